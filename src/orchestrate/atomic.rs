//! Replacing a small file all at once: readers see the old bytes or the new,
//! never a torn mix, and the new bytes survive a crash once the call returns.
//! The lowest file of `orchestrate`: the lock, the run directory and the
//! report use it, and it uses none of them.

use std::fs;
use std::io::Write;
use std::path::Path;

/// Writes `bytes` to `path` through a temporary file, fsync and rename.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    fs::File::open(dir)?.sync_all()
}
