//! A Delta table read back for verification: the data files of its latest version, each with
//! its partition values, read by the job's mapped schema (`columnar::read_back`).

use std::path::PathBuf;

use async_trait::async_trait;
use sluice_core::{Error, ErrorKind, Result, Side, TableName};

use super::table::LakeTable;
use super::{DeltaOptions, Lake};
use crate::columnar::read_back::{DataFileToRead, DataFiles, Listing};

/// The files of a table's latest version.
pub(super) struct LatestVersion {
    name: TableName,
    root: PathBuf,
}

impl LatestVersion {
    /// The table `name` of the target these options describe.
    pub(super) fn of(options: DeltaOptions, name: &TableName) -> LatestVersion {
        let path = options.path.clone();
        let root = Lake { options, path, fence: None }.root(name);
        LatestVersion { name: name.clone(), root }
    }
}

#[async_trait]
impl Listing for LatestVersion {
    async fn list(&self) -> Result<Option<DataFiles>> {
        let Some(table) = LakeTable::open(&self.name, &self.root).await? else { return Ok(None) };
        let partition_columns = table.partition_columns();
        let mut files = Vec::new();
        for file in table.files() {
            if file.add.deletion_vector.is_some() {
                return Err(Error::new(
                    ErrorKind::Read,
                    format!(
                        "Delta table {} at {}: data file {} has a deletion vector, which verify does not read",
                        self.name,
                        self.root.display(),
                        file.add.path
                    ),
                )
                .on(Side::Target)
                .hint("rewrite the table's files without deletion vectors (OPTIMIZE or REORG … APPLY (PURGE)), then verify again"));
            }
            let partition = partition_columns
                .iter()
                .map(|column| (column.clone(), file.add.partition_values.get(column).cloned().flatten()))
                .collect();
            files.push(DataFileToRead { path: file.file.clone(), rows: file.rows, partition });
        }
        Ok(Some(DataFiles { schema: table.arrow_schema(), files }))
    }
}
