//! The checks of one node, made by `rekindle doctor` and at the start of
//! every attempt on every node (before the run directory is touched):
//!
//! | check | fails when |
//! |---|---|
//! | `devices` | the driver does not answer; fewer GPUs visible than SLURM allotted (to this process, where a visibility variable narrows it) |
//! | `device memory` | a visible device has less than `[health] min_free_device_memory` of its memory free |
//! | `gpu health` | uncorrected ECC errors, retired pages or remapped rows pending (throttling only warns) |
//! | `run directory` | the run directory (or its parent) is not visible from this node, or a look at it hangs |
//! | `clock skew` | a file written beside the run directory has a time further than `[health] max_clock_skew` from this node's clock |
//! | `free disk` | no room for one checkpoint of the known size |
//! | `checkpoint round-trip` (doctor) | a tiny checkpoint cannot be written, verified and read back beside the checkpoints |
//! | `checkpoint directory` (an attempt) | a file cannot be written, fsynced, renamed and removed beside the checkpoints |
//! | `site command` | `[health] command` exits non-zero or runs past `[health] timeout` (one ended by a stop is skipped: it says nothing of the node) |
//!
//! Devices come from the same probe as detection (`crate::gpu`): NVML, ROCm
//! SMI, or an injected inventory (`REKINDLE_GPU_INVENTORY`, `doctor
//! --inventory`), so the health counters are tested without a GPU; what the
//! driver does not report is said, never passed as healthy.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::config::{GpuBackend, HealthSection};
use crate::gpu::{EnvMap, GpuDevice, GpuProbe, nearest_existing, visible_devices};
use crate::telemetry::Redactor;

use super::checklist::{CheckStatus, Checklist};
use super::command::{CommandEnd, SiteRun, run_site_command, site_env};
use super::storage::{StorageProbe, check_disk, check_round_trip, check_writable};

/// How long a look at the shared filesystem may take before the mount
/// counts as hung.
pub const FS_TIMEOUT: Duration = Duration::from_secs(15);

/// What the node checks need.
pub struct NodeInput<'a> {
    pub health: &'a HealthSection,
    pub backend: GpuBackend,
    /// The process environment (SLURM's GPU variables, the visibility ones).
    pub env: &'a EnvMap,
    pub probe: &'a dyn GpuProbe,
    /// The probe is an inventory: it describes exactly the job's devices.
    pub inventory: bool,
    pub run_dir: &'a Path,
    pub checkpoint_dir: &'a Path,
    /// Bytes of one checkpoint, when known.
    pub expected_checkpoint_bytes: Option<u64>,
    /// How the place of the checkpoints is tried.
    pub storage: StorageProbe,
    /// A later attempt of the run: its directory should already be there.
    pub restarting: bool,
    /// This node's name (given to the site command as `REKINDLE_NODE`).
    pub node: &'a str,
    /// Whether a stop came: the site command is ended at once.
    pub stopped: &'a dyn Fn() -> bool,
    /// What the site command and its output are redacted with.
    pub redactor: &'a Redactor,
    /// This process checks what is its node's, not only its own devices:
    /// the first rank on the node (`SLURM_LOCALID` 0, or a process that
    /// does not know), and `doctor`. The node's other ranks skip the
    /// node-wide checks ([`NODE_WIDE`]): one storage probe, one listing of
    /// the checkpoints and one site command a node, not one a rank.
    pub node_wide: bool,
}

/// The checks whose verdict is the node's: every rank on the node sees the
/// same mounts, clock, disk and site command. The device checks are per
/// rank: under `--gpus-per-task` each rank has a device of its own.
pub const NODE_WIDE: &[&str] =
    &["run directory", "clock skew", "free disk", "checkpoint directory", "checkpoint round-trip", "site command"];

/// Every check of the table above, in its order.
pub fn node_checks(input: &NodeInput<'_>) -> Checklist {
    let mut list = Checklist::new();
    let devices = check_devices(&mut list, input);
    check_device_memory(&mut list, devices.as_deref(), input.health.min_free_device_memory);
    check_gpu_health(&mut list, devices.as_deref());
    if !input.node_wide {
        let storage = match input.storage {
            StorageProbe::RoundTrip => "checkpoint round-trip",
            StorageProbe::Write => "checkpoint directory",
        };
        for name in NODE_WIDE.iter().filter(|n| !n.starts_with("checkpoint ") || **n == storage) {
            list.push(name, CheckStatus::Skip, false, "the node's first rank (SLURM_LOCALID 0) checks it");
        }
        return list;
    }
    check_run_dir(&mut list, input.run_dir, input.restarting);
    check_clock_skew(&mut list, input.run_dir, input.health.max_clock_skew);
    check_disk(&mut list, input.checkpoint_dir, input.expected_checkpoint_bytes);
    match input.storage {
        StorageProbe::RoundTrip => check_round_trip(&mut list, input.checkpoint_dir),
        StorageProbe::Write => check_writable(&mut list, input.checkpoint_dir),
    }
    check_site_command(&mut list, input);
    list
}

/// How many GPUs this process should see, and the variable that says so:
/// what SLURM allotted on the node, or fewer where a visibility variable
/// narrows it for this process (`--gpus-per-task` and `--gpu-bind` give
/// each task its own `CUDA_VISIBLE_DEVICES`; a user may narrow it too).
fn expected(env: &EnvMap) -> Option<(String, usize)> {
    let allotted = allotted(env);
    let narrowed =
        ["CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"].into_iter().find_map(|var| {
            let list = env.get(var)?;
            let n = list.split(',').filter(|e| !e.trim().is_empty() && e.trim() != "NoDevFiles").count();
            Some((format!("{var}={list}"), n))
        });
    match (allotted, narrowed) {
        (Some((a_var, a)), Some((v_var, v))) if v < a => Some((format!("{v_var}, of {a_var}"), v)),
        (Some(allotted), _) => Some(allotted),
        (None, _) => None,
    }
}

/// How many GPUs SLURM allotted on this node, and the variable that says so.
fn allotted(env: &EnvMap) -> Option<(String, usize)> {
    for var in ["SLURM_STEP_GPUS", "SLURM_JOB_GPUS"] {
        if let Some(list) = env.get(var).filter(|v| !v.trim().is_empty()) {
            let n = list.split(',').filter(|e| !e.trim().is_empty()).count();
            return Some((format!("{var}={list}"), n));
        }
    }
    let n: usize = env.get("SLURM_GPUS_ON_NODE")?.trim().parse().ok()?;
    Some((format!("SLURM_GPUS_ON_NODE={n}"), n))
}

fn describe(d: &GpuDevice) -> String {
    format!("{} {} {} ({} of {} MiB free)", d.vendor, d.index, d.name, d.memory_free_mib, d.memory_total_mib)
}

/// The devices the run may use; `None` under `[gpu] backend = "cpu"`.
fn check_devices(list: &mut Checklist, input: &NodeInput<'_>) -> Option<Vec<GpuDevice>> {
    let name = "devices";
    let probed = match input.probe.probe() {
        Ok(probed) => probed,
        Err(e) => {
            list.push(name, CheckStatus::Fail, true, format!("the GPU driver did not answer: {e}"));
            return Some(Vec::new());
        }
    };
    let (visible, mut notes) = if input.inventory {
        (probed.devices, probed.notes)
    } else {
        let v = visible_devices(input.env, &probed.devices);
        (v.devices, probed.notes.into_iter().chain(v.notes).collect())
    };
    if input.backend == GpuBackend::Cpu {
        list.push(name, CheckStatus::Skip, false, CPU_BACKEND);
        return None;
    }
    let found = if visible.is_empty() {
        "no GPU visible".to_string()
    } else {
        visible.iter().map(describe).collect::<Vec<_>>().join("; ")
    };
    notes.retain(|n| !n.is_empty());
    let notes = if notes.is_empty() { String::new() } else { format!(" ({})", notes.join("; ")) };
    match expected(input.env) {
        Some((var, n)) if visible.len() < n => list.push(
            name,
            CheckStatus::Fail,
            true,
            format!("SLURM allotted {n} GPU(s) to this process ({var}) but {} visible: {found}{notes}", visible.len()),
        ),
        Some((var, _)) => list.push(name, CheckStatus::Ok, true, format!("{found}, as allotted ({var})")),
        None => list.push(name, CheckStatus::Ok, true, format!("{found}; SLURM allotted no GPU count{notes}")),
    }
    Some(visible)
}

/// Why the device checks are skipped under `[gpu] backend = "cpu"`.
const CPU_BACKEND: &str = "[gpu] backend = \"cpu\": no device is used";

fn check_device_memory(list: &mut Checklist, devices: Option<&[GpuDevice]>, min_share: f64) {
    let name = "device memory";
    let Some(devices) = devices else { return list.push(name, CheckStatus::Skip, false, CPU_BACKEND) };
    if devices.is_empty() {
        return list.push(name, CheckStatus::Skip, false, "no GPU to check");
    }
    if min_share <= 0.0 {
        return list.push(name, CheckStatus::Skip, false, "[health] min_free_device_memory = 0: not checked");
    }
    let short: Vec<String> = devices
        .iter()
        .filter(|d| (d.memory_free_mib as f64) < min_share * d.memory_total_mib as f64)
        .map(|d| format!("{} {} has {} of {} MiB free", d.vendor, d.index, d.memory_free_mib, d.memory_total_mib))
        .collect();
    if short.is_empty() {
        list.push(name, CheckStatus::Ok, true, format!("every device has at least {:.0} % free", min_share * 100.0));
    } else {
        list.push(
            name,
            CheckStatus::Fail,
            true,
            format!(
                "{} (less than [health] min_free_device_memory = {min_share}): another process holds it",
                short.join("; ")
            ),
        );
    }
}

fn check_gpu_health(list: &mut Checklist, devices: Option<&[GpuDevice]>) {
    let name = "gpu health";
    let Some(devices) = devices else { return list.push(name, CheckStatus::Skip, false, CPU_BACKEND) };
    if devices.is_empty() {
        return list.push(
            name,
            CheckStatus::Skip,
            false,
            "no GPU on this node: no ECC, page or throttle counters to read",
        );
    }
    let (mut failed, mut warned, mut seen, mut unreported) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for d in devices {
        let id = format!("{} {}", d.vendor, d.index);
        let Some(h) = &d.health else {
            unreported.push(format!("{id}: nothing"));
            continue;
        };
        let mut missing = Vec::new();
        match h.ecc_uncorrected {
            Some(n) if n > 0 => failed.push(format!("{id}: {n} uncorrected ECC error(s)")),
            Some(_) => seen.push(format!("{id}: no uncorrected ECC error")),
            None => missing.push("ECC counts"),
        }
        match h.retired_pages_pending {
            Some(true) => failed.push(format!("{id}: memory pages pending retirement (needs a GPU reset)")),
            Some(false) => {}
            None => missing.push("retired pages"),
        }
        match h.remapped_rows_pending {
            Some(true) => failed.push(format!("{id}: memory rows pending remapping (needs a GPU reset)")),
            Some(false) => {}
            None => missing.push("remapped rows"),
        }
        if !h.throttle_reasons.is_empty() {
            warned.push(format!("{id}: clocks held down ({})", h.throttle_reasons.join(", ")));
        }
        if !missing.is_empty() {
            unreported.push(format!("{id}: {}", missing.join(", ")));
        }
    }
    let not = if unreported.is_empty() {
        String::new()
    } else {
        format!("; not reported by the driver, so not checked: {}", unreported.join("; "))
    };
    if !failed.is_empty() {
        list.push(name, CheckStatus::Fail, true, format!("{}{not}", failed.join("; ")));
    } else if !warned.is_empty() {
        list.push(
            name,
            CheckStatus::Warn,
            true,
            format!("{} (a slow device, not a broken one){not}", warned.join("; ")),
        );
    } else if seen.is_empty() && devices.iter().all(|d| d.health.is_none()) {
        list.push(name, CheckStatus::Skip, false, format!("could not be checked{not}"));
    } else {
        list.push(name, CheckStatus::Ok, true, format!("{}{not}", seen.join("; ")));
    }
}

/// Runs `f` on a thread of its own, giving up after `limit` (a look at a
/// hung mount never returns; the thread is left behind, the attempt ends).
fn bounded<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("rekindle-health-fs".into())
        .spawn(move || {
            let _ = tx.send(f());
        })
        .ok()?;
    rx.recv_timeout(limit).ok()
}

fn check_run_dir(list: &mut Checklist, run_dir: &Path, restarting: bool) {
    let name = "run directory";
    let dir = run_dir.to_path_buf();
    let looked = bounded(FS_TIMEOUT, move || {
        let meta = std::fs::metadata(&dir);
        let parent = dir.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")).to_path_buf();
        (meta.map(|m| m.is_dir()), parent.is_dir(), parent)
    });
    let Some((meta, parent_there, parent)) = looked else {
        return list.push(
            name,
            CheckStatus::Fail,
            true,
            format!(
                "looking at {} did not answer within {}s: its filesystem hangs on this node",
                run_dir.display(),
                FS_TIMEOUT.as_secs()
            ),
        );
    };
    match meta {
        Ok(true) => list.push(name, CheckStatus::Ok, true, format!("{} is visible from this node", run_dir.display())),
        Ok(false) => {
            list.push(name, CheckStatus::Fail, true, format!("{} is there but not a directory", run_dir.display()))
        }
        Err(_) if restarting && !parent_there => list.push(
            name,
            CheckStatus::Fail,
            true,
            format!(
                "neither {} nor {} is visible from this node, yet an earlier attempt ran: is the shared \
                 filesystem mounted here?",
                run_dir.display(),
                parent.display()
            ),
        ),
        Err(_) if parent_there => list.push(
            name,
            CheckStatus::Ok,
            true,
            format!("{} is not there yet; {} is, so it can be made", run_dir.display(), parent.display()),
        ),
        Err(_) => list.push(
            name,
            CheckStatus::Ok,
            true,
            format!("{} and its parent are not there yet; they will be made", run_dir.display()),
        ),
    }
}

/// Writes a file beside the run directory and compares the time the
/// filesystem gave it with this node's clock (positive: the filesystem is
/// ahead); an error says why nothing could be written or read back.
fn measure_skew(dir: PathBuf) -> Result<f64, String> {
    let base = nearest_existing(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let before = SystemTime::now();
    let file = tempfile::Builder::new()
        .prefix(".rekindle-clock-")
        .tempfile_in(&base)
        .map_err(|e| format!("cannot write a file in {}: {e}", base.display()))?;
    let after = SystemTime::now();
    let stamped = file.as_file().metadata().and_then(|m| m.modified()).map_err(|e| e.to_string())?;
    let secs = |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
    let (lo, hi, at) = (secs(before), secs(after), secs(stamped));
    // Inside the window of the write: no skew to speak of (coarse
    // timestamps round down, so allow a second below it).
    Ok(if at < lo - 1.0 {
        at - lo
    } else if at > hi {
        at - hi
    } else {
        0.0
    })
}

fn check_clock_skew(list: &mut Checklist, run_dir: &Path, max: Duration) {
    let name = "clock skew";
    let parent = run_dir.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")).to_path_buf();
    match bounded(FS_TIMEOUT, move || measure_skew(parent)) {
        None => list.push(
            name,
            CheckStatus::Fail,
            true,
            format!("writing a file beside {} did not finish within {}s", run_dir.display(), FS_TIMEOUT.as_secs()),
        ),
        Some(Err(e)) => list.push(name, CheckStatus::Fail, true, e),
        Some(Ok(skew)) if skew.abs() > max.as_secs_f64() => list.push(
            name,
            CheckStatus::Fail,
            true,
            format!(
                "the shared filesystem's clock is {skew:+.1}s from this node's (more than [health] max_clock_skew = \
                 {}): lock heartbeats and checkpoint ages would be misread",
                humantime::format_duration(max)
            ),
        ),
        Some(Ok(skew)) => list.push(
            name,
            CheckStatus::Ok,
            true,
            format!("{skew:+.1}s against the filesystem beside {}", run_dir.display()),
        ),
    }
}

fn check_site_command(list: &mut Checklist, input: &NodeInput<'_>) {
    let name = "site command";
    let Some(command) = &input.health.command else {
        return list.push(name, CheckStatus::Skip, false, "no [health] command configured");
    };
    let vars = input.env.iter().map(|(k, v)| (k.clone(), v.clone()));
    let mut env = site_env(vars, input.health.inherit_env, input.redactor);
    env.insert("REKINDLE_NODE".into(), input.node.to_string());
    env.insert("REKINDLE_RUN_DIR".into(), input.run_dir.display().to_string());
    let how = SiteRun { timeout: input.health.timeout, env: &env, stopped: input.stopped, redactor: input.redactor };
    let run = run_site_command(command, &how);
    // Cut short by a stop, it says nothing about the node.
    let status = match run.end {
        _ if run.healthy() => CheckStatus::Ok,
        CommandEnd::Stopped => CheckStatus::Skip,
        _ => CheckStatus::Fail,
    };
    list.push(name, status, true, run.describe(command, input.health.timeout, input.redactor));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::test_device as device;
    use crate::gpu::{DeviceHealth, StaticProbe, Vendor};

    struct Fixture {
        dir: tempfile::TempDir,
        health: HealthSection,
        env: EnvMap,
    }

    fn fixture() -> Fixture {
        Fixture { dir: tempfile::tempdir().unwrap(), health: HealthSection::default(), env: EnvMap::new() }
    }

    impl Fixture {
        fn check(&self, probe: &dyn GpuProbe, restarting: bool) -> Checklist {
            self.check_as(probe, restarting, true)
        }

        fn check_as(&self, probe: &dyn GpuProbe, restarting: bool, node_wide: bool) -> Checklist {
            let run_dir = self.dir.path().join("runs/r");
            let checkpoints = run_dir.join("checkpoints");
            node_checks(&NodeInput {
                health: &self.health,
                backend: GpuBackend::Auto,
                env: &self.env,
                probe,
                inventory: true,
                run_dir: &run_dir,
                checkpoint_dir: &checkpoints,
                expected_checkpoint_bytes: None,
                storage: StorageProbe::Write,
                restarting,
                node: "n1",
                stopped: &|| false,
                redactor: &Redactor::default(),
                node_wide,
            })
        }
    }

    #[test]
    fn a_nodes_other_ranks_check_their_own_devices_and_leave_the_nodes_checks_to_its_first() {
        let f = fixture();
        // A restart whose run directory is missing fails the node's check...
        let first = f.check_as(&sick(DeviceHealth::default()), true, true);
        assert_eq!(status(&first, "run directory"), CheckStatus::Fail, "{first}");
        // ...which the node's other ranks leave to its first: they neither
        // look at the run directory nor write beside the checkpoints.
        let other = f.check_as(&sick(DeviceHealth::default()), true, false);
        assert!(!other.any_required_failed(), "{other}");
        for name in ["run directory", "clock skew", "free disk", "checkpoint directory", "site command"] {
            assert_eq!(status(&other, name), CheckStatus::Skip, "{other}");
            assert!(other.get(name).unwrap().detail.contains("SLURM_LOCALID 0"), "{other}");
        }
        assert!(other.get("checkpoint round-trip").is_none(), "only the probe this start would run: {other}");
        assert!(!f.dir.path().join("runs").exists(), "nothing written");
        // Their own devices are still theirs to check.
        assert_eq!(status(&other, "devices"), CheckStatus::Ok, "{other}");
        let bad = DeviceHealth { ecc_uncorrected: Some(2), ..DeviceHealth::default() };
        assert!(f.check_as(&sick(bad), true, false).any_required_failed());
    }

    fn status(list: &Checklist, name: &str) -> CheckStatus {
        list.get(name).unwrap_or_else(|| panic!("no check {name}: {list}")).status
    }

    fn no_gpu() -> StaticProbe {
        StaticProbe::new(vec![])
    }

    fn sick(health: DeviceHealth) -> StaticProbe {
        let mut gpu = device(Vendor::Nvidia, 0, Some("GPU-a"), 80, 78);
        gpu.health = Some(health);
        StaticProbe::new(vec![gpu])
    }

    #[test]
    fn a_gpu_less_node_passes_and_says_what_it_could_not_check() {
        let f = fixture();
        let list = f.check(&no_gpu(), false);
        assert!(!list.any_required_failed(), "{list}");
        assert_eq!(status(&list, "gpu health"), CheckStatus::Skip);
        assert!(list.get("gpu health").unwrap().detail.contains("no ECC, page or throttle counters"), "{list}");
        assert_eq!(status(&list, "site command"), CheckStatus::Skip);
        assert_eq!(status(&list, "clock skew"), CheckStatus::Ok, "{list}");
        assert_eq!(status(&list, "run directory"), CheckStatus::Ok, "{list}");
        assert_eq!(status(&list, "checkpoint directory"), CheckStatus::Ok, "{list}");
        // Nothing is left behind, and the run directory was not made.
        assert_eq!(std::fs::read_dir(f.dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn fewer_gpus_than_slurm_allotted_fails_devices() {
        let mut f = fixture();
        f.env.insert("SLURM_JOB_GPUS".into(), "0,1".into());
        let list = f.check(&StaticProbe::new(vec![device(Vendor::Nvidia, 0, None, 80, 80)]), false);
        assert_eq!(status(&list, "devices"), CheckStatus::Fail);
        assert!(
            list.get("devices")
                .unwrap()
                .detail
                .starts_with("SLURM allotted 2 GPU(s) to this process (SLURM_JOB_GPUS=0,1) but 1")
        );
        f.env.insert("SLURM_JOB_GPUS".into(), "0".into());
        let list = f.check(&StaticProbe::new(vec![device(Vendor::Nvidia, 0, None, 80, 80)]), false);
        assert_eq!(status(&list, "devices"), CheckStatus::Ok, "{list}");
    }

    #[test]
    fn a_task_bound_to_one_of_the_nodes_gpus_expects_that_one() {
        // `srun --gpus-per-task=1`: the step has four GPUs on the node, this
        // task sees the one CUDA_VISIBLE_DEVICES gives it.
        let mut f = fixture();
        f.env.insert("SLURM_STEP_GPUS".into(), "0,1,2,3".into());
        f.env.insert("CUDA_VISIBLE_DEVICES".into(), "2".into());
        // (The injected inventory lists what this process sees.)
        let list = f.check(&StaticProbe::new(vec![device(Vendor::Nvidia, 0, None, 80, 80)]), false);
        assert_eq!(status(&list, "devices"), CheckStatus::Ok, "{list}");
        // The GPU it was given does not answer: that still fails.
        let list = f.check(&StaticProbe::new(Vec::new()), false);
        assert_eq!(status(&list, "devices"), CheckStatus::Fail, "{list}");
        assert!(list.get("devices").unwrap().detail.contains("(CUDA_VISIBLE_DEVICES=2, of SLURM_STEP_GPUS=0,1,2,3)"));
    }

    #[test]
    fn a_driver_that_does_not_answer_fails_devices() {
        let f = fixture();
        let probe = StaticProbe::sequence(vec![Err("NVIDIA: GPU is lost".into())]);
        let list = f.check(&probe, false);
        assert_eq!(status(&list, "devices"), CheckStatus::Fail);
        assert!(list.get("devices").unwrap().detail.contains("GPU is lost"));
    }

    #[test]
    fn a_device_held_by_another_process_fails_device_memory() {
        let f = fixture();
        let list = f.check(&StaticProbe::new(vec![device(Vendor::Nvidia, 0, None, 80, 10)]), false);
        assert_eq!(status(&list, "device memory"), CheckStatus::Fail);
        assert!(list.get("device memory").unwrap().detail.contains("another process holds it"));
    }

    #[test]
    fn gpu_health_counters_fail_warn_or_pass_and_unreported_ones_are_named() {
        let f = fixture();
        let table: [(DeviceHealth, CheckStatus, &str); 5] = [
            (DeviceHealth { ecc_uncorrected: Some(2), ..Default::default() }, CheckStatus::Fail, "2 uncorrected ECC"),
            (
                DeviceHealth { ecc_uncorrected: Some(0), retired_pages_pending: Some(true), ..Default::default() },
                CheckStatus::Fail,
                "pending retirement",
            ),
            (DeviceHealth { remapped_rows_pending: Some(true), ..Default::default() }, CheckStatus::Fail, "remapping"),
            (
                DeviceHealth { throttle_reasons: vec!["hw_thermal_slowdown".into()], ..Default::default() },
                CheckStatus::Warn,
                "clocks held down (hw_thermal_slowdown)",
            ),
            (
                DeviceHealth { ecc_uncorrected: Some(0), retired_pages_pending: Some(false), ..Default::default() },
                CheckStatus::Ok,
                "not checked: nvidia 0: remapped rows",
            ),
        ];
        for (health, want, says) in table {
            let list = f.check(&sick(health.clone()), false);
            let check = list.get("gpu health").unwrap();
            assert_eq!(check.status, want, "{health:?}: {check:?}");
            assert!(check.detail.contains(says), "{health:?}: {check:?}");
        }
        let list = f.check(&StaticProbe::new(vec![device(Vendor::Nvidia, 0, None, 80, 80)]), false);
        let check = list.get("gpu health").unwrap();
        assert_eq!(check.status, CheckStatus::Skip);
        assert!(check.detail.contains("not reported by the driver, so not checked: nvidia 0: nothing"), "{check:?}");
    }

    #[test]
    fn health_counters_are_read_from_an_injected_inventory() {
        let f = fixture();
        let file = f.dir.path().join("inventory.json");
        std::fs::write(
            &file,
            r#"{"devices": [{"vendor": "nvidia", "name": "H100", "memory_total_mib": 81559,
                "ecc_uncorrected": 1, "throttle_reasons": ["hw_slowdown"]}]}"#,
        )
        .unwrap();
        let list = f.check(&crate::gpu::InventoryProbe::new(&file), false);
        assert_eq!(status(&list, "gpu health"), CheckStatus::Fail);
        assert!(list.get("gpu health").unwrap().detail.contains("1 uncorrected ECC error(s)"), "{list}");
    }

    #[test]
    fn a_checkpoint_place_that_cannot_be_written_fails() {
        let f = fixture();
        let blocker = f.dir.path().join("file");
        std::fs::write(&blocker, "").unwrap();
        let mut list = Checklist::new();
        check_writable(&mut list, &blocker.join("x/checkpoints"));
        assert_eq!(status(&list, "checkpoint directory"), CheckStatus::Fail, "{list}");
    }

    #[test]
    fn a_later_attempt_that_cannot_see_the_run_directory_fails() {
        let f = fixture();
        let list = f.check(&no_gpu(), true);
        assert_eq!(status(&list, "run directory"), CheckStatus::Fail, "{list}");
        assert!(list.get("run directory").unwrap().detail.contains("is the shared filesystem mounted here?"));
        std::fs::create_dir_all(f.dir.path().join("runs/r")).unwrap();
        assert_eq!(status(&f.check(&no_gpu(), true), "run directory"), CheckStatus::Ok);
    }

    #[test]
    fn the_site_command_decides_and_its_output_is_recorded() {
        let mut f = fixture();
        f.health.command = Some("echo \"bad HCA on $REKINDLE_NODE\"; exit 1".into());
        let list = f.check(&no_gpu(), false);
        assert_eq!(status(&list, "site command"), CheckStatus::Fail);
        assert!(list.get("site command").unwrap().detail.ends_with("output: bad HCA on n1"), "{list}");
        assert_eq!(list.first_required_failure().unwrap().name, "site command");
        f.health.command = Some("true".into());
        assert_eq!(status(&f.check(&no_gpu(), false), "site command"), CheckStatus::Ok);
    }

    #[test]
    fn skew_is_measured_against_the_filesystem() {
        let dir = tempfile::tempdir().unwrap();
        let skew = measure_skew(dir.path().join("run")).unwrap();
        assert!(skew.abs() < 2.0, "{skew}");
    }
}
