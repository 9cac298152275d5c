//! The tests that need an NVIDIA GPU and a rekindle built with
//! `--features cuda`: `make gpu-check` runs them (docs/gpus.md). Everywhere
//! else they are ignored (`#[ignore]`), so `cargo test` and CI skip them and
//! say so in their count of ignored tests; once asked for (`--ignored`),
//! each fails loudly when the machine or the build cannot run it, never
//! passes vacuously.
//!
//! - detection: `rekindle gpus --json` lists the GPUs `nvidia-smi` lists,
//!   with the same names, UUIDs and total memory;
//! - one step on each planned device: a run plans one replica per visible
//!   GPU and completes a step on all of them, with no fallback;
//! - stop and resume on one GPU: bit-identical to the uninterrupted run;
//! - the out-of-memory back-off on real device memory: a micro-batch far
//!   beyond any GPU's memory is halved until it fits, the same step, the
//!   same effective batch, still on the GPU.
//!
//! Not yet run on a GPU: no GPU machine was available when they were
//! written. docs/gpus.md says so until someone runs `make gpu-check`.

use crate::support;

use std::process::Command;

use serde_json::Value;
use support::runs::{EXIT_DONE, Training, assert_same_checkpoint, assert_same_metrics, events_named, outcome, summary};

/// One GPU as `nvidia-smi` lists it.
#[derive(Debug, PartialEq)]
struct SmiGpu {
    index: u32,
    uuid: String,
    name: String,
    memory_total_mib: u64,
}

/// `nvidia-smi`'s list of the GPUs, or a panic saying why there is none.
fn nvidia_smi() -> Vec<SmiGpu> {
    let out = Command::new("nvidia-smi")
        .args(["--query-gpu=index,uuid,name,memory.total", "--format=csv,noheader,nounits"])
        .output()
        .unwrap_or_else(|e| panic!("`nvidia-smi` did not run ({e}): these tests need an NVIDIA GPU and its driver"));
    assert!(out.status.success(), "nvidia-smi failed: {}", String::from_utf8_lossy(&out.stderr));
    let gpus: Vec<SmiGpu> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let f: Vec<&str> = line.split(',').map(str::trim).collect();
            assert_eq!(f.len(), 4, "unexpected nvidia-smi line {line:?}");
            SmiGpu {
                index: f[0].parse().expect("index"),
                uuid: f[1].to_string(),
                name: f[2].to_string(),
                memory_total_mib: f[3].parse().expect("memory.total"),
            }
        })
        .collect();
    assert!(!gpus.is_empty(), "nvidia-smi lists no GPU");
    gpus
}

/// `rekindle gpus --json`, as a run would plan (`[gpu] backend = "auto"`).
fn gpus_report() -> Value {
    let out = support::runs::rekindle().args(["gpus", "--json"]).output().expect("start rekindle");
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("rekindle gpus --json: {e}: {}", String::from_utf8_lossy(&out.stderr)))
}

/// Panics unless this binary has the CUDA backend (built with `--features cuda`).
fn assert_cuda_build(report: &Value) {
    let notes = report["notes"].to_string();
    assert!(
        !notes.contains("no CUDA backend"),
        "this rekindle has no CUDA backend: run `make gpu-check`, which builds with --features cuda ({notes})"
    );
}

/// A tiny run planning for whatever GPUs are visible.
fn on_gpus(training: Training) -> Training {
    training.set("gpu.backend=\"cuda\"").set("gpu.require=true").set("optimizer.warmup_steps=1")
}

fn run(training: &Training, dir: &std::path::Path, env: &[(&str, &str)], extra: &[&str]) -> (i32, String) {
    let mut cmd = training.command(dir, extra);
    cmd.envs(env.iter().copied());
    let (code, _, stderr) = outcome(&cmd.output().expect("start rekindle"));
    (code, stderr)
}

fn the_event(dir: &std::path::Path, name: &str) -> Value {
    let found = events_named(dir, name);
    assert_eq!(found.len(), 1, "expected one `{name}` event in {}: {found:?}", dir.display());
    found.into_iter().next().unwrap()
}

#[test]
#[ignore = "needs an NVIDIA GPU and --features cuda: make gpu-check"]
fn detection_matches_nvidia_smi() {
    let smi = nvidia_smi();
    let report = gpus_report();
    let devices = report["devices"].as_array().expect("devices");
    let nvidia: Vec<&Value> = devices.iter().filter(|d| d["vendor"] == "nvidia").collect();
    assert_eq!(nvidia.len(), smi.len(), "rekindle sees {nvidia:?}, nvidia-smi {smi:?}");
    for (ours, theirs) in nvidia.iter().zip(&smi) {
        assert_eq!(ours["index"], theirs.index, "{ours} vs {theirs:?}");
        assert_eq!(ours["uuid"], theirs.uuid.as_str(), "{ours} vs {theirs:?}");
        assert_eq!(ours["name"], theirs.name.as_str(), "{ours} vs {theirs:?}");
        assert_eq!(ours["memory_total_mib"], theirs.memory_total_mib, "{ours} vs {theirs:?}");
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU and --features cuda: make gpu-check"]
fn one_step_on_each_planned_device() {
    let smi = nvidia_smi();
    assert_cuda_build(&gpus_report());
    let n = smi.len();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    // One replica per GPU: the effective batch splits into n shards.
    let training = on_gpus(Training::tiny_mlp(1)).set(&format!("train.batch_size={}", 16 * n));
    let (code, stderr) = run(&training, &dir, &[], &[]);
    assert_eq!(code, EXIT_DONE, "{stderr}");
    assert!(events_named(&dir, "gpu_fallback").is_empty(), "{stderr}");
    let placement = &the_event(&dir, "start")["placement"];
    assert_eq!(placement["backend"], "cuda", "{placement}");
    assert_eq!(placement["layout"]["replicas"], n, "{placement}");
    let mut used: Vec<u64> =
        placement["devices"].as_array().unwrap().iter().map(|g| g[0].as_u64().expect("device index")).collect();
    used.sort_unstable();
    let all: Vec<u64> = smi.iter().map(|g| u64::from(g.index)).collect();
    assert_eq!(used, all, "every GPU trains a replica: {placement}");
    assert_eq!(summary(&dir)["steps"], 1);
}

#[test]
#[ignore = "needs an NVIDIA GPU and --features cuda: make gpu-check"]
fn stop_and_resume_on_one_gpu_is_bit_exact() {
    nvidia_smi();
    assert_cuda_build(&gpus_report());
    let tmp = tempfile::tempdir().unwrap();
    let one = [("CUDA_VISIBLE_DEVICES", "0")];
    let training = on_gpus(Training::tiny_gpt(8));
    let reference = tmp.path().join("reference");
    let (code, stderr) = run(&training, &reference, &one, &[]);
    assert_eq!(code, EXIT_DONE, "{stderr}");
    assert_eq!(the_event(&reference, "start")["placement"]["backend"], "cuda");

    let dir = tmp.path().join("run");
    let (code, stderr) = run(&training, &dir, &one, &["--stop-at-step", "4"]);
    assert_eq!(code, support::runs::EXIT_STOPPED, "{stderr}");
    let (code, stderr) = run(&training, &dir, &one, &[]);
    assert_eq!(code, EXIT_DONE, "{stderr}");
    assert!(events_named(&dir, "gpu_fallback").is_empty(), "{stderr}");
    assert_same_metrics(&dir, &reference, 8);
    assert_same_checkpoint(&dir, &reference, 8);
}

#[test]
#[ignore = "needs an NVIDIA GPU and --features cuda: make gpu-check"]
fn out_of_memory_backs_off_on_the_gpu_with_a_huge_micro_batch() {
    nvidia_smi();
    assert_cuda_build(&gpus_report());
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    // 2^20 samples × 65536 hidden units × 4 bytes: 256 GiB of activations in
    // one micro-batch, beyond any GPU; 2^15 (after five halvings) is 8 GiB.
    let samples = 1 << 20;
    let training = on_gpus(Training::tiny_mlp(2))
        .set("model.hidden=[65536]")
        .set(&format!("data.synthetic_samples={samples}"))
        .set(&format!("train.batch_size={samples}"))
        .set(&format!("train.micro_batch={samples}"));
    let (code, stderr) = run(&training, &dir, &[("CUDA_VISIBLE_DEVICES", "0")], &[]);
    assert_eq!(code, EXIT_DONE, "{stderr}");
    assert_eq!(the_event(&dir, "start")["placement"]["backend"], "cuda");
    let retries = events_named(&dir, "oom_retry");
    assert!(!retries.is_empty(), "no out-of-memory retry: {stderr}");
    for r in &retries {
        assert_eq!(r["step"], 1, "{r}");
        let error = r["error"].as_str().unwrap().to_ascii_lowercase();
        assert!(error.contains("out of memory") || error.contains("out_of_memory"), "{r}");
        let (from, to) = (&r["from"], &r["to"]);
        let effective = |l: &Value| l["micro_batch"].as_u64().unwrap() * l["grad_accum"].as_u64().unwrap();
        assert_eq!(effective(from), effective(to), "the effective batch is kept: {r}");
    }
    assert!(events_named(&dir, "gpu_fallback").is_empty(), "the back-off found a size that fits: {stderr}");
    assert_eq!(summary(&dir)["steps"], 2);
}
