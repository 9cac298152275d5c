//! AMD GPUs through ROCm SMI (`rocm_smi_lib`, cargo feature `rocm`).
//!
//! The crate links `librocm_smi64` at build time, so a binary built with this
//! feature needs that library at run time. Its bundled header is newer than
//! the library Debian ships (5.2): some of the crate's convenience calls use
//! functions that library lacks (`rsmi_dev_revision_get`,
//! `rsmi_dev_current_socket_power_get`, …) and would not link. So this file
//! calls only the raw functions 5.2 has: init, device count, name, unique id,
//! VRAM total/used, busy percent, edge temperature, average power and the
//! version queries.

use std::ffi::CStr;
use std::os::raw::c_char;

use rocm_smi_lib::{
    rsmi_dev_busy_percent_get, rsmi_dev_ecc_count_get, rsmi_dev_memory_total_get, rsmi_dev_memory_usage_get,
    rsmi_dev_name_get, rsmi_dev_power_ave_get, rsmi_dev_temp_metric_get, rsmi_dev_unique_id_get, rsmi_error_count_t,
    rsmi_gpu_block_t_RSMI_GPU_BLOCK_UMC, rsmi_init, rsmi_memory_type_t_RSMI_MEM_TYPE_VRAM, rsmi_num_monitor_devices,
    rsmi_shut_down, rsmi_status_t, rsmi_status_t_RSMI_STATUS_SUCCESS, rsmi_sw_component_t_RSMI_SW_COMP_DRIVER,
    rsmi_temperature_metric_t_RSMI_TEMP_CURRENT, rsmi_temperature_type_t_RSMI_TEMP_TYPE_EDGE, rsmi_version_str_get,
};

use super::error::GpuError;
use super::probe::{DeviceHealth, GpuDevice, GpuProbe, Probed, Vendor};

const MIB: u64 = 1 << 20;
const TEXT_LEN: usize = 256;

/// ROCm SMI, initialised once; `Err` holds the note explaining why not.
pub struct AmdProbe {
    ready: Result<(), String>,
}

impl AmdProbe {
    /// Initialises ROCm SMI. Never fails: a failure becomes the note every
    /// later [`probe`](GpuProbe::probe) returns. Without an AMD GPU the
    /// library initialises and reports no devices.
    pub fn new() -> AmdProbe {
        // SAFETY: rsmi_init takes flags by value and has no preconditions.
        let status = unsafe { rsmi_init(0) };
        let ready = ok(status).map_err(|status| {
            // RSMI_STATUS_INIT_ERROR: typically no amdgpu kernel driver (no /sys/class/drm).
            let hint = if status == 8 { ": no AMD GPU driver found" } else { "" };
            format!("AMD: ROCm SMI did not initialise (status {status}{hint})")
        });
        AmdProbe { ready }
    }
}

impl Default for AmdProbe {
    fn default() -> Self {
        AmdProbe::new()
    }
}

impl Drop for AmdProbe {
    fn drop(&mut self) {
        if self.ready.is_ok() {
            // SAFETY: paired with the successful rsmi_init in `new`.
            unsafe { rsmi_shut_down() };
        }
    }
}

fn ok(status: rsmi_status_t) -> Result<(), rsmi_status_t> {
    if status == rsmi_status_t_RSMI_STATUS_SUCCESS { Ok(()) } else { Err(status) }
}

/// Reads a NUL-terminated string the library writes into our buffer.
fn read_text(fill: impl FnOnce(*mut c_char, usize) -> rsmi_status_t) -> Option<String> {
    let mut buffer = [0 as c_char; TEXT_LEN];
    ok(fill(buffer.as_mut_ptr(), TEXT_LEN - 1)).ok()?;
    buffer[TEXT_LEN - 1] = 0;
    // SAFETY: the buffer is NUL-terminated (last byte forced to 0 above).
    let text = unsafe { CStr::from_ptr(buffer.as_ptr()) };
    Some(text.to_string_lossy().trim().to_string()).filter(|t| !t.is_empty())
}

impl GpuProbe for AmdProbe {
    fn name(&self) -> String {
        "rocm-smi".into()
    }

    fn probe(&self) -> Result<Probed, GpuError> {
        if let Err(note) = &self.ready {
            return Ok(Probed { devices: Vec::new(), notes: vec![note.clone()] });
        }
        let mut count = 0u32;
        // SAFETY: `count` is a valid out-pointer for the duration of the call.
        ok(unsafe { rsmi_num_monitor_devices(&mut count) }).map_err(|status| GpuError::Probe {
            vendor: "AMD",
            message: format!("rsmi_num_monitor_devices returned status {status}"),
        })?;
        // SAFETY (all calls below): every pointer is to a live local of the
        // type the C function writes, or a buffer of the length passed.
        let driver = read_text(|buf, len| unsafe {
            rsmi_version_str_get(rsmi_sw_component_t_RSMI_SW_COMP_DRIVER, buf, len as u32)
        });
        let mut found = Probed::default();
        for index in 0..count {
            let (mut total, mut used) = (0u64, 0u64);
            let memory =
                ok(unsafe { rsmi_dev_memory_total_get(index, rsmi_memory_type_t_RSMI_MEM_TYPE_VRAM, &mut total) })
                    .and_then(|_| {
                        ok(unsafe {
                            rsmi_dev_memory_usage_get(index, rsmi_memory_type_t_RSMI_MEM_TYPE_VRAM, &mut used)
                        })
                    });
            if let Err(status) = memory {
                found.notes.push(format!("AMD: GPU {index} memory is not readable (status {status})"));
                continue;
            }
            let mut unique = 0u64;
            let uuid =
                ok(unsafe { rsmi_dev_unique_id_get(index, &mut unique) }).ok().map(|_| format!("GPU-{unique:016x}"));
            let mut busy = 0u32;
            let utilization = ok(unsafe { rsmi_dev_busy_percent_get(index, &mut busy) }).ok().map(|_| busy);
            let mut millidegrees = 0i64;
            let temperature = ok(unsafe {
                rsmi_dev_temp_metric_get(
                    index,
                    rsmi_temperature_type_t_RSMI_TEMP_TYPE_EDGE,
                    rsmi_temperature_metric_t_RSMI_TEMP_CURRENT,
                    &mut millidegrees,
                )
            })
            .ok()
            .map(|_| millidegrees as f64 / 1000.0);
            let mut microwatts = 0u64;
            let power =
                ok(unsafe { rsmi_dev_power_ave_get(index, 0, &mut microwatts) }).ok().map(|_| microwatts as f64 / 1e6);
            let name = read_text(|buf, len| unsafe { rsmi_dev_name_get(index, buf, len) });
            found.devices.push(GpuDevice {
                vendor: Vendor::Amd,
                index,
                uuid,
                name: name.unwrap_or_else(|| "AMD GPU".to_string()),
                memory_total_mib: total / MIB,
                memory_free_mib: total.saturating_sub(used) / MIB,
                utilization_pct: utilization,
                temperature_c: temperature,
                power_w: power,
                driver_version: driver.clone(),
                health: health(index),
            });
        }
        Ok(found)
    }
}

/// The health counters ROCm SMI reports for device `index`: uncorrectable
/// ECC errors of the memory controller (UMC) block, where ECC is on. ROCm
/// SMI 5.2 (Debian's) has no retired-page-pending or throttle-reason query.
fn health(index: u32) -> Option<DeviceHealth> {
    let mut counts = rsmi_error_count_t { correctable_err: 0, uncorrectable_err: 0 };
    // SAFETY: `counts` is a valid, writable rsmi_error_count_t.
    let read = ok(unsafe { rsmi_dev_ecc_count_get(index, rsmi_gpu_block_t_RSMI_GPU_BLOCK_UMC, &mut counts) });
    read.ok().map(|_| DeviceHealth { ecc_uncorrected: Some(counts.uncorrectable_err), ..DeviceHealth::default() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probing_links_and_answers_without_an_amd_gpu() {
        // Proves the library links and the calls resolve; on a machine without
        // an AMD GPU the answer is simply no devices.
        let found = AmdProbe::new().probe().unwrap();
        for device in &found.devices {
            assert_eq!(device.vendor, Vendor::Amd);
            assert!(device.memory_free_mib <= device.memory_total_mib);
        }
    }
}
