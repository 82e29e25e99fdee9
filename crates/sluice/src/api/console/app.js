/* Sluice web console.
 *
 * One page over the HTTP API (/api/v1), routed by the URL's hash:
 *   #/login  #/jobs  #/jobs/NAME  #/editor  #/editor/NAME  #/cluster  #/dirty/NAME  #/alarms
 * No framework, no build step, nothing fetched from elsewhere. Every string from the server
 * reaches the DOM as a text node or an attribute value (see el()), never through innerHTML.
 * The page shown reloads its data every 3 s, except the editor, whose edits it would lose.
 */
'use strict';

const API = '/api/v1';
const TOKEN_KEY = 'sluice-token';
const REFRESH_MS = 3000;

/* ------------------------------------------------------------------ DOM helpers */

const $ = (id) => document.getElementById(id);
const SVG_NS = 'http://www.w3.org/2000/svg';

/** Appends children: nodes as they are, anything else as text; arrays are flattened, null skipped. */
function append(node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

/** Sets attributes: `dataset` fills data-*, `onX` adds a listener, `true` is an empty attribute. */
function setProps(node, props) {
  for (const [key, value] of Object.entries(props)) {
    if (value === null || value === undefined || value === false) continue;
    if (key === 'dataset') Object.assign(node.dataset, value);
    else if (key.startsWith('on')) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? '' : String(value));
  }
  return node;
}

/** el('td', {class: 'num'}, 'text', node, [nodes]): an element with attributes and children. */
function el(tag, props = {}, ...children) {
  return append(setProps(document.createElement(tag), props), children);
}

function svgEl(tag, props = {}, ...children) {
  return append(setProps(document.createElementNS(SVG_NS, tag), props), children);
}

function replace(node, ...children) {
  node.replaceChildren();
  return append(node, children);
}

/** Rebuilds a table body, keeping open the <details> (matched by data-key) the reader opened. */
function rebuild(body, rows) {
  const open = new Set([...body.querySelectorAll('details[open]')].map((details) => details.dataset.key));
  replace(body, rows);
  for (const details of body.querySelectorAll('details[data-key]')) {
    if (open.has(details.dataset.key)) details.open = true;
  }
}

function table(id, labels, body) {
  const head = el('thead', {}, el('tr', {}, labels.map((label) => el('th', {scope: 'col'}, label))));
  return el('div', {class: 'scroll'}, el('table', {id, class: 'grid'}, head, body));
}

function emptyRow(columns, text) {
  return el('tr', {class: 'empty'}, el('td', {colspan: columns}, text));
}

function section(title, ...content) {
  return el('section', {}, el('h2', {}, title), content);
}

/** A section with an id (for the role rules of style.css). */
function sectionWithId(id, title, ...content) {
  return el('section', {id}, el('h2', {}, title), content);
}

function jsonDetails(key, label, value) {
  return el('details', {dataset: {key}}, el('summary', {}, label),
    el('pre', {class: 'json'}, JSON.stringify(value, null, 2)));
}

/* ------------------------------------------------------------------ formatting */

const enc = encodeURIComponent;
const jobHref = (name) => `#/jobs/${enc(name)}`;
const dash = (value) => (value === null || value === undefined || value === '' ? '—' : String(value));
const field = (object, key) => (object && typeof object === 'object' ? object[key] : undefined);

function count(value) {
  return typeof value === 'number' ? value.toLocaleString('en-US') : '—';
}

/** Rows per second: one decimal below 10, whole numbers above. */
function rate(value) {
  if (typeof value !== 'number' || !Number.isFinite(value)) return '—';
  if (value < 10 && value !== Math.round(value)) return value.toFixed(1);
  return Math.round(value).toLocaleString('en-US');
}

function duration(secs) {
  if (typeof secs !== 'number' || !Number.isFinite(secs)) return '—';
  if (secs < 60) return `${Math.round(secs * 10) / 10} s`;
  const whole = Math.round(secs);
  if (whole < 3600) return `${Math.floor(whole / 60)} min ${whole % 60} s`;
  return `${Math.floor(whole / 3600)} h ${Math.floor((whole % 3600) / 60)} min`;
}

/** An ErrorView as "side: message" (the side is omitted when unknown). */
function errorText(error) {
  if (!error) return '';
  if (typeof error === 'string') return error;
  const message = String(error.message ?? '');
  // Messages often name their side already ("target: connect on …").
  if (!error.side || message.startsWith(`${error.side}:`)) return message;
  return `${error.side}: ${message}`;
}

function clock(ms) {
  return new Date(ms).toLocaleTimeString([], {hour: '2-digit', minute: '2-digit'});
}

/* A state's colour: a Map, so that a state named like an Object property finds nothing. */
const TONES = new Map(Object.entries({
  running: 'green', succeeded: 'green', ok: 'green', resolved: 'green', yes: 'green',
  failed: 'red', firing: 'red', no: 'red',
  restarting: 'orange', pending: 'orange',
  stopped: 'grey', skipped: 'grey',
  scheduled: 'blue', current: 'blue', leader: 'blue',
}));

function setBadge(node, state) {
  const text = state === null || state === undefined ? '' : String(state);
  node.textContent = text;
  node.className = `badge tone-${TONES.get(text.split(':')[0]) || 'plain'}`;
}

function badge(state) {
  const node = el('span');
  setBadge(node, state);
  return node;
}

/* ------------------------------------------------------------------ messages */

let flash = null; // a message for the next page, shown after a navigation

function notice(id, text, tone) {
  const node = $(id);
  node.textContent = text || '';
  node.className = text ? tone : '';
}

/** The outcome of an action (success or error) in #message. */
const setMessage = (text, tone = 'ok') => notice('message', text, tone);
/** Why the page could not reload its data, in #status. */
const setStatus = (text) => notice('status', text, 'error');

/* ------------------------------------------------------------------ the API */

class ApiError extends Error {
  constructor(status, message, errors = []) {
    super(message);
    this.status = status;
    this.errors = Array.isArray(errors) ? errors : [];
  }
}

const storedToken = () => sessionStorage.getItem(TOKEN_KEY);
let loginNote = ''; // why the login page is shown, when a token was refused
let returnTo = '#/jobs'; // where the login page goes once it has a token

/**
 * Calls the API. A string body is a job document (YAML unless `type` says otherwise), any
 * other body is sent as JSON. Answers the parsed JSON; throws an ApiError with the server's
 * message. A 401 goes back to the login page unless `probe` (the login page's own checks).
 */
async function request(method, path, {body, type, token = storedToken(), probe = false} = {}) {
  const headers = {Accept: 'application/json'};
  if (token) headers.Authorization = `Bearer ${token}`;
  let payload;
  if (typeof body === 'string') {
    payload = body;
    headers['Content-Type'] = type || 'application/yaml';
  } else if (body !== undefined) {
    payload = JSON.stringify(body);
    headers['Content-Type'] = 'application/json';
  }
  let response;
  try {
    response = await fetch(API + path, {method, headers, body: payload, cache: 'no-store', credentials: 'same-origin'});
  } catch (error) {
    throw new ApiError(0, `cannot reach the server (${error.message})`);
  }
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = text;
  }
  if (response.ok) return data;
  const message = field(data, 'error') || (typeof data === 'string' && data.trim()) ||
    `${response.status} ${response.statusText}`;
  if (response.status === 401 && !probe) sessionEnded();
  throw new ApiError(response.status, message, field(data, 'errors'));
}

const get = (path) => request('GET', path);
const post = (path, body) => request('POST', path, {body});

/** A call refused for want of a valid token: forget the token, and log in again. */
function sessionEnded() {
  if (location.hash === '#/login') return;
  if (storedToken()) loginNote = 'The server refused the token (401); log in again.';
  sessionStorage.removeItem(TOKEN_KEY);
  returnTo = location.hash || '#/jobs';
  location.hash = '#/login';
}

/* ------------------------------------------------------------------ routing and refresh */

const ROUTES = [
  [/^#\/login$/, showLogin, null],
  [/^#\/jobs$/, showJobs, 'jobs'],
  [/^#\/jobs\/([^/]+)$/, showJob, 'jobs'],
  [/^#\/editor$/, showEditor, 'new'],
  [/^#\/editor\/([^/]+)$/, showEditor, 'jobs'],
  [/^#\/cluster$/, showCluster, 'cluster'],
  [/^#\/dirty\/([^/]+)$/, showDirty, 'jobs'],
  [/^#\/alarms$/, showAlarms, 'alarms'],
  [/^#\/audit$/, showAudit, 'audit'],
];

// The page shown: `refresh` reloads its data (null for pages that do not reload).
let page = {refresh: null};

function go(hash) {
  if (location.hash === hash) route();
  else location.hash = hash;
}

function route() {
  if (!location.hash) history.replaceState(null, '', '#/jobs');
  for (const [pattern, show, section] of ROUTES) {
    const match = pattern.exec(location.hash);
    if (!match) continue;
    let params;
    try {
      params = match.slice(1).map(decodeURIComponent);
    } catch {
      break; // a malformed %-escape
    }
    page = {refresh: null, busy: false, again: false};
    document.body.classList.toggle('logged-out', show === showLogin);
    for (const link of document.querySelectorAll('#topbar nav a')) {
      link.classList.toggle('active', link.dataset.section === section);
    }
    setMessage(flash ? flash.text : '', flash ? flash.tone : 'ok');
    flash = null;
    setStatus('');
    document.title = 'Sluice';
    $('view').replaceChildren();
    window.scrollTo(0, 0);
    show($('view'), ...params);
    if (show !== showLogin) showCaller();
    refreshNow();
    return;
  }
  location.replace('#/jobs');
}

/** Reloads the page's data now; a reload asked for while one runs follows it. */
async function refreshNow() {
  const current = page;
  if (!current.refresh) return;
  if (current.busy) {
    current.again = true;
    return;
  }
  current.busy = true;
  try {
    do {
      current.again = false;
      await current.refresh();
      if (current === page) setStatus('');
    } while (current.again && current === page);
  } catch (error) {
    if (current === page && error.status !== 401) setStatus(`Could not load this page: ${error.message}`);
  } finally {
    current.busy = false;
  }
}

/**
 * Runs an action from a button: the button is disabled meanwhile, and the text the action
 * answers (or its error) goes to #message; then the page reloads.
 */
async function act(button, work) {
  if (button) button.disabled = true;
  try {
    const text = await work();
    if (text) setMessage(text, 'ok');
    refreshNow();
  } catch (error) {
    if (error.status !== 401) setMessage(error.message, 'error');
  } finally {
    if (button) button.disabled = false;
  }
}

/* ------------------------------------------------------------------ login */

function showLogin(view) {
  const current = page;
  document.title = 'Log in · Sluice';
  const input = el('input', {id: 'token', type: 'password', autocomplete: 'current-password',
    placeholder: 'API token', 'aria-describedby': 'login-error'});
  const error = el('p', {id: 'login-error', class: 'error-text', role: 'alert'}, loginNote);
  const button = el('button', {id: 'login', type: 'submit', class: 'primary'}, 'Log in');
  loginNote = '';
  view.append(el('form', {class: 'login', onsubmit: (event) => {
    event.preventDefault();
    logIn(input.value.trim(), error, button);
  }},
  el('h1', {}, 'Sluice console'),
  el('label', {for: 'token'}, 'API token'),
  input, button, error));
  input.focus();
  // A server with no token configured answers without one: then there is nothing to log in to.
  if (!storedToken()) {
    request('GET', '/jobs', {token: null, probe: true})
      .then(() => { if (current === page) leaveLogin(); })
      .catch(() => {});
  }
}

async function logIn(token, error, button) {
  if (!token) {
    error.textContent = 'Enter a token.';
    return;
  }
  button.disabled = true;
  error.textContent = '';
  try {
    await request('GET', '/jobs', {token, probe: true});
    sessionStorage.setItem(TOKEN_KEY, token);
    leaveLogin();
  } catch (failure) {
    error.textContent = failure.status === 401 || failure.status === 403
      ? `The server refused this token (${failure.status}): ${failure.message}`
      : failure.message;
  } finally {
    button.disabled = false;
  }
}

function leaveLogin() {
  const target = returnTo;
  returnTo = '#/jobs';
  go(target === '#/login' ? '#/jobs' : target);
}

/**
 * Shows who is signed in (GET /whoami: the token's name and role) and marks the page with the
 * role, so what it may not do is not offered.
 */
async function showCaller() {
  try {
    const caller = await get('/whoami');
    $('signed-in').textContent = `${caller.name} (${caller.role})`;
    document.body.dataset.role = caller.role;
  } catch {
    // The page's own request reports what went wrong.
  }
}

function logOut(event) {
  event.preventDefault();
  sessionStorage.removeItem(TOKEN_KEY);
  $('signed-in').textContent = '';
  delete document.body.dataset.role;
  returnTo = '#/jobs';
  go('#/login');
}

/* ------------------------------------------------------------------ jobs list */

function showJobs(view) {
  document.title = 'Jobs · Sluice';
  const body = el('tbody');
  view.append(
    el('div', {class: 'page-head'}, el('h1', {}, 'Jobs'),
      el('a', {class: 'button', href: '#/editor'}, 'New job')),
    table('jobs', ['Job', 'State', 'Phase', 'Mode', 'Version', 'Rows/s', 'Lag', 'Last error'], body));
  page.refresh = async () => replace(body, jobRows(await get('/jobs')));
}

function jobRows(jobs) {
  if (!jobs.length) return emptyRow(8, 'No jobs yet: “New job” creates one.');
  const sorted = [...jobs].sort((a, b) => String(a.name).localeCompare(String(b.name)));
  return sorted.map((job) => el('tr', {dataset: {job: job.name}},
    el('td', {class: 'name'}, el('a', {href: jobHref(job.name)}, job.name)),
    el('td', {class: 'state'}, badge(job.state)),
    el('td', {class: 'phase'}, dash(job.phase)),
    el('td', {}, dash(job.mode)),
    el('td', {class: 'num'}, dash(job.version)),
    el('td', {class: 'num rate'}, rate(job.rows_per_sec)),
    el('td', {class: 'num lag'}, duration(job.lag_secs)),
    el('td', {class: 'error'}, errorText(job.error))));
}

/* ------------------------------------------------------------------ one job */

function showJob(view, name) {
  document.title = `${name} · Sluice`;
  const base = `/jobs/${enc(name)}`;
  const ui = {
    state: el('span', {id: 'job-state', class: 'badge'}),
    phase: el('span', {id: 'job-phase'}),
    error: el('div', {id: 'job-error', class: 'callout error', hidden: true}),
    stats: el('div', {class: 'stats'}),
    notes: el('div'),
    tasks: el('tbody'),
    throughput: chart('chart-throughput', 'throughput in rows per second'),
    lag: chart('chart-lag', 'lag in seconds'),
    runs: el('tbody'),
    versions: el('tbody'),
    diffTitle: el('h3', {hidden: true}),
    diff: el('pre', {id: 'diff', class: 'diff', hidden: true}),
    verification: el('div', {id: 'verification'}),
    current: null, // its current version, for "diff with current"
  };
  const action = (id, label, work, tone) =>
    el('button', {id, type: 'button', class: tone, onclick: (event) => act(event.currentTarget, work)}, label);
  view.append(
    el('div', {class: 'page-head'}, el('h1', {}, name), ui.state,
      el('span', {class: 'muted'}, 'phase:'), ui.phase),
    el('div', {class: 'toolbar'},
      action('job-stop', 'Stop', () => lifecycle(name, 'stop')),
      action('job-start', 'Start', () => lifecycle(name, 'start')),
      action('job-restart', 'Restart', () => lifecycle(name, 'restart')),
      el('span', {class: 'separator'}),
      el('a', {id: 'job-edit', class: 'button', href: `#/editor/${enc(name)}`}, 'Edit'),
      el('a', {id: 'job-dirty', class: 'button', href: `#/dirty/${enc(name)}`}, 'Dirty records'),
      action('job-verify', 'Verify', () => verifyJob(name, ui, false)),
      action('job-repair', 'Verify and repair', () => window.confirm(`Compare job ${name}'s target with its ` +
        'source and write the source\'s rows over every row that differs? Each repair is recorded.')
        ? verifyJob(name, ui, true) : null),
      el('span', {class: 'separator'}),
      action('job-delete', 'Delete', () => deleteJob(name), 'danger')),
    ui.error, ui.stats, ui.notes,
    section('Tasks', table('tasks', ['Task', 'Kind', 'State', 'Worker', 'Epoch', 'Position', 'Lag',
      'Rows read', 'Rows written', 'Restarts', 'Error'], ui.tasks)),
    section('Last 6 hours', el('div', {class: 'charts'},
      el('figure', {}, el('figcaption', {}, 'Throughput (rows/s)'), ui.throughput),
      el('figure', {}, el('figcaption', {}, 'Lag (s)'), ui.lag))),
    section('Verification', ui.verification),
    section('Runs', table('runs', ['Status', 'Mode', 'Elapsed', 'Rows read', 'Rows written', 'Skipped',
      'Rows/s', 'Restarts', 'Dirty', 'Error', 'Summary'], ui.runs)),
    section('Versions', table('versions', ['Version', 'Created', 'Origin', '', ''], ui.versions),
      ui.diffTitle, ui.diff),
    tablesForm('add-tables', 'Add tables', 'Tables added to a running job with a change stream are copied ' +
      'while the stream runs on, then taken into it.', 'Add tables', (input) => addTables(name, input)),
    tablesForm('resync-tables', 'Resync tables', 'Tables of the job copied again while its stream runs, each ' +
      'put in the table\'s place whole once copied (PostgreSQL and MySQL targets).', 'Resync',
      (input) => resyncTables(name, input)));
  page.refresh = () => loadJob(name, ui);
}

/**
 * A section whose form takes tables, comma separated, and hands its input to `submit`: the input
 * is `#id`, the section `#id-section`, the button `#id-submit`.
 */
function tablesForm(id, title, note, button, submit) {
  const input = el('input', {id, type: 'text', size: 40, placeholder: 'db.table, db.other',
    'aria-label': `${title}: tables, comma separated`});
  return sectionWithId(`${id}-section`, title, el('p', {class: 'muted'}, note),
    el('form', {class: 'inline', onsubmit: (event) => {
      event.preventDefault();
      act(event.currentTarget.querySelector('button'), () => submit(input));
    }}, input, el('button', {id: `${id}-submit`, type: 'submit'}, button)));
}

/**
 * Compares the job's target with its source (POST /jobs/NAME/verify), with `repair` writing the
 * source's rows over the differing ones, and shows the report.
 */
async function verifyJob(name, ui, repair) {
  const last = await post(`/jobs/${enc(name)}/verify`, repair ? {repair: true} : {});
  replace(ui.verification, verificationBlock(last));
  const differences = last.report.differences_total;
  const repaired = last.report.tables.reduce((sum, table) => sum + table.repaired, 0);
  const repairs = repaired ? ` ${count(repaired)} rows repaired (listed with the dirty records).` : '';
  return (differences === 0 ? `Job ${name}: the target equals the source.`
    : `Job ${name}: ${rowsDiffer(differences)} between target and source.`) + repairs;
}

/** "1 row differs", "3 rows differ". */
function rowsDiffer(differences) {
  return differences === 1 ? '1 row differs' : `${count(differences)} rows differ`;
}

/** A job's last verification: a line per table, then the differences listed (up to 20 each). */
function verificationBlock(last) {
  if (!last) return el('p', {class: 'muted'}, 'Never verified: "Verify" compares the target with the source, row by row.');
  const report = last.report;
  const rows = report.tables.map((table) => el('tr', {dataset: {table: table.table}},
    el('td', {class: 'mono'}, table.table),
    el('td', {class: 'num'}, count(table.rows_source)),
    el('td', {class: 'num'}, count(table.rows_target)),
    el('td', {class: 'num'}, count(table.missing)),
    el('td', {class: 'num'}, count(table.extra)),
    el('td', {class: 'num'}, count(table.different)),
    el('td', {class: 'mono'}, (table.differences || []).length ? el('ul', {class: 'plain'},
      table.differences.slice(0, 20).map((difference) => el('li', {}, `${difference.kind} ${JSON.stringify(difference.key)}` +
        (difference.columns.length ? `: ${difference.columns.join(', ')}` : '')))) : '—'),
    el('td', {class: 'error'}, (table.problems || []).join('; ') || '—')));
  return el('div', {},
    el('p', {id: 'verify-summary'}, report.differences_total === 0 ? 'The target equals the source' :
      rowsDiffer(report.differences_total), ` · verified ${new Date(last.at * 1000).toISOString()} on ${last.node}` +
      ` (version ${last.version}) in ${duration(report.elapsed_ms / 1000)}`),
    table('verify-tables', ['Table', 'Source rows', 'Target rows', 'Missing', 'Extra', 'Different',
      'Differences', 'Problems'], el('tbody', {}, rows)));
}

/** Stop, start or restart: the server answers the desired state and the generation. */
async function lifecycle(name, verb) {
  const desired = await post(`/jobs/${enc(name)}/${verb}`);
  return `Job ${name}: ${verb} asked (desired ${desired.desired}, generation ${desired.generation}).`;
}

async function loadJob(name, ui) {
  const base = `/jobs/${enc(name)}`;
  const [job, series, runs, versions, verification] = await Promise.all([
    get(base),
    // The charts are an extra: a job page without them is still worth showing.
    get(`${base}/series`).catch(() => null),
    get(`${base}/runs`),
    get(`${base}/versions`),
    // 404 until the job is first verified.
    get(`${base}/verify`).catch(() => null),
  ]);
  showJobSummary(job, ui);
  replace(ui.tasks, taskRows(job.tasks || []));
  const points = field(series, 'points') || [];
  drawChart(ui.throughput, points, (point) => point.rows_per_sec, rate);
  drawChart(ui.lag, points, (point) => point.lag_secs, (value) => duration(value));
  rebuild(ui.runs, runRows(runs || []));
  ui.current = job.version;
  replace(ui.versions, versionRows(name, versions || [], ui));
  replace(ui.verification, verificationBlock(verification));
}

function showJobSummary(job, ui) {
  setBadge(ui.state, job.state);
  ui.phase.textContent = dash(job.phase);
  const error = errorText(job.error);
  ui.error.textContent = error;
  ui.error.hidden = !error;
  const stats = job.stats || {};
  const stat = (label, value) => el('div', {class: 'stat'},
    el('span', {class: 'label'}, label), el('span', {class: 'value'}, dash(value)));
  replace(ui.stats,
    stat('Version', job.version), stat('Mode', job.mode), stat('Generation', job.generation),
    stat('Priority', job.priority), stat('Rows/s', rate(stats.rows_per_sec)), stat('Lag', duration(stats.lag_secs)),
    stat('Rows read', count(stats.rows_read)), stat('Rows written', count(stats.rows_written)),
    stat('Rows skipped', count(stats.rows_skipped)), stat('Restarts', job.restarts),
    stat('Differences', stats.verify_differences == null ? null : count(stats.verify_differences)),
    stat('Updated', job.updated_at));
  replace(ui.notes,
    job.backfill && job.backfill.length
      ? el('p', {class: 'callout'}, `Copying added tables: ${job.backfill.join(', ')}`) : null,
    // A stopped stream job whose source keeps its log meanwhile (a PostgreSQL slot's WAL).
    job.held_log
      ? el('p', {id: 'held-log', class: 'callout error'},
        `Stopped, and its source holds ${(job.held_log.bytes / 1048576).toFixed(1)} MiB of change log for it ` +
        `(a replication slot), growing until the job runs again or is reset (measured ${job.held_log.at}).`)
      : null,
    scheduleBlock(job.schedule));
}

function scheduleBlock(schedule) {
  if (!schedule) return null;
  const recent = (schedule.history || []).slice(-10).reverse();
  const rows = recent.map((batch) => el('tr', {},
    el('td', {class: 'num'}, dash(batch.batch)),
    el('td', {}, dash(batch.due_at)), el('td', {}, dash(batch.fired_at)), el('td', {}, dash(batch.ended_at)),
    el('td', {class: 'num'},
      batch.rows ? [batch.rows.read, batch.rows.written, batch.rows.skipped].map(count).join(' / ') : '—'),
    el('td', {class: 'state'}, badge(batch.outcome))));
  return el('div', {class: 'schedule'},
    el('p', {}, `Schedule: ${schedule.schedule} · last batch ${schedule.batch} · next ${dash(schedule.next_at)}`,
      schedule.queued ? ' · a firing waits for the running batch' : ''),
    rows.length ? table('batches', ['Batch', 'Due', 'Fired', 'Ended', 'Read / written / skipped', 'Outcome'],
      el('tbody', {}, rows)) : null);
}

function taskRows(tasks) {
  if (!tasks.length) return emptyRow(11, 'No tasks yet: the job has no plan.');
  return tasks.map((task) => el('tr', {dataset: {task: task.id}},
    el('td', {class: 'mono'}, task.id),
    el('td', {}, dash(task.kind)),
    el('td', {class: 'state'}, badge(task.state)),
    el('td', {}, dash(task.worker)),
    el('td', {class: 'num'}, dash(task.epoch)),
    el('td', {class: 'mono position'}, task.position == null ? '—' : JSON.stringify(task.position)),
    el('td', {class: 'num'}, duration(task.lag_secs)),
    el('td', {class: 'num'}, count(task.rows_read)),
    el('td', {class: 'num'}, count(task.rows_written)),
    el('td', {class: 'num'}, dash(task.restarts)),
    // A pending task that no live node's zone and labels admit says what it waits for.
    el('td', {class: 'error'}, task.waiting_for ? `waits for ${task.waiting_for}` : errorText(task.error))));
}

/** Run summaries (sluice-core's RunSummary), most recent first, each with its full JSON. */
function runRows(runs) {
  if (!runs.length) return emptyRow(11, 'No finished runs yet.');
  // The server lists them oldest first (their keys begin with the time they ended); the
  // index from the oldest keeps a run's key, and so its open <details>, across reloads.
  return runs.map((run, index) => ({run, index})).reverse().map(({run, index}) => el('tr', {},
    el('td', {class: 'state'}, badge(field(run, 'status'))),
    el('td', {}, dash(field(run, 'mode'))),
    el('td', {class: 'num'}, duration(field(run, 'elapsed_secs'))),
    el('td', {class: 'num'}, count(field(run, 'rows_read'))),
    el('td', {class: 'num'}, count(field(run, 'rows_written'))),
    el('td', {class: 'num'}, count(field(run, 'rows_skipped'))),
    el('td', {class: 'num'}, rate(field(run, 'rows_per_sec'))),
    el('td', {class: 'num'}, dash(field(run, 'restarts'))),
    el('td', {class: 'num'}, count(field(run, 'dirty_records_total'))),
    el('td', {class: 'error'}, errorText(field(run, 'error'))),
    el('td', {}, jsonDetails(`run-${index}`, 'JSON', run))));
}

function versionRows(name, versions, ui) {
  const sorted = [...versions].sort((a, b) => b.version - a.version);
  return sorted.map((version) => el('tr', {dataset: {version: version.version}, class: version.current ? 'current' : null},
    el('td', {class: 'num'}, version.version),
    el('td', {}, dash(version.created_at)),
    el('td', {}, dash(version.origin)),
    el('td', {}, version.current ? badge('current') : ''),
    el('td', {class: 'actions'}, version.current ? null : [
      el('button', {type: 'button', class: 'show-diff', dataset: {version: version.version},
        onclick: (event) => act(event.currentTarget, () => showDiff(name, version.version, ui))}, 'diff with current'),
      el('button', {type: 'button', class: 'rollback', dataset: {version: version.version},
        onclick: (event) => rollBack(name, version.version, event.currentTarget)}, 'roll back'),
    ])));
}

async function showDiff(name, version, ui) {
  const current = ui.current;
  const answer = await get(`/jobs/${enc(name)}/versions/${version}/diff/${current}`);
  ui.diffTitle.textContent = `Version ${version} → current version ${current} (- only in ${version}, + only in ${current})`;
  ui.diffTitle.hidden = false;
  const lines = String(answer.diff || '').split('\n');
  if (lines[lines.length - 1] === '') lines.pop();
  const tone = (line) => (line.startsWith('+') ? 'add' : line.startsWith('-') ? 'del' : null);
  replace(ui.diff, lines.map((line) => el('span', {class: tone(line)}, `${line}\n`)));
  ui.diff.hidden = false;
  ui.diff.scrollIntoView({block: 'nearest'});
  return null;
}

function rollBack(name, version, button) {
  const question = `Roll job ${name} back to version ${version}? Its document becomes a new version, and the job runs it.`;
  if (!window.confirm(question)) return;
  act(button, async () => {
    const created = await post(`/jobs/${enc(name)}/rollback`, {version});
    return `Job ${name}: rolled back to version ${version}, as version ${created.version}.`;
  });
}

async function addTables(name, input) {
  const tables = input.value.split(',').map((table) => table.trim()).filter(Boolean);
  if (!tables.length) throw new ApiError(0, 'List the tables to add as db.table, separated by commas.');
  const added = await post(`/jobs/${enc(name)}/tables`, {tables});
  input.value = '';
  return `Job ${name}: adding ${(added.backfill || tables).join(', ')} as version ${added.version}; ` +
    'they are copied, then taken into the stream.';
}

async function resyncTables(name, input) {
  const tables = input.value.split(',').map((table) => table.trim()).filter(Boolean);
  if (!tables.length) throw new ApiError(0, 'List the tables to copy again as db.table, separated by commas.');
  const accepted = await post(`/jobs/${enc(name)}/resync`, {tables});
  input.value = '';
  return `Job ${name}: ${accepted.tables.join(', ')} are copied again while the stream runs (${accepted.id}).`;
}

async function deleteJob(name) {
  if (!window.confirm(`Delete job ${name}, its versions, plan and runs?`)) return null;
  await request('DELETE', `/jobs/${enc(name)}`);
  flash = {text: `Job ${name} deleted.`, tone: 'ok'};
  go('#/jobs');
  return null;
}

/* ------------------------------------------------------------------ charts */

const CHART = {width: 640, height: 180, left: 64, right: 12, top: 14, bottom: 26};

function chart(id, label) {
  return svgEl('svg', {id, class: 'chart', viewBox: `0 0 ${CHART.width} ${CHART.height}`, role: 'img', 'aria-label': label});
}

/**
 * Draws a series as polylines in an SVG: the y axis is labelled with the smallest and largest
 * value, the x axis with the first and last time. A point without a value (lag unknown) breaks
 * the line rather than drawing it to zero.
 */
function drawChart(svg, points, valueOf, format) {
  const {width, height, left, right, top, bottom} = CHART;
  const [x0, x1, y0, y1] = [left, width - right, top, height - bottom];
  const samples = points.map((point) => ({t: Date.parse(point.at), v: valueOf(point)}))
    .filter((sample) => Number.isFinite(sample.t))
    .sort((a, b) => a.t - b.t);
  const values = samples.map((sample) => sample.v).filter((value) => typeof value === 'number' && Number.isFinite(value));
  const text = (x, y, anchor, content, cls = 'label') => svgEl('text', {x, y, 'text-anchor': anchor, class: cls}, content);
  replace(svg,
    svgEl('line', {x1: x0, y1: y0, x2: x0, y2: y1, class: 'axis'}),
    svgEl('line', {x1: x0, y1, x2: x1, y2: y1, class: 'axis'}));
  if (!values.length) {
    svg.append(text((x0 + x1) / 2, (y0 + y1) / 2, 'middle', 'no data yet', 'label empty'));
    return;
  }
  const [tMin, tMax] = [samples[0].t, samples[samples.length - 1].t];
  const [vMin, vMax] = [Math.min(...values), Math.max(...values)];
  const x = (t) => (tMax === tMin ? x1 : x0 + ((t - tMin) / (tMax - tMin)) * (x1 - x0));
  // A flat series is drawn in the middle.
  const y = (v) => (vMax === vMin ? (y0 + y1) / 2 : y1 - ((v - vMin) / (vMax - vMin)) * (y1 - y0));
  let run = [];
  const flush = () => {
    if (run.length === 1) svg.append(svgEl('circle', {cx: run[0][0], cy: run[0][1], r: 2, class: 'dot'}));
    if (run.length > 1) svg.append(svgEl('polyline', {points: run.map((p) => p.join(',')).join(' '), class: 'line'}));
    run = [];
  };
  for (const sample of samples) {
    if (typeof sample.v !== 'number' || !Number.isFinite(sample.v)) flush();
    else run.push([x(sample.t).toFixed(1), y(sample.v).toFixed(1)]);
  }
  flush();
  const last = samples[samples.length - 1].v;
  append(svg, [
    text(x0 - 6, vMax === vMin ? (y0 + y1) / 2 + 4 : y0 + 4, 'end', format(vMax), 'label max'),
    vMax === vMin ? null : text(x0 - 6, y1, 'end', format(vMin), 'label min'),
    text(x0, height - 6, 'start', clock(tMin), 'label start'),
    text(x1, height - 6, 'end', clock(tMax), 'label end'),
    text(x1, y0 - 2, 'end', `now: ${typeof last === 'number' ? format(last) : '—'}`, 'label now')]);
}

/* ------------------------------------------------------------------ editor */

const EXAMPLE = `# A new job: change it, then "Create job". \${SLUICE_VAR_...}s come from each node's environment
# (or a file of its --secrets-dir): a password written in plain text is refused.
name: orders-to-warehouse         # letters, digits, "-", "_" and "." only
mode: snapshot                    # snapshot | cdc | snapshot+cdc | incremental-cursor
source:
  type: mysql
  url: mysql://reader:\${SLUICE_VAR_SRC_PASSWORD}@db.example:3306
  tables: ["shop.orders"]         # globs; "!" excludes
target:
  type: postgres
  url: postgres://loader:\${SLUICE_VAR_DST_PASSWORD}@warehouse.example:5432/warehouse
  write_mode: insert              # insert | upsert
  create_tables: true
parallelism: 2
`;

function showEditor(view, name) {
  document.title = `${name ? `Edit ${name}` : 'New job'} · Sluice`;
  const textarea = el('textarea', {id: 'editor', wrap: 'off', spellcheck: 'false', autocomplete: 'off',
    autocapitalize: 'off', 'aria-label': 'job document (YAML)'});
  const gutter = el('div', {id: 'gutter', 'aria-hidden': 'true'});
  const errors = el('ul', {id: 'errors', class: 'errors'});
  const submit = el('button', {id: 'submit', type: 'button', class: 'primary'}, name ? 'Save new version' : 'Create job');
  const heading = el('h1', {}, name ? `Edit job ${name}` : 'New job');
  const editor = {textarea, gutter, errors, lines: 0, errorLines: new Set()};
  view.append(
    el('div', {class: 'page-head'}, heading, name ? el('a', {href: jobHref(name)}, 'back to the job') : null),
    el('div', {class: 'editor'}, gutter, textarea),
    el('div', {class: 'toolbar'}, submit,
      el('span', {class: 'muted'}, 'Tab indents by two spaces; Esc then Tab leaves the editor.')),
    errors);
  textarea.addEventListener('input', () => syncGutter(editor));
  textarea.addEventListener('scroll', () => { gutter.scrollTop = textarea.scrollTop; });
  textarea.addEventListener('keydown', editorKeys);
  submit.addEventListener('click', () => submitJob(name, editor, submit));
  if (!name) {
    textarea.value = EXAMPLE;
    syncGutter(editor);
    textarea.focus();
    return;
  }
  textarea.disabled = true;
  submit.disabled = true;
  syncGutter(editor);
  loadDocument(name, editor, heading).then(() => {
    textarea.disabled = false;
    submit.disabled = false;
  }, (error) => {
    if (error.status !== 401) setMessage(`Could not load job ${name}: ${error.message}`, 'error');
  });
}

/** Fills the editor with the job's current version. */
async function loadDocument(name, editor, heading) {
  const job = await get(`/jobs/${enc(name)}`);
  const version = await get(`/jobs/${enc(name)}/versions/${job.version}`);
  editor.textarea.value = version.document;
  heading.textContent = `Edit job ${name} (version ${version.version}, ${version.format})`;
  syncGutter(editor);
}

/** One gutter line per line of text, rebuilt when the count changes, scrolled with the text. */
function syncGutter(editor) {
  const lines = editor.textarea.value.split('\n').length;
  if (lines !== editor.lines) {
    editor.lines = lines;
    const numbers = [];
    for (let line = 1; line <= lines; line++) {
      numbers.push(el('div', {dataset: {line}, class: editor.errorLines.has(line) ? 'line-error' : null}, line));
    }
    replace(editor.gutter, numbers);
  }
  editor.gutter.scrollTop = editor.textarea.scrollTop;
}

let tabLeaves = false; // after Esc, Tab moves the focus as usual (keyboard users can leave)

function editorKeys(event) {
  if (event.key === 'Escape') {
    tabLeaves = true;
    return;
  }
  if (event.key !== 'Tab' || tabLeaves || event.shiftKey || event.ctrlKey || event.altKey || event.metaKey) {
    tabLeaves = false;
    return;
  }
  event.preventDefault();
  const area = event.target;
  // insertText keeps the browser's undo history; setRangeText is the fallback.
  if (!document.execCommand || !document.execCommand('insertText', false, '  ')) {
    area.setRangeText('  ', area.selectionStart, area.selectionEnd, 'end');
    area.dispatchEvent(new Event('input', {bubbles: true}));
  }
}

async function submitJob(name, editor, submit) {
  const text = editor.textarea.value;
  // A JSON document (as "add tables" makes) goes as JSON, anything else as YAML.
  const type = /^\s*\{/.test(text) ? 'application/json' : 'application/yaml';
  submit.disabled = true;
  setMessage('');
  try {
    const created = name
      ? await request('PUT', `/jobs/${enc(name)}`, {body: text, type})
      : await request('POST', '/jobs', {body: text, type});
    const job = created.name || name;
    flash = {text: `Job ${job}: version ${created.version} saved.`, tone: 'ok'};
    go(jobHref(job));
  } catch (error) {
    if (error.status === 401) return;
    showEditorErrors(editor, error.errors);
    setMessage(error.message, 'error');
  } finally {
    submit.disabled = false;
  }
}

/** Lists a refused document's errors and marks their lines in the gutter. */
function showEditorErrors(editor, errors) {
  editor.errorLines = new Set(errors.map((error) => error.line).filter((line) => Number.isInteger(line)));
  for (const number of editor.gutter.children) {
    number.classList.toggle('line-error', editor.errorLines.has(Number(number.dataset.line)));
  }
  replace(editor.errors, errors.map((error) => {
    const where = [Number.isInteger(error.line) ? `line ${error.line}` : null, error.path || null].filter(Boolean);
    const text = [...where, error.message].join(': ');
    if (!Number.isInteger(error.line)) return el('li', {}, text);
    return el('li', {dataset: {line: error.line}, class: 'clickable', title: 'go to the line',
      onclick: () => goToLine(editor.textarea, error.line)}, text);
  }));
}

function goToLine(textarea, line) {
  const lines = textarea.value.split('\n');
  const start = lines.slice(0, line - 1).reduce((sum, text) => sum + text.length + 1, 0);
  textarea.focus();
  textarea.setSelectionRange(start, start + (lines[line - 1] || '').length);
  const height = parseFloat(getComputedStyle(textarea).lineHeight) || 20;
  textarea.scrollTop = Math.max(0, (line - 3) * height);
}

/* ------------------------------------------------------------------ cluster */

function showCluster(view) {
  document.title = 'Cluster · Sluice';
  const leader = el('code', {id: 'leader'});
  const body = el('tbody');
  view.append(
    el('div', {class: 'page-head'}, el('h1', {}, 'Cluster'), el('span', {class: 'muted'}, 'leader:'), leader),
    table('workers', ['Worker', 'Role', 'Address', 'Alive', 'Capacity', 'Weight', 'Load', 'Tasks', 'Started'], body));
  page.refresh = async () => {
    const [workers, current] = await Promise.all([get('/workers'), get('/leader')]);
    leader.textContent = current.leader || 'none';
    replace(body, workerRows(workers, current.leader));
  };
}

function workerRows(workers, leader) {
  if (!workers.length) return emptyRow(9, 'No live worker.');
  const sorted = [...workers].sort((a, b) => String(a.id).localeCompare(String(b.id)));
  return sorted.map((worker) => {
    const tasks = worker.tasks || [];
    const share = worker.capacity ? ` (${Math.round((100 * tasks.length) / worker.capacity)}%)` : '';
    const load = `${tasks.length} / ${dash(worker.capacity)}${share}`;
    return el('tr', {dataset: {worker: worker.id}, class: worker.id === leader ? 'leader' : null},
      el('td', {class: 'mono'}, worker.id),
      el('td', {class: 'role'}, worker.id === leader ? badge('leader') : 'worker'),
      el('td', {class: 'mono'}, dash(worker.address)),
      el('td', {}, badge(worker.alive ? 'yes' : 'no')),
      el('td', {class: 'num'}, dash(worker.capacity)),
      el('td', {class: 'num'}, dash(worker.weight)),
      el('td', {class: 'num'}, load),
      el('td', {}, tasks.length ? el('ul', {class: 'plain'}, tasks.map(taskLink)) : '—'),
      el('td', {}, dash(worker.started_at)));
  });
}

/** A worker's task (`job/task`), linked to its job. */
function taskLink(task) {
  const job = String(task).split('/')[0];
  return el('li', {}, el('a', {href: jobHref(job)}, task));
}

/* ------------------------------------------------------------------ dirty records */

function showDirty(view, name) {
  document.title = `Dirty records of ${name} · Sluice`;
  const base = `/jobs/${enc(name)}/dirty`;
  const total = el('span', {id: 'dirty-total'});
  const body = el('tbody');
  const repairs = el('tbody');
  const selected = new Set(); // ids picked, kept across reloads
  const pickAll = el('input', {type: 'checkbox', id: 'pick-all', 'aria-label': 'pick every record shown'});
  body.addEventListener('change', (event) => {
    if (!event.target.classList.contains('pick')) return;
    if (event.target.checked) selected.add(event.target.value);
    else selected.delete(event.target.value);
  });
  pickAll.addEventListener('change', () => {
    for (const box of body.querySelectorAll('input.pick')) {
      box.checked = pickAll.checked;
      if (pickAll.checked) selected.add(box.value);
      else selected.delete(box.value);
    }
  });
  const picked = () => {
    if (!selected.size) throw new ApiError(0, 'Pick records first.');
    return [...selected];
  };
  const replay = async (ids) => {
    const answer = await post(`${base}/replay`, ids ? {ids} : {});
    const failed = answer.failed || [];
    for (const id of ids || []) if (!failed.some((failure) => failure.id === id)) selected.delete(id);
    const failures = failed.map((failure) => `${failure.id}: ${failure.error}`).join('; ');
    if (failed.length) throw new ApiError(0, `Replayed ${answer.replayed}; failed ${failed.length}: ${failures}`);
    return `Replayed ${answer.replayed}.`;
  };
  const discard = async () => {
    const ids = picked();
    const question = `Discard ${ids.length} dirty record(s) of job ${name}? They are forgotten (a later copy of their split may still write them); the discard is audited.`;
    if (!window.confirm(question)) return null;
    const answer = await post(`${base}/discard`, {ids});
    ids.forEach((id) => selected.delete(id));
    return `Discarded ${answer.discarded}.`;
  };
  const button = (id, label, work, tone) =>
    el('button', {id, type: 'button', class: tone, onclick: (event) => act(event.currentTarget, work)}, label);
  view.append(
    el('div', {class: 'page-head'}, el('h1', {}, `Dirty records of ${name}`), total,
      el('a', {href: jobHref(name)}, 'back to the job')),
    el('p', {class: 'muted'}, 'Rows the job could not read or write. Replaying writes them again; discarding drops them.'),
    el('div', {class: 'toolbar'},
      button('replay-selected', 'Replay selected', () => replay(picked())),
      button('replay-all', 'Replay all', () => window.confirm(`Replay every dirty record of job ${name}? Their rows are read again and written by key with the job as it is now.`) ? replay(null) : null),
      button('discard-selected', 'Discard selected', discard, 'danger')),
    el('div', {class: 'scroll'}, el('table', {id: 'dirty', class: 'grid'},
      el('thead', {}, el('tr', {}, el('th', {}, pickAll),
        ['Task', 'Table', 'Key', 'Reason', 'Node', 'Created', 'Record'].map((label) => el('th', {scope: 'col'}, label)))),
      body)),
    section('Repairs', el('p', {class: 'muted'}, 'Rows "Verify and repair" rewrote from the source, oldest first.'),
      table('repairs', ['At', 'Node', 'Table', 'Kind', 'Key', 'Before', 'After'], repairs)));
  page.refresh = async () => {
    rebuild(repairs, repairRows(await get(`/jobs/${enc(name)}/repairs`)));
    const answer = await get(base);
    const records = answer.records || [];
    total.textContent = `${answer.total} of limit ${answer.limit}`;
    const shown = new Set(records.map((record) => String(record.id)));
    for (const id of [...selected]) if (!shown.has(id)) selected.delete(id);
    rebuild(body, dirtyRows(records, selected));
    pickAll.checked = records.length > 0 && selected.size === records.length;
  };
}

function dirtyRows(records, selected) {
  if (!records.length) return emptyRow(8, 'No dirty records.');
  return records.map((record) => {
    const id = String(record.id);
    return el('tr', {dataset: {id}},
      el('td', {}, el('input', {type: 'checkbox', class: 'pick', value: id, checked: selected.has(id),
        'aria-label': `pick record ${id}`})),
      el('td', {class: 'mono'}, dash(record.task),
        record.change ? el('div', {class: 'muted'}, `at ${JSON.stringify(record.change.position)}`) : null),
      el('td', {}, dash(record.table)),
      el('td', {class: 'mono'}, dash(record.key)),
      el('td', {class: 'error'}, dash(record.reason)),
      el('td', {}, dash(record.node)),
      el('td', {}, dash(record.created_at)),
      el('td', {}, jsonDetails(`dirty-${id}`, 'record', record.record),
        record.change ? jsonDetails(`dirty-before-${id}`, 'before', record.change.before) : null));
  });
}

/** The rows verifications repaired: what the target held before and what the source wrote. */
function repairRows(repairs) {
  if (!repairs.length) return emptyRow(7, 'No repairs.');
  return repairs.map((repair, index) => el('tr', {dataset: {table: repair.table}},
    el('td', {}, new Date(repair.at * 1000).toISOString()),
    el('td', {}, dash(repair.node)),
    el('td', {class: 'mono'}, repair.table),
    el('td', {}, repair.kind),
    el('td', {class: 'mono'}, JSON.stringify(repair.key)),
    el('td', {}, repair.before ? jsonDetails(`repair-before-${index}`, 'before', repair.before) : '—'),
    el('td', {}, repair.after ? jsonDetails(`repair-after-${index}`, 'after', repair.after) : 'deleted')));
}

/* ------------------------------------------------------------------ alarms */

function showAlarms(view) {
  document.title = 'Alarms · Sluice';
  const rules = el('tbody');
  const history = el('tbody');
  view.append(
    el('div', {class: 'page-head'}, el('h1', {}, 'Alarms')),
    section('Rules', table('alarm-rules', ['Job', 'Alarm', 'When', 'For', 'State', 'Value', 'Since'], rules)),
    section('History', table('alarm-history', ['At', 'Job', 'Alarm', 'Event', 'Value', 'Message'], history)));
  page.refresh = async () => {
    const answer = await get('/alarms');
    replace(rules, alarmRuleRows(answer.rules || []));
    replace(history, alarmHistoryRows(answer.history || []));
  };
}

/** A job's name linked to its page, or "global" for a rule over every job. */
function alarmJob(job) {
  return job == null ? el('span', {class: 'muted'}, 'global') : el('a', {href: jobHref(job)}, job);
}

/** A rule's name, marked when it is a global rule (evaluated for every job). */
function alarmName(rule) {
  return rule.scope === 'global' ? `${rule.name} (global)` : rule.name;
}

function alarmRuleRows(rules) {
  if (!rules.length) return emptyRow(7, 'No alarm rule.');
  // A job's own rule is JOB/NAME; a global rule evaluated for the job is JOB/global.NAME.
  const id = (rule) => `${rule.job ?? 'global'}/${rule.scope === 'global' ? 'global.' : ''}${rule.name}`;
  return rules.map((rule) => el('tr', {dataset: {alarm: id(rule)}},
    el('td', {}, alarmJob(rule.job)),
    el('td', {}, dash(alarmName(rule))),
    el('td', {class: 'mono'}, dash(rule.when)),
    el('td', {class: 'num'}, duration(rule.for_secs)),
    el('td', {class: 'state'}, badge(rule.state)),
    el('td', {class: 'num'}, dash(rule.value)),
    el('td', {}, dash(rule.since))));
}

function alarmHistoryRows(events) {
  if (!events.length) return emptyRow(6, 'No alarm has fired.');
  // The server sends them newest first.
  return events.map((event) => el('tr', {},
    el('td', {}, dash(event.at)),
    el('td', {}, alarmJob(event.job)),
    el('td', {}, dash(alarmName(event))),
    el('td', {class: 'event'}, badge(event.event)),
    el('td', {class: 'num'}, dash(event.value)),
    el('td', {}, dash(event.message))));
}

/* ------------------------------------------------------------------ audit */

function showAudit(view) {
  document.title = 'Audit · Sluice';
  const body = el('tbody');
  const job = el('input', {id: 'audit-job', type: 'text', size: 20, placeholder: 'job', 'aria-label': 'only this job'});
  const actor = el('input', {id: 'audit-actor', type: 'text', size: 20, placeholder: 'token name',
    'aria-label': 'only this token name'});
  view.append(
    el('div', {class: 'page-head'}, el('h1', {}, 'Audit trail')),
    el('p', {class: 'muted'}, 'Every change asked of the server, newest first: recorded before it ran, with who ' +
      'asked, from where, and how it ended.'),
    el('form', {class: 'inline', onsubmit: (event) => {
      event.preventDefault();
      refreshNow();
    }}, job, actor, el('button', {id: 'audit-filter', type: 'submit'}, 'Filter')),
    el('div', {class: 'scroll'}, table('audit', ['At', 'Who', 'Role', 'From', 'Action', 'Job', 'Version', 'Status',
      'Result', 'Diff'], body)));
  page.refresh = async () => {
    const query = new URLSearchParams({limit: '500'});
    if (job.value.trim()) query.set('job', job.value.trim());
    if (actor.value.trim()) query.set('actor', actor.value.trim());
    rebuild(body, auditRows(await get(`/audit?${query}`)));
  };
}

function auditRows(records) {
  if (!records.length) return emptyRow(10, 'No change recorded.');
  return records.map((record) => el('tr', {},
    el('td', {}, new Date(record.at_ms).toISOString()),
    el('td', {}, record.actor),
    el('td', {}, record.role),
    el('td', {}, dash(record.from)),
    el('td', {}, record.action),
    el('td', {}, record.job ? el('a', {href: jobHref(record.job)}, record.job) : '—'),
    el('td', {class: 'num'}, dash(record.version)),
    el('td', {class: 'num'}, dash(record.status)),
    el('td', {}, record.result),
    el('td', {}, record.diff ? el('details', {dataset: {key: `${record.at_ms}-${record.node}`}}, el('summary', {}, 'diff'), el('pre', {class: 'diff'}, record.diff)) : '')));
}

/* ------------------------------------------------------------------ start */

$('nav-logout').addEventListener('click', logOut);
window.addEventListener('hashchange', route);
setInterval(refreshNow, REFRESH_MS);
route();
