//! The `generate` source: tables declared in the job file (columns, key, a row count), their
//! rows made up from a seed. The same seed gives the same rows on every run and every node, so a
//! cluster can be loaded, a target measured or a demo run without a database. Row `n` (from 0)
//! has key `n + 1` (text keys zero-padded, so they sort as the rows do); every other value is a
//! function of the seed, the table, the column and `n`. Splits are ranges of row numbers and a
//! read resumes after its last batch.

pub(crate) mod connector;

use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sluice_core::change::{Batch, Change, Position};
use sluice_core::connector::{CheckItem, Reader, SnapshotSource, Source, Split, SplitHint};
use sluice_core::names::split_task;
use sluice_core::value::{Date, DateTime, Decimal};
use sluice_core::{DataType, Result, Row, TableSchema, Value};

/// One declared table: its schema and how many rows it has.
#[derive(Debug, Clone)]
pub struct GeneratedTable {
    pub schema: Arc<TableSchema>,
    pub rows: u64,
}

/// A `generate` source's options.
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    pub seed: u64,
    pub tables: Vec<GeneratedTable>,
}

/// The rows of one split: row numbers `start` (included) to `end` (excluded).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct RowRange {
    start: u64,
    end: u64,
}

/// Where a split's read stands: the next row number to make.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct NextRow {
    next: u64,
}

#[derive(Debug)]
pub struct GenerateSource {
    options: GenerateOptions,
}

impl GenerateSource {
    pub fn new(options: GenerateOptions) -> GenerateSource {
        GenerateSource { options }
    }
}

#[async_trait]
impl Source for GenerateSource {
    async fn check(&self) -> Result<Vec<CheckItem>> {
        let rows: u64 = self.options.tables.iter().map(|table| table.rows).sum();
        Ok(vec![CheckItem {
            what: "source generate".into(),
            ok: true,
            detail: format!("{} tables, {rows} rows from seed {}", self.options.tables.len(), self.options.seed),
        }])
    }

    async fn discover(&self) -> Result<Vec<TableSchema>> {
        let mut tables: Vec<TableSchema> =
            self.options.tables.iter().map(|table| table.schema.as_ref().clone()).collect();
        tables.sort_by_key(|table| table.name.to_string());
        Ok(tables)
    }

    sluice_core::capabilities!(snapshot: SnapshotSource);
}

#[async_trait]
impl SnapshotSource for GenerateSource {
    async fn split(&self, table: &Arc<TableSchema>, hint: SplitHint) -> Result<Vec<Split>> {
        let rows = self.options.tables.iter().find(|declared| declared.schema.name == table.name).map_or(0, |t| t.rows);
        let per_split = hint.rows_per_split.max(1);
        let count = rows.div_ceil(per_split).max(1);
        Ok((0..count)
            .map(|index| {
                let range = RowRange { start: index * per_split, end: ((index + 1) * per_split).min(rows) };
                Split::new(split_task(&table.name, index), table.clone(), &range, range.end - range.start)
            })
            .collect())
    }

    async fn open(&self, split: &Split, resume_after: Option<&Position>, batch_rows: usize) -> Result<Box<dyn Reader>> {
        let range: RowRange = split.read_descriptor()?;
        let next = match resume_after {
            Some(position) => position.read::<NextRow>(&split.id)?.next,
            None => range.start,
        };
        let seed = self.options.seed ^ hash(split.table.name.to_string().as_bytes());
        Ok(Box::new(GeneratedRows {
            table: split.table.clone(),
            seed,
            next,
            end: range.end,
            batch_rows: batch_rows.max(1) as u64,
        }))
    }
}

/// The rows of one split, a batch at a time.
struct GeneratedRows {
    table: Arc<TableSchema>,
    /// The job's seed mixed with the table's name.
    seed: u64,
    next: u64,
    end: u64,
    batch_rows: u64,
}

#[async_trait]
impl Reader for GeneratedRows {
    async fn next(&mut self) -> Result<Option<Batch>> {
        if self.next >= self.end {
            return Ok(None);
        }
        let last = (self.next + self.batch_rows).min(self.end);
        let changes: Vec<Change> = (self.next..last)
            .map(|row| Change::insert(self.table.clone(), make_row(&self.table, self.seed, row)))
            .collect();
        self.next = last;
        Ok(Some(Batch::new(changes, Position::of(&NextRow { next: last }))))
    }
}

/// Row number `row` of `table`.
fn make_row(table: &TableSchema, seed: u64, row: u64) -> Row {
    table
        .columns
        .iter()
        .enumerate()
        .map(|(index, column)| {
            if table.primary_key.contains(&index) {
                key_value(&column.data_type, row)
            } else {
                value(&column.data_type, mix(seed ^ (index as u64).rotate_left(40) ^ mix(row)))
            }
        })
        .collect()
}

/// The key of row `row`: `row + 1`, text zero-padded so keys sort as rows do.
fn key_value(data_type: &DataType, row: u64) -> Value {
    match data_type {
        DataType::Text { .. } => Value::Text(format!("{:012}", row + 1)),
        DataType::Decimal { .. } => Value::Decimal(Decimal::parse(&(row + 1).to_string()).expect("a whole number")),
        _ => Value::Int(row as i64 + 1),
    }
}

/// A value of `data_type` made from the random word `bits`.
fn value(data_type: &DataType, bits: u64) -> Value {
    let date = || Date {
        year: 2000 + (bits % 30) as u16,
        month: 1 + ((bits >> 8) % 12) as u8,
        day: 1 + ((bits >> 16) % 28) as u8,
    };
    let date_time = || DateTime {
        date: date(),
        hour: ((bits >> 24) % 24) as u8,
        minute: ((bits >> 32) % 60) as u8,
        second: ((bits >> 40) % 60) as u8,
        microsecond: ((bits >> 44) % 1_000_000) as u32,
    };
    match data_type {
        DataType::Boolean => Value::Bool(bits & 1 == 1),
        DataType::Integer { bytes: 8, .. } => Value::Int((bits >> 1) as i64),
        DataType::Integer { .. } => Value::Int(((bits >> 33) as i64) - (1 << 30)),
        DataType::Float64 | DataType::Float32 => Value::Float64((bits >> 11) as f64 / (1u64 << 53) as f64 * 1000.0),
        DataType::Decimal { .. } => Value::Decimal(
            Decimal::parse(&format!("{}.{:02}", (bits >> 8) % 1_000_000, bits % 100)).expect("a decimal"),
        ),
        DataType::Bytes { .. } => Value::Bytes(bits.to_le_bytes().repeat(2)),
        DataType::Date => Value::Date(date()),
        DataType::DateTime { .. } => Value::DateTime(date_time()),
        DataType::Timestamp { .. } => Value::Timestamp(date_time()),
        DataType::Json => Value::Json(format!("{{\"n\": {}, \"even\": {}}}", bits % 1000, bits.is_multiple_of(2))),
        _ => Value::Text(word(bits)),
    }
}

/// A lowercase word of 8 to 23 letters.
fn word(mut bits: u64) -> String {
    let length = 8 + (bits % 16) as usize;
    let mut text = String::with_capacity(length);
    for _ in 0..length {
        bits = mix(bits);
        text.push((b'a' + (bits % 26) as u8) as char);
    }
    text
}

/// splitmix64's finaliser: every bit of the input moves every bit of the output.
fn mix(mut bits: u64) -> u64 {
    bits = bits.wrapping_add(0x9e37_79b9_7f4a_7c15);
    bits = (bits ^ (bits >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    bits = (bits ^ (bits >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    bits ^ (bits >> 31)
}

/// FNV-1a of `bytes`: a table name's share of its rows' seed, the same on every machine.
fn hash(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::{Column, TableName};

    fn table() -> Arc<TableSchema> {
        Arc::new(TableSchema {
            name: TableName::parse("t"),
            columns: vec![
                Column::new("id", DataType::Integer { bytes: 8, unsigned: false }, false),
                Column::new("v", DataType::Text { length: None, fixed: false }, true),
                Column::new("at", DataType::Timestamp { precision: 6 }, true),
            ],
            primary_key: vec![0],
            indexes: Vec::new(),
            details: Default::default(),
        })
    }

    async fn read_all(source: &GenerateSource, rows_per_split: u64, batch_rows: usize) -> Vec<Row> {
        let mut rows = Vec::new();
        for split in source.split(&table(), SplitHint { rows_per_split }).await.unwrap() {
            let mut reader = source.open(&split, None, batch_rows).await.unwrap();
            while let Some(batch) = reader.next().await.unwrap() {
                rows.extend(batch.changes.into_iter().map(Change::into_row));
            }
        }
        rows
    }

    fn source(seed: u64, rows: u64) -> GenerateSource {
        GenerateSource::new(GenerateOptions { seed, tables: vec![GeneratedTable { schema: table(), rows }] })
    }

    #[tokio::test]
    async fn the_same_seed_makes_the_same_rows_however_they_are_split_and_a_read_resumes() {
        let whole = read_all(&source(7, 1_000), 1_000, 1_000).await;
        assert_eq!(whole.len(), 1_000);
        assert_eq!(read_all(&source(7, 1_000), 64, 10).await, whole, "splits and batches change nothing");
        assert_ne!(read_all(&source(8, 1_000), 1_000, 1_000).await, whole, "another seed, other values");
        let keys: Vec<&Value> = whole.iter().map(|row| &row[0]).collect();
        assert_eq!(keys.first(), Some(&&Value::Int(1)));
        assert_eq!(keys.last(), Some(&&Value::Int(1_000)));

        // A read resumed after its first batch makes the rest, the same.
        let source = source(7, 1_000);
        let split = source.split(&table(), SplitHint { rows_per_split: 1_000 }).await.unwrap().remove(0);
        let mut reader = source.open(&split, None, 300).await.unwrap();
        let first = reader.next().await.unwrap().unwrap();
        let mut resumed = source.open(&split, Some(&first.position), 300).await.unwrap();
        let mut rest = Vec::new();
        while let Some(batch) = resumed.next().await.unwrap() {
            rest.extend(batch.changes.into_iter().map(Change::into_row));
        }
        assert_eq!(rest, whole[300..].to_vec());
    }
}
