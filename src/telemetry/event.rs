//! The lines of `events.jsonl` as types: [`Event`] is one variant per event
//! kind, serde-tagged by `event`, and [`RecordedEvent`] is a line read back
//! with its envelope (`time`, `node`, `job_id`, `attempt`).
//!
//! The JSON these types write is the format documented in
//! `docs/run-directory.md`; a test checks that every variant is documented
//! there. Writers only ever produce known variants; readers are lenient: every
//! field has a default (older versions and hand-written fixtures omit some),
//! an unknown event kind, or a known one whose fields do not fit, reads as
//! [`Event::Other`] holding the raw object, and [`RecordedEvent::raw`] keeps
//! every field, known or not.
//!
//! Nested objects that other modules own and serialise (the placement plan,
//! the SLURM allocation, checkpoint verification failures, the monitor's
//! warnings) are kept as JSON values here: this module is the records'
//! vocabulary and depends on no other part of rekindle.

use std::path::PathBuf;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

/// One event of `events.jsonl` (without its envelope, see [`EventContext`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// An attempt began (written once the placement is known).
    Start(Start),
    /// This attempt took the run-directory lock over from a holder judged gone.
    LockTakeover(LockTakeover),
    /// A checkpoint directory did not verify at start-up and is skipped.
    CheckpointRejected(CheckpointRejected),
    /// A rejected checkpoint was moved to `quarantine/` (or could not be).
    CheckpointQuarantined(CheckpointQuarantined),
    /// Training resumed from a checkpoint.
    Resume(Resume),
    /// Checkpoints exist but none verifies: training starts again at step 0.
    FreshStart(FreshStart),
    /// A GPU could not be used: training goes on on the CPU.
    GpuFallback(GpuFallback),
    /// A step ran out of memory and is retried with a smaller micro-batch.
    OomRetry(OomRetry),
    /// A periodic checkpoint was snapshotted and handed to the background
    /// writer: it is in flight until its `checkpoint_saved`.
    CheckpointStarted(CheckpointStarted),
    /// A checkpoint is durable.
    CheckpointSaved(CheckpointSaved),
    /// A checkpoint could not be written (earlier ones are intact).
    CheckpointFailed(CheckpointFailed),
    /// The background checkpoint thread died: restarted, or the run stops.
    PersisterDied(PersisterDied),
    /// A step's loss or gradient was not finite.
    Nonfinite(Nonfinite),
    /// A stop signal (or `--stop-at-step`) was acted on.
    Signal(Signal),
    /// The GPU/host monitor stopped.
    Monitor(MonitorOutcome),
    /// Results were published (or publishing failed).
    Publish(PublishOutcome),
    /// The requeue decision and what `scontrol requeue` answered.
    Requeue(RequeueRecord),
    /// The attempt stopped with a durable checkpoint (exit 75).
    Stop(Stop),
    /// Training reached `max_steps` (exit 0).
    Finish(Finish),
    /// The attempt failed (exit 1).
    Error(ErrorEvent),
    /// The watchdog found an activity stuck past its limit.
    Hang(HangEvent),
    /// `[checkpoint] interval = "auto"` chose a (noticeably different)
    /// periodic checkpoint interval, with its inputs.
    CheckpointInterval(CheckpointIntervalChosen),
    /// `rekindle exec` started the program, with the contract's environment.
    ChildStart(ChildStart),
    /// The program run by `rekindle exec` ended, and what that means.
    ChildExit(ChildExit),
    /// Another rank of a data-parallel run stopped beating past
    /// `[distributed] timeout` (stopped, dead, its node gone).
    RankLost(RankLost),
    /// A node-local checkpoint (`[recovery] local`) was committed by the
    /// world, skipped (no room) or failed.
    LocalCheckpoint(LocalCheckpoint),
    /// The first step trained after a fault (a lost rank or node, a crash,
    /// a hang): how long it took and where the state came from.
    Recovery(Recovery),
    /// A rank slower than the others' median (or a process alone slower
    /// than its own earlier steps) for `[health] straggler_steps` steps in a
    /// row; once per rank per attempt.
    Straggler(Straggler),
    /// The start-of-attempt check failed on this node: the attempt ends
    /// without training.
    NodeUnhealthy(NodeUnhealthy),
    /// What the end of an attempt blamed, and which nodes the job's next
    /// attempt (or in-job step) leaves behind, or why none.
    NodesExcluded(NodesExcluded),
    /// An event this version does not know (or whose fields do not fit):
    /// the whole object, `event` included. Never written by this version.
    #[serde(untagged)]
    Other(Value),
}

/// Every `event` name this version writes, in the order of [`Event`].
pub const EVENT_NAMES: [&str; 30] = [
    "start",
    "lock_takeover",
    "checkpoint_rejected",
    "checkpoint_quarantined",
    "resume",
    "fresh_start",
    "gpu_fallback",
    "oom_retry",
    "checkpoint_started",
    "checkpoint_saved",
    "checkpoint_failed",
    "persister_died",
    "nonfinite",
    "signal",
    "monitor",
    "publish",
    "requeue",
    "stop",
    "finish",
    "error",
    "hang",
    "checkpoint_interval",
    "child_start",
    "child_exit",
    "rank_lost",
    "local_checkpoint",
    "recovery",
    "straggler",
    "node_unhealthy",
    "nodes_excluded",
];

impl Event {
    /// The `event` name (for [`Event::Other`], the name it was read with).
    pub fn name(&self) -> &str {
        match self {
            Event::Start(_) => "start",
            Event::LockTakeover(_) => "lock_takeover",
            Event::CheckpointRejected(_) => "checkpoint_rejected",
            Event::CheckpointQuarantined(_) => "checkpoint_quarantined",
            Event::Resume(_) => "resume",
            Event::FreshStart(_) => "fresh_start",
            Event::GpuFallback(_) => "gpu_fallback",
            Event::OomRetry(_) => "oom_retry",
            Event::CheckpointStarted(_) => "checkpoint_started",
            Event::CheckpointSaved(_) => "checkpoint_saved",
            Event::CheckpointFailed(_) => "checkpoint_failed",
            Event::PersisterDied(_) => "persister_died",
            Event::Nonfinite(_) => "nonfinite",
            Event::Signal(_) => "signal",
            Event::Monitor(_) => "monitor",
            Event::Publish(_) => "publish",
            Event::Requeue(_) => "requeue",
            Event::Stop(_) => "stop",
            Event::Finish(_) => "finish",
            Event::Error(_) => "error",
            Event::Hang(_) => "hang",
            Event::CheckpointInterval(_) => "checkpoint_interval",
            Event::ChildStart(_) => "child_start",
            Event::ChildExit(_) => "child_exit",
            Event::RankLost(_) => "rank_lost",
            Event::LocalCheckpoint(_) => "local_checkpoint",
            Event::Recovery(_) => "recovery",
            Event::Straggler(_) => "straggler",
            Event::NodeUnhealthy(_) => "node_unhealthy",
            Event::NodesExcluded(_) => "nodes_excluded",
            Event::Other(raw) => raw.get("event").and_then(Value::as_str).unwrap_or("?"),
        }
    }

    /// The event's own `step`, when it has one.
    pub fn step(&self) -> Option<u64> {
        match self {
            Event::CheckpointRejected(e) => Some(e.step),
            Event::CheckpointQuarantined(e) => Some(e.step),
            Event::Resume(e) => Some(e.step),
            Event::OomRetry(e) => Some(e.step),
            Event::CheckpointStarted(e) => Some(e.step),
            Event::CheckpointSaved(e) => Some(e.step),
            Event::CheckpointFailed(e) => Some(e.step),
            Event::PersisterDied(e) => e.step,
            Event::Nonfinite(e) => Some(e.step),
            Event::Signal(e) => e.step,
            Event::Stop(e) => e.step,
            Event::Finish(e) => Some(e.step),
            Event::Error(e) => e.step,
            Event::Hang(e) => Some(e.step),
            Event::CheckpointInterval(e) => Some(e.step),
            Event::ChildStart(e) => e.resume_step,
            Event::ChildExit(e) => e.last_sealed_step,
            Event::RankLost(e) => e.step,
            Event::LocalCheckpoint(e) => Some(e.step),
            Event::Recovery(e) => Some(e.step),
            Event::Straggler(e) => Some(e.step),
            Event::Other(raw) => raw.get("step").and_then(Value::as_u64),
            Event::Start(_)
            | Event::LockTakeover(_)
            | Event::FreshStart(_)
            | Event::GpuFallback(_)
            | Event::Monitor(_)
            | Event::Publish(_)
            | Event::Requeue(_)
            | Event::NodeUnhealthy(_)
            | Event::NodesExcluded(_) => None,
        }
    }
}

/// `start`: who runs the attempt, where, and on which devices.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Start {
    pub pid: u32,
    pub rekindle_version: String,
    pub run_dir: PathBuf,
    /// The SLURM allocation as the environment describes it (`SlurmEnv`).
    pub allocation: Value,
    /// `[run] max_steps`; `null` for `rekindle exec` when the config does not
    /// set it (only the program knows its length).
    pub max_steps: Option<u64>,
    /// Backend, plan, layout and devices in use (see `attempt::Devices`).
    pub placement: Value,
    /// Ranks of a data-parallel run (absent for one process).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub world_size: Option<usize>,
    /// The node of each rank, in rank order (absent for one process).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank_nodes: Option<Vec<String>>,
    /// Data-parallel runs only: whether each rank keeps only its slice of
    /// the optimizer state (`[distributed] shard_optimizer`, ZeRO-1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub optimizer_sharded: Option<bool>,
    /// Under a batch shell that restarts in the job: how many in-job
    /// restarts came before this attempt in its allocation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_job_restart: Option<u32>,
    /// SHA-256 of the whole config this attempt ran with
    /// (`config::config_hash`): the progress guard counts afresh after a
    /// change. Absent in records of older versions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config_sha256: Option<String>,
}

/// `lock_takeover`: the run-directory lock this attempt took over, and why
/// its holder counted as gone.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LockTakeover {
    /// Why the holder counted as gone.
    pub reason: String,
    /// The holder's host (node name), pid, job id and restart count, when
    /// its lock file was readable.
    pub previous_host: Option<String>,
    pub previous_pid: Option<u32>,
    pub previous_job_id: Option<String>,
    pub previous_restart_count: Option<u32>,
    /// Age of the holder's heartbeat by this node's clock at the takeover.
    pub heartbeat_age_seconds: Option<f64>,
    /// Seconds this attempt waited before it could take the lock over.
    pub waited_seconds: f64,
}

/// `checkpoint_rejected`: a checkpoint that does not verify.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CheckpointRejected {
    pub step: u64,
    pub dir: PathBuf,
    /// What failed to verify, file by file.
    pub failures: Value,
}

/// `checkpoint_quarantined`: a checkpoint that failed verification at resume
/// was moved out of the checkpoints directory, so that nothing counts it as a
/// checkpoint again; or it could not be moved (`moved_to` is `None`, `error`
/// says why) and stays where it was.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CheckpointQuarantined {
    pub step: u64,
    /// Where it was.
    pub dir: PathBuf,
    /// Where it is now (`…/checkpoints/quarantine/step-…-<time>`).
    pub moved_to: Option<PathBuf>,
    /// What failed, in one line (`file: problem; …`).
    pub reason: String,
    /// What failed to verify, file by file.
    pub failures: Value,
    /// Why it could not be moved, when it could not.
    pub error: Option<String>,
}

/// `resume`: the checkpoint training continues from.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Resume {
    pub step: u64,
    /// The checkpoint directory.
    pub from: PathBuf,
    /// The node that wrote the checkpoint.
    pub previous_node: Option<String>,
    /// SLURM's restart count when the checkpoint was written.
    pub previous_attempt: Option<u64>,
    pub this_node: String,
    pub restart_count: u32,
    /// Steps the previous attempt logged after this checkpoint (trained again).
    pub steps_lost: u64,
    /// Age of the checkpoint in seconds.
    pub seconds_since_checkpoint: Option<f64>,
    /// `local` (the node-local tier) or `durable`; absent before 0.2.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
    /// For the local tier: the node whose copy was used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_node: Option<String>,
    /// With `[recovery] local`: why the durable tier was used instead.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fallback_reason: Option<String>,
}

/// `fresh_start`: no checkpoint verifies.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FreshStart {
    pub reason: String,
    /// Checkpoints rejected.
    pub rejected: usize,
}

/// `gpu_fallback`: why the GPU plan is not used, and the CPU plan instead.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GpuFallback {
    pub reason: String,
    /// The GPU plan that could not be used (`null` when there was none).
    pub wanted: Value,
    pub plan: Value,
    pub layout: Value,
}

/// `oom_retry`: one retry of a step after running out of memory.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct OomRetry {
    pub step: u64,
    /// 1 for the first retry of this step.
    pub retry: u32,
    /// The layout that ran out of memory.
    pub from: Value,
    /// The layout of the retry.
    pub to: Value,
    pub error: String,
}

/// `checkpoint_started`: a periodic snapshot is in host memory and the
/// background writer has it; a node lost before its `checkpoint_saved` loses
/// it, and so the steps trained since `due_step`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CheckpointStarted {
    pub step: u64,
    /// Always `periodic` in this version.
    pub kind: String,
    /// The step at which this save fell due; earlier than `step` when the
    /// previous save was still being written then (the save waits for it).
    pub due_step: u64,
    /// Training stalled this long to copy the state to host memory.
    pub snapshot_seconds: f64,
}

/// `checkpoint_saved`: either a full report (`bytes` … `rotated_out`), or,
/// for a checkpoint committed with a problem afterwards, only `warning`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CheckpointSaved {
    pub step: u64,
    /// periodic, stop or final.
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload_bytes: Option<u64>,
    /// Training stalled this long to copy the state to host memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot_seconds: Option<f64>,
    /// Writing, fsync and commit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub persist_seconds: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gb_per_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub already_existed: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dir: Option<PathBuf>,
    /// Checkpoint directories removed by rotation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rotated_out: Option<Vec<PathBuf>>,
    /// A sharded optimizer's checkpoint: the ranks that each wrote their
    /// part of the optimizer state.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub optimizer_parts: Option<u64>,
    /// Of `persist_seconds`, how long rank 0 waited, after writing its own
    /// files, for the other ranks' parts (they report at step boundaries).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parts_wait_seconds: Option<f64>,
    /// With parts: the bytes rank 0 wrote itself (the other ranks wrote
    /// the rest of `bytes`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub own_bytes: Option<u64>,
    /// How the files were written: direct or buffered I/O, block size,
    /// writes in flight, and whether that was measured (with the
    /// measurement, at the save that made it), configured or the default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub write: Option<crate::checkpoint::WriteChoice>,
    /// Committed and loadable, but the directory sync or rotation failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
}

/// `checkpoint_failed`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CheckpointFailed {
    pub step: u64,
    pub kind: String,
    pub error: String,
    /// Periodic saves only: failures in a row so far.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consecutive_failures: Option<u32>,
}

/// `persister_died`: the background checkpoint thread is gone (a panic, or
/// its channel closed); the save in flight is lost.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PersisterDied {
    /// The step whose save was in flight (`null`: none).
    pub step: Option<u64>,
    /// The panic's message, or why the thread is gone.
    pub error: String,
    /// `restarted` (a new thread takes over), or `stopping` (it died
    /// `[checkpoint] max_consecutive_failures` times in a row: a synchronous
    /// checkpoint is attempted, then the run fails).
    pub action: String,
    /// Failed periodic saves in a row, this one included.
    pub consecutive_failures: u32,
}

/// `nonfinite`: `action` is `stop` or `rollback` (then `restored_step` and
/// `skipped_batches` say where training went back to).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Nonfinite {
    pub step: u64,
    /// `null` when not finite.
    pub loss: Option<f64>,
    pub grad_norm: Option<f64>,
    pub action: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restored_step: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skipped_batches: Option<u64>,
}

/// `signal`: during training with `arrival` and `deadline_in_seconds`; before
/// training with `before_training: true` instead.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Signal {
    /// SIGTERM, SIGUSR1, …, or `stop_at_step`.
    pub signal: String,
    /// The last completed step (before training: the newest durable one, or `null`).
    pub step: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arrival: Option<String>,
    /// Present during training; `null` when there is no deadline (`--stop-at-step`).
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub deadline_in_seconds: Option<Option<f64>>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub before_training: bool,
}

/// `stop`: three shapes, by how the attempt stopped — with a stop checkpoint
/// (`seconds_to_durable_checkpoint` … `requeue`; or, when the stop checkpoint
/// failed, `checkpoint_error` and `step` naming the earlier checkpoint kept),
/// a fast exit keeping the previous checkpoint (`fast_exit: true`), or before
/// training began (`before_training: true` and `requeue`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Stop {
    /// The step of the durable checkpoint kept (`null`: none yet).
    pub step: Option<u64>,
    /// The signal name or `stop_at_step`.
    pub reason: String,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub fast_exit: bool,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub before_training: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seconds_to_durable_checkpoint: Option<f64>,
    /// Seconds left before the deadline at the end (`null`: no deadline).
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub seconds_left: Option<Option<f64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signals_received: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub publish: Option<PublishOutcome>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requeue: Option<RequeueRecord>,
    /// The stop checkpoint failed, and why: `step` then names the earlier
    /// checkpoint (of this attempt or one before) kept instead.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoint_error: Option<String>,
    /// Steps of the stop that failed after the checkpoint (`summary: …`,
    /// `monitor: …`, `events: …`), each recorded and passed over; absent
    /// when none did.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<String>,
}

/// `child_start`: the program `rekindle exec` runs, and the contract's
/// environment it was given (docs/exec.md).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ChildStart {
    /// The command line, argument by argument (lossy UTF-8), secrets
    /// redacted ([`Redactor::args`](super::Redactor::args)) unless `[telemetry]
    /// record_raw_command`.
    pub command: Vec<String>,
    pub pid: u32,
    /// `REKINDLE_EXEC_PROTOCOL`.
    pub protocol: u32,
    /// `REKINDLE_RESUME_FROM` (`null`: a fresh start).
    pub resume_from: Option<PathBuf>,
    /// The step of that checkpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resume_step: Option<u64>,
    /// `REKINDLE_CHECKPOINT_DIR`.
    pub checkpoint_dir: PathBuf,
    /// `REKINDLE_STOP_FILE`.
    pub stop_file: PathBuf,
    /// `REKINDLE_DEADLINE` at the start (the job's end time), Unix seconds.
    pub deadline: Option<i64>,
    /// In a job step of several tasks, the task (`SLURM_PROCID`) whose
    /// supervisor started this copy of the program (absent for one task).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task: Option<u32>,
}

/// `child_exit`: how the program ended and what rekindle made of it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ChildExit {
    pub pid: u32,
    /// Its exit code (`null` when a signal ended it).
    pub exit_code: Option<i32>,
    /// The signal that ended it (`SIGKILL`, …), if one did.
    pub signal: Option<String>,
    pub seconds: f64,
    /// A stop was requested (and forwarded) before it ended.
    pub stop_requested: bool,
    /// It was still running at the stop deadline (or a third signal) and was killed.
    pub killed_at_deadline: bool,
    /// The newest checkpoint that verifies after it ended.
    pub last_sealed_step: Option<u64>,
    /// Checkpoints it sealed in this attempt.
    pub sealed_this_attempt: u64,
    /// `finished`, `stopped` or `crashed`.
    pub verdict: String,
    /// Its last lines on stderr (at most 20, each at most 500 bytes),
    /// secrets redacted ([`Redactor::text`](super::Redactor::text)).
    pub stderr_tail: Vec<String>,
    /// As in [`ChildStart::task`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task: Option<u32>,
}

/// `finish`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Finish {
    pub step: u64,
    pub publish: PublishOutcome,
}

/// `error`: `step` is absent when the failure came before training (e.g.
/// `[gpu] require = true` with no usable GPU). A failure during training
/// also carries its classification (`class`, `why`) and, for a transient
/// one, what was done about it (`requeue`, `hold_seconds`, `hold_error`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ErrorEvent {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    pub error: String,
    /// `transient` (an I/O or device error: worth running again) or
    /// `deterministic` (it would fail the same way again).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub class: Option<CrashClass>,
    /// Why the error got its class.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// The requeue decision after a transient crash (`null`: deterministic).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requeue: Option<RequeueRecord>,
    /// Seconds the requeued job was held before it may start again (the backoff).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hold_seconds: Option<u64>,
    /// Why the hold could not be set (the job then starts after SLURM's own delay).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hold_error: Option<String>,
}

/// How a crash is classified (see `attempt::crash`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CrashClass {
    /// An I/O or device error: a new attempt (maybe on another node) may pass.
    Transient,
    /// A config, shape or numerical error: a new attempt would fail the same way.
    Deterministic,
}

/// `hang`: an activity ran past its `[watchdog]` limit. Written first, before
/// the checkpoint attempt, the requeue and the exit.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HangEvent {
    /// `step`, `eval`, `save` or `publish`.
    pub activity: String,
    /// The stuck thread: `training` or `persister`; `program` under `exec`.
    pub thread: String,
    /// The step trained, evaluated after, saved or published.
    pub step: u64,
    /// When the activity began (RFC 3339, UTC).
    pub since: String,
    /// Seconds it had run when the watchdog acted.
    pub stuck_seconds: f64,
    /// Its limit, in seconds.
    pub limit_seconds: f64,
    /// Under `exec`: the program's rank whose progress stopped (its reports,
    /// docs/exec.md); absent for `run`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank: Option<usize>,
}

/// `rank_lost`: a rank of a data-parallel run whose heartbeat did not
/// change for `[distributed] timeout`, as another rank watched it. One event
/// per lost rank, written by the lowest-numbered rank still beating.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RankLost {
    /// The lost rank.
    pub rank: usize,
    /// Its node, as it wrote it in its heartbeat.
    pub rank_node: String,
    /// Its process id on that node.
    pub pid: u32,
    /// The last step it had completed when it last beat (`None`: none yet).
    pub step: Option<u64>,
    /// How long its heartbeat had not changed when this was noticed.
    pub silent_seconds: f64,
    /// `[distributed] timeout`, in seconds.
    pub timeout_seconds: f64,
    /// The rank that noticed and writes this event.
    pub noticed_by: usize,
    /// How many ranks the world has.
    pub world_size: usize,
}

/// `straggler`: a rank of a data-parallel run whose own work in a step
/// (forward and backward, not its wait for the others) took more than
/// `[health] straggler_factor` times the median of the other ranks' for
/// `[health] straggler_steps` steps in a row; or, for a process alone, a
/// step time that grew past that factor of the attempt's first steps'.
/// Written by rank 0, once per rank per attempt.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Straggler {
    /// The slow rank (0 for a process alone).
    pub rank: usize,
    /// Its node (the envelope's `node` is the writer's, rank 0's).
    pub rank_node: String,
    /// The step that made it a straggler (the last of the slow run).
    pub step: u64,
    /// The median of its seconds per step over the slow run.
    pub step_seconds: f64,
    /// The median it was compared with: the other ranks' (median over the
    /// run of each step's median), or a process alone's first steps'.
    pub median_seconds: f64,
    /// `[health] straggler_factor`.
    pub factor: f64,
    /// `[health] straggler_steps`: slow steps in a row.
    pub steps: u64,
    /// `[health] straggler_blame`: the slowdown is blamed on its node, which
    /// the next requeue or in-job restart leaves behind (as a node a failure
    /// is attributed to); false: reported only.
    pub blamed: bool,
    /// Ranks in the world (1: a process alone, compared with itself).
    pub world_size: usize,
}

/// `local_checkpoint`: one save of the node-local tier (`[recovery] local`),
/// or, once at an attempt's start, the tier turned off for the attempt
/// because a node cannot keep copies (`failed`, `step`: where it starts).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LocalCheckpoint {
    pub step: u64,
    /// `committed` (every node wrote a copy with the same files, and each
    /// now holds `WORLD.json`), `skipped` (a node had no room) or `failed`
    /// (a write failed, the copies differ, or the tier is off).
    pub outcome: String,
    /// The nodes holding a copy (committed only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub holders: Vec<String>,
    /// Bytes of one copy.
    pub bytes: u64,
    /// The training thread's pause to snapshot the state.
    pub stall_seconds: f64,
    /// The slowest node's write, in the background.
    pub write_seconds: f64,
    /// Why it was skipped or failed, naming the rank and node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The step this save fell due at, when it started later because the
    /// save before it was still being written: the tier's cadence was not
    /// met by `step - due_step` steps. Absent for a save on time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub due_step: Option<u64>,
}

/// `recovery`: written after the first step an attempt trains when the
/// attempt before it ended in a fault (not a graceful stop).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Recovery {
    /// The step just trained.
    pub step: u64,
    /// The checkpoint step this attempt resumed from.
    pub resumed_from: u64,
    /// `local` or `durable`.
    pub tier: String,
    /// Steps the attempt before had trained past that checkpoint (trained again).
    pub steps_lost: u64,
    /// What ended the attempt before: `rank_lost`, `error`, `hang`.
    pub fault: String,
    /// From the fault (a lost rank's last heartbeat, or the failure's
    /// record) to this step, in seconds.
    pub recovery_seconds: Option<f64>,
    /// Whether this attempt runs in the same SLURM allocation as the one
    /// that failed (a restart inside the job), not after a requeue.
    pub in_job: bool,
}

/// `node_unhealthy`: the start-of-attempt check (`crate::health`) failed
/// on this node; the attempt ended without training.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeUnhealthy {
    /// The node that failed.
    pub node: String,
    /// The first required check that failed (`devices`, `gpu health`,
    /// `site command`, …).
    pub check: String,
    /// What it found (for the site command: how it ended and its output).
    pub detail: String,
    /// Every check made, as `rekindle doctor --json` lists them.
    pub checks: Value,
    /// What launched the attempt: its SLURM job step (`<job>.<step>`), or
    /// this process (`pid <pid>`) outside one. The ranks of one attempt
    /// share it, so that they count as one attempt.
    pub launch: String,
    /// As `start`'s: the config the failed attempt would have run with.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config_sha256: Option<String>,
}

/// `nodes_excluded`: the nodes an attempt's end blamed and what came of
/// excluding them: the job's new `ExcNodeList` (after a requeue), the
/// nodes the next in-job step leaves out, or why nothing was excluded.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct NodesExcluded {
    /// What ended the attempt (`node_unhealthy: site command`, `rank_lost:
    /// rank 1`, `hang: step`, `crash: transient`).
    pub cause: String,
    /// The nodes blamed for it.
    pub blamed: Vec<String>,
    /// The nodes newly excluded (empty when none were).
    pub added: Vec<String>,
    /// The job's whole exclusion list afterwards (the user's own included).
    pub excluded: Vec<String>,
    /// `requeue` (`scontrol update ExcNodeList`) or `in_job` (the batch
    /// shell's next step).
    pub how: String,
    /// Why nothing (or not everything) was excluded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// What kept the exclusion from being set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `checkpoint_interval`: the periodic checkpoint interval `"auto"` chose,
/// why, and from what (see `checkpoint::interval`). Recorded at the start
/// and whenever a new measurement changes the choice noticeably.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CheckpointIntervalChosen {
    /// The step after which it was chosen (the step resumed from at the start).
    pub step: u64,
    /// The interval now in force, in seconds.
    pub interval_seconds: f64,
    /// `young_daly`, `unmeasured` (no save measured yet: a conservative
    /// default) or `no_mtbf` (no interruption rate known: the default).
    pub reason: String,
    /// √(2 × cost × mtbf) before the bounds, when both were known.
    pub young_daly_seconds: Option<f64>,
    /// The bound that set the interval, if one did: `stall_fraction`,
    /// `persist_time`, `floor` or `remaining_time`.
    pub bound: Option<String>,
    /// The checkpoint cost used: the training stall per save plus, for
    /// background saves, the slowdown of training while the write ran
    /// (inline saves add the write instead), medians of the recent saves.
    pub cost_seconds: Option<f64>,
    /// How the cost was measured: `snapshot_stall_and_slowdown` (background
    /// saves) or `snapshot_and_write`.
    pub cost_measured_as: Option<String>,
    /// Saves measured so far (this attempt).
    pub saves_measured: u32,
    /// Median time to write a snapshot to storage.
    pub persist_seconds: Option<f64>,
    /// Median training time a background write cost beyond its stall
    /// (steps trained while it ran, against the usual step).
    #[serde(default)]
    pub slowdown_seconds: Option<f64>,
    /// The mean time between interruptions used, in seconds.
    pub mtbf_seconds: Option<f64>,
    /// `config` (`[checkpoint] mtbf`), `history` (this run's earlier
    /// attempts) or `none`.
    pub mtbf_source: String,
    /// With `history`: the earlier attempts that lost work …
    pub interruptions: Option<u64>,
    /// … over this many seconds of earlier attempts.
    pub history_seconds: Option<f64>,
    /// Seconds left before the SLURM job's end time, when known.
    pub remaining_seconds: Option<f64>,
    /// The interval in force before this choice (absent for the first).
    pub previous_seconds: Option<f64>,
}

/// What publishing did, as `publish`, `stop.publish` and `finish.publish` record it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PublishOutcome {
    /// Not attempted: `publishing disabled`, `fast exit`.
    Skipped { skipped: String },
    /// Even the local commit failed.
    Failed { error: String },
    /// Committed; `pushed` says whether the push succeeded.
    Done {
        /// The new commit; `null` when nothing changed since the last publish.
        commit: Option<String>,
        pushed: bool,
        attempts: u32,
        files: Vec<String>,
        /// Files left out (type not on the allow-list, over the size cap,
        /// under `checkpoints/`); absent when none was.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        refused: Vec<RefusedFile>,
        /// The last push error, when not pushed.
        last_error: Option<String>,
        /// Why the clone's checked-out `runs/<run>/` was left as it was (a
        /// symbolic link on its path: never written through); absent when
        /// it was refreshed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        worktree: Option<String>,
    },
}

/// A run-directory file publishing left out, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusedFile {
    pub file: String,
    pub reason: String,
}

impl Default for PublishOutcome {
    fn default() -> PublishOutcome {
        PublishOutcome::Skipped { skipped: String::new() }
    }
}

/// What the stopped monitor reports (`monitor`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MonitorOutcome {
    Failed {
        error: String,
    },
    Stopped {
        samples: u64,
        /// `low_utilization` and `low_disk` warnings, each with its numbers.
        warnings: Vec<Value>,
        /// Seconds the monitor spent sampling and writing.
        busy_seconds: f64,
    },
}

/// The requeue decision (`decision`: `requeue` or `skip`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum RequeueDecision {
    Requeue {
        #[serde(default)]
        job_id: String,
        #[serde(default)]
        reason: String,
    },
    Skip {
        #[serde(default)]
        reason: String,
    },
}

impl RequeueDecision {
    /// `requeue` or `skip`.
    pub fn name(&self) -> &'static str {
        match self {
            RequeueDecision::Requeue { .. } => "requeue",
            RequeueDecision::Skip { .. } => "skip",
        }
    }

    pub fn reason(&self) -> &str {
        match self {
            RequeueDecision::Requeue { reason, .. } | RequeueDecision::Skip { reason } => reason,
        }
    }
}

/// What `scontrol requeue` answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RequeueAnswer {
    Requeued,
    /// SLURM said the job is already pending or requeued: counts as success.
    AlreadyPending,
}

/// `requeue` (also `stop.requeue`): the decision, and for a requeue either
/// SLURM's `answer` or the `error` that kept it from answering.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequeueRecord {
    #[serde(flatten)]
    pub decision: RequeueDecision,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<RequeueAnswer>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl RequeueRecord {
    /// A decision not carried out (or not needing to be).
    pub fn skip(reason: impl Into<String>) -> RequeueRecord {
        RequeueRecord { decision: RequeueDecision::Skip { reason: reason.into() }, answer: None, error: None }
    }
}

/// Fields of every event: the node, SLURM job id and SLURM restart count.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventContext {
    pub node: String,
    pub job_id: Option<String>,
    /// SLURM's restart count (0 outside SLURM).
    pub attempt: u32,
}

/// A line as written: envelope and event.
#[derive(Serialize)]
pub(crate) struct EventLine<'a> {
    pub time: String,
    #[serde(flatten)]
    pub context: &'a EventContext,
    #[serde(flatten)]
    pub event: &'a Event,
}

/// One line of `events.jsonl` read back: the envelope typed, the event typed,
/// and every field (known or not) in `raw`.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedEvent {
    /// start, resume, checkpoint_saved, signal, stop, requeue, finish, …
    pub name: String,
    pub time: Option<DateTime<Utc>>,
    pub node: Option<String>,
    pub job_id: Option<String>,
    /// SLURM's restart count when the event was written (0 outside SLURM).
    pub slurm_attempt: Option<u64>,
    /// The event's own `step`, when it has one.
    pub step: Option<u64>,
    pub event: Event,
    pub raw: Value,
}

impl RecordedEvent {
    /// Types a record; `None` when it has no `event` name.
    pub fn from_value(raw: Value) -> Option<RecordedEvent> {
        let name = raw.get("event")?.as_str()?.to_string();
        let text = |k: &str| match raw.get(k) {
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Number(n)) => Some(n.to_string()),
            _ => None,
        };
        let event = serde_json::from_value::<Event>(raw.clone()).unwrap_or_else(|_| Event::Other(raw.clone()));
        Some(RecordedEvent {
            time: super::records::time_field(&raw, "time"),
            node: text("node"),
            job_id: text("job_id"),
            slurm_attempt: raw.get("attempt").and_then(Value::as_u64),
            step: event.step(),
            name,
            event,
            raw,
        })
    }
}

/// Serialises as the line was read (every field, known or not).
impl Serialize for RecordedEvent {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.raw.serialize(serializer)
    }
}

/// Types every record that names an event.
pub fn events_from(records: Vec<Value>) -> Vec<RecordedEvent> {
    records.into_iter().filter_map(RecordedEvent::from_value).collect()
}

/// A field that may be absent (`None`), `null` (`Some(None)`) or a value.
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn line(event: &Event) -> Value {
        let ctx = EventContext { node: "n1".into(), job_id: Some("7".into()), attempt: 2 };
        serde_json::to_value(EventLine { time: "t".into(), context: &ctx, event }).unwrap()
    }

    #[test]
    fn events_are_tagged_by_name_next_to_the_envelope() {
        let v = line(&Event::Finish(Finish {
            step: 9,
            publish: PublishOutcome::Skipped { skipped: "publishing disabled".into() },
        }));
        assert_eq!(
            v,
            json!({"event": "finish", "time": "t", "node": "n1", "job_id": "7", "attempt": 2, "step": 9,
                   "publish": {"skipped": "publishing disabled"}})
        );
    }

    #[test]
    fn absent_null_and_value_stay_distinct() {
        let before =
            Event::Signal(Signal { signal: "SIGTERM".into(), step: None, before_training: true, ..Signal::default() });
        let v = line(&before);
        assert_eq!(v["step"], Value::Null);
        assert!(v.get("deadline_in_seconds").is_none() && v.get("arrival").is_none());
        let during = Event::Signal(Signal {
            signal: "stop_at_step".into(),
            step: Some(4),
            arrival: Some("a".into()),
            deadline_in_seconds: Some(None),
            before_training: false,
        });
        let v = line(&during);
        assert_eq!(v["deadline_in_seconds"], Value::Null);
        assert!(v.get("before_training").is_none());
        let back = RecordedEvent::from_value(v).unwrap();
        assert_eq!(back.event, during);
    }

    /// One table of every event variant, each filled in (long on purpose:
    /// a variant missing here is a record whose schema nothing checks).
    #[test]
    fn every_variant_round_trips_through_its_json() {
        let requeue = RequeueRecord {
            decision: RequeueDecision::Requeue { job_id: "7".into(), reason: "preempted".into() },
            answer: Some(RequeueAnswer::AlreadyPending),
            error: None,
        };
        let events = vec![
            Event::Start(Start { pid: 1, max_steps: Some(5), allocation: json!({"job_id": null}), ..Start::default() }),
            Event::LockTakeover(LockTakeover {
                reason: "its heartbeat on n1 is 61s old".into(),
                previous_host: Some("n1".into()),
                waited_seconds: 1.5,
                ..Default::default()
            }),
            Event::CheckpointRejected(CheckpointRejected { step: 3, failures: json!([]), ..Default::default() }),
            Event::CheckpointQuarantined(CheckpointQuarantined {
                step: 3,
                moved_to: Some("ckpt/quarantine/step-0000000003-20261123T120000Z".into()),
                reason: "model.safetensors: sha256 mismatch".into(),
                failures: json!([{"file": "model.safetensors", "problem": "sha256_mismatch"}]),
                ..Default::default()
            }),
            Event::Resume(Resume {
                step: 3,
                previous_node: Some("n0".into()),
                tier: Some("local".into()),
                source_node: Some("n1".into()),
                ..Default::default()
            }),
            Event::FreshStart(FreshStart { reason: "no checkpoint verifies".into(), rejected: 2 }),
            Event::GpuFallback(GpuFallback { reason: "r".into(), ..Default::default() }),
            Event::OomRetry(OomRetry { step: 2, retry: 1, error: "oom".into(), ..Default::default() }),
            Event::CheckpointStarted(CheckpointStarted {
                step: 5,
                kind: "periodic".into(),
                due_step: 4,
                snapshot_seconds: 0.01,
            }),
            Event::CheckpointSaved(CheckpointSaved {
                step: 5,
                kind: "final".into(),
                bytes: Some(10),
                ..Default::default()
            }),
            Event::CheckpointFailed(CheckpointFailed {
                step: 5,
                kind: "stop".into(),
                error: "e".into(),
                consecutive_failures: None,
            }),
            Event::PersisterDied(PersisterDied {
                step: Some(5),
                error: "panicked: boom".into(),
                action: "restarted".into(),
                consecutive_failures: 1,
            }),
            Event::Nonfinite(Nonfinite {
                step: 4,
                loss: None,
                grad_norm: Some(1.0),
                action: "stop".into(),
                ..Default::default()
            }),
            Event::Signal(Signal { signal: "SIGUSR1".into(), step: Some(2), ..Default::default() }),
            Event::Monitor(MonitorOutcome::Stopped { samples: 3, warnings: vec![], busy_seconds: 0.5 }),
            Event::Publish(PublishOutcome::Done {
                commit: None,
                pushed: false,
                attempts: 2,
                files: vec![],
                refused: vec![RefusedFile { file: "w.pkl".into(), reason: "not a publishable type".into() }],
                last_error: Some("x".into()),
                worktree: None,
            }),
            Event::Requeue(requeue.clone()),
            Event::Stop(Stop {
                step: Some(5),
                reason: "SIGTERM".into(),
                seconds_left: Some(Some(3.0)),
                requeue: Some(requeue),
                checkpoint_error: Some("disk full".into()),
                failures: vec!["summary: read-only file system".into()],
                ..Default::default()
            }),
            Event::Finish(Finish { step: 5, publish: PublishOutcome::Failed { error: "e".into() } }),
            Event::Error(ErrorEvent {
                step: Some(4),
                error: "boom".into(),
                class: Some(CrashClass::Transient),
                why: Some("an I/O error".into()),
                requeue: None,
                hold_seconds: Some(60),
                hold_error: None,
            }),
            Event::Hang(HangEvent {
                activity: "save".into(),
                thread: "persister".into(),
                step: 5,
                since: "2026-11-23T12:00:00.000Z".into(),
                stuck_seconds: 2.5,
                limit_seconds: 2.0,
                rank: None,
            }),
            Event::CheckpointInterval(CheckpointIntervalChosen {
                step: 40,
                interval_seconds: 120.0,
                reason: "young_daly".into(),
                young_daly_seconds: Some(120.0),
                cost_seconds: Some(2.0),
                cost_measured_as: Some("snapshot_stall_and_slowdown".into()),
                saves_measured: 3,
                mtbf_seconds: Some(3600.0),
                mtbf_source: "config".into(),
                ..Default::default()
            }),
            Event::ChildStart(ChildStart {
                command: vec!["python3".into(), "train.py".into()],
                pid: 42,
                protocol: 1,
                resume_from: Some("runs/x/checkpoints/step-0000000040".into()),
                resume_step: Some(40),
                checkpoint_dir: "runs/x/checkpoints/.staging".into(),
                stop_file: "runs/x/stop-requested.json".into(),
                deadline: Some(1_790_000_000),
                task: Some(1),
            }),
            Event::ChildExit(ChildExit {
                pid: 42,
                signal: Some("SIGKILL".into()),
                seconds: 12.5,
                stop_requested: true,
                killed_at_deadline: true,
                last_sealed_step: Some(40),
                verdict: "stopped".into(),
                stderr_tail: vec!["Traceback (most recent call last):".into()],
                ..Default::default()
            }),
            Event::RankLost(RankLost {
                rank: 1,
                rank_node: "n2".into(),
                pid: 4242,
                step: Some(17),
                silent_seconds: 3.2,
                timeout_seconds: 3.0,
                noticed_by: 0,
                world_size: 2,
            }),
            Event::LocalCheckpoint(LocalCheckpoint {
                step: 5,
                outcome: "committed".into(),
                holders: vec!["n1".into(), "n3".into()],
                bytes: 10,
                ..Default::default()
            }),
            Event::Recovery(Recovery {
                step: 6,
                resumed_from: 5,
                tier: "local".into(),
                fault: "rank_lost".into(),
                recovery_seconds: Some(12.5),
                in_job: true,
                ..Default::default()
            }),
            Event::Straggler(Straggler {
                rank: 1,
                rank_node: "n2".into(),
                step: 240,
                step_seconds: 0.31,
                median_seconds: 0.1,
                factor: 1.5,
                steps: 20,
                blamed: true,
                world_size: 2,
            }),
            Event::NodeUnhealthy(NodeUnhealthy {
                node: "n1".into(),
                check: "site command".into(),
                detail: "`check` exited 1 after 0.1s; output: bad HCA".into(),
                checks: json!({"checks": []}),
                launch: "7.0".into(),
                config_sha256: Some("c0ffee".into()),
            }),
            Event::NodesExcluded(NodesExcluded {
                cause: "node_unhealthy: site command".into(),
                blamed: vec!["n1".into()],
                added: vec!["n1".into()],
                excluded: vec!["n1".into(), "n9".into()],
                how: "requeue".into(),
                ..Default::default()
            }),
        ];
        assert_eq!(events.len(), EVENT_NAMES.len());
        // `exec`'s hang names the program's rank; `run`'s has no rank key.
        let program = Event::Hang(HangEvent { thread: "program".into(), rank: Some(1), ..HangEvent::default() });
        assert_eq!(line(&program)["rank"], 1);
        assert!(line(&events[EVENT_NAMES.iter().position(|n| *n == "hang").unwrap()]).get("rank").is_none());
        for (event, name) in events.iter().zip(EVENT_NAMES) {
            assert_eq!(event.name(), name);
            let v = line(event);
            assert_eq!(v["event"], name);
            let back = RecordedEvent::from_value(v).unwrap();
            assert_eq!(&back.event, event, "{name}");
        }
    }

    /// Adding a variant stops this from compiling until it is handled here:
    /// list it in [`EVENT_NAMES`] (and so in docs/run-directory.md).
    fn is_listed(event: &Event) -> bool {
        match event {
            Event::Start(_)
            | Event::LockTakeover(_)
            | Event::CheckpointRejected(_)
            | Event::CheckpointQuarantined(_)
            | Event::Resume(_)
            | Event::FreshStart(_)
            | Event::GpuFallback(_)
            | Event::OomRetry(_)
            | Event::CheckpointStarted(_)
            | Event::CheckpointSaved(_)
            | Event::CheckpointFailed(_)
            | Event::PersisterDied(_)
            | Event::Nonfinite(_)
            | Event::Signal(_)
            | Event::Monitor(_)
            | Event::Publish(_)
            | Event::Requeue(_)
            | Event::Stop(_)
            | Event::Finish(_)
            | Event::Error(_)
            | Event::Hang(_)
            | Event::CheckpointInterval(_)
            | Event::ChildStart(_)
            | Event::ChildExit(_)
            | Event::RankLost(_)
            | Event::LocalCheckpoint(_)
            | Event::Recovery(_)
            | Event::Straggler(_)
            | Event::NodeUnhealthy(_)
            | Event::NodesExcluded(_) => EVENT_NAMES.contains(&event.name()),
            Event::Other(_) => false,
        }
    }

    #[test]
    fn every_listed_name_reads_as_its_own_variant() {
        for name in EVENT_NAMES {
            let fields = match name {
                "monitor" => json!({"event": name, "samples": 1, "warnings": [], "busy_seconds": 0.0}),
                "publish" => json!({"event": name, "skipped": "publishing disabled"}),
                "requeue" => json!({"event": name, "decision": "skip", "reason": "r"}),
                _ => json!({"event": name}),
            };
            let e = RecordedEvent::from_value(fields).unwrap();
            assert!(is_listed(&e.event), "{name} reads as {:?}", e.event);
            assert_eq!(e.event.name(), name);
        }
    }

    /// The section of docs/run-directory.md that documents each event (`### `name``).
    fn documented_events() -> Vec<String> {
        let doc = include_str!("../../docs/run-directory.md");
        let section = doc.split("\n## events.jsonl").nth(1).expect("docs/run-directory.md has ## events.jsonl");
        let section = section.split("\n## ").next().unwrap_or_default();
        section.lines().filter_map(|l| l.strip_prefix("### `")?.strip_suffix('`').map(str::to_string)).collect()
    }

    #[test]
    fn every_event_is_documented_and_every_documented_event_exists() {
        let documented = documented_events();
        for name in EVENT_NAMES {
            assert!(documented.iter().any(|d| d == name), "event `{name}` is missing from docs/run-directory.md");
        }
        for name in &documented {
            assert!(EVENT_NAMES.contains(&name.as_str()), "docs/run-directory.md documents `{name}`, not an event");
        }
        assert_eq!(documented.len(), EVENT_NAMES.len(), "an event is documented twice: {documented:?}");
    }

    #[test]
    fn unknown_kinds_and_fields_are_kept_not_rejected() {
        let v = json!({"event": "teleport", "time": "2026-11-01T10:00:00Z", "step": 3, "where": "moon"});
        let e = RecordedEvent::from_value(v.clone()).unwrap();
        assert_eq!(e.event, Event::Other(v));
        assert_eq!((e.name.as_str(), e.event.name(), e.step), ("teleport", "teleport", Some(3)));
        let e = RecordedEvent::from_value(json!({"event": "resume", "step": 3, "flux": 1})).unwrap();
        assert!(matches!(e.event, Event::Resume(Resume { step: 3, .. })));
        assert_eq!(e.raw["flux"], 1);
        // A known kind whose field has the wrong type is kept whole, too.
        let e = RecordedEvent::from_value(json!({"event": "resume", "step": "three"})).unwrap();
        assert!(matches!(e.event, Event::Other(_)));
        assert_eq!(e.name, "resume");
    }
}
