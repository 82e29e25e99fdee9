//! The one door a job's text comes in by, whoever brings it (a file on the command line, the
//! API, a version a worker reads from the coordination store): parse the YAML or JSON, check
//! its structure, then the connectors' own checks, and report every problem found at once.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sluice_core::spec::{parse_job_with, unset_variable, JobSpec, SpecError};

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

/// Where the `${NAME}`s of a job document take their values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Variables {
    /// This process's environment: `sluice run`, `check`, `verify`, the user's own shell.
    Process,
    /// A server's rule: a document reads a file of `secrets` named as the variable (as container
    /// orchestrators mount secrets), else an environment variable whose name starts with
    /// `prefix`; any other name is refused, so a document cannot route the server's own
    /// credentials (`SLUICE_ETCD_PASSWORD`, cloud keys) into a table name or a row. An empty
    /// prefix lets documents read every variable.
    Server { prefix: String, secrets: Option<PathBuf> },
}

/// The prefix a server's documents' variables must start with unless `--env-prefix` says.
pub const DEFAULT_PREFIX: &str = "SLUICE_VAR_";

impl Variables {
    /// The value of `${name}`, or why it has none, naming the variable and the fix.
    pub fn value(&self, name: &str) -> Result<String, String> {
        let (prefix, secrets) = match self {
            Variables::Process => return std::env::var(name).map_err(|_| unset_variable(name)),
            Variables::Server { prefix, secrets } => (prefix, secrets.as_deref()),
        };
        if let Some(directory) = secrets {
            match std::fs::read_to_string(directory.join(name)) {
                Ok(text) => {
                    let line =
                        text.strip_suffix('\n').map_or(text.as_str(), |line| line.strip_suffix('\r').unwrap_or(line));
                    return Ok(line.to_owned());
                }
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => {
                    return Err(format!(
                        "variable `{name}`: cannot read the secret file {}: {error}; make it readable by the server",
                        directory.join(name).display()
                    ))
                }
            }
        }
        let from_secrets = match secrets {
            Some(directory) => format!("a file named {name} in {}", directory.display()),
            None => "a file in the server's --secrets-dir".to_owned(),
        };
        if !name.starts_with(prefix.as_str()) {
            return Err(format!(
                "variable `{name}` is not available to jobs on this server: a document may read environment \
                 variables whose name starts with `{prefix}` (the server's --env-prefix) or {from_secrets}; rename it"
            ));
        }
        std::env::var(name).map_err(|_| {
            format!("variable `{name}` is not set on this server: set it in the environment of every node, or add {from_secrets}")
        })
    }
}

/// Every problem of a document: its structure, then the connectors' checks of a job whose
/// fields could all be read. The job comes back whenever it could be read, so a caller may add
/// checks of its own before it decides.
pub fn check(text: &str, format: DocumentFormat, variables: &Variables) -> (Option<JobSpec>, Vec<SpecError>) {
    let (job, mut errors) = parse_job_with(text, format == DocumentFormat::Json, &|name| variables.value(name));
    if let Some(job) = &job {
        errors.extend(sluice_connectors::validate(job));
    }
    (job, errors)
}

/// The job a document describes, or every problem it has, in the order of their lines.
pub fn parse(text: &str, format: DocumentFormat, variables: &Variables) -> Result<JobSpec, Vec<SpecError>> {
    decided(check(text, format, variables))
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
    parse(&text, DocumentFormat::of_path(path), &Variables::Process)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_problem_of_a_document_comes_back_at_once_structure_and_connector_alike() {
        let text = "name: two\nmode: snapshot\nsource: {type: mysql}\ntarget: {type: nowhere}\nextra: 1\n";
        let errors = parse(text, DocumentFormat::Yaml, &Variables::Process).unwrap_err();
        let paths: Vec<&str> = errors.iter().map(|error| error.path.as_str()).collect();
        assert!(paths.contains(&"extra"), "{errors:?}");
        assert!(errors.len() >= 2, "{errors:?}");
        assert!(errors.windows(2).all(|pair| pair[0].line.unwrap_or(usize::MAX) <= pair[1].line.unwrap_or(usize::MAX)));
    }

    #[test]
    fn a_server_reads_only_prefixed_variables_and_its_secrets_directory() {
        let secrets = tempfile::tempdir().unwrap();
        std::fs::write(secrets.path().join("DB_PASSWORD"), "s3cret\n").unwrap();
        std::fs::write(secrets.path().join("RAW"), "two\nlines").unwrap();
        // PATH is set in every test process, and no test changes it.
        let server = Variables::Server { prefix: "SLUICE_VAR_".into(), secrets: Some(secrets.path().into()) };
        assert_eq!(server.value("DB_PASSWORD").unwrap(), "s3cret", "one trailing newline is not the secret's");
        assert_eq!(server.value("RAW").unwrap(), "two\nlines");
        let refused = server.value("PATH").unwrap_err();
        assert!(refused.contains("`PATH`") && refused.contains("`SLUICE_VAR_`"), "{refused}");
        let unset = server.value("SLUICE_VAR_NOT_SET_ANYWHERE").unwrap_err();
        assert!(unset.contains("not set on this server"), "{unset}");
        let prefixed = Variables::Server { prefix: "PAT".into(), secrets: None };
        assert_eq!(prefixed.value("PATH").unwrap(), std::env::var("PATH").unwrap());
        assert!(prefixed.value("HOME").unwrap_err().contains("--secrets-dir"));
        let open = Variables::Server { prefix: String::new(), secrets: None };
        assert_eq!(open.value("PATH").unwrap(), std::env::var("PATH").unwrap(), "an empty prefix admits every name");

        let text = "name: x\nsource:\n  type: sqlite\n  path: ${PATH}\ntarget:\n  type: jsonl\n  path: ${HOME}\n";
        let errors = parse(text, DocumentFormat::Yaml, &server).unwrap_err();
        let fields: Vec<&str> = errors
            .iter()
            .filter(|error| error.message.contains("is not available to jobs"))
            .map(|error| error.path.as_str())
            .collect();
        assert_eq!(fields, ["source.path", "target.path"], "every refused variable at once: {errors:?}");
    }

    #[test]
    fn a_format_is_named_as_the_store_keeps_it() {
        assert_eq!(serde_json::to_string(&DocumentFormat::Json).unwrap(), "\"json\"");
        assert_eq!(serde_json::from_str::<DocumentFormat>("\"yaml\"").unwrap(), DocumentFormat::Yaml);
        assert_eq!(DocumentFormat::of_path(Path::new("a/job.JSON")), DocumentFormat::Json);
        assert_eq!(DocumentFormat::of_content_type("application/yaml"), DocumentFormat::Yaml);
    }
}
