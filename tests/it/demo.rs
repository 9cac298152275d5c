//! `make demo`'s script, `scripts/demo.sh`, as a newcomer runs it but with
//! the binary cargo built for the tests and a short run (issue #26, "The
//! first five minutes"): it must stop the run with a real SIGTERM past half
//! way, resume it with the same command, show its checkpoints, verify them,
//! show its status and write its report, and say what happened with the
//! numbers the run wrote. A change that breaks any of that fails here, not on
//! a newcomer's first try.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::support::cli::exe;
use crate::support::run_as_user;

/// Longest the script may take with the debug binary (it bounds a hang).
const TIMEOUT: Duration = Duration::from_secs(600);

/// Steps of the demo run here: enough for the script to see it past half
/// way and stop it before the end (it looks twice a second), few enough for
/// a debug build.
const STEPS: u64 = 100;

/// The demo's GPT, narrowed: in a debug build its own shape (width and
/// context 64) takes seconds a step, this one about a tenth of a second.
const NARROW: [&str; 8] =
    ["--set", "model.width=16", "--set", "model.heads=2", "--set", "model.context=16", "--set", "train.batch_size=16"];

/// The script's outcome: (exit code, stdout, stderr).
fn demo(args: &[&str], run_dir: &Path) -> (Option<i32>, String, String) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let logs = tempfile::tempdir().expect("log dir");
    let (out, err) = (logs.path().join("out"), logs.path().join("err"));
    let mut cmd = Command::new("sh");
    cmd.arg(root.join("scripts/demo.sh")).args(["--bin", exe()]).args(args).arg("--run-dir").arg(run_dir);
    // configs/demo.toml names its text relative to the working directory,
    // as `make demo` runs it: from the repository's root.
    cmd.current_dir(root);
    let code = run_as_user(cmd, &out, &err, TIMEOUT).and_then(|status| status.code());
    (code, fs::read_to_string(&out).unwrap_or_default(), fs::read_to_string(&err).unwrap_or_default())
}

fn events(run_dir: &Path) -> Vec<Value> {
    let text = fs::read_to_string(run_dir.join("events.jsonl")).expect("events.jsonl");
    text.lines().map(|l| serde_json::from_str(l).expect("an event line")).collect()
}

/// The only event of kind `kind`.
fn the(events: &[Value], kind: &str) -> Value {
    let found: Vec<&Value> = events.iter().filter(|e| e["event"] == kind).collect();
    assert_eq!(found.len(), 1, "one `{kind}` event: {events:#?}");
    found[0].clone()
}

#[test]
fn the_demo_stops_the_run_with_sigterm_past_half_way_resumes_it_and_says_what_happened() {
    let scratch = tempfile::tempdir().unwrap();
    let run_dir: PathBuf = scratch.path().join("demo");
    let steps = STEPS.to_string();
    let args = [&["--config", "configs/demo.toml", "--steps", &steps][..], &NARROW].concat();
    let (code, out, err) = demo(&args, &run_dir);
    assert_eq!(code, Some(0), "scripts/demo.sh failed\n--- stdout:\n{out}\n--- stderr:\n{err}");

    // A real signal, past half way, and a checkpoint of the step it came at.
    let events = events(&run_dir);
    let signal = the(&events, "signal");
    assert_eq!(signal["signal"], "SIGTERM", "{signal}");
    let stop = the(&events, "stop");
    let stopped_at = stop["step"].as_u64().expect("the stop names its checkpoint's step");
    assert!((STEPS / 2..STEPS).contains(&stopped_at), "stopped at step {stopped_at} of {STEPS}: {stop}");
    assert_eq!(stop["reason"], "SIGTERM");
    assert_eq!(signal["step"].as_u64(), Some(stopped_at), "the checkpoint is of the step the stop was acted on at");
    // The same command resumed from it, lost nothing, and finished.
    let resume = the(&events, "resume");
    assert_eq!(resume["step"].as_u64(), Some(stopped_at), "{resume}");
    assert_eq!(resume["steps_lost"].as_u64(), Some(0), "{resume}");
    assert_eq!(the(&events, "finish")["step"].as_u64(), Some(STEPS));
    assert!(run_dir.join("report.html").is_file(), "the report was written");

    // What the script says is what the run wrote.
    let saved = events.iter().find(|e| e["event"] == "checkpoint_saved" && e["kind"] == "stop").expect("the stop save");
    let save_ms = (saved["persist_seconds"].as_f64().unwrap() * 1000.0).round();
    let after = stop["seconds_to_durable_checkpoint"].as_f64().unwrap();
    let summary =
        out.split("What just happened").nth(1).expect("the summary").split_whitespace().collect::<Vec<_>>().join(" ");
    for said in [
        "Then SIGTERM (kill -TERM".to_string(),
        format!("a checkpoint of the last step it completed, step {stopped_at}, in {save_ms} ms"),
        format!("(durable {after:.2} s after the signal) and exited 75"),
        format!("resumed from the checkpoint of step {stopped_at} (0 steps lost)"),
        format!("finished at step {STEPS} (exit 0)"),
        "every file of every checkpoint kept matches its SHA-256 manifest".to_string(),
        format!("open {}/report.html", run_dir.display()),
        "sbatch slurm/orchestrator.slurm configs/demo.toml".to_string(),
        "rekindle exec --run-dir".to_string(),
    ] {
        assert!(summary.contains(&said), "the demo's summary lacks {said:?}\n--- stdout:\n{out}");
    }
    // The loss at the first and the last step, and the validation loss of
    // the evaluations (every 50 steps).
    let loss = summary.split("rekindle trained configs/demo.toml: loss ").nth(1).expect("the loss");
    assert!(loss.starts_with(|c: char| c.is_ascii_digit()) && loss.contains(" at step 1, "), "{loss}");
    assert!(loss.contains(&format!(" at step {STEPS}; validation loss ")), "{loss}");
    assert!(loss.contains(" at step 50, ") && loss.contains(&format!(" at step {STEPS}. ")), "{loss}");
}

#[test]
fn the_demo_empties_no_directory_that_is_not_a_rekindle_run_directory() {
    let scratch = tempfile::tempdir().unwrap();
    let mine = scratch.path().join("mine");
    fs::create_dir(&mine).unwrap();
    fs::write(mine.join("notes.txt"), "mine").unwrap();
    let (code, out, err) = demo(&["--steps", "2"], &mine);
    assert_eq!(code, Some(1), "--- stdout:\n{out}\n--- stderr:\n{err}");
    assert!(err.contains("is not a rekindle run directory: not emptying it"), "{err}");
    assert_eq!(fs::read_to_string(mine.join("notes.txt")).unwrap(), "mine");
}
