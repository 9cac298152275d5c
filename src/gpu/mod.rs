//! GPUs: what the node has, what the job may use, how a run is placed on it,
//! and how it is watched. Whether the whole machine is ready for a run is
//! `crate::doctor`'s, which uses these.
//!
//! - `probe.rs`: the [`GpuProbe`] trait, [`GpuDevice`], a fixed probe for tests.
//! - `system.rs`: [`SystemProbe`], the vendor probes of this build together.
//! - `nvidia.rs`: NVML (`nvml-wrapper`, loaded at run time).
//! - `amd.rs`: ROCm SMI (`rocm_smi_lib`, cargo feature `rocm`).
//! - `inventory.rs`: a JSON description of a node instead of probing.
//! - `visible.rs`: the devices allotted to the job (CUDA/ROCr/HIP/SLURM variables).
//! - `placement.rs`: the placement plan, a pure function (docs/placement.md).
//! - `host.rs`: host CPU, RAM and free disk.
//! - `monitor.rs`: the background sampler writing `gpu_stats.jsonl`.
//! - `overview.rs`: what `rekindle gpus` shows (devices, plan, notes).
//! - `error.rs`: [`GpuError`].

#[cfg(feature = "rocm")]
mod amd;
mod error;
mod host;
mod inventory;
mod monitor;
mod nvidia;
mod overview;
mod placement;
mod probe;
mod system;
mod visible;

#[cfg(feature = "rocm")]
pub use amd::AmdProbe;
pub use error::GpuError;
pub(crate) use host::nearest_existing;
pub use host::{HostProbe, HostStats, SysinfoHost, free_disk_bytes};
pub use inventory::{InventoryProbe, parse_inventory, read_inventory};
pub use monitor::{Monitor, MonitorSettings, MonitorSummary, MonitorWarning, STATS_FILE, WarningTracker};
pub use nvidia::NvidiaProbe;
pub use overview::{GpusReport, NO_AMD_BACKEND, gpus_report, report_from};
pub(crate) use overview::{choose_devices, host_available_bytes};
pub use placement::{DeviceKind, Footprint, Placement, PlacementRequest, Plan, PlanDevice, place};
#[cfg(test)]
pub(crate) use probe::tests::device as test_device;
pub use probe::{DeviceHealth, DeviceKey, GpuDevice, GpuProbe, Probed, StaticProbe, Vendor};
pub use system::SystemProbe;
pub use visible::{EnvMap, VISIBILITY_VARIABLES, Visible, process_env, utf8_env, visible_devices};
