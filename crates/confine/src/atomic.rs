//! Replacing a small file all at once: readers see the old bytes or the new,
//! never a torn mix, and the new bytes survive a crash once the call returns.
//! Part of the ground layer (`confine`): the lock, the run directory, the
//! report, publishing's working tree and the in-job request file use it.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use super::Dir;

/// Writes `bytes` to `path` through a temporary file, fsync and rename. The
/// rename replaces whatever is at `path` (a symlink included) and never
/// writes through it. The file gets mode 0666 less the umask, as any file a
/// program creates, so a run directory shared by a group (umask 002) can be
/// resumed by a colleague (docs/run-directory.md, "File modes").
///
/// `path`'s directory is opened once as a handle ([`crate::confine::Dir`]);
/// the temporary file is created there (`O_EXCL`, never through a link),
/// renamed over the name and the directory synced, all relative to that
/// handle: the directory cannot be swapped between the write and the rename.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let (dir, name) = Dir::open_parent(path)?;
    let mut tmp = TempFile::new_in(&dir, ".tmp")?;
    tmp.file.write_all(bytes)?;
    tmp.persist(name)
}

/// A temporary file created in a directory handle (`O_EXCL`, never through
/// anything left at its name), mode 0666 less the umask (so a group sharing
/// the run directory can read what replaces a file), removed unless it is
/// [persisted](TempFile::persist).
pub struct TempFile<'a> {
    dir: &'a Dir,
    name: String,
    pub file: std::fs::File,
    persisted: bool,
}

impl<'a> TempFile<'a> {
    /// A new temporary file in `dir`, named `<prefix><pid>-<n>`.
    pub fn new_in(dir: &'a Dir, prefix: &str) -> std::io::Result<TempFile<'a>> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        loop {
            let name = format!("{prefix}{}-{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed));
            match dir.create_new(&name, 0o666) {
                Ok(file) => return Ok(TempFile { dir, name, file, persisted: false }),
                // A leftover of a process with this id before: the next name.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Its name in its directory.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Syncs the file, renames it over `name` (replacing what is there, a
    /// link included, never writing through it) and syncs the directory.
    pub fn persist(mut self, name: impl AsRef<Path>) -> std::io::Result<()> {
        self.file.sync_all()?;
        self.dir.rename(&self.name, name)?;
        self.persisted = true;
        self.dir.sync()
    }
}

impl Write for TempFile<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.file.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

impl Drop for TempFile<'_> {
    fn drop(&mut self) {
        if !self.persisted {
            let _ = self.dir.remove_file(&self.name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_file_is_replaced_whole_a_link_at_its_name_replaced_not_written_through() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        fs::write(&outside, b"theirs").unwrap();
        let path = tmp.path().join("summary.json");
        std::os::unix::fs::symlink(&outside, &path).unwrap();
        write_atomically(&path, b"{\"a\":1}").unwrap();
        assert_eq!(fs::read(&outside).unwrap(), b"theirs", "the link's target is untouched");
        assert!(fs::symlink_metadata(&path).unwrap().is_file());
        write_atomically(&path, b"{}").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"{}");
        let names: Vec<_> = fs::read_dir(tmp.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 2, "no temporary file left: {names:?}");
    }

    #[test]
    fn replaced_files_get_the_mode_the_umask_allows() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("summary.json");
        let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o002));
        let written = write_atomically(&path, b"{}");
        nix::sys::stat::umask(old);
        written.unwrap();
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o664);
    }
}
