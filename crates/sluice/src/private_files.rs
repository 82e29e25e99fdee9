//! What sluice keeps on disk (plans, checkpoints, job documents, dirty rows) is its user's alone:
//! the directories it creates are 0700 and its state files 0600, whatever the umask.

use std::io::Write;
use std::path::Path;

/// Creates `directory` and its missing parents; those it creates are readable by the owner only.
pub fn create_dir(directory: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(directory)
}

/// Makes an existing file readable and writable by its owner only.
pub fn restrict(path: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

/// Writes `bytes` to `path`, created (or first restricted, when it exists) readable by its owner
/// only, so no other user reads it even for a moment.
pub fn write(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    if path.exists() {
        restrict(path)?;
    }
    options.open(path)?.write_all(bytes)
}

#[cfg(all(test, unix))]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn directories_and_files_are_the_owners_alone() {
        let root = tempfile::tempdir().unwrap();
        let directory = root.path().join("a/b");
        create_dir(&directory).unwrap();
        assert_eq!((mode(&root.path().join("a")), mode(&directory)), (0o700, 0o700));
        let file = directory.join("state.json");
        std::fs::write(&file, "old").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        write(&file, b"new").unwrap();
        assert_eq!((mode(&file), std::fs::read_to_string(&file).unwrap().as_str()), (0o600, "new"));
        let fresh = directory.join("fresh.json");
        write(&fresh, b"{}").unwrap();
        assert_eq!(mode(&fresh), 0o600);
    }
}
