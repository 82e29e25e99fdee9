//! The `generate` connector: tables declared in the job file, their rows made from a seed.
//!
//! ```yaml
//! source: {type: generate, seed: 1, tables: [{name: t, rows: 100000, columns: {id: bigint, v: text}}]}
//! ```

use std::sync::Arc;

use sluice_core::connector::{Capabilities, Source};
use sluice_core::spec::{EndpointSpec, JobSpec, Node, NodeKind, SpecError};
use sluice_core::{DataType, Result, TableName, TableSchema};

use super::{GenerateOptions, GenerateSource, GeneratedTable};
use crate::declared::{declared_columns, declared_key};
use crate::{Connector, SourceSide};

pub(crate) const CONNECTOR: Connector = Connector {
    name: "generate",
    feature: "default",
    secrets: &[],
    capabilities: Capabilities { snapshot_source: true, ..Capabilities::NONE },
    source: Some(SourceSide { fields: &["type", "seed", "tables"], validate, build }),
    target: None,
};

/// A table's fields.
const TABLE_FIELDS: &[&str] = &["name", "rows", "columns", "key"];

fn options(endpoint: &EndpointSpec) -> std::result::Result<GenerateOptions, Vec<SpecError>> {
    let mut errors = Vec::new();
    let seed = match endpoint.options.get("seed").map(|node| &node.kind) {
        None => 0,
        Some(NodeKind::Scalar { text, quoted: false }) if text.replace('_', "").parse::<u64>().is_ok() => {
            text.replace('_', "").parse().expect("checked")
        }
        Some(_) => {
            errors.push(endpoint.error("seed", "expected a whole number (the same seed makes the same rows)"));
            0
        }
    };
    let mut tables = Vec::new();
    let path = endpoint.path_of("tables");
    match endpoint.options.get("tables").map(|node| &node.kind) {
        Some(NodeKind::Sequence(items)) if !items.is_empty() => {
            for (index, item) in items.iter().enumerate() {
                if let Some(table) = declared_table(item, &format!("{path}[{index}]"), &mut errors) {
                    if tables.iter().any(|other: &GeneratedTable| other.schema.name == table.schema.name) {
                        errors.push(SpecError {
                            path: format!("{path}[{index}].name"),
                            line: item.line,
                            message: format!("table `{}` is declared twice", table.schema.name),
                        });
                    }
                    tables.push(table);
                }
            }
        }
        _ => errors.push(endpoint.error(
            "tables",
            "missing required field `tables`: a list of tables, e.g. [{name: t, rows: 1000, columns: {id: bigint, v: text}}]",
        )),
    }
    if errors.is_empty() {
        Ok(GenerateOptions { seed, tables })
    } else {
        Err(errors)
    }
}

/// One `{name, rows, columns, key}` at `path`.
fn declared_table(node: &Node, path: &str, errors: &mut Vec<SpecError>) -> Option<GeneratedTable> {
    let NodeKind::Mapping(entries) = &node.kind else {
        errors.push(SpecError {
            path: path.to_owned(),
            line: node.line,
            message: "expected a table: {name: t, rows: 1000, columns: {id: bigint, v: text}}".into(),
        });
        return None;
    };
    let field = |name: &str| entries.iter().find(|(key, _)| key == name).map(|(_, value)| value);
    let text = |node: &Node| match &node.kind {
        NodeKind::Scalar { text, .. } => Some(text.clone()),
        _ => None,
    };
    let before = errors.len();
    for (key, value) in entries {
        if !TABLE_FIELDS.contains(&key.as_str()) {
            errors.push(SpecError {
                path: format!("{path}.{key}"),
                line: value.line,
                message: format!("unknown field `{key}`; expected one of: {}", TABLE_FIELDS.join(", ")),
            });
        }
    }
    let name = field("name").and_then(text).filter(|name| !name.is_empty());
    if name.is_none() {
        errors.push(SpecError {
            path: format!("{path}.name"),
            line: node.line,
            message: "missing required field `name` (the table, `t` or `schema.t`)".into(),
        });
    }
    let rows = match field("rows") {
        Some(node) => match &node.kind {
            NodeKind::Scalar { text, quoted: false } if text.replace('_', "").parse::<u64>().is_ok() => {
                Some(text.replace('_', "").parse::<u64>().expect("checked"))
            }
            _ => {
                errors.push(SpecError {
                    path: format!("{path}.rows"),
                    line: node.line,
                    message: "expected a whole number of rows".into(),
                });
                None
            }
        },
        None => {
            errors.push(SpecError {
                path: format!("{path}.rows"),
                line: node.line,
                message: "missing required field `rows` (how many rows the table has)".into(),
            });
            None
        }
    };
    let mut columns = declared_columns(field("columns"), &format!("{path}.columns"), node.line, errors);
    // The key: `key:` names it, else the first column.
    let names: Vec<String> = match field("key").map(|node| &node.kind) {
        Some(NodeKind::Sequence(items)) => items.iter().filter_map(text).collect(),
        Some(NodeKind::Scalar { text, .. }) => vec![text.clone()],
        _ => columns.first().map(|column| column.name.clone()).into_iter().collect(),
    };
    let primary_key = declared_key(&mut columns, &names, &format!("{path}.key"), node.line, errors);
    for &index in &primary_key {
        let column = &columns[index];
        if !matches!(column.data_type, DataType::Integer { .. } | DataType::Text { .. } | DataType::Decimal { .. }) {
            errors.push(SpecError {
                path: format!("{path}.key"),
                line: node.line,
                message: format!(
                    "key column `{}` is a {:?}; a generated key is an integer, bigint, decimal or text (row 1, 2, …)",
                    column.name, column.data_type
                ),
            });
        }
    }
    if errors.len() > before {
        return None;
    }
    let schema = TableSchema {
        name: TableName::parse(&name?),
        columns,
        primary_key,
        indexes: Vec::new(),
        details: Default::default(),
    };
    Some(GeneratedTable { schema: Arc::new(schema), rows: rows? })
}

fn validate(_job: &JobSpec, endpoint: &EndpointSpec) -> Vec<SpecError> {
    options(endpoint).err().unwrap_or_default()
}

fn build(job: &JobSpec) -> Result<Arc<dyn Source>> {
    Ok(Arc::new(GenerateSource::new(options(&job.source).map_err(crate::invalid)?)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(source: &str) -> Vec<String> {
        let text = format!("name: gen\nmode: snapshot\nsource: {source}\ntarget: {{type: blackhole}}\n");
        let job = sluice_core::spec::parse_job(&text, false, |_| None).unwrap();
        validate(&job, &job.source).into_iter().map(|error| format!("{}: {}", error.path, error.message)).collect()
    }

    #[test]
    fn the_issue_s_job_reads_and_every_mistake_is_named_at_once() {
        let good = "{type: generate, seed: 1, tables: [{name: t, rows: 100000, columns: {id: bigint, v: text}}]}";
        assert_eq!(problems(good), Vec::<String>::new());
        let bad = "{type: generate, seed: x, tables: [{name: t, rows: many, columns: {id: date, v: colour}, size: 1}, {rows: 1, columns: {id: int}}]}";
        let found = problems(bad);
        for expected in [
            "source.seed: expected a whole number",
            "source.tables[0].size: unknown field",
            "source.tables[0].rows: expected a whole number",
            "source.tables[0].columns.v: unknown type `colour`",
            "source.tables[0].key: key column `id`",
            "source.tables[1].name: missing required field",
        ] {
            assert!(found.iter().any(|problem| problem.starts_with(expected)), "{expected} in {found:#?}");
        }
    }
}
