//! The Prometheus text-format file of a run (`[telemetry]
//! prometheus_textfile`), in the form node_exporter's textfile collector
//! reads: gauges labelled by `run` and `slurm_job` (not `job`: Prometheus
//! gives every scraped sample the `job` of its scrape target, and would
//! rename ours `exported_job`), rewritten whole by a rename
//! so that a scrape never sees half a file. [`PromState`] folds the run's
//! records into the values (pure, tested without a disk); the exporter
//! (`export.rs`) feeds it and writes [`PromState::render`].
//!
//! The alert "no durable checkpoint for 30 minutes" is one line of PromQL
//! over `rekindle_last_checkpoint_timestamp_seconds` (docs/telemetry.md).

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::event::{Event, RecordedEvent};
use super::gpu_sample::GpuSample;
use super::metrics::MetricsLine;
use super::records::time_field;
use crate::confine::Dir;

/// The labels of every sample of a run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PromLabels {
    /// `[run] name`.
    pub run: String,
    /// The SLURM job (`<array job>_<task>` for an array task; empty outside
    /// SLURM, and then no `slurm_job` label is written).
    pub job: String,
    /// The node this attempt runs on (only on `rekindle_info`).
    pub node: String,
}

/// How many recent metrics lines the step rate is taken over.
const RATE_WINDOW: usize = 20;

/// What the run's records say, as the textfile shows it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PromState {
    pub labels: PromLabels,
    /// The attempt still runs (the exporter sets it false at its end).
    pub running: bool,
    /// How the last attempt ended: `stopped`, `finished` or `failed` (`None` while running).
    pub ended: Option<&'static str>,
    pub step: Option<u64>,
    pub max_steps: Option<u64>,
    pub loss: Option<f64>,
    /// (Unix seconds, step) of the recent metrics lines of this attempt.
    recent: VecDeque<(f64, u64)>,
    pub last_checkpoint_step: Option<u64>,
    /// When it became durable, Unix seconds.
    pub last_checkpoint_time: Option<f64>,
    pub checkpoint_stall_seconds: Option<f64>,
    pub checkpoint_persist_seconds: Option<f64>,
    /// `start` events: attempts so far, this one included.
    pub attempts: u64,
    pub resumes: u64,
    pub last_stop_reason: Option<String>,
    pub world_size: Option<usize>,
    /// The newest `gpu_stats.jsonl` sample's devices.
    pub gpus: Vec<super::GpuDeviceStats>,
}

impl PromState {
    pub fn new(labels: PromLabels) -> PromState {
        PromState { labels, running: true, ..PromState::default() }
    }

    /// A line of `metrics.jsonl`.
    pub fn observe_metrics(&mut self, line: &Value) {
        let Some(MetricsLine::Step(s)) = MetricsLine::from_value(line) else { return };
        self.step = Some(self.step.map_or(s.step, |old| old.max(s.step)));
        if let Some(loss) = s.loss.filter(|l| l.is_finite()) {
            self.loss = Some(loss);
        }
        if let Some(t) = time_field(line, "time") {
            let t = t.timestamp_millis() as f64 / 1000.0;
            if self.recent.back().is_some_and(|(_, step)| s.step <= *step) {
                self.recent.clear(); // went back (a rollback): the rate starts again
            }
            self.recent.push_back((t, s.step));
            if self.recent.len() > RATE_WINDOW {
                self.recent.pop_front();
            }
        }
    }

    /// A line of `events.jsonl`.
    pub fn observe_event(&mut self, e: &RecordedEvent) {
        match &e.event {
            Event::Start(start) => {
                self.attempts += 1;
                self.max_steps = start.max_steps;
                self.world_size = start.world_size.or(Some(1));
                self.recent.clear();
            }
            Event::Resume(r) => {
                self.resumes += 1;
                self.step = Some(r.step);
            }
            Event::CheckpointSaved(c) if c.warning.is_none() || c.persist_seconds.is_some() => {
                self.last_checkpoint_step = Some(c.step);
                self.last_checkpoint_time = e.time.map(|t| t.timestamp_millis() as f64 / 1000.0);
                self.checkpoint_stall_seconds = c.snapshot_seconds.or(self.checkpoint_stall_seconds);
                self.checkpoint_persist_seconds = c.persist_seconds.or(self.checkpoint_persist_seconds);
            }
            Event::Stop(stop) => {
                self.last_stop_reason =
                    Some(if stop.reason.is_empty() { "unknown".into() } else { stop.reason.clone() });
                self.ended = Some("stopped");
            }
            Event::Finish(_) => self.ended = Some("finished"),
            Event::Error(_) => self.ended = Some("failed"),
            _ => {}
        }
    }

    /// A line of `gpu_stats.jsonl`.
    pub fn observe_gpu(&mut self, line: &Value) {
        if let Ok(sample) = serde_json::from_value::<GpuSample>(line.clone()) {
            self.gpus = sample.devices;
        }
    }

    /// Steps per second over the recent metrics lines.
    pub fn steps_per_second(&self) -> Option<f64> {
        let (first, last) = (self.recent.front()?, self.recent.back()?);
        let (secs, steps) = (last.0 - first.0, last.1.checked_sub(first.1)? as f64);
        (secs > 0.0 && steps > 0.0).then(|| steps / secs)
    }

    /// The file's text at Unix time `now`.
    pub fn render(&self, now: f64) -> String {
        let mut out = Out {
            text: String::new(),
            labels: label_text(&[("run", &self.labels.run), ("slurm_job", &self.labels.job)]),
        };
        let l = &self.labels;
        let info = label_text(&[
            ("run", &l.run),
            ("slurm_job", &l.job),
            ("node", &l.node),
            ("version", env!("CARGO_PKG_VERSION")),
        ]);
        out.help("rekindle_info", "The run, its SLURM job and the node of its current (or last) attempt.");
        let _ = writeln!(out.text, "rekindle_info{info} 1");
        out.gauge(
            "rekindle_running",
            "1 while an attempt runs, 0 once it ended.",
            Some(if self.running { 1.0 } else { 0.0 }),
        );
        out.help("rekindle_state", "How the run stands: one of running, stopped, finished, failed is 1.");
        let state = if self.running { "running" } else { self.ended.unwrap_or("failed") };
        for s in ["running", "stopped", "finished", "failed"] {
            let labels = label_text(&[("run", &l.run), ("slurm_job", &l.job), ("state", s)]);
            let _ = writeln!(out.text, "rekindle_state{labels} {}", u8::from(s == state));
        }
        out.gauge("rekindle_step", "Steps completed (the newest metrics.jsonl line).", self.step.map(|s| s as f64));
        out.gauge(
            "rekindle_max_steps",
            "[run] max_steps (absent for an exec run that does not set it).",
            self.max_steps.map(|s| s as f64),
        );
        out.gauge("rekindle_loss", "The loss of the newest metrics line with a finite loss.", self.loss);
        out.gauge(
            "rekindle_steps_per_second",
            "Training speed over the recent metrics lines of this attempt.",
            self.steps_per_second(),
        );
        out.gauge(
            "rekindle_last_checkpoint_step",
            "Step of the newest durable checkpoint.",
            self.last_checkpoint_step.map(|s| s as f64),
        );
        out.gauge(
            "rekindle_last_checkpoint_timestamp_seconds",
            "Unix time the newest checkpoint became durable (alert on time() minus this).",
            self.last_checkpoint_time,
        );
        out.gauge(
            "rekindle_seconds_since_last_checkpoint",
            "Age of the newest durable checkpoint when this file was written.",
            self.last_checkpoint_time.map(|t| (now - t).max(0.0)),
        );
        out.gauge(
            "rekindle_checkpoint_stall_seconds",
            "Training stall of the newest checkpoint (its snapshot).",
            self.checkpoint_stall_seconds,
        );
        out.gauge(
            "rekindle_checkpoint_persist_seconds",
            "Time to write, fsync and commit the newest checkpoint.",
            self.checkpoint_persist_seconds,
        );
        out.gauge("rekindle_attempts", "Attempts of the run so far, this one included.", Some(self.attempts as f64));
        out.gauge("rekindle_resumes", "Attempts that resumed from a checkpoint.", Some(self.resumes as f64));
        if let Some(reason) = &self.last_stop_reason {
            out.help("rekindle_last_stop", "Why the last stopped attempt stopped (the signal, or stop_at_step).");
            let labels = label_text(&[("run", &l.run), ("slurm_job", &l.job), ("reason", reason)]);
            let _ = writeln!(out.text, "rekindle_last_stop{labels} 1");
        }
        out.gauge("rekindle_world_size", "Ranks of the attempt (1: one process).", self.world_size.map(|w| w as f64));
        let gpu = |name: &str, help: &str, value: &dyn Fn(&super::GpuDeviceStats) -> Option<f64>, out: &mut Out| {
            let samples: Vec<(String, f64)> = self
                .gpus
                .iter()
                .filter_map(|d| {
                    let labels = label_text(&[
                        ("run", &l.run),
                        ("slurm_job", &l.job),
                        ("gpu", &d.index.to_string()),
                        ("vendor", &d.vendor),
                    ]);
                    Some((labels, value(d)?))
                })
                .collect();
            if !samples.is_empty() {
                out.help(name, help);
                for (labels, v) in samples {
                    let _ = writeln!(out.text, "{name}{labels} {}", number(v));
                }
            }
        };
        gpu(
            "rekindle_gpu_utilization_ratio",
            "GPU busy fraction, 0 to 1 (the newest gpu_stats.jsonl sample).",
            &|d| d.utilization_pct.map(|p| p as f64 / 100.0),
            &mut out,
        );
        gpu(
            "rekindle_gpu_memory_used_bytes",
            "GPU memory in use.",
            &|d| Some(d.memory_used_mib as f64 * 1048576.0),
            &mut out,
        );
        gpu(
            "rekindle_gpu_memory_total_bytes",
            "GPU memory in all.",
            &|d| Some(d.memory_total_mib as f64 * 1048576.0),
            &mut out,
        );
        out.gauge("rekindle_textfile_timestamp_seconds", "Unix time this file was written.", Some(now));
        out.text
    }
}

/// The text being rendered, and the `{run=…,slurm_job=…}` of plain gauges.
struct Out {
    text: String,
    labels: String,
}

impl Out {
    fn help(&mut self, name: &str, help: &str) {
        let _ = writeln!(self.text, "# HELP {name} {help}\n# TYPE {name} gauge");
    }

    /// A gauge with the run's labels; nothing when its value is unknown.
    fn gauge(&mut self, name: &str, help: &str, value: Option<f64>) {
        if let Some(v) = value {
            self.help(name, help);
            let _ = writeln!(self.text, "{name}{} {}", self.labels, number(v));
        }
    }
}

/// A sample value as the text format writes it.
fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf".into() } else { "-Inf".into() }
    } else {
        format!("{v}")
    }
}

/// `{a="x",b="y"}` with the text format's escapes (`\\`, `\"`, `\n`); a
/// `slurm_job` without a value is left out (outside SLURM).
fn label_text(pairs: &[(&str, &str)]) -> String {
    let body: Vec<String> = pairs
        .iter()
        .filter(|(k, v)| !(*k == "slurm_job" && v.is_empty()))
        .map(|(k, v)| format!("{k}=\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")))
        .collect();
    format!("{{{}}}", body.join(","))
}

/// How every textfile rekindle renders begins: what tells its own file
/// from another one in a collector directory shared with other exporters.
pub const TEXTFILE_HEAD: &str = "# HELP rekindle_info ";

fn refuse(path: &Path, why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::AlreadyExists,
        format!(
            "{} {why}: rekindle replaces only a textfile it wrote (one that begins with {TEXTFILE_HEAD:?}); \
             set [telemetry] prometheus_textfile to a path of its own",
            path.display()
        ),
    )
}

/// A Prometheus textfile (`[telemetry] prometheus_textfile`): its
/// directory held open as a handle (`confine::Dir`, opened once, as the
/// path names it: a collector directory linked from elsewhere is common),
/// and its name there. Every write goes through that handle; this module
/// opens nothing by path (`tests/it/architecture.rs`, `HANDLE_ONLY`).
#[derive(Debug)]
pub struct Textfile {
    dir: Dir,
    name: OsString,
    path: PathBuf,
}

impl Textfile {
    /// Opens the directory of `path` (which must exist: it is a collector's).
    pub fn open(path: &Path) -> io::Result<Textfile> {
        let Some(name) = path.file_name() else { return Err(refuse(path, "names no file")) };
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        Ok(Textfile { dir: Dir::open(dir)?, name: name.to_os_string(), path: path.to_path_buf() })
    }

    /// Writes `text` whole: a temporary file beside it (named so that
    /// node_exporter, which reads `*.prom` only, never takes it), then a
    /// rename. The directory may be shared with other exporters: what is
    /// at the name is replaced only when it is a regular file rekindle
    /// wrote (it begins with [`TEXTFILE_HEAD`]); a link, a special file or
    /// another program's file is refused and left as it is. Nothing else in
    /// the directory is touched.
    pub fn write(&self, text: &str) -> io::Result<()> {
        use std::io::Read;
        let path = &self.path;
        match self.dir.symlink_metadata(&self.name) {
            Ok(meta) if !meta.is_file() => return Err(refuse(path, &format!("is {}", crate::confine::kind_of(&meta)))),
            Ok(_) => {
                // A regular file a moment ago; the handle refuses it if it
                // was swapped since for a link or a FIFO.
                let file =
                    self.dir.open_read(&self.name).map_err(|e| refuse(path, &format!("cannot be read ({e})")))?;
                let mut head = Vec::new();
                file.take(TEXTFILE_HEAD.len() as u64).read_to_end(&mut head)?;
                if head != TEXTFILE_HEAD.as_bytes() {
                    return Err(refuse(path, "is another program's file"));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        // Created with O_EXCL: a name already there, whoever's, is never
        // opened, truncated or removed. Readable by node_exporter, which
        // often runs as its own user.
        let (tmp_name, mut tmp) = (0..100)
            .find_map(|n| {
                let tmp_name = format!(".rekindle-{}.{}.{n}.tmp", self.name.to_string_lossy(), std::process::id());
                match self.dir.create_new(&tmp_name, 0o644) {
                    Ok(file) => Some(Ok((tmp_name, file))),
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => None,
                    Err(e) => Some(Err(e)),
                }
            })
            .unwrap_or_else(|| Err(refuse(path, "has no free temporary name beside it")))?;
        let written = tmp
            .write_all(text.as_bytes())
            .and_then(|()| tmp.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644)))
            .and_then(|()| self.dir.rename(&tmp_name, &self.name));
        if written.is_err() {
            let _ = self.dir.remove_file(&tmp_name);
        }
        written
    }
}

/// Writes `text` to `path` whole, as [`Textfile::write`] does (opening its
/// directory for this one write).
pub fn write_textfile(path: &Path, text: &str) -> io::Result<()> {
    Textfile::open(path)?.write(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(v: Value) -> RecordedEvent {
        RecordedEvent::from_value(v).unwrap()
    }

    fn state() -> PromState {
        let mut s = PromState::new(PromLabels { run: "sweep \"a\"".into(), job: "77_3".into(), node: "n1".into() });
        s.observe_event(&event(json!({"event": "start", "max_steps": 100, "time": "2026-11-01T10:00:00Z"})));
        s.observe_event(&event(json!({"event": "stop", "step": 20, "reason": "SIGTERM"})));
        s.observe_event(&event(json!({"event": "start", "max_steps": 100, "world_size": 2})));
        s.observe_event(&event(json!({"event": "resume", "step": 20})));
        s.observe_event(&event(json!({"event": "checkpoint_saved", "step": 30, "kind": "periodic",
            "snapshot_seconds": 0.001, "persist_seconds": 0.5, "time": "2026-11-01T10:10:00Z"})));
        for (step, t) in [(21, "10:09:00"), (31, "10:09:10"), (41, "10:09:20")] {
            s.observe_metrics(&json!({"step": step, "loss": 0.5, "time": format!("2026-11-01T{t}Z")}));
        }
        s.observe_metrics(&json!({"step": 41, "val_loss": 0.1}));
        s.observe_gpu(&json!({"devices": [{"vendor": "nvidia", "index": 0, "utilization_pct": 90,
            "memory_used_mib": 1024, "memory_total_mib": 2048}]}));
        s
    }

    #[test]
    fn folds_the_records_into_the_gauges() {
        let s = state();
        assert_eq!((s.step, s.attempts, s.resumes, s.world_size), (Some(41), 2, 1, Some(2)));
        assert_eq!(s.steps_per_second(), Some(1.0));
        assert_eq!(s.last_checkpoint_step, Some(30));
        assert_eq!(s.last_stop_reason.as_deref(), Some("SIGTERM"));
        assert_eq!(s.ended, Some("stopped"), "the stop of the attempt before");
    }

    #[test]
    fn renders_labelled_gauges_with_escapes() {
        let mut s = state();
        let t0 = 1_793_527_800.0; // 2026-11-01T10:10:00Z
        let text = s.render(t0 + 60.0);
        let labels = r#"{run="sweep \"a\"",slurm_job="77_3"}"#;
        for line in [
            format!("rekindle_step{labels} 41"),
            format!("rekindle_max_steps{labels} 100"),
            format!("rekindle_last_checkpoint_timestamp_seconds{labels} {t0}"),
            format!("rekindle_seconds_since_last_checkpoint{labels} 60"),
            format!("rekindle_checkpoint_persist_seconds{labels} 0.5"),
            format!("rekindle_running{labels} 1"),
            r#"rekindle_state{run="sweep \"a\"",slurm_job="77_3",state="running"} 1"#.to_string(),
            r#"rekindle_last_stop{run="sweep \"a\"",slurm_job="77_3",reason="SIGTERM"} 1"#.to_string(),
            r#"rekindle_gpu_utilization_ratio{run="sweep \"a\"",slurm_job="77_3",gpu="0",vendor="nvidia"} 0.9"#
                .to_string(),
            r#"rekindle_gpu_memory_used_bytes{run="sweep \"a\"",slurm_job="77_3",gpu="0",vendor="nvidia"} 1073741824"#
                .to_string(),
            "# TYPE rekindle_step gauge".to_string(),
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        s.running = false;
        s.observe_event(&event(json!({"event": "finish", "step": 100})));
        let text = s.render(t0);
        assert!(text.contains(r#"state="finished"} 1"#), "{text}");
        assert!(text.contains(&format!("rekindle_running{labels} 0")), "{text}");
    }

    #[test]
    fn the_file_is_replaced_whole() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("run.prom");
        let text = |n: u32| format!("{TEXTFILE_HEAD}x\nrekindle_info{{}} 1\na {n}\n");
        write_textfile(&path, &text(1)).unwrap();
        write_textfile(&path, &text(2)).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text(2));
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1, "no temporary file left");
        assert!(state().render(0.0).starts_with(TEXTFILE_HEAD), "what rekindle renders is recognised as its own");
    }

    #[test]
    fn only_its_own_textfile_is_replaced_in_a_shared_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let text = format!("{TEXTFILE_HEAD}x\n");
        let other = tmp.path().join("node.prom");
        std::fs::write(&other, "node_up 1\n").unwrap();
        let err = write_textfile(&other, &text).unwrap_err();
        assert!(err.to_string().contains("another program's file"), "{err}");
        assert_eq!(std::fs::read_to_string(&other).unwrap(), "node_up 1\n");
        let link = tmp.path().join("link.prom");
        std::os::unix::fs::symlink(&other, &link).unwrap();
        assert!(write_textfile(&link, &text).unwrap_err().to_string().contains("symbolic link"));
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
        let fifo = tmp.path().join("fifo.prom");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert!(write_textfile(&fifo, &text).unwrap_err().to_string().contains("is a FIFO"));
        let names: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 3, "no temporary file left: {names:?}");
    }
}
