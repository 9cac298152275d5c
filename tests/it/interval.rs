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
    // mtbf 40 s: before a save is measured, a quarter of it (10 s); then
    // about a second idle (√(2 × cost × 40 s), a cost of tens of ms), and
    // under 5 s on a 2-vCPU machine beside a CPU hog (a cost of 0.12 s gave
    // 2.5 s): a change the records show (NOTICEABLE_CHANGE is 20 %).
    const MTBF: f64 = 40.0;
    const UNMEASURED: f64 = MTBF / 4.0;
    let training = Training::tiny_mlp(100_000_000)
        .set("checkpoint.every_steps=0")
        .set("checkpoint.interval=\"auto\"")
        .set(&format!("checkpoint.mtbf=\"{MTBF}s\""));
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
    assert_eq!((first["mtbf_source"].as_str(), first["mtbf_seconds"].as_f64()), (Some("config"), Some(MTBF)));
    assert_eq!(first["interval_seconds"].as_f64(), Some(UNMEASURED), "a quarter of the mtbf before any save");
    assert_eq!(first["saves_measured"], 0);
    assert!(first["cost_seconds"].is_null() && first["remaining_seconds"].is_null(), "{first}");
    let measured = &chosen[1];
    assert_eq!(measured["reason"], "young_daly", "{measured}");
    assert_eq!(measured["cost_measured_as"], "snapshot_stall_and_slowdown");
    assert!(measured["slowdown_seconds"].as_f64().is_some_and(|s| s >= 0.0), "{measured}");
    assert_eq!(measured["saves_measured"], 1);
    assert_eq!(measured["previous_seconds"].as_f64(), Some(UNMEASURED));
    // What a save costs depends on the machine (a loaded one stalls and
    // slows more): no bound on it, but the recorded choice must follow from
    // the recorded inputs (it asserted `cost < 1`, an interval under 5 s and
    // that a lower bound set it: speed tests that passed only within a band
    // of machine speeds, issue #34).
    let cost = measured["cost_seconds"].as_f64().unwrap();
    assert!(cost.is_finite() && cost >= 0.0, "{measured}");
    let young_daly = measured["young_daly_seconds"].as_f64().unwrap();
    assert!((young_daly - (2.0 * cost * MTBF).sqrt()).abs() < 1e-9, "{measured}");
    assert_follows_from_its_inputs(measured);

    // The first save came after the unmeasured 10 s; each later one fell due
    // when the interval in force had passed since the one before, and was
    // taken at the first step after that.
    let start = time_of(&events_named(&run, "start")[0]);
    let first_after = (time_of(&periodic_saves(&run)[0]) - start).as_seconds_f64();
    assert!(first_after >= UNMEASURED - 0.1, "the first periodic checkpoint came {first_after} s after the start");
    let checked = assert_saves_follow_the_interval(&run);
    assert!(checked >= 2, "{checked} saves at a measured interval");
}

/// Asserts that a `young_daly` choice is what its recorded inputs give:
/// √(2 × cost × mtbf), raised to the largest lower bound above it (the 1 s
/// floor, the cost over the 5 % stall fraction, the write time), and names
/// that bound.
fn assert_follows_from_its_inputs(chosen: &Value) {
    let number = |key: &str| chosen[key].as_f64().unwrap_or_else(|| panic!("no {key}: {chosen}"));
    let (cost, persist) = (number("cost_seconds"), number("persist_seconds"));
    let mut expected = (number("young_daly_seconds"), None);
    for (at_least, bound) in [(1.0, "floor"), (cost / 0.05, "stall_fraction"), (persist, "persist_time")] {
        if expected.0 < at_least {
            expected = (at_least, Some(bound));
        }
    }
    let interval = number("interval_seconds");
    assert!((interval - expected.0).abs() < 1e-6, "expected an interval of {} s: {chosen}", expected.0);
    assert_eq!(chosen["bound"].as_str(), expected.1, "{chosen}");
}

/// Asserts that every periodic save after the first measured choice fell due
/// only once the interval in force had passed since the previous save, and
/// was due no later than that: the step before it (as `metrics.jsonl`
/// times it) was still inside the interval. Returns how many it checked.
///
/// Judged by the run's own records, not by the wall clock between saves: on
/// a loaded machine a save may land late (a slow step, a write still in
/// flight, which `due_step` accounts for), which says nothing about the
/// interval followed (it asserted gaps of 0.5–4 s before: issue #34).
fn assert_saves_follow_the_interval(run: &std::path::Path) -> usize {
    // The interval in force may drift from the last one recorded by up to
    // this fraction before a new `checkpoint_interval` is written
    // (NOTICEABLE_CHANGE in src/checkpoint/interval.rs).
    const UNRECORDED_DRIFT: f64 = 0.2;
    // Event and metrics times are truncated to the millisecond.
    const TICK: f64 = 0.002;
    let step_times: std::collections::BTreeMap<u64, DateTime<Utc>> = support::runs::jsonl(&run.join("metrics.jsonl"))
        .iter()
        .filter(|m| m.get("loss").is_some())
        .map(|m| (m["step"].as_u64().unwrap(), time_of(m)))
        .collect();
    let step_time = |step: u64| *step_times.get(&step).unwrap_or_else(|| panic!("step {step} is not in metrics.jsonl"));
    // Whether an interval from a measured save was chosen yet; the previous
    // periodic save (its step and the time of its `checkpoint_started`).
    let (mut measured, mut previous, mut checked) = (false, None::<(u64, DateTime<Utc>)>, 0);
    // The intervals recorded since the previous save: the one in force at
    // any moment is within UNRECORDED_DRIFT of one of them.
    let mut in_force: Vec<f64> = Vec::new();
    for event in events(run) {
        if event["event"] == "checkpoint_interval" {
            let seconds = event["interval_seconds"].as_f64().unwrap();
            in_force.push(seconds);
            measured |= event["reason"] == "young_daly";
        }
        if event["event"] != "checkpoint_started" || event["kind"] != "periodic" {
            continue;
        }
        let (step, due) = (event["step"].as_u64().unwrap(), event["due_step"].as_u64().unwrap());
        if let (true, Some((prev_step, prev_started))) = (measured, previous) {
            let shortest = in_force.iter().copied().fold(f64::INFINITY, f64::min) * (1.0 - UNRECORDED_DRIFT);
            let longest = in_force.iter().copied().fold(0.0, f64::max) * (1.0 + UNRECORDED_DRIFT);
            // The interval clock restarts as the previous save's snapshot
            // begins: after its step was logged, before its event.
            let since_prev = |t: DateTime<Utc>| (t - step_time(prev_step)).as_seconds_f64();
            // Due: the step after `due` was logged after the check at `due`.
            if let Some(&after_due) = step_times.get(&(due + 1)) {
                assert!(
                    since_prev(after_due) + TICK >= shortest,
                    "the save of step {step} fell due {} s after the one of step {prev_step}, before the interval ({shortest} s at the least): {event}",
                    since_prev(after_due)
                );
            }
            // Not due a step earlier: the check after step due − 1 came
            // after its metrics line, and found the interval not yet over.
            if due > prev_step + 1 {
                let before_due = (step_time(due - 1) - prev_started).as_seconds_f64();
                assert!(
                    before_due <= longest + TICK,
                    "the save of step {step} was not taken when step {} ended, {before_due} s after the previous save started, past the interval ({longest} s at the most): {event}",
                    due - 1
                );
            }
            checked += 1;
        }
        previous = Some((step, time_of(&event)));
        in_force = in_force.last().copied().into_iter().collect();
    }
    checked
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
    // The job ends in 4 min: the unmeasured interval (a quarter of the
    // hour, at most 5 min) does not fit.
    let end = Utc::now().timestamp() + 240;
    let spawned = Utc::now();
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
    // The time left when the interval was chosen, after the spawn and before
    // the event was written, in whole seconds from the start of the current
    // one (SLURM gives the end in seconds; event times are truncated to the
    // millisecond). It was a bound of 20 s for the
    // start-up, which a loaded machine could exceed: issue #34.
    let remaining = first["remaining_seconds"].as_f64().unwrap();
    let end = DateTime::from_timestamp(end, 0).unwrap();
    let (least, most) = ((end - time_of(first)).as_seconds_f64() - 0.001, (end - spawned).as_seconds_f64() + 1.0);
    assert!((least..=most).contains(&remaining), "{remaining} s left, not within {least}..={most}: {first}");
    assert_eq!(first["interval_seconds"].as_f64(), Some(remaining), "no save measured: all the time left");
}
