//! Verification and loading: a checkpoint counts only if its manifest lists
//! every required file and each file has the size and SHA-256 the manifest
//! records. Loading reads through the same checks, so a checkpoint that
//! verifies is exactly one that resume would load.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::error::{FileFailure, Problem};
use super::hashed_io::{map_tensors_hashed, read_hashed};
use super::layout::CheckpointKind;
use super::layout::{MODEL_FILE, OPTIMIZER_FILE, STATE_FILE, Snapshot, parse_step_dir_name};
use super::manifest::{MANIFEST_FILE, Manifest, ManifestEntry};
use super::parts::{assemble, optimizer_part_name};
use super::safetensors_io;
use super::tensor::TensorSet;

/// How thoroughly [`CheckpointStore::list`](super::CheckpointStore::list) checks each checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VerifyLevel {
    /// Manifest, presence, file types and sizes (no reading of contents).
    Quick,
    /// Everything `Quick` checks plus every file's SHA-256.
    Full,
}

/// One checkpoint directory and what verification found.
#[derive(Debug, Clone, Serialize)]
pub struct CheckpointInfo {
    pub step: u64,
    pub dir: PathBuf,
    pub created_at: Option<String>,
    /// Bytes of the files named by the manifest (0 when it is unreadable).
    pub bytes: u64,
    pub valid: bool,
    pub failures: Vec<FileFailure>,
}

/// A checkpoint that verified and was read into memory.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub dir: PathBuf,
    pub manifest: Manifest,
    pub snapshot: Snapshot,
}

/// The largest `MANIFEST.json` read: about 150 bytes a file, so room for
/// checkpoints of over 100,000 files; a larger one is refused unread.
pub const MAX_MANIFEST_BYTES: u64 = 16 << 20;

/// Reads and parses the manifest of `dir` (at most [`MAX_MANIFEST_BYTES`]).
pub fn read_manifest(dir: &Path) -> Result<Manifest, FileFailure> {
    let path = dir.join(MANIFEST_FILE);
    let fail = |problem| FileFailure { file: MANIFEST_FILE.into(), problem };
    match fs::symlink_metadata(&path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(fail(Problem::ManifestMissing)),
        Err(e) => return Err(fail(Problem::ManifestUnreadable { reason: e.to_string() })),
        Ok(m) if !m.file_type().is_file() => return Err(fail(Problem::NotPlainFile)),
        Ok(_) => {}
    }
    let bytes = crate::confine::read_bounded(&path, MAX_MANIFEST_BYTES)
        .map_err(|e| fail(Problem::ManifestUnreadable { reason: e.to_string() }))?;
    let manifest = Manifest::parse(&bytes)?;
    if let Some(reason) = manifest.missing_required() {
        return Err(fail(Problem::ManifestInvalid { reason }));
    }
    if let Some(step) = dir.file_name().and_then(|n| parse_step_dir_name(&n.to_string_lossy()))
        && step != manifest.step
    {
        return Err(fail(Problem::ManifestInvalid {
            reason: format!("manifest is for step {} but the directory is for step {step}", manifest.step),
        }));
    }
    Ok(manifest)
}

/// Checks one file named by the manifest. With `keep`, returns its bytes.
fn check_entry(dir: &Path, entry: &ManifestEntry, level: VerifyLevel, keep: bool) -> Result<Vec<u8>, FileFailure> {
    let path = check_file(dir, entry)?;
    if level == VerifyLevel::Quick {
        return Ok(Vec::new());
    }
    let (bytes, sha256, kept) = read_hashed(&path, keep).map_err(|e| unreadable(entry, e))?;
    check_read(entry, bytes, sha256)?;
    Ok(kept)
}

/// What can be checked of a file without reading it: there, a plain file,
/// of the manifest's size. Returns its path.
fn check_file(dir: &Path, entry: &ManifestEntry) -> Result<PathBuf, FileFailure> {
    let fail = |problem| FileFailure { file: entry.name.clone(), problem };
    let path = dir.join(&entry.name);
    let meta = match fs::symlink_metadata(&path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(fail(Problem::Missing)),
        Err(e) => return Err(fail(Problem::Unreadable { reason: e.to_string() })),
        Ok(m) => m,
    };
    if !meta.file_type().is_file() {
        return Err(fail(Problem::NotPlainFile));
    }
    if meta.len() != entry.bytes {
        return Err(fail(Problem::WrongSize { expected: entry.bytes, actual: meta.len() }));
    }
    Ok(path)
}

fn unreadable(entry: &ManifestEntry, e: io::Error) -> FileFailure {
    FileFailure { file: entry.name.clone(), problem: Problem::Unreadable { reason: e.to_string() } }
}

/// The size and hash of the bytes read against the manifest's.
fn check_read(entry: &ManifestEntry, bytes: u64, sha256: String) -> Result<(), FileFailure> {
    let fail = |problem| FileFailure { file: entry.name.clone(), problem };
    if bytes != entry.bytes {
        return Err(fail(Problem::WrongSize { expected: entry.bytes, actual: bytes }));
    }
    if sha256 != entry.sha256.to_ascii_lowercase() {
        return Err(fail(Problem::Sha256Mismatch { expected: entry.sha256.clone(), actual: sha256 }));
    }
    Ok(())
}

/// A file of a checkpoint, read and checked for loading.
enum Content {
    /// A safetensors file's tensors, read straight into their buffers.
    Tensors(TensorSet),
    /// Any other file's bytes.
    Bytes(Vec<u8>),
}

/// Reads one file for loading, hash checked on the same pass; a safetensors
/// file straight into its tensors' buffers.
fn load_entry(dir: &Path, entry: &ManifestEntry) -> Result<Content, FileFailure> {
    if !entry.name.ends_with(".safetensors") {
        return check_entry(dir, entry, VerifyLevel::Full, true).map(Content::Bytes);
    }
    let path = check_file(dir, entry)?;
    let read = map_tensors_hashed(&path).map_err(|e| unreadable(entry, e))?;
    check_read(entry, read.bytes, read.sha256)?;
    read.tensors
        .map(Content::Tensors)
        .map_err(|reason| FileFailure { file: entry.name.clone(), problem: Problem::InvalidContent { reason } })
}

/// Verifies one checkpoint directory; an empty list means it is valid.
///
/// `Full` checks exactly what loading checks (every hash, and that the
/// safetensors and JSON files parse), so a checkpoint that verifies is one
/// that resume would load.
///
/// Files are checked in parallel (at most [`MAX_PARALLEL_FILES`] at once),
/// each hashed while it is read, without keeping the bytes (nothing is
/// allocated for the tensor data).
pub fn verify_checkpoint_dir(dir: &Path, level: VerifyLevel) -> Vec<FileFailure> {
    let manifest = match read_manifest(dir) {
        Err(f) => return vec![f],
        Ok(m) => m,
    };
    if level == VerifyLevel::Quick {
        return manifest.files.iter().filter_map(|e| check_entry(dir, e, level, false).err()).collect();
    }
    let kind = manifest.kind;
    let results = in_parallel(&manifest.files, |entry| verify_entry_fully(dir, entry, kind));
    results.into_iter().filter_map(Result::err).collect()
}

/// Most files checked at once. The manifest is untrusted: a thread for each
/// file it lists would let a manifest of 100 000 names exhaust the kernel's
/// threads and mappings (and a failed spawn aborts). A checkpoint has three
/// files, so this costs real checkpoints nothing.
const MAX_PARALLEL_FILES: usize = 8;

/// `f` of every item, in order, on at most [`MAX_PARALLEL_FILES`] threads
/// that take the next item as they finish one.
fn in_parallel<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let next = AtomicUsize::new(0);
    let mut slots: Vec<Option<R>> = std::iter::repeat_with(|| None).take(items.len()).collect();
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..items.len().min(MAX_PARALLEL_FILES))
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(item) = items.get(i) else { return done };
                        done.push((i, f(item)));
                    }
                })
            })
            .collect();
        for worker in workers {
            for (i, result) in worker.join().expect("file check thread does not panic") {
                slots[i] = Some(result);
            }
        }
    });
    slots.into_iter().map(|r| r.expect("every item was checked")).collect()
}

/// Hash, size, and the content check loading would make (layout of a
/// safetensors file, JSON of state.json). A files checkpoint's files are
/// the program's own: only their hashes and sizes are rekindle's to check.
fn verify_entry_fully(dir: &Path, entry: &ManifestEntry, kind: CheckpointKind) -> Result<(), FileFailure> {
    if kind == CheckpointKind::Files {
        return check_entry(dir, entry, VerifyLevel::Full, false).map(drop);
    }
    let small = entry.name == STATE_FILE;
    let kept = check_entry(dir, entry, VerifyLevel::Full, small)?;
    let invalid =
        |reason: String| FileFailure { file: entry.name.clone(), problem: Problem::InvalidContent { reason } };
    if small {
        serde_json::from_slice::<serde_json::Value>(&kept).map_err(|e| invalid(e.to_string()))?;
    } else if entry.name.ends_with(".safetensors") {
        let unreadable = |e: io::Error| FileFailure {
            file: entry.name.clone(),
            problem: Problem::Unreadable { reason: e.to_string() },
        };
        let mut file = crate::confine::open_regular(&dir.join(&entry.name)).map_err(unreadable)?;
        safetensors_io::read_layout(&mut file, entry.bytes).map_err(|e| match e {
            safetensors_io::LayoutError::Invalid(reason) => invalid(reason),
            safetensors_io::LayoutError::Io(e) => unreadable(e),
        })?;
    }
    Ok(())
}

/// What verification at `level` finds in the checkpoint of `step` in `dir`.
pub(super) fn inspect(dir: &Path, step: u64, level: VerifyLevel) -> CheckpointInfo {
    let manifest = read_manifest(dir).ok();
    let failures = verify_checkpoint_dir(dir, level);
    CheckpointInfo {
        step,
        dir: dir.to_path_buf(),
        created_at: manifest.as_ref().map(|m| m.created_at.clone()),
        bytes: manifest.as_ref().map(Manifest::total_bytes).unwrap_or(0),
        valid: failures.is_empty(),
        failures,
    }
}

/// Reads a checkpoint, verifying every hash on the same pass, and parses it.
/// Safetensors files are mapped: their tensors share the mapping's pages
/// (`TensorBytes::Shared`) rather than fresh memory, and are valid only
/// once this returns `Ok` (every hash matched).
pub fn load_dir(dir: &Path) -> Result<Loaded, Vec<FileFailure>> {
    let manifest = read_manifest(dir).map_err(|f| vec![f])?;
    if manifest.kind != CheckpointKind::Native {
        let reason = format!("a {} checkpoint has no training state to load", manifest.kind.name());
        return Err(vec![FileFailure { file: MANIFEST_FILE.into(), problem: Problem::InvalidContent { reason } }]);
    }
    let mut contents = BTreeMap::new();
    let mut failures = Vec::new();
    // Files in parallel, each hashed while it is read into its final buffers.
    let results: Vec<(String, Result<Content, FileFailure>)> =
        in_parallel(&manifest.files, |entry| (entry.name.clone(), load_entry(dir, entry)));
    for (name, result) in results {
        match result {
            Ok(content) => {
                contents.insert(name, content);
            }
            Err(f) => failures.push(f),
        }
    }
    if !failures.is_empty() {
        return Err(failures);
    }
    let invalid = |file: &str, reason: String| {
        vec![FileFailure { file: file.into(), problem: Problem::InvalidContent { reason } }]
    };
    let mut tensors = |file: &str| match contents.remove(file) {
        Some(Content::Tensors(set)) => Ok(set),
        _ => Err(invalid(file, "not read as a safetensors file".into())),
    };
    let model = tensors(MODEL_FILE)?;
    let optimizer = match manifest.optimizer_parts() {
        None => tensors(OPTIMIZER_FILE)?,
        Some(world) => {
            // Rank order: each moment is its pieces joined in that order.
            let parts = (0..world).map(|r| tensors(&optimizer_part_name(r, world))).collect::<Result<Vec<_>, _>>()?;
            assemble(&model, &parts)
                .map_err(|reason| invalid(&format!("optimizer.rank-*-of-{world:05}.safetensors"), reason))?
        }
    };
    let state: serde_json::Value = match contents.get(STATE_FILE) {
        Some(Content::Bytes(bytes)) => serde_json::from_slice(bytes).map_err(|e| invalid(STATE_FILE, e.to_string()))?,
        _ => return Err(invalid(STATE_FILE, "not read".into())),
    };
    let step = manifest.step;
    Ok(Loaded { dir: dir.to_path_buf(), manifest, snapshot: Snapshot { step, model, optimizer, state } })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A checkpoint directory whose manifest lists the required files and
    /// `extra` more, none of which exist.
    fn manifest_listing(extra: usize) -> tempfile::TempDir {
        let tmp = tempfile::tempdir().unwrap();
        let files: Vec<ManifestEntry> = super::super::layout::REQUIRED_FILES
            .iter()
            .map(|n| n.to_string())
            .chain((0..extra).map(|i| format!("f{i}")))
            .map(|name| ManifestEntry { name, bytes: 1, sha256: "0".repeat(64) })
            .collect();
        let manifest = Manifest {
            format_version: super::super::manifest::FORMAT_VERSION,
            kind: CheckpointKind::Native,
            step: 1,
            created_at: "2026-01-01T00:00:00Z".into(),
            rekindle_version: "0.1.0".into(),
            files,
        };
        fs::write(tmp.path().join(MANIFEST_FILE), manifest.to_bytes()).unwrap();
        tmp
    }

    #[test]
    fn a_manifest_listing_forty_thousand_files_is_checked_without_a_thread_each() {
        // One thread per listed file used to be spawned at once: a hostile
        // manifest listing 40 000 files ran into the kernel's limits on
        // threads and mappings, and a failed spawn panics.
        let tmp = manifest_listing(40_000);
        let failures = verify_checkpoint_dir(tmp.path(), VerifyLevel::Full);
        assert_eq!(failures.len(), 40_003);
        assert!(failures.iter().all(|f| f.problem == Problem::Missing));
        assert_eq!(load_dir(tmp.path()).unwrap_err().len(), 40_003);
    }
}
