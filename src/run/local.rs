//! The node-local checkpoint tier in a run (`[recovery] local`,
//! docs/recovery.md; the format and the choice are `checkpoint::local`'s).
//!
//! ```text
//! leader, when a local save is due:  snapshot (the stall) ─ LocalSave round
//!     (its state.json to every rank) ─ its own copy written in the background
//! every node's writer (its lowest rank): snapshot ─ copy in the background ─
//!     reports LocalDone (files, SHA-256) in a later round
//! leader, once every writer reported the same files: LocalCommit round ─
//!     every writer adds WORLD.json to its copy: a local checkpoint
//! a new world (in-job restart): every rank reports the local checkpoints
//!     its node holds at hello; the leader picks the newest newer than the
//!     durable one (checkpoint::local::choose), LocalRestore round, the holder
//!     broadcasts it to the nodes without it ([`share`]), Begin { local: true }
//! ```
//!
//! Each node's root is private to the user (`checkpoint/private.rs`): made
//! `0700` and checked, with the way to it, before anything is read from it
//! ([`local_root`]); a copy that is not the user's alone or not this run's
//! is refused before it is read, and rank 0 records every such refusal,
//! by rank and node, as a failed `local_checkpoint` ([`refusal_events`]).
//!
//! Nothing here waits on another rank outside a round, and a node that
//! fails to write (no room, an I/O error) only costs that step its local
//! checkpoint: the durable tier and training go on. A node that cannot keep
//! copies at all (no local directory, or one it cannot make) turns the tier
//! off for the whole attempt: every rank says so in its first round after
//! hello, and the leader records it ([`Attempt::open_local_tier`]) instead of
//! starting saves that could never be committed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::checkpoint::local::{self as tier, LocalPlaceError, Unusable, WorldRecord};
use crate::checkpoint::private;
use crate::checkpoint::{CheckpointStore, ManifestEntry, Snapshot, TensorSet, read_manifest, reusable, step_dir_name};
use crate::config::{AutoDuration, Config};
use crate::confine::Dir;
use crate::distributed::Collective;
use crate::slurm::SlurmEnv;
use crate::telemetry::{Event, LocalCheckpoint, RecordedEvent};

use super::Attempt;
use crate::attempt::error::RunError;
use crate::checkpoint::persist::panic_message;

/// The shortest and longest interval `local_interval = "auto"` chooses.
const AUTO_MIN: Duration = Duration::from_secs(5);
const AUTO_MAX: Duration = Duration::from_secs(300);
/// `"auto"` keeps a local save's cost to this share of the training time.
const AUTO_COST_SHARE: f64 = 0.01;
/// How much of a file one round of [`share`] carries (a few bytes in unit
/// tests, so that a file there takes several rounds).
#[cfg(not(test))]
const SHARE_CHUNK: usize = 64 << 20;
#[cfg(test)]
const SHARE_CHUNK: usize = 64;

/// This node's local root for the run in `run_root`, when `[recovery]
/// local` is on: made (`0700`) and checked to be the user's alone, with
/// the way to it, before anything is read from it (`private::prepare_root`).
pub fn local_root(cfg: &Config, slurm: &SlurmEnv, run_root: &Path) -> Result<Option<PathBuf>, LocalPlaceError> {
    if !cfg.recovery.local {
        return Ok(None);
    }
    let absolute = std::path::absolute(run_root).unwrap_or_else(|_| run_root.to_path_buf());
    let root = tier::resolve_root(
        cfg.recovery.local_dir.as_deref(),
        |var| std::env::var(var).ok(),
        Path::is_dir,
        &slurm.node_name(),
        slurm.job_id.as_deref(),
        &absolute,
        private::user(),
    )?;
    private::prepare_root(&root)?;
    Ok(Some(root))
}

/// The failed `local_checkpoint` events for the copies the ranks' nodes
/// refused at hello (`refused[r]`: rank `r`'s, every [`Unusable`] of its
/// node; only those refused as untrusted count, `nodes[r]` names rank `r`'s
/// node), in rank order, each naming the rank, the node and why (the why
/// names the directory).
pub fn refusal_events(refused: &[Vec<Unusable>], nodes: &[String]) -> Vec<LocalCheckpoint> {
    let mut events = Vec::new();
    for (rank, copies) in refused.iter().enumerate() {
        let node = nodes.get(rank).map_or("?", String::as_str);
        for copy in copies.iter().filter(|c| c.refused) {
            events.push(LocalCheckpoint {
                step: copy.step,
                outcome: "failed".into(),
                reason: Some(format!(
                    "rank {rank} on {node}: the local copy of step {} is refused, not resumed from: {}",
                    copy.step, copy.reason
                )),
                ..LocalCheckpoint::default()
            });
        }
    }
    events
}

/// The ranks that write a node's copy: the lowest rank on each node.
pub fn writers(nodes: &[String]) -> Vec<usize> {
    let mut seen = std::collections::HashSet::with_capacity(nodes.len());
    (0..nodes.len()).filter(|&r| seen.insert(nodes[r].as_str())).collect()
}

/// Whether this rank of `world` is the lowest on its node `node` (its
/// node's writer, [`writers`]): the one rank a node that checks the node's
/// local copies at the start of an attempt, so that a node's copies are
/// hashed once, not once a rank. A collective every rank calls alike (the
/// ranks' node names, all-gathered: a few bytes a rank), before hello.
pub fn checks_node(world: &dyn Collective, node: &str) -> Result<bool, crate::distributed::DistributedError> {
    let all = world.all_gather_bytes(node.as_bytes())?;
    let nodes: Vec<String> = all.iter().map(|b| String::from_utf8_lossy(b).into_owned()).collect();
    Ok(writers(&nodes).contains(&world.rank()))
}

/// The warning for a world of several ranks that all run on one node: its
/// local tier then has no copy on another node, so losing that node loses
/// every copy. `None` for one rank alone, or ranks on two nodes or more.
pub fn same_node_warning(nodes: &[String]) -> Option<String> {
    if nodes.len() < 2 || writers(nodes).len() > 1 {
        return None;
    }
    Some(format!(
        "all {} ranks run on node {}: the local tier has no copy on another node, so losing that node loses every \
         local copy (the durable tier is unaffected); spread the ranks over nodes for cross-node redundancy",
        nodes.len(),
        nodes[0]
    ))
}

/// Why the local tier is off for this attempt, from the ranks that cannot
/// keep copies (`off`: rank and why, in any order; `nodes[r]` names rank
/// `r`'s node); `None` when every rank can.
pub fn off_reason(off: &[(usize, String)], nodes: &[String]) -> Option<String> {
    if off.is_empty() {
        return None;
    }
    Some(format!(
        "{}; the node-local tier is off for this attempt (a local checkpoint needs a copy on every node), durable \
         checkpoints go on; the next attempt tries again: point [recovery] local_dir at a directory every node can \
         write on its own storage",
        by_rank(off, nodes)
    ))
}

/// `rank R on NODE: why` for each of `list`, in rank order, joined by `; `.
pub fn by_rank(list: &[(usize, String)], nodes: &[String]) -> String {
    let mut list = list.to_vec();
    list.sort();
    let each: Vec<String> = list
        .iter()
        .map(|(rank, why)| format!("rank {rank} on {}: {why}", nodes.get(*rank).map_or("?", String::as_str)))
        .collect();
    each.join("; ")
}

/// One node's save of a local copy, as its writer reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LocalDone {
    pub step: u64,
    /// The copy's files (empty when it was not written).
    #[serde(default)]
    pub files: Vec<ManifestEntry>,
    pub bytes: u64,
    pub seconds: f64,
    /// Why it was not written.
    pub error: Option<String>,
    /// Not written for want of room (or a save still in flight): no failure.
    #[serde(default)]
    pub skipped: bool,
}

impl LocalDone {
    /// A save this node did not write, and why: a failure.
    pub fn unwritten(step: u64, error: String) -> LocalDone {
        LocalDone { step, files: Vec::new(), bytes: 0, seconds: 0.0, error: Some(error), skipped: false }
    }
}

/// A copy being written: its report, and its buffers back for reuse.
type Writing = JoinHandle<(LocalDone, Option<Snapshot>)>;

/// Writes this node's copies on a thread of its own, one at a time.
pub struct LocalWriter {
    store: CheckpointStore,
    /// `[recovery] local_keep`: committed copies kept (the store itself
    /// keeps one more, the copy being written: see [`prune`]).
    keep: usize,
    share: f64,
    in_flight: Option<(u64, Writing)>,
    done: Vec<LocalDone>,
    spare: Option<(TensorSet, TensorSet)>,
}

impl LocalWriter {
    /// The writer of the local root `root` (made if missing). Copies there
    /// that the world never committed (no `WORLD.json`: a save the fault
    /// cut short) are removed: never resumed from, they would stand in for
    /// this world's copy of the same step (the store keeps a step it has).
    pub fn open(root: &Path, cfg: &Config) -> Result<LocalWriter, String> {
        // Checked again right before anything is written there.
        private::prepare_root(root).map_err(|e| e.to_string())?;
        // Opening the store first refuses a directory rekindle did not make:
        // nothing is removed from one.
        // One more than local_keep: the store's own rotation counts every
        // copy, committed or not, and the copy being written must never push
        // out the newest the world committed (a stop or a fault before its
        // agreement would leave no committed copy at all).
        let keep = cfg.recovery.local_keep;
        let store = CheckpointStore::open(root, keep + 1).map_err(|e| e.to_string())?;
        remove_uncommitted(&*store.root().map_err(|e| e.to_string())?);
        Ok(LocalWriter {
            store,
            keep,
            share: cfg.recovery.local_max_share,
            in_flight: None,
            done: Vec::new(),
            spare: None,
        })
    }

    /// Host buffers of the last copy written, for the next snapshot.
    pub fn take_spare(&mut self) -> Option<(TensorSet, TensorSet)> {
        self.spare.take()
    }

    /// Starts writing `snapshot`'s copy, or reports at once why not.
    pub fn start(&mut self, snapshot: Snapshot) {
        let step = snapshot.step;
        let skip = |error: String| LocalDone { skipped: true, ..LocalDone::unwritten(step, error) };
        if let Some((busy, _)) = self.in_flight.as_ref().filter(|(_, h)| !h.is_finished()) {
            return self.done.push(skip(format!("the local copy of step {busy} is still being written")));
        }
        self.collect();
        // A copy of this step already there would be kept by the store when
        // it verifies, and committed as this world's: one that is not the
        // user's alone (or a link) is refused, one of theirs (an earlier
        // world's, or another run's put here) is replaced.
        let dir = self.store.step_dir(step);
        if let Err(why) = private::check_tree_if_present(&dir) {
            return self.done.push(LocalDone::unwritten(step, format!("refused to write over it: {why}")));
        }
        let name = step_dir_name(step);
        if let Err(e) = self.store.root().map_err(|e| e.to_string()).and_then(|root| {
            if root.exists(&name) { root.remove_dir_all(&name).map_err(|e| e.to_string()) } else { Ok(()) }
        }) {
            return self.done.push(LocalDone::unwritten(step, format!("cannot replace {}: {e}", dir.display())));
        }
        let bytes = snapshot.payload_bytes();
        if let Err(why) = tier::room_for(self.store.dir(), bytes, self.share) {
            return self.done.push(skip(why));
        }
        // Tests make a write fail here (`local::write=return(why)`).
        fail::fail_point!("local::write", |arg: Option<String>| {
            self.done.push(LocalDone::unwritten(step, format!("failpoint local::write: {}", arg.unwrap_or_default())))
        });
        let store = self.store.clone();
        let spawned = std::thread::Builder::new().name("rekindle-local".into()).spawn(move || {
            let t0 = Instant::now();
            // Written under the user's umask: made writable by the user alone,
            // as every copy read back must be (`private::check_tree`).
            let saved = store.save(&snapshot).map_err(|e| e.to_string()).and_then(|report| {
                let dir = store.step_dir(step);
                private::keep_private(&dir).map_err(|e| format!("cannot make {} private: {e}", dir.display()))?;
                Ok(report)
            });
            let seconds = t0.elapsed().as_secs_f64();
            let read_back =
                |report| read_manifest(&store.step_dir(step)).map(|m| (report, m)).map_err(|f| f.to_string());
            let done = match saved.and_then(read_back) {
                Ok((report, manifest)) => {
                    LocalDone { step, files: manifest.files, bytes: report.bytes, seconds, error: None, skipped: false }
                }
                Err(e) => LocalDone { step, files: Vec::new(), bytes, seconds, error: Some(e), skipped: false },
            };
            (done, Some(snapshot))
        });
        match spawned {
            Ok(handle) => self.in_flight = Some((step, handle)),
            Err(e) => self.done.push(LocalDone::unwritten(step, format!("cannot start its thread: {e}"))),
        }
    }

    fn collect(&mut self) {
        if let Some((step, handle)) = self.in_flight.take_if(|(_, h)| h.is_finished()) {
            let (done, snapshot) = handle.join().unwrap_or_else(|panic| {
                let error = format!("the thread writing it panicked: {}", panic_message(&panic));
                (LocalDone::unwritten(step, error), None)
            });
            if let Some(s) = snapshot {
                self.spare = Some((reusable(s.model), reusable(s.optimizer)));
            }
            self.done.push(done);
        }
    }

    /// The saves finished since the last call (without waiting).
    pub fn finished(&mut self) -> Vec<LocalDone> {
        self.collect();
        std::mem::take(&mut self.done)
    }

    /// Makes this node's copy of `record.step` a local checkpoint, when its
    /// files are the ones the world agreed on.
    pub fn commit(&self, record: &WorldRecord) -> Result<(), String> {
        let dir = self.store.step_dir(record.step);
        let manifest = read_manifest(&dir).map_err(|f| f.to_string())?;
        if manifest.files != record.files {
            return Err(format!("this node's copy of step {} is not the one the world agreed on", record.step));
        }
        let root = self.store.root().map_err(|e| e.to_string())?;
        root.open_dir(step_dir_name(record.step))
            .and_then(|copy| record.write(&copy))
            .map_err(|e| format!("cannot write {}: {e}", dir.join(tier::WORLD_FILE).display()))?;
        prune(&root, self.keep);
        Ok(())
    }
}

/// After a commit: keeps the newest `keep` committed copies under `root`
/// and removes the older ones, and every uncommitted copy older than the
/// newest committed one (a save the world never agreed on). A copy newer
/// than the newest committed one is being written: left alone.
fn prune(root: &Dir, keep: usize) {
    let Ok(entries) = root.entries("") else { return };
    let mut copies: Vec<(u64, bool)> = entries
        .iter()
        .filter(|e| e.kind.is_dir())
        .filter_map(|e| crate::checkpoint::parse_step_dir_name(&e.name_lossy()))
        .map(|step| (step, root.symlink_metadata(Path::new(&step_dir_name(step)).join(tier::WORLD_FILE)).is_ok()))
        .collect();
    copies.sort_unstable();
    for step in prune_plan(&copies, keep) {
        if let Err(e) = root.remove_dir_all(step_dir_name(step)) {
            tracing::warn!(step, error = %e, root = %root.path().display(), "cannot remove an old local copy");
        }
    }
}

/// Which copies [`prune`] removes, from `(step, committed)` in step order.
fn prune_plan(copies: &[(u64, bool)], keep: usize) -> Vec<u64> {
    let committed: Vec<u64> = copies.iter().filter(|(_, c)| *c).map(|(s, _)| *s).collect();
    let Some(&newest) = committed.last() else { return Vec::new() };
    let kept_from = committed[committed.len().saturating_sub(keep.max(1))];
    copies
        .iter()
        .filter(|(step, c)| if *c { *step < kept_from } else { *step < newest })
        .map(|(step, _)| *step)
        .collect()
}

/// The name a refused copy is moved aside to in its root.
pub const REFUSED_PREFIX: &str = "refused-";

/// Removes the copies under `root` without `WORLD.json`: only the user's
/// own. A copy that is not the user's alone (a link, what another user
/// left) is not rekindle's to remove nor to write over: it is moved aside,
/// renamed `refused-step-…` in the same folder (a rename never follows a
/// link nor opens what it moves), where neither the store's rotation nor a
/// save of the same step reaches it.
fn remove_uncommitted(root: &Dir) {
    let Ok(entries) = root.entries("") else { return };
    for entry in entries {
        let path = root.shown(&entry.name);
        if crate::checkpoint::parse_step_dir_name(&entry.name_lossy()).is_none() {
            continue;
        }
        if let Err(why) = private::check_tree(&path) {
            let aside_name = format!("{REFUSED_PREFIX}{}", entry.name_lossy());
            let aside = root.shown(&aside_name);
            let moved = match private::look(&aside) {
                Ok(None) => root.rename(&entry.name, &aside_name).map_err(|e| e.to_string()),
                _ => Err(format!("{} is taken", aside.display())),
            };
            match moved {
                Ok(()) => {
                    tracing::warn!(copy = %path.display(), aside = %aside.display(), %why, "a local copy that is not this user's alone is moved aside")
                }
                Err(e) => {
                    tracing::warn!(copy = %path.display(), %why, error = %e, "a local copy that is not this user's alone is left where it is")
                }
            }
            continue;
        }
        if root.symlink_metadata(Path::new(&entry.name).join(tier::WORLD_FILE)).is_err() {
            match root.remove_dir_all(&entry.name) {
                Ok(()) => tracing::info!(copy = %path.display(), "removed a local copy the world never committed"),
                Err(e) => tracing::warn!(copy = %path.display(), error = %e, "cannot remove an uncommitted local copy"),
            }
        }
    }
}

/// The leader's collection of one local save: complete once every writer
/// reported.
#[derive(Debug)]
pub struct LocalInbox {
    pub step: u64,
    pub stall: f64,
    /// The step the save was due at, when it started late.
    pub due_step: Option<u64>,
    writers: Vec<usize>,
    got: BTreeMap<usize, LocalDone>,
}

/// What a complete [`LocalInbox`] comes to.
#[derive(Debug, PartialEq)]
pub enum InboxVerdict {
    /// Every writer wrote the same files.
    Agreed {
        files: Vec<ManifestEntry>,
        bytes: u64,
        seconds: f64,
    },
    /// A writer skipped it (no room, a save still in flight).
    Skipped {
        reason: String,
    },
    Failed {
        reason: String,
    },
}

impl LocalInbox {
    pub fn new(step: u64, stall: f64, writers: Vec<usize>) -> LocalInbox {
        LocalInbox { step, stall, due_step: None, writers, got: BTreeMap::new() }
    }

    /// Takes writer `rank`'s report (others, and other steps', are stale).
    pub fn add(&mut self, rank: usize, done: LocalDone) {
        if done.step == self.step && self.writers.contains(&rank) {
            self.got.insert(rank, done);
        }
    }

    /// The verdict once every writer reported; `nodes[r]` names rank `r`'s node.
    pub fn verdict(&self, nodes: &[String]) -> Option<InboxVerdict> {
        if self.writers.iter().any(|r| !self.got.contains_key(r)) {
            return None;
        }
        let at = |rank: &usize| format!("rank {rank} on {}", nodes.get(*rank).map_or("?", String::as_str));
        if let Some((rank, d)) = self.got.iter().find(|(_, d)| d.error.is_some() && !d.skipped) {
            return Some(InboxVerdict::Failed {
                reason: format!("{}: {}", at(rank), d.error.as_deref().unwrap_or("")),
            });
        }
        if let Some((rank, d)) = self.got.iter().find(|(_, d)| d.skipped) {
            return Some(InboxVerdict::Skipped {
                reason: format!("{}: {}", at(rank), d.error.as_deref().unwrap_or("")),
            });
        }
        let mut copies = self.got.iter();
        let (_, first) = copies.next()?;
        if let Some((rank, other)) = copies.find(|(_, d)| d.files != first.files) {
            let differ: Vec<&str> =
                other.files.iter().filter(|f| !first.files.contains(f)).map(|f| f.name.as_str()).collect();
            let reason = format!(
                "{}'s copy differs from rank {}'s in {}: the ranks' states are not identical",
                at(rank),
                self.writers[0],
                if differ.is_empty() { "its list of files".to_string() } else { differ.join(", ") }
            );
            return Some(InboxVerdict::Failed { reason });
        }
        let seconds = self.got.values().map(|d| d.seconds).fold(0.0, f64::max);
        Some(InboxVerdict::Agreed { files: first.files.clone(), bytes: first.bytes, seconds })
    }
}

/// The leader's local tier in an attempt.
pub(super) struct LocalTier {
    pub(super) writer: LocalWriter,
    /// The writers' ranks (rank 0 first) and every rank's node.
    writers: Vec<usize>,
    nodes: Vec<String>,
    last: Instant,
    /// `"auto"`: the interval in force.
    auto: Duration,
    pending: Option<LocalInbox>,
    /// The step at which a save fell due while another was in flight: it is
    /// owed, and starts as soon as that one is done, not at the next
    /// multiple of the cadence (which a slow node would miss again).
    owed: Option<u64>,
    /// Whether this attempt said the cadence is not met.
    warned_late: bool,
}

impl LocalTier {
    pub(super) fn new(writer: LocalWriter, nodes: Vec<String>) -> LocalTier {
        if let Some(warning) = same_node_warning(&nodes) {
            tracing::warn!(node = %nodes[0], ranks = nodes.len(), "{warning}");
        }
        let writers = writers(&nodes);
        LocalTier {
            writer,
            writers,
            nodes,
            last: Instant::now(),
            auto: AUTO_MIN,
            pending: None,
            owed: None,
            warned_late: false,
        }
    }

    fn due(&self, step: u64, cfg: &Config) -> bool {
        let r = &cfg.recovery;
        let by_steps = r.local_every_steps > 0 && step.is_multiple_of(r.local_every_steps);
        let interval = match r.local_interval {
            AutoDuration::Fixed(d) => d,
            AutoDuration::Auto => self.auto,
        };
        // With a step count set, time is only a ceiling for very slow steps.
        let by_time =
            self.last.elapsed() >= interval && (r.local_every_steps == 0 || r.local_interval != AutoDuration::Auto);
        by_steps || by_time
    }

    /// After `step`: the step a save to start now was due at, or `None`.
    /// A save due while another is in flight is owed (the first such step
    /// is kept) and starts right after that one; see [`plan_start`].
    fn start_now(&mut self, step: u64, cfg: &Config) -> Option<u64> {
        let due = self.due(step, cfg);
        plan_start(due, self.pending.is_some(), &mut self.owed, step)
    }

    /// `"auto"`: as often as keeps the save's cost (its stall, and the
    /// slowest node's background write, which competes with training for
    /// the node's cores and memory bandwidth) at 1 % of the time.
    fn measured(&mut self, stall: f64, write: f64) {
        let cost = stall + write;
        self.auto = Duration::from_secs_f64(cost / AUTO_COST_SHARE).clamp(AUTO_MIN, AUTO_MAX);
    }
}

/// Whether a local save starts after `step`, as the step it was due at:
/// one due now starts now unless a save is `in_flight`; then it is `owed`
/// (the first due step kept) and starts after the first step that finds
/// nothing in flight, so a node slower than the cadence still gets a copy
/// as often as it can write one, and the lateness is known.
fn plan_start(due: bool, in_flight: bool, owed: &mut Option<u64>, step: u64) -> Option<u64> {
    if in_flight {
        if due && owed.is_none() {
            *owed = Some(step);
        }
        return None;
    }
    match owed.take() {
        Some(at) => Some(at),
        None => due.then_some(step),
    }
}

impl Attempt {
    /// After a completed step: takes in the writers' reports (committing a
    /// save every node wrote), then starts a local save when one is due (or
    /// owed: due while the one before was still in flight).
    pub(super) fn local_tick(&mut self, step: u64) -> Result<(), RunError> {
        if self.local.is_none() {
            return Ok(());
        }
        self.local_collect()?;
        let max_steps = self.cfg.run.max_steps;
        if step >= max_steps || self.stop_reason().is_some() {
            return Ok(());
        }
        let Some(local) = &mut self.local else { return Ok(()) };
        let Some(due_at) = local.start_now(step, &self.cfg) else { return Ok(()) };
        if due_at < step && !local.warned_late {
            local.warned_late = true;
            tracing::warn!(
                step,
                due_at,
                "a node-local save fell due while the one before was still being written: it starts {} step(s) \
                 late, and the tier's cadence ([recovery] local_every_steps / local_interval) is not met on this \
                 node; each late save's local_checkpoint records its due_step",
                step - due_at
            );
        }
        self.local_save(due_at)
    }

    /// Starts the local save of the step just trained, due at `due_at`.
    fn local_save(&mut self, due_at: u64) -> Result<(), RunError> {
        let t0 = Instant::now();
        let Some(local) = &mut self.local else { return Ok(()) };
        let mut snapshot = self.trainer.snapshot_part(local.writer.take_spare())?;
        let train = std::mem::take(&mut snapshot.state);
        let losses = super::envelope::Losses { best_loss: self.best_loss, last_loss: self.last_loss };
        snapshot.state =
            super::envelope::StateEnvelope::new(snapshot.step, train, losses, &self.slurm, &self.cfg).to_value();
        let step = snapshot.step;
        if let Some(leader) = &self.leader {
            leader.local_save(&self.stop, step, snapshot.state.clone())?;
        }
        let stall = t0.elapsed().as_secs_f64();
        local.writer.start(snapshot);
        local.last = Instant::now();
        let mut inbox = LocalInbox::new(step, stall, local.writers.clone());
        inbox.due_step = (due_at < step).then_some(due_at);
        local.pending = Some(inbox);
        Ok(())
    }

    /// Takes the finished saves in; a complete one is committed (every
    /// writer adds WORLD.json) or recorded as skipped or failed.
    fn local_collect(&mut self) -> Result<(), RunError> {
        let Some(local) = &mut self.local else { return Ok(()) };
        let mine = local.writer.finished();
        let theirs = self.leader.as_ref().map(|l| l.take_local()).unwrap_or_default();
        let Some(inbox) = &mut local.pending else { return Ok(()) };
        for done in mine {
            inbox.add(0, done);
        }
        for (rank, done) in theirs {
            inbox.add(rank, done);
        }
        let Some(verdict) = inbox.verdict(&local.nodes) else { return Ok(()) };
        let inbox = local.pending.take().expect("checked above");
        let holders: Vec<String> = local.writers.iter().map(|r| local.nodes[*r].clone()).collect();
        let mut event = LocalCheckpoint {
            step: inbox.step,
            stall_seconds: inbox.stall,
            due_step: inbox.due_step,
            ..LocalCheckpoint::default()
        };
        match verdict {
            InboxVerdict::Agreed { files, bytes, seconds } => {
                let run = tier::run_identity(&self.dir.root);
                let record = WorldRecord::new(run, inbox.step, files, holders.clone(), local.nodes.len());
                if let Some(leader) = &self.leader {
                    leader.local_commit(&self.stop, record.clone())?;
                }
                match local.writer.commit(&record) {
                    Ok(()) => {
                        local.measured(inbox.stall, seconds);
                        event.outcome = "committed".into();
                        event.holders = holders;
                    }
                    Err(e) => {
                        event.outcome = "failed".into();
                        event.reason = Some(format!("rank 0 on {}: {e}", local.nodes[0]));
                    }
                }
                (event.bytes, event.write_seconds) = (bytes, seconds);
                tracing::debug!(
                    step = inbox.step,
                    stall_s = inbox.stall,
                    write_s = seconds,
                    "local checkpoint committed"
                );
            }
            InboxVerdict::Skipped { reason } => {
                tracing::warn!(step = inbox.step, %reason, "local checkpoint skipped; the durable tier is unaffected");
                (event.outcome, event.reason) = ("skipped".into(), Some(reason));
            }
            InboxVerdict::Failed { reason } => {
                tracing::warn!(step = inbox.step, %reason, "local checkpoint failed; the durable tier is unaffected");
                (event.outcome, event.reason) = ("failed".into(), Some(reason));
            }
        }
        self.events.record(&Event::LocalCheckpoint(event))?;
        Ok(())
    }

    /// Opens this node's writer for the attempt that starts at `step`, once
    /// every rank said whether it can keep copies (followers in their first
    /// round after hello, [`Leader::take_local_off`](super::ranks::Leader::take_local_off);
    /// `place`: this node's root, or why it has none). When a rank cannot,
    /// the tier is off for the attempt: a save could never be committed, so
    /// none is started, and a `local_checkpoint` event of outcome `failed`
    /// says which node, why and what to do.
    pub(super) fn open_local_tier(&mut self, place: Result<PathBuf, String>, step: u64) -> Result<(), RunError> {
        let nodes = self.rank_nodes.clone().unwrap_or_else(|| vec![self.slurm.node_name()]);
        let mut off = self.leader.as_ref().map(|l| l.take_local_off()).unwrap_or_default();
        let writer = match place.and_then(|root| LocalWriter::open(&root, &self.cfg)) {
            Ok(writer) => Some(writer),
            Err(why) => {
                off.push((0, why));
                None
            }
        };
        if let Some(reason) = off_reason(&off, &nodes) {
            tracing::warn!(%reason, "no node-local checkpoints this attempt");
            let event =
                LocalCheckpoint { step, outcome: "failed".into(), reason: Some(reason), ..LocalCheckpoint::default() };
            return self.events.record(&Event::LocalCheckpoint(event)).map_err(RunError::from);
        }
        if let Some(writer) = writer {
            self.local = Some(LocalTier::new(writer, nodes));
        }
        Ok(())
    }
}

/// The newest local checkpoint the run's records say was committed: its
/// step and the nodes that held it.
pub fn last_committed(records: &[RecordedEvent]) -> Option<(u64, Vec<String>)> {
    records.iter().rev().find_map(|r| match &r.event {
        Event::LocalCheckpoint(e) if e.outcome == "committed" => Some((e.step, e.holders.clone())),
        _ => None,
    })
}

/// A rank's side of [`share`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Side<'a> {
    /// Its node's local root; `write`: this rank writes the copy received
    /// into it (it is its node's writer, and the node holds no verified copy).
    Root { root: &'a Path, write: bool },
    /// This rank cannot have the copy on its node, and why: every rank then
    /// falls back to the durable tier.
    Cannot(String),
}

/// A rank's [`Side`]: `root` its node's local root (or why it has none),
/// `writer` whether it could open its node's writer (`None`: another rank
/// of its node writes), `holds` whether its node holds a verified copy.
pub fn side<'a>(
    root: Result<&'a Path, &str>,
    writer: Option<Result<(), &str>>,
    holds: impl FnOnce() -> bool,
) -> Side<'a> {
    let root = match root {
        Ok(root) => root,
        Err(why) => return Side::Cannot(why.to_string()),
    };
    // Only a writer asks whether its node holds the copy (a full check of
    // it): a rank that is not its node's writer never writes either way.
    match writer {
        None => Side::Root { root, write: false },
        Some(_) if holds() => Side::Root { root, write: false },
        Some(Err(why)) => Side::Cannot(why.to_string()),
        Some(Ok(())) => Side::Root { root, write: true },
    }
}

/// Sends the local checkpoint of `step` of the run `run`
/// (`tier::run_identity`) from rank `holder`'s node to every node without
/// it: a collective every rank of `world` calls alike, each with its
/// [`Side`]. Returns `Ok` when every rank ended with a verified copy on its
/// node, else every rank's failure (rank, why), the same on every rank, so
/// every rank decides alike.
pub fn share(
    world: &dyn Collective,
    holder: usize,
    step: u64,
    run: &str,
    side: Side<'_>,
) -> Result<(), Vec<(usize, String)>> {
    let me = world.rank();
    let (root, write, mut failure) = match side {
        Side::Root { root, write } => (Some(root), write, None),
        Side::Cannot(why) => (None, false, Some(why)),
    };
    let dir = root.map(|root| root.join(step_dir_name(step)));
    // The root held open: every file of the copy is read, written and
    // renamed below it, never through a link.
    let handle = match root.map(Dir::open).transpose() {
        Ok(handle) => handle,
        Err(e) => {
            failure.get_or_insert(format!("cannot open the local root: {e}"));
            None
        }
    };
    let step_name = step_dir_name(step);
    let names: Vec<String> = match &dir {
        Some(dir) if me == holder => {
            let mut names: Vec<String> =
                read_manifest(dir).map(|m| m.files.into_iter().map(|f| f.name).collect()).unwrap_or_default();
            names.extend([crate::checkpoint::MANIFEST_FILE.to_string(), tier::WORLD_FILE.to_string()]);
            names
        }
        _ => Vec::new(),
    };
    let names = match from_holder(world, holder, &serde_json::to_vec(&names).unwrap_or_default()) {
        Ok(bytes) => serde_json::from_slice::<Vec<String>>(&bytes).unwrap_or_default(),
        Err(e) => return agree(world, Some(e)),
    };
    let incoming_name = format!(".incoming-{}", step_dir_name(step));
    let incoming = handle.as_ref().map(|h| h.shown(&incoming_name)).filter(|_| write);
    // Names are written into this node's root: never one that leaves it.
    if let Some(bad) = names.iter().find(|n| !crate::checkpoint::is_plain_name(n) && *n != tier::WORLD_FILE) {
        failure.get_or_insert(format!("the holder sent the file name `{bad}`, which is not a plain file name"));
    }
    if let (Some(incoming), Some(handle)) = (&incoming, &handle) {
        let _ = handle.remove_dir_all(&incoming_name);
        if let Err(e) = handle.create_dir(&incoming_name, 0o777) {
            failure = Some(format!("cannot make {}: {e}", incoming.display()));
        }
    }
    for name in &names {
        // Every rank takes part in every round, also after a failure of its
        // own: the rounds must stay in step across the world.
        let mut source = handle
            .as_ref()
            .filter(|_| me == holder && dir.is_some())
            .map(|h| h.open_read(Path::new(&step_name).join(name)));
        let mut sink = handle
            .as_ref()
            .filter(|_| incoming.is_some() && failure.is_none())
            .map(|h| h.create_new(Path::new(&incoming_name).join(name), 0o666));
        loop {
            let chunk = match source.as_mut() {
                Some(Ok(file)) => read_chunk(file).unwrap_or_default(),
                _ => Vec::new(),
            };
            let got = match from_holder(world, holder, &chunk) {
                Ok(got) => got,
                Err(e) => return agree(world, Some(e)),
            };
            if let (Some(Ok(file)), Some(inc)) = (sink.as_mut(), &incoming)
                && let Err(e) = std::io::Write::write_all(file, &got)
            {
                failure.get_or_insert(format!("cannot write {}: {e}", inc.join(name).display()));
            }
            // Every rank received the same chunk, so every rank tells alike
            // whether the file goes on: a full chunk means more may follow
            // (the holder reads at most SHARE_CHUNK; a short or failed read
            // ends the file, and the copy then fails to verify).
            if got.len() != SHARE_CHUNK {
                break;
            }
        }
        if let (Some(Err(e)), Some(inc)) = (sink, &incoming) {
            failure.get_or_insert(format!("cannot create {}: {e}", inc.join(name).display()));
        }
    }
    if let (Some(_), Some(dir), Some(handle)) = (&incoming, &dir, &handle) {
        if failure.is_none() {
            let _ = handle.remove_dir_all(&step_name);
            match handle.rename(&incoming_name, &step_name).and_then(|()| private::keep_private(dir)) {
                Ok(()) => {
                    if let Err(e) = tier::check_copy(dir, step, run) {
                        failure = Some(format!("the copy received does not verify: {e}"));
                    }
                }
                Err(e) => failure = Some(format!("cannot move the copy into place: {e}")),
            }
        }
        if failure.is_some() {
            let _ = handle.remove_dir_all(&incoming_name);
        }
    }
    agree(world, failure)
}

/// Every rank's verdict on [`share`]: `Ok` when no rank failed, else each
/// failed rank and why (the same list on every rank).
fn agree(world: &dyn Collective, failure: Option<String>) -> Result<(), Vec<(usize, String)>> {
    if let Some(why) = &failure {
        tracing::warn!(rank = world.rank(), %why, "could not take the local checkpoint from its holder");
    }
    // One byte at least from every rank (MPI refuses a gather of nothing):
    // `-` for no failure, else `!` and why.
    let mine = failure.map_or_else(|| "-".to_string(), |why| format!("!{why}"));
    let all = world
        .all_gather_bytes(mine.as_bytes())
        .map_err(|e| vec![(world.rank(), format!("the ranks could not compare their copies: {e}"))])?;
    let failed: Vec<(usize, String)> = all
        .into_iter()
        .enumerate()
        .filter_map(|(rank, sent)| sent.strip_prefix(b"!").map(|why| (rank, String::from_utf8_lossy(why).into_owned())))
        .collect();
    if failed.is_empty() { Ok(()) } else { Err(failed) }
}

/// What rank `holder` sends, as every rank receives it: a broadcast from
/// the holder (a tree in MPI: O(log N) steps, not a ring of N hops).
fn from_holder(world: &dyn Collective, holder: usize, mine: &[u8]) -> Result<Vec<u8>, String> {
    let send = if world.rank() == holder { mine } else { &[] };
    world.broadcast_bytes(holder, send).map_err(|e| e.to_string())
}

fn read_chunk(file: &mut std::fs::File) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut chunk = Vec::with_capacity(SHARE_CHUNK);
    file.take(SHARE_CHUNK as u64).read_to_end(&mut chunk)?;
    Ok(chunk)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(step: u64, sha: &str) -> LocalDone {
        let files = vec![ManifestEntry { name: "model.safetensors".into(), bytes: 8, sha256: sha.into() }];
        LocalDone { step, files, bytes: 8, seconds: 0.5, error: None, skipped: false }
    }

    fn nodes(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_save_due_while_one_is_in_flight_is_owed_and_starts_right_after_it() {
        let mut owed = None;
        // Every 5 steps; the save of step 5 takes until step 12 to commit.
        assert_eq!(plan_start(true, false, &mut owed, 5), Some(5), "due and free: now");
        assert_eq!(plan_start(false, true, &mut owed, 6), None);
        assert_eq!(plan_start(true, true, &mut owed, 10), None, "due while busy: owed");
        assert_eq!(owed, Some(10));
        assert_eq!(plan_start(false, true, &mut owed, 11), None);
        // Free at 12: the save owed since 10 starts now (not at 15), late by 2.
        assert_eq!(plan_start(false, false, &mut owed, 12), Some(10));
        assert_eq!(owed, None);
        // A second due step while still busy keeps the first as the due one.
        assert_eq!(plan_start(true, true, &mut owed, 15), None);
        assert_eq!(plan_start(true, true, &mut owed, 20), None);
        assert_eq!(plan_start(false, false, &mut owed, 21), Some(15));
        // Nothing due, nothing owed: nothing starts.
        assert_eq!(plan_start(false, false, &mut owed, 22), None);
    }

    #[test]
    fn the_lowest_rank_on_each_node_writes_its_copy() {
        assert_eq!(writers(&nodes(&["a", "a", "b", "b", "c"])), vec![0, 2, 4]);
        assert_eq!(writers(&nodes(&["a"])), vec![0]);
    }

    #[test]
    fn ranks_that_all_run_on_one_node_are_warned_that_no_copy_is_on_another_node() {
        let warning = same_node_warning(&nodes(&["a", "a", "a"])).expect("three ranks on a");
        assert!(warning.contains("all 3 ranks run on node a"), "{warning}");
        assert!(warning.contains("no copy on another node"), "{warning}");
        for spread in [&["a"][..], &["a", "b"], &["a", "a", "b"]] {
            assert_eq!(same_node_warning(&nodes(spread)), None, "{spread:?}");
        }
    }

    #[test]
    fn a_rank_that_cannot_keep_copies_turns_the_tier_off_naming_its_node_and_what_to_do() {
        let ns = nodes(&["a", "b", "c"]);
        assert_eq!(off_reason(&[], &ns), None);
        let off = [(2, "cannot make the local directory /x: Not a directory".to_string()), (1, "no room".into())];
        let reason = off_reason(&off, &ns).unwrap();
        assert!(
            reason.starts_with("rank 1 on b: no room; rank 2 on c: cannot make the local directory /x"),
            "in rank order: {reason}"
        );
        assert!(reason.contains("off for this attempt") && reason.contains("[recovery] local_dir"), "{reason}");
    }

    #[test]
    fn a_rank_takes_the_shared_copy_only_as_its_nodes_writer_and_says_when_it_cannot() {
        let root = Path::new("/local");
        assert_eq!(side(Ok(root), Some(Ok(())), || false), Side::Root { root, write: true });
        assert_eq!(side(Ok(root), Some(Ok(())), || true), Side::Root { root, write: false }, "its node holds it");
        let never = || -> bool { panic!("a rank that is not its node's writer checks no copy") };
        assert_eq!(side(Ok(root), None, never), Side::Root { root, write: false }, "another rank writes");
        assert_eq!(side(Ok(root), Some(Err("EROFS")), || true), Side::Root { root, write: false });
        assert_eq!(side(Ok(root), Some(Err("EROFS")), || false), Side::Cannot("EROFS".into()));
        assert_eq!(side(Err("no local directory"), None, never), Side::Cannot("no local directory".into()));
    }

    #[test]
    fn a_local_save_commits_once_every_writer_reported_the_same_files() {
        let ns = nodes(&["a", "b"]);
        let mut inbox = LocalInbox::new(10, 0.001, vec![0, 1]);
        inbox.add(0, done(10, "x"));
        inbox.add(1, done(9, "x"));
        assert_eq!(inbox.verdict(&ns), None, "a stale report of another step does not count");
        inbox.add(1, done(10, "x"));
        assert!(matches!(inbox.verdict(&ns), Some(InboxVerdict::Agreed { .. })));
    }

    #[test]
    fn copies_that_differ_fail_and_name_the_rank_and_node() {
        let mut inbox = LocalInbox::new(10, 0.0, vec![0, 1]);
        inbox.add(0, done(10, "x"));
        inbox.add(1, done(10, "y"));
        let Some(InboxVerdict::Failed { reason }) = inbox.verdict(&nodes(&["a", "b"])) else { panic!() };
        assert!(reason.contains("rank 1 on b's copy differs from rank 0's"), "{reason}");
    }

    #[test]
    fn a_writer_without_room_skips_the_save_and_one_that_failed_fails_it() {
        let ns = nodes(&["a", "b"]);
        let mut inbox = LocalInbox::new(10, 0.0, vec![0, 1]);
        inbox.add(0, done(10, "x"));
        inbox.add(1, LocalDone { error: Some("no room".into()), skipped: true, ..done(10, "x") });
        let Some(InboxVerdict::Skipped { reason }) = inbox.verdict(&ns) else { panic!() };
        assert_eq!(reason, "rank 1 on b: no room");
        inbox.add(0, LocalDone { error: Some("EIO".into()), ..done(10, "x") });
        assert!(matches!(inbox.verdict(&ns), Some(InboxVerdict::Failed { .. })));
    }

    #[test]
    fn a_copy_the_world_never_committed_is_removed_when_a_writer_opens_and_a_committed_one_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join(private::private_dir_name(private::user())).join("key");
        // The root as an earlier world left it: claimed by its writer.
        drop(LocalWriter::open(&root, &Config::default()).unwrap());
        let (cut_short, committed) = (root.join(step_dir_name(275)), root.join(step_dir_name(270)));
        std::fs::create_dir_all(&cut_short).unwrap();
        std::fs::create_dir_all(&committed).unwrap();
        WorldRecord::new("/runs/a".into(), 270, Vec::new(), vec!["a".into()], 1)
            .write(&crate::confine::Dir::open(&committed).unwrap())
            .unwrap();
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        let linked = root.join(step_dir_name(280));
        std::os::unix::fs::symlink(&elsewhere, &linked).unwrap();
        let _writer = LocalWriter::open(&root, &Config::default()).unwrap();
        assert!(!cut_short.exists(), "it would stand in for this world's copy of step 275");
        assert!(committed.join(tier::WORLD_FILE).is_file());
        let aside = root.join(format!("{REFUSED_PREFIX}{}", step_dir_name(280)));
        assert!(!linked.exists() && aside.is_symlink(), "a link is moved aside, not removed nor followed");
        assert!(elsewhere.is_dir());
    }

    #[test]
    fn copies_refused_as_untrusted_become_failed_events_naming_rank_node_and_why() {
        let copy = |step, refused| Unusable { step, reason: format!("why {step}"), refused };
        let refused = vec![vec![copy(5, true), copy(6, false)], vec![], vec![copy(7, true)]];
        let events = refusal_events(&refused, &nodes(&["a", "b", "c"]));
        let reasons: Vec<&str> = events.iter().map(|e| e.reason.as_deref().unwrap()).collect();
        assert_eq!(
            reasons,
            [
                "rank 0 on a: the local copy of step 5 is refused, not resumed from: why 5",
                "rank 2 on c: the local copy of step 7 is refused, not resumed from: why 7"
            ],
            "a copy only incomplete or damaged is logged, not recorded"
        );
        assert!(events.iter().all(|e| e.outcome == "failed"));
        assert_eq!(events[1].step, 7);
    }

    /// A committed local copy of `step` of the run `run` under `root`,
    /// written the way a node's writer writes one.
    fn committed_copy(root: &Path, step: u64, run: &str) {
        use crate::checkpoint::HostTensor;
        let mut writer = LocalWriter::open(root, &Config::default()).unwrap();
        let mut model = TensorSet::new();
        let weights: Vec<f32> = (0..100).map(|i| i as f32 * 0.25).collect();
        model.insert("w".into(), HostTensor::from_f32(vec![100], &weights));
        writer.start(Snapshot { step, model, optimizer: TensorSet::new(), state: serde_json::json!({"step": step}) });
        let done = loop {
            if let Some(done) = writer.finished().pop() {
                break done;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        assert_eq!(done.error, None);
        writer.commit(&WorldRecord::new(run.into(), step, done.files, vec!["a".into()], 3)).unwrap();
    }

    /// Every rank's result of [`share`] over a world of threads, each with
    /// its side.
    fn share_over_threads(
        holder: usize,
        step: u64,
        run: &str,
        sides: Vec<Side<'_>>,
    ) -> Vec<Result<(), Vec<(usize, String)>>> {
        let world = crate::distributed::ThreadRank::world(sides.len());
        std::thread::scope(|scope| {
            let handles: Vec<_> = world
                .into_iter()
                .zip(sides)
                .map(|(world, side)| scope.spawn(move || share(&world, holder, step, run, side)))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn one_rank_a_node_checks_its_copies_the_lowest_whatever_the_layout() {
        // Cyclic over three nodes, then a node of one rank: ranks 0, 1, 2
        // and 6 check, and nobody else.
        let nodes = ["a", "b", "c", "a", "b", "c", "d", "a"];
        let world = crate::distributed::ThreadRank::world(nodes.len());
        let checks: Vec<bool> = std::thread::scope(|scope| {
            let handles: Vec<_> = world
                .into_iter()
                .zip(nodes)
                .map(|(world, node)| scope.spawn(move || checks_node(&world, node).unwrap()))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(checks, [true, true, true, false, false, false, true, false]);
    }

    #[test]
    fn a_local_copy_is_broadcast_from_its_holder_to_a_node_without_it_and_verifies_there() {
        let tmp = tempfile::tempdir().unwrap();
        let root_of = |node: &str| {
            let root = tmp.path().join(node).join(private::private_dir_name(private::user())).join("key");
            private::prepare_root(&root).unwrap();
            root
        };
        let (a, b, c) = (root_of("a"), root_of("b"), root_of("c"));
        let (a, b, c) = (a.as_path(), b.as_path(), c.as_path());
        let run = "/runs/a";
        committed_copy(a, 10, run);
        // Rank 0 on a holds it; ranks 1 and 2 are on b, whose writer is rank 1.
        let sides = vec![
            Side::Root { root: a, write: false },
            Side::Root { root: b, write: true },
            Side::Root { root: b, write: false },
        ];
        for result in share_over_threads(0, 10, run, sides) {
            assert_eq!(result, Ok(()));
        }
        let (sent, got) = (a.join(step_dir_name(10)), b.join(step_dir_name(10)));
        tier::check_copy(&got, 10, run).expect("b's copy verifies");
        for name in ["MANIFEST.json", tier::WORLD_FILE, "model.safetensors"] {
            let bytes = std::fs::read(sent.join(name)).unwrap();
            assert!(bytes.len() > SHARE_CHUNK, "{name} takes several rounds");
            assert_eq!(std::fs::read(got.join(name)).unwrap(), bytes, "{name}");
        }
        assert!(!b.join(format!(".incoming-{}", step_dir_name(10))).exists(), "received into place");

        // A rank that cannot take it fails the share on every rank alike.
        let sides = vec![
            Side::Root { root: a, write: false },
            Side::Root { root: c, write: true },
            Side::Cannot("no local directory".into()),
        ];
        for result in share_over_threads(0, 10, run, sides) {
            assert_eq!(result, Err(vec![(2, "no local directory".to_string())]));
        }
    }

    #[test]
    fn pruning_keeps_the_newest_committed_copies_and_the_one_being_written() {
        // local_keep 2: 10 and 20 committed, 25 abandoned, 30 committed, 35 being written.
        let copies = [(10, true), (20, true), (25, false), (30, true), (35, false)];
        assert_eq!(prune_plan(&copies, 2), [10, 25]);
        assert_eq!(prune_plan(&copies, 1), [10, 20, 25]);
        // Nothing committed yet: nothing is removed (the store keeps its own count).
        assert_eq!(prune_plan(&[(5, false), (10, false)], 2), Vec::<u64>::new());
        // A stop before the newest copy was agreed leaves the committed one.
        assert_eq!(prune_plan(&[(25, true), (30, false)], 1), Vec::<u64>::new());
    }
}
