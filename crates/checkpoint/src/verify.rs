//! Verification and loading: a checkpoint counts only if its manifest lists
//! every required file and each file has the size and SHA-256 the manifest
//! records. Loading reads through the same checks, so a checkpoint that
//! verifies is exactly one that resume would load.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::error::{FileFailure, Problem};
use super::hashed_io::{map_tensors_hashed, read_hashed};
use super::layout::CheckpointKind;
use super::layout::{MODEL_FILE, OPTIMIZER_FILE, STATE_FILE, Snapshot, parse_step_dir_name};
use super::manifest::{MANIFEST_FILE, Manifest, ManifestEntry};
use super::parallel::{file_threads, in_parallel, largest_first};
use super::parts::{assemble, optimizer_part_name};
use super::safetensors_io;
use super::shards::{ShardIndex, index_name, parse_index_name, shard_name};
use super::tensor::TensorSet;
use crate::confine::Dir;

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

/// The checkpoint directory at `dir` as a handle (the one path this module
/// opens: everything below it is reached through the handle, never through
/// a link in any component; `confine::Dir`), or why it cannot be read.
fn open_checkpoint(dir: &Path) -> Result<Dir, FileFailure> {
    Dir::open(dir).map_err(|e| FileFailure {
        file: MANIFEST_FILE.into(),
        problem: if e.kind() == io::ErrorKind::NotFound {
            Problem::ManifestMissing
        } else {
            Problem::ManifestUnreadable { reason: e.to_string() }
        },
    })
}

/// Reads and parses the manifest of `dir` (at most [`MAX_MANIFEST_BYTES`]).
pub fn read_manifest(dir: &Path) -> Result<Manifest, FileFailure> {
    read_manifest_at(&open_checkpoint(dir)?)
}

/// [`read_manifest`] of the checkpoint directory held as `dir`.
pub fn read_manifest_at(dir: &Dir) -> Result<Manifest, FileFailure> {
    let fail = |problem| FileFailure { file: MANIFEST_FILE.into(), problem };
    match dir.symlink_metadata(MANIFEST_FILE) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(fail(Problem::ManifestMissing)),
        Err(e) => return Err(fail(Problem::ManifestUnreadable { reason: e.to_string() })),
        Ok(m) if !m.file_type().is_file() => return Err(fail(Problem::NotPlainFile)),
        Ok(_) => {}
    }
    let bytes = dir
        .read_bounded(MANIFEST_FILE, MAX_MANIFEST_BYTES)
        .map_err(|e| fail(Problem::ManifestUnreadable { reason: e.to_string() }))?;
    let manifest = Manifest::parse(&bytes)?;
    if let Some(reason) = manifest.missing_required() {
        return Err(fail(Problem::ManifestInvalid { reason }));
    }
    if let Some(step) = dir.path().file_name().and_then(|n| parse_step_dir_name(&n.to_string_lossy()))
        && step != manifest.step
    {
        return Err(fail(Problem::ManifestInvalid {
            reason: format!("manifest is for step {} but the directory is for step {step}", manifest.step),
        }));
    }
    Ok(manifest)
}

/// Checks one file named by the manifest. With `keep`, returns its bytes.
fn check_entry(dir: &Dir, entry: &ManifestEntry, level: VerifyLevel, keep: bool) -> Result<Vec<u8>, FileFailure> {
    check_file(dir, entry)?;
    if level == VerifyLevel::Quick {
        return Ok(Vec::new());
    }
    let (bytes, sha256, kept) =
        dir.open_read(&entry.name).and_then(|f| read_hashed(f, keep)).map_err(|e| unreadable(entry, e))?;
    check_read(entry, bytes, sha256)?;
    Ok(kept)
}

/// What can be checked of a file without reading it: there, a plain file,
/// of the manifest's size, reached without a link in any component.
fn check_file(dir: &Dir, entry: &ManifestEntry) -> Result<(), FileFailure> {
    let fail = |problem| FileFailure { file: entry.name.clone(), problem };
    let meta = match dir.symlink_metadata(&entry.name) {
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
    Ok(())
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
fn load_entry(dir: &Dir, entry: &ManifestEntry) -> Result<Content, FileFailure> {
    if !entry.name.ends_with(".safetensors") {
        return check_entry(dir, entry, VerifyLevel::Full, true).map(Content::Bytes);
    }
    check_file(dir, entry)?;
    let read = dir.open_read(&entry.name).and_then(map_tensors_hashed).map_err(|e| unreadable(entry, e))?;
    check_read(entry, read.bytes, read.sha256)?;
    read.tensors
        .map(Content::Tensors)
        .map_err(|reason| FileFailure { file: entry.name.clone(), problem: Problem::InvalidContent { reason } })
}

/// The tensors of the safetensors file `file`, taken out of `contents`.
fn take_tensors(contents: &mut BTreeMap<String, Content>, file: &str) -> Result<TensorSet, Vec<FileFailure>> {
    match contents.remove(file) {
        Some(Content::Tensors(set)) => Ok(set),
        _ => Err(vec![FileFailure {
            file: file.into(),
            problem: Problem::InvalidContent { reason: "not read as a safetensors file".into() },
        }]),
    }
}

/// The tensors of `stem`'s `n` shards (taken out of `contents`), joined
/// into one set once the index says each is where it is.
fn join_shards(contents: &mut BTreeMap<String, Content>, stem: &str, n: usize) -> Result<TensorSet, Vec<FileFailure>> {
    let name = index_name(stem);
    let invalid =
        |reason: String| vec![FileFailure { file: name.clone(), problem: Problem::InvalidContent { reason } }];
    let index = match contents.remove(&name) {
        Some(Content::Bytes(bytes)) => ShardIndex::parse(&bytes).map_err(invalid)?,
        _ => return Err(invalid("not read".into())),
    };
    let mut shards = Vec::with_capacity(n);
    for k in 1..=n {
        let shard = shard_name(stem, k, n);
        let set = take_tensors(contents, &shard)?;
        shards.push((shard, set));
    }
    let held: Vec<(String, Vec<(String, u64)>)> = shards
        .iter()
        .map(|(file, set)| (file.clone(), set.iter().map(|(t, v)| (t.clone(), v.data.len() as u64)).collect()))
        .collect();
    index.check(&held).map_err(invalid)?;
    Ok(shards.into_iter().flat_map(|(_, set)| set).collect())
}

/// Verifies one checkpoint directory; an empty list means it is valid.
///
/// `Full` checks exactly what loading checks (every hash, and that the
/// safetensors and JSON files parse), so a checkpoint that verifies is one
/// that resume would load.
///
/// Files are checked in parallel, on as many threads as the process has
/// cores (`parallel.rs`, largest first), each hashed while it is read,
/// without keeping the bytes (nothing is allocated for the tensor data).
/// A checkpoint in shards has its index checked against the shards'
/// headers too, as loading checks it against their tensors.
pub fn verify_checkpoint_dir(dir: &Path, level: VerifyLevel) -> Vec<FileFailure> {
    match open_checkpoint(dir) {
        Ok(dir) => verify_at(&dir, level),
        Err(f) => vec![f],
    }
}

/// [`verify_checkpoint_dir`] of the checkpoint directory held as `dir`.
pub fn verify_at(dir: &Dir, level: VerifyLevel) -> Vec<FileFailure> {
    let manifest = match read_manifest_at(dir) {
        Err(f) => return vec![f],
        Ok(m) => m,
    };
    if level == VerifyLevel::Quick {
        return manifest.files.iter().filter_map(|e| check_entry(dir, e, level, false).err()).collect();
    }
    let kind = manifest.kind;
    let results = for_each_file(&manifest, |entry| verify_entry_fully(dir, entry, kind));
    let mut failures: Vec<FileFailure> = results.into_iter().filter_map(Result::err).collect();
    if failures.is_empty() && kind == CheckpointKind::Native {
        for stem in super::shards::SHARDED_STEMS {
            if let Some(n) = manifest.shards(stem)
                && let Err(f) = check_index_against_headers(dir, stem, n)
            {
                failures.push(f);
            }
        }
    }
    failures
}

/// `f` of every file of `manifest`, in manifest order, the largest files
/// taken first, on [`file_threads`] threads.
fn for_each_file<R: Send>(manifest: &Manifest, f: impl Fn(&ManifestEntry) -> R + Sync) -> Vec<R> {
    let sizes: Vec<u64> = manifest.files.iter().map(|e| e.bytes).collect();
    in_parallel(&manifest.files, &largest_first(&sizes), file_threads(), f)
}

/// The index of `stem`'s `n` shards against what the shards' headers hold
/// (their hashes matched already): *invalid content* of the index when a
/// tensor is not where it says.
fn check_index_against_headers(dir: &Dir, stem: &str, n: usize) -> Result<(), FileFailure> {
    let name = index_name(stem);
    let invalid = |reason: String| FileFailure { file: name.clone(), problem: Problem::InvalidContent { reason } };
    let bytes = dir
        .read_bounded(&name, MAX_INDEX_BYTES)
        .map_err(|e| FileFailure { file: name.clone(), problem: Problem::Unreadable { reason: e.to_string() } })?;
    let index = ShardIndex::parse(&bytes).map_err(invalid)?;
    let mut held = Vec::with_capacity(n);
    for k in 1..=n {
        let shard = shard_name(stem, k, n);
        let fail = |problem| FileFailure { file: shard.clone(), problem };
        let mut file = dir.open_read(&shard).map_err(|e| fail(Problem::Unreadable { reason: e.to_string() }))?;
        let len = file.metadata().map_err(|e| fail(Problem::Unreadable { reason: e.to_string() }))?.len();
        let layout = safetensors_io::read_layout(&mut file, len).map_err(|e| match e {
            safetensors_io::LayoutError::Invalid(reason) => fail(Problem::InvalidContent { reason }),
            safetensors_io::LayoutError::Io(e) => fail(Problem::Unreadable { reason: e.to_string() }),
        })?;
        held.push((shard.clone(), layout.into_iter().map(|t| (t.name, t.end - t.start)).collect()));
    }
    index.check(&held).map_err(invalid)
}

/// The largest shard index read (about 100 bytes a tensor).
const MAX_INDEX_BYTES: u64 = 64 << 20;

/// Hash, size, and the content check loading would make (layout of a
/// safetensors file, JSON of state.json). A files checkpoint's files are
/// the program's own: only their hashes and sizes are rekindle's to check.
fn verify_entry_fully(dir: &Dir, entry: &ManifestEntry, kind: CheckpointKind) -> Result<(), FileFailure> {
    if kind == CheckpointKind::Files {
        return check_entry(dir, entry, VerifyLevel::Full, false).map(drop);
    }
    let index = parse_index_name(&entry.name).is_some();
    let small = entry.name == STATE_FILE || index;
    let kept = check_entry(dir, entry, VerifyLevel::Full, small)?;
    let invalid =
        |reason: String| FileFailure { file: entry.name.clone(), problem: Problem::InvalidContent { reason } };
    if index {
        ShardIndex::parse(&kept).map_err(invalid)?;
    } else if small {
        serde_json::from_slice::<serde_json::Value>(&kept).map_err(|e| invalid(e.to_string()))?;
    } else if entry.name.ends_with(".safetensors") {
        let unreadable = |e: io::Error| FileFailure {
            file: entry.name.clone(),
            problem: Problem::Unreadable { reason: e.to_string() },
        };
        let mut file = dir.open_read(&entry.name).map_err(unreadable)?;
        safetensors_io::read_layout(&mut file, entry.bytes).map_err(|e| match e {
            safetensors_io::LayoutError::Invalid(reason) => invalid(reason),
            safetensors_io::LayoutError::Io(e) => unreadable(e),
        })?;
    }
    Ok(())
}

/// What a checkpoint directory that cannot be opened as a handle is (a link
/// in its place, gone since it was listed): invalid, and why.
pub(super) fn unopened(dir: PathBuf, step: u64, e: &io::Error) -> CheckpointInfo {
    let reason = e.to_string();
    let failures = vec![FileFailure { file: MANIFEST_FILE.into(), problem: Problem::ManifestUnreadable { reason } }];
    CheckpointInfo { step, dir, created_at: None, bytes: 0, valid: false, failures }
}

/// [`inspect`] of the checkpoint directory held as `dir`.
pub(super) fn inspect_at(dir: &Dir, step: u64, level: VerifyLevel) -> CheckpointInfo {
    let manifest = read_manifest_at(dir).ok();
    let failures = verify_at(dir, level);
    CheckpointInfo {
        step,
        dir: dir.path().to_path_buf(),
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
    load_at(&open_checkpoint(dir).map_err(|f| vec![f])?)
}

/// [`load_dir`] of the checkpoint directory held as `dir`.
pub fn load_at(dir: &Dir) -> Result<Loaded, Vec<FileFailure>> {
    let manifest = read_manifest_at(dir).map_err(|f| vec![f])?;
    if manifest.kind != CheckpointKind::Native {
        let reason = format!("a {} checkpoint has no training state to load", manifest.kind.name());
        return Err(vec![FileFailure { file: MANIFEST_FILE.into(), problem: Problem::InvalidContent { reason } }]);
    }
    let mut contents = BTreeMap::new();
    let mut failures = Vec::new();
    // Files in parallel, each hashed while it is read into its final buffers.
    let results: Vec<(String, Result<Content, FileFailure>)> =
        for_each_file(&manifest, |entry| (entry.name.clone(), load_entry(dir, entry)));
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
    let state: serde_json::Value = match contents.get(STATE_FILE) {
        Some(Content::Bytes(bytes)) => serde_json::from_slice(bytes).map_err(|e| invalid(STATE_FILE, e.to_string()))?,
        _ => return Err(invalid(STATE_FILE, "not read".into())),
    };
    let model = match manifest.shards("model") {
        None => take_tensors(&mut contents, MODEL_FILE)?,
        Some(n) => join_shards(&mut contents, "model", n)?,
    };
    let optimizer = match (manifest.optimizer_parts(), manifest.shards("optimizer")) {
        (Some(world), _) => {
            // Rank order: each moment is its pieces joined in that order.
            let parts = (0..world)
                .map(|r| take_tensors(&mut contents, &optimizer_part_name(r, world)))
                .collect::<Result<Vec<_>, _>>()?;
            assemble(&model, &parts)
                .map_err(|reason| invalid(&format!("optimizer.rank-*-of-{world:05}.safetensors"), reason))?
        }
        (None, Some(n)) => join_shards(&mut contents, "optimizer", n)?,
        (None, None) => take_tensors(&mut contents, OPTIMIZER_FILE)?,
    };
    let step = manifest.step;
    Ok(Loaded { dir: dir.path().to_path_buf(), manifest, snapshot: Snapshot { step, model, optimizer, state } })
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
        std::fs::write(tmp.path().join(MANIFEST_FILE), manifest.to_bytes()).unwrap();
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
