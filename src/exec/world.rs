//! A job step of several SLURM tasks under `rekindle exec` (docs/exec.md,
//! "Distributed programs"): `srun` starts one supervisor per task (`sbatch
//! -N2 -n2 slurm/orchestrator.slurm --exec … -- python train.py`, one task
//! per rank; or `--ntasks-per-node=1 … -- torchrun …`, one per node), and
//! each runs its own copy of the program.
//!
//! ```text
//! task 0, the leader   the whole lifecycle of a one-task exec (the lock,
//!                      quarantine, resume, records, requeue, publish), and
//!                      two files in the staging directory for the others:
//!                      the world record once its program may start
//!                      (`.exec-world.json`) and its exit code at the end
//!                      (`.exec-world-end.json`)
//! the other tasks      wait for the world record of this launch, start their
//!                      program with the same contract (the leader's lock for
//!                      seals, the same checkpoint to resume from), forward
//!                      stops to it, and exit with the leader's code; a
//!                      program that failed unasked ends its supervisor at
//!                      once with 1, and `srun --kill-on-bad-exit` the world
//! ```
//!
//! Every supervisor gives its program torch's `env://` variables derived
//! from SLURM's ([`torch_vars`]), each only where the environment lacks it.
//! Files, not MPI: the run directory is on storage every node shares
//! anyway, and the supervisors exchange two small records per attempt.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::attempt::error::RunError;
use crate::attempt::stop::StopFlag;
use crate::slurm::SlurmEnv;

/// The world record's file name in the staging directory.
pub const RECORD_FILE: &str = ".exec-world.json";
/// The leader's exit code's file name in the staging directory.
pub const END_FILE: &str = ".exec-world-end.json";

/// How often a follower looks for the leader's files.
const POLL: Duration = Duration::from_millis(100);

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

fn write_json(path: &Path, value: &impl Serialize) -> Result<(), RunError> {
    let bytes = serde_json::to_vec(value).expect("a world record serialises");
    crate::rundir::write_atomically(path, &bytes)
        .map_err(|source| RunError::RunDir { path: path.to_path_buf(), source })
}

fn read_json<T: for<'a> Deserialize<'a>>(path: &Path) -> Option<T> {
    let bytes = crate::confine::read_bounded(path, 1 << 20).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// The leader: the world record into the staging directory `staging`.
pub fn publish(staging: &Path, record: &WorldRecord) -> Result<(), RunError> {
    write_json(&staging.join(RECORD_FILE), record)
}

/// The leader, on its way out: its exit code. Best effort: a follower that
/// never sees it exits 1 after its wait.
pub fn publish_end(staging: &Path, launch: &str, code: u8) {
    let path = staging.join(END_FILE);
    if let Err(e) = write_json(&path, &WorldEnd { launch: launch.to_string(), code }) {
        tracing::error!(error = %e, "could not tell the other tasks how this one ended; they exit 1 after their wait");
    }
}

/// A follower: waits for the world record of `launch` (at most `timeout`),
/// or `None` when a stop came first (the program is not started then).
pub fn wait_for_record(
    staging: &Path,
    launch: &str,
    timeout: Duration,
    stop: &StopFlag,
) -> Result<Option<WorldRecord>, RunError> {
    let started = Instant::now();
    let path = staging.join(RECORD_FILE);
    loop {
        if let Some(record) = read_json::<WorldRecord>(&path).filter(|r| r.launch == launch) {
            return Ok(Some(record));
        }
        if stop.signal().is_some() {
            return Ok(None);
        }
        if started.elapsed() >= timeout {
            return Err(RunError::World {
                reason: format!(
                    "task 0 of this job step published no world record ({}) within {:.0} s ([distributed] \
                     timeout): it failed before its program could start (its output says why), or it cannot reach \
                     the run directory this task sees (the run directory must be on storage every node shares)",
                    path.display(),
                    timeout.as_secs_f64()
                ),
            });
        }
        std::thread::sleep(POLL);
    }
}

/// A follower whose program ended: waits for the leader's exit code (at
/// most `timeout`).
pub fn wait_for_end(staging: &Path, launch: &str, timeout: Duration) -> Result<u8, RunError> {
    let started = Instant::now();
    let path = staging.join(END_FILE);
    loop {
        if let Some(end) = read_json::<WorldEnd>(&path).filter(|e| e.launch == launch) {
            return Ok(end.code);
        }
        if started.elapsed() >= timeout {
            return Err(RunError::World {
                reason: format!(
                    "task 0 of this job step did not end within {:.0} s of this task's program ({} never came)",
                    timeout.as_secs_f64(),
                    path.display()
                ),
            });
        }
        std::thread::sleep(POLL);
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
    fn a_follower_takes_only_its_own_launchs_records() {
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
        publish(tmp.path(), &record("42.0.r0")).unwrap();
        let err = wait_for_record(tmp.path(), "42.0.r1", Duration::from_millis(250), &stop).unwrap_err();
        assert!(err.to_string().contains("published no world record"), "{err}");
        publish(tmp.path(), &record("42.0.r1")).unwrap();
        let got = wait_for_record(tmp.path(), "42.0.r1", Duration::from_secs(5), &stop).unwrap();
        assert_eq!(got, Some(record("42.0.r1")));
        publish_end(tmp.path(), "42.0.r0", 1);
        assert!(wait_for_end(tmp.path(), "42.0.r1", Duration::from_millis(250)).is_err());
        publish_end(tmp.path(), "42.0.r1", 75);
        assert_eq!(wait_for_end(tmp.path(), "42.0.r1", Duration::from_secs(5)).unwrap(), 75);
    }
}
