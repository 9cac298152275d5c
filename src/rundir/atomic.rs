//! Replacing a small file all at once: readers see the old bytes or the new,
//! never a torn mix, and the new bytes survive a crash once the call returns.
//! The lowest file of `rundir`: the lock, the run directory and the
//! report use it, and it uses none of them.

use std::fs;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::confine::Dir;

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
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{} names no file", path.display()))
    })?;
    let dir = Dir::open(dir)?;
    let (tmp, mut file) = loop {
        let tmp = format!(".tmp{}-{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed));
        match dir.create_new(&tmp, 0o666) {
            Ok(file) => break (tmp, file),
            // A leftover of a process with this id before: take the next name.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    };
    let written = file.write_all(bytes).and_then(|()| file.sync_all()).and_then(|()| dir.rename(&tmp, name));
    if let Err(e) = written {
        let _ = dir.remove_file(&tmp);
        return Err(e);
    }
    dir.sync()
}

/// A temporary file in `dir` whose mode is 0666 less the umask (tempfile's
/// default, 0600, would keep a group from reading the files of a run
/// directory it shares).
pub fn shared_tempfile(prefix: &str, dir: &Path) -> std::io::Result<tempfile::NamedTempFile> {
    use std::os::unix::fs::PermissionsExt;
    tempfile::Builder::new().prefix(prefix).permissions(fs::Permissions::from_mode(0o666)).tempfile_in(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
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
