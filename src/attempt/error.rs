//! Errors of a run's lifecycle, each mapped to an exit code.

use std::io;
use std::path::PathBuf;

use crate::checkpoint::CheckpointError;
use crate::config::ConfigError;
use crate::distributed::DistributedError;
use crate::exit::Outcome;
use crate::gpu::GpuError;
use crate::rundir::{RunDirError, RunDirRefusal};
use crate::telemetry::TelemetryError;
use crate::train::TrainError;

/// Why `rekindle run` could not finish.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The run directory refuses this run (exit 78, nothing changed).
    #[error(transparent)]
    Dir(RunDirRefusal),
    /// The newest checkpoint's `state.json` records other training settings
    /// (`settings_sha256`, run/settings.rs) than this config's.
    #[error(
        "checkpoint {dir} was trained with other training settings than this config (its state.json settings_sha256 differs):\n  {}\nresuming would not continue the same run; restore the old settings, use a new run directory (--run-dir), or pass --allow-config-change",
        diff.join("\n  ")
    )]
    CheckpointSettingsChanged { dir: PathBuf, diff: Vec<String> },
    /// The config's workload cannot be built or its data cannot be used
    /// (`Registry::checked_workload`): found before the run directory is
    /// touched.
    #[error("this config cannot be trained: {0}; nothing was started or changed")]
    Unusable(TrainError),
    #[error(transparent)]
    Distributed(crate::distributed::DistributedError),
    #[error("the ranks of this data-parallel run disagree: {what}")]
    Ranks { what: String },
    #[error("cannot prepare run directory {path}: {source}")]
    RunDir { path: PathBuf, source: io::Error },
    /// The run directory is not rekindle's to use (`crate::confine::claim_dir`).
    #[error(transparent)]
    Claim(#[from] crate::confine::ClaimError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Telemetry(#[from] TelemetryError),
    #[error(transparent)]
    Train(#[from] TrainError),
    #[error("restoring checkpoint {dir} failed: {source}")]
    Restore { dir: PathBuf, source: TrainError },
    #[error(transparent)]
    Lock(#[from] crate::rundir::lock::LockError),
    #[error(
        "another process took over the lock of run directory {dir} (its holder judged this run dead); \
         this run stopped without writing anything more: check that two jobs do not share the directory"
    )]
    LockLost { dir: PathBuf },
    #[error(
        "step {step} had a non-finite loss ({loss}) or gradient norm ({grad_norm}) and [train] on_nonfinite = \"stop\"; \
         the last good step is checkpointed: lower the learning rate, check the data, or use on_nonfinite = \"skip\" or \"rollback\""
    )]
    NonFinite { step: u64, loss: f64, grad_norm: f64 },
    #[error(
        "{count} checkpoint saves in a row failed ([checkpoint] max_consecutive_failures); last error: {last}; \
         earlier checkpoints are intact: free space or fix the checkpoint directory, then run again"
    )]
    CheckpointsFailing { count: u32, last: CheckpointError },
    #[error(
        "the background checkpoint thread died {count} times in a row ([checkpoint] max_consecutive_failures); \
         last: {error}; a synchronous checkpoint of the last completed step was attempted (see events.jsonl): \
         run again to resume from the newest checkpoint that verifies, and report the panic"
    )]
    PersisterDied { count: u32, error: String },
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error(
        "[gpu] require = true but {reason}; nothing more was trained: run on a node with a usable GPU (see \
         `rekindle gpus` and `rekindle doctor`), or set [gpu] require = false to fall back to the CPU"
    )]
    GpuRequired { reason: String },
    #[error(
        "{source}; stopped with a checkpoint of step {step} in {checkpoint} (exit 1, not 75: the same \
         settings would run out of memory again): set a smaller [train] micro_batch, raise [gpu] headroom, \
         or free device memory, then run again to resume from it"
    )]
    OutOfMemory { step: u64, checkpoint: PathBuf, source: TrainError },
    #[error(
        "stopped by {reason} at step {step}, but the stop checkpoint failed ({error}) and no earlier checkpoint \
         verifies: nothing durable to resume from (exit 1, not 75); the job was still requeued where the rules \
         allow, and the next attempt starts from step 0 unless the checkpoint directory is fixed"
    )]
    StopWithoutCheckpoint { reason: String, step: u64, error: String },
    #[error(
        "stopped by {reason} before training began, and this run has no checkpoint yet: nothing was trained \
         and nothing is lost, but there is nothing to resume from either (exit 1, not 75: 75 promises a durable \
         checkpoint); the job was still requeued where the rules allow; run the same command again to start at \
         step 0"
    )]
    StoppedBeforeFirstCheckpoint { reason: String },
    #[error(
        "step {step} needs a rollback but no checkpoint verifies in {dir}; use on_nonfinite = \"skip\" or \"stop\""
    )]
    NothingToRollBackTo { step: u64, dir: PathBuf },
    #[error("cannot start the program `{command}`: {source}; check that it exists, is executable and is on PATH")]
    ChildSpawn { command: String, source: io::Error },
    #[error(
        "the program `{command}` {how} with no stop requested ({why}); its last stderr lines are in the \
         `child_exit` event of events.jsonl: fix it and run the same command again"
    )]
    ChildFailed { command: String, how: String, class: crate::telemetry::CrashClass, why: String },
    #[error("cannot start the supervisor's event loop: {source}; the system may be out of file descriptors")]
    ExecRuntime { source: io::Error },
    #[error("rekindle seal: {reason}")]
    Seal { reason: String },
    /// A task of a job step of several under `rekindle exec` (exec/world.rs).
    #[error("rekindle exec, a task of several: {reason}")]
    World { reason: String },
    /// The start-of-attempt check failed on this node (`crate::health`);
    /// the attempt ended untrained, its requeue and exclusion decided.
    #[error(
        "node {node} failed its health check `{check}`: {detail}; this attempt did not train (node_unhealthy in \
         events.jsonl); {next}"
    )]
    Unhealthy { node: String, check: String, detail: String, next: String, resumable: bool },
    /// The progress guard (`[run] max_attempts_without_progress`).
    #[error("{message}")]
    NoProgress { message: String },
}

impl RunError {
    /// The exit code this error maps to.
    pub fn outcome(&self) -> Outcome {
        match self {
            RunError::Config(_)
            | RunError::Dir(_)
            | RunError::CheckpointSettingsChanged { .. }
            | RunError::Unusable(_)
            | RunError::Distributed(
                DistributedError::NotBuiltWithMpi { .. }
                | DistributedError::BadLaunchEnv { .. }
                | DistributedError::WorldMismatch { .. },
            ) => Outcome::ConfigError,
            RunError::Claim(e) | RunError::Checkpoint(CheckpointError::Claim(e)) if !e.is_io() => Outcome::ConfigError,
            RunError::NoProgress { .. } => Outcome::NoProgress,
            // As a hang: 75 when a checkpoint verifies (the next attempt, on
            // another node, resumes from it), 1 when there is none.
            RunError::Unhealthy { resumable: true, .. } => Outcome::StoppedWithCheckpoint,
            _ => Outcome::Failure,
        }
    }
}

/// The run directory's refusals keep their type; its I/O and claim errors
/// are the attempt's like any other.
impl From<RunDirError> for RunError {
    fn from(e: RunDirError) -> RunError {
        match e {
            RunDirError::Refused(r) => RunError::Dir(r),
            RunDirError::Io { path, source } => RunError::RunDir { path, source },
            RunDirError::Claim(c) => RunError::Claim(c),
            RunDirError::Checkpoint(c) => RunError::Checkpoint(c),
        }
    }
}
