//! The command line: clap definitions (raw flags) and one function per
//! subcommand that turns validated arguments into library calls and
//! user-facing output. [`main_with`] is a whole program's `main`: the
//! `rekindle` binary's over the built-in models, and a user's own binary's
//! over its own [`Registry`] (`docs/workloads.md`). It parses and maps the
//! result to an exit code (see [`crate::exit`]).

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::OnceLock;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use serde::Serialize;

use crate::attempt::RunError;
use crate::checkpoint::{
    CheckpointInfo, CheckpointStore, MANIFEST_FILE, QUARANTINE_DIR, VerifyLevel, parse_quarantine_name,
    parse_step_dir_name,
};
use crate::config;
use crate::exit::{EXIT_CODES_HELP, Outcome};
use crate::run::RunOptions;
use crate::telemetry::{LogFormat, LogOptions, init_logging, report_lost_log_lines};
use crate::train::Registry;
use crate::units::human_bytes;
use crate::{exec, rundir};

/// `print!` to stdout through [`write_out`]: cannot panic.
macro_rules! out {
    ($($arg:tt)*) => { write_out(format_args!($($arg)*)) };
}

/// `println!` to stdout through [`write_out`]: cannot panic.
macro_rules! outln {
    ($($arg:tt)*) => { write_out(format_args!("{}\n", format_args!($($arg)*))) };
}

/// `eprintln!` through [`write_err`]: cannot panic.
macro_rules! errln {
    ($($arg:tt)*) => { write_err(format_args!("{}\n", format_args!($($arg)*))) };
}

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
    /// requeue and publish (reads only the run directory).
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
    /// SLURM, GPUs, a tiny matmul, free disk, a checkpoint round-trip, the config.
    /// Exit 1 if a required check fails.
    Doctor(DoctorArgs),
    /// Benchmarks (numbers for docs/performance.md).
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Save, load+verify, verify and snapshot stall of synthetic state of SIZE
    /// (parameters in candle variables and AdamW moments, as between two
    /// training steps), beside `dd bs=8M conv=fsync` of the same bytes on the
    /// same filesystem.
    Checkpoint(BenchCheckpointArgs),
    /// Training throughput of a config with checkpoints off and every N steps,
    /// the stall per checkpoint, and a synchronous save of the same state.
    Train(BenchTrainArgs),
    /// The gradient sum of a data-parallel step on every rank of a world,
    /// timed and checked bit for bit: launch it as the ranks, e.g.
    /// `mpirun -n 2 rekindle bench collective --bytes 64MiB` or
    /// `srun -n 2 --mpi=pmix rekindle bench collective` (needs the `mpi`
    /// feature for more than one rank). Rank 0 prints.
    Collective(BenchCollectiveArgs),
    /// Expected work lost with `[checkpoint] interval = "auto"` (Young/Daly,
    /// bounded) versus a fixed interval, over a range of mean times between
    /// interruptions: a seeded Monte-Carlo simulation, no training.
    Interval(BenchIntervalArgs),
}

#[derive(Debug, Args)]
pub struct BenchIntervalArgs {
    /// Training time each checkpoint costs: its stall plus the slowdown of
    /// the steps trained while it is written (e.g. 5s, 700us).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5s")]
    pub stall: Duration,
    /// Time for a snapshot to be written and committed in the background.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
    pub persist: Duration,
    /// Training the simulated job needs.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "7days")]
    pub work: Duration,
    /// The fixed interval compared against.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5m")]
    pub fixed: Duration,
    /// Mean times between interruptions, comma-separated.
    #[arg(long, value_parser = humantime::parse_duration, value_delimiter = ',', default_value = "15m,30m,1h,2h,6h,12h,1day,3days")]
    pub mtbf: Vec<Duration>,
    /// Simulated jobs per cell.
    #[arg(long, default_value_t = 200)]
    pub runs: u32,
    /// Seed of the simulation.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct BenchCollectiveArgs {
    /// Size of the summed vector (f32): bytes, or with a unit (64MiB, 1GiB).
    #[arg(long, value_parser = parse_size, default_value = "16MiB")]
    pub bytes: u64,
    /// Timed repetitions (the median is reported).
    #[arg(long, default_value_t = 10)]
    pub iterations: usize,
    /// Print JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct BenchTrainArgs {
    /// The config to train (e.g. configs/tiny.toml).
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: PathBuf,
    /// Override config keys, as for `run`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
    /// Steps per measurement.
    #[arg(long, default_value_t = 500)]
    pub steps: u64,
    /// Checkpoint every this many steps in the second measurement.
    #[arg(long, default_value_t = 50)]
    pub every: u64,
    /// Directory for the checkpoints.
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
    /// Print JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct BenchCheckpointArgs {
    /// State size: bytes, or with a unit (256MiB, 1GiB, 4GiB).
    #[arg(long, value_parser = parse_size)]
    pub bytes: u64,
    /// Directory on the filesystem to measure.
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
    /// Repetitions (medians are reported).
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// Drop the page cache before reads (root only) to measure cold loads.
    #[arg(long)]
    pub cold: bool,
    /// Print JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Parses `1GiB`, `256MiB`, `512k`, `1000000`.
fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("`{text}` is not a size: write e.g. 1GiB, 256MiB or 1048576"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "kb" => 1000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        other => return Err(format!("unknown size unit `{other}`: use B, KiB, MiB, GiB, KB, MB or GB")),
    };
    Ok((n * mult as f64) as u64)
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The run directory.
    pub run_dir: PathBuf,
    /// Print JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// The run directory.
    pub run_dir: PathBuf,
    /// Where to write the HTML (default: `<run dir>/report.html`).
    #[arg(long, value_name = "FILE.html")]
    pub out: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum DataCommand {
    /// Check every line of a JSONL dataset and report problems with line numbers.
    ///
    /// Reports JSON parse errors, missing/empty/non-string text fields,
    /// invalid UTF-8, NUL and control characters, and over-long records, with
    /// counts, the first example lines, and the length distribution. Exit 0
    /// when clean, 1 when any line is invalid.
    Validate(ValidateArgs),
}

#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// The JSONL file.
    pub file: PathBuf,
    /// Name of the text field of each record.
    #[arg(long, default_value = "text")]
    pub field: String,
    /// Records with more bytes of text than this are invalid (0: no limit).
    #[arg(long, default_value_t = 0)]
    pub max_len: usize,
    /// Also write a cleaned copy here (valid lines byte for byte).
    #[arg(long, value_name = "CLEAN.jsonl")]
    pub out: Option<PathBuf>,
    /// With --out: cut over-long records to --max-len instead of dropping them.
    #[arg(long, requires = "out")]
    pub truncate: bool,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct GpusArgs {
    /// Plan for this config's model and batch (default: the built-in defaults).
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Describe GPUs with a JSON inventory instead of probing this machine.
    #[arg(long, value_name = "FILE")]
    pub inventory: Option<PathBuf>,
    /// Print JSON on stdout (`devices`, `plan`, `notes`).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Check this config (and its checkpoint directory and publish remote).
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Describe GPUs with a JSON inventory instead of probing.
    #[arg(long, value_name = "FILE")]
    pub inventory: Option<PathBuf>,
    /// Print JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The TOML config (see configs/example.toml for every key).
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: PathBuf,
    /// Run directory (default: `[run] dir`, else `runs/<run name>`).
    #[arg(long, value_name = "DIR")]
    pub run_dir: Option<PathBuf>,
    /// Override a config key, typed as in TOML: `--set run.max_steps=500`,
    /// `--set checkpoint.interval=30s`, `--set model.hidden=[64,64]`, a registered
    /// model's own setting `--set model.settings.channels=16` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
    /// Resume even if training settings differ from those of the run
    /// directory's config.toml or of the checkpoint resumed from.
    #[arg(long)]
    pub allow_config_change: bool,
    /// Stop after step K as if told to stop: checkpoint step K, exit 75 (when
    /// K >= max_steps the run finishes instead: final checkpoint, exit 0).
    #[arg(long, value_name = "K")]
    pub stop_at_step: Option<u64>,
}

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// A TOML config ([run], [checkpoint] keep, [signals], [publish], [lock],
    /// [gpu] monitor_interval apply; see configs/example.toml). Without one,
    /// every default.
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Run directory (default: `[run] dir`, else `runs/<run name>`); needed without --config.
    #[arg(long, value_name = "DIR", required_unless_present = "config")]
    pub run_dir: Option<PathBuf>,
    /// Override a config key, typed as in TOML: `--set signals.grace=30s` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
    /// Go on even if settings differ from the run directory's config.toml.
    #[arg(long)]
    pub allow_config_change: bool,
    /// The program and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<std::ffi::OsString>,
}

#[derive(Debug, Args)]
pub struct SealArgs {
    /// The staged directory (directly under REKINDLE_CHECKPOINT_DIR).
    pub dir: PathBuf,
    /// The program's step this checkpoint holds (newer than the newest checkpoint).
    #[arg(long)]
    pub step: u64,
    /// The run directory (default: REKINDLE_RUN_DIR, set by `rekindle exec`).
    #[arg(long, value_name = "DIR")]
    pub run_dir: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// A checkpoint directory, a checkpoints directory or a run directory.
    pub path: PathBuf,
    /// Print a JSON report on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct CheckpointsArgs {
    /// The run directory (or a checkpoints directory).
    pub run_dir: PathBuf,
    /// Print JSON on stdout.
    #[arg(long)]
    pub json: bool,
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
    if let Some(e) = STDOUT_ERROR.get()
        && e.kind() != io::ErrorKind::BrokenPipe
    {
        errln!(
            "warning: this command's output could not be written to stdout ({e}) and is incomplete: run it again with stdout somewhere it can be written"
        );
    }
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

/// The first error writing the command's output to stdout; output after it
/// is dropped.
static STDOUT_ERROR: OnceLock<io::Error> = OnceLock::new();

/// Writes the command's output to stdout, never panicking (as `print!` does
/// on a closed pipe or a full disk): once a write fails, that error is kept
/// and later output dropped. A reader that went away (`rekindle status |
/// head -1`) ends the output quietly; any other failure is told on stderr as
/// the command ends. Either way the exit code stays the command's own: it
/// reports what the command found or did, not whether it could be printed.
fn write_out(args: std::fmt::Arguments<'_>) {
    if STDOUT_ERROR.get().is_some() {
        return;
    }
    let mut stdout = io::stdout().lock();
    if let Err(e) = stdout.write_fmt(args).and_then(|()| stdout.flush()) {
        let _ = STDOUT_ERROR.set(e);
    }
}

/// Writes a message to stderr, never panicking (as `eprintln!` does when
/// stderr cannot be written): a message that cannot be written is dropped.
fn write_err(args: std::fmt::Arguments<'_>) {
    let _ = io::stderr().write_fmt(args);
}

/// Runs the parsed command, building models from `registry`.
pub fn execute(cli: Cli, registry: &Registry) -> Result<Outcome, CliError> {
    match cli.command {
        Command::Run(args) => run(args, registry),
        Command::Exec(args) => exec(args),
        Command::Seal(args) => seal(args),
        Command::Verify(args) => verify(&args.path, args.json),
        Command::Checkpoints(args) => checkpoints(&args.run_dir, args.json),
        Command::Status(args) => status(&args.run_dir, args.json),
        Command::Report(args) => report(&args),
        Command::Data(DataCommand::Validate(args)) => data_validate(&args),
        Command::Gpus(args) => gpus(&args, registry),
        Command::Doctor(args) => doctor(&args, registry),
        Command::Bench(BenchCommand::Checkpoint(args)) => bench_checkpoint(&args),
        Command::Bench(BenchCommand::Train(args)) => bench_train(&args, registry),
        Command::Bench(BenchCommand::Collective(args)) => bench_collective(&args),
        Command::Bench(BenchCommand::Interval(args)) => bench_interval(&args),
    }
}

fn status(dir: &Path, json: bool) -> Result<Outcome, CliError> {
    if !dir.join(rundir::CONFIG_FILE).is_file() {
        return Err(CliError::NotARunDir { path: dir.to_path_buf(), file: rundir::CONFIG_FILE });
    }
    let st = rundir::status(dir);
    emit(&st, json);
    Ok(Outcome::Done)
}

fn report(args: &ReportArgs) -> Result<Outcome, CliError> {
    let path = crate::report::write_report(&args.run_dir, args.out.as_deref())?;
    outln!("wrote {}", path.display());
    Ok(Outcome::Done)
}

fn data_validate(args: &ValidateArgs) -> Result<Outcome, CliError> {
    use crate::train::{CleanMode, ValidateOptions, validate_file, write_clean};
    let opts = ValidateOptions { field: args.field.clone(), max_len: args.max_len, ..ValidateOptions::default() };
    let report = validate_file(&args.file, &opts)?;
    emit(&report, args.json);
    if let Some(out) = &args.out {
        let mode = if args.truncate { CleanMode::Truncate } else { CleanMode::Drop };
        let summary = write_clean(&args.file, out, &opts, mode)?;
        errln!(
            "wrote {}: {} lines kept, {} truncated, {} dropped",
            out.display(),
            summary.kept,
            summary.truncated,
            summary.dropped
        );
    }
    Ok(if report.is_clean() { Outcome::Done } else { Outcome::Failure })
}

/// The config to plan for: the given file, or the defaults.
fn config_or_default(path: Option<&Path>, registry: &Registry) -> Result<config::Config, CliError> {
    Ok(match path {
        Some(p) => config::load_with(p, &[], registry)?.config,
        None => config::Config::default(),
    })
}

fn gpus(args: &GpusArgs, registry: &Registry) -> Result<Outcome, CliError> {
    let cfg = config_or_default(args.config.as_deref(), registry)?;
    let report = crate::gpu::gpus_report(args.inventory.as_deref(), &cfg, crate::train::footprint(&cfg, registry)?)?;
    emit(&report, args.json);
    Ok(Outcome::Done)
}

fn bench_checkpoint(args: &BenchCheckpointArgs) -> Result<Outcome, CliError> {
    let opts = crate::bench::CheckpointBenchOptions {
        bytes: args.bytes,
        dir: args.dir.clone(),
        repeat: args.repeat,
        cold: args.cold,
    };
    let result = crate::bench::run_checkpoint_bench(&opts)?;
    emit(&result, args.json);
    Ok(Outcome::Done)
}

fn bench_train(args: &BenchTrainArgs, registry: &Registry) -> Result<Outcome, CliError> {
    let cfg = config::load_with(&args.config, &args.overrides, registry)?.config;
    let result = crate::bench::run_train_bench(&cfg, registry, args.steps, args.every, args.dir.clone())?;
    emit(&result, args.json);
    Ok(Outcome::Done)
}

fn bench_collective(args: &BenchCollectiveArgs) -> Result<Outcome, CliError> {
    if let Some(result) = crate::bench::run_collective_bench(args.bytes, args.iterations)? {
        emit(&result, args.json);
    }
    Ok(Outcome::Done)
}

fn bench_interval(args: &BenchIntervalArgs) -> Result<Outcome, CliError> {
    let opts = crate::bench::IntervalBenchOptions {
        stall: args.stall,
        persist: args.persist,
        work: args.work,
        fixed: args.fixed,
        mtbfs: args.mtbf.clone(),
        runs: args.runs,
        seed: args.seed,
    };
    emit(&crate::bench::run_interval_bench(&opts), args.json);
    Ok(Outcome::Done)
}

fn doctor(args: &DoctorArgs, registry: &Registry) -> Result<Outcome, CliError> {
    let cfg = args.config.as_deref().map(|p| config::load_with(p, &[], registry)).transpose()?.map(|l| l.config);
    // The checks `rekindle run` makes before it starts (its model builds,
    // its data loads), on the trainer whose parameters the footprint counts.
    let checked = cfg.clone().unwrap_or_default();
    let trainer = registry.checked_workload(&checked).and_then(|w| crate::train::Trainer::with_workload(&checked, w));
    let (fp, workload_error) = match trainer {
        Ok(trainer) => (Some(crate::train::footprint_for(&checked, trainer.param_count())), None),
        // Without a config the defaults are only the backdrop of the checks.
        Err(e) => (None, cfg.as_ref().map(|_| e.to_string())),
    };
    let opts = crate::doctor::DoctorOptions {
        inventory: args.inventory.clone(),
        footprint: fp,
        expected_checkpoint_bytes: None,
        workload_error,
    };
    let list = crate::doctor::doctor(cfg.as_ref(), &opts);
    emit(&list, args.json);
    Ok(if list.any_required_failed() { Outcome::Failure } else { Outcome::Done })
}

fn run(args: RunArgs, registry: &Registry) -> Result<Outcome, CliError> {
    let opts = RunOptions {
        registry: registry.clone(),
        config_path: args.config,
        overrides: args.overrides,
        run_dir: args.run_dir,
        allow_config_change: args.allow_config_change,
        stop_at_step: args.stop_at_step,
    };
    Ok(crate::run::run(&opts)?)
}

fn exec(args: ExecArgs) -> Result<Outcome, CliError> {
    let opts = exec::ExecOptions {
        config_path: args.config,
        overrides: args.overrides,
        run_dir: args.run_dir,
        allow_config_change: args.allow_config_change,
        command: args.command,
    };
    Ok(exec::exec(&opts)?)
}

fn seal(args: SealArgs) -> Result<Outcome, CliError> {
    let opts = exec::SealOptions { staged: args.dir, step: args.step, run_dir: args.run_dir };
    let dir = exec::seal(&opts)?;
    outln!("{}", dir.display());
    Ok(Outcome::Done)
}

/// What a verify/checkpoints PATH points at.
enum Target {
    One(PathBuf),
    Store(PathBuf),
}

fn resolve_target(path: &Path) -> Result<Target, CliError> {
    let is_step_dir = path.file_name().and_then(|n| parse_step_dir_name(&n.to_string_lossy())).is_some();
    if path.join(MANIFEST_FILE).exists() || (is_step_dir && path.is_dir()) {
        return Ok(Target::One(path.to_path_buf()));
    }
    let run_config = path.join(rundir::CONFIG_FILE);
    if run_config.is_file()
        && let Ok(loaded) = config::load_with(&run_config, &[], &config::AnyKind)
    {
        return Ok(Target::Store(rundir::checkpoints_dir(path, &loaded.config)));
    }
    if path.join(rundir::CHECKPOINTS_DIR).is_dir() {
        return Ok(Target::Store(path.join(rundir::CHECKPOINTS_DIR)));
    }
    if path.is_dir()
        && (path.join(QUARANTINE_DIR).is_dir()
            || std::fs::read_dir(path)
                .map(|rd| rd.flatten().any(|e| parse_step_dir_name(&e.file_name().to_string_lossy()).is_some()))
                .unwrap_or(false))
    {
        return Ok(Target::Store(path.to_path_buf()));
    }
    Err(CliError::NotACheckpointPath { path: path.to_path_buf() })
}

/// The checkpoints a verify/checkpoints PATH holds, and the quarantined ones
/// beside them (none when PATH is one checkpoint).
struct Listing {
    checkpoints: Vec<CheckpointInfo>,
    quarantined: Vec<CheckpointInfo>,
    /// Entries named like checkpoints that are not rekindle's (`CheckpointStore::strays`).
    strays: Vec<PathBuf>,
}

fn infos_for(path: &Path) -> Result<Listing, CliError> {
    Ok(match resolve_target(path)? {
        Target::One(dir) => {
            let step = dir
                .file_name()
                .and_then(|n| {
                    let name = n.to_string_lossy();
                    parse_step_dir_name(&name).or_else(|| parse_quarantine_name(&name))
                })
                .or_else(|| crate::checkpoint::read_manifest(&dir).ok().map(|m| m.step))
                .unwrap_or(0);
            let failures = crate::checkpoint::verify_checkpoint_dir(&dir, VerifyLevel::Full);
            let manifest = crate::checkpoint::read_manifest(&dir).ok();
            let info = CheckpointInfo {
                step,
                created_at: manifest.as_ref().map(|m| m.created_at.clone()),
                bytes: manifest.as_ref().map(|m| m.total_bytes()).unwrap_or(0),
                valid: failures.is_empty(),
                failures,
                dir,
            };
            Listing { checkpoints: vec![info], quarantined: Vec::new(), strays: Vec::new() }
        }
        Target::Store(dir) => {
            let store = CheckpointStore::open_read_only(dir);
            Listing {
                checkpoints: store.list(VerifyLevel::Full)?,
                quarantined: store.list_quarantined(VerifyLevel::Full)?,
                strays: store.strays()?,
            }
        }
    })
}

#[derive(Serialize)]
struct VerifyJson<'a> {
    path: &'a Path,
    /// Every checkpoint verifies (quarantined ones do not count: they are
    /// not checkpoints of the run any more).
    all_valid: bool,
    checkpoints: &'a [CheckpointInfo],
    quarantined: &'a [CheckpointInfo],
    /// Entries named like checkpoints that are not rekindle's, left alone.
    strays: &'a [PathBuf],
}

/// The reasons a checkpoint fails, in one line.
fn reasons(info: &CheckpointInfo) -> String {
    info.failures.iter().map(|f| f.to_string()).collect::<Vec<_>>().join("; ")
}

/// The lines that tell about entries named like checkpoints that rekindle
/// did not make (none when there are none).
fn print_strays(strays: &[PathBuf]) {
    if strays.is_empty() {
        return;
    }
    outln!(
        "{} entr{} named like checkpoints but not rekindle's (not a step-<10 digits> directory): never loaded, counted or rotated, left alone:",
        strays.len(),
        if strays.len() == 1 { "y" } else { "ies" }
    );
    for path in strays {
        outln!("      {}", path.display());
    }
}

/// The lines that tell about quarantined checkpoints (empty when there are none).
fn print_quarantined(quarantined: &[CheckpointInfo]) {
    if quarantined.is_empty() {
        return;
    }
    outln!(
        "{} quarantined checkpoint(s): they failed verification when a run resumed and were moved aside; never loaded or rotated, kept for inspection (delete them with `rm -r`, or move one back under its step- name once repaired):",
        quarantined.len()
    );
    for info in quarantined {
        let status = if info.valid { "verifies now".to_string() } else { reasons(info) };
        outln!("{:>10}  {}  {status}", info.step, info.dir.display());
    }
}

fn verify(path: &Path, json: bool) -> Result<Outcome, CliError> {
    let Listing { checkpoints: infos, quarantined, strays } = infos_for(path)?;
    let all_valid = infos.iter().all(|i| i.valid);
    if json {
        let report = VerifyJson { path, all_valid, checkpoints: &infos, quarantined: &quarantined, strays: &strays };
        outln!("{}", serde_json::to_string_pretty(&report).expect("report serialises"));
    } else {
        if infos.is_empty() {
            outln!("{}: no checkpoints yet", path.display());
        }
        for info in &infos {
            if info.valid {
                outln!("OK    {}  ({})", info.dir.display(), human_bytes(info.bytes));
            } else {
                outln!("FAIL  {}", info.dir.display());
                for f in &info.failures {
                    outln!("      {f}");
                }
            }
        }
        let good = infos.iter().filter(|i| i.valid).count();
        if !infos.is_empty() {
            outln!("{good} of {} checkpoint(s) verify", infos.len());
        }
        print_quarantined(&quarantined);
        print_strays(&strays);
    }
    Ok(if all_valid { Outcome::Done } else { Outcome::Failure })
}

fn checkpoints(path: &Path, json: bool) -> Result<Outcome, CliError> {
    let Listing { checkpoints: infos, quarantined, strays } = infos_for(path)?;
    let resume_step = infos.iter().find(|i| i.valid).map(|i| i.step);
    if json {
        #[derive(Serialize)]
        struct ListJson<'a> {
            resume_step: Option<u64>,
            checkpoints: &'a [CheckpointInfo],
            quarantined: &'a [CheckpointInfo],
            strays: &'a [PathBuf],
        }
        let list = ListJson { resume_step, checkpoints: &infos, quarantined: &quarantined, strays: &strays };
        outln!("{}", serde_json::to_string_pretty(&list).unwrap());
        return Ok(Outcome::Done);
    }
    if infos.is_empty() {
        outln!("no checkpoints in {}", path.display());
    } else {
        outln!("{:>10}  {:<24}  {:>10}  status", "step", "created", "size");
    }
    for info in &infos {
        let status = if info.valid {
            if Some(info.step) == resume_step { "valid (resume point)".to_string() } else { "valid".to_string() }
        } else {
            format!("INVALID: {}", reasons(info))
        };
        outln!(
            "{:>10}  {:<24}  {:>10}  {status}",
            info.step,
            info.created_at.as_deref().unwrap_or("-"),
            human_bytes(info.bytes)
        );
    }
    print_quarantined(&quarantined);
    print_strays(&strays);
    Ok(Outcome::Done)
}

/// Prints `value` as pretty JSON (`--json`) or as its human-readable Display.
fn emit<T: Serialize + std::fmt::Display>(value: &T, json: bool) {
    if json {
        outln!("{}", serde_json::to_string_pretty(value).expect("command output serialises"));
    } else {
        out!("{value}");
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
