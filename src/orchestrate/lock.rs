//! The run-directory lock: two live runs must never write the same run
//! directory, and a lock left behind by a dead node must not block a requeued
//! job forever.
//!
//! `flock` is not enough on NFS-like shared filesystems, so the lock is a file,
//! `<run dir>/rekindle.lock`, created with O_EXCL and holding JSON (owner token,
//! job id, host, pid, heartbeat). The holder refreshes the heartbeat every
//! [`HEARTBEAT_EVERY`]. A lock may be taken over when it is stale:
//! - same host and its pid is gone;
//! - same SLURM job id (SLURM never runs two attempts of a job at once, so the
//!   holder is a dead earlier attempt, possibly on another node);
//! - its heartbeat is older than the stale timeout.
//!
//! The take-over decision is a pure function ([`takeover`]).

use std::fs;
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::atomic::write_atomically;

pub const LOCK_FILE: &str = "rekindle.lock";
/// How often the holder refreshes its heartbeat.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(10);
/// A heartbeat older than this marks the lock stale.
pub const STALE_AFTER: Duration = Duration::from_secs(60);

/// Errors taking the lock.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error(
        "run directory {dir} is in use by pid {pid} on {host} (job {job}), heartbeat {age_s:.0}s ago; \
         two runs must not share a run directory: wait for it to end, use another --run-dir, \
         or remove {lock} if you are sure it is dead"
    )]
    Held { dir: PathBuf, lock: PathBuf, pid: u32, host: String, job: String, age_s: f64 },
    #[error("cannot write lock file {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

/// The content of the lock file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LockInfo {
    pub token: String,
    pub job_id: Option<String>,
    pub host: String,
    pub pid: u32,
    /// Unix seconds (float) of the last heartbeat.
    pub heartbeat: f64,
    pub started: f64,
}

impl LockInfo {
    /// Parses a lock file; `None` when it is not a lock (a torn write of a
    /// crashed holder, or anything else), never a panic.
    pub fn parse(bytes: &[u8]) -> Option<LockInfo> {
        serde_json::from_slice(bytes).ok()
    }

    /// Reads and parses the lock file at `path`; `None` when missing or not a lock.
    pub fn read(path: &Path) -> Option<LockInfo> {
        LockInfo::parse(&fs::read(path).ok()?)
    }
}

/// Who is asking for the lock, and when.
#[derive(Debug, Clone)]
pub struct Claimant {
    pub job_id: Option<String>,
    pub host: String,
    pub now: f64,
}

/// Why a lock may be taken over (`None`: it is live, keep out).
pub fn takeover(
    held: &LockInfo,
    me: &Claimant,
    pid_alive: impl Fn(u32) -> bool,
    stale_after: Duration,
) -> Option<String> {
    if held.host == me.host && !pid_alive(held.pid) {
        return Some(format!("its process {} on this host is gone", held.pid));
    }
    if let (Some(theirs), Some(mine)) = (&held.job_id, &me.job_id)
        && theirs == mine
    {
        return Some(format!("it belongs to an earlier attempt of this job ({mine}) on {}", held.host));
    }
    let age = me.now - held.heartbeat;
    if age > stale_after.as_secs_f64() {
        return Some(format!("its heartbeat is {age:.0}s old (stale after {}s)", stale_after.as_secs()));
    }
    None
}

/// A held lock; dropping it stops the heartbeat and removes the file (if still ours).
#[derive(Debug)]
pub struct RunLock {
    path: PathBuf,
    info: LockInfo,
    stop: Arc<AtomicBool>,
    lost: Arc<AtomicBool>,
    heartbeat: Option<JoinHandle<()>>,
}

/// Seconds since the Unix epoch (the lock's heartbeat clock).
pub(super) fn unix_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

fn pid_alive(pid: u32) -> bool {
    // The pid comes from the lock file: 0 and anything past i32::MAX are no
    // process (kill(2) would read them as "my process group" or "every
    // process" and answer that they exist).
    let Ok(pid) = i32::try_from(pid) else { return false };
    if pid <= 0 {
        return false;
    }
    // Signal 0 checks existence; EPERM means it exists but is not ours.
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) {
        Ok(()) => true,
        Err(e) => e == nix::errno::Errno::EPERM,
    }
}

impl RunLock {
    /// Takes the lock of `dir` or explains who holds it.
    pub fn acquire(dir: &Path, job_id: Option<String>, host: String) -> Result<RunLock, LockError> {
        let path = dir.join(LOCK_FILE);
        let now = unix_now();
        let info = LockInfo {
            token: format!("{host}-{}-{now}", std::process::id()),
            job_id: job_id.clone(),
            host: host.clone(),
            pid: std::process::id(),
            heartbeat: now,
            started: now,
        };
        let bytes = serde_json::to_vec_pretty(&info).expect("lock serialises");
        let io = |source| LockError::Io { path: path.clone(), source };
        match fs::OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(mut f) => {
                f.write_all(&bytes).map_err(io)?;
                f.sync_all().map_err(io)?;
            }
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                let held: Option<LockInfo> = LockInfo::read(&path);
                match held {
                    // An unreadable lock is a torn write of a crashed holder.
                    None => tracing::warn!(lock = %path.display(), "taking over an unreadable lock file"),
                    Some(held) => {
                        let me = Claimant { job_id, host, now };
                        match takeover(&held, &me, pid_alive, STALE_AFTER) {
                            Some(why) => {
                                tracing::warn!(lock = %path.display(), holder_pid = held.pid, holder_host = %held.host, "taking over the run-directory lock: {why}")
                            }
                            None => {
                                return Err(LockError::Held {
                                    dir: dir.to_path_buf(),
                                    lock: path.clone(),
                                    pid: held.pid,
                                    host: held.host,
                                    job: held.job_id.unwrap_or_else(|| "none".into()),
                                    age_s: now - held.heartbeat,
                                });
                            }
                        }
                    }
                }
                write_atomically(&path, &bytes).map_err(io)?;
            }
            Err(e) => return Err(io(e)),
        }
        let stop = Arc::new(AtomicBool::new(false));
        let lost = Arc::new(AtomicBool::new(false));
        let heartbeat = {
            let (stop, lost, path, info) = (Arc::clone(&stop), Arc::clone(&lost), path.clone(), info.clone());
            std::thread::Builder::new()
                .name("rekindle-lock-heartbeat".into())
                .spawn(move || heartbeat_loop(&path, info, &stop, &lost))
                .map_err(io)?
        };
        Ok(RunLock { path, info, stop, lost, heartbeat: Some(heartbeat) })
    }

    pub fn info(&self) -> &LockInfo {
        &self.info
    }

    /// A flag the heartbeat sets when another process has taken the lock
    /// over; the run must then stop writing at once.
    pub fn lost_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.lost)
    }

    /// A handle that releases this lock from another thread, for an exit
    /// that cannot unwind to this lock's drop (the watchdog's `process::exit`
    /// while the training thread is stuck).
    pub fn release_handle(&self) -> LockRelease {
        LockRelease { path: self.path.clone(), token: self.info.token.clone(), stop: Arc::clone(&self.stop) }
    }
}

/// Releases a [`RunLock`] without its owner: see [`RunLock::release_handle`].
#[derive(Debug, Clone)]
pub struct LockRelease {
    path: PathBuf,
    token: String,
    stop: Arc<AtomicBool>,
}

impl LockRelease {
    /// Stops the heartbeat (it checks every 200 ms; not joined, the process
    /// is about to exit) and removes the lock file if it is still ours.
    pub fn release(&self) {
        self.stop.store(true, Ordering::SeqCst);
        let current: Option<LockInfo> = fs::read(&self.path).ok().and_then(|b| serde_json::from_slice(&b).ok());
        if current.is_some_and(|c| c.token == self.token) {
            let _ = fs::remove_file(&self.path);
        }
    }
}

fn heartbeat_loop(path: &Path, mut info: LockInfo, stop: &AtomicBool, lost: &AtomicBool) {
    let tick = Duration::from_millis(200);
    let mut waited = Duration::ZERO;
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(tick);
        waited += tick;
        if waited < HEARTBEAT_EVERY {
            continue;
        }
        waited = Duration::ZERO;
        let current: Option<LockInfo> = LockInfo::read(path);
        if current.as_ref().map(|c| &c.token) != Some(&info.token) {
            tracing::error!(lock = %path.display(), "the run-directory lock was taken over by another process; stopping without writing more");
            lost.store(true, Ordering::SeqCst);
            return;
        }
        info.heartbeat = unix_now();
        if let Err(e) = write_atomically(path, &serde_json::to_vec_pretty(&info).expect("lock serialises")) {
            tracing::warn!(lock = %path.display(), error = %e, "cannot refresh the lock heartbeat");
        }
    }
}

impl Drop for RunLock {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.heartbeat.take() {
            let _ = h.join();
        }
        let current: Option<LockInfo> = LockInfo::read(&self.path);
        if current.is_some_and(|c| c.token == self.info.token) {
            let _ = fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(host: &str, pid: u32, job: Option<&str>, heartbeat: f64) -> LockInfo {
        LockInfo { token: "t".into(), job_id: job.map(Into::into), host: host.into(), pid, heartbeat, started: 0.0 }
    }

    fn me(host: &str, job: Option<&str>, now: f64) -> Claimant {
        Claimant { job_id: job.map(Into::into), host: host.into(), now }
    }

    const STALE: Duration = Duration::from_secs(60);

    #[test]
    fn live_lock_on_other_host_with_fresh_heartbeat_is_respected() {
        assert_eq!(takeover(&held("n1", 10, Some("5"), 100.0), &me("n2", Some("6"), 110.0), |_| true, STALE), None);
    }

    #[test]
    fn dead_pid_on_same_host_is_taken_over() {
        assert!(takeover(&held("n1", 10, None, 100.0), &me("n1", None, 101.0), |_| false, STALE).is_some());
        assert!(takeover(&held("n1", 10, None, 100.0), &me("n1", None, 101.0), |_| true, STALE).is_none());
    }

    #[test]
    fn earlier_attempt_of_same_job_is_taken_over_from_another_node() {
        let why = takeover(&held("n1", 10, Some("42"), 100.0), &me("n2", Some("42"), 101.0), |_| true, STALE);
        assert!(why.unwrap().contains("earlier attempt"));
    }

    #[test]
    fn stale_heartbeat_is_taken_over() {
        assert!(takeover(&held("n1", 10, None, 100.0), &me("n2", None, 161.0), |_| true, STALE).is_some());
        assert!(takeover(&held("n1", 10, None, 100.0), &me("n2", None, 159.0), |_| true, STALE).is_none());
    }

    #[test]
    fn second_acquire_in_same_process_is_refused_and_released_on_drop() {
        let tmp = tempfile::tempdir().unwrap();
        let first = RunLock::acquire(tmp.path(), None, "hostA".into()).unwrap();
        // Same host, live pid (ours), no job id, fresh heartbeat: refused.
        let err = RunLock::acquire(tmp.path(), None, "hostA".into()).unwrap_err();
        assert!(err.to_string().contains("in use by pid"), "{err}");
        drop(first);
        assert!(!tmp.path().join(LOCK_FILE).exists());
        RunLock::acquire(tmp.path(), None, "hostA".into()).unwrap();
    }

    #[test]
    fn a_release_handle_frees_the_directory_without_the_owner() {
        let tmp = tempfile::tempdir().unwrap();
        let held = RunLock::acquire(tmp.path(), None, "hostA".into()).unwrap();
        held.release_handle().release();
        assert!(!tmp.path().join(LOCK_FILE).exists());
        // Another run may take it at once; the owner's drop leaves that one alone.
        let next = RunLock::acquire(tmp.path(), None, "hostA".into()).unwrap();
        drop(held);
        assert!(tmp.path().join(LOCK_FILE).exists(), "the new holder's lock survives the old owner's drop");
        drop(next);
    }

    #[test]
    fn a_pid_that_names_no_single_process_is_not_alive() {
        // kill(0, 0) and kill(-1, 0) succeed (process group, every process):
        // a lock file saying pid 0 or 4294967295 used to count as live.
        assert!(!pid_alive(0));
        assert!(!pid_alive(u32::MAX));
        assert!(!pid_alive(i32::MAX as u32 + 1));
        assert!(pid_alive(std::process::id()));
    }

    /// Property tests over arbitrary and mutated lock files; see `crate::fuzz`.
    mod fuzz {
        use super::*;
        use crate::fuzz;
        use proptest::prelude::*;

        fn valid() -> Vec<u8> {
            let info = LockInfo {
                token: "n1-4242-1700000000.5".into(),
                job_id: Some("77".into()),
                host: "n1".into(),
                pid: 4242,
                heartbeat: 1_700_000_000.5,
                started: 1_699_999_000.25,
            };
            serde_json::to_vec_pretty(&info).unwrap()
        }

        fn check(bytes: &[u8]) {
            if let Some(held) = LockInfo::parse(bytes) {
                for (host, job, now) in [("n1", Some("77"), 1e9), ("n2", None, f64::MAX), ("n1", None, -1.0)] {
                    let _ = takeover(&held, &me(host, job, now), |_| true, STALE);
                    let _ = takeover(&held, &me(host, job, now), pid_alive, STALE);
                }
            }
        }

        proptest! {
            #![proptest_config(fuzz::config())]

            #[test]
            fn arbitrary_bytes_are_a_lock_or_none(bytes in fuzz::bytes(256)) {
                check(&bytes);
            }

            #[test]
            fn mutated_lock_files_are_a_lock_or_none(bytes in fuzz::mutated(valid())) {
                check(&bytes);
            }
        }
    }
}
