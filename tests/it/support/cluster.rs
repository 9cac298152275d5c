//! The local SLURM cluster of `slurm/local-cluster.sh` (twelve nodes on this
//! machine), for the tests that submit real jobs: the drills
//! (`drills.rs`) and the batch shell's in-job restarts (`injob.rs`).
//!
//! [`LocalCluster::up`] brings it up (installing the Debian packages when
//! they are missing) and holds a process-wide lock until the value drops,
//! which brings the cluster down: the tests share its nodes, and one test's
//! `down` would cancel another's jobs, so they run one at a time.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The checkout the tests belong to.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `slurm/local-cluster.sh ARG`.
pub fn local_cluster(arg: &str) -> Output {
    Command::new(repo().join("slurm/local-cluster.sh"))
        .arg(arg)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run slurm/local-cluster.sh {arg}: {e}"))
}

/// The running local cluster; brought down when dropped, also when the test
/// fails.
pub struct LocalCluster {
    conf: PathBuf,
    // Released after `drop` has brought the cluster down.
    _turn: MutexGuard<'static, ()>,
}

impl LocalCluster {
    /// Waits for the other cluster tests to finish, then brings the cluster
    /// up; panics with the script's output when it cannot.
    pub fn up() -> LocalCluster {
        // A test that failed while holding the lock still brought the cluster down.
        let turn = ONE_AT_A_TIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let up = local_cluster("up");
        let dir = String::from_utf8(local_cluster("dir").stdout).expect("utf-8 path");
        let cluster = LocalCluster { conf: Path::new(dir.trim()).join("slurm.conf"), _turn: turn };
        assert!(
            up.status.success(),
            "slurm/local-cluster.sh up failed:\n{}{}",
            String::from_utf8_lossy(&up.stdout),
            String::from_utf8_lossy(&up.stderr)
        );
        cluster
    }

    /// Its slurm.conf: `SLURM_CONF` for the SLURM commands that talk to it.
    pub fn conf(&self) -> &Path {
        &self.conf
    }

    /// A SLURM client command (`sbatch`, `scontrol`, ...) pointed at this cluster.
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        cmd.env("SLURM_CONF", &self.conf).stdin(Stdio::null());
        cmd
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        let out = local_cluster("down");
        if !out.status.success() {
            eprintln!("slurm/local-cluster.sh down failed: {}", String::from_utf8_lossy(&out.stderr));
        }
    }
}
