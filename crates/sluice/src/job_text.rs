//! The one door a job's text comes in by, whoever brings it (a file on the command line, the
//! API, a version a worker reads from the coordination store): parse the YAML or JSON, check
//! its structure, then the connectors' own checks, and report every problem found at once.

use std::path::Path;

use serde::{Deserialize, Serialize};
use sluice_core::spec::{parse_job_with, JobSpec, SpecError};

pub use crate::document_rules::{DocumentRules, DEFAULT_PREFIX};

/// The notation a job document is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DocumentFormat {
    Yaml,
    Json,
}

impl DocumentFormat {
    /// JSON for a `.json` file, YAML otherwise.
    pub fn of_path(path: &Path) -> DocumentFormat {
        match path.extension() {
            Some(extension) if extension.eq_ignore_ascii_case("json") => DocumentFormat::Json,
            _ => DocumentFormat::Yaml,
        }
    }

    /// YAML when the media type names it, JSON otherwise (the API's default).
    pub fn of_content_type(content_type: &str) -> DocumentFormat {
        if content_type.contains("yaml") {
            DocumentFormat::Yaml
        } else {
            DocumentFormat::Json
        }
    }

    /// The media type a document in this notation is sent with.
    pub fn content_type(self) -> &'static str {
        match self {
            DocumentFormat::Yaml => "application/yaml",
            DocumentFormat::Json => "application/json",
        }
    }

    /// The name the store and the API give it: `yaml` or `json`.
    pub fn name(self) -> &'static str {
        match self {
            DocumentFormat::Yaml => "yaml",
            DocumentFormat::Json => "json",
        }
    }
}

/// Every problem of a document: its structure, then the connectors' checks of a job whose
/// fields could all be read. The job comes back whenever it could be read, so a caller may add
/// checks of its own before it decides.
pub fn check(text: &str, format: DocumentFormat, rules: &DocumentRules) -> (Option<JobSpec>, Vec<SpecError>) {
    let (mut job, mut errors) = parse_job_with(text, format == DocumentFormat::Json, &|name| rules.variable(name));
    if let Some(job) = &mut job {
        errors.extend(rules.confine(job));
        errors.extend(sluice_connectors::validate(job));
    }
    (job, errors)
}

/// The job a document describes, or every problem it has, in the order of their lines.
pub fn parse(text: &str, format: DocumentFormat, rules: &DocumentRules) -> Result<JobSpec, Vec<SpecError>> {
    decided(check(text, format, rules))
}

/// The job of a checked document when it has no problem; otherwise its problems, in the order of
/// their lines.
pub fn decided((job, mut errors): (Option<JobSpec>, Vec<SpecError>)) -> Result<JobSpec, Vec<SpecError>> {
    errors.sort_by_key(|error| error.line.unwrap_or(usize::MAX));
    match job {
        Some(job) if errors.is_empty() => Ok(job),
        _ => Err(errors),
    }
}

/// Reads a job file and parses it with this process's environment.
pub fn load(path: &Path) -> Result<JobSpec, Vec<SpecError>> {
    let text = std::fs::read_to_string(path).map_err(|error| {
        vec![SpecError {
            path: String::new(),
            line: None,
            message: format!("cannot read the job file {}: {error}", path.display()),
        }]
    })?;
    parse(&text, DocumentFormat::of_path(path), &DocumentRules::Standalone)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_problem_of_a_document_comes_back_at_once_structure_and_connector_alike() {
        let text = "name: two\nmode: snapshot\nsource: {type: mysql}\ntarget: {type: nowhere}\nextra: 1\n";
        let errors = parse(text, DocumentFormat::Yaml, &DocumentRules::Standalone).unwrap_err();
        let paths: Vec<&str> = errors.iter().map(|error| error.path.as_str()).collect();
        assert!(paths.contains(&"extra"), "{errors:?}");
        assert!(errors.len() >= 2, "{errors:?}");
        assert!(errors.windows(2).all(|pair| pair[0].line.unwrap_or(usize::MAX) <= pair[1].line.unwrap_or(usize::MAX)));
    }

    #[test]
    fn a_format_is_named_as_the_store_keeps_it() {
        assert_eq!(serde_json::to_string(&DocumentFormat::Json).unwrap(), "\"json\"");
        assert_eq!(serde_json::from_str::<DocumentFormat>("\"yaml\"").unwrap(), DocumentFormat::Yaml);
        assert_eq!(DocumentFormat::of_path(Path::new("a/job.JSON")), DocumentFormat::Json);
        assert_eq!(DocumentFormat::of_content_type("application/yaml"), DocumentFormat::Yaml);
    }
}
