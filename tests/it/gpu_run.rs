//! Device placement of `rekindle run` (issue 6), through the real binary,
//! with injected GPUs (and injected GPU-less nodes) and failures; where a
//! test runs on this machine's own devices it first asks `rekindle gpus`
//! what is there and asserts the matching outcome, so the suite passes on
//! GPU nodes too:
//!
//! - a fake 2-GPU node (`REKINDLE_GPU_INVENTORY`): this build has no CUDA
//!   backend, so the run falls back to the CPU with a `gpu_fallback` event,
//!   or, with `[gpu] require = true`, refuses before training (exit 1);
//! - a stand-in backend (failpoint `gpu::backend_init`) whose first step
//!   fails (`train::step_error`): the run falls back and trains on, ending
//!   exactly where a CPU run does;
//! - `[train] micro_batch = "auto"` takes the plan's micro-batch;
//! - out of memory (failpoint `train::oom`): the step is retried with half
//!   the micro-batch (an `oom_retry` event each time) and the run ends
//!   exactly where a run with the smaller micro-batch from the start does;
//!   after 5 retries it stops with a checkpoint and exit 1; on a GPU
//!   backend (the stand-in) it falls back to the CPU instead and trains on;
//! - the monitor writes `gpu_stats.jsonl` every `[gpu] monitor_interval`.

use crate::support;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;
use support::runs::{
    EXIT_DONE, Training, assert_same_checkpoint, assert_same_metrics, checkpoint_steps, events, events_named, jsonl,
    losses, outcome, step_dir, summary,
};

const EXIT_FAILURE: i32 = 1;

/// An inventory of `n` H100s with `free_mib` free each, in `dir`.
fn inventory(dir: &Path, n: usize, free_mib: u64) -> PathBuf {
    let device =
        format!(r#"{{"vendor": "nvidia", "name": "H100", "memory_total_mib": 81559, "memory_free_mib": {free_mib}}}"#);
    let path = dir.join(format!("node-{n}.json"));
    fs::write(&path, format!(r#"{{"devices": [{}]}}"#, vec![device; n].join(", "))).unwrap();
    path
}

/// An inventory of a node with no GPU at all (`{"devices": []}`), in `dir`.
fn no_gpus(dir: &Path) -> PathBuf {
    let path = dir.join("node-0.json");
    fs::write(&path, r#"{"devices": []}"#).unwrap();
    path
}

/// Whether this machine has a GPU a run with `[gpu] backend = "auto"` (the
/// default) plans for, asked the way a run asks (`rekindle gpus --json`
/// probes like `rekindle run` does): tests about "this machine" assert what
/// matches the answer.
fn this_machine_plans_a_gpu() -> bool {
    let out = support::runs::rekindle().args(["gpus", "--json"]).output().unwrap();
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("rekindle gpus --json: {e}: {}", String::from_utf8_lossy(&out.stderr)));
    report["plan"]["device_kind"].as_str().is_some_and(|k| k != "cpu")
}

/// The tiny mlp for `steps` steps (warm-up shortened to fit).
fn short(steps: u64) -> Training {
    Training::tiny_mlp(steps).set("optimizer.warmup_steps=1")
}

/// [`short`], planning for whatever GPUs it is shown (tiny.toml says `cpu`).
fn on_any_backend(steps: u64) -> Training {
    short(steps).set("gpu.backend=\"auto\"")
}

/// Runs `training` in `dir` with these extra environment variables.
fn run_with(training: &Training, dir: &Path, env: &[(&str, &Path)], failpoints: Option<&str>) -> (i32, String) {
    let mut cmd = training.command(dir, &[]);
    for (key, value) in env {
        cmd.env(key, value);
    }
    if let Some(fp) = failpoints {
        cmd.env("FAILPOINTS", fp);
    }
    let out: Output = cmd.output().expect("start rekindle");
    let (code, _, stderr) = outcome(&out);
    (code, stderr)
}

fn the_event(dir: &Path, name: &str) -> Value {
    let found = events_named(dir, name);
    assert_eq!(found.len(), 1, "expected one `{name}` event in {}: {found:?}", dir.display());
    found.into_iter().next().unwrap()
}

#[test]
fn a_fake_two_gpu_node_falls_back_to_the_cpu_with_an_event() {
    let tmp = tempfile::tempdir().unwrap();
    let node = inventory(tmp.path(), 2, 80_000);
    let dir = tmp.path().join("run");
    let (code, stderr) = run_with(&on_any_backend(3), &dir, &[("REKINDLE_GPU_INVENTORY", &node)], None);
    assert_eq!(code, EXIT_DONE, "{stderr}");
    assert!(stderr.contains("GPU FALLBACK: training on the CPU"), "{stderr}");
    assert!(stderr.contains("no CUDA backend"), "{stderr}");

    let start = the_event(&dir, "start");
    let placement = &start["placement"];
    assert_eq!(placement["backend"], "cpu");
    assert_eq!(placement["visible"], 2);
    assert_eq!(placement["wanted"]["device_kind"], "cuda");
    assert_eq!(placement["wanted"]["replicas"], 2, "{placement}");
    assert_eq!(placement["plan"]["device_kind"], "cpu");
    assert_eq!(placement["layout"]["replicas"], 1);
    assert!(placement["fallback"].as_str().unwrap().contains("no CUDA backend"), "{placement}");

    let fallback = the_event(&dir, "gpu_fallback");
    assert!(fallback["reason"].as_str().unwrap().contains("candle's `cuda` feature is not compiled in"));
    assert_eq!(fallback["wanted"]["device_kind"], "cuda");
    assert_eq!(fallback["plan"]["device_kind"], "cpu");
    assert_eq!(summary(&dir)["steps"], 3, "trained on the CPU to the end");

    // A node without GPUs: no fallback, the CPU from the start.
    let plain = tmp.path().join("plain");
    let (code, stderr) =
        run_with(&on_any_backend(3), &plain, &[("REKINDLE_GPU_INVENTORY", &no_gpus(tmp.path()))], None);
    assert_eq!(code, EXIT_DONE, "{stderr}");
    assert!(events_named(&plain, "gpu_fallback").is_empty());
    assert_eq!(the_event(&plain, "start")["placement"]["backend"], "cpu");

    // This machine, probed: the outcome matches what `rekindle gpus` finds.
    let here = tmp.path().join("here");
    let gpu_here = this_machine_plans_a_gpu();
    let (code, stderr) = run_with(&on_any_backend(3), &here, &[], None);
    assert_eq!(code, EXIT_DONE, "{stderr}");
    let placement = &the_event(&here, "start")["placement"];
    if gpu_here {
        // A GPU this build can use trains there; one it cannot falls back.
        let fell_back = !events_named(&here, "gpu_fallback").is_empty();
        assert_eq!(placement["backend"] == "cpu", fell_back, "{placement}");
    } else {
        assert!(events_named(&here, "gpu_fallback").is_empty(), "no GPU here, yet a fallback");
        assert_eq!(placement["backend"], "cpu", "{placement}");
    }
}

#[test]
fn require_true_refuses_before_training() {
    let tmp = tempfile::tempdir().unwrap();
    let node = inventory(tmp.path(), 2, 80_000);
    let dir = tmp.path().join("run");
    let training = on_any_backend(3).set("gpu.require=true");
    let (code, stderr) = run_with(&training, &dir, &[("REKINDLE_GPU_INVENTORY", &node)], None);
    assert_eq!(code, EXIT_FAILURE, "{stderr}");
    assert!(stderr.contains("error: [gpu] require = true but this build has no CUDA backend"), "{stderr}");
    assert!(stderr.contains("set [gpu] require = false"), "{stderr}");
    assert!(checkpoint_steps(&dir).is_empty(), "nothing was trained or saved");
    assert!(jsonl(&dir.join("metrics.jsonl")).is_empty());
    assert!(events_named(&dir, "gpu_fallback").is_empty());
    assert!(the_event(&dir, "error")["error"].as_str().unwrap().contains("require = true"));
    assert_eq!(the_event(&dir, "start")["placement"]["wanted"]["replicas"], 2);

    // And on a node with no GPU at all.
    let none = tmp.path().join("none");
    let (code, stderr) = run_with(&training, &none, &[("REKINDLE_GPU_INVENTORY", &no_gpus(tmp.path()))], None);
    assert_eq!(code, EXIT_FAILURE, "{stderr}");
    assert!(stderr.contains("require = true but no usable GPU is visible to this job"), "{stderr}");

    // This machine, probed: without a GPU it refuses the same way; with one
    // it refuses for this build's missing backend or trains on it.
    let here = tmp.path().join("here");
    let gpu_here = this_machine_plans_a_gpu();
    let (code, stderr) = run_with(&training, &here, &[], None);
    if gpu_here {
        assert!(code == EXIT_DONE || stderr.contains("require = true but this build has no"), "{code}: {stderr}");
    } else {
        assert_eq!(code, EXIT_FAILURE, "{stderr}");
        assert!(stderr.contains("require = true but no usable GPU is visible to this job"), "{stderr}");
    }
}

#[test]
fn a_backend_whose_first_step_fails_falls_back_and_ends_where_a_cpu_run_does() {
    let tmp = tempfile::tempdir().unwrap();
    let node = inventory(tmp.path(), 2, 80_000);
    let training = on_any_backend(5);
    let reference = tmp.path().join("reference");
    training.run_to_end(&reference);

    let dir = tmp.path().join("run");
    let failpoints = "gpu::backend_init=return;train::step_error=1*return";
    let (code, stderr) = run_with(&training, &dir, &[("REKINDLE_GPU_INVENTORY", &node)], Some(failpoints));
    assert_eq!(code, EXIT_DONE, "{stderr}");
    let placement = &the_event(&dir, "start")["placement"];
    assert_eq!(placement["backend"], "cuda", "the stand-in backend initialised: {placement}");
    assert_eq!(placement["layout"]["replicas"], 2);
    let fallback = the_event(&dir, "gpu_fallback");
    let reason = fallback["reason"].as_str().unwrap();
    assert!(reason.contains("the first step failed on the cuda backend"), "{reason}");
    assert!(reason.contains("injected failure"), "{reason}");
    assert_eq!(fallback["layout"]["replicas"], 1);
    // Rebuilt from the state before the failed step: bit for bit a CPU run.
    assert_same_metrics(&dir, &reference, 5);
    assert_same_checkpoint(&dir, &reference, 5);

    let refused = tmp.path().join("refused");
    let (code, stderr) = run_with(
        &training.clone().set("gpu.require=true"),
        &refused,
        &[("REKINDLE_GPU_INVENTORY", &node)],
        Some(failpoints),
    );
    assert_eq!(code, EXIT_FAILURE, "{stderr}");
    assert!(stderr.contains("require = true but the first step failed on the cuda backend"), "{stderr}");
    assert!(checkpoint_steps(&refused).is_empty());
}

#[test]
fn auto_micro_batch_comes_from_the_plan_and_keeps_the_effective_batch() {
    let tmp = tempfile::tempdir().unwrap();
    // One GPU with 1 MiB free: the tiny gpt's state fits with room for a
    // few samples per micro-batch, fewer than the 16 of a step.
    let node = inventory(tmp.path(), 1, 1);
    let training = on_any_backend(4)
        .set("model.kind=\"gpt\"")
        .set("model.layers=1")
        .set("model.width=16")
        .set("model.heads=2")
        .set("model.context=16")
        .set("train.batch_size=16");
    let dir = tmp.path().join("run");
    // The node check would refuse a device this full (another process
    // holding it): this test is about the plan, so it does not ask.
    let training = training.set("health.min_free_device_memory=0");
    let (code, stderr) = run_with(
        &training.clone().set("train.micro_batch=\"auto\""),
        &dir,
        &[("REKINDLE_GPU_INVENTORY", &node)],
        Some("gpu::backend_init=return"),
    );
    assert_eq!(code, EXIT_DONE, "{stderr}");
    let placement = &the_event(&dir, "start")["placement"];
    let (plan, layout) = (&placement["plan"], &placement["layout"]);
    assert_eq!(plan["device_kind"], "cuda", "{placement}");
    let micro = layout["micro_batch"].as_u64().unwrap();
    assert!(micro > 1 && micro < 16, "memory bounds the micro-batch: {placement}");
    assert_eq!(layout["micro_batch"], plan["micro_batch"]);
    assert_eq!(micro * layout["grad_accum"].as_u64().unwrap(), 16, "{placement}");
    assert!(plan["reason"].as_str().unwrap().contains("samples per micro-batch"), "{plan}");

    // The same samples as the manual run, cut smaller: losses agree to float order.
    let manual = tmp.path().join("manual");
    training.run_to_end(&manual);
    for (step, (a, b)) in losses(&dir, 4).iter().zip(losses(&manual, 4)).enumerate() {
        assert!((a - b).abs() <= 1e-5 * b.abs(), "step {}: {a} vs {b}", step + 1);
    }
    // The monitor watched the planned device.
    let stats = jsonl(&dir.join("gpu_stats.jsonl"));
    assert_eq!(stats[0]["devices"].as_array().unwrap().len(), 1, "{}", stats[0]);
}

#[test]
fn out_of_memory_retries_the_step_with_half_the_micro_batch() {
    let tmp = tempfile::tempdir().unwrap();
    let training = short(4);
    let dir = tmp.path().join("run");
    let (code, stderr) = run_with(&training, &dir, &[], Some("train::oom=2*return"));
    assert_eq!(code, EXIT_DONE, "{stderr}");
    assert!(stderr.contains("out of memory: retrying the step"), "{stderr}");
    let retries = events_named(&dir, "oom_retry");
    let seen: Vec<(u64, u64, u64, u64)> = retries
        .iter()
        .map(|r| {
            let n = |v: &Value| v.as_u64().unwrap();
            (n(&r["step"]), n(&r["retry"]), n(&r["from"]["micro_batch"]), n(&r["to"]["micro_batch"]))
        })
        .collect();
    assert_eq!(seen, [(1, 1, 16, 8), (1, 2, 8, 4)]);
    assert_eq!(retries[1]["to"]["grad_accum"], 4, "accumulation doubled twice");
    assert!(retries[0]["error"].as_str().unwrap().contains("injected allocation failure"));

    // Same samples, same order, same effective batch: exactly the run that
    // used micro-batch 4 from the start.
    let reference = tmp.path().join("reference");
    training.clone().set("train.micro_batch=4").run_to_end(&reference);
    assert_same_metrics(&dir, &reference, 4);
    assert_same_checkpoint(&dir, &reference, 4);
}

#[test]
fn out_of_memory_after_five_retries_stops_with_a_checkpoint_and_exit_1() {
    let tmp = tempfile::tempdir().unwrap();
    let training = short(10).set("train.batch_size=64");
    let dir = tmp.path().join("run");
    // Steps 1–3 (one micro-batch each) pass; every attempt at step 4 fails.
    let (code, stderr) = run_with(&training, &dir, &[], Some("train::oom=3*off->return"));
    assert_eq!(code, EXIT_FAILURE, "{stderr}");
    assert!(stderr.contains("step 4 ran out of memory 6 time(s)"), "{stderr}");
    assert!(stderr.contains("stopped with a checkpoint of step 3"), "{stderr}");
    assert!(stderr.contains("exit 1, not 75"), "{stderr}");
    assert!(step_dir(&dir, 3).is_dir(), "the last completed step is checkpointed");
    assert_eq!(checkpoint_steps(&dir), [3]);
    let retries = events_named(&dir, "oom_retry");
    assert_eq!(retries.len(), 5);
    assert!(retries.iter().all(|r| r["step"] == 4));
    assert_eq!(retries[4]["to"]["micro_batch"], 2);
    assert_eq!(summary(&dir)["state"], "failed");
    assert!(the_event(&dir, "error")["error"].as_str().unwrap().contains("ran out of memory"));

    // Resuming without the injected failure continues from step 3.
    training.run_to_end(&dir);
    assert_eq!(the_last(&dir, "resume")["step"], 3);
    assert_eq!(summary(&dir)["steps"], 10);
}

#[test]
fn out_of_memory_at_the_floor_on_a_gpu_falls_back_to_the_cpu_and_trains_on() {
    let tmp = tempfile::tempdir().unwrap();
    let node = inventory(tmp.path(), 1, 80_000);
    let training = on_any_backend(6).set("train.batch_size=64");
    let reference = tmp.path().join("reference");
    training.run_to_end(&reference);

    // The stand-in backend: steps 1–3 pass, the six attempts at step 4
    // (micro-batch 64 down to 2) run out of memory, then memory is plenty.
    let dir = tmp.path().join("run");
    let failpoints = "gpu::backend_init=return;train::oom=3*off->6*return";
    let (code, stderr) = run_with(&training, &dir, &[("REKINDLE_GPU_INVENTORY", &node)], Some(failpoints));
    assert_eq!(code, EXIT_DONE, "{stderr}");
    assert_eq!(the_event(&dir, "start")["placement"]["backend"], "cuda");
    let retries = events_named(&dir, "oom_retry");
    assert_eq!(retries.len(), 5, "{retries:?}");
    assert!(retries.iter().all(|r| r["step"] == 4));
    let fallback = the_event(&dir, "gpu_fallback");
    let reason = fallback["reason"].as_str().unwrap();
    assert!(
        reason.contains("out of memory on the cuda backend even at the back-off's smallest micro-batch"),
        "{reason}"
    );
    assert!(reason.contains("step 4 ran out of memory 6 time(s)"), "{reason}");
    assert_eq!(fallback["plan"]["device_kind"], "cpu");
    assert!(stderr.contains("GPU FALLBACK: training on the CPU"), "{stderr}");
    // Step 4 ran again on the CPU from the state after step 3: the run is
    // bit for bit the CPU run.
    assert_same_metrics(&dir, &reference, 6);
    assert_same_checkpoint(&dir, &reference, 6);

    // With [gpu] require = true the out-of-memory error stops the run, as on the CPU.
    let refused = tmp.path().join("refused");
    let (code, stderr) = run_with(
        &training.clone().set("gpu.require=true"),
        &refused,
        &[("REKINDLE_GPU_INVENTORY", &node)],
        Some(failpoints),
    );
    assert_eq!(code, EXIT_FAILURE, "{stderr}");
    assert!(stderr.contains("step 4 ran out of memory 6 time(s)"), "{stderr}");
    assert!(events_named(&refused, "gpu_fallback").is_empty());
    assert_eq!(checkpoint_steps(&refused), [3]);
}

fn the_last(dir: &Path, name: &str) -> Value {
    events_named(dir, name).pop().unwrap_or_else(|| panic!("no `{name}` event in {}", dir.display()))
}

#[test]
fn the_monitor_writes_gpu_stats_during_the_run_and_stops_at_exit() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let training = Training::tiny_mlp(150).set("gpu.monitor_interval=\"5ms\"");
    training.run_to_end(&dir);
    let stats = jsonl(&dir.join("gpu_stats.jsonl"));
    assert!(stats.len() >= 3, "only {} samples in a run of 150 steps at 5 ms", stats.len());
    for line in &stats {
        assert!(line["time"].is_string(), "{line}");
        assert_eq!(line["devices"], Value::Array(vec![]), "the CPU run watches no GPU: {line}");
        assert!(line["host"]["ram_total_mib"].as_u64().unwrap() > 0, "{line}");
        assert!(line["host"]["disk_free_mib"].as_u64().is_some(), "{line}");
        assert!(line["host"]["disk_dir"].as_str().unwrap().ends_with("checkpoints"), "{line}");
    }
    // Stopped before the finish event: it reported every line it wrote.
    let monitor = the_event(&dir, "monitor");
    assert_eq!(monitor["samples"].as_u64().unwrap(), stats.len() as u64, "{monitor}");
    let names: Vec<Value> = events(&dir).into_iter().map(|e| e["event"].clone()).collect();
    let at = |n: &str| names.iter().position(|e| e == n).unwrap();
    assert!(at("monitor") < at("finish"));
}
