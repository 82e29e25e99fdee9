#!/usr/bin/env bash
# Checks the Grafana dashboard ops/grafana/sluice.json (or the file given as $1) without running Grafana:
#
#  1. Grafana's schema: the JSON, verbatim, is type-checked by TypeScript against the dashboard model that
#     Grafana publishes as the npm package @grafana/schema (generated from Grafana's CUE kinds; Grafana's own
#     frontend is built against it): `Dashboard`, and for each panel its type's `Options` and `FieldConfig`
#     from that package's panel schemas (timeseries, stat, table, ...; a panel type without one fails). A wrong
#     type, a missing required field or an unknown field fails. Enum-typed fields are checked against the
#     enum's values, as JSON holds them. Query targets are free-form in that schema: only (2) reads them.
#  2. The PromQL: every metric name in a query is a family that crates/sluice/src/api/metrics.rs writes
#     (a histogram's _bucket/_sum/_count included), so the dashboard cannot drift from the code.
#  3. The layout: every panel has a title, a description and a unit, uses the `datasource` variable, and sits
#     in the 24-column grid without overlapping another.
#
# Needs node and npm. The first run installs the pinned packages into $SLUICE_GRAFANA_CHECK_CACHE
# (default /tmp/sluice-grafana-check); later runs reuse them and need no network.
set -euo pipefail

SCHEMA_VERSION=13.2.3     # @grafana/schema: the dashboard schema of Grafana 13.2.3
TYPESCRIPT_VERSION=5.9.3  # typescript

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
dashboard="$(realpath -m "${1:-$here/sluice.json}")"
metrics="$repo/crates/sluice/src/api/metrics.rs"
cache="${SLUICE_GRAFANA_CHECK_CACHE:-/tmp/sluice-grafana-check}"

fail() {
    echo "grafana check: FAILED: $*" >&2
    exit 1
}

command -v node >/dev/null || fail "node is not installed (Debian: apt-get install nodejs npm)"
command -v npm >/dev/null || fail "npm is not installed (Debian: apt-get install npm)"
[[ -f $dashboard ]] || fail "no dashboard at $dashboard"
[[ -f $metrics ]] || fail "no metrics source at $metrics"

mkdir -p "$cache"
stamp="$cache/.installed-schema-$SCHEMA_VERSION-typescript-$TYPESCRIPT_VERSION"
(
    flock 9
    if [[ ! -f $stamp ]]; then
        echo "grafana check: installing @grafana/schema@$SCHEMA_VERSION and typescript@$TYPESCRIPT_VERSION into $cache"
        rm -rf "$cache/node_modules" "$cache/package-lock.json" "$cache"/.installed-*
        cat >"$cache/package.json" <<EOF
{
  "name": "sluice-grafana-check",
  "private": true,
  "dependencies": {
    "@grafana/schema": "$SCHEMA_VERSION",
    "typescript": "$TYPESCRIPT_VERSION"
  }
}
EOF
        if ! npm install --prefix "$cache" --no-audit --no-fund --ignore-scripts --loglevel=error \
            >"$cache/npm.log" 2>&1; then
            cat "$cache/npm.log" >&2
            fail "npm install into $cache did not succeed"
        fi
        touch "$stamp"
    fi
) 9>"$cache/.lock"

# The checker itself, rewritten on every run so that it always is the one in this file.
cat >"$cache/check.cjs" <<'EOF'
'use strict';
const fs = require('fs');
const path = require('path');

const [dashboardPath, metricsPath, cache, schemaVersion, typescriptVersion] = process.argv.slice(2);
const shown = (file) => {
  const relative = path.relative(process.cwd(), file);
  return relative && !relative.startsWith('..') ? relative : file;
};
const display = shown(dashboardPath);
const errors = [];
const error = (message) => errors.push(message);

const text = fs.readFileSync(dashboardPath, 'utf8');
let dashboard;
try {
  dashboard = JSON.parse(text);
} catch (e) {
  console.error(`grafana check: FAILED: ${display} is not JSON: ${e.message}`);
  process.exit(1);
}
for (const [name, version] of [['@grafana/schema', schemaVersion], ['typescript', typescriptVersion]]) {
  const installed = require(path.join(cache, 'node_modules', name, 'package.json')).version;
  if (installed !== version) {
    console.error(`grafana check: FAILED: ${name} ${installed} is installed in ${cache}, not ${version}`);
    process.exit(1);
  }
}
const isObject = (value) => value !== null && typeof value === 'object' && !Array.isArray(value);
const panelsOf = (list) => (Array.isArray(list) ? list.filter(isObject) : []);
const topPanels = panelsOf(dashboard.panels);
const allPanels = topPanels.flatMap((panel) => [panel, ...(panel.type === 'row' ? panelsOf(panel.panels) : [])]);
const name = (panel) => `panel ${panel.id ?? '?'} "${panel.title ?? ''}"`;

// 1. Grafana's schema, through TypeScript. The JSON goes in verbatim, so a diagnostic's line is its line.
const schemaRoot = path.join(cache, 'node_modules', '@grafana', 'schema', 'dist', 'types');
const panelTypes = [...new Set(allPanels.map((p) => p.type).filter((t) => typeof t === 'string' && t !== 'row'))];
const checkedTypes = [];
const header = [
  "import type * as S from '@grafana/schema';",
  // JSON holds an enum's values: the string enums of the schema become the union of their values.
  'type Json<T> = T extends string ? `${T}` : T extends number | boolean | null | undefined ? T :',
  '  T extends ReadonlyArray<infer U> ? Array<Json<U>> : T extends object ? { [K in keyof T]: Json<T[K]> } : T;',
  "type Defaults<C> = Omit<Json<S.FieldConfig>, 'custom'> & { custom?: Json<C> };",
  "type FieldConfigSource<C> = Omit<Json<S.FieldConfigSource>, 'defaults'> & { defaults: Defaults<C> };",
  "type PanelOf<K extends string, O, C> = Omit<Json<S.Panel>, 'type' | 'options' | 'fieldConfig'> &",
  '  { type: K; options?: Json<O>; fieldConfig?: FieldConfigSource<C> };',
];
const members = [];
panelTypes.forEach((type, index) => {
  const file = path.join(schemaRoot, 'raw', 'composable', type, 'panelcfg', 'x', 'types.gen.d.ts');
  const literal = JSON.stringify(type);
  if (/^[a-z0-9-]+$/.test(type) && fs.existsSync(file)) {
    const source = fs.readFileSync(file, 'utf8');
    const alias = `P${index}`;
    header.push(`import type * as ${alias} from '@grafana/schema/dist/types/raw/composable/${type}/panelcfg/x/types.gen';`);
    const options = /export (interface|type) Options\b/.test(source) ? `${alias}.Options` : 'Record<string, unknown>';
    const custom = /export (interface|type) FieldConfig\b/.test(source) ? `${alias}.FieldConfig` : 'Record<string, unknown>';
    members.push(`PanelOf<${literal}, ${options}, ${custom}>`);
    checkedTypes.push(type);
  } else {
    error(`panel type ${literal} has no panel schema in @grafana/schema: a typo, or a plugin's panel this check cannot see`);
  }
});
header.push(
  `type TypedPanel = ${members.length ? members.join(' | ') : 'never'};`,
  "type TypedRow = Omit<Json<S.RowPanel>, 'panels'> & { panels: Array<TypedPanel> };",
  "type Checked = Omit<Json<S.Dashboard>, 'panels'> & { panels?: Array<TypedPanel | TypedRow> };",
  'export const dashboard: Checked =',
);
const source = `${header.join('\n')}\n${text.trimEnd()}\n;\n`;
const tsFile = path.join(cache, 'dashboard.ts');
fs.writeFileSync(tsFile, source);

const ts = require(path.join(cache, 'node_modules', 'typescript'));
const program = ts.createProgram([tsFile], {
  noEmit: true,
  strict: true,
  skipLibCheck: true,
  target: ts.ScriptTarget.ES2022,
  module: ts.ModuleKind.CommonJS,
  moduleResolution: ts.ModuleResolutionKind.Node10,
  lib: ['lib.es2022.d.ts'],
  types: [],
  baseUrl: cache,
  typeRoots: [],
});
for (const diagnostic of ts.getPreEmitDiagnostics(program)) {
  const message = ts.flattenDiagnosticMessageText(diagnostic.messageText, '\n    ');
  if (diagnostic.file && diagnostic.start !== undefined) {
    const { line, character } = diagnostic.file.getLineAndCharacterOfPosition(diagnostic.start);
    if (path.resolve(diagnostic.file.fileName) === path.resolve(tsFile) && line >= header.length) {
      error(`${display}:${line - header.length + 1}:${character + 1}: TS${diagnostic.code}: ${message}`);
      continue;
    }
    error(`${diagnostic.file.fileName}:${line + 1}:${character + 1}: TS${diagnostic.code}: ${message}`);
  } else {
    error(`TS${diagnostic.code}: ${message}`);
  }
}

// 2. Every metric in the PromQL is a family of metrics.rs.
let rust = fs.readFileSync(metricsPath, 'utf8');
rust = rust.split('#[cfg(test)]')[0];
const families = new Map();
for (const match of rust.matchAll(/"(sluice_[a-z0-9_]+)"/g)) families.set(match[1], families.get(match[1]) ?? 'unknown');
for (const match of rust.matchAll(/"(sluice_[a-z0-9_]+)"\s*,\s*"(counter|gauge|histogram|summary|untyped)"/g)) {
  families.set(match[1], match[2]);
}
for (const match of rust.matchAll(/# TYPE (sluice_[a-z0-9_]+) ([a-z]+)/g)) families.set(match[1], match[2]);
if (families.size === 0) error(`no metric family found in ${metricsPath}: has /metrics moved?`);
const suffixes = { histogram: ['_bucket', '_sum', '_count'], summary: ['_sum', '_count'] };
const known = new Set();
for (const [family, kind] of families) {
  known.add(family);
  for (const suffix of suffixes[kind] ?? []) known.add(family + suffix);
}
const queries = [];
for (const panel of allPanels) {
  for (const target of Array.isArray(panel.targets) ? panel.targets : []) {
    if (typeof target?.expr !== 'string' || !target.expr.trim()) error(`${name(panel)}: a target without an expr`);
    else queries.push([`${name(panel)} target ${target.refId}`, target.expr]);
  }
}
const variables = Array.isArray(dashboard.templating?.list) ? dashboard.templating.list : [];
for (const variable of variables) {
  if (variable?.type !== 'query') continue;
  const query = typeof variable.query === 'string' ? variable.query : variable.query?.query;
  if (typeof query === 'string') queries.push([`variable $${variable.name}`, query]);
}
const used = new Set();
for (const [where, expr] of queries) {
  const names = [...expr.matchAll(/(?<![A-Za-z0-9_:])sluice_[A-Za-z0-9_:]*/g)].map((m) => m[0]);
  if (names.length === 0) error(`${where}: uses no sluice_ metric: ${expr}`);
  for (const metric of names) {
    used.add(metric);
    if (!known.has(metric)) error(`${where}: metric ${metric} is not written by ${path.basename(metricsPath)}: ${expr}`);
  }
}

// 3. Layout and the conventions of this dashboard.
if (dashboard.uid !== 'sluice') error(`uid is ${JSON.stringify(dashboard.uid)}, not "sluice"`);
const datasourceVariable = variables.find((v) => v?.name === 'datasource');
if (datasourceVariable?.type !== 'datasource' || datasourceVariable?.query !== 'prometheus') {
  error('no templating variable "datasource" of type datasource with query prometheus');
}
const jobVariable = variables.find((v) => v?.name === 'job');
if (!jobVariable || !jobVariable.multi || !jobVariable.includeAll) error('no multi-value variable "job" with All');
const ids = new Set();
for (const panel of allPanels) {
  if (ids.has(panel.id)) error(`${name(panel)}: id ${panel.id} is used twice`);
  ids.add(panel.id);
  if (typeof panel.title !== 'string' || !panel.title.trim()) error(`${name(panel)}: no title`);
  if (panel.type === 'row') continue;
  if (typeof panel.description !== 'string' || !panel.description.trim()) error(`${name(panel)}: no description`);
  const unit = panel.fieldConfig?.defaults?.unit;
  if (typeof unit !== 'string' || !unit.trim()) error(`${name(panel)}: no unit (fieldConfig.defaults.unit)`);
  const references = [panel.datasource, ...(panel.targets ?? []).map((t) => t?.datasource)];
  if (references.some((ref) => ref?.uid !== '${datasource}')) error(`${name(panel)}: a datasource other than \${datasource}`);
}
const layouts = [topPanels, ...topPanels.filter((p) => p.type === 'row').map((row) => panelsOf(row.panels))];
for (const group of layouts) {
  const placed = [];
  for (const panel of group) {
    const g = panel.gridPos;
    if (!isObject(g) || ![g.x, g.y, g.w, g.h].every(Number.isInteger)) {
      error(`${name(panel)}: gridPos is not four integers`);
      continue;
    }
    if (g.x < 0 || g.y < 0 || g.w < 1 || g.h < 1 || g.x + g.w > 24) error(`${name(panel)}: gridPos outside the 24-column grid`);
    for (const [other, o] of placed) {
      if (g.x < o.x + o.w && o.x < g.x + g.w && g.y < o.y + o.h && o.y < g.y + g.h) {
        error(`${name(panel)} overlaps ${name(other)}`);
      }
    }
    placed.push([panel, g]);
  }
}

if (errors.length) {
  console.error(errors.join('\n'));
  console.error(`grafana check: FAILED: ${errors.length} problem(s) in ${display}`);
  process.exit(1);
}
console.log(
  `grafana check: ok: ${display} is a dashboard of @grafana/schema ${schemaVersion}` +
    ` (with the options of its ${checkedTypes.join(', ')} panels);` +
    ` ${allPanels.length} panels laid out without overlap;` +
    ` its ${queries.length} queries use ${used.size} metrics, all written by ${shown(metricsPath)}`,
);
EOF

cd "$repo"
node "$cache/check.cjs" "$dashboard" "$metrics" "$cache" "$SCHEMA_VERSION" "$TYPESCRIPT_VERSION"
