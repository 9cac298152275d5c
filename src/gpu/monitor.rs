//! The background sampler: every `[gpu] monitor_interval` it appends one line
//! to `gpu_stats.jsonl` — per device utilisation, memory used, temperature
//! and power (when the backend offers them), host CPU and RAM, and free disk
//! on the checkpoint filesystem — and warns when utilisation stays low (the
//! run is input-bound) or free disk drops below what the next checkpoint
//! needs. It never touches tensors; stopping it wakes it at once.
//!
//! The warning rules are a pure [`WarningTracker`]; the thread only samples,
//! writes and reports.

use std::fmt;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::telemetry::{GpuDeviceStats, GpuSample, HostSample};

use super::error::GpuError;
use super::host::{HostProbe, HostStats};
use super::probe::{DeviceKey, GpuDevice, GpuProbe};
use crate::units::mib_or_gib;

/// File name of the statistics, in the run directory.
pub const STATS_FILE: &str = "gpu_stats.jsonl";

/// What the monitor samples and when it warns.
#[derive(Debug, Clone, PartialEq)]
pub struct MonitorSettings {
    /// Time between samples (`[gpu] monitor_interval`).
    pub interval: Duration,
    /// The JSONL file lines are appended to.
    pub stats_path: PathBuf,
    /// Directory whose filesystem must hold the next checkpoint.
    pub disk_dir: PathBuf,
    /// Bytes the next checkpoint needs (0: no disk warning).
    pub expected_checkpoint_bytes: u64,
    /// Mean utilisation below this percentage counts as low.
    pub low_utilization_pct: u32,
    /// Consecutive low samples before warning.
    pub low_utilization_samples: u32,
    /// Devices to sample (the plan's); `None`: every probed device.
    pub only: Option<Vec<DeviceKey>>,
}

impl MonitorSettings {
    /// Defaults: warn after 6 samples in a row below 30% utilisation (a
    /// minute at the default 10 s interval); no disk warning until
    /// `expected_checkpoint_bytes` is set.
    pub fn new(stats_path: impl Into<PathBuf>, disk_dir: impl Into<PathBuf>, interval: Duration) -> MonitorSettings {
        MonitorSettings {
            interval,
            stats_path: stats_path.into(),
            disk_dir: disk_dir.into(),
            expected_checkpoint_bytes: 0,
            low_utilization_pct: 30,
            low_utilization_samples: 6,
            only: None,
        }
    }
}

/// Something an operator should look at.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "warning", rename_all = "snake_case")]
pub enum MonitorWarning {
    /// Mean GPU utilisation stayed low: the devices wait for input.
    LowUtilization { mean_pct: f64, threshold_pct: u32, samples: u32 },
    /// Less free disk than the next checkpoint needs.
    LowDisk { dir: PathBuf, free_bytes: u64, needed_bytes: u64 },
}

impl fmt::Display for MonitorWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MonitorWarning::LowUtilization { mean_pct, threshold_pct, samples } => write!(
                f,
                "GPU utilisation {mean_pct:.0}% is below {threshold_pct}% for {samples} samples in a row: \
                 the run looks input-bound (more data-loading work, a larger micro-batch, or fewer GPUs)"
            ),
            MonitorWarning::LowDisk { dir, free_bytes, needed_bytes } => write!(
                f,
                "{} free on the filesystem of {} but the next checkpoint needs about {}: free space or move \
                 [checkpoint] dir",
                mib_or_gib(*free_bytes),
                dir.display(),
                mib_or_gib(*needed_bytes)
            ),
        }
    }
}

/// The warning rules, as state fed one sample at a time. Each condition warns
/// once when it starts and again only after it has cleared.
#[derive(Debug, Clone)]
pub struct WarningTracker {
    low_pct: u32,
    low_needed: u32,
    needed_bytes: u64,
    dir: PathBuf,
    low_run: u32,
    low_sum: f64,
    low_warned: bool,
    disk_warned: bool,
}

impl WarningTracker {
    pub fn new(settings: &MonitorSettings) -> WarningTracker {
        WarningTracker {
            low_pct: settings.low_utilization_pct,
            low_needed: settings.low_utilization_samples.max(1),
            needed_bytes: settings.expected_checkpoint_bytes,
            dir: settings.disk_dir.clone(),
            low_run: 0,
            low_sum: 0.0,
            low_warned: false,
            disk_warned: false,
        }
    }

    /// The warnings this sample starts.
    pub fn observe(&mut self, devices: &[GpuDevice], host: &HostStats) -> Vec<MonitorWarning> {
        let mut out = Vec::new();
        let reported: Vec<f64> = devices.iter().filter_map(|d| d.utilization_pct).map(f64::from).collect();
        if !reported.is_empty() {
            let mean = reported.iter().sum::<f64>() / reported.len() as f64;
            if mean < f64::from(self.low_pct) {
                self.low_run += 1;
                self.low_sum += mean;
                if self.low_run >= self.low_needed && !self.low_warned {
                    self.low_warned = true;
                    out.push(MonitorWarning::LowUtilization {
                        mean_pct: self.low_sum / f64::from(self.low_run),
                        threshold_pct: self.low_pct,
                        samples: self.low_run,
                    });
                }
            } else {
                self.low_run = 0;
                self.low_sum = 0.0;
                self.low_warned = false;
            }
        }
        if let Some(free_mib) = host.disk_free_mib
            && self.needed_bytes > 0
        {
            let free = free_mib.saturating_mul(1 << 20);
            if free < self.needed_bytes {
                if !self.disk_warned {
                    self.disk_warned = true;
                    out.push(MonitorWarning::LowDisk {
                        dir: self.dir.clone(),
                        free_bytes: free,
                        needed_bytes: self.needed_bytes,
                    });
                }
            } else {
                self.disk_warned = false;
            }
        }
        out
    }
}

/// What a stopped monitor did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MonitorSummary {
    pub samples: u64,
    pub warnings: Vec<MonitorWarning>,
    /// Seconds spent sampling and writing (the monitor's own cost).
    pub busy_seconds: f64,
}

type Stop = Arc<(Mutex<bool>, Condvar)>;

/// A running sampler; [`stop`](Monitor::stop) it to get its summary.
pub struct Monitor {
    stop: Stop,
    thread: Option<JoinHandle<Result<MonitorSummary, GpuError>>>,
}

impl Monitor {
    /// Opens (appending) the statistics file and starts sampling at once,
    /// then every `settings.interval`. `on_warning` is called on the
    /// monitor's thread for each warning (also logged with `tracing`).
    pub fn start(
        probe: Box<dyn GpuProbe>,
        host: Box<dyn HostProbe>,
        settings: MonitorSettings,
        on_warning: impl FnMut(&MonitorWarning) + Send + 'static,
    ) -> Result<Monitor, GpuError> {
        let file = open_stats(&settings.stats_path)?;
        let stop: Stop = Arc::new((Mutex::new(false), Condvar::new()));
        let thread_stop = stop.clone();
        let thread = std::thread::Builder::new()
            .name("rekindle-gpu-monitor".into())
            .spawn(move || run(probe, host, settings, file, thread_stop, on_warning))
            .map_err(GpuError::MonitorSpawn)?;
        Ok(Monitor { stop, thread: Some(thread) })
    }

    /// Stops the sampler (waking it if it waits) and returns its summary.
    pub fn stop(mut self) -> Result<MonitorSummary, GpuError> {
        self.signal_stop();
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(result)) => result,
            Some(Err(_)) => Err(GpuError::Probe { vendor: "monitor", message: "the monitor thread panicked".into() }),
            None => Ok(MonitorSummary { samples: 0, warnings: Vec::new(), busy_seconds: 0.0 }),
        }
    }

    fn signal_stop(&self) {
        let (flag, wake) = &*self.stop;
        *flag.lock().unwrap_or_else(|e| e.into_inner()) = true;
        wake.notify_all();
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.signal_stop();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn open_stats(path: &Path) -> Result<File, GpuError> {
    let failed = |source| GpuError::StatsWrite { path: path.to_path_buf(), source };
    // In the claimed run directory, through its handle: never through a
    // symlink left in its place (docs/run-directory.md, Trust boundaries).
    crate::telemetry::open_in_dir(path).map_err(failed)
}

fn run(
    probe: Box<dyn GpuProbe>,
    mut host: Box<dyn HostProbe>,
    settings: MonitorSettings,
    mut file: File,
    stop: Stop,
    mut on_warning: impl FnMut(&MonitorWarning),
) -> Result<MonitorSummary, GpuError> {
    let mut tracker = WarningTracker::new(&settings);
    let mut summary = MonitorSummary { samples: 0, warnings: Vec::new(), busy_seconds: 0.0 };
    let (flag, wake) = &*stop;
    loop {
        let started = Instant::now();
        let (devices, error) = match probe.probe() {
            Ok(found) => (select(found.devices, settings.only.as_deref()), None),
            Err(e) => (Vec::new(), Some(e.to_string())),
        };
        let host_stats = host.sample();
        let line = sample_line(&devices, &host_stats, &settings.disk_dir, error.as_deref());
        file.write_all(line.as_bytes())
            .map_err(|source| GpuError::StatsWrite { path: settings.stats_path.clone(), source })?;
        for warning in tracker.observe(&devices, &host_stats) {
            tracing::warn!(%warning, "resource warning");
            on_warning(&warning);
            summary.warnings.push(warning);
        }
        summary.samples += 1;
        summary.busy_seconds += started.elapsed().as_secs_f64();

        let deadline = Instant::now() + settings.interval;
        let mut stopped = flag.lock().unwrap_or_else(|e| e.into_inner());
        while !*stopped {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            stopped = wake.wait_timeout(stopped, left).unwrap_or_else(|e| e.into_inner()).0;
        }
        if *stopped {
            return Ok(summary);
        }
    }
}

fn select(devices: Vec<GpuDevice>, only: Option<&[DeviceKey]>) -> Vec<GpuDevice> {
    match only {
        None => devices,
        Some(keys) => devices.into_iter().filter(|d| keys.contains(&d.key())).collect(),
    }
}

/// One `gpu_stats.jsonl` line (with its newline).
fn sample_line(devices: &[GpuDevice], host: &HostStats, disk_dir: &Path, error: Option<&str>) -> String {
    let sample = GpuSample {
        time: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        devices: devices
            .iter()
            .map(|d| GpuDeviceStats {
                vendor: d.vendor.as_str().to_string(),
                index: d.index,
                uuid: d.uuid.clone(),
                utilization_pct: d.utilization_pct,
                memory_used_mib: d.memory_used_mib(),
                memory_total_mib: d.memory_total_mib,
                temperature_c: d.temperature_c,
                power_w: d.power_w,
            })
            .collect(),
        host: HostSample {
            cpu_pct: host.cpu_pct,
            ram_used_mib: host.ram_used_mib,
            ram_total_mib: host.ram_total_mib,
            disk_free_mib: host.disk_free_mib,
            disk_dir: disk_dir.to_path_buf(),
        },
        error: error.map(str::to_string),
    };
    // Through a JSON value: keys in alphabetical order, as before.
    let mut text = serde_json::to_value(&sample).expect("a sample serialises").to_string();
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::probe::tests::device;
    use crate::gpu::probe::{Probed, StaticProbe, Vendor};

    struct FakeHost {
        disk_free_mib: Option<u64>,
    }

    impl HostProbe for FakeHost {
        fn sample(&mut self) -> HostStats {
            HostStats { cpu_pct: 12.5, ram_used_mib: 1000, ram_total_mib: 4000, disk_free_mib: self.disk_free_mib }
        }
    }

    fn busy(pct: u32) -> Vec<GpuDevice> {
        let mut a = device(Vendor::Nvidia, 0, Some("GPU-a"), 80, 60);
        a.utilization_pct = Some(pct);
        a.temperature_c = Some(55.0);
        a.power_w = Some(300.5);
        let mut b = device(Vendor::Nvidia, 1, Some("GPU-b"), 80, 70);
        b.utilization_pct = Some(pct);
        vec![a, b]
    }

    fn settings(dir: &Path) -> MonitorSettings {
        // The run directory exists (claimed) before its monitor starts.
        std::fs::create_dir_all(dir.join("run")).unwrap();
        let mut s = MonitorSettings::new(dir.join("run/gpu_stats.jsonl"), dir, Duration::from_millis(5));
        s.low_utilization_samples = 3;
        s
    }

    fn host(free_mib: u64) -> HostStats {
        HostStats { cpu_pct: 0.0, ram_used_mib: 0, ram_total_mib: 0, disk_free_mib: Some(free_mib) }
    }

    #[test]
    fn low_utilisation_warns_once_per_episode() {
        let s = settings(Path::new("/x"));
        let mut t = WarningTracker::new(&s);
        let h = host(1 << 20);
        assert!(t.observe(&busy(5), &h).is_empty());
        assert!(t.observe(&busy(10), &h).is_empty());
        let w = t.observe(&busy(15), &h);
        assert_eq!(w, [MonitorWarning::LowUtilization { mean_pct: 10.0, threshold_pct: 30, samples: 3 }]);
        assert!(w[0].to_string().contains("input-bound"));
        assert!(t.observe(&busy(5), &h).is_empty(), "already warned");
        assert!(t.observe(&busy(90), &h).is_empty());
        for _ in 0..2 {
            assert!(t.observe(&busy(1), &h).is_empty());
        }
        assert_eq!(t.observe(&busy(1), &h).len(), 1, "a new episode warns again");
    }

    #[test]
    fn devices_without_utilisation_never_warn() {
        let s = settings(Path::new("/x"));
        let mut t = WarningTracker::new(&s);
        let quiet = vec![device(Vendor::Amd, 0, None, 64, 64)];
        for _ in 0..10 {
            assert!(t.observe(&quiet, &host(1 << 20)).is_empty());
        }
    }

    #[test]
    fn low_disk_warns_when_the_next_checkpoint_would_not_fit() {
        let mut s = settings(Path::new("/ckpt"));
        s.expected_checkpoint_bytes = 2 << 30;
        let mut t = WarningTracker::new(&s);
        assert!(t.observe(&busy(90), &host(4096)).is_empty());
        let w = t.observe(&busy(90), &host(1024));
        assert_eq!(w, [MonitorWarning::LowDisk { dir: "/ckpt".into(), free_bytes: 1 << 30, needed_bytes: 2 << 30 }]);
        assert_eq!(
            w[0].to_string(),
            "1.0 GiB free on the filesystem of /ckpt but the next checkpoint needs about 2.0 GiB: free space or \
             move [checkpoint] dir"
        );
        assert!(t.observe(&busy(90), &host(1000)).is_empty());
        assert!(t.observe(&busy(90), &host(4096)).is_empty());
        assert_eq!(t.observe(&busy(90), &host(10)).len(), 1);
        // Unknown free space: no warning.
        s.expected_checkpoint_bytes = 1;
        let mut t = WarningTracker::new(&s);
        let unknown = HostStats { disk_free_mib: None, ..host(0) };
        assert!(t.observe(&busy(90), &unknown).is_empty());
    }

    #[test]
    fn sampler_appends_lines_and_reports_warnings_through_the_callback() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = settings(dir.path());
        s.expected_checkpoint_bytes = 1 << 40;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        let monitor = Monitor::start(
            Box::new(StaticProbe::new(busy(3))),
            Box::new(FakeHost { disk_free_mib: Some(100) }),
            s.clone(),
            move |w| sink.lock().unwrap().push(w.clone()),
        )
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while seen.lock().unwrap().len() < 2 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let summary = monitor.stop().unwrap();
        assert!(summary.samples >= 3, "{summary:?}");
        assert_eq!(summary.warnings.len(), 2, "{:?}", summary.warnings);
        assert_eq!(*seen.lock().unwrap(), summary.warnings);

        let text = std::fs::read_to_string(&s.stats_path).unwrap();
        let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len() as u64, summary.samples);
        let first = &lines[0];
        assert_eq!(first["devices"].as_array().unwrap().len(), 2);
        let d = &first["devices"][0];
        assert_eq!(d["vendor"], "nvidia");
        assert_eq!(d["uuid"], "GPU-a");
        assert_eq!(d["utilization_pct"], 3);
        assert_eq!(d["memory_used_mib"], 20 * 1024);
        assert_eq!(d["temperature_c"], 55.0);
        assert_eq!(d["power_w"], 300.5);
        assert!(first["devices"][1]["power_w"].is_null());
        assert_eq!(first["host"]["cpu_pct"], 12.5);
        assert_eq!(first["host"]["ram_used_mib"], 1000);
        assert_eq!(first["host"]["disk_free_mib"], 100);
        assert!(first["time"].as_str().unwrap().ends_with('Z'));
    }

    #[test]
    fn stopping_wakes_a_long_interval_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = settings(dir.path());
        s.interval = Duration::from_secs(3600);
        let stats = s.stats_path.clone();
        let started = Instant::now();
        let monitor =
            Monitor::start(Box::new(StaticProbe::new(vec![])), Box::new(FakeHost { disk_free_mib: None }), s, |_| {})
                .unwrap();
        // Once its first sample is written the sampler waits out the hour:
        // the stop must wake it there (a stop before it got that far would
        // not exercise the wake).
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::fs::read_to_string(&stats).map(|t| t.lines().count()).unwrap_or(0) < 1 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let summary = monitor.stop().unwrap();
        assert_eq!(summary.samples, 1);
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn probe_errors_are_recorded_and_sampling_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let s = settings(dir.path());
        let probe =
            StaticProbe::sequence(vec![Err("GPU is lost".into()), Ok(Probed { devices: busy(50), notes: vec![] })]);
        let monitor =
            Monitor::start(Box::new(probe), Box::new(FakeHost { disk_free_mib: None }), s.clone(), |_| {}).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::fs::read_to_string(&s.stats_path).map(|t| t.lines().count()).unwrap_or(0) < 2
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        monitor.stop().unwrap();
        let text = std::fs::read_to_string(&s.stats_path).unwrap();
        let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines[0]["error"], "static probe failed: GPU is lost");
        assert_eq!(lines[1]["devices"].as_array().unwrap().len(), 2);
        assert!(lines[1].get("error").is_none());
    }

    #[test]
    fn only_the_planned_devices_are_sampled() {
        let all = busy(50);
        let keep = vec![all[1].key()];
        let picked = select(all, Some(&keep));
        assert_eq!(picked.len(), 1);
        assert_eq!(picked[0].index, 1);
    }

    #[test]
    fn unwritable_stats_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let blocker = dir.path().join("file");
        std::fs::write(&blocker, "").unwrap();
        let s = MonitorSettings::new(blocker.join("gpu_stats.jsonl"), dir.path(), Duration::from_secs(1));
        let err =
            Monitor::start(Box::new(StaticProbe::new(vec![])), Box::new(FakeHost { disk_free_mib: None }), s, |_| {})
                .err()
                .unwrap();
        assert!(err.to_string().contains("gpu_stats.jsonl"), "{err}");
    }
}
