//! The attempts of a run, derived from `events.jsonl`: each `start` event
//! opens one, and the events up to the next `start` say how it went and how
//! it ended. A pure function of the events, shared by `rekindle report` (the
//! attempts table) and `rekindle status` ("last attempt ended because …").

use std::fmt;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::event::{Event, RecordedEvent};

/// How an attempt ended.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AttemptEnd {
    /// It reached max_steps (`finish`).
    Finished,
    /// A stop signal or `--stop-at-step` (`stop`): `reason` is the signal name
    /// or `stop_at_step`.
    Stopped { reason: String, fast_exit: bool, before_training: bool },
    /// It recorded an `error`.
    Failed { error: String },
    /// No ending event: still running, or killed without a chance to record
    /// one (SIGKILL after the grace time, a node failure, out of memory).
    Unrecorded,
}

impl AttemptEnd {
    /// A few words for a table cell.
    pub fn short(&self) -> String {
        match self {
            AttemptEnd::Finished => "finished".into(),
            AttemptEnd::Stopped { reason, .. } => reason.clone(),
            AttemptEnd::Failed { .. } => "error".into(),
            AttemptEnd::Unrecorded => "no end recorded".into(),
        }
    }
}

/// One attempt of a run: one process from `start` to its exit.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Attempt {
    /// 1 for the first `start` in events.jsonl, then 2, 3, …
    pub number: usize,
    pub node: Option<String>,
    pub job_id: Option<String>,
    /// SLURM's restart count (0 outside SLURM, so it can repeat).
    pub slurm_attempt: Option<u64>,
    pub started: Option<DateTime<Utc>>,
    /// Time of the ending event; for an unrecorded end, of its last event.
    pub ended: Option<DateTime<Utc>>,
    /// The step it resumed from (0 for a fresh start).
    pub start_step: u64,
    /// The step of its ending event, else the highest step it recorded.
    pub end_step: Option<u64>,
    pub end: AttemptEnd,
    /// From the stop signal to the durable stop checkpoint.
    pub seconds_to_checkpoint: Option<f64>,
    /// The requeue decision and its reason (`requeue: …`, `skip: …`).
    pub requeue: Option<String>,
    /// Steps this attempt trained that the next one had to train again
    /// (the next attempt's `resume.steps_lost`).
    pub steps_lost: Option<u64>,
    pub checkpoints_saved: usize,
    /// Under `rekindle exec`: how the program ended (`child_exit`: `exited
    /// with code 0`, `was killed by SIGKILL`); `None` for `rekindle run`.
    pub program: Option<String>,
}

impl Attempt {
    fn opened_by(number: usize, start: &RecordedEvent) -> Attempt {
        Attempt {
            number,
            node: start.node.clone(),
            job_id: start.job_id.clone(),
            slurm_attempt: start.slurm_attempt,
            started: start.time,
            ended: None,
            start_step: 0,
            end_step: None,
            end: AttemptEnd::Unrecorded,
            seconds_to_checkpoint: None,
            requeue: None,
            steps_lost: None,
            checkpoints_saved: 0,
            program: None,
        }
    }

    /// The end as a sentence: "it received SIGTERM at step 130", …
    pub fn because(&self) -> String {
        let at = self.end_step.map(|s| format!(" at step {s}")).unwrap_or_default();
        let mut text = match &self.end {
            AttemptEnd::Finished if self.program.is_some() => format!("the program finished{at}"),
            AttemptEnd::Finished => format!("it reached max_steps{at}"),
            AttemptEnd::Stopped { reason, before_training: true, .. } => {
                format!("it was stopped ({reason}) before training began")
            }
            AttemptEnd::Stopped { reason, .. } if reason == "stop_at_step" => format!("--stop-at-step was reached{at}"),
            AttemptEnd::Stopped { reason, fast_exit, .. } => format!(
                "it received {reason}{at}{}",
                if *fast_exit { " and exited at once, keeping the previous checkpoint" } else { "" }
            ),
            AttemptEnd::Failed { error } => format!("it failed{at}: {error}"),
            AttemptEnd::Unrecorded => {
                "no stop, finish or error was recorded (still running, or killed without warning: SIGKILL, node \
                 failure, out of memory)"
                    .to_string()
            }
        };
        if let Some(secs) = self.seconds_to_checkpoint {
            text.push_str(&format!("; checkpoint durable {secs:.2}s after the signal"));
        }
        if let Some(r) = &self.requeue {
            text.push_str(&format!("; requeue {r}"));
        }
        text
    }
}

impl fmt::Display for Attempt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "attempt {}", self.number)?;
        if let Some(node) = &self.node {
            write!(f, " on {node}")?;
        }
        write!(f, " ended because {}", self.because())
    }
}

/// The attempts recorded in `events` (in file order); events before the
/// first `start` belong to none.
pub fn attempts(events: &[RecordedEvent]) -> Vec<Attempt> {
    let mut fold = AttemptFold::keeping(usize::MAX);
    events.iter().for_each(|ev| fold.push(ev));
    fold.finish()
}

/// [`attempts`] one event at a time, keeping only the newest `keep`
/// attempts: a reader streaming a long `events.jsonl` (`status`, `report`)
/// holds as many attempts as it shows, not one per `start` ever written.
#[derive(Debug, Clone)]
pub struct AttemptFold {
    kept: std::collections::VecDeque<Attempt>,
    keep: usize,
    count: usize,
}

impl AttemptFold {
    /// Keeps the newest `keep` attempts (at least two: a `resume` tells the
    /// attempt before it how many steps it lost).
    pub fn keeping(keep: usize) -> AttemptFold {
        AttemptFold { kept: Default::default(), keep: keep.max(2), count: 0 }
    }

    /// How many attempts were opened, kept or not.
    pub fn count(&self) -> usize {
        self.count
    }

    /// The attempts kept, oldest first.
    pub fn finish(self) -> Vec<Attempt> {
        self.kept.into()
    }

    pub fn push(&mut self, ev: &RecordedEvent) {
        if ev.name == "start" {
            self.count += 1;
            if self.kept.len() == self.keep {
                self.kept.pop_front();
            }
            self.kept.push_back(Attempt::opened_by(self.count, ev));
            return;
        }
        let n = self.kept.len();
        let Some(cur) = self.kept.back_mut() else { return };
        if cur.end == AttemptEnd::Unrecorded {
            cur.ended = ev.time.or(cur.ended);
            if let Some(s) = ev.step {
                cur.end_step = Some(cur.end_step.map_or(s, |e| e.max(s)));
            }
        }
        match &ev.event {
            Event::Resume(resume) => {
                cur.start_step = resume.step;
                let lost = ev.raw.get("steps_lost").map(|_| resume.steps_lost);
                if let Some(prev) = n.checked_sub(2).and_then(|i| self.kept.get_mut(i)) {
                    prev.steps_lost = lost;
                }
            }
            Event::CheckpointSaved(_) => cur.checkpoints_saved += 1,
            // In a job step of several tasks, task 0's program is the
            // attempt's (the others' may end after it).
            Event::ChildExit(exit) if exit.task.is_none_or(|t| t == 0) => {
                cur.program = Some(match (exit.exit_code, &exit.signal) {
                    (Some(code), _) => format!("exited with code {code}"),
                    (None, Some(signal)) => format!("was killed by {signal}"),
                    (None, None) => "ended".to_string(),
                });
            }
            Event::Requeue(r) => {
                let decision = r.decision.name();
                cur.requeue = Some(match r.decision.reason() {
                    "" => decision.to_string(),
                    reason => format!("{decision}: {reason}"),
                });
            }
            Event::Finish(_) => {
                cur.end = AttemptEnd::Finished;
                cur.end_step = ev.step.or(cur.end_step);
                cur.ended = ev.time;
            }
            Event::Stop(stop) => {
                cur.end = AttemptEnd::Stopped {
                    reason: if stop.reason.is_empty() { "unknown".into() } else { stop.reason.clone() },
                    fast_exit: stop.fast_exit,
                    before_training: stop.before_training,
                };
                cur.end_step = ev.step.or(cur.end_step);
                cur.ended = ev.time;
                cur.seconds_to_checkpoint = stop.seconds_to_durable_checkpoint;
            }
            Event::Error(e) => {
                let error = if e.error.is_empty() { "unknown error" } else { &e.error };
                cur.end = AttemptEnd::Failed { error: error.to_string() };
                cur.end_step = ev.step.or(cur.end_step);
                cur.ended = ev.time;
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn ev(v: Value) -> RecordedEvent {
        RecordedEvent::from_value(v).unwrap()
    }

    fn at(secs: u32) -> String {
        format!("2026-11-01T10:{:02}:{:02}.000Z", secs / 60, secs % 60)
    }

    fn three_attempts() -> Vec<RecordedEvent> {
        vec![
            ev(json!({"event": "start", "time": at(0), "node": "n1", "attempt": 0, "job_id": "7"})),
            ev(json!({"event": "checkpoint_saved", "time": at(10), "node": "n1", "step": 50, "kind": "periodic"})),
            ev(json!({"event": "signal", "time": at(20), "node": "n1", "signal": "SIGTERM", "step": 61})),
            ev(json!({"event": "checkpoint_saved", "time": at(21), "node": "n1", "step": 61, "kind": "stop"})),
            ev(json!({"event": "requeue", "time": at(22), "decision": "requeue", "reason": "preempted"})),
            ev(json!({"event": "stop", "time": at(22), "node": "n1", "step": 61, "reason": "SIGTERM",
                      "seconds_to_durable_checkpoint": 1.25})),
            ev(json!({"event": "start", "time": at(60), "node": "n2", "attempt": 1})),
            ev(json!({"event": "resume", "time": at(61), "node": "n2", "step": 61, "steps_lost": 0})),
            ev(json!({"event": "checkpoint_saved", "time": at(70), "node": "n2", "step": 100})),
            ev(json!({"event": "start", "time": at(120), "node": "n3", "attempt": 2})),
            ev(json!({"event": "resume", "time": at(121), "node": "n3", "step": 100, "steps_lost": 12})),
            ev(json!({"event": "finish", "time": at(150), "node": "n3", "step": 200})),
        ]
    }

    #[test]
    fn each_start_opens_an_attempt_with_its_node_and_times() {
        let a = attempts(&three_attempts());
        assert_eq!(a.len(), 3);
        assert_eq!(a.iter().map(|x| x.number).collect::<Vec<_>>(), vec![1, 2, 3]);
        assert_eq!(a.iter().map(|x| x.node.clone().unwrap()).collect::<Vec<_>>(), vec!["n1", "n2", "n3"]);
        assert_eq!(a[0].slurm_attempt, Some(0));
        assert_eq!(a[0].job_id.as_deref(), Some("7"));
        assert_eq!(a[0].started.unwrap().to_rfc3339(), "2026-11-01T10:00:00+00:00");
        assert_eq!(a[0].ended.unwrap().to_rfc3339(), "2026-11-01T10:00:22+00:00");
    }

    #[test]
    fn a_stop_records_reason_step_checkpoint_time_and_requeue() {
        let a = attempts(&three_attempts());
        assert_eq!(
            a[0].end,
            AttemptEnd::Stopped { reason: "SIGTERM".into(), fast_exit: false, before_training: false }
        );
        assert_eq!(a[0].end_step, Some(61));
        assert_eq!(a[0].seconds_to_checkpoint, Some(1.25));
        assert_eq!(a[0].requeue.as_deref(), Some("requeue: preempted"));
        assert_eq!(a[0].checkpoints_saved, 2);
        assert_eq!(
            a[0].because(),
            "it received SIGTERM at step 61; checkpoint durable 1.25s after the signal; requeue requeue: preempted"
        );
    }

    #[test]
    fn steps_lost_are_charged_to_the_attempt_that_lost_them() {
        let a = attempts(&three_attempts());
        assert_eq!(a[0].steps_lost, Some(0));
        assert_eq!(a[1].steps_lost, Some(12));
        assert_eq!(a[2].steps_lost, None);
        assert_eq!(a[1].start_step, 61);
    }

    #[test]
    fn an_attempt_without_an_ending_event_is_unrecorded_with_its_last_step_and_time() {
        let a = attempts(&three_attempts());
        assert_eq!(a[1].end, AttemptEnd::Unrecorded);
        assert_eq!(a[1].end_step, Some(100));
        assert_eq!(a[1].ended.unwrap().to_rfc3339(), "2026-11-01T10:01:10+00:00");
        assert!(a[1].to_string().starts_with("attempt 2 on n2 ended because no stop, finish or error"));
    }

    #[test]
    fn finish_and_error_end_attempts() {
        let a = attempts(&three_attempts());
        assert_eq!(a[2].end, AttemptEnd::Finished);
        assert_eq!(a[2].because(), "it reached max_steps at step 200");
        let failed = attempts(&[
            ev(json!({"event": "start", "time": at(0)})),
            ev(json!({"event": "error", "time": at(5), "step": 9, "error": "non-finite loss or gradient"})),
        ]);
        assert_eq!(failed[0].end.short(), "error");
        assert_eq!(failed[0].because(), "it failed at step 9: non-finite loss or gradient");
    }

    #[test]
    fn a_program_under_exec_finishes_as_itself_and_its_end_is_kept() {
        let a = attempts(&[
            ev(json!({"event": "start"})),
            ev(json!({"event": "child_exit", "exit_code": 0, "verdict": "finished", "last_sealed_step": 60})),
            ev(json!({"event": "finish", "step": 60})),
            ev(json!({"event": "start"})),
            ev(json!({"event": "child_exit", "signal": "SIGKILL", "verdict": "stopped", "task": 0})),
            ev(json!({"event": "stop", "step": 40, "reason": "SIGTERM"})),
            ev(json!({"event": "child_exit", "exit_code": 1, "verdict": "stopped", "task": 1})),
        ]);
        assert_eq!(a[0].because(), "the program finished at step 60");
        assert_eq!(a[0].program.as_deref(), Some("exited with code 0"));
        assert_eq!(a[1].program.as_deref(), Some("was killed by SIGKILL"));
        assert_eq!(a[1].because(), "it received SIGTERM at step 40");
        assert_eq!(attempts(&three_attempts())[2].program, None);
    }

    #[test]
    fn stop_at_step_and_early_stops_read_naturally() {
        let a = attempts(&[
            ev(json!({"event": "start"})),
            ev(json!({"event": "stop", "step": 60, "reason": "stop_at_step"})),
            ev(json!({"event": "start"})),
            ev(json!({"event": "stop", "step": 60, "reason": "SIGINT", "before_training": true})),
        ]);
        assert_eq!(a[0].because(), "--stop-at-step was reached at step 60");
        assert_eq!(a[1].because(), "it was stopped (SIGINT) before training began");
    }

    #[test]
    fn events_before_the_first_start_are_ignored() {
        let a = attempts(&[ev(json!({"event": "stop", "step": 1})), ev(json!({"event": "start"}))]);
        assert_eq!(a.len(), 1);
        assert_eq!(a[0].end, AttemptEnd::Unrecorded);
        assert!(attempts(&[]).is_empty());
    }

    #[test]
    fn a_fold_keeping_two_matches_the_newest_two_of_the_whole_list() {
        let all = attempts(&three_attempts());
        let mut fold = AttemptFold::keeping(2);
        three_attempts().iter().for_each(|e| fold.push(e));
        assert_eq!(fold.count(), 3);
        assert_eq!(fold.finish(), all[1..].to_vec());
    }
}
