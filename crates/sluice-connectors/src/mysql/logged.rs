//! The schema of a table the change stream created or altered, as a snapshot would copy it.
//!
//! The binlog's table map gives the columns the rows were written with: names, types as the
//! rows are encoded (no display width, no `(M,D)` of a FLOAT, no JSON on MariaDB, where it is a
//! LONGTEXT), signedness, nullability, collations and the primary key. information_schema gives
//! the rest, through the function the snapshot reads it with (`source::describe_table`): the
//! column's own type text, its default, counter, ON UPDATE and comment, and the table's indexes,
//! collation, comment and counter. But it describes the table as it is *now*, and the stream
//! may be applying rows written before a later ALTER, DROP or RENAME. So the description is
//! taken column by column, where it agrees with the table map (`reconcile`).

use sluice_core::{Column, DataType, Index, TableSchema};

/// `logged` (the table map's schema) completed by `described` (information_schema's, read
/// now). Each column of `logged` is the described column of its name when that agrees with it
/// (same type as the rows were decoded with, same nullability and collation), else it stays
/// as logged; the columns keep `logged`'s order. Indexes are the described ones whose columns
/// all remain; the table's details are the described ones. A described table with another
/// primary key is another table (or the key changed since, which the stream refuses anyway):
/// then `logged` is kept whole. Returns the schema and what disagreed, for a message.
pub(super) fn reconcile(logged: &TableSchema, described: &TableSchema) -> (TableSchema, Vec<String>) {
    if logged.primary_key_names() != described.primary_key_names() {
        let key = |table: &TableSchema| format!("({})", table.primary_key_names().join(", "));
        let problem = format!("its primary key is {} now, {} in the binlog", key(described), key(logged));
        return (logged.clone(), vec![problem]);
    }
    let mut disagreements = Vec::new();
    let columns: Vec<Column> = logged
        .columns
        .iter()
        .map(|column| match described.columns.iter().find(|known| known.name == column.name) {
            Some(known) if agrees(column, known) => known.clone(),
            Some(known) => {
                disagreements.push(format!(
                    "column {} is {} now, {} in the binlog",
                    column.name,
                    shape(known),
                    shape(column)
                ));
                column.clone()
            }
            None => {
                disagreements.push(format!("column {} is not in information_schema now", column.name));
                column.clone()
            }
        })
        .collect();
    let position = |index: usize| columns.iter().position(|column| column.name == described.columns[index].name);
    let indexes = described
        .indexes
        .iter()
        .filter_map(|index| {
            let members: Option<Vec<usize>> = index.columns.iter().map(|&member| position(member)).collect();
            members.map(|columns| Index { name: index.name.clone(), columns, unique: index.unique })
        })
        .collect();
    let table = TableSchema {
        name: logged.name.clone(),
        columns,
        primary_key: logged.primary_key.clone(),
        indexes,
        details: described.details.clone(),
    };
    (table, disagreements)
}

/// Whether a described column is the logged one: the rows decoded as the logged type read
/// the same as the described type, and nullability and collation match.
fn agrees(logged: &Column, described: &Column) -> bool {
    // MariaDB's JSON is a LONGTEXT to the binlog, JSON to information_schema (by its check).
    let json_as_text =
        described.data_type == DataType::Json && logged.data_type == DataType::Text { length: None, fixed: false };
    (logged.data_type == described.data_type || json_as_text)
        && logged.nullable == described.nullable
        && (logged.collation.is_none() || logged.collation == described.collation)
}

/// A column's type, nullability and collation, for messages.
fn shape(column: &Column) -> String {
    let mut text = format!("{:?}", column.data_type);
    if !column.nullable {
        text.push_str(" NOT NULL");
    }
    if let Some(collation) = &column.collation {
        text.push_str(&format!(" COLLATE {collation}"));
    }
    text
}

#[cfg(test)]
mod tests {
    use sluice_core::schema::{ColumnDetails, TableDetails};
    use sluice_core::TableName;

    use super::*;

    fn column(name: &str, data_type: DataType, native_type: &str, default: Option<&str>) -> Column {
        Column {
            native_type: native_type.to_owned(),
            details: ColumnDetails { default: default.map(str::to_owned), ..ColumnDetails::default() },
            ..Column::new(name, data_type, true)
        }
    }

    fn table(columns: Vec<Column>, indexes: Vec<Index>) -> TableSchema {
        let mut id = column("id", DataType::Integer { bytes: 4, unsigned: true }, "int(10) unsigned", None);
        id.nullable = false;
        let mut all = vec![id];
        all.extend(columns);
        TableSchema {
            name: TableName::parse("db.t"),
            columns: all,
            primary_key: vec![0],
            indexes,
            details: TableDetails { dialect: Some("mariadb".into()), ..TableDetails::default() },
        }
    }

    #[test]
    fn agreeing_columns_take_the_description_and_the_rest_stay_as_logged() {
        let float = DataType::Float32;
        let text = DataType::Text { length: None, fixed: false };
        let logged = TableSchema {
            details: TableDetails::default(),
            ..table(
                vec![
                    column("f", float.clone(), "", None),
                    column("j", text.clone(), "", None),
                    column("n", DataType::Integer { bytes: 4, unsigned: false }, "", None),
                    column("gone", text.clone(), "", None),
                ],
                Vec::new(),
            )
        };
        let mut described = table(
            vec![
                // Altered since: BIGINT now.
                column("n", DataType::Integer { bytes: 8, unsigned: false }, "bigint(20)", None),
                column("f", float, "float(10,2)", Some("1.50")),
                column("j", DataType::Json, "longtext", None),
            ],
            Vec::new(),
        );
        described.indexes = vec![
            Index { name: "by_f".into(), columns: vec![2], unique: false },
            Index { name: "by_n".into(), columns: vec![1], unique: true },
        ];
        let (schema, disagreements) = reconcile(&logged, &described);
        let names: Vec<&str> = schema.columns.iter().map(|column| column.name.as_str()).collect();
        assert_eq!(names, ["id", "f", "j", "n", "gone"], "the binlog's order");
        assert_eq!(schema.columns[0].native_type, "int(10) unsigned");
        assert_eq!(
            (schema.columns[1].native_type.as_str(), schema.columns[1].details.default.as_deref()),
            ("float(10,2)", Some("1.50"))
        );
        assert_eq!(schema.columns[2].data_type, DataType::Json, "MariaDB's JSON, a LONGTEXT to the binlog");
        assert_eq!(schema.columns[3], logged.columns[3], "retyped since: as logged");
        assert_eq!(schema.columns[4], logged.columns[4]);
        assert_eq!(disagreements.len(), 2, "{disagreements:?}");
        assert!(disagreements[0].contains("column n is Integer { bytes: 8"), "{disagreements:?}");
        assert!(disagreements[1].contains("column gone is not in information_schema"), "{disagreements:?}");
        assert_eq!(
            schema.indexes,
            vec![
                Index { name: "by_f".into(), columns: vec![1], unique: false },
                Index { name: "by_n".into(), columns: vec![3], unique: true },
            ],
            "indexes follow their columns by name"
        );
        assert_eq!(schema.details.dialect.as_deref(), Some("mariadb"));
    }

    #[test]
    fn another_primary_key_keeps_the_table_map_whole() {
        let logged = table(vec![column("v", DataType::Date, "", None)], Vec::new());
        let mut described = table(vec![column("v", DataType::Date, "date", Some("'2024-01-01'"))], Vec::new());
        described.primary_key = vec![1];
        let (schema, disagreements) = reconcile(&logged, &described);
        assert_eq!(schema, logged);
        assert_eq!(disagreements, ["its primary key is (v) now, (id) in the binlog"]);
    }
}
