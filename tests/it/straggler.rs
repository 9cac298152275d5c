//! Stragglers (issue #29), with real processes: one rank of a two-rank
//! world made slow in its own work every step (the `train::compute`
//! failpoint sleeps there, on that rank alone) is reported once, naming its
//! rank and its node, and `rekindle status` and the report say so; a
//! process alone whose steps become slower than its first ones is reported
//! the same way, once.

use std::path::Path;
use std::process::Output;

use serde_json::Value;

use crate::distributed::mpirun_per_rank;
use crate::support::requires;
use crate::support::runs::{EXIT_DONE, Training, events_named, rekindle};

/// Every step line of `metrics.jsonl`.
fn step_lines(run_dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(run_dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v.get("loss").is_some())
        .collect()
}

/// `rekindle status DIR` (its text) and `rekindle report DIR` (the page).
fn status_and_report(run_dir: &Path) -> (String, String) {
    let status = rekindle().arg("status").arg(run_dir).output().unwrap();
    assert!(status.status.success(), "{}", String::from_utf8_lossy(&status.stderr));
    let report = rekindle().arg("report").arg(run_dir).output().unwrap();
    assert!(report.status.success(), "{}", String::from_utf8_lossy(&report.stderr));
    (
        String::from_utf8_lossy(&status.stdout).into_owned(),
        std::fs::read_to_string(run_dir.join("report.html")).unwrap(),
    )
}

/// The run ended normally with exactly one `straggler` event, at least
/// 50 ms a step and past the factor of its median: that event.
fn the_one_straggler(out: &Output, run_dir: &Path) -> Value {
    assert_eq!(out.status.code(), Some(EXIT_DONE), "{}", String::from_utf8_lossy(&out.stderr));
    let mut found = events_named(run_dir, "straggler");
    assert_eq!(found.len(), 1, "exactly one straggler event: {found:#?}");
    let s = found.remove(0);
    let (mine, median) = (s["step_seconds"].as_f64().unwrap(), s["median_seconds"].as_f64().unwrap());
    assert!(mine >= 0.05 && mine > 1.5 * median, "{s}");
    s
}

#[test]
fn a_rank_slow_in_every_step_is_reported_once_with_its_rank_and_node() {
    let Some(()) = requires::mpi() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let run_dir = tmp.path().join("run");
    let training = Training::tiny_mlp(60)
        .set("train.log_every=1")
        .set("health.straggler_steps=10")
        .set("health.straggler_blame=true");
    // Each rank on a node of its own name; rank 1's own work 50 ms longer
    // in every step (a tiny mlp step takes a few ms).
    let out = mpirun_per_rank(2, training.command(&run_dir, &[]), |rank| {
        let mut env = vec![format!("SLURMD_NODENAME=node{rank}")];
        if rank == 1 {
            env.push("FAILPOINTS=train::compute=sleep(50)".into());
        }
        env
    })
    .output()
    .unwrap();
    let s = &the_one_straggler(&out, &run_dir);
    assert_eq!((s["rank"].as_u64(), s["rank_node"].as_str()), (Some(1), Some("node1")), "{s}");
    assert_eq!(
        (s["node"].as_str(), s["world_size"].as_u64(), s["blamed"].as_bool()),
        (Some("node0"), Some(2), Some(true))
    );
    assert_eq!((s["factor"].as_f64(), s["steps"].as_u64()), (Some(1.5), Some(10)));
    // Ten slow steps in a row: at step 10 unless rank 0 itself was held up
    // that long by the machine in one of them.
    let step = s["step"].as_u64().unwrap();
    assert!((10..=60).contains(&step), "{s}");

    // Every step line carries both ranks' own seconds; rank 1's hold the sleep.
    let lines = step_lines(&run_dir);
    assert_eq!(lines.len(), 60);
    for line in &lines {
        let ranks = line["rank_compute_s"].as_array().unwrap_or_else(|| panic!("no rank_compute_s: {line}"));
        assert_eq!(ranks.len(), 2, "{line}");
        assert!(ranks[1].as_f64().unwrap() >= 0.05, "{line}");
        let summary = &line["rank_compute"];
        assert_eq!((summary["ranks"].as_u64(), summary["slowest_rank"].as_u64()), (Some(2), Some(1)), "{line}");
        assert_eq!(summary["max_s"], ranks[1], "{line}");
    }

    let (status, report) = status_and_report(&run_dir);
    assert!(status.contains(&format!("straggler rank 1 on node1 from step {step}: ")), "{status}");
    assert!(status.contains("; its node is blamed"), "{status}");
    let table = rekindle().args(["status", "--table"]).arg(&run_dir).output().unwrap();
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("node0 (straggler: rank 1 on node1)"), "{table}");
    let chart = report.split("<figure id=\"chart-step-time\">").nth(1).expect("a per-rank step-time chart");
    assert!(chart.contains("rank 0") && chart.contains("rank 1"), "both ranks drawn");
    assert!(report.contains("rank 1 on node1 from step"), "the events table names it");
}

/// Past `[telemetry] rank_times_max` ranks a step line carries the summary
/// alone (O(1) in the world size), and the report draws it: here a world of
/// two with the limit at 0.
#[test]
fn a_world_past_the_per_rank_limit_records_the_summary_alone() {
    let Some(()) = requires::mpi() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let run_dir = tmp.path().join("run");
    let training = Training::tiny_mlp(20).set("train.log_every=1").set("telemetry.rank_times_max=0");
    let out = mpirun_per_rank(2, training.command(&run_dir, &[]), |rank| {
        let mut env = vec![format!("SLURMD_NODENAME=node{rank}")];
        if rank == 1 {
            env.push("FAILPOINTS=train::compute=sleep(30)".into());
        }
        env
    })
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(EXIT_DONE), "{}", String::from_utf8_lossy(&out.stderr));
    let lines = step_lines(&run_dir);
    assert_eq!(lines.len(), 20);
    for line in &lines {
        assert!(line.get("rank_compute_s").is_none(), "no per-rank seconds past the limit: {line}");
        let summary = &line["rank_compute"];
        assert_eq!((summary["ranks"].as_u64(), summary["slowest_rank"].as_u64()), (Some(2), Some(1)), "{line}");
        assert!(summary["max_s"].as_f64().unwrap() >= 0.03, "{line}");
        assert!(summary["min_s"].as_f64().unwrap() <= summary["median_s"].as_f64().unwrap(), "{line}");
    }
    let (_, report) = status_and_report(&run_dir);
    let chart = report.split("<figure id=\"chart-step-time\">").nth(1).expect("a step-time chart");
    assert!(chart.contains("slowest rank") && chart.contains("fastest rank"), "the summary drawn");
    assert!(!chart.contains("rank 0"), "no per-rank lines");
}

#[test]
fn a_process_whose_steps_become_slower_than_its_first_ones_is_reported_once() {
    let tmp = tempfile::tempdir().unwrap();
    let run_dir = tmp.path().join("run");
    let training = Training::tiny_mlp(60).set("health.straggler_steps=5");
    // The first 20 steps as fast as they are; every later one 100 ms slower
    // (a node throttled after a while; well past a baseline that a loaded
    // machine may have made several times slower than idle).
    let out = training
        .command(&run_dir, &[])
        .env("SLURMD_NODENAME", "node7")
        .env("FAILPOINTS", "train::compute=20*off->sleep(100)")
        .output()
        .unwrap();
    let s = &the_one_straggler(&out, &run_dir);
    assert_eq!(
        (s["rank"].as_u64(), s["rank_node"].as_str(), s["world_size"].as_u64()),
        (Some(0), Some("node7"), Some(1))
    );
    assert_eq!(s["blamed"].as_bool(), Some(false), "not blamed by default");
    // Its baseline is its first 10 steps; slow from step 21, five in a row.
    let step = s["step"].as_u64().unwrap();
    assert!((25..=60).contains(&step), "{s}");
    let (status, report) = status_and_report(&run_dir);
    assert!(status.contains(&format!("straggler this process on node7 from step {step}: ")), "{status}");
    assert!(report.contains("<figure id=\"chart-step-time\">"), "a step-time chart");
}
