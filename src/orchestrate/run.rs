//! `rekindle run`: the lifecycle of one attempt of a run.
//!
//! load config → prepare run directory → open the checkpoint store (removing
//! leftovers) → resume from the newest checkpoint that verifies → train,
//! checkpointing every `[checkpoint] every_steps` steps or `interval` of
//! wall-clock time → on a stop signal or `--stop-at-step`, write a durable
//! checkpoint of the last completed step and exit 75; at `max_steps`, write the
//! final checkpoint and `summary.json` and exit 0.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde_json::json;

use crate::checkpoint::{CheckpointStore, Snapshot};
use crate::config::{self, Config};
use crate::exit::Outcome;
use crate::telemetry::{EventLog, JsonlWriter};
use crate::train::{StepResult, Trainer};

use super::error::RunError;
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

/// Runs (or resumes) training; returns `Done` when `max_steps` is reached and
/// `StoppedWithCheckpoint` after a stop with a durable checkpoint.
pub fn run(opts: &RunOptions) -> Result<Outcome, RunError> {
    let stop = StopFlag::install().map_err(|source| RunError::RunDir { path: PathBuf::from("<signals>"), source })?;
    let loaded = config::load(&opts.config_path, &opts.overrides)?;
    let cfg = loaded.config;
    let root = rundir::resolve_run_dir(opts.run_dir.as_deref(), &cfg);
    let dir = rundir::prepare(&root, &cfg, opts.allow_config_change)?;
    tracing::info!(run = %cfg.run.name, dir = %dir.root.display(), config = %opts.config_path.display(), "run directory ready");
    Attempt::start(cfg, dir, stop, opts.stop_at_step)?.train()
}

/// One attempt: the state that lives from start (or resume) to exit.
struct Attempt {
    cfg: Config,
    dir: RunDir,
    store: CheckpointStore,
    events: EventLog,
    metrics: JsonlWriter,
    trainer: Trainer,
    stop: StopFlag,
    stop_at_step: Option<u64>,
    started: Instant,
    start_step: u64,
    checkpoints_written: u64,
    last_checkpoint: Instant,
    last_loss: Option<f64>,
    best_loss: Option<f64>,
    resumes: u64,
}

impl Attempt {
    fn start(cfg: Config, dir: RunDir, stop: StopFlag, stop_at_step: Option<u64>) -> Result<Attempt, RunError> {
        let store = CheckpointStore::open(&dir.checkpoints, cfg.checkpoint.keep)?;
        let mut events = EventLog::open(dir.path(EVENTS_FILE), context())?;
        let outcome = store.load_latest()?;
        for rejected in &outcome.rejected {
            let reasons: Vec<String> = rejected.failures.iter().map(|f| f.to_string()).collect();
            events.record(
                "checkpoint_rejected",
                json!({"step": rejected.step, "dir": rejected.dir, "failures": rejected.failures}),
            )?;
            tracing::warn!(step = rejected.step, reasons = %reasons.join("; "), "skipping checkpoint that does not verify");
        }
        let mut trainer = Trainer::new(&cfg)?;
        let previous = previous_summary(&dir);
        let resumes = previous.as_ref().and_then(|s| s["resumes"].as_u64()).unwrap_or(0);
        let (start_step, resumes) = match outcome.loaded {
            Some(loaded) => {
                let snap = &loaded.snapshot;
                trainer
                    .restore(&snap.model, &snap.optimizer, &snap.state["train"])
                    .map_err(|source| RunError::Restore { dir: loaded.dir.clone(), source })?;
                tracing::info!(step = snap.step, dir = %loaded.dir.display(), "resumed from checkpoint");
                events.record(
                    "resume",
                    json!({"step": snap.step, "from": loaded.dir, "previous_node": snap.state["host"]["node"]}),
                )?;
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
                }
                events.record("start", json!({"step": 0}))?;
                (0, resumes)
            }
        };
        // Steps logged after the checkpoint we resumed from were lost with the
        // previous attempt; they are trained again, so drop their lines to keep
        // every step exactly once.
        truncate_metrics(&dir.path(METRICS_FILE), start_step)?;
        let metrics = JsonlWriter::open(dir.path(METRICS_FILE))?;
        Ok(Attempt {
            cfg,
            dir,
            store,
            events,
            metrics,
            trainer,
            stop,
            stop_at_step,
            started: Instant::now(),
            start_step,
            checkpoints_written: 0,
            last_checkpoint: Instant::now(),
            last_loss: previous.as_ref().and_then(|s| s["final_loss"].as_f64()),
            best_loss: previous.as_ref().and_then(|s| s["best_loss"].as_f64()),
            resumes,
        })
    }

    fn stop_reason(&self) -> Option<StopReason> {
        self.stop
            .signal()
            .or_else(|| self.stop_at_step.filter(|k| self.trainer.step() >= *k).map(|_| StopReason::StopAtStep))
    }

    fn train(mut self) -> Result<Outcome, RunError> {
        let max_steps = self.cfg.run.max_steps;
        let progress = super::progress::Progress::new(self.trainer.step(), max_steps);
        while self.trainer.step() < max_steps {
            if let Some(reason) = self.stop_reason() {
                progress.finish();
                return self.stop_with_checkpoint(reason);
            }
            let stop = self.stop.clone();
            match self.trainer.train_step(&move || stop.is_set())? {
                StepResult::Interrupted => continue,
                StepResult::Completed(m) => {
                    if m.step.is_multiple_of(self.cfg.train.log_every) || m.step == max_steps {
                        self.metrics.append(&m.to_json())?;
                    }
                    self.last_loss = Some(m.loss);
                    if m.loss.is_finite() {
                        self.best_loss = Some(self.best_loss.map_or(m.loss, |b| b.min(m.loss)));
                    }
                    progress.update(m.step, m.loss);
                    if self.cfg.train.eval_every > 0 && m.step.is_multiple_of(self.cfg.train.eval_every) {
                        let val_loss = self.trainer.evaluate()?;
                        self.metrics.append(&json!({"step": m.step, "val_loss": val_loss, "time": now()}))?;
                    }
                    if self.periodic_checkpoint_due(m.step) && m.step < max_steps {
                        self.checkpoint("periodic")?;
                    }
                }
            }
        }
        progress.finish();
        self.checkpoint("final")?;
        self.write_summary("finished")?;
        self.events.record("finish", json!({"step": self.trainer.step()}))?;
        tracing::info!(step = self.trainer.step(), "training finished");
        Ok(Outcome::Done)
    }

    fn periodic_checkpoint_due(&self, step: u64) -> bool {
        let by_steps = self.cfg.checkpoint.every_steps > 0 && step.is_multiple_of(self.cfg.checkpoint.every_steps);
        by_steps || self.last_checkpoint.elapsed() >= self.cfg.checkpoint.interval
    }

    fn stop_with_checkpoint(mut self, reason: StopReason) -> Result<Outcome, RunError> {
        let step = self.trainer.step();
        tracing::warn!(reason = %reason.name(), step, "stop requested: writing a checkpoint of the last completed step");
        let t0 = Instant::now();
        self.events.record("signal", json!({"signal": reason.name(), "step": step}))?;
        self.checkpoint("stop")?;
        self.write_summary("stopped")?;
        self.events.record(
            "stop",
            json!({"step": step, "reason": reason.name(), "seconds_to_durable_checkpoint": t0.elapsed().as_secs_f64()}),
        )?;
        self.events.sync()?;
        tracing::info!(step, "stopped with a durable checkpoint; run the same command again to continue");
        Ok(Outcome::StoppedWithCheckpoint)
    }

    fn checkpoint(&mut self, why: &str) -> Result<(), RunError> {
        let t0 = Instant::now();
        let snap = self.trainer.snapshot()?;
        let snapshot_seconds = t0.elapsed().as_secs_f64();
        let snapshot = Snapshot {
            step: snap.step,
            model: snap.model,
            optimizer: snap.optimizer,
            state: json!({
                "step": snap.step,
                "train": snap.state,
                "config_hash": config::training_hash(&self.cfg),
                "metrics": {"last_loss": self.last_loss, "best_loss": self.best_loss},
                "host": host_info(),
                "rekindle_version": env!("CARGO_PKG_VERSION"),
            }),
        };
        let bytes = snapshot.payload_bytes();
        match self.store.save(&snapshot) {
            Ok(report) => {
                self.last_checkpoint = Instant::now();
                if !report.already_existed {
                    self.checkpoints_written += 1;
                }
                tracing::info!(
                    step = report.step,
                    kind = why,
                    seconds = format!("{:.3}", report.seconds),
                    "checkpoint saved"
                );
                self.events.record(
                    "checkpoint_saved",
                    json!({"step": report.step, "kind": why, "bytes": report.bytes, "payload_bytes": bytes,
                           "snapshot_seconds": snapshot_seconds, "persist_seconds": report.seconds,
                           "dir": report.dir, "rotated_out": report.rotated_out}),
                )?;
                Ok(())
            }
            Err(e) => {
                self.events
                    .record("checkpoint_failed", json!({"step": snapshot.step, "kind": why, "error": e.to_string()}))?;
                Err(e.into())
            }
        }
    }

    fn write_summary(&mut self, state: &str) -> Result<(), RunError> {
        let summary = json!({
            "state": state,
            "steps": self.trainer.step(),
            "max_steps": self.cfg.run.max_steps,
            "final_loss": self.last_loss,
            "best_loss": self.best_loss,
            "wall_seconds_this_attempt": self.started.elapsed().as_secs_f64(),
            "steps_this_attempt": self.trainer.step() - self.start_step,
            "resumes": self.resumes,
            "checkpoints_written_this_attempt": self.checkpoints_written,
            "updated_at": now(),
        });
        let path = self.dir.path(SUMMARY_FILE);
        rundir::write_atomically(&path, &serde_json::to_vec_pretty(&summary).expect("summary serialises"))
            .map_err(|source| RunError::RunDir { path, source })
    }
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn hostname() -> String {
    nix::unistd::gethostname().map(|h| h.to_string_lossy().into_owned()).unwrap_or_else(|_| "unknown".into())
}

/// Host and SLURM job facts recorded in each checkpoint.
fn host_info() -> serde_json::Value {
    let env = |k: &str| std::env::var(k).ok();
    json!({
        "node": env("SLURMD_NODENAME").unwrap_or_else(hostname),
        "hostname": hostname(),
        "pid": std::process::id(),
        "slurm_job_id": env("SLURM_JOB_ID"),
        "slurm_restart_count": env("SLURM_RESTART_COUNT"),
    })
}

/// Fields added to every event.
fn context() -> serde_json::Map<String, serde_json::Value> {
    let env = |k: &str| std::env::var(k).ok();
    let attempt: u64 = env("SLURM_RESTART_COUNT").and_then(|s| s.parse().ok()).unwrap_or(0);
    json!({
        "node": env("SLURMD_NODENAME").unwrap_or_else(hostname),
        "job_id": env("SLURM_JOB_ID"),
        "attempt": attempt,
    })
    .as_object()
    .expect("object")
    .clone()
}

fn previous_summary(dir: &RunDir) -> Option<serde_json::Value> {
    serde_json::from_slice(&std::fs::read(dir.path(SUMMARY_FILE)).ok()?).ok()
}

/// Keeps only metric lines of steps ≤ `step` (and drops a torn last line).
fn truncate_metrics(path: &Path, step: u64) -> Result<(), RunError> {
    let Ok(text) = std::fs::read_to_string(path) else { return Ok(()) };
    let kept: String = text
        .lines()
        .filter(|line| {
            serde_json::from_str::<serde_json::Value>(line)
                .ok()
                .and_then(|v| v["step"].as_u64())
                .is_some_and(|s| s <= step)
        })
        .map(|l| format!("{l}\n"))
        .collect();
    if kept.len() != text.len() {
        rundir::write_atomically(path, kept.as_bytes())
            .map_err(|source| RunError::RunDir { path: path.to_path_buf(), source })?;
    }
    Ok(())
}
