//! Logs of a real run: readable timestamped lines by default with lifecycle
//! events at info and no per-step lines; `-v` adds one debug line per step;
//! `--log-format json` writes one JSON object per line; `-q` keeps only
//! warnings and errors; `RUST_LOG` overrides the level.
//!
//! And output that cannot be written (issue #33: stderr or stdout on a full
//! file system, or a pipe nobody reads any more) loses only itself: `run`
//! and `exec` train, checkpoint and exit as documented; `verify`, `status`
//! and `checkpoints` never panic.

use crate::support;

use std::fs::File;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

use support::runs::{
    EXIT_DONE, EXIT_STOPPED, Training, events_named, expect_exit, outcome, rekindle, step_dir, summary, tiny_config,
};

const STEPS: usize = 12;

/// Trains the tiny config for STEPS steps with `flags`; returns stderr.
fn run_logs(dir: &Path, flags: &[&str], rust_log: Option<&str>) -> String {
    let mut cmd = rekindle();
    cmd.args(flags).arg("run").arg("--config").arg(tiny_config()).arg("--run-dir").arg(dir.join("run"));
    cmd.args(["--set", &format!("run.max_steps={STEPS}")]);
    if let Some(level) = rust_log {
        cmd.env("RUST_LOG", level);
    }
    String::from_utf8(expect_exit(&mut cmd, 0).stderr).expect("utf-8 logs")
}

fn step_lines(logs: &str) -> usize {
    logs.lines().filter(|l| l.contains("DEBUG") && l.contains(" step step=")).count()
}

#[test]
fn default_logs_are_timestamped_lifecycle_lines_without_per_step_detail() {
    let tmp = tempfile::tempdir().unwrap();
    let logs = run_logs(tmp.path(), &[], None);
    let finished = logs.lines().find(|l| l.contains("training finished")).unwrap_or_else(|| panic!("{logs}"));
    assert!(finished.contains(" INFO "), "{finished}");
    let stamp = finished.split_whitespace().next().unwrap();
    assert!(chrono::DateTime::parse_from_rfc3339(stamp).is_ok(), "no timestamp: {finished}");
    assert!(logs.contains("checkpoint saved"), "{logs}");
    assert_eq!(step_lines(&logs), 0, "{logs}");
    // Not under SLURM there is no job, and no `job=None` either (issue #33).
    let ready = logs.lines().find(|l| l.contains("run directory ready")).unwrap_or_else(|| panic!("{logs}"));
    assert!(!ready.contains("job="), "{ready}");
}

#[test]
fn verbose_adds_one_debug_line_per_step() {
    let tmp = tempfile::tempdir().unwrap();
    let logs = run_logs(tmp.path(), &["-v"], None);
    assert_eq!(step_lines(&logs), STEPS, "{logs}");
    let first = logs.lines().find(|l| l.contains(" step step=1 ")).unwrap_or_else(|| panic!("{logs}"));
    for field in ["loss=", "lr=", "grad_norm=", "samples_per_s="] {
        assert!(first.contains(field), "{field} missing: {first}");
    }
}

#[test]
fn json_format_writes_one_object_per_line_and_rust_log_sets_the_level() {
    let tmp = tempfile::tempdir().unwrap();
    let logs = run_logs(tmp.path(), &["--log-format", "json"], Some("rekindle=debug"));
    let records: Vec<Value> =
        logs.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"))).collect();
    let steps: Vec<&Value> = records.iter().filter(|r| r["message"] == "step").collect();
    assert_eq!(steps.len(), STEPS);
    assert_eq!(steps[0]["level"], "DEBUG");
    assert_eq!(steps[0]["step"], 1);
    assert!(steps[0]["loss"].is_f64());
    assert!(records.iter().any(|r| r["message"] == "training finished" && r["level"] == "INFO"));
    assert!(records.iter().all(|r| r["timestamp"].is_string()));
    let ready = records.iter().find(|r| r["message"] == "run directory ready").expect("a run directory ready line");
    assert!(ready.get("job").is_none(), "no job outside SLURM, not the string \"None\": {ready}");
}

#[test]
fn quiet_keeps_only_warnings_and_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let logs = run_logs(tmp.path(), &["-q"], None);
    assert!(!logs.contains(" INFO "), "{logs}");
    assert!(!logs.contains("DEBUG"), "{logs}");
}

/// Where a test sends output that rekindle cannot write.
#[derive(Debug, Clone, Copy)]
enum Unwritable {
    /// `/dev/full`: every write fails with ENOSPC, as on a full file system.
    FullDisk,
    /// A pipe whose read end is closed before rekindle starts: every write
    /// fails with EPIPE (and would kill a process that does not ignore
    /// SIGPIPE), as after `rekindle … | head -1`.
    ClosedPipe,
}

impl Unwritable {
    const ALL: [Unwritable; 2] = [Unwritable::FullDisk, Unwritable::ClosedPipe];

    fn stdio(self) -> Stdio {
        match self {
            Unwritable::FullDisk => {
                Stdio::from(File::options().write(true).open("/dev/full").expect("open /dev/full for writing"))
            }
            Unwritable::ClosedPipe => {
                let (reader, writer) = std::io::pipe().expect("create a pipe");
                drop(reader);
                Stdio::from(writer)
            }
        }
    }
}

/// Runs `cmd` with stdout and stderr both unwritable; asserts that it was
/// not killed by a signal (SIGPIPE) and did not panic (exit 101).
fn output_lost(cmd: &mut Command, sink: Unwritable) -> i32 {
    let status = cmd.stdin(Stdio::null()).stdout(sink.stdio()).stderr(sink.stdio()).status().expect("start rekindle");
    let code = status.code().unwrap_or_else(|| panic!("{cmd:?} with output to {sink:?} died of a signal: {status}"));
    assert_ne!(code, 101, "{cmd:?} with output to {sink:?} panicked");
    code
}

#[test]
fn a_run_whose_log_cannot_be_written_trains_checkpoints_and_exits_75() {
    for sink in Unwritable::ALL {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run");
        // -v: a log line per step as well, every one of them lost.
        let mut cmd = rekindle();
        cmd.args(["-v", "run", "--config"]).arg(tiny_config()).arg("--run-dir").arg(&dir);
        cmd.args(["--set", "run.max_steps=40", "--stop-at-step", "25"]);
        let code = output_lost(&mut cmd, sink);
        assert_eq!(code, EXIT_STOPPED, "with its log to {sink:?}");
        assert!(step_dir(&dir, 25).is_dir(), "no checkpoint of step 25 with its log to {sink:?}");
        expect_exit(rekindle().arg("verify").arg(&dir), EXIT_DONE);
        let stops = events_named(&dir, "stop");
        assert_eq!(stops.len(), 1, "the attempt's end is recorded: {stops:?}");
        assert_eq!(stops[0]["step"], 25);
        let summary = summary(&dir);
        assert_eq!((summary["state"].as_str(), summary["steps"].as_u64()), (Some("stopped"), Some(25)), "{summary}");
        // The next attempt, with a log that works, resumes and finishes.
        Training::tiny_mlp(40).run_to_end(&dir);
    }
}

#[test]
fn exec_whose_log_cannot_be_written_runs_the_program_and_exits_with_its_code() {
    for sink in Unwritable::ALL {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run");
        // The program writes to its stderr (teed to rekindle's, which fails)
        // and seals a checkpoint with a `seal` whose own output is lost too;
        // it exits with the seal's code.
        let script = r#"echo hi >&2; d="$REKINDLE_CHECKPOINT_DIR/s"; mkdir "$d" && echo w > "$d/w" &&
            "$REKINDLE_BIN" seal "$d" --step 1 >/dev/full 2>/dev/full"#;
        let mut cmd = rekindle();
        cmd.args(["exec", "--run-dir"]).arg(&dir).args(["--", "sh", "-c", script]);
        let code = output_lost(&mut cmd, sink);
        assert_eq!(code, EXIT_DONE, "with its log to {sink:?}");
        assert!(step_dir(&dir, 1).is_dir(), "the program's checkpoint was sealed with its log to {sink:?}");
        expect_exit(rekindle().arg("verify").arg(&dir), EXIT_DONE);
        assert_eq!(events_named(&dir, "child_exit").len(), 1, "the program's end is recorded");
    }
}

/// Runs `rekindle ARGS` with stdout unwritable and stderr captured.
fn with_stdout_lost(args: &[&str], dir: &Path, sink: Unwritable) -> (i32, String) {
    let out: Output =
        rekindle().args(args).arg(dir).stdin(Stdio::null()).stdout(sink.stdio()).output().expect("start rekindle");
    let (code, _, stderr) = outcome(&out);
    assert!(!stderr.contains("panicked"), "rekindle {args:?} with stdout to {sink:?} panicked:\n{stderr}");
    assert_ne!(code, 101, "rekindle {args:?} with stdout to {sink:?}:\n{stderr}");
    (code, stderr)
}

#[test]
fn verify_status_and_checkpoints_with_stdout_unwritable_keep_their_exit_code_and_never_panic() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    Training::tiny_mlp(20).stop_at(&dir, 10);
    let commands: [&[&str]; 6] = [
        &["verify"],
        &["verify", "--json"],
        &["status"],
        &["status", "--json"],
        &["checkpoints"],
        &["checkpoints", "--json"],
    ];
    for args in commands {
        for sink in Unwritable::ALL {
            let (code, stderr) = with_stdout_lost(args, &dir, sink);
            assert_eq!(code, EXIT_DONE, "rekindle {args:?} with stdout to {sink:?}:\n{stderr}");
            match sink {
                // Told, naming why: the output the user asked for is lost.
                Unwritable::FullDisk => assert!(
                    stderr.contains("could not be written to stdout") && stderr.contains("No space left on device"),
                    "rekindle {args:?}:\n{stderr}"
                ),
                // The reader went away on purpose (`| head`): quiet.
                Unwritable::ClosedPipe => assert_eq!(stderr, "", "rekindle {args:?}"),
            }
        }
    }
    // A checkpoint that fails verification still makes `verify` exit 1.
    support::flip_byte(&step_dir(&dir, 10).join("model.safetensors"));
    for sink in Unwritable::ALL {
        assert_eq!(with_stdout_lost(&["verify"], &dir, sink).0, 1, "with stdout to {sink:?}");
    }
}
