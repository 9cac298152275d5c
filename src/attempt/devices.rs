//! Which devices a run trains on, and keeping it training when they let it
//! down:
//!
//! - at start-up, the placement plan (probe → the devices allotted to the
//!   job → `gpu::place`, as `rekindle gpus` shows it), one candle device per
//!   replica from the plan's assignment (`Device::new_cuda(i)` in a build
//!   with the `cuda` feature; the trainer runs replica `r` there), and the
//!   CPU fallback when that backend cannot be used (or a refusal with
//!   `[gpu] require = true`);
//! - the layout `[train] micro_batch` asks for (as written, from the plan, or
//!   a number of samples);
//! - around each step, the out-of-memory back-off, and the fallback to the
//!   CPU when the first step fails on the GPU backend or a step still runs
//!   out of GPU memory at the back-off's floor;
//! - the background monitor writing `gpu_stats.jsonl`.
//!
//! `REKINDLE_GPU_INVENTORY=FILE` makes a run read a JSON inventory (the
//! format of `rekindle gpus --inventory`) instead of probing, so a test or a
//! dry run can pose as a GPU node (docs/placement.md). Nothing else reads it.

use std::path::PathBuf;
use std::sync::Arc;

use candle_core::Device;
use serde::Serialize;
use serde_json::Value;

use crate::checkpoint::{Snapshot, TensorSet};
use crate::config::{Config, MicroBatch, TrainSection};
use crate::gpu::{
    self, DeviceKind, Footprint, GpuProbe, GpusReport, InventoryProbe, Monitor, MonitorSettings, PlacementRequest,
    Plan, SysinfoHost, SystemProbe, Vendor,
};
use crate::telemetry::{ErrorEvent, Event, EventLog, GpuFallback, MonitorOutcome, OomRetry};
use crate::train::{
    Layout, Registry, StepResult, TrainError, Trainer, candle_message, checkpoint_bytes, footprint_for,
};

use crate::attempt::error::RunError;
use crate::rundir::RunDir;

/// The environment variable naming a GPU inventory for `rekindle run`.
pub const INVENTORY_ENV: &str = "REKINDLE_GPU_INVENTORY";

/// Where the devices come from.
#[derive(Debug, Clone)]
enum Source {
    System,
    Inventory(PathBuf),
}

impl Source {
    fn from_env() -> Source {
        match std::env::var_os(INVENTORY_ENV).filter(|v| !v.is_empty()) {
            Some(path) => Source::Inventory(path.into()),
            None => Source::System,
        }
    }

    fn probe(&self) -> Box<dyn GpuProbe> {
        match self {
            Source::System => Box::new(SystemProbe::new()),
            Source::Inventory(path) => Box::new(InventoryProbe::new(path)),
        }
    }
}

/// The devices a run trains on, why, and what happened to them since.
pub struct Devices {
    source: Source,
    /// What the node offers and the plan its GPUs allow.
    report: GpusReport,
    /// The plan in use (the CPU's after a fallback).
    plan: Plan,
    /// Device indices per replica in use (empty on the CPU).
    groups: Vec<Vec<u32>>,
    layout: Layout,
    /// The CPU's plan and layout, for a fallback.
    cpu: (Plan, Layout),
    /// Why the GPU plan is not used, when a GPU was wanted or required.
    unusable: Option<String>,
    require: bool,
    /// The next step is the first on a GPU backend: a failure falls back.
    first_gpu_step: bool,
    /// Events to record, in order (`gpu_fallback`, `oom_retry`, `error`).
    pending: Vec<Event>,
    /// What the trainer is rebuilt from, on another device.
    registry: Registry,
}

/// The placement, as the `start` event records it.
#[derive(Serialize)]
struct Placement<'a> {
    backend: DeviceKind,
    plan: &'a Plan,
    layout: Layout,
    /// Device indices per replica (empty on the CPU).
    devices: &'a [Vec<u32>],
    source: &'a str,
    /// GPUs visible to the job.
    visible: usize,
    /// The GPU plan not used, when there was a fallback.
    wanted: Option<&'a Plan>,
    fallback: Option<&'a str>,
    notes: &'a [String],
}

impl Devices {
    /// Plans the run for the trainer's model, initialises the backend the
    /// plan needs (rebuilding the trainer on that device) or falls back to
    /// the CPU, and sets the trainer's layout. A failure to use a GPU is not
    /// an error here: [`announce`](Self::announce) reports it (or refuses,
    /// with `[gpu] require = true`) once the start event is written.
    ///
    /// `initial` is the checkpoint the run resumes from: a trainer rebuilt
    /// on a GPU takes its parameters from it rather than drawing them.
    /// `ranks` is the data-parallel world's size: a world of several ranks
    /// trains on the CPU (one rank per process, its collectives over MPI);
    /// ranks on GPUs need NCCL, which this version does not build, and a
    /// GPU-only step of rank 0 (its first-step snapshot, a rebuild on the
    /// CPU) would leave the other ranks waiting in a collective.
    pub fn select(
        cfg: &Config,
        registry: &Registry,
        trainer: &mut Trainer,
        initial: Option<&Arc<TensorSet>>,
        ranks: usize,
    ) -> Result<Devices, RunError> {
        let source = Source::from_env();
        let footprint = footprint_for(cfg, trainer.param_count());
        let host_free = gpu::host_available_bytes();
        let env = match source {
            Source::System => Some(gpu::process_env()),
            // An inventory describes exactly the devices the job gets.
            Source::Inventory(_) => None,
        };
        let report = gpu::report_from(source.probe().as_ref(), env.as_ref(), cfg, footprint, host_free)?;
        let cpu_plan = cpu_plan(cfg, footprint, host_free)?;
        let cpu = (cpu_plan.clone(), layout_for(&cfg.train, &cpu_plan)?);

        let (gpu_kind, _) = gpu::choose_devices(&report.devices, cfg.gpu.backend, &mut Vec::new());
        let wanted = report.plan.as_ref().filter(|p| p.device_kind != DeviceKind::Cpu);
        let too_big = report.plan_error.as_ref().filter(|_| gpu_kind != DeviceKind::Cpu);
        let (plan, groups, unusable) = match (wanted, too_big) {
            (Some(_), _) | (None, Some(_)) if ranks > 1 => (
                cpu_plan,
                Vec::new(),
                Some(format!(
                    "a data-parallel run of {ranks} ranks trains on the CPU: ranks on GPUs need NCCL, which this \
                     version of rekindle does not build (docs/distributed.md)"
                )),
            ),
            (Some(plan), _) => match replica_devices(&report, plan.device_kind) {
                Ok(devices) => {
                    let mut placed =
                        Trainer::from_registry_on_resuming(cfg, registry, devices[0].clone(), initial.cloned())?;
                    placed.place_replicas(devices)?;
                    *trainer = placed;
                    (plan.clone(), report.assignment.clone(), None)
                }
                Err(reason) => (cpu_plan, Vec::new(), Some(reason.to_string())),
            },
            (None, Some(error)) => {
                (cpu_plan, Vec::new(), Some(format!("the model does not fit the visible GPUs: {error}")))
            }
            (None, None) if cfg.gpu.require => {
                let notes =
                    if report.notes.is_empty() { String::new() } else { format!(" ({})", report.notes.join("; ")) };
                (cpu_plan, Vec::new(), Some(format!("no usable GPU is visible to this job{notes}")))
            }
            (None, None) => (cpu_plan, Vec::new(), None),
        };
        let layout = layout_for(&cfg.train, &plan)?;
        trainer.set_layout(layout)?;
        Ok(Devices {
            source,
            report,
            first_gpu_step: plan.device_kind != DeviceKind::Cpu,
            plan,
            groups,
            layout,
            cpu,
            unusable,
            require: cfg.gpu.require,
            pending: Vec::new(),
            registry: registry.clone(),
        })
    }

    /// The placement, for the `start` event.
    pub fn describe(&self) -> Value {
        serde_json::to_value(Placement {
            backend: self.plan.device_kind,
            plan: &self.plan,
            layout: self.layout,
            devices: &self.groups,
            source: &self.report.source,
            visible: self.report.devices.len(),
            wanted: self.report.plan.as_ref().filter(|_| self.unusable.is_some()),
            fallback: self.unusable.as_deref(),
            notes: &self.report.notes,
        })
        .expect("the placement serialises")
    }

    /// Says what start-up decided: a `gpu_fallback` event and a loud
    /// warning when a GPU could not be used, or, with `[gpu] require =
    /// true`, an `error` event and [`RunError::GpuRequired`].
    pub fn announce(&mut self, events: &mut EventLog) -> Result<(), RunError> {
        tracing::info!(plan = %self.plan, layout = %self.layout, "placement");
        let mut decided = Ok(());
        if let Some(reason) = self.unusable.clone() {
            decided = self.fall_back_or_refuse(reason);
        } else if self.plan.device_kind != DeviceKind::Cpu && self.plan.devices_per_replica > 1 {
            tracing::warn!(
                devices = ?self.groups,
                "each replica runs on the first device of its group: splitting one replica over several devices \
                 is not implemented, so the others stay idle"
            );
        }
        self.record_events(events)?;
        decided
    }

    /// Records the events gathered since the last call.
    pub fn record_events(&mut self, events: &mut EventLog) -> Result<(), RunError> {
        for event in self.pending.drain(..) {
            events.record(&event)?;
        }
        Ok(())
    }

    /// One optimizer step with the out-of-memory back-off (an `oom_retry`
    /// event each time). When the first step on a GPU backend fails for
    /// another reason, the trainer is rebuilt on the CPU from its state
    /// before the step and the step runs there (or the run stops, with
    /// `[gpu] require = true`). When a step on a GPU backend still runs out
    /// of memory at the back-off's floor, the trainer (as after the previous
    /// step) is rebuilt on the CPU the same way and the step runs there
    /// (with `[gpu] require = true`, the out-of-memory error stops the run).
    /// Call [`record_events`](Self::record_events) after it, whatever it
    /// returns.
    pub fn step(
        &mut self,
        trainer: &mut Trainer,
        cfg: &Config,
        should_stop: &dyn Fn() -> bool,
    ) -> Result<StepResult, RunError> {
        let before = if self.first_gpu_step { Some(trainer.snapshot()?) } else { None };
        let mut retries = Vec::new();
        let result = trainer.train_step_with_backoff(should_stop, &mut |r| retries.push(r.clone()));
        for retry in retries {
            self.pending.push(Event::OomRetry(OomRetry {
                step: retry.step,
                retry: retry.retry,
                from: serde_json::to_value(retry.from).unwrap_or_default(),
                to: serde_json::to_value(retry.to).unwrap_or_default(),
                error: retry.error,
            }));
        }
        match (result, before) {
            (Ok(StepResult::Interrupted), _) => Ok(StepResult::Interrupted),
            (Ok(done), _) => {
                self.first_gpu_step = false;
                Ok(done)
            }
            (Err(e @ TrainError::OutOfMemoryRetriesExhausted { .. }), _)
                if self.plan.device_kind != DeviceKind::Cpu && !self.require =>
            {
                // A failed step leaves the trainer as after the previous one.
                let before = trainer.snapshot()?;
                let reason = format!(
                    "out of memory on the {} backend even at the back-off's smallest micro-batch: {e}",
                    self.plan.device_kind
                );
                self.fall_back_or_refuse(reason)?;
                self.rebuild_on_cpu(trainer, cfg, &before)?;
                self.step(trainer, cfg, should_stop)
            }
            (Err(e), Some(before)) if !matches!(e, TrainError::OutOfMemoryRetriesExhausted { .. }) => {
                let reason = format!("the first step failed on the {} backend: {e}", self.plan.device_kind);
                self.fall_back_or_refuse(reason)?;
                self.rebuild_on_cpu(trainer, cfg, &before)?;
                self.step(trainer, cfg, should_stop)
            }
            (Err(e), _) => Err(e.into()),
        }
    }

    /// Replaces `trainer` with one on the CPU holding `state`, in the CPU's layout.
    fn rebuild_on_cpu(&self, trainer: &mut Trainer, cfg: &Config, state: &Snapshot) -> Result<(), RunError> {
        let mut cpu = Trainer::from_registry(cfg, &self.registry)?;
        cpu.restore(&state.model, &state.optimizer, &state.state)?;
        cpu.set_layout(self.layout)?;
        *trainer = cpu;
        Ok(())
    }

    /// Starts the monitor on the devices in use (none on the CPU), warning
    /// about free disk below `param_count`'s checkpoint size. A monitor
    /// that cannot start is a warning, not a reason to stop training.
    pub fn start_monitor(&self, cfg: &Config, dir: &RunDir, param_count: usize) -> Option<Monitor> {
        let mut settings =
            MonitorSettings::new(dir.path(gpu::STATS_FILE), dir.checkpoints.clone(), cfg.gpu.monitor_interval);
        settings.expected_checkpoint_bytes = checkpoint_bytes(param_count);
        let vendor = match self.plan.device_kind {
            DeviceKind::Cuda => Some(Vendor::Nvidia),
            DeviceKind::Rocm => Some(Vendor::Amd),
            DeviceKind::Cpu => None,
        };
        let used: Vec<u32> = self.groups.iter().flatten().copied().collect();
        settings.only = Some(
            self.report
                .devices
                .iter()
                .filter(|d| Some(d.vendor) == vendor && used.contains(&d.index))
                .map(|d| d.key())
                .collect(),
        );
        start_monitor_with(self.source.probe(), settings, dir)
    }

    /// Switches to the CPU plan with a loud warning and a `gpu_fallback`
    /// event, or refuses with `[gpu] require = true`.
    fn fall_back_or_refuse(&mut self, reason: String) -> Result<(), RunError> {
        if self.require {
            let error = RunError::GpuRequired { reason };
            tracing::error!("{error}");
            self.pending.push(Event::Error(ErrorEvent {
                step: None,
                error: error.to_string(),
                ..ErrorEvent::default()
            }));
            return Err(error);
        }
        let wanted = self.report.plan.clone().filter(|p| p.device_kind != DeviceKind::Cpu);
        (self.plan, self.layout) = self.cpu.clone();
        self.groups.clear();
        self.first_gpu_step = false;
        tracing::warn!(
            "GPU FALLBACK: training on the CPU, much more slowly: {reason} \
             (set [gpu] require = true to stop instead)"
        );
        self.pending.push(Event::GpuFallback(GpuFallback {
            reason,
            wanted: serde_json::to_value(wanted).unwrap_or_default(),
            plan: serde_json::to_value(&self.plan).unwrap_or_default(),
            layout: serde_json::to_value(self.layout).unwrap_or_default(),
        }));
        Ok(())
    }
}

/// Starts the monitor of a program run by `rekindle exec` on every device
/// visible to the job (rekindle did not place the program, so it watches
/// all of them) and the host; a monitor that cannot start is a warning.
pub fn start_job_monitor(cfg: &Config, dir: &RunDir) -> Option<Monitor> {
    let settings = MonitorSettings::new(dir.path(gpu::STATS_FILE), dir.checkpoints.clone(), cfg.gpu.monitor_interval);
    start_monitor_with(Source::from_env().probe(), settings, dir)
}

fn start_monitor_with(probe: Box<dyn GpuProbe>, settings: MonitorSettings, dir: &RunDir) -> Option<Monitor> {
    let host = Box::new(SysinfoHost::new(dir.checkpoints.clone()));
    match Monitor::start(probe, host, settings, |_| {}) {
        Ok(monitor) => Some(monitor),
        Err(e) => {
            tracing::warn!(error = %e, "the GPU/host monitor did not start; the run goes on without it");
            None
        }
    }
}

/// Stops the monitor and records what it did (a `monitor` event).
pub fn stop_monitor(monitor: Option<Monitor>, events: &mut EventLog) -> Result<(), RunError> {
    let Some(monitor) = monitor else { return Ok(()) };
    let outcome = match monitor.stop() {
        Ok(summary) => MonitorOutcome::Stopped {
            samples: summary.samples,
            warnings: summary.warnings.iter().filter_map(|w| serde_json::to_value(w).ok()).collect(),
            busy_seconds: summary.busy_seconds,
        },
        Err(e) => MonitorOutcome::Failed { error: e.to_string() },
    };
    events.record(&Event::Monitor(outcome))?;
    Ok(())
}

/// The CPU's plan for this run, bounded by available host memory when that
/// is known and holds the model; otherwise unbounded (a warning says so),
/// as before plans existed.
fn cpu_plan(cfg: &Config, footprint: Footprint, host_free: Option<u64>) -> Result<Plan, RunError> {
    let request = |host_free_bytes| PlacementRequest {
        kind: DeviceKind::Cpu,
        devices: Vec::new(),
        footprint,
        target_batch: cfg.train.batch_size * cfg.train.grad_accum,
        headroom: cfg.gpu.headroom,
        host_free_bytes,
    };
    match gpu::place(&request(host_free)) {
        Ok(placement) => Ok(placement.plan),
        Err(gpu::GpuError::NoPlacement { reason }) if host_free.is_some() => {
            tracing::warn!(%reason, "planning for the CPU without a memory bound");
            Ok(gpu::place(&request(None))?.plan)
        }
        Err(e) => Err(e.into()),
    }
}

/// The layout `[train]` asks for under `plan`: unset `micro_batch` keeps
/// `batch_size` (the largest divisor of a replica's share at most that),
/// `"auto"` takes the plan's micro-batch, a number caps it the same way.
/// The effective batch is always `batch_size × grad_accum`.
pub fn layout_for(train: &TrainSection, plan: &Plan) -> Result<Layout, TrainError> {
    let effective = train.batch_size * train.grad_accum;
    let cap = match train.micro_batch {
        None => train.batch_size,
        Some(MicroBatch::Samples(m)) => m,
        Some(MicroBatch::Auto) => plan.micro_batch,
    };
    Layout::fit(effective, plan.replicas, cap).ok_or_else(|| TrainError::Config {
        key: "train.micro_batch".into(),
        reason: format!("{} replica(s) cannot share the effective batch of {effective} evenly", plan.replicas),
    })
}

/// The backend's own number for device `index` of `kind`: its position among
/// the job's devices of that vendor (CUDA renumbers the visible devices from 0).
fn runtime_ordinal(report: &GpusReport, kind: DeviceKind, index: u32) -> usize {
    let vendor = if kind == DeviceKind::Rocm { Vendor::Amd } else { Vendor::Nvidia };
    report.devices.iter().filter(|d| d.vendor == vendor).position(|d| d.index == index).unwrap_or(0)
}

/// Why a GPU backend cannot be had: the first step then trains on the CPU,
/// and the `gpu_fallback` record says why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    #[error(
        "this build has no CUDA backend (candle's `cuda` feature is not compiled in; it needs the CUDA \
         toolkit at build time)"
    )]
    NoCuda,
    #[error("the CUDA backend did not initialise on device {ordinal}: {message}")]
    CudaInit { ordinal: usize, message: String },
    #[error("{}", gpu::NO_AMD_BACKEND)]
    NoAmd,
}

/// One candle device per replica of the plan: the first device of each
/// group of the report's assignment, initialised on `kind`'s backend; or
/// why they cannot be had (the first failure).
fn replica_devices(report: &GpusReport, kind: DeviceKind) -> Result<Vec<Device>, BackendError> {
    let firsts: Vec<u32> = report.assignment.iter().filter_map(|g| g.first().copied()).collect();
    let firsts = if firsts.is_empty() { vec![0] } else { firsts };
    firsts.into_iter().map(|index| init_backend(kind, runtime_ordinal(report, kind, index))).collect()
}

/// The candle device for `kind`, or why there is none.
fn init_backend(kind: DeviceKind, ordinal: usize) -> Result<Device, BackendError> {
    // Test builds only: a stand-in backend that "initialises" as the CPU, so
    // the first-step fallback can be exercised without a GPU.
    fail::fail_point!("gpu::backend_init", |_| Ok(Device::Cpu));
    match kind {
        DeviceKind::Cpu => Ok(Device::Cpu),
        DeviceKind::Cuda if !candle_core::utils::cuda_is_available() => Err(BackendError::NoCuda),
        DeviceKind::Cuda => {
            Device::new_cuda(ordinal).map_err(|e| BackendError::CudaInit { ordinal, message: candle_message(&e) })
        }
        DeviceKind::Rocm => Err(BackendError::NoAmd),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(kind: DeviceKind, replicas: usize, micro_batch: usize, grad_accum: usize) -> Plan {
        Plan { device_kind: kind, replicas, devices_per_replica: 1, micro_batch, grad_accum, reason: String::new() }
    }

    fn train(batch_size: usize, grad_accum: usize, micro_batch: Option<MicroBatch>) -> TrainSection {
        TrainSection { batch_size, grad_accum, micro_batch, ..TrainSection::default() }
    }

    #[test]
    fn unset_micro_batch_keeps_the_config_as_written_on_one_replica() {
        let l = layout_for(&train(16, 2, None), &plan(DeviceKind::Cpu, 1, 32, 1)).unwrap();
        assert_eq!(l, Layout::single(16, 2));
    }

    #[test]
    fn auto_takes_the_plans_micro_batch_and_keeps_the_effective_batch() {
        let l = layout_for(&train(16, 2, Some(MicroBatch::Auto)), &plan(DeviceKind::Cpu, 1, 8, 4)).unwrap();
        assert_eq!(l, Layout { replicas: 1, micro_batch: 8, grad_accum: 4 });
        let l = layout_for(&train(16, 2, Some(MicroBatch::Auto)), &plan(DeviceKind::Cuda, 2, 4, 4)).unwrap();
        assert_eq!(l, Layout { replicas: 2, micro_batch: 4, grad_accum: 4 });
        assert_eq!(l.samples_per_step(), 32);
    }

    #[test]
    fn a_number_caps_the_micro_batch_per_replica() {
        let l = layout_for(&train(32, 1, Some(MicroBatch::Samples(8))), &plan(DeviceKind::Cpu, 1, 32, 1)).unwrap();
        assert_eq!(l, Layout { replicas: 1, micro_batch: 8, grad_accum: 4 });
        // 4 replicas share 32: 8 each, and 8 is at most the 16 asked for.
        let l = layout_for(&train(32, 1, Some(MicroBatch::Samples(16))), &plan(DeviceKind::Cuda, 4, 8, 1)).unwrap();
        assert_eq!(l, Layout { replicas: 4, micro_batch: 8, grad_accum: 1 });
        // Unset on 2 replicas: batch_size 32 caps each 16-sample share at 16.
        let l = layout_for(&train(32, 1, None), &plan(DeviceKind::Cuda, 2, 16, 1)).unwrap();
        assert_eq!(l, Layout { replicas: 2, micro_batch: 16, grad_accum: 1 });
    }

    #[test]
    fn replicas_that_cannot_share_the_batch_are_an_error() {
        let err = layout_for(&train(5, 1, None), &plan(DeviceKind::Cuda, 2, 2, 1)).unwrap_err();
        assert!(err.to_string().contains("2 replica(s) cannot share the effective batch of 5"), "{err}");
    }

    #[test]
    fn this_build_cannot_initialise_a_gpu_backend_and_says_why() {
        // Not under a failpoint scenario, so no stand-in backend.
        match (candle_core::utils::cuda_is_available(), init_backend(DeviceKind::Cuda, 0)) {
            // A CUDA build: a device initialises, or its error is the device's.
            (true, Ok(_)) => {}
            (true, Err(e)) => assert!(matches!(e, BackendError::CudaInit { ordinal: 0, .. }), "{e}"),
            (false, result) => {
                let cuda = result.unwrap_err();
                assert_eq!(cuda, BackendError::NoCuda);
                assert!(cuda.to_string().contains("this build has no CUDA backend"), "{cuda}");
            }
        }
        let rocm = init_backend(DeviceKind::Rocm, 0).unwrap_err().to_string();
        assert!(rocm.starts_with("no AMD compute backend in this build, training on CPU"), "{rocm}");
        assert!(init_backend(DeviceKind::Cpu, 0).unwrap().is_cpu());
    }
}
