//! The opening of an attempt, one sequence for both drivers (`run` and
//! `exec`), so that a fix to it is made once:
//!
//! ```text
//! claim ─ refuse the other driver's checkpoints      [claim → Claimed]
//!   (run: the node-local tier, the world's hello)
//! lock ─ the driver's check under it ─ prepare ─ the store, under the lock
//!                                                    [Claimed::hold → Held]
//!   (the driver: where it resumes from, its placement)
//! events.jsonl: `start`, `lock_takeover`             [Held::open_records]
//!   (the driver: its own records of the start)
//! rejected checkpoints set aside ─ a stop that came meanwhile
//!                                                    [Held::settle]
//!   (the driver: `resume` or a fresh start)
//! metrics.jsonl trimmed to the step resumed from ─ exports started
//!                                                    [Held::begin]
//! ```
//!
//! Each stage is a value only the stage before makes: a driver cannot take
//! the lock of a directory it did not claim, prepare one it does not hold,
//! or commit without the lock's guard. The steps themselves
//! (`rundir::claim`, `RunLock::acquire`, …) are called here only: the
//! architecture check (tests/it/architecture.rs) fails a driver that calls
//! one itself.

use std::path::{Path, PathBuf};

use crate::checkpoint::{CheckpointInfo, CheckpointKind, CheckpointStore};
use crate::config::Config;
use crate::exit::Outcome;
use crate::rundir::lock::{LockRequest, RunLock};
use crate::rundir::{self, EVENTS_FILE, METRICS_FILE, RunDir};
use crate::slurm::SlurmEnv;
use crate::telemetry::{Event, EventLog, Exporter, Start};

use super::ending::early_stop;
use super::error::RunError;
use super::records::{context, set_aside_rejected, takeover_event, truncate_metrics};
use super::stop::StopFlag;

/// A run directory this attempt claimed (it is rekindle's, or empty) and
/// whose checkpoints are this driver's kind; nothing is written in it yet.
#[derive(Debug)]
pub struct Claimed {
    root: PathBuf,
}

/// Claims `root` for an attempt of the driver whose checkpoints are of
/// `kind`: a directory that is not rekindle's is refused, and so is one
/// whose newest checkpoint the other driver wrote (`rekindle run` continues
/// its own checkpoints, `rekindle exec` a program's).
pub fn claim(root: PathBuf, cfg: &Config, kind: CheckpointKind) -> Result<Claimed, RunError> {
    rundir::claim(&root, cfg)?;
    rundir::refuse_other_command(&root, cfg, kind)?;
    Ok(Claimed { root })
}

impl Claimed {
    /// Locks the directory for this allocation (a live holder refuses it; a
    /// dead one's lock is taken over), runs the driver's `under_lock` check
    /// (before `config.toml` is rewritten: a refusal leaves it as it was),
    /// prepares the directory and opens its checkpoint store, whose every
    /// commit first confirms the lock is still this attempt's.
    pub fn hold(
        self,
        cfg: &Config,
        slurm: &SlurmEnv,
        allow_config_change: bool,
        under_lock: impl FnOnce(&Path) -> Result<(), RunError>,
    ) -> Result<Held, RunError> {
        // Before anything is written: a run refused because another one is
        // live must leave that run's config.toml alone.
        let lock = RunLock::acquire(&self.root, LockRequest::for_allocation(slurm, cfg.lock.stale_after))?;
        under_lock(&self.root)?;
        let dir = rundir::prepare(&self.root, cfg, allow_config_change)?;
        tracing::info!(run = %cfg.run.name, dir = %dir.root.display(), node = %slurm.node_name(), job = slurm.job_id.as_deref(), restart = slurm.restart_count, "run directory ready");
        let store = CheckpointStore::open(&dir.checkpoints, cfg.checkpoint.keep)?
            .with_commit_guard(lock.ownership().commit_guard())
            .with_write_settings(crate::checkpoint::write_settings(&cfg.checkpoint));
        Ok(Held { lock, dir, store })
    }
}

/// A run directory this attempt holds: locked, prepared, its store open
/// under the lock's guard.
pub struct Held {
    pub lock: RunLock,
    pub dir: RunDir,
    pub store: CheckpointStore,
}

impl Held {
    /// Opens `events.jsonl` and records the attempt's `start`, then the
    /// lock's takeover when the previous holder was judged gone.
    pub fn open_records(&self, slurm: &SlurmEnv, start: Start) -> Result<EventLog, RunError> {
        let mut events = EventLog::open(self.dir.path(EVENTS_FILE), context(slurm))?;
        events.record(&Event::Start(start))?;
        if let Some(takeover) = self.lock.ownership().takeover() {
            events.record(&takeover_event(takeover))?;
        }
        Ok(events)
    }

    /// Once the driver knows where it resumes from: the checkpoints that did
    /// not verify are recorded and set aside (quarantined), and a stop that
    /// came meanwhile ends the attempt here (`Some`: its outcome, with its
    /// records and requeue decision). `durable`: the step of the newest
    /// checkpoint that verifies; `max_steps`: the step at which the run is
    /// finished (`u64::MAX` where only the program knows).
    pub fn settle(
        &self,
        events: &mut EventLog,
        rejected: &[CheckpointInfo],
        stop: &StopFlag,
        durable: Option<u64>,
        max_steps: u64,
        (cfg, slurm): (&Config, &SlurmEnv),
    ) -> Result<Option<Outcome>, RunError> {
        set_aside_rejected(&self.store, events, rejected)?;
        stopped(events, stop, durable, max_steps, (cfg, slurm))
    }

    /// The first step is next: the lines `metrics.jsonl` holds past
    /// `start_step` (the previous attempt's steps after its checkpoint, lost
    /// with it and trained again) go, so each step is logged exactly once,
    /// and the exports (TensorBoard, the Prometheus textfile) start from
    /// there. Dropping the exporter ends them: keep it past the attempt's
    /// last records.
    pub fn begin(&self, cfg: &Config, slurm: &SlurmEnv, start_step: u64) -> Result<Exporter, RunError> {
        truncate_metrics(&self.dir.path(METRICS_FILE), start_step)?;
        Ok(super::exports::start(cfg, &self.dir, slurm, start_step))
    }
}

/// A stop that came while the attempt opened (after [`Held::settle`]: while
/// it loaded its checkpoint): its outcome, recorded, or `None`.
pub fn stopped(
    events: &mut EventLog,
    stop: &StopFlag,
    durable: Option<u64>,
    max_steps: u64,
    (cfg, slurm): (&Config, &SlurmEnv),
) -> Result<Option<Outcome>, RunError> {
    early_stop(stop, events, durable, max_steps, cfg, slurm)
}

/// The fields of the `start` event both drivers fill alike: this process,
/// the run directory, the allocation, the config's hash and the in-job
/// restarts the batch script offers. `max_steps`: `None` under `exec`;
/// `placement`: the driver's (`null` before devices were chosen).
pub fn start_record(
    cfg: &Config,
    dir: &RunDir,
    slurm: &SlurmEnv,
    max_steps: Option<u64>,
    placement: serde_json::Value,
) -> Start {
    Start {
        pid: std::process::id(),
        rekindle_version: env!("CARGO_PKG_VERSION").into(),
        run_dir: dir.root.clone(),
        allocation: serde_json::to_value(slurm).unwrap_or_default(),
        max_steps,
        placement,
        in_job_restart: crate::slurm::injob::InJobOffer::from_process().map(|offer| offer.restarts),
        config_sha256: Some(crate::config::config_hash(cfg)),
        ..Start::default()
    }
}
