//! `rekindle exec -- CMD`: any training program (PyTorch, JAX, numpy, a
//! shell script) as a child under the lifecycle of `rekindle run`, reusing
//! its pieces (the lock, `rundir`, the start's quarantine and records, the
//! ending's requeue, publish and crash decisions):
//!
//! ```text
//! exec         load config ─ progress guard and node check
//!              (attempt/health.rs) ─ the opening both drivers share
//!              (attempt/opening.rs): claim the run dir, refuse `run`'s
//!              checkpoints, lock it, prepare it ─ empty the staging dir ─
//!              `start` ─ newest files checkpoint that verifies (newer damaged
//!              ones recorded and quarantined) ─ `resume` or fresh start ─
//!              trim metrics, exports (TensorBoard, Prometheus:
//!              attempt/exports.rs) ─ monitor
//! child.rs     spawn (own process group, parent-death signal, contract
//!              environment: contract.rs) ─ `child_start` ─ wait on exit,
//!              stop signals (stop file + SIGTERM to the group), the deadline
//!              (SIGKILL), a lost lock (SIGKILL), a hung rank (progress.rs)
//! progress.rs  the ranks' progress reports (`rk.step()`) on a private Unix
//!              datagram socket: the task's step in its heartbeat, and the
//!              watchdog: a rank past its `[watchdog]` limit is a hang
//! stderr.rs    the program's stderr on a thread of its own: teed, split
//!              into bounded lines, redacted, the tail kept for `child_exit`
//! verdict.rs   finished / stopped / crashed (classified) / lock lost
//!              (a lost task and a hang are the supervisor's: `rank_lost`,
//!              `hang`, with the in-job restart or requeue of attempt/lost.rs)
//! exec         `child_exit` ─ finished: summary, publish, `finish`, exit 0
//!              ─ stopped: requeue, summary, publish, `stop`; exit 75 with a
//!              durable checkpoint, else 1 ─ crashed: requeue when transient
//!              (bounded), `error`, exit 1
//! seal.rs      `rekindle seal DIR --step N`: a staged directory becomes a
//!              checkpoint (checkpoint/files.rs) under the supervisor's lock;
//!              with `--rank R --world-size W` one rank's part of the
//!              world's checkpoint (checkpoint/world.rs)
//! world.rs     a job step of several tasks: task 0 runs all of the above
//!              and publishes what the others need; they run their copy of
//!              the program with the same contract and torch's env://
//!              variables, and exit with task 0's code; every task beats and
//!              watches the others' beats: a lost task ends the world's
//!              programs (`rank_lost`, exit 75 with a world checkpoint)
//! ```

mod child;
mod contract;
mod progress;
mod seal;
mod stderr;
mod verdict;
mod world;

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::checkpoint::{CheckpointKind, CheckpointStore, MANIFEST_FILE, VerifyLevel, read_manifest};
use crate::config::{self, Config};
use crate::exit::Outcome;
use crate::slurm::SlurmEnv;
use crate::telemetry::{
    ChildExit, ChildStart, ErrorEvent, Event, EventLog, Finish, PublishOutcome, RecordedEvent, Start, Stop, Summary,
    SummaryState, now_rfc3339,
};

use crate::attempt::board::{Board, Link, SharedLink};
use crate::attempt::budget;
use crate::attempt::deadline::Deadline;
use crate::attempt::devices;
use crate::attempt::ending::{Failure, StopRequeue, publish_results, record_failure, record_or_log};
use crate::attempt::error::RunError;
use crate::attempt::lost::{lost_message, newest_valid, record_hang, record_loss};
use crate::attempt::opening;
use crate::attempt::rank_watch::Lost;
use crate::attempt::records::{context, fresh_start, last_logged_step, previous_summary, resume_record};
use crate::attempt::stop::StopFlag;
use crate::rundir::{self, EVENTS_FILE, METRICS_FILE, RunDir, SUMMARY_FILE};
use child::{StopTaken, Supervised};
use contract::ChildEnv;
use verdict::{ChildEnd, Verdict};
use world::{Launch, Liveness, Role, WorldRecord};

pub use contract::{
    ENV_BIN, ENV_CHECKPOINT_DIR, ENV_DEADLINE, ENV_EXEC_HOST, ENV_EXEC_PID, ENV_PROTOCOL, ENV_RESUME_FROM, ENV_RUN_DIR,
    ENV_STOP_FILE, PROTOCOL, STOP_FILE,
};
pub use seal::{SealOptions, seal};

/// What `rekindle exec` was asked to do.
#[derive(Debug, Clone, Default)]
pub struct ExecOptions {
    /// The TOML config; without one, every default (then `run_dir` is needed).
    pub config_path: Option<PathBuf>,
    pub overrides: Vec<String>,
    pub run_dir: Option<PathBuf>,
    pub allow_config_change: bool,
    /// The program and its arguments.
    pub command: Vec<OsString>,
}

/// Runs the program under the lifecycle (module header); `Done` when it
/// finished, `StoppedWithCheckpoint` after a stop with a durable checkpoint.
/// In a job step of several tasks, task 0 does so and tells the others how
/// it ended; the others follow it (world.rs).
pub fn exec(opts: &ExecOptions) -> Result<Outcome, RunError> {
    let stop = StopFlag::install().map_err(|source| RunError::RunDir { path: PathBuf::from("<signals>"), source })?;
    let slurm = SlurmEnv::from_process();
    let leader = match Role::of(&slurm) {
        Role::Follower(launch) => return follow(opts, &stop, slurm, &launch),
        Role::Leader(launch) => Some(launch),
        Role::Alone => None,
    };
    let mut board = None;
    let result = lead(opts, &stop, slurm, leader.as_ref(), &mut board);
    if let (Some(board), Some(launch)) = (&board, &leader) {
        let code = match &result {
            Ok(outcome) => outcome.code(),
            Err(e) => e.outcome().code(),
        };
        world::publish_end(board, &launch.id, code);
    }
    result
}

/// The lifecycle of one `rekindle exec` (the module header), for a step of
/// one task or as task 0 of several (`leader`: then the world record is
/// published before the program starts). `board` is opened once the staging
/// directory is known (task 0 holds the lock then), for the others' waits
/// (channel.rs) and the leader's end record.
fn lead(
    opts: &ExecOptions,
    stop: &StopFlag,
    slurm: SlurmEnv,
    leader: Option<&Launch>,
    board: &mut Option<Board>,
) -> Result<Outcome, RunError> {
    let stop = stop.clone();
    let (cfg, max_steps) = load_config(opts)?;
    let root = rundir::resolve_run_dir(opts.run_dir.as_deref(), &cfg);
    // The progress guard and this node's check, before the run directory is
    // touched (attempt/health.rs).
    crate::attempt::health::before_start(&cfg, &slurm, &root, true, &stop)?;
    // Rekindle's own checkpoints are continued by `rekindle run`, not by a
    // program (attempt/opening.rs: the opening both drivers share).
    let held =
        opening::claim(root, &cfg, CheckpointKind::Files)?.hold(&cfg, &slurm, opts.allow_config_change, |_| Ok(()))?;
    // The supervisor commits nothing itself (`rekindle seal` does), but it
    // quarantines and removes staged leftovers: only as the lock's owner.
    // Emptied before task 0 says where it listens there (below). The
    // previous launch's world files (channel.rs) go without a word.
    for leftover in held.store.reset_staging()? {
        if !leftover.file_name().is_some_and(|n| n.to_string_lossy().starts_with(".exec-")) {
            tracing::warn!(path = %leftover.display(), "removed a staged checkpoint that was never sealed");
        }
    }
    if let Some(launch) = leader {
        // The others connect now and wait on the connection while this task
        // verifies checkpoints and prepares.
        // Their records come through it too: one writer of events.jsonl.
        let host = crate::slurm::hostname();
        let relay_to = held.dir.path(EVENTS_FILE);
        *board = Some(Board::open(&held.store.staging_dir(), &launch.id, &host, launch.size as usize, Some(&relay_to)));
    }
    // Secrets redacted unless `[telemetry] record_raw_command`.
    let recorded = child::recorded_command(&cfg, &opts.command);
    // Each task's node as SLURM's variables lay them out (world.rs).
    let rank_nodes = leader.and_then(|_| world::task_nodes(&slurm));
    let placement = serde_json::json!({"exec": recorded.join(" ")});
    let mut events = held.open_records(
        &slurm,
        Start {
            world_size: leader.map(|l| l.size as usize),
            rank_nodes: rank_nodes.clone(),
            ..opening::start_record(&cfg, &held.dir, &slurm, max_steps, placement)
        },
    )?;
    let found = held.store.newest_files_checkpoint()?;
    let resumed = found.newest;
    let start_step = resumed.as_ref().map(|c| c.step);
    // Only the program knows when it is done: a stop before it started is
    // never "finished" (max_steps = u64::MAX).
    if let Some(early) = held.settle(&mut events, &found.rejected, &stop, start_step, u64::MAX, (&cfg, &slurm))? {
        return Ok(early);
    }
    let dir = &held.dir;
    let resumes = previous_summary(dir).map(|s| s.resumes).unwrap_or(0);
    let resumes = match &resumed {
        Some(c) => {
            let created_at = read_manifest(&c.dir).map(|m| m.created_at).unwrap_or_default();
            let last_logged = last_logged_step(&dir.path(METRICS_FILE));
            let resume = resume_record(c.step, &c.dir, &created_at, last_logged, &slurm, chrono::Utc::now());
            tracing::info!(step = c.step, dir = %c.dir.display(), "the program resumes from this checkpoint");
            events.record(&Event::Resume(resume))?;
            resumes + 1
        }
        None => {
            fresh_start(&mut events, found.rejected.len())?;
            resumes
        }
    };
    // The program logged steps past the checkpoint before it was stopped:
    // it trains them again, so their lines go (every step exactly once);
    // what it logs next (log_metrics) goes into TensorBoard and the
    // textfile. Dropped after the attempt's last records.
    let _exports = held.begin(&cfg, &slurm, start_step.unwrap_or(0))?;
    let opening::Held { lock, dir, store } = held;
    let ownership = lock.ownership();
    let _ = crate::confine::Dir::open(&dir.root).and_then(|root| root.remove_file(contract::STOP_FILE));
    let monitor = devices::start_job_monitor(&cfg, &dir);
    let mut env = ChildEnv {
        run_dir: absolute(&dir.root),
        resume_from: resumed.as_ref().map(|c| absolute(&c.dir)),
        checkpoint_dir: absolute(&store.staging_dir()),
        stop_file: absolute(&contract::stop_file(&dir.root)),
        deadline: slurm.end_time,
        bin: current_exe()?,
        exec_pid: std::process::id(),
        exec_host: None,
        progress: None,
        launcher: Vec::new(),
    };
    let channel = open_progress(&cfg);
    env.progress = channel.as_ref().map(|c| c.path().to_path_buf());
    let mut liveness = None;
    if let (Some(launch), Some(board)) = (leader, board.as_ref()) {
        // The other tasks start their programs only now, with what this one
        // decided: the checkpoint to resume from, the lock seals commit under.
        let record = WorldRecord {
            launch: launch.id.clone(),
            exec_pid: env.exec_pid,
            exec_host: slurm.node_name(),
            master_addr: crate::slurm::hostname(),
            master_port: world::free_port()?,
            resume_from: env.resume_from.clone(),
            resume_step: start_step,
            checkpoint_dir: env.checkpoint_dir.clone(),
            stop_file: env.stop_file.clone(),
            deadline: env.deadline,
        };
        env.exec_host = Some(record.exec_host.clone());
        env.launcher = launcher_vars(launch, &record);
        // Beating before the others can start: a leader that cannot beat
        // fails here, before any program of the world runs.
        liveness = Some(Liveness::start(&dir.root, launch, &record, slurm.node_name(), cfg.distributed.timeout)?);
        board.post(&record)?;
        tracing::info!(tasks = launch.size, master = %format!("{}:{}", record.master_addr, record.master_port), "task 0 of the job step: the other tasks start their programs");
    }
    let task = leader.map(|l| l.rank);
    let attempt = ExecAttempt {
        cfg,
        max_steps,
        dir,
        store,
        slurm,
        started: Instant::now(),
        start_step,
        resumes,
        monitor,
        rank_nodes,
        world_size: leader.map(|l| l.size as usize),
    };
    let on_spawn = |pid, ev: &mut EventLog| record_child_start(ev, &recorded, pid, &env, start_step, task);
    // Task 0 tells the others before it ends its program, so that theirs
    // failing then is known for the hang's echo (follow_program).
    let announce = |hang: &crate::telemetry::HangEvent| {
        if let (Some(launch), Some(board)) = (leader, board.as_ref()) {
            let notice = world::WorldHang { launch: launch.id.clone(), rank: hang.rank, step: hang.step };
            if let Err(e) = board.post(&notice) {
                tracing::error!(error = %e, "could not tell the other tasks of the hang; their programs' failure may read as their own");
            }
        }
    };
    let progress = channel
        .as_ref()
        .map(|channel| child::Progress { channel, role: child::HangRole::Decides { announce: &announce } });
    let supervised = child::supervise(
        &opts.command,
        &env,
        &attempt.cfg,
        &stop,
        Some(&ownership),
        liveness.as_ref(),
        progress,
        &mut events,
        on_spawn,
    );
    let result = match supervised {
        Ok(ran) => {
            let lost = world_loss(&ran, liveness.as_ref());
            attempt.end(&mut events, ran, &stop, &opts.command, task, lost)
        }
        Err(e) => {
            let (class, why) = crate::attempt::crash::classify(&e, 0);
            attempt.fail(&mut events, &e, class, &why);
            Err(e)
        }
    };
    if let Some(liveness) = liveness {
        liveness.finish();
    }
    result
}

/// The tasks lost while this task's program ran: found by the watch (the
/// program was ended for it), or, when the program failed unasked, found
/// while waiting for the other tasks to settle (`Liveness::settle`). From
/// now on this task's beats say its program ended.
fn world_loss(ran: &Supervised, liveness: Option<&Liveness>) -> Option<Vec<Lost>> {
    let liveness = liveness?;
    liveness.program_ended();
    if ran.lost.is_some() {
        return ran.lost.clone();
    }
    let failed_unasked = ran.stop.is_none() && ran.hang.is_none() && !ran.lock_lost && !ran.status.success();
    if !failed_unasked {
        return None;
    }
    tracing::info!("the program failed: waiting for the other tasks' programs to end, or for a lost task to be found");
    liveness.settle()
}

/// A task other than 0 of a job step of several (world.rs): waits for task
/// 0's world record, runs its own copy of the program with the same
/// contract, and exits with task 0's code; with 1 as soon as the other
/// tasks are seen alive when its program failed unasked (`srun
/// --kill-on-bad-exit` then ends the other tasks); with 75 (or 1 without a
/// world checkpoint) when a task was lost. It takes no lock and records
/// only its `child_start` and `child_exit` (through task 0, which appends
/// them: attempt/board.rs), and the records of a loss when task 0 is the one
/// lost (itself then).
fn follow(opts: &ExecOptions, stop: &StopFlag, slurm: SlurmEnv, launch: &Launch) -> Result<Outcome, RunError> {
    let (cfg, _) = load_config(opts)?;
    let root = rundir::resolve_run_dir(opts.run_dir.as_deref(), &cfg);
    // Every task checks its own node (task 0 keeps the progress guard).
    crate::attempt::health::before_start(&cfg, &slurm, &root, false, stop)?;
    let staging = CheckpointStore::open_read_only(rundir::checkpoints_dir(&root, &cfg)).staging_dir();
    // Task 0 may take the lock over from a dead holder or verify a large
    // checkpoint first: as long as a rank may be silent.
    let (timeout, grace) = (cfg.distributed.timeout, cfg.signals.grace);
    tracing::info!(task = launch.rank, tasks = launch.size, "waiting for task 0 of the job step to start");
    // One link to task 0 for the launch: the record, then the end (channel.rs).
    let link = SharedLink::new(Link::new(&staging, &launch.id));
    let waited = world::wait_for_record(&mut link.lock(), timeout, stop)?;
    let Some(record) = waited else {
        tracing::warn!("stopped before the program started: task 0 decides what comes next");
        return Ok(Outcome::from_code(world::wait_for_end(&mut link.lock(), timeout + grace)?));
    };
    let liveness = Liveness::start(&root, launch, &record, slurm.node_name(), timeout)?;
    let result = follow_program(opts, stop, &slurm, launch, &cfg, &root, &link, &record, &liveness);
    liveness.finish();
    result
}

/// A follower's program, from its start to this task's exit code (`follow`).
#[allow(clippy::too_many_arguments)]
fn follow_program(
    opts: &ExecOptions,
    stop: &StopFlag,
    slurm: &SlurmEnv,
    launch: &Launch,
    cfg: &Config,
    root: &std::path::Path,
    link: &SharedLink,
    record: &WorldRecord,
    liveness: &Liveness,
) -> Result<Outcome, RunError> {
    let (timeout, grace) = (cfg.distributed.timeout, cfg.signals.grace);
    let mut events = EventLog::open(root.join(EVENTS_FILE), context(slurm))?;
    // Task 0 appends this task's records (one writer of events.jsonl); it
    // writes them itself where task 0 does not take them.
    events.relay_through(Box::new(link.clone()));
    let env = ChildEnv {
        run_dir: absolute(root),
        resume_from: record.resume_from.clone(),
        checkpoint_dir: record.checkpoint_dir.clone(),
        stop_file: record.stop_file.clone(),
        deadline: record.deadline,
        bin: current_exe()?,
        exec_pid: record.exec_pid,
        exec_host: Some(record.exec_host.clone()),
        progress: None,
        launcher: launcher_vars(launch, record),
    };
    // This task's ranks report here too: their step goes into its heartbeat.
    let channel = open_progress(cfg);
    let env = ChildEnv { progress: channel.as_ref().map(|c| c.path().to_path_buf()), ..env };
    let announced = || world::hang_posted(&record.checkpoint_dir, &launch.id).is_some();
    let progress = channel
        .as_ref()
        .map(|channel| child::Progress { channel, role: child::HangRole::Follows { announced: &announced } });
    let recorded = child::recorded_command(cfg, &opts.command);
    let task = Some(launch.rank);
    let on_spawn = |pid, ev: &mut EventLog| record_child_start(ev, &recorded, pid, &env, record.resume_step, task);
    let ran = child::supervise(&opts.command, &env, cfg, stop, None, Some(liveness), progress, &mut events, on_spawn)?;
    let end = ChildEnd::from_status(ran.status);
    // Task 0 found a rank hung and ended its program (its notice is written
    // before): this program's failure is that hang's echo, task 0 records it.
    let failed = ran.stop.is_none() && ran.hang.is_none() && !ran.status.success();
    if ran.hang_echo || (failed && announced()) {
        liveness.program_ended();
        tracing::warn!(task = launch.rank, how = %end.describe(), "the program ended after task 0 found a rank hung; waiting for task 0 to end the attempt");
        record_or_log(&mut events, &child_exit(&ran, end, &Verdict::Hang, None, 0, task));
        let _ = events.sync();
        let bound = grace + 2 * budget::SCONTROL_TIMEOUT + LOST_GRACE_BOUND;
        return Ok(Outcome::from_code(world::wait_for_end(&mut link.lock(), bound)?));
    }
    if let Some(lost) = world_loss(&ran, Some(liveness)) {
        record_or_log(&mut events, &child_exit(&ran, end, &Verdict::RankLost, None, 0, task));
        return Ok(follower_loss(cfg, slurm, root, link, launch, liveness, &mut events, &lost));
    }
    if let Some(hang) = &ran.hang {
        // Its own rank hung while task 0's went on: its failure ends the
        // job step (srun --kill-on-bad-exit), and task 0 takes that as a stop.
        liveness.program_ended();
        record_or_log(&mut events, &child_exit(&ran, end, &Verdict::Hang, None, 0, task));
        let _ = events.sync();
        let rank = hang.rank.map_or("a rank".to_string(), |r| format!("rank {r}"));
        let why = format!(
            "{rank} made no progress at step {} for {:.0}s (limit {:.0}s) while task 0's went on",
            hang.step, hang.stuck_seconds, hang.limit_seconds
        );
        tracing::error!(task = launch.rank, "{why}: ending this task, and with it the job step");
        return Err(RunError::ChildFailed {
            command: recorded.join(" "),
            how: end.describe(),
            class: crate::telemetry::CrashClass::Transient,
            why,
        });
    }
    let verdict = verdict::verdict(end, ran.stop.is_some(), false, 0, None);
    record_or_log(&mut events, &child_exit(&ran, end, &verdict, None, 0, task));
    let _ = events.sync();
    if let Verdict::Crashed { class, why } = verdict {
        tracing::error!(task = launch.rank, how = %end.describe(), "the program failed: ending this task, and with it the job step");
        return Err(RunError::ChildFailed { command: recorded.join(" "), how: end.describe(), class, why });
    }
    let (relayed, file_reads) = {
        let link = link.lock();
        (link.acked(), link.file_reads())
    };
    tracing::info!(task = launch.rank, how = %end.describe(), relayed, file_reads, "the program ended; waiting for task 0 to end the attempt");
    // Still watching: task 0's node may die while its program runs on.
    let ended = world::wait_for_end_or_loss(&mut link.lock(), timeout + grace, &|| liveness.lost())?;
    match ended {
        world::Ended::Code(code) => Ok(Outcome::from_code(code)),
        world::Ended::Lost(lost) => Ok(follower_loss(cfg, slurm, root, link, launch, liveness, &mut events, &lost)),
    }
}

/// A follower that found tasks of its world lost (its program ended, or
/// was ended for it): the lowest task left records the loss when task 0 is
/// among them (`attempt/lost.rs`); else task 0 does, and this task exits
/// with task 0's code once it has (an exit before it would make srun end
/// the step under the recording, `--kill-on-bad-exit`), or with its own
/// (75 when a world checkpoint verifies, else 1) past the recording's bound.
#[allow(clippy::too_many_arguments)]
fn follower_loss(
    cfg: &Config,
    slurm: &SlurmEnv,
    root: &std::path::Path,
    link: &SharedLink,
    launch: &Launch,
    liveness: &Liveness,
    events: &mut EventLog,
    lost: &[Lost],
) -> Outcome {
    // The newest checkpoint is looked up only by the task that records the
    // loss or ends with its own code: every task verifying the kept
    // checkpoints at once cost a loss N² opens (bench/control_plane.py).
    let newest = || newest_valid(&CheckpointStore::open_read_only(rundir::checkpoints_dir(root, cfg)));
    tracing::error!(task = launch.rank, "LOST TASKS: {}", lost_message(lost, cfg.distributed.timeout));
    let own = || if newest().is_some() { Outcome::StoppedWithCheckpoint } else { Outcome::Failure };
    let outcome = if liveness.records(lost) {
        // Task 0 is among the lost (else it would record): its connection
        // may look open (a node frozen or cut off sends nothing), so this
        // task's records go straight to the file.
        link.lock().leave();
        // A world that lost a task is never finished (max_steps: none).
        let mut record = |e: &Event| record_or_log(events, e);
        let path = root.join(EVENTS_FILE);
        record_loss(&mut record, cfg, slurm, &path, lost, liveness.rank(), liveness.size(), newest(), None)
    } else {
        let _ = events.sync();
        let bound = cfg.signals.grace + 2 * budget::SCONTROL_TIMEOUT;
        let waited = world::wait_for_end(&mut link.lock(), bound);
        match waited {
            Ok(code) => Outcome::from_code(code),
            Err(e) => {
                tracing::error!(task = launch.rank, error = %e, "exiting with this task's own code");
                own()
            }
        }
    };
    let _ = events.sync();
    outcome
}

/// `child_exit` for the program that ran as `ran` and ended as `end`.
fn child_exit(
    ran: &Supervised,
    end: ChildEnd,
    verdict: &Verdict,
    last_sealed_step: Option<u64>,
    sealed_this_attempt: u64,
    task: Option<u32>,
) -> Event {
    let (exit_code, signal) = match end {
        ChildEnd::Exited(code) => (Some(code), None),
        ChildEnd::Signaled(sig) => (None, Some(verdict::signal_name(sig))),
    };
    Event::ChildExit(ChildExit {
        pid: ran.pid,
        exit_code,
        signal,
        seconds: ran.seconds,
        stop_requested: ran.stop.is_some(),
        killed_at_deadline: ran.killed_at_deadline,
        last_sealed_step,
        sealed_this_attempt,
        verdict: verdict.name().into(),
        stderr_tail: ran.stderr_tail.clone(),
        task,
    })
}

/// torch's variables for `launch` that this process's environment lacks.
fn launcher_vars(launch: &Launch, record: &WorldRecord) -> Vec<(&'static str, String)> {
    world::torch_vars(launch, &record.master_addr, record.master_port)
        .into_iter()
        .filter(|(k, _)| std::env::var_os(k).is_none_or(|v| v.is_empty()))
        .collect()
}

/// How much longer than a stop's a follower waits for task 0 after a hang:
/// task 0 gives its program [`world::LOST_GRACE`] to end before SIGKILL.
const LOST_GRACE_BOUND: Duration = world::LOST_GRACE;

/// The progress socket for the program's ranks (progress.rs); `None` (no
/// watchdog, no step in the heartbeat) when none can be bound here.
fn open_progress(cfg: &Config) -> Option<progress::Channel> {
    let short = progress::too_short(&cfg.watchdog);
    if !short.is_empty() {
        tracing::warn!(
            "{}: a rank reports its progress about once a second, so a limit under {}s may call a rank that is only \
             between two reports hung; raise it",
            short.join(", "),
            2 * progress::REPORT_INTERVAL.as_secs()
        );
    }
    match progress::Channel::open() {
        Ok(channel) => Some(channel),
        Err(e) => {
            tracing::warn!(error = %e, "cannot bind the progress socket in the temporary directory: the program's ranks \
                 report no progress, and no watchdog watches them (set TMPDIR to a writable local folder)");
            None
        }
    }
}

fn current_exe() -> Result<PathBuf, RunError> {
    std::env::current_exe().map_err(|source| RunError::RunDir { path: "<current exe>".into(), source })
}

/// `child_start` for the program `pid` started with `env`.
fn record_child_start(
    events: &mut EventLog,
    recorded: &[String],
    pid: u32,
    env: &ChildEnv,
    resume_step: Option<u64>,
    task: Option<u32>,
) {
    tracing::info!(pid, command = %recorded.join(" "), "the program started");
    record_or_log(
        events,
        &Event::ChildStart(ChildStart {
            command: recorded.to_vec(),
            pid,
            protocol: PROTOCOL,
            resume_from: env.resume_from.clone(),
            resume_step,
            checkpoint_dir: env.checkpoint_dir.clone(),
            stop_file: env.stop_file.clone(),
            deadline: env.deadline,
            task,
        }),
    );
}

/// The config of `opts`, or every default with the overrides.
/// The config, and `[run] max_steps` where it is set (the file or `--set`):
/// the default means nothing for a program rekindle does not train.
fn load_config(opts: &ExecOptions) -> Result<(Config, Option<u64>), RunError> {
    let loaded = match &opts.config_path {
        Some(path) => config::load(path, &opts.overrides)?,
        None => config::from_str("", "<defaults>", &opts.overrides)?,
    };
    let max_steps = loaded.set_keys.contains("run.max_steps").then_some(loaded.config.run.max_steps);
    Ok((loaded.config, max_steps))
}

fn absolute(path: &std::path::Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// Checkpoints the program sealed.
#[derive(Debug, Clone, Copy)]
struct Sealed {
    this_attempt: u64,
    /// After the stop was requested (its stop checkpoint).
    after_stop: u64,
    /// Seconds from the stop signal to the first of those.
    seconds_to_durable: Option<f64>,
}

/// One attempt of `rekindle exec`, from the program's start to the exit.
struct ExecAttempt {
    cfg: Config,
    /// `[run] max_steps` where the config sets it.
    max_steps: Option<u64>,
    dir: RunDir,
    store: CheckpointStore,
    slurm: SlurmEnv,
    started: Instant,
    /// The step resumed from (`None`: a fresh start).
    start_step: Option<u64>,
    resumes: u64,
    monitor: Option<crate::gpu::Monitor>,
    /// Each task's node, in task order, in a job step of several where
    /// SLURM's variables say (`world::task_nodes`).
    rank_nodes: Option<Vec<String>>,
    /// Tasks of the job step, when several.
    world_size: Option<usize>,
}

impl ExecAttempt {
    /// The newest checkpoint that passes the quick check now.
    fn newest_step(&self) -> Option<u64> {
        match self.store.newest_valid(VerifyLevel::Quick) {
            Ok(newest) => newest.map(|i| i.step),
            Err(e) => {
                tracing::error!(error = %e, "cannot list the checkpoints; counting none");
                None
            }
        }
    }

    /// Checkpoints sealed in this attempt, and since its stop signal
    /// (`checkpoint_saved` events after the last `start`, and after its
    /// `signal`), and the seconds from the signal to the first of those.
    fn sealed(&self) -> Sealed {
        // This attempt's events only (from its `start`), streamed.
        let events = crate::telemetry::read_events_since(&self.dir.path(EVENTS_FILE), |e| e.name == "start")
            .ok()
            .flatten()
            .unwrap_or_default();
        let since = events.iter().rposition(|e| matches!(e.event, Event::Start(_))).map_or(0, |i| i + 1);
        let attempt = &events[since..];
        let saved = |e: &&RecordedEvent| matches!(e.event, Event::CheckpointSaved(_));
        let signal = attempt.iter().position(|e| matches!(e.event, Event::Signal(_)));
        let after_stop = signal.map_or(&[][..], |i| &attempt[i..]);
        let arrival = signal.and_then(|i| match &attempt[i].event {
            Event::Signal(s) => s.arrival.as_deref().and_then(|a| chrono::DateTime::parse_from_rfc3339(a).ok()),
            _ => None,
        });
        let first_after = after_stop.iter().find(saved).and_then(|e| e.time);
        let to_durable = arrival
            .zip(first_after)
            .map(|(a, t)| (t - a.with_timezone(&chrono::Utc)).num_milliseconds().max(0) as f64 / 1000.0);
        Sealed {
            this_attempt: attempt.iter().filter(saved).count() as u64,
            after_stop: after_stop.iter().filter(saved).count() as u64,
            seconds_to_durable: to_durable,
        }
    }

    fn end(
        self,
        events: &mut EventLog,
        ran: Supervised,
        stop: &StopFlag,
        command: &[OsString],
        task: Option<u32>,
        lost: Option<Vec<Lost>>,
    ) -> Result<Outcome, RunError> {
        let end = ChildEnd::from_status(ran.status);
        let seals = self.sealed();
        let sealed = seals.this_attempt;
        let newest = self.newest_step();
        if let Some(lost) = lost.filter(|_| !ran.lock_lost) {
            record_or_log(events, &child_exit(&ran, end, &Verdict::RankLost, newest, sealed, task));
            return Ok(self.lost_world(events, &lost, newest, sealed));
        }
        if let Some(hang) = ran.hang.as_ref().filter(|_| !ran.lock_lost) {
            record_or_log(events, &child_exit(&ran, end, &Verdict::Hang, newest, sealed, task));
            return Ok(self.hung(events, hang, newest, sealed));
        }
        // Its last step sealed in this attempt: `[run] max_steps` set and reached.
        let completed = self.max_steps.filter(|&last| newest.is_some_and(|n| n >= last));
        let verdict = verdict::verdict(end, ran.stop.is_some(), ran.lock_lost, sealed, completed);
        tracing::info!(pid = ran.pid, how = %end.describe(), verdict = verdict.name(), sealed, "the program ended");
        if verdict == Verdict::LockLost {
            // Another process owns the run directory: nothing more is written.
            return Err(RunError::LockLost { dir: self.dir.root.clone() });
        }
        record_or_log(events, &child_exit(&ran, end, &verdict, newest, sealed, task));
        match verdict {
            Verdict::Finished => self.finish(events, newest, sealed),
            Verdict::TeardownFault { why } => {
                tracing::warn!(pid = ran.pid, "{why}: the run counts as finished");
                self.finish(events, newest, sealed)
            }
            Verdict::Stopped => {
                let taken = ran.stop.expect("a stopped verdict has a stop");
                self.stopped(events, taken, stop, newest, seals, ran.killed_at_deadline)
            }
            Verdict::Crashed { class, why } => {
                let error = RunError::ChildFailed {
                    command: child::recorded_command(&self.cfg, command).join(" "),
                    how: end.describe(),
                    class,
                    why: why.clone(),
                };
                self.write_summary(SummaryState::Failed, newest, sealed);
                self.fail(events, &error, class, &why);
                Err(error)
            }
            Verdict::LockLost | Verdict::RankLost | Verdict::Hang => unreachable!("returned above"),
        }
    }

    /// Another task of the world was lost and the programs are ended: task
    /// 0 records the loss and its requeue or in-job restart
    /// (`attempt/lost.rs`, as `run`'s ranks do), the summary says stopped
    /// (or failed with no checkpoint); 75 when a world checkpoint verifies.
    fn lost_world(mut self, events: &mut EventLog, lost: &[Lost], newest: Option<u64>, sealed: u64) -> Outcome {
        let timeout = self.cfg.distributed.timeout;
        tracing::error!(task = 0, "LOST TASKS: {}", lost_message(lost, timeout));
        let _ = devices::stop_monitor(self.monitor.take(), events);
        let state = if newest.is_some() { SummaryState::Stopped } else { SummaryState::Failed };
        self.write_summary(state, newest, sealed);
        let path = self.dir.path(EVENTS_FILE);
        let size = self.world_size.unwrap_or(1);
        let mut record = |e: &Event| record_or_log(events, e);
        // A world that lost a task is never finished (max_steps: none).
        let outcome = record_loss(&mut record, &self.cfg, &self.slurm, &path, lost, 0, size, newest, None);
        if let Err(e) = events.sync() {
            tracing::error!(error = %e, "could not sync events.jsonl");
        }
        outcome
    }

    /// A rank of the program hung and the program was ended (its `hang`
    /// event is written): the in-job restart or the requeue of a hang
    /// (`attempt/lost.rs`), the summary says stopped (or failed with no
    /// checkpoint); 75 when a checkpoint verifies.
    fn hung(
        mut self,
        events: &mut EventLog,
        hang: &crate::telemetry::HangEvent,
        newest: Option<u64>,
        sealed: u64,
    ) -> Outcome {
        let _ = devices::stop_monitor(self.monitor.take(), events);
        let state = if newest.is_some() { SummaryState::Stopped } else { SummaryState::Failed };
        self.write_summary(state, newest, sealed);
        let path = self.dir.path(EVENTS_FILE);
        let mut record = |e: &Event| record_or_log(events, e);
        let outcome = record_hang(&mut record, &self.cfg, &self.slurm, &path, hang, newest);
        if let Err(e) = events.sync() {
            tracing::error!(error = %e, "could not sync events.jsonl");
        }
        outcome
    }

    /// The program finished: summary, publish, `finish`, exit 0.
    fn finish(mut self, events: &mut EventLog, newest: Option<u64>, sealed: u64) -> Result<Outcome, RunError> {
        devices::stop_monitor(self.monitor.take(), events)?;
        self.write_summary(SummaryState::Finished, newest, sealed);
        let publish = self.publish(events, newest, "finished", None);
        events.record(&Event::Finish(Finish { step: newest.unwrap_or(0), publish }))?;
        tracing::info!(step = newest, "the program finished");
        Ok(Outcome::Done)
    }

    /// The stop path of `run/ending.rs`, in its order, with the program's
    /// last sealed checkpoint as the stop checkpoint: requeue decision,
    /// monitor, summary, publish, `stop`; 75 with a durable checkpoint.
    fn stopped(
        mut self,
        events: &mut EventLog,
        taken: StopTaken,
        stop: &StopFlag,
        newest: Option<u64>,
        seals: Sealed,
        killed: bool,
    ) -> Result<Outcome, RunError> {
        let sealed = seals.this_attempt;
        let StopTaken { reason, deadline, .. } = taken;
        let requeue_by = requeue_deadline_after(deadline, killed, self.cfg.signals.safety_margin);
        let requeued = StopRequeue::decide(&self.cfg, &self.slurm, reason, false, requeue_by, stop, events);
        let mut failures = Vec::new();
        if let Err(e) = devices::stop_monitor(self.monitor.take(), events) {
            failures.push(format!("monitor: {e}"));
        }
        let state = if newest.is_some() { SummaryState::Stopped } else { SummaryState::Failed };
        self.write_summary(state, newest, sealed);
        let publish = match requeued.publish_deadline(stop, deadline) {
            None => PublishOutcome::Skipped { skipped: "fast exit".into() },
            Some(until) => self.publish(events, newest, &reason.name(), until),
        };
        let requeue = requeued.record;
        let no_new = (seals.after_stop == 0).then(|| {
            if killed {
                "the program was killed at the stop deadline before it sealed a checkpoint after the stop".to_string()
            } else {
                "the program sealed no checkpoint after the stop".to_string()
            }
        });
        let Some(step) = newest else {
            let error = no_new.unwrap_or_else(|| "no checkpoint verifies".into());
            record_or_log(
                events,
                &Event::Error(ErrorEvent {
                    error: format!("stopped by {} with no checkpoint: {error}", reason.name()),
                    requeue: Some(requeue),
                    ..ErrorEvent::default()
                }),
            );
            let _ = events.sync();
            return Err(RunError::StopWithoutCheckpoint { reason: reason.name(), step: 0, error });
        };
        record_or_log(
            events,
            &Event::Stop(Stop {
                step: Some(step),
                reason: reason.name(),
                seconds_to_durable_checkpoint: seals.seconds_to_durable,
                seconds_left: Some(budget::seconds_left(deadline, Instant::now())),
                signals_received: Some(stop.count()),
                publish: Some(publish),
                requeue: Some(requeue),
                checkpoint_error: no_new.clone(),
                failures,
                ..Stop::default()
            }),
        );
        if let Err(e) = events.sync() {
            tracing::error!(error = %e, "could not sync events.jsonl");
        }
        match no_new {
            None => tracing::info!(step, "stopped with a durable checkpoint; run the same command again to continue"),
            Some(why) => tracing::warn!(
                step,
                dir = %self.store.step_dir(step).display(),
                "{why}: keeping the earlier checkpoint of step {step}, which verifies; run the same command again to \
                 continue from it"
            ),
        }
        Ok(Outcome::StoppedWithCheckpoint)
    }

    /// A failure: the requeue decision for its class, the `error` event,
    /// a failed summary (exit 1 follows).
    fn fail(mut self, events: &mut EventLog, error: &RunError, class: crate::telemetry::CrashClass, why: &str) {
        tracing::error!(class = ?class, %why, "the program failed; classified before exiting 1");
        let _ = devices::stop_monitor(self.monitor.take(), events);
        let failure = Failure { error, class, why: why.to_string(), step: self.newest_step(), stop_path: false };
        record_failure(&self.cfg, &self.slurm, failure, events, &self.dir.path(EVENTS_FILE));
        let _ = events.sync();
    }

    fn publish(
        &self,
        events: &mut EventLog,
        newest: Option<u64>,
        reason: &str,
        deadline: Option<Deadline>,
    ) -> PublishOutcome {
        let manifest = newest.map(|s| self.store.step_dir(s).join(MANIFEST_FILE));
        publish_results(&self.cfg, &self.dir.root, manifest, newest.unwrap_or(0), &self.slurm, reason, deadline, events)
    }

    /// `summary.json`: steps are the program's sealed steps (rekindle sees no
    /// others); the losses are the program's to log in metrics.jsonl.
    fn write_summary(&self, state: SummaryState, newest: Option<u64>, sealed: u64) {
        let steps = newest.unwrap_or(0);
        let summary = Summary {
            state,
            run: self.cfg.run.name.clone(),
            steps,
            max_steps: self.max_steps,
            final_loss: None,
            best_loss: None,
            wall_seconds_this_attempt: self.started.elapsed().as_secs_f64(),
            steps_this_attempt: steps.saturating_sub(self.start_step.unwrap_or(0)),
            resumes: self.resumes,
            checkpoints_written_this_attempt: sealed,
            last_checkpoint_step: newest,
            updated_at: now_rfc3339(),
            world_size: self.world_size,
            rank_nodes: self.rank_nodes.clone(),
        };
        let path = self.dir.path(SUMMARY_FILE);
        if let Err(e) = crate::rundir::write_atomically(&path, &summary.to_bytes()) {
            tracing::error!(error = %e, path = %path.display(), "could not write summary.json");
        }
    }
}

/// The deadline the requeue decision of a stop runs under. A program killed
/// at the stop deadline used all of its share of the grace, yet the requeue
/// is what brings the job back, and `scontrol requeue` takes milliseconds:
/// it still gets half of `[signals] safety_margin` (the other half stays for
/// the exit before SLURM's SIGKILL). Unlike `run`, whose own save is bounded,
/// a program too slow to save is the normal way an `exec` stop overruns, and
/// skipping the requeue would leave the job FAILED with its run unfinished.
fn requeue_deadline_after(
    deadline: Option<Deadline>,
    killed_at_deadline: bool,
    safety_margin: Duration,
) -> Option<Deadline> {
    match deadline {
        Some(d) if killed_at_deadline => Some(Deadline { at: d.at + safety_margin / 2 }),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_killed_at_the_deadline_leaves_the_requeue_half_the_safety_margin() {
        let now = Instant::now();
        let deadline = Some(Deadline { at: now });
        let margin = Duration::from_secs(10);
        let later = requeue_deadline_after(deadline, true, margin).unwrap();
        assert_eq!(later.at, now + Duration::from_secs(5));
        // Killed at the deadline, the requeue is no fast exit any more.
        assert!(!budget::exit_now(1, Some(later), now + Duration::from_millis(50)));
        assert!(budget::exit_now(1, deadline, now + Duration::from_millis(50)));
        // A program that answered in time keeps the stop's own deadline.
        assert_eq!(requeue_deadline_after(deadline, false, margin).unwrap().at, now);
        assert!(requeue_deadline_after(None, true, margin).is_none());
    }
}
