//! The rules a job document is read by: where its `${NAME}`s take their values and, on a
//! server, the directory every path it names must stay inside. `sluice run` trusts its user's
//! own file and shell; a server takes documents from anyone holding an admin token, so it lets
//! them read only what its operator chose.

use std::path::{Component, Path, PathBuf};

use sluice_core::spec::{unset_variable, JobSpec, SpecError};

/// How a node reads job documents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DocumentRules {
    /// `sluice run`, `check`, `verify`, `tail`: the user's own environment, any path.
    Standalone,
    /// `sluice server`.
    Server(ServerRules),
}

/// What a server lets a document read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerRules {
    /// `${NAME}` reads an environment variable only when NAME starts with this (`--env-prefix`);
    /// an empty prefix lets documents read every variable.
    pub env_prefix: String,
    /// `${NAME}` reads the file NAME here first, whatever its prefix (`--secrets-dir`).
    pub secrets_dir: Option<PathBuf>,
    /// Every path a document names resolves inside this directory, symbolic links followed
    /// (`--data-root`); canonical.
    pub data_root: PathBuf,
}

/// The prefix a server's documents' variables must start with unless `--env-prefix` says.
pub const DEFAULT_PREFIX: &str = "SLUICE_VAR_";

impl DocumentRules {
    /// The value of `${name}`, or why it has none, naming the variable and the fix.
    pub fn variable(&self, name: &str) -> Result<String, String> {
        match self {
            DocumentRules::Standalone => std::env::var(name).map_err(|_| unset_variable(name)),
            DocumentRules::Server(server) => server.variable(name),
        }
    }

    /// Resolves every path `job` names under the data root (a relative one from it), or
    /// returns an error for each that leads outside. Nothing to do standalone.
    pub fn confine(&self, job: &mut JobSpec) -> Vec<SpecError> {
        let DocumentRules::Server(server) = self else {
            return Vec::new();
        };
        let mut errors = Vec::new();
        if !job.targets.is_empty() {
            errors.push(SpecError {
                path: "targets".into(),
                line: job.targets[0].endpoint.line,
                message: "a job with several targets runs with `sluice run` in this version; on a server, submit one job per target".into(),
            });
        }
        if !job.sources.is_empty() {
            errors.push(SpecError {
                path: "sources".into(),
                line: job.sources[0].endpoint.line,
                message:
                    "a job with several sources runs with `sluice run` in this version; a server does not run it yet"
                        .into(),
            });
        }
        for endpoint in [&mut job.source, &mut job.target] {
            let Some(path) = &endpoint.path else { continue };
            match server.resolve(Path::new(path)) {
                Ok(inside) => endpoint.path = Some(inside.to_string_lossy().into_owned()),
                Err(message) => errors.push(SpecError {
                    path: format!("{}.path", endpoint.role),
                    line: endpoint.line_of("path"),
                    message,
                }),
            }
        }
        errors
    }
}

impl ServerRules {
    /// The rules with `data_root` made (`0700`) and made canonical.
    pub fn new(env_prefix: String, secrets_dir: Option<PathBuf>, data_root: &Path) -> std::io::Result<ServerRules> {
        crate::private_files::create_dir(data_root)?;
        let data_root = data_root.canonicalize()?;
        Ok(ServerRules { env_prefix, secrets_dir, data_root })
    }

    fn variable(&self, name: &str) -> Result<String, String> {
        if let Some(directory) = &self.secrets_dir {
            let file = directory.join(name);
            match std::fs::read_to_string(&file) {
                // One trailing line end is the file's, not the secret's.
                Ok(text) => {
                    let line =
                        text.strip_suffix('\n').map_or(text.as_str(), |line| line.strip_suffix('\r').unwrap_or(line));
                    return Ok(line.to_owned());
                }
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => {
                    return Err(format!(
                        "variable `{name}`: cannot read the secret file {}: {error}; make it readable by the server",
                        file.display()
                    ))
                }
            }
        }
        let from_secrets = match &self.secrets_dir {
            Some(directory) => format!("a file named {name} in {}", directory.display()),
            None => "a file in the server's --secrets-dir".to_owned(),
        };
        let prefix = &self.env_prefix;
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

    /// `path` (relative to the data root, or absolute) with every symbolic link that exists
    /// followed and `..` applied, when that is inside the data root.
    fn resolve(&self, path: &Path) -> Result<PathBuf, String> {
        let mut resolved = PathBuf::new();
        for component in self.data_root.join(path).components() {
            match component {
                Component::Prefix(_) | Component::RootDir => resolved.push(component),
                Component::CurDir => {}
                Component::ParentDir => {
                    resolved.pop();
                }
                Component::Normal(name) => {
                    resolved.push(name);
                    // A link is followed where it stands: what it points to is what is written.
                    if resolved.symlink_metadata().is_ok() {
                        resolved = resolved
                            .canonicalize()
                            .map_err(|error| format!("{}: cannot resolve it: {error}", resolved.display()))?;
                    }
                }
            }
        }
        if resolved.starts_with(&self.data_root) {
            Ok(resolved)
        } else {
            Err(format!(
                "{} leads outside the server's data root {} (symbolic links followed); name a path inside it, or \
                 start the server with another --data-root",
                path.display(),
                self.data_root.display()
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(secrets: Option<&Path>, root: &Path) -> DocumentRules {
        DocumentRules::Server(
            ServerRules::new("SLUICE_VAR_".into(), secrets.map(Path::to_path_buf), root).expect("a data root"),
        )
    }

    #[test]
    fn a_server_reads_only_prefixed_variables_and_its_secrets_directory() {
        let secrets = tempfile::tempdir().unwrap();
        let root = tempfile::tempdir().unwrap();
        std::fs::write(secrets.path().join("DB_PASSWORD"), "s3cret\n").unwrap();
        std::fs::write(secrets.path().join("RAW"), "two\nlines").unwrap();
        // PATH is set in every test process, and no test changes it.
        let rules = server(Some(secrets.path()), root.path());
        assert_eq!(rules.variable("DB_PASSWORD").unwrap(), "s3cret", "one trailing newline is not the secret's");
        assert_eq!(rules.variable("RAW").unwrap(), "two\nlines");
        let refused = rules.variable("PATH").unwrap_err();
        assert!(refused.contains("`PATH`") && refused.contains("`SLUICE_VAR_`"), "{refused}");
        let unset = rules.variable("SLUICE_VAR_NOT_SET_ANYWHERE").unwrap_err();
        assert!(unset.contains("not set on this server"), "{unset}");
        let prefixed = DocumentRules::Server(ServerRules::new("PAT".into(), None, root.path()).unwrap());
        assert_eq!(prefixed.variable("PATH").unwrap(), std::env::var("PATH").unwrap());
        assert!(prefixed.variable("HOME").unwrap_err().contains("--secrets-dir"));
        let open = DocumentRules::Server(ServerRules::new(String::new(), None, root.path()).unwrap());
        assert_eq!(open.variable("PATH").unwrap(), std::env::var("PATH").unwrap(), "an empty prefix admits every name");
        assert_eq!(DocumentRules::Standalone.variable("PATH").unwrap(), std::env::var("PATH").unwrap());

        let text = "name: x\nsource:\n  type: sqlite\n  path: ${PATH}\ntarget:\n  type: jsonl\n  path: ${HOME}\n";
        let errors = crate::job_text::parse(text, crate::job_text::DocumentFormat::Yaml, &rules).unwrap_err();
        let fields: Vec<&str> = errors
            .iter()
            .filter(|error| error.message.contains("is not available to jobs"))
            .map(|error| error.path.as_str())
            .collect();
        assert_eq!(fields, ["source.path", "target.path"], "every refused variable at once: {errors:?}");
    }

    #[test]
    fn paths_resolve_inside_the_data_root_links_followed() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("lake")).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("escape")).unwrap();
        std::os::unix::fs::symlink(root.path().join("lake"), root.path().join("inner")).unwrap();
        let DocumentRules::Server(rules) = server(None, root.path()) else { unreachable!() };
        let canonical = root.path().canonicalize().unwrap();
        assert_eq!(rules.resolve(Path::new("lake/t.db")).unwrap(), canonical.join("lake/t.db"));
        assert_eq!(rules.resolve(Path::new("new/dir/./out")).unwrap(), canonical.join("new/dir/out"));
        assert_eq!(rules.resolve(&canonical.join("lake")).unwrap(), canonical.join("lake"), "absolute inside");
        assert_eq!(rules.resolve(Path::new("inner/x")).unwrap(), canonical.join("lake/x"), "a link inside the root");
        for escaping in ["../x.db", "lake/../../x", "/etc/passwd", "escape/x.db", "escape"] {
            let error = rules.resolve(Path::new(escaping)).unwrap_err();
            assert!(error.contains("outside the server's data root"), "{escaping}: {error}");
        }
    }

    #[test]
    fn a_document_naming_paths_outside_the_root_gets_an_error_for_each() {
        let root = tempfile::tempdir().unwrap();
        let rules = server(None, root.path());
        let text =
            "name: x\nsource:\n  type: sqlite\n  path: ../../etc/shadow\ntarget:\n  type: sqlite\n  path: /tmp/x.db\n";
        let errors = crate::job_text::parse(text, crate::job_text::DocumentFormat::Yaml, &rules).unwrap_err();
        let fields: Vec<(&str, Option<usize>)> = errors.iter().map(|error| (error.path.as_str(), error.line)).collect();
        assert_eq!(fields, [("source.path", Some(4)), ("target.path", Some(7))], "{errors:?}");
        let inside = "name: x\nsource:\n  type: sqlite\n  path: s.db\ntarget:\n  type: sqlite\n  path: out/t.db\n";
        let job = crate::job_text::parse(inside, crate::job_text::DocumentFormat::Yaml, &rules).unwrap();
        let canonical = root.path().canonicalize().unwrap();
        assert_eq!(job.source.path.as_deref(), Some(canonical.join("s.db").to_str().unwrap()));
        assert_eq!(job.target.path.as_deref(), Some(canonical.join("out/t.db").to_str().unwrap()));
        let standalone =
            crate::job_text::parse(text, crate::job_text::DocumentFormat::Yaml, &DocumentRules::Standalone);
        assert_eq!(standalone.unwrap().source.path.as_deref(), Some("../../etc/shadow"), "sluice run trusts its user");
    }
}
