//! What `rekindle gpus` shows: the devices allotted to the job (probed, or
//! read from an inventory), the plan a run of the given config would use,
//! and notes about everything not seen or not usable. JSON through
//! `Serialize`, text through `Display`.

use std::fmt;
use std::path::Path;

use serde::Serialize;

use crate::config::{Config, GpuBackend};

use super::error::GpuError;
use super::inventory::InventoryProbe;
use super::placement::{DeviceKind, Footprint, PlacementRequest, Plan, PlanDevice, place};
use super::probe::{GpuDevice, GpuProbe, Vendor};
use super::system::SystemProbe;
use super::visible::{EnvMap, process_env, visible_devices};

const MIB: u64 = 1 << 20;

/// The answer of `rekindle gpus`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpusReport {
    /// Where the devices came from: the probes' names or `inventory FILE`.
    pub source: String,
    /// The devices allotted to the job, in runtime order.
    pub devices: Vec<GpuDevice>,
    /// The plan; `None` when nothing fits (see `plan_error`).
    pub plan: Option<Plan>,
    /// Why no plan fits, when none does.
    pub plan_error: Option<String>,
    /// Device indices of each replica, in stage order (empty on the CPU).
    pub assignment: Vec<Vec<u32>>,
    /// What was not seen or will not be used, e.g. "NVIDIA: no driver library".
    pub notes: Vec<String>,
}

impl GpusReport {
    /// Exit-code helper for the CLI: true when a plan exists.
    pub fn has_plan(&self) -> bool {
        self.plan.is_some()
    }
}

/// Probes this node (or reads `inventory`) and plans `cfg`'s run for
/// `footprint`. The visibility variables apply to probed devices only: an
/// inventory describes exactly the devices a job would get.
pub fn gpus_report(inventory: Option<&Path>, cfg: &Config, footprint: Footprint) -> Result<GpusReport, GpuError> {
    match inventory {
        Some(path) => report_from(&InventoryProbe::new(path), None, cfg, footprint, None),
        None => {
            let host_free = host_available_bytes();
            report_from(&SystemProbe::new(), Some(&process_env()), cfg, footprint, host_free)
        }
    }
}

/// [`gpus_report`] with everything injected: `env` is `None` to take the
/// probed devices as allotted; `host_free_bytes` bounds the CPU plan.
pub fn report_from(
    probe: &dyn GpuProbe,
    env: Option<&EnvMap>,
    cfg: &Config,
    footprint: Footprint,
    host_free_bytes: Option<u64>,
) -> Result<GpusReport, GpuError> {
    let probed = probe.probe()?;
    let mut notes = probed.notes;
    let devices = match env {
        Some(env) => {
            let visible = visible_devices(env, &probed.devices);
            notes.extend(visible.notes);
            visible.devices
        }
        None => probed.devices,
    };

    let (kind, usable) = choose_devices(&devices, cfg.gpu.backend, &mut notes);
    let request = PlacementRequest {
        kind,
        devices: usable.iter().map(|d| PlanDevice { index: d.index, free_bytes: d.memory_free_mib * MIB }).collect(),
        footprint,
        target_batch: cfg.train.batch_size * cfg.train.grad_accum,
        headroom: cfg.gpu.headroom,
        host_free_bytes,
    };
    let (plan, plan_error, assignment) = match place(&request) {
        Ok(placement) => (Some(placement.plan), None, placement.groups),
        Err(GpuError::NoPlacement { reason }) => (None, Some(reason), Vec::new()),
        Err(other) => return Err(other),
    };
    match kind {
        DeviceKind::Cpu => {}
        DeviceKind::Cuda if candle_core::utils::cuda_is_available() => {}
        DeviceKind::Cuda => notes.push(
            "this build has no CUDA backend (candle's `cuda` feature is not compiled in): a run with this binary \
             trains on the CPU (or stops, with [gpu] require = true)"
                .into(),
        ),
        DeviceKind::Rocm => notes.push(format!("{NO_AMD_BACKEND} (or stops, with [gpu] require = true)")),
    }
    Ok(GpusReport { source: probe.name(), devices, plan, plan_error, assignment, notes })
}

/// Why a plan for AMD GPUs trains on the CPU: what `rekindle gpus`,
/// `rekindle doctor` and a run's `gpu_fallback` event say.
pub const NO_AMD_BACKEND: &str = "no AMD compute backend in this build, training on CPU (candle has no ROCm backend: \
                                  AMD GPUs are detected and planned for, but cannot train)";

/// The devices the plan may use under `[gpu] backend`, and their kind.
pub(crate) fn choose_devices<'a>(
    devices: &'a [GpuDevice],
    backend: GpuBackend,
    notes: &mut Vec<String>,
) -> (DeviceKind, Vec<&'a GpuDevice>) {
    let of = |vendor| devices.iter().filter(|d| d.vendor == vendor).collect::<Vec<_>>();
    let (nvidia, amd) = (of(Vendor::Nvidia), of(Vendor::Amd));
    match backend {
        GpuBackend::Cpu => {
            if !devices.is_empty() {
                notes.push(format!("[gpu] backend = \"cpu\": the {} visible GPU(s) are not used", devices.len()));
            }
            (DeviceKind::Cpu, Vec::new())
        }
        GpuBackend::Cuda if nvidia.is_empty() => {
            notes.push("[gpu] backend = \"cuda\" but no NVIDIA GPU is visible".into());
            (DeviceKind::Cpu, Vec::new())
        }
        GpuBackend::Rocm if amd.is_empty() => {
            notes.push("[gpu] backend = \"rocm\" but no AMD GPU is visible".into());
            (DeviceKind::Cpu, Vec::new())
        }
        GpuBackend::Cuda => (DeviceKind::Cuda, nvidia),
        GpuBackend::Rocm => (DeviceKind::Rocm, amd),
        GpuBackend::Auto if !nvidia.is_empty() => {
            if !amd.is_empty() {
                notes.push(format!(
                    "both NVIDIA and AMD GPUs are visible: planning for the {} NVIDIA one(s); set [gpu] backend to choose",
                    nvidia.len()
                ));
            }
            (DeviceKind::Cuda, nvidia)
        }
        GpuBackend::Auto if !amd.is_empty() => (DeviceKind::Rocm, amd),
        GpuBackend::Auto => (DeviceKind::Cpu, Vec::new()),
    }
}

/// Host memory available now, for the CPU plan (`None` if unreadable).
pub(crate) fn host_available_bytes() -> Option<u64> {
    let refresh = sysinfo::RefreshKind::nothing().with_memory(sysinfo::MemoryRefreshKind::nothing().with_ram());
    sysinfo::System::new_with_specifics(refresh).ok().map(|s| s.available_memory()).filter(|&b| b > 0)
}

fn gib(mib: u64) -> String {
    format!("{:.1} GiB", mib as f64 / 1024.0)
}

impl fmt::Display for GpusReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.devices.is_empty() {
            writeln!(f, "GPUs ({}): none visible", self.source)?;
        } else {
            writeln!(f, "GPUs ({}): {} visible", self.source, self.devices.len())?;
        }
        for d in &self.devices {
            write!(
                f,
                "  {} {}  {}  {} total, {} free",
                d.vendor,
                d.index,
                d.name,
                gib(d.memory_total_mib),
                gib(d.memory_free_mib)
            )?;
            if let Some(pct) = d.utilization_pct {
                write!(f, ", {pct}% busy")?;
            }
            if let Some(t) = d.temperature_c {
                write!(f, ", {t:.0} °C")?;
            }
            if let Some(w) = d.power_w {
                write!(f, ", {w:.0} W")?;
            }
            if let Some(v) = &d.driver_version {
                write!(f, ", driver {v}")?;
            }
            if let Some(u) = &d.uuid {
                write!(f, "  [{u}]")?;
            }
            writeln!(f)?;
        }
        match (&self.plan, &self.plan_error) {
            (Some(plan), _) => {
                writeln!(f, "plan: {plan}")?;
                if !self.assignment.is_empty() {
                    let groups: Vec<String> = self
                        .assignment
                        .iter()
                        .map(|g| format!("[{}]", g.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")))
                        .collect();
                    writeln!(f, "  devices per replica: {}", groups.join(" "))?;
                }
                writeln!(f, "  why: {}", plan.reason)?;
            }
            (None, Some(error)) => writeln!(f, "plan: none fits: {error}")?,
            (None, None) => writeln!(f, "plan: none")?,
        }
        if !self.notes.is_empty() {
            writeln!(f, "notes:")?;
            for note in &self.notes {
                writeln!(f, "  - {note}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::probe::tests::device;
    use crate::gpu::probe::{Probed, StaticProbe};

    fn footprint() -> Footprint {
        Footprint::estimate_from_params(100_000_000, 4, 64 << 20)
    }

    fn report(devices: Vec<GpuDevice>, env: Option<&EnvMap>, cfg: &Config) -> GpusReport {
        report_from(&StaticProbe::new(devices), env, cfg, footprint(), None).unwrap()
    }

    #[test]
    fn gpu_less_machine_gets_a_cpu_plan_and_notes() {
        let probe = StaticProbe::sequence(vec![Ok(Probed {
            devices: vec![],
            notes: vec!["NVIDIA: no driver library (libnvidia-ml could not be loaded)".into()],
        })]);
        let r = report_from(&probe, Some(&EnvMap::new()), &Config::default(), footprint(), Some(8 << 30)).unwrap();
        let plan = r.plan.as_ref().unwrap();
        assert_eq!(plan.device_kind, DeviceKind::Cpu);
        assert_eq!(plan.effective_batch(), 32);
        assert!(r.notes[0].starts_with("NVIDIA: no driver library"));
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["devices"], serde_json::json!([]));
        assert_eq!(json["plan"]["device_kind"], "cpu");
        for key in ["replicas", "devices_per_replica", "micro_batch", "grad_accum", "reason"] {
            assert!(!json["plan"][key].is_null(), "{key}");
        }
        let text = r.to_string();
        assert!(text.starts_with("GPUs (static): none visible\nplan: cpu: 1 replica(s)"), "{text}");
        assert!(text.contains("notes:\n  - NVIDIA: no driver library"), "{text}");
    }

    #[test]
    fn two_nvidia_gpus_plan_data_parallel_and_say_cuda_is_not_built() {
        let devices = vec![device(Vendor::Nvidia, 0, Some("GPU-a"), 80, 78), device(Vendor::Nvidia, 1, None, 80, 78)];
        let r = report(devices, None, &Config::default());
        let plan = r.plan.unwrap();
        assert_eq!((plan.device_kind, plan.replicas, plan.devices_per_replica), (DeviceKind::Cuda, 2, 1));
        assert_eq!(r.assignment, [[0], [1]]);
        // Only a build without the `cuda` feature says it cannot train there.
        let says_no_cuda = r.notes.iter().any(|n| n.contains("no CUDA backend"));
        assert_eq!(says_no_cuda, !candle_core::utils::cuda_is_available(), "{:?}", r.notes);
    }

    #[test]
    fn amd_gpus_plan_but_say_there_is_no_amd_compute_backend() {
        let r = report(vec![device(Vendor::Amd, 0, None, 64, 64)], None, &Config::default());
        assert_eq!(r.plan.unwrap().device_kind, DeviceKind::Rocm);
        assert!(
            r.notes.iter().any(|n| n.starts_with("no AMD compute backend in this build, training on CPU")),
            "{:?}",
            r.notes
        );
    }

    #[test]
    fn visibility_applies_to_probed_devices() {
        let devices = vec![device(Vendor::Nvidia, 0, None, 80, 78), device(Vendor::Nvidia, 1, None, 80, 78)];
        let env: EnvMap = [("CUDA_VISIBLE_DEVICES".to_string(), "1".to_string())].into();
        let r = report(devices, Some(&env), &Config::default());
        assert_eq!(r.devices.len(), 1);
        assert_eq!(r.devices[0].index, 1);
        assert_eq!(r.assignment, [[1]]);
        assert!(r.notes.iter().any(|n| n.starts_with("CUDA_VISIBLE_DEVICES=\"1\"")), "{:?}", r.notes);
    }

    #[test]
    fn backend_setting_chooses_the_devices() {
        let devices = vec![device(Vendor::Nvidia, 0, None, 16, 16), device(Vendor::Amd, 0, None, 64, 64)];
        let mut cfg = Config::default();
        let kind = |cfg: &Config| report(devices.clone(), None, cfg).plan.unwrap().device_kind;
        assert_eq!(kind(&cfg), DeviceKind::Cuda);
        cfg.gpu.backend = GpuBackend::Rocm;
        assert_eq!(kind(&cfg), DeviceKind::Rocm);
        cfg.gpu.backend = GpuBackend::Cpu;
        assert_eq!(kind(&cfg), DeviceKind::Cpu);
        let r = report(
            vec![device(Vendor::Amd, 0, None, 64, 64)],
            None,
            &Config { gpu: cfg.gpu.clone(), ..Config::default() },
        );
        assert!(r.notes.iter().any(|n| n.contains("backend = \"cpu\"")));
        cfg.gpu.backend = GpuBackend::Cuda;
        let r = report(vec![device(Vendor::Amd, 0, None, 64, 64)], None, &cfg);
        assert_eq!(r.plan.unwrap().device_kind, DeviceKind::Cpu);
        assert!(r.notes.iter().any(|n| n.contains("no NVIDIA GPU is visible")));
    }

    #[test]
    fn a_model_that_fits_nowhere_reports_why() {
        let big = Footprint::estimate_from_params(10_000_000_000, 4, 1 << 20);
        let r = report_from(
            &StaticProbe::new(vec![device(Vendor::Nvidia, 0, None, 16, 16)]),
            None,
            &Config::default(),
            big,
            None,
        )
        .unwrap();
        assert!(r.plan.is_none());
        assert!(!r.has_plan());
        assert!(r.plan_error.as_deref().unwrap().contains("does not fit the 1 cuda device(s)"));
        assert!(r.to_string().contains("plan: none fits: the model does not fit"));
        assert!(serde_json::to_value(&r).unwrap()["plan"].is_null());
    }

    #[test]
    fn inventory_file_drives_the_report() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.json");
        std::fs::write(
            &path,
            r#"{"devices": [{"vendor": "nvidia", "name": "H100", "memory_total_mib": 81559, "memory_free_mib": 80000},
                            {"vendor": "nvidia", "name": "H100", "memory_total_mib": 81559, "memory_free_mib": 80000},
                            {"vendor": "nvidia", "name": "H100", "memory_total_mib": 81559, "memory_free_mib": 80000},
                            {"vendor": "nvidia", "name": "H100", "memory_total_mib": 81559, "memory_free_mib": 80000}]}"#,
        )
        .unwrap();
        let r = gpus_report(Some(&path), &Config::default(), footprint()).unwrap();
        assert_eq!(r.devices.len(), 4);
        assert_eq!(r.plan.as_ref().unwrap().replicas, 4);
        assert!(r.source.starts_with("inventory "));
        let text = r.to_string();
        assert!(text.contains("nvidia 0  H100  79.6 GiB total, 78.1 GiB free"), "{text}");
        assert!(text.contains("devices per replica: [0] [1] [2] [3]"), "{text}");
        let missing = gpus_report(Some(&dir.path().join("nope.json")), &Config::default(), footprint());
        assert!(matches!(missing, Err(GpuError::InventoryRead { .. })));
    }

    #[test]
    fn probing_this_machine_is_honest() {
        // Whatever this machine has, the report is produced without error.
        let r = gpus_report(None, &Config::default(), footprint()).unwrap();
        if r.devices.is_empty() {
            assert_eq!(r.plan.unwrap().device_kind, DeviceKind::Cpu);
            assert!(r.notes.iter().any(|n| n.starts_with("NVIDIA:")), "{:?}", r.notes);
        }
    }

    /// Property tests: a GPU inventory (`rekindle gpus --inventory`,
    /// `REKINDLE_GPU_INVENTORY`) arbitrary or mutated, then planned for
    /// several models and visibility variables: a plan or a named error,
    /// never a panic (memory sizes near u64::MAX, thousands of devices).
    mod fuzz {
        use super::*;
        use crate::fuzz;
        use crate::gpu::inventory::parse_inventory;
        use proptest::prelude::*;

        fn valid() -> Vec<u8> {
            br#"{"devices": [
                {"vendor": "nvidia", "name": "H100", "memory_total_mib": 81559, "memory_free_mib": 80000, "index": 0},
                {"vendor": "amd", "name": "MI250", "memory_total_mib": 65536, "index": 3, "busy": true}
            ]}"#
            .to_vec()
        }

        fn plan_every_way(bytes: &[u8]) {
            let Ok(devices) = parse_inventory(&String::from_utf8_lossy(bytes), Path::new("fuzz.json")) else { return };
            let env: EnvMap = [("CUDA_VISIBLE_DEVICES".to_string(), "0,3,18446744073709551615".to_string())].into();
            for params in [1, 100_000_000, u64::MAX / 64] {
                let footprint = Footprint::estimate_from_params(params, 4, 64 << 20);
                for env in [None, Some(&env)] {
                    if let Ok(r) = report_from(
                        &StaticProbe::new(devices.clone()),
                        env,
                        &Config::default(),
                        footprint,
                        Some(u64::MAX),
                    ) {
                        let _ = (r.to_string(), serde_json::to_string(&r).unwrap());
                    }
                }
            }
        }

        proptest! {
            #![proptest_config(fuzz::config())]

            #[test]
            fn arbitrary_inventories_plan_or_are_refused(bytes in fuzz::bytes(256)) {
                plan_every_way(&bytes);
            }

            #[test]
            fn mutated_inventories_plan_or_are_refused(bytes in fuzz::mutated(valid())) {
                plan_every_way(&bytes);
            }
        }
    }
}
