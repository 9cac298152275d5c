//! A run of several ranks (docs/distributed.md): rank 0, the *leader*, runs
//! the whole lifecycle of a one-process run (lock, records, checkpoints,
//! requeue, publish); the other ranks, *followers*, train in lockstep and
//! write nothing but their heartbeat (`attempt/rank_watch.rs`). They agree through
//! rounds of one all-gather each: every rank sends a [`Report`] (its node,
//! the stop signal it received), and the leader adds what happens next
//! ([`Lead`]):
//!
//! ```text
//! hello          every rank: its node           (the start event lists them)
//!                leader: the launch's session   (heartbeats carry it)
//! Begin          leader: the step to resume from (or none)
//! Tick × steps   leader: whether it would train; every rank: its signal.
//!                A signal on any rank stops every rank at this boundary.
//! Snapshot       leader: it checkpoints: every rank writes its share (its
//!                model shards, and its optimizer shards or, with a sharded
//!                optimizer, its part of the moments) into the staging
//!                directory named, in the background, and reports the
//!                files' manifest entries in a later round (`parts`)
//! End            leader: the exit code; followers exit with it
//! ```
//!
//! The leader commits a checkpoint written in parts only once every rank
//! reported its part ([`PartsInbox`]): during training the reports ride on
//! the ticks; a leader that must wait for them (a stop, the end) makes
//! rounds of `Tick { train: false }` until they are in.
//!
//! Every decision is a pure function of what all ranks sent
//! ([`trains`]), so every rank makes the same one. The leader sends `End`
//! on every way out (also an error before `Begin`), so followers never wait
//! for a round that will not come. A rank that dies is first the launcher's
//! business (`srun --kill-on-bad-exit`, `mpirun`); one that stops without
//! dying, or dies unnoticed, is found by the heartbeats (`attempt/rank_watch.rs`),
//! and either way the job comes back from the last committed checkpoint.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::checkpoint::{CheckpointStore, ManifestEntry, PartsError, Snapshot, load_dir};
use crate::config::Config;
use crate::distributed::{Collective, SharedWorld};
use crate::exit::Outcome;
use crate::train::{Registry, StepResult, Trainer};

use crate::attempt::error::RunError;
use crate::attempt::rank_watch::Pulse;
use crate::attempt::stop::{StopFlag, StopSignal};
use crate::checkpoint::local::{HeldStep, Unusable, WorldRecord};
use crate::checkpoint::persist::panic_message;
use crate::run::envelope::StateEnvelope;
use crate::run::local::{self, LocalDone, LocalWriter, share};

/// What the leader says in a round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "lead", rename_all = "snake_case")]
pub enum Lead {
    /// The first round: the launch's identity, which every rank writes in
    /// its heartbeat (`attempt/rank_watch.rs`).
    Hello { session: String },
    /// Training begins: restore this step's checkpoint (none: step 0),
    /// from the node-local tier when `local` (`run/local.rs`).
    Begin {
        resume_step: Option<u64>,
        #[serde(default)]
        local: bool,
    },
    /// A step boundary: whether the leader would train one more step.
    Tick { train: bool },
    /// The run is over: exit with this code.
    End { code: u8 },
    /// The leader checkpoints step `step`: every rank writes its share of
    /// the checkpoint (`CheckpointStore::write_share`) into the staging
    /// directory `staging` (of the checkpoints directory) and reports it
    /// ([`Report::parts`]).
    Snapshot { step: u64, staging: String },
    /// A local checkpoint of `step` (`[recovery] local`): every node's
    /// writer saves a whole copy with this `state.json` and reports it
    /// ([`Report::local`]).
    LocalSave { step: u64, state: serde_json::Value },
    /// Every writer reported the same copy: each adds this record to its
    /// copy, which makes it a local checkpoint.
    LocalCommit { record: WorldRecord },
    /// A new world resumes from the local checkpoint of `step`: rank
    /// `holder` sends it to the nodes without it (`local::share`).
    LocalRestore { step: u64, holder: usize },
}

/// A rank's part of a checkpoint, written (or not).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartDone {
    /// The save it belongs to: its staging directory (one per save; a
    /// step may be saved twice, by a save abandoned and the one after).
    pub staging: String,
    pub step: u64,
    /// The manifest entries of the files of this rank's share, when they
    /// were written.
    #[serde(default)]
    pub entries: Vec<ManifestEntry>,
    /// Why it was not.
    pub error: Option<String>,
}

/// What every rank says in every round.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub node: String,
    /// The first stop signal this rank received, and how long ago.
    pub signal: Option<StopSignal>,
    pub signal_age_s: f64,
    /// Only from the leader.
    pub lead: Option<Lead>,
    /// The checkpoint parts this rank finished since its last report.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<PartDone>,
    /// The local copies this rank wrote since its last report.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub local: Vec<LocalDone>,
    /// At hello: the local checkpoints this rank's node holds that verify.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held: Vec<HeldStep>,
    /// At hello: this rank did not check its node's copies (its node's local
    /// rank 0 did, and `held` is empty): rank 0 takes that rank's list.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unchecked: bool,
    /// At hello: the copies on this rank's node refused as untrusted (not
    /// the user's alone, or not this run's), for rank 0 to record.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<Unusable>,
    /// In the first round after hello: why this rank keeps no local copies
    /// this attempt (its node has no local directory, or its writer cannot
    /// make one), which turns the tier off for the world (`run/local.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_off: Option<String>,
}

impl Report {
    fn of(node: &str, stop: &StopFlag, lead: Option<Lead>) -> Report {
        let first = stop.signal();
        let age = first.map_or(0.0, |s| s.arrival.elapsed().as_secs_f64());
        Report {
            node: node.to_string(),
            signal: first.map(|s| s.signal),
            signal_age_s: age,
            lead,
            parts: Vec::new(),
            local: Vec::new(),
            held: Vec::new(),
            unchecked: false,
            refused: Vec::new(),
            local_off: None,
        }
    }
}

/// Whether the step after this round is trained: the leader would, and no
/// rank got a stop signal.
pub fn trains(reports: &[Report]) -> bool {
    let leader_trains = matches!(reports.first().and_then(|r| r.lead.as_ref()), Some(Lead::Tick { train: true }));
    leader_trains && reports.iter().all(|r| r.signal.is_none())
}

/// The earliest stop signal over all ranks, and its age.
pub fn earliest_signal(reports: &[Report]) -> Option<(StopSignal, f64)> {
    reports.iter().filter_map(|r| r.signal.map(|s| (s, r.signal_age_s))).max_by(|a, b| a.1.total_cmp(&b.1))
}

/// One round: sends `mine`, returns every rank's report in rank order.
fn round(world: &SharedWorld, mine: &Report) -> Result<Vec<Report>, RunError> {
    let bytes = serde_json::to_vec(mine).unwrap_or_default();
    let all = world.all_gather_bytes(&bytes).map_err(RunError::Distributed)?;
    all.iter()
        .enumerate()
        .map(|(rank, b)| {
            serde_json::from_slice(b).map_err(|e| RunError::Ranks {
                what: format!("rank {rank} sent an unreadable report ({e}): are all ranks the same rekindle?"),
            })
        })
        .collect()
}

/// The leader's side of the rounds.
#[derive(Clone)]
pub struct Leader {
    world: SharedWorld,
    node: String,
    /// The leader's heartbeat: the step it stands at, told at every tick.
    pulse: Pulse,
    /// The launch's identity, in the staging directories' names.
    session: String,
    /// Parts the followers reported in any round, until taken.
    parts: Arc<Mutex<Vec<(usize, PartDone)>>>,
    /// Local copies the followers reported in any round, until taken.
    local: Arc<Mutex<Vec<(usize, LocalDone)>>>,
    /// What every rank's node held of the local tier at hello, in rank order.
    held: Arc<Vec<Vec<HeldStep>>>,
    /// The copies every rank's node refused at hello, in rank order.
    refused: Arc<Vec<Vec<Unusable>>>,
    /// The followers that keep no local copies this attempt, and why.
    local_off: Arc<Mutex<Vec<(usize, String)>>>,
}

impl Leader {
    /// The hello round, announcing the launch's `session`; returns the
    /// leader and every rank's node.
    pub fn hello(
        world: SharedWorld,
        node: String,
        stop: &StopFlag,
        session: String,
        pulse: Pulse,
        held: Option<Vec<HeldStep>>,
        refused: Vec<Unusable>,
    ) -> Result<(Leader, Vec<String>), RunError> {
        let mut mine = Report::of(&node, stop, Some(Lead::Hello { session: session.clone() }));
        (mine.unchecked, mine.held, mine.refused) = (held.is_none(), held.unwrap_or_default(), refused);
        let reports = round(&world, &mine)?;
        let held = Arc::new(held_by_rank(&reports));
        let refused = Arc::new(reports.iter().map(|r| r.refused.clone()).collect());
        let leader = Leader {
            world,
            node,
            pulse,
            session,
            parts: Arc::default(),
            local: Arc::default(),
            held,
            refused,
            local_off: Arc::default(),
        };
        Ok((leader, reports.into_iter().map(|r| r.node).collect()))
    }

    /// What every rank's node held of the local tier at hello.
    pub fn held(&self) -> &[Vec<HeldStep>] {
        &self.held
    }

    /// The copies every rank's node refused as untrusted at hello.
    pub fn refused(&self) -> &[Vec<Unusable>] {
        &self.refused
    }

    /// The local copies the followers reported and nobody took yet.
    pub fn take_local(&self) -> Vec<(usize, LocalDone)> {
        std::mem::take(&mut *self.local.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// The followers that said they keep no local copies this attempt (in
    /// their first round after hello), with why, and nobody took yet.
    pub fn take_local_off(&self) -> Vec<(usize, String)> {
        std::mem::take(&mut *self.local_off.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Every node's writer saves a copy of `step` with `state`.
    pub fn local_save(&self, stop: &StopFlag, step: u64, state: serde_json::Value) -> Result<(), RunError> {
        self.round(stop, Lead::LocalSave { step, state }).map(drop)
    }

    /// Every writer commits its copy of `record.step`.
    pub fn local_commit(&self, stop: &StopFlag, record: WorldRecord) -> Result<(), RunError> {
        self.round(stop, Lead::LocalCommit { record }).map(drop)
    }

    /// The world resumes from the local checkpoint of `step`, which rank
    /// `holder` shares next (`local::share`).
    pub fn local_restore(&self, stop: &StopFlag, step: u64, holder: usize) -> Result<(), RunError> {
        self.round(stop, Lead::LocalRestore { step, holder }).map(drop)
    }

    /// One round of the leader's, keeping the parts the followers report.
    fn round(&self, stop: &StopFlag, lead: Lead) -> Result<Vec<Report>, RunError> {
        let mut reports = round(&self.world, &Report::of(&self.node, stop, Some(lead)))?;
        let mut parts = self.parts.lock().unwrap_or_else(PoisonError::into_inner);
        let mut local = self.local.lock().unwrap_or_else(PoisonError::into_inner);
        let mut local_off = self.local_off.lock().unwrap_or_else(PoisonError::into_inner);
        for (rank, report) in reports.iter_mut().enumerate() {
            parts.extend(report.parts.drain(..).map(|p| (rank, p)));
            local.extend(report.local.drain(..).map(|d| (rank, d)));
            local_off.extend(report.local_off.take().map(|why| (rank, why)));
        }
        Ok(reports)
    }

    /// The parts of the save into `staging` that the followers reported
    /// and nobody took yet, with their ranks. Those of other saves stay (a
    /// save on this thread beside one in the background takes only its own).
    pub fn take_parts(&self, staging: &str) -> Vec<(usize, PartDone)> {
        let mut parts = self.parts.lock().unwrap_or_else(PoisonError::into_inner);
        let (mine, others) = std::mem::take(&mut *parts).into_iter().partition(|(_, p)| p.staging == staging);
        *parts = others;
        mine
    }

    pub fn world(&self) -> &SharedWorld {
        &self.world
    }

    pub fn begin(&self, stop: &StopFlag, resume_step: Option<u64>, local: bool) -> Result<(), RunError> {
        self.round(stop, Lead::Begin { resume_step, local }).map(drop)
    }

    /// A step boundary after `step` completed steps: returns whether every
    /// rank trains the next step. A signal that reached only other ranks is
    /// recorded in `stop` (with its arrival time there, so the deadline is
    /// the earliest arrival).
    pub fn tick(&self, stop: &StopFlag, train: bool, step: u64) -> Result<bool, RunError> {
        self.pulse.at_step(step);
        let reports = self.round(stop, Lead::Tick { train })?;
        if let Some((sig, age)) = earliest_signal(&reports) {
            stop.merge_remote(
                sig,
                Instant::now().checked_sub(Duration::from_secs_f64(age)).unwrap_or_else(Instant::now),
            );
        }
        Ok(trains(&reports))
    }

    /// Before the leader snapshots a sharded optimizer for the checkpoint
    /// of `step`: makes a new staging directory in `checkpoints`, into
    /// which every follower writes its part (reported in a later round,
    /// [`take_parts`](Self::take_parts)); returns its name. Only the leader
    /// makes it, so a follower late with a part of a save already
    /// committed or abandoned finds no directory to write into.
    pub fn snapshot(&self, stop: &StopFlag, checkpoints: &CheckpointStore, step: u64) -> Result<String, RunError> {
        let staging = checkpoints.new_shared_staging(step, &self.session)?;
        self.round(stop, Lead::Snapshot { step, staging: staging.clone() })?;
        Ok(staging)
    }

    /// The last round: every follower exits with `outcome`'s code.
    pub fn end(&self, stop: &StopFlag, outcome: Outcome) {
        let lead = Lead::End { code: outcome.code() };
        if let Err(e) = self.round(stop, lead) {
            tracing::error!(error = %e, "could not tell the other ranks that the run is over");
        }
    }
}

/// The leader's instruction in a round.
fn lead_of(reports: &[Report]) -> Result<Lead, RunError> {
    reports
        .first()
        .and_then(|r| r.lead.clone())
        .ok_or_else(|| RunError::Ranks { what: "rank 0 sent no instruction: are all ranks the same rekindle?".into() })
}

/// What every rank's node holds of the local tier, in rank order: a rank
/// that did not check its node ([`Report::unchecked`]) takes the list of
/// the rank of its node that did (none: an empty list, and the restore
/// copies to it as to a node without the copy).
fn held_by_rank(reports: &[Report]) -> Vec<Vec<HeldStep>> {
    let mut checked: BTreeMap<&str, &Vec<HeldStep>> = BTreeMap::new();
    for r in reports.iter().filter(|r| !r.unchecked) {
        checked.entry(r.node.as_str()).or_insert(&r.held);
    }
    reports
        .iter()
        .map(|r| match r.unchecked {
            true => checked.get(r.node.as_str()).map(|h| (*h).clone()).unwrap_or_default(),
            false => r.held.clone(),
        })
        .collect()
}

/// A follower's hello round, telling the local checkpoints its node holds:
/// returns the launch's session, from the leader, and every rank's node.
pub fn follower_hello(
    world: &SharedWorld,
    node: &str,
    stop: &StopFlag,
    held: Option<Vec<HeldStep>>,
    refused: Vec<Unusable>,
) -> Result<(String, Vec<String>), RunError> {
    let mut mine = Report::of(node, stop, None);
    (mine.unchecked, mine.held, mine.refused) = (held.is_none(), held.unwrap_or_default(), refused);
    let reports = round(world, &mine)?;
    match lead_of(&reports)? {
        Lead::Hello { session } => Ok((session, reports.into_iter().map(|r| r.node).collect())),
        other => Err(RunError::Ranks { what: format!("rank 0 began with {other:?} instead of hello") }),
    }
}

/// A follower's part in the local tier: its node's root (or why it has
/// none), and the writer of its node's copies when it is that node's lowest
/// rank (or why that could not open).
pub struct FollowerLocal {
    pub root: Result<PathBuf, String>,
    pub writer: Option<Result<LocalWriter, String>>,
    /// The run, as its local checkpoints' records name it.
    pub run: String,
}

impl FollowerLocal {
    /// Why this rank keeps no local copies this attempt, if it does not.
    fn off(&self) -> Option<String> {
        match (&self.root, &self.writer) {
            (Err(why), _) | (Ok(_), Some(Err(why))) => Some(why.clone()),
            _ => None,
        }
    }

    fn writer(&mut self) -> Option<&mut LocalWriter> {
        self.writer.as_mut().and_then(|w| w.as_mut().ok())
    }
}

/// A follower after its hello: trains in lockstep with the leader, writes
/// nothing but its heartbeat (through `pulse`) and its node's local copies,
/// and exits with the leader's code.
#[allow(clippy::too_many_arguments)]
pub fn follow(
    cfg: &Config,
    registry: &Registry,
    checkpoints: CheckpointStore,
    world: SharedWorld,
    node: String,
    stop: &StopFlag,
    pulse: &Pulse,
    mut local: Option<FollowerLocal>,
) -> Result<Outcome, RunError> {
    let checkpoints = checkpoints.with_write_settings(crate::checkpoint::write_settings(&cfg.checkpoint));
    let mut trainer: Option<Trainer> = None;
    let mut writer = PartWriter::new(checkpoints.clone());
    // Told once, in the first round after hello (the leader keeps it).
    let mut local_off = local.as_ref().and_then(FollowerLocal::off);
    // Saves this rank's node cannot make, reported as failed so that the
    // leader's save resolves (it would wait for them forever).
    let mut unwritten: Vec<LocalDone> = Vec::new();
    loop {
        let mut report = Report::of(&node, stop, None);
        report.parts = writer.finished();
        report.local = local.as_mut().and_then(FollowerLocal::writer).map(LocalWriter::finished).unwrap_or_default();
        report.local.append(&mut unwritten);
        report.local_off = local_off.take();
        let reports = round(&world, &report)?;
        match lead_of(&reports)? {
            Lead::Hello { .. } => return Err(RunError::Ranks { what: "rank 0 said hello twice".into() }),
            Lead::End { code } => {
                // Rank 0 waited for every part it commits: one still being
                // written belongs to a save it abandoned (the next start
                // removes what it leaves).
                writer.abandon();
                return Ok(Outcome::from_code(code));
            }
            Lead::Snapshot { step, staging } => {
                // This rank's share of the checkpoint, written in the
                // background: the snapshot shares the parameters and
                // moments, which no step writes into (each replaces them).
                // The share is cut by the same plan on every rank, from
                // the same tensors and [checkpoint] shard_size; a sharded
                // optimizer's part is this rank's own.
                let t = trainer.as_ref().ok_or_else(|| RunError::Ranks {
                    what: "rank 0 asked for a snapshot before training began".into(),
                })?;
                let (rank, world_size) = t.rank_and_size();
                let snapshot = t.snapshot_part(None).map_err(|e| e.to_string());
                let in_parts = t.optimizer_shard().is_some();
                writer.start(PartJob { step, staging, rank, world: world_size }, snapshot, in_parts);
            }
            Lead::LocalSave { step, state } => {
                if let Some(Err(why)) = local.as_ref().and_then(|l| l.writer.as_ref()) {
                    // The leader starts no save once it heard of this; a
                    // report keeps one that started anyway from hanging.
                    unwritten.push(LocalDone::unwritten(step, why.clone()));
                }
                if let (Some(t), Some(w)) = (&trainer, local.as_mut().and_then(FollowerLocal::writer)) {
                    let mut snapshot = t.snapshot_part(w.take_spare())?;
                    if snapshot.step != step {
                        return Err(RunError::Ranks {
                            what: format!("rank 0 saves step {step} locally, this rank is at step {}", snapshot.step),
                        });
                    }
                    snapshot.state = state;
                    w.start(snapshot);
                }
            }
            Lead::LocalCommit { record } => {
                if let Some(Ok(w)) = local.as_ref().and_then(|l| l.writer.as_ref())
                    && let Err(e) = w.commit(&record)
                {
                    tracing::warn!(step = record.step, error = %e, "this node's local copy is not committed");
                }
            }
            Lead::LocalRestore { step, holder } => {
                // Rank 0 learns from the share's outcome whether every node
                // has the copy, and falls back to the durable tier if not.
                let off = "this rank's config keeps no local tier ([recovery] local is off here)";
                let side = match &local {
                    Some(l) => local::side(
                        l.root.as_deref().map_err(String::as_str),
                        l.writer.as_ref().map(|w| w.as_ref().map(drop).map_err(String::as_str)),
                        || l.root.as_ref().is_ok_and(|root| tier_holds(root, step, &l.run).is_ok()),
                    ),
                    None => local::Side::Cannot(off.into()),
                };
                let run = local.as_ref().map(|l| l.run.as_str()).unwrap_or_default();
                let _ = share(&world, holder, step, run, side);
            }
            Lead::Begin { resume_step, local: from_local } => {
                let mut t = Trainer::from_registry(cfg, registry)?;
                if let Some(step) = resume_step {
                    let dir = match (local.as_ref().map(|l| &l.root), from_local) {
                        (Some(Ok(root)), true) => root.join(crate::checkpoint::step_dir_name(step)),
                        (_, true) => {
                            return Err(RunError::Ranks {
                                what: "rank 0 resumes from the local tier, which this rank does not keep".into(),
                            });
                        }
                        _ => checkpoints.step_dir(step),
                    };
                    let loaded = load_dir(&dir).map_err(|failures| RunError::Ranks {
                        what: format!(
                            "checkpoint {} that rank 0 resumes from does not verify here ({}): is the run \
                             directory on storage every node shares?",
                            dir.display(),
                            failures.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
                        ),
                    })?;
                    let snap = &loaded.snapshot;
                    t.restore(&snap.model, &snap.optimizer, &StateEnvelope::of(snap).train)
                        .map_err(|source| RunError::Restore { dir: dir.clone(), source })?;
                    pulse.at_step(step);
                }
                t.join_world(Box::new(world.clone()), cfg.model.dropout)?;
                if cfg.distributed.shard_optimizer {
                    t.shard_optimizer()?;
                }
                trainer = Some(t);
            }
            Lead::Tick { .. } => {
                if !trains(&reports) {
                    continue;
                }
                let t = trainer
                    .as_mut()
                    .ok_or_else(|| RunError::Ranks { what: "rank 0 asked for a step before training began".into() })?;
                match t.train_step(&|| false)? {
                    StepResult::Completed(_) | StepResult::NonFiniteStop(_) | StepResult::Interrupted => {
                        pulse.at_step(t.step());
                    }
                    StepResult::NonFiniteRollback(_) => {
                        return Err(RunError::Ranks { what: "a rollback in a data-parallel run".into() });
                    }
                }
            }
        }
    }
}

/// Whether the local root holds a verified local checkpoint of `step` of
/// the run `run`.
pub fn tier_holds(root: &std::path::Path, step: u64, run: &str) -> Result<(), String> {
    let dir = root.join(crate::checkpoint::step_dir_name(step));
    crate::checkpoint::local::check_copy(&dir, step, run).map(drop).map_err(|e| e.to_string())
}

/// What a follower writes for one checkpoint written in parts.
struct PartJob {
    step: u64,
    staging: String,
    rank: usize,
    world: usize,
}

/// A follower's writes of its checkpoint parts, each on a thread of its
/// own while training goes on; finished ones are reported at the next
/// round. Nothing here waits for a write: a rank that did would miss the
/// rounds, and every other rank would wait for it in them.
struct PartWriter {
    store: CheckpointStore,
    in_flight: Vec<(PartJob, JoinHandle<PartDone>)>,
    done: Vec<PartDone>,
}

impl PartWriter {
    fn new(store: CheckpointStore) -> PartWriter {
        PartWriter { store, in_flight: Vec::new(), done: Vec::new() }
    }

    /// Starts writing this rank's share of `snapshot` (or reports at once
    /// why there is none); `optimizer_in_parts`: its optimizer is this
    /// rank's part of a sharded optimizer.
    fn start(&mut self, job: PartJob, snapshot: Result<Snapshot, String>, optimizer_in_parts: bool) {
        let failed = |job: &PartJob, error: String| PartDone {
            staging: job.staging.clone(),
            step: job.step,
            entries: Vec::new(),
            error: Some(error),
        };
        let snapshot = match snapshot {
            Ok(snapshot) => snapshot,
            Err(error) => return self.done.push(failed(&job, error)),
        };
        // Rank 0 starts a save once every rank reported the last one, unless
        // it abandoned that one: then a write still in flight here is stuck.
        if let Some((stuck, _)) = self.in_flight.iter().find(|(_, h)| !h.is_finished()) {
            let error = format!("this rank's part of step {} is still being written", stuck.step);
            return self.done.push(failed(&job, error));
        }
        let store = self.store.clone();
        let (staging, step, rank, world) = (job.staging.clone(), job.step, job.rank, job.world);
        let spawned = std::thread::Builder::new().name("rekindle-part".into()).spawn(move || {
            let written = store.write_share(&staging, rank, world, &snapshot, optimizer_in_parts);
            if let Err(e) = &written {
                tracing::error!(step, error = %e, "could not write this rank's share of the checkpoint");
            }
            let (entries, error) = match written {
                Ok(entries) => (entries, None),
                Err(e) => (Vec::new(), Some(e.to_string())),
            };
            PartDone { staging, step, entries, error }
        });
        match spawned {
            Ok(handle) => self.in_flight.push((job, handle)),
            Err(e) => {
                let error = format!("cannot start a thread to write it: {e}");
                self.done.push(failed(&job, error));
            }
        }
    }

    /// The parts finished since the last call (without waiting).
    fn finished(&mut self) -> Vec<PartDone> {
        let (over, running): (Vec<_>, Vec<_>) = self.in_flight.drain(..).partition(|(_, h)| h.is_finished());
        self.in_flight = running;
        for (job, handle) in over {
            let done = handle.join().unwrap_or_else(|panic| PartDone {
                staging: job.staging,
                step: job.step,
                entries: Vec::new(),
                error: Some(format!("the thread writing it panicked: {}", panic_message(&panic))),
            });
            self.done.push(done);
        }
        std::mem::take(&mut self.done)
    }

    /// Leaves the writes in flight to end with the process.
    fn abandon(&mut self) {
        for (job, _) in self.in_flight.drain(..) {
            tracing::warn!(
                step = job.step,
                "the run ends while this rank's part of an abandoned checkpoint is written"
            );
        }
    }
}

/// The leader's collection of the parts of one save (its staging
/// directory): complete once every follower (ranks 1 .. world) reported.
#[derive(Debug)]
pub struct PartsInbox {
    staging: String,
    world: usize,
    got: BTreeMap<usize, PartDone>,
}

impl PartsInbox {
    pub fn new(staging: &str, world: usize) -> PartsInbox {
        PartsInbox { staging: staging.to_string(), world, got: BTreeMap::new() }
    }

    /// The staging directory of the save it collects.
    pub fn staging(&self) -> &str {
        &self.staging
    }

    /// The followers that have not reported yet.
    pub fn missing(&self) -> Vec<usize> {
        (1..self.world).filter(|r| !self.got.contains_key(r)).collect()
    }

    /// Why waiting longer than `waited` for the missing parts was given up.
    pub fn overdue(&self, waited: Duration) -> PartsError {
        PartsError::Overdue { ranks: self.missing(), waited_s: waited.as_secs_f64() }
    }

    /// Takes the reports of this save's parts (others are stale: a save
    /// that was abandoned, even of the same step); returns, once every
    /// follower reported, their entries in rank order (each rank's files
    /// in the order it listed them), or the first rank's error.
    pub fn add(&mut self, parts: Vec<(usize, PartDone)>) -> Option<Result<Vec<ManifestEntry>, PartsError>> {
        for (rank, part) in parts {
            if part.staging == self.staging && (1..self.world).contains(&rank) {
                self.got.insert(rank, part);
            }
        }
        if self.got.len() + 1 < self.world {
            return None;
        }
        let mut entries = Vec::new();
        for (rank, part) in &self.got {
            if let Some(error) = &part.error {
                return Some(Err(PartsError::RankFailed { rank: *rank, error: error.clone() }));
            }
            entries.extend(part.entries.iter().cloned());
        }
        Some(Ok(entries))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(signal: Option<StopSignal>, age: f64, lead: Option<Lead>) -> Report {
        Report {
            node: "n".into(),
            signal,
            signal_age_s: age,
            lead,
            parts: Vec::new(),
            local: Vec::new(),
            held: Vec::new(),
            unchecked: false,
            refused: Vec::new(),
            local_off: None,
        }
    }

    #[test]
    fn the_parts_of_a_step_are_complete_once_every_follower_reported() {
        let entry = |rank: usize| ManifestEntry {
            name: crate::checkpoint::optimizer_part_name(rank, 3),
            bytes: 10,
            sha256: "a".repeat(64),
        };
        let done = |staging: &str, rank| PartDone {
            staging: staging.into(),
            step: 20,
            entries: vec![entry(rank)],
            error: None,
        };
        let mut inbox = PartsInbox::new(".tmp-b", 3);
        // A part of an abandoned save of the same step does not count.
        assert_eq!(inbox.add(vec![(2, done(".tmp-b", 2)), (1, done(".tmp-a", 1))]), None);
        assert_eq!(inbox.add(vec![(1, done(".tmp-b", 1))]), Some(Ok(vec![entry(1), entry(2)])), "in rank order");

        let mut failed = PartsInbox::new(".tmp-b", 3);
        let broken =
            PartDone { staging: ".tmp-b".into(), step: 20, entries: Vec::new(), error: Some("disk full".into()) };
        let verdict = failed.add(vec![(1, done(".tmp-b", 1)), (2, broken)]).unwrap().unwrap_err();
        assert_eq!(verdict, PartsError::RankFailed { rank: 2, error: "disk full".into() });
        assert_eq!(verdict.to_string(), "rank 2 could not write its part: disk full");
        let alone = PartsInbox::new(".tmp-c", 1).add(Vec::new());
        assert_eq!(alone, Some(Ok(Vec::new())), "a world of one has no followers");
    }

    #[test]
    fn every_rank_trains_only_when_the_leader_would_and_no_rank_got_a_signal() {
        let tick = |train| Some(Lead::Tick { train });
        assert!(trains(&[report(None, 0.0, tick(true)), report(None, 0.0, None)]));
        assert!(!trains(&[report(None, 0.0, tick(false)), report(None, 0.0, None)]));
        assert!(!trains(&[report(None, 0.0, tick(true)), report(Some(StopSignal::Term), 0.2, None)]));
        assert!(!trains(&[report(Some(StopSignal::Usr1), 0.1, tick(true)), report(None, 0.0, None)]));
        assert!(!trains(&[report(None, 0.0, Some(Lead::Begin { resume_step: None, local: false }))]));
        assert!(!trains(&[]));
    }

    #[test]
    fn the_earliest_signal_over_ranks_sets_the_deadline() {
        let reports = [
            report(Some(StopSignal::Term), 0.1, None),
            report(Some(StopSignal::Usr1), 2.5, None),
            report(None, 0.0, None),
        ];
        assert_eq!(earliest_signal(&reports), Some((StopSignal::Usr1, 2.5)));
        assert_eq!(earliest_signal(&[report(None, 0.0, None)]), None);
    }

    #[test]
    fn reports_round_trip_through_json() {
        for lead in [
            Lead::Hello { session: "n1-7-1".into() },
            Lead::Begin { resume_step: Some(4), local: true },
            Lead::Tick { train: false },
            Lead::End { code: 75 },
        ] {
            let r = report(Some(StopSignal::Term), 1.0, Some(lead));
            let back: Report = serde_json::from_slice(&serde_json::to_vec(&r).unwrap()).unwrap();
            assert_eq!(back, r);
        }
    }

    #[test]
    fn a_rank_that_did_not_check_its_node_takes_the_list_of_the_rank_that_did() {
        let held = |steps: &[u64]| -> Vec<HeldStep> {
            steps.iter().map(|&step| HeldStep { step, files: Vec::new() }).collect()
        };
        let at = |node: &str, steps: Option<&[u64]>| Report {
            node: node.into(),
            unchecked: steps.is_none(),
            held: steps.map(held).unwrap_or_default(),
            ..report(None, 0.0, None)
        };
        let reports = [
            at("n1", Some(&[10, 5])),
            at("n1", None),
            at("n2", None),
            at("n2", Some(&[5])),
            at("n3", None),
            at("n4", Some(&[])),
        ];
        let got = held_by_rank(&reports);
        assert_eq!(got[0], held(&[10, 5]));
        assert_eq!(got[1], held(&[10, 5]), "its node's local rank 0 checked for it");
        assert_eq!(got[2], held(&[5]), "whatever the order of the ranks");
        assert_eq!(got[3], held(&[5]));
        assert_eq!(got[4], held(&[]), "nobody checked n3: nothing is taken as held there");
        assert_eq!(got[5], held(&[]));
        // A restore then copies to n3's ranks as to a node without the copy.
        assert!(matches!(
            crate::checkpoint::local::choose(&got, Some(4)),
            crate::checkpoint::local::LocalChoice::Local { step: 10, holder: 0 }
        ));
    }
}
