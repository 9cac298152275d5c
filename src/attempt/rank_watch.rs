//! Lost ranks: a rank of a data-parallel run that stops without dying
//! (SIGSTOP, a node frozen by its hypervisor, storage that stalls forever)
//! or dies without its launcher noticing holds every other rank in the next
//! collective, where MPI waits forever. Every rank therefore runs a
//! [`RankWatch`] thread that
//!
//! - rewrites its own heartbeat file, `<run dir>/ranks/rank-<r>.json`
//!   ([`RankBeat`]), every [`beat_interval`] (a tenth of `[distributed]
//!   timeout`), with a growing `seq` and the last step it completed, and
//! - reads every other rank's, and calls a rank *lost* when its `seq` has not
//!   changed for `[distributed] timeout` by this rank's own clock ([`lost`]:
//!   no clocks are compared across nodes).
//!
//! The files are on the run directory's storage, which every rank must share
//! anyway (followers read the checkpoints there): no socket protocol of our
//! own, no second channel through MPI (which is the thing that hangs). The
//! heartbeat is written by its own thread, so a long save or a slow step
//! does not look like a loss; a thread stuck inside a live process is the
//! watchdog's business (`watchdog.rs`).
//!
//! When ranks are lost, the handler given to the watch runs once, on the
//! watch's thread: the lowest-numbered rank still beating ([`recorder`])
//! records `rank_lost` (rank 0 while it lives, else a follower: rank 0's
//! records are then written by rank 1; `attempt/lost.rs`), and every
//! survivor ends its part of the world: `run`'s ranks abort the MPI world
//! (`MPI_Abort`), so the launcher ends every rank, the stopped ones
//! included; `exec`'s supervisors end their programs (`exec/world.rs`). A
//! rank that ends normally writes a last beat with `done` and is never
//! called lost; a beat of another launch (its `session`) is no beat. A
//! supervisor whose program ended says `done` from then on
//! ([`RankWatch::mark_done`]) and goes on watching the others.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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
        if self.beat.as_ref().is_none_or(|old| old.seq != beat.seq || old.done != beat.done) {
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
    /// Where the beats are, whose, and how long silence may last: what
    /// [`finish_with_world`](RankWatch::finish_with_world) reads.
    dir: PathBuf,
    rank: usize,
    size: usize,
    session: String,
    timeout: Duration,
}

impl RankWatch {
    /// Writes this rank's first beat (so the others see it from their first
    /// look) and starts the thread.
    pub fn start(setup: WatchSetup, handler: LostHandler) -> std::io::Result<RankWatch> {
        std::fs::create_dir_all(&setup.dir)?;
        // Never a link to elsewhere (crate::confine).
        crate::confine::own_dir(&setup.dir)?;
        let pulse = Pulse::default();
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicBool::new(false));
        let handler = Arc::new(Mutex::new(Some(handler)));
        let (dir, rank, size, session, timeout) =
            (setup.dir.clone(), setup.rank, setup.size, setup.session.clone(), setup.timeout);
        let mut beater = Beater { setup, seq: 0, pulse: pulse.clone(), done: Arc::clone(&done) };
        beater.beat();
        let thread = {
            let (stop, done, handler) = (Arc::clone(&stop), Arc::clone(&done), Arc::clone(&handler));
            std::thread::Builder::new().name("rekindle-rank-watch".into()).spawn(move || {
                beater.run(&stop, &handler);
                if done.load(Ordering::SeqCst) {
                    beater.beat();
                }
            })?
        };
        Ok(RankWatch { pulse, stop, done, handler, thread: Some(thread), dir, rank, size, session, timeout })
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
        // Each rank's beat is read until it says done, once a beat: the
        // end costs each rank's file about one read, not N reads a poll.
        let said_done = |r: &usize| read_beat(&self.dir, *r).is_some_and(|b| b.session == self.session && b.done);
        let mut left: Vec<usize> = (0..self.size).filter(|r| *r != self.rank && !said_done(r)).collect();
        // Until every rank said done, the deadline, or a rank was found lost
        // (the handler was taken: it ends the world).
        while !left.is_empty() && Instant::now() < until && !self.handler_running() {
            std::thread::sleep(beat_interval(self.timeout));
            left.retain(|r| !said_done(r));
        }
        if !left.is_empty() {
            tracing::warn!(ranks = ?left, "ranks still running after the world's end; the launcher ends them");
        }
        self.finish();
        left
    }

    /// This rank ended its run normally: a last beat says `done`, so no
    /// other rank calls it lost while it exits.
    pub fn finish(mut self) {
        self.done.store(true, Ordering::SeqCst);
        self.halt();
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
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
}

impl Beater {
    fn run(&mut self, stop: &AtomicBool, handler: &Mutex<Option<LostHandler>>) {
        let interval = beat_interval(self.setup.timeout);
        let started = Instant::now();
        let mut peers = vec![Peer::new(started); self.setup.size];
        while !stop.load(Ordering::SeqCst) {
            std::thread::sleep(interval);
            if stop.load(Ordering::SeqCst) {
                return;
            }
            self.beat();
            let now = Instant::now();
            for (rank, peer) in peers.iter_mut().enumerate() {
                if rank != self.setup.rank {
                    peer.observe(read_beat(&self.setup.dir, rank), &self.setup.session, now);
                }
            }
            let lost = lost(&peers, self.setup.rank, self.setup.timeout, now);
            if lost.is_empty() {
                continue;
            }
            let taken = handler.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(handle) = taken {
                handle(lost);
            }
            return;
        }
    }

    fn beat(&mut self) {
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
        if let Err(e) = write_beat(&self.setup.dir, &beat) {
            // Not fatal here: if it lasts, the others call this rank lost,
            // which is what a rank cut off from the run directory is.
            tracing::warn!(error = %e, dir = %self.setup.dir.display(), "cannot write this rank's heartbeat");
        }
    }
}

/// Writes `beat` as `<dir>/rank-<r>.json`, through a rename so a reader
/// never sees half a file. Not synced: a beat is worth nothing after a crash
/// of the node that wrote it.
fn write_beat(dir: &Path, beat: &RankBeat) -> std::io::Result<()> {
    let path = dir.join(rank_beat_file(beat.rank));
    let tmp = dir.join(format!(".{}.tmp", rank_beat_file(beat.rank)));
    // Through a JSON value: keys in alphabetical order, as in every file.
    let value = serde_json::to_value(beat).map_err(std::io::Error::other)?;
    let bytes = serde_json::to_vec(&value).map_err(std::io::Error::other)?;
    // A fresh file (O_EXCL never follows a link left by that name).
    let _ = std::fs::remove_file(&tmp);
    std::io::Write::write_all(&mut std::fs::File::options().write(true).create_new(true).open(&tmp)?, &bytes)?;
    std::fs::rename(&tmp, &path)
}

/// Rank `rank`'s beat in `dir`, if it can be read.
pub fn read_beat(dir: &Path, rank: usize) -> Option<RankBeat> {
    // Bounded and never through a link (crate::confine): beats are ~200 bytes.
    serde_json::from_slice(&crate::confine::read_bounded(&dir.join(rank_beat_file(rank)), 64 << 10).ok()?).ok()
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
    fn beat_file_keys_are_alphabetical_and_it_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let written = beat(3, "s", false);
        write_beat(dir.path(), &written).unwrap();
        let text = std::fs::read_to_string(dir.path().join(rank_beat_file(1))).unwrap();
        assert_eq!(crate::telemetry::first_unsorted_key(&text), None, "{text}");
        assert_eq!(read_beat(dir.path(), 1), Some(written));
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
        WatchSetup {
            dir: run.join(RANKS_DIR),
            rank,
            size: 2,
            node: format!("n{rank}"),
            session: "s".into(),
            timeout: Duration::from_millis(1000),
        }
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
        while read_beat(&tmp.path().join(RANKS_DIR), 1).and_then(|b| b.step) != Some(5) {
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
        std::thread::sleep(Duration::from_millis(300));
        assert!(rx1.try_recv().is_err(), "rank 0 beats: rank 1 finds nobody lost");
        w1.finish();
        assert!(read_beat(&tmp.path().join(RANKS_DIR), 1).unwrap().done);
        assert!(rx.recv_timeout(Duration::from_millis(2000)).is_err(), "a finished rank is not lost");
        w0.finish();
    }

    #[test]
    fn a_rank_marked_done_says_so_and_still_watches_the_others() {
        let tmp = tempfile::tempdir().unwrap();
        let (w0, rx, w1, rx1) = two_watches(tmp.path());
        w0.mark_done();
        let t0 = std::time::Instant::now();
        while !read_beat(&tmp.path().join(RANKS_DIR), 0).is_some_and(|b| b.done) {
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
}
