//! The program as a child process, and the supervisor that waits on
//! everything at once (a single-threaded tokio runtime on the main thread):
//!
//! - the child's exit;
//! - the stop signals (TERM, INT, USR1, USR2; the [`StopFlag`] records each,
//!   the tokio streams only wake the loop): on the first, the stop file is
//!   written with the deadline and a `signal` event recorded; every stop
//!   signal received is forwarded as SIGTERM to the child's whole process
//!   group at once (DataLoader workers and `torchrun`'s ranks see it too;
//!   SIGTERM because it is what programs trap, while SIGUSR1's default
//!   action would kill one that does not);
//! - the stop deadline (`budget::exit_now`: the deadline passed, or a third
//!   signal): the group gets SIGKILL, and the last sealed checkpoint stands;
//! - the run-directory lock, lost to another process: the group gets SIGKILL;
//! - in a job step of several tasks, another task lost (`world.rs`,
//!   [`Liveness`]): the group gets SIGTERM, and SIGKILL [`LOST_GRACE`] later;
//! - the ranks' progress reports (progress.rs): the task's lowest step goes
//!   into its heartbeat, and where this supervisor decides for the world (one
//!   task, or task 0) a rank past its `[watchdog]` limit is a hang: the
//!   `hang` event, then SIGTERM to the group and SIGKILL [`LOST_GRACE`] later
//!   (the program is stuck: it cannot save);
//! - not the child's stderr: a thread of its own tees it, keeps its last
//!   lines redacted for the `child_exit` event (stderr.rs), and is waited
//!   for only once the child exited (at most [`STDERR_DRAIN`]).
//!
//! The child is its own process group's leader and gets PR_SET_PDEATHSIG =
//! SIGKILL: a rekindle that is SIGKILLed takes it along. The death signal
//! fires when the *thread* that forked exits; the runtime is current-thread
//! on the main thread, which lives as long as the process.

use std::ffi::OsString;
use std::process::ExitStatus;
use std::sync::PoisonError;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::signal::unix::{SignalKind, signal};

use crate::config::Config;
use crate::telemetry::{Event, EventLog, HangEvent, Redactor};

use super::contract::{ChildEnv, StopNotice};
use super::progress::{Channel, MAX_REPORT, Tracker};
use super::stderr::{self, Tail};
use super::world::{LOST_GRACE, Liveness};
use crate::attempt::budget;
use crate::attempt::deadline::Deadline;
use crate::attempt::ending::{instant_to_rfc3339, record_or_log};
use crate::attempt::error::RunError;
use crate::attempt::rank_watch::Lost;
use crate::attempt::stop::{SignalStop, StopFlag, StopReason};
use crate::rundir::lock::LockOwnership;

/// How long the loop sleeps between looks at the stop flag and the lock
/// (signals wake it at once; this catches one that arrived before the
/// streams were registered, and a lock lost).
const TICK: Duration = Duration::from_millis(100);

/// After the child exited: how long to wait for the rest of its stderr (a
/// grandchild may hold the pipe open).
const STDERR_DRAIN: Duration = Duration::from_secs(1);
/// How often the drain looks whether the stderr thread is done.
const DRAIN_TICK: Duration = Duration::from_millis(10);

/// A stop as the supervisor took it.
#[derive(Debug, Clone, Copy)]
pub struct StopTaken {
    pub reason: StopReason,
    pub deadline: Option<Deadline>,
}

/// How the child's run went.
#[derive(Debug)]
pub struct Supervised {
    pub pid: u32,
    pub status: ExitStatus,
    pub stop: Option<StopTaken>,
    pub killed_at_deadline: bool,
    pub lock_lost: bool,
    /// Other tasks of the world found lost while the program ran (it was
    /// ended then).
    pub lost: Option<Vec<Lost>>,
    /// A rank of the program past its `[watchdog]` limit (it was ended then).
    pub hang: Option<HangEvent>,
    /// It was ended because task 0 found a rank of the world hung.
    pub hang_echo: bool,
    pub stderr_tail: Vec<String>,
    pub seconds: f64,
}

/// The program's progress reports (progress.rs) and what this supervisor
/// does when a rank of its program is past its `[watchdog]` limit.
pub struct Progress<'a> {
    pub channel: &'a Channel,
    pub role: HangRole<'a>,
}

/// Who ends the world when a rank hangs.
pub enum HangRole<'a> {
    /// The only task, or task 0: records the hang, calls `announce` (task 0
    /// tells the other tasks: exec/world.rs's `WorldHang`) and ends its
    /// program.
    Decides { announce: &'a dyn Fn(&HangEvent) },
    /// Another task of a job step. Its ranks wait for a stuck peer in the
    /// next collective, as task 0's do, so task 0 finds the hang; while this
    /// task's own ranks are past their limit it asks `announced` (one read of
    /// task 0's notice) once a second, and ends its program once task 0 has
    /// spoken. A hang task 0 never announces (its own ranks go on: no
    /// collective binds them) is this task's own at twice the limit: it
    /// records it and ends its program, and its failure ends the job step.
    Follows { announced: &'a dyn Fn() -> bool },
}

/// How often a follower whose ranks are past their limit looks for task 0's
/// notice of the hang.
const NOTICE_LOOK: Duration = Duration::from_secs(1);

/// Runs `command` with the contract's environment until it exits, handling
/// stops, the deadline, the lock, lost tasks (`liveness`, in a job step of
/// several) and hung ranks (`progress`) as the module header says.
/// `on_spawn` gets the child's pid (for the `child_start` event) once it runs.
#[allow(clippy::too_many_arguments)]
pub fn supervise(
    command: &[OsString],
    env: &ChildEnv,
    cfg: &Config,
    stop: &StopFlag,
    lock: Option<&LockOwnership>,
    liveness: Option<&Liveness>,
    progress: Option<Progress<'_>>,
    events: &mut EventLog,
    on_spawn: impl FnOnce(u32, &mut EventLog),
) -> Result<Supervised, RunError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| RunError::ExecRuntime { source })?;
    runtime.block_on(async {
        let shown = recorded_command(cfg, command).join(" ");
        let spawn_err = |source| RunError::ChildSpawn { command: shown.clone(), source };
        // Registered before the child exists: a signal from then on wakes the loop.
        let mut streams = Vec::new();
        for kind in [
            SignalKind::terminate(),
            SignalKind::interrupt(),
            SignalKind::user_defined1(),
            SignalKind::user_defined2(),
            SignalKind::hangup(),
        ] {
            streams.push(signal(kind).map_err(spawn_err)?);
        }
        let [term, int, usr1, usr2, hup] = &mut streams[..] else { unreachable!("five streams") };
        let (stderr_read, stderr_write) = std::io::pipe().map_err(spawn_err)?;
        let mut child = spawn(command, env, stderr_write).map_err(spawn_err)?;
        let started = Instant::now();
        let pid = child.id().unwrap_or_default();
        let group = Pid::from_raw(pid as i32);
        on_spawn(pid, events);
        let tail = Tail::default();
        let redactor = Redactor::new(&cfg.telemetry.secret_words);
        let tee = match stderr::tee(stderr_read, tail.clone(), redactor) {
            Ok(ended) => Some(ended),
            Err(e) => {
                // The program runs on; its stderr pipe, unread, may fill and
                // block it, which the stop still ends.
                tracing::error!(error = %e, "could not start the thread that reads the program's stderr");
                None
            }
        };
        let reports = progress.as_ref().and_then(|p| match p.channel.socket() {
            Ok(socket) => Some(socket),
            Err(e) => {
                tracing::error!(error = %e, "cannot watch the program's progress reports; no watchdog for it");
                None
            }
        });
        let (mut tracker, mut buf) = (Tracker::default(), [0u8; MAX_REPORT]);
        let (mut hang, mut echo, mut looked) = (None::<HangEvent>, false, None::<Instant>);
        let mut tick = tokio::time::interval(TICK);
        let (mut taken, mut forwarded, mut killed_at_deadline, mut lock_lost) = (None::<StopTaken>, 0, false, false);
        let (mut lost, mut kill_lost_at) = (None::<Vec<Lost>>, None::<Instant>);
        let status = loop {
            tokio::select! {
                status = child.wait() => break status.map_err(spawn_err)?,
                _ = term.recv() => {}
                _ = int.recv() => {}
                _ = usr1.recv() => {}
                _ = usr2.recv() => {}
                _ = hup.recv() => {}
                _ = tick.tick() => {}
                _ = readable(reports.as_ref()) => {}
            }
            if !lock_lost && lock.is_some_and(LockOwnership::is_lost) {
                lock_lost = true;
                tracing::error!(pid, "the run directory's lock was lost: killing the program's process group");
                kill_group(group, Signal::SIGKILL);
            }
            if let Some(socket) = &reports {
                let before = tracker.lowest_step();
                while let Ok(n) = socket.try_recv(&mut buf) {
                    if !tracker.take(&buf[..n], Instant::now()) && tracker.dropped == 1 {
                        tracing::warn!(pid, "a datagram on the progress socket was not a report; dropped (and any more)");
                    }
                }
                if let (Some(step), Some(live)) = (tracker.lowest_step(), liveness)
                    && before != Some(step)
                {
                    live.at_step(step);
                }
            }
            if let Some(p) = &progress
                && hang.is_none()
                && !echo
                && taken.is_none()
                && lost.is_none()
                && !lock_lost
                && let Some(found) = tracker.overdue(&cfg.watchdog, Instant::now())
            {
                let act = match p.role {
                    HangRole::Decides { announce } => {
                        record_hang(events, &found, pid, "ending the program");
                        announce(&found);
                        true
                    }
                    HangRole::Follows { announced } => {
                        if looked.is_none_or(|at| at.elapsed() >= NOTICE_LOOK) {
                            looked = Some(Instant::now());
                            echo = announced();
                        }
                        let own = !echo && found.stuck_seconds >= 2.0 * found.limit_seconds;
                        if own {
                            record_hang(events, &found, pid, "task 0 said nothing of it: ending this task's program");
                        } else if echo {
                            tracing::warn!(pid, "task 0 found a rank of the world hung: ending this task's program");
                        }
                        echo || own
                    }
                };
                if act {
                    kill_group(group, Signal::SIGTERM);
                    kill_lost_at = Some(Instant::now() + LOST_GRACE);
                    hang = (!echo).then_some(found);
                }
            }
            if lost.is_none()
                && let Some(found) = liveness.and_then(Liveness::lost)
            {
                let tasks = found.iter().map(|l| l.rank.to_string()).collect::<Vec<_>>().join(", ");
                tracing::error!(pid, tasks = %tasks, "another task of the job step was lost: ending the program (SIGTERM, SIGKILL {}s later)", LOST_GRACE.as_secs());
                kill_group(group, Signal::SIGTERM);
                kill_lost_at = Some(Instant::now() + LOST_GRACE);
                lost = Some(found);
            }
            if kill_lost_at.is_some_and(|at| Instant::now() >= at) {
                kill_lost_at = None;
                tracing::error!(pid, "the program did not end within {}s of the loss or hang: killing its process group", LOST_GRACE.as_secs());
                kill_group(group, Signal::SIGKILL);
            }
            let count = stop.count();
            // The first handler publishes its signal right after claiming
            // it: a second signal counted in between waits for the next
            // tick, so the stop is taken with the signal that came first.
            let first = if taken.is_none() { stop.signal() } else { None };
            if count > forwarded && (taken.is_some() || first.is_some()) {
                if let Some(first) = first {
                    taken = Some(take_stop(first, cfg, env, events));
                }
                tracing::warn!(pid, signals = count, "forwarding the stop to the program's process group (SIGTERM)");
                for _ in forwarded..count {
                    kill_group(group, Signal::SIGTERM);
                }
                forwarded = count;
            }
            if let Some(t) = &taken
                && !killed_at_deadline
                && budget::exit_now(count, t.deadline, Instant::now())
            {
                killed_at_deadline = true;
                tracing::error!(
                    pid,
                    signals = count,
                    "the program is still running at the stop deadline (or a third signal came): killing its process \
                 group; the last sealed checkpoint stands"
                );
                kill_group(group, Signal::SIGKILL);
            }
        };
        // Whatever of the group outlived its leader (workers it did not reap)
        // must not train on: the group goes.
        kill_group(group, Signal::SIGKILL);
        if let Some(ended) = tee {
            let until = Instant::now() + STDERR_DRAIN;
            while !ended.load(Ordering::Acquire) && Instant::now() < until {
                tokio::time::sleep(DRAIN_TICK).await;
            }
        }
        let stderr_tail = tail.lock().unwrap_or_else(PoisonError::into_inner).iter().cloned().collect();
        Ok(Supervised {
            pid,
            status,
            stop: taken,
            killed_at_deadline,
            lock_lost,
            lost,
            hang,
            hang_echo: echo,
            stderr_tail,
            seconds: started.elapsed().as_secs_f64(),
        })
    })
}

/// The `hang` event of a rank past its limit, synced at once (the program
/// is ended right after), and the log line of what happens next.
fn record_hang(events: &mut EventLog, found: &HangEvent, pid: u32, next: &str) {
    tracing::error!(
        pid,
        rank = found.rank,
        activity = %found.activity,
        step = found.step,
        stuck_s = format!("{:.1}", found.stuck_seconds),
        limit_s = format!("{:.1}", found.limit_seconds),
        "HANG: a rank of the program made no progress past its [watchdog] limit: {next} (SIGTERM, SIGKILL {}s \
         later); the job resumes from the newest committed checkpoint",
        LOST_GRACE.as_secs()
    );
    record_or_log(events, &Event::Hang(found.clone()));
    if let Err(e) = events.sync() {
        tracing::error!(error = %e, "could not sync events.jsonl");
    }
}

/// Ready to read when `socket` has a datagram; never without a socket.
async fn readable(socket: Option<&tokio::net::UnixDatagram>) -> std::io::Result<()> {
    match socket {
        Some(socket) => socket.readable().await,
        None => std::future::pending().await,
    }
}

/// The child: its own process group, the contract's environment, stderr
/// into `stderr` (a pipe read by stderr.rs's thread: a blocking one, which
/// tokio's own pipes are not), and the parent-death signal.
fn spawn(command: &[OsString], env: &ChildEnv, stderr: std::io::PipeWriter) -> std::io::Result<tokio::process::Child> {
    let (program, args) = command.split_first().ok_or_else(|| std::io::Error::other("no command given"))?;
    let mut cmd = tokio::process::Command::new(program);
    // `cmd` holds our copy of the write end until it is dropped on return,
    // so the reader sees the end of the stream when the program's copies close.
    cmd.args(args).envs(env.all_vars()).stderr(stderr).process_group(0).kill_on_drop(true);
    for var in env.unset() {
        cmd.env_remove(var);
    }
    let parent = nix::unistd::getpid();
    // SAFETY: between fork and exec only async-signal-safe calls: prctl and getppid.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)?;
            // The parent may have died before the death signal was armed.
            if nix::unistd::getppid() != parent {
                return Err(std::io::Error::other("rekindle exited before the program started"));
            }
            Ok(())
        });
    }
    cmd.spawn()
}

/// The first stop: its deadline, the stop file (written before the first
/// SIGTERM, so a program that checks the file on the signal finds it) and
/// the `signal` event.
fn take_stop(signal: SignalStop, cfg: &Config, env: &ChildEnv, events: &mut EventLog) -> StopTaken {
    let (reason, arrival) = (StopReason::Signal(signal), signal.arrival);
    let mut deadline = budget::stop_deadline(reason, cfg.signals.grace, cfg.signals.safety_margin);
    let unix_now = chrono::Utc::now().timestamp_millis() as f64 / 1000.0;
    let notice = StopNotice {
        signal: reason.name(),
        deadline: unix_now + budget::seconds_left(deadline, Instant::now()).unwrap_or(0.0),
    };
    match publish_stop(&env.stop_file, &notice) {
        Ok(None) => {}
        // Another task's supervisor wrote it first (a job step of several,
        // one stop file): its deadline is the world's.
        Ok(Some(first)) => {
            let ahead = Duration::from_secs_f64((first.deadline - unix_now).max(0.0));
            deadline = Some(Deadline { at: Instant::now() + ahead });
            tracing::info!(signal = %first.signal, deadline = first.deadline, "another task's stop came first: its deadline holds for this one too");
        }
        Err(e) => {
            tracing::error!(error = %e, path = %env.stop_file.display(), "could not write the stop file; the program still gets SIGTERM");
        }
    }
    let left = budget::seconds_left(deadline, Instant::now());
    tracing::warn!(reason = %reason.name(), seconds_left = ?left, "stop requested: the program has until the deadline to seal a checkpoint and exit");
    record_or_log(
        events,
        &Event::Signal(crate::telemetry::Signal {
            signal: reason.name(),
            step: None,
            arrival: Some(instant_to_rfc3339(arrival)),
            deadline_in_seconds: Some(left),
            before_training: false,
        }),
    );
    StopTaken { reason, deadline }
}

/// Writes the stop file unless it exists: `Ok(None)` when this notice is
/// the stop file now, `Ok(Some(first))` with the notice another process
/// wrote first. The file appears whole or not at all (a temporary file,
/// hard-linked into place: the link fails if the name exists), so that the
/// supervisors of one job step agree on one deadline.
///
/// Everything goes through the run directory's handle: the temporary file
/// is created `O_EXCL` (a link or a file a program left at its name is
/// never written through) and the stop file is read back without
/// following a link.
fn publish_stop(path: &std::path::Path, notice: &StopNotice) -> std::io::Result<Option<StopNotice>> {
    use std::io::Write;
    let (dir, name) = crate::confine::Dir::open_parent(path)?;
    // A name of its own (`O_EXCL`, the next one if taken: the supervisors
    // of other nodes, even with the same pid, never share it), removed
    // when it goes out of scope.
    let mut tmp = crate::confine::TempFile::new_in(&dir, ".stop-")?;
    tmp.file.write_all(&notice.to_bytes())?;
    tmp.file.sync_all()?;
    let linked = dir.hard_link(tmp.name(), &name);
    drop(tmp);
    match linked {
        Ok(()) => dir.sync().map(|()| None),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let bytes = dir.read_bounded(name, 1 << 16)?;
            serde_json::from_slice(&bytes).map(Some).map_err(std::io::Error::other)
        }
        Err(e) => Err(e),
    }
}

/// Sends `sig` to the whole group; a group already gone is fine.
fn kill_group(group: Pid, sig: Signal) {
    if group.as_raw() <= 0 {
        return;
    }
    if let Err(e) = killpg(group, sig)
        && e != nix::errno::Errno::ESRCH
    {
        tracing::error!(error = %e, group = group.as_raw(), signal = %sig, "could not signal the program's process group");
    }
}

/// The command line as rekindle records and shows it (`child_start`, the
/// `start` placement, messages): redacted (`telemetry::Redactor`) unless
/// `[telemetry] record_raw_command` (lossy UTF-8 either way).
pub fn recorded_command(cfg: &Config, command: &[OsString]) -> Vec<String> {
    let args: Vec<String> = command.iter().map(|a| a.to_string_lossy().into_owned()).collect();
    if cfg.telemetry.record_raw_command { args } else { Redactor::new(&cfg.telemetry.secret_words).args(&args) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_is_recorded_redacted_unless_raw_is_asked_for() {
        let command: Vec<OsString> = ["prog", "--api-key=sk-1", "--token", "t", "--lr", "1"].map(OsString::from).into();
        let mut cfg = Config::default();
        assert_eq!(recorded_command(&cfg, &command), ["prog", "--api-key=***", "--token", "***", "--lr", "1"]);
        cfg.telemetry.record_raw_command = true;
        assert_eq!(recorded_command(&cfg, &command), ["prog", "--api-key=sk-1", "--token", "t", "--lr", "1"]);
    }
}
