//! The start of an attempt: the `start` event, checkpoints that do not
//! verify (recorded, then quarantined so that nothing counts them as
//! checkpoints again), resuming from the newest one that does (or starting
//! fresh), and trimming `metrics.jsonl` back to the step resumed from.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use chrono::{DateTime, Utc};

use crate::checkpoint::{CheckpointInfo, CheckpointStore, CommitGuard, Loaded};
use crate::config::Config;
use crate::slurm::SlurmEnv;
use crate::telemetry::{
    AttemptEnd, CheckpointQuarantined, CheckpointRejected, Event, EventLog, FreshStart, JsonlWriter, LockTakeover,
    Resume, Start, Summary, attempts, metrics_step,
};
use crate::train::{Registry, Trainer, Workload};

use super::super::devices::Devices;
use super::super::error::RunError;
use super::super::lock::{RunLock, Takeover};
use super::super::persist::Persister;
use super::super::rank_watch::RankWatch;
use super::super::ranks::Leader;
use super::super::rundir::{EVENTS_FILE, METRICS_FILE, RunDir, SUMMARY_FILE};
use super::super::settings;
use super::super::stop::StopFlag;
use super::super::watchdog::{Beats, Progress, Watchdog};
use super::ending::early_stop;
use super::hang::{HangDesk, HangHandler, events_path};
use super::saving::AutoInterval;
use super::{Attempt, Started, context};

impl Attempt {
    /// Opens the records, places the run, resumes (or starts fresh) and
    /// starts the monitor; a stop signal that arrived meanwhile ends it here,
    /// and so does a newest checkpoint of `max_steps` (the run is finished:
    /// nothing is recorded or written). `workload`: the trainer's, built and
    /// checked before the run directory was touched.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn start(
        cfg: Config,
        registry: &Registry,
        workload: Box<dyn Workload>,
        dir: RunDir,
        stop: StopFlag,
        stop_at_step: Option<u64>,
        slurm: SlurmEnv,
        lock: &RunLock,
        world: Option<(Leader, Vec<String>, &RankWatch)>,
        allow_config_change: bool,
    ) -> Result<Started, RunError> {
        let ownership = lock.ownership();
        // Every commit first confirms the run directory is still ours.
        let guard = {
            let lock = ownership.clone();
            CommitGuard::new(move || lock.confirm())
        };
        let store = CheckpointStore::open(&dir.checkpoints, cfg.checkpoint.keep)?.with_commit_guard(guard);
        // The interruption history is read before this attempt's `start`.
        let auto_interval = AutoInterval::for_config(&cfg.checkpoint, &dir.path(EVENTS_FILE));
        let mut events = EventLog::open(dir.path(EVENTS_FILE), context(&slurm))?;
        // The newest valid checkpoint is read first, so that the trainer's
        // parameters are built from it rather than drawn and then
        // overwritten (the rejected ones are recorded below, after `start`).
        let mut outcome = store.load_latest()?;
        if let Some(loaded) = &outcome.loaded {
            settings::check(&cfg, loaded, allow_config_change)?;
        }
        if let Some(loaded) = outcome.loaded.as_ref().filter(|l| l.snapshot.step >= cfg.run.max_steps)
            && last_attempt_finished(&dir)
        {
            tracing::info!(
                step = loaded.snapshot.step,
                max_steps = cfg.run.max_steps,
                checkpoint = %loaded.dir.display(),
                "this run already finished at step {}: nothing to train, nothing written (to train further, raise \
                 run.max_steps: with [optimizer] decay_steps set, as it is; else with --allow-config-change)",
                loaded.snapshot.step
            );
            return Ok(Started::AlreadyFinished);
        }
        let initial = outcome.loaded.as_mut().map(|l| Arc::new(std::mem::take(&mut l.snapshot.model)));
        // The placement plan needs the model's size, so the trainer comes first.
        let mut trainer = Trainer::from_registry_prebuilt(&cfg, registry, workload, initial.clone())?;
        let ranks = world.as_ref().map_or(1, |(_, nodes, _)| nodes.len());
        let mut devices = Devices::select(&cfg, registry, &mut trainer, initial.as_ref(), ranks)?;
        let (leader, rank_nodes, watch) =
            world.map_or((None, None, None), |(l, nodes, watch)| (Some(l), Some(nodes), Some(watch)));
        if let Some(leader) = &leader {
            trainer.join_world(Box::new(leader.world().clone()), cfg.model.dropout)?;
            if cfg.distributed.shard_optimizer {
                trainer.shard_optimizer()?;
            }
        }
        let mut start = start_event(&cfg, &dir, &slurm, &devices);
        if let Event::Start(s) = &mut start {
            s.world_size = rank_nodes.as_ref().map(Vec::len);
            s.rank_nodes = rank_nodes.clone();
            s.optimizer_sharded = rank_nodes.as_ref().map(|_| trainer.optimizer_shard().is_some());
        }
        events.record(&start)?;
        if let Some(takeover) = ownership.takeover() {
            events.record(&takeover_event(takeover))?;
        }
        devices.announce(&mut events)?;
        set_aside_rejected(&store, &mut events, &outcome.rejected)?;
        let last_durable_step = outcome.loaded.as_ref().map(|l| l.snapshot.step);
        if let Some(early) = early_stop(&stop, &mut events, last_durable_step, cfg.run.max_steps, &cfg, &slurm)? {
            return Ok(Started::StoppedEarly(early));
        }
        let resumes = previous_summary(&dir).map(|s| s.resumes).unwrap_or(0);
        let (start_step, resumes) = match (&outcome.loaded, initial.as_deref()) {
            (Some(loaded), Some(model)) => {
                let snap = &loaded.snapshot;
                trainer
                    .restore(model, &snap.optimizer, &snap.state["train"])
                    .map_err(|source| RunError::Restore { dir: loaded.dir.clone(), source })?;
                let last_logged = last_logged_step(&dir.path(METRICS_FILE));
                let resume = resume_event(loaded, last_logged, &slurm, Utc::now());
                tracing::info!(step = snap.step, dir = %loaded.dir.display(), steps_lost = resume.steps_lost, "resumed from checkpoint");
                events.record(&Event::Resume(resume))?;
                (snap.step, resumes + 1)
            }
            _ => {
                fresh_start(&mut events, outcome.rejected.len())?;
                (0, resumes)
            }
        };
        if let Some(early) = early_stop(&stop, &mut events, last_durable_step, cfg.run.max_steps, &cfg, &slurm)? {
            return Ok(Started::StoppedEarly(early));
        }
        if let Some(leader) = &leader {
            leader.begin(&stop, outcome.loaded.as_ref().map(|l| l.snapshot.step))?;
        }
        // Steps logged after the checkpoint we resumed from were lost with the
        // previous attempt; they are trained again, so drop their lines to keep
        // every step exactly once.
        truncate_metrics(&dir.path(METRICS_FILE), start_step)?;
        let metrics = JsonlWriter::open(dir.path(METRICS_FILE))?;
        let beats = Beats::default();
        let persister = Persister::spawn(store.clone(), beats.clone())
            .map_err(|source| RunError::RunDir { path: dir.checkpoints.clone(), source })?;
        let hang = std::sync::Arc::new(HangDesk::default());
        // The watchdog and the watch over the other ranks end the attempt the
        // same way, through one handler: whichever finds trouble first takes it.
        let handler = HangHandler {
            cfg: cfg.clone(),
            slurm: slurm.clone(),
            events: events_path(&dir.root),
            store: store.clone(),
            beats: beats.clone(),
            desk: std::sync::Arc::clone(&hang),
            lock: lock.release_handle(),
            summary: dir.path(SUMMARY_FILE),
            start_step,
            resumes,
            started: Instant::now(),
        };
        let handler = std::sync::Arc::new(std::sync::Mutex::new(Some(handler)));
        let take = |slot: &std::sync::Mutex<Option<HangHandler>>| slot.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let (Some(watch), Some(nodes)) = (watch, &rank_nodes) {
            let (slot, size) = (std::sync::Arc::clone(&handler), nodes.len());
            watch.set_handler(Box::new(move |lost| match take(&slot) {
                Some(h) => h.handle_lost(lost, size),
                None => park_forever(),
            }));
        }
        let watchdog = if cfg.watchdog.enabled {
            let slot = std::sync::Arc::clone(&handler);
            let dog = Watchdog::spawn(
                cfg.watchdog.clone(),
                cfg.train.eval_batches,
                beats.clone(),
                Box::new(move |h| match take(&slot) {
                    Some(handler) => handler.handle(h),
                    None => park_forever(),
                }),
            )
            .map_err(|source| RunError::RunDir { path: PathBuf::from("<watchdog thread>"), source })?;
            Some(dog)
        } else {
            None
        };
        // The losses so far come from the checkpoint, not summary.json: a
        // SIGKILLed attempt writes no summary, and after a fallback to an older
        // checkpoint the summary covers steps that are trained again.
        let (last_loss, best_loss) =
            outcome.loaded.as_ref().map(|l| losses_so_far(&l.snapshot.state)).unwrap_or_default();
        if let Some(step) = last_durable_step {
            beats.resumed_from(step);
        }
        beats.progressed(Progress { step: start_step, last_loss, best_loss });
        let monitor = devices.start_monitor(&cfg, &dir, trainer.param_count());
        let mut attempt = Box::new(Attempt {
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
            auto_interval,
            save_due_since: None,
            last_durable_step,
            resumes,
            lock: ownership,
            spare: None,
            parts_inbox: None,
            leader,
            rank_nodes,
            beats,
            _watchdog: watchdog,
            hang,
        });
        attempt.choose_interval(start_step)?;
        Ok(Started::Ready(attempt))
    }
}

/// Whether the last attempt in `events.jsonl` ended with `finish`. A run
/// whose checkpoint of `max_steps` is written but whose ending was cut short
/// (its publish hung, it was killed) is not finished yet: the next attempt
/// resumes there and goes through the ending again (publish, `finish`).
fn last_attempt_finished(dir: &RunDir) -> bool {
    let events = super::recorded(&dir.path(EVENTS_FILE));
    attempts(&events).last().is_some_and(|a| a.end == AttemptEnd::Finished)
}

/// The other handler is ending the process: this thread waits for that.
fn park_forever() -> ! {
    loop {
        std::thread::park();
    }
}

fn start_event(cfg: &Config, dir: &RunDir, slurm: &SlurmEnv, devices: &Devices) -> Event {
    start_record(cfg, dir, slurm, devices.describe())
}

/// The `start` event of this process, with `placement` (`null` for an
/// attempt that failed before its devices were chosen).
pub(super) fn start_record(cfg: &Config, dir: &RunDir, slurm: &SlurmEnv, placement: serde_json::Value) -> Event {
    Event::Start(Start {
        pid: std::process::id(),
        rekindle_version: env!("CARGO_PKG_VERSION").into(),
        run_dir: dir.root.clone(),
        allocation: serde_json::to_value(slurm).unwrap_or_default(),
        max_steps: Some(cfg.run.max_steps),
        placement,
        world_size: None,
        rank_nodes: None,
        optimizer_sharded: None,
    })
}

/// A `checkpoint_rejected` event (and a warning) per checkpoint that does not
/// verify, then each is moved to quarantine and a `checkpoint_quarantined`
/// event says where (or why it could not be moved).
pub(in crate::orchestrate) fn set_aside_rejected(
    store: &CheckpointStore,
    events: &mut EventLog,
    rejected: &[CheckpointInfo],
) -> Result<(), RunError> {
    record_rejected(events, rejected)?;
    for q in store.quarantine(rejected) {
        events.record(&Event::CheckpointQuarantined(CheckpointQuarantined {
            step: q.step,
            dir: q.dir.clone(),
            reason: q.reason(),
            failures: serde_json::to_value(&q.failures).unwrap_or_default(),
            moved_to: q.moved_to.as_ref().ok().cloned(),
            error: q.moved_to.as_ref().err().map(|e| e.to_string()),
        }))?;
    }
    Ok(())
}

/// The `lock_takeover` event of a lock taken over from a holder judged gone.
pub(in crate::orchestrate) fn takeover_event(t: &Takeover) -> Event {
    let previous = t.previous.as_ref();
    Event::LockTakeover(LockTakeover {
        reason: t.reason.clone(),
        previous_host: previous.map(|p| p.host.clone()),
        previous_pid: previous.map(|p| p.pid),
        previous_job_id: previous.and_then(|p| p.job_id.clone()),
        previous_restart_count: previous.and_then(|p| p.restart_count),
        heartbeat_age_seconds: t.heartbeat_age_s.filter(|a| a.is_finite()),
        waited_seconds: t.waited_s,
    })
}

/// A `checkpoint_rejected` event (and a warning) per checkpoint that does not verify.
fn record_rejected(events: &mut EventLog, rejected: &[CheckpointInfo]) -> Result<(), RunError> {
    for r in rejected {
        let reasons: Vec<String> = r.failures.iter().map(|f| f.to_string()).collect();
        events.record(&Event::CheckpointRejected(CheckpointRejected {
            step: r.step,
            dir: r.dir.clone(),
            failures: serde_json::to_value(&r.failures).unwrap_or_default(),
        }))?;
        tracing::warn!(step = r.step, reasons = %reasons.join("; "), "skipping checkpoint that does not verify");
    }
    Ok(())
}

/// No checkpoint to resume from: say so, loudly when some were rejected.
pub(in crate::orchestrate) fn fresh_start(events: &mut EventLog, rejected: usize) -> Result<(), RunError> {
    if rejected == 0 {
        tracing::info!("no checkpoint yet: starting from step 0");
        return Ok(());
    }
    tracing::error!(
        rejected,
        "NO CHECKPOINT VERIFIES: starting fresh from step 0 (the invalid ones are kept for inspection in checkpoints/quarantine/)"
    );
    events.record(&Event::FreshStart(FreshStart { reason: "no checkpoint verifies".into(), rejected }))?;
    Ok(())
}

/// The `resume` event for a checkpoint loaded at `now`; `last_logged` is
/// the highest step in metrics.jsonl (what the previous attempt reached).
fn resume_event(loaded: &Loaded, last_logged: Option<u64>, slurm: &SlurmEnv, now: DateTime<Utc>) -> Resume {
    let snap = &loaded.snapshot;
    Resume {
        previous_node: snap.state["host"]["node"].as_str().map(str::to_string),
        previous_attempt: snap.state["host"]["slurm_restart_count"].as_u64(),
        ..resume_record(snap.step, &loaded.dir, &loaded.manifest.created_at, last_logged, slurm, now)
    }
}

/// The `resume` event of a checkpoint of `step` in `from`, committed at
/// `created_at` (RFC 3339), as far as the checkpoint's manifest tells (no
/// previous node or attempt: those are in a native checkpoint's state).
pub(in crate::orchestrate) fn resume_record(
    step: u64,
    from: &Path,
    created_at: &str,
    last_logged: Option<u64>,
    slurm: &SlurmEnv,
    now: DateTime<Utc>,
) -> Resume {
    let since_checkpoint = DateTime::parse_from_rfc3339(created_at)
        .ok()
        .map(|t| (now - t.with_timezone(&Utc)).num_milliseconds() as f64 / 1000.0);
    Resume {
        step,
        from: from.to_path_buf(),
        previous_node: None,
        previous_attempt: None,
        this_node: slurm.node_name(),
        restart_count: slurm.restart_count,
        steps_lost: last_logged.map(|s| s.saturating_sub(step)).unwrap_or(0),
        seconds_since_checkpoint: since_checkpoint,
    }
}

pub(in crate::orchestrate) fn previous_summary(dir: &RunDir) -> Option<Summary> {
    Summary::read(&dir.path(SUMMARY_FILE))
}

/// `(last_loss, best_loss)` of the steps up to a checkpoint, as its `state.json` recorded them.
pub(super) fn losses_so_far(state: &serde_json::Value) -> (Option<f64>, Option<f64>) {
    (state["metrics"]["last_loss"].as_f64(), state["metrics"]["best_loss"].as_f64())
}

/// The highest step in metrics.jsonl (what the previous attempt reached).
pub(in crate::orchestrate) fn last_logged_step(path: &Path) -> Option<u64> {
    let lines = crate::telemetry::read_jsonl(path).ok()??;
    lines.records.iter().filter_map(metrics_step).max()
}

/// Keeps only metric lines of steps ≤ `step` (and drops a torn last line).
pub(in crate::orchestrate) fn truncate_metrics(path: &Path, step: u64) -> Result<(), RunError> {
    // Never through a symlink or FIFO in its place (crate::confine).
    let mut text = String::new();
    match crate::confine::open_regular(path).and_then(|mut f| std::io::Read::read_to_string(&mut f, &mut text)) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => return Err(RunError::RunDir { path: path.to_path_buf(), source }),
    }
    let kept: String = text
        .lines()
        .filter(|line| serde_json::from_str(line).ok().and_then(|v| metrics_step(&v)).is_some_and(|s| s <= step))
        .map(|l| format!("{l}\n"))
        .collect();
    if kept.len() != text.len() {
        super::super::write_atomically(path, kept.as_bytes())
            .map_err(|source| RunError::RunDir { path: path.to_path_buf(), source })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{Manifest, Snapshot, TensorSet};
    use std::collections::BTreeMap;

    const METRICS: &str = "{\"step\":4,\"loss\":1.0}\n{\"step\":6,\"val_loss\":0.9}\n{\"step\":8,\"loss\":0.8}\n";

    #[test]
    fn truncating_metrics_keeps_steps_up_to_the_checkpoint_and_drops_a_torn_line() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("metrics.jsonl");
        std::fs::write(&path, format!("{METRICS}{{\"step\":9,\"lo")).unwrap();
        truncate_metrics(&path, 6).unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "{\"step\":4,\"loss\":1.0}\n{\"step\":6,\"val_loss\":0.9}\n"
        );
        // Nothing to drop: the file is left alone; a missing file is fine.
        truncate_metrics(&path, 100).unwrap();
        assert!(std::fs::read_to_string(&path).unwrap().ends_with("0.9}\n"));
        truncate_metrics(&tmp.path().join("absent.jsonl"), 0).unwrap();
    }

    #[test]
    fn the_last_logged_step_counts_every_kind_of_line() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("metrics.jsonl");
        std::fs::write(&path, format!("{METRICS}{{\"step\":10,\"val_loss\":0.7}}\n{{\"step\":11")).unwrap();
        assert_eq!(last_logged_step(&path), Some(10));
        assert_eq!(last_logged_step(&tmp.path().join("absent.jsonl")), None);
    }

    fn loaded(step: u64, state: serde_json::Value) -> Loaded {
        Loaded {
            dir: format!("ckpt/step-{step}").into(),
            manifest: Manifest {
                format_version: 1,
                kind: crate::checkpoint::CheckpointKind::Native,
                step,
                created_at: "2026-11-23T12:00:00.000Z".into(),
                rekindle_version: "test".into(),
                files: Vec::new(),
            },
            snapshot: Snapshot { step, model: TensorSet::new(), optimizer: TensorSet::new(), state },
        }
    }

    #[test]
    fn a_resume_says_where_from_what_was_lost_and_how_old_the_checkpoint_is() {
        let state = serde_json::json!({"host": {"node": "n1", "slurm_restart_count": 2}});
        let slurm = SlurmEnv::from_map(&BTreeMap::from([
            ("SLURMD_NODENAME".to_string(), "n2".to_string()),
            ("SLURM_RESTART_COUNT".to_string(), "3".to_string()),
        ]));
        let now = DateTime::parse_from_rfc3339("2026-11-23T12:00:01.500Z").unwrap().with_timezone(&Utc);
        let r = resume_event(&loaded(50, state), Some(61), &slurm, now);
        assert_eq!((r.step, r.steps_lost, r.restart_count), (50, 11, 3));
        assert_eq!((r.previous_node.as_deref(), r.previous_attempt, r.this_node.as_str()), (Some("n1"), Some(2), "n2"));
        assert_eq!(r.seconds_since_checkpoint, Some(1.5));
        assert_eq!(r.from, Path::new("ckpt/step-50"));
        // A checkpoint without host facts, and nothing logged after it.
        let r = resume_event(&loaded(50, serde_json::json!({})), Some(40), &slurm, now);
        assert_eq!((r.previous_node, r.previous_attempt, r.steps_lost), (None, None, 0));
    }

    #[test]
    fn losses_come_from_the_checkpoint_state() {
        let state = serde_json::json!({"metrics": {"last_loss": 0.5, "best_loss": null}});
        assert_eq!(losses_so_far(&state), (Some(0.5), None));
        assert_eq!(losses_so_far(&serde_json::json!({})), (None, None));
    }
}
