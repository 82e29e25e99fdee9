//! What PostgreSQL's catalog says of the tables a job reads: their columns with types mapped to
//! sluice's, keys, secondary indexes, defaults, identity columns, comments, enum
//! labels, domains (as their base types) and the replica identity the change stream relies on.

use sluice_core::schema::{ColumnDetails, GeneratedColumn, TableDetails};
use sluice_core::{Column, DataType, Error, ErrorKind, Index, Side, TableName, TableSchema};
use tokio_postgres::Client;

use super::super::postgres_error;

/// Schemas that hold no user tables.
const SYSTEM_SCHEMAS: &str = "('pg_catalog', 'information_schema')";

/// The source dialect written into `TableDetails::dialect`: a PostgreSQL target creates the
/// columns whose `native_type` is set with that type.
pub(crate) const DIALECT: &str = "postgres";

/// Every ordinary and partitioned table the user can see, outside system schemas; partitions
/// are read through their root.
pub(crate) async fn table_names(client: &Client, server: &str) -> Result<Vec<TableName>, Error> {
    let sql = format!(
        "SELECT n.nspname::text, c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition AND n.nspname NOT IN {SYSTEM_SCHEMAS} \
         AND n.nspname NOT LIKE 'pg\\_toast%' AND n.nspname NOT LIKE 'pg\\_temp%' ORDER BY 1, 2"
    );
    let rows =
        client.query(&sql, &[]).await.map_err(|error| postgres_error(error, Side::Source, server, "list tables"))?;
    Ok(rows.iter().map(|row| TableName::new(Some(row.get::<_, &str>(0)), row.get::<_, &str>(1))).collect())
}

/// A table's quoted, schema-qualified name as SQL text.
pub(crate) fn qualified(name: &TableName) -> String {
    super::super::tables::qualified(name)
}

/// How the change stream identifies a table's deleted and updated rows (`relreplident`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReplicaIdentity {
    /// The primary key (`d`).
    Default,
    /// The whole old row (`f`).
    Full,
    /// A unique index (`i`).
    Index,
    /// Nothing (`n`): deletes and updates cannot be told apart.
    Nothing,
}

/// A described table and what the stream needs beyond its schema.
#[derive(Debug, Clone)]
pub(crate) struct Described {
    pub schema: TableSchema,
    pub identity: ReplicaIdentity,
    /// Rows the planner estimates (`pg_class.reltuples`), or the table's bytes / 100 when it was
    /// never analyzed.
    pub estimated_rows: u64,
    /// Columns whose values PostgreSQL may store out of line (TOAST), which an UPDATE that
    /// leaves them unchanged does not carry.
    pub toasted: Vec<String>,
}

const COLUMNS_SQL: &str = "\
SELECT a.attname::text,
       format_type(a.atttypid, a.atttypmod),
       COALESCE(bt.typname, t.typname)::text,
       COALESCE(bt.typnamespace, t.typnamespace) = 'pg_catalog'::regnamespace,
       CASE WHEN t.typtype = 'd' THEN format_type(t.typbasetype, t.typtypmod) ELSE format_type(a.atttypid, a.atttypmod) END,
       CASE WHEN t.typtype = 'd' THEN t.typtypmod ELSE a.atttypmod END,
       COALESCE(bt.typtype, t.typtype)::text,
       COALESCE(bt.typcategory, t.typcategory)::text,
       a.attnotnull OR (t.typtype = 'd' AND t.typnotnull),
       pg_get_expr(d.adbin, d.adrelid),
       a.attidentity::text,
       a.attgenerated::text,
       col_description(a.attrelid, a.attnum),
       (SELECT array_agg(e.enumlabel::text ORDER BY e.enumsortorder) FROM pg_enum e WHERE e.enumtypid = COALESCE(bt.oid, t.oid)),
       a.attstorage::text
FROM pg_attribute a
JOIN pg_type t ON t.oid = a.atttypid
LEFT JOIN pg_type bt ON t.typtype = 'd' AND bt.oid = t.typbasetype
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE a.attrelid = $1::text::regclass AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
ORDER BY a.attnum";

/// The stored generated columns: type, expression and the other columns the expression reads
/// (the dependencies of the column's default, or of the column itself, as servers record them;
/// PostgreSQL 15 the former).
const GENERATED_SQL: &str = "\
SELECT a.attname::text,
       format_type(a.atttypid, a.atttypmod),
       t.typnamespace = 'pg_catalog'::regnamespace,
       pg_get_expr(d.adbin, d.adrelid),
       ARRAY(SELECT r.attname::text FROM pg_depend dep
             JOIN pg_attribute r ON r.attrelid = dep.refobjid AND r.attnum = dep.refobjsubid
             WHERE dep.refobjid = a.attrelid AND r.attnum <> a.attnum
               AND ((dep.classid = 'pg_attrdef'::regclass AND dep.objid = d.oid)
                    OR (dep.classid = 'pg_class'::regclass AND dep.objid = a.attrelid AND dep.objsubid = a.attnum))
             ORDER BY r.attnum)
FROM pg_attribute a
JOIN pg_type t ON t.oid = a.atttypid
JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE a.attrelid = $1::text::regclass AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = 's'
ORDER BY a.attnum";

const INDEXES_SQL: &str = "\
SELECT ic.relname::text, i.indisprimary, i.indisunique, array_to_string(i.indkey::int2[], ','), i.indexprs IS NULL AND i.indpred IS NULL, i.indisreplident
FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid
WHERE i.indrelid = $1::text::regclass AND i.indisvalid
ORDER BY i.indisprimary DESC, ic.relname";

/// A table's rows are its own; a partitioned table's are its partitions' (`pg_partition_tree`:
/// the table itself and every partition under it; only the leaves hold rows. It lists nothing
/// for a table that is not partitioned).
const TABLE_SQL: &str = "\
SELECT c.relreplident::text,
       (SELECT coalesce(sum(CASE WHEN l.reltuples >= 0 THEN l.reltuples ELSE pg_total_relation_size(l.oid) / 100 END), 0)
        FROM pg_class l
        WHERE (l.oid = c.oid AND c.relkind <> 'p')
           OR l.oid IN (SELECT t.relid FROM pg_partition_tree(c.oid) t WHERE t.isleaf))::float8,
       obj_description(c.oid, 'pg_class')
FROM pg_class c WHERE c.oid = $1::text::regclass";

/// Describes one table; a table that does not exist is a `Schema` error naming it. Generated
/// columns are not among its columns: the change stream does not carry their values
/// (PostgreSQL computes them), so the copy does not either. They are described apart
/// (`TableDetails::generated`, those of a built-in type) for a PostgreSQL target to create.
pub(crate) async fn describe(client: &Client, name: &TableName, server: &str) -> Result<Described, Error> {
    let doing = format!("describe table {name}");
    let error = |error| postgres_error(error, Side::Source, server, &doing);
    let relation = qualified(name);
    let table = client.query_opt(TABLE_SQL, &[&relation]).await.map_err(error)?;
    let Some(table) = table else {
        return Err(
            Error::new(ErrorKind::Schema, format!("table {name} does not exist in the source")).on(Side::Source)
        );
    };
    let identity = match table.get::<_, &str>(0) {
        "f" => ReplicaIdentity::Full,
        "i" => ReplicaIdentity::Index,
        "n" => ReplicaIdentity::Nothing,
        _ => ReplicaIdentity::Default,
    };
    let estimated_rows = table.get::<_, f64>(1) as u64;
    let mut columns = Vec::new();
    let mut toasted = Vec::new();
    for row in client.query(COLUMNS_SQL, &[&relation]).await.map_err(error)? {
        let name: String = row.get(0);
        let base: &str = row.get(2);
        let builtin: bool = row.get(3);
        let base_format: String = row.get(4);
        let modifier: i32 = row.get(5);
        let type_kind: &str = row.get(6);
        let category: &str = row.get(7);
        let labels: Option<Vec<String>> = row.get(13);
        let data_type = data_type(base, modifier, type_kind, category, labels);
        let identity = row.get::<_, &str>(10);
        if row.get::<_, &str>(14) != "p" {
            toasted.push(name.clone());
        }
        let default: Option<String> = row.get(9);
        let details = ColumnDetails {
            default: default.filter(|_| !default_is_sequence(row.get(9))),
            auto_increment: matches!(identity, "a" | "d")
                || row.get::<_, Option<&str>>(9).is_some_and(|default| default_is_sequence(Some(default))),
            on_update: None,
            comment: row.get(12),
        };
        // A PostgreSQL target creates a built-in type as the source has it; a user's type
        // (enum, composite, an extension's) by its mapping, as the target may lack it.
        let native_type = if builtin { base_format } else { String::new() };
        columns.push(Column {
            name,
            data_type,
            nullable: !row.get::<_, bool>(8),
            native_type,
            collation: None,
            details,
        });
    }
    if columns.is_empty() {
        return Err(
            Error::new(ErrorKind::Schema, format!("table {name} has no columns the user can read")).on(Side::Source)
        );
    }
    let attribute_numbers = attribute_numbers(client, &relation, server, &doing).await?;
    let position = |number: i16| attribute_numbers.iter().position(|&attribute| attribute == number);
    let mut primary_key = Vec::new();
    let mut indexes = Vec::new();
    for row in client.query(INDEXES_SQL, &[&relation]).await.map_err(error)? {
        let keys: Vec<i16> = row.get::<_, &str>(3).split(',').filter_map(|number| number.trim().parse().ok()).collect();
        let Some(positions) = keys.iter().map(|&number| position(number)).collect::<Option<Vec<usize>>>() else {
            continue;
        };
        if !row.get::<_, bool>(4) {
            continue; // An expression or partial index: no column list says what it holds.
        }
        if row.get::<_, bool>(1) {
            primary_key = positions;
        } else {
            indexes.push(Index { name: row.get(0), columns: positions, unique: row.get(2) });
        }
    }
    let generated = client
        .query(GENERATED_SQL, &[&relation])
        .await
        .map_err(error)?
        .iter()
        .filter(|row| row.get::<_, bool>(2))
        .map(|row| GeneratedColumn {
            name: row.get(0),
            native_type: row.get(1),
            expression: row.get(3),
            reads: row.get(4),
        })
        .collect();
    let details = TableDetails {
        dialect: Some(DIALECT.to_owned()),
        comment: table.get(2),
        collation: None,
        next_auto_increment: None,
        generated,
        old_values_unknown: identity != ReplicaIdentity::Full,
    };
    let schema = TableSchema { name: name.clone(), columns, primary_key, indexes, details };
    Ok(Described { schema, identity, estimated_rows, toasted })
}

/// The attribute numbers of the table's live columns, in order (dropped columns leave gaps).
async fn attribute_numbers(client: &Client, relation: &str, server: &str, doing: &str) -> Result<Vec<i16>, Error> {
    let rows = client
        .query(
            "SELECT attnum FROM pg_attribute WHERE attrelid = $1::text::regclass AND attnum > 0 AND NOT attisdropped \
             AND attgenerated = '' ORDER BY attnum",
            &[&relation],
        )
        .await
        .map_err(|error| postgres_error(error, Side::Source, server, doing))?;
    Ok(rows.iter().map(|row| row.get(0)).collect())
}

/// A `serial` column's default: its sequence, which the target has not.
fn default_is_sequence(default: Option<&str>) -> bool {
    default.is_some_and(|default| default.starts_with("nextval("))
}

/// Sluice's type for a PostgreSQL base type (a domain's base type for a domain), its type
/// modifier, kind (`typtype`) and category. What has no counterpart of its own (uuid, inet,
/// interval, arrays, ranges, money, xml, tsvector, ...) is text: a PostgreSQL target creates it
/// with its own type again (`Column::native_type`), others keep its text form.
pub(crate) fn data_type(
    base: &str,
    modifier: i32,
    kind: &str,
    category: &str,
    labels: Option<Vec<String>>,
) -> DataType {
    if kind == "e" {
        return DataType::Enum { values: labels.unwrap_or_default() };
    }
    if category == "A" {
        return DataType::Text { length: None, fixed: false };
    }
    let precision = |default: u8| if modifier >= 0 { modifier.min(6) as u8 } else { default };
    match base {
        "bool" => DataType::Boolean,
        "int2" => DataType::Integer { bytes: 2, unsigned: false },
        "int4" => DataType::Integer { bytes: 4, unsigned: false },
        "int8" => DataType::Integer { bytes: 8, unsigned: false },
        "float4" => DataType::Float32,
        "float8" => DataType::Float64,
        "numeric" if modifier >= 4 => {
            let packed = (modifier - 4) as u32;
            DataType::Decimal { precision: Some(packed >> 16 & 0xffff), scale: Some(packed & 0xffff) }
        }
        "numeric" => DataType::Decimal { precision: None, scale: None },
        "varchar" if modifier >= 4 => DataType::Text { length: Some((modifier - 4) as u32), fixed: false },
        "bpchar" if modifier >= 4 => DataType::Text { length: Some((modifier - 4) as u32), fixed: true },
        "bpchar" => DataType::Text { length: Some(1), fixed: true },
        "bytea" => DataType::Bytes { length: None, fixed: false },
        "bit" if (1..=64).contains(&modifier) => DataType::Bits { width: modifier as u8 },
        "date" => DataType::Date,
        "time" => DataType::Time { precision: precision(6) },
        "timestamp" => DataType::DateTime { precision: precision(6) },
        "timestamptz" => DataType::Timestamp { precision: precision(6) },
        "json" | "jsonb" => DataType::Json,
        _ => DataType::Text { length: None, fixed: false },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_map_to_their_counterparts_and_the_rest_to_text() {
        assert_eq!(
            data_type("numeric", (12 << 16 | 3) + 4, "b", "N", None),
            DataType::Decimal { precision: Some(12), scale: Some(3) }
        );
        assert_eq!(data_type("numeric", -1, "b", "N", None), DataType::Decimal { precision: None, scale: None });
        assert_eq!(data_type("varchar", 24, "b", "S", None), DataType::Text { length: Some(20), fixed: false });
        assert_eq!(data_type("timestamptz", 3, "b", "D", None), DataType::Timestamp { precision: 3 });
        assert_eq!(data_type("int4", -1, "b", "A", None), DataType::Text { length: None, fixed: false });
        assert_eq!(data_type("uuid", -1, "b", "U", None), DataType::Text { length: None, fixed: false });
        assert_eq!(
            data_type("mood", -1, "e", "E", Some(vec!["a".into()])),
            DataType::Enum { values: vec!["a".into()] }
        );
    }
}
