//! `rekindle bench train`: training throughput of a config with checkpoints
//! off and every N steps (snapshot on the training thread, persisted in the
//! background as `rekindle run` does), the stall each checkpoint costs, and
//! a synchronous save of the same state for comparison.

use std::path::PathBuf;
use std::time::Instant;

use serde::Serialize;

use crate::checkpoint::Persister;
use crate::checkpoint::{CheckpointStore, Snapshot, reusable};
use crate::config::Config;
use crate::train::{Registry, StepResult, Trainer};

use super::checkpoint::BenchError;

/// One throughput measurement.
#[derive(Debug, Clone, Serialize)]
pub struct TrainBench {
    pub steps: u64,
    pub checkpoint_every: u64,
    pub state_bytes: u64,
    pub steps_per_s_without_checkpoints: f64,
    pub steps_per_s_with_checkpoints: f64,
    /// with / without.
    pub throughput_ratio: f64,
    pub checkpoints: u64,
    /// Mean training-thread pause per checkpoint (snapshot into host memory).
    pub stall_seconds: f64,
    /// A synchronous durable save of the same state.
    pub sync_save_seconds: f64,
    /// stall / sync save.
    pub stall_fraction_of_sync_save: f64,
    /// The throughput cost of one checkpoint every 5 minutes: stall / 300 s.
    pub overhead_at_5_min_interval: f64,
}

fn trainer_err(e: crate::train::TrainError) -> BenchError {
    BenchError::Invalid { step: 0, reason: e.to_string() }
}

fn snapshot(trainer: &Trainer, reuse: Option<Snapshot>) -> Result<Snapshot, BenchError> {
    let reuse = reuse.map(|r| (reusable(r.model), reusable(r.optimizer)));
    trainer.snapshot_reusing(reuse).map_err(trainer_err)
}

/// Trains `steps` steps twice: without checkpoints, then with one every `every` steps.
pub fn run_train_bench(
    cfg: &Config,
    registry: &Registry,
    steps: u64,
    every: u64,
    dir: PathBuf,
) -> Result<TrainBench, BenchError> {
    let io = |source| BenchError::Io { path: dir.clone(), source };
    let died =
        |d: crate::checkpoint::PersisterDied| BenchError::Io { path: dir.clone(), source: std::io::Error::other(d) };
    std::fs::create_dir_all(&dir).map_err(io)?;
    let work = tempfile::Builder::new().prefix("rekindle-bench-train-").tempdir_in(&dir).map_err(io)?;

    // Warm up (allocator, caches, CPU clocks) before either measurement.
    let mut warm = Trainer::from_registry(cfg, registry).map_err(trainer_err)?;
    for _ in 0..(steps / 10).max(1) {
        step(&mut warm)?;
    }
    drop(warm);
    let mut trainer = Trainer::from_registry(cfg, registry).map_err(trainer_err)?;
    let t0 = Instant::now();
    for _ in 0..steps {
        step(&mut trainer)?;
    }
    let without = steps as f64 / t0.elapsed().as_secs_f64();

    let store = CheckpointStore::open(work.path().join("checkpoints"), 3)?;
    let mut persister =
        Persister::spawn(store.clone(), std::sync::Arc::new(crate::checkpoint::Unwatched)).map_err(io)?;
    let mut trainer = Trainer::from_registry(cfg, registry).map_err(trainer_err)?;
    let (mut stalls, mut count) = (0.0, 0u64);
    let mut spare = None;
    let t0 = Instant::now();
    for _ in 0..steps {
        step(&mut trainer)?;
        if let Some(done) = persister.poll().map_err(died)? {
            done.result?;
            spare = done.buffers;
        }
        if every > 0 && trainer.step().is_multiple_of(every) && !persister.busy() {
            let s0 = Instant::now();
            let snap = snapshot(&trainer, spare.take())?;
            stalls += s0.elapsed().as_secs_f64();
            count += 1;
            persister.submit(snap, 0.0, None).map_err(died)?;
        }
    }
    if let Some(done) = persister.wait().map_err(died)? {
        done.result?;
        spare = done.buffers;
    }
    let with = steps as f64 / t0.elapsed().as_secs_f64();

    let snap = snapshot(&trainer, spare)?;
    let state_bytes = snap.payload_bytes();
    let sync_store = CheckpointStore::open(work.path().join("sync"), 1)?;
    let s0 = Instant::now();
    sync_store.save(&snap)?;
    let sync_save_seconds = s0.elapsed().as_secs_f64();
    let stall = if count > 0 { stalls / count as f64 } else { 0.0 };
    Ok(TrainBench {
        steps,
        checkpoint_every: every,
        state_bytes,
        steps_per_s_without_checkpoints: without,
        steps_per_s_with_checkpoints: with,
        throughput_ratio: with / without,
        checkpoints: count,
        stall_seconds: stall,
        sync_save_seconds,
        stall_fraction_of_sync_save: stall / sync_save_seconds,
        overhead_at_5_min_interval: stall / 300.0,
    })
}

fn step(trainer: &mut Trainer) -> Result<(), BenchError> {
    match trainer.train_step(&|| false).map_err(trainer_err)? {
        StepResult::Completed(_) => Ok(()),
        other => Err(BenchError::Invalid { step: trainer.step(), reason: format!("unexpected step result {other:?}") }),
    }
}

impl std::fmt::Display for TrainBench {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "training benchmark: {} steps, state {} bytes", self.steps, self.state_bytes)?;
        writeln!(f, "steps/s without checkpoints      {:>10.2}", self.steps_per_s_without_checkpoints)?;
        writeln!(
            f,
            "steps/s, checkpoint every {:>5}  {:>10.2}  ({:.1}% of the above, {} checkpoints)",
            self.checkpoint_every,
            self.steps_per_s_with_checkpoints,
            100.0 * self.throughput_ratio,
            self.checkpoints
        )?;
        writeln!(f, "stall per checkpoint (snapshot)  {:>10.6} s", self.stall_seconds)?;
        writeln!(f, "synchronous durable save          {:>10.6} s", self.sync_save_seconds)?;
        writeln!(f, "stall / synchronous save          {:>10.2}%", 100.0 * self.stall_fraction_of_sync_save)?;
        writeln!(f, "overhead at one checkpoint / 5 min {:>9.5}%", 100.0 * self.overhead_at_5_min_interval)
    }
}
