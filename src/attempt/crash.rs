//! What a crash during training means for the job, as pure functions:
//! [`classify`] sorts the error into transient (an I/O or device error: a new
//! attempt, maybe on another node, may pass) or deterministic (config, shape
//! mismatch, non-finite numbers, out of memory, a bug: it would fail the same
//! way again), and [`decide`] turns the class and the history into a requeue
//! with a hold (backoff) or none. The `scontrol` calls are in
//! `slurm::requeue_after_crash`; the records in `run/ending.rs`.
//!
//! "In a row" is counted from `events.jsonl` ([`crash_requeues_in_a_row`]):
//! crash requeues since the last checkpoint saved. A run that checkpoints
//! between crashes is making progress and keeps being requeued; one that
//! crashes before its next checkpoint stops after `[run] max_crash_requeues`.

use std::time::Duration;

use crate::checkpoint::CheckpointError;
use crate::gpu::GpuError;
use crate::telemetry::{CrashClass, Event, RequeueRecord, TelemetryError};
use crate::train::TrainError;

use crate::attempt::error::RunError;
use crate::rundir::lock::LockError;

/// The hold before the first crash requeue starts again; doubled per crash
/// requeue in a row, at most [`MAX_HOLD`]. SLURM already waits for its job
/// credential to expire before a requeued job runs (120 s by default), so
/// this is on top of that: long enough for a flapping filesystem or a node
/// being drained to settle, short next to a job's time in the queue.
pub const FIRST_HOLD: Duration = Duration::from_secs(60);

/// The longest hold.
pub const MAX_HOLD: Duration = Duration::from_secs(15 * 60);

/// What to do after a crash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CrashAction {
    /// Ask SLURM to requeue (the usual requeue rules still apply) and hold the
    /// job back for `hold` before it starts again.
    Requeue { hold: Duration },
    /// Exit 1 with the error; `reason` says why there is no requeue.
    NoRequeue { reason: String },
}

/// The class of `error`, and why. `steps_this_attempt` is history: a step
/// that fails after this attempt trained others failed where the same code
/// passed (a device error); failing on the very first step is a setup
/// problem (a shape or dtype mismatch) that a new attempt would repeat.
pub fn classify(error: &RunError, steps_this_attempt: u64) -> (CrashClass, String) {
    use CrashClass::{Deterministic, Transient};
    let (class, why): (CrashClass, &str) = match error {
        RunError::Config(_) | RunError::Dir(_) | RunError::CheckpointSettingsChanged { .. } => {
            (Deterministic, "a configuration error")
        }
        RunError::Unusable(_) => (Deterministic, "the config's model or data cannot be used"),
        RunError::Distributed(_) => (Deterministic, "the ranks were launched wrongly (see docs/distributed.md)"),
        RunError::Ranks { .. } => (Deterministic, "the ranks of a data-parallel run disagree"),
        RunError::RunDir { .. } => (Transient, "an I/O error on the run directory"),
        RunError::Claim(e) => claim_class(e),
        RunError::Checkpoint(e) => return checkpoint_class(e),
        RunError::Telemetry(TelemetryError::Write { .. }) => (Transient, "an I/O error writing the records"),
        RunError::Train(e) => return train_class(e, steps_this_attempt),
        RunError::Restore { .. } => {
            (Deterministic, "a checkpoint that verifies does not fit this model (shape or state mismatch)")
        }
        RunError::Lock(LockError::Io { .. }) => (Transient, "an I/O error on the lock file"),
        RunError::Lock(LockError::Held { .. } | LockError::HolderAlive { .. }) => {
            (Deterministic, "another live run holds the run directory")
        }
        RunError::Lock(LockError::NotALock { .. }) => (Deterministic, "something else stands where the lock file goes"),
        RunError::Lock(LockError::GaveUp { .. }) => {
            (Transient, "the run-directory lock stayed busy (a shared filesystem that stalls)")
        }
        RunError::LockLost { .. } => (Deterministic, "another process took the run directory over"),
        RunError::NonFinite { .. } => (Deterministic, "a non-finite loss or gradient"),
        RunError::NothingToRollBackTo { .. } => (Deterministic, "a non-finite step with no checkpoint to roll back to"),
        RunError::CheckpointsFailing { last, .. } => return checkpoint_class(last),
        RunError::PersisterDied { .. } => (Deterministic, "the checkpoint thread panicked repeatedly (a bug)"),
        RunError::Gpu(e) => return gpu_class(e),
        RunError::GpuRequired { .. } => (Deterministic, "[gpu] require = true and no usable GPU was allocated"),
        RunError::OutOfMemory { .. } => (Deterministic, "out of memory at the smallest micro-batch"),
        RunError::StoppedBeforeFirstCheckpoint { .. } => {
            (Transient, "stopped before the first checkpoint; the stop path decided the requeue")
        }
        RunError::StopWithoutCheckpoint { .. } => {
            (Transient, "the stop checkpoint failed (an I/O error); the stop path decided the requeue")
        }
        RunError::ChildSpawn { .. } => (Deterministic, "the program could not be started"),
        RunError::ChildFailed { class, why, .. } => return (*class, why.clone()),
        RunError::ExecRuntime { .. } => (Transient, "the supervisor's event loop could not start (a resource limit)"),
        RunError::Seal { .. } => (Deterministic, "`rekindle seal` was called wrongly"),
        RunError::World { .. } => (Transient, "the tasks of the job step could not meet (a task failed or its node)"),
        RunError::Unhealthy { .. } => (Transient, "a node failed its health check; its requeue was decided then"),
        RunError::NoProgress { .. } => {
            (Deterministic, "attempts in a row made no progress ([run] max_attempts_without_progress)")
        }
    };
    (class, why.to_string())
}

fn claim_class(e: &crate::confine::ClaimError) -> (CrashClass, &'static str) {
    if e.is_io() {
        (CrashClass::Transient, "an I/O error preparing the run directory")
    } else {
        (CrashClass::Deterministic, "a run or checkpoints directory that is not rekindle's")
    }
}

fn checkpoint_class(e: &CheckpointError) -> (CrashClass, String) {
    use CrashClass::{Deterministic, Transient};
    let (class, why) = match e {
        CheckpointError::Claim(e) => claim_class(e),
        CheckpointError::CreateDir { .. }
        | CheckpointError::ListDir { .. }
        | CheckpointError::Write { .. }
        | CheckpointError::Remove { .. }
        | CheckpointError::ReplaceMoveAside { .. }
        | CheckpointError::ReplaceRename { .. }
        | CheckpointError::SyncDir { .. }
        | CheckpointError::Quarantine { .. }
        | CheckpointError::Injected(_) => (Transient, "an I/O error writing a checkpoint"),
        CheckpointError::NoSpace { .. } => (Transient, "no space for a checkpoint (space may be freed)"),
        CheckpointError::Parts { .. } => (Transient, "another rank could not write its part of a checkpoint"),
        CheckpointError::World { .. } => (Transient, "a rank of the program did not seal its part of a checkpoint"),
        CheckpointError::BadTensor { .. } => (Deterministic, "a tensor that cannot be saved"),
        CheckpointError::NotOwner { .. } => (Deterministic, "another process took the run directory over"),
        CheckpointError::WrongKind { .. } => (Deterministic, "a checkpoint of the other lifecycle (run or exec)"),
        CheckpointError::Seal { .. } => (Deterministic, "a staged directory that cannot be sealed"),
        CheckpointError::Invalid { .. } | CheckpointError::NotACheckpoint { .. } => {
            (Deterministic, "a checkpoint that does not verify")
        }
        CheckpointError::AfterCommit { source, .. } => return checkpoint_class(source),
    };
    (class, why.to_string())
}

fn train_class(e: &TrainError, steps_this_attempt: u64) -> (CrashClass, String) {
    use CrashClass::{Deterministic, Transient};
    let (class, why) = match e {
        TrainError::Step { .. } if steps_this_attempt > 0 => {
            (Transient, "a step failed after this attempt trained others (a device error)")
        }
        TrainError::Step { .. } => {
            (Deterministic, "the first step of this attempt failed (a shape, dtype or setup error)")
        }
        TrainError::Eval { .. } if steps_this_attempt > 0 => (Transient, "an evaluation failed (a device error)"),
        TrainError::Eval { .. } => (Deterministic, "an evaluation failed before any step (a setup error)"),
        TrainError::Io { .. } => (Transient, "an I/O error reading the data"),
        TrainError::Collective { .. } => (Transient, "the ranks could not agree (a rank or a link failed)"),
        TrainError::OutOfMemory { .. } | TrainError::OutOfMemoryRetriesExhausted { .. } => {
            (Deterministic, "out of memory at the smallest micro-batch")
        }
        TrainError::Config { .. }
        | TrainError::UnsupportedDtype { .. }
        | TrainError::Build { .. }
        | TrainError::InvalidDataset { .. }
        | TrainError::EmptyData { .. } => (Deterministic, "a configuration or data error"),
        TrainError::Tensor { .. }
        | TrainError::MissingTensor { .. }
        | TrainError::UnexpectedTensor { .. }
        | TrainError::TensorMismatch { .. }
        | TrainError::State { .. } => (Deterministic, "a shape or state mismatch"),
    };
    (class, why.to_string())
}

fn gpu_class(e: &GpuError) -> (CrashClass, String) {
    use CrashClass::{Deterministic, Transient};
    let (class, why) = match e {
        GpuError::InventoryRead { .. } | GpuError::InventorySyntax { .. } | GpuError::InventoryField { .. } => {
            (Deterministic, "a bad GPU inventory file")
        }
        GpuError::NoPlacement { .. } => (Deterministic, "no placement fits the model"),
        GpuError::Probe { .. } => (Transient, "a device error"),
        GpuError::StatsWrite { .. } | GpuError::MonitorSpawn(_) => (Transient, "an I/O error of the monitor"),
    };
    (class, why.to_string())
}

/// Whether a crash classified `class` was a device error on this node (a
/// step or evaluation failing after others passed, a GPU the driver lost):
/// what `crate::health::blame` blames the node for. I/O on shared storage
/// and ranks that could not agree blame nobody.
pub fn is_device_error(error: &RunError, class: CrashClass) -> bool {
    class == CrashClass::Transient
        && matches!(
            error,
            RunError::Train(TrainError::Step { .. } | TrainError::Eval { .. }) | RunError::Gpu(GpuError::Probe { .. })
        )
}

/// Whether to requeue after a crash of `class`, given the crash requeues in
/// a row so far and `[run] max_crash_requeues`. `stop_path_decided`: the
/// error came out of the stop path, which has made its own requeue decision.
pub fn decide(class: CrashClass, in_a_row: u32, max_crash_requeues: u32, stop_path_decided: bool) -> CrashAction {
    if stop_path_decided {
        return CrashAction::NoRequeue { reason: "the stop path already made the requeue decision".into() };
    }
    match class {
        CrashClass::Deterministic => {
            CrashAction::NoRequeue { reason: "a deterministic error: a new attempt would fail the same way".into() }
        }
        CrashClass::Transient if in_a_row >= max_crash_requeues => CrashAction::NoRequeue {
            reason: format!(
                "{in_a_row} crash requeues in a row without a new checkpoint ([run] max_crash_requeues = \
                 {max_crash_requeues}): not requeueing again"
            ),
        },
        CrashClass::Transient => CrashAction::Requeue { hold: hold_after(in_a_row) },
    }
}

/// The hold before a job requeued after `in_a_row` earlier crash requeues starts again.
pub fn hold_after(in_a_row: u32) -> Duration {
    FIRST_HOLD.saturating_mul(1u32.checked_shl(in_a_row).unwrap_or(u32::MAX)).min(MAX_HOLD)
}

/// Crash requeues SLURM accepted since the last checkpoint saved, from the
/// events of the run so far. A hang's requeue counts as one (its `stop`
/// event, reason `hang: …`), and so does a lost rank's (`rank_lost: …`): a
/// job that hangs at the same place after every restart is a crash loop too.
pub fn crash_requeues_in_a_row(events: &[Event]) -> u32 {
    let accepted = |r: &Option<RequeueRecord>| r.as_ref().is_some_and(|r| r.answer.is_some());
    events.iter().fold(0, |n, e| match e {
        Event::CheckpointSaved(_) => 0,
        Event::Error(err) if accepted(&err.requeue) => n + 1,
        Event::Stop(stop)
            if (stop.reason.starts_with("hang:") || stop.reason.starts_with("rank_lost:"))
                && accepted(&stop.requeue) =>
        {
            n + 1
        }
        _ => n,
    })
}

#[cfg(test)]
mod tests {
    use std::io;

    use crate::rundir::RunDirRefusal;
    use std::path::PathBuf;

    use super::*;
    use crate::config::ConfigError;
    use crate::telemetry::{CheckpointSaved, ErrorEvent, RequeueAnswer, RequeueDecision, Stop};
    use CrashClass::{Deterministic, Transient};

    fn io_error() -> io::Error {
        io::Error::other("EIO")
    }

    fn path() -> PathBuf {
        PathBuf::from("/runs/x")
    }

    fn step_error() -> TrainError {
        TrainError::Step { step: 9, during: "the forward pass", message: "device lost".into() }
    }

    /// Every variant family of `RunError`, with the class it must get after
    /// some steps of the attempt have been trained.
    fn table() -> Vec<(RunError, CrashClass)> {
        let ckpt_io = || CheckpointError::Write { step: 5, path: path(), source: io_error() };
        vec![
            (RunError::Config(ConfigError::Invalid { source_name: "c.toml".into(), problems: vec![] }), Deterministic),
            (RunError::Dir(RunDirRefusal::ConfigChanged { path: path(), diff: vec![] }), Deterministic),
            (RunError::CheckpointSettingsChanged { dir: path(), diff: vec![] }, Deterministic),
            (RunError::Dir(RunDirRefusal::PreviousConfig { path: path(), reason: "r".into() }), Deterministic),
            (RunError::Unusable(TrainError::config("data.path", "r")), Deterministic),
            (
                RunError::Dir(RunDirRefusal::OtherCommand { dir: path(), step: 1, theirs: "exec", ours: "run" }),
                Deterministic,
            ),
            (
                RunError::Distributed(crate::distributed::DistributedError::NotBuiltWithMpi {
                    size: 2,
                    launcher: crate::distributed::Launcher::Slurm,
                }),
                Deterministic,
            ),
            (RunError::Ranks { what: "w".into() }, Deterministic),
            (RunError::StoppedBeforeFirstCheckpoint { reason: "SIGTERM".into() }, Transient),
            (
                RunError::Train(TrainError::Collective { step: 9, during: "the gradient sum", message: "m".into() }),
                Transient,
            ),
            (RunError::Checkpoint(CheckpointError::SyncDir { path: path(), source: io_error() }), Transient),
            (RunError::RunDir { path: path(), source: io_error() }, Transient),
            (RunError::Checkpoint(ckpt_io()), Transient),
            (RunError::Checkpoint(CheckpointError::Injected("checkpoint::before_manifest".into())), Transient),
            (
                RunError::Checkpoint(CheckpointError::NoSpace { step: 5, path: path(), needed: 2, available: 1 }),
                Transient,
            ),
            (
                RunError::Checkpoint(CheckpointError::BadTensor { step: 5, name: "w".into(), reason: "r".into() }),
                Deterministic,
            ),
            (RunError::Checkpoint(CheckpointError::NotACheckpoint { path: path() }), Deterministic),
            (
                RunError::Checkpoint(CheckpointError::AfterCommit {
                    step: 5,
                    dir: path(),
                    stage: "rotation",
                    source: Box::new(ckpt_io()),
                }),
                Transient,
            ),
            (RunError::Telemetry(TelemetryError::Write { path: path(), source: io_error() }), Transient),
            (RunError::Train(step_error()), Transient),
            (RunError::Train(TrainError::Eval { step: 9, message: "m".into() }), Transient),
            (RunError::Train(TrainError::Io { path: path(), source: io_error() }), Transient),
            (RunError::Train(TrainError::Config { key: "k".into(), reason: "r".into() }), Deterministic),
            (
                RunError::Train(TrainError::TensorMismatch {
                    set: "model",
                    name: "w".into(),
                    expected: "shape [2], dtype F32".into(),
                    found: "shape [3], dtype F32".into(),
                }),
                Deterministic,
            ),
            (
                RunError::Train(TrainError::OutOfMemory {
                    step: 9,
                    micro_batch: 1,
                    during: "the forward pass",
                    message: "m".into(),
                }),
                Deterministic,
            ),
            (RunError::Restore { dir: path(), source: step_error() }, Deterministic),
            (RunError::Lock(LockError::Io { path: path(), source: io_error() }), Transient),
            (
                RunError::Lock(LockError::Held {
                    dir: path(),
                    lock: path(),
                    pid: 1,
                    host: "h".into(),
                    job: "j".into(),
                    age_s: 0.0,
                }),
                Deterministic,
            ),
            (RunError::LockLost { dir: path() }, Deterministic),
            (RunError::NonFinite { step: 9, loss: f64::NAN, grad_norm: 1.0 }, Deterministic),
            (RunError::NothingToRollBackTo { step: 9, dir: path() }, Deterministic),
            (RunError::CheckpointsFailing { count: 3, last: ckpt_io() }, Transient),
            (RunError::PersisterDied { count: 3, error: "panicked".into() }, Deterministic),
            (RunError::Gpu(GpuError::Probe { vendor: "nvidia", message: "Xid 79".into() }), Transient),
            (RunError::Gpu(GpuError::NoPlacement { reason: "r".into() }), Deterministic),
            (RunError::GpuRequired { reason: "r".into() }, Deterministic),
            (RunError::OutOfMemory { step: 9, checkpoint: path(), source: step_error() }, Deterministic),
            (RunError::StopWithoutCheckpoint { reason: "SIGTERM".into(), step: 9, error: "e".into() }, Transient),
        ]
    }

    #[test]
    fn only_a_transient_step_or_device_failure_is_a_device_error() {
        assert!(is_device_error(&RunError::Train(step_error()), Transient));
        assert!(!is_device_error(&RunError::Train(step_error()), Deterministic));
        let gpu = RunError::Gpu(GpuError::Probe { vendor: "NVIDIA", message: "lost".into() });
        assert!(is_device_error(&gpu, Transient));
        let io = RunError::RunDir { path: path(), source: io_error() };
        assert!(!is_device_error(&io, Transient));
    }

    #[test]
    fn every_error_family_gets_its_class_and_a_reason() {
        for (error, class) in table() {
            let (got, why) = classify(&error, 8);
            assert_eq!(got, class, "{error:?}: {why}");
            assert!(!why.is_empty());
        }
    }

    #[test]
    fn a_step_or_eval_that_fails_before_any_step_passed_is_deterministic() {
        assert_eq!(classify(&RunError::Train(step_error()), 0).0, Deterministic);
        assert_eq!(classify(&RunError::Train(TrainError::Eval { step: 0, message: "m".into() }), 0).0, Deterministic);
        assert_eq!(classify(&RunError::Train(step_error()), 1).0, Transient);
    }

    #[test]
    fn transient_crashes_requeue_with_a_growing_hold_up_to_the_bound() {
        assert_eq!(decide(Transient, 0, 3, false), CrashAction::Requeue { hold: Duration::from_secs(60) });
        assert_eq!(decide(Transient, 1, 3, false), CrashAction::Requeue { hold: Duration::from_secs(120) });
        assert_eq!(decide(Transient, 2, 3, false), CrashAction::Requeue { hold: Duration::from_secs(240) });
        let stop = decide(Transient, 3, 3, false);
        assert!(matches!(&stop, CrashAction::NoRequeue { reason } if reason.contains("max_crash_requeues = 3")));
        assert!(matches!(decide(Transient, 0, 0, false), CrashAction::NoRequeue { .. }), "0 turns it off");
    }

    #[test]
    fn deterministic_crashes_and_stop_path_errors_never_requeue() {
        for in_a_row in [0, 1, 5] {
            assert!(matches!(decide(Deterministic, in_a_row, 3, false), CrashAction::NoRequeue { .. }));
            assert!(matches!(decide(Transient, in_a_row, 3, true), CrashAction::NoRequeue { .. }));
        }
    }

    #[test]
    fn the_whole_table_requeues_exactly_transient_crashes_within_the_bound() {
        for (error, _) in table() {
            for steps in [0, 8] {
                for in_a_row in 0..5 {
                    let (class, _) = classify(&error, steps);
                    let stop_path = matches!(error, RunError::StopWithoutCheckpoint { .. });
                    let action = decide(class, in_a_row, 3, stop_path);
                    let expect = class == Transient && in_a_row < 3 && !stop_path;
                    assert_eq!(matches!(action, CrashAction::Requeue { .. }), expect, "{error:?} {steps} {in_a_row}");
                }
            }
        }
    }

    #[test]
    fn the_hold_doubles_and_is_capped() {
        assert_eq!(hold_after(0), FIRST_HOLD);
        assert_eq!(hold_after(3), Duration::from_secs(480));
        assert_eq!(hold_after(4), MAX_HOLD);
        assert_eq!(hold_after(40), MAX_HOLD, "no overflow");
    }

    fn crash(answered: bool) -> Event {
        let decision = RequeueDecision::Requeue { job_id: "7".into(), reason: "r".into() };
        let answer = answered.then_some(RequeueAnswer::Requeued);
        Event::Error(ErrorEvent {
            requeue: Some(RequeueRecord { decision, answer, error: None }),
            ..ErrorEvent::default()
        })
    }

    #[test]
    fn crash_requeues_are_counted_since_the_last_checkpoint() {
        let saved = Event::CheckpointSaved(CheckpointSaved::default());
        let plain_error = Event::Error(ErrorEvent::default());
        assert_eq!(crash_requeues_in_a_row(&[]), 0);
        assert_eq!(crash_requeues_in_a_row(&[crash(true), crash(true)]), 2);
        assert_eq!(crash_requeues_in_a_row(&[crash(true), saved.clone(), crash(true)]), 1);
        assert_eq!(crash_requeues_in_a_row(&[crash(true), crash(false), plain_error]), 1, "only accepted requeues");
        assert_eq!(crash_requeues_in_a_row(&[crash(true), saved]), 0);
        let hang = |reason: &str| {
            Event::Stop(Stop {
                reason: reason.into(),
                requeue: Some(RequeueRecord {
                    decision: RequeueDecision::Requeue { job_id: "7".into(), reason: "r".into() },
                    answer: Some(RequeueAnswer::Requeued),
                    error: None,
                }),
                ..Stop::default()
            })
        };
        assert_eq!(crash_requeues_in_a_row(&[crash(true), hang("hang: step")]), 2, "a hang's requeue counts");
        assert_eq!(crash_requeues_in_a_row(&[hang("SIGTERM")]), 0, "a preemption's does not");
        assert_eq!(
            crash_requeues_in_a_row(&[hang("rank_lost: rank 1"), hang("hang: step")]),
            2,
            "a lost rank's counts"
        );
    }
}
