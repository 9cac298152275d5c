//! The run-directory lock: two live runs must never write the same run
//! directory, and a lock left behind by a dead process or node must not block
//! a requeued job forever.
//!
//! `flock` is not enough on NFS-like shared filesystems, so the lock is a file,
//! `<run dir>/rekindle.lock`, holding JSON ([`LockInfo`]): an owner token, the
//! SLURM job id, restart count and step, the host (SLURM node name, else the
//! host name), the pid with its start time and the kernel's boot id, the
//! heartbeat, the holder's stale timeout, and a lineage and generation that
//! name the file's versions (below).
//!
//! # Who may take a lock over ([`takeover`], a pure function)
//!
//! Only a holder that is provably gone:
//! - **same host**: its process is gone: no process has its pid, or the one
//!   that has it started at another time or in another boot (a reused pid).
//!   A live process is never taken over, whatever its job id: two tasks of one
//!   job, or a second run inside the same allocation, are refused.
//! - **other host**: its heartbeat is stale: older than the stale timeout by
//!   this node's clock, *or* not changed for the stale timeout while this
//!   process watched it (by its own monotonic clock, so a holder whose clock
//!   runs ahead of ours is still judged). The timeout is the longer of this
//!   run's `[lock] stale_after` and the one the holder recorded.
//! - **an earlier attempt of this job on another node** (same job id, lower
//!   restart count) whose heartbeat is fresh: SLURM requeued the job because it
//!   lost that node, which may still be running it (a network partition).
//!   [`RunLock::acquire`] waits, at most the stale timeout and polling about
//!   every second, for the heartbeat to go stale; if it moves instead, the
//!   holder is alive and the attempt is refused ([`LockError::HolderAlive`]).
//! - anything else live is refused at once ([`LockError::Held`]).
//!
//! An unreadable lock file (never written torn by this module: see below) is
//! taken over once it has not changed for the stale timeout.
//!
//! # Changing the file: one transition per generation marker
//!
//! The file is created whole or not at all: a complete temporary file is
//! hard-linked to the name (`link` fails if the name exists, atomically, on
//! NFS too). Every later change (a takeover, a heartbeat, the release) is a
//! *transition* from the exact bytes just read, of lineage `L` and generation
//! `g`, made under a marker file `rekindle.lock.takeover.<L>.<g>.<n>`:
//!
//! 1. read the lock (bytes `C`, lineage `L`, generation `g`) and decide;
//! 2. list the markers of `(L, g)`. None: `n = 0`. Otherwise take the highest,
//!    `m`: if this process has seen it unchanged for [`marker_break_after`]
//!    (a third of the stale timeout; its maker crashed inside a transition,
//!    which otherwise takes milliseconds), `n = m + 1`; else the lock is busy:
//!    retry shortly (a heartbeat skips to the next check);
//! 3. create marker `(L, g, n)` exclusively (hard link of a complete file);
//!    if it exists, another process won this round: busy;
//! 4. under the marker, re-read the lock: if it is not byte-identical to `C`,
//!    the lock moved on: abort. If a marker `(L, g, n')` with `n' > n`
//!    exists, this process was judged crashed: abort. Otherwise write the new
//!    content (generation `g + 1`) through a temporary file and `rename`, or
//!    remove the file (release);
//! 5. remove the markers of `(L, ≤ g)`: their generation is past.
//!
//! Why exactly one contender wins: exclusive creation admits one process per
//! marker name; a marker of `(L, g)` is needed to change a lock of generation
//! `g`; and a marker holder writes only if the lock still holds `C`, while
//! every write changes the bytes (a new generation, and a new token or
//! heartbeat). Two holders of markers of the same `(L, g)` exist only if one
//! was judged crashed after sitting on its marker for [`marker_break_after`];
//! it re-checks for a higher marker right before writing, so it must also
//! freeze in that last instant: the one case no timeout-based lock can rule
//! out. A marker left by a crashed process costs a wait of
//! [`marker_break_after`], never a second winner: breaking it means creating
//! the *next* name exclusively, not deleting it (two breakers race on the same
//! new name, and one wins), and markers are only removed once their
//! generation is past (or by their maker when it aborts). Markers of a
//! previous lineage (before a release) never match the names of the current
//! one. On NFS the exclusive creation and the lock file's content are
//! server-side facts, but directory listings (used to find the highest
//! marker) may be cached for a moment; a second winner would need such a
//! stale listing exactly while a crashed marker is being broken.
//!
//! The holder's heartbeat thread reads the lock every [`check_every`] (at most
//! 1 s): a token not ours means the lock was taken over, and the run stops
//! writing at once (the lost flag, polled by training, and
//! [`LockOwnership::confirm`], called by the checkpoint store right before each
//! commit). It rewrites the heartbeat every [`heartbeat_every`] (a sixth of
//! the stale timeout, at most 10 s) as a transition. Decisions are pure
//! functions ([`takeover`], [`unreadable`], in `takeover.rs`); the I/O
//! around them, here, is thin.

use std::ffi::OsStr;
use std::io::{ErrorKind, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sha2::Digest;

use crate::slurm::SlurmEnv;

use crate::confine::{Dir, TempFile};
#[cfg(test)]
use liveness::pid_alive;
use liveness::{boot_id, holder_alive, proc_start};

mod liveness;
mod takeover;
#[cfg(test)]
mod tests;

pub use takeover::{Claimant, Verdict, check_every, heartbeat_every, marker_break_after, takeover, unreadable};

pub const LOCK_FILE: &str = "rekindle.lock";
/// Markers are named `<this><lineage>.<generation>.<n>`.
const MARKER_PREFIX: &str = "rekindle.lock.takeover.";
/// The stale timeout when the config does not set `[lock] stale_after`.
pub const DEFAULT_STALE_AFTER: Duration = Duration::from_secs(60);
/// How often a contender retries a busy marker.
const BUSY_RETRY: Duration = Duration::from_millis(50);
/// How long the release at exit tries before leaving the lock to go stale.
const RELEASE_TRIES_FOR: Duration = Duration::from_secs(2);

/// Errors taking the lock.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error(
        "run directory {dir} is in use by pid {pid} on {host} (job {job}), heartbeat {age_s:.0}s ago; \
         two runs must not share a run directory: wait for it to end, use another --run-dir, \
         or remove {lock} if you are sure it is dead"
    )]
    Held { dir: PathBuf, lock: PathBuf, pid: u32, host: String, job: String, age_s: f64 },
    #[error(
        "run directory {dir} is held by an earlier attempt of this job (job {job}) on {host} (pid {pid}), and its \
         heartbeat moved while this attempt waited {waited_s:.0}s for it to go stale: that attempt is still running \
         (SLURM requeued the job while it could not reach that node). Two attempts must not write one run directory, \
         so this one exits: end the other one on {host}, or remove {lock} if you are sure it is dead, then run again"
    )]
    HolderAlive { dir: PathBuf, lock: PathBuf, pid: u32, host: String, job: String, waited_s: f64 },
    #[error(
        "gave up taking the lock of run directory {dir} after {waited_s:.0}s: {why}; \
         check which processes use it (see {lock}), then run again"
    )]
    GaveUp { dir: PathBuf, lock: PathBuf, waited_s: f64, why: String },
    #[error("cannot read or write lock file {path}: {source}; check that the run directory is writable")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{reason} (the run-directory lock is a regular file that only rekindle writes)")]
    NotALock { path: PathBuf, reason: String },
}

/// Why a held lock is not confirmed as ours ([`LockOwnership::confirm`]).
#[derive(Debug, thiserror::Error)]
pub enum OwnershipError {
    #[error("the run-directory lock {path} was lost earlier")]
    LostEarlier { path: PathBuf },
    /// Cannot prove ownership, but nothing says it was lost.
    #[error("cannot read the run-directory lock {path}: {source}")]
    Unreadable { path: PathBuf, source: std::io::Error },
    #[error("the run-directory lock {path} now belongs to pid {pid} on {host} (job {})", job_id.as_deref().unwrap_or("none"))]
    TakenOver { path: PathBuf, pid: u32, host: String, job_id: Option<String> },
    #[error("the run-directory lock {path} is gone or unreadable")]
    Gone { path: PathBuf },
}

/// The content of the lock file. Fields after `started` were added later:
/// lock files without them still read.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LockInfo {
    pub token: String,
    pub job_id: Option<String>,
    pub host: String,
    pub pid: u32,
    /// Unix seconds (float) of the last heartbeat, by the holder's clock.
    pub heartbeat: f64,
    pub started: f64,
    /// `SLURM_RESTART_COUNT` of the holder: which attempt of the job it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_count: Option<u32>,
    /// The SLURM job step the holder runs in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_id: Option<String>,
    /// The kernel's boot id on the holder's host (a reboot ends every process).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    /// The holder process's start time (clock ticks since boot), which tells
    /// it apart from a later process that reuses its pid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proc_start: Option<u64>,
    /// The holder's stale timeout in seconds; a contender waits at least this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stale_after_s: Option<f64>,
    /// Names the file's life from its creation to its release; kept across
    /// takeovers and heartbeats (marker names start with it).
    #[serde(default)]
    pub lineage: String,
    /// Counts the changes of the file within its lineage.
    #[serde(default)]
    pub generation: u64,
}

impl LockInfo {
    /// Parses a lock file; `None` when it is not a lock (damaged, foreign,
    /// anything else), never a panic.
    pub fn parse(bytes: &[u8]) -> Option<LockInfo> {
        serde_json::from_slice(bytes).ok()
    }

    /// Reads and parses the lock file at `path`; `None` when missing or not a lock.
    pub fn read(path: &Path) -> Option<LockInfo> {
        LockInfo::parse(&read_if_exists(path).ok()??)
    }

    /// The file's bytes: pretty JSON, keys in alphabetical order (through a
    /// JSON value, whose map is sorted; readers take any order).
    fn to_bytes(&self) -> Vec<u8> {
        let value = serde_json::to_value(self).expect("lock serialises");
        serde_json::to_vec_pretty(&value).expect("lock serialises")
    }
}

/// What a run asks the lock for.
#[derive(Debug, Clone)]
pub struct LockRequest {
    pub job_id: Option<String>,
    pub host: String,
    pub restart_count: u32,
    pub step_id: Option<String>,
    pub stale_after: Duration,
    /// Nodes the batch shell excluded from this allocation's steps (lost).
    pub excluded: Vec<String>,
}

impl LockRequest {
    /// The request of this process inside the allocation `slurm` describes.
    pub fn for_allocation(slurm: &SlurmEnv, stale_after: Duration) -> LockRequest {
        LockRequest {
            job_id: slurm.control_id(),
            host: slurm.node_name(),
            restart_count: slurm.restart_count,
            step_id: slurm.step_id.clone(),
            stale_after,
            excluded: crate::slurm::injob::InJobOffer::from_process().map(|o| o.excluded).unwrap_or_default(),
        }
    }

    /// The lock file this request writes: a new token (host, pid, start
    /// time) and a lineage named after it, generation 0.
    fn lock_info(&self) -> LockInfo {
        let started_at = unix_now();
        let pid = std::process::id();
        let token = format!("{}-{pid}-{:.9}", self.host, started_at);
        LockInfo {
            token: token.clone(),
            job_id: self.job_id.clone(),
            host: self.host.clone(),
            pid,
            heartbeat: started_at,
            started: started_at,
            restart_count: Some(self.restart_count),
            step_id: self.step_id.clone(),
            boot_id: boot_id(),
            proc_start: proc_start(pid),
            stale_after_s: Some(self.stale_after.as_secs_f64()),
            lineage: short_hash(&token),
            generation: 0,
        }
    }
}

/// Seconds since the Unix epoch (the lock's heartbeat clock).
pub(crate) fn unix_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// A short, filename-safe hash of `text`.
fn short_hash(text: &str) -> String {
    hex::encode(&sha2::Sha256::digest(text.as_bytes())[..6])
}

// Every change of the lock and its markers goes through a handle of the
// lock's directory (`Dir::open_parent`): created `O_EXCL`, linked, listed,
// read and removed relative to it, never through a link
// (docs/run-directory.md, Trust boundaries).

/// Creates `path` with `bytes`, whole, only if it does not exist: a complete
/// temporary file is hard-linked to the name. Returns false when it exists.
fn create_exclusive(path: &Path, bytes: &[u8]) -> std::io::Result<bool> {
    let (dir, name) = Dir::open_parent(path)?;
    create_exclusive_in(&dir, &name, bytes)
}

/// [`create_exclusive`] of `name` in `dir`.
fn create_exclusive_in(dir: &Dir, name: &OsStr, bytes: &[u8]) -> std::io::Result<bool> {
    let mut tmp = TempFile::new_in(dir, ".rekindle-lock-")?;
    tmp.write_all(bytes)?;
    tmp.file.sync_all()?;
    let linked = dir.hard_link(tmp.name(), name);
    // NFS may report a failure for a link that was made (a lost reply, the
    // retried call then finding the name taken: by this very link): the
    // temporary file's link count tells, whatever `link` said (open(2)).
    let made = match linked {
        Ok(()) => true,
        Err(e) => match dir.symlink_metadata(tmp.name()) {
            Ok(meta) if meta.nlink() == 2 => true,
            _ if e.kind() == ErrorKind::AlreadyExists => false,
            _ => return Err(e),
        },
    };
    // The temporary name goes (dropped), the link stays.
    drop(tmp);
    if made {
        dir.sync()?;
    }
    Ok(made)
}

/// The lock file's bytes, `None` when there is none. Only a regular file of
/// at most [`MAX_LOCK_BYTES`] is a lock: a symlink (dangling or not), a FIFO
/// or a device in its place is an error, never followed, blocked on or read
/// without end (`crate::confine`).
fn read_if_exists(path: &Path) -> std::io::Result<Option<Vec<u8>>> {
    match Dir::open_parent(path) {
        Ok((dir, name)) => read_in(&dir, name),
        // No directory, no lock.
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// [`read_if_exists`] of `name` in `dir`.
fn read_in(dir: &Dir, name: impl AsRef<Path>) -> std::io::Result<Option<Vec<u8>>> {
    match dir.read_bounded(name, MAX_LOCK_BYTES) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// The largest lock file read: they are a few hundred bytes.
pub const MAX_LOCK_BYTES: u64 = 64 << 10;

/// The marker names of one lineage in the lock's directory, as
/// `(generation, n, name)`.
fn markers_in(dir: &Dir, lineage: &str) -> std::io::Result<Vec<(u64, u64, String)>> {
    let prefix = format!("{MARKER_PREFIX}{lineage}.");
    let mut out = Vec::new();
    for entry in dir.entries("")? {
        let Some(name) = entry.name.to_str() else { continue };
        let Some(rest) = name.strip_prefix(&prefix) else { continue };
        let Some((g, n)) = rest.split_once('.') else { continue };
        if let (Ok(g), Ok(n)) = (g.parse(), n.parse()) {
            out.push((g, n, name.to_string()));
        }
    }
    Ok(out)
}

/// The marker name of `(lineage, generation, n)`.
fn marker_name(lineage: &str, generation: u64, n: u64) -> String {
    format!("{MARKER_PREFIX}{lineage}.{generation}.{n}")
}

/// Which marker this process has watched, with its bytes and since when.
#[derive(Debug, Default)]
struct MarkerWatch {
    seen: Option<(PathBuf, Vec<u8>, Instant)>,
}

impl MarkerWatch {
    /// True once `path` has held `bytes` for `limit` as this process watched it.
    fn stale(&mut self, path: &Path, bytes: &[u8], limit: Duration) -> bool {
        match &self.seen {
            Some((p, b, since)) if p == path && b == bytes => since.elapsed() >= limit,
            _ => {
                self.seen = Some((path.to_path_buf(), bytes.to_vec(), Instant::now()));
                limit.is_zero()
            }
        }
    }
}

/// What a transition does to the lock file.
enum Change {
    /// Replace it with this content (its lineage and generation are set).
    Write(Box<LockInfo>),
    /// Remove it.
    Remove,
}

/// How a transition ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Done,
    /// Another process is changing the lock (or this one was judged crashed): retry.
    Busy,
    /// The lock no longer holds the bytes the decision was made on.
    Changed,
}

/// One transition of the lock file at `path` from `expected` (as read, with
/// lineage and generation `from`) to `change`, under a generation marker;
/// see the module header.
fn transition(
    path: &Path,
    expected: &[u8],
    from: (&str, u64),
    change: Change,
    marker_owner: &str,
    watch: &mut MarkerWatch,
    stale_after: Duration,
) -> std::io::Result<Step> {
    let (dir, name) = Dir::open_parent(path)?;
    let (lineage, generation) = from;
    let current: Vec<(u64, String)> =
        markers_in(&dir, lineage)?.into_iter().filter(|(g, _, _)| *g == generation).map(|(_, n, m)| (n, m)).collect();
    let n = match current.iter().max_by_key(|(n, _)| *n) {
        None => 0,
        Some((m, marker)) => {
            let Some(bytes) = read_in(&dir, marker)? else { return Ok(Step::Busy) };
            if !watch.stale(&dir.shown(marker), &bytes, marker_break_after(stale_after)) {
                return Ok(Step::Busy);
            }
            tracing::warn!(marker = %dir.shown(marker).display(), "breaking a lock marker left by a process that stopped mid-change");
            m + 1
        }
    };
    let mine = marker_name(lineage, generation, n);
    let note = serde_json::json!({"owner": marker_owner, "pid": std::process::id(), "at": unix_now()});
    if !create_exclusive_in(&dir, OsStr::new(&mine), note.to_string().as_bytes())? {
        return Ok(Step::Busy);
    }
    let give_up = |step: Step| -> std::io::Result<Step> {
        let _ = dir.remove_file(&mine);
        Ok(step)
    };
    if read_in(&dir, &name)?.as_deref() != Some(expected) {
        return give_up(Step::Changed);
    }
    if markers_in(&dir, lineage)?.iter().any(|(g, m, _)| *g == generation && *m > n) {
        return give_up(Step::Busy);
    }
    match change {
        Change::Write(mut info) => {
            info.lineage = lineage.to_string();
            info.generation = generation + 1;
            // Through the same handle as the markers.
            let mut tmp = TempFile::new_in(&dir, ".tmp")?;
            tmp.write_all(&info.to_bytes())?;
            tmp.persist(&name)?;
        }
        Change::Remove => {
            dir.remove_file(&name)?;
            dir.sync()?;
        }
    }
    for (g, _, marker) in markers_in(&dir, lineage)? {
        if g <= generation {
            let _ = dir.remove_file(marker);
        }
    }
    Ok(Step::Done)
}

/// A lock this process took over: from whom, why, after how long.
#[derive(Debug, Clone, PartialEq)]
pub struct Takeover {
    pub reason: String,
    /// The holder as its lock file said (`None`: the file was unreadable).
    pub previous: Option<LockInfo>,
    /// Age of its heartbeat by this host's clock when taken over.
    pub heartbeat_age_s: Option<f64>,
    /// How long `acquire` waited for it.
    pub waited_s: f64,
}

/// The shared state of a held lock: who we are, and whether we lost it.
#[derive(Debug)]
struct Holding {
    path: PathBuf,
    token: String,
    stale_after: Duration,
    lost: AtomicBool,
    takeover: Option<Takeover>,
}

impl Holding {
    /// Reads the lock: Ok while it holds our token; otherwise marks the lock
    /// lost and says who holds it now.
    fn confirm(&self) -> Result<(), OwnershipError> {
        let path = || self.path.clone();
        if self.lost.load(Ordering::SeqCst) {
            return Err(OwnershipError::LostEarlier { path: path() });
        }
        // One retry: a network filesystem may fail one read and not the next.
        let read = read_if_exists(&self.path).or_else(|_| {
            std::thread::sleep(Duration::from_millis(100));
            read_if_exists(&self.path)
        });
        let current = match read {
            Ok(Some(bytes)) => LockInfo::parse(&bytes),
            Ok(None) => None,
            // Cannot read it: cannot prove ownership, but nothing says we lost it.
            Err(source) => return Err(OwnershipError::Unreadable { path: path(), source }),
        };
        match current {
            Some(c) if c.token == self.token => Ok(()),
            other => {
                self.lost.store(true, Ordering::SeqCst);
                Err(match other {
                    Some(c) => OwnershipError::TakenOver { path: path(), pid: c.pid, host: c.host, job_id: c.job_id },
                    None => OwnershipError::Gone { path: path() },
                })
            }
        }
    }
}

/// A clonable view of a held lock for the code that writes into the run
/// directory: whether it is still ours.
#[derive(Debug, Clone)]
pub struct LockOwnership(Arc<Holding>);

impl LockOwnership {
    /// True once the lock is known to be lost (set by the heartbeat's checks
    /// and by [`confirm`](Self::confirm)); the run must then stop writing.
    pub fn is_lost(&self) -> bool {
        self.0.lost.load(Ordering::SeqCst)
    }

    /// Reads the lock file (a cheap read) and confirms it is still ours; when
    /// it is not, marks the lock lost and says who holds it now. Called right
    /// before each checkpoint commit.
    pub fn confirm(&self) -> Result<(), OwnershipError> {
        self.0.confirm()
    }

    /// The guard a checkpoint store asks before each commit: this lock is
    /// still ours ([`confirm`](Self::confirm)).
    pub fn commit_guard(&self) -> crate::checkpoint::CommitGuard {
        let lock = self.clone();
        crate::checkpoint::CommitGuard::new(move || lock.confirm())
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.0.path
    }

    /// The holder this process took the lock over from, if it did.
    pub fn takeover(&self) -> Option<&Takeover> {
        self.0.takeover.as_ref()
    }
}

/// A held lock; dropping it stops the heartbeat and removes the file (if still ours).
#[derive(Debug)]
pub struct RunLock {
    holding: Arc<Holding>,
    info: LockInfo,
    stop: Arc<AtomicBool>,
    heartbeat: Option<JoinHandle<()>>,
}

impl RunLock {
    /// Takes the lock of `dir` or explains who holds it. May wait (at most
    /// about the stale timeout) for an earlier attempt of this job on another
    /// node to go stale; see the module header.
    pub fn acquire(dir: &Path, req: LockRequest) -> Result<RunLock, LockError> {
        let mut info = req.lock_info();
        let mut contender = Contender::new(dir, &req);
        let took_over = contender.contend(&mut info)?;
        RunLock::hold(contender.path, info, req.stale_after, took_over)
    }

    /// Holds the lock just written as `info`: its shared state and its heartbeat thread.
    fn hold(
        path: PathBuf,
        info: LockInfo,
        stale_after: Duration,
        took_over: Option<Takeover>,
    ) -> Result<RunLock, LockError> {
        let holding = Arc::new(Holding {
            path: path.clone(),
            token: info.token.clone(),
            stale_after,
            lost: AtomicBool::new(false),
            takeover: took_over,
        });
        let stop = Arc::new(AtomicBool::new(false));
        let heartbeat = {
            let (stop, holding, info) = (Arc::clone(&stop), Arc::clone(&holding), info.clone());
            std::thread::Builder::new()
                .name("rekindle-lock-heartbeat".into())
                .spawn(move || heartbeat_loop(&holding, info, &stop))
                .map_err(|source| lock_io_error(&path, source))?
        };
        Ok(RunLock { holding, info, stop, heartbeat: Some(heartbeat) })
    }

    /// The lock as this process wrote it when it took it.
    pub fn info(&self) -> &LockInfo {
        &self.info
    }

    /// A view for the code that writes into the run directory.
    pub fn ownership(&self) -> LockOwnership {
        LockOwnership(Arc::clone(&self.holding))
    }
}

/// An I/O error on the lock file at `path`: something in its place that is
/// not a lock (a link, a FIFO, too large), or plain I/O.
fn lock_io_error(path: &Path, source: std::io::Error) -> LockError {
    match source.kind() {
        ErrorKind::InvalidInput | ErrorKind::InvalidData => {
            LockError::NotALock { path: path.to_path_buf(), reason: source.to_string() }
        }
        _ => LockError::Io { path: path.to_path_buf(), source },
    }
}

/// How long `acquire` waits in all for a lock of stale timeout `limit`.
/// Waiting is bounded by the timeout itself; this only stops a lock that
/// keeps changing hands from holding us forever.
fn give_up_after(limit: Duration) -> Duration {
    limit + marker_break_after(limit) + Duration::from_secs(5)
}

/// How long this process has seen the lock file hold the same bytes.
#[derive(Debug, Default)]
struct LockWatch {
    seen: Option<(Vec<u8>, Instant)>,
    /// The token of the holder being waited for (a `Wait` verdict).
    waiting_for: Option<String>,
}

/// One [`RunLock::acquire`] under way: whose, since when, and what it has
/// watched of the lock file and its markers.
struct Contender<'a> {
    dir: &'a Path,
    path: PathBuf,
    req: &'a LockRequest,
    t0: Instant,
    watch: LockWatch,
    markers: MarkerWatch,
    said_waiting: bool,
}

impl<'a> Contender<'a> {
    /// Starts contending for the lock of `dir` now.
    fn new(dir: &'a Path, req: &'a LockRequest) -> Contender<'a> {
        Contender {
            dir,
            path: dir.join(LOCK_FILE),
            req,
            t0: Instant::now(),
            watch: LockWatch::default(),
            markers: MarkerWatch::default(),
            said_waiting: false,
        }
    }

    /// Reads and judges the lock until it is ours, written as `info`:
    /// created (`None`) or taken over (from whom, why).
    fn contend(&mut self, info: &mut LockInfo) -> Result<Option<Takeover>, LockError> {
        loop {
            let Some(bytes) = read_if_exists(&self.path).map_err(|e| lock_io_error(&self.path, e))? else {
                info.heartbeat = unix_now();
                if create_exclusive(&self.path, &info.to_bytes()).map_err(|e| lock_io_error(&self.path, e))? {
                    return Ok(None);
                }
                continue;
            };
            let held = LockInfo::parse(&bytes);
            let unchanged_for = self.unchanged_for(&bytes, held.as_ref())?;
            let stale_after = self.req.stale_after;
            let limit = held.as_ref().map_or(stale_after, |h| h.stale_limit(stale_after));
            let me = Claimant {
                job_id: self.req.job_id.clone(),
                host: self.req.host.clone(),
                restart_count: self.req.restart_count,
                step_id: self.req.step_id.clone(),
                excluded: self.req.excluded.clone(),
                now: unix_now(),
            };
            let verdict = match &held {
                Some(h) => takeover(h, &me, holder_alive, stale_after, unchanged_for),
                None => unreadable(unchanged_for, stale_after),
            };
            match verdict {
                Verdict::Live => return Err(self.held(held.expect("a live verdict needs a readable lock"), me.now)),
                Verdict::Wait(why) => self.wait(&why, held, limit)?,
                Verdict::TakeOver(why) => {
                    if let Some(took) = self.take_over(info, &bytes, held, why, limit)? {
                        return Ok(Some(took));
                    }
                }
            }
        }
    }

    /// How long this process has seen the lock hold `bytes`; an error when
    /// the holder it was waiting for rewrote them (that holder is alive).
    fn unchanged_for(&mut self, bytes: &[u8], held: Option<&LockInfo>) -> Result<Duration, LockError> {
        match &self.watch.seen {
            Some((seen, since)) if *seen == bytes => Ok(since.elapsed()),
            _ => {
                if let (Some(waited_for), Some(h)) = (&self.watch.waiting_for, held)
                    && *waited_for == h.token
                {
                    return Err(LockError::HolderAlive {
                        dir: self.dir.to_path_buf(),
                        lock: self.path.clone(),
                        pid: h.pid,
                        host: h.host.clone(),
                        job: h.job_id.clone().unwrap_or_else(|| "none".into()),
                        waited_s: self.t0.elapsed().as_secs_f64(),
                    });
                }
                self.watch = LockWatch { seen: Some((bytes.to_vec(), Instant::now())), waiting_for: None };
                Ok(Duration::ZERO)
            }
        }
    }

    /// The refusal for `h`, a live holder, its heartbeat's age taken at `now`.
    fn held(&self, h: LockInfo, now: f64) -> LockError {
        LockError::Held {
            dir: self.dir.to_path_buf(),
            lock: self.path.clone(),
            pid: h.pid,
            job: h.job_id.clone().unwrap_or_else(|| "none".into()),
            age_s: h.age(now),
            host: h.host,
        }
    }

    /// Sleeps one poll while `held` may go stale (saying why once), unless
    /// this has gone on longer than [`give_up_after`].
    fn wait(&mut self, why: &str, held: Option<LockInfo>, limit: Duration) -> Result<(), LockError> {
        if !self.said_waiting {
            tracing::warn!(lock = %self.path.display(), "the run-directory lock is held: {why}");
            self.said_waiting = true;
        }
        self.watch.waiting_for = held.map(|h| h.token);
        if self.t0.elapsed() > give_up_after(limit) {
            return Err(self.gave_up("the lock kept changing while this run waited for it to go stale"));
        }
        std::thread::sleep(check_every(limit));
        Ok(())
    }

    /// Replaces `held` (read as `bytes`) with `info` in one transition: the
    /// takeover once done, `None` to read the lock again (it moved on, or a
    /// busy marker was waited out a moment).
    fn take_over(
        &mut self,
        info: &mut LockInfo,
        bytes: &[u8],
        held: Option<LockInfo>,
        why: String,
        limit: Duration,
    ) -> Result<Option<Takeover>, LockError> {
        let from = held.as_ref().map_or(("unreadable", 0), |h| (h.lineage.as_str(), h.generation));
        info.heartbeat = unix_now();
        let change = Change::Write(Box::new(info.clone()));
        let step = transition(&self.path, bytes, from, change, &info.token, &mut self.markers, limit)
            .map_err(|e| lock_io_error(&self.path, e))?;
        match step {
            Step::Done => {
                tracing::warn!(lock = %self.path.display(), holder_pid = ?held.as_ref().map(|h| h.pid), holder_host = ?held.as_ref().map(|h| &h.host), "took over the run-directory lock: {why}");
                (info.lineage, info.generation) = (from.0.to_string(), from.1 + 1);
                Ok(Some(Takeover {
                    reason: why,
                    heartbeat_age_s: held.as_ref().map(|h| h.age(unix_now())),
                    previous: held,
                    waited_s: self.t0.elapsed().as_secs_f64(),
                }))
            }
            Step::Changed => Ok(None),
            Step::Busy => {
                if self.t0.elapsed() > give_up_after(limit) {
                    return Err(self.gave_up("another process kept the lock busy"));
                }
                std::thread::sleep(BUSY_RETRY);
                Ok(None)
            }
        }
    }

    /// Giving up after waiting this long, and why.
    fn gave_up(&self, why: &str) -> LockError {
        LockError::GaveUp {
            dir: self.dir.to_path_buf(),
            lock: self.path.clone(),
            waited_s: self.t0.elapsed().as_secs_f64(),
            why: why.to_string(),
        }
    }
}

/// Checks the token every [`check_every`] and rewrites the heartbeat every
/// [`heartbeat_every`] until stopped or the lock is lost.
fn heartbeat_loop(holding: &Holding, info: LockInfo, stop: &AtomicBool) {
    let (check, beat) = (check_every(holding.stale_after), heartbeat_every(holding.stale_after));
    let tick = Duration::from_millis(50).min(check);
    let (mut last_check, mut last_beat) = (Instant::now(), Instant::now());
    let mut watch = MarkerWatch::default();
    // Failures are retried every check but logged once a heartbeat period.
    let mut last_warned: Option<Instant> = None;
    let mut warn = |what: &str, e: &std::io::Error| {
        if last_warned.is_none_or(|t| t.elapsed() >= beat) {
            tracing::warn!(lock = %holding.path.display(), error = %e, "{what}; trying again");
            last_warned = Some(Instant::now());
        }
    };
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(tick);
        if last_check.elapsed() < check {
            continue;
        }
        last_check = Instant::now();
        let bytes = match read_if_exists(&holding.path) {
            Ok(b) => b,
            Err(e) => {
                warn("cannot read the run-directory lock", &e);
                continue;
            }
        };
        let current = bytes.as_deref().and_then(LockInfo::parse);
        let Some(current) = current.filter(|c| c.token == holding.token) else {
            holding.lost.store(true, Ordering::SeqCst);
            tracing::error!(lock = %holding.path.display(), "the run-directory lock was taken over by another process (or removed); stopping without writing more");
            return;
        };
        if last_beat.elapsed() < beat {
            continue;
        }
        let next = LockInfo { heartbeat: unix_now(), ..info.clone() };
        let from = (current.lineage.as_str(), current.generation);
        let bytes = bytes.unwrap_or_default();
        match transition(
            &holding.path,
            &bytes,
            from,
            Change::Write(Box::new(next)),
            &holding.token,
            &mut watch,
            holding.stale_after,
        ) {
            Ok(Step::Done) => last_beat = Instant::now(),
            // Busy: another process is judging the lock; Changed: the next
            // check sees who holds it now. Either way, try at the next check.
            Ok(Step::Busy | Step::Changed) => {}
            Err(e) => warn("cannot refresh the lock heartbeat", &e),
        }
    }
}

impl RunLock {
    /// A handle that releases this lock from another thread, for an exit
    /// that cannot unwind to this lock's drop (the watchdog's `process::exit`
    /// while the training thread is stuck).
    pub fn release_handle(&self) -> LockRelease {
        LockRelease { holding: Arc::clone(&self.holding), stop: Arc::clone(&self.stop) }
    }
}

/// Releases a [`RunLock`] without its owner: see [`RunLock::release_handle`].
#[derive(Debug, Clone)]
pub struct LockRelease {
    holding: Arc<Holding>,
    stop: Arc<AtomicBool>,
}

impl LockRelease {
    /// Stops the heartbeat (not joined: the process is about to exit) and
    /// removes the lock file if it is still ours, under the marker as every
    /// change to the lock file.
    pub fn release(&self) {
        self.stop.store(true, Ordering::SeqCst);
        release(&self.holding);
    }
}

impl Drop for RunLock {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.heartbeat.take() {
            let _ = h.join();
        }
        release(&self.holding);
    }
}

/// Removes the lock file if it is still `holding`'s (nothing when the lock
/// was lost), retrying a busy marker for a while.
fn release(holding: &Holding) {
    if holding.lost.load(Ordering::SeqCst) {
        return;
    }
    let path = &holding.path;
    let t0 = Instant::now();
    let mut watch = MarkerWatch::default();
    while t0.elapsed() < RELEASE_TRIES_FOR {
        let Ok(Some(bytes)) = read_if_exists(path) else { return };
        let Some(current) = LockInfo::parse(&bytes).filter(|c| c.token == holding.token) else { return };
        let from = (current.lineage.as_str(), current.generation);
        match transition(path, &bytes, from, Change::Remove, &holding.token, &mut watch, holding.stale_after) {
            Ok(Step::Done | Step::Changed) => return,
            Ok(Step::Busy) => std::thread::sleep(BUSY_RETRY),
            Err(e) => {
                tracing::warn!(lock = %path.display(), error = %e, "cannot release the run-directory lock; it will go stale");
                return;
            }
        }
    }
    tracing::warn!(lock = %path.display(), "the run-directory lock stayed busy; leaving it to go stale");
}
