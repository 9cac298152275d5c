//! A job step of several SLURM tasks under `rekindle exec` (docs/exec.md,
//! "Distributed programs"): `srun` starts one supervisor per task (`sbatch
//! -N2 -n2 slurm/orchestrator.slurm --exec … -- python train.py`, one task
//! per rank; or `--ntasks-per-node=1 … -- torchrun …`, one per node), and
//! each runs its own copy of the program.
//!
//! ```text
//! task 0, the leader   the whole lifecycle of a one-task exec (the lock,
//!                      quarantine, resume, records, requeue, publish), and
//!                      two messages for the others: the world record once
//!                      its program may start and its exit code at the end,
//!                      said over a TCP connection each task holds to it and
//!                      written to the staging directory (`.exec-world.json`,
//!                      `.exec-world-end.json`) for a task that cannot
//!                      connect (channel.rs)
//! the other tasks      wait for the world record of this launch, start their
//!                      program with the same contract (the leader's lock for
//!                      seals, the same checkpoint to resume from), forward
//!                      stops to it, and exit with the leader's code; a
//!                      program that failed unasked ends its supervisor with
//!                      1 (once the others are seen alive, below), and
//!                      `srun --kill-on-bad-exit` the world
//! ```
//!
//! Every supervisor gives its program torch's `env://` variables derived
//! from SLURM's ([`torch_vars`]), each only where the environment lacks it.
//! Not MPI: the supervisors exchange two small records per attempt, and a
//! task must be able to wait for task 0 to verify checkpoints for minutes
//! without costing the shared filesystem anything (channel.rs).
//!
//! While the programs run, the supervisors watch each other ([`Liveness`]:
//! the heartbeats of `run`'s ranks, `attempt/rank_watch.rs`, in `<run
//! dir>/ranks/`). A task whose supervisor stops beating for `[distributed]
//! timeout` (SIGKILLed, its node gone or frozen) is lost: every survivor
//! ends its program (SIGTERM, SIGKILL [`LOST_GRACE`] later: it is likely
//! stuck in a collective that cannot finish), the lowest task left records
//! `rank_lost` and the requeue or in-job restart (`attempt/lost.rs`), and
//! each exits 75 when a world checkpoint verifies, else 1. A program that
//! fails unasked while a peer is silent is judged the same way once the
//! peer is lost ([`Liveness::settle`]): its failure is the loss's echo
//! (gloo reports a dead peer's closed connection at once).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::attempt::board::{Board, Link, Posted, Waited};
use crate::attempt::error::RunError;
use crate::attempt::rank_watch::{Lost, RANKS_DIR, RankWatch, WatchSetup, beat_interval, read_world};
use crate::attempt::stop::StopFlag;
use crate::slurm::{SlurmEnv, expand_hostlist};

/// The world record's file name in the staging directory.
pub const RECORD_FILE: &str = ".exec-world.json";
/// The leader's exit code's file name in the staging directory.
pub const END_FILE: &str = ".exec-world-end.json";

/// This supervisor's part in the job step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// A step of one task (or no SLURM step): no world.
    Alone,
    /// Task 0 of a step of several.
    Leader(Launch),
    /// Another task.
    Follower(Launch),
}

/// Who this task is in a job step of several tasks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    /// The launch (job, step, restart): the leader's records name it, and a
    /// follower takes only its own launch's.
    pub id: String,
    pub rank: u32,
    pub size: u32,
    pub local_rank: u32,
    /// Tasks on this node, where SLURM says.
    pub local_size: Option<u32>,
    pub node_rank: u32,
    pub nodes: u32,
}

impl Role {
    /// The role SLURM's variables give this process.
    pub fn of(slurm: &SlurmEnv) -> Role {
        let (Some(size), Some(rank), Some(job), Some(step)) =
            (slurm.tasks, slurm.procid, &slurm.job_id, &slurm.step_id)
        else {
            return Role::Alone;
        };
        if size <= 1 || rank >= size {
            return Role::Alone;
        }
        let node_rank = slurm.nodeid.unwrap_or(0);
        let launch = Launch {
            id: format!("{job}.{step}.r{}", slurm.restart_count),
            rank,
            size,
            local_rank: slurm.localid.unwrap_or(0),
            local_size: slurm.tasks_per_node.as_deref().and_then(|t| tasks_on_node(t, node_rank)),
            node_rank,
            nodes: slurm.nodes.unwrap_or(1).max(1),
        };
        if rank == 0 { Role::Leader(launch) } else { Role::Follower(launch) }
    }
}

/// The tasks on node `node` from SLURM's compressed list (`2(x3),1`: three
/// nodes of two tasks, then one of one).
pub fn tasks_on_node(list: &str, node: u32) -> Option<u32> {
    let mut seen = 0u32;
    for group in list.split(',') {
        let (count, times) = match group.split_once("(x") {
            Some((count, rest)) => (count, rest.strip_suffix(')')?.parse::<u32>().ok()?),
            None => (group, 1),
        };
        let count: u32 = count.trim().parse().ok()?;
        if node < seen.saturating_add(times) {
            return Some(count);
        }
        seen = seen.saturating_add(times);
    }
    None
}

/// torch's `env://` variables for `launch` (`RANK`, `WORLD_SIZE`,
/// `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`), and the
/// ones `torchrun` reads its flags from when launched once per node
/// (`PET_NNODES`, `PET_NODE_RANK`, `PET_MASTER_ADDR`, `PET_MASTER_PORT`: a
/// static rendezvous at task 0's node), for the caller to set where the
/// environment lacks them. `torchrun` gives its own ranks their own
/// `RANK`…, so the first set is for one task per rank.
pub fn torch_vars(launch: &Launch, master_addr: &str, master_port: u16) -> Vec<(&'static str, String)> {
    let mut vars = vec![
        ("RANK", launch.rank.to_string()),
        ("WORLD_SIZE", launch.size.to_string()),
        ("LOCAL_RANK", launch.local_rank.to_string()),
    ];
    if let Some(local) = launch.local_size {
        vars.push(("LOCAL_WORLD_SIZE", local.to_string()));
    }
    vars.extend([
        ("MASTER_ADDR", master_addr.to_string()),
        ("MASTER_PORT", master_port.to_string()),
        ("PET_NNODES", launch.nodes.to_string()),
        ("PET_NODE_RANK", launch.node_rank.to_string()),
        ("PET_MASTER_ADDR", master_addr.to_string()),
        ("PET_MASTER_PORT", master_port.to_string()),
    ]);
    vars
}

/// The node of each task of the step, in task order, as SLURM's variables
/// lay them out: the step's nodes (`SLURM_STEP_NODELIST`), the tasks on each
/// (`SLURM_STEP_TASKS_PER_NODE`) and the distribution (`SLURM_DISTRIBUTION`:
/// block, SLURM's default, fills each node in turn; cyclic deals tasks
/// round the nodes). `None` where they do not say (no node list, a plane or
/// arbitrary distribution, counts that do not add up to the step's tasks).
pub fn task_nodes(slurm: &SlurmEnv) -> Option<Vec<String>> {
    let nodes = expand_hostlist(slurm.step_nodelist.as_deref()?);
    let per_node = slurm.tasks_per_node.as_deref()?;
    let counts: Vec<u32> = (0..nodes.len() as u32).map(|i| tasks_on_node(per_node, i)).collect::<Option<_>>()?;
    let kind = slurm.distribution.as_deref().unwrap_or("block");
    let kind = kind.split([':', ',']).next().unwrap_or("block");
    let mut out = Vec::new();
    match kind {
        "block" => {
            for (node, &count) in nodes.iter().zip(&counts) {
                out.extend(std::iter::repeat_n(node.clone(), count as usize));
            }
        }
        "cyclic" => {
            let mut left = counts.clone();
            while left.iter().any(|&c| c > 0) {
                for (node, c) in nodes.iter().zip(left.iter_mut()) {
                    if *c > 0 {
                        *c -= 1;
                        out.push(node.clone());
                    }
                }
            }
        }
        _ => return None,
    }
    (slurm.tasks.is_none_or(|t| t as usize == out.len()) && !out.is_empty()).then_some(out)
}

/// How long a program whose world lost a task has between the SIGTERM and
/// the SIGKILL: it cannot save (a world checkpoint needs every task), and is
/// most likely stuck in a collective that will not finish.
pub const LOST_GRACE: Duration = Duration::from_secs(3);

/// The heartbeats' launch identity for the world of `record`: its launch and
/// task 0's pid, which no earlier launch had together.
pub fn session(record: &WorldRecord) -> String {
    format!("{}-{}", record.launch, record.exec_pid)
}

/// This supervisor's heartbeat and its watch on the others' (module header),
/// from the start of its program to its exit.
pub struct Liveness {
    watch: RankWatch,
    lost: Arc<Mutex<Option<Vec<Lost>>>>,
    dir: PathBuf,
    rank: usize,
    size: usize,
    session: String,
    timeout: Duration,
}

impl Liveness {
    /// Starts beating as task `launch.rank` in `<run_dir>/ranks` and
    /// watching the other tasks (lost after `timeout` without a beat).
    pub fn start(
        run_dir: &Path,
        launch: &Launch,
        record: &WorldRecord,
        node: String,
        timeout: Duration,
    ) -> Result<Liveness, RunError> {
        let dir = run_dir.join(RANKS_DIR);
        let (rank, size, session) = (launch.rank as usize, launch.size as usize, session(record));
        let lost: Arc<Mutex<Option<Vec<Lost>>>> = Arc::default();
        let slot = Arc::clone(&lost);
        let setup = WatchSetup { dir: dir.clone(), rank, size, node, session: session.clone(), timeout };
        let handler = Box::new(move |found| *slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(found));
        let watch =
            RankWatch::start(setup, handler).map_err(|source| RunError::RunDir { path: dir.clone(), source })?;
        Ok(Liveness { watch, lost, dir, rank, size, session, timeout })
    }

    /// The tasks found lost, once the watch has found any.
    pub fn lost(&self) -> Option<Vec<Lost>> {
        self.lost.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Whether this task records a loss (the lowest task not lost).
    pub fn records(&self, lost: &[Lost]) -> bool {
        crate::attempt::rank_watch::recorder(lost, self.size) == Some(self.rank)
    }

    pub fn size(&self) -> usize {
        self.size
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Every rank of this task's program completed `step` (its reports,
    /// progress.rs): the heartbeat carries it to the world's sweepers.
    pub fn at_step(&self, step: u64) {
        self.watch.pulse().at_step(step);
    }

    /// This task's program ended: the beats say so from now on (no other
    /// task calls this one lost while it winds up), and the watch goes on.
    pub fn program_ended(&self) {
        self.watch.mark_done();
    }

    /// After this task's program failed unasked: whether a task is lost
    /// behind the failure. Waits until every other task is seen alive (its
    /// beat moved, or says its program ended: the failure is the program's
    /// own, or the world's), or the watch finds a task lost (the failure was
    /// the loss's echo), at most `[distributed] timeout` and two beats.
    pub fn settle(&self) -> Option<Vec<Lost>> {
        let interval = beat_interval(self.timeout);
        let until = Instant::now() + self.timeout + 2 * interval;
        let others: Vec<usize> = (0..self.size).filter(|r| *r != self.rank).collect();
        // The nodes' files, once a beat (one listing and one read a node):
        // a task whose program failed looks at the world as rarely as the
        // watch does, however many fail at once.
        let world = || read_world(&self.dir, &self.session, self.size);
        let first = world();
        let mut alive = vec![false; others.len()];
        loop {
            if let Some(lost) = self.lost() {
                return Some(lost);
            }
            let now = world();
            for (i, &r) in others.iter().enumerate() {
                let seq =
                    |w: &[Option<crate::telemetry::RankBeat>]| w.get(r).cloned().flatten().map(|b| (b.seq, b.done));
                alive[i] |= seq(&now).is_some_and(|(s, done)| done || Some(s) != seq(&first).map(|f| f.0));
            }
            if alive.iter().all(|a| *a) || Instant::now() >= until {
                return None;
            }
            std::thread::sleep(interval);
        }
    }

    /// The last beat says `done`; the watch ends.
    pub fn finish(self) {
        self.watch.finish();
    }
}

/// What the leader tells the other tasks once its program may start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorldRecord {
    /// [`Launch::id`].
    pub launch: String,
    /// The leader's pid and node, as its run-directory lock names them:
    /// seals commit under that lock.
    pub exec_pid: u32,
    pub exec_host: String,
    /// Where task 0 listens (`MASTER_ADDR`: its host name) and on which port.
    pub master_addr: String,
    pub master_port: u16,
    pub resume_from: Option<PathBuf>,
    pub resume_step: Option<u64>,
    pub checkpoint_dir: PathBuf,
    pub stop_file: PathBuf,
    pub deadline: Option<i64>,
}

/// The leader's exit code, for the other tasks to exit with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorldEnd {
    pub launch: String,
    pub code: u8,
}

impl Posted for WorldRecord {
    const FILE: &'static str = RECORD_FILE;
    fn launch(&self) -> &str {
        &self.launch
    }
}

impl Posted for WorldEnd {
    const FILE: &'static str = END_FILE;
    fn launch(&self) -> &str {
        &self.launch
    }
}

/// The hang notice's file name in the staging directory.
pub const HANG_FILE: &str = ".exec-world-hang.json";

/// The leader found a rank of its program hung and ends it (progress.rs):
/// written before its program is ended, so that a follower whose program
/// fails right after knows the failure for the hang's echo.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorldHang {
    pub launch: String,
    /// The rank of task 0's program that hung.
    pub rank: Option<usize>,
    pub step: u64,
}

impl Posted for WorldHang {
    const FILE: &'static str = HANG_FILE;
    fn launch(&self) -> &str {
        &self.launch
    }
}

/// The hang notice of `launch` in the staging directory, if task 0 wrote
/// one: one bounded read, on a failed program's path only.
pub fn hang_posted(staging: &Path, launch: &str) -> Option<WorldHang> {
    let bytes = crate::confine::read_bounded(&staging.join(HANG_FILE), 4096).ok()?;
    serde_json::from_slice::<WorldHang>(&bytes).ok().filter(|h| h.launch == launch)
}

/// The leader, on its way out: its exit code. Best effort for the file: a
/// task connected hears it anyway, one that hears nothing exits 1 after its
/// wait.
pub fn publish_end(board: &Board, launch: &str, code: u8) {
    if let Err(e) = board.post(&WorldEnd { launch: launch.to_string(), code }) {
        tracing::error!(error = %e, "could not write how this task ended; the tasks connected hear it, the others exit 1 after their wait");
    }
}

/// A follower: waits on `link` for the world record of its launch (at most
/// `timeout`), or `None` when a stop came first (the program is not started
/// then).
pub fn wait_for_record(link: &mut Link, timeout: Duration, stop: &StopFlag) -> Result<Option<WorldRecord>, RunError> {
    let stopped = || stop.signal().map(|_| ());
    match link.wait::<WorldRecord, _>(Instant::now() + timeout, &stopped) {
        Some(Waited::Got(record)) => Ok(Some(record)),
        Some(Waited::Quit(())) => Ok(None),
        None => Err(RunError::World {
            reason: format!(
                "task 0 of this job step published no world record (neither over its connection nor in {}) \
                 within {:.0} s ([distributed] timeout): it failed before its program could start (its output says \
                 why), or it cannot reach the run directory this task sees (the run directory must be on storage \
                 every node shares)",
                link.staging().join(RECORD_FILE).display(),
                timeout.as_secs_f64()
            ),
        }),
    }
}

/// A follower whose program ended: waits for the leader's exit code (at
/// most `timeout`).
pub fn wait_for_end(link: &mut Link, timeout: Duration) -> Result<u8, RunError> {
    match wait_for_end_or_loss(link, timeout, &|| None)? {
        Ended::Code(code) => Ok(code),
        Ended::Lost(_) => unreachable!("no watch, no loss"),
    }
}

/// How a follower's wait for the leader ended.
#[derive(Debug)]
pub enum Ended {
    /// The leader's exit code.
    Code(u8),
    /// `lost` found tasks lost first (the leader's among them, maybe).
    Lost(Vec<Lost>),
}

/// As [`wait_for_end`], asking `lost` every tenth of a second (in memory)
/// whether the watch found tasks lost (a follower whose program ended still
/// watches: the leader's node may die while its program runs on).
pub fn wait_for_end_or_loss(
    link: &mut Link,
    timeout: Duration,
    lost: &dyn Fn() -> Option<Vec<Lost>>,
) -> Result<Ended, RunError> {
    match link.wait::<WorldEnd, _>(Instant::now() + timeout, lost) {
        Some(Waited::Got(end)) => Ok(Ended::Code(end.code)),
        Some(Waited::Quit(lost)) => Ok(Ended::Lost(lost)),
        None => Err(RunError::World {
            reason: format!(
                "task 0 of this job step did not end within {:.0} s of this task's program (it said nothing over its \
                 connection, and {} never came)",
                timeout.as_secs_f64(),
                link.staging().join(END_FILE).display()
            ),
        }),
    }
}

/// A TCP port free on this node now, for task 0's rendezvous (`MASTER_PORT`):
/// the one the system hands out for port 0.
pub fn free_port() -> Result<u16, RunError> {
    std::net::TcpListener::bind(("0.0.0.0", 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|source| RunError::RunDir { path: PathBuf::from("<a free TCP port for MASTER_PORT>"), source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn slurm(pairs: &[(&str, &str)]) -> SlurmEnv {
        let map: BTreeMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        SlurmEnv::from_map(&map)
    }

    const STEP: [(&str, &str); 3] = [("SLURM_JOB_ID", "42"), ("SLURM_STEP_ID", "0"), ("SLURM_STEP_NUM_TASKS", "4")];

    #[test]
    fn the_role_comes_from_the_step_task_0_leads() {
        assert_eq!(Role::of(&slurm(&[])), Role::Alone);
        assert_eq!(Role::of(&slurm(&[("SLURM_JOB_ID", "42")])), Role::Alone, "the batch shell");
        let one = slurm(&[
            ("SLURM_JOB_ID", "42"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_STEP_NUM_TASKS", "1"),
            ("SLURM_PROCID", "0"),
        ]);
        assert_eq!(Role::of(&one), Role::Alone);
        let mut vars = STEP.to_vec();
        vars.extend([
            ("SLURM_PROCID", "3"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_NODEID", "1"),
            ("SLURM_STEP_NUM_NODES", "2"),
            ("SLURM_STEP_TASKS_PER_NODE", "2(x2)"),
            ("SLURM_RESTART_COUNT", "2"),
        ]);
        let Role::Follower(launch) = Role::of(&slurm(&vars)) else { panic!("task 3 follows") };
        assert_eq!(
            launch,
            Launch {
                id: "42.0.r2".into(),
                rank: 3,
                size: 4,
                local_rank: 1,
                local_size: Some(2),
                node_rank: 1,
                nodes: 2
            }
        );
        vars[3] = ("SLURM_PROCID", "0");
        assert!(matches!(Role::of(&slurm(&vars)), Role::Leader(l) if l.rank == 0));
    }

    #[test]
    fn tasks_per_node_are_read_from_slurms_compressed_list() {
        let cases = [("2(x3),1", 0, Some(2)), ("2(x3),1", 2, Some(2)), ("2(x3),1", 3, Some(1)), ("2(x3),1", 4, None)];
        for (list, node, want) in cases {
            assert_eq!(tasks_on_node(list, node), want, "{list} node {node}");
        }
        assert_eq!(tasks_on_node("4", 0), Some(4));
        assert_eq!(tasks_on_node("1,3", 1), Some(3));
        assert_eq!(tasks_on_node("x(x2)", 0), None);
    }

    #[test]
    fn torch_gets_ranks_from_slurm_and_torchrun_a_static_rendezvous_at_task_0() {
        let launch = Launch {
            id: "1.0.r0".into(),
            rank: 5,
            size: 8,
            local_rank: 1,
            local_size: Some(4),
            node_rank: 1,
            nodes: 2,
        };
        let vars: BTreeMap<&str, String> = torch_vars(&launch, "node-a", 29511).into_iter().collect();
        let want = [
            ("RANK", "5"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "4"),
            ("MASTER_ADDR", "node-a"),
            ("MASTER_PORT", "29511"),
            ("PET_NNODES", "2"),
            ("PET_NODE_RANK", "1"),
            ("PET_MASTER_ADDR", "node-a"),
            ("PET_MASTER_PORT", "29511"),
        ];
        assert_eq!(vars, want.into_iter().map(|(k, v)| (k, v.to_string())).collect());
        let unknown = Launch { local_size: None, ..launch };
        assert!(!torch_vars(&unknown, "a", 1).iter().any(|(k, _)| *k == "LOCAL_WORLD_SIZE"));
    }

    #[test]
    fn a_follower_waits_for_its_own_launchs_records_and_says_why_it_gave_up() {
        let tmp = tempfile::tempdir().unwrap();
        let stop = StopFlag::default();
        let record = |launch: &str| WorldRecord {
            launch: launch.into(),
            exec_pid: 7,
            exec_host: "n1".into(),
            master_addr: "host-a".into(),
            master_port: 1234,
            resume_from: None,
            resume_step: None,
            checkpoint_dir: "c".into(),
            stop_file: "s".into(),
            deadline: None,
        };
        let old = Board::open(tmp.path(), "42.0.r0", "localhost", 2, None);
        old.post(&record("42.0.r0")).unwrap();
        publish_end(&old, "42.0.r0", 1);
        let mut link = Link::new(tmp.path(), "42.0.r1");
        let err = wait_for_record(&mut link, Duration::from_millis(250), &stop).unwrap_err();
        assert!(err.to_string().contains("published no world record"), "{err}");
        assert!(err.to_string().contains(RECORD_FILE), "{err}");
        let err = wait_for_end(&mut link, Duration::from_millis(250)).unwrap_err();
        assert!(err.to_string().contains("did not end within"), "{err}");
        let board = Board::open(tmp.path(), "42.0.r1", "localhost", 2, None);
        board.post(&record("42.0.r1")).unwrap();
        let got = wait_for_record(&mut link, Duration::from_secs(5), &stop).unwrap();
        assert_eq!(got, Some(record("42.0.r1")));
        let lost = || Some(vec![]);
        assert!(matches!(wait_for_end_or_loss(&mut link, Duration::from_secs(5), &lost), Ok(Ended::Lost(_))));
        publish_end(&board, "42.0.r1", 75);
        assert_eq!(wait_for_end(&mut link, Duration::from_secs(5)).unwrap(), 75);
    }

    #[test]
    fn each_tasks_node_follows_slurms_layout_or_is_unknown() {
        let step = |list: &str, per_node: &str, tasks: &str, dist: Option<&str>| {
            let mut vars = vec![
                ("SLURM_STEP_NODELIST", list),
                ("SLURM_STEP_TASKS_PER_NODE", per_node),
                ("SLURM_STEP_NUM_TASKS", tasks),
            ];
            if let Some(d) = dist {
                vars.push(("SLURM_DISTRIBUTION", d));
            }
            task_nodes(&slurm(&vars))
        };
        let names = |v: &[&str]| Some(v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        let cases = [
            (("n[1-2]", "2(x2)", "4", None), names(&["n1", "n1", "n2", "n2"])),
            (("n[1-2]", "2(x2)", "4", Some("block")), names(&["n1", "n1", "n2", "n2"])),
            (("n[1-2]", "2(x2)", "4", Some("cyclic:block")), names(&["n1", "n2", "n1", "n2"])),
            (("a,b", "2,1", "3", Some("cyclic")), names(&["a", "b", "a"])),
            (("n[1-2]", "1(x2)", "2", Some("plane=2")), None),
            (("n[1-2]", "2(x2)", "3", None), None),
            (("n[1-3]", "2(x2)", "4", None), None),
        ];
        for ((list, per_node, tasks, dist), want) in cases {
            assert_eq!(step(list, per_node, tasks, dist), want, "{list} {per_node} {tasks} {dist:?}");
        }
        assert_eq!(task_nodes(&slurm(&[("SLURM_STEP_TASKS_PER_NODE", "2")])), None, "no node list");
    }
}
