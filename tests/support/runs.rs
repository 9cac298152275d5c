//! Real runs through the built binary: `rekindle` commands with the SLURM
//! environment of the test process removed (so a test run inside a SLURM job
//! behaves like one outside), and a run directory of `configs/tiny.toml`
//! stopped, resumed and finished over three attempts on three nodes.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use assert_cmd::prelude::*;

/// `configs/tiny.toml` of this checkout.
pub fn tiny_config() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("configs").join("tiny.toml")
}

/// A `rekindle` command without the test process's SLURM variables.
pub fn rekindle() -> Command {
    let mut cmd = Command::cargo_bin("rekindle").expect("rekindle binary");
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("SLURM") {
            cmd.env_remove(key);
        }
    }
    cmd.env_remove("RUST_LOG");
    cmd
}

/// Runs `cmd`, panicking with its output unless it exits with `code`.
pub fn expect_exit(cmd: &mut Command, code: i32) -> Output {
    let out = cmd.output().expect("run rekindle");
    assert_eq!(
        out.status.code(),
        Some(code),
        "{cmd:?} exited {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Validation every this many steps in [`three_attempt_run`].
pub const EVAL_EVERY: u64 = 20;

/// One attempt of the tiny run in `run_dir`, as if SLURM had placed it on
/// `node` with restart count `restart`; `stop_at` stops it (exit 75).
pub fn tiny_attempt(run_dir: &Path, node: &str, restart: u32, stop_at: Option<u64>) {
    let mut cmd = rekindle();
    cmd.arg("run").arg("--config").arg(tiny_config()).arg("--run-dir").arg(run_dir);
    cmd.args(["--set", &format!("train.eval_every={EVAL_EVERY}")]);
    cmd.env("SLURMD_NODENAME", node).env("SLURM_RESTART_COUNT", restart.to_string());
    if let Some(k) = stop_at {
        cmd.args(["--stop-at-step", &k.to_string()]);
    }
    expect_exit(&mut cmd, if stop_at.is_some() { 75 } else { 0 });
}

/// The tiny run (200 steps, checkpoints every 50) over three attempts:
/// n1 stops at step 70; n2 resumes there and stops at 130; the step-130
/// checkpoint is then damaged, so n3 rejects it, resumes from step 100
/// (30 steps lost) and finishes.
pub fn three_attempt_run(run_dir: &Path) {
    tiny_attempt(run_dir, "n1", 0, Some(70));
    tiny_attempt(run_dir, "n2", 1, Some(130));
    super::flip_byte(&run_dir.join("checkpoints").join("step-0000000130").join("model.safetensors"));
    tiny_attempt(run_dir, "n3", 2, None);
}

/// Copies a directory tree (a run directory, for a test to change its copy).
pub fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap_or_else(|e| panic!("create {}: {e}", to.display()));
    for entry in std::fs::read_dir(from).unwrap_or_else(|e| panic!("list {}: {e}", from.display())) {
        let entry = entry.expect("dir entry");
        let dest = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_tree(&entry.path(), &dest);
        } else {
            std::fs::copy(entry.path(), &dest).unwrap_or_else(|e| panic!("copy {}: {e}", entry.path().display()));
        }
    }
}
