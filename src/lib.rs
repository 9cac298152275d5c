//! rekindle: a preemption-tolerant training orchestrator for SLURM clusters.
//!
//! The binary (`src/main.rs`) only parses arguments and maps results to exit
//! codes; everything else lives here, one module per concern:
//!
//! - [`bench`]: the benchmarks behind `rekindle bench`.
//! - [`config`]: the TOML config, overrides, validation with every error at once.
//! - [`confine`]: opening run-directory files without following links or blocking, reads bounded.
//! - [`checkpoint`]: the on-disk format and the crash-consistent commit protocol.
//! - [`train`]: models, optimizer, data, and the training loop's state.
//! - [`distributed`]: ranks of a data-parallel run and their collectives (MPI).
//! - [`rundir`]: the run directory: its files, atomic writes, the lock, `status`.
//! - [`attempt`]: what both drivers share: the stop, deadlines, crashes, the watchdog, devices.
//! - [`run`]: the candle driver (`rekindle run`): its phases and its ranks.
//! - [`exec`]: the child-program driver (`rekindle exec`, `rekindle seal`).
//! - [`publish`]: git-publishing results on exit.
//! - [`slurm`]: the allocation, the requeue decision, `scontrol`.
//! - [`gpu`]: GPU detection, visibility, placement, monitoring.
//! - [`doctor`]: whether the machine is ready for a run (`rekindle doctor`).
//! - [`telemetry`]: logging setup, the run's event records, reading them back.
//! - [`report`]: the HTML report of a run (`rekindle report`).
//! - [`cli`]: the command line and what each subcommand does.
//! - [`exit`]: the exit-code contract.
//! - [`units`]: byte counts as people read them.

pub mod attempt;
pub mod bench;
pub mod checkpoint;
pub mod cli;
pub mod config;
pub mod distributed;
pub mod doctor;
pub mod exec;
pub mod exit;
pub mod gpu;
pub mod health;
pub mod publish;
pub mod report;
pub mod run;
pub mod rundir;
pub mod slurm;
pub mod telemetry;
pub mod train;

// The layers beside the application (crates/), under the names the
// application has always used for them.
pub use rekindle_confine as confine;
pub use rekindle_units as units;

#[cfg(test)]
use rekindle_fuzz as fuzz;
