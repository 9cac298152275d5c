//! The node-wide checks at the start of an attempt (`health::node::NODE_WIDE`:
//! the run directory, the clock, the free disk, the storage probe, the site
//! command) made once a node, not once a rank: the node's first rank
//! (`SLURM_LOCALID` 0) makes them and leaves its verdict on node-local
//! storage; the node's other ranks of the same launch wait for it there and
//! take it as their own, then check their own devices.
//!
//! ```text
//! where      <base>/rekindle-local-<uid>/checks-<key>/verdict.json: the
//!            base /dev/shm (else the system's temporary directory), the
//!            user's private folder (made 0700 and checked, as the local
//!            tier's and the heartbeats' are: checkpoint/private.rs), a
//!            folder per launch and node (key: SHA-256 of both)
//! the first  every check, then the node-wide ones' results there (written
//!            whole: a temporary name renamed), pass or fail
//! the others wait for it (a look every 50 ms, node-local), at most the
//!            longest the first's checks can take; a stop ends the wait.
//!            Not there by then (the first died, or is stuck past its own
//!            bounds): they make the node-wide checks themselves
//! ```
//!
//! So at 8 ranks a node, a start costs the shared filesystem one listing of
//! the checkpoints, one look at the run directory, one clock probe and one
//! storage probe (a file written, fsynced, renamed, removed) a node where it
//! cost eight, and the site's command runs once a node. A rank that takes a
//! failed verdict fails exactly as if it had made the check (its own
//! `node_unhealthy`, the same exit code; only the first asks slurmctld).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::health::Check;
use crate::slurm::SlurmEnv;

const VERDICT_FILE: &str = "verdict.json";
/// A folder of a launch's verdict begins so.
const PREFIX: &str = "checks-";
/// How often a rank waiting for its node's verdict looks (node-local).
const LOOK: Duration = Duration::from_millis(50);
/// The largest verdict read (a few KiB in practice).
const MAX_VERDICT: u64 = 1 << 20;

/// This node's verdict folder for this launch, and who makes the checks.
#[derive(Debug, Clone)]
pub(crate) struct NodeVerdict {
    dir: PathBuf,
    launch: String,
    /// This rank is its node's first: it checks and publishes.
    pub first: bool,
}

/// What the first rank leaves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Verdict {
    launch: String,
    checks: Vec<Check>,
}

impl NodeVerdict {
    /// Where this launch's verdict for this node goes; `None` outside a
    /// SLURM step that says each task's local id (every rank then checks
    /// everything itself), or without a private node-local folder.
    pub(crate) fn for_launch(slurm: &SlurmEnv) -> Option<NodeVerdict> {
        use sha2::Digest;
        let (job, step, localid) = (slurm.job_id.as_ref()?, slurm.step_id.as_ref()?, slurm.localid?);
        let node = slurm.node_name();
        let launch = format!("{job}.{step}.r{}", slurm.restart_count);
        let base = [PathBuf::from("/dev/shm"), std::env::temp_dir()].into_iter().find(|b| b.is_dir())?;
        let key = hex::encode(&sha2::Sha256::digest(format!("{launch}\n{node}").as_bytes())[..8]);
        let private = base.join(crate::checkpoint::private::private_dir_name(crate::checkpoint::private::user()));
        let dir = private.join(format!("{PREFIX}{key}"));
        if let Err(e) = crate::checkpoint::private::prepare_root(&dir) {
            tracing::warn!(error = %e, "no private node-local folder to share this node's checks in: every rank makes them");
            return None;
        }
        if localid == 0 {
            super::rank_watch::forget_old_launches(&private, PREFIX);
        }
        Some(NodeVerdict { dir, launch, first: localid == 0 })
    }

    /// The first rank: the node-wide checks' results, for the others.
    /// Best effort: a rank that does not find them checks itself.
    pub(crate) fn publish(&self, checks: &[Check]) {
        let verdict = Verdict { launch: self.launch.clone(), checks: checks.to_vec() };
        let bytes = serde_json::to_vec(&verdict).expect("a verdict serialises");
        if let Err(e) = crate::confine::write_atomically(&self.dir.join(VERDICT_FILE), &bytes) {
            tracing::warn!(error = %e, dir = %self.dir.display(), "could not leave this node's checks for its other ranks: they make them themselves");
        }
    }

    /// Another rank: the first's node-wide checks once they are there, at
    /// most `bound`; `None` past it, or when `stopped` says so.
    pub(crate) fn wait(&self, bound: Duration, stopped: &dyn Fn() -> bool) -> Option<Vec<Check>> {
        let until = Instant::now() + bound;
        let dir = crate::confine::Dir::open(&self.dir).ok()?;
        loop {
            if let Some(v) = dir
                .read_bounded(VERDICT_FILE, MAX_VERDICT)
                .ok()
                .and_then(|b| serde_json::from_slice::<Verdict>(&b).ok())
                .filter(|v| v.launch == self.launch)
            {
                return Some(v.checks);
            }
            if stopped() || Instant::now() >= until {
                return None;
            }
            std::thread::sleep(LOOK);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::CheckStatus;

    impl NodeVerdict {
        fn at(dir: &std::path::Path, launch: &str, first: bool) -> NodeVerdict {
            NodeVerdict { dir: dir.to_path_buf(), launch: launch.into(), first }
        }
    }

    fn check(name: &str, status: CheckStatus) -> Check {
        Check { name: name.into(), status, detail: "d".into(), required: true }
    }

    #[test]
    fn the_others_take_the_first_ranks_verdict_of_their_own_launch() {
        let tmp = tempfile::tempdir().unwrap();
        let first = NodeVerdict::at(tmp.path(), "7.0.r1", true);
        let other = NodeVerdict::at(tmp.path(), "7.0.r1", false);
        let checks = vec![check("clock skew", CheckStatus::Fail), check("site command", CheckStatus::Ok)];
        let waiting = std::thread::spawn(move || other.wait(Duration::from_secs(10), &|| false));
        std::thread::sleep(Duration::from_millis(200));
        first.publish(&checks);
        assert_eq!(waiting.join().unwrap(), Some(checks));
    }

    #[test]
    fn a_verdict_of_another_launch_or_none_is_waited_for_at_most_the_bound_or_a_stop() {
        let tmp = tempfile::tempdir().unwrap();
        NodeVerdict::at(tmp.path(), "7.0.r0", true).publish(&[check("clock skew", CheckStatus::Ok)]);
        let other = NodeVerdict::at(tmp.path(), "7.0.r1", false);
        let started = Instant::now();
        assert_eq!(other.wait(Duration::from_millis(300), &|| false), None);
        assert!(started.elapsed() >= Duration::from_millis(300));
        let started = Instant::now();
        assert_eq!(other.wait(Duration::from_secs(30), &|| true), None, "a stop ends the wait");
        assert!(started.elapsed() < Duration::from_secs(1));
        std::fs::write(tmp.path().join(VERDICT_FILE), b"{not json").unwrap();
        assert_eq!(other.wait(Duration::from_millis(200), &|| false), None, "an unreadable verdict is not taken");
    }
}
