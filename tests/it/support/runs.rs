//! Driving the real `rekindle run` in temporary run directories, and reading
//! back what a run leaves there: checkpoints, `metrics.jsonl`, `events.jsonl`,
//! `summary.json`.
//!
//! A [`Training`] is a config file plus `--set` overrides; every call runs the
//! binary built by `cargo test` in a fresh process, so a "resume" here is what
//! a user gets after a preemption: a new process, a new thread pool, only the
//! files on disk.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use assert_cmd::prelude::*;
use serde_json::Value;

/// Exit code of a finished run.
pub const EXIT_DONE: i32 = 0;
/// Exit code of a run stopped with a durable checkpoint.
pub const EXIT_STOPPED: i32 = 75;
/// Exit code of a configuration error.
pub const EXIT_CONFIG: i32 = 78;

/// The files a bit-exact resume must reproduce byte for byte.
pub const WEIGHT_FILES: [&str; 2] = ["model.safetensors", "optimizer.safetensors"];

/// Longest a test waits for a background run to reach a point.
const WAIT_LIMIT: Duration = Duration::from_secs(120);

/// `configs/tiny.toml` of this checkout.
pub fn tiny_config() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("configs").join("tiny.toml")
}

/// The `rekindle` binary under test, with an environment that cannot steer
/// it: no SLURM job (so no `scontrol`), no `RUST_LOG`, no failpoints, no GPU
/// inventory.
pub fn rekindle() -> Command {
    unsteered(Command::cargo_bin("rekindle").expect("the rekindle binary is built by cargo test"))
}

/// `examples/own_model.rs`: the whole `rekindle` command line of a program
/// that registers a model of its own (`kind = "conv"`).
pub fn own_model_exe() -> PathBuf {
    let me = std::env::current_exe().expect("current_exe");
    let profile_dir = me.parent().and_then(Path::parent).expect("test binary lives in <target>/<profile>/deps");
    let exe = profile_dir.join("examples").join(format!("own_model{}", std::env::consts::EXE_SUFFIX));
    assert!(
        exe.is_file(),
        "{} is missing: run `cargo build --examples` (or a plain `cargo test`, which builds examples) first",
        exe.display()
    );
    exe
}

/// `configs/own_model.toml` of this checkout (`kind = "conv"`).
pub fn own_model_config() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("configs").join("own_model.toml")
}

/// [`own_model_exe`] in the environment [`rekindle`] runs in.
pub fn own_model() -> Command {
    unsteered(Command::new(own_model_exe()))
}

fn unsteered(mut cmd: Command) -> Command {
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("SLURM_") {
            cmd.env_remove(key);
        }
    }
    for key in ["RUST_LOG", "FAILPOINTS", "REKINDLE_GPU_INVENTORY"] {
        cmd.env_remove(key);
    }
    cmd
}

/// `(exit code, stdout, stderr)` of a finished command that was not killed.
pub fn outcome(out: &Output) -> (i32, String, String) {
    let code = out.status.code().unwrap_or_else(|| panic!("rekindle died of a signal: {:?}", out.status));
    (code, String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// A training setup: a config file, `--set` overrides, and its `max_steps`.
#[derive(Debug, Clone)]
pub struct Training {
    /// The program (`None`: the `rekindle` binary under test).
    exe: Option<PathBuf>,
    config: PathBuf,
    sets: Vec<String>,
    max_steps: u64,
}

impl Training {
    /// `configs/tiny.toml` (the `mlp` workload) trained for `max_steps`.
    pub fn tiny_mlp(max_steps: u64) -> Training {
        Training { exe: None, config: tiny_config(), sets: vec![format!("run.max_steps={max_steps}")], max_steps }
    }

    /// `configs/own_model.toml` (the `conv` model of `examples/own_model.rs`,
    /// run by that program) trained for `max_steps`, logging every step.
    pub fn own_model(max_steps: u64) -> Training {
        Training {
            exe: Some(own_model_exe()),
            config: own_model_config(),
            sets: vec![format!("run.max_steps={max_steps}"), "train.log_every=1".to_string()],
            max_steps,
        }
    }

    /// The `gpt` workload on synthetic bytes, small enough for a debug build
    /// (a step takes milliseconds), trained for `max_steps`.
    pub fn tiny_gpt(max_steps: u64) -> Training {
        Training::tiny_mlp(max_steps)
            .set("model.kind=\"gpt\"")
            .set("model.layers=1")
            .set("model.width=16")
            .set("model.heads=2")
            .set("model.context=16")
            .set("train.batch_size=4")
            .set("optimizer.warmup_steps=2")
    }

    /// Adds a `--set KEY=VALUE` override (value typed as in TOML).
    pub fn set(mut self, key_value: &str) -> Training {
        self.sets.push(key_value.to_string());
        self
    }

    pub fn max_steps(&self) -> u64 {
        self.max_steps
    }

    /// `rekindle -q run --config … --run-dir DIR --set …` plus `extra`.
    pub fn command(&self, run_dir: &Path, extra: &[&str]) -> Command {
        let mut cmd = match &self.exe {
            Some(exe) => unsteered(Command::new(exe)),
            None => rekindle(),
        };
        cmd.args(["-q", "run", "--config"]).arg(&self.config).arg("--run-dir").arg(run_dir);
        for s in &self.sets {
            cmd.args(["--set", s]);
        }
        cmd.args(extra);
        cmd
    }

    /// Runs to completion and returns the output, whatever the exit code.
    pub fn output(&self, run_dir: &Path, extra: &[&str]) -> Output {
        self.command(run_dir, extra).output().expect("start rekindle")
    }

    /// Runs and asserts the exit code; returns stderr.
    pub fn expect_exit(&self, run_dir: &Path, extra: &[&str], expected: i32) -> String {
        let (code, _, stderr) = outcome(&self.output(run_dir, extra));
        assert_eq!(code, expected, "rekindle run {extra:?} in {} exited {code}; stderr:\n{stderr}", run_dir.display());
        stderr
    }

    /// Trains (or resumes) to `max_steps`; asserts exit 0.
    pub fn run_to_end(&self, run_dir: &Path) {
        self.expect_exit(run_dir, &[], EXIT_DONE);
    }

    /// Trains (or resumes) to step `k` and stops there; asserts exit 75 and
    /// that the checkpoint of step `k` exists.
    pub fn stop_at(&self, run_dir: &Path, k: u64) {
        self.expect_exit(run_dir, &["--stop-at-step", &k.to_string()], EXIT_STOPPED);
        assert!(step_dir(run_dir, k).is_dir(), "stopping at step {k} left no checkpoint of step {k}");
    }

    /// Starts the run in the background (output discarded but stderr kept in
    /// `<run_dir>.stderr` for a failing test's message).
    pub fn spawn(&self, run_dir: &Path) -> Child {
        let stderr = fs::File::create(run_dir.with_extension("stderr")).expect("create stderr file");
        self.command(run_dir, &[]).stdout(Stdio::null()).stderr(stderr).spawn().expect("start rekindle")
    }
}

/// What was on disk when [`kill_after_periodic_checkpoint`] killed a run.
#[derive(Debug, Clone, Copy)]
pub struct Killed {
    /// The newest checkpoint that had committed.
    pub checkpoint_step: u64,
    /// The last step in `metrics.jsonl`.
    pub last_logged_step: u64,
}

/// Starts `training` in `run_dir`, waits until a `checkpoint_saved` event of
/// kind `periodic` for a step ≥ `min_step` is in `events.jsonl` and the run
/// has logged `steps_past` more steps after it, then SIGKILLs it.
///
/// Panics if the run ends on its own before it could be killed.
pub fn kill_after_periodic_checkpoint(training: &Training, run_dir: &Path, min_step: u64, steps_past: u64) -> Killed {
    let mut child = training.spawn(run_dir);
    let started = Instant::now();
    let mut target = None;
    loop {
        if let Some(status) = child.try_wait().expect("poll rekindle") {
            let stderr = fs::read_to_string(run_dir.with_extension("stderr")).unwrap_or_default();
            panic!(
                "the run ended ({status}) before it could be killed (saved step {target:?}); lengthen it.\n{stderr}"
            );
        }
        if target.is_none() {
            target = events(run_dir)
                .iter()
                .filter(|e| e["event"] == "checkpoint_saved" && e["kind"] == "periodic")
                .filter_map(|e| e["step"].as_u64())
                .find(|&s| s >= min_step)
                .map(|s| s + steps_past);
        }
        if let Some(t) = target
            && last_logged_step(run_dir).is_some_and(|s| s >= t)
        {
            break;
        }
        assert!(started.elapsed() < WAIT_LIMIT, "no periodic checkpoint ≥ {min_step} within {WAIT_LIMIT:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
    child.kill().expect("SIGKILL rekindle");
    let status = child.wait().expect("reap rekindle");
    assert_eq!(status.signal(), Some(9), "rekindle was not killed by SIGKILL but ended with {status}");
    Killed {
        checkpoint_step: checkpoint_steps(run_dir).into_iter().max().expect("a committed checkpoint"),
        last_logged_step: last_logged_step(run_dir).expect("logged steps"),
    }
}

/// `<run_dir>/checkpoints/step-<10 digits>`.
pub fn step_dir(run_dir: &Path, step: u64) -> PathBuf {
    run_dir.join("checkpoints").join(format!("step-{step:010}"))
}

/// Steps of the committed checkpoint directories (not `.tmp-…`), ascending.
pub fn checkpoint_steps(run_dir: &Path) -> Vec<u64> {
    let mut steps: Vec<u64> = fs::read_dir(run_dir.join("checkpoints"))
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().to_str()?.strip_prefix("step-")?.parse().ok())
                .collect::<Vec<u64>>()
        })
        .unwrap_or_default();
    steps.sort_unstable();
    steps
}

/// The records of a JSON-lines file, skipping torn records; empty if the
/// file does not exist. A torn record is the start of one, cut short: a
/// writer killed mid-`write` (the kernel may end a write at a page boundary
/// when SIGKILL is pending), after which the next attempt ends the line and
/// appends (docs/run-directory.md). Any other line that does not parse is
/// corruption and fails the test.
pub fn jsonl(path: &Path) -> Vec<Value> {
    let Ok(text) = fs::read_to_string(path) else { return Vec::new() };
    text.lines()
        .enumerate()
        .filter_map(|(i, line)| match serde_json::from_str(line) {
            Ok(v) => Some(v),
            Err(e) if e.is_eof() && line.starts_with('{') => None,
            Err(e) => panic!("{}:{}: not JSON ({e}): {line}", path.display(), i + 1),
        })
        .collect()
}

/// The records of `events.jsonl`.
pub fn events(run_dir: &Path) -> Vec<Value> {
    jsonl(&run_dir.join("events.jsonl"))
}

/// The events named `name`.
pub fn events_named(run_dir: &Path, name: &str) -> Vec<Value> {
    events(run_dir).into_iter().filter(|e| e["event"] == name).collect()
}

/// `summary.json`.
pub fn summary(run_dir: &Path) -> Value {
    let path = run_dir.join("summary.json");
    serde_json::from_slice(&fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The highest step of a training line in `metrics.jsonl`.
pub fn last_logged_step(run_dir: &Path) -> Option<u64> {
    jsonl(&run_dir.join("metrics.jsonl"))
        .iter()
        .filter(|l| l.get("loss").is_some())
        .filter_map(|l| l["step"].as_u64())
        .max()
}

/// The values of a step's metrics line that must be reproduced exactly (no
/// wall-clock fields).
#[derive(Debug, Clone, PartialEq)]
pub struct StepValues {
    pub loss: Value,
    pub lr: Value,
    pub grad_norm: Value,
}

/// The step lines of `metrics.jsonl` by step, and the `val_loss` lines by
/// step, after asserting that no step has two lines of either kind.
pub fn metrics(run_dir: &Path) -> (BTreeMap<u64, StepValues>, BTreeMap<u64, Value>) {
    let path = run_dir.join("metrics.jsonl");
    let (mut steps, mut evals) = (BTreeMap::new(), BTreeMap::new());
    for line in jsonl(&path) {
        let step = line["step"].as_u64().unwrap_or_else(|| panic!("{}: a line without a step: {line}", path.display()));
        let duplicate = if let Some(val) = line.get("val_loss") {
            evals.insert(step, val.clone()).is_some()
        } else {
            let values =
                StepValues { loss: line["loss"].clone(), lr: line["lr"].clone(), grad_norm: line["grad_norm"].clone() };
            assert!(values.loss.is_number() && values.lr.is_number(), "{}: step {step}: {line}", path.display());
            steps.insert(step, values).is_some()
        };
        assert!(!duplicate, "{}: step {step} is logged twice", path.display());
    }
    (steps, evals)
}

/// The losses of steps `1..=max_steps`, after asserting that `metrics.jsonl`
/// holds each of those steps exactly once and no other.
pub fn losses(run_dir: &Path, max_steps: u64) -> Vec<f64> {
    let (steps, _) = metrics(run_dir);
    assert_every_step_once(&steps, max_steps, run_dir);
    steps.values().map(|v| v.loss.as_f64().expect("finite loss")).collect()
}

fn assert_every_step_once(steps: &BTreeMap<u64, StepValues>, max_steps: u64, run_dir: &Path) {
    let logged: Vec<u64> = steps.keys().copied().collect();
    let missing: Vec<u64> = (1..=max_steps).filter(|s| !steps.contains_key(s)).collect();
    assert!(
        logged.len() as u64 == max_steps && missing.is_empty(),
        "{}/metrics.jsonl must log steps 1..={max_steps} once each; missing {missing:?}, logged {} lines (last {:?})",
        run_dir.display(),
        logged.len(),
        logged.last()
    );
}

/// Asserts that `resumed` logged every step `1..=max_steps` exactly once with
/// the same loss, learning rate and gradient norm (and the same validation
/// losses) as `reference`.
pub fn assert_same_metrics(resumed: &Path, reference: &Path, max_steps: u64) {
    let (steps, evals) = metrics(resumed);
    let (ref_steps, ref_evals) = metrics(reference);
    assert_every_step_once(&ref_steps, max_steps, reference);
    assert_every_step_once(&steps, max_steps, resumed);
    for (step, expected) in &ref_steps {
        assert_eq!(&steps[step], expected, "metrics of step {step} differ from the uninterrupted run's");
    }
    assert_eq!(evals, ref_evals, "val_loss lines differ from the uninterrupted run's");
}

/// Asserts that the checkpoints of `step` in two run directories hold
/// byte-identical weights and optimizer state, and the same training state
/// (`state.json`'s `train`: RNG streams, data cursor, schedule, counters).
/// An optimizer state written in one part per rank (a sharded optimizer) is
/// compared as loading reassembles it.
pub fn assert_same_checkpoint(resumed: &Path, reference: &Path, step: u64) {
    let (dir, ref_dir) = (step_dir(resumed, step), step_dir(reference, step));
    for name in WEIGHT_FILES {
        if !dir.join(name).exists() || !ref_dir.join(name).exists() {
            // Written in shards (`[checkpoint] shard_size`, every rank its
            // share), or a sharded optimizer's state in one part per rank:
            // the tensors joined at load must be the same, value for value.
            let set = |d: &Path| match rekindle::checkpoint::load_dir(d) {
                Ok(loaded) if name == "optimizer.safetensors" => loaded.snapshot.optimizer,
                Ok(loaded) => loaded.snapshot.model,
                Err(failures) => panic!("{} does not load: {failures:?}", d.display()),
            };
            assert!(
                set(&dir) == set(&ref_dir),
                "{name} of step {step} in {} differs from the uninterrupted run's",
                resumed.display()
            );
            continue;
        }
        let (a, b) = (read(&dir.join(name)), read(&ref_dir.join(name)));
        assert!(a == b, "{name} of step {step} in {} differs from the uninterrupted run's", resumed.display());
    }
    let train_state = |d: &Path| -> Value {
        serde_json::from_slice::<Value>(&read(&d.join("state.json"))).expect("state.json is JSON")["train"].clone()
    };
    assert_eq!(train_state(&dir), train_state(&ref_dir), "training state of step {step} differs");
}

fn read(path: &Path) -> Vec<u8> {
    fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
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
