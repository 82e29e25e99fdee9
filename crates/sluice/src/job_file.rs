//! Reading a job file from disk: parse, validate the structure, validate against the connectors.

use std::path::Path;

use sluice_core::spec::{parse_job_partially, JobSpec, SpecError};

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
    parse(&text, json)
}

/// Parses and validates a job document (YAML, or JSON when `json`), `${VAR}` from the
/// environment, returning every error found.
pub fn parse(text: &str, json: bool) -> Result<JobSpec, Vec<SpecError>> {
    let (job, mut errors) = parse_job_partially(text, json, |name| std::env::var(name).ok());
    if let Some(job) = &job {
        errors.extend(sluice_connectors::validate(job));
    }
    errors.sort_by_key(|error| error.line.unwrap_or(usize::MAX));
    match job {
        Some(job) if errors.is_empty() => Ok(job),
        _ => Err(errors),
    }
}
