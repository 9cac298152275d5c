//! Issue #33, "every documented claim is true", through the real binary:
//! every JSON file rekindle writes has its keys in alphabetical order
//! (docs/run-directory.md); `rekindle status` of an exec run shows a total
//! only where `[run] max_steps` is configured; the bad-data error suggests a
//! `rekindle data validate` command that finds the lines the run found. (The
//! settings guard and `max_steps` with `decay_steps` are in `resume.rs`.)

use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::{Value, json};

use crate::support::cli::{RunCmd, last_event};
use crate::support::runs::{EXIT_DONE, EXIT_STOPPED, outcome, rekindle, tiny_config};

/// Longest wait for a run or a program (debug build on a shared machine).
const TIMEOUT: Duration = Duration::from_secs(120);

/// `rekindle ARGS…` to its end: (exit code, stdout, stderr).
fn rekindle_out(args: &[&str]) -> (i32, String, String) {
    outcome(&rekindle().args(args).output().expect("start rekindle"))
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 temporary path")
}

/// Every `.json` and `.jsonl` file under `dir`, recursively.
fn json_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("listing {}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(json_files(&path));
        } else if path.extension().is_some_and(|e| e == "json" || e == "jsonl") {
            files.push(path);
        }
    }
    files
}

/// Fails naming each file whose objects' keys are not in alphabetical order.
fn assert_keys_in_order(files: &[PathBuf]) {
    let unsorted: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let text = std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            rekindle::telemetry::first_unsorted_key(&text).map(|why| format!("{}: {why}", f.display()))
        })
        .collect();
    assert!(unsorted.is_empty(), "docs/run-directory.md: keys in alphabetical order:\n{}", unsorted.join("\n"));
}

/// docs/run-directory.md: "Keys of each object are written in alphabetical
/// order" — in every file of a run directory and a checkpoint, the lock and
/// the stop file included (they are read while the run holds them).
#[test]
fn issue_33_every_json_file_rekindle_writes_has_its_keys_in_alphabetical_order() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    RunCmd::new(&run).set("run.max_steps=10").set("checkpoint.every_steps=5").run(TIMEOUT).assert_code(EXIT_DONE);
    let files = json_files(&run);
    for name in ["MANIFEST.json", "state.json", "summary.json", "events.jsonl", "metrics.jsonl"] {
        assert!(files.iter().any(|f| f.ends_with(name)), "a run writes {name}: {files:?}");
    }
    assert_keys_in_order(&files);

    // `rekindle exec`: the program copies the lock it runs under and the
    // stop file, and seals a files checkpoint.
    let exec_run = tmp.path().join("exec");
    let script = r#"cp "$REKINDLE_RUN_DIR/rekindle.lock" "$REKINDLE_RUN_DIR/../lock.json"
        d="$REKINDLE_CHECKPOINT_DIR/s"; mkdir "$d"; echo w > "$d/w"; "$REKINDLE_BIN" -q seal "$d" --step 1
        trap '' TERM; touch "$REKINDLE_RUN_DIR/../ready"
        while [ ! -e "$REKINDLE_STOP_FILE" ]; do sleep 0.05; done"#;
    let mut running = RunCmd::exec(&exec_run, &["sh", "-c", script]).spawn();
    running.wait_until("the program's seal", TIMEOUT, |_| tmp.path().join("ready").exists());
    running.signal(Signal::SIGTERM);
    running.wait(TIMEOUT).assert_code(EXIT_STOPPED);
    let mut files = json_files(&exec_run);
    files.push(tmp.path().join("lock.json"));
    for name in ["MANIFEST.json", "stop-requested.json", "summary.json", "events.jsonl", "lock.json"] {
        assert!(files.iter().any(|f| f.ends_with(name)), "{name} was written: {files:?}");
    }
    assert_keys_in_order(&files);
}

/// After `rekindle exec` without a configured `[run] max_steps` there is
/// no total: `status` shows the step alone (not `200 / 1000 (20.0%)`, the
/// default that means nothing to a program rekindle does not train).
#[test]
fn issue_33_status_of_an_exec_run_shows_a_total_only_where_one_is_configured() {
    let tmp = tempfile::tempdir().unwrap();
    let script =
        r#"d="$REKINDLE_CHECKPOINT_DIR/s"; mkdir "$d"; echo w > "$d/w"; "$REKINDLE_BIN" -q seal "$d" --step 200"#;
    let run = tmp.path().join("unconfigured");
    RunCmd::exec(&run, &["sh", "-c", script]).run(TIMEOUT).assert_code(EXIT_DONE);
    let (code, stdout, stderr) = rekindle_out(&["status", path_str(&run)]);
    assert_eq!(code, EXIT_DONE, "{stderr}");
    assert!(stdout.contains("state     finished\n") && stdout.contains("step      200\n"), "{stdout}");
    assert!(!stdout.contains("1000") && !stdout.contains('%'), "{stdout}");
    let (_, json, _) = rekindle_out(&["status", path_str(&run), "--json"]);
    let status: Value = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"));
    assert_eq!((&status["step"], &status["max_steps"], &status["progress"]), (&json!(200), &Value::Null, &Value::Null));
    assert_eq!(last_event(&run, "start")["max_steps"], Value::Null);
    let summary: Value = serde_json::from_slice(&std::fs::read(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["max_steps"], Value::Null, "{summary}");

    let run = tmp.path().join("configured");
    RunCmd::exec(&run, &["sh", "-c", script]).set("run.max_steps=400").run(TIMEOUT).assert_code(EXIT_DONE);
    let (_, stdout, _) = rekindle_out(&["status", path_str(&run)]);
    assert!(stdout.contains("step      200 / 400 (50.0%)\n"), "{stdout}");
}

/// The bad-data error of a run suggests a `rekindle data validate` command;
/// run as printed, it finds exactly the lines the run found (the config's
/// `field` and `max_len` included, which `data validate` alone does not
/// know).
#[test]
fn issue_33_the_bad_data_error_suggests_a_command_that_finds_the_same_lines() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("my corpus.jsonl");
    let long = format!(r#"{{"body": "{}"}}"#, "a long record ".repeat(4));
    let lines = [r#"{"body": "short one"}"#, &long, "not json", r#"{"body": "short two"}"#, &long, r#"{"text": "x"}"#];
    std::fs::write(&data, lines.map(|l| format!("{l}\n")).concat()).unwrap();
    let out = rekindle()
        .args(["-q", "run", "--config"])
        .arg(tiny_config())
        .arg("--run-dir")
        .arg(tmp.path().join("run"))
        .args(["--set", "model.kind=\"gpt\"", "--set", "model.layers=1", "--set", "model.width=16"])
        .args(["--set", "model.heads=2", "--set", "model.context=16", "--set", "data.kind=\"jsonl\""])
        .args([
            "--set",
            &format!("data.path={}", serde_json::to_string(path_str(&data)).unwrap()),
            "--set",
            "data.field=\"body\"",
        ])
        .args(["--set", "data.max_len=20"])
        .output()
        .unwrap();
    let (code, _, stderr) = outcome(&out);
    assert_ne!(code, EXIT_DONE, "{stderr}");
    assert!(stderr.contains("4 of 6 records are invalid"), "{stderr}");
    let (_, after) = stderr.split_once("run `").unwrap_or_else(|| panic!("no command suggested: {stderr}"));
    let (command, _) = after.split_once('`').unwrap();
    assert!(command.starts_with("rekindle data validate ") && command.contains("--max-len 20"), "{command}");

    let bin_dir = Path::new(crate::support::cli::exe()).parent().unwrap();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    let printed = std::process::Command::new("sh").arg("-c").arg(command).env("PATH", path).output().unwrap();
    let (code, stdout, stderr) = outcome(&printed);
    assert_eq!(code, 1, "the suggested command finds bad lines: {stdout}{stderr}");
    assert!(stdout.contains("6 lines, 2 valid, 4 invalid"), "the run's 4 of 6: {stdout}");
    assert!(stdout.contains("too_long") && stdout.contains("(line 2, 5)"), "{stdout}");
}
