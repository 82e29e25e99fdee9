//! Reading a job file from disk: parse, validate the structure, validate against the connectors.

use std::path::Path;

use sluice_core::spec::{parse_job, JobSpec, SpecError};

/// Reads, parses and validates a job file, returning every error found.
pub fn load(path: &Path) -> Result<JobSpec, Vec<SpecError>> {
    let text = std::fs::read_to_string(path).map_err(|error| {
        vec![SpecError {
            path: String::new(),
            line: None,
            message: format!("cannot read the job file {}: {error}", path.display()),
        }]
    })?;
    let json = path.extension().is_some_and(|extension| extension.eq_ignore_ascii_case("json"));
    let job = parse_job(&text, json, |name| std::env::var(name).ok())?;
    let errors = sluice_connectors::validate(&job);
    if errors.is_empty() {
        Ok(job)
    } else {
        Err(errors)
    }
}
