//! `source.cursor:`: how an `incremental-cursor` job finds the rows that changed since its last
//! batch, in a source without a change log (or without the privileges to read it).
//!
//! ```yaml
//! mode: incremental-cursor
//! source:
//!   type: mysql
//!   cursor: {column: updated_at, lookback_secs: 60}
//! ```
//!
//! Each batch copies the rows whose cursor column passed the mark the last completed batch
//! reached, minus `lookback_secs` for a time column, and upserts them by key. Deletes leave no
//! trace in such a column: this mode cannot see them.

use serde::{Deserialize, Serialize};

use super::decode::{Decoder, Fields};

/// A validated cursor: the column (in every selected table) and the lookback window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CursorSpec {
    /// An updated-at timestamp or an increasing id.
    pub column: String,
    /// Rows whose time cursor is at most this many seconds below the mark are read again, so a
    /// row committed late with an earlier time is caught. Time columns only.
    pub lookback_secs: u64,
}

/// Decodes `source.cursor`, or `None` without one (its errors are in `decoder`).
pub(super) fn decode_cursor(decoder: &mut Decoder, fields: &Fields<'_>) -> Option<Option<CursorSpec>> {
    let Some(node) = fields.get("cursor") else {
        return Some(None);
    };
    let path = fields.path("cursor");
    let cursor = decoder.mapping(node, &path, &["column", "lookback_secs"])?;
    let column = cursor
        .require(decoder, "column", "the cursor column, an updated-at timestamp or an increasing id")
        .and_then(|node| decoder.string(node, &cursor.path("column")));
    let lookback_secs = match cursor.get("lookback_secs") {
        None => Some(0),
        Some(node) => decoder.unsigned(node, &cursor.path("lookback_secs"), 366 * 86_400),
    };
    Some(Some(CursorSpec { column: column?, lookback_secs: lookback_secs? }))
}
