//! What the run directory refuses, and why it could not be prepared.

use std::io;
use std::path::PathBuf;

use crate::checkpoint::CheckpointError;
use crate::confine::ClaimError;

/// A run directory that this run must not use as it stands (exit 78:
/// nothing was changed).
#[derive(Debug, thiserror::Error)]
pub enum RunDirRefusal {
    #[error(
        "the run directory's {path} differs from this config in training settings:\n  {}\nresuming would not continue the same run; restore the old settings, use a new run directory (--run-dir), or pass --allow-config-change",
        diff.join("\n  ")
    )]
    ConfigChanged { path: PathBuf, diff: Vec<String> },
    #[error("cannot read the previous config {path}: {reason}; fix or remove it")]
    PreviousConfig { path: PathBuf, reason: String },
    /// The run directory's checkpoints are the other command's: `run`
    /// continues native checkpoints, `exec` sealed ones.
    #[error(
        "run directory {dir} holds checkpoints of `rekindle {theirs}` (newest: step {step}), which `rekindle {ours}` \
         cannot continue: continue this run directory with `rekindle {theirs}`, or give `rekindle {ours}` another one \
         (--run-dir); nothing was changed"
    )]
    OtherCommand { dir: PathBuf, step: u64, theirs: &'static str, ours: &'static str },
}

/// Why the run directory could not be claimed or prepared.
#[derive(Debug, thiserror::Error)]
pub enum RunDirError {
    #[error(transparent)]
    Refused(#[from] RunDirRefusal),
    #[error("cannot prepare run directory {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    /// The run directory is not rekindle's to use (`crate::confine::claim_dir`).
    #[error(transparent)]
    Claim(#[from] ClaimError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
}
