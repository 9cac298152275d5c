//! What a report shows, read from a run directory: metrics, events, the
//! attempts, checkpoints and event markers derived from them, and GPU
//! samples when `gpu_stats.jsonl` exists. Only reads; tolerates torn lines.

use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};

use crate::gpu::STATS_FILE;
use crate::rundir::{self, CONFIG_FILE, EVENTS_FILE, METRICS_FILE, RunStatus};
use crate::telemetry::{
    Attempt, AttemptFold, Event, GpuPoint, Jsonl, MetricPoint, MetricRecord, RecordedEvent, ValPoint, for_each_jsonl,
    gpu_point, metric_point,
};

use super::downsample::Downsample;
use super::error::ReportError;

/// A checkpoint save (or failed save) recorded in events.jsonl.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointMark {
    /// 1, 2, … in the order saved: the label of its marker on the loss chart.
    pub number: usize,
    pub step: u64,
    /// periodic, stop or final.
    pub kind: String,
    pub time: Option<DateTime<Utc>>,
    pub node: Option<String>,
    /// The attempt that wrote it (see [`Attempt::number`]).
    pub attempt: usize,
    pub bytes: Option<u64>,
    /// Training stalled this long to copy the state to host memory.
    pub snapshot_seconds: Option<f64>,
    /// Writing, fsync and commit (in the background for periodic saves).
    pub persist_seconds: Option<f64>,
    /// The failure, for `checkpoint_failed`; a warning for a committed save.
    pub problem: Option<String>,
    pub failed: bool,
}

/// What a vertical line on the charts stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkerKind {
    /// A stop signal (preemption, time limit, Ctrl-C) or `--stop-at-step`.
    Signal,
    Requeue,
    Resume,
    /// error, fresh_start (no checkpoint verified), nonfinite.
    Problem,
    /// A straggler: a rank (or the process alone) slow for many steps.
    Straggler,
}

/// A lifecycle event drawn as a vertical line, labelled with node and attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct Marker {
    pub kind: MarkerKind,
    /// A word or two: `SIGTERM`, `requeue`, `no requeue`, `resume`, …
    pub what: String,
    pub node: Option<String>,
    pub attempt: usize,
    /// Its step, or the last step known when it happened.
    pub step: Option<u64>,
    pub time: Option<DateTime<Utc>>,
    /// A sentence for the events table.
    pub detail: String,
}

impl Marker {
    /// `SIGTERM · n1 · attempt 1`
    pub fn label(&self) -> String {
        format!("{} · {}", self.what, self.whose())
    }

    /// `n1 · attempt 1`: who the marker belongs to.
    pub fn whose(&self) -> String {
        format!("{} · attempt {}", self.node.as_deref().unwrap_or("?"), self.attempt)
    }
}

/// The most attempts, checkpoint saves and markers a report keeps (each the
/// newest): `events.jsonl` is read a record at a time, and a run with
/// millions of events costs the memory and page size of these rows, not of
/// its lines (issue #40).
pub const MAX_ROWS: usize = 1000;

/// The longest text of a row (an event's detail or a checkpoint's note):
/// a record line may be a megabyte.
const MAX_DETAIL_CHARS: usize = 500;

/// How many rows of each table were left out, the oldest ones.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LeftOut {
    pub attempts: usize,
    pub checkpoints: usize,
    pub markers: usize,
}

/// Everything a report draws.
#[derive(Debug, Clone)]
pub struct RunData {
    pub dir: PathBuf,
    /// `[run] name`, else the directory name.
    pub name: String,
    pub status: RunStatus,
    /// The earliest time an event records.
    pub first_event: Option<DateTime<Utc>>,
    /// The newest [`MAX_ROWS`] attempts.
    pub attempts: Vec<Attempt>,
    pub train: Vec<MetricPoint>,
    pub val: Vec<ValPoint>,
    /// `None` when the run has no gpu_stats.jsonl.
    pub gpu: Option<Vec<GpuPoint>>,
    /// The newest [`MAX_ROWS`] checkpoint saves and markers.
    pub checkpoints: Vec<CheckpointMark>,
    pub markers: Vec<Marker>,
    /// Attempts, checkpoint saves and markers older than those kept, left
    /// out of the page (a long or hostile `events.jsonl`).
    pub left_out: LeftOut,
    /// Lines that did not parse, per file (torn writes).
    pub skipped: Vec<(&'static str, usize)>,
    /// Training and validation lines of `metrics.jsonl`, when the charts
    /// draw fewer of them (a long run, downsampled: `downsample.rs`).
    pub downsampled: Option<u64>,
}

impl RunData {
    /// Reads the run in `dir`.
    pub fn load(dir: &Path) -> Result<RunData, ReportError> {
        if !rundir::is_run_dir(dir) {
            return Err(ReportError::NotARunDir { path: dir.to_path_buf(), file: CONFIG_FILE });
        }
        let mut skipped = Vec::new();
        let mut note = |file: &'static str, j: &Option<Jsonl>| {
            if let Some(j) = j.as_ref().filter(|j| j.skipped > 0) {
                skipped.push((file, j.skipped));
            }
        };
        // Streamed, keeping what the page shows: the newest rows, counts
        // and the earliest time.
        let events_path = dir.join(EVENTS_FILE);
        let (mut attempts, mut marks) = (AttemptFold::keeping(MAX_ROWS), MarkFold::default());
        let (mut checkpoints, mut markers) = (Newest::default(), Newest::default());
        let mut first_event: Option<DateTime<Utc>> = None;
        let events_skipped = for_each_jsonl(&events_path, |v| {
            let Some(ev) = RecordedEvent::from_value(v) else { return };
            first_event = first_event.min(ev.time).or(first_event).or(ev.time);
            attempts.push(&ev);
            match marks.push(&ev) {
                Some(Mark::Checkpoint(c)) => checkpoints.push(c),
                Some(Mark::Marker(m)) => markers.push(m),
                None => {}
            }
        })
        .map_err(|source| ReportError::Read { path: events_path, source })?;
        note(EVENTS_FILE, &events_skipped.map(|skipped| Jsonl { records: Vec::new(), skipped }));
        let left_out = LeftOut {
            attempts: attempts.count() - attempts.count().min(MAX_ROWS),
            checkpoints: checkpoints.dropped,
            markers: markers.dropped,
        };
        // Streamed: a run of a million steps costs the memory of the
        // points drawn, not of its lines.
        let (mut train, mut val) =
            (Downsample::new(|m: &MetricPoint| m.loss), Downsample::new(|v: &ValPoint| Some(v.val_loss)));
        let metrics_path = dir.join(METRICS_FILE);
        let metrics_skipped = for_each_jsonl(&metrics_path, |r| match metric_point(&r) {
            Some(MetricRecord::Train(m)) => train.push(m),
            Some(MetricRecord::Val(v)) => val.push(v),
            None => {}
        })
        .map_err(|source| ReportError::Read { path: metrics_path, source })?;
        note(METRICS_FILE, &metrics_skipped.map(|skipped| Jsonl { records: Vec::new(), skipped }));
        let lines = train.seen() + val.seen();
        let (mut train, mut val) = (train.finish(), val.finish());
        let downsampled = ((train.len() + val.len()) as u64) < lines;
        train.sort_by_key(|m| m.step);
        val.sort_by_key(|v| v.step);
        // The same for the GPU samples (one every [gpu] monitor_interval,
        // for as long as the run ran), by the first device's utilisation.
        let gpu_path = dir.join(STATS_FILE);
        let mut gpu = Downsample::new(|g: &GpuPoint| g.devices.first().and_then(|d| d.utilization_pct));
        let gpu_skipped = for_each_jsonl(&gpu_path, |r| gpu_point(&r).into_iter().for_each(|p| gpu.push(p)))
            .map_err(|source| ReportError::Read { path: gpu_path, source })?;
        note(STATS_FILE, &gpu_skipped.map(|skipped| Jsonl { records: Vec::new(), skipped }));
        let gpu = gpu_skipped.map(|_| {
            let mut points = gpu.finish();
            points.sort_by_key(|s| s.time);
            points
        });

        let name = crate::config::load_recorded(&dir.join(CONFIG_FILE))
            .map(|l| l.config.run.name)
            .ok()
            .or_else(|| dir.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "run".into());
        Ok(RunData {
            dir: dir.to_path_buf(),
            name,
            status: rundir::status(dir),
            attempts: attempts.finish(),
            first_event,
            train,
            val,
            gpu,
            checkpoints: checkpoints.kept.into(),
            markers: markers.kept.into(),
            left_out,
            skipped,
            downsampled: downsampled.then_some(lines),
        })
    }

    /// The earliest time recorded: time axes count seconds from here.
    pub fn origin(&self) -> Option<DateTime<Utc>> {
        let events = self.first_event.into_iter();
        let metrics = self.train.iter().filter_map(|m| m.time);
        let gpu = self.gpu.iter().flatten().map(|g| g.time);
        events.chain(metrics).chain(gpu).min()
    }

    /// The attempt (its number) running at `t`: the last one started by then.
    pub fn attempt_at(&self, t: DateTime<Utc>) -> usize {
        self.attempts.iter().filter(|a| a.started.is_some_and(|s| s <= t)).map(|a| a.number).next_back().unwrap_or(0)
    }
}

/// The newest [`MAX_ROWS`] of a stream of rows, and how many older ones were dropped.
#[derive(Debug)]
struct Newest<T> {
    kept: std::collections::VecDeque<T>,
    dropped: usize,
}

impl<T> Default for Newest<T> {
    fn default() -> Self {
        Newest { kept: Default::default(), dropped: 0 }
    }
}

impl<T> Newest<T> {
    fn push(&mut self, row: T) {
        if self.kept.len() == MAX_ROWS {
            self.kept.pop_front();
            self.dropped += 1;
        }
        self.kept.push_back(row);
    }
}

/// What one event adds to the page: a checkpoint save or a chart marker.
#[derive(Debug, Clone, PartialEq)]
pub enum Mark {
    Checkpoint(CheckpointMark),
    Marker(Marker),
}

/// The checkpoint saves and the chart markers recorded in `events`.
pub fn checkpoints_and_markers(events: &[RecordedEvent]) -> (Vec<CheckpointMark>, Vec<Marker>) {
    let (mut ckpts, mut markers) = (Vec::new(), Vec::new());
    let mut fold = MarkFold::default();
    for ev in events {
        match fold.push(ev) {
            Some(Mark::Checkpoint(c)) => ckpts.push(c),
            Some(Mark::Marker(m)) => markers.push(m),
            None => {}
        }
    }
    (ckpts, markers)
}

/// [`checkpoints_and_markers`] one event at a time: the attempt and the
/// last step known so far, and how many checkpoint saves were numbered.
#[derive(Debug, Default)]
pub struct MarkFold {
    attempt: usize,
    last_step: Option<u64>,
    saves: usize,
}

impl MarkFold {
    /// The mark `ev` makes, if any.
    pub fn push(&mut self, ev: &RecordedEvent) -> Option<Mark> {
        if ev.name == "start" {
            self.attempt += 1;
        }
        self.last_step = ev.step.or(self.last_step);
        let (attempt, last_step) = (self.attempt, self.last_step);
        let clipped = |text: String| match text.char_indices().nth(MAX_DETAIL_CHARS) {
            Some((i, _)) => format!("{}…", &text[..i]),
            None => text,
        };
        let marker = |kind, what: String, detail: String| {
            Some(Mark::Marker(Marker {
                kind,
                what: clipped(what),
                node: ev.node.clone(),
                attempt,
                step: last_step,
                time: ev.time,
                detail: clipped(detail),
            }))
        };
        let at_step = last_step.map(|s| format!(" at step {s}")).unwrap_or_default();
        let number = self.saves + 1;
        let checkpoint = |kind: &str, failed: bool, problem: Option<&String>| CheckpointMark {
            number,
            step: ev.step.unwrap_or(0),
            kind: if kind.is_empty() { "?".into() } else { clipped(kind.to_string()) },
            time: ev.time,
            node: ev.node.clone(),
            attempt,
            bytes: None,
            snapshot_seconds: None,
            persist_seconds: None,
            problem: problem.cloned().map(clipped),
            failed,
        };
        let or = |text: &str, default: &str| if text.is_empty() { default.to_string() } else { text.to_string() };
        match &ev.event {
            Event::CheckpointSaved(c) => {
                self.saves += 1;
                Some(Mark::Checkpoint(CheckpointMark {
                    bytes: c.bytes,
                    snapshot_seconds: c.snapshot_seconds,
                    persist_seconds: c.persist_seconds,
                    ..checkpoint(&c.kind, false, c.warning.as_ref())
                }))
            }
            Event::CheckpointFailed(c) => {
                self.saves += 1;
                Some(Mark::Checkpoint(checkpoint(&c.kind, true, Some(&c.error).filter(|e| !e.is_empty()))))
            }
            Event::Signal(s) => {
                let sig = or(&s.signal, "signal");
                let arrival = s.arrival.as_ref().map(|a| format!(", arrived {a}")).unwrap_or_default();
                marker(MarkerKind::Signal, sig.clone(), format!("{sig}{at_step}{arrival}"))
            }
            Event::Requeue(r) => {
                let decision = r.decision.name();
                let what = if decision == "requeue" { "requeue" } else { "no requeue" };
                marker(MarkerKind::Requeue, what.into(), format!("{decision}: {}", r.decision.reason()))
            }
            Event::Resume(r) => {
                let lost = ev.raw.get("steps_lost").map(|_| r.steps_lost);
                let prev = r.previous_node.as_ref().map(|n| format!(" (previous node {n})")).unwrap_or_default();
                let lost = lost.map(|l| format!(", {l} steps lost")).unwrap_or_default();
                let tier = rundir::resume_tier(r).map(|t| format!(", from the {t}")).unwrap_or_default();
                let what = format!("resumed{at_step}{prev}{lost}{tier}");
                marker(MarkerKind::Resume, "resume".into(), what)
            }
            Event::Recovery(r) => {
                let label = if r.in_job { "recovered in job" } else { "recovered" };
                marker(MarkerKind::Resume, label.into(), rundir::recovery_line(r))
            }
            Event::FreshStart(f) => marker(MarkerKind::Problem, "fresh start".into(), or(&f.reason, "fresh start")),
            Event::Nonfinite(n) => {
                let action = or(&n.action, "?");
                marker(MarkerKind::Problem, "non-finite".into(), format!("non-finite step{at_step}: {action}"))
            }
            Event::Error(e) => {
                let err = or(&e.error, "error");
                marker(MarkerKind::Problem, "error".into(), format!("error{at_step}: {err}"))
            }
            Event::Straggler(s) => {
                let what = if s.world_size > 1 { format!("straggler rank {}", s.rank) } else { "slower".into() };
                // Labelled with the slow rank's node, not the writer's (rank 0's).
                let node = Some(s.rank_node.clone()).filter(|n| !n.is_empty()).or_else(|| ev.node.clone());
                match marker(MarkerKind::Straggler, what, rundir::straggler_line(s)) {
                    Some(Mark::Marker(m)) => Some(Mark::Marker(Marker { node: node.map(clipped), ..m })),
                    other => other,
                }
            }
            Event::NodeUnhealthy(u) => {
                let detail = format!("node {} failed its health check `{}`: {}", u.node, u.check, u.detail);
                marker(MarkerKind::Problem, "unhealthy node".into(), detail)
            }
            Event::NodesExcluded(x) => {
                let detail = if x.added.is_empty() {
                    let why = x.error.as_deref().or(x.note.as_deref()).unwrap_or("?");
                    format!("{} blamed {}; none excluded: {why}", x.cause, x.blamed.join(", "))
                } else {
                    format!("{}: excluded {} (now {})", x.cause, x.added.join(", "), x.excluded.join(", "))
                };
                marker(MarkerKind::Requeue, "excluded".into(), detail)
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::events_from;
    use serde_json::json;

    fn events(values: Vec<serde_json::Value>) -> Vec<RecordedEvent> {
        events_from(values)
    }

    #[test]
    fn markers_carry_node_attempt_and_the_last_known_step() {
        let evs = events(vec![
            json!({"event": "start", "node": "n1"}),
            json!({"event": "signal", "node": "n1", "signal": "SIGTERM", "step": 61}),
            json!({"event": "requeue", "node": "n1", "decision": "requeue", "reason": "preempted"}),
            json!({"event": "start", "node": "n2"}),
            json!({"event": "resume", "node": "n2", "step": 50, "previous_node": "n1", "steps_lost": 11}),
        ]);
        let (_, m) = checkpoints_and_markers(&evs);
        assert_eq!(m.len(), 3);
        assert_eq!(m[0].label(), "SIGTERM · n1 · attempt 1");
        assert_eq!(m[1].label(), "requeue · n1 · attempt 1");
        assert_eq!(m[1].step, Some(61), "requeue has no step of its own: it takes the signal's");
        assert_eq!(m[2].label(), "resume · n2 · attempt 2");
        assert_eq!(m[2].detail, "resumed at step 50 (previous node n1), 11 steps lost");
        assert_eq!(m[2].kind, MarkerKind::Resume);
    }

    #[test]
    fn a_recovery_in_the_job_is_marked_with_its_tier_copy_and_cost() {
        let (_, m) = checkpoints_and_markers(&events(vec![
            json!({"event": "start", "node": "n1"}),
            json!({"event": "start", "node": "n3"}),
            json!({"event": "resume", "node": "n3", "step": 120, "steps_lost": 7, "tier": "local", "source_node": "n2"}),
            json!({"event": "recovery", "node": "n3", "step": 121, "resumed_from": 120, "tier": "local",
                   "steps_lost": 7, "fault": "rank_lost", "recovery_seconds": 9.3, "in_job": true}),
        ]));
        assert_eq!(m[0].detail, "resumed at step 120, 7 steps lost, from the local tier (n2's copy)");
        assert_eq!(m[1].label(), "recovered in job · n3 · attempt 2");
        assert_eq!(
            m[1].detail,
            "after rank_lost: training again at step 121 from the local tier, 9.3 s after the fault, 7 steps trained \
             again, in the same job (no requeue)"
        );
    }

    #[test]
    fn a_skipped_requeue_reads_as_no_requeue() {
        let (_, m) = checkpoints_and_markers(&events(vec![
            json!({"event": "start"}),
            json!({"event": "requeue", "decision": "skip", "reason": "not under SLURM"}),
        ]));
        assert_eq!(m[0].what, "no requeue");
        assert_eq!(m[0].detail, "skip: not under SLURM");
    }

    #[test]
    fn checkpoints_are_numbered_with_size_and_timings() {
        let (c, _) = checkpoints_and_markers(&events(vec![
            json!({"event": "start", "node": "n1"}),
            json!({"event": "checkpoint_saved", "step": 50, "kind": "periodic", "bytes": 4096,
                   "snapshot_seconds": 0.01, "persist_seconds": 0.2}),
            json!({"event": "checkpoint_failed", "step": 100, "kind": "periodic", "error": "disk full"}),
        ]));
        assert_eq!(c.len(), 2);
        assert_eq!((c[0].number, c[0].step, c[0].bytes), (1, 50, Some(4096)));
        assert_eq!((c[0].snapshot_seconds, c[0].persist_seconds), (Some(0.01), Some(0.2)));
        assert_eq!(c[0].attempt, 1);
        assert!(c[1].failed);
        assert_eq!(c[1].problem.as_deref(), Some("disk full"));
    }

    #[test]
    fn a_run_directory_written_by_0_1_0_under_slurm_loads_whole() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/run-0.1.0-slurm");
        let data = RunData::load(&dir).unwrap();
        assert!(data.skipped.is_empty(), "{:?}", data.skipped);
        assert_eq!(data.attempts.len(), 2);
        assert_eq!(data.status.state, "finished");
        assert_eq!((data.train.len(), data.val.len()), (8, 4));
        assert_eq!(data.gpu.as_ref().map(|g| g.is_empty()), Some(false));
        let what: Vec<&str> = data.markers.iter().map(|m| m.what.as_str()).collect();
        assert_eq!(what, vec!["SIGTERM", "requeue", "resume"]);
        assert_eq!(data.markers[2].whose(), "n2 · attempt 2");
        assert_eq!(data.checkpoints.iter().filter(|c| c.kind == "stop").count(), 1);
    }

    #[test]
    fn an_unhealthy_node_and_its_exclusion_are_marked() {
        let (_, markers) = checkpoints_and_markers(&events(vec![
            json!({"event": "node_unhealthy", "node": "n1", "check": "site command", "detail": "exited 1"}),
            json!({"event": "nodes_excluded", "cause": "node_unhealthy: site command", "blamed": ["n1"],
                   "added": ["n1"], "excluded": ["n1"], "how": "requeue"}),
        ]));
        let shown: Vec<(&str, &str)> = markers.iter().map(|m| (m.what.as_str(), m.detail.as_str())).collect();
        assert_eq!(shown[0], ("unhealthy node", "node n1 failed its health check `site command`: exited 1"));
        assert_eq!(shown[1], ("excluded", "node_unhealthy: site command: excluded n1 (now n1)"));
    }
}
