//! Values as JSON: the one codec lives in `sluice_core::json` (dirty records render their rows
//! with it too); the JSON Lines files and the change events use it from here.

pub use sluice_core::json::*;
