//! The start of an attempt: the `start` event, checkpoints that do not
//! verify (recorded, then quarantined so that nothing counts them as
//! checkpoints again), resuming from the newest one that does (or starting
//! fresh), and trimming `metrics.jsonl` back to the step resumed from.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use chrono::{DateTime, Utc};

use crate::checkpoint::local::{self as local_tier, LocalChoice};
use crate::checkpoint::{CheckpointStore, LoadOutcome, Loaded, TensorSet, VerifyLevel, load_dir};
use crate::config::Config;
use crate::slurm::SlurmEnv;
use crate::telemetry::{AttemptEnd, Event, EventLog, JsonlWriter, Recovery, Resume, Start, attempts};
use crate::train::{Registry, Trainer, Workload};

use super::envelope::StateEnvelope;
use super::hang::{HangDesk, HangHandler, events_path};
use super::saving::AutoInterval;
use super::{Attempt, Started};
use crate::attempt::devices::Devices;
use crate::attempt::error::RunError;
use crate::attempt::opening::{self, Held};
use crate::attempt::rank_watch::RankWatch;
use crate::attempt::records::{
    fresh_start, last_logged_step, previous_fault, previous_summary, recorded, resume_record,
};
use crate::attempt::stop::StopFlag;
use crate::attempt::straggler::{Detector, Rule};
use crate::attempt::watchdog::{Beats, Progress, Watchdog};
use crate::checkpoint::persist::Persister;
use crate::run::local::{Side, share};
use crate::run::ranks::Leader;
use crate::run::settings;
use crate::rundir::{EVENTS_FILE, METRICS_FILE, RunDir, SUMMARY_FILE};

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
        held: &Held,
        stop: StopFlag,
        stop_at_step: Option<u64>,
        slurm: SlurmEnv,
        world: Option<(Leader, Vec<String>, &RankWatch)>,
        allow_config_change: bool,
        (local_root, refused): (Option<Result<PathBuf, String>>, Vec<local_tier::Unusable>),
    ) -> Result<Started, RunError> {
        let ownership = held.lock.ownership();
        // Every commit first confirms the run directory is still ours.
        let (store, dir) = (held.store.clone(), held.dir.clone());
        // The interruption history is read before this attempt's `start`.
        let auto_interval = AutoInterval::for_config(&cfg.checkpoint, &dir.path(EVENTS_FILE));
        let records = recorded(&dir.path(EVENTS_FILE));
        let fault = previous_fault(&records);
        let last_local = crate::run::local::last_committed(&records);
        let world_leader = world.as_ref().map(|(l, nodes, _)| (l, nodes.as_slice()));
        let resume = ResumeContext {
            cfg: &cfg,
            dir: &dir,
            store: &store,
            stop: &stop,
            slurm: &slurm,
            allow_config_change,
            last_local,
        };
        let Some((mut outcome, source)) = resume.point(local_root.as_ref(), world_leader)? else {
            return Ok(Started::AlreadyFinished);
        };
        let initial = outcome.loaded.as_mut().map(|l| Arc::new(std::mem::take(&mut l.snapshot.model)));
        let (leader, rank_nodes, watch) =
            world.map_or((None, None, None), |(l, nodes, watch)| (Some(l), Some(nodes), Some(watch)));
        let ranks = rank_nodes.as_ref().map_or(1, Vec::len);
        let (mut trainer, mut devices) = place(&cfg, registry, workload, initial.as_ref(), leader.as_ref(), ranks)?;
        let mut events =
            held.open_records(&slurm, start_event(&cfg, &dir, &slurm, &devices, rank_nodes.as_ref(), &trainer))?;
        // Copies any node refused as untrusted (told at hello; this node's
        // alone in a run of one process).
        let refused = leader.as_ref().map_or_else(|| vec![refused], |l| l.refused().to_vec());
        let here = rank_nodes.clone().unwrap_or_else(|| vec![slurm.node_name()]);
        for event in crate::run::local::refusal_events(&refused, &here) {
            tracing::warn!(reason = event.reason.as_deref().unwrap_or_default(), "a local copy is refused");
            events.record(&Event::LocalCheckpoint(event))?;
        }
        devices.announce(&mut events)?;
        let last_durable_step = outcome.loaded.as_ref().map(|l| l.snapshot.step);
        let max_steps = cfg.run.max_steps;
        if let Some(early) =
            held.settle(&mut events, &outcome.rejected, &stop, last_durable_step, max_steps, (&cfg, &slurm))?
        {
            return Ok(Started::StoppedEarly(early));
        }
        let steps_before = last_logged_step(&dir.path(METRICS_FILE));
        let (start_step, resumes) =
            resume_or_fresh(&mut trainer, &outcome, initial.as_deref(), &dir, &slurm, &mut events, &source)?;
        if let Some(early) = opening::stopped(&mut events, &stop, last_durable_step, max_steps, (&cfg, &slurm))? {
            return Ok(Started::StoppedEarly(early));
        }
        if let Some(leader) = &leader {
            leader.begin(&stop, outcome.loaded.as_ref().map(|l| l.snapshot.step), source.tier == Some(Tier::Local))?;
        }
        // Steps logged after the checkpoint we resumed from were lost with the
        // previous attempt; they are trained again, so their lines go (every
        // step exactly once) before the exports start.
        let exports = held.begin(&cfg, &slurm, start_step)?;
        let metrics = JsonlWriter::open(dir.path(METRICS_FILE))?;
        let beats = Beats::default();
        let persister = Persister::spawn(store.clone(), Arc::new(beats.clone()))
            .map_err(|source| RunError::RunDir { path: dir.checkpoints.clone(), source })?;
        let hang = Arc::new(HangDesk::default());
        let handler = HangHandler {
            cfg: cfg.clone(),
            slurm: slurm.clone(),
            events: events_path(&dir.root),
            store: store.clone(),
            beats: beats.clone(),
            desk: Arc::clone(&hang),
            lock: held.lock.release_handle(),
            summary: dir.path(SUMMARY_FILE),
            start_step,
            resumes,
            started: Instant::now(),
        };
        let watchdog = arm_hang_handler(handler, &cfg, &beats, watch, rank_nodes.as_ref())?;
        // The losses so far come from the checkpoint, not summary.json: a
        // SIGKILLed attempt writes no summary, and after a fallback to an older
        // checkpoint the summary covers steps that are trained again.
        let (last_loss, best_loss) =
            outcome.loaded.as_ref().map(|l| StateEnvelope::of(&l.snapshot).losses_so_far()).unwrap_or_default();
        if let Some(step) = last_durable_step {
            beats.resumed_from(step);
        }
        beats.progressed(Progress { step: start_step, last_loss, best_loss });
        let monitor = devices.start_monitor(&cfg, &dir, trainer.param_count());
        let stragglers = Rule::of(&cfg.health).map(|rule| Detector::new(rule, ranks));
        let mut attempt = Box::new(Attempt {
            stragglers,
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
            exports: crate::telemetry::Rewinder::none(),
            consecutive_failures: 0,
            last_checkpoint: Instant::now(),
            auto_interval,
            save_due_since: None,
            last_durable_step,
            resumes,
            lock: ownership,
            spare: None,
            parts_inbox: None,
            local: None,
            recovering: None,
            leader,
            rank_nodes,
            beats,
            _watchdog: watchdog,
            hang,
        });
        attempt.recovering = outcome.loaded.as_ref().and(fault).map(|fault| {
            let in_job = fault.job_id.is_some()
                && fault.job_id == attempt.slurm.job_id
                && fault.restart_count == Some(u64::from(attempt.slurm.restart_count));
            let recovery = Recovery {
                resumed_from: start_step,
                tier: source.tier.unwrap_or(Tier::Durable).name().into(),
                steps_lost: steps_before.map_or(0, |s| s.saturating_sub(start_step)),
                fault: fault.kind,
                in_job,
                ..Recovery::default()
            };
            (recovery, fault.at)
        });
        if let Some(place) = local_root {
            attempt.open_local_tier(place, start_step)?;
        }
        attempt.choose_interval(start_step)?;
        Ok(Started::Ready(attempt, exports))
    }
}

/// What [`ResumeContext::point`] needs of the attempt.
struct ResumeContext<'a> {
    cfg: &'a Config,
    dir: &'a RunDir,
    store: &'a CheckpointStore,
    stop: &'a StopFlag,
    slurm: &'a SlurmEnv,
    allow_config_change: bool,
    /// The newest local checkpoint the records say was committed, and its holders.
    last_local: Option<(u64, Vec<String>)>,
}

impl ResumeContext<'_> {
    /// The checkpoint this attempt resumes from and where it came from;
    /// `None` when it ends a run that finished. With `[recovery] local`
    /// (`local`: this node's root, or why it has none), the tier is chosen
    /// before anything is loaded: the newest local checkpoint wins when it
    /// is newer than the newest durable one *listed* (manifest, files and
    /// sizes: no contents read), so a durable checkpoint that a local one
    /// supersedes is never read nor hashed. The durable tier is loaded (the
    /// newest that verifies) when the local one is not newer or fails; when
    /// that durable one is older than the one listed (which did not verify),
    /// a local checkpoint newer than it is tried after all.
    fn point(
        &self,
        local: Option<&Result<PathBuf, String>>,
        world: Option<(&Leader, &[String])>,
    ) -> Result<Option<(LoadOutcome, ResumeSource)>, RunError> {
        let root = match local {
            None => return Ok(self.newest_unfinished()?.map(|o| (o, ResumeSource::default()))),
            Some(Err(why)) => {
                let source = ResumeSource::durable(format!("rank 0's node has no local directory: {why}"));
                return Ok(self.newest_unfinished()?.map(|o| (o, source)));
            }
            Some(Ok(root)) => root,
        };
        let listed = newest_listed(self.store)?;
        let (mut reason, tried) = match self.restore_local(root, listed, world)? {
            LocalResume::Loaded(loaded, source) => {
                if finished(self.cfg, self.dir, &loaded) {
                    return Ok(None);
                }
                return Ok(Some((LoadOutcome { loaded: Some(*loaded), rejected: Vec::new() }, source)));
            }
            LocalResume::NotChosen(reason) => (reason, false),
            LocalResume::Failed(reason) => (reason, true),
        };
        let Some(mut outcome) = self.newest_unfinished()? else { return Ok(None) };
        let loaded = outcome.loaded.as_ref().map(|l| l.snapshot.step);
        if !tried && loaded != listed {
            match self.restore_local(root, loaded, world)? {
                LocalResume::Loaded(local, source) => {
                    outcome.loaded = Some(*local);
                    return Ok(Some((outcome, source)));
                }
                LocalResume::NotChosen(why) | LocalResume::Failed(why) => reason = why,
            }
        }
        Ok(Some((outcome, ResumeSource::durable(reason))))
    }

    /// The newest durable checkpoint that verifies (and the newer ones that
    /// did not), checked against this config; `None` when it ends a run
    /// that finished.
    fn newest_unfinished(&self) -> Result<Option<LoadOutcome>, RunError> {
        // The newest valid checkpoint is read first, so that the trainer's
        // parameters are built from it rather than drawn and then
        // overwritten (the rejected ones are recorded after `start`).
        let outcome = self.store.load_latest()?;
        if let Some(loaded) = &outcome.loaded {
            settings::check(self.cfg, loaded, self.allow_config_change)?;
            if finished(self.cfg, self.dir, loaded) {
                return Ok(None);
            }
        }
        Ok(Some(outcome))
    }

    /// The newest local checkpoint when it is newer than the durable one
    /// of step `durable` (`checkpoint::local::choose` over what every
    /// rank's node holds), loaded after it was shared with the nodes that
    /// lack it; else why not. Every rank takes part in the same rounds
    /// (`ranks.rs`).
    fn restore_local(
        &self,
        root: &std::path::Path,
        durable: Option<u64>,
        world: Option<(&Leader, &[String])>,
    ) -> Result<LocalResume, RunError> {
        let run = local_tier::run_identity(&self.dir.root);
        let held = match world {
            Some((leader, _)) => leader.held().to_vec(),
            None => vec![local_tier::held(root, &run).0],
        };
        let (step, holder) = match local_tier::choose(&held, durable) {
            LocalChoice::Local { step, holder } => (step, holder),
            LocalChoice::Durable { reason } => {
                let here = world.map_or_else(|| vec![self.slurm.node_name()], |(_, nodes)| nodes.to_vec());
                let last = self.last_local.as_ref().map(|(step, holders)| (*step, holders.as_slice()));
                return Ok(LocalResume::NotChosen(match local_tier::holders_gone(last, &here, durable) {
                    Some(gone) => format!("{reason}: {gone}"),
                    None => reason,
                }));
            }
        };
        let holder_node =
            world.and_then(|(_, nodes)| nodes.get(holder).cloned()).unwrap_or_else(|| self.slurm.node_name());
        if let Some((leader, nodes)) = world {
            leader.local_restore(self.stop, step, holder)?;
            let side = Side::Root { root, write: super::ranks::tier_holds(root, step, &run).is_err() };
            if let Err(failed) = share(leader.world(), holder, step, &run, side) {
                return Ok(LocalResume::Failed(format!(
                    "the local checkpoint of step {step} on {holder_node} could not be copied to every node: {}",
                    crate::run::local::by_rank(&failed, nodes)
                )));
            }
        }
        let dir = root.join(crate::checkpoint::step_dir_name(step));
        match load_dir(&dir) {
            Ok(loaded) => {
                settings::check(self.cfg, &loaded, self.allow_config_change)?;
                tracing::info!(step, from = %holder_node, durable = ?durable, "resuming from the node-local tier");
                let source =
                    ResumeSource { tier: Some(Tier::Local), source_node: Some(holder_node), fallback_reason: None };
                Ok(LocalResume::Loaded(Box::new(loaded), source))
            }
            Err(failures) => {
                let first = failures.first().map(ToString::to_string).unwrap_or_default();
                Ok(LocalResume::Failed(format!("the local checkpoint of step {step} does not load here: {first}")))
            }
        }
    }
}

/// The newest durable checkpoint whose manifest, files and sizes check
/// (nothing is read beyond the manifest).
fn newest_listed(store: &CheckpointStore) -> Result<Option<u64>, RunError> {
    if !store.dir().exists() {
        return Ok(None);
    }
    Ok(store.newest_valid(VerifyLevel::Quick)?.map(|info| info.step))
}

/// Whether `loaded`, the checkpoint to resume from, ends a run that
/// finished: it is of `max_steps` (or later) and the last attempt finished.
fn finished(cfg: &Config, dir: &RunDir, loaded: &Loaded) -> bool {
    if loaded.snapshot.step < cfg.run.max_steps || !last_attempt_finished(dir) {
        return false;
    }
    tracing::info!(
        step = loaded.snapshot.step,
        max_steps = cfg.run.max_steps,
        checkpoint = %loaded.dir.display(),
        "this run already finished at step {}: nothing to train, nothing written (to train further, raise \
         run.max_steps: with [optimizer] decay_steps set, as it is; else with --allow-config-change)",
        loaded.snapshot.step
    );
    true
}

/// What the local tier offers a resume.
enum LocalResume {
    /// The local checkpoint, loaded and verified.
    Loaded(Box<Loaded>, ResumeSource),
    /// None is newer than the durable tier (why); no round was made.
    NotChosen(String),
    /// One was chosen but could not be shared or loaded (why).
    Failed(String),
}

/// Which tier a resume comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Tier {
    Durable,
    Local,
}

impl Tier {
    fn name(self) -> &'static str {
        match self {
            Tier::Durable => "durable",
            Tier::Local => "local",
        }
    }
}

/// Where the checkpoint resumed from came from, for the `resume` event.
#[derive(Debug, Clone, Default)]
pub(super) struct ResumeSource {
    tier: Option<Tier>,
    source_node: Option<String>,
    fallback_reason: Option<String>,
}

impl ResumeSource {
    /// The durable tier, with the local tier on: `reason` says why not local.
    fn durable(reason: String) -> ResumeSource {
        tracing::info!(%reason, "resuming from the durable tier (if from a checkpoint)");
        ResumeSource { tier: Some(Tier::Durable), source_node: None, fallback_reason: Some(reason) }
    }
}

/// Builds the trainer (from `initial` when resuming) and places it on its
/// devices; in a world of ranks, joins it to the world and shards its
/// optimizer when the config says so.
fn place(
    cfg: &Config,
    registry: &Registry,
    workload: Box<dyn Workload>,
    initial: Option<&Arc<TensorSet>>,
    leader: Option<&Leader>,
    ranks: usize,
) -> Result<(Trainer, Devices), RunError> {
    // The placement plan needs the model's size, so the trainer comes first.
    let mut trainer = Trainer::from_registry_prebuilt(cfg, registry, workload, initial.cloned())?;
    let devices = Devices::select(cfg, registry, &mut trainer, initial, ranks)?;
    if let Some(leader) = leader {
        trainer.join_world(Box::new(leader.world().clone()), cfg.model.dropout)?;
        if cfg.distributed.shard_optimizer {
            trainer.shard_optimizer()?;
        }
    }
    Ok((trainer, devices))
}

/// Restores the trainer from the checkpoint loaded (`initial`, its model)
/// and records `resume`, or records a fresh start; returns the step training
/// starts at and how many resumes the run has had.
fn resume_or_fresh(
    trainer: &mut Trainer,
    outcome: &LoadOutcome,
    initial: Option<&TensorSet>,
    dir: &RunDir,
    slurm: &SlurmEnv,
    events: &mut EventLog,
    source: &ResumeSource,
) -> Result<(u64, u64), RunError> {
    let resumes = previous_summary(dir).map(|s| s.resumes).unwrap_or(0);
    match (&outcome.loaded, initial) {
        (Some(loaded), Some(model)) => {
            let snap = &loaded.snapshot;
            trainer
                .restore(model, &snap.optimizer, &StateEnvelope::of(snap).train)
                .map_err(|source| RunError::Restore { dir: loaded.dir.clone(), source })?;
            let last_logged = last_logged_step(&dir.path(METRICS_FILE));
            let mut resume = resume_event(loaded, last_logged, slurm, Utc::now());
            resume.tier = Some(source.tier.unwrap_or(Tier::Durable).name().into());
            resume.source_node = source.source_node.clone();
            resume.fallback_reason = source.fallback_reason.clone();
            tracing::info!(step = snap.step, dir = %loaded.dir.display(), steps_lost = resume.steps_lost, tier = ?resume.tier, "resumed from checkpoint");
            events.record(&Event::Resume(resume))?;
            Ok((snap.step, resumes + 1))
        }
        _ => {
            fresh_start(events, outcome.rejected.len())?;
            Ok((0, resumes))
        }
    }
}

/// Gives `handler` to the watchdog (when enabled) and to the watch over the
/// other ranks (in a world): both end the attempt the same way, and
/// whichever finds trouble first takes it. Returns the watchdog.
fn arm_hang_handler(
    handler: HangHandler,
    cfg: &Config,
    beats: &Beats,
    watch: Option<&RankWatch>,
    rank_nodes: Option<&Vec<String>>,
) -> Result<Option<Watchdog>, RunError> {
    let handler = Arc::new(std::sync::Mutex::new(Some(handler)));
    let take = |slot: &std::sync::Mutex<Option<HangHandler>>| slot.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let (Some(watch), Some(nodes)) = (watch, rank_nodes) {
        let (slot, size) = (Arc::clone(&handler), nodes.len());
        watch.set_handler(Box::new(move |lost| match take(&slot) {
            Some(h) => h.handle_lost(lost, size),
            None => park_forever(),
        }));
    }
    if !cfg.watchdog.enabled {
        return Ok(None);
    }
    let slot = Arc::clone(&handler);
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
    Ok(Some(dog))
}

/// Whether the last attempt in `events.jsonl` ended with `finish`. A run
/// whose checkpoint of `max_steps` is written but whose ending was cut short
/// (its publish hung, it was killed) is not finished yet: the next attempt
/// resumes there and goes through the ending again (publish, `finish`).
fn last_attempt_finished(dir: &RunDir) -> bool {
    let events = recorded(&dir.path(EVENTS_FILE));
    attempts(&events).last().is_some_and(|a| a.end == AttemptEnd::Finished)
}

/// The other handler is ending the process: this thread waits for that.
fn park_forever() -> ! {
    loop {
        std::thread::park();
    }
}

/// The `start` event of this attempt: where it runs and, in a world of
/// ranks, the ranks' nodes and whether the optimizer is sharded.
fn start_event(
    cfg: &Config,
    dir: &RunDir,
    slurm: &SlurmEnv,
    devices: &Devices,
    rank_nodes: Option<&Vec<String>>,
    trainer: &Trainer,
) -> Start {
    Start {
        world_size: rank_nodes.map(Vec::len),
        rank_nodes: rank_nodes.cloned(),
        optimizer_sharded: rank_nodes.map(|_| trainer.optimizer_shard().is_some()),
        ..opening::start_record(cfg, dir, slurm, Some(cfg.run.max_steps), devices.describe())
    }
}

/// The `resume` event for a checkpoint loaded at `now`; `last_logged` is
/// the highest step in metrics.jsonl (what the previous attempt reached).
fn resume_event(loaded: &Loaded, last_logged: Option<u64>, slurm: &SlurmEnv, now: DateTime<Utc>) -> Resume {
    let snap = &loaded.snapshot;
    let host = StateEnvelope::of(snap).host;
    Resume {
        previous_node: host.node,
        previous_attempt: host.slurm_restart_count,
        ..resume_record(snap.step, &loaded.dir, &loaded.manifest.created_at, last_logged, slurm, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{Manifest, Snapshot, TensorSet};
    use std::collections::BTreeMap;
    use std::path::Path;

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
}
