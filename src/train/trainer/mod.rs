//! The [`Trainer`]: one object owning everything a training step reads or
//! changes (parameters, optimizer, schedule, loss scaler, RNG streams, data
//! cursor, step and counters), the step itself, evaluation, and the
//! snapshot/restore pair that makes a resumed run bit-identical to one that
//! never stopped.
//!
//! A step works on copies of the cursor and the dropout stream and commits
//! them only when it completes, so an interrupted step (or one that asks for
//! a stop or a rollback) leaves the trainer exactly as after the previous
//! step. Every walk over parameters is in name order, and the snapshot holds
//! host copies only, so a checkpoint can be written while training goes on.
//!
//! A step's samples are cut up as its [`Layout`] says (replicas, micro-batch,
//! accumulation): replicas compute their gradients one after another over
//! disjoint shards and are averaged in replica order on the trainer's device,
//! so the result is deterministic. The layout is not part of the checkpoint:
//! it changes float summation order only, never which samples a step sees.
//!
//! Each replica runs on its own device ([`Trainer::place_replicas`]; the
//! placement plan picks them, `attempt/devices.rs`): replica 0 on the
//! trainer's device with the master parameters (f32) and the optimizer,
//! replica `r ≥ 1` on `devices[r]` with its own instance of the workload,
//! whose parameters are copied from the master ones before every step and
//! whose gradients are copied back. The code is the same whatever the
//! device: every CPU test with replicas takes this path on `Device::Cpu`.

mod reduce;
mod state;

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::sync::Arc;
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};

use super::builtin::builtin_workload;
use super::data::{DataCursor, Sampler};
use super::error::{TrainError, candle_message, is_out_of_memory};
use super::layout::Layout;
use super::optim::{AdamW, AdamWConfig, GatherF32, ShardRange, snapshot_tensors};
use super::params::{ParamStore, Params, check_host, from_host, holds_host_values, param_count};
use super::registry::Registry;
use super::rng::{RngState, Stream, StreamRng};
use super::scaler::{LossScaler, ScalerState, compute_dtype};
use super::schedule::LrSchedule;
use super::workload::{ForwardCtx, Split, Workload};
use crate::checkpoint::{Snapshot, TensorSet};
use crate::config::{Config, OnNonFinite};
use crate::distributed::Collective;
use reduce::{Gathered, all_gather_f32, average_across_ranks, average_replicas, gather_losses};

/// Version of the JSON training state; a restore refuses any other.
pub const STATE_FORMAT: u32 = 1;

/// Running totals kept in the training state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Counters {
    /// Micro-batches consumed from the data (including skipped ones).
    pub batches: u64,
    /// Training samples consumed.
    pub samples: u64,
    /// Training tokens consumed (language models).
    pub tokens: u64,
    /// Steps skipped because a loss or gradient was not finite (`on_nonfinite = "skip"`).
    pub nonfinite_skipped: u64,
    /// Steps skipped by the f16 loss scaler after a gradient overflow.
    pub scaler_skipped: u64,
    /// Micro-batches passed over by [`Trainer::skip_batches`].
    pub batches_skipped: u64,
    /// Steps whose gradients were clipped.
    pub clipped: u64,
}

/// What a completed step did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepMetrics {
    /// Steps completed, this one included (1 after the first step).
    pub step: u64,
    /// Mean loss over the step's micro-batches (unscaled).
    pub loss: f64,
    /// Learning rate of this step.
    pub lr: f64,
    /// Global L2 norm of the (unscaled) gradient before clipping.
    pub grad_norm: f64,
    /// Whether the gradient was clipped.
    pub clipped: bool,
    /// Samples in this step.
    pub samples: u64,
    /// Tokens in this step (language models).
    pub tokens: Option<u64>,
    pub samples_per_s: f64,
    pub tokens_per_s: Option<f64>,
    /// The loss scale after this step's scaler update (f16 only).
    pub loss_scale: Option<f64>,
    /// The update was skipped because a loss or gradient was not finite.
    pub skipped_nonfinite: bool,
    /// Epoch of the data cursor after the step.
    pub epoch: u64,
    /// Wall-clock seconds of the step.
    pub elapsed_s: f64,
    /// In a world of ranks: each rank's seconds of its own forward and
    /// backward passes in this step (before it waits for the others in the
    /// step's collectives), in rank order; what tells a straggler
    /// (`attempt::straggler`). Empty for a process alone.
    pub rank_compute_s: Vec<f64>,
}

/// A step whose loss or gradient was not finite and whose policy is stop or rollback.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NonFiniteEvent {
    /// The step that failed (1-based, as [`StepMetrics::step`] would have been).
    pub step: u64,
    pub loss: f64,
    pub grad_norm: f64,
    /// [`Counters::batches`] just after the offending micro-batches: after
    /// reloading an earlier checkpoint, [`Trainer::skip_past`] moves the
    /// data cursor here.
    pub batches_end: u64,
}

/// The outcome of [`Trainer::train_step`].
#[derive(Debug, Clone, PartialEq)]
pub enum StepResult {
    /// The step finished (possibly skipping its update; see
    /// [`StepMetrics::skipped_nonfinite`]).
    Completed(StepMetrics),
    /// `should_stop` returned true between micro-batches; the partial step
    /// was discarded and the trainer is as after the previous step.
    Interrupted,
    /// Non-finite loss or gradient with `on_nonfinite = "stop"`: the trainer
    /// is as after the previous step; the run should end.
    NonFiniteStop(NonFiniteEvent),
    /// Non-finite loss or gradient with `on_nonfinite = "rollback"`: the
    /// caller should restore the last checkpoint, call
    /// [`Trainer::skip_past`] with this event, and continue.
    NonFiniteRollback(NonFiniteEvent),
}

/// Makes another instance of the trainer's workload, for a replica on
/// another device.
type WorkloadFactory = Arc<dyn Fn() -> Result<Box<dyn Workload>, TrainError> + Send + Sync>;

/// A replica `r ≥ 1`: its own instance of the workload on its device.
struct Replica {
    device: Device,
    workload: Box<dyn Workload>,
    params: Params,
}

/// What one micro-batch runs on: the master workload on the trainer's
/// device, or a [`Replica`]'s.
struct Target<'a> {
    workload: &'a dyn Workload,
    params: &'a Params,
    device: &'a Device,
}

/// The training engine; see the module docs.
pub struct Trainer {
    workload: Box<dyn Workload>,
    device: Device,
    /// Where replica `r` runs: `replica_devices[r % len]`; the first is `device`.
    replica_devices: Vec<Device>,
    /// Replicas 1.. built so far (replica 0 is the trainer's own workload).
    replicas: Vec<Replica>,
    /// New workload instances for [`Replica`]s; `None` for a trainer built
    /// from one workload instance ([`with_workload`](Self::with_workload)),
    /// whose replicas all run on the trainer's device and workload.
    factory: Option<WorkloadFactory>,
    dtype: DType,
    params: Params,
    optimizer: AdamW,
    schedule: LrSchedule,
    scaler: LossScaler,
    init_rng: StreamRng,
    dropout_rng: StreamRng,
    sampler: Sampler,
    seed: u64,
    train_samples: usize,
    cursor: DataCursor,
    step: u64,
    counters: Counters,
    /// `[train] batch_size`: with `grad_accum`, the effective batch, and the
    /// unit of [`Counters::batches`] whatever the layout.
    batch_size: usize,
    grad_accum: usize,
    layout: Layout,
    grad_clip: f64,
    on_nonfinite: OnNonFinite,
    eval_batches: usize,
    /// The other ranks of a data-parallel run ([`join_world`](Self::join_world));
    /// `None` for a process alone.
    world: Option<Box<dyn Collective>>,
}

impl std::fmt::Debug for Trainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trainer")
            .field("workload", &self.workload.name())
            .field("step", &self.step)
            .field("cursor", &self.cursor)
            .field("params", &self.params.len())
            .finish_non_exhaustive()
    }
}

fn dtype_name(dtype: DType) -> String {
    format!("{dtype:?}").to_lowercase()
}

impl Trainer {
    /// A trainer for the built-in workload `[model] kind` on `[data]`.
    pub fn new(cfg: &Config) -> Result<Self, TrainError> {
        Self::on_device(cfg, Device::Cpu)
    }

    /// The built-in workload on `device` (parameters, optimizer state and
    /// batches live there; snapshots are host copies as always).
    pub fn on_device(cfg: &Config, device: Device) -> Result<Self, TrainError> {
        let owned = cfg.clone();
        Self::with_factory_on(cfg, Arc::new(move || builtin_workload(&owned)), device, None)
    }

    /// A trainer for the workload `[model] kind` names, built-in or
    /// registered in `registry`.
    pub fn from_registry(cfg: &Config, registry: &Registry) -> Result<Self, TrainError> {
        Self::from_registry_on(cfg, registry, Device::Cpu)
    }

    /// [`from_registry`](Self::from_registry) for a run about to
    /// [`restore`](Self::restore) a checkpoint whose parameters are
    /// `initial`: the parameters are built from those values instead of
    /// being drawn first and overwritten (what made resuming a large model
    /// cost more than reading its checkpoint). Restoring still checks every
    /// tensor, and the result is the same as `from_registry` + `restore`.
    pub fn from_registry_resuming(
        cfg: &Config,
        registry: &Registry,
        initial: Arc<TensorSet>,
    ) -> Result<Self, TrainError> {
        Self::from_registry_on_resuming(cfg, registry, Device::Cpu, Some(initial))
    }

    /// [`from_registry`](Self::from_registry) on `device`.
    pub fn from_registry_on(cfg: &Config, registry: &Registry, device: Device) -> Result<Self, TrainError> {
        Self::from_registry_on_resuming(cfg, registry, device, None)
    }

    /// [`from_registry_on`](Self::from_registry_on), with the parameters
    /// built from `initial` when given (see
    /// [`from_registry_resuming`](Self::from_registry_resuming)).
    pub fn from_registry_on_resuming(
        cfg: &Config,
        registry: &Registry,
        device: Device,
        initial: Option<Arc<TensorSet>>,
    ) -> Result<Self, TrainError> {
        let (owned, registry) = (cfg.clone(), registry.clone());
        Self::with_factory_on(cfg, Arc::new(move || registry.workload(&owned)), device, initial)
    }

    /// [`from_registry_on_resuming`](Self::from_registry_on_resuming) on the
    /// CPU, with the trainer's own workload already built from `registry`
    /// (by [`Registry::checked_workload`], which `rekindle run` calls before
    /// it touches the run directory), so its data is not loaded again;
    /// replicas on other devices still build theirs from `registry`.
    pub fn from_registry_prebuilt(
        cfg: &Config,
        registry: &Registry,
        workload: Box<dyn Workload>,
        initial: Option<Arc<TensorSet>>,
    ) -> Result<Self, TrainError> {
        let (owned, registry) = (cfg.clone(), registry.clone());
        let mut trainer = Self::build(cfg, workload, Device::Cpu, initial)?;
        trainer.factory = Some(Arc::new(move || registry.workload(&owned)));
        Ok(trainer)
    }

    /// A trainer whose workload `factory` makes, once for the trainer and
    /// once per replica on another device.
    fn with_factory_on(
        cfg: &Config,
        factory: WorkloadFactory,
        device: Device,
        initial: Option<Arc<TensorSet>>,
    ) -> Result<Self, TrainError> {
        let mut trainer = Self::build(cfg, factory()?, device, initial)?;
        trainer.factory = Some(factory);
        Ok(trainer)
    }

    /// A trainer for any [`Workload`]; `[model]` and `[data]` are left to
    /// the workload, everything else (`[run]`, `[train]`, `[optimizer]`,
    /// `[precision]`) applies.
    pub fn with_workload(cfg: &Config, workload: Box<dyn Workload>) -> Result<Self, TrainError> {
        Self::with_workload_on(cfg, workload, Device::Cpu)
    }

    /// [`with_workload`](Self::with_workload) on `device`.
    pub fn with_workload_on(cfg: &Config, workload: Box<dyn Workload>, device: Device) -> Result<Self, TrainError> {
        Self::build(cfg, workload, device, None)
    }

    fn build(
        cfg: &Config,
        mut workload: Box<dyn Workload>,
        device: Device,
        initial: Option<Arc<TensorSet>>,
    ) -> Result<Self, TrainError> {
        let t = &cfg.train;
        if t.batch_size == 0 {
            return Err(TrainError::config("train.batch_size", "must be at least 1"));
        }
        if t.grad_accum == 0 {
            return Err(TrainError::config("train.grad_accum", "must be at least 1"));
        }
        if !(t.grad_clip.is_finite() && t.grad_clip >= 0.0) {
            return Err(TrainError::config("train.grad_clip", "must be a finite number >= 0 (0 disables clipping)"));
        }
        let dtype = compute_dtype(cfg.precision.dtype, &device)?;
        let seed = cfg.run.seed;

        let rng = StreamRng::new(seed, Stream::Init);
        let store = match initial {
            Some(initial) => ParamStore::with_initial(device.clone(), rng, initial),
            None => ParamStore::new(device.clone(), rng),
        };
        workload
            .build(store.var_builder())
            .map_err(|e| TrainError::Build { workload: workload.name().to_string(), message: candle_message(&e) })?;
        let (params, init_rng) = store.into_parts();
        if params.is_empty() {
            return Err(TrainError::Build {
                workload: workload.name().to_string(),
                message: "declared no parameters".into(),
            });
        }
        let train_samples = workload.num_samples(Split::Train);
        if train_samples == 0 {
            return Err(TrainError::EmptyData {
                what: format!("workload `{}`", workload.name()),
                reason: "the training split has no samples".into(),
            });
        }
        let optimizer = AdamW::new(&params, AdamWConfig::from_config(&cfg.optimizer))?;
        tracing::debug!(
            workload = workload.name(),
            params = param_count(&params),
            tensors = params.len(),
            train_samples,
            dtype = %dtype_name(dtype),
            "trainer built"
        );
        Ok(Trainer {
            workload,
            replica_devices: vec![device.clone()],
            replicas: Vec::new(),
            factory: None,
            device,
            dtype,
            params,
            optimizer,
            schedule: LrSchedule::from_config(&cfg.optimizer, cfg.run.max_steps),
            scaler: LossScaler::from_config(&cfg.precision),
            init_rng,
            dropout_rng: StreamRng::new(seed, Stream::Dropout),
            sampler: Sampler::new(seed, train_samples),
            seed,
            train_samples,
            cursor: DataCursor::default(),
            step: 0,
            counters: Counters::default(),
            batch_size: t.batch_size,
            grad_accum: t.grad_accum,
            layout: Layout::single(t.batch_size, t.grad_accum),
            grad_clip: t.grad_clip,
            on_nonfinite: t.on_nonfinite,
            eval_batches: t.eval_batches,
            world: None,
        })
    }

    /// Steps completed.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// Samples per optimizer step (`batch_size * grad_accum`).
    pub fn samples_per_step(&self) -> usize {
        self.batch_size * self.grad_accum
    }

    /// How a step's samples are cut up (replicas, micro-batch, accumulation).
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Cuts the following steps' samples as `layout` says. It must keep the
    /// effective batch (`replicas × micro_batch × grad_accum` =
    /// [`samples_per_step`](Self::samples_per_step)); the samples and their
    /// order do not change.
    pub fn set_layout(&mut self, layout: Layout) -> Result<(), TrainError> {
        let effective = self.samples_per_step();
        if layout.replicas == 0 || layout.micro_batch == 0 || layout.grad_accum == 0 {
            return Err(TrainError::config("train.micro_batch", format!("layout {layout} has a zero factor")));
        }
        if layout.samples_per_step() != effective {
            return Err(TrainError::config(
                "train.micro_batch",
                format!(
                    "layout {layout} does not keep the effective batch train.batch_size × train.grad_accum = {effective}"
                ),
            ));
        }
        if layout != self.layout {
            tracing::debug!(from = %self.layout, to = %layout, "layout changed");
        }
        self.layout = layout;
        Ok(())
    }

    /// Makes this trainer one rank of a data-parallel world of
    /// `world.size()` ranks: the layout becomes one replica per rank, and
    /// each step this rank computes only its replica's shard, the ranks sum
    /// their gradients and losses in rank order, and every rank applies the
    /// same update. Every rank holds the whole training state (parameters,
    /// optimizer, data cursor), identical on all ranks after every step, so
    /// N ranks train exactly as one process with N replicas.
    ///
    /// A world of one is the same as none. Refused when the effective batch
    /// does not split into `world.size()` equal shards; with dropout (a rank
    /// cannot know the dropout draws of the ranks before it, which one
    /// process with replicas draws from one stream); and with
    /// `on_nonfinite = "rollback"`. The out-of-memory back-off is off in a
    /// world: one rank shrinking its micro-batch alone would break the sum.
    pub fn join_world(&mut self, world: Box<dyn Collective>, dropout: f64) -> Result<(), TrainError> {
        let n = world.size();
        if n <= 1 {
            return Ok(());
        }
        if dropout > 0.0 {
            return Err(TrainError::config(
                "model.dropout",
                format!(
                    "must be 0 in a data-parallel run of {n} ranks (got {dropout}); train with one rank to use dropout"
                ),
            ));
        }
        if self.on_nonfinite == OnNonFinite::Rollback {
            return Err(TrainError::config(
                "train.on_nonfinite",
                format!(
                    "\"rollback\" reloads a checkpoint on one process; in a data-parallel run of {n} ranks use \"skip\" \
                     or \"stop\" (every rank sees the same non-finite step and acts alike)"
                ),
            ));
        }
        let effective = self.samples_per_step();
        let layout = Layout::fit(effective, n, self.layout.micro_batch).ok_or_else(|| {
            TrainError::config(
                "train.batch_size",
                format!(
                    "the effective batch train.batch_size × train.grad_accum = {effective} must split into {n} \
                     equal shards, one per rank: make it a multiple of {n}"
                ),
            )
        })?;
        self.set_layout(layout)?;
        self.world = Some(world);
        Ok(())
    }

    /// ZeRO-1 (`[distributed] shard_optimizer`): after
    /// [`join_world`](Self::join_world), keep the optimizer moments of only
    /// this rank's slice of the parameters (`distributed::chunk_bounds` of
    /// their total, flattened in name order). Training stays bit for bit the
    /// same; [`snapshot`](Self::snapshot) then gathers the whole state, so
    /// every rank must take it at the same time, and
    /// [`snapshot_part`](Self::snapshot_part) takes this rank's part of a
    /// checkpoint written in parts. Nothing to do alone.
    pub fn shard_optimizer(&mut self) -> Result<(), TrainError> {
        let Some(world) = &self.world else { return Ok(()) };
        let total: usize = self.params.values().map(|v| v.elem_count()).sum();
        let (start, len) = crate::distributed::collective::chunk_bounds(total, world.size())[world.rank()];
        self.optimizer.shard_to(&self.params, ShardRange { start, end: start + len })
    }

    /// This rank's part of a checkpoint of a sharded optimizer's state
    /// (`checkpoint::parts`): the pieces of the moments it keeps, shared,
    /// not copied (each step replaces them). `None` when not sharded.
    pub fn optimizer_part(&self) -> Result<Option<TensorSet>, TrainError> {
        if self.optimizer.shard_range().is_none() {
            return Ok(None);
        }
        let (part, _) = self.optimizer.state_shared(&self.params, None, &mut TensorSet::new())?;
        Ok(Some(part))
    }

    /// This rank's slice of the optimizer state, when sharded.
    pub fn optimizer_shard(&self) -> Option<ShardRange> {
        self.optimizer.shard_range()
    }

    /// This rank and the world's size (`(0, 1)` for a process alone).
    pub fn rank_and_size(&self) -> (usize, usize) {
        self.world.as_ref().map_or((0, 1), |w| (w.rank(), w.size()))
    }

    /// The device parameters and batches live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Runs replica `r` of the following steps on `devices[r % devices.len()]`
    /// (as the placement plan assigns them). The first must be the
    /// trainer's own device, where replica 0, the master parameters and the
    /// optimizer live. Each other replica gets its own instance of the
    /// workload there, built at its first step. Refused for a trainer built
    /// from one workload instance ([`with_workload`](Self::with_workload)),
    /// which cannot make another.
    pub fn place_replicas(&mut self, devices: Vec<Device>) -> Result<(), TrainError> {
        match devices.first() {
            Some(first) if first.same_device(&self.device) => {}
            _ => {
                return Err(TrainError::Build {
                    workload: self.workload.name().to_string(),
                    message: format!(
                        "replica 0 must run on the trainer's device {:?}, but the devices given start with {:?}",
                        self.device,
                        devices.first()
                    ),
                });
            }
        }
        if devices.len() > 1 && self.factory.is_none() {
            return Err(TrainError::Build {
                workload: self.workload.name().to_string(),
                message: format!(
                    "it was given to the trainer as one instance (Trainer::with_workload), so it cannot be \
                     replicated onto {} devices: build the trainer with Trainer::from_registry_on",
                    devices.len()
                ),
            });
        }
        self.replica_devices = devices;
        self.replicas.clear();
        Ok(())
    }

    /// The devices replicas run on ([`place_replicas`](Self::place_replicas)).
    pub fn replica_devices(&self) -> &[Device] {
        &self.replica_devices
    }

    /// Makes sure replicas `1..count` exist (when this trainer can make
    /// them) and copies the master parameters into each.
    fn prepare_replicas(&mut self, count: usize, step: u64) -> Result<(), TrainError> {
        let Some(factory) = self.factory.clone() else { return Ok(()) };
        if self.world.is_some() {
            // A rank computes only its own replica, on its own device.
            return Ok(());
        }
        let wanted = count.saturating_sub(1);
        self.replicas.truncate(wanted);
        while self.replicas.len() < wanted {
            let r = self.replicas.len() + 1;
            let device = self.replica_devices[r % self.replica_devices.len()].clone();
            let mut workload = factory()?;
            let store = ParamStore::new(device.clone(), StreamRng::new(self.seed, Stream::Init));
            workload.build(store.var_builder()).map_err(|e| TrainError::Build {
                workload: workload.name().to_string(),
                message: format!("replica {r} on {device:?}: {}", candle_message(&e)),
            })?;
            let (params, _) = store.into_parts();
            let same = params.len() == self.params.len()
                && params.iter().zip(&self.params).all(|((a, va), (b, vb))| a == b && va.dims() == vb.dims());
            if !same {
                return Err(TrainError::Build {
                    workload: workload.name().to_string(),
                    message: format!(
                        "replica {r} declared other parameters than replica 0: a workload must declare the same \
                         names and shapes every time it is built"
                    ),
                });
            }
            self.replicas.push(Replica { device, workload, params });
        }
        for (i, replica) in self.replicas.iter().enumerate() {
            for (name, var) in &replica.params {
                let fail = |e: candle_core::Error| TrainError::Step {
                    step,
                    during: "copying parameters to the replicas",
                    message: format!("replica {} `{name}`: {}", i + 1, candle_message(&e)),
                };
                let value = self.params[name].as_tensor().to_device(&replica.device).map_err(fail)?;
                var.set(&value).map_err(fail)?;
            }
        }
        Ok(())
    }

    /// Number of scalar parameters.
    pub fn param_count(&self) -> usize {
        param_count(&self.params)
    }

    /// Parameter names and shapes, in name order.
    pub fn param_shapes(&self) -> Vec<(String, Vec<usize>)> {
        self.params.iter().map(|(n, v)| (n.clone(), v.dims().to_vec())).collect()
    }

    /// The dtype matrix products run in.
    pub fn compute_dtype(&self) -> DType {
        self.dtype
    }

    /// Where the next training batch starts.
    pub fn cursor(&self) -> DataCursor {
        self.cursor
    }

    /// The current epoch of the data cursor.
    pub fn epoch(&self) -> u64 {
        self.cursor.epoch
    }

    /// Running totals.
    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// The learning rate the next step will use.
    pub fn next_lr(&self) -> f64 {
        self.schedule.lr_at(self.step)
    }

    /// Moves the data cursor past `n` micro-batches without training on
    /// them (the step count does not change).
    pub fn skip_batches(&mut self, n: u64) {
        self.sampler.skip(&mut self.cursor, n * self.batch_size as u64);
        self.counters.batches += n;
        self.counters.batches_skipped += n;
        tracing::info!(batches = n, cursor = ?self.cursor, "skipped training batches");
    }

    /// After a rollback: moves the cursor just past the micro-batches of the
    /// step `event` reported, so the run continues on different data.
    /// Returns how many micro-batches were skipped.
    pub fn skip_past(&mut self, event: &NonFiniteEvent) -> Result<u64, TrainError> {
        let Some(n) = event.batches_end.checked_sub(self.counters.batches) else {
            return Err(TrainError::state(
                "counters.batches",
                format!(
                    "the restored state has consumed {} batches, past the {} of the failed step {}: restore an earlier checkpoint",
                    self.counters.batches, event.batches_end, event.step
                ),
            ));
        };
        self.skip_batches(n);
        Ok(n)
    }

    /// One optimizer step over the effective batch, cut up as the
    /// [`layout`](Self::layout) says; `should_stop` is polled before each
    /// micro-batch. An out-of-memory error in a micro-batch is
    /// [`TrainError::OutOfMemory`] and leaves the trainer as after the
    /// previous step (see [`train_step_with_backoff`](Self::train_step_with_backoff)).
    pub fn train_step(&mut self, should_stop: &dyn Fn() -> bool) -> Result<StepResult, TrainError> {
        let started = Instant::now();
        self.optimizer.release_values();
        let step_no = self.step + 1;
        let layout = self.layout;

        // Work on copies; commit them only when the step completes.
        let mut cursor = self.cursor;
        let mut dropout = self.dropout_rng.clone();
        let scale = self.scaler.scale();
        // The step's samples in data order; replica r takes the r-th shard.
        let indices = self.sampler.take(&mut cursor, layout.samples_per_step());
        let Some(work) = self.forward_backward(step_no, &indices, scale, &mut dropout, should_stop)? else {
            return Ok(StepResult::Interrupted);
        };
        // This rank's own work, before it waits for any other rank: on a
        // GPU the backward kernels may still be running, so wait for them
        // first (the gradient sum reads them right after anyway).
        if self.world.is_some() {
            self.device.synchronize().map_err(step_error(step_no, "waiting for the backward pass"))?;
        }
        let compute_s = started.elapsed().as_secs_f64();
        let Combined { mut grads, micro_losses, tokens, rank_compute_s } = self.combine(step_no, work, compute_s)?;
        // Summed in step order, as one process adds its micro-batches.
        let loss_sum: f64 = micro_losses.iter().fold(0.0, |acc, l| acc + l);
        let loss_finite = micro_losses.iter().all(|l| l.is_finite());

        let loss = loss_sum / (layout.replicas * layout.grad_accum) as f64;
        if scale != 1.0 {
            for g in grads.values_mut() {
                *g = g.affine(1.0 / scale, 0.0).map_err(step_error(step_no, "unscaling gradients"))?;
            }
        }
        let grad_norm =
            if loss_finite { global_norm(&grads).map_err(step_error(step_no, "the gradient norm"))? } else { f64::NAN };
        let samples = self.samples_per_step() as u64;

        if !(loss_finite && grad_norm.is_finite()) {
            if let Some(end) = self.on_nonfinite_step(step_no, loss, grad_norm, loss_finite) {
                return Ok(end);
            }
            let lr = self.schedule.lr_at(self.step);
            self.commit(cursor, dropout, samples, tokens);
            let m = self.metrics(started, loss, lr, grad_norm, false, samples, tokens, true);
            return Ok(StepResult::Completed(StepMetrics { rank_compute_s, ..m }));
        }

        let (clipped, lr) = self.apply(step_no, &mut grads, grad_norm)?;
        self.scaler.update(true);
        self.commit(cursor, dropout, samples, tokens);
        let m = self.metrics(started, loss, lr, grad_norm, clipped, samples, tokens, false);
        Ok(StepResult::Completed(StepMetrics { rank_compute_s, ..m }))
    }

    /// Forward and backward over the step's micro-batches (`indices`, in data
    /// order), replica by replica: each replica's gradients, moved to the
    /// trainer's device, and every micro-batch's loss in step order. In a
    /// world of ranks this rank computes only its own replica, and never
    /// stops inside a step: the others would wait for it in the sum.
    /// `None` when `should_stop` interrupted it (nothing was applied).
    fn forward_backward(
        &mut self,
        step_no: u64,
        indices: &[usize],
        scale: f64,
        dropout: &mut StreamRng,
        should_stop: &dyn Fn() -> bool,
    ) -> Result<Option<StepWork>, TrainError> {
        let layout = self.layout;
        let mut replica_grads: Vec<BTreeMap<String, Tensor>> = Vec::with_capacity(layout.replicas);
        let mut micro_losses: Vec<f64> = Vec::with_capacity(layout.replicas * layout.grad_accum);
        let mut tokens: Option<u64> = None;
        let mine = self.world.as_ref().map(|w| w.rank());
        self.prepare_replicas(layout.replicas, step_no)?;
        // Tests make this rank's own work in a step slow here
        // (`train::compute=sleep(…)`: a straggler).
        fail::fail_point!("train::compute");

        for (replica, shard) in indices.chunks(layout.per_replica()).enumerate() {
            if mine.is_some_and(|m| m != replica) {
                continue;
            }
            let target = match replica.checked_sub(1).and_then(|i| self.replicas.get(i)) {
                Some(r) => Target { workload: &*r.workload, params: &r.params, device: &r.device },
                None => Target { workload: &*self.workload, params: &self.params, device: &self.device },
            };
            let mut grads: BTreeMap<String, Tensor> = BTreeMap::new();
            for micro in shard.chunks(layout.micro_batch) {
                if mine.is_none() && should_stop() {
                    tracing::debug!(step = step_no, "step interrupted; partial work discarded");
                    return Ok(None);
                }
                let weight = scale / layout.grad_accum as f64;
                let out = self.micro_batch(&target, step_no, micro, weight, dropout, &mut grads)?;
                if let Some(t) = out.tokens {
                    *tokens.get_or_insert(0) += t as u64;
                }
                micro_losses.push(out.loss);
            }
            // Averaged on the trainer's device (a no-op copy when the replica is there too).
            for g in grads.values_mut() {
                *g = g.to_device(&self.device).map_err(oom_or(step_no, layout, "copying gradients from a replica"))?;
            }
            replica_grads.push(grads);
        }
        Ok(Some(StepWork { replica_grads, micro_losses, tokens }))
    }

    /// The step's gradient, its micro-batch losses and its tokens: the mean
    /// of this process's replicas, or in a world of ranks the mean across
    /// ranks with every rank's losses, tokens and `compute_s` (no gradient
    /// when a loss is not finite: the step will not be applied, so there is
    /// no sum to agree on).
    fn combine(&self, step_no: u64, work: StepWork, compute_s: f64) -> Result<Combined, TrainError> {
        let StepWork { mut replica_grads, micro_losses, tokens } = work;
        match &self.world {
            None => {
                let grads =
                    average_replicas(replica_grads).map_err(oom_or(step_no, self.layout, "averaging replicas"))?;
                Ok(Combined { grads, micro_losses, tokens, rank_compute_s: Vec::new() })
            }
            Some(world) => {
                let Gathered { losses: all_losses, tokens: all_tokens, compute_s: rank_compute_s } =
                    gather_losses(&**world, step_no, &micro_losses, tokens, compute_s)?;
                let local = replica_grads.pop().unwrap_or_default();
                let grads = if all_losses.iter().all(|l| l.is_finite()) {
                    average_across_ranks(&**world, step_no, local, &self.device)?
                } else {
                    BTreeMap::new()
                };
                Ok(Combined { grads, micro_losses: all_losses, tokens: all_tokens, rank_compute_s })
            }
        }
    }

    /// A step whose loss or gradient is not finite: a loss-scale overflow
    /// lowers the scale and skips it; otherwise `on_nonfinite` skips it, or
    /// ends training with what to do next. `None`: skipped (the caller
    /// commits the step without an update).
    fn on_nonfinite_step(&mut self, step_no: u64, loss: f64, grad_norm: f64, loss_finite: bool) -> Option<StepResult> {
        let event = NonFiniteEvent {
            step: step_no,
            loss,
            grad_norm,
            batches_end: self.counters.batches + self.grad_accum as u64,
        };
        let scaler_overflow = self.scaler.enabled() && loss_finite;
        if scaler_overflow {
            self.scaler.update(false);
            self.counters.scaler_skipped += 1;
            tracing::debug!(
                step = step_no,
                scale = self.scaler.scale(),
                "gradient overflow; step skipped and loss scale reduced"
            );
            return None;
        }
        match self.on_nonfinite {
            OnNonFinite::Skip => {
                self.counters.nonfinite_skipped += 1;
                tracing::warn!(step = step_no, loss, grad_norm, "non-finite loss or gradient; step skipped");
                None
            }
            OnNonFinite::Stop => {
                tracing::error!(step = step_no, loss, grad_norm, "non-finite loss or gradient; stopping");
                Some(StepResult::NonFiniteStop(event))
            }
            OnNonFinite::Rollback => {
                tracing::warn!(step = step_no, loss, grad_norm, "non-finite loss or gradient; rollback requested");
                Some(StepResult::NonFiniteRollback(event))
            }
        }
    }

    /// Clips `grads` to `grad_clip` and applies the optimizer (sharded across
    /// ranks when it is) at this step's learning rate; returns whether it
    /// clipped, and the rate.
    fn apply(
        &mut self,
        step_no: u64,
        grads: &mut BTreeMap<String, Tensor>,
        grad_norm: f64,
    ) -> Result<(bool, f64), TrainError> {
        let clipped = self.grad_clip > 0.0 && grad_norm > self.grad_clip;
        if clipped {
            let coef = self.grad_clip / (grad_norm + 1e-6);
            for g in grads.values_mut() {
                *g = g.affine(coef, 0.0).map_err(step_error(step_no, "clipping gradients"))?;
            }
            self.counters.clipped += 1;
        }
        let lr = self.schedule.lr_at(self.step);
        match (&self.world, self.optimizer.shard_range()) {
            (Some(world), Some(_)) => {
                let gather = |mine: Vec<f32>| all_gather_f32(&**world, mine);
                self.optimizer.step_sharded(&self.params, grads, lr, &gather)
            }
            _ => self.optimizer.step(&self.params, grads, lr),
        }
        .map_err(step_error(step_no, "the optimizer update"))?;
        Ok((clipped, lr))
    }

    /// Forward and backward of one micro-batch: adds its gradient, weighted
    /// by `weight` (loss scale / accumulation), into `grads`. A non-finite
    /// loss adds nothing (the step will not be applied). Out-of-memory
    /// errors come back as [`TrainError::OutOfMemory`].
    fn micro_batch(
        &self,
        target: &Target<'_>,
        step: u64,
        indices: &[usize],
        weight: f64,
        dropout: &mut StreamRng,
        grads: &mut BTreeMap<String, Tensor>,
    ) -> Result<MicroBatchOut, TrainError> {
        let layout = Layout { micro_batch: indices.len(), ..self.layout };
        // Test-only injections (failpoints are compiled in for `cargo test`
        // builds): an allocation failure, and any other step failure.
        fail::fail_point!("train::oom", |_| Err(TrainError::OutOfMemory {
            step,
            micro_batch: indices.len(),
            during: "the forward pass",
            message: "injected allocation failure (failpoint train::oom)".into(),
        }));
        fail::fail_point!("train::step_error", |_| Err(TrainError::Step {
            step,
            during: "the forward pass",
            message: "injected failure (failpoint train::step_error)".into(),
        }));
        let batch = target.workload.batch(Split::Train, indices, target.device).map_err(oom_or(
            step,
            layout,
            "building the batch",
        ))?;
        let mut ctx = ForwardCtx::training(self.dtype, dropout);
        let loss = target.workload.loss(&batch, &mut ctx).map_err(oom_or(step, layout, "the forward pass"))?;
        let loss = scalar_f32(&loss).map_err(oom_or(step, layout, "the forward pass"))?;
        let value = f64::from(loss.to_scalar::<f32>().map_err(oom_or(step, layout, "reading the loss"))?);
        let out = MicroBatchOut { loss: value, tokens: batch.tokens };
        if !value.is_finite() {
            return Ok(out);
        }
        let scaled = loss.affine(weight, 0.0).map_err(oom_or(step, layout, "scaling the loss"))?;
        let store = scaled.backward().map_err(oom_or(step, layout, "the backward pass"))?;
        for (name, var) in target.params {
            let Some(g) = store.get(var) else { continue };
            let g = g.to_dtype(DType::F32).map_err(oom_or(step, layout, "accumulating gradients"))?;
            match grads.entry(name.clone()) {
                Entry::Vacant(e) => {
                    e.insert(g);
                }
                Entry::Occupied(mut e) => {
                    let sum = (e.get() + g).map_err(oom_or(step, layout, "accumulating gradients"))?;
                    e.insert(sum);
                }
            }
        }
        Ok(out)
    }

    fn commit(&mut self, cursor: DataCursor, dropout: StreamRng, samples: u64, tokens: Option<u64>) {
        self.cursor = cursor;
        self.dropout_rng = dropout;
        self.step += 1;
        self.counters.batches += self.grad_accum as u64;
        self.counters.samples += samples;
        self.counters.tokens += tokens.unwrap_or(0);
    }

    #[allow(clippy::too_many_arguments)]
    fn metrics(
        &self,
        started: Instant,
        loss: f64,
        lr: f64,
        grad_norm: f64,
        clipped: bool,
        samples: u64,
        tokens: Option<u64>,
        skipped_nonfinite: bool,
    ) -> StepMetrics {
        let elapsed = started.elapsed().as_secs_f64().max(1e-9);
        StepMetrics {
            step: self.step,
            loss,
            lr,
            grad_norm,
            clipped,
            samples,
            tokens,
            samples_per_s: samples as f64 / elapsed,
            tokens_per_s: tokens.map(|t| t as f64 / elapsed),
            loss_scale: self.scaler.enabled().then(|| self.scaler.scale()),
            skipped_nonfinite,
            epoch: self.cursor.epoch,
            elapsed_s: elapsed,
            rank_compute_s: Vec::new(),
        }
    }

    /// Mean validation loss over `eval_batches` batches of the validation
    /// split, in index order (wrapping around a small split). Uses no
    /// dropout and touches neither the data cursor nor any RNG stream.
    pub fn evaluate(&mut self) -> Result<f64, TrainError> {
        let n = self.workload.num_samples(Split::Validation);
        if n == 0 {
            return Err(TrainError::EmptyData {
                what: "validation split".into(),
                reason: "no validation samples; set `[data] val_fraction` above 0".into(),
            });
        }
        if self.eval_batches == 0 {
            return Err(TrainError::config("train.eval_batches", "must be at least 1 to evaluate"));
        }
        let step = self.step;
        let fail = |e: candle_core::Error| TrainError::Eval { step, message: candle_message(&e) };
        let mut total = 0.0;
        for b in 0..self.eval_batches {
            let indices: Vec<usize> = (b * self.batch_size..(b + 1) * self.batch_size).map(|i| i % n).collect();
            let batch = self.workload.batch(Split::Validation, &indices, &self.device).map_err(fail)?;
            let mut ctx = ForwardCtx::evaluation(self.dtype);
            let loss = self.workload.loss(&batch, &mut ctx).and_then(|l| scalar_f32(&l.detach())).map_err(fail)?;
            total += f64::from(loss.to_scalar::<f32>().map_err(fail)?);
        }
        Ok(total / self.eval_batches as f64)
    }
}

/// What one micro-batch contributed besides its gradient.
struct MicroBatchOut {
    loss: f64,
    tokens: Option<usize>,
}

/// What a step's forward and backward passes left to combine.
struct StepWork {
    /// Each computed replica's gradients, on the trainer's device.
    replica_grads: Vec<BTreeMap<String, Tensor>>,
    /// Each micro-batch's loss, in step order.
    micro_losses: Vec<f64>,
    tokens: Option<u64>,
}

/// The step's gradient, with the losses and tokens of every micro-batch
/// that went into it (every rank's, in a world).
struct Combined {
    grads: BTreeMap<String, Tensor>,
    /// In step order.
    micro_losses: Vec<f64>,
    tokens: Option<u64>,
    /// In a world: each rank's own seconds ([`StepMetrics::rank_compute_s`]).
    rank_compute_s: Vec<f64>,
}

/// Maps a candle error of step `step` outside a micro-batch.
fn step_error(step: u64, during: &'static str) -> impl Fn(candle_core::Error) -> TrainError {
    move |e| TrainError::Step { step, during, message: candle_message(&e) }
}

/// Maps a candle error of a micro-batch: out of memory (retryable, nothing
/// was applied) or any other step failure.
fn oom_or(step: u64, layout: Layout, during: &'static str) -> impl Fn(candle_core::Error) -> TrainError {
    move |e| {
        let message = candle_message(&e);
        if is_out_of_memory(&e) {
            TrainError::OutOfMemory { step, micro_batch: layout.micro_batch, during, message }
        } else {
            TrainError::Step { step, during, message }
        }
    }
}

/// The loss as an f32 scalar, or an error if the workload returned another shape.
fn scalar_f32(loss: &Tensor) -> candle_core::Result<Tensor> {
    if loss.rank() != 0 {
        candle_core::bail!("the workload's loss must be a scalar, got shape {:?}", loss.dims());
    }
    loss.to_dtype(DType::F32)
}

/// Global L2 norm of all gradients, accumulated in f64 in name order.
fn global_norm(grads: &BTreeMap<String, Tensor>) -> candle_core::Result<f64> {
    let mut sum = 0.0f64;
    for g in grads.values() {
        sum += g.to_dtype(DType::F64)?.sqr()?.sum_all()?.to_scalar::<f64>()?;
    }
    Ok(sum.sqrt())
}
