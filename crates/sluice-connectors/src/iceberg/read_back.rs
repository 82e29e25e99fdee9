//! An Iceberg table read back for verification: the live data files of its current snapshot,
//! read by the job's mapped schema (`columnar::read_back`).

use std::sync::Arc;

use async_trait::async_trait;
use sluice_core::{Result, TableName};

use super::Warehouse;
use crate::columnar::read_back::{DataFileToRead, DataFiles, Listing};

/// The files of a table's current snapshot.
pub(super) struct CurrentSnapshot {
    pub(super) warehouse: Arc<Warehouse>,
    pub(super) name: TableName,
}

#[async_trait]
impl Listing for CurrentSnapshot {
    async fn list(&self) -> Result<Option<DataFiles>> {
        let Some(table) = self.warehouse.open(&self.name).await? else { return Ok(None) };
        let files = table
            .live_files(&self.warehouse.io)
            .await?
            .iter()
            .map(|entry| DataFileToRead {
                path: super::files::local(entry.file_path()),
                rows: entry.record_count(),
                partition: Vec::new(),
            })
            .collect();
        Ok(Some(DataFiles { schema: table.arrow_schema()?, files }))
    }
}
