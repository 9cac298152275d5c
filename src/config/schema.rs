//! The configuration as the rest of rekindle sees it: serde structs with a
//! default for every key that can have one and `deny_unknown_fields`
//! everywhere. Loading, overrides and error reporting live in `load.rs`;
//! semantic checks in `validate.rs`.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The whole config file. Every section is optional.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub run: RunSection,
    pub model: ModelSection,
    pub data: DataSection,
    pub train: TrainSection,
    pub optimizer: OptimizerSection,
    pub precision: PrecisionSection,
    pub checkpoint: CheckpointSection,
    pub signals: SignalsSection,
    pub publish: PublishSection,
    pub gpu: GpuSection,
    pub watchdog: WatchdogSection,
    pub lock: LockSection,
    pub distributed: DistributedSection,
    pub recovery: RecoverySection,
    pub health: HealthSection,
    pub telemetry: TelemetrySection,
}

/// `[run]`: identity and length of the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunSection {
    /// Name of the run; also the default run directory `runs/<name>`.
    pub name: String,
    /// Run directory (default `runs/<name>`, relative to the working directory).
    pub dir: Option<PathBuf>,
    /// Seed of every random draw (weights, data order, dropout).
    pub seed: u64,
    /// Optimizer steps of the whole run.
    pub max_steps: u64,
    /// Requeues after transient crashes (I/O or device errors) and hangs in
    /// a row without a new checkpoint in between; 0 never requeues after
    /// a crash or a hang.
    pub max_crash_requeues: u32,
    /// Consecutive attempts, whatever ended them, that may commit no newer
    /// checkpoint: the attempt after them does not train and the job ends
    /// (exit 79) instead of being requeued again. 0 turns the guard off.
    pub max_attempts_without_progress: u32,
}

impl Default for RunSection {
    fn default() -> Self {
        RunSection {
            name: "run".into(),
            dir: None,
            seed: 0,
            max_steps: 1000,
            max_crash_requeues: 3,
            max_attempts_without_progress: 5,
        }
    }
}

/// Which model to train: a built-in one, or one a program registered with
/// its [`Registry`](crate::train::Registry) (`docs/workloads.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelKind {
    /// The built-in classifier (`[model] input_dim`, `hidden`, `classes`).
    Mlp,
    /// The built-in byte-level transformer (`[model] layers`, `width`, `heads`, `context`).
    Gpt,
    /// A registered workload of that name; its own settings are `[model.settings]`.
    Registered(String),
}

impl ModelKind {
    /// The names of the built-in kinds.
    pub const BUILTIN: [&'static str; 2] = ["mlp", "gpt"];

    /// The name as written in `[model] kind`.
    pub fn name(&self) -> &str {
        match self {
            ModelKind::Mlp => "mlp",
            ModelKind::Gpt => "gpt",
            ModelKind::Registered(name) => name,
        }
    }

    /// The kind a name stands for: `mlp` and `gpt` are built in, any other
    /// name is a registered workload's.
    pub fn from_name(name: &str) -> ModelKind {
        match name {
            "mlp" => ModelKind::Mlp,
            "gpt" => ModelKind::Gpt,
            other => ModelKind::Registered(other.to_string()),
        }
    }
}

impl Serialize for ModelKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for ModelKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        if name.is_empty() {
            return Err(serde::de::Error::custom("expected the name of a model kind, found \"\""));
        }
        Ok(ModelKind::from_name(&name))
    }
}

/// `[model]`: architecture. `mlp` uses `input_dim`, `hidden`, `classes`;
/// `gpt` uses `layers`, `width`, `heads`, `context` (vocabulary: 256 bytes);
/// a registered kind reads its own settings from `settings`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelSection {
    pub kind: ModelKind,
    pub input_dim: usize,
    pub hidden: Vec<usize>,
    pub classes: usize,
    pub layers: usize,
    pub width: usize,
    pub heads: usize,
    pub context: usize,
    /// Dropout probability (0 disables).
    pub dropout: f64,
    /// `[model.settings]`: a registered kind's own settings, deserialized
    /// into the type it registered (checked key by key when the config
    /// loads); empty for `mlp` and `gpt`.
    pub settings: toml::Table,
}

impl Default for ModelSection {
    fn default() -> Self {
        ModelSection {
            kind: ModelKind::Mlp,
            input_dim: 32,
            hidden: vec![64, 64],
            classes: 10,
            layers: 2,
            width: 64,
            heads: 4,
            context: 64,
            dropout: 0.0,
            settings: toml::Table::new(),
        }
    }
}

/// Where the samples of `[data]` come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DataKind {
    /// Generated from `[run] seed`.
    Synthetic,
    /// A JSONL file, its text in the field `[data] field` of each record.
    Jsonl,
    /// A plain UTF-8 text file, trained on as it is (byte-level).
    Text,
}

impl DataKind {
    /// The name as written in `[data] kind`.
    pub fn name(self) -> &'static str {
        match self {
            DataKind::Synthetic => "synthetic",
            DataKind::Jsonl => "jsonl",
            DataKind::Text => "text",
        }
    }
}

/// What to do with invalid records of a JSONL dataset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnInvalid {
    /// Refuse to start and print the validation report.
    Error,
    /// Skip invalid records and count them.
    Skip,
}

/// `[data]`: where batches come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DataSection {
    pub kind: DataKind,
    /// The JSONL or text file (required for `kind = "jsonl"` and `kind = "text"`).
    pub path: Option<PathBuf>,
    /// Name of the text field of each JSONL record.
    pub field: String,
    /// Records longer than this many bytes are invalid (0: no limit).
    pub max_len: usize,
    pub on_invalid: OnInvalid,
    /// Fraction of samples held out for validation.
    pub val_fraction: f64,
    /// Number of samples the synthetic generator produces.
    pub synthetic_samples: usize,
}

impl Default for DataSection {
    fn default() -> Self {
        DataSection {
            kind: DataKind::Synthetic,
            path: None,
            field: "text".into(),
            max_len: 0,
            on_invalid: OnInvalid::Error,
            val_fraction: 0.1,
            synthetic_samples: 4096,
        }
    }
}

/// What to do when a loss or gradient is not finite.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnNonFinite {
    Skip,
    Stop,
    Rollback,
}

/// How a step's samples are cut into micro-batches (`[train] micro_batch`).
///
/// The effective batch (`batch_size × grad_accum` samples per optimizer
/// step, in the same order) never depends on it; only the size of the
/// pieces the gradient is computed in does, which changes float summation
/// order and nothing else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MicroBatch {
    /// From the placement plan: the largest micro-batch the free memory
    /// (less `[gpu] headroom`) holds.
    Auto,
    /// This many samples per micro-batch per replica.
    Samples(usize),
}

impl Serialize for MicroBatch {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            MicroBatch::Auto => s.serialize_str("auto"),
            MicroBatch::Samples(n) => s.serialize_u64(*n as u64),
        }
    }
}

impl<'de> Deserialize<'de> for MicroBatch {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct MicroBatchVisitor;

        impl serde::de::Visitor<'_> for MicroBatchVisitor {
            type Value = MicroBatch;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("\"auto\" or a whole number of samples")
            }

            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<MicroBatch, E> {
                if text == "auto" {
                    Ok(MicroBatch::Auto)
                } else {
                    Err(E::custom(format!("`{text}` is not allowed; expected \"auto\" or a whole number of samples")))
                }
            }

            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<MicroBatch, E> {
                usize::try_from(n)
                    .map(MicroBatch::Samples)
                    .map_err(|_| E::custom(format!("expected \"auto\" or a whole number of samples, found {n}")))
            }

            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<MicroBatch, E> {
                usize::try_from(n).map(MicroBatch::Samples).map_err(|_| E::custom(format!("{n} is too large")))
            }
        }

        d.deserialize_any(MicroBatchVisitor)
    }
}

/// `[train]`: the loop.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainSection {
    /// Samples per micro-batch; with `grad_accum`, the effective batch.
    pub batch_size: usize,
    /// Micro-batches per optimizer step; with `batch_size`, the effective batch.
    pub grad_accum: usize,
    /// How the effective batch is cut into micro-batches: unset (the
    /// default) keeps `batch_size × grad_accum` as written; `"auto"` takes
    /// the micro-batch from the placement plan; a number sets it.
    pub micro_batch: Option<MicroBatch>,
    /// Clip gradients to this global norm (0 disables).
    pub grad_clip: f64,
    /// Write a metrics line every this many steps.
    pub log_every: u64,
    /// Evaluate on the validation split every this many steps (0 disables).
    pub eval_every: u64,
    /// Validation batches per evaluation.
    pub eval_batches: usize,
    pub on_nonfinite: OnNonFinite,
}

impl Default for TrainSection {
    fn default() -> Self {
        TrainSection {
            batch_size: 32,
            grad_accum: 1,
            micro_batch: None,
            grad_clip: 1.0,
            log_every: 1,
            eval_every: 0,
            eval_batches: 4,
            on_nonfinite: OnNonFinite::Skip,
        }
    }
}

/// `[optimizer]`: AdamW and its learning-rate schedule (linear warm-up, then
/// cosine decay to `min_lr` over `decay_steps`, default `run.max_steps`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OptimizerSection {
    pub lr: f64,
    pub min_lr: f64,
    pub warmup_steps: u64,
    pub decay_steps: Option<u64>,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

impl Default for OptimizerSection {
    fn default() -> Self {
        OptimizerSection {
            lr: 1e-3,
            min_lr: 1e-4,
            warmup_steps: 0,
            decay_steps: None,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    F32,
    Bf16,
    F16,
}

/// `[precision]`: compute dtype and the dynamic loss scaler used with f16.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PrecisionSection {
    pub dtype: Precision,
    pub initial_scale: f64,
    pub growth_factor: f64,
    pub backoff_factor: f64,
    pub growth_interval: u64,
}

impl Default for PrecisionSection {
    fn default() -> Self {
        PrecisionSection {
            dtype: Precision::F32,
            initial_scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
        }
    }
}

/// `[checkpoint]`: when and where checkpoints are written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CheckpointSection {
    /// Wall-clock time between periodic checkpoints ("5m", "90s", "1h 30m"),
    /// or `"auto"`: chosen from the measured checkpoint cost and the mean
    /// time between interruptions (`checkpoint::interval`).
    pub interval: CheckpointInterval,
    /// Mean time between interruptions that lose work, for `interval =
    /// "auto"` (unset: estimated from the run's own earlier attempts).
    #[serde(with = "humantime_option", skip_serializing_if = "Option::is_none")]
    pub mtbf: Option<Duration>,
    /// Also checkpoint every this many steps (0: off).
    pub every_steps: u64,
    /// Valid checkpoints to keep.
    pub keep: usize,
    /// Persist periodic checkpoints on a background thread.
    #[serde(rename = "async")]
    pub async_save: bool,
    /// Checkpoint directory (default `<run dir>/checkpoints`).
    pub dir: Option<PathBuf>,
    /// Stop the run after this many background saves fail in a row.
    pub max_consecutive_failures: u32,
    /// How a checkpoint's large files reach the disk: `"auto"` (measured
    /// once per filesystem, `checkpoint::write_mode`), `"direct"`
    /// (`O_DIRECT`) or `"buffered"` (the page cache, flushed and dropped
    /// behind the writes).
    pub write_mode: CheckpointWriteMode,
    /// Bytes per write call: `"auto"` (measured with `write_mode = "auto"`,
    /// else 8 MiB) or a size such as `"4MiB"` (a multiple of 4 KiB, 64 KiB
    /// to 256 MiB).
    pub write_block: AutoSize,
    /// Writes in flight per file: 0 for automatic (measured with
    /// `write_mode = "auto"`, else 2), or 1 to 64.
    pub write_queue_depth: u32,
    /// The largest model or optimizer file: bigger state is split into
    /// shards (`model-00001-of-00004.safetensors` and an index, the Hugging
    /// Face layout) that are hashed, written, verified and loaded on every
    /// core. `"auto"` (512 MiB) or a size of at least 4 KiB.
    pub shard_size: AutoSize,
}

impl Default for CheckpointSection {
    fn default() -> Self {
        CheckpointSection {
            interval: CheckpointInterval::Fixed(Duration::from_secs(300)),
            mtbf: None,
            every_steps: 0,
            keep: 3,
            async_save: true,
            dir: None,
            max_consecutive_failures: 3,
            write_mode: CheckpointWriteMode::Auto,
            write_block: AutoSize::Auto,
            write_queue_depth: 0,
            shard_size: AutoSize::Auto,
        }
    }
}

/// `[checkpoint] write_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckpointWriteMode {
    Auto,
    Direct,
    Buffered,
}

/// A size that may be left to rekindle: `"auto"` or a size such as
/// `"8MiB"` (`units::parse_size`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AutoSize {
    Auto,
    Fixed(u64),
}

impl AutoSize {
    /// The size, unless left to rekindle.
    pub fn fixed(self) -> Option<u64> {
        match self {
            AutoSize::Auto => None,
            AutoSize::Fixed(n) => Some(n),
        }
    }
}

impl Serialize for AutoSize {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            AutoSize::Auto => s.serialize_str("auto"),
            AutoSize::Fixed(n) => s.serialize_str(&format!("{n}B")),
        }
    }
}

impl<'de> Deserialize<'de> for AutoSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct AutoSizeVisitor;

        impl serde::de::Visitor<'_> for AutoSizeVisitor {
            type Value = AutoSize;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("\"auto\" or a size such as \"8MiB\"")
            }

            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<AutoSize, E> {
                if text == "auto" {
                    return Ok(AutoSize::Auto);
                }
                crate::units::parse_size(text).map(AutoSize::Fixed).map_err(|e| {
                    E::custom(format!("`{text}` is neither \"auto\" nor a size ({e}); write e.g. \"auto\" or \"8MiB\""))
                })
            }
        }

        d.deserialize_str(AutoSizeVisitor)
    }
}

/// A duration that may be left to rekindle: `"auto"` or a fixed duration
/// such as `"5m"`. `[checkpoint] interval` (see [`CheckpointInterval`]) and
/// the `[watchdog]` limits (see [`Limit`]) are read this way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AutoDuration {
    Auto,
    Fixed(Duration),
}

/// `[checkpoint] interval`: a fixed duration, or `"auto"` (Young/Daly from
/// the measured checkpoint cost and the mean time between interruptions,
/// see `checkpoint::interval`).
pub type CheckpointInterval = AutoDuration;

/// A `[watchdog]` limit: `"auto"` (derived from the measured median step
/// time, see `attempt::watchdog::auto_limit`) or a fixed duration.
pub type Limit = AutoDuration;

impl Serialize for AutoDuration {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            AutoDuration::Auto => s.serialize_str("auto"),
            AutoDuration::Fixed(d) => s.serialize_str(&humantime::format_duration(*d).to_string()),
        }
    }
}

impl<'de> Deserialize<'de> for AutoDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct AutoDurationVisitor;

        impl serde::de::Visitor<'_> for AutoDurationVisitor {
            type Value = AutoDuration;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("\"auto\" or a duration such as \"5m\"")
            }

            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<AutoDuration, E> {
                if text == "auto" {
                    return Ok(AutoDuration::Auto);
                }
                humantime::parse_duration(text).map(AutoDuration::Fixed).map_err(|e| {
                    E::custom(format!(
                        "`{text}` is neither \"auto\" nor a duration ({e}); write e.g. \"auto\", \"90s\" or \"5m\""
                    ))
                })
            }
        }

        d.deserialize_str(AutoDurationVisitor)
    }
}

/// Requeue policy after a stop signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RequeuePolicy {
    Auto,
    Always,
    Never,
}

/// `[signals]`: the grace period and what happens after a stop.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SignalsSection {
    /// Time between the first stop signal and SIGKILL.
    #[serde(with = "humantime_serde_compat")]
    pub grace: Duration,
    /// Kept free at the end of the grace period.
    #[serde(with = "humantime_serde_compat")]
    pub safety_margin: Duration,
    pub requeue: RequeuePolicy,
    /// Stop requeueing after this many restarts.
    pub max_restarts: u32,
}

impl Default for SignalsSection {
    fn default() -> Self {
        SignalsSection {
            grace: Duration::from_secs(120),
            safety_margin: Duration::from_secs(10),
            requeue: RequeuePolicy::Auto,
            max_restarts: 20,
        }
    }
}

/// `[publish]`: git publishing of small run artefacts on exit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PublishSection {
    pub enabled: bool,
    /// Path of a local clone to commit into.
    pub repo: Option<PathBuf>,
    pub remote: String,
    pub branch: String,
    /// Commit message template (default names run, step, job id and reason);
    /// `{run}`, `{step}`, `{job}`, `{reason}`, `{node}` are replaced.
    pub message: Option<String>,
    /// Extra run-directory files to publish (glob patterns relative to the
    /// run directory, never leaving it: checked by `validate.rs`). Only
    /// regular files of small text artefacts and figures are published
    /// (`publish::PUBLISHABLE_EXTENSIONS`); symbolic links are never
    /// followed, and weights and checkpoint contents never published.
    pub include: Vec<String>,
    /// Largest file published, in MiB; a larger one is left out with a warning.
    pub max_file_mib: u64,
    /// Push attempts before giving up (the commit stays local and is pushed by the next run).
    pub max_attempts: u32,
    /// Wait before the second push attempt; doubles each time.
    #[serde(with = "humantime_serde_compat")]
    pub retry_initial: Duration,
    /// Longest wait between push attempts.
    #[serde(with = "humantime_serde_compat")]
    pub retry_max: Duration,
}

impl Default for PublishSection {
    fn default() -> Self {
        PublishSection {
            enabled: false,
            repo: None,
            remote: "origin".into(),
            branch: "main".into(),
            message: None,
            include: Vec::new(),
            max_file_mib: 50,
            max_attempts: 5,
            retry_initial: Duration::from_secs(5),
            retry_max: Duration::from_secs(300),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuBackend {
    Auto,
    Cpu,
    Cuda,
    Rocm,
}

/// `[gpu]`: device selection, memory headroom for placement, whether a GPU
/// is required, and how often the monitor samples.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GpuSection {
    pub backend: GpuBackend,
    /// Fraction of free device memory kept unused by the placement plan.
    pub headroom: f64,
    /// Stop with an error instead of falling back to the CPU when no GPU
    /// backend can be used.
    pub require: bool,
    /// Time between samples of `gpu_stats.jsonl`.
    #[serde(with = "humantime_serde_compat")]
    pub monitor_interval: Duration,
}

impl Default for GpuSection {
    fn default() -> Self {
        GpuSection {
            backend: GpuBackend::Auto,
            headroom: 0.25,
            require: false,
            monitor_interval: Duration::from_secs(10),
        }
    }
}

/// `[watchdog]`: how long a training step, an evaluation, a checkpoint save
/// or a publish may take before it counts as a hang (a stuck collective, a
/// dead NFS server, a deadlocked data loader) and the attempt is ended with
/// a requeue instead of burning the allocation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WatchdogSection {
    pub enabled: bool,
    pub step: Limit,
    pub eval: Limit,
    pub save: Limit,
    pub publish: Limit,
    /// The shortest `"auto"` limit of a step or an evaluation; saves and
    /// publishes get three times it.
    #[serde(with = "humantime_serde_compat")]
    pub floor: Duration,
}

impl Default for WatchdogSection {
    fn default() -> Self {
        WatchdogSection {
            enabled: true,
            step: Limit::Auto,
            eval: Limit::Auto,
            save: Limit::Auto,
            publish: Limit::Auto,
            floor: Duration::from_secs(600),
        }
    }
}

/// `[lock]`: the run-directory lock (`rundir/lock/`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LockSection {
    /// A lock whose heartbeat is this old (or has not moved for this long)
    /// belongs to a dead holder on another node; the holder rewrites its
    /// heartbeat every sixth of it (at most every 10 s).
    #[serde(with = "humantime_serde_compat")]
    pub stale_after: Duration,
}

impl Default for LockSection {
    fn default() -> Self {
        LockSection { stale_after: Duration::from_secs(60) }
    }
}

/// `[distributed]`: a run of several ranks (docs/distributed.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DistributedSection {
    /// A rank whose heartbeat file (`<run dir>/ranks/`) has not changed for
    /// this long, as watched by another rank, is lost (stopped, dead, or its
    /// node gone): the others record `rank_lost` and abort the world.
    #[serde(with = "humantime_serde_compat")]
    pub timeout: Duration,
    /// ZeRO-1: each rank keeps and updates the optimizer moments of only
    /// its 1/N slice of the parameters; the updated slices are all-gathered.
    /// At a checkpoint each rank writes its own slice (`checkpoint::parts`).
    pub shard_optimizer: bool,
}

impl Default for DistributedSection {
    fn default() -> Self {
        DistributedSection { timeout: Duration::from_secs(180), shard_optimizer: false }
    }
}

/// `[recovery]`: the node-local checkpoint tier and restarts inside the
/// running job (docs/recovery.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RecoverySection {
    /// Keep a second, node-local checkpoint tier besides the durable one:
    /// every node writes a whole copy of the state to its own storage, and
    /// a restart inside the job resumes from the newest complete one.
    pub local: bool,
    /// Where on each node (`{node}` and `{job}` are replaced by the node's
    /// name and the SLURM job id). Default: `$SLURM_TMPDIR`, else
    /// `$TMPDIR`, else `/dev/shm`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local_dir: Option<String>,
    /// Write a local checkpoint every this many steps (0: by time only).
    pub local_every_steps: u64,
    /// ... and at most this long apart (`"auto"`: as often as costs at most
    /// 1 % of the training time, measured).
    pub local_interval: AutoDuration,
    /// Local checkpoints to keep on each node (1 or 2).
    pub local_keep: usize,
    /// A local checkpoint is skipped (with an event) when it would take more
    /// than this share of its filesystem's free space.
    pub local_max_share: f64,
    /// When the batch shell offers it (`slurm/orchestrator.slurm`), a world
    /// that lost a rank or a node continues in a new job step on the nodes
    /// left instead of requeueing the job.
    pub in_job: bool,
}

impl Default for RecoverySection {
    fn default() -> Self {
        RecoverySection {
            local: false,
            local_dir: None,
            local_every_steps: 0,
            local_interval: AutoDuration::Auto,
            local_keep: 2,
            local_max_share: 0.5,
            in_job: true,
        }
    }
}

/// `[health]`: the check every node makes at the start of every attempt,
/// leaving nodes it blames behind (docs/slurm.md, "Bad nodes"), and
/// stragglers (docs/distributed.md#stragglers).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HealthSection {
    /// Check the node at the start of every attempt, before the run
    /// directory is touched; a node that fails ends the attempt untrained.
    pub check: bool,
    /// A site's own check, run with `sh -c` on every node; non-zero (or
    /// past `timeout`) is unhealthy. Its output is recorded (bounded).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// How long the site command may run (at most [`MAX_HEALTH_TIMEOUT`]).
    #[serde(with = "humantime_serde_compat")]
    pub timeout: Duration,
    /// Give the site command rekindle's whole environment, secrets such as
    /// `HF_TOKEN` included; by default it gets only what a site check needs
    /// (`PATH`, `HOME`, `USER`, `LANG`, `SLURM_*`, the GPU visibility
    /// variables…: `health::site_env`).
    pub inherit_env: bool,
    /// Each device the job is given must have at least this share of its
    /// memory free (another process holding it means a node not cleaned up).
    pub min_free_device_memory: f64,
    /// The most this node's clock may differ from the shared filesystem's.
    #[serde(with = "humantime_serde_compat")]
    pub max_clock_skew: Duration,
    /// Exclude the nodes an attempt's end blames from the job's next
    /// attempt (`scontrol update ExcNodeList`) or next in-job step.
    pub exclude: bool,
    /// The most nodes rekindle adds to a job's exclusions, all attempts
    /// together (the user's own `--exclude` does not count).
    pub max_excluded_nodes: usize,
    /// A rank whose own work in a step (forward and backward) takes more
    /// than this many times the median of the other ranks', or one process
    /// whose step takes more than this many times its own earlier median,
    /// is slow in that step.
    pub straggler_factor: f64,
    /// Slow for this many steps in a row: a `straggler` event names the
    /// rank and its node, once per rank per attempt (0: never looked for).
    pub straggler_steps: u64,
    /// A straggler's event blames its node (`blamed = true`): the slowdown
    /// is the node's, as a failure attributed to it is; false reports it only.
    pub straggler_blame: bool,
}

impl Default for HealthSection {
    fn default() -> Self {
        HealthSection {
            check: true,
            command: None,
            timeout: Duration::from_secs(60),
            inherit_env: false,
            min_free_device_memory: 0.5,
            max_clock_skew: Duration::from_secs(60),
            exclude: true,
            max_excluded_nodes: 2,
            straggler_factor: 1.5,
            straggler_steps: 20,
            straggler_blame: false,
        }
    }
}

/// The longest `[health] timeout`: the check runs before every attempt, on
/// every node, and a site check that needs longer holds the allocation
/// idle (a stop ends it at once whatever the timeout).
pub const MAX_HEALTH_TIMEOUT: Duration = Duration::from_secs(600);

/// The words `[telemetry] secret_words` holds by default.
pub const DEFAULT_SECRET_WORDS: [&str; 11] = [
    "token",
    "secret",
    "password",
    "passwd",
    "passphrase",
    "pass",
    "key",
    "credential",
    "credentials",
    "auth",
    "authorization",
];

/// `[telemetry]`: what rekindle's own records (`events.jsonl`, which
/// publishing copies) may hold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetrySection {
    /// A name (`HF_TOKEN`, `--api-key`, `"password":`) is secret when one
    /// of its parts (split at `_`, `-`, `.`) ends with one of these words
    /// (case-insensitive, ASCII letters and digits); the values of secret
    /// names are redacted from `rekindle exec`'s command line and its
    /// program's stderr tail before they are recorded (`telemetry::Redactor`).
    /// URL credentials and bearer tokens are redacted whatever the list.
    pub secret_words: Vec<String>,
    /// Record `rekindle exec`'s command line as given, secrets included
    /// (`child_start`, the `start` placement, error messages), and so
    /// publish it with `events.jsonl`. The stderr tail is redacted anyway.
    pub record_raw_command: bool,
    /// TensorBoard event files of the run's scalars (docs/telemetry.md):
    /// `true` (into `<run dir>/tensorboard`), `false`, or a directory
    /// (relative to the working directory; `{run}` and `{job}` are
    /// replaced by the run's name and SLURM job).
    pub tensorboard: TensorBoardSetting,
    /// A Prometheus textfile for node_exporter's textfile collector, kept up
    /// to date while the run trains (unset: none). A path ending in `.prom`;
    /// `{run}` and `{job}` are replaced as for `tensorboard`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prometheus_textfile: Option<String>,
    /// A run of several ranks: the largest world whose step lines carry
    /// every rank's own seconds (`rank_compute_s`, N numbers a line, and N
    /// TensorBoard tags). Every step line carries the summary
    /// (`rank_compute`: the fastest, median and slowest rank's seconds and
    /// which rank was slowest), O(1) in the world size; 0 writes the
    /// summary only.
    pub rank_times_max: u64,
}

impl Default for TelemetrySection {
    fn default() -> Self {
        TelemetrySection {
            secret_words: DEFAULT_SECRET_WORDS.iter().map(|w| w.to_string()).collect(),
            record_raw_command: false,
            tensorboard: TensorBoardSetting::Enabled(true),
            prometheus_textfile: None,
            rank_times_max: DEFAULT_RANK_TIMES_MAX,
        }
    }
}

/// `[telemetry] rank_times_max`'s default: per-rank seconds on each step
/// line for worlds of up to 8 ranks (a line of ~100 bytes more), the
/// summary alone above.
pub const DEFAULT_RANK_TIMES_MAX: u64 = 8;

/// `[telemetry] tensorboard`: on or off, or the directory to write into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TensorBoardSetting {
    /// `true`: into `<run dir>/tensorboard`; `false`: none.
    Enabled(bool),
    /// A directory (may hold `{run}` and `{job}`).
    Dir(String),
}

impl Serialize for TensorBoardSetting {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            TensorBoardSetting::Enabled(on) => s.serialize_bool(*on),
            TensorBoardSetting::Dir(dir) => s.serialize_str(dir),
        }
    }
}

impl<'de> Deserialize<'de> for TensorBoardSetting {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct TensorBoardVisitor;

        impl serde::de::Visitor<'_> for TensorBoardVisitor {
            type Value = TensorBoardSetting;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("true, false or a directory such as \"tb/{run}\"")
            }

            fn visit_bool<E: serde::de::Error>(self, on: bool) -> Result<TensorBoardSetting, E> {
                Ok(TensorBoardSetting::Enabled(on))
            }

            fn visit_str<E: serde::de::Error>(self, dir: &str) -> Result<TensorBoardSetting, E> {
                Ok(TensorBoardSetting::Dir(dir.to_string()))
            }
        }

        d.deserialize_any(TensorBoardVisitor)
    }
}

/// An optional human-readable duration (absent: `None`).
mod humantime_option {
    use std::time::Duration;

    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => super::humantime_serde_compat::serialize(d, s),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        super::humantime_serde_compat::deserialize(d).map(Some)
    }
}

/// Human-readable durations ("5m", "120s", "1h 30m") in both directions.
mod humantime_serde_compat {
    use std::fmt;
    use std::time::Duration;

    use serde::de::{self, Visitor};
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        d.deserialize_str(DurationVisitor)
    }

    struct DurationVisitor;

    impl Visitor<'_> for DurationVisitor {
        type Value = Duration;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a duration string such as \"90s\", \"5m\" or \"1h 30m\"")
        }

        fn visit_str<E: de::Error>(self, text: &str) -> Result<Duration, E> {
            humantime::parse_duration(text).map_err(|e| {
                E::custom(format!("`{text}` is not a duration ({e}); write e.g. \"90s\", \"5m\" or \"1h 30m\""))
            })
        }
    }
}
