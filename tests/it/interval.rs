//! `[checkpoint] interval = "auto"` through the real binary: the
//! `checkpoint_interval` event names its inputs, periodic checkpoints follow
//! the chosen interval, and without `[checkpoint] mtbf` the interruption rate
//! comes from the run's earlier attempts (a SIGKILLed one counts, a
//! `--stop-at-step` does not), and the SLURM job's end time bounds it.

use crate::support;

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

use support::runs::{EXIT_STOPPED, Training, events, events_named, kill_after_periodic_checkpoint};

fn time_of(event: &Value) -> DateTime<Utc> {
    event["time"].as_str().and_then(|t| t.parse().ok()).unwrap_or_else(|| panic!("no time in {event}"))
}

fn periodic_saves(run_dir: &std::path::Path) -> Vec<Value> {
    events_named(run_dir, "checkpoint_saved").into_iter().filter(|e| e["kind"] == "periodic").collect()
}

#[test]
fn auto_interval_with_a_configured_mtbf_is_recorded_and_followed() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    std::fs::create_dir_all(&run).unwrap();
    // No step-based saves: every periodic checkpoint is the interval's.
    // mtbf 20 s: before a save is measured, a quarter of it (5 s); then
    // √(2 × ~1 ms × 20 s) ≈ 0.2 s, raised to the 1 s floor.
    let training = Training::tiny_mlp(100_000_000)
        .set("checkpoint.every_steps=0")
        .set("checkpoint.interval=\"auto\"")
        .set("checkpoint.mtbf=\"20s\"");
    let mut child = training.spawn(&run);
    let started = Instant::now();
    while periodic_saves(&run).len() < 4 {
        if let Some(status) = child.try_wait().unwrap() {
            let stderr = std::fs::read_to_string(run.with_extension("stderr")).unwrap_or_default();
            panic!("the run ended ({status}) before four periodic checkpoints:\n{stderr}");
        }
        assert!(started.elapsed() < Duration::from_secs(120), "no four periodic checkpoints in 120 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(EXIT_STOPPED));

    let chosen = events_named(&run, "checkpoint_interval");
    assert!(chosen.len() >= 2, "{chosen:?}");
    let first = &chosen[0];
    assert_eq!((first["step"].as_u64(), first["reason"].as_str()), (Some(0), Some("unmeasured")));
    assert_eq!((first["mtbf_source"].as_str(), first["mtbf_seconds"].as_f64()), (Some("config"), Some(20.0)));
    assert_eq!(first["interval_seconds"].as_f64(), Some(5.0), "a quarter of the mtbf before any save");
    assert_eq!(first["saves_measured"], 0);
    assert!(first["cost_seconds"].is_null() && first["remaining_seconds"].is_null(), "{first}");
    let measured = &chosen[1];
    assert_eq!(measured["reason"], "young_daly", "{measured}");
    assert_eq!(measured["cost_measured_as"], "snapshot_stall_and_slowdown");
    assert!(measured["slowdown_seconds"].as_f64().is_some_and(|s| s >= 0.0), "{measured}");
    assert_eq!(measured["saves_measured"], 1);
    assert_eq!(measured["previous_seconds"].as_f64(), Some(5.0));
    let cost = measured["cost_seconds"].as_f64().unwrap();
    assert!((0.0..1.0).contains(&cost), "a tiny model's stall and slowdown: {cost}");
    let young_daly = measured["young_daly_seconds"].as_f64().unwrap();
    assert!((young_daly - (2.0 * cost * 20.0).sqrt()).abs() < 1e-9, "{measured}");
    let interval = measured["interval_seconds"].as_f64().unwrap();
    assert!((1.0..5.0).contains(&interval), "{measured}");
    assert!(measured["bound"].is_string(), "√(2 × {cost} × 20) is below every lower bound: {measured}");

    // The first save came after the unmeasured 5 s, the later ones at the
    // measured interval (well under 5 s apart).
    let start = time_of(&events_named(&run, "start")[0]);
    let saves: Vec<DateTime<Utc>> = periodic_saves(&run).iter().map(time_of).collect();
    let first_after = (saves[0] - start).as_seconds_f64();
    assert!(first_after >= 4.9, "the first periodic checkpoint came {first_after} s after the start");
    for pair in saves[1..].windows(2) {
        let gap = (pair[1] - pair[0]).as_seconds_f64();
        assert!((0.5..4.0).contains(&gap), "periodic checkpoints {gap} s apart at an interval of {interval} s");
    }
}

#[test]
fn auto_interval_without_mtbf_estimates_it_from_earlier_interrupted_attempts() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    std::fs::create_dir_all(&run).unwrap();
    let training = Training::tiny_mlp(100_000_000).set("checkpoint.interval=\"auto\"");
    // Attempt 1 stops cleanly (--stop-at-step): no work lost, no interruption.
    training.stop_at(&run, 60);
    let none = events_named(&run, "checkpoint_interval");
    assert_eq!((none[0]["mtbf_source"].as_str(), none[0]["reason"].as_str()), (Some("none"), Some("unmeasured")));
    assert_eq!(none[0]["interval_seconds"].as_f64(), Some(300.0));
    // Attempt 2 is SIGKILLed after a step-based checkpoint: it lost work.
    let killed = kill_after_periodic_checkpoint(&training, &run, 100, 20);
    // Attempt 3 resumes and reads the history before its own start.
    let stop = killed.last_logged_step + 10;
    training.stop_at(&run, stop);

    let all = events(&run);
    let starts: Vec<DateTime<Utc>> = all.iter().filter(|e| e["event"] == "start").map(time_of).collect();
    assert_eq!(starts.len(), 3);
    let before_third: Vec<&Value> = all.iter().filter(|e| time_of(e) < starts[2] && e["event"] != "start").collect();
    let ran = (time_of(before_third.last().unwrap()) - starts[0]).as_seconds_f64();
    let chosen: Vec<&Value> = all.iter().filter(|e| e["event"] == "checkpoint_interval").collect();
    let third = chosen.iter().find(|e| time_of(e) >= starts[2]).expect("attempt 3 chose an interval");
    assert_eq!(third["mtbf_source"], "history", "{third}");
    assert_eq!(third["interruptions"], 1, "only the SIGKILLed attempt lost work: {third}");
    let history = third["history_seconds"].as_f64().unwrap();
    // Attempts 1 and 2 ran from their starts to their last events; the gap
    // between them (the stop, the next start) is not counted.
    assert!(history > 0.0 && history <= ran + 0.01, "history {history} s, attempts 1–2 span {ran} s: {third}");
    assert_eq!(third["mtbf_seconds"].as_f64(), Some(history), "one interruption: the mtbf is the time run");
    assert_eq!(third["reason"], "unmeasured");
    // A quarter of the mtbf (at most 5 min), never under the 1 s floor.
    let expected = (history / 4.0).clamp(1.0, 300.0);
    assert!((third["interval_seconds"].as_f64().unwrap() - expected).abs() < 1e-6, "{third}");
}

#[test]
fn auto_interval_leaves_room_for_a_save_before_the_job_ends() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let training = Training::tiny_mlp(200).set("checkpoint.interval=\"auto\"").set("checkpoint.mtbf=\"1h\"");
    // The job ends in 40 s: a quarter of the hour (15 min) does not fit.
    let end = Utc::now().timestamp() + 40;
    let out = training
        .command(&run, &["--stop-at-step", "30"])
        .env("SLURM_JOB_END_TIME", end.to_string())
        .output()
        .expect("start rekindle");
    assert_eq!(out.status.code(), Some(EXIT_STOPPED), "{}", String::from_utf8_lossy(&out.stderr));
    let chosen = events_named(&run, "checkpoint_interval");
    assert_eq!(chosen.len(), 1, "the stop checkpoint measures nothing: {chosen:?}");
    let first = &chosen[0];
    assert_eq!((first["reason"].as_str(), first["bound"].as_str()), (Some("unmeasured"), Some("remaining_time")));
    let remaining = first["remaining_seconds"].as_f64().unwrap();
    assert!(remaining > 20.0 && remaining <= 40.0, "{first}");
    assert_eq!(first["interval_seconds"].as_f64(), Some(remaining), "no save measured: all the time left");
}
