//! NVIDIA GPUs through NVML (`nvml-wrapper`). The wrapper loads
//! `libnvidia-ml` at run time, so the binary builds and runs without it; a
//! machine without the driver library gets the note "NVIDIA: no driver
//! library" and no devices.
//!
//! A GPU in MIG mode cannot be used whole by CUDA, so it is listed as its MIG
//! instances (UUIDs `MIG-…`, index of the parent GPU) instead.

use nvml_wrapper::Device;
use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError, TemperatureSensor};
use nvml_wrapper::error::NvmlError;

use super::error::GpuError;
use super::probe::{DeviceHealth, GpuDevice, GpuProbe, Probed, Vendor};

/// NVML reports bytes; devices carry MiB.
const MIB: u64 = 1 << 20;
/// NVML's `NVML_DEVICE_MIG_ENABLE`.
const MIG_ENABLED: u32 = 1;
/// The most MIG instances one GPU can hold (A100/H100: 7).
const MAX_MIG_INSTANCES: u32 = 7;

/// NVML, initialised once; `Err` holds the note explaining why not.
pub struct NvidiaProbe {
    nvml: Result<Nvml, String>,
}

impl NvidiaProbe {
    /// Loads and initialises NVML. Never fails: a missing library or driver
    /// becomes the note every later [`probe`](GpuProbe::probe) returns.
    pub fn new() -> NvidiaProbe {
        NvidiaProbe { nvml: Nvml::init().map_err(|e| init_note(&e)) }
    }
}

impl Default for NvidiaProbe {
    fn default() -> Self {
        NvidiaProbe::new()
    }
}

/// The note for an NVML that did not initialise.
pub(crate) fn init_note(error: &NvmlError) -> String {
    match error {
        NvmlError::LibloadingError(_) | NvmlError::FailedToLoadSymbol(_) | NvmlError::LibraryNotFound => {
            "NVIDIA: no driver library (libnvidia-ml could not be loaded)".to_string()
        }
        NvmlError::DriverNotLoaded => "NVIDIA: driver library found but the kernel driver is not loaded".to_string(),
        NvmlError::NoPermission => "NVIDIA: no permission to query the driver".to_string(),
        other => format!("NVIDIA: NVML did not initialise: {other}"),
    }
}

impl GpuProbe for NvidiaProbe {
    fn name(&self) -> String {
        "nvml".into()
    }

    fn probe(&self) -> Result<Probed, GpuError> {
        let nvml = match &self.nvml {
            Ok(nvml) => nvml,
            Err(note) => return Ok(Probed { devices: Vec::new(), notes: vec![note.clone()] }),
        };
        let failed = |e: NvmlError| GpuError::Probe { vendor: "NVIDIA", message: e.to_string() };
        let count = nvml.device_count().map_err(failed)?;
        let driver = nvml.sys_driver_version().ok();
        let mut found = Probed::default();
        for index in 0..count {
            let device = match nvml.device_by_index(index) {
                Ok(device) => device,
                Err(e) => {
                    found.notes.push(format!("NVIDIA: GPU {index} is not readable: {e}"));
                    continue;
                }
            };
            let mig_on = device.mig_mode().is_ok_and(|mode| mode.current == MIG_ENABLED);
            if !mig_on {
                match describe(&device, index, false, driver.as_deref()) {
                    Ok(d) => found.devices.push(d),
                    Err(e) => found.notes.push(format!("NVIDIA: GPU {index} is not readable: {e}")),
                }
                continue;
            }
            let before = found.devices.len();
            for slot in 0..MAX_MIG_INSTANCES {
                let Ok(instance) = device.mig_device_by_index(slot) else { continue };
                match describe(&instance, index, true, driver.as_deref()) {
                    Ok(d) => found.devices.push(d),
                    Err(e) => found.notes.push(format!("NVIDIA: MIG instance {slot} of GPU {index}: {e}")),
                }
            }
            let instances = found.devices.len() - before;
            found.notes.push(format!(
                "NVIDIA: GPU {index} is in MIG mode: listed as its {instances} MIG instance(s); \
                 select them with CUDA_VISIBLE_DEVICES=MIG-<uuid>"
            ));
        }
        Ok(found)
    }
}

fn describe(device: &Device<'_>, index: u32, mig: bool, driver: Option<&str>) -> Result<GpuDevice, NvmlError> {
    let memory = device.memory_info()?;
    let mig_suffix = if mig { " (MIG)" } else { "" };
    Ok(GpuDevice {
        vendor: Vendor::Nvidia,
        index,
        uuid: device.uuid().ok(),
        name: format!("{}{mig_suffix}", device.name().unwrap_or_else(|_| "NVIDIA GPU".to_string())),
        memory_total_mib: memory.total / MIB,
        memory_free_mib: memory.free / MIB,
        utilization_pct: device.utilization_rates().ok().map(|u| u.gpu),
        temperature_c: device.temperature(TemperatureSensor::Gpu).ok().map(f64::from),
        // NVML reports milliwatts.
        power_w: device.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
        driver_version: driver.map(str::to_string),
        health: health(device),
    })
}

/// The health counters NVML reports for `device` (each left out where the
/// card, its mode or the driver does not report it). Remapped rows are not
/// asked: nvml-wrapper 0.13 does not expose `nvmlDeviceGetRemappedRows`.
fn health(device: &Device<'_>) -> Option<DeviceHealth> {
    let health = DeviceHealth {
        ecc_uncorrected: device.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile).ok(),
        retired_pages_pending: device.are_pages_pending_retired().ok(),
        remapped_rows_pending: None,
        throttle_reasons: device.current_throttle_reasons().map(throttle_words).unwrap_or_default(),
    };
    health.reports_anything().then_some(health)
}

/// The throttle reasons that make a device slow for a reason of its own
/// (not idleness or a clock setting someone chose), as words.
fn throttle_words(reasons: ThrottleReasons) -> Vec<String> {
    [
        (ThrottleReasons::HW_SLOWDOWN, "hw_slowdown"),
        (ThrottleReasons::HW_THERMAL_SLOWDOWN, "hw_thermal_slowdown"),
        (ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN, "hw_power_brake_slowdown"),
        (ThrottleReasons::SW_THERMAL_SLOWDOWN, "sw_thermal_slowdown"),
    ]
    .into_iter()
    .filter(|(flag, _)| reasons.contains(*flag))
    .map(|(_, word)| word.to_string())
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_library_is_reported_as_no_driver_library() {
        let note = init_note(&NvmlError::FailedToLoadSymbol("nvmlInit_v2".into()));
        assert!(note.starts_with("NVIDIA: no driver library"), "{note}");
        assert!(init_note(&NvmlError::DriverNotLoaded).contains("kernel driver is not loaded"));
    }

    #[test]
    fn only_throttle_reasons_of_the_device_itself_are_kept() {
        let words = throttle_words(ThrottleReasons::GPU_IDLE | ThrottleReasons::HW_THERMAL_SLOWDOWN);
        assert_eq!(words, ["hw_thermal_slowdown"]);
        assert!(throttle_words(ThrottleReasons::APPLICATIONS_CLOCKS_SETTING).is_empty());
    }

    #[test]
    fn probing_without_nvml_is_a_note_not_an_error() {
        let probe = NvidiaProbe { nvml: Err("NVIDIA: no driver library".into()) };
        let found = probe.probe().unwrap();
        assert!(found.devices.is_empty());
        assert_eq!(found.notes, ["NVIDIA: no driver library"]);
    }
}
