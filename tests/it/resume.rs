//! Acceptance of bit-exact resume (issue 3), through the real binary: a run
//! stopped at any step — with `--stop-at-step`, or SIGKILLed right after a
//! periodic checkpoint — and resumed in a new process ends with the same
//! `model.safetensors` and `optimizer.safetensors` bytes as a run never
//! stopped, and its `metrics.jsonl` holds every step exactly once with the
//! same loss, learning rate and gradient norm.
//!
//! Also: the tiny run learns; a resume with changed training settings is
//! refused unless allowed; a corrupted newest checkpoint is skipped, and
//! quarantined so that rotation never counts it (issue 15).
//!
//! Workloads are kept tiny (a step takes milliseconds in a debug build).

use crate::support;

use std::fs;

use support::flip_byte;
use support::runs::{
    EXIT_CONFIG, EXIT_DONE, EXIT_STOPPED, Training, assert_same_checkpoint, assert_same_metrics, checkpoint_steps,
    events, events_named, kill_after_periodic_checkpoint, losses, metrics, outcome, rekindle, step_dir, summary,
};

/// Trains `training` uninterrupted in `<tmp>/reference`, then once per
/// schedule in a fresh directory: stops at each step of the schedule in turn
/// (a new process each time, exit 75), runs to the end (exit 0), and asserts
/// that the result is the reference's, bit for bit.
fn assert_stopped_runs_match_uninterrupted(training: &Training, schedules: &[&[u64]]) {
    let tmp = tempfile::tempdir().unwrap();
    let reference = tmp.path().join("reference");
    training.run_to_end(&reference);
    let n = training.max_steps();
    for (i, schedule) in schedules.iter().enumerate() {
        let dir = tmp.path().join(format!("stopped-{i}"));
        for &k in *schedule {
            training.stop_at(&dir, k);
        }
        training.run_to_end(&dir);
        let context = format!("stopped at {schedule:?}");
        assert_same_checkpoint(&dir, &reference, n);
        assert_same_metrics(&dir, &reference, n);
        let resumed_from: Vec<u64> =
            events_named(&dir, "resume").iter().map(|e| e["step"].as_u64().expect("resume step")).collect();
        assert_eq!(resumed_from, schedule.to_vec(), "{context}: each attempt resumes from the previous stop");
        assert_eq!(summary(&dir)["resumes"], schedule.len(), "{context}: summary.json counts the resumes");
    }
}

/// SIGKILLs `training` after its first periodic checkpoint at or past
/// `min_step` (and `steps_past` more steps), resumes it to the end, and
/// asserts the result equals an uninterrupted run's.
fn assert_killed_run_matches_uninterrupted(training: &Training, min_step: u64, steps_past: u64) {
    let tmp = tempfile::tempdir().unwrap();
    let (reference, killed_dir) = (tmp.path().join("reference"), tmp.path().join("killed"));
    let killed = kill_after_periodic_checkpoint(training, &killed_dir, min_step, steps_past);
    assert!(
        killed.last_logged_step > killed.checkpoint_step,
        "the kill should lose steps: logged {killed:?}; shorten the wait or lengthen the run"
    );
    training.run_to_end(&killed_dir);
    training.run_to_end(&reference);

    let n = training.max_steps();
    assert_same_checkpoint(&killed_dir, &reference, n);
    // Steps after the checkpoint were logged by the killed process and again
    // by the resumed one: the orchestrator must have dropped the first lines.
    assert_same_metrics(&killed_dir, &reference, n);
    let resumes = events_named(&killed_dir, "resume");
    assert_eq!(resumes.len(), 1, "one resume event: {resumes:?}");
    assert_eq!(resumes[0]["step"], killed.checkpoint_step, "resumed from the newest committed checkpoint");
    assert_eq!(
        resumes[0]["steps_lost"],
        killed.last_logged_step - killed.checkpoint_step,
        "steps_lost counts the steps logged after the checkpoint ({killed:?})"
    );
}

#[test]
fn stopped_and_resumed_mlp_ends_byte_identical() {
    // tiny.toml checkpoints every 50 steps: 50 is a periodic boundary, 59 the
    // step before the end, 0 a stop before any training.
    let training = Training::tiny_mlp(60);
    assert_stopped_runs_match_uninterrupted(&training, &[&[1, 50], &[0, 25, 59], &[49, 51]]);
}

#[test]
fn stopped_and_resumed_mlp_with_dropout_ends_byte_identical() {
    let training = Training::tiny_mlp(60).set("model.dropout=0.2");
    assert_stopped_runs_match_uninterrupted(&training, &[&[1, 50], &[7, 59]]);
}

#[test]
fn stopped_and_resumed_mlp_with_gradient_accumulation_ends_byte_identical() {
    let training = Training::tiny_mlp(60).set("train.grad_accum=3");
    assert_stopped_runs_match_uninterrupted(&training, &[&[1, 50], &[31, 59]]);
}

#[test]
fn stopped_and_resumed_gpt_ends_byte_identical() {
    let training = Training::tiny_gpt(20).set("checkpoint.every_steps=8");
    assert_stopped_runs_match_uninterrupted(&training, &[&[1, 8], &[9, 19]]);
}

#[test]
fn stopped_and_resumed_gpt_with_dropout_and_evaluation_ends_byte_identical() {
    let training =
        Training::tiny_gpt(20).set("checkpoint.every_steps=8").set("model.dropout=0.1").set("train.eval_every=5");
    assert_stopped_runs_match_uninterrupted(&training, &[&[5, 16]]);
    let tmp = tempfile::tempdir().unwrap();
    training.run_to_end(tmp.path());
    let (_, evals) = metrics(tmp.path());
    assert_eq!(evals.keys().copied().collect::<Vec<_>>(), [5, 10, 15, 20], "val_loss every 5 steps");
}

#[test]
fn killed_mlp_resumes_byte_identical() {
    let training = Training::tiny_mlp(2000).set("checkpoint.every_steps=200");
    assert_killed_run_matches_uninterrupted(&training, 200, 30);
}

#[test]
fn killed_mlp_with_gradient_accumulation_resumes_byte_identical() {
    let training = Training::tiny_mlp(800).set("checkpoint.every_steps=100").set("train.grad_accum=3");
    assert_killed_run_matches_uninterrupted(&training, 100, 15);
}

#[test]
fn killed_gpt_resumes_byte_identical() {
    let training = Training::tiny_gpt(80).set("checkpoint.every_steps=20");
    assert_killed_run_matches_uninterrupted(&training, 20, 4);
}

#[test]
fn tiny_run_loss_falls_by_more_than_half() {
    let tmp = tempfile::tempdir().unwrap();
    let training = Training::tiny_mlp(200);
    training.run_to_end(tmp.path());
    let losses = losses(tmp.path(), 200);
    let mean = |xs: &[f64]| xs.iter().sum::<f64>() / xs.len() as f64;
    let (first, last) = (mean(&losses[..10]), mean(&losses[losses.len() - 10..]));
    assert!(last < 0.5 * first, "mean loss of the last 10 steps {last} is not below half of the first 10's {first}");
}

#[test]
fn resume_with_changed_learning_rate_is_refused_unless_allowed() {
    let tmp = tempfile::tempdir().unwrap();
    let (reference, dir) = (tmp.path().join("reference"), tmp.path().join("changed"));
    let training = Training::tiny_mlp(60);
    training.run_to_end(&reference);
    training.stop_at(&dir, 20);
    let config_before = fs::read(dir.join("config.toml")).unwrap();

    let changed = training.clone().set("optimizer.lr=0.1");
    let stderr = changed.expect_exit(&dir, &[], EXIT_CONFIG);
    assert!(stderr.contains("optimizer.lr"), "the refusal names the changed key:\n{stderr}");
    assert!(stderr.contains("--allow-config-change"), "the refusal says how to override:\n{stderr}");
    assert_eq!(fs::read(dir.join("config.toml")).unwrap(), config_before, "a refused resume changes nothing");
    assert_eq!(checkpoint_steps(&dir), [20], "a refused resume trains nothing");

    changed.expect_exit(&dir, &["--allow-config-change"], EXIT_DONE);
    assert!(dir.join("config.toml.prev").is_file(), "the old config is kept as config.toml.prev");
    let (steps, ref_steps) = (metrics(&dir).0, metrics(&reference).0);
    assert_eq!(steps.len(), 60);
    assert!((1..=20).all(|s| steps[&s] == ref_steps[&s]), "steps before the change are the reference's");
    assert!(steps[&21].lr.as_f64().unwrap() > 10.0 * ref_steps[&21].lr.as_f64().unwrap(), "the new lr is used");
    let events = events_named(&dir, "resume");
    assert_eq!(events.last().unwrap()["step"], 20);
}

/// Issue 33: each checkpoint's state.json records the hash of the training
/// settings; a resume compares it with the config's even when config.toml,
/// the run directory's own guard, is gone.
#[test]
fn issue_33_checkpoint_settings_refuse_a_changed_resume_without_config_toml() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let training = Training::tiny_mlp(40);
    training.stop_at(&dir, 10);
    let state: serde_json::Value =
        serde_json::from_slice(&fs::read(step_dir(&dir, 10).join("state.json")).unwrap()).unwrap();
    let hash = state["settings_sha256"].as_str().expect("state.json records settings_sha256").to_string();
    assert!(hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit()), "{hash}");
    assert_eq!(state["settings"]["optimizer.lr"], 3e-3, "{state}");

    // The same settings resume without config.toml.
    fs::remove_file(dir.join("config.toml")).unwrap();
    training.stop_at(&dir, 20);

    fs::remove_file(dir.join("config.toml")).unwrap();
    let changed = training.clone().set("optimizer.lr=0.1").set("train.grad_clip=0.5");
    let stderr = changed.expect_exit(&dir, &[], EXIT_CONFIG);
    for expected in ["step-0000000020", "settings_sha256", "optimizer.lr: 0.003 -> 0.1", "train.grad_clip: 1.0 -> 0.5"]
    {
        assert!(stderr.contains(expected), "the refusal names {expected:?}:\n{stderr}");
    }
    assert!(stderr.contains("--allow-config-change"), "the refusal says how to override:\n{stderr}");
    assert!(!dir.join("config.toml").exists(), "a refused resume writes nothing");
    assert_eq!(events_named(&dir, "start").len(), 2, "a refused resume records nothing");

    changed.expect_exit(&dir, &["--allow-config-change"], EXIT_DONE);
    assert_eq!(events_named(&dir, "resume").last().unwrap()["step"], 20);
    let (steps, _) = metrics(&dir);
    assert!(steps[&21].lr.as_f64().unwrap() > 10.0 * steps[&20].lr.as_f64().unwrap(), "the new lr is used");
    let last: serde_json::Value =
        serde_json::from_slice(&fs::read(step_dir(&dir, 40).join("state.json")).unwrap()).unwrap();
    assert_ne!(last["settings_sha256"], hash, "checkpoints after the change record the new settings");
    assert_eq!(last["settings"]["optimizer.lr"], 0.1);
}

/// Issue 33: `max_steps` shapes training only as the default decay length,
/// so with `[optimizer] decay_steps` set a finished run may be extended
/// (every step it shares with a run that long from the start is the same);
/// without it the extension is refused, naming the decay length.
#[test]
fn issue_33_max_steps_may_grow_when_decay_steps_pins_the_schedule() {
    let tmp = tempfile::tempdir().unwrap();
    let (reference, extended, unpinned) = (tmp.path().join("ref"), tmp.path().join("ext"), tmp.path().join("unpinned"));
    let pinned = |max_steps| Training::tiny_mlp(max_steps).set("optimizer.decay_steps=30");
    pinned(50).run_to_end(&reference);
    pinned(30).run_to_end(&extended);
    pinned(50).run_to_end(&extended);
    assert_eq!(events_named(&extended, "resume").last().unwrap()["step"], 30);
    assert_same_checkpoint(&extended, &reference, 50);
    assert_same_metrics(&extended, &reference, 50);
    assert!(!extended.join("config.toml.prev").exists(), "no training setting changed");

    Training::tiny_mlp(30).run_to_end(&unpinned);
    let stderr = Training::tiny_mlp(50).expect_exit(&unpinned, &[], EXIT_CONFIG);
    assert!(stderr.contains("optimizer.decay_steps: 30 -> 50 (run.max_steps)"), "{stderr}");
}

#[test]
fn resume_falls_back_past_a_corrupted_newest_checkpoint_and_ends_identical() {
    let tmp = tempfile::tempdir().unwrap();
    let (reference, dir) = (tmp.path().join("reference"), tmp.path().join("corrupted"));
    let training = Training::tiny_mlp(60);
    training.run_to_end(&reference);
    training.stop_at(&dir, 30);
    training.stop_at(&dir, 55);
    let older: Vec<u64> = checkpoint_steps(&dir).into_iter().filter(|&s| s < 55).collect();
    let fallback = *older.last().expect("a checkpoint older than step 55");
    flip_byte(&step_dir(&dir, 55).join("model.safetensors"));

    training.run_to_end(&dir);
    let rejected = events_named(&dir, "checkpoint_rejected");
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    assert_eq!(rejected[0]["step"], 55);
    assert!(rejected[0]["failures"].to_string().contains("model.safetensors"), "names the damaged file: {rejected:?}");
    assert_eq!(events_named(&dir, "resume").last().unwrap()["step"], fallback);
    assert_same_checkpoint(&dir, &reference, 60);
    assert_same_metrics(&dir, &reference, 60);
}

/// Issue 15: a damaged checkpoint that keeps its size (one flipped byte)
/// passes the size-only check rotation used. With `keep = 1`, a resumed run
/// that rightly fell back past it then deleted every checkpoint it committed
/// (the periodic ones and the stop checkpoint) right after the commit, exited
/// 75 claiming a durable checkpoint that was gone, and the next attempt
/// started over. Now the damaged one is quarantined at resume, reported, and
/// the checkpoints committed afterwards stay.
#[test]
fn issue_15_a_resume_past_a_damaged_checkpoint_keeps_what_it_commits_and_quarantines_the_damaged_one() {
    let tmp = tempfile::tempdir().unwrap();
    let (reference, dir) = (tmp.path().join("reference"), tmp.path().join("damaged"));
    let training = Training::tiny_mlp(60).set("checkpoint.keep=1").set("checkpoint.every_steps=10");
    training.run_to_end(&reference);
    training.stop_at(&dir, 40);
    assert_eq!(checkpoint_steps(&dir), [40], "keep = 1 leaves only the stop checkpoint");
    let damaged_model = step_dir(&dir, 40).join("model.safetensors");
    let size = fs::metadata(&damaged_model).unwrap().len();
    flip_byte(&damaged_model);
    assert_eq!(fs::metadata(&damaged_model).unwrap().len(), size, "the damage keeps the file's size");
    let damaged_bytes = fs::read(&damaged_model).unwrap();

    // Resume (nothing verifies: a fresh start), checkpoint at 10 and 20, stop at 25.
    training.expect_exit(&dir, &["--stop-at-step", "25"], EXIT_STOPPED);
    assert_eq!(checkpoint_steps(&dir), [25], "the stop checkpoint of an exit 75 must exist");
    let (code, verified) = rekindle_out(&["verify", &step_dir(&dir, 25).to_string_lossy()]);
    assert_eq!(code, 0, "the stop checkpoint verifies:\n{verified}");
    for saved in events_named(&dir, "checkpoint_saved") {
        let own = saved["dir"].clone();
        let rotated = saved["rotated_out"].as_array().cloned().unwrap_or_default();
        assert!(!rotated.contains(&own), "a save rotated out its own checkpoint: {saved}");
    }

    // The damaged one is quarantined, intact as found, and reported.
    let quarantine = dir.join("checkpoints").join("quarantine");
    let held: Vec<_> = fs::read_dir(&quarantine).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(held.len(), 1, "{held:?}");
    let moved_to = &held[0];
    assert!(moved_to.file_name().unwrap().to_string_lossy().starts_with("step-0000000040-"), "{moved_to:?}");
    assert!(fs::read(moved_to.join("model.safetensors")).unwrap() == damaged_bytes, "kept as found");
    let rejected = events_named(&dir, "checkpoint_rejected");
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    assert_eq!(rejected[0]["step"], 40);
    let quarantined = events_named(&dir, "checkpoint_quarantined");
    assert_eq!(quarantined.len(), 1, "{quarantined:?}");
    let q = &quarantined[0];
    assert_eq!((q["step"].as_u64(), q["dir"].as_str()), (Some(40), step_dir(&dir, 40).to_str()));
    assert_eq!(q["moved_to"].as_str(), moved_to.to_str());
    assert_eq!(q["error"], serde_json::Value::Null);
    let reason = q["reason"].as_str().unwrap();
    assert!(reason.contains("model.safetensors") && reason.contains("sha256 mismatch"), "{reason}");
    assert_eq!(events_named(&dir, "fresh_start").len(), 1, "nothing else verified: a fresh start");

    // `rekindle checkpoints` lists it apart; `rekindle verify` reports it and passes.
    let (code, listing) = rekindle_out(&["checkpoints", &dir.to_string_lossy()]);
    assert_eq!(code, 0, "{listing}");
    assert!(listing.contains("valid (resume point)"), "{listing}");
    assert!(listing.contains("1 quarantined checkpoint(s)"), "{listing}");
    assert!(listing.contains(&moved_to.display().to_string()) && listing.contains("sha256 mismatch"), "{listing}");
    let (code, json) = rekindle_out(&["checkpoints", &dir.to_string_lossy(), "--json"]);
    assert_eq!(code, 0, "{json}");
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(json["resume_step"], 25);
    assert_eq!(json["checkpoints"].as_array().map(Vec::len), Some(1), "{json}");
    assert_eq!(
        (json["quarantined"][0]["step"].as_u64(), json["quarantined"][0]["valid"].as_bool()),
        (Some(40), Some(false))
    );
    let (code, status) = rekindle_out(&["status", &dir.to_string_lossy()]);
    assert_eq!(code, 0, "{status}");
    assert!(status.contains("1 quarantined"), "rekindle status counts it:\n{status}");
    let (code, verified) = rekindle_out(&["verify", &dir.to_string_lossy()]);
    assert_eq!(code, 0, "quarantined checkpoints do not fail verify:\n{verified}");
    assert!(verified.contains("quarantined") && verified.contains(&moved_to.display().to_string()), "{verified}");

    // The next attempt resumes from the stop checkpoint and ends as if never stopped.
    training.run_to_end(&dir);
    assert_eq!(events_named(&dir, "resume").last().unwrap()["step"], 25);
    assert_eq!(events_named(&dir, "checkpoint_quarantined").len(), 1, "nothing more to quarantine");
    assert_eq!(checkpoint_steps(&dir), [60]);
    assert!(moved_to.is_dir(), "rotation never deletes a quarantined checkpoint");
    assert_same_checkpoint(&dir, &reference, 60);
    assert_same_metrics(&dir, &reference, 60);
    assert!(events(&dir).iter().all(|e| e["event"] != "error"), "no attempt failed");
}

/// Issue 15, when the damaged checkpoint cannot be moved aside (here a file
/// stands where `quarantine/` should go): the event says so and why, and the
/// checkpoints committed afterwards still stay, because rotation verifies a
/// checkpoint newer than the one it runs for before counting it.
#[test]
fn issue_15_a_damaged_checkpoint_that_cannot_be_quarantined_never_costs_the_stop_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("damaged");
    let training = Training::tiny_mlp(40).set("checkpoint.keep=1").set("checkpoint.every_steps=10");
    training.stop_at(&dir, 30);
    flip_byte(&step_dir(&dir, 30).join("optimizer.safetensors"));
    fs::write(dir.join("checkpoints").join("quarantine"), b"in the way").unwrap();

    training.expect_exit(&dir, &["--stop-at-step", "15"], EXIT_STOPPED);
    assert_eq!(checkpoint_steps(&dir), [15], "the stop checkpoint stays; the damaged 30 is rotated out");
    let (code, verified) = rekindle_out(&["verify", &dir.to_string_lossy()]);
    assert_eq!(code, 0, "{verified}");
    let q = events_named(&dir, "checkpoint_quarantined");
    assert_eq!(q.len(), 1, "{q:?}");
    assert_eq!((q[0]["step"].as_u64(), &q[0]["moved_to"]), (Some(30), &serde_json::Value::Null));
    let error = q[0]["error"].as_str().expect("the event says why the move failed");
    assert!(error.contains("cannot move the damaged checkpoint") && error.contains("step-0000000030"), "{error}");
    assert!(q[0]["reason"].as_str().unwrap().contains("optimizer.safetensors"), "{}", q[0]);
    training.expect_exit(&dir, &[], EXIT_DONE);
    assert_eq!(events_named(&dir, "resume").last().unwrap()["step"], 15);
}

/// `rekindle ARGS…`: (exit code, stdout and stderr).
fn rekindle_out(args: &[&str]) -> (i32, String) {
    let (code, stdout, stderr) = outcome(&rekindle().args(args).output().expect("run rekindle"));
    (code, format!("{stdout}{stderr}"))
}

/// Losses that are lowest early: a huge weight decay pulls every weight to
/// zero after a few steps, so the loss settles near ln(4) above its early
/// minimum. A SIGKILL leaves no `summary.json`, so the resumed attempt must
/// take the best loss so far from the checkpoint.
#[test]
fn best_loss_survives_a_sigkill_before_any_summary() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("killed");
    let training = Training::tiny_mlp(600).set("checkpoint.every_steps=100").set("optimizer.weight_decay=100.0");
    let killed = kill_after_periodic_checkpoint(&training, &dir, 100, 10);
    assert!(!dir.join("summary.json").exists(), "a killed first attempt writes no summary");
    training.run_to_end(&dir);

    let losses = losses(&dir, 600);
    let best = losses.iter().copied().fold(f64::INFINITY, f64::min);
    let best_step = losses.iter().position(|&l| l == best).unwrap() as u64 + 1;
    assert!(best_step <= killed.checkpoint_step, "the test needs the best loss before the kill ({best_step})");
    let summary = summary(&dir);
    assert_eq!(summary["best_loss"].as_f64(), Some(best), "best_loss of summary.json: {summary}");
    assert_eq!(summary["final_loss"].as_f64(), losses.last().copied(), "final_loss of summary.json");
}
