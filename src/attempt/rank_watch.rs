//! Lost ranks: a rank of a data-parallel run that stops without dying
//! (SIGSTOP, a node frozen by its hypervisor, storage that stalls forever)
//! or dies without its launcher noticing holds every other rank in the next
//! collective, where MPI waits forever. Every rank therefore runs a
//! [`RankWatch`] thread; together they find a lost rank at any world size
//! with shared-filesystem work that grows with the nodes, not the ranks
//! squared (docs/scale.md):
//!
//! - **Beats stay on the node.** Every [`beat_interval`] (a tenth of
//!   `[distributed] timeout`) each rank rewrites its own beat ([`RankBeat`]:
//!   a growing `seq`, the last step it completed) in its node's folder on
//!   node-local storage (`/dev/shm`, private to the user as the node-local
//!   checkpoint tier is), and reads its node's other beats there.
//! - **One file a node.** The node's lowest rank whose beat moved within
//!   half the timeout (so a frozen one is replaced long before anyone would
//!   call its node lost) writes what it read as `<run dir>/ranks/
//!   node-<node>.json` ([`NodeBeat`]), once a beat.
//! - **Two sweepers.** Rank 0 reads every node's file once a beat and calls
//!   a rank *lost* when its `seq` has not grown for `[distributed] timeout`
//!   by rank 0's own clock ([`lost`]: no clocks are compared across nodes);
//!   so does the *deputy*, the lowest rank on another node than rank 0's
//!   (rank 1 when there is none), which rank 0 names in
//!   `<run dir>/ranks/watch.json`: rank 0's own loss, or its node's, is found
//!   too. Until a deputy is named (rank 0 lost before its first sweep),
//!   every node's writer past half the timeout sweeps.
//! - **One verdict.** A sweeper that finds ranks lost writes them once to
//!   `<run dir>/ranks/lost.json` ([`LostRecord`]); each node's writer copies
//!   it (and `watch.json`) into its node's folder, where every rank of the
//!   node reads it: every survivor acts on the same list within about two
//!   beats. Per beat the shared filesystem sees a write and two small reads
//!   a node and two sweeps of one listing and one read a node: O(nodes), and
//!   no rank reads another rank's file.
//!
//! The shared files are on the run directory's storage, which every rank
//! must share anyway (followers read the checkpoints there): no socket
//! protocol of our own, no second channel through MPI (which is the thing
//! that hangs). The heartbeat is written by its own thread, so a long save
//! or a slow step does not look like a loss; a thread stuck inside a live
//! process is the watchdog's business (`watchdog.rs`). A loss is found
//! between the timeout and the timeout plus about three beats after the
//! lost rank's last beat (a beat to reach its node's file, one for a
//! sweep to see it, one to sweep again).
//!
//! When ranks are lost, the handler given to the watch runs once, on the
//! watch's thread: the lowest-numbered rank still beating ([`recorder`])
//! records `rank_lost` (rank 0 while it lives, else a follower: rank 0's
//! records are then written by rank 1; `attempt/lost.rs`), and every
//! survivor ends its part of the world: `run`'s ranks abort the MPI world
//! (`MPI_Abort`), so the launcher ends every rank, the stopped ones
//! included; `exec`'s supervisors end their programs (`exec/world.rs`). A
//! rank that ends normally writes a last beat with `done` (its node's
//! writer carries it into the node's file at once) and is never called
//! lost; a beat of another launch (its `session`) is no beat. A supervisor
//! whose program ended says `done` from then on ([`RankWatch::mark_done`])
//! and goes on watching the others.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::confine::Dir;
use crate::telemetry::{RankBeat, now_rfc3339, rank_beat_file};

/// The directory of heartbeat files in a run directory.
pub const RANKS_DIR: &str = "ranks";

/// How often a rank rewrites its heartbeat and reads the others': a tenth of
/// the timeout, between 100 ms and 5 s. A loss is noticed at most one
/// interval after the timeout.
pub fn beat_interval(timeout: Duration) -> Duration {
    (timeout / 10).clamp(Duration::from_millis(100), Duration::from_secs(5))
}

/// What this rank knows of another rank's heartbeat.
#[derive(Debug, Clone, PartialEq)]
pub struct Peer {
    /// The last beat of this launch read from its file (`None`: none yet).
    pub beat: Option<RankBeat>,
    /// When its `seq` last changed, or when watching began.
    pub changed_at: Instant,
}

impl Peer {
    pub fn new(now: Instant) -> Peer {
        Peer { beat: None, changed_at: now }
    }

    /// Takes in what was read from the peer's file at `now`. A beat of
    /// another launch, an unreadable file or a beat with the same `seq` is
    /// no change.
    pub fn observe(&mut self, read: Option<RankBeat>, session: &str, now: Instant) {
        let Some(beat) = read.filter(|b| b.session == session) else { return };
        // Only a newer beat is a change: two writers of a node's file (one
        // taking over from a frozen one) may hand over an older copy.
        if self.beat.as_ref().is_none_or(|old| old.seq < beat.seq || (old.seq == beat.seq && old.done != beat.done)) {
            self.beat = Some(beat);
            self.changed_at = now;
        }
    }
}

/// A rank judged lost.
#[derive(Debug, Clone, PartialEq)]
pub struct Lost {
    pub rank: usize,
    /// Its node and pid as its last beat said (empty and 0 with no beat).
    pub node: String,
    pub pid: u32,
    /// The last step it had completed, as its last beat said.
    pub step: Option<u64>,
    /// How long its beat had not changed.
    pub silent: Duration,
}

/// The ranks (other than `me`) whose beat has not changed for longer than
/// `timeout` at `now`, in rank order. A rank whose last beat says `done`
/// ended normally and is never lost.
pub fn lost(peers: &[Peer], me: usize, timeout: Duration, now: Instant) -> Vec<Lost> {
    peers
        .iter()
        .enumerate()
        .filter(|(rank, _)| *rank != me)
        .filter(|(_, p)| !p.beat.as_ref().is_some_and(|b| b.done))
        .filter_map(|(rank, p)| {
            let silent = now.saturating_duration_since(p.changed_at);
            (silent > timeout).then(|| Lost {
                rank,
                node: p.beat.as_ref().map(|b| b.node.clone()).unwrap_or_default(),
                pid: p.beat.as_ref().map_or(0, |b| b.pid),
                step: p.beat.as_ref().and_then(|b| b.step),
                silent,
            })
        })
        .collect()
}

/// The rank that records the loss: the lowest-numbered one not lost (every
/// survivor computes the same from the same files, give or take an
/// interval; two that disagree each write their own view, which is still
/// true). `None` when every rank is lost, which a surviving caller cannot see.
pub fn recorder(lost: &[Lost], size: usize) -> Option<usize> {
    (0..size).find(|r| !lost.iter().any(|l| l.rank == *r))
}

/// What a rank does when others are lost. Runs once, on the watch's thread,
/// after which this rank stops beating and watching: `run`'s ends the
/// process (aborts the world); `exec`'s stores the loss for its supervisor,
/// which ends its program and the task.
pub type LostHandler = Box<dyn FnOnce(Vec<Lost>) + Send>;

/// Who this rank is, for its heartbeat.
#[derive(Debug, Clone)]
pub struct WatchSetup {
    /// `<run dir>/ranks`.
    pub dir: PathBuf,
    pub rank: usize,
    pub size: usize,
    pub node: String,
    pub session: String,
    pub timeout: Duration,
}

/// The step this rank last completed, as its heartbeat tells the others.
#[derive(Debug, Clone, Default)]
pub struct Pulse(Arc<AtomicU64>);

impl Pulse {
    /// This rank completed `step` (or stands at it after a resume).
    pub fn at_step(&self, step: u64) {
        self.0.store(step + 1, Ordering::Relaxed);
    }

    fn step(&self) -> Option<u64> {
        self.0.load(Ordering::Relaxed).checked_sub(1)
    }
}

/// The least the leader waits at the end for ranks still beating to say
/// done: a short `[distributed] timeout` must not make it leave a rank that
/// is only slow to wind up on a loaded machine (the chaos campaign saw a
/// follower take more than 4 s at a 2 s timeout; leaving it made `mpirun`
/// call the end improper).
pub const END_WAIT_MIN: Duration = Duration::from_secs(30);

/// The heartbeat thread of one rank; see the module docs. Dropped without
/// [`finish`](RankWatch::finish), it stops beating (the others will call
/// this rank lost if the launcher does not end them first).
pub struct RankWatch {
    pulse: Pulse,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicBool>,
    handler: Arc<Mutex<Option<LostHandler>>>,
    thread: Option<JoinHandle<()>>,
    /// Dropped to wake the thread from its pause between beats when the
    /// watch ends (a rank's end must not wait up to a beat, 5 s at the
    /// default timeout).
    wake: Option<std::sync::mpsc::Sender<()>>,
    /// When this rank last beat, for `rekindle bench liveness`.
    last_beat: Arc<Mutex<Instant>>,
    /// `<run dir>/ranks`, held open, and the launch: where the end looks
    /// for `done`.
    world: Dir,
    session: String,
    rank: usize,
    size: usize,
    timeout: Duration,
}

impl RankWatch {
    /// Writes this rank's first beat, in its node's folder and its node's
    /// file (so the others see it from their first look), and starts the
    /// thread.
    pub fn start(setup: WatchSetup, handler: LostHandler) -> std::io::Result<RankWatch> {
        std::fs::create_dir_all(&setup.dir)?;
        // Never a link to elsewhere (crate::confine).
        crate::confine::own_dir(&setup.dir)?;
        let pulse = Pulse::default();
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicBool::new(false));
        let handler = Arc::new(Mutex::new(Some(handler)));
        let (rank, size, timeout) = (setup.rank, setup.size, setup.timeout);
        let session = setup.session.clone();
        let local = match local_dir(&setup.node, &setup.session) {
            Some(dir) => dir,
            None => {
                let dir = setup.dir.join(format!("local-{}", node_beat_file(&setup.node).trim_end_matches(".json")));
                std::fs::create_dir_all(&dir)?;
                crate::confine::own_dir(&dir)?;
                dir
            }
        };
        // Both folders held open from here: every beat file is reached
        // through them, never through a link.
        let (local, shared) = (Dir::open(&local)?, Dir::open(&setup.dir)?);
        let world = shared.try_clone()?;
        let last_beat = Arc::new(Mutex::new(Instant::now()));
        let mut beater = Beater {
            setup,
            seq: 0,
            pulse: pulse.clone(),
            done: Arc::clone(&done),
            local,
            shared,
            own: None,
            started: Instant::now(),
            node_peers: std::collections::BTreeMap::new(),
            last_beat: Arc::clone(&last_beat),
        };
        beater.beat();
        // Into its node's file at once too (one write a rank, once): a
        // rank is named there from its start, not a beat later (the others
        // see it from their first look; a launcher or a person looking for
        // a rank's pid finds it there).
        beater.write_node_now();
        let (wake, wake_rx) = std::sync::mpsc::channel::<()>();
        let thread = {
            let (stop, done, handler) = (Arc::clone(&stop), Arc::clone(&done), Arc::clone(&handler));
            std::thread::Builder::new().name("rekindle-rank-watch".into()).spawn(move || {
                beater.run(&stop, &handler, &wake_rx);
                if done.load(Ordering::SeqCst) {
                    beater.beat();
                    // Its `done` reaches its node's file at once, whoever
                    // writes that file (a run shorter than a beat never
                    // looked; a writer that ended before it has stopped):
                    // the leader's end waits for every `done`. One write a
                    // rank, once.
                    beater.write_node_now();
                }
            })?
        };
        Ok(RankWatch {
            pulse,
            stop,
            done,
            handler,
            thread: Some(thread),
            wake: Some(wake),
            last_beat,
            world,
            session,
            rank,
            size,
            timeout,
        })
    }

    /// Where this rank tells its progress.
    pub fn pulse(&self) -> Pulse {
        self.pulse.clone()
    }

    /// Replaces what happens when ranks are lost (a leader installs the full
    /// end of its attempt once that attempt has started). Does nothing once
    /// the handler has run.
    pub fn set_handler(&self, handler: LostHandler) {
        let mut slot = self.handler.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_some() {
            *slot = Some(handler);
        }
    }

    /// This rank's part of the work ended (its program exited): its beats
    /// say `done` from the next on, so no other rank calls it lost while it
    /// winds up, and it goes on watching the others (until it finds one
    /// lost: then, as always, the handler runs and the watch ends).
    pub fn mark_done(&self) {
        self.done.store(true, Ordering::SeqCst);
    }

    /// The leader ended the world's run (and told the other ranks): its
    /// beats say `done`, and it waits until every other rank's beat says
    /// `done` too before it finishes. A rank that stops beating in that wait
    /// (a node frozen after the last collective) is found as any lost rank
    /// is, within `[distributed] timeout`, and `on_lost` runs (it ends the
    /// world, so that the launcher ends the frozen rank: otherwise the
    /// launcher, and the job, would wait for it until the time limit).
    /// A rank still beating is still winding up (its last local copy, its
    /// records): it is waited for, up to twice the timeout and at least
    /// [`END_WAIT_MIN`], then left to the launcher. Returns the ranks that
    /// never said done.
    pub fn finish_with_world(self, on_lost: LostHandler) -> Vec<usize> {
        self.set_handler(on_lost);
        self.mark_done();
        let until = Instant::now() + (2 * self.timeout + 2 * beat_interval(self.timeout)).max(END_WAIT_MIN);
        // The nodes' files (one listing and one read a node), where each
        // rank's `done` lands as it ends: every 200 ms for the first two
        // seconds (the ranks end together, and a run must not end a beat
        // late), then once a beat (a slow one costs little while it is
        // waited for).
        let world = || read_world_at(&self.world, &self.session, self.size);
        let said_done =
            |w: &[Option<RankBeat>], r: &usize| w.get(*r).is_some_and(|b| b.as_ref().is_some_and(|b| b.done));
        let started = Instant::now();
        let first = world();
        let mut left: Vec<usize> = (0..self.size).filter(|r| *r != self.rank && !said_done(&first, r)).collect();
        // Until every rank said done, the deadline, or a rank was found lost
        // (the handler was taken: it ends the world).
        while !left.is_empty() && Instant::now() < until && !self.handler_running() {
            let pause = if started.elapsed() < Duration::from_secs(2) {
                Duration::from_millis(200).min(beat_interval(self.timeout))
            } else {
                beat_interval(self.timeout)
            };
            std::thread::sleep(pause);
            let now = world();
            left.retain(|r| !said_done(&now, r));
        }
        if !left.is_empty() {
            tracing::warn!(ranks = ?left, "ranks still running after the world's end; the launcher ends them");
        }
        self.finish();
        left
    }

    /// Stops beating without saying done, as a rank frozen or killed would,
    /// and returns when it last beat (`rekindle bench liveness`).
    pub fn stop_beating(mut self) -> Instant {
        self.halt();
        *self.last_beat.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// This rank ended its run normally: a last beat says `done`, so no
    /// other rank calls it lost while it exits.
    pub fn finish(mut self) {
        self.done.store(true, Ordering::SeqCst);
        self.halt();
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.wake.take();
        if let Some(t) = self.thread.take() {
            // A thread inside the handler ends the process itself.
            if t.is_finished() || !self.handler_running() {
                let _ = t.join();
            }
        }
    }

    fn handler_running(&self) -> bool {
        self.handler.lock().unwrap_or_else(|p| p.into_inner()).is_none()
    }
}

impl Drop for RankWatch {
    fn drop(&mut self) {
        self.halt();
    }
}

struct Beater {
    setup: WatchSetup,
    seq: u64,
    pulse: Pulse,
    done: Arc<AtomicBool>,
    /// This node's beats: node-local storage ([`local_dir`]), held open.
    local: Dir,
    /// `<run dir>/ranks`, held open.
    shared: Dir,
    /// This rank's newest beat.
    own: Option<RankBeat>,
    /// When the watch began.
    started: Instant,
    /// What this rank knows of its node's ranks' beats (its own included).
    node_peers: std::collections::BTreeMap<usize, Peer>,
    last_beat: Arc<Mutex<Instant>>,
}

/// The node's aggregated beats, `<run dir>/ranks/node-<node>.json`: what
/// the lowest live rank of a node read of its node's beats (module docs).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeBeat {
    pub session: String,
    pub node: String,
    /// The rank that wrote it (the node's lowest rank still beating).
    pub writer: usize,
    pub beats: Vec<RankBeat>,
    pub time: String,
}

/// Who sweeps besides rank 0: `<run dir>/ranks/watch.json`, written by rank 0
/// when it changes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct WatchRecord {
    pub session: String,
    pub deputy: usize,
}

/// A loss found, `<run dir>/ranks/lost.json`: written once by the sweeper
/// that found it, read by every node, so that every rank ends with the same
/// verdict.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LostRecord {
    pub session: String,
    /// The sweeper that found it.
    pub by: usize,
    pub lost: Vec<LostRank>,
}

/// One rank of a [`LostRecord`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LostRank {
    pub rank: usize,
    pub node: String,
    pub pid: u32,
    pub step: Option<u64>,
    pub silent_seconds: f64,
}

impl LostRank {
    fn of(l: &Lost) -> LostRank {
        LostRank {
            rank: l.rank,
            node: l.node.clone(),
            pid: l.pid,
            step: l.step,
            silent_seconds: l.silent.as_secs_f64(),
        }
    }

    fn lost(&self) -> Lost {
        Lost {
            rank: self.rank,
            node: self.node.clone(),
            pid: self.pid,
            step: self.step,
            silent: Duration::try_from_secs_f64(self.silent_seconds).unwrap_or_default(),
        }
    }
}

const NODE_PREFIX: &str = "node-";
const WATCH_FILE: &str = "watch.json";
const LOST_FILE: &str = "lost.json";

/// The file name of `node`'s aggregated beats (a node name is a host name;
/// anything else is replaced so that the name stays one file's).
pub fn node_beat_file(node: &str) -> String {
    let safe: String = node
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_' { c } else { '_' })
        .collect();
    format!("{NODE_PREFIX}{safe}.json")
}

/// Where the ranks of `node` in launch `session` beat: node-local storage
/// (`/dev/shm`, else the system's temporary directory), in the user's
/// private folder (made `0700` and checked as the node-local tier's is,
/// `checkpoint::private`), a folder per launch and node. `None` when there
/// is no such storage the user alone can write: the beats then go to
/// `<ranks>/local-<node>/` on the shared filesystem.
fn local_dir(node: &str, session: &str) -> Option<PathBuf> {
    use sha2::Digest;
    let base = [PathBuf::from("/dev/shm"), std::env::temp_dir()].into_iter().find(|b| b.is_dir())?;
    let key = hex::encode(&sha2::Sha256::digest(format!("{session}\n{node}").as_bytes())[..8]);
    let private = base.join(crate::checkpoint::private::private_dir_name(crate::checkpoint::private::user()));
    let dir = private.join(format!("beats-{key}"));
    match crate::checkpoint::private::prepare_root(&dir) {
        Ok(()) => {
            forget_old_launches(&private, "beats-");
            Some(dir)
        }
        Err(e) => {
            tracing::warn!(error = %e, "no private node-local folder for the heartbeats; they go to the run directory's storage");
            None
        }
    }
}

/// Removes the folders of launches a day old whose names begin with
/// `prefix` (best effort: the beats' are a few hundred bytes a rank, the
/// node checks' a few KiB, and a node may host thousands of launches).
pub(crate) fn forget_old_launches(private: &Path, prefix: &str) {
    let Ok(private) = Dir::open(private) else { return };
    let Ok(entries) = private.entries("") else { return };
    let day = Duration::from_secs(24 * 3600);
    for entry in entries.into_iter().filter(|e| e.kind.is_dir() && e.name_lossy().starts_with(prefix)) {
        let age =
            private.symlink_metadata(&entry.name).ok().and_then(|m| m.modified().ok()).and_then(|t| t.elapsed().ok());
        if age.is_some_and(|age| age > day) {
            let _ = private.remove_dir_all(&entry.name);
        }
    }
}

/// What one beat of the loop found: the ranks lost, and who found them
/// (`true`: this rank, which then publishes the verdict).
type Found = Option<(Vec<Lost>, bool)>;

impl Beater {
    fn run(&mut self, stop: &AtomicBool, handler: &Mutex<Option<LostHandler>>, wake: &std::sync::mpsc::Receiver<()>) {
        let interval = beat_interval(self.setup.timeout);
        let mut world_peers = vec![Peer::new(self.started); self.setup.size];
        let mut deputy: Option<usize> = None;
        while !stop.load(Ordering::SeqCst) {
            // The pause between beats, cut short when the watch ends.
            let _ = wake.recv_timeout(interval);
            if stop.load(Ordering::SeqCst) {
                return;
            }
            self.beat();
            let Some((lost, mine)) = self.look(&mut world_peers, &mut deputy) else { continue };
            if mine {
                let record = LostRecord {
                    session: self.setup.session.clone(),
                    by: self.setup.rank,
                    lost: lost.iter().map(LostRank::of).collect(),
                };
                if let Err(e) = write_json(&self.shared, LOST_FILE, &record, true) {
                    tracing::warn!(error = %e, "cannot publish the ranks found lost; the others find them themselves or end with the world");
                }
            }
            let taken = handler.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(handle) = taken {
                handle(lost);
            }
            return;
        }
    }

    /// One beat's look: this node's beats (node-local), the node's file if
    /// this rank writes it, the verdict, and the whole world's beats if this
    /// rank sweeps.
    fn look(&mut self, world_peers: &mut [Peer], deputy: &mut Option<usize>) -> Found {
        let (me, session, timeout) = (self.setup.rank, self.setup.session.clone(), self.setup.timeout);
        let now = Instant::now();
        let local = read_local_beats(&self.local, &session);
        for beat in &local {
            self.node_peers.entry(beat.rank).or_insert_with(|| Peer::new(now)).observe(
                Some(beat.clone()),
                &session,
                now,
            );
        }
        let node_peers = &self.node_peers;
        // The node's writer: its lowest rank whose beat moved within half
        // the timeout (this rank, if none lower did): a frozen writer is
        // replaced long before the sweepers would call its node lost.
        let fresh = |r: &usize, p: &Peer| *r == me || now.saturating_duration_since(p.changed_at) <= timeout / 2;
        let writer = node_peers.iter().filter(|(r, p)| fresh(r, p)).map(|(r, _)| *r).chain([me]).min();
        if writer == Some(me) {
            self.write_node_now();
            // The verdict and the deputy, for this node's ranks.
            for name in [LOST_FILE, WATCH_FILE] {
                if let Some(bytes) = read_small(&self.shared, name, true) {
                    let _ = write_bytes(&self.local, name, &bytes, false);
                }
            }
        }
        if let Some(record) = read_json::<LostRecord>(&self.local, LOST_FILE, false).filter(|r| r.session == session)
            && !record.lost.is_empty()
        {
            return Some((record.lost.iter().map(LostRank::lost).collect(), false));
        }
        if me != 0 {
            *deputy = read_json::<WatchRecord>(&self.local, WATCH_FILE, false)
                .filter(|w| w.session == session)
                .map(|w| w.deputy);
        }
        // Until rank 0 has named a deputy (its first sweeps), a node's writer
        // past half the timeout sweeps too: rank 0 may have died before it
        // named one, and its loss must still be found.
        let unnamed = deputy.is_none() && writer == Some(me) && self.started.elapsed() > timeout / 2;
        let sweeps = me == 0 || *deputy == Some(me) || unnamed;
        if !sweeps {
            return None;
        }
        let swept = Instant::now();
        for beat in read_world_beats(&self.shared, &session) {
            if let Some(peer) = world_peers.get_mut(beat.rank) {
                peer.observe(Some(beat), &session, now);
            }
        }
        io_counts::sweep(swept.elapsed());
        if me == 0 {
            // The deputy: the lowest rank on another node than this one (it
            // sees this node's loss), else rank 1.
            let here = &self.setup.node;
            let chosen = world_peers
                .iter()
                .enumerate()
                .find(|(_, p)| p.beat.as_ref().is_some_and(|b| &b.node != here))
                .map(|(r, _)| r)
                .or((self.setup.size > 1).then_some(1));
            if chosen.is_some() && chosen != *deputy {
                let record = WatchRecord { session: session.clone(), deputy: chosen.unwrap_or(1) };
                if write_json(&self.shared, WATCH_FILE, &record, true).is_ok() {
                    *deputy = chosen;
                }
            }
        }
        let found = lost(world_peers, me, timeout, now);
        (!found.is_empty()).then_some((found, true))
    }

    /// Reads this node's beats and writes its file, holding the node's
    /// folder's lock from the read to the rename: two ranks of a node that
    /// write the file at once (both ending, or the writer beating while
    /// another ends) take turns, so the last write has read every beat
    /// written before it began. Without the turn, a rank's last beat saying
    /// `done` could be overwritten by a copy read just before it, and with
    /// both ranks gone no one would write the file again: rank 0's end wait
    /// would call a finished rank silent (seen with 16 ranks, two a node).
    /// A holder frozen with the lock is waited for at most a tenth of a
    /// beat, then the file is written without the turn, as before.
    fn write_node_now(&mut self) {
        let wait = beat_interval(self.setup.timeout) / 10;
        let _turn = match self.local.try_lock_for(wait) {
            Ok(turn) => turn,
            Err(e) => {
                tracing::debug!(error = %e, "cannot take this node's heartbeat lock; writing without it");
                None
            }
        };
        let now = Instant::now();
        for beat in read_local_beats(&self.local, &self.setup.session) {
            self.node_peers.entry(beat.rank).or_insert_with(|| Peer::new(now)).observe(
                Some(beat),
                &self.setup.session,
                now,
            );
        }
        self.write_node(now);
    }

    /// Writes this node's file: the beats of its ranks as this rank last
    /// read them, its own newest included.
    fn write_node(&mut self, now: Instant) {
        let me = self.setup.rank;
        if let Some(own) = self.own.clone() {
            self.node_peers.entry(me).or_insert_with(|| Peer::new(now)).observe(Some(own), &self.setup.session, now);
        }
        let node = NodeBeat {
            session: self.setup.session.clone(),
            node: self.setup.node.clone(),
            writer: me,
            beats: self.node_peers.values().filter_map(|p| p.beat.clone()).collect(),
            time: now_rfc3339(),
        };
        if let Err(e) = write_json(&self.shared, &node_beat_file(&self.setup.node), &node, true) {
            tracing::warn!(error = %e, "cannot write this node's heartbeats");
        }
    }

    fn beat(&mut self) {
        *self.last_beat.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        let done = self.done.load(Ordering::SeqCst);
        self.seq += 1;
        let beat = RankBeat {
            rank: self.setup.rank,
            node: self.setup.node.clone(),
            pid: std::process::id(),
            session: self.setup.session.clone(),
            seq: self.seq,
            step: self.pulse.step(),
            done,
            time: now_rfc3339(),
        };
        if let Err(e) = write_json(&self.local, &rank_beat_file(beat.rank), &beat, false) {
            // Not fatal here: if it lasts, the others call this rank lost,
            // which is what a rank cut off from its node's beats is.
            tracing::warn!(error = %e, dir = %self.local.path().display(), "cannot write this rank's heartbeat");
        }
        self.own = Some(beat);
    }
}

/// Writes `value` as `<dir>/<name>` through a rename, so that a reader never
/// sees half a file; counted as `shared` storage or not. Not synced: a beat
/// is worth nothing after a crash of the node that wrote it.
fn write_json(dir: &Dir, name: &str, value: &impl Serialize, shared: bool) -> std::io::Result<()> {
    // Through a JSON value: keys in alphabetical order, as in every file.
    let value = serde_json::to_value(value).map_err(std::io::Error::other)?;
    let bytes = serde_json::to_vec(&value).map_err(std::io::Error::other)?;
    write_bytes(dir, name, &bytes, shared)
}

/// Through the directory's handle (`confine::Dir`): created `O_EXCL`, never
/// through a link, renamed over the name.
fn write_bytes(dir: &Dir, name: &str, bytes: &[u8], shared: bool) -> std::io::Result<()> {
    count(shared, 3);
    // Named by the process and the writing thread: ranks are processes, but
    // a benchmark runs many in one, and two writers of a node's file may
    // overlap while one takes over from another.
    let tmp = format!(".{name}.{}.{:?}.tmp", std::process::id(), std::thread::current().id()).replace(['(', ')'], "");
    // A leftover of a killed writer by this name goes first.
    let _ = dir.remove_file(&tmp);
    std::io::Write::write_all(&mut dir.create_new(&tmp, 0o644)?, bytes)?;
    dir.rename(&tmp, name)
}

fn count(shared: bool, n: u64) {
    if shared { io_counts::shared(n) } else { io_counts::local(n) }
}

/// `<dir>/<name>`, bounded, a regular file reached without a link: beats
/// are ~200 bytes, a node's a few KiB.
fn read_small(dir: &Dir, name: &str, shared: bool) -> Option<Vec<u8>> {
    count(shared, 1);
    dir.read_bounded(name, 4 << 20).ok()
}

fn read_json<T: for<'a> Deserialize<'a>>(dir: &Dir, name: &str, shared: bool) -> Option<T> {
    serde_json::from_slice(&read_small(dir, name, shared)?).ok()
}

/// Every `<prefix>*.json` regular file of `dir` read as a `T` (one listing,
/// one read a file; what cannot be read or parsed is left out).
fn read_all<T: for<'a> Deserialize<'a>>(dir: &Dir, prefix: &str, shared: bool) -> Vec<T> {
    count(shared, 1);
    let Ok(entries) = dir.entries("") else { return Vec::new() };
    entries
        .into_iter()
        .filter(|e| e.kind.is_file())
        .map(|e| e.name_lossy())
        .filter(|name| name.starts_with(prefix) && name.ends_with(".json"))
        .filter_map(|name| read_json(dir, &name, shared))
        .collect()
}

/// The beats of launch `session` in the node-local folder `dir`.
fn read_local_beats(dir: &Dir, session: &str) -> Vec<RankBeat> {
    read_all::<RankBeat>(dir, "rank-", false).into_iter().filter(|b| b.session == session).collect()
}

/// Every beat of launch `session` in the nodes' files of `<run dir>/ranks`
/// (`dir`): one listing and one read a node.
fn read_world_beats(dir: &Dir, session: &str) -> Vec<RankBeat> {
    read_all::<NodeBeat>(dir, NODE_PREFIX, true)
        .into_iter()
        .filter(|n| n.session == session)
        .flat_map(|n| n.beats)
        .filter(|b| b.session == session)
        .collect()
}

/// Every rank's newest beat of launch `session` that the nodes' files in
/// `dir` (`<run dir>/ranks`) hold, by rank (`None`: none yet); what a task
/// that looks at the world once in a while reads (`exec`'s settle), one
/// listing and one read a node.
pub fn read_world(dir: &Path, session: &str, size: usize) -> Vec<Option<RankBeat>> {
    match Dir::open(dir) {
        Ok(held) => read_world_at(&held, session, size),
        Err(_) => vec![None; size],
    }
}

/// [`read_world`] of the `ranks` directory held as `dir`.
fn read_world_at(dir: &Dir, session: &str, size: usize) -> Vec<Option<RankBeat>> {
    let mut world: Vec<Option<RankBeat>> = vec![None; size];
    for beat in read_world_beats(dir, session) {
        if let Some(slot) = world.get_mut(beat.rank)
            && slot.as_ref().is_none_or(|old| old.seq < beat.seq)
        {
            *slot = Some(beat);
        }
    }
    world
}

/// What the liveness protocol costs the storage it runs on, counted as it
/// runs (process-wide; `rekindle bench liveness` reads them, docs/scale.md):
/// metadata operations on the run directory's shared filesystem (an open of
/// a beat is one; a beat written is three: the unlink of a leftover
/// temporary name, its create and the rename) and on node-local storage
/// alike, and the longest sweep of the others' beats one watcher made.
pub mod io_counts {
    use std::sync::atomic::{AtomicU64, Ordering};

    pub(super) static SHARED_OPS: AtomicU64 = AtomicU64::new(0);
    pub(super) static LOCAL_OPS: AtomicU64 = AtomicU64::new(0);
    pub(super) static LONGEST_SWEEP_NANOS: AtomicU64 = AtomicU64::new(0);

    /// (shared-filesystem operations, node-local operations, longest sweep
    /// in seconds) since the last [`reset`].
    pub fn read() -> (u64, u64, f64) {
        (
            SHARED_OPS.load(Ordering::Relaxed),
            LOCAL_OPS.load(Ordering::Relaxed),
            LONGEST_SWEEP_NANOS.load(Ordering::Relaxed) as f64 / 1e9,
        )
    }

    pub fn reset() {
        SHARED_OPS.store(0, Ordering::Relaxed);
        LOCAL_OPS.store(0, Ordering::Relaxed);
        LONGEST_SWEEP_NANOS.store(0, Ordering::Relaxed);
    }

    pub(super) fn shared(n: u64) {
        SHARED_OPS.fetch_add(n, Ordering::Relaxed);
    }

    pub(super) fn local(n: u64) {
        LOCAL_OPS.fetch_add(n, Ordering::Relaxed);
    }

    pub(super) fn sweep(took: std::time::Duration) {
        LONGEST_SWEEP_NANOS.fetch_max(took.as_nanos() as u64, Ordering::Relaxed);
    }
}

/// A fresh launch identity for the heartbeats: rank 0's node, pid and start
/// time, which no earlier launch can have had together.
pub fn new_session(node: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
    format!("{node}-{}-{nanos}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::Receiver;

    fn beat(seq: u64, session: &str, done: bool) -> RankBeat {
        RankBeat {
            rank: 1,
            node: "n2".into(),
            pid: 7,
            session: session.into(),
            seq,
            step: Some(seq * 2),
            done,
            time: String::new(),
        }
    }

    const T: Duration = Duration::from_secs(3);

    #[test]
    fn node_file_keys_are_alphabetical_and_the_world_reads_back_the_newest_beat_of_each_rank() {
        let dir = tempfile::tempdir().unwrap();
        let held = Dir::open(dir.path()).unwrap();
        let (older, newer) = (beat(3, "s", false), beat(4, "s", true));
        let node = |writer, beats: Vec<RankBeat>| NodeBeat {
            session: "s".into(),
            node: "n2".into(),
            writer,
            beats,
            time: String::new(),
        };
        write_json(&held, &node_beat_file("n2"), &node(1, vec![newer.clone()]), true).unwrap();
        // Another node's file still holding an older copy (a writer that
        // was replaced), and one of an earlier launch.
        write_json(&held, &node_beat_file("n2 old"), &node(1, vec![older]), true).unwrap();
        let mut other = node(0, vec![RankBeat { rank: 0, session: "earlier".into(), ..beat(9, "earlier", false) }]);
        other.session = "earlier".into();
        write_json(&held, &node_beat_file("n1"), &other, true).unwrap();
        let text = std::fs::read_to_string(dir.path().join(node_beat_file("n2"))).unwrap();
        assert_eq!(crate::telemetry::first_unsorted_key(&text), None, "{text}");
        assert_eq!(node_beat_file("n2 old"), "node-n2_old.json");
        assert_eq!(read_world(dir.path(), "s", 2), vec![None, Some(newer)]);
    }

    #[test]
    fn a_rank_whose_beat_stops_changing_is_lost_after_the_timeout_by_our_clock() {
        let t0 = Instant::now();
        let mut peers = vec![Peer::new(t0), Peer::new(t0)];
        peers[1].observe(Some(beat(1, "s", false)), "s", t0);
        peers[1].observe(Some(beat(2, "s", false)), "s", t0 + Duration::from_secs(1));
        // The same seq read again is no sign of life.
        peers[1].observe(Some(beat(2, "s", false)), "s", t0 + Duration::from_secs(3));
        assert!(lost(&peers, 0, T, t0 + Duration::from_secs(4)).is_empty(), "3 s silent is not past 3 s");
        let found = lost(&peers, 0, T, t0 + Duration::from_millis(4100));
        assert_eq!(found.len(), 1);
        let l = &found[0];
        assert_eq!((l.rank, l.node.as_str(), l.pid, l.step), (1, "n2", 7, Some(4)));
        assert_eq!(l.silent, Duration::from_millis(3100));
    }

    #[test]
    fn a_rank_that_never_beat_is_lost_counting_from_when_watching_began() {
        let t0 = Instant::now();
        let peers = vec![Peer::new(t0), Peer::new(t0)];
        assert!(lost(&peers, 0, T, t0 + T).is_empty());
        let found = lost(&peers, 0, T, t0 + T + Duration::from_millis(1));
        assert_eq!((found[0].rank, found[0].node.as_str(), found[0].step), (1, "", None));
    }

    #[test]
    fn a_beat_of_another_launch_or_an_unreadable_file_is_no_sign_of_life() {
        let t0 = Instant::now();
        let mut peer = Peer::new(t0);
        peer.observe(Some(beat(9, "earlier launch", false)), "s", t0 + Duration::from_secs(2));
        peer.observe(None, "s", t0 + Duration::from_secs(2));
        assert_eq!((peer.beat.clone(), peer.changed_at), (None, t0));
    }

    #[test]
    fn a_rank_that_ended_normally_is_never_lost_and_i_am_never_lost() {
        let t0 = Instant::now();
        let mut peers = vec![Peer::new(t0), Peer::new(t0)];
        peers[1].observe(Some(beat(3, "s", true)), "s", t0);
        assert!(lost(&peers, 0, T, t0 + Duration::from_secs(60)).is_empty());
        assert_eq!(lost(&peers, 1, T, t0 + Duration::from_secs(60)).iter().map(|l| l.rank).collect::<Vec<_>>(), [0]);
    }

    #[test]
    fn the_lowest_rank_still_beating_records_the_loss() {
        let l = |rank| Lost { rank, node: String::new(), pid: 0, step: None, silent: T };
        assert_eq!(recorder(&[l(1)], 2), Some(0));
        assert_eq!(recorder(&[l(0)], 2), Some(1), "rank 0 lost: rank 1 writes its records");
        assert_eq!(recorder(&[l(0), l(1)], 4), Some(2));
        assert_eq!(recorder(&[l(0), l(1)], 2), None);
    }

    #[test]
    fn beats_are_a_tenth_of_the_timeout_within_bounds() {
        assert_eq!(beat_interval(Duration::from_secs(3)), Duration::from_millis(300));
        assert_eq!(beat_interval(Duration::from_secs(1)), Duration::from_millis(100));
        assert_eq!(beat_interval(Duration::from_millis(200)), Duration::from_millis(100));
        assert_eq!(beat_interval(Duration::from_secs(180)), Duration::from_secs(5));
    }

    /// Rank `rank` of two beating in `<run>/ranks`, on node `n<rank>`, lost after 1 s.
    fn one_of_two(run: &Path, rank: usize) -> WatchSetup {
        one_of(run, rank, 2, &format!("n{rank}"))
    }

    /// Rank `rank` of `size` on `node`, in a launch of the test's own (the
    /// node-local folders are per launch, and tests run side by side).
    fn one_of(run: &Path, rank: usize, size: usize, node: &str) -> WatchSetup {
        WatchSetup {
            dir: run.join(RANKS_DIR),
            rank,
            size,
            node: node.into(),
            session: run.display().to_string(),
            timeout: Duration::from_millis(1000),
        }
    }

    /// Rank `rank`'s newest beat in the nodes' files of the run `run`.
    fn world_beat(run: &Path, rank: usize) -> Option<RankBeat> {
        read_world(&run.join(RANKS_DIR), &run.display().to_string(), 8).swap_remove(rank)
    }

    #[test]
    fn two_watches_see_each_other_and_a_silent_one_is_reported_once() {
        let tmp = tempfile::tempdir().unwrap();
        let setup = |rank| one_of_two(tmp.path(), rank);
        let (tx, rx) = std::sync::mpsc::channel();
        let tx2 = tx.clone();
        let w0 = RankWatch::start(setup(0), Box::new(move |l| tx.send((0, l)).unwrap())).unwrap();
        let w1 = RankWatch::start(setup(1), Box::new(move |l| tx2.send((1, l)).unwrap())).unwrap();
        w1.pulse().at_step(5);
        // Rank 1's beats carry its step once its next beat is written.
        let t0 = std::time::Instant::now();
        while world_beat(tmp.path(), 1).and_then(|b| b.step) != Some(5) {
            assert!(t0.elapsed() < Duration::from_secs(20), "rank 1's beat never carried step 5");
            std::thread::sleep(Duration::from_millis(10));
        }
        // For longer than the timeout both beat: nobody is lost.
        std::thread::sleep(Duration::from_millis(1500));
        assert!(rx.try_recv().is_err(), "both beat: nobody is lost");
        // Rank 1 stops beating without ending normally.
        drop(w1);
        let (who, lost) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!((who, lost.len(), lost[0].rank, lost[0].step), (0, 1, 1, Some(5)));
        assert!(lost[0].silent > Duration::from_millis(1000));
        assert!(rx.recv_timeout(Duration::from_millis(500)).is_err(), "once");
        w0.finish();
    }

    /// Ranks 0 and 1 of two watching each other over `dir`, each handler
    /// sending what it found to its receiver.
    #[allow(clippy::type_complexity)]
    fn two_watches(dir: &Path) -> (RankWatch, Receiver<Vec<Lost>>, RankWatch, Receiver<Vec<Lost>>) {
        let (tx0, rx0) = std::sync::mpsc::channel();
        let (tx1, rx1) = std::sync::mpsc::channel();
        let w0 = RankWatch::start(one_of_two(dir, 0), Box::new(move |l| tx0.send(l).unwrap())).unwrap();
        let w1 = RankWatch::start(one_of_two(dir, 1), Box::new(move |l| tx1.send(l).unwrap())).unwrap();
        (w0, rx0, w1, rx1)
    }

    #[test]
    fn a_rank_that_finishes_is_not_reported() {
        let tmp = tempfile::tempdir().unwrap();
        let (w0, rx, w1, rx1) = two_watches(tmp.path());
        // The scenario: both run a while (a few beats) before rank 1 finishes.
        std::thread::sleep(Duration::from_millis(300));
        assert!(rx1.try_recv().is_err(), "rank 0 beats: rank 1 finds nobody lost");
        w1.finish();
        assert!(world_beat(tmp.path(), 1).unwrap().done, "the node's writer said done in its file at once");
        assert!(rx.recv_timeout(Duration::from_millis(2000)).is_err(), "a finished rank is not lost");
        w0.finish();
    }

    #[test]
    fn ranks_of_one_node_ending_together_all_say_done_in_its_file() {
        // Each ending rank writes its node's file from the beats it read: two
        // at once once overwrote a `done` with a copy read a moment before,
        // and with both gone nobody wrote it again (the wide drill's end
        // wait found ranks 11 and 13 of 16 silent). Four ranks a node ending
        // at the same moment, twenty times.
        for round in 0..20 {
            let tmp = tempfile::tempdir().unwrap();
            let start =
                |rank, node: &str| RankWatch::start(one_of(tmp.path(), rank, 5, node), Box::new(|_| ())).unwrap();
            let w0 = start(0, "a");
            let on_b: Vec<RankWatch> = (1..5).map(|r| start(r, "b")).collect();
            let gate = Arc::new(std::sync::Barrier::new(on_b.len()));
            let ending: Vec<_> = on_b
                .into_iter()
                .map(|w| {
                    let gate = Arc::clone(&gate);
                    std::thread::spawn(move || {
                        gate.wait();
                        w.finish();
                    })
                })
                .collect();
            for t in ending {
                t.join().unwrap();
            }
            let world = read_world(&tmp.path().join(RANKS_DIR), &tmp.path().display().to_string(), 5);
            let not_done: Vec<usize> = (1..5).filter(|r| !world[*r].as_ref().is_some_and(|b| b.done)).collect();
            assert!(not_done.is_empty(), "round {round}: ranks {not_done:?} ended but node b's file does not say so");
            w0.finish();
        }
    }

    #[test]
    fn a_rank_marked_done_says_so_and_still_watches_the_others() {
        let tmp = tempfile::tempdir().unwrap();
        let (w0, rx, w1, rx1) = two_watches(tmp.path());
        w0.mark_done();
        let t0 = std::time::Instant::now();
        while !world_beat(tmp.path(), 0).is_some_and(|b| b.done) {
            assert!(t0.elapsed() < Duration::from_secs(20), "rank 0's beats never said done");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(rx1.try_recv().is_err(), "a done rank is never called lost");
        drop(w1);
        let lost = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(lost.iter().map(|l| l.rank).collect::<Vec<_>>(), [1], "a done rank still finds the lost one");
        w0.finish();
    }

    #[test]
    fn the_leader_at_the_end_waits_for_every_rank_to_say_done() {
        let tmp = tempfile::tempdir().unwrap();
        let (w0, _rx0, w1, _rx1) = two_watches(tmp.path());
        let follower = std::thread::spawn(move || {
            // The scenario: the follower ends after the leader began to wait.
            std::thread::sleep(Duration::from_millis(300));
            w1.finish();
        });
        let (tx, rx) = std::sync::mpsc::channel();
        let left = w0.finish_with_world(Box::new(move |l| tx.send(l).unwrap()));
        follower.join().unwrap();
        assert!(left.is_empty(), "rank 1 said done: {left:?}");
        assert!(rx.try_recv().is_err(), "nobody was lost");
    }

    #[test]
    fn a_rank_frozen_after_the_end_is_found_and_the_end_handler_runs() {
        let tmp = tempfile::tempdir().unwrap();
        let (w0, _rx0, w1, _rx1) = two_watches(tmp.path());
        // Rank 1 stops beating without saying done (a frozen node).
        drop(w1);
        let (tx, rx) = std::sync::mpsc::channel();
        let left = w0.finish_with_world(Box::new(move |l| tx.send(l).unwrap()));
        let lost = rx.recv_timeout(Duration::from_secs(10)).expect("the end handler ran");
        assert_eq!(lost.iter().map(|l| l.rank).collect::<Vec<_>>(), [1]);
        assert_eq!(left, [1]);
    }

    /// Ranks 0 on node a, 1 and 2 on node b: rank 1 writes b's file, rank 1
    /// is the deputy (the lowest rank off rank 0's node).
    #[allow(clippy::type_complexity)]
    fn three(run: &Path) -> Vec<(Option<RankWatch>, Receiver<Vec<Lost>>)> {
        [(0, "a"), (1, "b"), (2, "b")]
            .into_iter()
            .map(|(rank, node)| {
                let (tx, rx) = std::sync::mpsc::channel();
                let w = RankWatch::start(one_of(run, rank, 3, node), Box::new(move |l| tx.send(l).unwrap())).unwrap();
                (Some(w), rx)
            })
            .collect()
    }

    fn named(rx: &Receiver<Vec<Lost>>) -> Vec<usize> {
        rx.recv_timeout(Duration::from_secs(8)).expect("a verdict").iter().map(|l| l.rank).collect()
    }

    #[test]
    fn a_frozen_rank_that_is_not_its_nodes_writer_is_named_by_the_sweepers_and_every_rank_hears_it() {
        let tmp = tempfile::tempdir().unwrap();
        let mut world = three(tmp.path());
        // The scenario: longer than the timeout passes while all beat.
        std::thread::sleep(Duration::from_millis(1500));
        assert!(world.iter().all(|(_, rx)| rx.try_recv().is_err()), "all beat: nobody is lost");
        world[2].0.take().unwrap().stop_beating();
        assert_eq!(named(&world[0].1), [2], "rank 0 sweeps");
        assert_eq!(named(&world[1].1), [2], "rank 1 hears it (or finds it: it is the deputy)");
    }

    #[test]
    fn a_frozen_writer_is_replaced_by_its_nodes_next_rank_and_alone_named_lost() {
        let tmp = tempfile::tempdir().unwrap();
        let mut world = three(tmp.path());
        // The scenario: the world runs past the timeout before b's writer freezes.
        std::thread::sleep(Duration::from_millis(1500));
        world[1].0.take().unwrap().stop_beating();
        assert_eq!(named(&world[0].1), [1], "rank 2 took b's file over: only rank 1 is silent");
        assert_eq!(named(&world[2].1), [1], "rank 2 hears the verdict through its node's folder");
    }

    #[test]
    fn a_frozen_rank_0_is_found_by_the_deputy_and_every_other_rank_hears_it() {
        let tmp = tempfile::tempdir().unwrap();
        let mut world = three(tmp.path());
        // The deputy learns it is one from rank 0's first sweeps.
        let t0 = Instant::now();
        while !std::fs::read_to_string(tmp.path().join(RANKS_DIR).join(WATCH_FILE))
            .is_ok_and(|t| t.contains("\"deputy\":1"))
        {
            assert!(t0.elapsed() < Duration::from_secs(10), "rank 0 never named a deputy");
            std::thread::sleep(Duration::from_millis(20));
        }
        // ... through node b's folder, where b's writer copies the naming
        // (rank 1 reads it there at its next look): wait for the copy.
        let b = local_dir("b", &tmp.path().display().to_string()).expect("node-local storage").join(WATCH_FILE);
        while !std::fs::read_to_string(&b).is_ok_and(|t| t.contains("\"deputy\":1")) {
            assert!(t0.elapsed() < Duration::from_secs(20), "node b's folder never heard of the deputy");
            std::thread::sleep(Duration::from_millis(20));
        }
        world[0].0.take().unwrap().stop_beating();
        assert_eq!(named(&world[1].1), [0], "the deputy sweeps");
        assert_eq!(named(&world[2].1), [0], "rank 2 hears it");
        let record: LostRecord =
            serde_json::from_slice(&std::fs::read(tmp.path().join(RANKS_DIR).join(LOST_FILE)).unwrap()).unwrap();
        assert_eq!((record.by, record.lost.len()), (1, 1), "{record:?}");
    }

    #[test]
    fn a_rank_0_lost_before_it_named_a_deputy_is_still_found() {
        let tmp = tempfile::tempdir().unwrap();
        let mut world = three(tmp.path());
        // At once: rank 0 never sweeps, so never names a deputy.
        world[0].0.take().unwrap().stop_beating();
        assert_eq!(named(&world[1].1), [0], "node b's writer sweeps while no deputy is named");
        assert_eq!(named(&world[2].1), [0], "rank 2 hears it");
    }

    #[test]
    fn the_shared_filesystem_sees_the_nodes_files_not_a_file_a_rank() {
        let tmp = tempfile::tempdir().unwrap();
        let world = three(tmp.path());
        // Wait until both nodes' files and rank 0's sweep record are there
        // (a product writing a file a rank would have written them by then).
        let shared = tmp.path().join(RANKS_DIR);
        let t0 = Instant::now();
        while !["node-a.json", "node-b.json", WATCH_FILE].iter().all(|f| shared.join(f).is_file()) {
            assert!(t0.elapsed() < Duration::from_secs(20), "the nodes' files never appeared");
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut names: Vec<String> = std::fs::read_dir(tmp.path().join(RANKS_DIR))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with('.'))
            .collect();
        names.sort();
        assert_eq!(names, ["node-a.json", "node-b.json", "watch.json"]);
        for (w, _) in world {
            w.unwrap().finish();
        }
    }
}
