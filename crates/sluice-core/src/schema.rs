//! Table schemas: what a source describes and a target creates.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A table's qualified name: a namespace (MySQL database, PostgreSQL schema; absent for SQLite's
/// main database and for files) and the table's own name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TableName {
    pub namespace: Option<String>,
    pub name: String,
}

impl TableName {
    pub fn new(namespace: Option<&str>, name: &str) -> TableName {
        TableName { namespace: namespace.map(str::to_owned), name: name.to_owned() }
    }

    /// Parses `namespace.table` or `table`; the first dot separates.
    pub fn parse(text: &str) -> TableName {
        match text.split_once('.') {
            Some((namespace, name)) => TableName::new(Some(namespace), name),
            None => TableName::new(None, text),
        }
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(namespace) => write!(formatter, "{namespace}.{}", self.name),
            None => formatter.write_str(&self.name),
        }
    }
}

/// The logical type of a column, independent of any dialect. Connectors map their native types
/// into it and back; `docs/types.md` lists the mappings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum DataType {
    Boolean,
    /// A signed or unsigned integer stored in `bytes` bytes (1, 2, 3, 4 or 8).
    Integer {
        bytes: u8,
        unsigned: bool,
    },
    Float32,
    Float64,
    /// An exact decimal; `None` precision means unconstrained (PostgreSQL `numeric`).
    Decimal {
        precision: Option<u32>,
        scale: Option<u32>,
    },
    /// Character data; `length` in characters when bounded, `fixed` for CHAR.
    Text {
        length: Option<u32>,
        fixed: bool,
    },
    /// Binary data; `length` in bytes when bounded, `fixed` for BINARY.
    Bytes {
        length: Option<u32>,
        fixed: bool,
    },
    Bits {
        width: u8,
    },
    Date,
    Time {
        precision: u8,
    },
    DateTime {
        precision: u8,
    },
    Timestamp {
        precision: u8,
    },
    Year,
    Json,
    Enum {
        values: Vec<String>,
    },
    Set {
        values: Vec<String>,
    },
    Geometry,
}

/// One column of a table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Column {
    pub name: String,
    pub data_type: DataType,
    pub nullable: bool,
    /// The source's own type name (e.g. `varchar(20)`), for messages and same-engine copies.
    pub native_type: String,
    /// The source's collation of a text column (e.g. `utf8mb4_bin`), which a same-engine target
    /// keeps so keys compare (and stay unique) as they did at the source.
    #[serde(default)]
    pub collation: Option<String>,
    /// What the source says of the column beyond its type, for a target that carries the
    /// schema of a migration.
    #[serde(default, skip_serializing_if = "ColumnDetails::is_empty")]
    pub details: ColumnDetails,
}

impl Column {
    /// A column known only by its name and type: no source type name, no collation (columns
    /// read from files, and tables built by tests).
    pub fn new(name: impl Into<String>, data_type: DataType, nullable: bool) -> Column {
        Column {
            name: name.into(),
            data_type,
            nullable,
            native_type: String::new(),
            collation: None,
            details: ColumnDetails::default(),
        }
    }
}

/// A column's definition beyond its type, as the source states it, in the source's SQL dialect
/// (`TableDetails::dialect`): a target of that dialect writes it as it is, another translates
/// what has a meaning to it (docs/types.md, "Schema").
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ColumnDetails {
    /// The default as the source's DDL writes it: a literal (`'abc'`, `42`, `NULL`) or an
    /// expression (`current_timestamp()`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<String>,
    /// An insert that gives no value takes the next one of the table's counter (MySQL
    /// AUTO_INCREMENT).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub auto_increment: bool,
    /// What an update sets the column to (MySQL `ON UPDATE current_timestamp()`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_update: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
}

impl ColumnDetails {
    pub fn is_empty(&self) -> bool {
        *self == ColumnDetails::default()
    }
}

/// A table's definition beyond its columns and keys, as the source states it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TableDetails {
    /// The SQL dialect of the columns' `native_type` and details (`mysql`): a target of the same
    /// dialect creates the columns with the source's own types.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dialect: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
    /// The table's default collation (MySQL), for the text columns that name none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collation: Option<String>,
    /// The next value of the table's counter when it was described (MySQL AUTO_INCREMENT): a
    /// target's counter is set at least this far once the rows are in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_auto_increment: Option<u64>,
    /// Columns the source computes from the others (PostgreSQL's `GENERATED ALWAYS AS (…)
    /// STORED`): never read nor written, since the change stream does not carry them; a target
    /// of the source's dialect creates them to compute them itself.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub generated: Vec<GeneratedColumn>,
    /// The source's change log carries an updated row's old values only in part: its key, and
    /// only when the key changed (PostgreSQL without `REPLICA IDENTITY FULL`). A change's
    /// before image then holds the new row's values (the key unchanged) or nulls (the key
    /// moved) where the old ones are unknown, which a stream target does not present as old
    /// values.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub old_values_unknown: bool,
}

/// A column computed from others of its row, in the source's dialect (`TableDetails::dialect`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GeneratedColumn {
    pub name: String,
    /// The column's type as the source's dialect writes it.
    pub native_type: String,
    /// The expression, as the source prints it.
    pub expression: String,
    /// The columns the expression reads: where one is missing or renamed in the target the
    /// expression cannot be created there.
    pub reads: Vec<String>,
}

impl TableDetails {
    pub fn is_empty(&self) -> bool {
        *self == TableDetails::default()
    }
}

/// A table's shape: its columns in order and the positions of its primary-key columns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableSchema {
    pub name: TableName,
    pub columns: Vec<Column>,
    /// Indexes into `columns`, in key order; empty when the table has no primary key.
    pub primary_key: Vec<usize>,
    /// Secondary indexes, built by targets after the table's rows are loaded.
    #[serde(default)]
    pub indexes: Vec<Index>,
    /// What the source says of the table beyond its columns and keys.
    #[serde(default, skip_serializing_if = "TableDetails::is_empty")]
    pub details: TableDetails,
}

/// A secondary index: its name in the source, its columns (indexes into `columns`, in order) and
/// whether it is unique.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Index {
    pub name: String,
    pub columns: Vec<usize>,
    pub unique: bool,
}

impl TableSchema {
    /// A table known by its name only (no columns yet).
    pub fn named(name: TableName) -> TableSchema {
        TableSchema {
            name,
            columns: Vec::new(),
            primary_key: Vec::new(),
            indexes: Vec::new(),
            details: TableDetails::default(),
        }
    }

    pub fn column_index(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|column| column.name == name)
    }

    /// The table with the columns `keeps` keeps alone; a key or an index that loses a column is
    /// dropped.
    pub fn keeping(&self, keeps: &dyn Fn(&str) -> bool) -> TableSchema {
        let mut positions = vec![None; self.columns.len()];
        let mut columns = Vec::with_capacity(self.columns.len());
        for (index, column) in self.columns.iter().enumerate() {
            if keeps(&column.name) {
                positions[index] = Some(columns.len());
                columns.push(column.clone());
            }
        }
        let moved = |indexes: &[usize]| indexes.iter().map(|&index| positions[index]).collect::<Option<Vec<usize>>>();
        TableSchema {
            name: self.name.clone(),
            columns,
            primary_key: moved(&self.primary_key).unwrap_or_default(),
            indexes: self
                .indexes
                .iter()
                .filter_map(|index| Some(Index { columns: moved(&index.columns)?, ..index.clone() }))
                .collect(),
            details: self.details.clone(),
        }
    }

    pub fn primary_key_names(&self) -> Vec<&str> {
        self.primary_key.iter().map(|&index| self.columns[index].name.as_str()).collect()
    }

    /// This table's names (namespace, table, columns) that are longer than `limit` as `length`
    /// measures them, each described with its length.
    pub fn names_longer_than(&self, limit: usize, length: impl Fn(&str) -> usize) -> Vec<String> {
        let mut long = Vec::new();
        let mut check = |what: String, name: &str| {
            if length(name) > limit {
                long.push(format!("{what} ({})", length(name)));
            }
        };
        if let Some(namespace) = &self.name.namespace {
            check(format!("schema `{namespace}`"), namespace);
        }
        check(format!("table `{}`", self.name), &self.name.name);
        for column in &self.columns {
            check(format!("column `{}` of {}", column.name, self.name), &column.name);
        }
        long
    }

    /// What makes this schema unusable, every problem at once: a key or index naming a column
    /// that does not exist, a column named twice, no columns. Schemas read from files are
    /// checked with this before anything indexes into `columns`.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.columns.is_empty() {
            problems.push("it has no columns".to_owned());
        }
        let count = self.columns.len();
        for (position, index) in self.primary_key.iter().enumerate() {
            if *index >= count {
                problems.push(format!(
                    "primary_key[{position}] is {index}, but the columns are numbered 0 to {}",
                    count.saturating_sub(1)
                ));
            }
        }
        for index in &self.indexes {
            for (position, column) in index.columns.iter().enumerate() {
                if *column >= count {
                    problems.push(format!(
                        "index {}: columns[{position}] is {column}, but the columns are numbered 0 to {}",
                        index.name,
                        count.saturating_sub(1)
                    ));
                }
            }
        }
        for (position, column) in self.columns.iter().enumerate() {
            if self.columns[..position].iter().any(|earlier| earlier.name == column.name) {
                problems.push(format!("column `{}` is named twice", column.name));
            }
        }
        problems
    }
}

/// One step that brings a target table's columns to a source table's new schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ColumnChange<'a> {
    Rename { from: &'a str, to: &'a str },
    Add(&'a Column),
    Retype(&'a Column),
    Drop(String),
}

/// The steps from a target table's column names (`existing`) to `table`'s columns: renames
/// first, where the old name exists and the new one does not (so a replayed step is a no-op),
/// then added and retyped columns in the table's order, then the columns it no longer has.
pub fn column_changes<'a>(
    existing: &[String],
    table: &'a TableSchema,
    renamed: &'a [(String, String)],
    retyped: &[String],
) -> Vec<ColumnChange<'a>> {
    let mut names: Vec<String> = existing.to_vec();
    let mut steps = Vec::new();
    for (from, to) in renamed {
        if names.contains(from) && !names.contains(to) {
            steps.push(ColumnChange::Rename { from, to });
            names.retain(|name| name != from);
            names.push(to.clone());
        }
    }
    for column in &table.columns {
        if !names.contains(&column.name) {
            steps.push(ColumnChange::Add(column));
        } else if retyped.contains(&column.name) {
            steps.push(ColumnChange::Retype(column));
        }
    }
    for name in names {
        if !table.columns.iter().any(|column| column.name == name) {
            steps.push(ColumnChange::Drop(name));
        }
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn column_changes_rename_first_and_replay_as_no_ops() {
        let column = |name: &str| Column::new(name, DataType::Integer { bytes: 8, unsigned: false }, true);
        let table = TableSchema {
            name: TableName::parse("db.t"),
            columns: vec![column("id"), column("a2"), column("b"), column("new")],
            primary_key: vec![0],
            indexes: Vec::new(),
            details: Default::default(),
        };
        let renamed = vec![("a".to_owned(), "a2".to_owned())];
        let retyped = vec!["b".to_owned()];
        let existing: Vec<String> = ["id", "a", "b", "old"].map(String::from).to_vec();
        assert_eq!(
            column_changes(&existing, &table, &renamed, &retyped),
            vec![
                ColumnChange::Rename { from: "a", to: "a2" },
                ColumnChange::Retype(&table.columns[2]),
                ColumnChange::Add(&table.columns[3]),
                ColumnChange::Drop("old".into()),
            ]
        );
        // Applied already: only the retype (harmless to repeat) is left.
        let done: Vec<String> = ["id", "a2", "b", "new"].map(String::from).to_vec();
        assert_eq!(column_changes(&done, &table, &renamed, &retyped), vec![ColumnChange::Retype(&table.columns[2])]);
    }
}
