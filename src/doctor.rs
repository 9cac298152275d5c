//! `rekindle doctor`: whether this machine is ready for a run — config,
//! SLURM, GPUs, disk, the checkpoint store, publishing — checked before
//! submitting, or at the top of an sbatch script, as a checklist. Each check says ok, warn, fail or skip,
//! what it found, and whether it is required: a failed required check means
//! the run should not start.
//!
//! Checks: config valid (with its model built and its data loaded, as
//! `rekindle run` does before it starts: "ready" means `run` starts); SLURM environment; SLURM commands on PATH; visible
//! GPUs and driver versions; the placement plan (given a footprint); a tiny
//! matmul on the CPU and on each device the plan would use; then the checks
//! every attempt makes on its node before it starts (`crate::health`, one
//! implementation: devices as allotted, free device memory, GPU health
//! counters, the run directory seen from here, clock skew, free disk versus
//! the expected checkpoint size, a write + fsync + rename + verify
//! round-trip with the real checkpoint store next to the checkpoint
//! directory, the site's `[health] command`); and the publish repository.

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::config::{Config, GpuBackend, validate};
pub use crate::health::{Check, CheckStatus, Checklist};
use crate::health::{NodeInput, StorageProbe, node_checks};

use crate::gpu::{
    DeviceKind, EnvMap, Footprint, GpuProbe, InventoryProbe, NO_AMD_BACKEND, PlacementRequest, PlanDevice, SystemProbe,
    choose_devices, place, visible_devices,
};

/// What `doctor` checks against, besides the config.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DoctorOptions {
    /// Describe the GPUs with an inventory instead of probing.
    pub inventory: Option<PathBuf>,
    /// The workload's footprint, for the plan and the expected checkpoint size.
    pub footprint: Option<Footprint>,
    /// Bytes of one checkpoint (default: from the footprint).
    pub expected_checkpoint_bytes: Option<u64>,
    /// Why the config's model or data cannot be trained, as `rekindle run`
    /// finds before it starts (`Registry::checked_workload`, then building
    /// the trainer); `None` when they can. Fails the config check.
    pub workload_error: Option<String>,
    /// Why the config given could not be loaded (read, parsed, `--set`
    /// applied, validated): fails the config check; the others then check
    /// the defaults.
    pub config_error: Option<String>,
}

/// Runs every check against this machine and process environment. With
/// `cfg = None` the defaults are checked (and the config check is skipped).
pub fn doctor(cfg: Option<&Config>, options: &DoctorOptions) -> Checklist {
    let env: EnvMap = crate::gpu::utf8_env();
    let probe: Box<dyn GpuProbe> = match &options.inventory {
        Some(path) => Box::new(InventoryProbe::new(path)),
        None => Box::new(SystemProbe::new()),
    };
    run_checks(cfg, options, &env, probe.as_ref())
}

/// [`doctor`] with the environment (including `PATH`) and the probe injected.
pub fn run_checks(cfg: Option<&Config>, options: &DoctorOptions, env: &EnvMap, probe: &dyn GpuProbe) -> Checklist {
    let mut list = Checklist { checks: Vec::new() };
    let default = Config::default();
    let config = cfg.unwrap_or(&default);

    check_config(&mut list, cfg, options);
    let in_job = check_slurm_env(&mut list, env);
    check_slurm_commands(&mut list, env, in_job);
    let planned = check_gpus_and_plan(&mut list, config, options, env, probe);
    check_matmul(&mut list, config, &planned);
    let ckpt_dir = checkpoint_dir(config);
    let run_dir = run_dir(config);
    let expected = options.expected_checkpoint_bytes.or(options.footprint.map(|f| f.checkpoint_bytes()));
    let restarting = env.get("SLURM_RESTART_COUNT").is_some_and(|n| n.trim() != "0");
    let node = env.get("SLURMD_NODENAME").cloned().unwrap_or_else(crate::slurm::hostname);
    list.extend(node_checks(&NodeInput {
        health: &config.health,
        backend: config.gpu.backend,
        env,
        probe,
        inventory: options.inventory.is_some(),
        run_dir: &run_dir,
        checkpoint_dir: &ckpt_dir,
        expected_checkpoint_bytes: expected,
        storage: StorageProbe::RoundTrip,
        restarting,
        node: &node,
        stopped: &|| false,
        redactor: &crate::telemetry::Redactor::new(&config.telemetry.secret_words),
        node_wide: true,
    }));
    check_publish(&mut list, config);
    list
}

fn check_config(list: &mut Checklist, cfg: Option<&Config>, options: &DoctorOptions) {
    if let Some(error) = &options.config_error {
        let detail = format!("cannot be used: {error}; the checks below use the defaults");
        list.push("config", CheckStatus::Fail, true, detail);
        return;
    }
    let workload_error = options.workload_error.as_deref();
    let Some(cfg) = cfg else {
        list.push("config", CheckStatus::Skip, false, "no config given: checking with the defaults");
        return;
    };
    let mut text: Vec<String> = validate(cfg).iter().map(|p| format!("{}: {}", p.key, p.message)).collect();
    text.extend(workload_error.map(|e| format!("`rekindle run` would refuse it: {e}")));
    if text.is_empty() {
        list.push("config", CheckStatus::Ok, true, "valid; its model builds and its data loads");
    } else {
        list.push("config", CheckStatus::Fail, true, text.join("; "));
    }
}

fn check_slurm_env(list: &mut Checklist, env: &EnvMap) -> bool {
    match env.get("SLURM_JOB_ID") {
        Some(job) => {
            let mut detail = format!("inside SLURM job {job}");
            for (var, label) in [("SLURM_JOB_NODELIST", "nodes"), ("SLURM_JOB_PARTITION", "partition")] {
                if let Some(v) = env.get(var) {
                    detail.push_str(&format!(", {label} {v}"));
                }
            }
            if env.contains_key("SLURM_RESTART_COUNT") {
                detail.push_str(&format!(", restart {}", env["SLURM_RESTART_COUNT"]));
            }
            list.push("slurm environment", CheckStatus::Ok, false, detail);
            true
        }
        None => {
            list.push(
                "slurm environment",
                CheckStatus::Warn,
                false,
                "not inside a SLURM job (SLURM_JOB_ID unset): fine before submitting; requeueing needs a job",
            );
            false
        }
    }
}

fn check_slurm_commands(list: &mut Checklist, env: &EnvMap, in_job: bool) {
    let path = env.get("PATH").map(String::as_str).unwrap_or("");
    let find = |name: &str| std::env::split_paths(path).map(|dir| dir.join(name)).find(|p| is_executable(p));
    let commands = ["sinfo", "scontrol", "sbatch", "squeue"];
    let (found, missing): (Vec<_>, Vec<_>) = commands.iter().map(|c| (*c, find(c))).partition(|(_, p)| p.is_some());
    let found_text: Vec<String> =
        found.iter().map(|(_, p)| p.as_ref().map(|p| p.display().to_string()).unwrap_or_default()).collect();
    if missing.is_empty() {
        list.push("slurm commands", CheckStatus::Ok, in_job, format!("found {}", found_text.join(", ")));
        return;
    }
    let missing: Vec<&str> = missing.iter().map(|(c, _)| *c).collect();
    // Inside a job, requeueing after preemption needs `scontrol`.
    let status = if in_job && missing.contains(&"scontrol") { CheckStatus::Fail } else { CheckStatus::Warn };
    list.push(
        "slurm commands",
        status,
        in_job,
        format!(
            "not on PATH: {} (rekindle uses `scontrol` to requeue and `sinfo`/`squeue` to report)",
            missing.join(", ")
        ),
    );
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The device kind and device indices the plan would use, with each one's
/// number for the backend (its position among the usable devices: CUDA
/// renumbers the visible devices from 0).
struct Planned {
    kind: DeviceKind,
    devices: Vec<(u32, usize)>,
}

fn check_gpus_and_plan(
    list: &mut Checklist,
    config: &Config,
    options: &DoctorOptions,
    env: &EnvMap,
    probe: &dyn GpuProbe,
) -> Planned {
    let require = config.gpu.require;
    let cpu = Planned { kind: DeviceKind::Cpu, devices: Vec::new() };
    let probed = match probe.probe() {
        Ok(probed) => probed,
        Err(e) => {
            list.push("gpus", CheckStatus::Fail, true, e.to_string());
            return cpu;
        }
    };
    let visible = if options.inventory.is_some() {
        probed.devices.clone()
    } else {
        visible_devices(env, &probed.devices).devices
    };
    let mut notes = probed.notes.clone();
    let (kind, usable) = choose_devices(&visible, config.gpu.backend, &mut notes);
    let status = if !usable.is_empty() || config.gpu.backend == GpuBackend::Cpu {
        CheckStatus::Ok
    } else if require {
        CheckStatus::Fail
    } else {
        CheckStatus::Warn
    };
    let tail = match status {
        CheckStatus::Fail => "; [gpu] require = true",
        CheckStatus::Warn => "; training runs on the CPU",
        _ => "",
    };
    let mut found: Vec<String> = if visible.is_empty() {
        vec![format!("no GPU visible to this job ({} probed)", probed.devices.len())]
    } else {
        visible
            .iter()
            .map(|d| {
                let driver = d.driver_version.as_deref().map(|v| format!(", driver {v}")).unwrap_or_default();
                format!(
                    "{} {} {} ({} MiB free of {}{driver})",
                    d.vendor, d.index, d.name, d.memory_free_mib, d.memory_total_mib
                )
            })
            .collect()
    };
    found.extend(notes);
    list.push("gpus", status, require, format!("{}{tail}", found.join("; ")));

    let Some(footprint) = options.footprint else {
        list.push("placement", CheckStatus::Skip, false, "no workload footprint given");
        let devices = usable.iter().enumerate().map(|(ordinal, d)| (d.index, ordinal)).collect();
        return Planned { kind, devices };
    };
    let request = PlacementRequest {
        kind,
        devices: usable.iter().map(|d| PlanDevice { index: d.index, free_bytes: d.memory_free_mib << 20 }).collect(),
        footprint,
        target_batch: config.train.batch_size * config.train.grad_accum,
        headroom: config.gpu.headroom,
        host_free_bytes: None,
    };
    match place(&request) {
        Ok(placement) => {
            list.push("placement", CheckStatus::Ok, true, format!("{}; {}", placement.plan, placement.plan.reason));
            let ordinal = |index: u32| usable.iter().position(|d| d.index == index).unwrap_or(0);
            Planned { kind, devices: placement.groups.into_iter().flatten().map(|i| (i, ordinal(i))).collect() }
        }
        Err(e) => {
            list.push("placement", CheckStatus::Fail, true, e.to_string());
            cpu
        }
    }
}

fn check_matmul(list: &mut Checklist, config: &Config, planned: &Planned) {
    match device_matmul(&candle_core::Device::Cpu) {
        Ok(detail) => list.push("matmul cpu", CheckStatus::Ok, true, detail),
        Err(e) => list.push("matmul cpu", CheckStatus::Fail, true, e),
    }
    if planned.kind == DeviceKind::Cpu {
        return;
    }
    // A GPU in the plan runs the same matmul where this build has its
    // backend; where it has none, a run falls back at its start, and this
    // says so instead.
    let require = config.gpu.require;
    let status = if require { CheckStatus::Fail } else { CheckStatus::Warn };
    let fallback = if require { "[gpu] require = true stops the run" } else { "a run falls back to the CPU" };
    for &(index, ordinal) in &planned.devices {
        let name = format!("matmul {}:{index}", planned.kind);
        let outcome = match planned.kind {
            DeviceKind::Cuda if candle_core::utils::cuda_is_available() => candle_core::Device::new_cuda(ordinal)
                .map_err(|e| format!("the CUDA backend did not initialise on device {ordinal}: {e}"))
                .and_then(|device| device_matmul(&device)),
            DeviceKind::Cuda => {
                Err("not run: this build has no CUDA backend (candle's `cuda` feature is not compiled in)".into())
            }
            _ => Err(format!("not run: {NO_AMD_BACKEND}")),
        };
        match outcome {
            Ok(detail) => list.push(&name, CheckStatus::Ok, require, detail),
            Err(e) => list.push(&name, status, require, format!("{e}; {fallback}")),
        }
    }
}

/// A 64×64 f32 matmul on `device`, checked against a plain loop on the host.
fn device_matmul(device: &candle_core::Device) -> Result<String, String> {
    use candle_core::Tensor;
    const N: usize = 64;
    let a: Vec<f32> = (0..N * N).map(|i| ((i * 7) % 13) as f32 - 6.0).collect();
    let b: Vec<f32> = (0..N * N).map(|i| ((i * 5) % 11) as f32 - 5.0).collect();
    let started = Instant::now();
    let run = || -> candle_core::Result<Vec<Vec<f32>>> {
        let ta = Tensor::from_vec(a.clone(), (N, N), device)?;
        let tb = Tensor::from_vec(b.clone(), (N, N), device)?;
        ta.matmul(&tb)?.to_vec2::<f32>()
    };
    let product = run().map_err(|e| format!("candle matmul failed: {e:#}"))?;
    let elapsed = started.elapsed();
    for i in 0..N {
        for j in 0..N {
            let expected: f32 = (0..N).map(|k| a[i * N + k] * b[k * N + j]).sum();
            // Small integers: every partial sum is exact in f32.
            if product[i][j] != expected {
                return Err(format!("wrong result at ({i}, {j}): {} instead of {expected}", product[i][j]));
            }
        }
    }
    Ok(format!("{N}×{N} f32 matmul correct in {:.1} ms", elapsed.as_secs_f64() * 1000.0))
}

/// `[run] dir`, else `runs/<name>`.
fn run_dir(config: &Config) -> PathBuf {
    config.run.dir.clone().unwrap_or_else(|| Path::new("runs").join(&config.run.name))
}

/// `[checkpoint] dir`, else `<run dir>/checkpoints`.
fn checkpoint_dir(config: &Config) -> PathBuf {
    config.checkpoint.dir.clone().unwrap_or_else(|| run_dir(config).join("checkpoints"))
}

fn check_publish(list: &mut Checklist, config: &Config) {
    let publish = &config.publish;
    if !publish.enabled {
        list.push("publish", CheckStatus::Skip, false, "skipped: publishing not configured");
        return;
    }
    let Some(repo) = &publish.repo else {
        list.push("publish", CheckStatus::Fail, true, "[publish] enabled but no repo set");
        return;
    };
    if repo.join(".git").exists() {
        list.push(
            "publish",
            CheckStatus::Ok,
            false,
            format!(
                "{} is a git clone; remote `{}` reachability is not checked by this build",
                repo.display(),
                publish.remote
            ),
        );
    } else {
        list.push("publish", CheckStatus::Fail, true, format!("{} is not a git clone (no .git)", repo.display()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::test_device as device;
    use crate::gpu::{Probed, StaticProbe, Vendor};

    struct Fixture {
        dir: tempfile::TempDir,
        config: Config,
        env: EnvMap,
    }

    fn fixture() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config::default();
        config.run.dir = Some(dir.path().join("runs/test"));
        Fixture { dir, config, env: EnvMap::new() }
    }

    fn no_gpu() -> StaticProbe {
        StaticProbe::sequence(vec![Ok(Probed { devices: vec![], notes: vec!["NVIDIA: no driver library".into()] })])
    }

    fn status(list: &Checklist, name: &str) -> CheckStatus {
        list.get(name).unwrap_or_else(|| panic!("no check {name}: {list}")).status
    }

    /// A PATH directory holding executable stubs of the SLURM commands.
    fn slurm_path(dir: &Path, commands: &[&str]) -> String {
        use std::os::unix::fs::PermissionsExt;
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        for c in commands {
            let p = bin.join(c);
            std::fs::write(&p, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        bin.display().to_string()
    }

    #[test]
    fn gpu_less_machine_outside_slurm_passes_with_warnings() {
        let f = fixture();
        let list = run_checks(Some(&f.config), &DoctorOptions::default(), &f.env, &no_gpu());
        assert!(!list.any_required_failed(), "{list}");
        assert_eq!(status(&list, "config"), CheckStatus::Ok);
        assert_eq!(status(&list, "slurm environment"), CheckStatus::Warn);
        assert_eq!(status(&list, "slurm commands"), CheckStatus::Warn);
        assert_eq!(status(&list, "gpus"), CheckStatus::Warn);
        assert!(list.get("gpus").unwrap().detail.contains("NVIDIA: no driver library"));
        assert_eq!(status(&list, "matmul cpu"), CheckStatus::Ok);
        assert_eq!(status(&list, "free disk"), CheckStatus::Ok);
        assert_eq!(status(&list, "checkpoint round-trip"), CheckStatus::Ok, "{list}");
        assert_eq!(list.get("publish").unwrap().detail, "skipped: publishing not configured");
        // Nothing is left behind next to the checkpoints.
        let leftovers: Vec<_> = std::fs::read_dir(f.dir.path()).unwrap().collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
        let text = list.to_string();
        assert!(text.contains("[ ok ] matmul cpu: 64×64 f32 matmul correct"), "{text}");
        assert!(text.trim_end().ends_with(": ready"), "{text}");
    }

    #[test]
    fn requiring_a_gpu_fails_without_one() {
        let mut f = fixture();
        f.config.gpu.require = true;
        let list = run_checks(Some(&f.config), &DoctorOptions::default(), &f.env, &no_gpu());
        assert!(list.any_required_failed());
        assert_eq!(status(&list, "gpus"), CheckStatus::Fail);
        assert!(list.to_string().contains("[FAIL] gpus (required)"));
    }

    #[test]
    fn invalid_config_fails_the_config_check() {
        let mut f = fixture();
        f.config.checkpoint.keep = 0;
        let list = run_checks(Some(&f.config), &DoctorOptions::default(), &f.env, &no_gpu());
        assert_eq!(status(&list, "config"), CheckStatus::Fail);
        assert!(list.get("config").unwrap().detail.contains("checkpoint.keep"));
        // What `run` finds building the model and loading the data fails it too.
        f.config.checkpoint.keep = 3;
        let options = DoctorOptions { workload_error: Some("data.path: cannot read x".into()), ..Default::default() };
        let list = run_checks(Some(&f.config), &options, &f.env, &no_gpu());
        assert_eq!(status(&list, "config"), CheckStatus::Fail);
        assert!(list.get("config").unwrap().detail.contains("`rekindle run` would refuse it: data.path"), "{list}");
        assert!(list.any_required_failed());
        assert!(list.any_required_failed());
        let skipped = run_checks(None, &DoctorOptions::default(), &f.env, &no_gpu());
        assert_eq!(status(&skipped, "config"), CheckStatus::Skip);
    }

    #[test]
    fn inside_a_job_missing_scontrol_is_a_required_failure() {
        let mut f = fixture();
        f.env.insert("SLURM_JOB_ID".into(), "42".into());
        f.env.insert("SLURM_JOB_NODELIST".into(), "n1".into());
        f.env.insert("PATH".into(), slurm_path(f.dir.path(), &["sinfo"]));
        let list = run_checks(Some(&f.config), &DoctorOptions::default(), &f.env, &no_gpu());
        assert_eq!(status(&list, "slurm environment"), CheckStatus::Ok);
        assert!(list.get("slurm environment").unwrap().detail.contains("job 42, nodes n1"));
        assert_eq!(status(&list, "slurm commands"), CheckStatus::Fail);
        assert!(list.any_required_failed());

        f.env.insert("PATH".into(), slurm_path(f.dir.path(), &["sinfo", "scontrol", "sbatch", "squeue"]));
        let list = run_checks(Some(&f.config), &DoctorOptions::default(), &f.env, &no_gpu());
        assert_eq!(status(&list, "slurm commands"), CheckStatus::Ok, "{list}");
    }

    #[test]
    fn planned_gpus_are_reported_and_their_matmul_is_honestly_not_run() {
        let f = fixture();
        let mut gpu = device(Vendor::Nvidia, 0, Some("GPU-a"), 80, 78);
        gpu.driver_version = Some("550.54".into());
        let probe = StaticProbe::new(vec![gpu, device(Vendor::Nvidia, 1, Some("GPU-b"), 80, 78)]);
        let options = DoctorOptions {
            footprint: Some(Footprint::estimate_from_params(1_000_000, 4, 1 << 20)),
            ..DoctorOptions::default()
        };
        let list = run_checks(Some(&f.config), &options, &f.env, &probe);
        assert_eq!(status(&list, "gpus"), CheckStatus::Ok);
        assert!(list.get("gpus").unwrap().detail.contains("driver 550.54"));
        assert_eq!(status(&list, "placement"), CheckStatus::Ok);
        assert!(list.get("placement").unwrap().detail.starts_with("cuda: 2 replica(s)"));
        for i in 0..2 {
            let check = list.get(&format!("matmul cuda:{i}")).unwrap();
            if candle_core::utils::cuda_is_available() {
                // A CUDA build runs it: on real GPUs it passes, without them
                // the driver's error is a warning.
                assert!(check.status == CheckStatus::Ok || check.detail.contains("did not initialise"), "{check:?}");
            } else {
                assert_eq!(check.status, CheckStatus::Warn);
                assert!(check.detail.contains("no CUDA backend"));
            }
        }
        assert!(!list.any_required_failed(), "{list}");
    }

    #[test]
    fn planned_amd_gpus_say_there_is_no_amd_compute_backend() {
        let f = fixture();
        let probe = StaticProbe::new(vec![device(Vendor::Amd, 0, None, 64, 64)]);
        let options = DoctorOptions {
            footprint: Some(Footprint::estimate_from_params(1_000_000, 4, 1 << 20)),
            ..DoctorOptions::default()
        };
        let list = run_checks(Some(&f.config), &options, &f.env, &probe);
        let check = list.get("matmul rocm:0").unwrap();
        assert_eq!(check.status, CheckStatus::Warn);
        assert!(check.detail.contains("no AMD compute backend in this build, training on CPU"), "{check:?}");
        assert!(!list.any_required_failed(), "{list}");
    }

    #[test]
    fn cpu_backend_with_gpus_present_is_fine_and_runs_no_gpu_matmul() {
        let mut f = fixture();
        f.config.gpu.backend = GpuBackend::Cpu;
        let probe =
            StaticProbe::new(vec![device(Vendor::Amd, 0, None, 64, 64), device(Vendor::Nvidia, 0, None, 16, 16)]);
        let list = run_checks(Some(&f.config), &DoctorOptions::default(), &f.env, &probe);
        assert_eq!(status(&list, "gpus"), CheckStatus::Ok);
        assert!(list.get("gpus").unwrap().detail.contains("backend = \"cpu\""));
        assert!(!list.checks.iter().any(|c| c.name.starts_with("matmul cuda") || c.name.starts_with("matmul rocm")));
        // Auto prefers NVIDIA, as `rekindle gpus` does.
        f.config.gpu.backend = GpuBackend::Auto;
        let list = run_checks(Some(&f.config), &DoctorOptions::default(), &f.env, &probe);
        assert!(list.get("matmul cuda:0").is_some(), "{list}");
    }

    #[test]
    fn a_model_that_fits_nowhere_fails_placement() {
        let f = fixture();
        let options = DoctorOptions {
            footprint: Some(Footprint::estimate_from_params(100_000_000_000, 4, 1 << 20)),
            ..DoctorOptions::default()
        };
        let probe = StaticProbe::new(vec![device(Vendor::Nvidia, 0, None, 16, 16)]);
        let list = run_checks(Some(&f.config), &options, &f.env, &probe);
        assert_eq!(status(&list, "placement"), CheckStatus::Fail);
        assert!(list.any_required_failed());
    }

    #[test]
    fn too_little_disk_for_a_checkpoint_fails() {
        let f = fixture();
        let options = DoctorOptions { expected_checkpoint_bytes: Some(u64::MAX / 2), ..DoctorOptions::default() };
        let list = run_checks(Some(&f.config), &options, &f.env, &no_gpu());
        assert_eq!(status(&list, "free disk"), CheckStatus::Fail);
        assert!(list.get("free disk").unwrap().detail.contains("one checkpoint needs about"));
    }

    #[test]
    fn unwritable_checkpoint_location_fails_the_round_trip() {
        let mut f = fixture();
        let blocker = f.dir.path().join("file");
        std::fs::write(&blocker, "").unwrap();
        // The checkpoint directory's parent is a file: nothing can be created there.
        f.config.checkpoint.dir = Some(blocker.join("checkpoints"));
        let list = run_checks(Some(&f.config), &DoctorOptions::default(), &f.env, &no_gpu());
        assert_eq!(status(&list, "checkpoint round-trip"), CheckStatus::Fail, "{list}");
    }

    #[test]
    fn publish_repo_is_checked_when_enabled() {
        let mut f = fixture();
        f.config.publish.enabled = true;
        f.config.publish.repo = Some(f.dir.path().join("results"));
        let list = run_checks(Some(&f.config), &DoctorOptions::default(), &f.env, &no_gpu());
        assert_eq!(status(&list, "publish"), CheckStatus::Fail);
        std::fs::create_dir_all(f.dir.path().join("results/.git")).unwrap();
        let list = run_checks(Some(&f.config), &DoctorOptions::default(), &f.env, &no_gpu());
        assert_eq!(status(&list, "publish"), CheckStatus::Ok);
    }

    #[test]
    fn checklist_serialises_and_doctor_runs_on_this_machine() {
        let f = fixture();
        let list = doctor(Some(&f.config), &DoctorOptions::default());
        let json = serde_json::to_value(&list).unwrap();
        let first = &json["checks"][0];
        assert_eq!(first["name"], "config");
        assert_eq!(first["status"], "ok");
        assert_eq!(first["required"], true);
        assert_eq!(json["required_failed"], list.any_required_failed());
        assert!(list.get("matmul cpu").is_some());
    }
}
