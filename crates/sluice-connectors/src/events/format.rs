//! The change-event formats a stream target writes: Maxwell's JSON and Debezium's envelope
//! (without or with its Kafka Connect schema). `docs/events.md` describes them field by field.
//! Values are rendered as JSON Lines files render them (`crate::json`).

use sluice_core::change::{key_text, Change, ChangeKind};
use sluice_core::spec::{EndpointSpec, SpecError};
use sluice_core::{DataType, Row, TableSchema, Value};

use crate::json::encode_value;

/// How change events are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventFormat {
    /// Maxwell's JSON: `{"database", "table", "type", "ts", "xid", "commit", "data", "old"}`.
    Maxwell,
    /// Debezium's envelope: `{"before", "after", "source", "op", "ts_ms", "transaction"}`, with
    /// the Kafka Connect JSON schema around key and value when `schema` is set.
    Debezium { schema: bool },
}

/// The names `format:` takes.
pub const FORMAT_NAMES: &[&str] = &["maxwell", "debezium", "debezium-schema"];

impl EventFormat {
    /// The events a row change becomes. An update that moves a row of a keyed table to another
    /// primary key is, in Debezium's format, a `d` of the old key and a `c` of the new one, as
    /// Debezium sends it: a consumer that keeps the last event per key (a compacted topic) then
    /// drops the old key. Maxwell sends it as one `update` whose `old` holds the old key.
    pub fn events_of<'a>(&self, change: &'a Change) -> Vec<EventKind<'a>> {
        match &change.kind {
            ChangeKind::Insert { after } => vec![EventKind::Insert { after }],
            ChangeKind::Delete { before } => vec![EventKind::Delete { before }],
            ChangeKind::Update { before, after } => {
                let table = &change.table;
                let moved = !table.primary_key.is_empty()
                    && table.primary_key.iter().any(|&index| before.get(index) != after.get(index));
                if moved && matches!(self, EventFormat::Debezium { .. }) {
                    vec![EventKind::Delete { before }, EventKind::Insert { after }]
                } else {
                    vec![EventKind::Update { before, after }]
                }
            }
        }
    }

    pub fn parse(name: &str) -> Option<EventFormat> {
        match name {
            "maxwell" => Some(EventFormat::Maxwell),
            "debezium" => Some(EventFormat::Debezium { schema: false }),
            "debezium-schema" => Some(EventFormat::Debezium { schema: true }),
            _ => None,
        }
    }

    /// The name `format:` gives it.
    pub fn name(&self) -> &'static str {
        match self {
            EventFormat::Maxwell => "maxwell",
            EventFormat::Debezium { schema: false } => "debezium",
            EventFormat::Debezium { schema: true } => "debezium-schema",
        }
    }

    /// The endpoint's `format:` (Maxwell when absent), or the error naming the field.
    pub fn of(endpoint: &EndpointSpec) -> Result<EventFormat, SpecError> {
        match super::text_option(endpoint, "format") {
            None => Ok(EventFormat::Maxwell),
            Some(name) => EventFormat::parse(&name).ok_or_else(|| {
                endpoint
                    .error("format", format!("unknown format `{name}`; expected one of: {}", FORMAT_NAMES.join(", ")))
            }),
        }
    }
}

/// Who wrote the events: the job (Debezium's `source.name`) and the source connector type.
#[derive(Debug, Clone)]
pub struct Origin {
    pub job: String,
    pub connector: String,
}

/// An event's place in its source transaction.
#[derive(Debug, Clone, Copy)]
pub struct TransactionInfo<'a> {
    /// The transaction's id: its commit position as text, unique and the same on every replay.
    pub id: &'a str,
    /// The event's index in the transaction, from 0.
    pub index: u64,
    /// Events of the transaction this target writes.
    pub count: u64,
}

/// What happened to the row.
#[derive(Debug, Clone, Copy)]
pub enum EventKind<'a> {
    /// A row of a snapshot (Maxwell `bootstrap-insert`, Debezium `r`).
    Snapshot {
        after: &'a Row,
    },
    Insert {
        after: &'a Row,
    },
    Update {
        before: &'a Row,
        after: &'a Row,
    },
    Delete {
        before: &'a Row,
    },
}

/// One row event, ready to render.
#[derive(Debug, Clone, Copy)]
pub struct Event<'a> {
    pub table: &'a TableSchema,
    pub kind: EventKind<'a>,
    /// The source's commit time (snapshot rows: the time they were read), Unix milliseconds.
    pub ts_ms: u64,
    /// Where the stream resumes after the event's transaction, as JSON text (rendered once per
    /// transaction); `None` for snapshot rows.
    pub position: Option<&'a str>,
    pub transaction: Option<TransactionInfo<'a>>,
}

impl Event<'_> {
    /// The image that identifies the row: the new one, or the old one of a delete.
    fn row(&self) -> &Row {
        match self.kind {
            EventKind::Snapshot { after } | EventKind::Insert { after } | EventKind::Update { after, .. } => after,
            EventKind::Delete { before } => before,
        }
    }

    /// The columns that identify the row: its primary key, or every column of a keyless table.
    fn key_columns(&self) -> Vec<usize> {
        if self.table.primary_key.is_empty() {
            (0..self.table.columns.len()).collect()
        } else {
            self.table.primary_key.clone()
        }
    }

    /// The row's identity as text (`id=5`), the same in every format: what keeps per-key order.
    pub fn key_text(&self) -> String {
        key_text(self.table, self.row())
    }
}

fn push_string(text: &str, output: &mut String) {
    output.push_str(&serde_json::Value::from(text).to_string());
}

/// `{"a":1,"b":"x"}` of some columns of a row.
fn push_object(table: &TableSchema, row: &Row, columns: impl Iterator<Item = usize>, output: &mut String) {
    output.push('{');
    for (written, index) in columns.enumerate() {
        if written > 0 {
            output.push(',');
        }
        push_string(&table.columns[index].name, output);
        output.push(':');
        encode_value(row.get(index).unwrap_or(&Value::Null), output);
    }
    output.push('}');
}

fn push_row(table: &TableSchema, row: &Row, output: &mut String) {
    push_object(table, row, 0..table.columns.len(), output);
}

fn database(table: &TableSchema) -> &str {
    table.name.namespace.as_deref().unwrap_or("")
}

/// The 53-bit FNV-1a hash of a transaction id: Maxwell's `xid` is a number, and 53 bits stay
/// exact in every JSON reader.
fn xid(id: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in id.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash & ((1 << 53) - 1)
}

impl EventFormat {
    /// The message key: Maxwell's `{"database", "table", "pk.<column>"}` or Debezium's key
    /// document (the primary-key columns). Keyless tables key by every column.
    pub fn key(&self, event: &Event<'_>) -> String {
        let row = event.row();
        let table = event.table;
        let mut output = String::with_capacity(64);
        match self {
            EventFormat::Maxwell => {
                output.push_str("{\"database\":");
                push_string(database(table), &mut output);
                output.push_str(",\"table\":");
                push_string(&table.name.name, &mut output);
                for index in event.key_columns() {
                    output.push(',');
                    push_string(&format!("pk.{}", table.columns[index].name.to_lowercase()), &mut output);
                    output.push(':');
                    encode_value(row.get(index).unwrap_or(&Value::Null), &mut output);
                }
                output.push('}');
            }
            EventFormat::Debezium { schema } => {
                let columns = event.key_columns();
                if *schema {
                    output.push_str("{\"schema\":");
                    let fields: Vec<usize> = columns.clone();
                    push_struct_schema(
                        table,
                        &fields,
                        &format!("{}.Key", schema_name(table)),
                        false,
                        None,
                        &mut output,
                    );
                    output.push_str(",\"payload\":");
                }
                push_object(table, row, columns.into_iter(), &mut output);
                if *schema {
                    output.push('}');
                }
            }
        }
        output
    }

    /// The message value.
    pub fn value(&self, event: &Event<'_>, origin: &Origin) -> String {
        match self {
            EventFormat::Maxwell => maxwell(event),
            EventFormat::Debezium { schema } => {
                let payload = debezium(event, origin);
                if *schema {
                    let mut output = String::with_capacity(payload.len() + 1024);
                    output.push_str("{\"schema\":");
                    push_envelope_schema(event.table, &mut output);
                    output.push_str(",\"payload\":");
                    output.push_str(&payload);
                    output.push('}');
                    output
                } else {
                    payload
                }
            }
        }
    }
}

fn maxwell(event: &Event<'_>) -> String {
    let table = event.table;
    let mut output = String::with_capacity(256);
    output.push_str("{\"database\":");
    push_string(database(table), &mut output);
    output.push_str(",\"table\":");
    push_string(&table.name.name, &mut output);
    let kind = match event.kind {
        EventKind::Snapshot { .. } => "bootstrap-insert",
        EventKind::Insert { .. } => "insert",
        EventKind::Update { .. } => "update",
        EventKind::Delete { .. } => "delete",
    };
    output.push_str(",\"type\":\"");
    output.push_str(kind);
    output.push_str("\",\"ts\":");
    output.push_str(&(event.ts_ms / 1000).to_string());
    if let Some(transaction) = event.transaction {
        output.push_str(",\"xid\":");
        output.push_str(&xid(transaction.id).to_string());
        output.push_str(",\"xoffset\":");
        output.push_str(&transaction.index.to_string());
        output.push_str(",\"xcount\":");
        output.push_str(&transaction.count.to_string());
        output.push_str(",\"transaction_id\":");
        push_string(transaction.id, &mut output);
        if transaction.index + 1 == transaction.count {
            output.push_str(",\"commit\":true");
        }
    }
    if let Some(position) = event.position {
        output.push_str(",\"position\":");
        output.push_str(position);
    }
    output.push_str(",\"data\":");
    push_row(table, event.row(), &mut output);
    if let EventKind::Update { before, after } = event.kind {
        // Maxwell's `old` holds the previous value of each column that changed, only those; of
        // the key's alone where the source sent no other old values.
        let known = |index: &usize| !table.details.old_values_unknown || table.primary_key.contains(index);
        let changed = (0..table.columns.len()).filter(|&index| before.get(index) != after.get(index)).filter(known);
        output.push_str(",\"old\":");
        push_object(table, before, changed, &mut output);
    }
    if !table.primary_key.is_empty() {
        output.push_str(",\"primary_key\":[");
        for (written, &index) in table.primary_key.iter().enumerate() {
            if written > 0 {
                output.push(',');
            }
            encode_value(event.row().get(index).unwrap_or(&Value::Null), &mut output);
        }
        output.push_str("],\"primary_key_columns\":[");
        for (written, &index) in table.primary_key.iter().enumerate() {
            if written > 0 {
                output.push(',');
            }
            push_string(&table.columns[index].name, &mut output);
        }
        output.push(']');
    }
    output.push('}');
    output
}

fn debezium(event: &Event<'_>, origin: &Origin) -> String {
    let table = event.table;
    let mut output = String::with_capacity(384);
    let (before, after, op) = match event.kind {
        EventKind::Snapshot { after } => (None, Some(after), "r"),
        EventKind::Insert { after } => (None, Some(after), "c"),
        // No old row where the source sent none (as Debezium's PostgreSQL connector does).
        EventKind::Update { before, after } => {
            ((!table.details.old_values_unknown).then_some(before), Some(after), "u")
        }
        EventKind::Delete { before } => (Some(before), None, "d"),
    };
    for (name, image) in [("{\"before\":", before), (",\"after\":", after)] {
        output.push_str(name);
        match image {
            Some(row) => push_row(table, row, &mut output),
            None => output.push_str("null"),
        }
    }
    output.push_str(",\"source\":{\"version\":");
    push_string(env!("CARGO_PKG_VERSION"), &mut output);
    output.push_str(",\"connector\":");
    push_string(&origin.connector, &mut output);
    output.push_str(",\"name\":");
    push_string(&origin.job, &mut output);
    output.push_str(",\"ts_ms\":");
    output.push_str(&event.ts_ms.to_string());
    output.push_str(",\"snapshot\":");
    output.push_str(if op == "r" { "\"true\"" } else { "\"false\"" });
    output.push_str(",\"db\":");
    push_string(database(table), &mut output);
    output.push_str(",\"table\":");
    push_string(&table.name.name, &mut output);
    output.push_str(",\"position\":");
    // A JSON document as a string, the way Debezium carries `io.debezium.data.Json`.
    match event.position {
        Some(position) => push_string(position, &mut output),
        None => output.push_str("null"),
    }
    output.push_str("},\"op\":\"");
    output.push_str(op);
    output.push_str("\",\"ts_ms\":");
    output.push_str(&event.ts_ms.to_string());
    output.push_str(",\"transaction\":");
    match event.transaction {
        Some(transaction) => {
            output.push_str("{\"id\":");
            push_string(transaction.id, &mut output);
            output.push_str(",\"total_order\":");
            output.push_str(&(transaction.index + 1).to_string());
            output.push_str(",\"data_collection_order\":");
            output.push_str(&(transaction.index + 1).to_string());
            output.push_str(",\"event_count\":");
            output.push_str(&transaction.count.to_string());
            output.push('}');
        }
        None => output.push_str("null"),
    }
    output.push('}');
    output
}

/// `server.db.table`, Debezium's schema name prefix (the server being the job).
fn schema_name(table: &TableSchema) -> String {
    match &table.name.namespace {
        Some(namespace) => format!("sluice.{namespace}.{}", table.name.name),
        None => format!("sluice.{}", table.name.name),
    }
}

/// The Kafka Connect type of a column: (type, logical name). Exact decimals and 64-bit unsigned
/// integers are strings named `sluice.Decimal` (their text is exact); times are strings with
/// their precision, named like Debezium's string time types.
fn connect_type(data_type: &DataType) -> (&'static str, Option<&'static str>) {
    match data_type {
        DataType::Boolean => ("boolean", None),
        DataType::Integer { bytes: 8, unsigned: true } => ("string", Some("sluice.Decimal")),
        DataType::Integer { bytes: 1, unsigned: false } => ("int16", None),
        DataType::Integer { bytes, unsigned } if *bytes < 4 || (*bytes == 4 && !*unsigned) => ("int32", None),
        DataType::Integer { .. } | DataType::Bits { .. } => ("int64", None),
        DataType::Year => ("int32", Some("io.debezium.time.Year")),
        DataType::Float32 => ("float", None),
        DataType::Float64 => ("double", None),
        DataType::Decimal { .. } => ("string", Some("sluice.Decimal")),
        DataType::Bytes { .. } => ("bytes", None),
        DataType::Date => ("string", Some("sluice.Date")),
        DataType::Time { .. } => ("string", Some("sluice.Time")),
        DataType::DateTime { .. } => ("string", Some("sluice.DateTime")),
        DataType::Timestamp { .. } => ("string", Some("io.debezium.time.ZonedTimestamp")),
        DataType::Json => ("string", Some("io.debezium.data.Json")),
        DataType::Enum { .. } => ("string", Some("io.debezium.data.Enum")),
        DataType::Set { .. } => ("string", Some("io.debezium.data.EnumSet")),
        DataType::Text { .. } | DataType::Geometry => ("string", None),
    }
}

/// A struct schema of some columns of a table.
fn push_struct_schema(
    table: &TableSchema,
    columns: &[usize],
    name: &str,
    optional: bool,
    field: Option<&str>,
    output: &mut String,
) {
    output.push_str("{\"type\":\"struct\",\"fields\":[");
    for (written, &index) in columns.iter().enumerate() {
        if written > 0 {
            output.push(',');
        }
        let column = &table.columns[index];
        let (kind, logical) = connect_type(&column.data_type);
        output.push_str("{\"type\":\"");
        output.push_str(kind);
        output.push_str("\",\"optional\":");
        output.push_str(if column.nullable { "true" } else { "false" });
        if let Some(logical) = logical {
            output.push_str(",\"name\":\"");
            output.push_str(logical);
            output.push('"');
        }
        output.push_str(",\"field\":");
        push_string(&column.name, output);
        output.push('}');
    }
    output.push_str("],\"optional\":");
    output.push_str(if optional { "true" } else { "false" });
    output.push_str(",\"name\":");
    push_string(name, output);
    if let Some(field) = field {
        output.push_str(",\"field\":");
        push_string(field, output);
    }
    output.push('}');
}

/// The schema of Debezium's envelope for a table.
fn push_envelope_schema(table: &TableSchema, output: &mut String) {
    let name = schema_name(table);
    let all: Vec<usize> = (0..table.columns.len()).collect();
    output.push_str("{\"type\":\"struct\",\"fields\":[");
    push_struct_schema(table, &all, &format!("{name}.Value"), true, Some("before"), output);
    output.push(',');
    push_struct_schema(table, &all, &format!("{name}.Value"), true, Some("after"), output);
    output.push_str(concat!(
        ",{\"type\":\"struct\",\"fields\":[",
        "{\"type\":\"string\",\"optional\":false,\"field\":\"version\"},",
        "{\"type\":\"string\",\"optional\":false,\"field\":\"connector\"},",
        "{\"type\":\"string\",\"optional\":false,\"field\":\"name\"},",
        "{\"type\":\"int64\",\"optional\":false,\"field\":\"ts_ms\"},",
        "{\"type\":\"string\",\"optional\":true,\"field\":\"snapshot\"},",
        "{\"type\":\"string\",\"optional\":false,\"field\":\"db\"},",
        "{\"type\":\"string\",\"optional\":true,\"field\":\"table\"},",
        "{\"type\":\"string\",\"optional\":true,\"name\":\"io.debezium.data.Json\",\"field\":\"position\"}",
        "],\"optional\":false,\"name\":\"sluice.Source\",\"field\":\"source\"},",
        "{\"type\":\"string\",\"optional\":false,\"field\":\"op\"},",
        "{\"type\":\"int64\",\"optional\":true,\"field\":\"ts_ms\"},",
        "{\"type\":\"struct\",\"fields\":[",
        "{\"type\":\"string\",\"optional\":false,\"field\":\"id\"},",
        "{\"type\":\"int64\",\"optional\":false,\"field\":\"total_order\"},",
        "{\"type\":\"int64\",\"optional\":false,\"field\":\"data_collection_order\"},",
        "{\"type\":\"int64\",\"optional\":false,\"field\":\"event_count\"}",
        "],\"optional\":true,\"name\":\"event.block\",\"field\":\"transaction\"}",
        "],\"optional\":false,\"name\":"
    ));
    push_string(&format!("{name}.Envelope"), output);
    output.push('}');
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use serde_json::{json, Value as Json};
    use sluice_core::value::Decimal;
    use sluice_core::{Column, TableName};

    use super::*;

    fn table() -> TableSchema {
        let column = Column::new;
        TableSchema {
            name: TableName::new(Some("shop"), "items"),
            columns: vec![
                column("id", DataType::Integer { bytes: 8, unsigned: false }, false),
                column("price", DataType::Decimal { precision: Some(10), scale: Some(2) }, true),
                column("blob", DataType::Bytes { length: None, fixed: false }, true),
                column("note", DataType::Text { length: None, fixed: false }, true),
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
            Value::Bytes(vec![0, 255]),
            Value::Text(note.into()),
        ]
    }

    fn origin() -> Origin {
        Origin { job: "orders".into(), connector: "mysql".into() }
    }

    fn parse(text: &str) -> Json {
        Json::from_str(text).expect("valid JSON")
    }

    #[test]
    fn maxwell_update_carries_old_values_of_changed_columns_only_and_the_transaction() {
        let table = table();
        let (before, after) = (row(7, "old"), row(7, "new"));
        let position = json!({"file": "b.000001", "pos": 4}).to_string();
        let event = Event {
            table: &table,
            kind: EventKind::Update { before: &before, after: &after },
            ts_ms: 1_700_000_000_123,
            position: Some(&position),
            transaction: Some(TransactionInfo { id: "t1", index: 1, count: 2 }),
        };
        let value = parse(&EventFormat::Maxwell.value(&event, &origin()));
        assert_eq!(value["database"], "shop");
        assert_eq!(value["table"], "items");
        assert_eq!(value["type"], "update");
        assert_eq!(value["ts"], 1_700_000_000);
        assert_eq!(value["xid"], xid("t1"));
        assert_eq!(value["xoffset"], 1);
        assert_eq!(value["commit"], true);
        assert_eq!(value["data"], json!({"id": 7, "price": "12.50", "blob": "AP8=", "note": "new"}));
        assert_eq!(value["old"], json!({"note": "old"}));
        assert_eq!(value["primary_key"], json!([7]));
        assert_eq!(value["position"], json!({"file": "b.000001", "pos": 4}));
        assert_eq!(parse(&EventFormat::Maxwell.key(&event)), json!({"database": "shop", "table": "items", "pk.id": 7}));
        let first = Event { transaction: Some(TransactionInfo { id: "t1", index: 0, count: 2 }), ..event };
        assert!(parse(&EventFormat::Maxwell.value(&first, &origin())).get("commit").is_none());
    }

    #[test]
    fn a_key_move_is_a_delete_and_a_create_in_debezium_and_one_update_in_maxwell() {
        let table = std::sync::Arc::new(table());
        let ops = |format: EventFormat, before: Row, after: Row| -> Vec<(String, i64)> {
            let change = Change { table: table.clone(), kind: ChangeKind::Update { before, after } };
            format
                .events_of(&change)
                .into_iter()
                .map(|kind| {
                    let event = Event { table: &table, kind, ts_ms: 0, position: None, transaction: None };
                    let value = parse(&format.value(&event, &origin()));
                    let key = parse(&format.key(&event));
                    let id = key.get("id").or_else(|| key.get("pk.id")).and_then(Json::as_i64).unwrap();
                    (value.get("op").or_else(|| value.get("type")).unwrap().as_str().unwrap().to_owned(), id)
                })
                .collect()
        };
        let debezium = EventFormat::Debezium { schema: false };
        assert_eq!(ops(debezium, row(7, "a"), row(8, "a")), [("d".to_owned(), 7), ("c".to_owned(), 8)]);
        assert_eq!(ops(debezium, row(7, "a"), row(7, "b")), [("u".to_owned(), 7)]);
        assert_eq!(ops(EventFormat::Maxwell, row(7, "a"), row(8, "a")), [("update".to_owned(), 8)]);
        // A keyless table's rows are keyed by every column: a changed row is an update.
        let keyless = std::sync::Arc::new(TableSchema { primary_key: Vec::new(), ..(*table).clone() });
        let change = Change { table: keyless, kind: ChangeKind::Update { before: row(7, "a"), after: row(8, "a") } };
        assert!(matches!(debezium.events_of(&change)[..], [EventKind::Update { .. }]));
    }

    #[test]
    fn old_values_the_source_did_not_send_are_not_shown_as_old_values() {
        let table = TableSchema {
            details: sluice_core::schema::TableDetails { old_values_unknown: true, ..Default::default() },
            ..table()
        };
        let after = row(7, "new");
        let kept = Event {
            table: &table,
            kind: EventKind::Update { before: &after, after: &after },
            ts_ms: 0,
            position: None,
            transaction: None,
        };
        let debezium = parse(&EventFormat::Debezium { schema: false }.value(&kept, &origin()));
        assert!(debezium["before"].is_null() && debezium["after"]["note"] == "new", "{debezium}");
        assert_eq!(parse(&EventFormat::Maxwell.value(&kept, &origin()))["old"], json!({}));
        // A key moved: the old key is known, the other old values are not (sent as nulls).
        let old_key = vec![Value::Int(6), Value::Null, Value::Null, Value::Null];
        let moved = Event { kind: EventKind::Update { before: &old_key, after: &after }, ..kept };
        assert_eq!(parse(&EventFormat::Maxwell.value(&moved, &origin()))["old"], json!({"id": 6}));
    }

    #[test]
    fn debezium_ops_images_and_source_follow_the_envelope() {
        let table = table();
        let (before, after) = (row(7, "old"), row(7, "new"));
        let transaction = Some(TransactionInfo { id: "t1", index: 0, count: 1 });
        let format = EventFormat::Debezium { schema: false };
        for (kind, op, has_before, has_after) in [
            (EventKind::Snapshot { after: &after }, "r", false, true),
            (EventKind::Insert { after: &after }, "c", false, true),
            (EventKind::Update { before: &before, after: &after }, "u", true, true),
            (EventKind::Delete { before: &before }, "d", true, false),
        ] {
            let event = Event { table: &table, kind, ts_ms: 5_000, position: None, transaction };
            let value = parse(&format.value(&event, &origin()));
            assert_eq!(value["op"], op);
            assert_eq!(value["before"].is_object(), has_before, "{op}");
            assert_eq!(value["after"].is_object(), has_after, "{op}");
            assert_eq!(value["source"]["name"], "orders");
            assert_eq!(value["source"]["db"], "shop");
            assert_eq!(value["source"]["snapshot"], if op == "r" { "true" } else { "false" });
            assert_eq!(value["ts_ms"], 5_000);
            assert_eq!(
                value["transaction"],
                json!({"id": "t1", "total_order": 1, "data_collection_order": 1, "event_count": 1})
            );
            assert_eq!(parse(&format.key(&event)), json!({"id": 7}));
            assert_eq!(value["source"]["position"], Json::Null);
        }
        // A change's position is a JSON document carried as a string, as its schema says.
        let position = json!({"file": "b.000001", "pos": 4}).to_string();
        let event = Event {
            table: &table,
            kind: EventKind::Insert { after: &after },
            ts_ms: 5_000,
            position: Some(&position),
            transaction,
        };
        let value = parse(&format.value(&event, &origin()));
        assert_eq!(value["source"]["position"], json!(position));
    }

    #[test]
    fn debezium_with_schema_describes_every_payload_field() {
        let table = table();
        let after = row(1, "x");
        let event = Event {
            table: &table,
            kind: EventKind::Insert { after: &after },
            ts_ms: 1,
            position: None,
            transaction: None,
        };
        let format = EventFormat::Debezium { schema: true };
        let value = parse(&format.value(&event, &origin()));
        let fields = value["schema"]["fields"].as_array().unwrap();
        let names: Vec<&str> = fields.iter().map(|field| field["field"].as_str().unwrap()).collect();
        let payload = value["payload"].as_object().unwrap();
        assert_eq!(names, payload.keys().map(String::as_str).collect::<Vec<_>>());
        let after_fields = fields[1]["fields"].as_array().unwrap();
        assert_eq!(after_fields.len(), table.columns.len());
        assert_eq!(after_fields[1]["name"], "sluice.Decimal");
        assert_eq!(after_fields[2]["type"], "bytes");
        let key = parse(&format.key(&event));
        assert_eq!(key["payload"], json!({"id": 1}));
        assert_eq!(key["schema"]["fields"][0]["type"], "int64");
    }

    #[test]
    fn formats_are_named_as_documented() {
        for name in FORMAT_NAMES {
            assert!(EventFormat::parse(name).is_some(), "{name}");
        }
        assert!(EventFormat::parse("avro").is_none());
    }
}
