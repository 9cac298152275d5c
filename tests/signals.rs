//! The orchestrator through the real binary, with real signals and processes:
//! each stop signal checkpoints the current step and a rerun resumes there;
//! second and third signals; a signal before training begins; the requeue
//! decision carried out with a stand-in `scontrol` first on PATH; the
//! run-directory lock; failing background checkpoints (failpoints); publishing
//! on exit; and the grace period bounding everything after the checkpoint.

mod support;

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use nix::sys::signal::Signal;
use serde_json::Value;

use support::cli::{
    RunCmd, assert_verifies, checkpoint_steps, events_named, last_event, last_metric_step, metric_steps, rfc3339,
};

/// Longest wait for a child to get going (debug build, shared machine).
const STARTUP: Duration = Duration::from_secs(60);
/// Longest wait for a child to exit once it should.
const EXIT: Duration = Duration::from_secs(60);
/// A graceful stop of the tiny model takes tens of milliseconds; the default
/// grace period is 120 s. Anything near this bound is a bug.
const WELL_WITHIN_GRACE: Duration = Duration::from_secs(5);

/// A run that would take hours: it only ends when told to.
fn long_run(dir: &Path) -> RunCmd {
    RunCmd::new(dir).set("run.max_steps=10000000").set("checkpoint.every_steps=100")
}

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().expect("temp dir")
}

fn signal_name(sig: Signal) -> &'static str {
    sig.as_str()
}

/// Sends `sig` once training is under way; checks exit 75 well within the
/// grace period, that the checkpoint holds the last trained step, the `signal`
/// and `stop` events; then reruns and checks it resumes from exactly that step
/// and continues.
fn stop_signal_checkpoints_current_step_and_rerun_resumes_there(sig: Signal) {
    let tmp = tempdir();
    let dir = tmp.path().join("run");
    let mut run = long_run(&dir).spawn();
    run.wait_for_event("checkpoint_saved", STARTUP);
    let sent_at = Instant::now();
    let sent_wall = run.signal(sig);
    let exited = run.wait(EXIT);
    exited.assert_code(75);
    let took = exited.at - sent_at;
    assert!(took < WELL_WITHIN_GRACE, "{sig} took {took:?} to exit");

    assert_verifies(&dir);
    let saved = *checkpoint_steps(&dir).last().expect("a checkpoint");
    assert_eq!(last_metric_step(&dir), Some(saved), "the stop checkpoint is not of the last trained step");
    let stop_save = events_named(&dir, "checkpoint_saved").into_iter().find(|e| e["kind"] == "stop").unwrap();
    assert_eq!(stop_save["step"], saved);

    let signal = last_event(&dir, "signal");
    assert_eq!(signal["signal"], signal_name(sig));
    assert_eq!(signal["step"], saved);
    let arrival = rfc3339(&signal["arrival"]);
    // Event times have millisecond resolution (truncated).
    assert!(
        arrival + Duration::from_millis(2) >= sent_wall && arrival <= SystemTime::now(),
        "arrival {} is not when the signal was sent",
        signal["arrival"]
    );
    let stop = last_event(&dir, "stop");
    assert_eq!(stop["reason"], signal_name(sig));
    assert_eq!(stop["step"], saved);
    let to_durable = stop["seconds_to_durable_checkpoint"].as_f64().expect("seconds_to_durable_checkpoint");
    assert!(to_durable > 0.0 && to_durable <= took.as_secs_f64(), "seconds_to_durable_checkpoint {to_durable}");
    // Default grace 120 s minus the 10 s safety margin, less what the stop took.
    let left = stop["seconds_left"].as_f64().expect("seconds_left");
    assert!(left > 110.0 - took.as_secs_f64() && left <= 110.0, "seconds_left {left}");

    // The same command again: resumes from that step, loses nothing, continues.
    let until = saved + 20;
    long_run(&dir).arg("--stop-at-step").arg(&until.to_string()).run(EXIT).assert_code(75);
    let resume = last_event(&dir, "resume");
    assert_eq!(resume["step"], saved);
    assert_eq!(resume["steps_lost"], 0);
    assert_eq!(metric_steps(&dir), (1..=until).collect::<Vec<_>>(), "every step logged exactly once");
    assert_eq!(checkpoint_steps(&dir).last(), Some(&until));
    assert_verifies(&dir);
}

#[test]
fn sigterm_checkpoints_the_current_step_and_a_rerun_resumes_there() {
    stop_signal_checkpoints_current_step_and_rerun_resumes_there(Signal::SIGTERM);
}

#[test]
fn sigint_checkpoints_the_current_step_and_a_rerun_resumes_there() {
    stop_signal_checkpoints_current_step_and_rerun_resumes_there(Signal::SIGINT);
}

#[test]
fn sigusr1_checkpoints_the_current_step_and_a_rerun_resumes_there() {
    stop_signal_checkpoints_current_step_and_rerun_resumes_there(Signal::SIGUSR1);
}

#[test]
fn sigusr2_checkpoints_the_current_step_and_a_rerun_resumes_there() {
    stop_signal_checkpoints_current_step_and_rerun_resumes_there(Signal::SIGUSR2);
}

// ---------------------------------------------------------------------------
// A stand-in scontrol.

/// A stand-in `scontrol` in its own directory: answers `show job -o ID` with a
/// canned line, runs `on_requeue` (shell) for `requeue ID`, and records every
/// invocation, one line each.
struct FakeScontrol {
    bin: PathBuf,
    log: PathBuf,
}

/// What `scontrol show job -o 77` prints for a requeueable running batch job.
const RUNNING_JOB: &str =
    "JobId=77 JobName=tiny JobState=RUNNING Reason=None Requeue=1 Restarts=0 BatchFlag=1 NodeList=n1";

impl FakeScontrol {
    fn new(root: &Path, show_job: &str, on_requeue: &str) -> FakeScontrol {
        let bin = root.join("fake-bin");
        std::fs::create_dir_all(&bin).unwrap();
        let log = root.join("scontrol-calls");
        let script = format!(
            "#!/bin/sh\necho \"$*\" >> '{log}'\ncase \"$1\" in\n  show) {show} ;;\n  requeue) {on_requeue} ;;\nesac\n",
            log = log.display(),
            show = if show_job.starts_with("exec ") { show_job.to_string() } else { format!("echo '{show_job}'") },
        );
        let path = bin.join("scontrol");
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        FakeScontrol { bin, log }
    }

    fn running_job(root: &Path) -> FakeScontrol {
        FakeScontrol::new(root, RUNNING_JOB, "exit 0")
    }

    /// PATH with the stand-in first.
    fn path(&self) -> OsString {
        let mut path = OsString::from(&self.bin);
        path.push(":");
        path.push(std::env::var_os("PATH").unwrap_or_default());
        path
    }

    fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log).map(|t| t.lines().map(String::from).collect()).unwrap_or_default()
    }
}

/// A long run under a (pretend) SLURM job, stopped with SIGTERM once training
/// is under way; returns its `requeue` event.
fn sigterm_under_slurm(dir: &Path, path: OsString, env: &[(&str, &str)], sets: &[&str]) -> Value {
    let mut cmd = long_run(dir).env("PATH", path);
    for (k, v) in env {
        cmd = cmd.env(k, v);
    }
    for s in sets {
        cmd = cmd.set(s);
    }
    let mut run = cmd.spawn();
    run.wait_for_step(1, STARTUP);
    run.signal(Signal::SIGTERM);
    run.wait(EXIT).assert_code(75);
    let requeue = last_event(dir, "requeue");
    let in_stop = &last_event(dir, "stop")["requeue"];
    assert_eq!((&in_stop["decision"], &in_stop["reason"]), (&requeue["decision"], &requeue["reason"]));
    requeue
}

fn reason(requeue: &Value) -> &str {
    requeue["reason"].as_str().unwrap_or_else(|| panic!("requeue event without a reason: {requeue}"))
}

#[test]
fn running_requeueable_batch_job_is_requeued_with_scontrol() {
    let tmp = tempdir();
    let fake = FakeScontrol::running_job(tmp.path());
    let dir = tmp.path().join("run");
    let requeue = sigterm_under_slurm(&dir, fake.path(), &[("SLURM_JOB_ID", "77")], &[]);
    assert_eq!(fake.calls(), ["show job -o 77", "requeue 77"]);
    assert_eq!(requeue["decision"], "requeue", "{requeue}");
    assert_eq!(requeue["job_id"], "77");
    assert_eq!(requeue["answer"], "requeued");
    assert_eq!(requeue["job_id"], last_event(&dir, "start")["job_id"], "events carry the job id");
}

#[test]
fn cancelled_job_is_never_requeued() {
    let tmp = tempdir();
    let fake = FakeScontrol::new(tmp.path(), &RUNNING_JOB.replace("RUNNING", "CANCELLED"), "exit 0");
    let requeue = sigterm_under_slurm(&tmp.path().join("run"), fake.path(), &[("SLURM_JOB_ID", "77")], &[]);
    assert_eq!(fake.calls(), ["show job -o 77"]);
    assert_eq!(requeue["decision"], "skip");
    assert!(reason(&requeue).contains("cancelled"), "{requeue}");
}

#[test]
fn array_task_is_requeued_as_array_job_underscore_task() {
    let tmp = tempdir();
    let fake = FakeScontrol::new(
        tmp.path(),
        &RUNNING_JOB.replace("JobId=77", "JobId=73 ArrayJobId=70 ArrayTaskId=3"),
        "exit 0",
    );
    let env = [("SLURM_JOB_ID", "73"), ("SLURM_ARRAY_JOB_ID", "70"), ("SLURM_ARRAY_TASK_ID", "3")];
    let requeue = sigterm_under_slurm(&tmp.path().join("run"), fake.path(), &env, &[]);
    assert_eq!(fake.calls(), ["show job -o 70_3", "requeue 70_3"]);
    assert_eq!(requeue["job_id"], "70_3");
}

#[test]
fn requeue_never_leaves_scontrol_alone() {
    let tmp = tempdir();
    let fake = FakeScontrol::running_job(tmp.path());
    let requeue = sigterm_under_slurm(
        &tmp.path().join("run"),
        fake.path(),
        &[("SLURM_JOB_ID", "77")],
        &["signals.requeue=never"],
    );
    assert_eq!(fake.calls(), Vec::<String>::new());
    assert_eq!(requeue["decision"], "skip");
    assert!(reason(&requeue).contains("never"), "{requeue}");
}

#[test]
fn job_restarted_max_restarts_times_is_not_requeued_again() {
    let tmp = tempdir();
    let fake = FakeScontrol::running_job(tmp.path());
    let dir = tmp.path().join("run");
    let env = [("SLURM_JOB_ID", "77"), ("SLURM_RESTART_COUNT", "3")];
    let requeue = sigterm_under_slurm(&dir, fake.path(), &env, &["signals.max_restarts=3"]);
    assert!(!fake.calls().iter().any(|c| c.starts_with("requeue")), "requeued: {:?}", fake.calls());
    assert_eq!(requeue["decision"], "skip");
    assert!(
        reason(&requeue).contains("restarted 3 times") && reason(&requeue).contains("max_restarts = 3"),
        "{requeue}"
    );
    assert_eq!(requeue["attempt"], 3, "events carry SLURM_RESTART_COUNT as the attempt");
}

#[test]
fn missing_scontrol_skips_the_requeue_and_says_so() {
    let tmp = tempdir();
    // A PATH with nothing on it: no scontrol (as inside many containers).
    let empty = tmp.path().join("empty-bin");
    std::fs::create_dir_all(&empty).unwrap();
    let requeue = sigterm_under_slurm(&tmp.path().join("run"), empty.into(), &[("SLURM_JOB_ID", "77")], &[]);
    assert_eq!(requeue["decision"], "skip");
    assert!(reason(&requeue).contains("scontrol not found"), "{requeue}");
}

#[test]
fn job_already_pending_answer_counts_as_requeued() {
    let tmp = tempdir();
    let pending = "echo 'Requeue of JobId=77 returned an error: Job is pending execution' >&2; exit 1";
    let fake = FakeScontrol::new(tmp.path(), RUNNING_JOB, pending);
    let requeue = sigterm_under_slurm(&tmp.path().join("run"), fake.path(), &[("SLURM_JOB_ID", "77")], &[]);
    assert_eq!(fake.calls(), ["show job -o 77", "requeue 77"]);
    assert_eq!(requeue["decision"], "requeue");
    assert_eq!(requeue["answer"], "already_pending", "{requeue}");
    assert!(requeue.get("error").is_none(), "{requeue}");
}

#[test]
fn without_slurm_requeue_is_skipped_with_a_note() {
    let tmp = tempdir();
    let fake = FakeScontrol::running_job(tmp.path());
    let requeue = sigterm_under_slurm(&tmp.path().join("run"), fake.path(), &[], &[]);
    assert_eq!(fake.calls(), Vec::<String>::new());
    assert_eq!(requeue["decision"], "skip");
    assert!(reason(&requeue).contains("not running under SLURM"), "{requeue}");
}
