//! The exports of an attempt: TensorBoard event files and the Prometheus
//! textfile, kept up to date from the run's own records (`metrics.jsonl`,
//! `events.jsonl`, `gpu_stats.jsonl`) by a thread that follows them. The
//! records stay the one source: whoever wrote a line (the training loop,
//! the background checkpointer, or the program under `rekindle exec`
//! through `log_metrics`), it reaches TensorBoard the same way, and what
//! TensorBoard shows is what `metrics.jsonl` holds.
//!
//! An attempt starts its [`Exporter`] once `metrics.jsonl` is trimmed back
//! to the step it resumed from; the start fills TensorBoard in up to that
//! step (see `tensorboard`), then the thread follows the files every
//! `interval`. A rollback within the attempt calls [`Rewinder::rewind`]
//! after trimming `metrics.jsonl`, before training again. Dropping the
//! exporter reads the files a last time (the attempt's final events are
//! written by then) and writes the textfile with the attempt ended. An
//! export that cannot be written is warned about and never stops training.

use std::path::PathBuf;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::event::{Event, RecordedEvent};
use super::follow::Follow;
use super::prometheus::{PromLabels, PromState, Textfile};
use super::records::time_field;
use super::tensorboard::TensorBoard;

/// What to export, and from which files.
#[derive(Debug, Clone, Default)]
pub struct ExportOptions {
    pub metrics: PathBuf,
    pub events: PathBuf,
    pub gpu_stats: PathBuf,
    /// The TensorBoard directory (`None`: no event files).
    pub tensorboard: Option<TensorBoardTarget>,
    /// The Prometheus textfile (`None`: none).
    pub prometheus_textfile: Option<PathBuf>,
    pub labels: PromLabels,
    /// The step the attempt resumed from (0: a fresh start).
    pub resume_step: u64,
    /// How often the files are read.
    pub interval: Duration,
}

/// Where the event files go, and the run's record of the files it created
/// there (only those are ever trimmed: the directory may be shared).
#[derive(Debug, Clone, PartialEq)]
pub struct TensorBoardTarget {
    pub dir: PathBuf,
    pub record: PathBuf,
}

/// The textfile is rewritten at least this often, for its age gauges.
const PROM_REFRESH: Duration = Duration::from_secs(15);

/// How long a rewind waits for the exporter thread.
const REWIND_WAIT: Duration = Duration::from_secs(30);

enum Msg {
    Rewind(u64, mpsc::SyncSender<()>),
}

/// The exports of one attempt; dropping it ends them (module header).
#[derive(Debug)]
pub struct Exporter {
    tx: Option<mpsc::Sender<Msg>>,
    thread: Option<JoinHandle<()>>,
}

/// Tells the exporter that training went back to an earlier step.
#[derive(Debug, Clone)]
pub struct Rewinder {
    tx: Option<mpsc::Sender<Msg>>,
}

impl Exporter {
    /// Fills the exports in up to `opts.resume_step` (on this thread, so
    /// that nothing the attempt writes afterwards is taken for history),
    /// then follows the records on a thread of its own. Nothing to export:
    /// no thread.
    pub fn start(opts: ExportOptions) -> Exporter {
        if opts.tensorboard.is_none() && opts.prometheus_textfile.is_none() {
            return Exporter { tx: None, thread: None };
        }
        let interval = opts.interval;
        let mut mirror = Mirror::start(opts);
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::Builder::new().name("rekindle-exports".into()).spawn(move || {
            loop {
                match rx.recv_timeout(interval) {
                    Ok(Msg::Rewind(step, done)) => {
                        mirror.rewind(step);
                        let _ = done.send(());
                    }
                    Err(mpsc::RecvTimeoutError::Timeout) => mirror.poll(),
                    Err(mpsc::RecvTimeoutError::Disconnected) => break,
                }
            }
            mirror.finish();
        });
        match thread {
            Ok(thread) => Exporter { tx: Some(tx), thread: Some(thread) },
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the exports' thread: no TensorBoard or Prometheus updates in this attempt");
                Exporter { tx: None, thread: None }
            }
        }
    }

    /// A handle for the training loop's rollbacks.
    pub fn rewinder(&self) -> Rewinder {
        Rewinder { tx: self.tx.clone() }
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        self.tx = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Rewinder {
    /// No exports: rewinding does nothing.
    pub fn none() -> Rewinder {
        Rewinder { tx: None }
    }

    /// Training went back to `step`, and `metrics.jsonl` was trimmed to it:
    /// TensorBoard is trimmed too. Returns once done (or after a bounded wait).
    pub fn rewind(&self, step: u64) {
        let Some(tx) = &self.tx else { return };
        let (done, wait) = mpsc::sync_channel(1);
        if tx.send(Msg::Rewind(step, done)).is_ok() && wait.recv_timeout(REWIND_WAIT).is_err() {
            tracing::warn!(step, "the exports did not confirm the rollback in time; TensorBoard may show steps twice");
        }
    }
}

/// The values of a `metrics.jsonl` line as TensorBoard scalars: every
/// number under its own name (`loss`, `lr`, `val_loss`, a program's own
/// keys), at the line's step; `None` without a step.
pub fn metric_scalars(line: &Value) -> Option<(u64, Vec<(String, f64)>)> {
    let step = line.get("step")?.as_u64()?;
    let mut values: Vec<(String, f64)> = line
        .as_object()?
        .iter()
        .filter(|(k, _)| k.as_str() != "step")
        .filter_map(|(k, v)| Some((k.clone(), v.as_number()?.as_f64()?)))
        .collect();
    // Each rank's own seconds of the step, one scalar per rank: the
    // per-rank step-time chart in TensorBoard.
    if let Some(ranks) = line.get("rank_compute_s").and_then(Value::as_array) {
        let per_rank = ranks.iter().enumerate().filter_map(|(r, v)| Some((format!("rank_compute_s/{r}"), v.as_f64()?)));
        values.extend(per_rank);
    }
    // Their summary, four tags at any world size (the per-rank tags above
    // only come with worlds of at most `[telemetry] rank_times_max` ranks).
    if let Some(summary) = line.get("rank_compute").and_then(Value::as_object) {
        for key in ["min_s", "median_s", "max_s", "slowest_rank"] {
            if let Some(v) = summary.get(key).and_then(Value::as_f64) {
                values.push((format!("rank_compute/{key}"), v));
            }
        }
    }
    Some((step, values))
}

/// The scalars an event stands for: a checkpoint's stall and persist time,
/// and a marker at each stop (1), resume (the steps lost) and straggler
/// (its rank).
pub fn event_scalars(e: &RecordedEvent) -> Option<(u64, Vec<(String, f64)>)> {
    match &e.event {
        Event::CheckpointSaved(c) if c.persist_seconds.is_some() => {
            let mut values = vec![("checkpoint/persist_seconds".to_string(), c.persist_seconds?)];
            if let Some(stall) = c.snapshot_seconds {
                values.push(("checkpoint/stall_seconds".to_string(), stall));
            }
            Some((c.step, values))
        }
        Event::Stop(stop) => Some((stop.step?, vec![("rekindle/stop".to_string(), 1.0)])),
        Event::Resume(r) => Some((r.step, vec![("rekindle/resume".to_string(), r.steps_lost as f64)])),
        Event::Straggler(s) => Some((s.step, vec![("rekindle/straggler".to_string(), s.rank as f64)])),
        _ => None,
    }
}

/// Unix seconds now.
fn now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// The `time` of a record, Unix seconds (now when it has none).
fn wall_time(v: &Value) -> f64 {
    time_field(v, "time").map_or_else(now, |t| t.timestamp_millis() as f64 / 1000.0)
}

/// The exports and the files they follow (the thread's state).
struct Mirror {
    tensorboard: Option<TensorBoard>,
    tensorboard_dir: Option<PathBuf>,
    prometheus: Option<(PathBuf, PromState)>,
    /// The textfile's directory, held open from the first write that found
    /// it (`Textfile`): every later write goes through that handle.
    prometheus_file: Option<Textfile>,
    /// The kind of the last error writing the textfile (warned once per kind).
    prometheus_failed: Option<std::io::ErrorKind>,
    prometheus_written: Option<Instant>,
    changed: bool,
    metrics: Follow,
    events: Follow,
    gpu: Follow,
    host: String,
}

impl Mirror {
    fn start(opts: ExportOptions) -> Mirror {
        let host = opts.labels.node.clone();
        let tensorboard = opts.tensorboard.as_ref().and_then(|tb| {
            TensorBoard::open(&tb.dir, &tb.record, &host, opts.resume_step, now())
                .map_err(|e| {
                    tracing::warn!(dir = %tb.dir.display(), error = %e, "cannot write TensorBoard event files in this attempt (training goes on; the next attempt fills them in)");
                })
                .ok()
        });
        let mut mirror = Mirror {
            tensorboard,
            tensorboard_dir: opts.tensorboard.as_ref().map(|tb| tb.dir.clone()),
            prometheus: opts.prometheus_textfile.map(|p| (p, PromState::new(opts.labels.clone()))),
            prometheus_file: None,
            prometheus_failed: None,
            prometheus_written: None,
            changed: true,
            metrics: Follow::new(&opts.metrics),
            events: Follow::new(&opts.events),
            gpu: Follow::new(&opts.gpu_stats),
            host,
        };
        // History first: events up to the step resumed from (a killed
        // attempt's later ones were trained again), then the metrics, which
        // the attempt has trimmed to that step.
        mirror.read_events(Some(opts.resume_step));
        mirror.read_metrics();
        mirror.read_gpu();
        let msg = format!("rekindle: attempt on {} trains from step {}", mirror.host, opts.resume_step + 1);
        mirror.tensorboard_io(|tb| tb.begin_after(opts.resume_step, now(), msg));
        mirror.write_prometheus();
        mirror
    }

    fn poll(&mut self) {
        self.read_events(None);
        self.read_metrics();
        self.read_gpu();
        self.write_prometheus();
    }

    fn rewind(&mut self, step: u64) {
        // Events first (the rollback's own is there); the metrics after the
        // rewind, so that a replaced metrics.jsonl is read against it.
        self.read_events(None);
        let msg = format!("rekindle: rolled back to step {step} on {}", self.host);
        self.tensorboard_io(|tb| tb.rewind(step, now(), msg));
        if let Some((_, state)) = &mut self.prometheus {
            state.step = Some(step);
        }
        self.read_metrics();
        self.write_prometheus();
    }

    fn finish(&mut self) {
        self.read_events(None);
        self.read_metrics();
        self.read_gpu();
        self.tensorboard_io(|tb| tb.sync());
        if let Some((_, state)) = &mut self.prometheus {
            state.running = false;
        }
        self.changed = true;
        self.write_prometheus();
    }

    /// New events: TensorBoard's markers and checkpoint times (up to
    /// `until` at the start), every one into the Prometheus state.
    fn read_events(&mut self, until: Option<u64>) {
        for raw in self.follow(|m| &mut m.events) {
            let wall = wall_time(&raw);
            let Some(e) = RecordedEvent::from_value(raw) else { continue };
            if let Some((_, state)) = &mut self.prometheus {
                state.observe_event(&e);
                self.changed = true;
            }
            if let Some((step, values)) = event_scalars(&e).filter(|(step, _)| until.is_none_or(|u| *step <= u)) {
                self.tensorboard_io(|tb| tb.write(step, wall, &values));
            }
        }
    }

    fn read_metrics(&mut self) {
        for line in self.follow(|m| &mut m.metrics) {
            if let Some((_, state)) = &mut self.prometheus {
                state.observe_metrics(&line);
                self.changed = true;
            }
            if let Some((step, values)) = metric_scalars(&line) {
                let wall = wall_time(&line);
                self.tensorboard_io(|tb| tb.write(step, wall, &values));
            }
        }
    }

    fn read_gpu(&mut self) {
        if self.prometheus.is_none() {
            return;
        }
        if let Some(last) = self.follow(|m| &mut m.gpu).last()
            && let Some((_, state)) = &mut self.prometheus
        {
            state.observe_gpu(last);
            self.changed = true;
        }
    }

    /// The new records of one followed file (none, with a warning, when it
    /// cannot be read).
    fn follow(&mut self, which: impl Fn(&mut Mirror) -> &mut Follow) -> Vec<Value> {
        let follow = which(self);
        follow.read_new().unwrap_or_else(|e| {
            tracing::debug!(file = %follow.path().display(), error = %e, "cannot read a record file for the exports");
            Vec::new()
        })
    }

    /// Runs `f` on the TensorBoard writer; on an error, warns and stops
    /// writing TensorBoard files for this attempt (the next one fills in
    /// what is missing from metrics.jsonl).
    fn tensorboard_io(&mut self, f: impl FnOnce(&mut TensorBoard) -> std::io::Result<()>) {
        let Some(tb) = &mut self.tensorboard else { return };
        if let Err(e) = f(tb) {
            let dir = self.tensorboard_dir.as_deref().unwrap_or(std::path::Path::new("?"));
            tracing::warn!(dir = %dir.display(), error = %e, "cannot write TensorBoard event files: none for the rest of this attempt (training goes on; the next attempt fills them in from metrics.jsonl)");
            self.tensorboard = None;
        }
    }

    fn write_prometheus(&mut self) {
        let Some((path, state)) = &self.prometheus else { return };
        let due = self.prometheus_written.is_none_or(|t| t.elapsed() >= PROM_REFRESH);
        if !self.changed && !due {
            return;
        }
        let file = match self.prometheus_file.take() {
            Some(file) => Ok(file),
            None => Textfile::open(path),
        };
        let written = file.and_then(|file| {
            let written = file.write(&state.render(now()));
            self.prometheus_file = Some(file);
            written
        });
        match written {
            Ok(()) => {
                if self.prometheus_failed.take().is_some() {
                    tracing::info!(file = %path.display(), "the Prometheus textfile is written again");
                }
            }
            Err(e) => {
                if self.prometheus_failed != Some(e.kind()) {
                    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
                    tracing::warn!(file = %path.display(), error = %e, "cannot write the Prometheus textfile into {} (training goes on; retried every {}s)", dir.display(), PROM_REFRESH.as_secs());
                }
                self.prometheus_failed = Some(e.kind());
            }
        }
        self.changed = false;
        self.prometheus_written = Some(Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::io::Write;

    fn append(path: &std::path::Path, lines: &[Value]) {
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap();
        for l in lines {
            writeln!(f, "{l}").unwrap();
        }
    }

    fn loss_steps(dir: &std::path::Path) -> Vec<(u64, f32)> {
        crate::telemetry::tensorboard::tests_support::read_all(dir)
            .into_iter()
            .filter(|(_, t, _)| t == "loss")
            .map(|(s, _, v)| (s, v))
            .collect()
    }

    #[test]
    fn metric_lines_become_scalars_of_their_own_names() {
        let (step, values) =
            metric_scalars(&json!({"step": 3, "loss": 0.5, "lr": null, "clipped": false, "acc": 1, "time": "t"}))
                .unwrap();
        assert_eq!(step, 3);
        assert_eq!(values, vec![("acc".to_string(), 1.0), ("loss".to_string(), 0.5)]);
        assert_eq!(metric_scalars(&json!({"loss": 1.0})), None);
        let (_, values) = metric_scalars(&json!({"step": 4, "rank_compute_s": [0.1, 0.3]})).unwrap();
        assert_eq!(values, vec![("rank_compute_s/0".to_string(), 0.1), ("rank_compute_s/1".to_string(), 0.3)]);
        let summary = json!({"ranks": 2, "min_s": 0.1, "median_s": 0.2, "max_s": 0.3, "slowest_rank": 1});
        let (_, values) = metric_scalars(&json!({"step": 4, "rank_compute": summary})).unwrap();
        let want = [("min_s", 0.1), ("median_s", 0.2), ("max_s", 0.3), ("slowest_rank", 1.0)];
        assert_eq!(values, want.map(|(k, v)| (format!("rank_compute/{k}"), v)).to_vec(), "four tags at any world size");
    }

    #[test]
    fn a_straggler_is_a_marker_of_its_rank_at_its_step() {
        let e = RecordedEvent::from_value(json!({"event": "straggler", "rank": 3, "rank_node": "n4", "step": 240,
                                                 "step_seconds": 0.3, "median_seconds": 0.1, "factor": 1.5,
                                                 "steps": 20, "blamed": false, "world_size": 8}))
        .unwrap();
        assert_eq!(event_scalars(&e), Some((240, vec![("rekindle/straggler".to_string(), 3.0)])));
    }

    #[test]
    fn an_attempt_fills_in_up_to_its_resume_follows_and_rewinds() {
        let tmp = tempfile::tempdir().unwrap();
        let opts = ExportOptions {
            metrics: tmp.path().join("metrics.jsonl"),
            events: tmp.path().join("events.jsonl"),
            gpu_stats: tmp.path().join("gpu_stats.jsonl"),
            tensorboard: Some(TensorBoardTarget {
                dir: tmp.path().join("tensorboard"),
                record: tmp.path().join("tensorboard.files"),
            }),
            prometheus_textfile: Some(tmp.path().join("run.prom")),
            labels: PromLabels { run: "r".into(), job: String::new(), node: "n1".into() },
            resume_step: 2,
            interval: Duration::from_millis(10),
        };
        let line = |step: u64, loss: f64| json!({"step": step, "loss": loss, "time": "2026-11-01T10:00:00Z"});
        append(&opts.metrics, &[line(1, 1.0), line(2, 2.0)]);
        append(
            &opts.events,
            &[
                json!({"event": "start", "max_steps": 10}),
                json!({"event": "stop", "step": 2, "reason": "SIGTERM"}),
                // A checkpoint beyond the resume (it did not verify): not history.
                json!({"event": "checkpoint_saved", "step": 4, "persist_seconds": 0.5}),
                json!({"event": "resume", "step": 2, "steps_lost": 0}),
            ],
        );
        let exporter = Exporter::start(opts.clone());
        append(&opts.metrics, &[line(3, 3.0), line(4, 4.0)]);
        // The exporter has read steps 3 and 4 (its textfile says step 4)
        // before the rollback: otherwise the rewind below trims nothing and
        // the test passes without exercising it.
        let prom = tmp.path().join("run.prom");
        let t0 = std::time::Instant::now();
        while !std::fs::read_to_string(&prom).is_ok_and(|p| p.contains("rekindle_step{run=\"r\"} 4\n")) {
            assert!(t0.elapsed() < Duration::from_secs(20), "the exporter never read step 4");
            std::thread::sleep(Duration::from_millis(10));
        }
        // A rollback to step 3: metrics.jsonl is trimmed by a rename, then the rewind.
        std::fs::write(tmp.path().join("m"), format!("{}\n{}\n{}\n", line(1, 1.0), line(2, 2.0), line(3, 3.0)))
            .unwrap();
        std::fs::rename(tmp.path().join("m"), &opts.metrics).unwrap();
        exporter.rewinder().rewind(3);
        append(&opts.metrics, &[line(4, 40.0)]);
        append(&opts.events, &[json!({"event": "finish", "step": 4})]);
        drop(exporter);
        let tb = tmp.path().join("tensorboard");
        assert_eq!(loss_steps(&tb), vec![(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0)]);
        let all = crate::telemetry::tensorboard::tests_support::read_all(&tb);
        assert!(all.contains(&(2, "rekindle/stop".into(), 1.0)), "{all:?}");
        assert!(all.contains(&(2, "rekindle/resume".into(), 0.0)), "{all:?}");
        assert!(!all.iter().any(|(_, t, _)| t.starts_with("checkpoint/")), "{all:?}");
        let prom = std::fs::read_to_string(tmp.path().join("run.prom")).unwrap();
        assert!(prom.contains("rekindle_step{run=\"r\"} 4\n"), "no job label outside SLURM: {prom}");
        assert!(prom.contains("state=\"finished\"} 1"), "{prom}");
    }

    #[test]
    fn nothing_to_export_starts_no_thread() {
        let exporter = Exporter::start(ExportOptions::default());
        assert!(exporter.thread.is_none());
        exporter.rewinder().rewind(3);
    }
}
