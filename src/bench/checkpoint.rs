//! `rekindle bench checkpoint`: save, load+verify, verify and snapshot stall
//! of synthetic state of a given size, beside same-run `dd conv=fsync` and
//! `dd oflag=direct` baselines on the same filesystem, the write path the
//! save chose there (`checkpoint::write_mode`, measured once before the
//! timed saves), and SHA-256 of the state on 1, 2, … threads.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use serde::Serialize;

use candle_core::{Device, Var};

use crate::checkpoint::write_mode::{WriteChoice, plan_for};
use crate::checkpoint::{
    CheckpointError, CheckpointStore, DType, HostTensor, Snapshot, TensorSet, VerifyLevel, WriteSettings, reusable,
};
use crate::train::{AdamW, AdamWConfig, Params, TrainError, from_host, snapshot_tensors};

/// What to measure.
#[derive(Debug, Clone)]
pub struct CheckpointBenchOptions {
    /// Bytes of tensor state (model + optimizer).
    pub bytes: u64,
    /// Directory on the filesystem to measure (a temporary subdirectory is used).
    pub dir: PathBuf,
    pub repeat: usize,
    /// Drop the page cache before each load (needs root), for cold reads.
    pub cold: bool,
    /// What the write path may choose (`[checkpoint] write_mode`, …).
    pub write: WriteSettings,
}

/// Medians (and spreads) of one benchmark run.
#[derive(Debug, Clone, Serialize)]
pub struct CheckpointBench {
    pub bytes: u64,
    pub repeat: usize,
    pub dir: PathBuf,
    pub save_gbps: f64,
    pub load_verify_gbps: f64,
    pub verify_gbps: f64,
    pub stall_seconds: f64,
    pub sync_save_seconds: f64,
    pub dd_fsync_gbps: Option<f64>,
    /// `dd bs=8M oflag=direct conv=fsync` of the same bytes: what direct
    /// I/O gives on this filesystem (absent where it refuses `O_DIRECT`).
    pub dd_direct_gbps: Option<f64>,
    /// How the saves wrote (measured before the first timed save, or
    /// configured), with the measurement's candidates.
    pub write: WriteChoice,
    /// Files in each checkpoint (the shards, their indexes, `state.json`).
    pub files: usize,
    /// SHA-256 of the state in memory on 1, 2, … threads (up to the cores
    /// this process may use), each thread hashing its own tensors.
    pub sha256_threads: Vec<HashThreads>,
    /// The same bytes written from memory with plain `write` + one fsync, no
    /// hashing, no manifest: what the filesystem allows.
    pub raw_write_fsync_gbps: f64,
    pub raw_write_fsync_seconds: Stats,
    /// SHA-256 of the state in memory on one thread (the verify ceiling).
    pub sha256_one_core_gbps: f64,
    pub save_seconds: Stats,
    pub load_verify_seconds: Stats,
    pub verify_seconds: Stats,
    pub stall: Stats,
    pub dd_fsync_seconds: Option<Stats>,
    pub dd_direct_seconds: Option<Stats>,
    /// `--cold` was asked for.
    pub cold_reads: bool,
    /// Every read ran after the page cache was dropped. `false` when
    /// `--cold` was not given, or when dropping failed (not root,
    /// `/proc/sys/vm/drop_caches` not writable): the load and verify figures
    /// are then warm-cache numbers, and `cold_cache_reason` says why.
    pub cold_cache: bool,
    /// Why the reads were not cold; absent when they were.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cold_cache_reason: Option<String>,
}

/// SHA-256 throughput on a number of threads.
#[derive(Debug, Clone, Serialize)]
pub struct HashThreads {
    pub threads: usize,
    pub gbps: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Stats {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Stats {
    pub(super) fn of(samples: &[f64]) -> Stats {
        let mut s = samples.to_vec();
        s.sort_by(f64::total_cmp);
        let median = if s.is_empty() {
            f64::NAN
        } else if s.len() % 2 == 1 {
            s[s.len() / 2]
        } else {
            (s[s.len() / 2 - 1] + s[s.len() / 2]) / 2.0
        };
        Stats { median, min: *s.first().unwrap_or(&f64::NAN), max: *s.last().unwrap_or(&f64::NAN) }
    }
}

/// Errors of the benchmark.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error("benchmark directory {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("the benchmark checkpoint of step {step} does not verify: {reason}")]
    Invalid { step: u64, reason: String },
}

/// Fills `buf` with cheap pseudo-random bytes (incompressible, no zero pages).
fn fill(buf: &mut [u8], mut seed: u64) {
    for chunk in buf.chunks_mut(8) {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let bytes = seed.to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
}

/// Synthetic training state: a third parameters, two thirds AdamW moments,
/// in tensors of transformer-like shapes (rows of 4096 f32).
pub fn synthetic_state(bytes: u64) -> (TensorSet, TensorSet) {
    const ROW: usize = 4096 * 4;
    let params = (bytes / 3).max(ROW as u64) as usize;
    let layers = 8usize;
    let mut model = TensorSet::new();
    let mut optimizer = TensorSet::new();
    let per_layer_rows = (params / layers / ROW).max(1);
    for layer in 0..layers {
        for prefix in ["", "exp_avg.", "exp_avg_sq."] {
            let mut data = vec![0u8; per_layer_rows * ROW];
            fill(&mut data, 0x9E37_79B9_7F4A_7C15 ^ (layer as u64 * 31 + prefix.len() as u64));
            let name = format!("{prefix}blocks.{layer}.mlp.weight");
            let tensor = HostTensor::new(DType::F32, vec![per_layer_rows, 4096], data).expect("shape matches");
            if prefix.is_empty() {
                model.insert(name, tensor)
            } else {
                optimizer.insert(name, tensor)
            };
        }
    }
    (model, optimizer)
}

/// The synthetic state as a trainer holds it: parameters in candle `Var`s
/// and the moments in rekindle's AdamW, so that the stall is measured
/// through the code a periodic checkpoint runs (`train::snapshot_tensors`).
struct LiveState {
    params: Params,
    optimizer: AdamW,
}

impl LiveState {
    fn new(bytes: u64) -> Result<LiveState, BenchError> {
        let failed = |e: TrainError| BenchError::Invalid { step: 0, reason: format!("{e:#}") };
        let (model, moments) = synthetic_state(bytes);
        let mut params = Params::new();
        // Each host tensor is dropped once it is in candle: the bench holds
        // about the state's size twice at most, not three times.
        for (name, host) in model {
            let var = from_host(&name, &host, &Device::Cpu).and_then(|t| {
                Var::from_tensor(&t).map_err(|e| TrainError::Tensor { name: name.clone(), message: e.to_string() })
            });
            params.insert(name, var.map_err(failed)?);
        }
        let hyper = AdamWConfig { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0 };
        let mut optimizer = AdamW::new(&params, hyper).map_err(failed)?;
        optimizer.load_state(&moments, 1, &Device::Cpu).map_err(failed)?;
        drop(moments);
        // As between two steps of a run: the optimizer holds the parameter
        // values its last update computed.
        optimizer.keep_values(&params).map_err(|e| failed(TrainError::state("bench", e.to_string())))?;
        Ok(LiveState { params, optimizer })
    }

    /// The snapshot of `step` a periodic checkpoint takes, into the
    /// buffers of `reuse` where something must be copied.
    fn snapshot(&self, step: u64, reuse: Option<Snapshot>) -> Result<Snapshot, BenchError> {
        let reuse = reuse.map(|r| (reusable(r.model), reusable(r.optimizer)));
        let (model, optimizer, _) = snapshot_tensors(&self.params, &self.optimizer, None, reuse)
            .map_err(|e| BenchError::Invalid { step, reason: format!("{e:#}") })?;
        Ok(Snapshot { step, model, optimizer, state: serde_json::json!({"bench": true}) })
    }
}

/// `dd bs=8M conv=fsync` of `bytes` into `dir` (with `direct`, also
/// `oflag=direct`), timed; `None` when dd fails (or the filesystem refuses
/// direct I/O).
fn dd_fsync(dir: &Path, bytes: u64, direct: bool) -> Option<f64> {
    let path = dir.join("dd.bin");
    let count = bytes.div_ceil(8 << 20);
    let t0 = Instant::now();
    let of = format!("of={}", path.display());
    let count = format!("count={count}");
    let mut args = vec!["if=/dev/zero", &of, "bs=8M", &count, "conv=fsync"];
    if direct {
        args.push("oflag=direct");
    }
    let ok = Command::new("dd").args(args).stderr(std::process::Stdio::null()).status().ok()?.success();
    let secs = t0.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(&path);
    ok.then_some(secs)
}

/// Writes the snapshot's tensor bytes to one file and fsyncs it, timed.
fn raw_write(dir: &Path, snap: &Snapshot) -> std::io::Result<f64> {
    use std::io::Write;
    let path = dir.join("raw.bin");
    let t0 = Instant::now();
    let mut f = std::fs::File::create(&path)?;
    for t in snap.model.values().chain(snap.optimizer.values()) {
        f.write_all(&t.data)?;
    }
    f.sync_all()?;
    let secs = t0.elapsed().as_secs_f64();
    std::fs::remove_file(&path)?;
    Ok(secs)
}

/// SHA-256 of `snap`'s tensors on `threads` threads, each hashing every
/// `threads`-th tensor as its own stream (as the files of a checkpoint
/// are hashed), in GB/s.
fn hash_on_threads(snap: &Snapshot, threads: usize) -> f64 {
    let tensors: Vec<&HostTensor> = snap.model.values().chain(snap.optimizer.values()).collect();
    let bytes: u64 = tensors.iter().map(|t| t.data.len() as u64).sum();
    let t0 = Instant::now();
    std::thread::scope(|scope| {
        for i in 0..threads {
            let tensors = &tensors;
            scope.spawn(move || {
                for t in tensors.iter().skip(i).step_by(threads) {
                    let _ = <sha2::Sha256 as sha2::Digest>::digest(&t.data[..]);
                }
            });
        }
    });
    bytes as f64 / t0.elapsed().as_secs_f64() / 1e9
}

/// The kernel's page-cache control file.
const DROP_CACHES: &str = "/proc/sys/vm/drop_caches";

/// Writes back dirty pages and drops the page cache through `control`
/// (`/proc/sys/vm/drop_caches`); the error says why it could not.
fn drop_caches(control: &Path) -> Result<(), String> {
    let _ = Command::new("sync").status();
    std::fs::write(control, "3\n").map_err(|e| {
        format!("cannot drop the page cache through {}: {e} (it needs root on the host)", control.display())
    })
}

/// Whether the reads were cold, and why not: from `--cold` and the first
/// failure to drop the cache, if any.
fn cold_cache(requested: bool, failure: Option<String>) -> (bool, Option<String>) {
    match (requested, failure) {
        (false, _) => (false, Some("not requested (--cold not given)".into())),
        (true, Some(why)) => (false, Some(why)),
        (true, None) => (true, None),
    }
}

/// Runs the checkpoint benchmark.
pub fn run_checkpoint_bench(opts: &CheckpointBenchOptions) -> Result<CheckpointBench, BenchError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| BenchError::Io { path, source }
    };
    std::fs::create_dir_all(&opts.dir).map_err(io(&opts.dir))?;
    let work = tempfile::Builder::new().prefix("rekindle-bench-").tempdir_in(&opts.dir).map_err(io(&opts.dir))?;
    let live = LiveState::new(opts.bytes)?;
    // One snapshot before the timed ones, as a run's first checkpoint
    // (buffers it had to allocate are reused by the later ones).
    let mut staging = live.snapshot(0, None)?;
    let bytes = staging.payload_bytes();
    // The measurement a run makes at its first large save, made here before
    // the timed saves (which then reuse it, as a run's later saves do).
    let write = plan_for(&crate::confine::Dir::open(work.path()).map_err(io(work.path()))?, &opts.write, bytes, true);
    let (mut save, mut load, mut verify, mut stall, mut dd) = (vec![], vec![], vec![], vec![], vec![]);
    let mut dd_direct = vec![];
    let mut files = 0;
    let mut raw = vec![];
    let mut drop_failure: Option<String> = None;
    let cold = |failure: &mut Option<String>| {
        if opts.cold
            && let Err(why) = drop_caches(Path::new(DROP_CACHES))
        {
            failure.get_or_insert(why);
        }
    };
    for i in 0..opts.repeat.max(1) {
        let step = i as u64 + 1;
        // The stall: what a periodic checkpoint costs the training thread,
        // through the trainer's own code (tensors nothing writes into any
        // more shared, the rest copied into reused buffers).
        let t0 = Instant::now();
        staging = live.snapshot(step, Some(staging))?;
        stall.push(t0.elapsed().as_secs_f64());

        let dir = work.path().join(format!("run{i}"));
        let store = CheckpointStore::open(&dir, 1)?.with_write_settings(opts.write);
        let t0 = Instant::now();
        let report = store.save(&staging)?;
        save.push(t0.elapsed().as_secs_f64());
        files = crate::checkpoint::read_manifest(&report.dir).map_or(0, |m| m.files.len());

        // Saves write with direct I/O where the filesystem allows it, so the
        // page cache may not hold the checkpoint now: read it once, untimed,
        // so that load and verify below read under the same conditions (warm,
        // or cold with `--cold`, which drops the cache before each).
        if !opts.cold {
            let _ = crate::checkpoint::verify_checkpoint_dir(&report.dir, VerifyLevel::Full);
        }
        cold(&mut drop_failure);
        let t0 = Instant::now();
        let loaded = crate::checkpoint::load_dir(&report.dir)
            .map_err(|f| BenchError::Invalid { step, reason: format!("{f:?}") })?;
        load.push(t0.elapsed().as_secs_f64());
        drop(loaded);

        cold(&mut drop_failure);
        let t0 = Instant::now();
        let failures = crate::checkpoint::verify_checkpoint_dir(&report.dir, VerifyLevel::Full);
        verify.push(t0.elapsed().as_secs_f64());
        if !failures.is_empty() {
            return Err(BenchError::Invalid { step, reason: format!("{failures:?}") });
        }
        std::fs::remove_dir_all(&dir).map_err(io(&dir))?;
        if let Some(s) = dd_fsync(work.path(), bytes, false) {
            dd.push(s);
        }
        if let Some(s) = dd_fsync(work.path(), bytes, true) {
            dd_direct.push(s);
        }
        raw.push(raw_write(work.path(), &staging).map_err(io(work.path()))?);
    }
    let t0 = Instant::now();
    let mut h = <sha2::Sha256 as sha2::Digest>::new();
    for t in staging.model.values().chain(staging.optimizer.values()) {
        for chunk in t.data.chunks(1 << 20) {
            sha2::Digest::update(&mut h, chunk);
        }
    }
    let _ = sha2::Digest::finalize(h);
    let sha256_one_core_gbps = bytes as f64 / t0.elapsed().as_secs_f64() / 1e9;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let sha256_threads =
        (1..=cores.min(8)).map(|threads| HashThreads { threads, gbps: hash_on_threads(&staging, threads) }).collect();
    let gbps = |s: &Stats| bytes as f64 / s.median / 1e9;
    let (save, load, verify, stall) = (Stats::of(&save), Stats::of(&load), Stats::of(&verify), Stats::of(&stall));
    let dd = (!dd.is_empty()).then(|| Stats::of(&dd));
    let dd_direct = (!dd_direct.is_empty()).then(|| Stats::of(&dd_direct));
    let raw = Stats::of(&raw);
    let (cold_cache, cold_cache_reason) = cold_cache(opts.cold, drop_failure);
    if let (true, false, Some(why)) = (opts.cold, cold_cache, &cold_cache_reason) {
        tracing::warn!("--cold: {why}; load and verify were measured with a warm page cache");
    }
    Ok(CheckpointBench {
        bytes,
        repeat: opts.repeat.max(1),
        dir: opts.dir.clone(),
        save_gbps: gbps(&save),
        load_verify_gbps: gbps(&load),
        verify_gbps: gbps(&verify),
        stall_seconds: stall.median,
        sync_save_seconds: save.median,
        dd_fsync_gbps: dd.as_ref().map(gbps),
        dd_direct_gbps: dd_direct.as_ref().map(gbps),
        write,
        files,
        sha256_threads,
        sha256_one_core_gbps,
        raw_write_fsync_gbps: gbps(&raw),
        raw_write_fsync_seconds: raw,
        save_seconds: save,
        load_verify_seconds: load,
        verify_seconds: verify,
        stall,
        dd_fsync_seconds: dd,
        dd_direct_seconds: dd_direct,
        cold_reads: opts.cold,
        cold_cache,
        cold_cache_reason,
    })
}

impl std::fmt::Display for CheckpointBench {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let gib = self.bytes as f64 / (1u64 << 30) as f64;
        writeln!(
            f,
            "checkpoint benchmark: {gib:.2} GiB of state in {}, {} repeat(s){}",
            self.dir.display(),
            self.repeat,
            if self.cold_cache { ", cold reads" } else { "" }
        )?;
        if self.cold_reads && !self.cold_cache {
            writeln!(
                f,
                "NOT COLD: --cold was asked for, but {}; load and verify below read from a warm page cache",
                self.cold_cache_reason.as_deref().unwrap_or("the page cache could not be dropped")
            )?;
        }
        writeln!(f, "{:<22} {:>9} {:>9} {:>9} {:>9}", "operation", "median s", "min s", "max s", "GB/s")?;
        let row = |f: &mut std::fmt::Formatter<'_>, name: &str, s: &Stats| {
            writeln!(
                f,
                "{:<22} {:>9.3} {:>9.3} {:>9.3} {:>9.2}",
                name,
                s.median,
                s.min,
                s.max,
                self.bytes as f64 / s.median / 1e9
            )
        };
        row(f, "save (durable+sha256)", &self.save_seconds)?;
        row(f, "load + verify", &self.load_verify_seconds)?;
        row(f, "verify", &self.verify_seconds)?;
        row(f, "snapshot stall", &self.stall)?;
        row(f, "write+fsync, no hash", &self.raw_write_fsync_seconds)?;
        if let Some(dd) = &self.dd_fsync_seconds {
            row(f, "dd bs=8M conv=fsync", dd)?;
        }
        if let Some(dd) = &self.dd_direct_seconds {
            row(f, "dd ... oflag=direct", dd)?;
        }
        writeln!(f, "{:<22} {:>39.2}", "sha256, 1 core, memory", self.sha256_one_core_gbps)?;
        for h in &self.sha256_threads {
            writeln!(f, "{:<22} {:>39.2}", format!("sha256, {} thread(s)", h.threads), h.gbps)?;
        }
        let how = match self.write.chosen_by {
            crate::checkpoint::write_mode::ChosenBy::Measured => "measured",
            crate::checkpoint::write_mode::ChosenBy::Configured => "configured",
            crate::checkpoint::write_mode::ChosenBy::Default => "default (too small to measure)",
        };
        writeln!(f, "write path: {} ({how}), {} files per checkpoint", self.write.plan, self.files)?;
        for t in &self.write.trials {
            writeln!(f, "  measured {:<40} {:>6.2} GB/s", t.plan.to_string(), t.gbps)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_cache_that_cannot_be_dropped_is_reported_not_silently_warm() {
        let tmp = tempfile::tempdir().unwrap();
        let why = drop_caches(&tmp.path().join("no-such-dir/drop_caches")).unwrap_err();
        assert!(why.contains("cannot drop the page cache") && why.contains("needs root"), "{why}");
        assert_eq!(cold_cache(true, Some(why.clone())), (false, Some(why)));
        assert_eq!(cold_cache(true, None), (true, None));
        assert!(!cold_cache(false, None).0);
    }

    #[test]
    fn warm_numbers_asked_for_cold_say_so_in_json_and_text() {
        let stats = || Stats::of(&[1.0]);
        let bench = CheckpointBench {
            bytes: 1 << 20,
            repeat: 1,
            dir: "/tmp".into(),
            save_gbps: 1.0,
            load_verify_gbps: 1.0,
            verify_gbps: 1.0,
            stall_seconds: 0.1,
            sync_save_seconds: 1.0,
            dd_fsync_gbps: None,
            dd_direct_gbps: None,
            write: WriteChoice {
                plan: crate::checkpoint::write_mode::WritePlan::DEFAULT,
                chosen_by: crate::checkpoint::write_mode::ChosenBy::Default,
                trials: Vec::new(),
                measure_seconds: None,
                direct_refused: false,
            },
            files: 3,
            sha256_threads: vec![HashThreads { threads: 1, gbps: 1.0 }],
            raw_write_fsync_gbps: 1.0,
            raw_write_fsync_seconds: stats(),
            sha256_one_core_gbps: 1.0,
            save_seconds: stats(),
            load_verify_seconds: stats(),
            verify_seconds: stats(),
            stall: stats(),
            dd_fsync_seconds: None,
            dd_direct_seconds: None,
            cold_reads: true,
            cold_cache: false,
            cold_cache_reason: Some("cannot drop the page cache through /proc/sys/vm/drop_caches: denied".into()),
        };
        let json = serde_json::to_value(&bench).unwrap();
        assert_eq!((&json["cold_reads"], &json["cold_cache"]), (&serde_json::json!(true), &serde_json::json!(false)));
        assert!(json["cold_cache_reason"].as_str().unwrap().contains("denied"));
        let text = bench.to_string();
        assert!(text.contains("NOT COLD: --cold was asked for, but cannot drop"), "{text}");
        assert!(!text.contains(", cold reads"), "{text}");
    }
}
