//! `rekindle status`: one screen about a run, read from its directory only
//! (summary.json, events.jsonl, metrics.jsonl, the lock and the checkpoints),
//! so it works from a login node while the job runs elsewhere.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::checkpoint::{CheckpointStore, VerifyLevel};
use crate::config;
use crate::telemetry::{self, Attempt, Event, MetricsLine, PublishOutcome, RecordedEvent, StepLine, Summary};

use crate::rundir::lock::{DEFAULT_STALE_AFTER, LOCK_FILE, LockInfo, unix_now};
use crate::rundir::{CONFIG_FILE, EVENTS_FILE, METRICS_FILE, SUMMARY_FILE, checkpoints_dir};

/// What a run directory says about its run.
#[derive(Debug, Clone, Serialize)]
pub struct RunStatus {
    pub run_dir: PathBuf,
    /// running, stopped, finished, failed or new.
    pub state: String,
    pub step: Option<u64>,
    pub max_steps: Option<u64>,
    pub progress: Option<f64>,
    pub last_loss: Option<f64>,
    pub checkpoints: Vec<CheckpointLine>,
    /// Checkpoints moved to `checkpoints/quarantine/` because they failed
    /// verification at resume (`rekindle checkpoints` lists them).
    pub quarantined: usize,
    pub last_checkpoint_age_seconds: Option<f64>,
    pub restarts: u64,
    pub attempts: u64,
    /// The last events of these kinds, shown (and serialised) as written.
    pub last_signal: Option<RecordedEvent>,
    pub last_stop: Option<RecordedEvent>,
    pub last_publish: Option<RecordedEvent>,
    pub last_requeue: Option<RecordedEvent>,
    /// The last `resume` (which tier and whose copy it came from, or why the
    /// durable tier was used) and the last `recovery` (after a fault: the
    /// steps trained again, the seconds to training again, in the job or
    /// after a requeue).
    pub last_resume: Option<RecordedEvent>,
    pub last_recovery: Option<RecordedEvent>,
    /// The last `local_checkpoint` (`[recovery] local`): committed on which
    /// nodes, or skipped/failed and why.
    pub last_local_checkpoint: Option<RecordedEvent>,
    /// The `straggler` events of the newest attempt (a rank, or a process
    /// alone, slower than the median for `[health] straggler_steps` steps).
    pub stragglers: Vec<RecordedEvent>,
    /// The last `node_unhealthy` (a node that failed its start-of-attempt
    /// check) and the last `nodes_excluded` (what was left behind, or why not).
    pub last_unhealthy: Option<RecordedEvent>,
    pub last_exclusion: Option<RecordedEvent>,
    /// The most recent attempt that has ended (the one before the running
    /// one while the run is running), and why it ended.
    pub last_ended_attempt: Option<Attempt>,
    /// Who holds the run directory now.
    pub lock: Option<LockInfo>,
    /// The SLURM job of the newest attempt (`<array job>_<task>` for an
    /// array task; `null` outside SLURM).
    pub job: Option<String>,
    /// The node the run runs on (while running) or last ran on.
    pub node: Option<String>,
    /// Estimated seconds to max_steps from the recent step rate.
    pub eta_seconds: Option<f64>,
    /// Why `config.toml` does not load (its settings are then unknown):
    /// too large, not a regular file, not valid TOML; `null` when it loads.
    pub config_problem: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CheckpointLine {
    pub step: u64,
    pub created_at: Option<String>,
    pub bytes: u64,
    pub valid: bool,
}

/// The kinds of event status shows the newest of.
const LAST_OF: [&str; 11] = [
    "signal",
    "stop",
    "publish",
    "requeue",
    "resume",
    "recovery",
    "local_checkpoint",
    "node_unhealthy",
    "nodes_excluded",
    "start",
    // The state: the newest of these says how the run ended.
    "finish",
];

/// The most `straggler` events of the newest attempt status keeps (the
/// newest ones): one a slow step for a whole attempt would otherwise be
/// held, and shown, in full.
const MAX_STRAGGLERS: usize = 50;

/// What status needs of `events.jsonl`, gathered a record at a time: a
/// file of millions of lines costs the memory of the events shown, not of
/// its lines (issue #40).
#[derive(Default)]
struct EventDigest {
    last: std::collections::HashMap<&'static str, RecordedEvent>,
    /// The name of the newest event that says what state the run is in.
    state_event: Option<String>,
    node: Option<String>,
    starts: u64,
    resumes: u64,
    stragglers: std::collections::VecDeque<RecordedEvent>,
    attempts: Option<telemetry::AttemptFold>,
}

impl EventDigest {
    fn read(path: &Path) -> EventDigest {
        let mut d = EventDigest { attempts: Some(telemetry::AttemptFold::keeping(2)), ..Default::default() };
        let _ = telemetry::for_each_jsonl(path, |v| {
            if let Some(ev) = RecordedEvent::from_value(v) {
                d.push(ev);
            }
        });
        d
    }

    fn push(&mut self, ev: RecordedEvent) {
        if let Some(f) = self.attempts.as_mut() {
            f.push(&ev);
        }
        if matches!(ev.name.as_str(), "finish" | "stop" | "error" | "start" | "resume" | "node_unhealthy") {
            self.state_event = Some(ev.name.clone());
        }
        if ev.node.is_some() {
            self.node.clone_from(&ev.node);
        }
        match ev.name.as_str() {
            "start" => {
                self.starts += 1;
                self.stragglers.clear();
            }
            "resume" => self.resumes += 1,
            "straggler" => {
                if self.stragglers.len() == MAX_STRAGGLERS {
                    self.stragglers.pop_front();
                }
                self.stragglers.push_back(ev.clone());
            }
            _ => {}
        }
        if let Some(name) = LAST_OF.iter().find(|n| **n == ev.name) {
            self.last.insert(name, ev);
        }
    }

    fn last_of(&self, name: &str) -> Option<RecordedEvent> {
        self.last.get(name).cloned()
    }
}

/// How much of the end of `metrics.jsonl` status reads: a few thousand
/// lines, more than the 100 the rate is taken over.
const METRICS_TAIL_BYTES: u64 = 1 << 20;

/// Reads the status of the run in `dir`.
/// Whether `dir` is a run directory the read-only commands can show: one
/// with its `config.toml`, or one rekindle claimed and recorded in before
/// any config was written there (every attempt failed its node check:
/// `config.toml` is written only once a node passes it).
pub fn is_run_dir(dir: &Path) -> bool {
    dir.join(CONFIG_FILE).is_file() || (crate::confine::is_claimed(dir) && dir.join(EVENTS_FILE).is_file())
}

/// The node check that kept every attempt of the run from training, when
/// none trained: `(node, check, detail)` of the newest `node_unhealthy`.
pub fn untrained_by_node_check(st: &RunStatus) -> Option<(&str, &str, &str)> {
    if st.attempts > 0 || !st.checkpoints.is_empty() {
        return None;
    }
    match st.last_unhealthy.as_ref().map(|e| &e.event) {
        Some(Event::NodeUnhealthy(u)) => Some((&u.node, &u.check, &u.detail)),
        _ => None,
    }
}

pub fn status(dir: &Path) -> RunStatus {
    let summary = Summary::read(&dir.join(SUMMARY_FILE));
    let (cfg, config_problem) = match config::load_recorded(&dir.join(CONFIG_FILE)) {
        Ok(l) => (Some(l.config), None),
        Err(e) => (None, Some(e.to_string())),
    };
    let mut events = EventDigest::read(&dir.join(EVENTS_FILE));
    // The newest lines only: the last step, loss and rate are all that is
    // shown, and a long run's file is hundreds of megabytes.
    let metrics: Vec<StepLine> = telemetry::read_jsonl_tail(&dir.join(METRICS_FILE), METRICS_TAIL_BYTES)
        .ok()
        .flatten()
        .map(|j| j.records)
        .unwrap_or_default()
        .iter()
        .filter_map(|m| match MetricsLine::from_value(m)? {
            MetricsLine::Step(s) => Some(s),
            MetricsLine::Val(_) => None,
        })
        .collect();
    let lock: Option<LockInfo> = LockInfo::read(&dir.join(LOCK_FILE));
    // Fresh by the holder's own timeout (else the run's config, else the default).
    let configured = cfg.as_ref().map_or(DEFAULT_STALE_AFTER, |c| c.lock.stale_after);
    let live_lock = lock
        .as_ref()
        .filter(|l| l.age(unix_now()) < l.recorded_stale_after().unwrap_or(configured).as_secs_f64())
        .cloned();

    let step = metrics.last().map(|m| m.step).or_else(|| summary.as_ref().map(|s| s.steps));
    let max_steps =
        recorded_max_steps(events.last.get("start")).unwrap_or_else(|| cfg.as_ref().map(|c| c.run.max_steps));
    let state = match (live_lock.is_some(), events.state_event.as_deref()) {
        (true, _) => "running",
        (false, Some("finish")) => "finished",
        (false, Some("stop")) => "stopped",
        (false, Some("error")) => "failed",
        // Started or resumed, no live lock, no ending event: the process died.
        (false, Some("start" | "resume")) => "failed",
        // The attempt ended untrained on a bad node; the job was requeued
        // (or said why not).
        (false, Some("node_unhealthy")) => "stopped",
        _ => "new",
    }
    .to_string();
    let ckpt_dir = cfg.as_ref().map(|c| checkpoints_dir(dir, c)).unwrap_or_else(|| dir.join("checkpoints"));
    let store = CheckpointStore::open_read_only(ckpt_dir);
    let quarantined = store.list_quarantined(VerifyLevel::Quick).map(|q| q.len()).unwrap_or(0);
    let checkpoints: Vec<CheckpointLine> = store
        .list(VerifyLevel::Quick)
        .unwrap_or_default()
        .into_iter()
        .map(|i| CheckpointLine { step: i.step, created_at: i.created_at, bytes: i.bytes, valid: i.valid })
        .collect();
    let last_checkpoint_age_seconds = checkpoints
        .iter()
        .find(|c| c.valid)
        .and_then(|c| chrono::DateTime::parse_from_rfc3339(c.created_at.as_deref()?).ok())
        .map(|t| (chrono::Utc::now() - t.with_timezone(&chrono::Utc)).num_milliseconds() as f64 / 1000.0);
    let eta_seconds = eta(&metrics, max_steps);
    let job = events.last.get("start").and_then(job_of);
    let node = live_lock.as_ref().map(|l| l.host.clone()).or_else(|| events.node.clone());
    let mut attempts = events.attempts.take().map(telemetry::AttemptFold::finish).unwrap_or_default();
    if live_lock.is_some() {
        attempts.pop();
    }
    RunStatus {
        config_problem,
        run_dir: dir.to_path_buf(),
        state,
        step,
        max_steps,
        progress: step.zip(max_steps).map(|(s, m)| s as f64 / m.max(1) as f64),
        last_loss: metrics.last().and_then(|m| m.loss),
        checkpoints,
        quarantined,
        last_checkpoint_age_seconds,
        restarts: events.resumes,
        attempts: events.starts,
        last_signal: events.last_of("signal"),
        last_stop: events.last_of("stop"),
        last_publish: events.last_of("publish"),
        last_requeue: events.last_of("requeue"),
        last_resume: events.last_of("resume"),
        last_recovery: events.last_of("recovery"),
        last_local_checkpoint: events.last_of("local_checkpoint"),
        stragglers: events.stragglers.drain(..).collect(),
        last_unhealthy: events.last_of("node_unhealthy"),
        last_exclusion: events.last_of("nodes_excluded"),
        last_ended_attempt: attempts.pop(),
        lock: live_lock,
        job,
        node,
        eta_seconds,
    }
}

/// `rank 1 on n2`, or `this process on n1` for a process alone.
pub fn straggler_who(s: &crate::telemetry::Straggler) -> String {
    let node = if s.rank_node.is_empty() { "?" } else { &s.rank_node };
    if s.world_size > 1 { format!("rank {} on {node}", s.rank) } else { format!("this process on {node}") }
}

/// `rank 1 on n2 from step 240: 0.310 s a step against a median of 0.100 s
/// (3.1×, 20 steps in a row); blamed`.
pub fn straggler_line(s: &crate::telemetry::Straggler) -> String {
    let who = straggler_who(s);
    let against = if s.world_size > 1 { "the other ranks' median" } else { "its first steps' median" };
    let ratio =
        if s.median_seconds > 0.0 { format!("{:.1}×, ", s.step_seconds / s.median_seconds) } else { String::new() };
    format!(
        "{who} from step {}: {:.3} s a step against {against} of {:.3} s ({ratio}{} steps in a row){}",
        s.step,
        s.step_seconds,
        s.median_seconds,
        s.steps,
        if s.blamed { "; its node is blamed" } else { "" }
    )
}

/// `from step 120 of the local tier (n2's copy)`, `from step 100 of the
/// durable tier (the local tier was not used: …)` or `from step 100`
/// (before tiers were recorded).
pub fn resume_line(r: &crate::telemetry::Resume) -> String {
    let tier = resume_tier(r).map(|t| format!(" of the {t}")).unwrap_or_default();
    let lost = if r.steps_lost > 0 { format!(", {} steps trained again", r.steps_lost) } else { String::new() };
    format!("from step {}{tier}{lost}", r.step)
}

/// `local tier (n2's copy)`, `durable tier (the local tier was not used:
/// …)`, `durable tier`; none before tiers were recorded.
pub fn resume_tier(r: &crate::telemetry::Resume) -> Option<String> {
    Some(match (r.tier.as_deref()?, &r.source_node, &r.fallback_reason) {
        ("local", Some(node), _) => format!("local tier ({node}'s copy)"),
        (tier, _, Some(why)) => format!("{tier} tier (the local tier was not used: {why})"),
        (tier, _, None) => format!("{tier} tier"),
    })
}

/// `after rank_lost: training again at step 128, 9.3 s after the fault,
/// 7 steps trained again, in the same job (no requeue)`.
pub fn recovery_line(r: &crate::telemetry::Recovery) -> String {
    let fault = if r.fault.is_empty() { "a fault" } else { &r.fault };
    let secs = r.recovery_seconds.map(|s| format!(", {s:.1} s after the fault")).unwrap_or_default();
    let how = if r.in_job { "in the same job (no requeue)" } else { "after a requeue" };
    format!(
        "after {fault}: training again at step {} from the {} tier{secs}, {} steps trained again, {how}",
        r.step,
        if r.tier.is_empty() { "?" } else { &r.tier },
        r.steps_lost
    )
}

/// `step 120 committed on n1, n2 (25.0 MiB a copy)`, or `step 120 skipped:
/// …`.
pub fn local_checkpoint_line(l: &crate::telemetry::LocalCheckpoint) -> String {
    let outcome = if l.outcome.is_empty() { "?" } else { &l.outcome };
    let mut line = format!("step {} {outcome}", l.step);
    if !l.holders.is_empty() {
        line += &format!(" on {}", l.holders.join(", "));
    }
    if l.bytes > 0 && l.outcome == "committed" {
        line += &format!(" ({} a copy)", crate::units::mib_or_gib(l.bytes));
    }
    if let Some(why) = &l.reason {
        line += &format!(": {}", clip(why, 200));
    }
    line
}

/// The job a `start` event ran in: the array task as `scontrol` names it
/// (`<array job>_<task>`), else the job id of its envelope.
fn job_of(start: &RecordedEvent) -> Option<String> {
    let alloc = start.raw.get("allocation");
    let field = |k: &str| alloc.and_then(|a| a.get(k)).and_then(|v| v.as_str()).map(str::to_string);
    match (field("array_job_id"), field("array_task_id")) {
        (Some(array), Some(task)) => Some(format!("{array}_{task}")),
        _ => start.job_id.clone(),
    }
}

/// The `max_steps` the newest `start` event records: `Some(None)` when it
/// records `null` (`rekindle exec` without a configured `[run] max_steps`:
/// there is no total to show), `None` when there is no such event or field
/// (then `config.toml` says).
fn recorded_max_steps(start: Option<&RecordedEvent>) -> Option<Option<u64>> {
    let start = start?;
    match start.raw.get("max_steps")? {
        serde_json::Value::Null => Some(None),
        value => value.as_u64().map(Some),
    }
}

/// Seconds to max_steps from the rate over the last (up to) 100 metric lines.
fn eta(metrics: &[StepLine], max_steps: Option<u64>) -> Option<f64> {
    let window = &metrics[metrics.len().saturating_sub(100)..];
    let (first, last) = (window.first()?, window.last()?);
    let t = |m: &StepLine| chrono::DateTime::parse_from_rfc3339(&m.time).ok();
    let secs = (t(last)? - t(first)?).num_milliseconds() as f64 / 1000.0;
    let steps = last.step.checked_sub(first.step)? as f64;
    let left = max_steps?.checked_sub(last.step)? as f64;
    (steps > 0.0 && secs > 0.0).then(|| left * secs / steps)
}

impl std::fmt::Display for RunStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "run       {}", self.run_dir.display())?;
        writeln!(f, "state     {}", self.state)?;
        if let Some(why) = &self.config_problem {
            writeln!(f, "config    {why}")?;
        }
        match (self.step, self.max_steps) {
            (Some(s), Some(m)) => writeln!(f, "step      {s} / {m} ({:.1}%)", 100.0 * s as f64 / m.max(1) as f64)?,
            (Some(s), None) => writeln!(f, "step      {s}")?,
            _ => writeln!(f, "step      -")?,
        }
        if let Some(l) = self.last_loss {
            writeln!(f, "loss      {l:.5}")?;
        }
        if let Some(eta) = self.eta_seconds.filter(|_| self.state == "running") {
            writeln!(f, "eta       {}", humantime::format_duration(std::time::Duration::from_secs(eta as u64)))?;
        }
        writeln!(f, "attempts  {} (resumes: {})", self.attempts, self.restarts)?;
        let valid = self.checkpoints.iter().filter(|c| c.valid).count();
        write!(f, "ckpts     {valid} valid of {}", self.checkpoints.len())?;
        if let Some(newest) = self.checkpoints.iter().find(|c| c.valid) {
            write!(f, ", newest step {}", newest.step)?;
        }
        if let Some(age) = self.last_checkpoint_age_seconds {
            write!(f, ", {} ago", humantime::format_duration(std::time::Duration::from_secs(age.max(0.0) as u64)))?;
        }
        if self.quarantined > 0 {
            write!(f, "; {} quarantined (see `rekindle checkpoints`)", self.quarantined)?;
        }
        writeln!(f)?;
        if let Some((node, check, _)) = untrained_by_node_check(self) {
            writeln!(
                f,
                "trained   nothing: every attempt ended at its node check (the last: `{check}` on {node}, below), \
                 before config.toml was written; fix the node or the check, then start the run again"
            )?;
        }
        if let Some(a) = &self.last_ended_attempt {
            writeln!(f, "ended     {a}")?;
        }
        if let Some(Event::Stop(stop)) = self.last_stop.as_ref().map(|e| &e.event) {
            let secs = stop.seconds_to_durable_checkpoint;
            writeln!(
                f,
                "last stop {} at step {}{}",
                if stop.reason.is_empty() { "?" } else { &stop.reason },
                stop.step.map_or("null".to_string(), |s| s.to_string()),
                secs.map(|s| format!(", durable checkpoint {s:.2}s after the signal")).unwrap_or_default()
            )?;
        }
        for e in &self.stragglers {
            if let Event::Straggler(s) = &e.event {
                writeln!(f, "straggler {}", straggler_line(s))?;
            }
        }
        if let Some(Event::Resume(r)) = self.last_resume.as_ref().map(|e| &e.event) {
            writeln!(f, "resumed   {}", resume_line(r))?;
        }
        if let Some(Event::Recovery(r)) = self.last_recovery.as_ref().map(|e| &e.event) {
            writeln!(f, "recovery  {}", recovery_line(r))?;
        }
        if let Some(Event::LocalCheckpoint(l)) = self.last_local_checkpoint.as_ref().map(|e| &e.event) {
            writeln!(f, "local     {}", local_checkpoint_line(l))?;
        }
        if let Some(Event::Requeue(r)) = self.last_requeue.as_ref().map(|e| &e.event) {
            writeln!(f, "requeue   {}: {}", r.decision.name(), r.decision.reason())?;
        }
        if let Some(Event::NodeUnhealthy(u)) = self.last_unhealthy.as_ref().map(|e| &e.event) {
            writeln!(f, "unhealthy {} failed `{}`: {}", u.node, u.check, clip(&u.detail, 200))?;
        }
        if let Some(Event::NodesExcluded(x)) = self.last_exclusion.as_ref().map(|e| &e.event) {
            let why = x.error.as_deref().or(x.note.as_deref());
            if x.added.is_empty() {
                writeln!(f, "excluded  none: {} blamed {}: {}", x.cause, x.blamed.join(", "), why.unwrap_or("?"))?;
            } else {
                writeln!(
                    f,
                    "excluded  {} ({}; {}, now excluded: {}){}",
                    x.added.join(", "),
                    x.cause,
                    if x.how == "in_job" { "from the next in-job step" } else { "from the requeued job" },
                    x.excluded.join(", "),
                    why.map(|w| format!("; {w}")).unwrap_or_default()
                )?;
            }
        }
        if let Some(Event::Publish(p)) = self.last_publish.as_ref().map(|e| &e.event) {
            let state = match p {
                PublishOutcome::Done { pushed: true, .. } => "pushed".to_string(),
                PublishOutcome::Skipped { skipped } => format!("skipped ({skipped})"),
                PublishOutcome::Done { last_error, .. } => {
                    format!("not pushed ({})", last_error.as_deref().unwrap_or("?"))
                }
                PublishOutcome::Failed { error } => format!("not pushed ({error})"),
            };
            writeln!(f, "publish   {state}")?;
        }
        if let Some(lock) = &self.lock {
            writeln!(
                f,
                "held by   pid {} on {} (job {})",
                lock.pid,
                lock.host,
                lock.job_id.as_deref().unwrap_or("none")
            )?;
        }
        Ok(())
    }
}

/// `text` cut to about `max` characters.
fn clip(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn run_dir_with_events(lines: &[serde_json::Value]) -> tempfile::TempDir {
        let tmp = tempfile::tempdir().unwrap();
        let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
        // A torn last line, as a crash leaves it.
        std::fs::write(tmp.path().join(EVENTS_FILE), format!("{text}{{\"event\":\"che")).unwrap();
        tmp
    }

    fn two_attempts() -> Vec<serde_json::Value> {
        use serde_json::json;
        vec![
            json!({"event": "start", "node": "n1", "time": "2026-11-01T10:00:00Z"}),
            json!({"event": "signal", "node": "n1", "signal": "SIGTERM", "step": 61}),
            json!({"event": "stop", "node": "n1", "step": 61, "reason": "SIGTERM", "seconds_to_durable_checkpoint": 0.5}),
            json!({"event": "start", "node": "n2", "time": "2026-11-01T10:05:00Z"}),
            json!({"event": "resume", "node": "n2", "step": 61, "steps_lost": 0}),
        ]
    }

    #[test]
    fn an_exec_run_without_a_configured_max_steps_shows_no_total() {
        use serde_json::json;
        let start = |max_steps: serde_json::Value| json!({"event": "start", "node": "n1", "max_steps": max_steps});
        let finish = json!({"event": "finish", "node": "n1", "step": 200});
        let tmp = run_dir_with_events(&[start(json!(null)), finish.clone()]);
        // What exec writes: every default, max_steps = 1000 among them.
        std::fs::write(tmp.path().join(CONFIG_FILE), config::to_toml(&config::Config::default())).unwrap();
        let summary = Summary { steps: 200, ..Summary::default() };
        std::fs::write(tmp.path().join(SUMMARY_FILE), summary.to_bytes()).unwrap();
        let st = status(tmp.path());
        assert_eq!((st.step, st.max_steps, st.progress), (Some(200), None, None));
        assert!(st.to_string().contains("step      200\n"), "{st}");
        // A configured one is shown, whatever config.toml holds.
        let tmp = run_dir_with_events(&[start(json!(400)), finish]);
        std::fs::write(tmp.path().join(SUMMARY_FILE), summary.to_bytes()).unwrap();
        let st = status(tmp.path());
        assert_eq!((st.max_steps, st.progress), (Some(400), Some(0.5)));
        assert!(st.to_string().contains("step      200 / 400 (50.0%)"), "{st}");
        // No start event: the config says.
        let tmp = run_dir_with_events(&[]);
        std::fs::write(tmp.path().join(CONFIG_FILE), config::to_toml(&config::Config::default())).unwrap();
        assert_eq!(status(tmp.path()).max_steps, Some(1000));
    }

    #[test]
    fn shows_the_stragglers_of_the_newest_attempt_with_their_rank_and_node() {
        use serde_json::json;
        let straggler = |rank: u64, node: &str, world: u64, blamed: bool| {
            json!({"event": "straggler", "node": "n1", "rank": rank, "rank_node": node, "step": 240,
                   "step_seconds": 0.31, "median_seconds": 0.1, "factor": 1.5, "steps": 20,
                   "blamed": blamed, "world_size": world})
        };
        let mut events = two_attempts();
        // Attempt 1's straggler is not the newest attempt's.
        events.insert(1, straggler(2, "n3", 4, false));
        events.push(straggler(1, "n2", 2, true));
        let tmp = run_dir_with_events(&events);
        let st = status(tmp.path());
        assert_eq!(st.stragglers.len(), 1);
        let text = st.to_string();
        assert!(
            text.contains(
                "straggler rank 1 on n2 from step 240: 0.310 s a step against the other ranks' median of 0.100 s \
                 (3.1×, 20 steps in a row); its node is blamed\n"
            ),
            "{text}"
        );
        assert!(!text.contains("rank 2 on n3"), "{text}");
        let json = serde_json::to_value(&st).unwrap();
        assert_eq!(json["stragglers"][0]["rank_node"], "n2");
        // A process alone is compared with its own first steps.
        let tmp = run_dir_with_events(&[json!({"event": "start", "node": "n4"}), straggler(0, "n4", 1, false)]);
        let text = status(tmp.path()).to_string();
        assert!(
            text.contains(
                "straggler this process on n4 from step 240: 0.310 s a step against its first steps' median of \
                 0.100 s (3.1×, 20 steps in a row)\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn shows_which_tier_a_resume_came_from_and_what_a_recovery_cost() {
        use serde_json::json;
        let mut events = two_attempts();
        events[4] = json!({"event": "resume", "node": "n3", "step": 120, "steps_lost": 7, "tier": "local",
                           "source_node": "n2", "this_node": "n3"});
        events.push(json!({"event": "recovery", "node": "n3", "step": 121, "resumed_from": 120, "tier": "local",
                           "steps_lost": 7, "fault": "rank_lost", "recovery_seconds": 9.3, "in_job": true}));
        events.push(json!({"event": "local_checkpoint", "node": "n3", "step": 125, "outcome": "committed",
                           "holders": ["n1", "n3"], "bytes": 26_214_400u64}));
        let tmp = run_dir_with_events(&events);
        let st = status(tmp.path());
        let text = st.to_string();
        for line in [
            "resumed   from step 120 of the local tier (n2's copy), 7 steps trained again\n",
            "recovery  after rank_lost: training again at step 121 from the local tier, 9.3 s after the fault, 7 steps \
             trained again, in the same job (no requeue)\n",
            "local     step 125 committed on n1, n3 (25.0 MiB a copy)\n",
        ] {
            assert!(text.contains(line), "{line:?} not in\n{text}");
        }
        let json = serde_json::to_value(&st).unwrap();
        assert_eq!(json["last_recovery"]["recovery_seconds"], 9.3);
        assert_eq!(json["last_resume"]["source_node"], "n2");
        assert_eq!(json["last_local_checkpoint"]["outcome"], "committed");
        // The durable tier, and why the local one was not used; after a requeue.
        events[4] = json!({"event": "resume", "node": "n3", "step": 100, "tier": "durable",
                           "fallback_reason": "no node holds a local copy newer than step 100"});
        events[5] = json!({"event": "recovery", "node": "n3", "step": 101, "resumed_from": 100, "tier": "durable",
                           "steps_lost": 27, "fault": "rank_lost", "in_job": false});
        events[6] = json!({"event": "local_checkpoint", "node": "n3", "step": 125, "outcome": "skipped",
                           "reason": "n3 has 10 MiB free, a copy needs 25 MiB"});
        let text = status(run_dir_with_events(&events).path()).to_string();
        for line in [
            "resumed   from step 100 of the durable tier (the local tier was not used: no node holds a local copy \
             newer than step 100)\n",
            "recovery  after rank_lost: training again at step 101 from the durable tier, 27 steps trained again, \
             after a requeue\n",
            "local     step 125 skipped: n3 has 10 MiB free, a copy needs 25 MiB\n",
        ] {
            assert!(text.contains(line), "{line:?} not in\n{text}");
        }
        // A resume after a graceful stop says only where from.
        let text = status(run_dir_with_events(&two_attempts()).path()).to_string();
        assert!(text.contains("resumed   from step 61\n"), "{text}");
        assert!(!text.contains("recovery "), "{text}");
    }

    #[test]
    fn the_job_of_an_array_task_is_named_as_scontrol_names_it() {
        use serde_json::json;
        let start =
            |alloc: serde_json::Value| json!({"event": "start", "node": "n1", "job_id": "4242", "allocation": alloc});
        let job = |alloc| status(run_dir_with_events(&[start(alloc)]).path()).job;
        assert_eq!(job(json!({"array_job_id": "4240", "array_task_id": "2"})), Some("4240_2".into()));
        assert_eq!(job(json!({"nodes": ["n1"]})), Some("4242".into()));
        assert_eq!(status(run_dir_with_events(&[json!({"event": "start"})]).path()).job, None);
    }

    #[test]
    fn counts_quarantined_checkpoints_apart() {
        let tmp = run_dir_with_events(&two_attempts());
        assert_eq!(status(tmp.path()).quarantined, 0);
        assert!(!status(tmp.path()).to_string().contains("quarantined"));
        let held = tmp.path().join("checkpoints").join(crate::checkpoint::QUARANTINE_DIR);
        std::fs::create_dir_all(held.join("step-0000000040-20261123T134501Z")).unwrap();
        let st = status(tmp.path());
        assert_eq!((st.quarantined, st.checkpoints.len()), (1, 0));
        assert!(st.to_string().contains("; 1 quarantined (see `rekindle checkpoints`)"), "{st}");
    }

    #[test]
    fn an_unhealthy_node_and_its_exclusion_are_shown() {
        let mut lines = two_attempts();
        lines.push(serde_json::json!({"event": "node_unhealthy", "time": "2026-11-01T10:05:00Z", "node": "n1",
            "job_id": "7", "attempt": 2, "check": "site command", "detail": "`check` exited 1 after 0.1s; output: bad",
            "checks": {}}));
        lines.push(serde_json::json!({"event": "nodes_excluded", "time": "2026-11-01T10:05:01Z", "node": "n1",
            "job_id": "7", "attempt": 2, "cause": "node_unhealthy: site command", "blamed": ["n1"], "added": ["n1"],
            "excluded": ["n1", "n9"], "how": "requeue"}));
        let tmp = run_dir_with_events(&lines);
        let text = status(tmp.path()).to_string();
        assert!(text.contains("state     stopped"), "{text}");
        assert!(text.contains("unhealthy n1 failed `site command`: `check` exited 1"), "{text}");
        assert!(
            text.contains("excluded  n1 (node_unhealthy: site command; from the requeued job, now excluded: n1, n9)"),
            "{text}"
        );
    }

    #[test]
    fn says_why_the_last_attempt_ended() {
        let tmp = run_dir_with_events(&two_attempts());
        let st = status(tmp.path());
        // No live lock and no ending event: attempt 2 died unrecorded.
        let last = st.last_ended_attempt.as_ref().unwrap();
        assert_eq!(last.number, 2);
        assert!(st.to_string().contains("ended     attempt 2 on n2 ended because no stop, finish or error"), "{st}");
    }

    #[test]
    fn while_running_reports_the_attempt_before_the_running_one() {
        let tmp = run_dir_with_events(&two_attempts());
        let lock = LockInfo {
            token: "t".into(),
            job_id: None,
            host: "n2".into(),
            pid: 1,
            heartbeat: unix_now(),
            started: unix_now(),
            ..LockInfo::default()
        };
        std::fs::write(tmp.path().join(LOCK_FILE), serde_json::to_vec(&lock).unwrap()).unwrap();
        let st = status(tmp.path());
        assert_eq!(st.state, "running");
        assert!(
            st.to_string().contains(
                "ended     attempt 1 on n1 ended because it received SIGTERM at step 61; checkpoint durable 0.50s \
                 after the signal"
            ),
            "{st}"
        );
    }

    #[test]
    fn a_run_directory_written_by_0_1_0_under_slurm_shows_its_last_stop_and_requeue() {
        let st = status(&Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/run-0.1.0-slurm"));
        assert_eq!((st.state.as_str(), st.step, st.attempts, st.restarts), ("finished", Some(400), 2, 1));
        let text = st.to_string();
        assert!(text.contains("last stop SIGTERM at step 59, durable checkpoint "), "{text}");
        assert!(text.contains("requeue   requeue: training not finished; job RUNNING, restart 0"), "{text}");
        // The JSON of `status --json` shows the events as they were written.
        let json = serde_json::to_value(&st).unwrap();
        assert_eq!(json["last_requeue"]["answer"], "requeued");
        assert_eq!(json["last_stop"]["node"], "n1");
    }

    /// Property tests: `rekindle status` over a run directory whose every
    /// file (events, metrics, GPU samples, summary, config, lock, a
    /// checkpoint's manifest) may be mutated; see `crate::fuzz`. The report's
    /// twin is in `report/render.rs`.
    pub(crate) mod fuzz {
        use super::*;
        use crate::fuzz;
        use proptest::prelude::*;

        const FILES: [&str; 5] = ["events.jsonl", "metrics.jsonl", "gpu_stats.jsonl", "summary.json", "config.toml"];

        fn fixture(file: &str) -> Vec<u8> {
            let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/run-0.1.0-slurm").join(file);
            std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        }

        fn lock() -> Vec<u8> {
            let info = LockInfo {
                token: "t".into(),
                job_id: Some("77".into()),
                host: "n1".into(),
                pid: 1,
                heartbeat: unix_now(),
                started: unix_now() - 60.0,
                ..LockInfo::default()
            };
            serde_json::to_vec(&info).unwrap()
        }

        fn manifest() -> Vec<u8> {
            let files = ["model.safetensors", "optimizer.safetensors", "state.json"]
                .map(|n| serde_json::json!({"name": n, "bytes": 100, "sha256": "ab".repeat(32)}));
            serde_json::to_vec(&serde_json::json!({
                "format_version": 1, "step": 10, "created_at": "2026-11-01T10:00:00Z",
                "rekindle_version": "0.1.0", "files": files,
            }))
            .unwrap()
        }

        /// Writes `files` (relative path, bytes) into a new temporary directory.
        pub(crate) fn write_run_dir(files: &[(String, Vec<u8>)]) -> tempfile::TempDir {
            let tmp = tempfile::tempdir().unwrap();
            for (name, bytes) in files {
                let path = tmp.path().join(name);
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(&path, bytes).unwrap();
            }
            tmp
        }

        /// Which file gets which mutations.
        pub(crate) fn damaged_run_dir() -> impl Strategy<Value = Vec<(String, Vec<u8>)>> {
            let mut files: Vec<BoxedStrategy<(String, Vec<u8>)>> = FILES
                .iter()
                .map(|f| {
                    let name = f.to_string();
                    prop_oneof![Just(fixture(f)), fuzz::mutated(fixture(f))]
                        .prop_map(move |b| (name.clone(), b))
                        .boxed()
                })
                .collect();
            files.push(
                prop_oneof![Just(lock()), fuzz::mutated(lock())].prop_map(|b| (LOCK_FILE.to_string(), b)).boxed(),
            );
            files.push(
                prop_oneof![Just(manifest()), fuzz::mutated(manifest())]
                    .prop_map(|b| ("checkpoints/step-0000000010/MANIFEST.json".to_string(), b))
                    .boxed(),
            );
            files
        }

        proptest! {
            #![proptest_config(fuzz::config())]

            #[test]
            fn status_of_a_damaged_run_dir_never_panics(files in damaged_run_dir()) {
                let tmp = write_run_dir(&files);
                let st = status(tmp.path());
                let _ = st.to_string();
                let _ = serde_json::to_string(&st).unwrap();
            }
        }
    }
}
