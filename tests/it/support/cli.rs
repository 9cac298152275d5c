//! Driving the real `rekindle` binary as a child process: build a `rekindle
//! run` (or `rekindle exec -- CMD`) command line, start it, wait for what it writes to its run directory
//! (events.jsonl, metrics.jsonl), send it signals, and collect its exit.
//!
//! Children start without any `SLURM_*` or `FAILPOINTS` variable of the
//! environment the tests run in, so a test runs the same inside a SLURM job.

use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

/// The config every test starts from (a small MLP, ~1 ms a step in debug).
pub const TINY_CONFIG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/configs/tiny.toml");

/// The `rekindle` binary cargo built for these tests.
pub fn exe() -> &'static str {
    env!("CARGO_BIN_EXE_rekindle")
}

/// A `rekindle run --config configs/tiny.toml --run-dir DIR` command line
/// (or a `rekindle exec --run-dir DIR -- CMD` one).
pub struct RunCmd {
    cmd: Command,
    run_dir: PathBuf,
    /// Arguments that go last (`-- CMD …` of `exec`), after every option.
    trailing: Vec<String>,
}

impl RunCmd {
    pub fn new(run_dir: &Path) -> RunCmd {
        RunCmd::with_args(run_dir, &["run", "--config", TINY_CONFIG], Vec::new())
    }

    /// `rekindle exec --run-dir DIR [options] -- COMMAND…`.
    pub fn exec(run_dir: &Path, command: &[&str]) -> RunCmd {
        let trailing = std::iter::once("--").chain(command.iter().copied()).map(String::from).collect();
        RunCmd::with_args(run_dir, &["exec"], trailing)
    }

    fn with_args(run_dir: &Path, args: &[&str], trailing: Vec<String>) -> RunCmd {
        let mut cmd = Command::new(exe());
        cmd.args(args).arg("--run-dir").arg(run_dir);
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("SLURM") || key == "FAILPOINTS" {
                cmd.env_remove(key);
            }
        }
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
        RunCmd { cmd, run_dir: run_dir.to_path_buf(), trailing }
    }

    /// `--set KEY=VALUE`.
    pub fn set(mut self, key_value: &str) -> RunCmd {
        self.cmd.args(["--set", key_value]);
        self
    }

    pub fn arg(mut self, arg: &str) -> RunCmd {
        self.cmd.arg(arg);
        self
    }

    pub fn env(mut self, key: &str, value: impl AsRef<std::ffi::OsStr>) -> RunCmd {
        self.cmd.env(key, value);
        self
    }

    pub fn spawn(mut self) -> Running {
        self.cmd.args(&self.trailing);
        let events_before = events(&self.run_dir).len();
        let started = Instant::now();
        let mut child = self.cmd.spawn().unwrap_or_else(|e| panic!("starting {}: {e}", exe()));
        let mut pipe = child.stderr.take().expect("stderr is piped");
        let stderr = std::thread::spawn(move || {
            let mut out = Vec::new();
            let _ = pipe.read_to_end(&mut out);
            String::from_utf8_lossy(&out).into_owned()
        });
        Running { child: Some(child), stderr: Some(stderr), run_dir: self.run_dir, events_before, started }
    }

    /// Runs to the end (at most `timeout`).
    pub fn run(self, timeout: Duration) -> Exited {
        self.spawn().wait(timeout)
    }
}

/// A `rekindle run` child. Dropping it kills the child if it is still running.
pub struct Running {
    child: Option<Child>,
    stderr: Option<JoinHandle<String>>,
    run_dir: PathBuf,
    /// Lines events.jsonl had before this child started (earlier attempts).
    events_before: usize,
    pub started: Instant,
}

/// How a child ended.
#[derive(Debug)]
pub struct Exited {
    pub status: ExitStatus,
    pub stderr: String,
    /// When the exit was seen (polled every 5 ms).
    pub at: Instant,
}

impl Exited {
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }

    /// Panics with the child's stderr unless it exited with `code`.
    pub fn assert_code(&self, code: i32) -> &Exited {
        assert_eq!(
            self.status.code(),
            Some(code),
            "rekindle exited with {} (signal {:?}), expected {code}; stderr:\n{}",
            self.status,
            self.status.signal(),
            self.tail()
        );
        self
    }

    /// The last lines of stderr (for assertion messages).
    pub fn tail(&self) -> String {
        let lines: Vec<&str> = self.stderr.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

impl Running {
    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.as_ref().expect("child").id() as i32)
    }

    /// Sends `sig`; returns the wall-clock time just before sending.
    pub fn signal(&self, sig: Signal) -> SystemTime {
        let sent = SystemTime::now();
        kill(self.pid(), sig).unwrap_or_else(|e| panic!("sending {sig} to rekindle: {e}"));
        sent
    }

    /// Events this child appended so far.
    pub fn new_events(&self) -> Vec<Value> {
        let mut all = events(&self.run_dir);
        all.split_off(self.events_before.min(all.len()))
    }

    /// Polls until `ready` holds, failing if the child exits first or `timeout` passes.
    pub fn wait_until(&mut self, what: &str, timeout: Duration, mut ready: impl FnMut(&Running) -> bool) {
        let t0 = Instant::now();
        loop {
            if ready(self) {
                return;
            }
            if let Some(status) = self.child.as_mut().expect("child").try_wait().expect("try_wait") {
                let stderr = self.stderr.take().map(|h| h.join().unwrap()).unwrap_or_default();
                panic!("rekindle exited ({status}) while waiting for {what}; stderr:\n{stderr}");
            }
            assert!(t0.elapsed() < timeout, "no {what} after {timeout:?}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits for this child's first `name` event and returns it.
    pub fn wait_for_event(&mut self, name: &str, timeout: Duration) -> Value {
        self.wait_until(&format!("`{name}` event"), timeout, |r| r.new_events().iter().any(|e| e["event"] == name));
        self.new_events().into_iter().find(|e| e["event"] == name).unwrap()
    }

    /// Waits until metrics.jsonl shows a training step of at least `step`.
    pub fn wait_for_step(&mut self, step: u64, timeout: Duration) {
        let dir = self.run_dir.clone();
        self.wait_until(&format!("step {step} in metrics.jsonl"), timeout, |_| {
            last_metric_step(&dir).is_some_and(|s| s >= step)
        });
    }

    /// Waits for the exit, killing the child and failing after `timeout`.
    pub fn wait(mut self, timeout: Duration) -> Exited {
        let mut child = self.child.take().expect("child");
        let t0 = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                break status;
            }
            if t0.elapsed() > timeout {
                let _ = child.kill();
                let _ = child.wait();
                let stderr = self.stderr.take().map(|h| h.join().unwrap()).unwrap_or_default();
                panic!("rekindle still running after {timeout:?}; killed it; stderr:\n{stderr}");
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let at = Instant::now();
        let stderr = self.stderr.take().map(|h| h.join().unwrap()).unwrap_or_default();
        Exited { status, stderr, at }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn jsonl(path: &Path) -> Vec<Value> {
    let Ok(text) = std::fs::read_to_string(path) else { return Vec::new() };
    // A line being written may be cut off: only complete lines count.
    text.split_inclusive('\n')
        .filter(|l| l.ends_with('\n'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{}: bad line {l:?}: {e}", path.display())))
        .collect()
}

/// All events of `run_dir/events.jsonl` (every attempt).
pub fn events(run_dir: &Path) -> Vec<Value> {
    jsonl(&run_dir.join("events.jsonl"))
}

/// The events named `name`, oldest first.
pub fn events_named(run_dir: &Path, name: &str) -> Vec<Value> {
    events(run_dir).into_iter().filter(|e| e["event"] == name).collect()
}

/// The last event named `name`, panicking when there is none.
pub fn last_event(run_dir: &Path, name: &str) -> Value {
    events_named(run_dir, name).pop().unwrap_or_else(|| panic!("no `{name}` event in {}", run_dir.display()))
}

/// Training steps logged in metrics.jsonl, in file order.
pub fn metric_steps(run_dir: &Path) -> Vec<u64> {
    jsonl(&run_dir.join("metrics.jsonl"))
        .iter()
        .filter(|m| m.get("loss").is_some())
        .filter_map(|m| m["step"].as_u64())
        .collect()
}

pub fn last_metric_step(run_dir: &Path) -> Option<u64> {
    metric_steps(run_dir).last().copied()
}

/// Steps of the `step-*` directories in `run_dir/checkpoints`, ascending.
pub fn checkpoint_steps(run_dir: &Path) -> Vec<u64> {
    let Ok(entries) = std::fs::read_dir(run_dir.join("checkpoints")) else { return Vec::new() };
    let mut steps: Vec<u64> = entries
        .filter_map(|e| rekindle::checkpoint::parse_step_dir_name(&e.ok()?.file_name().to_string_lossy()))
        .collect();
    steps.sort_unstable();
    steps
}

/// `rekindle verify PATH`: (exit code, stdout + stderr).
pub fn verify(path: &Path) -> (Option<i32>, String) {
    let out = Command::new(exe()).arg("verify").arg(path).output().expect("rekindle verify runs");
    (out.status.code(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// Asserts that every checkpoint in `run_dir` verifies (`rekindle verify` exits 0).
pub fn assert_verifies(run_dir: &Path) {
    let (code, out) = verify(run_dir);
    assert_eq!(code, Some(0), "rekindle verify {} failed:\n{out}", run_dir.display());
}

/// Parses an RFC 3339 time of an event.
pub fn rfc3339(v: &Value) -> SystemTime {
    let s = v.as_str().unwrap_or_else(|| panic!("not a time: {v}"));
    let t = chrono::DateTime::parse_from_rfc3339(s).unwrap_or_else(|e| panic!("{s:?}: {e}"));
    SystemTime::UNIX_EPOCH + Duration::from_millis(t.timestamp_millis() as u64)
}
