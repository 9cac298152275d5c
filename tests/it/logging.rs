//! Logs of a real run: readable timestamped lines by default with lifecycle
//! events at info and no per-step lines; `-v` adds one debug line per step;
//! `--log-format json` writes one JSON object per line; `-q` keeps only
//! warnings and errors; `RUST_LOG` overrides the level.

use crate::support;

use std::path::Path;

use serde_json::Value;

use support::runs::{expect_exit, rekindle, tiny_config};

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
}

#[test]
fn quiet_keeps_only_warnings_and_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let logs = run_logs(tmp.path(), &["-q"], None);
    assert!(!logs.contains(" INFO "), "{logs}");
    assert!(!logs.contains("DEBUG"), "{logs}");
}
