//! `rekindle run`: the lifecycle of one attempt of a run.
//!
//! ```text
//! load config ─ prepare run dir ─ lock it ─ open store (remove leftovers)
//!   ─ place on devices (plan, GPU backend or CPU fallback; devices.rs)
//!   ─ resume from the newest checkpoint that verifies (or start at step 0)
//!   ─ start the GPU/host monitor (gpu_stats.jsonl)
//!   ─ train: periodic checkpoints persisted in the background; out of
//!       memory: retry the step with half the micro-batch, at most 5 times,
//!       then checkpoint the last completed step, exit 1
//!   ─ stop signal / --stop-at-step:  wait for the save in flight, checkpoint the
//!       last completed step synchronously, publish, decide on requeue, exit 75
//!   ─ max_steps reached:  final checkpoint, summary, publish, exit 0
//! ```
//!
//! The training loop runs on this thread and polls the stop flag between
//! micro-batches; the signal handler only records.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::checkpoint::{CheckpointStore, MANIFEST_FILE, SaveReport, Snapshot};
use crate::config::{self, Config};
use crate::exit::Outcome;
use crate::gpu::Monitor;
use crate::publish::{self, PublishRequest};
use crate::slurm::{self, Decision, RequeueInput, Scontrol, SlurmControl, SlurmEnv, StopKind};
use crate::telemetry::{
    CheckpointFailed, CheckpointRejected, CheckpointSaved, ErrorEvent, Event, EventContext, EventLog, Finish,
    FreshStart, JsonlWriter, MetricsLine, Nonfinite, PublishOutcome, RequeueRecord, Resume, Signal, Start, StepLine,
    Stop, Summary, SummaryState, ValLine, metrics_step, now_rfc3339,
};
use crate::train::{NonFiniteEvent, StepMetrics, StepResult, TrainError, Trainer};

use super::deadline::{Deadline, SignalResponse, response_to_signal};
use super::devices::{self, Devices};
use super::error::RunError;
use super::lock::RunLock;
use super::persist::{Persisted, Persister};
use super::progress::Progress;
use super::rundir::{self, EVENTS_FILE, METRICS_FILE, RunDir, SUMMARY_FILE};
use super::stop::{StopFlag, StopReason};

/// What `rekindle run` was asked to do.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    pub config_path: PathBuf,
    pub overrides: Vec<String>,
    pub run_dir: Option<PathBuf>,
    pub allow_config_change: bool,
    pub stop_at_step: Option<u64>,
}

/// Time kept for the requeue decision after publishing, at most.
const REQUEUE_RESERVE: Duration = Duration::from_secs(5);

/// Longest a single `scontrol` call may take.
const SCONTROL_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs (or resumes) training; returns `Done` when `max_steps` is reached and
/// `StoppedWithCheckpoint` after a stop with a durable checkpoint.
pub fn run(opts: &RunOptions) -> Result<Outcome, RunError> {
    // Handlers first: a signal that arrives while the config loads or the
    // model builds is recorded, and honoured as soon as it can be.
    let stop = StopFlag::install().map_err(|source| RunError::RunDir { path: PathBuf::from("<signals>"), source })?;
    let loaded = config::load(&opts.config_path, &opts.overrides)?;
    let cfg = loaded.config;
    let slurm = SlurmEnv::from_process();
    let root = rundir::resolve_run_dir(opts.run_dir.as_deref(), &cfg);
    // Lock before writing anything into the directory: a run refused because
    // another one is live must leave that run's config.toml alone.
    std::fs::create_dir_all(&root).map_err(|source| RunError::RunDir { path: root.clone(), source })?;
    let lock = RunLock::acquire(&root, slurm.control_id(), slurm.node_name())?;
    let dir = rundir::prepare(&root, &cfg, opts.allow_config_change)?;
    tracing::info!(run = %cfg.run.name, dir = %dir.root.display(), node = %slurm.node_name(), job = ?slurm.job_id, restart = slurm.restart_count, "run directory ready");
    match Attempt::start(cfg, dir, stop, opts.stop_at_step, slurm, lock.lost_flag())? {
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
    /// Set by the lock's heartbeat when another process took the run directory.
    lock_lost: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Host buffers of the last persisted snapshot, reused by the next one.
    spare: Option<(crate::checkpoint::TensorSet, crate::checkpoint::TensorSet)>,
}

impl Attempt {
    fn start(
        cfg: Config,
        dir: RunDir,
        stop: StopFlag,
        stop_at_step: Option<u64>,
        slurm: SlurmEnv,
        lock_lost: std::sync::Arc<std::sync::atomic::AtomicBool>,
    ) -> Result<Started, RunError> {
        let store = CheckpointStore::open(&dir.checkpoints, cfg.checkpoint.keep)?;
        let mut events = EventLog::open(dir.path(EVENTS_FILE), context(&slurm))?;
        // The placement plan needs the model's size, so the trainer comes first.
        let mut trainer = Trainer::new(&cfg)?;
        let mut devices = Devices::select(&cfg, &mut trainer)?;
        events.record(&Event::Start(Start {
            pid: std::process::id(),
            rekindle_version: env!("CARGO_PKG_VERSION").into(),
            run_dir: dir.root.clone(),
            allocation: serde_json::to_value(&slurm).unwrap_or_default(),
            max_steps: cfg.run.max_steps,
            placement: devices.describe(),
        }))?;
        devices.announce(&mut events)?;
        let outcome = store.load_latest()?;
        for rejected in &outcome.rejected {
            let reasons: Vec<String> = rejected.failures.iter().map(|f| f.to_string()).collect();
            events.record(&Event::CheckpointRejected(CheckpointRejected {
                step: rejected.step,
                dir: rejected.dir.clone(),
                failures: serde_json::to_value(&rejected.failures).unwrap_or_default(),
            }))?;
            tracing::warn!(step = rejected.step, reasons = %reasons.join("; "), "skipping checkpoint that does not verify");
        }
        let last_durable_step = outcome.loaded.as_ref().map(|l| l.snapshot.step);
        if let Some(early) = early_stop(&stop, &mut events, last_durable_step, &cfg, &slurm)? {
            return Ok(Started::StoppedEarly(early));
        }
        let previous = previous_summary(&dir);
        let resumes = previous.as_ref().map(|s| s.resumes).unwrap_or(0);
        let last_logged = last_logged_step(&dir.path(METRICS_FILE));
        let (start_step, resumes) = match &outcome.loaded {
            Some(loaded) => {
                let snap = &loaded.snapshot;
                trainer
                    .restore(&snap.model, &snap.optimizer, &snap.state["train"])
                    .map_err(|source| RunError::Restore { dir: loaded.dir.clone(), source })?;
                let since_checkpoint = chrono::DateTime::parse_from_rfc3339(&loaded.manifest.created_at)
                    .ok()
                    .map(|t| (chrono::Utc::now() - t.with_timezone(&chrono::Utc)).num_milliseconds() as f64 / 1000.0);
                let steps_lost = last_logged.map(|s| s.saturating_sub(snap.step)).unwrap_or(0);
                tracing::info!(step = snap.step, dir = %loaded.dir.display(), steps_lost, "resumed from checkpoint");
                events.record(&Event::Resume(Resume {
                    step: snap.step,
                    from: loaded.dir.clone(),
                    previous_node: snap.state["host"]["node"].as_str().map(str::to_string),
                    previous_attempt: snap.state["host"]["slurm_restart_count"].as_u64(),
                    this_node: slurm.node_name(),
                    restart_count: slurm.restart_count,
                    steps_lost,
                    seconds_since_checkpoint: since_checkpoint,
                }))?;
                (snap.step, resumes + 1)
            }
            None => {
                if outcome.rejected.is_empty() {
                    tracing::info!("no checkpoint yet: starting from step 0");
                } else {
                    tracing::error!(
                        rejected = outcome.rejected.len(),
                        "NO CHECKPOINT VERIFIES: starting fresh from step 0 (the invalid ones are kept for inspection)"
                    );
                    events.record(&Event::FreshStart(FreshStart {
                        reason: "no checkpoint verifies".into(),
                        rejected: outcome.rejected.len(),
                    }))?;
                }
                (0, resumes)
            }
        };
        if let Some(early) = early_stop(&stop, &mut events, last_durable_step, &cfg, &slurm)? {
            return Ok(Started::StoppedEarly(early));
        }
        // Steps logged after the checkpoint we resumed from were lost with the
        // previous attempt; they are trained again, so drop their lines to keep
        // every step exactly once.
        truncate_metrics(&dir.path(METRICS_FILE), start_step)?;
        let metrics = JsonlWriter::open(dir.path(METRICS_FILE))?;
        let persister = Persister::spawn(store.clone())
            .map_err(|source| RunError::RunDir { path: dir.checkpoints.clone(), source })?;
        // The losses so far come from the checkpoint, not summary.json: a
        // SIGKILLed attempt writes no summary, and after a fallback to an older
        // checkpoint the summary covers steps that are trained again.
        let (last_loss, best_loss) =
            outcome.loaded.as_ref().map(|l| losses_so_far(&l.snapshot.state)).unwrap_or_default();
        let monitor = devices.start_monitor(&cfg, &dir, trainer.param_count());
        Ok(Started::Ready(Box::new(Attempt {
            last_loss,
            best_loss,
            cfg,
            dir,
            store,
            persister,
            events,
            metrics,
            trainer,
            devices,
            monitor,
            stop,
            stop_at_step,
            slurm,
            started: Instant::now(),
            start_step,
            checkpoints_written: 0,
            consecutive_failures: 0,
            last_checkpoint: Instant::now(),
            last_durable_step,
            resumes,
            lock_lost,
            spare: None,
        })))
    }

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
            // Best effort: the error itself is what the caller must see.
            let _ =
                self.events.record(&Event::Error(ErrorEvent { step: Some(self.trainer.step()), error: e.to_string() }));
            let _ = self.write_summary(SummaryState::Failed);
            let _ = self.events.sync();
        }
        result
    }

    fn train_loop(&mut self) -> Result<Outcome, RunError> {
        let max_steps = self.cfg.run.max_steps;
        let progress = Progress::new(self.trainer.step(), max_steps);
        loop {
            if self.lock_lost.load(std::sync::atomic::Ordering::SeqCst) {
                progress.finish();
                return Err(RunError::LockLost { dir: self.dir.root.clone() });
            }
            self.collect_background()?;
            if let Some(reason) = self.stop_reason() {
                progress.finish();
                return self.stop_with_checkpoint(reason);
            }
            if self.trainer.step() >= max_steps {
                break;
            }
            let stop = self.stop.clone();
            let lost = std::sync::Arc::clone(&self.lock_lost);
            let should_stop = move || stop.is_set() || lost.load(std::sync::atomic::Ordering::SeqCst);
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
        self.finish()
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

    fn periodic_checkpoint_due(&self, step: u64) -> bool {
        let every = self.cfg.checkpoint.every_steps;
        (every > 0 && step.is_multiple_of(every)) || self.last_checkpoint.elapsed() >= self.cfg.checkpoint.interval
    }

    /// Snapshots into host memory (the stall) and persists in the background
    /// (or inline with `[checkpoint] async = false`).
    fn periodic_checkpoint(&mut self) -> Result<(), RunError> {
        if self.persister.busy() {
            tracing::warn!(step = self.trainer.step(), "previous checkpoint is still being written; skipping this one");
            return Ok(());
        }
        self.last_checkpoint = Instant::now();
        let t0 = Instant::now();
        let snapshot = self.snapshot()?;
        let stall = t0.elapsed().as_secs_f64();
        if self.cfg.checkpoint.async_save {
            self.persister.submit(snapshot, stall);
            Ok(())
        } else {
            let payload_bytes = snapshot.payload_bytes();
            let result = self.store.save(&snapshot);
            let step = snapshot.step;
            self.handle_persisted(Persisted {
                step,
                payload_bytes,
                snapshot_seconds: stall,
                result,
                buffers: Some(snapshot),
            })
        }
    }

    fn collect_background(&mut self) -> Result<(), RunError> {
        match self.persister.poll() {
            Some(p) => self.handle_persisted(p),
            None => Ok(()),
        }
    }

    /// Records a finished periodic save; too many failures in a row stop the run.
    fn handle_persisted(&mut self, mut p: Persisted) -> Result<(), RunError> {
        if let Some(buffers) = p.buffers.take() {
            self.spare = Some((buffers.model, buffers.optimizer));
        }
        match p.result {
            Ok(report) => {
                self.consecutive_failures = 0;
                self.record_saved(&report, "periodic", p.payload_bytes, p.snapshot_seconds)
            }
            Err(e) if e.committed() => {
                // Durable and loadable; only the directory sync or rotation failed.
                tracing::warn!(step = p.step, error = %e, "checkpoint committed with a warning");
                self.consecutive_failures = 0;
                self.last_durable_step = Some(p.step);
                self.events.record(&Event::CheckpointSaved(CheckpointSaved {
                    step: p.step,
                    kind: "periodic".into(),
                    warning: Some(e.to_string()),
                    ..CheckpointSaved::default()
                }))?;
                Ok(())
            }
            Err(e) => {
                self.consecutive_failures += 1;
                tracing::warn!(step = p.step, error = %e, failures_in_a_row = self.consecutive_failures, "background checkpoint failed; training continues, earlier checkpoints are intact");
                self.events.record(&Event::CheckpointFailed(CheckpointFailed {
                    step: p.step,
                    kind: "periodic".into(),
                    error: e.to_string(),
                    consecutive_failures: Some(self.consecutive_failures),
                }))?;
                if self.consecutive_failures >= self.cfg.checkpoint.max_consecutive_failures {
                    return Err(RunError::CheckpointsFailing { count: self.consecutive_failures, last: e });
                }
                Ok(())
            }
        }
    }

    fn record_saved(&mut self, r: &SaveReport, kind: &str, payload: u64, stall: f64) -> Result<(), RunError> {
        self.last_durable_step = Some(r.step);
        if !r.already_existed {
            self.checkpoints_written += 1;
        }
        let gbps = if r.seconds > 0.0 { r.bytes as f64 / r.seconds / 1e9 } else { 0.0 };
        tracing::info!(
            step = r.step,
            kind,
            bytes = r.bytes,
            stall_s = format!("{stall:.4}"),
            persist_s = format!("{:.3}", r.seconds),
            "checkpoint saved"
        );
        self.events.record(&Event::CheckpointSaved(CheckpointSaved {
            step: r.step,
            kind: kind.into(),
            bytes: Some(r.bytes),
            payload_bytes: Some(payload),
            snapshot_seconds: Some(stall),
            persist_seconds: Some(r.seconds),
            gb_per_s: Some(gbps),
            already_existed: Some(r.already_existed),
            dir: Some(r.dir.clone()),
            rotated_out: Some(r.rotated_out.clone()),
            warning: None,
        }))?;
        Ok(())
    }

    fn snapshot(&mut self) -> Result<Snapshot, RunError> {
        let snap = self.trainer.snapshot_reusing(self.spare.take())?;
        Ok(Snapshot {
            step: snap.step,
            model: snap.model,
            optimizer: snap.optimizer,
            state: serde_json::json!({
                "step": snap.step,
                "train": snap.state,
                "config_hash": config::training_hash(&self.cfg),
                "metrics": {"last_loss": self.last_loss, "best_loss": self.best_loss},
                "host": host_info(&self.slurm),
                "rekindle_version": env!("CARGO_PKG_VERSION"),
            }),
        })
    }

    /// Writes a checkpoint of the current step synchronously (after any save in flight).
    fn checkpoint_now(&mut self, kind: &str) -> Result<SaveReport, RunError> {
        if let Some(p) = self.persister.wait() {
            self.handle_persisted(p)?;
        }
        let t0 = Instant::now();
        let snapshot = self.snapshot()?;
        let stall = t0.elapsed().as_secs_f64();
        let payload = snapshot.payload_bytes();
        match self.store.save(&snapshot) {
            Ok(report) => {
                self.last_checkpoint = Instant::now();
                self.record_saved(&report, kind, payload, stall)?;
                Ok(report)
            }
            Err(e) if e.committed() => {
                tracing::warn!(step = snapshot.step, error = %e, "checkpoint committed with a warning");
                self.last_checkpoint = Instant::now();
                self.last_durable_step = Some(snapshot.step);
                self.events.record(&Event::CheckpointSaved(CheckpointSaved {
                    step: snapshot.step,
                    kind: kind.into(),
                    warning: Some(e.to_string()),
                    ..CheckpointSaved::default()
                }))?;
                Ok(SaveReport {
                    step: snapshot.step,
                    dir: self.store.step_dir(snapshot.step),
                    bytes: payload,
                    seconds: t0.elapsed().as_secs_f64(),
                    already_existed: false,
                    rotated_out: Vec::new(),
                })
            }
            Err(e) => {
                self.events.record(&Event::CheckpointFailed(CheckpointFailed {
                    step: snapshot.step,
                    kind: kind.into(),
                    error: e.to_string(),
                    consecutive_failures: None,
                }))?;
                Err(e.into())
            }
        }
    }

    fn finish(&mut self) -> Result<Outcome, RunError> {
        let step = self.trainer.step();
        self.checkpoint_now("final")?;
        devices::stop_monitor(self.monitor.take(), &mut self.events)?;
        self.write_summary(SummaryState::Finished)?;
        let published = self.publish("finished", None);
        self.events.record(&Event::Finish(Finish { step, publish: published }))?;
        tracing::info!(step, "training finished");
        Ok(Outcome::Done)
    }

    fn nonfinite_stop(&mut self, ev: NonFiniteEvent) -> Result<Outcome, RunError> {
        self.events.record(&Event::Nonfinite(Nonfinite {
            step: ev.step,
            loss: finite(ev.loss),
            grad_norm: finite(ev.grad_norm),
            action: "stop".into(),
            restored_step: None,
            skipped_batches: None,
        }))?;
        self.checkpoint_now("stop")?;
        Err(RunError::NonFinite { step: ev.step, loss: ev.loss, grad_norm: ev.grad_norm })
    }

    /// The out-of-memory back-off gave up: checkpoint the last completed
    /// step and fail (exit 1: running again unchanged would fail again).
    /// Checkpoints the last completed step, then fails (the `error` event and
    /// the failed summary are written by [`Attempt::train`]).
    fn out_of_memory_stop(&mut self, error: TrainError) -> Result<Outcome, RunError> {
        let report = self.checkpoint_now("stop")?;
        Err(RunError::OutOfMemory { step: report.step, checkpoint: report.dir, source: error })
    }

    /// Reloads the newest checkpoint and moves the data cursor past the
    /// offending batch.
    fn rollback(&mut self, ev: NonFiniteEvent) -> Result<(), RunError> {
        if let Some(p) = self.persister.wait() {
            self.handle_persisted(p)?;
        }
        let outcome = self.store.load_latest()?;
        let Some(loaded) = outcome.loaded else {
            return Err(RunError::NothingToRollBackTo { step: ev.step, dir: self.dir.checkpoints.clone() });
        };
        let snap = &loaded.snapshot;
        self.trainer
            .restore(&snap.model, &snap.optimizer, &snap.state["train"])
            .map_err(|source| RunError::Restore { dir: loaded.dir.clone(), source })?;
        let skipped = self.trainer.skip_past(&ev)?;
        (self.last_loss, self.best_loss) = losses_so_far(&snap.state);
        tracing::warn!(
            failed_step = ev.step,
            restored_step = snap.step,
            skipped_batches = skipped,
            "non-finite step: rolled back to the last checkpoint and skipped past its data"
        );
        self.events.record(&Event::Nonfinite(Nonfinite {
            step: ev.step,
            loss: finite(ev.loss),
            grad_norm: finite(ev.grad_norm),
            action: "rollback".into(),
            restored_step: Some(snap.step),
            skipped_batches: Some(skipped),
        }))?;
        truncate_metrics(&self.dir.path(METRICS_FILE), snap.step)?;
        self.metrics = JsonlWriter::open(self.dir.path(METRICS_FILE))?;
        Ok(())
    }

    fn stop_with_checkpoint(&mut self, reason: StopReason) -> Result<Outcome, RunError> {
        let step = self.trainer.step();
        let arrival = self.stop.first_arrival().unwrap_or_else(Instant::now);
        let deadline = match reason {
            StopReason::Signal(_) => {
                Some(Deadline::after_signal(arrival, self.cfg.signals.grace, self.cfg.signals.safety_margin))
            }
            StopReason::StopAtStep => None,
        };
        tracing::warn!(reason = %reason.name(), step, "stop requested: writing a checkpoint of the last completed step");
        self.events.record(&Event::Signal(Signal {
            signal: reason.name(),
            step: Some(step),
            arrival: Some(instant_to_rfc3339(arrival)),
            deadline_in_seconds: Some(deadline.map(|d| d.remaining(Instant::now()).as_secs_f64())),
            before_training: false,
        }))?;
        let exit_now = |flag: &StopFlag| {
            response_to_signal(flag.count()) == SignalResponse::ExitNow
                || deadline.is_some_and(|d| d.passed(Instant::now()))
        };
        if exit_now(&self.stop) && self.last_durable_step.is_some() {
            tracing::error!(
                "third signal or deadline passed before the checkpoint began: exiting at once; the previous checkpoint is intact"
            );
            self.events.record(&Event::Stop(Stop {
                step: self.last_durable_step,
                reason: reason.name(),
                fast_exit: true,
                signals_received: Some(self.stop.count()),
                ..Stop::default()
            }))?;
            self.events.sync()?;
            return Ok(Outcome::StoppedWithCheckpoint);
        }
        let report = self.checkpoint_now("stop")?;
        let to_durable = arrival.elapsed().as_secs_f64();
        devices::stop_monitor(self.monitor.take(), &mut self.events)?;
        if self.stop.count() >= 2 {
            tracing::warn!(signals = self.stop.count(), "more stop signals arrived during the checkpoint");
        }
        self.write_summary(SummaryState::Stopped)?;
        let (published, requeue) = if exit_now(&self.stop) {
            tracing::warn!("skipping publish and requeue: third signal or deadline passed");
            (PublishOutcome::Skipped { skipped: "fast exit".into() }, RequeueRecord::skip("fast exit"))
        } else {
            // Requeueing comes last (it ends the job) and must not be starved
            // by a slow remote: publishing gets the time left minus a reserve.
            let publish_deadline = deadline.map(|d| {
                let reserve = (d.remaining(Instant::now()) / 3).min(REQUEUE_RESERVE);
                Deadline { at: d.at.checked_sub(reserve).unwrap_or(d.at) }
            });
            let published = self.publish(&reason.name(), publish_deadline);
            let requeue = self.requeue(reason, deadline)?;
            (published, requeue)
        };
        let left = deadline.map(|d| d.remaining(Instant::now()).as_secs_f64());
        self.events.record(&Event::Stop(Stop {
            step: Some(report.step),
            reason: reason.name(),
            seconds_to_durable_checkpoint: Some(to_durable),
            seconds_left: Some(left),
            signals_received: Some(self.stop.count()),
            publish: Some(published),
            requeue: Some(requeue),
            ..Stop::default()
        }))?;
        self.events.sync()?;
        tracing::info!(
            step,
            seconds_to_durable_checkpoint = format!("{to_durable:.3}"),
            "stopped with a durable checkpoint; run the same command again to continue"
        );
        Ok(Outcome::StoppedWithCheckpoint)
    }

    /// Publishes results when `[publish] enabled`; failures are logged, never fatal.
    fn publish(&mut self, reason: &str, deadline: Option<Deadline>) -> PublishOutcome {
        if !self.cfg.publish.enabled {
            return PublishOutcome::Skipped { skipped: "publishing disabled".into() };
        }
        let newest_manifest = self.last_durable_step.map(|s| self.store.step_dir(s).join(MANIFEST_FILE));
        let req = PublishRequest {
            cfg: &self.cfg.publish,
            run_name: &self.cfg.run.name,
            run_dir: &self.dir.root,
            newest_manifest,
            step: self.trainer.step(),
            job_id: self.slurm.job_id.clone(),
            node: self.slurm.node_name(),
            reason: reason.to_string(),
            deadline: deadline.map(|d| d.at),
        };
        let outcome = match publish::publish(&req) {
            Ok(report) => PublishOutcome::Done {
                commit: report.commit,
                pushed: report.pushed,
                attempts: report.attempts,
                files: report.files,
                last_error: report.last_error,
            },
            Err(e) => {
                tracing::error!(error = %e, "publishing failed");
                PublishOutcome::Failed { error: e.to_string() }
            }
        };
        let _ = self.events.record(&Event::Publish(outcome.clone()));
        outcome
    }

    fn requeue(&mut self, reason: StopReason, deadline: Option<Deadline>) -> Result<RequeueRecord, RunError> {
        let finished = self.trainer.step() >= self.cfg.run.max_steps;
        requeue_after_stop(&self.cfg, &self.slurm, reason, finished, deadline, &mut self.events)
    }

    fn write_summary(&mut self, state: SummaryState) -> Result<(), RunError> {
        let summary = Summary {
            state,
            run: self.cfg.run.name.clone(),
            steps: self.trainer.step(),
            max_steps: self.cfg.run.max_steps,
            final_loss: self.last_loss,
            best_loss: self.best_loss,
            wall_seconds_this_attempt: self.started.elapsed().as_secs_f64(),
            steps_this_attempt: self.trainer.step() - self.start_step,
            resumes: self.resumes,
            checkpoints_written_this_attempt: self.checkpoints_written,
            last_checkpoint_step: self.last_durable_step,
            updated_at: now_rfc3339(),
        };
        let path = self.dir.path(SUMMARY_FILE);
        rundir::write_atomically(&path, &summary.to_bytes()).map_err(|source| RunError::RunDir { path, source })
    }
}

/// A stop signal before training began: nothing new to save, but the job is
/// still requeued when it should be. A job preempted (or warned of its time
/// limit) while it loads exits inside its GraceTime, and SLURM does not
/// requeue a job that exits by itself: without this it would end FAILED.
fn early_stop(
    stop: &StopFlag,
    events: &mut EventLog,
    durable: Option<u64>,
    cfg: &Config,
    alloc: &SlurmEnv,
) -> Result<Option<Outcome>, RunError> {
    let Some(reason) = stop.signal() else { return Ok(None) };
    tracing::warn!(reason = %reason.name(), "stop signal before training began: exiting; earlier checkpoints are intact");
    events.record(&Event::Signal(Signal {
        signal: reason.name(),
        step: durable,
        before_training: true,
        ..Signal::default()
    }))?;
    let arrival = stop.first_arrival().unwrap_or_else(Instant::now);
    let deadline = Deadline::after_signal(arrival, cfg.signals.grace, cfg.signals.safety_margin);
    let requeue = if response_to_signal(stop.count()) == SignalResponse::ExitNow || deadline.passed(Instant::now()) {
        RequeueRecord::skip("fast exit")
    } else {
        let finished = durable.is_some_and(|s| s >= cfg.run.max_steps);
        requeue_after_stop(cfg, alloc, reason, finished, Some(deadline), events)?
    };
    events.record(&Event::Stop(Stop {
        step: durable,
        reason: reason.name(),
        before_training: true,
        requeue: Some(requeue),
        ..Stop::default()
    }))?;
    events.sync()?;
    Ok(Some(Outcome::StoppedWithCheckpoint))
}

/// Decides whether to requeue after a stop and carries the decision out with
/// `scontrol`; records a `requeue` event and returns what it recorded.
fn requeue_after_stop(
    cfg: &Config,
    alloc: &SlurmEnv,
    reason: StopReason,
    finished: bool,
    deadline: Option<Deadline>,
    events: &mut EventLog,
) -> Result<RequeueRecord, RunError> {
    let stop = match reason {
        StopReason::Signal(nix::libc::SIGINT) => StopKind::Interrupt,
        StopReason::Signal(_) => StopKind::ClusterSignal,
        StopReason::StopAtStep => StopKind::StopAtStep,
    };
    // Each scontrol call gets what is left then (capped); once too little
    // is left, none is made: running past the deadline means SIGKILL.
    let timeout = || match deadline {
        Some(d) => d.budget(Instant::now(), SCONTROL_TIMEOUT, Duration::from_millis(200)),
        None => Some(SCONTROL_TIMEOUT),
    };
    const NO_TIME: &str = "no time left before the deadline";
    let job_id = alloc.control_id();
    let needs_query =
        job_id.is_some() && stop != StopKind::StopAtStep && cfg.signals.requeue != crate::config::RequeuePolicy::Never;
    let (job, job_query_error) = match (&job_id, needs_query) {
        (Some(id), true) => match timeout().map(|t| Scontrol.show_job(id, t)) {
            Some(Ok(j)) => (Some(j), None),
            Some(Err(e)) => (None, Some(e.to_string())),
            None => (None, Some(NO_TIME.to_string())),
        },
        _ => (None, None),
    };
    let input = RequeueInput {
        policy: cfg.signals.requeue,
        stop,
        finished,
        job_id,
        job,
        job_query_error,
        restart_count: alloc.restart_count,
        max_restarts: cfg.signals.max_restarts,
    };
    let decision = slurm::decide(&input);
    let mut record = RequeueRecord { decision: decision.clone(), answer: None, error: None };
    match &decision {
        Decision::Requeue { job_id, reason } => {
            tracing::info!(job = %job_id, %reason, "requeueing the job");
            match timeout()
                .ok_or(NO_TIME.to_string())
                .and_then(|t| Scontrol.requeue(job_id, t).map_err(|e| e.to_string()))
            {
                Ok(answer) => record.answer = Some(answer),
                Err(e) => {
                    tracing::error!(error = %e, "scontrol requeue failed; relying on sbatch --requeue");
                    record.error = Some(e);
                }
            }
        }
        Decision::Skip { reason } => tracing::info!(%reason, "not requeueing"),
    }
    events.record(&Event::Requeue(record.clone()))?;
    Ok(record)
}

/// A number as the records write it: `None` (`null`) when not finite.
fn finite(x: f64) -> Option<f64> {
    x.is_finite().then_some(x)
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

fn instant_to_rfc3339(t: Instant) -> String {
    let ago = chrono::Duration::from_std(t.elapsed()).unwrap_or_default();
    (chrono::Utc::now() - ago).to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// Host and SLURM job facts recorded in each checkpoint.
fn host_info(slurm: &SlurmEnv) -> serde_json::Value {
    serde_json::json!({
        "node": slurm.node_name(),
        "hostname": slurm::hostname(),
        "pid": std::process::id(),
        "slurm_job_id": slurm.job_id,
        "slurm_restart_count": slurm.restart_count,
        "allocation": slurm,
    })
}

/// Fields added to every event.
fn context(slurm: &SlurmEnv) -> EventContext {
    EventContext { node: slurm.node_name(), job_id: slurm.job_id.clone(), attempt: slurm.restart_count }
}

fn previous_summary(dir: &RunDir) -> Option<Summary> {
    Summary::read(&dir.path(SUMMARY_FILE))
}

/// `(last_loss, best_loss)` of the steps up to a checkpoint, as its `state.json` recorded them.
fn losses_so_far(state: &serde_json::Value) -> (Option<f64>, Option<f64>) {
    (state["metrics"]["last_loss"].as_f64(), state["metrics"]["best_loss"].as_f64())
}

/// The highest step in metrics.jsonl (what the previous attempt reached).
fn last_logged_step(path: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines().filter_map(|l| metrics_step(&serde_json::from_str(l).ok()?)).max()
}

/// Keeps only metric lines of steps ≤ `step` (and drops a torn last line).
fn truncate_metrics(path: &Path, step: u64) -> Result<(), RunError> {
    let Ok(text) = std::fs::read_to_string(path) else { return Ok(()) };
    let kept: String = text
        .lines()
        .filter(|line| serde_json::from_str(line).ok().and_then(|v| metrics_step(&v)).is_some_and(|s| s <= step))
        .map(|l| format!("{l}\n"))
        .collect();
    if kept.len() != text.len() {
        rundir::write_atomically(path, kept.as_bytes())
            .map_err(|source| RunError::RunDir { path: path.to_path_buf(), source })?;
    }
    Ok(())
}
