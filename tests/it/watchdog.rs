//! Hangs and crashes through the real binary: a step, an evaluation or a
//! background save made to hang with a sleeping failpoint (`FAILPOINTS` in
//! the child's environment) under a short `[watchdog]` limit ends the attempt
//! in bounded time with a `hang` event, a checkpoint of the last completed
//! step where the training thread is free, a requeue (stand-in `scontrol`),
//! exit 75 and a released lock; an injected step failure is classified:
//! transient after some steps (requeued with a hold, bounded by
//! `[run] max_crash_requeues`), deterministic on the first step (never
//! requeued).

use crate::support;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use support::cli::{RunCmd, assert_verifies, checkpoint_steps, events_named, last_event};
use support::git::remote_and_clone;
use support::scontrol::FakeScontrol;

/// A sleep far longer than any test: the watchdog must end it.
const FOREVER_MS: u64 = 600_000;
/// How long a hung run may take to exit: the 2 s limit, the checkpoint and
/// the records, on a slow shared machine. Without the watchdog it would
/// sleep for `FOREVER_MS`.
const HANG_EXIT: Duration = Duration::from_secs(45);
const EXIT: Duration = Duration::from_secs(60);

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().expect("temp dir")
}

/// A long run checkpointing every 10 steps, with the watchdog's `key` limit
/// at 2 s and a short grace (the budget of the checkpoint attempt).
fn watched_run(dir: &Path, key: &str) -> RunCmd {
    RunCmd::new(dir)
        .set("run.max_steps=10000000")
        .set("checkpoint.every_steps=10")
        .set(&format!("watchdog.{key}=\"2s\""))
        .set("signals.grace=\"20s\"")
        .set("signals.safety_margin=\"5s\"")
}

/// Runs `cmd` with `failpoints`, expects exit `code` within [`HANG_EXIT`];
/// returns the `hang` event.
fn hangs(cmd: RunCmd, dir: &Path, failpoints: &str, code: i32) -> Value {
    let started = Instant::now();
    let exited = cmd.env("FAILPOINTS", failpoints).run(HANG_EXIT);
    exited.assert_code(code);
    assert!(started.elapsed() < HANG_EXIT, "took {:?}", started.elapsed());
    assert!(exited.stderr.contains("HANG"), "the hang is logged loudly:\n{}", exited.tail());
    assert!(!dir.join("rekindle.lock").exists(), "the lock is released at the watchdog's exit");
    let hang = last_event(dir, "hang");
    assert_eq!(hang["limit_seconds"], 2.0, "{hang}");
    assert!(hang["stuck_seconds"].as_f64().unwrap() > 2.0, "{hang}");
    assert!(hang["since"].is_string(), "{hang}");
    hang
}

/// The last `scontrol` call set the job's ExcNodeList to the node the
/// `nodes_excluded` event (of `cause`) added.
fn assert_excluded(dir: &std::path::Path, calls: &[String], cause: &str) {
    let excluded = last_event(dir, "nodes_excluded");
    assert_eq!(excluded["cause"], cause, "{excluded}");
    let node = excluded["added"][0].as_str().unwrap_or_else(|| panic!("nothing added: {excluded}"));
    assert_eq!(calls.last().unwrap(), &format!("update JobId=77 ExcNodeList={node}"), "{calls:?}");
}

#[test]
fn a_stuck_step_is_a_hang_that_requeues_the_job_and_exits_75_with_the_last_checkpoint() {
    let tmp = tempdir();
    let dir = tmp.path().join("run");
    let fake = FakeScontrol::running_job(tmp.path());
    let cmd = watched_run(&dir, "step").env("PATH", fake.path()).env("SLURM_JOB_ID", "77");
    // Steps 1-30 pass; step 31 never ends.
    let hang = hangs(cmd, &dir, &format!("train::step=30*off->sleep({FOREVER_MS})"), 75);
    assert_eq!((&hang["activity"], &hang["thread"], &hang["step"]), (&"step".into(), &"training".into(), &31.into()));
    // The training thread is the stuck one: no new checkpoint, the requeue, and
    // a stop naming the newest committed checkpoint (step 30's, or an earlier
    // one: a save that falls due while the previous one is still being
    // written is deferred to the first step after it, e.g. 21; the persister
    // reports its commits itself, so one that finished while step 31 hung
    // counts).
    assert!(events_named(&dir, "checkpoint_saved").iter().all(|e| e["kind"] == "periodic"));
    // A step that hangs blames its node: excluded from the requeued job.
    let calls = fake.calls();
    assert_eq!(calls[..3], ["show job -o 77", "requeue 77", "show job -o 77"]);
    assert_excluded(&dir, &calls, "hang: step");
    assert_eq!(last_event(&dir, "requeue")["decision"], "requeue");
    let stop = last_event(&dir, "stop");
    let newest = *checkpoint_steps(&dir).last().expect("a checkpoint");
    assert!((10..=30).contains(&newest), "{newest}");
    assert_eq!((&stop["reason"], &stop["step"]), (&"hang: step".into(), &newest.into()), "{stop}");
    assert_eq!(stop["requeue"]["answer"], "requeued");
    let summary: Value = serde_json::from_slice(&std::fs::read(dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!((&summary["state"], &summary["steps"]), (&"stopped".into(), &30.into()), "{summary}");
    assert_eq!(summary["last_checkpoint_step"], newest);
    assert_verifies(&dir);
    // The requeued attempt hangs at once, before any new checkpoint: a hang
    // loop, bounded by [run] max_crash_requeues like a crash loop.
    let again = watched_run(&dir, "step")
        .set("run.max_crash_requeues=1")
        .env("PATH", fake.path())
        .env("SLURM_JOB_ID", "77")
        .env("SLURM_RESTART_COUNT", "1");
    hangs(again, &dir, &format!("train::step=sleep({FOREVER_MS})"), 75);
    let requeue = last_event(&dir, "requeue");
    assert_eq!(requeue["decision"], "skip", "{requeue}");
    assert!(requeue["reason"].as_str().unwrap().contains("max_crash_requeues = 1"), "{requeue}");
    assert_eq!(fake.calls().len(), 4, "SLURM not asked again: {:?}", fake.calls());
    // The next attempt resumes there.
    RunCmd::new(&dir)
        .set("run.max_steps=10000000")
        .set("checkpoint.every_steps=10")
        .arg("--stop-at-step")
        .arg("35")
        .run(EXIT)
        .assert_code(75);
    assert_eq!(last_event(&dir, "resume")["step"], newest);
}

#[test]
fn a_stuck_step_under_a_shell_that_offers_it_asks_for_an_in_job_restart_without_its_node() {
    let tmp = tempdir();
    let (dir, request) = (tmp.path().join("run"), tmp.path().join("request"));
    let fake = FakeScontrol::running_job(tmp.path());
    let under_a_shell = |restarts: &str| {
        watched_run(&dir, "step")
            .env("PATH", fake.path())
            .env("SLURM_JOB_ID", "77")
            .env("SLURMD_NODENAME", "n1")
            .env("SLURM_JOB_NODELIST", "n[1-2]")
            .env("REKINDLE_INJOB_REQUEST", &request)
            .env("REKINDLE_INJOB_RESTARTS", restarts)
            .env("REKINDLE_INJOB_MAX", "2")
    };
    hangs(under_a_shell("0"), &dir, &format!("train::step=30*off->sleep({FOREVER_MS})"), 75);
    let text = std::fs::read_to_string(&request).expect("a request for the batch shell");
    let asked = rekindle::slurm::injob::RestartRequest::parse(&text).expect("a restart request");
    // The hung node is left out of the next step: n2 is there to run it.
    assert_eq!((asked.reason.as_str(), &asked.exclude[..]), ("hang: step", &["n1".to_string()][..]), "{text}");
    assert_eq!(asked.requeue_exclude, ["n1"], "{text}");
    let calls = fake.calls();
    assert!(calls.iter().all(|c| c.starts_with("show job")), "no scontrol requeue: {calls:?}");
    let requeue = last_event(&dir, "requeue");
    assert_eq!(requeue["decision"], "skip", "{requeue}");
    assert!(requeue["reason"].as_str().unwrap().contains("in-job restart 1 of 2"), "{requeue}");
    let excluded = last_event(&dir, "nodes_excluded");
    assert_eq!((&excluded["how"], &excluded["added"]), (&"in_job".into(), &serde_json::json!(["n1"])), "{excluded}");
    let newest = *checkpoint_steps(&dir).last().expect("a checkpoint");
    let stop = last_event(&dir, "stop");
    assert_eq!((&stop["reason"], &stop["step"]), (&"hang: step".into(), &newest.into()), "{stop}");
    // The shell's bound spent: the job is requeued, the node left behind.
    std::fs::remove_file(&request).unwrap();
    hangs(under_a_shell("2"), &dir, &format!("train::step=sleep({FOREVER_MS})"), 75);
    assert!(!request.exists(), "no request once the bound is spent");
    assert_eq!(last_event(&dir, "requeue")["decision"], "requeue");
    assert_excluded(&dir, &fake.calls(), "hang: step");
}

#[test]
fn a_stuck_evaluation_is_a_hang_of_the_training_thread() {
    let tmp = tempdir();
    let dir = tmp.path().join("run");
    let cmd = watched_run(&dir, "eval").set("train.eval_every=5");
    // The evaluations after steps 5 and 10 pass; the one after step 15 never ends.
    let hang = hangs(cmd, &dir, &format!("run::eval=2*off->sleep({FOREVER_MS})"), 75);
    assert_eq!((&hang["activity"], &hang["thread"], &hang["step"]), (&"eval".into(), &"training".into(), &15.into()));
    let requeue = last_event(&dir, "requeue");
    assert!(requeue["reason"].as_str().unwrap().contains("not running under SLURM"), "{requeue}");
    assert_eq!(last_event(&dir, "stop")["step"], *checkpoint_steps(&dir).last().expect("a checkpoint"));
}

#[test]
fn a_stuck_background_save_gets_a_durable_checkpoint_of_the_last_step_beside_it() {
    let tmp = tempdir();
    let dir = tmp.path().join("run");
    // The first background save (step 10) passes; the next one (step 20, or
    // a later step when 20 fell due while 10 was still being written: the
    // save is deferred to the first step after, e.g. 21) never starts
    // writing.
    let hang = hangs(watched_run(&dir, "save"), &dir, &format!("persist::before_save=1*off->sleep({FOREVER_MS})"), 75);
    assert_eq!((&hang["activity"], &hang["thread"]), (&"save".into(), &"persister".into()));
    let stuck = hang["step"].as_u64().unwrap();
    assert!(stuck >= 20, "{hang}");
    // The training thread was free: it trained on, then wrote the last
    // completed step itself when the watchdog asked.
    let saved = last_event(&dir, "checkpoint_saved");
    assert_eq!(saved["kind"], "hang", "{saved}");
    let step = saved["step"].as_u64().unwrap();
    assert!(step > stuck, "the hang checkpoint is of a step trained after the stuck save: {step}");
    assert_eq!(last_event(&dir, "stop")["step"], step);
    assert_eq!(checkpoint_steps(&dir).last(), Some(&step));
    assert_verifies(&dir);
}

#[test]
fn a_publish_stuck_after_the_final_checkpoint_is_a_hang_that_keeps_it_and_is_not_requeued() {
    let tmp = tempdir();
    let dir = tmp.path().join("run");
    let (_remote, clone) = remote_and_clone(tmp.path());
    let fake = FakeScontrol::running_job(tmp.path());
    let publishing = |cmd: RunCmd| {
        cmd.set("run.max_steps=20")
            .set("checkpoint.every_steps=10")
            .set("publish.enabled=true")
            .set(&format!("publish.repo=\"{}\"", clone.display()))
            .env("PATH", fake.path())
            .env("SLURM_JOB_ID", "77")
    };
    let cmd = publishing(RunCmd::new(&dir).set("watchdog.publish=\"2s\""));
    let hang = hangs(cmd, &dir, &format!("run::publish=sleep({FOREVER_MS})"), 75);
    assert_eq!(
        (&hang["activity"], &hang["thread"], &hang["step"]),
        (&"publish".into(), &"training".into(), &20.into())
    );
    assert_eq!(last_event(&dir, "checkpoint_saved")["kind"], "final");
    let stop = last_event(&dir, "stop");
    assert_eq!((&stop["reason"], &stop["step"]), (&"hang: publish".into(), &20.into()), "{stop}");
    assert_eq!(stop["requeue"]["reason"], "training finished", "{stop}");
    assert!(!fake.calls().iter().any(|c| c.starts_with("requeue")), "{:?}", fake.calls());
    assert_verifies(&dir);
    // Run again: training is done; it publishes and finishes.
    publishing(RunCmd::new(&dir)).run(EXIT).assert_code(0);
    assert_eq!(last_event(&dir, "finish")["publish"]["pushed"], true);
}

#[test]
fn without_the_watchdog_a_stuck_step_is_not_ended() {
    let tmp = tempdir();
    let dir = tmp.path().join("run");
    let mut run = watched_run(&dir, "step")
        .set("watchdog.enabled=false")
        .env("FAILPOINTS", format!("train::step=3*off->sleep({FOREVER_MS})"))
        .spawn();
    run.wait_for_step(3, EXIT);
    // The scenario, not synchronisation: the step stays stuck well past the
    // 2 s limit the watchdog would have (watched_run's), and nothing ends it.
    std::thread::sleep(Duration::from_secs(5));
    assert!(events_named(&dir, "hang").is_empty());
    assert!(dir.join("rekindle.lock").exists(), "still running");
}

/// A run under (pretend) SLURM job 77 whose step fails after `passing` steps.
fn crashing_run(dir: &Path, fake: &FakeScontrol, passing: u64) -> RunCmd {
    RunCmd::new(dir)
        .set("run.max_steps=1000")
        .set("checkpoint.every_steps=10")
        .set("run.max_crash_requeues=1")
        .env("PATH", fake.path())
        .env("SLURM_JOB_ID", "77")
        .env("FAILPOINTS", format!("train::step_error={passing}*off->return"))
}

#[test]
fn a_transient_crash_requeues_with_a_hold_once_then_the_bound_stops_it() {
    let tmp = tempdir();
    let dir = tmp.path().join("run");
    let fake = FakeScontrol::running_job(tmp.path());
    // Step 26 fails after 25 passed: a device error, transient.
    crashing_run(&dir, &fake, 25).run(EXIT).assert_code(1);
    // A device error blames its node: excluded from the requeued job.
    let calls = fake.calls();
    assert_eq!(calls[..4], ["show job -o 77", "requeue 77", "update JobId=77 StartTime=now+60", "show job -o 77"]);
    assert_excluded(&dir, &calls, "crash: transient");
    let error = last_event(&dir, "error");
    assert_eq!((&error["class"], &error["step"]), (&"transient".into(), &25.into()), "{error}");
    assert_eq!((&error["requeue"]["decision"], &error["requeue"]["answer"]), (&"requeue".into(), &"requeued".into()));
    assert_eq!(error["hold_seconds"], 60);
    assert_eq!(last_event(&dir, "requeue")["decision"], "requeue");
    // The requeued attempt resumes from step 20 and crashes again before
    // its next checkpoint: one crash requeue in a row is the bound.
    crashing_run(&dir, &fake, 3).run(EXIT).assert_code(1);
    let error = last_event(&dir, "error");
    assert_eq!(error["class"], "transient", "{error}");
    assert_eq!(error["requeue"]["decision"], "skip");
    assert!(error["requeue"]["reason"].as_str().unwrap().contains("max_crash_requeues = 1"), "{error}");
    assert_eq!(fake.calls().len(), 5, "no second requeue: {:?}", fake.calls());
    assert_eq!(events_named(&dir, "requeue").len(), 1);
}

#[test]
fn a_deterministic_crash_exits_1_with_its_reason_and_is_never_requeued() {
    let tmp = tempdir();
    let dir = tmp.path().join("run");
    let fake = FakeScontrol::running_job(tmp.path());
    // The very first step fails: a setup error that a new attempt would repeat.
    let exited = crashing_run(&dir, &fake, 0).run(EXIT);
    exited.assert_code(1);
    assert!(exited.stderr.contains("deterministic"), "{}", exited.tail());
    assert!(fake.calls().is_empty(), "SLURM is not even asked: {:?}", fake.calls());
    assert!(events_named(&dir, "requeue").is_empty());
    let error = last_event(&dir, "error");
    assert_eq!(error["class"], "deterministic", "{error}");
    assert!(error["why"].as_str().unwrap().contains("first step"), "{error}");
    assert_eq!(error["requeue"]["decision"], "skip");
}
