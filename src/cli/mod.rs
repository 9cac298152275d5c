//! The command line. This file is the whole program's `main` ([`main_with`]:
//! parse, run, print the error, map the outcome to an exit code of the
//! contract in [`crate::exit`]), the top-level [`Cli`] and its [`Command`]s,
//! and the dispatch from a command to its handler. [`main_with`] is the
//! `rekindle` binary's `main` over the built-in models, and a user's own
//! binary's over its own [`Registry`] (`docs/workloads.md`).
//!
//! The rest is split by what a file owns, not by command:
//! - `args`: every subcommand's flags (raw clap definitions), one file so
//!   that a flag several commands share is defined once;
//! - `output`: stdout/stderr writing that never panics, and `--json` output;
//! - handlers, one file per concept, each turning flags into library calls
//!   and user-facing output: `run` (run, exec, seal: the drivers), `inspect`
//!   (verify, checkpoints, report: reading a run directory), `status`
//!   (one run, or a line per run over many),
//!   `data` (data validate), `preflight` (gpus, doctor: what a machine
//!   offers before submitting) and `bench` (bench ...).

#[macro_use]
mod output;
mod args;
mod bench;
mod data;
mod inspect;
mod preflight;
mod run;
mod status;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub use self::args::{
    BenchCheckpointArgs, BenchCollectiveArgs, BenchCommand, BenchIntervalArgs, BenchTrainArgs, CheckpointsArgs,
    DataCommand, DoctorArgs, ExecArgs, GpuPlanArgs, GpusArgs, JsonFlag, ReportArgs, RunArgs, RunDirArg, SealArgs,
    SetFlags, StatusArgs, ValidateArgs, VerifyArgs,
};
use crate::attempt::RunError;
use crate::checkpoint::MANIFEST_FILE;
use crate::exit::{EXIT_CODES_HELP, Outcome};
use crate::telemetry::{LogFormat, LogOptions, init_logging, report_lost_log_lines};
use crate::train::Registry;

/// rekindle: training runs that survive preemption, time limits and node loss.
///
/// Run `rekindle run --config FILE` inside a SLURM allocation (or anywhere):
/// it checkpoints periodically and on SIGTERM/SIGINT/SIGUSR1/SIGUSR2, and
/// resumes bit-exactly from the newest checkpoint that verifies.
#[derive(Debug, Parser)]
#[command(name = "rekindle", version, after_help = EXIT_CODES_HELP, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// More log detail (-v debug, -vv trace). RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    /// Only warnings and errors.
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    pub quiet: bool,
    /// Log line format on stderr.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
}

impl Cli {
    /// Logging options chosen on the command line.
    pub fn log_options(&self) -> LogOptions {
        LogOptions { verbose: self.verbose, quiet: self.quiet, format: self.log_format }
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Train (or resume) the run described by a config file.
    ///
    /// Loads and validates the config (every problem reported at once), prepares
    /// the run directory, resumes from the newest checkpoint that verifies, and
    /// trains to `[run] max_steps`. Exit 0 when finished, 75 when stopped with a
    /// durable checkpoint (run the same command again to continue).
    #[command(after_help = EXIT_CODES_HELP)]
    Run(RunArgs),
    /// Run any training program (PyTorch, JAX, numpy, a shell script) with the
    /// same preemption safety as `run`: `rekindle exec --run-dir runs/x -- python train.py`.
    ///
    /// rekindle locks the run directory, starts the program in its own process
    /// group and tells it, in its environment: REKINDLE_RESUME_FROM (the newest
    /// checkpoint that verifies; unset on a fresh start), REKINDLE_CHECKPOINT_DIR
    /// (stage a checkpoint in a fresh directory there, then run
    /// `$REKINDLE_BIN seal DIR --step N`), REKINDLE_STOP_FILE (appears on a stop,
    /// with the deadline), REKINDLE_DEADLINE, REKINDLE_RUN_DIR, REKINDLE_EXEC_PROTOCOL=1.
    ///
    /// On SIGTERM/SIGINT/SIGUSR1/SIGUSR2 the stop file is written and the program's
    /// whole process group gets SIGTERM at once; still running at the deadline
    /// ([signals] grace minus safety_margin) it is killed and the last sealed
    /// checkpoint stands. Exit 0 when the program exits 0 unasked; 75 after a stop
    /// with a durable checkpoint (the job is requeued as for `run`); 1 when the
    /// program crashed (classified and requeued when transient). The program dies
    /// with rekindle. python/rekindle_client.py wraps the contract; docs/exec.md
    /// describes it.
    #[command(after_help = EXIT_CODES_HELP)]
    Exec(ExecArgs),
    /// Seal a directory the program staged into a checkpoint: fsync and SHA-256
    /// every file, write the manifest, commit by rename, rotate (keep
    /// [checkpoint] keep, never the newest valid one).
    ///
    /// DIR must be a fresh directory directly under REKINDLE_CHECKPOINT_DIR
    /// holding only plain files, and N newer than the newest checkpoint. Under
    /// `rekindle exec` the run directory comes from REKINDLE_RUN_DIR. Prints the
    /// checkpoint's directory; exit 1 (nothing sealed, DIR left as it was) with
    /// the reason otherwise.
    ///
    /// In a distributed program every rank seals each checkpoint's step with
    /// `--rank R --world-size W`: its DIR (maybe empty) is its part; rank 0
    /// commits the world's checkpoint once every part is in, under one
    /// manifest (docs/exec.md, "Distributed programs").
    Seal(SealArgs),
    /// Verify checkpoints: every file's size and SHA-256 against its manifest.
    ///
    /// PATH is one checkpoint directory (`.../checkpoints/step-0000001234`), a
    /// checkpoints directory, or a run directory (then every checkpoint in it).
    /// Exit 0 when everything verifies, 1 otherwise, naming each failing file
    /// and why. Quarantined checkpoints (`checkpoints/quarantine/`, moved
    /// there when they failed verification at resume) are reported, but do
    /// not make it fail.
    Verify(VerifyArgs),
    /// List a run's checkpoints: step, time, size, and whether each verifies;
    /// then the quarantined ones, with why they failed.
    Checkpoints(CheckpointsArgs),
    /// One screen about a run: state, progress, loss, checkpoints, last stop,
    /// requeue and publish; or, over many run directories (`rekindle status
    /// runs/*`), one line per run, filtered by state and sorted, with
    /// `--watch` to refresh in place (reads only the run directories).
    ///
    /// A directory that is not a run (another program's, a file) is shown
    /// as `foreign`, one whose run cannot be read (config.toml missing or
    /// damaged) as `damaged`, each with the reason; neither is an error.
    Status(StatusArgs),
    /// Write one self-contained HTML report of a run: loss, learning rate,
    /// throughput and GPU charts with every checkpoint, signal, requeue and
    /// resume marked, and a table of attempts. Opens offline (no script, no
    /// network); reads only the run directory.
    Report(ReportArgs),
    /// Dataset tools.
    #[command(subcommand)]
    Data(DataCommand),
    /// GPUs visible to this job and the placement plan a run of the config would use.
    ///
    /// Honours CUDA_VISIBLE_DEVICES, ROCR/HIP_VISIBLE_DEVICES and SLURM_JOB_GPUS.
    /// `--inventory FILE` describes GPUs as JSON instead of probing, to see the
    /// plan for the node you are about to request:
    /// {"devices": [{"vendor": "nvidia", "name": "H100", "memory_total_mib": 81559, "memory_free_mib": 80000}]}
    Gpus(GpusArgs),
    /// Pre-flight checks before submitting (or at the top of the sbatch script):
    /// SLURM, GPUs, a tiny matmul, the config; then the node checks every
    /// attempt makes before it starts: GPUs as allotted, free device memory,
    /// GPU health counters (ECC, retired pages, remapped rows, throttling),
    /// the run directory seen from here, clock skew, free disk, a checkpoint
    /// round-trip and the site's `[health] command`. What the driver does not
    /// report is listed as not checked. Exit 1 if a required check fails.
    Doctor(DoctorArgs),
    /// Benchmarks (numbers for docs/performance.md).
    #[command(subcommand)]
    Bench(BenchCommand),
}

/// Errors of the command-line layer, each with its exit code.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Run(#[from] RunError),
    #[error(
        "{path}: no checkpoints here: expected a checkpoint directory (with {MANIFEST_FILE}), a checkpoints directory (with step-* directories) or a run directory (with checkpoints/)"
    )]
    NotACheckpointPath { path: PathBuf },
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Train(#[from] crate::train::TrainError),
    #[error(transparent)]
    Gpu(#[from] crate::gpu::GpuError),
    #[error(transparent)]
    Bench(#[from] crate::bench::BenchError),
    #[error(transparent)]
    CollectiveBench(#[from] crate::bench::CollectiveBenchError),
    #[error(transparent)]
    LivenessBench(#[from] crate::bench::LivenessBenchError),
    #[error(transparent)]
    BoardBench(#[from] crate::bench::BoardBenchError),
    #[error(transparent)]
    Report(#[from] crate::report::ReportError),
    #[error("{path} is not a run directory (no {file}); pass the directory `rekindle run` wrote to")]
    NotARunDir { path: PathBuf, file: &'static str },
}

impl CliError {
    pub fn outcome(&self) -> Outcome {
        match self {
            CliError::Run(e) => e.outcome(),
            CliError::Config(_) => Outcome::ConfigError,
            _ => Outcome::Failure,
        }
    }
}

/// The whole `rekindle` command line (run, verify, checkpoints, status,
/// report, gpus, doctor, bench, data) for the model kinds of `registry`:
/// parses the process's arguments, runs the command, prints an error, and
/// returns the exit code of the contract in [`crate::exit`].
///
/// The `rekindle` binary is `main_with(Registry::builtin())`; a program with
/// models of its own registers them:
///
/// ```no_run
/// # use std::process::ExitCode;
/// # use rekindle::train::{Registry, MlpWorkload};
/// fn main() -> ExitCode {
///     rekindle::cli::main_with(Registry::builtin().with("my-mlp", |cfg, _: ()| MlpWorkload::from_config(cfg)))
/// }
/// ```
pub fn main_with(registry: Registry) -> ExitCode {
    let cli = Cli::parse();
    // Failpoints are compiled in only for test builds; this reads FAILPOINTS.
    let _failpoints = fail::FailScenario::setup();
    init_logging(cli.log_options());
    let result = execute(cli, &registry);
    report_lost_log_lines();
    output::warn_if_stdout_lost();
    match result {
        Ok(outcome) => outcome.into(),
        Err(e) => {
            let outcome = e.outcome();
            // Every error message already names its cause (the `{source}` is
            // part of each message), so print the top-level Display only:
            // walking the source chain as well would repeat the causes.
            errln!("error: {e}");
            outcome.into()
        }
    }
}

/// Runs the parsed command, building models from `registry`.
pub fn execute(cli: Cli, registry: &Registry) -> Result<Outcome, CliError> {
    match cli.command {
        Command::Run(args) => run::run(args, registry),
        Command::Exec(args) => run::exec(args),
        Command::Seal(args) => run::seal(args),
        Command::Verify(args) => inspect::verify(&args.path, args.output.json),
        Command::Checkpoints(args) => inspect::checkpoints(&args.dir.run_dir, args.output.json),
        Command::Status(args) => status::status(&args),
        Command::Report(args) => inspect::report(&args),
        Command::Data(DataCommand::Validate(args)) => data::validate(&args),
        Command::Gpus(args) => preflight::gpus(&args, registry),
        Command::Doctor(args) => preflight::doctor(&args, registry),
        Command::Bench(BenchCommand::Checkpoint(args)) => bench::checkpoint(&args),
        Command::Bench(BenchCommand::Train(args)) => bench::train(&args, registry),
        Command::Bench(BenchCommand::Collective(args)) => bench::collective(&args),
        Command::Bench(BenchCommand::Interval(args)) => bench::interval(&args),
        Command::Bench(BenchCommand::Liveness(args)) => bench::liveness(&args),
        Command::Bench(BenchCommand::Board(args)) => bench::board(&args),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }
}
