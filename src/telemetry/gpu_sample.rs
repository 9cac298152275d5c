//! `gpu_stats.jsonl`: one [`GpuSample`] every `[gpu] monitor_interval` (the
//! writer is `gpu::Monitor`), and the report's view of those lines.

use std::path::PathBuf;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::records::time_field;

/// One line of `gpu_stats.jsonl`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GpuSample {
    /// RFC 3339, UTC.
    pub time: String,
    /// The devices the run uses (empty on the CPU).
    pub devices: Vec<GpuDeviceStats>,
    pub host: HostSample,
    /// Why the devices could not be probed this time (absent when they were).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One device in a sample; `null` where the backend does not say.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GpuDeviceStats {
    /// `nvidia` or `amd`.
    pub vendor: String,
    pub index: u32,
    pub uuid: Option<String>,
    pub utilization_pct: Option<u32>,
    pub memory_used_mib: u64,
    pub memory_total_mib: u64,
    pub temperature_c: Option<f64>,
    pub power_w: Option<f64>,
}

/// The host in a sample.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HostSample {
    /// Mean use over all CPUs since the previous sample, 0–100.
    pub cpu_pct: f32,
    pub ram_used_mib: u64,
    pub ram_total_mib: u64,
    /// Free space on the checkpoint filesystem (`null`: unknown).
    pub disk_free_mib: Option<u64>,
    /// The checkpoint directory whose filesystem is watched.
    pub disk_dir: PathBuf,
}

/// One device in one sample, for plotting.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuDevicePoint {
    /// `nvidia 0`, `amd 1`, …: stable across samples.
    pub label: String,
    pub utilization_pct: Option<f64>,
    pub memory_used_mib: Option<f64>,
    pub memory_total_mib: Option<f64>,
}

/// One sample, for plotting.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuPoint {
    pub time: DateTime<Utc>,
    pub devices: Vec<GpuDevicePoint>,
}

/// Types GPU monitor records; lines without a time (or that do not fit) are skipped.
pub fn gpu_samples_from(records: &[Value]) -> Vec<GpuPoint> {
    let mut out: Vec<GpuPoint> = records.iter().filter_map(gpu_point).collect();
    out.sort_by_key(|s| s.time);
    out
}

/// One GPU monitor record for plotting (a reader that streams the file
/// takes it a line at a time); `None` without a time or when it does not fit.
pub fn gpu_point(r: &Value) -> Option<GpuPoint> {
    let time = time_field(r, "time")?;
    let sample: GpuSample = serde_json::from_value(r.clone()).ok()?;
    let devices = sample
        .devices
        .iter()
        .map(|d| GpuDevicePoint {
            label: format!("{} {}", if d.vendor.is_empty() { "gpu" } else { &d.vendor }, d.index),
            utilization_pct: d.utilization_pct.map(f64::from),
            memory_used_mib: Some(d.memory_used_mib as f64),
            memory_total_mib: Some(d.memory_total_mib as f64),
        })
        .collect();
    Some(GpuPoint { time, devices })
}
