//! Reads run directories written by release 0.1.0 (`testdata/run-0.1.0`
//! outside SLURM, `testdata/run-0.1.0-slurm` stopped by SIGTERM under a
//! stand-in SLURM and requeued) with the current record types, and checks that the current writers would
//! write every record back field for field (names, nesting, null vs absent):
//! the files' format is a contract with `slurm/drill_check.py`, the tests and
//! users' scripts.

use std::path::PathBuf;

use serde_json::Value;

use super::event::EventLine;
use super::{Event, EventContext, GpuSample, MetricsLine, Summary, SummaryState, attempts, events_from, parse_jsonl};

const PLAIN: &str = "run-0.1.0";
const SLURM: &str = "run-0.1.0-slurm";

fn fixture_in(dir: &str, file: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata").join(dir).join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn fixture(file: &str) -> String {
    fixture_in(PLAIN, file)
}

fn lines_in(dir: &str, file: &str) -> Vec<Value> {
    let j = parse_jsonl(&fixture_in(dir, file));
    assert_eq!(j.skipped, 0, "{dir}/{file}");
    assert!(!j.records.is_empty(), "{dir}/{file}");
    j.records
}

fn lines(file: &str) -> Vec<Value> {
    lines_in(PLAIN, file)
}

#[test]
fn every_event_of_the_release_reads_typed_and_writes_back_the_same() {
    for dir in [PLAIN, SLURM] {
        events_write_back_the_same(dir);
    }
}

fn events_write_back_the_same(dir: &str) {
    let records = lines_in(dir, "events.jsonl");
    for (raw, read) in records.iter().zip(events_from(records.clone())) {
        assert!(!matches!(read.event, Event::Other(_)), "not typed: {raw}");
        let context = EventContext {
            node: read.node.clone().unwrap(),
            job_id: read.job_id.clone(),
            attempt: read.slurm_attempt.unwrap() as u32,
        };
        let time = raw["time"].as_str().unwrap().to_string();
        let written = serde_json::to_value(EventLine { time, context: &context, event: &read.event }).unwrap();
        assert_eq!(&written, raw);
    }
    let names: Vec<String> = events_from(records).into_iter().map(|e| e.name).collect();
    for name in ["start", "checkpoint_saved", "signal", "monitor", "requeue", "stop", "resume", "finish"] {
        assert!(names.iter().any(|n| n == name), "{dir} has no {name}");
    }
}

#[test]
fn a_sigterm_under_slurm_reads_with_its_deadline_requeue_and_next_node() {
    let events = events_from(lines_in(SLURM, "events.jsonl"));
    let signal = events.iter().find_map(|e| match &e.event {
        Event::Signal(s) => Some(s),
        _ => None,
    });
    let signal = signal.unwrap();
    assert_eq!(signal.signal, "SIGTERM");
    assert!(signal.arrival.is_some() && matches!(signal.deadline_in_seconds, Some(Some(s)) if s > 0.0));
    let stop = events.iter().find_map(|e| match &e.event {
        Event::Stop(s) => Some(s),
        _ => None,
    });
    let requeue = stop.unwrap().requeue.as_ref().unwrap();
    assert_eq!(requeue.answer, Some(super::RequeueAnswer::Requeued));
    assert!(matches!(&requeue.decision, super::RequeueDecision::Requeue { job_id, .. } if job_id == "42"));
    let a = attempts(&events);
    assert_eq!(a.len(), 2);
    assert_eq!((a[0].node.as_deref(), a[0].job_id.as_deref(), a[0].slurm_attempt), (Some("n1"), Some("42"), Some(0)));
    assert_eq!((a[1].node.as_deref(), a[1].slurm_attempt), (Some("n2"), Some(1)));
    assert!(a[0].because().starts_with("it received SIGTERM at step 59; checkpoint durable"), "{}", a[0].because());
}

#[test]
fn the_release_fixture_tells_two_attempts() {
    let a = attempts(&events_from(lines("events.jsonl")));
    assert_eq!(a.len(), 2);
    assert_eq!(
        a[0].because(),
        "--stop-at-step was reached at step 7; checkpoint durable 0.02s after the signal; requeue skip: not running \
         under SLURM (no SLURM_JOB_ID): run the same command again to continue"
    );
    assert_eq!((a[1].start_step, a[1].end_step), (7, Some(12)));
    assert_eq!(a[0].steps_lost, Some(0));
}

#[test]
fn every_metrics_line_of_the_release_reads_typed_and_writes_back_the_same() {
    let (mut steps, mut vals) = (0, 0);
    for raw in lines("metrics.jsonl").into_iter().chain(lines_in(SLURM, "metrics.jsonl")) {
        let line = MetricsLine::from_value(&raw).unwrap_or_else(|| panic!("not typed: {raw}"));
        match &line {
            MetricsLine::Step(_) => steps += 1,
            MetricsLine::Val(_) => vals += 1,
        }
        assert_eq!(serde_json::to_value(&line).unwrap(), raw);
    }
    assert_eq!((steps, vals), (3 + 8, 2 + 4));
}

#[test]
fn every_gpu_sample_of_the_release_reads_typed_and_writes_back_the_same() {
    // Compared as text, byte for byte: `cpu_pct` is an f32 written with f64
    // digits, which serde_json's default float parser can read one ulp off
    // as an f64 (so comparing JSON values would fail), but reads exactly
    // enough to round back to the same f32.
    for dir in [PLAIN, SLURM] {
        for line in fixture_in(dir, "gpu_stats.jsonl").lines() {
            let sample: GpuSample = serde_json::from_str(line).unwrap();
            assert_eq!(serde_json::to_value(&sample).unwrap().to_string(), line);
        }
    }
}

#[test]
fn the_release_summary_reads_typed_and_writes_back_byte_for_byte() {
    let text = fixture("summary.json");
    let summary = Summary::parse(text.as_bytes()).unwrap();
    assert_eq!((summary.state, summary.steps, summary.resumes), (SummaryState::Finished, 12, 1));
    assert_eq!(String::from_utf8(summary.to_bytes()).unwrap(), text);
    let text = fixture_in(SLURM, "summary.json");
    assert_eq!(String::from_utf8(Summary::parse(text.as_bytes()).unwrap().to_bytes()).unwrap(), text);
}

#[test]
fn a_torn_last_line_and_unknown_records_are_skipped_or_kept_not_fatal() {
    let mut text = fixture("events.jsonl");
    text.push_str("{\"event\":\"teleport\",\"time\":\"2026-11-23T12:00:27.000Z\",\"to\":\"moon\"}\n{\"event\":\"sto");
    let j = parse_jsonl(&text);
    assert_eq!(j.skipped, 1);
    let events = events_from(j.records);
    let last = events.last().unwrap();
    assert_eq!(last.name, "teleport");
    assert_eq!(last.raw["to"], "moon");
    assert!(matches!(last.event, Event::Other(_)));
}
