//! GPUs: what the node has, what the job may use, how a run is placed on it,
//! how it is watched, and whether the machine is ready (`rekindle doctor`).
//!
//! - `probe.rs`: the [`GpuProbe`] trait, [`GpuDevice`], the system probe.
//! - `nvidia.rs`: NVML (`nvml-wrapper`, loaded at run time).
//! - `amd.rs`: ROCm SMI (`rocm_smi_lib`, cargo feature `rocm`).
//! - `inventory.rs`: a JSON description of a node instead of probing.
//! - `visible.rs`: the devices allotted to the job (CUDA/ROCr/HIP/SLURM variables).
//! - `placement.rs`: the placement plan, a pure function (docs/placement.md).
//! - `host.rs`: host CPU, RAM and free disk.
//! - `monitor.rs`: the background sampler writing `gpu_stats.jsonl`.
//! - `report.rs`: `rekindle gpus`.
//! - `doctor.rs`: `rekindle doctor`.
//! - `error.rs`: [`GpuError`].

#[cfg(feature = "rocm")]
mod amd;
mod doctor;
mod error;
mod host;
mod inventory;
mod monitor;
mod nvidia;
mod placement;
mod probe;
mod report;
mod visible;

#[cfg(feature = "rocm")]
pub use amd::AmdProbe;
pub use doctor::{Check, CheckStatus, Checklist, DoctorOptions, doctor, run_checks};
pub use error::GpuError;
pub use host::{HostProbe, HostStats, SysinfoHost, free_disk_bytes};
pub use inventory::{InventoryProbe, parse_inventory, read_inventory};
pub use monitor::{Monitor, MonitorSettings, MonitorSummary, MonitorWarning, STATS_FILE, WarningTracker};
pub use nvidia::NvidiaProbe;
pub use placement::{DeviceKind, Footprint, Placement, PlacementRequest, Plan, PlanDevice, place};
pub use probe::{DeviceKey, GpuDevice, GpuProbe, Probed, StaticProbe, SystemProbe, Vendor};
pub use report::{GpusReport, gpus_report, report_from};
pub(crate) use report::{choose_devices, host_available_bytes};
pub use visible::{EnvMap, VISIBILITY_VARIABLES, Visible, process_env, visible_devices};
