//! [`SystemProbe`]: the vendor probes compiled into this build, asked in
//! turn. It sits above `nvidia.rs` and `amd.rs`, which know only the trait
//! in `probe.rs`.

#[cfg(feature = "rocm")]
use super::amd::AmdProbe;
use super::error::GpuError;
use super::nvidia::NvidiaProbe;
use super::probe::{GpuProbe, Probed};

/// The probes compiled into this build: NVIDIA always (the library is
/// loaded at run time), AMD with the `rocm` feature.
pub struct SystemProbe {
    nvidia: NvidiaProbe,
    #[cfg(feature = "rocm")]
    amd: AmdProbe,
}

impl SystemProbe {
    /// Initialises every vendor library once; failures become notes.
    pub fn new() -> SystemProbe {
        SystemProbe {
            nvidia: NvidiaProbe::new(),
            #[cfg(feature = "rocm")]
            amd: AmdProbe::new(),
        }
    }
}

impl Default for SystemProbe {
    fn default() -> Self {
        SystemProbe::new()
    }
}

impl GpuProbe for SystemProbe {
    fn name(&self) -> String {
        if cfg!(feature = "rocm") { "nvml + rocm-smi".into() } else { "nvml".into() }
    }

    fn probe(&self) -> Result<Probed, GpuError> {
        let mut found = self.nvidia.probe()?;
        #[cfg(feature = "rocm")]
        found.extend(self.amd.probe()?);
        #[cfg(not(feature = "rocm"))]
        found.notes.push("AMD: not compiled in (build with `--features rocm` to detect AMD GPUs)".into());
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_probe_answers_without_a_gpu_driver() {
        // On machines without libnvidia-ml this is a note, never an error.
        let found = SystemProbe::new().probe().unwrap();
        if found.devices.is_empty() {
            assert!(found.notes.iter().any(|n| n.starts_with("NVIDIA:")), "{:?}", found.notes);
        }
    }
}
