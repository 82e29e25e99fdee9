//! A MySQL-sourced streaming job in a workspace of its own: `sluice run` in the background,
//! waits on the stream's checkpoint in the target, `sluice replay`, the dirty records it lists.

use std::path::PathBuf;
use std::time::Duration;

use super::workload::{source_position, stream_position};
use super::{mysql_url, postgres_url, wait_for, Guard, Run, Workspace};

/// A `cdc` or `snapshot+cdc` job of a source database's tables into `postgres` or `mysql`.
pub struct StreamJob {
    pub workspace: Workspace,
    pub file: PathBuf,
    pub name: String,
    pub target: &'static str,
}

impl StreamJob {
    /// A job named after `database` (its checkpoints in the target are its own), with `target`
    /// options past its type and URL (`"  namespace: x\n"`) and `errors` (`"max_dirty_records: 5"`).
    pub fn new(mode: &str, database: &str, target: &'static str, options: &str, errors: &str) -> StreamJob {
        let workspace = Workspace::new();
        let name = format!("{}-{target}", database.replace('_', "-"));
        let file = workspace.write(
            "job.yaml",
            &format!(
                "name: {name}\nmode: {mode}\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{database}.*\"]\n\
                 target:\n  type: {target}\n  url: ${{TARGET}}\n{options}errors: {{{errors}}}\n"
            ),
        );
        StreamJob { workspace, file, name, target }
    }

    fn target_url(&self) -> String {
        if self.target == "postgres" {
            postgres_url()
        } else {
            mysql_url()
        }
    }

    /// Starts the job (its summary into `summary.json`) and waits for its stream's first
    /// checkpoint.
    pub fn start(&self) -> Guard {
        let child =
            self.workspace.start_run(&self.file, &mysql_url(), &self.target_url(), &["--summary-json", "summary.json"]);
        wait_for("the stream to start", Duration::from_secs(60), || stream_position(self.target, &self.name).is_some());
        child
    }

    /// Waits until the target holds everything the source committed so far, the run still going.
    pub fn wait_converged(&self, child: &mut Guard) {
        let source = source_position();
        wait_for("the stream to reach the source", Duration::from_secs(60), || {
            assert!(child.try_wait().unwrap().is_none(), "the run ended:\n{}", child.stderr_text());
            stream_position(self.target, &self.name).is_some_and(|at| at >= source)
        });
    }

    /// `sluice replay` of the job.
    pub fn replay(&self) -> Run {
        Run::from(
            self.workspace
                .command(&["replay", self.file.to_str().unwrap()])
                .env("SOURCE", mysql_url())
                .env("TARGET", self.target_url())
                .output()
                .unwrap(),
        )
    }

    /// The job's dirty records as `sluice run` and `sluice replay` list them.
    pub fn dirty(&self) -> Vec<serde_json::Value> {
        let path = self.workspace.path(&format!(".sluice/{}/dirty.jsonl", self.name));
        let text = std::fs::read_to_string(path).unwrap_or_default();
        text.lines().map(|line| serde_json::from_str(line).expect("a record per line")).collect()
    }
}
