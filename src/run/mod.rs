//! `rekindle run`: the lifecycle of one attempt of a run, as a sequence of
//! phases, each in its own file under `run/`:
//!
//! ```text
//! run          load config ─ build the workload, loading its data ─ the
//!              progress guard and this node's health check (exit 79 or
//!              `node_unhealthy`: attempt/health.rs) ─ the opening both
//!              drivers share (attempt/opening.rs): claim the run dir, refuse
//!              `exec`'s checkpoints, (join the world,) lock, the resume
//!              guard, prepare it (everything before the lock writes nothing
//!              but a new directory: a config or data problem exits 78 there)
//! start.rs     newest checkpoint already of max_steps: exit 0, nothing
//!              written ─ place on devices (devices.rs) ─ open records with
//!              the `start` event ─ resume from the newest checkpoint that
//!              verifies (or start at step 0) ─ trim metrics and start the
//!              exports (TensorBoard, Prometheus: attempt/exports.rs) ─ the
//!              GPU/host monitor; a start that fails records `error`
//!              (ending.rs), exit 1
//! train_loop   steps (out of memory: retry with half the micro-batch, at most
//!              5 times) ─ metrics ─ periodic checkpoints persisted in the
//!              background (saving.rs)
//! ending.rs    max_steps (also when a stop arrives with the last step, or
//!              --stop-at-step >= max_steps): final checkpoint, summary,
//!              publish, `finish`, exit 0
//!              stop signal / --stop-at-step: stop checkpoint, requeue
//!              (slurm::requeue_after_stop), summary, publish, `stop`; each
//!              failure recorded and passed over; exit 75 with a durable
//!              checkpoint (this attempt's or an earlier one, named), else 1
//!              (third signal or deadline passed: exit at once, budget.rs)
//!              failure: classified (crash.rs): transient → requeue with a
//!              hold, bounded; deterministic → none; `error`, failed
//!              summary, exit 1
//! hang.rs      the watchdog (its own thread) found a step, evaluation, save
//!              or publish stuck: `hang`, checkpoint if the training thread
//!              is free, requeue, `stop`, exit 75 (1 without a checkpoint)
//! ```
//!
//! The training loop runs on this thread and polls the stop flag between
//! micro-batches; the signal handler only records. A stop signal that
//! arrives before training began ends the attempt in `start` (still
//! requeueing the job when it should be): exit 75 with an earlier checkpoint
//! to resume from, exit 0 when that checkpoint already is of `max_steps` (the
//! run is finished), exit 1 when there is no checkpoint yet.

pub(crate) mod ending;
mod envelope;
mod hang;
mod local;
mod lost;
mod ranks;
mod saving;
mod settings;
pub(crate) mod start;

use std::path::PathBuf;
use std::time::Instant;

use crate::checkpoint::{CheckpointKind, CheckpointStore, TensorSet};
use crate::config::{self, Config};
use crate::distributed::{self, SharedWorld, WorldInfo};
use crate::exit::Outcome;
use crate::gpu::Monitor;
use crate::slurm::SlurmEnv;
use crate::telemetry::{EventLog, JsonlWriter, MetricsLine, RankCompute, StepLine, ValLine, now_rfc3339};
use crate::train::{Registry, StepMetrics, StepResult, TrainError, Trainer, Workload};

use crate::attempt::devices::Devices;
use crate::attempt::error::RunError;
use crate::attempt::opening;
use crate::attempt::progress::Progress;
use crate::attempt::rank_watch::{RANKS_DIR, RankWatch, WatchSetup, new_session};
use crate::attempt::stop::{StopFlag, StopReason};
use crate::attempt::watchdog::{Activity, Beats, Progress as WatchedProgress, Watchdog, Worker};
use crate::checkpoint::persist::Persister;
use crate::run::lost::WorldEnd;
use crate::rundir::lock::LockOwnership;
use crate::rundir::{self, RunDir};
use ending::Ending;
use hang::HangDesk;
use ranks::Leader;

/// What `rekindle run` was asked to do.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// The model kinds the program builds (`[model] kind`).
    pub registry: Registry,
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
    let loaded = config::load_with(&opts.config_path, &opts.overrides, &opts.registry)?;
    let cfg = loaded.config;
    // Whatever the config or its data hold that training cannot use is
    // found here, before the run directory is touched: exit 78, nothing
    // written (the data of a `[data] path` loads once, for the trainer).
    let workload = opts.registry.checked_workload(&cfg).map_err(RunError::Unusable)?;
    let slurm = SlurmEnv::from_process();
    let info = WorldInfo::detect().map_err(RunError::Distributed)?;
    let root = rundir::resolve_run_dir(opts.run_dir.as_deref(), &cfg);
    // Every rank checks its node before anything is joined or written
    // (docs/slurm.md, "Bad nodes"); rank 0 also keeps the progress guard.
    crate::attempt::health::before_start(&cfg, &slurm, &root, info.is_leader(), &stop)?;
    // A data-parallel run (docs/distributed.md) joins its world first: a
    // launch whose ranks do not make one (exit 78) leaves no run directory.
    let world = match info.size {
        0 | 1 => None,
        _ => Some(SharedWorld::new(distributed::connect(&info).map_err(RunError::Distributed)?)),
    };
    // Before anything is written there, by any rank (the ranks' beats go
    // into `ranks/` at once): a directory that is not rekindle's is refused.
    // Still before anything is written: checkpoints `rekindle exec` sealed
    // are continued by it, not by `run` (attempt/opening.rs: the opening
    // both drivers share).
    let claimed = opening::claim(root.clone(), &cfg, CheckpointKind::Native)?;
    // The node-local tier ([recovery] local): this node's root (or why it
    // has none: the tier is then off for the attempt, which rank 0 records),
    // the local checkpoints it holds that verify, and the copies it refuses
    // as untrusted (both told at hello; rank 0 records the refusals).
    let local_root = local::local_root(&cfg, &slurm, &root).map_err(|e| e.to_string()).transpose();
    let run = crate::checkpoint::local::run_identity(&root);
    // One rank a node checks its node's copies (a full SHA-256 of each), the
    // lowest on it: the others' hello says they did not, and rank 0 takes
    // the node's list for them (ranks.rs). Which rank that is takes a round
    // of the ranks' node names, when the config keeps a local tier.
    let checks_node = match (&world, &local_root) {
        (Some(world), Some(_)) => local::checks_node(world, &slurm.node_name()).map_err(RunError::Distributed)?,
        _ => true,
    };
    let (held, refused) = match &local_root {
        Some(Ok(local)) if checks_node => {
            let (held, refused) = held_here(local, &run);
            (Some(held), refused)
        }
        Some(Ok(_)) => (None, Vec::new()),
        _ => (Some(Vec::new()), Vec::new()),
    };
    let Some(world) = world else {
        return lead(opts, cfg, workload, stop, slurm, claimed, None, (local_root, refused));
    };
    // Rank 0 leads, the others follow; every rank beats and watches the
    // others' beats (attempt/rank_watch.rs).
    let node = slurm.node_name();
    let store = CheckpointStore::open_read_only(rundir::checkpoints_dir(&root, &cfg));
    let watch = |session: String| {
        let setup = WatchSetup {
            dir: root.join(RANKS_DIR),
            rank: info.rank,
            size: info.size,
            node: node.clone(),
            session,
            timeout: cfg.distributed.timeout,
        };
        let end = WorldEnd {
            cfg: cfg.clone(),
            slurm: slurm.clone(),
            events: root.join(rundir::EVENTS_FILE),
            store: store.clone(),
            rank: info.rank,
            size: info.size,
        };
        RankWatch::start(setup, Box::new(move |lost| end.handle(lost)))
            .map_err(|source| RunError::RunDir { path: root.join(RANKS_DIR), source })
    };
    if !info.is_leader() {
        // A follower builds its own trainer when the leader begins (ranks.rs).
        drop(workload);
        let (session, nodes) = ranks::follower_hello(&world, &node, &stop, held, refused)?;
        let watch = watch(session)?;
        let follower_local = local_root.map(|root| {
            let writes = local::writers(&nodes).contains(&info.rank);
            let writer = writes.then(|| root.clone().and_then(|root| local::LocalWriter::open(&root, &cfg)));
            if let Some(Err(e)) = &writer {
                tracing::warn!(error = %e, "this node keeps no local copies this attempt; the durable tier is unaffected");
            }
            ranks::FollowerLocal { root, writer, run }
        });
        // The world is kept until the watch said done: dropping it finalizes
        // MPI, which waits for rank 0, and rank 0 waits at the end for this
        // rank's `done` (RankWatch::finish_with_world).
        let result =
            ranks::follow(&cfg, &opts.registry, store, world.clone(), node, &stop, &watch.pulse(), follower_local);
        // Only a follower that heard the end may say it ended normally.
        if result.is_ok() {
            watch.finish();
        }
        drop(world);
        return result;
    }
    tracing::info!(ranks = info.size, launcher = %info.launcher, "leading a data-parallel run");
    let session = new_session(&node);
    let watch = watch(session.clone())?;
    let (leader, nodes) = Leader::hello(world, node, &stop, session, watch.pulse(), held, refused)?;
    let world = Some((leader.clone(), nodes, &watch));
    let result = lead(opts, cfg, workload, stop.clone(), slurm, claimed, world, (local_root, Vec::new()));
    let outcome = result.as_ref().map_or_else(RunError::outcome, |o| *o);
    leader.end(&stop, outcome);
    // A rank frozen after the end would hold the launcher, and the job, until
    // the time limit: once it is silent for the timeout the world is ended
    // with this attempt's own exit code (its records are written already).
    watch.finish_with_world(Box::new(move |lost| {
        tracing::error!(
            "rank(s) {:?} stopped answering after the world's end; ending the world so the launcher ends them \
             (the run's outcome stands: exit {})",
            lost.iter().map(|l| l.rank).collect::<Vec<_>>(),
            outcome.code()
        );
        crate::distributed::abort_world(outcome.code())
    }));
    result
}

/// The local checkpoints of the run `run` under this node's `root` that
/// verify, and the copies that do not (a restart resumes from another
/// node's or the durable tier): each logged, and those refused as
/// untrusted returned, for rank 0 to record.
fn held_here(
    root: &std::path::Path,
    run: &str,
) -> (Vec<crate::checkpoint::local::HeldStep>, Vec<crate::checkpoint::local::Unusable>) {
    let (held, unusable) = crate::checkpoint::local::held(root, run);
    for u in &unusable {
        tracing::warn!(step = u.step, root = %root.display(), reason = %u.reason, "a local copy on this node is not used");
    }
    (held, unusable.into_iter().filter(|u| u.refused).collect())
}

/// Everything a one-process run (or a data-parallel run's leader) does.
#[allow(clippy::too_many_arguments)]
fn lead(
    opts: &RunOptions,
    cfg: Config,
    workload: Box<dyn Workload>,
    stop: StopFlag,
    slurm: SlurmEnv,
    claimed: opening::Claimed,
    world: Option<(Leader, Vec<String>, &RankWatch)>,
    local: (Option<Result<PathBuf, String>>, Vec<crate::checkpoint::local::Unusable>),
) -> Result<Outcome, RunError> {
    let allow = opts.allow_config_change;
    let held = claimed.hold(&cfg, &slurm, allow, |root| {
        // Tests hold an attempt here (`sleep(…)`) to stop it between the
        // lock and its first step.
        fail::fail_point!("run::after_lock");
        // Before config.toml is rewritten: a refused resume leaves it as it was.
        settings::check_newest(&rundir::checkpoints_dir(root, &cfg), &cfg, allow)
    })?;
    // What a failed start records (its own `error` event) needs these after
    // the attempt has taken its own.
    let (kept_cfg, kept_slurm) = (cfg.clone(), slurm.clone());
    let started =
        Attempt::start(cfg, &opts.registry, workload, &held, stop, opts.stop_at_step, slurm, world, allow, local);
    match started {
        Ok(Started::Ready(mut attempt, exports)) => {
            // metrics.jsonl is trimmed to the step resumed from and no step
            // has run: the exports fill in up to it, then follow. Dropped
            // after the attempt's last records (attempt/exports.rs).
            attempt.exports = exports.rewinder();
            attempt.train()
        }
        Ok(Started::StoppedEarly(outcome)) => Ok(outcome),
        Ok(Started::AlreadyFinished) => Ok(Outcome::Done),
        Err(e) => {
            if !held.lock.ownership().is_lost() {
                ending::record_failed_start(&kept_cfg, &held.dir, &kept_slurm, &e);
            }
            Err(e)
        }
    }
}

enum Started {
    /// Ready to train; the exports follow metrics.jsonl until the exporter
    /// is dropped (after the attempt's last records).
    Ready(Box<Attempt>, crate::telemetry::Exporter),
    /// A stop signal arrived before training could begin.
    StoppedEarly(Outcome),
    /// The newest checkpoint is of `max_steps` or beyond: nothing to train,
    /// nothing written (exit 0).
    AlreadyFinished,
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
    /// `[checkpoint] interval = "auto"`: its inputs and choice (`None` for a
    /// fixed interval).
    auto_interval: Option<saving::AutoInterval>,
    /// The step at which a periodic save fell due while the previous one was
    /// still being written: it is taken at the first step the writer is free.
    save_due_since: Option<u64>,
    last_durable_step: Option<u64>,
    last_loss: Option<f64>,
    best_loss: Option<f64>,
    resumes: u64,
    /// Whether the run-directory lock is still ours: lost once the heartbeat
    /// or a commit's check finds another process took the run directory.
    lock: LockOwnership,
    /// Host buffers of the last persisted snapshot, reused by the next one.
    spare: Option<(TensorSet, TensorSet)>,
    /// The other ranks' parts of the checkpoint the persister is writing
    /// (a sharded optimizer's), as they report them.
    parts_inbox: Option<ranks::PartsInbox>,
    /// The node-local tier (`[recovery] local`), when this node has one.
    local: Option<local::LocalTier>,
    /// After a fault: the `recovery` event, written after the first step
    /// this attempt trains, and when the fault happened.
    recovering: Option<(crate::telemetry::Recovery, Option<chrono::DateTime<chrono::Utc>>)>,
    /// The other ranks of a data-parallel run, which this attempt leads.
    leader: Option<Leader>,
    /// The node of each rank of that run, in rank order.
    rank_nodes: Option<Vec<String>>,
    /// Finds the ranks (or this process alone) slow for `[health]
    /// straggler_steps` steps in a row (`None`: turned off).
    stragglers: Option<crate::attempt::straggler::Detector>,
    /// Tells the exports (TensorBoard, Prometheus) of a rollback.
    exports: crate::telemetry::Rewinder,
    /// What this thread and the persister are doing, for the watchdog.
    beats: Beats,
    /// The watchdog thread (`None` with `[watchdog] enabled = false`).
    _watchdog: Option<Watchdog>,
    /// Where the watchdog ends the attempt (and asks for a checkpoint when
    /// the persister is the stuck thread).
    hang: std::sync::Arc<HangDesk>,
}

impl Attempt {
    fn stop_reason(&self) -> Option<StopReason> {
        self.stop
            .signal()
            .map(StopReason::Signal)
            .or_else(|| self.stop_at_step.filter(|k| self.trainer.step() >= *k).map(|_| StopReason::StopAtStep))
    }

    /// Trains to the end or to a stop; a failure is classified, recorded in
    /// `events.jsonl` and `summary.json`, and requeued when transient
    /// (`ending.rs`), before it is returned.
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
            if self.hang.ended() {
                progress.finish();
                self.yield_to_watchdog();
            }
            self.collect_background()?;
            // With other ranks, every rank must make the same choice: agree
            // first (a signal on any rank stops all at this boundary), then
            // train exactly when agreed, whatever arrives meanwhile.
            let agreed = match &self.leader {
                None => true,
                Some(leader) => {
                    let lost = self.lock.is_lost();
                    let would = !lost && self.stop_reason().is_none() && self.trainer.step() < max_steps;
                    let agreed = leader.tick(&self.stop, would, self.trainer.step())?;
                    self.forward_parts();
                    agreed
                }
            };
            if !agreed || self.leader.is_none() {
                if self.lock.is_lost() {
                    progress.finish();
                    return Err(RunError::LockLost { dir: self.dir.root.clone() });
                }
                // Reaching max_steps comes first: a run whose last step is
                // done is finished (final checkpoint, exit 0) even when the
                // step it was told to stop at, or a stop signal, arrives with
                // it. A stop there would exit 75 and requeue a job that has
                // nothing left to do.
                if self.trainer.step() >= max_steps {
                    break;
                }
                if let Some(reason) = self.stop_reason() {
                    progress.finish();
                    return self.stop(reason);
                }
            }
            let stop = self.stop.clone();
            let lock = self.lock.clone();
            let hang = std::sync::Arc::clone(&self.hang);
            let should_stop = move || stop.is_set() || lock.is_lost() || hang.ended();
            let mut busy = Some(self.beats.begin(Worker::Training, Activity::Step, self.trainer.step() + 1));
            // Tests make a step hang here (`train::step=sleep(…)`).
            fail::fail_point!("train::step");
            let result = self.devices.step(&mut self.trainer, &self.cfg, &should_stop);
            // A completed step's records are part of it: a run-directory
            // filesystem that hangs its metrics line hangs the step.
            if !matches!(result, Ok(StepResult::Completed(_))) {
                drop(busy.take());
            }
            self.devices.record_events(&mut self.events)?;
            match result {
                Ok(StepResult::Interrupted) => continue,
                Ok(StepResult::Completed(m)) => {
                    self.record_step(&m, &progress)?;
                    drop(busy.take());
                    self.after_step(&m)?;
                }
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

    /// The records of a completed step: its metrics line, the losses, the progress.
    fn record_step(&mut self, m: &StepMetrics, progress: &Progress) -> Result<(), RunError> {
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
            self.metrics.append(&MetricsLine::Step(step_line(m, self.cfg.telemetry.rank_times_max)))?;
        }
        if m.loss.is_finite() {
            self.last_loss = Some(m.loss);
            self.best_loss = Some(self.best_loss.map_or(m.loss, |b| b.min(m.loss)));
        }
        progress.update(m.step, m.loss);
        self.beats.progressed(WatchedProgress { step: m.step, last_loss: self.last_loss, best_loss: self.best_loss });
        self.notice_stragglers(m)
    }

    /// Gives the step's seconds to the straggler detector (each rank's own
    /// work, or this process's step) and records a `straggler` event for
    /// each rank it finds. This process's own time is left out (unknown)
    /// while its background checkpoint write runs: the write shares its
    /// CPU, memory bus and disk, and a long one would look like a slow rank.
    fn notice_stragglers(&mut self, m: &StepMetrics) -> Result<(), RunError> {
        let Some(detector) = &mut self.stragglers else { return Ok(()) };
        let mut seconds = if m.rank_compute_s.is_empty() { vec![m.elapsed_s] } else { m.rank_compute_s.clone() };
        if self.persister.busy() {
            seconds[0] = f64::NAN;
        }
        for found in detector.observe(m.step, &seconds) {
            let node = match &self.rank_nodes {
                Some(nodes) => nodes.get(found.rank).cloned().unwrap_or_default(),
                None => self.slurm.node_name(),
            };
            let event = found.event(node, detector.rule(), self.cfg.health.straggler_blame, detector.size());
            tracing::warn!(
                rank = event.rank,
                node = %event.rank_node,
                step = event.step,
                "a straggler: {:.3} s per step against a median of {:.3} s for {} steps{}",
                event.step_seconds,
                event.median_seconds,
                event.steps,
                if event.blamed { "; its node is blamed" } else { "" }
            );
            self.events.record(&crate::telemetry::Event::Straggler(event))?;
        }
        Ok(())
    }

    /// What follows a completed step: an evaluation, a periodic checkpoint.
    fn after_step(&mut self, m: &StepMetrics) -> Result<(), RunError> {
        if let Some(auto) = &mut self.auto_interval {
            auto.slowdown.step(m.elapsed_s, self.persister.busy());
        }
        let max_steps = self.cfg.run.max_steps;
        let eval_every = self.cfg.train.eval_every;
        if eval_every > 0 && m.step.is_multiple_of(eval_every) && !self.stop.is_set() {
            let busy = self.beats.begin(Worker::Training, Activity::Eval, m.step);
            // Tests make an evaluation hang here (`run::eval=sleep(…)`).
            fail::fail_point!("run::eval");
            let val_loss = self.trainer.evaluate()?;
            drop(busy);
            self.metrics.append(&MetricsLine::Val(ValLine {
                step: m.step,
                val_loss: Some(val_loss),
                time: now_rfc3339(),
            }))?;
        }
        let due = self.save_due_since.is_some() || self.periodic_checkpoint_due(m.step);
        if due && m.step < max_steps && self.stop_reason().is_none() {
            self.periodic_checkpoint()?;
        }
        self.local_tick(m.step)?;
        if let Some((mut recovery, fault_at)) = self.recovering.take() {
            let now = chrono::Utc::now();
            recovery.step = m.step;
            recovery.recovery_seconds = fault_at.map(|at| (now - at).num_milliseconds() as f64 / 1000.0);
            tracing::info!(step = m.step, tier = %recovery.tier, steps_lost = recovery.steps_lost, recovery_s = ?recovery.recovery_seconds, in_job = recovery.in_job, "training again after {}", recovery.fault);
            self.events.record(&crate::telemetry::Event::Recovery(recovery))?;
        }
        Ok(())
    }
}

/// The `metrics.jsonl` line of a completed step; each rank's seconds only
/// for worlds of at most `rank_times_max` ranks, their summary always.
fn step_line(m: &StepMetrics, rank_times_max: u64) -> StepLine {
    let per_rank = m.rank_compute_s.len() as u64 <= rank_times_max;
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
        rank_compute_s: if per_rank { m.rank_compute_s.clone() } else { Vec::new() },
        rank_compute: RankCompute::of(&m.rank_compute_s).map(Box::new),
        time: now_rfc3339(),
    }
}
