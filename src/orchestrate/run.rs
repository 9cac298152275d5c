//! `rekindle run`: the lifecycle of one attempt of a run, as a sequence of
//! phases, each in its own file under `run/`:
//!
//! ```text
//! run          load config ─ lock the run dir ─ prepare it
//! start.rs     open records ─ place on devices (devices.rs) ─ `start` event
//!              ─ resume from the newest checkpoint that verifies (or start
//!              at step 0) ─ trim metrics ─ start the GPU/host monitor
//! train_loop   steps (out of memory: retry with half the micro-batch, at most
//!              5 times) ─ metrics ─ periodic checkpoints persisted in the
//!              background (saving.rs)
//! ending.rs    max_steps: final checkpoint, summary, publish, `finish`, exit 0
//!              stop signal / --stop-at-step: stop checkpoint, requeue
//!              (slurm::requeue_after_stop), summary, publish, `stop`; each
//!              failure recorded and passed over; exit 75 with a durable
//!              checkpoint (this attempt's or an earlier one, named), else 1
//!              (third signal or deadline passed: exit at once, budget.rs)
//!              failure: `error`, failed summary, exit 1
//! ```
//!
//! The training loop runs on this thread and polls the stop flag between
//! micro-batches; the signal handler only records. A stop signal that
//! arrives before training began ends the attempt in `start` (still
//! requeueing the job when it should be).

mod ending;
mod saving;
mod start;

use std::path::PathBuf;
use std::time::Instant;

use crate::checkpoint::{CheckpointStore, TensorSet};
use crate::config::{self, Config};
use crate::exit::Outcome;
use crate::gpu::Monitor;
use crate::slurm::SlurmEnv;
use crate::telemetry::{EventContext, EventLog, JsonlWriter, MetricsLine, StepLine, ValLine, now_rfc3339};
use crate::train::{StepMetrics, StepResult, TrainError, Trainer};

use super::devices::Devices;
use super::error::RunError;
use super::lock::{LockOwnership, LockRequest, RunLock};
use super::persist::Persister;
use super::progress::Progress;
use super::rundir::{self, RunDir};
use super::stop::{StopFlag, StopReason};
use ending::Ending;

/// What `rekindle run` was asked to do.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    pub config_path: PathBuf,
    pub overrides: Vec<String>,
    pub run_dir: Option<PathBuf>,
    pub allow_config_change: bool,
    pub stop_at_step: Option<u64>,
}

/// Runs (or resumes) training; returns `Done` when `max_steps` is reached and
/// `StoppedWithCheckpoint` after a stop with a durable checkpoint.
pub fn run(opts: &RunOptions) -> Result<Outcome, RunError> {
    // Handlers first: a signal that arrives while the config loads or the
    // model builds is recorded, and honoured as soon as it can be.
    let stop = StopFlag::install().map_err(|source| RunError::RunDir { path: PathBuf::from("<signals>"), source })?;
    let loaded = config::load(&opts.config_path, &opts.overrides)?;
    let cfg = loaded.config;
    let slurm = SlurmEnv::from_process();
    if let Some(tasks) = slurm.several_tasks() {
        return Err(RunError::SeveralTasks { tasks });
    }
    let root = rundir::resolve_run_dir(opts.run_dir.as_deref(), &cfg);
    // Lock before writing anything into the directory: a run refused because
    // another one is live must leave that run's config.toml alone.
    std::fs::create_dir_all(&root).map_err(|source| RunError::RunDir { path: root.clone(), source })?;
    let lock = RunLock::acquire(&root, LockRequest::for_allocation(&slurm, cfg.lock.stale_after))?;
    let dir = rundir::prepare(&root, &cfg, opts.allow_config_change)?;
    tracing::info!(run = %cfg.run.name, dir = %dir.root.display(), node = %slurm.node_name(), job = ?slurm.job_id, restart = slurm.restart_count, "run directory ready");
    match Attempt::start(cfg, dir, stop, opts.stop_at_step, slurm, lock.ownership())? {
        Started::Ready(attempt) => attempt.train(),
        Started::StoppedEarly(outcome) => Ok(outcome),
    }
}

enum Started {
    Ready(Box<Attempt>),
    /// A stop signal arrived before training could begin.
    StoppedEarly(Outcome),
}

/// One attempt: the state that lives from start (or resume) to exit.
struct Attempt {
    cfg: Config,
    dir: RunDir,
    store: CheckpointStore,
    persister: Persister,
    events: EventLog,
    metrics: JsonlWriter,
    trainer: Trainer,
    devices: Devices,
    /// Writes `gpu_stats.jsonl`; stopped at exit (or when dropped).
    monitor: Option<Monitor>,
    stop: StopFlag,
    stop_at_step: Option<u64>,
    slurm: SlurmEnv,
    started: Instant,
    start_step: u64,
    checkpoints_written: u64,
    consecutive_failures: u32,
    last_checkpoint: Instant,
    last_durable_step: Option<u64>,
    last_loss: Option<f64>,
    best_loss: Option<f64>,
    resumes: u64,
    /// Whether the run-directory lock is still ours: lost once the heartbeat
    /// or a commit's check finds another process took the run directory.
    lock: LockOwnership,
    /// Host buffers of the last persisted snapshot, reused by the next one.
    spare: Option<(TensorSet, TensorSet)>,
}

impl Attempt {
    fn stop_reason(&self) -> Option<StopReason> {
        self.stop
            .signal()
            .or_else(|| self.stop_at_step.filter(|k| self.trainer.step() >= *k).map(|_| StopReason::StopAtStep))
    }

    /// Trains to the end or to a stop; a failure is recorded in
    /// `events.jsonl` and `summary.json` before it is returned.
    fn train(mut self: Box<Self>) -> Result<Outcome, RunError> {
        let result = self.train_loop();
        if let Err(e) = &result
            && !matches!(e, RunError::LockLost { .. })
        {
            self.fail(e);
        }
        result
    }

    fn train_loop(&mut self) -> Result<Outcome, RunError> {
        let max_steps = self.cfg.run.max_steps;
        let progress = Progress::new(self.trainer.step(), max_steps);
        loop {
            if let Err(lost) = self.still_owner() {
                progress.finish();
                return Err(lost);
            }
            self.collect_background()?;
            if let Some(reason) = self.stop_reason() {
                progress.finish();
                return self.stop(reason);
            }
            if self.trainer.step() >= max_steps {
                break;
            }
            let stop = self.stop.clone();
            let lock = self.lock.clone();
            let should_stop = move || stop.is_set() || lock.is_lost();
            let result = self.devices.step(&mut self.trainer, &self.cfg, &should_stop);
            self.devices.record_events(&mut self.events)?;
            match result {
                Ok(StepResult::Interrupted) => continue,
                Ok(StepResult::Completed(m)) => self.after_step(&m, &progress)?,
                Ok(StepResult::NonFiniteStop(ev)) => {
                    progress.finish();
                    return self.nonfinite_stop(ev);
                }
                Ok(StepResult::NonFiniteRollback(ev)) => self.rollback(ev)?,
                Err(RunError::Train(e @ TrainError::OutOfMemoryRetriesExhausted { .. })) => {
                    progress.finish();
                    return self.out_of_memory_stop(e);
                }
                Err(e) => return Err(e),
            }
        }
        progress.finish();
        self.end(Ending::Finished)
    }

    /// `LockLost` once the run-directory lock is known lost: from then on
    /// this attempt writes nothing more into the run directory.
    fn still_owner(&self) -> Result<(), RunError> {
        if self.lock.is_lost() {
            return Err(RunError::LockLost { dir: self.dir.root.clone() });
        }
        Ok(())
    }

    fn after_step(&mut self, m: &StepMetrics, progress: &Progress) -> Result<(), RunError> {
        let max_steps = self.cfg.run.max_steps;
        tracing::debug!(
            step = m.step,
            loss = m.loss,
            lr = m.lr,
            grad_norm = m.grad_norm,
            samples_per_s = m.samples_per_s,
            "step"
        );
        if m.step.is_multiple_of(self.cfg.train.log_every) || m.step == max_steps {
            self.metrics.append(&MetricsLine::Step(step_line(m)))?;
        }
        if m.loss.is_finite() {
            self.last_loss = Some(m.loss);
            self.best_loss = Some(self.best_loss.map_or(m.loss, |b| b.min(m.loss)));
        }
        progress.update(m.step, m.loss);
        let eval_every = self.cfg.train.eval_every;
        if eval_every > 0 && m.step.is_multiple_of(eval_every) && !self.stop.is_set() {
            let val_loss = self.trainer.evaluate()?;
            self.metrics.append(&MetricsLine::Val(ValLine {
                step: m.step,
                val_loss: Some(val_loss),
                time: now_rfc3339(),
            }))?;
        }
        if self.periodic_checkpoint_due(m.step) && m.step < max_steps && self.stop_reason().is_none() {
            self.periodic_checkpoint()?;
        }
        Ok(())
    }
}

/// The `metrics.jsonl` line of a completed step.
fn step_line(m: &StepMetrics) -> StepLine {
    StepLine {
        step: m.step,
        loss: Some(m.loss),
        lr: Some(m.lr),
        grad_norm: Some(m.grad_norm),
        clipped: m.clipped,
        samples: m.samples,
        tokens: m.tokens,
        samples_per_s: Some(m.samples_per_s),
        tokens_per_s: m.tokens_per_s,
        loss_scale: m.loss_scale,
        skipped_nonfinite: m.skipped_nonfinite,
        epoch: m.epoch,
        elapsed_s: Some(m.elapsed_s),
        time: now_rfc3339(),
    }
}

/// Fields added to every event.
fn context(slurm: &SlurmEnv) -> EventContext {
    EventContext { node: slurm.node_name(), job_id: slurm.job_id.clone(), attempt: slurm.restart_count }
}
