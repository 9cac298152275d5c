//! What a GPU probe reports and the small trait every probe implements: the
//! vendor probes (combined by `system.rs`), the JSON inventory
//! (`inventory.rs`) and a fixed list for tests all answer with [`Probed`].
//! The vendors depend on this file, never the reverse.
//!
//! A probe that cannot find its driver library is not failing: it returns no
//! devices and a note ("NVIDIA: no driver library"), so a GPU-less machine
//! gets an honest answer instead of an error.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::error::GpuError;

/// GPU vendors rekindle can detect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Vendor {
    Nvidia,
    Amd,
}

impl Vendor {
    /// Lower-case name, as in inventories and `gpu_stats.jsonl`.
    pub fn as_str(self) -> &'static str {
        match self {
            Vendor::Nvidia => "nvidia",
            Vendor::Amd => "amd",
        }
    }

    /// Parses `nvidia` or `amd` (case-insensitive).
    pub fn parse(text: &str) -> Option<Vendor> {
        match text.to_ascii_lowercase().as_str() {
            "nvidia" => Some(Vendor::Nvidia),
            "amd" => Some(Vendor::Amd),
            _ => None,
        }
    }
}

impl fmt::Display for Vendor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One device as a probe saw it. Memory in MiB (2^20 bytes); optional values
/// are `None` when the backend does not offer them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuDevice {
    pub vendor: Vendor,
    /// The vendor library's index (NVML / ROCm SMI order), which is what
    /// index entries of the visibility variables refer to.
    pub index: u32,
    /// `GPU-…` for whole NVIDIA GPUs, `MIG-…` for MIG instances, `GPU-<hex>`
    /// (the unique id) for AMD.
    pub uuid: Option<String>,
    pub name: String,
    pub memory_total_mib: u64,
    pub memory_free_mib: u64,
    pub utilization_pct: Option<u32>,
    pub temperature_c: Option<f64>,
    pub power_w: Option<f64>,
    /// Driver (or management library) version.
    pub driver_version: Option<String>,
    /// What the driver reports about the device's health (`None`: it
    /// reports nothing, or the backend does not ask).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<DeviceHealth>,
}

/// A device's health counters, each `None` when the driver does not report
/// it (ECC off, a card or driver without the counter).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceHealth {
    /// Uncorrected (double-bit) ECC errors since the driver loaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ecc_uncorrected: Option<u64>,
    /// Memory pages waiting to be retired (NVML; the GPU needs a reset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retired_pages_pending: Option<bool>,
    /// Memory rows waiting to be remapped (A100 and later; needs a reset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remapped_rows_pending: Option<bool>,
    /// Why the clocks are held down now (hardware slowdown, thermal, power
    /// brake): a slow device, not a broken one. Empty when none or unknown.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub throttle_reasons: Vec<String>,
}

impl DeviceHealth {
    /// Whether any counter was reported at all.
    pub fn reports_anything(&self) -> bool {
        self.ecc_uncorrected.is_some()
            || self.retired_pages_pending.is_some()
            || self.remapped_rows_pending.is_some()
            || !self.throttle_reasons.is_empty()
    }
}

impl GpuDevice {
    /// Memory in use (total minus free), in MiB.
    pub fn memory_used_mib(&self) -> u64 {
        self.memory_total_mib.saturating_sub(self.memory_free_mib)
    }

    /// A MIG instance (an NVIDIA GPU slice addressed by its `MIG-` UUID).
    pub fn is_mig(&self) -> bool {
        self.uuid.as_deref().is_some_and(|u| u.len() >= 4 && u[..4].eq_ignore_ascii_case("MIG-"))
    }

    /// What identifies this device across samples.
    pub fn key(&self) -> DeviceKey {
        DeviceKey { vendor: self.vendor, index: self.index, uuid: self.uuid.clone() }
    }
}

/// Identity of a device: vendor, index and UUID when known.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DeviceKey {
    pub vendor: Vendor,
    pub index: u32,
    pub uuid: Option<String>,
}

/// What one probe found: devices, and notes about what it could not see.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Probed {
    pub devices: Vec<GpuDevice>,
    /// E.g. "NVIDIA: no driver library"; never errors the user must fix.
    pub notes: Vec<String>,
}

impl Probed {
    /// Appends another probe's devices and notes.
    pub fn extend(&mut self, other: Probed) {
        self.devices.extend(other.devices);
        self.notes.extend(other.notes);
    }
}

/// Lists the GPUs of this node (or of a described one).
pub trait GpuProbe: Send {
    /// Short name for messages ("nvml", "inventory data/node.json").
    fn name(&self) -> String;

    /// Current devices with their memory and, where offered, utilisation,
    /// temperature and power. Missing driver libraries are notes, not errors.
    fn probe(&self) -> Result<Probed, GpuError>;
}

/// A probe that answers from memory: the given results in order, then the
/// last one forever. For tests and for injecting a known node.
pub struct StaticProbe {
    queue: Mutex<VecDeque<Result<Probed, String>>>,
    last: Mutex<Result<Probed, String>>,
}

impl StaticProbe {
    /// Always answers `devices` (no notes).
    pub fn new(devices: Vec<GpuDevice>) -> StaticProbe {
        StaticProbe::sequence(vec![Ok(Probed { devices, notes: Vec::new() })])
    }

    /// Answers each result in turn (an `Err` becomes [`GpuError::Probe`]),
    /// then repeats the last.
    pub fn sequence(results: Vec<Result<Probed, String>>) -> StaticProbe {
        let last = results.last().cloned().unwrap_or_else(|| Ok(Probed::default()));
        StaticProbe { queue: Mutex::new(results.into()), last: Mutex::new(last) }
    }
}

impl GpuProbe for StaticProbe {
    fn name(&self) -> String {
        "static".into()
    }

    fn probe(&self) -> Result<Probed, GpuError> {
        let next = self.queue.lock().unwrap_or_else(|e| e.into_inner()).pop_front();
        let answer = match next {
            Some(answer) => answer,
            None => self.last.lock().unwrap_or_else(|e| e.into_inner()).clone(),
        };
        answer.map_err(|message| GpuError::Probe { vendor: "static", message })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A device with the given identity and memory (GiB) and nothing else.
    pub(crate) fn device(vendor: Vendor, index: u32, uuid: Option<&str>, total_gib: u64, free_gib: u64) -> GpuDevice {
        GpuDevice {
            vendor,
            index,
            uuid: uuid.map(str::to_string),
            name: format!("{vendor} test {total_gib}G"),
            memory_total_mib: total_gib * 1024,
            memory_free_mib: free_gib * 1024,
            utilization_pct: None,
            temperature_c: None,
            power_w: None,
            driver_version: None,
            health: None,
        }
    }

    #[test]
    fn mig_devices_are_recognised_by_uuid_prefix() {
        assert!(device(Vendor::Nvidia, 0, Some("MIG-4f1c"), 10, 10).is_mig());
        assert!(device(Vendor::Nvidia, 0, Some("mig-4f1c"), 10, 10).is_mig());
        assert!(!device(Vendor::Nvidia, 0, Some("GPU-4f1c"), 10, 10).is_mig());
        assert!(!device(Vendor::Nvidia, 0, None, 10, 10).is_mig());
    }

    #[test]
    fn used_memory_never_underflows() {
        let mut d = device(Vendor::Amd, 0, None, 16, 10);
        assert_eq!(d.memory_used_mib(), 6 * 1024);
        d.memory_free_mib = d.memory_total_mib + 1;
        assert_eq!(d.memory_used_mib(), 0);
    }

    #[test]
    fn static_probe_repeats_its_last_answer() {
        let probe = StaticProbe::sequence(vec![Err("lost".into()), Ok(Probed::default())]);
        assert!(matches!(probe.probe(), Err(GpuError::Probe { .. })));
        assert_eq!(probe.probe().unwrap(), Probed::default());
        assert_eq!(probe.probe().unwrap(), Probed::default());
    }
}
