//! A stand-in `scontrol`, first on the PATH of a child `rekindle`: canned
//! answers for `show job -o ID` and `requeue ID`, and a log of every call
//! (also `update JobId=… StartTime=…`, which succeeds), so tests check what
//! rekindle asked SLURM without a cluster.

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// A stand-in `scontrol` in its own directory: runs the shell snippet
/// `on_show` for `show job -o ID` and `on_requeue` for `requeue ID`, and
/// records every invocation, one line each.
pub struct FakeScontrol {
    bin: PathBuf,
    log: PathBuf,
}

/// What `scontrol show job -o 77` prints for a requeueable running batch job.
pub const RUNNING_JOB: &str =
    "JobId=77 JobName=tiny JobState=RUNNING Reason=None Requeue=1 Restarts=0 BatchFlag=1 NodeList=n1";

impl FakeScontrol {
    pub fn new(root: &Path, on_show: &str, on_requeue: &str) -> FakeScontrol {
        let bin = root.join("fake-bin");
        std::fs::create_dir_all(&bin).unwrap();
        let log = root.join("scontrol-calls");
        let script = format!(
            "#!/bin/sh\necho \"$*\" >> '{log}'\ncase \"$1\" in\n  show) {on_show} ;;\n  requeue) {on_requeue} ;;\nesac\n",
            log = log.display(),
        );
        let path = bin.join("scontrol");
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        FakeScontrol { bin, log }
    }

    pub fn running_job(root: &Path) -> FakeScontrol {
        FakeScontrol::new(root, &echo(RUNNING_JOB), "exit 0")
    }

    /// PATH with the stand-in first.
    pub fn path(&self) -> OsString {
        let mut path = OsString::from(&self.bin);
        path.push(":");
        path.push(std::env::var_os("PATH").unwrap_or_default());
        path
    }

    pub fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log).map(|t| t.lines().map(String::from).collect()).unwrap_or_default()
    }
}

/// A shell snippet printing `line`.
pub fn echo(line: &str) -> String {
    format!("echo '{line}'")
}
