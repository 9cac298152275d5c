//! The contract between `rekindle exec` and the program it runs, version
//! [`PROTOCOL`] (docs/exec.md): the environment the program is given, and
//! the stop file that appears when a stop is requested. Pure: what is set
//! and written, not the setting and writing.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The version of this contract; a program may refuse a version it does not know.
pub const PROTOCOL: u32 = 1;

/// `REKINDLE_EXEC_PROTOCOL`: [`PROTOCOL`].
pub const ENV_PROTOCOL: &str = "REKINDLE_EXEC_PROTOCOL";
/// `REKINDLE_RUN_DIR`: the run directory (events, metrics.jsonl, checkpoints).
pub const ENV_RUN_DIR: &str = "REKINDLE_RUN_DIR";
/// `REKINDLE_RESUME_FROM`: the newest checkpoint that verifies; unset on a fresh start.
pub const ENV_RESUME_FROM: &str = "REKINDLE_RESUME_FROM";
/// `REKINDLE_CHECKPOINT_DIR`: where to stage a checkpoint (a fresh directory in it).
pub const ENV_CHECKPOINT_DIR: &str = "REKINDLE_CHECKPOINT_DIR";
/// `REKINDLE_STOP_FILE`: appears when a stop is requested.
pub const ENV_STOP_FILE: &str = "REKINDLE_STOP_FILE";
/// `REKINDLE_DEADLINE`: Unix seconds by which the program must be done (the
/// job's end time); unset when not known. After a stop, the stop file's own
/// `deadline` is the one that counts.
pub const ENV_DEADLINE: &str = "REKINDLE_DEADLINE";
/// `REKINDLE_BIN`: the rekindle binary, for `rekindle seal`.
pub const ENV_BIN: &str = "REKINDLE_BIN";
/// `REKINDLE_EXEC_PID`: the supervising rekindle, whose run-directory lock
/// `rekindle seal` commits under.
pub const ENV_EXEC_PID: &str = "REKINDLE_EXEC_PID";

/// `REKINDLE_EXEC_HOST`: the node of that supervisor, as its lock names it;
/// set only for a task of a job step of several (exec/world.rs), whose
/// supervisor of record (task 0's) may run on another node.
pub const ENV_EXEC_HOST: &str = "REKINDLE_EXEC_HOST";

/// `REKINDLE_PROGRESS`: the supervisor's Unix datagram socket, where every
/// rank reports the steps it completes (`rk.step()`, exec/progress.rs); unset
/// when the supervisor could not bind one.
pub const ENV_PROGRESS: &str = "REKINDLE_PROGRESS";

/// The stop file's name in the run directory.
pub const STOP_FILE: &str = "stop-requested.json";

/// Every variable of the contract (each is set, or removed from what the
/// program inherits, so that nothing of an outer run leaks in).
pub const ALL_VARS: [&str; 10] = [
    ENV_PROTOCOL,
    ENV_RUN_DIR,
    ENV_RESUME_FROM,
    ENV_CHECKPOINT_DIR,
    ENV_STOP_FILE,
    ENV_DEADLINE,
    ENV_BIN,
    ENV_EXEC_PID,
    ENV_EXEC_HOST,
    ENV_PROGRESS,
];

/// What the program is told.
#[derive(Debug, Clone, PartialEq)]
pub struct ChildEnv {
    pub run_dir: PathBuf,
    pub resume_from: Option<PathBuf>,
    pub checkpoint_dir: PathBuf,
    pub stop_file: PathBuf,
    pub deadline: Option<i64>,
    pub bin: PathBuf,
    pub exec_pid: u32,
    /// The supervisor of record's node, in a job step of several tasks.
    pub exec_host: Option<String>,
    /// The progress socket (exec/progress.rs).
    pub progress: Option<PathBuf>,
    /// Variables of the program's own launcher (torch's `env://` ones, from
    /// SLURM's: exec/world.rs) that its environment lacked: set as they are.
    pub launcher: Vec<(&'static str, String)>,
}

impl ChildEnv {
    /// The variables to set; those of [`ALL_VARS`] not listed are removed.
    pub fn vars(&self) -> Vec<(&'static str, OsString)> {
        let mut vars = vec![
            (ENV_PROTOCOL, OsString::from(PROTOCOL.to_string())),
            (ENV_RUN_DIR, self.run_dir.clone().into_os_string()),
            (ENV_CHECKPOINT_DIR, self.checkpoint_dir.clone().into_os_string()),
            (ENV_STOP_FILE, self.stop_file.clone().into_os_string()),
            (ENV_BIN, self.bin.clone().into_os_string()),
            (ENV_EXEC_PID, OsString::from(self.exec_pid.to_string())),
        ];
        if let Some(resume) = &self.resume_from {
            vars.push((ENV_RESUME_FROM, resume.clone().into_os_string()));
        }
        if let Some(deadline) = self.deadline {
            vars.push((ENV_DEADLINE, OsString::from(deadline.to_string())));
        }
        if let Some(host) = &self.exec_host {
            vars.push((ENV_EXEC_HOST, OsString::from(host)));
        }
        if let Some(socket) = &self.progress {
            vars.push((ENV_PROGRESS, socket.clone().into_os_string()));
        }
        vars
    }

    /// [`vars`](Self::vars) and the launcher's variables: all the program is given.
    pub fn all_vars(&self) -> Vec<(&'static str, OsString)> {
        let mut vars = self.vars();
        vars.extend(self.launcher.iter().map(|(k, v)| (*k, OsString::from(v))));
        vars
    }

    /// The variables of the contract to remove from what the program inherits.
    pub fn unset(&self) -> Vec<&'static str> {
        let set: Vec<&str> = self.vars().iter().map(|(k, _)| *k).collect();
        ALL_VARS.into_iter().filter(|k| !set.contains(k)).collect()
    }
}

/// What the stop file holds (JSON): why, and by when the program must have
/// sealed its last checkpoint and exited.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StopNotice {
    /// The stop signal rekindle received (`SIGTERM`, `SIGUSR1`, …).
    pub signal: String,
    /// Unix seconds (fractional); after it the program's process group is killed.
    pub deadline: f64,
}

impl StopNotice {
    /// The file's bytes: one line of JSON, keys in alphabetical order.
    pub fn to_bytes(&self) -> Vec<u8> {
        let value = serde_json::to_value(self).expect("a stop notice serialises");
        let mut out = serde_json::to_vec(&value).expect("a stop notice serialises");
        out.push(b'\n');
        out
    }
}

/// The stop file of a run directory.
pub fn stop_file(run_dir: &Path) -> PathBuf {
    run_dir.join(STOP_FILE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(resume: Option<&str>, deadline: Option<i64>) -> ChildEnv {
        ChildEnv {
            run_dir: "runs/x".into(),
            resume_from: resume.map(PathBuf::from),
            checkpoint_dir: "runs/x/checkpoints/.staging".into(),
            stop_file: stop_file(Path::new("runs/x")),
            deadline,
            bin: "/usr/bin/rekindle".into(),
            exec_pid: 7,
            exec_host: None,
            progress: None,
            launcher: Vec::new(),
        }
    }

    #[test]
    fn a_fresh_start_unsets_resume_from_and_an_unknown_deadline() {
        let e = env(None, None);
        let names: Vec<&str> = e.vars().iter().map(|(k, _)| *k).collect();
        assert!(!names.contains(&ENV_RESUME_FROM) && !names.contains(&ENV_DEADLINE));
        assert_eq!(e.unset(), vec![ENV_RESUME_FROM, ENV_DEADLINE, ENV_EXEC_HOST, ENV_PROGRESS]);
        assert!(e.vars().contains(&(ENV_PROTOCOL, "1".into())));
        assert!(e.vars().contains(&(ENV_STOP_FILE, "runs/x/stop-requested.json".into())));
    }

    #[test]
    fn a_resume_names_the_checkpoint_and_the_job_end() {
        let e = env(Some("runs/x/checkpoints/step-0000000040"), Some(1_790_000_000));
        assert!(e.vars().contains(&(ENV_RESUME_FROM, "runs/x/checkpoints/step-0000000040".into())));
        assert!(e.vars().contains(&(ENV_DEADLINE, "1790000000".into())));
        assert_eq!(e.unset(), vec![ENV_EXEC_HOST, ENV_PROGRESS], "one task: its own supervisor, on its own node");
        let task = ChildEnv {
            exec_host: Some("n1".into()),
            progress: Some("/tmp/rekindle-progress-x/progress.sock".into()),
            launcher: vec![("RANK", "1".into())],
            ..e
        };
        assert!(task.unset().is_empty());
        assert_eq!(task.vars().len(), ALL_VARS.len());
        assert!(task.all_vars().contains(&("RANK", "1".into())) && !task.vars().iter().any(|(k, _)| *k == "RANK"));
    }

    #[test]
    fn the_docs_and_the_python_helper_name_every_variable_and_the_protocol() {
        let doc = include_str!("../../docs/exec.md");
        let helper = include_str!("../../python/rekindle_client.py");
        for var in ALL_VARS {
            assert!(doc.contains(&format!("| `{var}` |")), "docs/exec.md's environment table lacks {var}");
        }
        for var in [
            ENV_PROTOCOL,
            ENV_RESUME_FROM,
            ENV_CHECKPOINT_DIR,
            ENV_STOP_FILE,
            ENV_DEADLINE,
            ENV_BIN,
            ENV_RUN_DIR,
            ENV_PROGRESS,
        ] {
            assert!(helper.contains(&format!("\"{var}\"")), "python/rekindle_client.py does not read {var}");
        }
        assert!(helper.contains(&format!("PROTOCOL = {PROTOCOL}")), "the helper speaks another protocol");
        assert!(doc.contains(&format!("## The contract, version {PROTOCOL}")));
        assert!(doc.contains(&format!("`{STOP_FILE}`")) || doc.contains(STOP_FILE));
    }

    #[test]
    fn the_stop_notice_is_one_json_line_with_its_keys_in_alphabetical_order() {
        let n = StopNotice { signal: "SIGTERM".into(), deadline: 1_790_000_000.5 };
        assert_eq!(n.to_bytes(), b"{\"deadline\":1790000000.5,\"signal\":\"SIGTERM\"}\n");
        assert_eq!(serde_json::from_slice::<StopNotice>(&n.to_bytes()).unwrap(), n);
        // Earlier versions wrote the fields in declaration order.
        let earlier = br#"{"signal":"SIGTERM","deadline":1790000000.5}"#;
        assert_eq!(serde_json::from_slice::<StopNotice>(earlier).unwrap(), n);
    }
}
