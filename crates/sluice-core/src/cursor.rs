//! Cursor-incremental batches (`mode: incremental-cursor`): each batch copies, per table, the
//! rows whose cursor column lies in a window above the mark the previous batch reached, and
//! upserts them by key.
//!
//! - The window is fixed when the batch is planned: from the mark (lowered by the lookback) to
//!   the column's highest value then. It rides in every split of the table (`Split::window`),
//!   so a killed batch resumes the same window from its checkpoints.
//! - The mark lives in the target: a split's checkpoint, committed with its rows, says it is
//!   done, and the next batch starts its table from `through` only when every split of the
//!   table is done. Otherwise it reads the whole window again; upserts make that harmless.
//! - A row changed while the batch runs is read by the next batch when its new cursor is above
//!   `through`, and by this one (new version or old, upserted either way) when it is not.

use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorKind, Result, Side};
use crate::schema::{Column, DataType, TableSchema};
use crate::spec::CursorSpec;

/// The table's cursor column, checked: it exists, and a lookback is only asked of a time.
pub fn column<'a>(table: &'a TableSchema, cursor: &CursorSpec) -> Result<&'a Column> {
    let Some(column) = table.columns.iter().find(|column| column.name == cursor.column) else {
        return Err(Error::new(
            ErrorKind::Schema,
            format!("table {} has no column {} (source.cursor.column)", table.name, cursor.column),
        )
        .on(Side::Source)
        .hint("give every selected table the cursor column, or select only the tables that have it"));
    };
    let time = matches!(column.data_type, DataType::Date | DataType::DateTime { .. } | DataType::Timestamp { .. });
    if cursor.lookback_secs > 0 && !time {
        return Err(Error::new(
            ErrorKind::Config,
            format!(
                "source.cursor.lookback_secs: column {} of table {} is {}, not a date or time, so there is no time to look back by",
                cursor.column, table.name, column.native_type
            ),
        )
        .on(Side::Source)
        .hint("set lookback_secs to 0 for an increasing id, or use an updated-at column"));
    }
    Ok(column)
}

/// The rows of one table a batch copies: cursor values in (`after`, `through`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CursorWindow {
    /// The cursor column.
    pub column: String,
    /// The mark of the last batch that completed, which the next batch starts from when this
    /// one does not complete; `None` before the first.
    pub mark: Option<serde_json::Value>,
    /// Rows whose cursor is strictly above this are read: the mark, lowered by the lookback.
    /// `None`: from the first row, and rows whose cursor is NULL too.
    pub after: Option<serde_json::Value>,
    /// Rows whose cursor is at most this are read: the column's highest value when the batch
    /// was planned. `None`: no row had a cursor then, and only NULL cursors are read.
    pub through: Option<serde_json::Value>,
    /// The window of earlier batches read again (a rerun): the next batch starts at `mark`
    /// whatever this one did.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rerun: bool,
}

impl CursorWindow {
    /// The SQL condition selecting the window's rows, with `?`-style placeholders written by
    /// `placeholder` (given the parameter's index from 1) and the values to bind in order.
    /// `column` is the quoted column name.
    pub fn condition(
        &self,
        column: &str,
        mut placeholder: impl FnMut(usize) -> String,
    ) -> (String, Vec<&serde_json::Value>) {
        match (&self.after, &self.through) {
            (Some(after), Some(through)) => {
                (format!("{column} > {} AND {column} <= {}", placeholder(1), placeholder(2)), vec![after, through])
            }
            (Some(after), None) => (format!("{column} > {} AND 1 = 0", placeholder(1)), vec![after]),
            (None, Some(through)) => (format!("({column} <= {} OR {column} IS NULL)", placeholder(1)), vec![through]),
            (None, None) => (format!("{column} IS NULL"), Vec::new()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn window(after: Option<i64>, through: Option<i64>) -> CursorWindow {
        CursorWindow {
            column: "u".into(),
            mark: None,
            after: after.map(|v| json!(v)),
            through: through.map(|v| json!(v)),
            rerun: false,
        }
    }

    #[test]
    fn a_window_selects_above_its_start_through_its_end_and_null_cursors_only_on_the_first_batch() {
        let dollar = |index: usize| format!("${index}");
        let both = window(Some(3), Some(9));
        let (sql, values) = both.condition("\"u\"", dollar);
        assert_eq!((sql.as_str(), values), ("\"u\" > $1 AND \"u\" <= $2", vec![&json!(3), &json!(9)]));
        let first = window(None, Some(9));
        let (sql, values) = first.condition("`u`", |_| "?".into());
        assert_eq!((sql.as_str(), values), ("(`u` <= ? OR `u` IS NULL)", vec![&json!(9)]));
        let empty = window(None, None);
        let (sql, values) = empty.condition("u", |_| "?".into());
        assert_eq!((sql.as_str(), values.len()), ("u IS NULL", 0));
        let (sql, _) = window(Some(3), None).condition("u", |_| "?".into());
        assert!(sql.ends_with("1 = 0"), "{sql}");
    }
}
