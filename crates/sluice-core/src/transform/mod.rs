//! The transform stage: between every source and every sink, in the snapshot and in the change
//! stream alike, a source table's rows become its target table's rows.
//!
//! - `route:` names the target table (rename, move to another database or schema, merge
//!   shards into one table, optionally with an origin column that joins the key);
//! - `transform:` projects (keep, drop, rename, cast, compute columns), filters rows, and masks
//!   personal data (hash with a secret salt, redact, truncate).
//!
//! Rules are compiled once per source schema into a [`TableMapping`]: the target schema and a
//! program that turns a source row into a target row (or drops it). A table no rule touches has
//! an identity mapping and its rows pass as they are, so a job without transforms pays nothing.
//! In a change stream a row image is judged by the filter before and after a change: an update
//! that leaves the filter is a delete, one that enters it an insert.

pub mod expression;
mod mask;

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::change::{Batch, Change, ChangeKind, Rejected, Row};
use crate::error::{Error, ErrorKind, Result, Side};
use crate::schema::{Column, DataType, Index, TableName, TableSchema};
use crate::spec::{EventKinds, JobSpec, Mode, RouteSpec, TransformSpec, WriteMode};
use crate::value::Value;
use expression::{Expression, Scope};
use mask::Mask;

/// The job's routes and transform rules, ready to map tables.
#[derive(Debug, Clone, Default)]
pub struct Transforms {
    routes: Vec<RouteSpec>,
    rules: Vec<TransformSpec>,
    /// The target needs every table's primary key (a change stream, or upserts).
    needs_key: bool,
    /// The source's name when the job is one of several sources merged into one target
    /// (`JobSpec::fan_in`): every target table is shared with the other sources, and an origin
    /// column says `SOURCE/db.table`.
    fan_in: Option<String>,
}

/// How one source table (under one schema) lands in the target.
#[derive(Debug, Clone)]
pub struct TableMapping {
    pub source: Arc<TableSchema>,
    /// The target table, with the sink's own name for it.
    pub target: Arc<TableSchema>,
    /// The rules that apply, for messages and `sluice check` (`route[0], transform[1]`).
    pub rules: Vec<String>,
    program: Option<Arc<Program>>,
    /// The kinds of change of the stream that reach the target (`events:`); `None`: every kind.
    events: Option<EventKinds>,
}

/// Turns a source row into a target row.
#[derive(Debug)]
struct Program {
    /// `transform[1] (line 14)`, for messages.
    rule: String,
    filter: Option<Expression>,
    outputs: Vec<Output>,
    /// The source table's full name, appended when the route has an origin column.
    origin: Option<Value>,
}

#[derive(Debug)]
struct Output {
    value: OutputValue,
    mask: Option<Mask>,
}

#[derive(Debug)]
enum OutputValue {
    /// A source column; `last` when no later output takes the same column, so it is moved.
    Column {
        index: usize,
        last: bool,
    },
    Computed(Expression),
}

/// What happened to a batch in the transform stage.
#[derive(Debug)]
pub struct Transformed {
    pub batch: Batch,
    /// Rows the filter left out.
    pub filtered: u64,
}

fn located(path: &str, line: Option<usize>) -> String {
    match line {
        Some(line) => format!("{path} (line {line})"),
        None => path.to_owned(),
    }
}

impl Transforms {
    pub fn of(job: &JobSpec) -> Transforms {
        Transforms {
            routes: job.routes.clone(),
            rules: job.transforms.clone(),
            needs_key: job.mode != Mode::Snapshot || job.target.write_mode == WriteMode::Upsert,
            fan_in: job.fan_in.clone(),
        }
    }

    /// Whether every target table is shared with other sources' rows (`JobSpec::fan_in`).
    pub(crate) fn fans_in(&self) -> bool {
        self.fan_in.is_some()
    }

    /// No route and no rule: every mapping is the identity.
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty() && self.rules.is_empty()
    }

    fn route(&self, table: &TableName) -> Option<&RouteSpec> {
        let full = table.to_string();
        self.routes.iter().find(|route| route.pattern.is_match(&full))
    }

    fn rule(&self, table: &TableName) -> Option<&TransformSpec> {
        let full = table.to_string();
        self.rules.iter().find(|rule| rule.pattern.is_match(&full))
    }

    /// Whether two source names fall under the same route and transform rules (a renamed
    /// table keeps its shape and masks only then).
    pub(crate) fn same_rules(&self, one: &TableName, other: &TableName) -> bool {
        let position = |name: &TableName| {
            let full = name.to_string();
            (
                self.routes.iter().position(|route| route.pattern.is_match(&full)),
                self.rules.iter().position(|rule| rule.pattern.is_match(&full)),
            )
        };
        position(one) == position(other)
    }

    /// Checks that a table merged into the same target as `first` has its shape, and that the
    /// merge can tell their rows apart where the job needs it.
    pub(crate) fn check_merge(&self, first: &TableMapping, other: &TableMapping) -> Result<()> {
        self.merge_problem(first, other).map_or(Ok(()), |problem| {
            Err(Error::new(ErrorKind::Schema, problem)
                .on(Side::Target)
                .hint("tables merged into one target must keep one shape; change them together, or route them apart"))
        })
    }

    fn merge_problem(&self, first: &TableMapping, other: &TableMapping) -> Option<String> {
        let target = &first.target.name;
        let route = self.route(&other.source.name)?;
        if let Some(difference) = shape_difference(&first.target, &other.target) {
            return Some(format!(
                "{}: source tables {} and {} are merged into {target} but differ: {difference}",
                located(&route.path, route.line),
                first.source.name,
                other.source.name
            ));
        }
        if self.needs_key && route.origin_column.is_none() {
            return Some(format!(
                "{}: source tables {} and {} are merged into {target} without an `origin_column`: in a change stream (or with upserts) a key both hold would make one table's changes overwrite the other's row; add `origin_column: <name>`",
                located(&route.path, route.line),
                first.source.name,
                other.source.name
            ));
        }
        None
    }

    /// The name a source table gets before the sink's own naming (its `namespace`): the route's
    /// `sink_table`, else the source name.
    pub(crate) fn routed_name(&self, table: &TableName) -> TableName {
        let Some(route) = self.route(table) else { return table.clone() };
        let sink = match &route.replace_symbol {
            Some(symbol) => route.sink_table.replace(symbol.as_str(), &table.name),
            None => route.sink_table.clone(),
        };
        match sink.split_once('.') {
            Some((namespace, name)) => TableName::new(Some(namespace), name),
            None => TableName { namespace: table.namespace.clone(), name: sink },
        }
    }

    /// The target name of a source table: routed, then named by the sink.
    pub fn target_name(&self, table: &TableName, sink_name: &dyn Fn(&TableName) -> TableName) -> TableName {
        sink_name(&self.routed_name(table))
    }

    /// Maps one source table. Errors name the rule, its line and what is wrong.
    pub fn map(&self, source: &Arc<TableSchema>, sink_name: &dyn Fn(&TableName) -> TableName) -> Result<TableMapping> {
        self.map_onto(source, sink_name, None)
    }

    /// Maps one source table onto a target table that has only the columns `kept` (its names
    /// there; `None`: every column the rules make). What the rules make and the target lacks is
    /// left out (`schema_changes: ignore`); a left-out key column is a problem where the job needs
    /// the key.
    pub fn map_onto(
        &self,
        source: &Arc<TableSchema>,
        sink_name: &dyn Fn(&TableName) -> TableName,
        kept: Option<&[String]>,
    ) -> Result<TableMapping> {
        self.map_table(source, sink_name, kept).map_err(|problems| {
            Error::new(ErrorKind::Config, problems.join("; "))
                .hint("fix the job's `route` or `transform` rules for this table, or exclude it from source.tables")
        })
    }

    fn map_table(
        &self,
        source: &Arc<TableSchema>,
        sink_name: &dyn Fn(&TableName) -> TableName,
        kept: Option<&[String]>,
    ) -> std::result::Result<TableMapping, Vec<String>> {
        let keeps = |name: &str| kept.is_none_or(|kept| kept.iter().any(|known| known.eq_ignore_ascii_case(name)));
        let name = self.target_name(&source.name, sink_name);
        let route = self.route(&source.name);
        let rule = self.rule(&source.name);
        let mut rules = Vec::new();
        if let Some(route) = route {
            rules.push(route.path.clone());
        }
        if let Some(rule) = rule {
            rules.push(rule.path.clone());
        }
        let origin = route.and_then(|route| route.origin_column.as_ref().map(|column| (route, column)));
        if let Some(fan_in) = self.fan_in.as_ref().filter(|_| self.needs_key && origin.is_none()) {
            return Err(vec![format!(
                "sources[{fan_in}]: table {} goes into {name}, which the job's other sources write too, without an `origin_column`: in a change stream (or with upserts) a key two sources hold would make one's changes overwrite the other's row; add a route with `origin_column: <name>` for it (e.g. `route: [{{source_table: '{}\\..*', sink_table: '{}.<>', replace_symbol: '<>', origin_column: _source}}]`)",
                source.name,
                source.name.namespace.as_deref().unwrap_or("db"),
                source.name.namespace.as_deref().unwrap_or("db"),
            )]);
        }
        if rule.is_none() && origin.is_none() && source.columns.iter().all(|column| keeps(&column.name)) {
            let target = TableSchema { name, ..(**source).clone() };
            return Ok(TableMapping {
                source: source.clone(),
                target: Arc::new(target),
                rules,
                program: None,
                events: None,
            });
        }
        let mut problems = Vec::new();
        let scope = Scope { table: &source.name, columns: &source.columns };
        let rule_name = match (rule, kept) {
            (Some(rule), _) => located(&rule.path, rule.line),
            (None, Some(_)) => "schema_changes: ignore".to_owned(),
            (None, None) => String::new(),
        };
        let mut outputs = outputs_of(rule, source, scope, &rule_name, &mut problems);
        outputs.retain(|(name, _, _)| keeps(name));
        let filter = filter_of(rule, scope, &mut problems);
        let mut masks = masks_of(rule, &outputs, source, &mut problems);
        // Columns moved out of the source row must be the last use of that column.
        let mut taken = std::collections::HashSet::new();
        for (_, value, _) in outputs.iter_mut().rev() {
            if let OutputValue::Column { index, last } = value {
                *last = taken.insert(*index);
            }
        }
        let mut columns: Vec<Column> = Vec::with_capacity(outputs.len() + 1);
        for (position, (name, _, column)) in outputs.iter().enumerate() {
            let mut column = Column { name: name.clone(), ..column.clone() };
            if let Some(mask) = masks.get(&position) {
                mask.reshape(&mut column);
            }
            columns.push(column);
        }
        let (mut primary_key, mut indexes) = self.keys_of(source, &outputs, &masks, &rule_name, &mut problems);
        let origin_value = origin.map(|(route, column)| {
            add_origin(route, column, source, &mut columns, &mut primary_key, &mut indexes, &mut problems);
            Value::Text(match &self.fan_in {
                Some(fan_in) => format!("{fan_in}/{}", source.name),
                None => source.name.to_string(),
            })
        });
        if !problems.is_empty() {
            return Err(problems);
        }
        let target = TableSchema { name, columns, primary_key, indexes, details: source.details.clone() };
        let outputs = outputs
            .into_iter()
            .enumerate()
            .map(|(position, (_, value, _))| Output { value, mask: masks.remove(&position) })
            .collect();
        let program = Program {
            rule: if rule_name.is_empty() { rules.join(", ") } else { rule_name },
            filter,
            outputs,
            origin: origin_value,
        };
        Ok(TableMapping {
            source: source.clone(),
            target: Arc::new(target),
            rules,
            program: Some(Arc::new(program)),
            events: rule.and_then(|rule| rule.events),
        })
    }

    /// The target's primary key and indexes: each source key or index column, where the
    /// projection keeps it unchanged (a hash mask keeps equal values equal, so a hashed key is
    /// still a key). A key the projection changes is dropped, which a job that needs the key
    /// cannot have.
    fn keys_of(
        &self,
        source: &TableSchema,
        outputs: &[(String, OutputValue, Column)],
        masks: &BTreeMap<usize, Mask>,
        rule_name: &str,
        problems: &mut Vec<String>,
    ) -> (Vec<usize>, Vec<Index>) {
        let plain = |index: usize| {
            outputs.iter().enumerate().position(|(position, (_, value, _))| {
                matches!(value, OutputValue::Column { index: column, .. } if *column == index)
                    && masks.get(&position).is_none_or(Mask::keeps_identity)
            })
        };
        let mut primary_key: Vec<usize> = Vec::with_capacity(source.primary_key.len() + 1);
        let mut dropped = Vec::new();
        for &index in &source.primary_key {
            match plain(index) {
                Some(position) => primary_key.push(position),
                None => dropped.push(source.columns[index].name.clone()),
            }
        }
        if !dropped.is_empty() {
            if self.needs_key {
                problems.push(format!(
                    "{rule_name}: table {} keeps its primary key column(s) {} only unchanged (renamed or hashed is fine), and this job needs the key to apply updates, deletes or upserts",
                    source.name,
                    dropped.join(", ")
                ));
            }
            primary_key.clear();
        }
        let indexes: Vec<Index> = source
            .indexes
            .iter()
            .filter_map(|index| {
                let columns: Option<Vec<usize>> = index.columns.iter().map(|&column| plain(column)).collect();
                Some(Index { columns: columns?, ..index.clone() })
            })
            .collect();
        (primary_key, indexes)
    }

    /// Maps every table of a job and checks that tables merged into one target agree on its
    /// shape. Every problem is reported at once.
    pub fn map_all(
        &self,
        sources: Vec<TableSchema>,
        sink_name: &dyn Fn(&TableName) -> TableName,
    ) -> Result<Vec<TableMapping>> {
        let mut problems = Vec::new();
        let mut mappings: Vec<TableMapping> = Vec::with_capacity(sources.len());
        for source in sources {
            match self.map_table(&Arc::new(source), sink_name, None) {
                Ok(mapping) => mappings.push(mapping),
                Err(found) => problems.extend(found),
            }
        }
        let mut by_target: BTreeMap<&TableName, Vec<&TableMapping>> = BTreeMap::new();
        for mapping in &mappings {
            by_target.entry(&mapping.target.name).or_default().push(mapping);
        }
        for (target, group) in &by_target {
            let Some((first, others)) = group.split_first() else { continue };
            if !others.is_empty() && group.iter().any(|mapping| self.route(&mapping.source.name).is_none()) {
                let names: Vec<String> = group.iter().map(|mapping| mapping.source.name.to_string()).collect();
                problems.push(format!(
                    "source tables {} all map to target table {target}; merge them with a `route` rule, or select only one",
                    names.join(", ")
                ));
                continue;
            }
            for other in others {
                problems.extend(self.merge_problem(first, other));
            }
        }
        if problems.is_empty() {
            return Ok(mappings);
        }
        Err(Error::new(ErrorKind::Config, problems.join("; "))
            .on(Side::Target)
            .hint("fix the job's `route` or `transform` rules, or narrow source.tables"))
    }
}

/// The target tables of a job's mappings, each once (tables merged into one target are
/// nullable wherever one of them is).
pub fn target_tables(mappings: &[TableMapping]) -> Vec<TableSchema> {
    let mut targets: Vec<TableSchema> = Vec::with_capacity(mappings.len());
    for mapping in mappings {
        match targets.iter_mut().find(|known| known.name == mapping.target.name) {
            Some(known) => {
                for (column, other) in known.columns.iter_mut().zip(&mapping.target.columns) {
                    column.nullable |= other.nullable;
                }
            }
            None => targets.push((*mapping.target).clone()),
        }
    }
    targets
}

/// How two tables merged into one target differ, if they do (nullability aside).
fn shape_difference(first: &TableSchema, other: &TableSchema) -> Option<String> {
    let names = |table: &TableSchema| table.columns.iter().map(|column| column.name.clone()).collect::<Vec<_>>();
    if names(first) != names(other) {
        return Some(format!("columns ({}) against ({})", names(first).join(", "), names(other).join(", ")));
    }
    for (a, b) in first.columns.iter().zip(&other.columns) {
        if a.data_type != b.data_type {
            return Some(format!("column `{}` is {} in one and {} in the other", a.name, describe(a), describe(b)));
        }
    }
    if first.primary_key != other.primary_key {
        return Some("their primary keys".into());
    }
    None
}

fn describe(column: &Column) -> String {
    if column.native_type.is_empty() {
        format!("{:?}", column.data_type)
    } else {
        column.native_type.clone()
    }
}

/// A rule's output columns: the projection's items, else every source column. Two outputs
/// with one name are a problem.
fn outputs_of(
    rule: Option<&TransformSpec>,
    source: &TableSchema,
    scope: Scope,
    rule_name: &str,
    problems: &mut Vec<String>,
) -> Vec<(String, OutputValue, Column)> {
    let mut outputs: Vec<(String, OutputValue, Column)> = Vec::new();
    match rule.and_then(|rule| rule.projection.as_ref().map(|projection| (rule, projection))) {
        None => {
            for (index, column) in source.columns.iter().enumerate() {
                outputs.push((column.name.clone(), OutputValue::Column { index, last: true }, column.clone()));
            }
        }
        Some((rule, (_, items))) => {
            let at = located(&format!("{}.projection", rule.path), rule.projection_line);
            for item in items {
                match project(item, scope) {
                    Ok(items) => outputs.extend(items),
                    Err(problem) => problems.push(format!("{at}: {problem}")),
                }
            }
        }
    }
    let mut seen = std::collections::HashSet::new();
    for (name, _, _) in &outputs {
        if !seen.insert(name.to_ascii_lowercase()) {
            problems.push(format!("{rule_name}: the projection makes two columns named `{name}`; rename one with AS"));
        }
    }
    outputs
}

/// A rule's filter, compiled.
fn filter_of(rule: Option<&TransformSpec>, scope: Scope, problems: &mut Vec<String>) -> Option<Expression> {
    let (rule, (_, predicate)) = rule.and_then(|rule| rule.filter.as_ref().map(|filter| (rule, filter)))?;
    match Expression::compile(predicate, scope) {
        Ok(filter) => Some(filter),
        Err(problem) => {
            problems.push(format!("{}: {problem}", located(&format!("{}.filter", rule.path), rule.filter_line)));
            None
        }
    }
}

/// A rule's masks, by output column.
fn masks_of(
    rule: Option<&TransformSpec>,
    outputs: &[(String, OutputValue, Column)],
    source: &TableSchema,
    problems: &mut Vec<String>,
) -> BTreeMap<usize, Mask> {
    let mut masks: BTreeMap<usize, Mask> = BTreeMap::new();
    let Some(rule) = rule else { return masks };
    for spec in &rule.mask {
        let at = located(&format!("{}.mask.{}", rule.path, spec.column), spec.line);
        let Some(position) = outputs.iter().position(|(name, _, _)| name.eq_ignore_ascii_case(&spec.column)) else {
            let names: Vec<&str> = outputs.iter().map(|(name, _, _)| name.as_str()).collect();
            problems.push(format!(
                "{at}: table {} has no output column `{}` to mask; its columns: {}",
                source.name,
                spec.column,
                names.join(", ")
            ));
            continue;
        };
        match Mask::new(&spec.rule, rule.salt.as_ref(), &outputs[position].2) {
            Ok(mask) => {
                masks.insert(position, mask);
            }
            Err(problem) => problems.push(format!("{at}: {problem}")),
        }
    }
    masks
}

/// Adds a route's origin column (it holds the source table's name; `SOURCE/db.table` with
/// `sources:`) to the target table: last, in the primary key when there is one, and in each
/// unique index.
fn add_origin(
    route: &RouteSpec,
    column: &str,
    source: &TableSchema,
    columns: &mut Vec<Column>,
    primary_key: &mut Vec<usize>,
    indexes: &mut [Index],
    problems: &mut Vec<String>,
) {
    if columns.iter().any(|known| known.name.eq_ignore_ascii_case(column)) {
        problems.push(format!(
            "{}: origin_column `{column}` is already a column of table {}; choose another name",
            located(&route.path, route.line),
            source.name
        ));
    }
    let position = columns.len();
    columns.push(Column::new(column.to_owned(), DataType::Text { length: Some(192), fixed: false }, false));
    if !primary_key.is_empty() {
        primary_key.push(position);
    }
    // A unique key of one shard is unique per shard only.
    for index in indexes.iter_mut().filter(|index| index.unique) {
        index.columns.push(position);
    }
}

/// One select item's output columns.
fn project(
    item: &sqlparser::ast::SelectItem,
    scope: Scope<'_>,
) -> std::result::Result<Vec<(String, OutputValue, Column)>, String> {
    use sqlparser::ast::SelectItem;
    let compiled = |expression: &sqlparser::ast::Expr, name: Option<String>| {
        let compiled = Expression::compile(expression, scope)?;
        let name = match (name, compiled.column()) {
            (Some(name), _) => name,
            (None, Some(index)) => scope.columns[index].name.clone(),
            (None, None) => {
                return Err(format!("give the computed column `{expression}` a name: `{expression} AS name`"))
            }
        };
        let column = match compiled.column() {
            Some(index) => scope.columns[index].clone(),
            None => Column::new(name.clone(), compiled.data_type.clone(), compiled.nullable),
        };
        let value = match compiled.column() {
            Some(index) => OutputValue::Column { index, last: true },
            None => OutputValue::Computed(compiled),
        };
        Ok(vec![(name, value, column)])
    };
    match item {
        SelectItem::UnnamedExpr(expression) => compiled(expression, None),
        SelectItem::ExprWithAlias { expr, alias } => compiled(expr, Some(alias.value.clone())),
        SelectItem::Wildcard(options) => {
            if options.opt_ilike.is_some()
                || options.opt_replace.is_some()
                || options.opt_rename.is_some()
                || options.opt_alias.is_some()
            {
                return Err(format!("`{item}` is not supported; write `*`, `* EXCEPT (a, b)` or list the columns"));
            }
            let mut excluded: Vec<(String, bool)> = Vec::new();
            if let Some(except) = &options.opt_except {
                for ident in std::iter::once(&except.first_element).chain(&except.additional_elements) {
                    excluded.push((ident.value.clone(), ident.quote_style.is_some()));
                }
            }
            if let Some(exclude) = &options.opt_exclude {
                let names = match exclude {
                    sqlparser::ast::ExcludeSelectItem::Single(name) => vec![name.clone()],
                    sqlparser::ast::ExcludeSelectItem::Multiple(names) => names.clone(),
                };
                for name in names {
                    let text = name.to_string();
                    excluded.push((text.trim_matches(['"', '`']).to_owned(), text.starts_with(['"', '`'])));
                }
            }
            let mut skip = std::collections::HashSet::new();
            for (name, quoted) in &excluded {
                match scope.resolve(name, *quoted) {
                    Some(index) => {
                        skip.insert(index);
                    }
                    None => return Err(format!("table {} has no column `{name}` to leave out", scope.table)),
                }
            }
            Ok(scope
                .columns
                .iter()
                .enumerate()
                .filter(|(index, _)| !skip.contains(index))
                .map(|(index, column)| (column.name.clone(), OutputValue::Column { index, last: true }, column.clone()))
                .collect())
        }
        other => Err(format!("`{other}` is not supported in a projection")),
    }
}

impl TableMapping {
    /// The origin column a route adds (its name in the target) and the value it holds for this
    /// source table's rows.
    pub fn origin(&self) -> Option<(&str, &Value)> {
        let value = self.program.as_ref()?.origin.as_ref()?;
        let column = self.target.columns.last()?;
        Some((column.name.as_str(), value))
    }

    /// Rows pass as they are (only the table's name may change).
    pub fn is_identity(&self) -> bool {
        self.program.is_none()
    }

    /// A source row as a target row, or `None` when the filter leaves it out.
    pub fn row(&self, row: Row) -> std::result::Result<Option<Row>, String> {
        match &self.program {
            None => Ok(Some(row)),
            Some(program) => program.row(row),
        }
    }

    /// A batch of the source table as a batch of the target table. A row that cannot be
    /// transformed (a lossy cast, a number too large) is a dirty record, never dropped silently.
    /// The same mapping onto a target table of another name (a resync's hidden copy).
    pub fn renamed(&self, name: TableName) -> TableMapping {
        TableMapping { target: Arc::new(TableSchema { name, ..(*self.target).clone() }), ..self.clone() }
    }

    pub fn batch(&self, batch: Batch) -> Transformed {
        let Batch { changes, position, mut rejected, bytes, encoded } = batch;
        let mut out = Vec::with_capacity(changes.len());
        let mut filtered = 0;
        for change in changes {
            let row = match change.kind {
                ChangeKind::Insert { after } => after,
                // Snapshots carry inserts only; anything else goes through `change`.
                other => {
                    match self.change(Change { table: change.table, kind: other }) {
                        Ok(Some(change)) => out.push(change),
                        Ok(None) => filtered += 1,
                        Err(error) => rejected.push(Rejected {
                            table: self.source.name.to_string(),
                            key: String::from("(a change of the batch)"),
                            reason: error.to_string(),
                            record: None,
                            change: None,
                        }),
                    }
                    continue;
                }
            };
            let outcome = match &self.program {
                None => Ok(Some(row)),
                Some(program) => program.row_or_back(row),
            };
            match outcome {
                Ok(Some(after)) => out.push(Change::insert(self.target.clone(), after)),
                Ok(None) => filtered += 1,
                Err((reason, row)) => {
                    rejected.push(Rejected::row(&self.source, &row, format!("source: {}: {reason}", self.rule_name())))
                }
            }
        }
        Transformed { batch: Batch { changes: out, position, rejected, bytes, encoded }, filtered }
    }

    /// A source change as a target change; `None` when the filter leaves both images out, or
    /// the rule's `events` leave its kind out. An update whose row leaves the filter is a delete,
    /// one whose row enters it an insert.
    pub fn change(&self, change: Change) -> Result<Option<Change>> {
        let mapped = self.mapped_change(change)?;
        let Some(events) = self.events else { return Ok(mapped) };
        Ok(mapped.filter(|change| match change.kind {
            ChangeKind::Insert { .. } => events.insert,
            ChangeKind::Update { .. } => events.update,
            ChangeKind::Delete { .. } => events.delete,
        }))
    }

    fn mapped_change(&self, change: Change) -> Result<Option<Change>> {
        let table = self.target.clone();
        let Some(program) = &self.program else {
            return Ok(Some(Change { table, kind: change.kind }));
        };
        let failed = |reason: String| {
            Error::new(
                ErrorKind::Data,
                format!("change stream: table {}: {}: {reason}", self.source.name, program.rule),
            )
            .on(Side::Source)
            .hint("fix the transform rule (a row of the stream cannot be skipped without breaking the rows after it)")
        };
        let kind = match change.kind {
            ChangeKind::Insert { after } => {
                program.row(after).map_err(failed)?.map(|after| ChangeKind::Insert { after })
            }
            ChangeKind::Delete { before } => {
                program.row(before).map_err(failed)?.map(|before| ChangeKind::Delete { before })
            }
            ChangeKind::Update { before, after } => {
                match (program.row(before).map_err(failed)?, program.row(after).map_err(failed)?) {
                    (Some(before), Some(after)) => Some(ChangeKind::Update { before, after }),
                    (Some(before), None) => Some(ChangeKind::Delete { before }),
                    (None, Some(after)) => Some(ChangeKind::Insert { after }),
                    (None, None) => None,
                }
            }
        };
        Ok(kind.map(|kind| Change { table, kind }))
    }

    /// The target column a source column lands in unchanged (renamed or not), if one does.
    pub(crate) fn target_column(&self, source_column: &str) -> Option<String> {
        let index = self.source.column_index(source_column)?;
        let Some(program) = &self.program else { return Some(source_column.to_owned()) };
        program
            .outputs
            .iter()
            .position(|output| matches!(output.value, OutputValue::Column { index: column, .. } if column == index))
            .map(|position| self.target.columns[position].name.clone())
    }

    /// The source row's primary key read off a row of the target table: the values of the
    /// target columns the source key columns pass into unchanged (not computed or masked), in
    /// the source key's order; `None` when one does not pass through so, or the source table has
    /// no primary key.
    pub(crate) fn source_key(&self, target_row: &Row) -> Option<Row> {
        if self.source.primary_key.is_empty() {
            return None;
        }
        let passed = |index: usize| -> Option<usize> {
            let Some(program) = &self.program else { return Some(index) };
            program.outputs.iter().position(|output| {
                output.mask.is_none()
                    && matches!(output.value, OutputValue::Column { index: column, .. } if column == index)
            })
        };
        self.source.primary_key.iter().map(|&index| target_row.get(passed(index)?).cloned()).collect()
    }

    fn rule_name(&self) -> &str {
        self.program.as_ref().map_or("", |program| program.rule.as_str())
    }

    /// Whether a rule filters this table's rows.
    pub fn has_filter(&self) -> bool {
        self.program.as_ref().is_some_and(|program| program.filter.is_some())
    }
}

impl Program {
    fn row(&self, row: Row) -> std::result::Result<Option<Row>, String> {
        self.row_or_back(row).map_err(|(reason, _)| reason)
    }

    /// Like `row`; a row that fails comes back with the reason, whole, for its dirty record.
    fn row_or_back(&self, mut row: Row) -> std::result::Result<Option<Row>, (String, Row)> {
        if let Some(filter) = &self.filter {
            match filter.holds(&row) {
                Ok(true) => {}
                Ok(false) => return Ok(None),
                Err(reason) => return Err((reason, row)),
            }
        }
        let mut out: Vec<Value> = Vec::with_capacity(self.outputs.len() + usize::from(self.origin.is_some()));
        // Computed values first, while every source value is still in place.
        for output in &self.outputs {
            out.push(match &output.value {
                OutputValue::Computed(expression) => match expression.evaluate(&row) {
                    Ok(value) => value.into_owned(),
                    Err(reason) => return Err((reason, row)),
                },
                OutputValue::Column { .. } => Value::Null,
            });
        }
        for (slot, output) in out.iter_mut().zip(&self.outputs) {
            if let OutputValue::Column { index, last } = output.value {
                *slot = if last { std::mem::replace(&mut row[index], Value::Null) } else { row[index].clone() };
            }
            if let Some(mask) = &output.mask {
                mask.apply(slot);
            }
        }
        if let Some(origin) = &self.origin {
            out.push(origin.clone());
        }
        Ok(Some(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::parse_job;
    use crate::value::Decimal;

    fn environment(name: &str) -> Option<String> {
        (name == "SALT").then(|| "a-salt-of-sixteen-chars".to_owned())
    }

    fn job(rules: &str) -> JobSpec {
        let text = format!(
            "name: t\nmode: snapshot+cdc\nsource: {{type: mysql, url: 'mysql://u@h:1'}}\ntarget: {{type: postgres, url: 'postgres://u@h/d'}}\n{rules}"
        );
        parse_job(&text, false, environment).unwrap_or_else(|errors| panic!("{errors:?}"))
    }

    /// Every problem of a job with these rules, as one text.
    fn parse_job_errors(rules: &str) -> String {
        let text = format!(
            "name: t\nmode: snapshot+cdc\nsource: {{type: mysql, url: 'mysql://u@h:1'}}\ntarget: {{type: postgres, url: 'postgres://u@h/d'}}\n{rules}"
        );
        let errors = parse_job(&text, false, environment).expect_err("the rules are invalid");
        errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n")
    }

    fn customers(name: &str) -> TableSchema {
        TableSchema {
            name: TableName::parse(name),
            columns: vec![
                Column::new("id", DataType::Integer { bytes: 4, unsigned: false }, false),
                Column::new("name", DataType::Text { length: Some(50), fixed: false }, false),
                Column::new("email", DataType::Text { length: Some(80), fixed: false }, true),
                Column::new("balance", DataType::Decimal { precision: Some(10), scale: Some(2) }, false),
            ],
            primary_key: vec![0],
            indexes: vec![Index { name: "email_unique".into(), columns: vec![2], unique: true }],
            details: Default::default(),
        }
    }

    fn row(id: i64, name: &str, email: Option<&str>, balance: &str) -> Row {
        vec![
            Value::Int(id),
            Value::Text(name.into()),
            email.map_or(Value::Null, |email| Value::Text(email.into())),
            Value::Decimal(Decimal::parse(balance).unwrap()),
        ]
    }

    fn public(name: &TableName) -> TableName {
        TableName::new(Some(name.namespace.as_deref().unwrap_or("public")), &name.name)
    }

    #[test]
    fn a_table_without_rules_is_only_renamed() {
        let transforms = Transforms::of(&job(""));
        let mapping = transforms.map(&Arc::new(customers("shop.customers")), &public).unwrap();
        assert!(mapping.is_identity());
        assert_eq!(mapping.target.name, TableName::parse("shop.customers"));
    }

    #[test]
    fn projection_filter_and_masks_make_the_target_rows() {
        let transforms = Transforms::of(&job(
            "transform:\n  - source_table: shop\\.customers\n    projection: \"id, upper(name) AS name, email AS contact, balance * 2 AS doubled\"\n    filter: id > 10\n    mask: {contact: hash, name: truncate(3)}\n    salt: ${SALT}\n",
        ));
        let mapping = transforms.map(&Arc::new(customers("shop.customers")), &public).unwrap();
        let names: Vec<&str> = mapping.target.columns.iter().map(|column| column.name.as_str()).collect();
        assert_eq!(names, ["id", "name", "contact", "doubled"]);
        assert_eq!(mapping.target.primary_key, vec![0]);
        assert_eq!(mapping.target.columns[2].data_type, DataType::Text { length: Some(64), fixed: true });
        assert_eq!(mapping.target.indexes.len(), 1, "a hashed unique column stays unique");
        assert_eq!(mapping.row(row(5, "Ada", None, "1.00")).unwrap(), None);
        let out = mapping.row(row(11, "Grace", Some("g@x.org"), "2.50")).unwrap().unwrap();
        assert_eq!(out[0], Value::Int(11));
        assert_eq!(out[1], Value::Text("GRA".into()));
        let Value::Text(hash) = &out[2] else { panic!("{out:?}") };
        assert_eq!(hash.len(), 64);
        assert_eq!(out[3], Value::Decimal(Decimal::parse("5.00").unwrap()));
        // Equal values hash equally; NULL stays NULL.
        let again = mapping.row(row(12, "Grace", Some("g@x.org"), "0")).unwrap().unwrap();
        assert_eq!(again[2], out[2]);
        assert_eq!(mapping.row(row(13, "Linus", None, "0")).unwrap().unwrap()[2], Value::Null);
    }

    #[test]
    fn a_table_mapped_onto_fewer_target_columns_leaves_the_others_out() {
        // `schema_changes: ignore`: the target lacks `email` (added at the source since).
        let kept = ["ID".to_owned(), "name".to_owned(), "balance".to_owned()];
        let plain = Transforms::of(&job(""));
        let mapping = plain.map_onto(&Arc::new(customers("shop.customers")), &public, Some(&kept)).unwrap();
        let names: Vec<&str> = mapping.target.columns.iter().map(|column| column.name.as_str()).collect();
        assert_eq!(names, ["id", "name", "balance"]);
        assert_eq!(mapping.target.primary_key, vec![0]);
        assert!(mapping.target.indexes.is_empty(), "the index on the left-out column goes with it");
        let out = mapping.row(row(7, "Ada", Some("a@x.org"), "1.50")).unwrap().unwrap();
        assert_eq!(
            out,
            vec![Value::Int(7), Value::Text("Ada".into()), Value::Decimal(Decimal::parse("1.50").unwrap())]
        );
        // Every column kept: the identity.
        let all = ["id", "name", "email", "balance"].map(str::to_owned);
        assert!(plain.map_onto(&Arc::new(customers("shop.customers")), &public, Some(&all)).unwrap().is_identity());
        // With a rule, what the rule makes is narrowed; a left-out key is named where the job needs it.
        let renamed = Transforms::of(&job(
            "transform:\n  - source_table: shop.customers\n    projection: \"id, name AS full_name, balance\"\n",
        ));
        let mapping = renamed.map_onto(&Arc::new(customers("shop.customers")), &public, Some(&kept)).unwrap();
        let names: Vec<&str> = mapping.target.columns.iter().map(|column| column.name.as_str()).collect();
        assert_eq!(names, ["id", "balance"]);
        let keyless = ["name".to_owned()];
        let error = plain.map_onto(&Arc::new(customers("shop.customers")), &public, Some(&keyless)).unwrap_err();
        assert!(
            error.to_string().contains("schema_changes: ignore: table shop.customers keeps its primary key"),
            "{error}"
        );
    }

    #[test]
    fn updates_that_cross_the_filter_become_inserts_and_deletes() {
        let transforms =
            Transforms::of(&job("transform:\n  - source_table: shop.customers\n    filter: balance >= 100\n"));
        let mapping = transforms.map(&Arc::new(customers("shop.customers")), &public).unwrap();
        let update = |before: &str, after: &str| {
            let change = Change {
                table: mapping.source.clone(),
                kind: ChangeKind::Update { before: row(1, "a", None, before), after: row(1, "a", None, after) },
            };
            mapping.change(change).unwrap().map(|change| match change.kind {
                ChangeKind::Insert { .. } => "insert",
                ChangeKind::Update { .. } => "update",
                ChangeKind::Delete { .. } => "delete",
            })
        };
        assert_eq!(update("150", "200"), Some("update"));
        assert_eq!(update("150", "50"), Some("delete"));
        assert_eq!(update("50", "150"), Some("insert"));
        assert_eq!(update("50", "60"), None);
    }

    #[test]
    fn events_keep_the_kinds_of_change_a_rule_names_and_every_snapshot_row() {
        let transforms = Transforms::of(&job(
            "transform:\n  - source_table: shop.customers\n    filter: balance >= 100\n    events: [insert, update]\n",
        ));
        let mapping = transforms.map(&Arc::new(customers("shop.customers")), &public).unwrap();
        let kind_of = |kind: ChangeKind| {
            mapping.change(Change { table: mapping.source.clone(), kind }).unwrap().map(|change| match change.kind {
                ChangeKind::Insert { .. } => "insert",
                ChangeKind::Update { .. } => "update",
                ChangeKind::Delete { .. } => "delete",
            })
        };
        assert_eq!(kind_of(ChangeKind::Insert { after: row(1, "a", None, "150") }), Some("insert"));
        assert_eq!(
            kind_of(ChangeKind::Update { before: row(1, "a", None, "150"), after: row(1, "a", None, "200") }),
            Some("update")
        );
        assert_eq!(kind_of(ChangeKind::Delete { before: row(1, "a", None, "150") }), None, "a delete is left out");
        assert_eq!(
            kind_of(ChangeKind::Update { before: row(1, "a", None, "150"), after: row(1, "a", None, "50") }),
            None,
            "an update leaving the filter is a delete: left out too"
        );
        let snapshot = Batch::new(
            vec![Change::insert(mapping.source.clone(), row(2, "b", None, "300"))],
            crate::change::Position(serde_json::json!(1)),
        );
        assert_eq!(mapping.batch(snapshot).batch.changes.len(), 1, "snapshot rows are the table's state");
        let wrong = parse_job_errors("transform:\n  - source_table: shop.customers\n    events: [insert, upsert]\n");
        assert!(wrong.contains("transform[0].events[1]") && wrong.contains("`upsert`"), "{wrong}");
    }

    #[test]
    fn shards_merge_with_an_origin_column_in_the_key() {
        let transforms = Transforms::of(&job(
            "route:\n  - source_table: \"shard_[0-9]+.orders_[0-9]+\"\n    sink_table: all.orders\n    origin_column: _origin\n",
        ));
        let mappings = transforms
            .map_all(vec![customers("shard_1.orders_1"), customers("shard_2.orders_7"), customers("other.t")], &public)
            .unwrap();
        assert_eq!(mappings[0].target.name, TableName::parse("all.orders"));
        assert_eq!(mappings[1].target.name, TableName::parse("all.orders"));
        assert_eq!(mappings[2].target.name, TableName::parse("other.t"));
        assert_eq!(mappings[0].target.primary_key, vec![0, 4]);
        assert_eq!(mappings[0].target.indexes[0].columns, vec![2, 4]);
        let out = mappings[1].row(row(1, "a", None, "1")).unwrap().unwrap();
        assert_eq!(out[4], Value::Text("shard_2.orders_7".into()));
    }

    #[test]
    fn a_source_of_several_names_itself_in_the_origin_and_needs_one_where_keys_matter() {
        let route = "route:\n  - source_table: \"shop\\\\..*\"\n    sink_table: \"all.<>\"\n    replace_symbol: \"<>\"\n    origin_column: _source\n";
        let fanned = |rules: &str| JobSpec { fan_in: Some("east".into()), ..job(rules) };
        let transforms = Transforms::of(&fanned(route));
        assert!(transforms.fans_in());
        let mappings = transforms.map_all(vec![customers("shop.orders")], &public).unwrap();
        assert_eq!(mappings[0].target.name, TableName::parse("all.orders"));
        let out = mappings[0].row(row(1, "a", None, "1")).unwrap().unwrap();
        assert_eq!(out[4], Value::Text("east/shop.orders".into()));
        assert_eq!(mappings[0].origin(), Some(("_source", &Value::Text("east/shop.orders".into()))));
        assert!(!Transforms::of(&job(route)).fans_in());

        // A change stream over shared tables needs the origin column; a snapshot that inserts does not.
        let error =
            Transforms::of(&fanned("")).map_all(vec![customers("shop.orders")], &public).unwrap_err().to_string();
        assert!(
            error.contains("sources[east]: table shop.orders goes into shop.orders, which the job's other sources write too, without an `origin_column`"),
            "{error}"
        );
        let snapshot = JobSpec { mode: Mode::Snapshot, ..fanned("") };
        assert!(Transforms::of(&snapshot).map_all(vec![customers("shop.orders")], &public).is_ok());
    }

    #[test]
    fn merged_tables_of_different_shapes_are_refused_all_at_once() {
        let transforms = Transforms::of(&job("route:\n  - source_table: \"s[0-9].t\"\n    sink_table: all.t\n"));
        let mut other = customers("s2.t");
        other.columns[3].data_type = DataType::Float64;
        let mut third = customers("s3.t");
        third.columns.pop();
        let error = transforms.map_all(vec![customers("s1.t"), other, third], &public).unwrap_err().to_string();
        assert!(error.contains("s1.t and s2.t are merged into all.t but differ: column `balance`"), "{error}");
        assert!(error.contains("s1.t and s3.t"), "{error}");
        let error = Transforms::of(&job(""))
            .map_all(vec![customers("a.t"), customers("b.t")], &|_| TableName::parse("x.t"))
            .unwrap_err()
            .to_string();
        assert!(error.contains("source tables a.t, b.t all map to target table x.t"), "{error}");
    }

    #[test]
    fn a_merge_in_a_change_stream_needs_an_origin_column() {
        let route = "route:\n  - source_table: \"s[0-9].t\"\n    sink_table: all.t\n";
        let error = Transforms::of(&job(route))
            .map_all(vec![customers("s1.t"), customers("s2.t")], &public)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains(
                "route[0] (line 6): source tables s1.t and s2.t are merged into all.t without an `origin_column`"
            ),
            "{error}"
        );
        let snapshot = job(route);
        let snapshot = JobSpec { mode: Mode::Snapshot, ..snapshot };
        assert!(Transforms::of(&snapshot).map_all(vec![customers("s1.t"), customers("s2.t")], &public).is_ok());
        let transforms = Transforms::of(&job(route));
        assert!(transforms.same_rules(&TableName::parse("s1.t"), &TableName::parse("s2.t")));
        assert!(!transforms.same_rules(&TableName::parse("s1.t"), &TableName::parse("x.t")));
    }

    #[test]
    fn rule_errors_name_the_rule_and_line() {
        let transforms = Transforms::of(&job(
            "transform:\n  - source_table: shop.customers\n    projection: \"name, nope, upper(name)\"\n    filter: \"bad_column = 1\"\n",
        ));
        let error = transforms.map(&Arc::new(customers("shop.customers")), &public).unwrap_err().to_string();
        assert!(
            error.contains("transform[0].projection (line 7): table shop.customers has no column `nope`"),
            "{error}"
        );
        assert!(error.contains("give the computed column `upper(name)` a name"), "{error}");
        assert!(
            error.contains("transform[0].filter (line 8): table shop.customers has no column `bad_column`"),
            "{error}"
        );
        assert!(error.contains("primary key column(s) id"), "{error}");
    }

    #[test]
    fn syntax_errors_are_reported_with_the_job_file() {
        let text = "name: t\nsource: {type: mysql, url: 'mysql://u@h:1'}\ntarget: {type: postgres, url: 'postgres://u@h/d'}\nroute:\n  - source_table: \"shop.(\"\n    sink_table: x.y\ntransform:\n  - source_table: a.b\n    projection: \"id,\"\n    filter: \"id >\"\n    mask: {email: blur}\n";
        let errors = parse_job(text, false, environment).unwrap_err();
        let paths: Vec<(&str, Option<usize>)> = errors.iter().map(|error| (error.path.as_str(), error.line)).collect();
        assert_eq!(
            paths,
            [
                ("route[0].source_table", Some(5)),
                ("transform[0].projection", Some(9)),
                ("transform[0].filter", Some(10)),
                ("transform[0].mask.email", Some(11)),
            ]
        );
        let errors = parse_job(
            "name: t\nsource: {type: mysql, url: 'mysql://u@h:1'}\ntarget: {type: postgres, url: 'postgres://u@h/d'}\ntransform:\n  - source_table: a.b\n    mask: {email: hash}\n",
            false,
            environment,
        )
        .unwrap_err();
        assert!(errors[0].message.contains("needs a secret `salt`"), "{errors:?}");
    }

    #[test]
    fn a_row_that_cannot_be_transformed_is_a_dirty_record_with_its_key() {
        let transforms = Transforms::of(&job(
            "transform:\n  - source_table: shop.customers\n    projection: \"id, CAST(balance AS INT) AS whole\"\n    filter: \"id <> 3\"\n",
        ));
        let mapping = transforms.map(&Arc::new(customers("shop.customers")), &public).unwrap();
        let changes = [row(1, "a", None, "10.00"), row(2, "b", None, "10.50"), row(3, "c", None, "1")]
            .into_iter()
            .map(|row| Change::insert(mapping.source.clone(), row))
            .collect();
        let out = mapping.batch(Batch::new(changes, crate::change::Position(serde_json::json!(3))));
        assert_eq!(out.filtered, 1);
        assert_eq!(out.batch.changes.len(), 1);
        assert_eq!(out.batch.changes[0].row(), &vec![Value::Int(1), Value::Int(10)]);
        let rejected = &out.batch.rejected;
        assert_eq!(rejected.len(), 1);
        assert_eq!(rejected[0].key, "id=2");
        assert!(
            rejected[0].reason.contains("transform[0] (line 6)")
                && rejected[0].reason.contains("would lose information"),
            "{rejected:?}"
        );
    }

    #[test]
    fn replace_symbol_keeps_each_table_name() {
        let transforms = Transforms::of(&job(
            "route:\n  - source_table: \"shop\\\\..*\"\n    sink_table: ods.shop_<>\n    replace_symbol: <>\n",
        ));
        assert_eq!(transforms.routed_name(&TableName::parse("shop.orders")), TableName::parse("ods.shop_orders"));
        assert_eq!(transforms.routed_name(&TableName::parse("shopx.orders")), TableName::parse("shopx.orders"));
    }
}
