//! Errors of the checkpoint store, and the reasons a checkpoint fails to verify.

use std::io;
use std::path::PathBuf;

use serde::Serialize;

/// Why one file of a checkpoint (or its manifest) does not verify.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[serde(tag = "problem", rename_all = "snake_case")]
pub enum Problem {
    #[error("missing")]
    Missing,
    #[error("wrong size: manifest says {expected} bytes, file has {actual}")]
    WrongSize { expected: u64, actual: u64 },
    #[error("sha256 mismatch: manifest says {expected}, file hashes to {actual}")]
    Sha256Mismatch { expected: String, actual: String },
    #[error("unreadable: {reason}")]
    Unreadable { reason: String },
    #[error("not a plain file (symlinks and directories are refused)")]
    NotPlainFile,
    #[error("path outside the checkpoint: `{name}` (only plain names inside the checkpoint directory are allowed)")]
    PathOutside { name: String },
    #[error("manifest missing: the directory was never committed")]
    ManifestMissing,
    #[error("manifest unreadable: {reason}")]
    ManifestUnreadable { reason: String },
    #[error("manifest invalid: {reason}")]
    ManifestInvalid { reason: String },
    #[error("unknown format version {found} (this rekindle reads versions 1 to {supported}); use a newer rekindle")]
    UnknownFormatVersion { found: u64, supported: u64 },
    #[error("invalid content: {reason}")]
    InvalidContent { reason: String },
}

/// One verification failure: which file, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FileFailure {
    /// File name relative to the checkpoint directory (`MANIFEST.json` for manifest problems).
    pub file: String,
    #[serde(flatten)]
    pub problem: Problem,
}

impl std::fmt::Display for FileFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.file, self.problem)
    }
}

/// Errors of saving, listing and loading checkpoints.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The checkpoints directory is not rekindle's to use (`crate::confine::claim_dir`).
    #[error(transparent)]
    Claim(#[from] crate::confine::ClaimError),
    #[error("cannot create checkpoint directory {path}: {source}; check that the parent exists and is writable")]
    CreateDir { path: PathBuf, source: io::Error },
    #[error("cannot list checkpoint directory {path}: {source}")]
    ListDir { path: PathBuf, source: io::Error },
    #[error(
        "not enough free space for checkpoint of step {step} in {path}: need about {needed} bytes, {available} available; free space or point [checkpoint] dir elsewhere (earlier checkpoints are untouched)"
    )]
    NoSpace { step: u64, path: PathBuf, needed: u64, available: u64 },
    #[error(
        "writing checkpoint of step {step} failed at {path}: {source}{hint}; the partial checkpoint was removed and earlier checkpoints are untouched",
        hint = io_hint(source)
    )]
    Write { step: u64, path: PathBuf, source: io::Error },
    #[error(
        "cannot move the invalid checkpoint of step {step} at {dir} aside to {to} to replace it: {source}{hint}; \
         the new checkpoint of step {step} was not committed (its temporary directory was removed), the invalid \
         one stays where it is (it is never loaded) and earlier checkpoints are untouched",
        hint = io_hint(source)
    )]
    ReplaceMoveAside { step: u64, dir: PathBuf, to: PathBuf, source: io::Error },
    #[error(
        "cannot rename the new checkpoint of step {step} into {dir}: {source}{hint}; it was not committed (its \
         temporary directory was removed) and earlier checkpoints are untouched; the invalid checkpoint it was to \
         replace had been moved aside to {aside}, which the next start removes",
        hint = io_hint(source)
    )]
    ReplaceRename { step: u64, dir: PathBuf, aside: PathBuf, source: io::Error },
    #[error("cannot sync directory {path}: {source}{hint}", hint = io_hint(source))]
    SyncDir { path: PathBuf, source: io::Error },
    #[error(
        "cannot move the damaged checkpoint {dir} aside to {to}: {source}{hint}; it stays where it is, is never \
         loaded, and rotation counts it invalid (and may delete it) until a save of its step replaces it; move it \
         out of the checkpoints directory yourself to keep it for inspection",
        hint = io_hint(source)
    )]
    Quarantine { dir: PathBuf, to: PathBuf, source: io::Error },
    #[error("checkpoint of step {step}: tensor `{name}` is invalid: {reason}")]
    BadTensor { step: u64, name: String, reason: String },
    #[error("checkpoint {path} does not verify: {}", join_failures(failures))]
    Invalid { path: PathBuf, failures: Vec<FileFailure> },
    #[error("{path} is neither a checkpoint directory (no MANIFEST.json) nor a run or checkpoints directory")]
    NotACheckpoint { path: PathBuf },
    #[error("cannot remove {path}: {source}")]
    Remove { path: PathBuf, source: io::Error },
    #[error(
        "refused to commit the checkpoint of step {step}: {reason}; a checkpoint is committed only while this \
         process provably owns the run directory (its lock), so nothing was committed and the staged files were \
         removed"
    )]
    NotOwner { step: u64, reason: String },
    #[error("{}", wrong_kind(dir, *found))]
    WrongKind { dir: PathBuf, found: super::layout::CheckpointKind },
    #[error("cannot seal {dir} as the checkpoint of step {step}: {reason}")]
    Seal { dir: PathBuf, step: u64, reason: String },
    #[error(
        "checkpoint of step {step}: the optimizer parts of the other ranks: {reason}; nothing was committed (the \
         staging directory every rank wrote into is removed) and earlier checkpoints are untouched"
    )]
    Parts { step: u64, reason: String },
    #[error(
        "world checkpoint of step {step}: {reason}; nothing was committed (every rank's part is removed) and \
         earlier checkpoints are untouched"
    )]
    World { step: u64, reason: String },
    #[error("failpoint {0} injected an error")]
    Injected(String),
    #[error(
        "checkpoint of step {step} is committed at {dir}, but {stage} failed afterwards: {source}; \
         it verifies and loads normally, and earlier checkpoints are untouched"
    )]
    AfterCommit { step: u64, dir: PathBuf, stage: &'static str, source: Box<CheckpointError> },
}

impl CheckpointError {
    /// True when the checkpoint was nevertheless committed (the error came
    /// from syncing the parent directory or from rotation).
    pub fn committed(&self) -> bool {
        matches!(self, CheckpointError::AfterCommit { .. })
    }

    /// True when the save was refused because this process no longer owns
    /// the run directory (also when only rotation was refused after the commit).
    pub fn not_owner(&self) -> bool {
        match self {
            CheckpointError::NotOwner { .. } => true,
            CheckpointError::AfterCommit { source, .. } => source.not_owner(),
            _ => false,
        }
    }
}

fn wrong_kind(dir: &std::path::Path, found: super::layout::CheckpointKind) -> String {
    use super::layout::CheckpointKind;
    let dir = dir.display();
    match found {
        CheckpointKind::Files => format!(
            "checkpoint {dir} holds a program's own files, sealed under `rekindle exec`, not rekindle's training \
             state: `rekindle run` cannot resume from it; continue this run directory with `rekindle exec`, or \
             give `rekindle run` another one (--run-dir)"
        ),
        CheckpointKind::Native => format!(
            "checkpoint {dir} holds rekindle's own training state, written by `rekindle run`: `rekindle exec` \
             hands a program only checkpoints it sealed itself; continue this run directory with `rekindle run`, \
             or give `rekindle exec` another one (--run-dir)"
        ),
    }
}

fn io_hint(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc_enospc) if libc_enospc == nix::libc::ENOSPC => " (disk full)",
        Some(code) if code == nix::libc::EROFS => " (read-only filesystem)",
        Some(code) if code == nix::libc::EACCES || code == nix::libc::EPERM => " (permission denied)",
        Some(code) if code == nix::libc::EIO => " (I/O error: the disk or network filesystem failed)",
        _ => "",
    }
}

fn join_failures(failures: &[FileFailure]) -> String {
    failures.iter().map(|f| f.to_string()).collect::<Vec<_>>().join("; ")
}
