//! A database server of one test alone, started and stopped by scripts/testdb in its own
//! temporary directory (under /dev/shm where there is one).

use std::path::PathBuf;
use std::process::Command;

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/testdb")
}

/// Starts a server of `engine` (`mariadb` or `postgres`) in `DIRECTORY/ENGINE`: the directory
/// and the URL of the server's `sluice` user.
pub fn start(engine: &str) -> (tempfile::TempDir, String) {
    start_with(engine, &[])
}

/// `start` with more arguments of `scripts/testdb start` (`--tls CERTS`).
pub fn start_with(engine: &str, extra: &[&str]) -> (tempfile::TempDir, String) {
    let directory = tempfile::Builder::new()
        .prefix(&format!("sluice-{engine}"))
        .tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .expect("a temporary directory");
    let data = directory.path().join(engine);
    let output =
        Command::new(script()).args(["start", engine, data.to_str().unwrap()]).args(extra).output().expect("testdb");
    assert!(output.status.success(), "testdb start: {}", String::from_utf8_lossy(&output.stderr));
    let url = String::from_utf8_lossy(&output.stdout)
        .lines()
        .find_map(|line| line.strip_prefix("URL=").map(str::to_owned))
        .expect("testdb prints the URL");
    (directory, url)
}

/// Stops the server `start` started in `directory`.
pub fn stop(directory: &tempfile::TempDir, engine: &str) {
    let data = directory.path().join(engine);
    let _ = Command::new(script()).args(["stop", engine, data.to_str().unwrap()]).output();
}
