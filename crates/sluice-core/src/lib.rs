//! Sluice's vocabulary and engine. It knows no driver, no network protocol, no etcd and no HTTP:
//! connectors implement the traits in [`connector`], and the runner drives them.

pub mod change;
pub mod clock;
pub mod conflict;
pub mod connector;
pub mod cursor;
pub mod error;
pub mod failpoint;
pub mod filter;
pub mod hidden;
pub mod json;
pub mod names;
pub(crate) mod net_changes;
pub mod planner;
pub mod retry;
pub mod runner;
pub mod schema;
pub mod secret;
pub mod shared_log;
pub mod spec;
pub mod state;
pub mod stats;
pub(crate) mod throttle;
pub mod transform;
pub mod value;
pub mod zero_dates;

pub use change::{Batch, Change, ChangeKind, EncodedRows, LogMark, Position, Rejected, Row, RowEncoding};
pub use error::{Error, ErrorKind, Result, Side};
pub use schema::{Column, DataType, Index, TableName, TableSchema};
pub use value::{Date, DateTime, Decimal, Time, Value};
