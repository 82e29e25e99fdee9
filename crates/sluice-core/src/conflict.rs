//! What a target reports when it holds what the job did not write there: it was changed outside
//! the job. Every target finds these the same way and says them in the same words.

use crate::change::{key_text, Row};
use crate::error::{Error, ErrorKind, Side};
use crate::schema::{TableName, TableSchema};

/// The error of a publish whose tables' own names are taken (`taken` names each).
pub fn published_over(taken: &[String]) -> Error {
    Error::new(
        ErrorKind::Schema,
        format!(
            "the copied tables cannot take their names: the target has {} already, made outside the job while the copy was hidden",
            taken.join(", ")
        ),
    )
    .on(Side::Target)
    .hint("drop or rename the table made outside the job (the copy holds the job's rows) and run the job again")
}

/// The error of a source RENAME whose new name the target has already, with rows.
pub fn renamed_over(from: &TableName, to: &TableName) -> Error {
    Error::new(
        ErrorKind::Conflict,
        format!("the source renamed {from} to {to}, and the target has both, {to} with rows"),
    )
    .on(Side::Target)
    .hint(format!("the target was changed outside this job: drop or rename {to} in the target (the stream renames {from} to it) and restart"))
}

/// The error for keys the source changed but the target does not hold.
pub fn missing_rows(table: &TableSchema, missing: &[&Row]) -> Error {
    // A keyless table's "keys" are whole rows.
    let key_table = if table.primary_key.is_empty() {
        table.clone()
    } else {
        TableSchema {
            primary_key: (0..table.primary_key.len()).collect(),
            columns: table.primary_key.iter().map(|&index| table.columns[index].clone()).collect(),
            ..table.clone()
        }
    };
    let keys: Vec<String> = missing.iter().take(5).map(|key| key_text(&key_table, key)).collect();
    Error::new(
        ErrorKind::Conflict,
        format!(
            "table {}: {} row(s) the source updated or deleted are missing in the target ({}{})",
            table.name,
            missing.len(),
            keys.join("; "),
            if missing.len() > 5 { "; ..." } else { "" }
        ),
    )
    .on(Side::Target)
    .hint("the target was changed outside this job; repair the rows (or copy the table again with a new snapshot+cdc job) and restart")
}
