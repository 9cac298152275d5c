//! `rekindle seal DIR --step N`: commits a directory the program staged
//! into the checkpoint of step N (checkpoint/files.rs) and records it
//! (`checkpoint_saved`, kind `sealed`; `checkpoint_failed` when it fails).
//!
//! The stop signals do not interrupt a seal (it ignores them: see
//! [`ignore_stop_signals`]). Under `rekindle exec` the supervisor holds the run directory's lock, so
//! the seal commits under that lock: `REKINDLE_EXEC_PID` names the holder,
//! and the lock file must name it (pid and host) when the seal starts and
//! again right before the rename. Outside `exec` the seal takes the lock
//! itself, like any writer of a run directory. Seals of one run run one at
//! a time (an exclusive lock on `checkpoints/.seal.lock`).
//!
//! With `--rank R --world-size W` (a distributed program) the staged
//! directory is rank R's part of the world's checkpoint (checkpoint/world.rs):
//! a rank other than 0 seals its part and returns, taking no lock (it
//! commits nothing); rank 0 seals its own, waits for every other rank's
//! (`[distributed] timeout`) and commits them under one manifest, as a
//! plain seal commits.

use std::path::{Path, PathBuf};

use crate::checkpoint::{CheckpointStore, CommitGuard, WorldRank};
use crate::config;
use crate::slurm::SlurmEnv;
use crate::telemetry::{CheckpointFailed, CheckpointSaved, Event, EventLog};

use super::contract::{ENV_EXEC_HOST, ENV_EXEC_PID, ENV_RUN_DIR};
use crate::attempt::ending::record_or_log;
use crate::attempt::error::RunError;
use crate::attempt::records::context;
use crate::attempt::stop::StopSignal;
use crate::rundir::lock::{LOCK_FILE, LockInfo, LockRequest, RunLock};
use crate::rundir::{CONFIG_FILE, EVENTS_FILE, checkpoints_dir};

/// What `rekindle seal` was asked to do.
#[derive(Debug, Clone)]
pub struct SealOptions {
    /// The staged directory.
    pub staged: PathBuf,
    pub step: u64,
    /// The run directory (default: `REKINDLE_RUN_DIR`).
    pub run_dir: Option<PathBuf>,
    /// `(rank, world size)` of a distributed program: the staged directory
    /// is this rank's part of the world's checkpoint (checkpoint/world.rs).
    pub rank: Option<(usize, usize)>,
}

/// Seals the staged directory; returns the checkpoint's directory.
pub fn seal(opts: &SealOptions) -> Result<PathBuf, RunError> {
    ignore_stop_signals();
    let root = opts.run_dir.clone().or_else(|| std::env::var_os(ENV_RUN_DIR).map(PathBuf::from)).ok_or_else(|| {
        RunError::Seal {
            reason: format!(
                "no run directory: pass --run-dir DIR, or call it from a program run by `rekindle exec` \
                 ({ENV_RUN_DIR} is set there)"
            ),
        }
    })?;
    let config_path = root.join(CONFIG_FILE);
    // Not followed: a link or FIFO there is refused by `load_recorded` below
    // (bounded, non-blocking, a regular file only), as `status` refuses it.
    if std::fs::symlink_metadata(&config_path).is_err() {
        return Err(RunError::Seal {
            reason: format!(
                "{} is not a run directory (no {CONFIG_FILE}): start the run with `rekindle exec` first",
                root.display()
            ),
        });
    }
    let cfg = config::load_recorded(&config_path)
        .map_err(|e| {
            RunError::Dir(crate::rundir::RunDirRefusal::PreviousConfig {
                path: config_path.clone(),
                reason: e.to_string(),
            })
        })?
        .config;
    let who = opts
        .rank
        .map(|(rank, world)| WorldRank::new(rank, world).map_err(|reason| RunError::Seal { reason }))
        .transpose()?;
    if let Some(who) = who.filter(|w| w.rank != 0) {
        // A part commits nothing: no lock of its own (rank 0 commits under
        // the supervisor's), no wait for the others.
        let store = CheckpointStore::open_read_only(checkpoints_dir(&root, &cfg));
        let mut events = EventLog::open(root.join(EVENTS_FILE), context(&SlurmEnv::from_process()))?;
        return match store.seal_part(&opts.staged, opts.step, who) {
            Ok(part) => {
                tracing::info!(
                    step = part.step,
                    rank = who.rank,
                    world = who.world,
                    files = part.files.len(),
                    bytes = part.bytes,
                    "part sealed; rank 0 commits the world's checkpoint"
                );
                Ok(part.dir)
            }
            Err(e) => {
                record_or_log(&mut events, &failed(opts.step, who, &e));
                Err(e.into())
            }
        };
    }
    // Held until the seal returns when this process had to take it.
    let (guard, _own_lock) = match std::env::var(ENV_EXEC_PID).ok() {
        Some(pid) => (supervisor_guard(&root, &pid)?, None),
        None => {
            let slurm = SlurmEnv::from_process();
            let lock = RunLock::acquire(&root, LockRequest::for_allocation(&slurm, cfg.lock.stale_after))?;
            (lock.ownership().commit_guard(), Some(lock))
        }
    };
    let checkpoints = checkpoints_dir(&root, &cfg);
    let _one_at_a_time = seal_lock(&checkpoints)?;
    let store = CheckpointStore::open(&checkpoints, cfg.checkpoint.keep)?.with_commit_guard(guard);
    let mut events = EventLog::open(root.join(EVENTS_FILE), context(&SlurmEnv::from_process()))?;
    let sealed = match who {
        None => store.seal(&opts.staged, opts.step),
        Some(who) => store
            .seal_part(&opts.staged, opts.step, who)
            .and_then(|_| store.commit_world(opts.step, who.world, cfg.distributed.timeout)),
    };
    match sealed {
        Ok(report) => {
            tracing::info!(step = report.step, dir = %report.dir.display(), bytes = report.bytes, seconds = report.seconds, "sealed");
            record_or_log(&mut events, &saved(&report, None));
            Ok(report.dir)
        }
        Err(e) if e.committed() => {
            let dir = store.step_dir(opts.step);
            tracing::warn!(error = %e, "sealed, but a step after the commit failed");
            let report = crate::checkpoint::SaveReport {
                step: opts.step,
                dir: dir.clone(),
                bytes: 0,
                seconds: 0.0,
                already_existed: false,
                rotated_out: Vec::new(),
                parts: None,
                write: None,
            };
            record_or_log(&mut events, &saved(&report, Some(e.to_string())));
            Ok(dir)
        }
        Err(e) => {
            record_or_log(
                &mut events,
                &Event::CheckpointFailed(CheckpointFailed {
                    step: opts.step,
                    kind: "sealed".into(),
                    error: e.to_string(),
                    consecutive_failures: None,
                }),
            );
            Err(e.into())
        }
    }
}

/// The `checkpoint_failed` of a rank's part that could not be sealed.
fn failed(step: u64, who: WorldRank, e: &crate::checkpoint::CheckpointError) -> Event {
    Event::CheckpointFailed(CheckpointFailed {
        step,
        kind: "sealed".into(),
        error: format!("rank {} of {}: {e}", who.rank, who.world),
        consecutive_failures: None,
    })
}

fn saved(report: &crate::checkpoint::SaveReport, warning: Option<String>) -> Event {
    Event::CheckpointSaved(CheckpointSaved {
        step: report.step,
        kind: "sealed".into(),
        bytes: Some(report.bytes),
        persist_seconds: Some(report.seconds),
        gb_per_s: (report.seconds > 0.0).then(|| report.bytes as f64 / report.seconds / 1e9),
        dir: Some(report.dir.clone()),
        rotated_out: Some(report.rotated_out.clone()),
        parts_wait_seconds: report.parts.map(|p| p.wait_seconds),
        warning,
        ..CheckpointSaved::default()
    })
}

/// A seal runs in the program's process group, so the stop that `rekindle
/// exec` forwards to the group (and SLURM's `scancel -s TERM`, which signals
/// every process of the job step) reaches a seal in flight too: killed, it
/// would lose the periodic checkpoint it was committing and fail the
/// program's save just when the program is about to write its stop
/// checkpoint. A seal is short and ends by itself; the deadline's SIGKILL
/// still bounds it. This protects a seal only once its own code runs: a
/// stop that arrives while the binary is still loading would kill it, so
/// whoever starts a seal starts it with the stop signals blocked (the
/// mask is inherited; a pending one is discarded once ignored here):
/// `python/rekindle_client.py` does, docs/exec.md says how for others.
fn ignore_stop_signals() {
    use nix::sys::signal::{SigHandler, Signal, signal};
    for sig in StopSignal::ALL.map(Signal::from) {
        // SAFETY: installs SIG_IGN, no handler code runs.
        if let Err(e) = unsafe { signal(sig, SigHandler::SigIgn) } {
            tracing::warn!(signal = %sig, error = %e, "cannot ignore a stop signal during the seal");
        }
    }
}

/// The file whose exclusive lock seals hold while they run.
const SEAL_LOCK: &str = ".seal.lock";

/// Waits for any other seal of the run to end: a program that checkpoints
/// from two threads gets its seals one after the other, so that the step
/// check, the rename and rotation of one never interleave with another's
/// (without it, concurrent seals committed steps out of order and rotated
/// out checkpoints under each other's feet). Released when the returned file
/// is dropped.
fn seal_lock(checkpoints: &Path) -> Result<std::fs::File, RunError> {
    let path = checkpoints.join(SEAL_LOCK);
    let io = |source| RunError::RunDir { path: path.clone(), source };
    crate::checkpoint::claim_dir(checkpoints, false).map_err(|e| RunError::Checkpoint(e.into()))?;
    // Through the claimed directory's handle: never through a symlink or
    // FIFO in its place (docs/run-directory.md, Trust boundaries).
    let file = crate::confine::Dir::open(checkpoints).and_then(|dir| dir.open_append(SEAL_LOCK)).map_err(io)?;
    file.lock().map_err(io)?;
    Ok(file)
}

/// A commit guard for a seal under `rekindle exec`: the lock file names the
/// supervisor (`pid` on `REKINDLE_EXEC_HOST`, else on this node, named as
/// the lock names it: the SLURM node name, else the host name) now, and
/// still does (same token) right before the rename.
fn supervisor_guard(root: &Path, pid: &str) -> Result<CommitGuard, RunError> {
    let lock_path = root.join(LOCK_FILE);
    let pid: u32 =
        pid.parse().map_err(|_| RunError::Seal { reason: format!("{ENV_EXEC_PID}={pid} is not a process id") })?;
    // In a job step of several tasks the supervisor of record (task 0's)
    // may run on another node: it is named.
    let host = std::env::var(ENV_EXEC_HOST).ok().filter(|h| !h.is_empty());
    let host = host.unwrap_or_else(|| SlurmEnv::from_process().node_name());
    let info = LockInfo::read(&lock_path).filter(|i| i.pid == pid && i.host == host).ok_or_else(|| RunError::Seal {
        reason: format!(
            "the lock {} does not name the supervising `rekindle exec` (pid {pid} on {host}): it has exited, or \
             another process took the run directory over; nothing was sealed",
            lock_path.display()
        ),
    })?;
    let token = info.token;
    Ok(CommitGuard::new(move || match LockInfo::read(&lock_path) {
        Some(now) if now.token == token => Ok(()),
        _ => Err(format!("the lock {} no longer names the supervising rekindle exec (pid {pid})", lock_path.display())),
    }))
}
