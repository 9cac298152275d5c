//! Every subcommand's flags: the clap definitions the command line is parsed
//! into (raw flags; the handlers turn them into library options). One file
//! for all of them, in the order of the handler files (drivers, inspection,
//! data, GPUs and pre-flight, benchmarks), so that a flag two commands share
//! is seen to be the same flag and defined once.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};

// --- flags several commands share ---
//
// Each is defined once and flattened into the commands that take it. Where
// a command means something more particular by the flag, it rewords the
// help with `mut_arg` and keeps the definition (name, value, type).

/// `--json`: the command's result as JSON on stdout instead of text.
#[derive(Debug, Args)]
#[group(skip)]
pub struct JsonFlag {
    /// Print JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// A run directory, the positional argument of the commands that read one.
#[derive(Debug, Args)]
#[group(skip)]
pub struct RunDirArg {
    /// The run directory.
    pub run_dir: PathBuf,
}

/// `--set KEY=VALUE`: config keys overridden on the command line, applied
/// by `config::load_with` over the file.
#[derive(Debug, Args)]
#[group(skip)]
pub struct SetFlags {
    /// Override a config key, typed as in TOML: `--set run.max_steps=500`,
    /// `--set checkpoint.interval=30s`, `--set model.hidden=[64,64]`, a registered
    /// model's own setting `--set model.settings.channels=16` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
}

/// The machine a GPU plan is for: a config's model and batch, over GPUs
/// probed here or described by a JSON inventory.
#[derive(Debug, Args)]
#[group(skip)]
pub struct GpuPlanArgs {
    /// Plan for this config's model and batch (default: the built-in defaults).
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Describe GPUs with a JSON inventory instead of probing this machine.
    #[arg(long, value_name = "FILE")]
    pub inventory: Option<PathBuf>,
}

// --- run, exec, seal (cli/run.rs) ---

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The TOML config (see configs/example.toml for every key).
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: PathBuf,
    /// Run directory (default: `[run] dir`, else `runs/<run name>`).
    #[arg(long, value_name = "DIR")]
    pub run_dir: Option<PathBuf>,
    #[command(flatten)]
    pub set: SetFlags,
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
#[command(mut_arg("overrides", |a| a.help("Override a config key, typed as in TOML: `--set signals.grace=30s` (repeatable)")))]
pub struct ExecArgs {
    /// A TOML config ([run], [checkpoint] keep, [signals], [publish], [lock],
    /// [gpu] monitor_interval apply; see configs/example.toml). Without one,
    /// every default.
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Run directory (default: `[run] dir`, else `runs/<run name>`); needed without --config.
    #[arg(long, value_name = "DIR", required_unless_present = "config")]
    pub run_dir: Option<PathBuf>,
    #[command(flatten)]
    pub set: SetFlags,
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
    /// This process's rank in a distributed program (torch's RANK): DIR is
    /// its part of the world's checkpoint of step N, maybe empty; rank 0
    /// waits for every rank's part ([distributed] timeout) and commits them
    /// under one manifest. Needs --world-size.
    #[arg(long, value_name = "R", requires = "world_size")]
    pub rank: Option<usize>,
    /// The number of ranks of the program (torch's WORLD_SIZE); needs --rank.
    #[arg(long, value_name = "W", requires = "rank")]
    pub world_size: Option<usize>,
}

// --- verify, checkpoints, status, report (cli/inspect.rs) ---

#[derive(Debug, Args)]
#[command(mut_arg("json", |a| a.help("Print a JSON report on stdout")))]
pub struct VerifyArgs {
    /// A checkpoint directory, a checkpoints directory or a run directory.
    pub path: PathBuf,
    #[command(flatten)]
    pub output: JsonFlag,
}

#[derive(Debug, Args)]
#[command(mut_arg("run_dir", |a| a.help("The run directory (or a checkpoints directory)")))]
pub struct CheckpointsArgs {
    #[command(flatten)]
    pub dir: RunDirArg,
    #[command(flatten)]
    pub output: JsonFlag,
}

#[derive(Debug, Args)]
#[command(mut_arg("json", |a| a.help("Print JSON on stdout: the run's object for one directory, an array of one object per directory with several (or --table); with --watch one line of JSON per refresh")))]
pub struct StatusArgs {
    /// One run directory (one screen about it), or several, e.g. `runs/*`
    /// (one line each: run, job, state, step, loss, newest checkpoint and
    /// its age, attempts, last stop, node).
    #[arg(required = true, value_name = "DIR")]
    pub run_dirs: Vec<PathBuf>,
    /// One line per directory even for one.
    #[arg(long)]
    pub table: bool,
    /// Only the runs in these states (comma-separated or repeated); a
    /// directory that is not a run is `foreign`, one whose run cannot be
    /// read `damaged`.
    #[arg(long, value_delimiter = ',', value_name = "STATE",
          value_parser = clap::builder::PossibleValuesParser::new(crate::rundir::ROW_STATES))]
    pub state: Vec<String>,
    /// Order of the lines: by directory, state, progress (least first), or
    /// checkpoint-age (the oldest newest checkpoint first: runs at risk on top).
    #[arg(long, value_enum, default_value_t = StatusSort::Dir)]
    pub sort: StatusSort,
    /// Refresh in place until interrupted (Ctrl-C), like watch(1).
    #[arg(long)]
    pub watch: bool,
    /// With --watch: time between refreshes.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = humantime::parse_duration, requires = "watch")]
    pub interval: Duration,
    /// With --watch: stop after this many refreshes (default: never).
    #[arg(long, value_name = "N", requires = "watch")]
    pub count: Option<u64>,
    #[command(flatten)]
    pub output: JsonFlag,
}

/// `rekindle status --sort`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StatusSort {
    Dir,
    State,
    Progress,
    CheckpointAge,
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    #[command(flatten)]
    pub dir: RunDirArg,
    /// Where to write the HTML (default: `<run dir>/report.html`): a regular
    /// file, new or replaced; a link, directory or device there is refused
    /// (exit 1) and left as it is.
    #[arg(long, value_name = "FILE.html")]
    pub out: Option<PathBuf>,
}

// --- data (cli/data.rs) ---

#[derive(Debug, Subcommand)]
pub enum DataCommand {
    /// Check every line of a JSONL dataset: bad lines counted by problem, with the first five line numbers of each.
    ///
    /// Reports JSON parse errors, missing/empty/non-string text fields,
    /// invalid UTF-8, NUL and control characters, and over-long records, with
    /// counts, the first five line numbers of each, and the length distribution. Exit 0
    /// when clean, 1 when any line is invalid.
    Validate(ValidateArgs),
}

#[derive(Debug, Args)]
#[command(mut_arg("json", |a| a.help("Print the report as JSON on stdout")))]
pub struct ValidateArgs {
    /// The JSONL file.
    pub file: PathBuf,
    /// Name of the text field of each record.
    #[arg(long, default_value = "text")]
    pub field: String,
    /// Records with more bytes of text than this are invalid (0: no limit).
    #[arg(long, default_value_t = 0)]
    pub max_len: usize,
    /// Also write a cleaned copy here (valid lines byte for byte): a regular
    /// file, new or replaced; a link, directory or device there is refused
    /// (exit 1) and left as it is.
    #[arg(long, value_name = "CLEAN.jsonl")]
    pub out: Option<PathBuf>,
    /// With --out: cut over-long records to --max-len instead of dropping them.
    #[arg(long, requires = "out")]
    pub truncate: bool,
    #[command(flatten)]
    pub output: JsonFlag,
}

// --- gpus, doctor (cli/preflight.rs) ---

#[derive(Debug, Args)]
#[command(mut_arg("json", |a| a.help("Print JSON on stdout (`devices`, `plan`, `notes`)")))]
pub struct GpusArgs {
    #[command(flatten)]
    pub target: GpuPlanArgs,
    #[command(flatten)]
    pub output: JsonFlag,
}

#[derive(Debug, Args)]
#[command(mut_arg("config", |a| a.help("Check this config (and its checkpoint directory and publish remote)")))]
#[command(mut_arg("inventory", |a| a.help("Describe GPUs with a JSON inventory instead of probing")))]
pub struct DoctorArgs {
    #[command(flatten)]
    pub target: GpuPlanArgs,
    /// Check the config `rekindle run --set …` would use.
    #[command(flatten)]
    pub set: SetFlags,
    #[command(flatten)]
    pub output: JsonFlag,
}

// --- bench (cli/bench.rs) ---

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Save, load+verify, verify and snapshot stall of synthetic state of SIZE
    /// (parameters in candle variables and AdamW moments, as between two
    /// training steps), beside `dd bs=8M conv=fsync` and `dd oflag=direct` of
    /// the same bytes on the same filesystem; the write path (direct or
    /// buffered, block size, writes in flight) is measured there first, as a
    /// run measures it, and printed with the candidates' speeds; and SHA-256
    /// of the state on 1, 2, … threads.
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
    /// What the lost-rank watch costs the shared filesystem, and how fast it
    /// finds a rank that stops beating, for N ranks on N/per-node nodes: the
    /// real watch code, one thread a rank, in a temporary run directory
    /// (`--dir` on the shared filesystem to measure that one). Prints
    /// metadata operations a second (all ranks, per rank, per node), the
    /// longest sweep of the others' beats, the time to name a stopped rank
    /// and any rank named wrongly (docs/scale.md).
    Liveness(BenchLivenessArgs),
    /// What the tasks of an `exec` world cost the shared filesystem while
    /// they wait for task 0 (its world record, its end): the real board
    /// (task 0 listens, the others connect and block) with N tasks as
    /// threads over a temporary staging directory (`--dir` on the shared
    /// filesystem to measure that one). Prints the files read per task and
    /// second against the 10 a second of reading them every 100 ms, and how
    /// long the slowest task took to hear each post (docs/scale.md).
    Board(BenchBoardArgs),
}

#[derive(Debug, Args)]
pub struct BenchBoardArgs {
    /// World sizes (task 0 and the others), comma-separated (a row each).
    #[arg(long, value_delimiter = ',', default_value = "8,64,512")]
    pub tasks: Vec<usize>,
    /// How long task 0 takes to post the world's start (e.g. verifying a
    /// large checkpoint).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    pub wait: Duration,
    /// Where the temporary staging directories go (default: the system's
    /// temporary directory).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    #[command(flatten)]
    pub output: JsonFlag,
}

#[derive(Debug, Args)]
pub struct BenchLivenessArgs {
    /// World sizes, comma-separated (a row each).
    #[arg(long, value_delimiter = ',', default_value = "8,64,512")]
    pub ranks: Vec<usize>,
    /// Ranks per simulated node.
    #[arg(long, default_value_t = 8)]
    pub per_node: usize,
    /// `[distributed] timeout` of the simulated world.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    pub timeout: Duration,
    /// How long the steady state is counted.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    pub measure: Duration,
    /// Where the temporary run directories go (default: the system's
    /// temporary directory).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    #[command(flatten)]
    pub output: JsonFlag,
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
    #[command(flatten)]
    pub output: JsonFlag,
}

#[derive(Debug, Args)]
pub struct BenchCollectiveArgs {
    /// Size of the summed vector (f32): bytes, or with a unit (64MiB, 1GiB).
    #[arg(long, value_parser = crate::units::parse_size, default_value = "16MiB")]
    pub bytes: u64,
    /// Timed repetitions (the median is reported).
    #[arg(long, default_value_t = 10)]
    pub iterations: usize,
    #[command(flatten)]
    pub output: JsonFlag,
}

#[derive(Debug, Args)]
#[command(mut_arg("overrides", |a| a.help("Override config keys, as for `run`")))]
pub struct BenchTrainArgs {
    /// The config to train (e.g. configs/tiny.toml).
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: PathBuf,
    #[command(flatten)]
    pub set: SetFlags,
    /// Steps per measurement.
    #[arg(long, default_value_t = 500)]
    pub steps: u64,
    /// Checkpoint every this many steps in the second measurement.
    #[arg(long, default_value_t = 50)]
    pub every: u64,
    /// Directory for the checkpoints.
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
    #[command(flatten)]
    pub output: JsonFlag,
}

#[derive(Debug, Args)]
pub struct BenchCheckpointArgs {
    /// State size: bytes, or with a unit (256MiB, 1GiB, 4GiB).
    #[arg(long, value_parser = crate::units::parse_size)]
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
    /// How the saves write, as `[checkpoint] write_mode`: auto (measured
    /// here first, as a run measures at its first large save), direct or
    /// buffered.
    #[arg(long, value_enum, default_value = "auto")]
    pub write_mode: WriteModeArg,
    /// Bytes per write, as `[checkpoint] write_block` (a multiple of 4 KiB
    /// from 64KiB to 256MiB, e.g. 1MiB); measured with --write-mode auto
    /// when left out.
    #[arg(long, value_parser = parse_write_block)]
    pub write_block: Option<u64>,
    /// Writes in flight per file, as `[checkpoint] write_queue_depth`.
    #[arg(long)]
    pub write_queue_depth: Option<usize>,
    /// Largest model or optimizer file, as `[checkpoint] shard_size`
    /// (default 512MiB): the state is written in shards of at most this.
    #[arg(long, value_parser = crate::units::parse_size)]
    pub shard_size: Option<u64>,
    #[command(flatten)]
    pub output: JsonFlag,
}

/// `--write-block`: a size that direct I/O can use.
fn parse_write_block(text: &str) -> Result<u64, String> {
    let block = crate::units::parse_size(text)?;
    if block % 4096 != 0 || !(64 << 10..=256 << 20).contains(&block) {
        return Err(format!("{block} bytes: a block is a multiple of 4 KiB from 64KiB to 256MiB, e.g. 8MiB"));
    }
    Ok(block)
}

/// `--write-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum WriteModeArg {
    Auto,
    Direct,
    Buffered,
}
