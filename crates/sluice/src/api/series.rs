//! Each job's throughput and lag over the last hours, for the console's charts: sampled by every
//! node from the coordination store every `EVERY` (5 s), kept in memory (a node that starts has no
//! past; any node answers with what it saw).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use utoipa::ToSchema;

use super::views::job_view;
use crate::cluster::model::*;
use crate::cluster::store::Store;

const EVERY: Duration = Duration::from_secs(5);
/// Six hours of samples.
const KEPT: usize = 6 * 3_600 / 5;

/// One sample of a job.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Point {
    /// RFC 3339.
    pub at: String,
    pub rows_per_sec: f64,
    pub lag_secs: Option<u64>,
}

/// The samples of `GET /jobs/{name}/series`, oldest first.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SeriesView {
    pub points: Vec<Point>,
}

#[derive(Debug, Default)]
pub struct Series {
    jobs: Mutex<BTreeMap<String, VecDeque<Point>>>,
}

impl Series {
    pub fn of(&self, job: &str) -> SeriesView {
        let jobs = self.jobs.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        SeriesView { points: jobs.get(job).map(|points| points.iter().cloned().collect()).unwrap_or_default() }
    }

    /// Samples every job now, and forgets the jobs that are gone.
    async fn sample(&self, store: &dyn Store) -> sluice_core::Result<()> {
        let records: Vec<(String, JobRecord, _)> = load_all(store, &format!("{ROOT}jobs/")).await?;
        let mut points = Vec::new();
        for (name, job, _) in &records {
            let view = job_view(store, job).await?;
            let at = crate::logger::timestamp();
            points.push((
                name.clone(),
                Point { at, rows_per_sec: view.stats.rows_per_sec, lag_secs: view.stats.lag_secs },
            ));
        }
        let mut jobs = self.jobs.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        jobs.retain(|name, _| records.iter().any(|(known, _, _)| known == name));
        for (name, point) in points {
            let samples = jobs.entry(name).or_default();
            if samples.len() == KEPT {
                samples.pop_front();
            }
            samples.push_back(point);
        }
        Ok(())
    }

    /// Samples until the process ends.
    pub fn start(self: &Arc<Self>, store: Arc<dyn Store>) {
        let series = self.clone();
        tokio::spawn(async move {
            loop {
                if let Err(error) = series.sample(&*store).await {
                    log::debug!("job series: cannot sample now: {error}");
                }
                tokio::time::sleep(EVERY).await;
            }
        });
    }
}
