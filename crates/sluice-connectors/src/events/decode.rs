//! Change events read back, for stream sources: a message in one of the formats (Maxwell's JSON,
//! Debezium's envelope with or without its schema, as Sluice or the tools themselves write them)
//! into the table it is about, its operation and its row images, and a table's schema from it.

use serde_json::{Map, Value as Json};
use sluice_core::{Column, DataType, Row, TableName, TableSchema};

use super::EventFormat;
use crate::json::{decode_value, inferred_type};

/// What a row event did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// A row of a snapshot (Maxwell's `bootstrap-insert`, Debezium's `r`).
    Snapshot,
    Insert,
    Update,
    Delete,
}

/// One row event as a message carried it, its row images still JSON objects.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadEvent {
    pub table: TableName,
    pub operation: Operation,
    /// The row before the change (updates and deletes), every column the format gives.
    pub before: Option<Map<String, Json>>,
    /// The row after the change (snapshot rows, inserts and updates).
    pub after: Option<Map<String, Json>>,
    /// The primary-key columns, from the message key or the event, in key order.
    pub key_columns: Vec<String>,
    /// The source's time of the change, Unix milliseconds.
    pub ts_ms: u64,
    /// The row's columns with their types, when the message carries a schema (Debezium with
    /// schema); `None` when types can only be guessed from the values.
    pub columns: Option<Vec<Column>>,
}

impl ReadEvent {
    /// The table's schema this event implies: the carried schema, or the columns of its row
    /// image with types inferred from their JSON values (`crate::json::inferred_type`).
    pub fn schema(&self) -> Result<TableSchema, String> {
        let columns = match &self.columns {
            Some(columns) => columns.clone(),
            None => {
                let image = self.after.as_ref().or(self.before.as_ref()).ok_or("the event has no row image")?;
                image.iter().map(|(name, value)| Column::new(name, inferred_type(value), true)).collect()
            }
        };
        let mut primary_key = Vec::with_capacity(self.key_columns.len());
        for key in &self.key_columns {
            let index = columns
                .iter()
                .position(|column| &column.name == key)
                .ok_or_else(|| format!("key column `{key}` is not a column of the row"))?;
            primary_key.push(index);
        }
        let mut columns = columns;
        for &index in &primary_key {
            columns[index].nullable = false;
        }
        Ok(TableSchema {
            name: self.table.clone(),
            columns,
            primary_key,
            indexes: Vec::new(),
            details: Default::default(),
        })
    }

    /// A row image as a row of `table`: a missing column is NULL, a column the table does not
    /// have is an error (a schema change the stream cannot carry).
    pub fn row(table: &TableSchema, image: &Map<String, Json>) -> Result<Row, String> {
        if let Some(unknown) = image.keys().find(|name| table.column_index(name).is_none()) {
            return Err(format!("column `{unknown}` is not a column of {} as the stream first saw it", table.name));
        }
        table
            .columns
            .iter()
            .map(|column| {
                decode_value(image.get(&column.name).unwrap_or(&Json::Null), &column.data_type)
                    .map_err(|reason| format!("column {}: {reason}", column.name))
            })
            .collect()
    }
}

/// Reads one message. `Ok(None)` for a message that is no row event: a tombstone (no value), or
/// Maxwell's bootstrap markers. Anything else that does not read is an error saying why.
pub fn read_event(format: EventFormat, key: Option<&[u8]>, value: Option<&[u8]>) -> Result<Option<ReadEvent>, String> {
    let Some(value) = value.filter(|value| !value.is_empty()) else { return Ok(None) };
    let document: Json = serde_json::from_slice(value).map_err(|error| format!("the value is not JSON: {error}"))?;
    let key: Option<Json> = match key.filter(|key| !key.is_empty()) {
        Some(key) => Some(serde_json::from_slice(key).map_err(|error| format!("the key is not JSON: {error}"))?),
        None => None,
    };
    match format {
        EventFormat::Maxwell => maxwell(document, key),
        // A Debezium reader takes both variants: the schema is used when it is there.
        EventFormat::Debezium { .. } => debezium(document, key),
    }
}

fn object(value: Json, what: &str) -> Result<Map<String, Json>, String> {
    match value {
        Json::Object(map) => Ok(map),
        other => Err(format!("`{what}` is not a JSON object: {}", shown(&other))),
    }
}

fn shown(value: &Json) -> String {
    value.to_string().chars().take(120).collect()
}

fn text(map: &Map<String, Json>, field: &str) -> Result<String, String> {
    match map.get(field) {
        Some(Json::String(text)) => Ok(text.clone()),
        Some(other) => Err(format!("`{field}` is not a string: {}", shown(other))),
        None => Err(format!("the event has no `{field}`")),
    }
}

fn maxwell(document: Json, key: Option<Json>) -> Result<Option<ReadEvent>, String> {
    let mut event = object(document, "value")?;
    let database = text(&event, "database")?;
    let table = text(&event, "table")?;
    let kind = text(&event, "type")?;
    let operation = match kind.as_str() {
        "bootstrap-insert" => Operation::Snapshot,
        "insert" => Operation::Insert,
        "update" => Operation::Update,
        "delete" => Operation::Delete,
        "bootstrap-start" | "bootstrap-complete" => return Ok(None),
        other => {
            return Err(format!(
                "Maxwell event type `{other}` is not a row event (a schema change is not carried from a stream)"
            ))
        }
    };
    let ts_ms = event.get("ts").and_then(Json::as_u64).map_or(0, |seconds| seconds * 1000);
    let data = object(event.remove("data").ok_or("the event has no `data`")?, "data")?;
    // `old` holds the previous values of the columns an update changed, only those.
    let old = match event.remove("old") {
        Some(old) if !old.is_null() => Some(object(old, "old")?),
        _ => None,
    };
    let mut key_columns: Vec<String> = match event.get("primary_key_columns") {
        Some(Json::Array(names)) => names.iter().filter_map(|name| name.as_str().map(str::to_owned)).collect(),
        _ => Vec::new(),
    };
    if key_columns.is_empty() {
        // Maxwell's key: {"database", "table", "pk.<column>": value ...}; the event's own
        // column names are matched without case, as Maxwell lowers them.
        if let Some(Json::Object(key)) = &key {
            for name in key.keys().filter_map(|field| field.strip_prefix("pk.")) {
                let column = data.keys().find(|column| column.eq_ignore_ascii_case(name)).cloned();
                key_columns.push(column.unwrap_or_else(|| name.to_owned()));
            }
        }
    }
    let (before, after) = match operation {
        Operation::Snapshot | Operation::Insert => (None, Some(data)),
        Operation::Delete => (Some(data), None),
        Operation::Update => {
            let mut before = data.clone();
            for (column, value) in old.unwrap_or_default() {
                before.insert(column, value);
            }
            (Some(before), Some(data))
        }
    };
    Ok(Some(ReadEvent {
        table: TableName::new(Some(&database), &table),
        operation,
        before,
        after,
        key_columns,
        ts_ms,
        columns: None,
    }))
}

/// The payload of a Kafka Connect JSON document (`{"schema", "payload"}`), with its schema.
fn unwrapped(document: Json) -> (Json, Option<Json>) {
    match document {
        Json::Object(mut map) if map.len() == 2 && map.contains_key("schema") && map.contains_key("payload") => {
            let payload = map.remove("payload").unwrap_or(Json::Null);
            (payload, map.remove("schema"))
        }
        other => (other, None),
    }
}

fn debezium(document: Json, key: Option<Json>) -> Result<Option<ReadEvent>, String> {
    let (payload, schema) = unwrapped(document);
    let mut envelope = object(payload, "payload")?;
    let op = text(&envelope, "op")?;
    let operation = match op.as_str() {
        "r" => Operation::Snapshot,
        "c" => Operation::Insert,
        "u" => Operation::Update,
        "d" => Operation::Delete,
        other => {
            return Err(format!("Debezium op `{other}` is not a row change (a truncate or message is not carried)"))
        }
    };
    let source = object(envelope.remove("source").ok_or("the event has no `source`")?, "source")?;
    // Debezium's MySQL connector names `db`; its PostgreSQL one adds `schema`.
    let namespace = match source.get("schema").and_then(Json::as_str) {
        Some(schema) => schema.to_owned(),
        None => text(&source, "db")?,
    };
    let table = text(&source, "table")?;
    let ts_ms = envelope.get("ts_ms").and_then(Json::as_u64).or_else(|| source.get("ts_ms").and_then(Json::as_u64));
    let image = |envelope: &mut Map<String, Json>, field: &str| -> Result<Option<Map<String, Json>>, String> {
        match envelope.remove(field) {
            None | Some(Json::Null) => Ok(None),
            Some(value) => object(value, field).map(Some),
        }
    };
    let before = image(&mut envelope, "before")?;
    let after = image(&mut envelope, "after")?;
    match operation {
        Operation::Delete if before.is_none() => return Err("a delete without `before`".into()),
        Operation::Snapshot | Operation::Insert | Operation::Update if after.is_none() => {
            return Err(format!("op `{op}` without `after`"))
        }
        _ => {}
    }
    let key_columns = match key.map(unwrapped) {
        Some((Json::Object(fields), _)) => fields.keys().cloned().collect(),
        _ => Vec::new(),
    };
    let columns = schema.map(|schema| row_schema(&schema)).transpose()?;
    Ok(Some(ReadEvent {
        table: TableName::new(Some(&namespace), &table),
        operation,
        before,
        after,
        key_columns,
        ts_ms: ts_ms.unwrap_or(0),
        columns,
    }))
}

/// The columns of the envelope schema's `after` (or `before`) struct.
fn row_schema(schema: &Json) -> Result<Vec<Column>, String> {
    let fields = schema.get("fields").and_then(Json::as_array).ok_or("the schema has no `fields`")?;
    let image = fields
        .iter()
        .find(|field| field.get("field").and_then(Json::as_str) == Some("after"))
        .or_else(|| fields.iter().find(|field| field.get("field").and_then(Json::as_str) == Some("before")))
        .ok_or("the schema has no `after` struct")?;
    let columns = image.get("fields").and_then(Json::as_array).ok_or("the `after` schema has no `fields`")?;
    columns
        .iter()
        .map(|column| {
            let name = column.get("field").and_then(Json::as_str).ok_or("a schema field has no name")?;
            let kind = column.get("type").and_then(Json::as_str).unwrap_or("string");
            let logical = column.get("name").and_then(Json::as_str);
            let optional = column.get("optional").and_then(Json::as_bool).unwrap_or(true);
            Ok(Column::new(name, connect_data_type(kind, logical), optional))
        })
        .collect()
}

/// The logical type of a Kafka Connect field: the inverse of the format's `connect_type`, and
/// Debezium's common logical names. Unknown names fall back to the plain type.
fn connect_data_type(kind: &str, logical: Option<&str>) -> DataType {
    match (kind, logical) {
        (
            _,
            Some("sluice.Decimal" | "org.apache.kafka.connect.data.Decimal" | "io.debezium.data.VariableScaleDecimal"),
        ) => DataType::Decimal { precision: None, scale: None },
        (_, Some("sluice.Date")) => DataType::Date,
        (_, Some("sluice.Time" | "io.debezium.time.MicroTime")) if kind == "string" => DataType::Time { precision: 6 },
        (_, Some("sluice.DateTime")) => DataType::DateTime { precision: 6 },
        (_, Some("io.debezium.time.ZonedTimestamp")) => DataType::Timestamp { precision: 6 },
        (_, Some("io.debezium.time.Year")) => DataType::Year,
        (_, Some("io.debezium.data.Json")) => DataType::Json,
        ("boolean", _) => DataType::Boolean,
        ("int8", _) => DataType::Integer { bytes: 1, unsigned: false },
        ("int16", _) => DataType::Integer { bytes: 2, unsigned: false },
        ("int32", _) => DataType::Integer { bytes: 4, unsigned: false },
        ("int64", _) => DataType::Integer { bytes: 8, unsigned: false },
        ("float", _) => DataType::Float32,
        ("double", _) => DataType::Float64,
        ("bytes", _) => DataType::Bytes { length: None, fixed: false },
        _ => DataType::Text { length: None, fixed: false },
    }
}

#[cfg(test)]
mod tests {
    use sluice_core::value::Decimal;
    use sluice_core::Value;

    use super::*;
    use crate::events::format::{Event, EventKind, TransactionInfo};
    use crate::events::Origin;

    fn table() -> TableSchema {
        TableSchema {
            name: TableName::new(Some("shop"), "orders"),
            columns: vec![
                Column::new("id", DataType::Integer { bytes: 8, unsigned: false }, false),
                Column::new("total", DataType::Decimal { precision: Some(10), scale: Some(2) }, true),
                Column::new("note", DataType::Text { length: None, fixed: false }, true),
                Column::new("blob", DataType::Bytes { length: None, fixed: false }, true),
            ],
            primary_key: vec![0],
            indexes: Vec::new(),
            details: Default::default(),
        }
    }

    fn row(id: i64, note: &str) -> Row {
        vec![
            Value::Int(id),
            Value::Decimal(Decimal::parse("12.50").unwrap()),
            Value::Text(note.into()),
            Value::Bytes(vec![0, 255, 7]),
        ]
    }

    /// Writes an event as the stream targets do and reads it back.
    fn round_trip(format: EventFormat, kind: EventKind<'_>) -> ReadEvent {
        let table = table();
        let position = serde_json::json!({"file": "b.000001", "pos": 4}).to_string();
        let transaction = TransactionInfo { id: "b.000001:4", index: 0, count: 1 };
        let event = Event {
            table: &table,
            kind,
            ts_ms: 1_700_000_000_000,
            transaction: Some(transaction),
            position: Some(&position),
        };
        let origin = Origin { connector: "mysql".into(), job: "job".into() };
        let key = format.key(&event);
        let value = format.value(&event, &origin);
        read_event(format, Some(key.as_bytes()), Some(value.as_bytes())).unwrap().unwrap()
    }

    #[test]
    fn every_format_reads_back_what_the_targets_write() {
        let before = row(7, "old");
        let after = row(7, "new");
        for format in
            [EventFormat::Maxwell, EventFormat::Debezium { schema: false }, EventFormat::Debezium { schema: true }]
        {
            let event = round_trip(format, EventKind::Update { before: &before, after: &after });
            assert_eq!(event.table, TableName::new(Some("shop"), "orders"), "{format:?}");
            assert_eq!(event.operation, Operation::Update, "{format:?}");
            assert_eq!(event.key_columns, vec!["id".to_owned()], "{format:?}");
            let schema = event.schema().unwrap();
            assert_eq!(schema.primary_key, vec![0], "{format:?}");
            let read_before = ReadEvent::row(&schema, event.before.as_ref().unwrap()).unwrap();
            let read_after = ReadEvent::row(&schema, event.after.as_ref().unwrap()).unwrap();
            assert_eq!(read_before[2], Value::Text("old".into()), "{format:?}");
            assert_eq!(read_after[2], Value::Text("new".into()), "{format:?}");
            assert_eq!(read_after[0].to_string(), "7", "{format:?}");
            // Decimals travel as exact strings, bytes as base64: with a schema they come back typed.
            if format == (EventFormat::Debezium { schema: true }) {
                assert_eq!(read_after, after, "{format:?}");
                assert_eq!(schema.columns[1].data_type, DataType::Decimal { precision: None, scale: None });
            } else {
                assert_eq!(read_after[1], Value::Text("12.50".into()), "{format:?}");
            }
            let deleted = round_trip(format, EventKind::Delete { before: &before });
            assert_eq!(deleted.operation, Operation::Delete, "{format:?}");
            assert!(deleted.after.is_none() && deleted.before.is_some(), "{format:?}");
            let snapshot = round_trip(format, EventKind::Snapshot { after: &after });
            assert_eq!(snapshot.operation, Operation::Snapshot, "{format:?}");
        }
    }

    #[test]
    fn maxwell_update_before_is_data_with_old_values_overlaid() {
        let value =
            br#"{"database":"d","table":"t","type":"update","ts":5,"data":{"id":1,"a":"new","b":2},"old":{"a":"old"}}"#;
        let key = br#"{"database":"d","table":"t","pk.id":1}"#;
        let event = read_event(EventFormat::Maxwell, Some(key), Some(value)).unwrap().unwrap();
        assert_eq!(event.key_columns, vec!["id".to_owned()]);
        assert_eq!(event.ts_ms, 5000);
        let before = event.before.unwrap();
        assert_eq!(before["a"], "old");
        assert_eq!(before["b"], 2);
    }

    #[test]
    fn tombstones_and_markers_are_no_events_and_bad_messages_say_why() {
        assert_eq!(read_event(EventFormat::Maxwell, Some(b"{}"), None).unwrap(), None);
        let marker = br#"{"database":"d","table":"t","type":"bootstrap-start","ts":1,"data":{}}"#;
        assert_eq!(read_event(EventFormat::Maxwell, None, Some(marker)).unwrap(), None);
        let ddl = br#"{"database":"d","table":"t","type":"table-alter","ts":1}"#;
        assert!(read_event(EventFormat::Maxwell, None, Some(ddl)).unwrap_err().contains("table-alter"));
        assert!(read_event(EventFormat::Debezium { schema: false }, None, Some(b"not json"))
            .unwrap_err()
            .contains("not JSON"));
        let no_after = br#"{"op":"c","before":null,"after":null,"source":{"db":"d","table":"t"}}"#;
        assert!(read_event(EventFormat::Debezium { schema: false }, None, Some(no_after))
            .unwrap_err()
            .contains("after"));
    }

    #[test]
    fn a_column_the_first_event_did_not_have_is_an_error() {
        let event = read_event(
            EventFormat::Maxwell,
            None,
            Some(
                br#"{"database":"d","table":"t","type":"insert","ts":1,"data":{"id":1},"primary_key_columns":["id"]}"#,
            ),
        )
        .unwrap()
        .unwrap();
        let schema = event.schema().unwrap();
        let mut image = Map::new();
        image.insert("id".into(), Json::from(2));
        image.insert("added".into(), Json::from("x"));
        assert!(ReadEvent::row(&schema, &image).unwrap_err().contains("`added`"));
    }
}
