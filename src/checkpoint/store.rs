//! The checkpoint store: the commit protocol that makes a checkpoint either
//! fully there or not there at all, rotation, verification and loading.
//!
//! Commit protocol (see docs/checkpoint-format.md):
//! 1. check free space against the exact bytes to be written;
//! 2. write every file into a temporary sibling `.tmp-step-…` inside the
//!    checkpoints directory, hashing the bytes as they are written;
//! 3. fsync each file; write `MANIFEST.json` last and fsync it; fsync the
//!    temporary directory;
//! 4. rename it to `step-<10 digits>` and fsync the checkpoints directory;
//! 5. rotate: old checkpoints are first renamed to `.trash-…` (atomic), then
//!    removed, so a crash mid-delete never leaves a half checkpoint behind.
//!
//! A directory without a valid manifest is never a checkpoint; leftovers of
//! interrupted saves and deletes are removed when the store is opened.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::error::{CheckpointError, FileFailure, Problem};
use super::manifest::{FORMAT_VERSION, MANIFEST_FILE, Manifest, ManifestEntry};
use super::rotation::{self, Action, Candidate};
use super::safetensors_io;
use super::tensor::{TensorSet, payload_bytes};

/// Parameters by name.
pub const MODEL_FILE: &str = "model.safetensors";
/// Optimizer state by parameter name.
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
/// Step, cursor, RNG, scaler, schedule, metrics, host/job info.
pub const STATE_FILE: &str = "state.json";
/// The files every format-1 checkpoint holds besides its manifest.
pub const REQUIRED_FILES: [&str; 3] = [MODEL_FILE, OPTIMIZER_FILE, STATE_FILE];

const TMP_PREFIX: &str = ".tmp-";
const TRASH_PREFIX: &str = ".trash-";
const STEP_PREFIX: &str = "step-";
const IO_BUFFER: usize = 8 << 20;
/// Slack on top of the exact file sizes for the manifest and filesystem metadata.
const SPACE_SLACK: u64 = 1 << 20;

/// Everything a checkpoint holds, in host memory.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    pub step: u64,
    pub model: TensorSet,
    pub optimizer: TensorSet,
    /// Everything that is not a tensor; written as `state.json`.
    pub state: serde_json::Value,
}

impl Snapshot {
    /// Tensor payload bytes (what dominates the checkpoint's size).
    pub fn payload_bytes(&self) -> u64 {
        payload_bytes(&self.model) + payload_bytes(&self.optimizer)
    }
}

/// What a successful save did.
#[derive(Debug, Clone, Serialize)]
pub struct SaveReport {
    pub step: u64,
    pub dir: PathBuf,
    /// Bytes written (all files including the manifest).
    pub bytes: u64,
    /// Seconds from the first byte to the durable rename.
    pub seconds: f64,
    /// True when a valid checkpoint of this step already existed and was kept.
    pub already_existed: bool,
    /// Checkpoints removed by rotation.
    pub rotated_out: Vec<PathBuf>,
}

/// How thoroughly [`CheckpointStore::list`] checks each checkpoint.
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

/// The result of looking for the newest valid checkpoint.
#[derive(Debug, Clone)]
pub struct LoadOutcome {
    /// The newest checkpoint that verified, if any.
    pub loaded: Option<Loaded>,
    /// Newer checkpoints that failed, newest first, with the reasons.
    pub rejected: Vec<CheckpointInfo>,
}

/// A checkpoints directory and its rotation policy.
#[derive(Debug, Clone)]
pub struct CheckpointStore {
    dir: PathBuf,
    keep: usize,
}

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

impl CheckpointStore {
    /// Opens (creating if needed) a checkpoints directory and removes leftovers
    /// of interrupted saves and deletes, logging each one. Only the process that
    /// owns the run directory may open its store for writing.
    pub fn open(dir: impl Into<PathBuf>, keep: usize) -> Result<CheckpointStore, CheckpointError> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(|source| CheckpointError::CreateDir { path: dir.clone(), source })?;
        let store = CheckpointStore { dir, keep: keep.max(1) };
        for leftover in store.leftovers()? {
            tracing::warn!(path = %leftover.display(), "removing leftover of an interrupted checkpoint save or delete");
            fs::remove_dir_all(&leftover)
                .map_err(|source| CheckpointError::Remove { path: leftover.clone(), source })?;
        }
        Ok(store)
    }

    /// A read-only view of a checkpoints directory: nothing is created or removed.
    pub fn open_read_only(dir: impl Into<PathBuf>) -> CheckpointStore {
        CheckpointStore { dir: dir.into(), keep: usize::MAX }
    }

    /// The checkpoints directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The directory a checkpoint of `step` is committed to.
    pub fn step_dir(&self, step: u64) -> PathBuf {
        self.dir.join(step_dir_name(step))
    }

    fn leftovers(&self) -> Result<Vec<PathBuf>, CheckpointError> {
        let mut out = Vec::new();
        for entry in self.read_dir()? {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(TMP_PREFIX) || name.starts_with(TRASH_PREFIX) {
                out.push(entry.path());
            }
        }
        Ok(out)
    }

    fn read_dir(&self) -> Result<Vec<fs::DirEntry>, CheckpointError> {
        let list_err = |source| CheckpointError::ListDir { path: self.dir.clone(), source };
        let mut entries = Vec::new();
        for entry in fs::read_dir(&self.dir).map_err(list_err)? {
            entries.push(entry.map_err(list_err)?);
        }
        Ok(entries)
    }

    /// Commits `snapshot` durably, then rotates old checkpoints out.
    ///
    /// On any error the partial temporary directory is removed and every
    /// committed checkpoint is left untouched.
    pub fn save(&self, snapshot: &Snapshot) -> Result<SaveReport, CheckpointError> {
        let started = Instant::now();
        let step = snapshot.step;
        let final_dir = self.step_dir(step);
        if final_dir.exists() && verify_checkpoint_dir(&final_dir, VerifyLevel::Full).is_empty() {
            // Deterministic training: the same step holds the same state, so an
            // existing valid checkpoint is as good as a new one.
            tracing::info!(step, dir = %final_dir.display(), "checkpoint of this step already exists and verifies; keeping it");
            return Ok(SaveReport {
                step,
                dir: final_dir,
                bytes: 0,
                seconds: started.elapsed().as_secs_f64(),
                already_existed: true,
                rotated_out: Vec::new(),
            });
        }

        let files = self.encode(snapshot)?;
        let needed: u64 = files.iter().map(|f| f.size).sum::<u64>() + SPACE_SLACK;
        let available = available_space(&self.dir).map_err(|source| CheckpointError::Write {
            step,
            path: self.dir.clone(),
            source,
        })?;
        if available < needed {
            return Err(CheckpointError::NoSpace { step, path: self.dir.clone(), needed, available });
        }

        let tmp = self.dir.join(format!(
            "{TMP_PREFIX}{}-{}-{}",
            step_dir_name(step),
            std::process::id(),
            TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        match self.write_and_commit(snapshot, &files, &tmp, &final_dir) {
            Ok(bytes) => {
                let rotated_out = self.rotate().map_err(|e| CheckpointError::AfterCommit {
                    step,
                    dir: final_dir.clone(),
                    stage: "rotating out old checkpoints",
                    source: Box::new(e),
                })?;
                Ok(SaveReport {
                    step,
                    dir: final_dir,
                    bytes,
                    seconds: started.elapsed().as_secs_f64(),
                    already_existed: false,
                    rotated_out,
                })
            }
            Err(e) => {
                if tmp.exists()
                    && let Err(rm) = fs::remove_dir_all(&tmp)
                {
                    tracing::warn!(path = %tmp.display(), error = %rm, "could not remove partial checkpoint; it will be removed at the next start");
                }
                Err(e)
            }
        }
    }

    /// Sizes and encoders of the files of a snapshot, in write order.
    fn encode<'a>(&self, snapshot: &'a Snapshot) -> Result<Vec<PlannedFile<'a>>, CheckpointError> {
        let state = serde_json::to_vec_pretty(&snapshot.state).map_err(|e| CheckpointError::BadTensor {
            step: snapshot.step,
            name: STATE_FILE.into(),
            reason: e.to_string(),
        })?;
        let mut planned = Vec::new();
        for (name, set) in [(MODEL_FILE, &snapshot.model), (OPTIMIZER_FILE, &snapshot.optimizer)] {
            for (tname, t) in set {
                let elems: usize = t.shape.iter().product();
                if elems * t.dtype.size() != t.data.len() {
                    return Err(CheckpointError::BadTensor {
                        step: snapshot.step,
                        name: tname.clone(),
                        reason: format!("shape {:?} does not match {} data bytes", t.shape, t.data.len()),
                    });
                }
            }
            let meta = safetensors_metadata(name, snapshot.step);
            let size = safetensors_io::file_size(set, &meta);
            planned.push(PlannedFile { name, size, content: Content::Tensors(set, meta) });
        }
        planned.push(PlannedFile { name: STATE_FILE, size: state.len() as u64, content: Content::Bytes(state) });
        Ok(planned)
    }

    fn write_and_commit(
        &self,
        snapshot: &Snapshot,
        files: &[PlannedFile<'_>],
        tmp: &Path,
        final_dir: &Path,
    ) -> Result<u64, CheckpointError> {
        let step = snapshot.step;
        let werr = |path: &Path| {
            let path = path.to_path_buf();
            move |source| CheckpointError::Write { step, path, source }
        };
        fs::create_dir(tmp).map_err(werr(tmp))?;
        // Files are written (and hashed) in parallel: SHA-256 of one stream
        // runs on one core, so separate files are what lets hashing use more.
        let results: Vec<Result<ManifestEntry, CheckpointError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = files
                .iter()
                .map(|file| {
                    let path = tmp.join(file.name);
                    scope.spawn(move || -> Result<ManifestEntry, CheckpointError> {
                        failpoint(&format!("checkpoint::before_write::{}", file.name))?;
                        let (bytes, sha256) = match &file.content {
                            Content::Tensors(set, meta) => {
                                let header = safetensors_io::header(set, meta);
                                let mut parts: Vec<&[u8]> = vec![&header];
                                parts.extend(set.values().map(|t| t.data.as_slice()));
                                write_hashed(&path, &parts)
                            }
                            Content::Bytes(b) => write_hashed(&path, &[b]),
                        }
                        .map_err(werr(&path))?;
                        Ok(ManifestEntry { name: file.name.to_string(), bytes, sha256 })
                    })
                })
                .collect();
            // A panic in a writer (a simulated crash) propagates like one.
            handles.into_iter().map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
        });
        let mut entries = Vec::new();
        for r in results {
            entries.push(r?);
        }
        let manifest = Manifest {
            format_version: FORMAT_VERSION,
            step,
            created_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            rekindle_version: env!("CARGO_PKG_VERSION").to_string(),
            files: entries,
        };
        failpoint("checkpoint::before_manifest")?;
        let manifest_path = tmp.join(MANIFEST_FILE);
        let (manifest_bytes, _) =
            write_hashed(&manifest_path, &[&manifest.to_bytes()]).map_err(werr(&manifest_path))?;
        fsync_dir(tmp).map_err(werr(tmp))?;
        failpoint("checkpoint::before_rename")?;

        if final_dir.exists() {
            // An invalid checkpoint of the same step (a valid one was kept
            // above): move it aside atomically, then remove it.
            let trash = self.trash_path(step);
            tracing::warn!(dir = %final_dir.display(), "replacing an invalid checkpoint of the same step");
            fs::rename(final_dir, &trash).map_err(werr(final_dir))?;
            fs::rename(tmp, final_dir).map_err(werr(final_dir))?;
            fsync_dir(&self.dir).map_err(werr(&self.dir))?;
            fs::remove_dir_all(&trash).map_err(|source| CheckpointError::Remove { path: trash, source })?;
        } else {
            fs::rename(tmp, final_dir).map_err(werr(final_dir))?;
            let after = |e| CheckpointError::AfterCommit {
                step,
                dir: final_dir.to_path_buf(),
                stage: "syncing the checkpoints directory",
                source: Box::new(e),
            };
            failpoint("checkpoint::after_rename").map_err(after)?;
            fsync_dir(&self.dir).map_err(werr(&self.dir)).map_err(after)?;
        }
        failpoint("checkpoint::after_commit").map_err(|e| CheckpointError::AfterCommit {
            step,
            dir: final_dir.to_path_buf(),
            stage: "the commit's last step",
            source: Box::new(e),
        })?;
        Ok(manifest.total_bytes() + manifest_bytes)
    }

    fn trash_path(&self, step: u64) -> PathBuf {
        self.dir.join(format!(
            "{TRASH_PREFIX}{}-{}-{}",
            step_dir_name(step),
            std::process::id(),
            TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        ))
    }

    /// Applies the rotation plan: deletes what the pure planner says, each
    /// checkpoint first renamed aside so it disappears atomically.
    fn rotate(&self) -> Result<Vec<PathBuf>, CheckpointError> {
        let infos = self.list(VerifyLevel::Quick)?;
        let candidates: Vec<Candidate> = infos.iter().map(|i| Candidate { step: i.step, valid: i.valid }).collect();
        let mut removed = Vec::new();
        for action in rotation::plan(&candidates, self.keep) {
            if let Action::Delete { step, reason } = action {
                failpoint("checkpoint::rotation_delete")?;
                let dir = self.step_dir(step);
                let trash = self.trash_path(step);
                tracing::info!(step, ?reason, dir = %dir.display(), "rotating out checkpoint");
                fs::rename(&dir, &trash).map_err(|source| CheckpointError::Remove { path: dir.clone(), source })?;
                fsync_dir(&self.dir).map_err(|source| CheckpointError::Remove { path: dir.clone(), source })?;
                // Renamed aside but not yet removed: a crash here must leave only a leftover.
                failpoint("checkpoint::rotation_trashed")?;
                fs::remove_dir_all(&trash).map_err(|source| CheckpointError::Remove { path: trash, source })?;
                removed.push(dir);
            }
        }
        Ok(removed)
    }

    /// Every `step-*` checkpoint directory, newest first, with verification results.
    pub fn list(&self, level: VerifyLevel) -> Result<Vec<CheckpointInfo>, CheckpointError> {
        let mut infos = Vec::new();
        for entry in self.read_dir()? {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(step) = parse_step_dir_name(&name) else { continue };
            infos.push(inspect(&entry.path(), step, level));
        }
        infos.sort_by_key(|i| std::cmp::Reverse(i.step));
        Ok(infos)
    }

    /// Loads the newest checkpoint that verifies completely (every hash and
    /// every file parses). Newer ones that fail are returned with the reasons.
    pub fn load_latest(&self) -> Result<LoadOutcome, CheckpointError> {
        let mut rejected = Vec::new();
        if !self.dir.exists() {
            return Ok(LoadOutcome { loaded: None, rejected });
        }
        for info in self.list(VerifyLevel::Quick)? {
            let attempt = if info.valid { load_dir(&info.dir) } else { Err(info.failures.clone()) };
            match attempt {
                Ok(loaded) => return Ok(LoadOutcome { loaded: Some(loaded), rejected }),
                Err(failures) => {
                    tracing::warn!(dir = %info.dir.display(), failures = %join(&failures), "checkpoint does not verify; falling back to an older one");
                    rejected.push(CheckpointInfo { valid: false, failures, ..info });
                }
            }
        }
        Ok(LoadOutcome { loaded: None, rejected })
    }
}

enum Content<'a> {
    Tensors(&'a TensorSet, BTreeMap<String, String>),
    Bytes(Vec<u8>),
}

struct PlannedFile<'a> {
    name: &'static str,
    size: u64,
    content: Content<'a>,
}

fn safetensors_metadata(file: &str, step: u64) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("format".to_string(), "rekindle".to_string()),
        ("content".to_string(), file.trim_end_matches(".safetensors").to_string()),
        ("step".to_string(), step.to_string()),
    ])
}

fn failpoint(name: &str) -> Result<(), CheckpointError> {
    let _ = name; // unused when failpoints are compiled out
    fail::fail_point!(name, |_| Err(CheckpointError::Injected(name.to_string())));
    Ok(())
}

fn join(failures: &[FileFailure]) -> String {
    failures.iter().map(|f| f.to_string()).collect::<Vec<_>>().join("; ")
}

/// `step-0000001234`.
pub fn step_dir_name(step: u64) -> String {
    format!("{STEP_PREFIX}{step:010}")
}

/// The step of a `step-<digits>` directory name.
pub fn parse_step_dir_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(STEP_PREFIX)?;
    (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())).then(|| digits.parse().ok()).flatten()
}

/// Creates `path`, writes `parts` into it straight from their memory while a
/// second thread hashes the same bytes, and fsyncs it. Hashing costs about as
/// much CPU as the write, so running them side by side makes a save take the
/// longer of the two instead of their sum; nothing is copied and nothing is
/// read back. Returns (bytes, hex sha256).
fn write_hashed(path: &Path, parts: &[&[u8]]) -> io::Result<(u64, String)> {
    let mut file = File::options().write(true).create_new(true).open(path)?;
    let total: u64 = parts.iter().map(|p| p.len() as u64).sum();
    let digest = std::thread::scope(|scope| -> io::Result<String> {
        let hasher = scope.spawn(|| {
            let mut h = Sha256::new();
            for part in parts {
                for chunk in part.chunks(HASH_CHUNK) {
                    h.update(chunk);
                }
            }
            hex::encode(h.finalize())
        });
        let written =
            parts.iter().try_for_each(|part| part.chunks(IO_BUFFER).try_for_each(|chunk| file.write_all(chunk)));
        let digest = hasher.join().expect("hashing thread does not panic");
        written.map(|()| digest)
    })?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    fail_io(&format!("checkpoint::before_fsync::{name}"))?;
    file.sync_all()?;
    fail_io(&format!("checkpoint::after_fsync::{name}"))?;
    Ok((total, digest))
}

/// Bytes hashed per `update` call (keeps the hasher's working set in cache).
const HASH_CHUNK: usize = 1 << 20;

/// A failpoint inside I/O code: its injected error is an `EIO`.
fn fail_io(name: &str) -> io::Result<()> {
    let _ = name; // unused when failpoints are compiled out
    fail::fail_point!(name, |arg: Option<String>| {
        let code = match arg.as_deref() {
            Some("ENOSPC") => nix::libc::ENOSPC,
            Some("EACCES") => nix::libc::EACCES,
            Some("EROFS") => nix::libc::EROFS,
            _ => nix::libc::EIO,
        };
        Err(io::Error::from_raw_os_error(code))
    });
    Ok(())
}

fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

fn available_space(dir: &Path) -> io::Result<u64> {
    let st = nix::sys::statvfs::statvfs(dir).map_err(io::Error::from)?;
    Ok(st.blocks_available() as u64 * st.fragment_size() as u64)
}

/// Reads a file and hashes it on the same pass: a second thread hashes each
/// chunk as soon as it is read, so reading and hashing overlap. With `keep`
/// the bytes are returned (read straight into their final buffer); without,
/// two buffers alternate. Returns (bytes, hex sha256, kept bytes).
fn read_hashed(path: &Path, keep: bool) -> io::Result<(u64, String, Vec<u8>)> {
    let mut file = File::open(path)?;
    let len = file.metadata()?.len() as usize;
    if keep {
        let mut buf = vec![0u8; len];
        let (total, digest) = std::thread::scope(|scope| -> io::Result<(u64, String)> {
            // The reader fills disjoint chunks in order and hands each filled
            // chunk, now read-only, to the hasher.
            let (tx, rx) = std::sync::mpsc::sync_channel::<&[u8]>(4);
            let hasher = scope.spawn(move || {
                let mut h = Sha256::new();
                for chunk in rx {
                    h.update(chunk);
                }
                hex::encode(h.finalize())
            });
            let mut total = 0u64;
            let mut result = Ok(());
            for chunk in buf.chunks_mut(IO_BUFFER) {
                match read_full(&mut file, chunk) {
                    Ok(n) => {
                        total += n as u64;
                        let filled: &[u8] = chunk;
                        let _ = tx.send(&filled[..n]);
                        if n < filled.len() {
                            break;
                        }
                    }
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                }
            }
            drop(tx);
            let digest = hasher.join().expect("hashing thread does not panic");
            result.map(|()| (total, digest))
        })?;
        buf.truncate(total as usize);
        // A file that grew since stat: hash and keep the rest too.
        let mut rest = Vec::new();
        file.read_to_end(&mut rest)?;
        if !rest.is_empty() {
            buf.extend_from_slice(&rest);
            let digest = hex::encode(Sha256::digest(&buf));
            return Ok((buf.len() as u64, digest, buf));
        }
        return Ok((total, digest, buf));
    }
    let mut hasher = Sha256::new();
    let mut total = 0u64;
    let mut bufs = [vec![0u8; IO_BUFFER], vec![0u8; IO_BUFFER]];
    let mut current = 0;
    let mut pending: Option<usize> = None;
    loop {
        let (a, b) = bufs.split_at_mut(1);
        let (fill_buf, hash_buf) = if current == 0 { (&mut a[0], &b[0]) } else { (&mut b[0], &a[0]) };
        let n = std::thread::scope(|scope| {
            let h = &mut hasher;
            let handle = pending.map(|m| scope.spawn(move || h.update(&hash_buf[..m])));
            let n = read_full(&mut file, fill_buf);
            if let Some(handle) = handle {
                handle.join().expect("hashing thread does not panic");
            }
            n
        })?;
        if n == 0 {
            break;
        }
        total += n as u64;
        pending = Some(n);
        current = 1 - current;
    }
    Ok((total, hex::encode(hasher.finalize()), Vec::new()))
}

/// Reads until `buf` is full or the file ends; returns the bytes read.
fn read_full(file: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
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
        let mut prefix = [0u8; 8];
        file.read_exact(&mut prefix).map_err(|_| invalid("shorter than a safetensors header".into()))?;
        let n = safetensors_io::header_len(&prefix);
        if n > entry.bytes.saturating_sub(8) || n > 100 << 20 {
            return Err(invalid(format!("header length {n} does not fit the file")));
        }
        let mut header = vec![0u8; n as usize];
        file.read_exact(&mut header).map_err(unreadable)?;
        safetensors_io::check_layout(&header, entry.bytes).map_err(invalid)?;
    }
    Ok(())
}

fn inspect(dir: &Path, step: u64, level: VerifyLevel) -> CheckpointInfo {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::tensor::HostTensor;

    fn snapshot(step: u64) -> Snapshot {
        let mut model = TensorSet::new();
        model.insert("layer.weight".into(), HostTensor::from_f32(vec![2, 3], &[step as f32, 1.0, 2.0, 3.0, 4.0, 5.0]));
        let mut optimizer = TensorSet::new();
        optimizer.insert("layer.weight.m".into(), HostTensor::from_f32(vec![2], &[0.5, step as f32]));
        Snapshot { step, model, optimizer, state: serde_json::json!({"step": step, "cursor": [0, step]}) }
    }

    #[test]
    fn saved_checkpoint_loads_back_identically() {
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(tmp.path().join("checkpoints"), 3).unwrap();
        let report = store.save(&snapshot(7)).unwrap();
        assert_eq!(report.dir, store.step_dir(7));
        assert!(report.bytes > 0);
        let outcome = store.load_latest().unwrap();
        assert!(outcome.rejected.is_empty());
        assert_eq!(outcome.loaded.unwrap().snapshot, snapshot(7));
    }

    #[test]
    fn keeps_last_three_valid_checkpoints() {
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(tmp.path(), 3).unwrap();
        for step in 1..=5 {
            store.save(&snapshot(step)).unwrap();
        }
        let steps: Vec<u64> = store.list(VerifyLevel::Full).unwrap().iter().map(|i| i.step).collect();
        assert_eq!(steps, vec![5, 4, 3]);
    }

    #[test]
    fn keeps_last_valid_checkpoint_when_newest_is_corrupt() {
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(tmp.path(), 3).unwrap();
        store.save(&snapshot(1)).unwrap();
        store.save(&snapshot(2)).unwrap();
        let model = store.step_dir(2).join(MODEL_FILE);
        let mut bytes = fs::read(&model).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x01;
        fs::write(&model, bytes).unwrap();
        let outcome = store.load_latest().unwrap();
        assert_eq!(outcome.loaded.unwrap().snapshot.step, 1);
        assert_eq!(outcome.rejected.len(), 1);
        assert!(matches!(outcome.rejected[0].failures[0].problem, Problem::Sha256Mismatch { .. }));
        assert_eq!(outcome.rejected[0].failures[0].file, MODEL_FILE);
    }

    #[test]
    fn directory_without_manifest_is_not_a_checkpoint() {
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(tmp.path(), 3).unwrap();
        store.save(&snapshot(1)).unwrap();
        fs::create_dir(store.step_dir(9)).unwrap();
        let infos = store.list(VerifyLevel::Full).unwrap();
        assert_eq!(infos[0].step, 9);
        assert_eq!(infos[0].failures[0].problem, Problem::ManifestMissing);
        assert_eq!(store.load_latest().unwrap().loaded.unwrap().snapshot.step, 1);
    }

    #[test]
    fn leftover_temporary_directories_are_removed_at_open() {
        let tmp = tempfile::tempdir().unwrap();
        let partial = tmp.path().join(".tmp-step-0000000003-1-0");
        fs::create_dir_all(&partial).unwrap();
        fs::write(partial.join(MODEL_FILE), b"half").unwrap();
        let trash = tmp.path().join(".trash-step-0000000001-1-0");
        fs::create_dir_all(&trash).unwrap();
        CheckpointStore::open(tmp.path(), 3).unwrap();
        assert!(!partial.exists() && !trash.exists());
    }

    #[test]
    fn resaving_a_valid_step_keeps_the_existing_checkpoint() {
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(tmp.path(), 3).unwrap();
        store.save(&snapshot(4)).unwrap();
        let again = store.save(&snapshot(4)).unwrap();
        assert!(again.already_existed);
    }

    #[test]
    fn resaving_over_an_invalid_checkpoint_of_the_same_step_replaces_it() {
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(tmp.path(), 3).unwrap();
        store.save(&snapshot(4)).unwrap();
        fs::remove_file(store.step_dir(4).join(STATE_FILE)).unwrap();
        let again = store.save(&snapshot(4)).unwrap();
        assert!(!again.already_existed);
        assert!(verify_checkpoint_dir(&store.step_dir(4), VerifyLevel::Full).is_empty());
    }

    #[test]
    fn symlinked_file_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(tmp.path().join("c"), 3).unwrap();
        store.save(&snapshot(1)).unwrap();
        let state = store.step_dir(1).join(STATE_FILE);
        let outside = tmp.path().join("outside.json");
        fs::rename(&state, &outside).unwrap();
        std::os::unix::fs::symlink(&outside, &state).unwrap();
        let failures = verify_checkpoint_dir(&store.step_dir(1), VerifyLevel::Full);
        assert_eq!(failures, vec![FileFailure { file: STATE_FILE.into(), problem: Problem::NotPlainFile }]);
    }

    #[test]
    fn step_dir_names_round_trip() {
        assert_eq!(step_dir_name(1234), "step-0000001234");
        assert_eq!(parse_step_dir_name("step-0000001234"), Some(1234));
        assert_eq!(parse_step_dir_name("step-"), None);
        assert_eq!(parse_step_dir_name("step-12a"), None);
        assert_eq!(parse_step_dir_name(".tmp-step-1"), None);
    }
}
