//! Benchmarks behind `rekindle bench`: performance claims are measured here,
//! never in timed unit tests. Results go to docs/performance.md with the
//! command that produced them.

mod board;
mod checkpoint;
mod collective;
mod interval;
mod liveness;
mod train;

pub use board::{BoardBench, BoardBenchError, BoardBenchOptions, BoardRow, run_board_bench};
pub use checkpoint::{
    BenchError, CheckpointBench, CheckpointBenchOptions, Stats, run_checkpoint_bench, synthetic_state,
};
pub use collective::{CollectiveBench, CollectiveBenchError, run_collective_bench};
pub use interval::{IntervalBench, IntervalBenchOptions, IntervalRow, run_interval_bench};
pub use liveness::{LivenessBench, LivenessBenchError, LivenessBenchOptions, LivenessRow, run_liveness_bench};
pub use train::{TrainBench, run_train_bench};
