//! The job file's `route:` and `transform:` lists, as Flink CDC's pipeline files have them (in
//! snake_case): read, checked for syntax (regular expressions, SQL expressions, mask rules) with
//! the path and line of every problem, and kept for the transform stage, which compiles them
//! against each table's columns.

use sqlparser::ast as sql;

use super::decode::{Decoder, Fields};
use super::document::{Node, NodeKind};
use super::sql_text;
use crate::secret::{self, Secret};

/// One `route:` entry: source tables whose full name (`db.table`) matches `source_table` land in
/// `sink_table`.
#[derive(Debug, Clone)]
pub struct RouteSpec {
    /// `route[2]`, for messages.
    pub path: String,
    pub line: Option<usize>,
    /// The regular expression as written.
    pub source_table: String,
    /// Anchored: it matches a whole name.
    pub pattern: regex::Regex,
    /// `db.table` or `table` (same database as the source table); `replace_symbol` in it stands
    /// for the source table's own name.
    pub sink_table: String,
    pub replace_symbol: Option<String>,
    /// A column added to the target holding the source table's full name; it joins the primary
    /// key, so rows of different shards with the same key stay apart.
    pub origin_column: Option<String>,
    pub description: Option<String>,
}

/// How a masked column's values are hidden.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MaskRule {
    /// HMAC-SHA-256 with the rule's secret `salt`, as 64 hex digits: equal values stay equal (joins
    /// and keys still work), the value cannot be read back without the salt.
    Hash,
    /// Text becomes `***` (shorter when the column is); other types become NULL.
    Redact,
    /// Text keeps its first N characters, bytes their first N bytes.
    Truncate(usize),
}

#[derive(Debug, Clone)]
pub struct MaskSpec {
    /// A column of the rule's output (after `projection`).
    pub column: String,
    pub rule: MaskRule,
    pub line: Option<usize>,
}

/// One `transform:` entry, for the source tables whose full name matches `source_table`.
#[derive(Debug, Clone)]
pub struct TransformSpec {
    /// `transform[0]`, for messages.
    pub path: String,
    pub line: Option<usize>,
    pub source_table: String,
    pub pattern: regex::Regex,
    /// The select list as written and as parsed.
    pub projection: Option<(String, Vec<sql::SelectItem>)>,
    pub projection_line: Option<usize>,
    /// The predicate as written and as parsed.
    pub filter: Option<(String, sql::Expr)>,
    pub filter_line: Option<usize>,
    pub mask: Vec<MaskSpec>,
    /// The key of the `hash` mask; registered as a secret, so it never prints.
    pub salt: Option<Secret>,
    /// `events:`: the kinds of change of the stream that reach the target; `None`: every kind.
    pub events: Option<EventKinds>,
    pub description: Option<String>,
}

/// Which kinds of change a rule lets through (`events: [insert, update]`). It judges what the
/// target would be asked to do: an update whose row leaves the rule's filter is a delete.
/// Snapshot rows are the table's state, not events: they are always copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventKinds {
    pub insert: bool,
    pub update: bool,
    pub delete: bool,
}

const ROUTE_FIELDS: &[&str] = &["source_table", "sink_table", "replace_symbol", "origin_column", "description"];
const TRANSFORM_FIELDS: &[&str] = &["source_table", "projection", "filter", "mask", "salt", "events", "description"];

/// Reads `events:`, a list of `insert`, `update` and `delete`.
fn decode_events(decoder: &mut Decoder, node: &Node, path: &str) -> Option<EventKinds> {
    let names = decoder.string_list(node, path)?;
    let mut kinds = EventKinds { insert: false, update: false, delete: false };
    let mut ok = true;
    for (index, name) in names.iter().enumerate() {
        match name.as_str() {
            "insert" => kinds.insert = true,
            "update" => kinds.update = true,
            "delete" => kinds.delete = true,
            other => {
                decoder.error(
                    &format!("{path}[{index}]"),
                    node.line,
                    format!("unknown kind of change `{other}`; expected insert, update or delete"),
                );
                ok = false;
            }
        }
    }
    if ok && names.is_empty() {
        decoder.error(path, node.line, "lists no kind of change: name at least one of insert, update, delete");
        ok = false;
    }
    ok.then_some(kinds)
}

/// A table-name regular expression, anchored to match whole names.
fn pattern(decoder: &mut Decoder, node: &Node, path: &str) -> Option<(String, regex::Regex)> {
    let text = decoder.string(node, path)?;
    match regex::Regex::new(&format!("^(?:{text})$")) {
        Ok(pattern) => Some((text, pattern)),
        Err(error) => {
            let reason = error.to_string();
            let reason = reason.lines().last().unwrap_or("invalid").trim().to_owned();
            decoder.error(path, node.line, format!("`{text}` is not a valid regular expression: {reason}"));
            None
        }
    }
}

fn entries<'a>(decoder: &mut Decoder, node: &'a Node, path: &str) -> Vec<(String, &'a Node)> {
    match &node.kind {
        NodeKind::Sequence(items) => {
            items.iter().enumerate().map(|(index, item)| (format!("{path}[{index}]"), item)).collect()
        }
        _ => {
            decoder.error(path, node.line, format!("expected a list of rules, found {}", node.shape()));
            Vec::new()
        }
    }
}

fn optional_string(decoder: &mut Decoder, fields: &Fields<'_>, key: &str) -> Option<String> {
    fields.get(key).and_then(|node| decoder.string(node, &fields.path(key)))
}

/// Reads `route:`; `None` entries had errors (already recorded).
pub(crate) fn decode_routes(decoder: &mut Decoder, node: &Node) -> Vec<RouteSpec> {
    let mut routes = Vec::new();
    for (path, item) in entries(decoder, node, "route") {
        let Some(fields) = decoder.mapping(item, &path, ROUTE_FIELDS) else { continue };
        let source = fields
            .require(decoder, "source_table", "a regular expression over `database.table`")
            .and_then(|node| pattern(decoder, node, &fields.path("source_table")));
        let sink_table = fields
            .require(decoder, "sink_table", "the target table, `database.table`")
            .and_then(|node| decoder.string(node, &fields.path("sink_table")));
        let replace_symbol = optional_string(decoder, &fields, "replace_symbol");
        let origin_column = optional_string(decoder, &fields, "origin_column");
        let description = optional_string(decoder, &fields, "description");
        if let Some(sink) = &sink_table {
            let name = match &replace_symbol {
                Some(symbol) if !symbol.is_empty() => sink.replace(symbol.as_str(), "t"),
                _ => sink.clone(),
            };
            if name.is_empty() || name.starts_with('.') || name.ends_with('.') || name.matches('.').count() > 1 {
                decoder.error(
                    &fields.path("sink_table"),
                    fields.get("sink_table").and_then(|node| node.line),
                    format!("`{sink}` is not a table name; write `database.table` or `table`"),
                );
            }
        }
        if replace_symbol.as_deref() == Some("") {
            decoder.error(&fields.path("replace_symbol"), fields.line(), "must not be empty");
        }
        if origin_column.as_deref() == Some("") {
            decoder.error(&fields.path("origin_column"), fields.line(), "must not be empty");
        }
        if let (Some((source_table, pattern)), Some(sink_table)) = (source, sink_table) {
            routes.push(RouteSpec {
                path,
                line: item.line,
                source_table,
                pattern,
                sink_table,
                replace_symbol,
                origin_column,
                description,
            });
        }
    }
    routes
}

/// Reads `transform:`.
pub(crate) fn decode_transforms(decoder: &mut Decoder, node: &Node) -> Vec<TransformSpec> {
    let mut rules = Vec::new();
    for (path, item) in entries(decoder, node, "transform") {
        let Some(fields) = decoder.mapping(item, &path, TRANSFORM_FIELDS) else { continue };
        let mut ok = true;
        let source = fields
            .require(decoder, "source_table", "a regular expression over `database.table`")
            .and_then(|node| pattern(decoder, node, &fields.path("source_table")));
        let projection_line = fields.get("projection").and_then(|node| node.line);
        let projection = match optional_string(decoder, &fields, "projection") {
            None => None,
            Some(text) => match sql_text::parse_projection(&text) {
                Ok(items) => Some((text, items)),
                Err(error) => {
                    decoder.error(
                        &fields.path("projection"),
                        projection_line,
                        format!("not a valid select list: {error}"),
                    );
                    ok = false;
                    None
                }
            },
        };
        let filter_line = fields.get("filter").and_then(|node| node.line);
        let filter = match optional_string(decoder, &fields, "filter") {
            None => None,
            Some(text) => match sql_text::parse_predicate(&text) {
                Ok(predicate) => Some((text, predicate)),
                Err(error) => {
                    decoder.error(&fields.path("filter"), filter_line, format!("not a valid predicate: {error}"));
                    ok = false;
                    None
                }
            },
        };
        let mask = match fields.get("mask") {
            None => Vec::new(),
            Some(node) => decode_mask(decoder, node, &fields.path("mask")).unwrap_or_else(|| {
                ok = false;
                Vec::new()
            }),
        };
        let salt = fields.get("salt").and_then(|node| decoder.string(node, &fields.path("salt"))).map(|salt| {
            secret::register(&salt);
            Secret::new(salt)
        });
        if mask.iter().any(|mask| mask.rule == MaskRule::Hash) && salt.is_none() {
            decoder.error(
                &fields.path("salt"),
                fields.line(),
                "the `hash` mask needs a secret `salt` (e.g. salt: ${MASK_SALT}); without one a hash of a known value can be looked up",
            );
            ok = false;
        }
        if salt.as_ref().is_some_and(|salt| salt.expose().len() < 16) {
            decoder.error(
                &fields.path("salt"),
                fields.get("salt").and_then(|node| node.line),
                "must be at least 16 characters",
            );
            ok = false;
        }
        let events = match fields.get("events") {
            None => None,
            Some(node) => decode_events(decoder, node, &fields.path("events")).or_else(|| {
                ok = false;
                None
            }),
        };
        if ["projection", "filter", "mask", "events"].iter().all(|key| fields.get(key).is_none()) {
            decoder.error(
                &path,
                item.line,
                "a transform rule needs at least one of `projection`, `filter`, `mask` or `events`",
            );
            ok = false;
        }
        let description = optional_string(decoder, &fields, "description");
        if let (Some((source_table, pattern)), true) = (source, ok) {
            rules.push(TransformSpec {
                path,
                line: item.line,
                source_table,
                pattern,
                projection,
                projection_line,
                filter,
                filter_line,
                mask,
                salt,
                events,
                description,
            });
        }
    }
    rules
}

fn decode_mask(decoder: &mut Decoder, node: &Node, path: &str) -> Option<Vec<MaskSpec>> {
    let NodeKind::Mapping(entries) = &node.kind else {
        decoder.error(
            path,
            node.line,
            format!("expected a mapping of column: hash | redact | truncate(N), found {}", node.shape()),
        );
        return None;
    };
    let mut masks = Vec::with_capacity(entries.len());
    let mut ok = true;
    for (column, value) in entries {
        let field = format!("{path}.{column}");
        let Some(text) = decoder.string(value, &field) else {
            ok = false;
            continue;
        };
        let rule = match text.trim().to_ascii_lowercase().as_str() {
            "hash" => Some(MaskRule::Hash),
            "redact" => Some(MaskRule::Redact),
            other => other
                .strip_prefix("truncate(")
                .and_then(|rest| rest.strip_suffix(')'))
                .and_then(|count| count.trim().parse::<usize>().ok())
                .filter(|count| *count > 0)
                .map(MaskRule::Truncate),
        };
        match rule {
            Some(rule) => masks.push(MaskSpec { column: column.clone(), rule, line: value.line }),
            None => {
                decoder.error(
                    &field,
                    value.line,
                    format!("unknown mask `{text}`; expected hash, redact or truncate(N) with N ≥ 1"),
                );
                ok = false;
            }
        }
    }
    ok.then_some(masks)
}
