//! Replacing a small file all at once: readers see the old bytes or the new,
//! never a torn mix, and the new bytes survive a crash once the call returns.
//! The lowest file of `rundir`: the lock, the run directory and the
//! report use it, and it uses none of them.

use std::fs;
use std::io::Write;
use std::path::Path;

/// Writes `bytes` to `path` through a temporary file, fsync and rename. The
/// rename replaces whatever is at `path` (a symlink included) and never
/// writes through it. The file gets mode 0666 less the umask, as any file a
/// program creates, so a run directory shared by a group (umask 002) can be
/// resumed by a colleague (docs/run-directory.md, "File modes").
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let mut tmp = shared_tempfile(".tmp", dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    fs::File::open(dir)?.sync_all()
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
