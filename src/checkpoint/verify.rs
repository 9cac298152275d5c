//! Verification and loading: a checkpoint counts only if its manifest lists
//! every required file and each file has the size and SHA-256 the manifest
//! records. Loading reads through the same checks, so a checkpoint that
//! verifies is exactly one that resume would load.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::error::{FileFailure, Problem};
use super::hashed_io::read_hashed;
use super::layout::{MODEL_FILE, OPTIMIZER_FILE, REQUIRED_FILES, STATE_FILE, Snapshot, parse_step_dir_name};
use super::manifest::{MANIFEST_FILE, Manifest, ManifestEntry};
use super::safetensors_io;

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

/// Reads and parses the manifest of `dir`.
pub fn read_manifest(dir: &Path) -> Result<Manifest, FileFailure> {
    let path = dir.join(MANIFEST_FILE);
    let fail = |problem| FileFailure { file: MANIFEST_FILE.into(), problem };
    match fs::symlink_metadata(&path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(fail(Problem::ManifestMissing)),
        Err(e) => return Err(fail(Problem::ManifestUnreadable { reason: e.to_string() })),
        Ok(m) if !m.file_type().is_file() => return Err(fail(Problem::NotPlainFile)),
        Ok(_) => {}
    }
    let bytes = fs::read(&path).map_err(|e| fail(Problem::ManifestUnreadable { reason: e.to_string() }))?;
    let manifest = Manifest::parse(&bytes)?;
    for required in REQUIRED_FILES {
        if !manifest.files.iter().any(|f| f.name == required) {
            return Err(fail(Problem::ManifestInvalid { reason: format!("does not list `{required}`") }));
        }
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
    if level == VerifyLevel::Quick {
        return Ok(Vec::new());
    }
    let (bytes, sha256, kept) =
        read_hashed(&path, keep).map_err(|e| fail(Problem::Unreadable { reason: e.to_string() }))?;
    if bytes != entry.bytes {
        return Err(fail(Problem::WrongSize { expected: entry.bytes, actual: bytes }));
    }
    if sha256 != entry.sha256.to_ascii_lowercase() {
        return Err(fail(Problem::Sha256Mismatch { expected: entry.sha256.clone(), actual: sha256 }));
    }
    Ok(kept)
}

/// Verifies one checkpoint directory; an empty list means it is valid.
///
/// `Full` checks exactly what loading checks (every hash, and that the
/// safetensors and JSON files parse), so a checkpoint that verifies is one
/// that resume would load.
///
/// Files are checked in parallel, each hashed while it is read, without
/// keeping the bytes (nothing is allocated for the tensor data).
pub fn verify_checkpoint_dir(dir: &Path, level: VerifyLevel) -> Vec<FileFailure> {
    let manifest = match read_manifest(dir) {
        Err(f) => return vec![f],
        Ok(m) => m,
    };
    if level == VerifyLevel::Quick {
        return manifest.files.iter().filter_map(|e| check_entry(dir, e, level, false).err()).collect();
    }
    let results: Vec<Result<(), FileFailure>> = std::thread::scope(|scope| {
        let handles: Vec<_> =
            manifest.files.iter().map(|entry| scope.spawn(move || verify_entry_fully(dir, entry))).collect();
        handles.into_iter().map(|h| h.join().expect("verify thread does not panic")).collect()
    });
    results.into_iter().filter_map(Result::err).collect()
}

/// Hash, size, and the content check loading would make (layout of a
/// safetensors file, JSON of state.json).
fn verify_entry_fully(dir: &Path, entry: &ManifestEntry) -> Result<(), FileFailure> {
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
        let mut file = File::open(dir.join(&entry.name)).map_err(unreadable)?;
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
pub fn load_dir(dir: &Path) -> Result<Loaded, Vec<FileFailure>> {
    let manifest = read_manifest(dir).map_err(|f| vec![f])?;
    let mut contents = BTreeMap::new();
    let mut failures = Vec::new();
    // Files in parallel, each hashed while it is read into its final buffer.
    let results: Vec<(String, Result<Vec<u8>, FileFailure>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = manifest
            .files
            .iter()
            .map(|entry| (entry.name.clone(), scope.spawn(move || check_entry(dir, entry, VerifyLevel::Full, true))))
            .collect();
        handles.into_iter().map(|(n, h)| (n, h.join().expect("load thread does not panic"))).collect()
    });
    for (name, result) in results {
        match result {
            Ok(bytes) => {
                contents.insert(name, bytes);
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
    let model = safetensors_io::read(&contents[MODEL_FILE]).map_err(|r| invalid(MODEL_FILE, r))?;
    let optimizer = safetensors_io::read(&contents[OPTIMIZER_FILE]).map_err(|r| invalid(OPTIMIZER_FILE, r))?;
    let state: serde_json::Value =
        serde_json::from_slice(&contents[STATE_FILE]).map_err(|e| invalid(STATE_FILE, e.to_string()))?;
    let step = manifest.step;
    Ok(Loaded { dir: dir.to_path_buf(), manifest, snapshot: Snapshot { step, model, optimizer, state } })
}
