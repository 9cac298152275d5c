//! The guard against requeue loops that make no progress: from the run's
//! records, the attempts since the last checkpoint committed, each with its
//! node and how it ended; `[run] max_attempts_without_progress` of them in
//! a row and the next attempt does not train (exit 79, `crate::exit`).
//!
//! An attempt begins with its `start` event, or, when the start-of-attempt
//! check failed, with its `node_unhealthy` (ranks of one attempt that fail
//! together, with the same `launch`, count once). An attempt killed with its node records no end:
//! it still counts, which is why the guard reads the records at the start
//! of the next attempt rather than trusting an end to decide.

use crate::telemetry::{Event, RecordedEvent};

/// The `why` of the `error` event that records the guard's verdict.
pub const VERDICT_WHY: &str = "no progress ([run] max_attempts_without_progress)";

/// The records the guard counts: after its newest verdict when a SLURM job
/// other than the one it stopped reads them (the user fixed what it said and
/// submitted again: the count starts afresh); all of them otherwise, so the
/// ranks of the stopped attempt decide alike whenever each reads. Outside
/// SLURM nothing tells a new launch from the stopped one: the verdict stands
/// until `max_attempts_without_progress` is raised or set to 0.
pub fn since_last_verdict<'a>(events: &'a [RecordedEvent], job_id: Option<&str>) -> &'a [RecordedEvent] {
    let verdict =
        events.iter().rposition(|e| matches!(&e.event, Event::Error(err) if err.why.as_deref() == Some(VERDICT_WHY)));
    match verdict {
        Some(i) if job_id.is_some() && events[i].job_id.as_deref() != job_id => &events[i + 1..],
        _ => events,
    }
}

/// One attempt since the last checkpoint committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptSummary {
    /// What launched it, for an attempt that began with `node_unhealthy`.
    launch: Option<String>,
    /// Its node(s).
    pub nodes: Vec<String>,
    pub job_id: Option<String>,
    /// SLURM's restart count.
    pub restart: Option<u64>,
    /// How it ended, as its records say.
    pub ended: String,
}

/// The attempts since the last `checkpoint_saved`, oldest first.
pub fn attempts_without_progress(events: &[RecordedEvent]) -> Vec<AttemptSummary> {
    let mut attempts: Vec<AttemptSummary> = Vec::new();
    // Whether the newest attempt began with `node_unhealthy`.
    let mut unhealthy_open = false;
    for e in events {
        let node = e.node.clone().unwrap_or_default();
        match &e.event {
            Event::CheckpointSaved(_) => {
                attempts.clear();
                unhealthy_open = false;
            }
            Event::Start(_) => {
                attempts.push(AttemptSummary {
                    launch: None,
                    nodes: vec![node],
                    job_id: e.job_id.clone(),
                    restart: e.slurm_attempt,
                    ended: "no end recorded (killed, or its node failed)".into(),
                });
                unhealthy_open = false;
            }
            Event::NodeUnhealthy(u) => {
                // SLURM numbers a job's steps afresh after a requeue: the
                // restart count tells two attempts' `<job>.0` apart.
                let same = attempts.last().is_some_and(|a| {
                    unhealthy_open && a.launch.as_ref() == Some(&u.launch) && a.restart == e.slurm_attempt
                });
                let ended = format!("node_unhealthy on {}: {}", u.node, u.check);
                match attempts.last_mut() {
                    Some(a) if same => {
                        a.nodes.push(u.node.clone());
                        a.ended.push_str(&format!("; {ended}"));
                    }
                    _ => attempts.push(AttemptSummary {
                        launch: Some(u.launch.clone()),
                        nodes: vec![u.node.clone()],
                        job_id: e.job_id.clone(),
                        restart: e.slurm_attempt,
                        ended,
                    }),
                }
                unhealthy_open = true;
            }
            Event::Stop(stop) => set_end(&mut attempts, format!("stop: {}", stop.reason)),
            Event::Error(err) => set_end(&mut attempts, format!("error: {}", first_line(&err.error))),
            Event::Finish(_) => set_end(&mut attempts, "finish".into()),
            _ => {}
        }
    }
    attempts
}

fn set_end(attempts: &mut [AttemptSummary], ended: String) {
    if let Some(last) = attempts.last_mut() {
        last.ended = ended;
    }
}

fn first_line(text: &str) -> &str {
    let line = text.lines().next().unwrap_or_default();
    match line.char_indices().nth(200) {
        Some((at, _)) => &line[..at],
        None => line,
    }
}

/// The guard's verdict: the attempts that made no progress, and the message
/// that names them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoProgress {
    pub attempts: Vec<AttemptSummary>,
    pub max: u32,
    pub message: String,
}

/// `Some` when `attempts` (those since the last checkpoint) reach `max`
/// (`[run] max_attempts_without_progress`; 0 turns the guard off).
pub fn progress_guard(max: u32, attempts: &[AttemptSummary]) -> Option<NoProgress> {
    if max == 0 || attempts.len() < max as usize {
        return None;
    }
    let each = attempts
        .iter()
        .map(|a| {
            let job = a.job_id.as_deref().map(|j| format!("job {j}, ")).unwrap_or_default();
            let restart = a.restart.map(|r| format!("restart {r}")).unwrap_or_else(|| "no restart count".into());
            format!("on {} ({job}{restart}): {}", a.nodes.join(", "), a.ended)
        })
        .collect::<Vec<_>>()
        .join("; ");
    let message = format!(
        "{} attempts in a row committed no newer checkpoint ([run] max_attempts_without_progress = {max}): not \
         training again and not requeueing; the attempts were {each}. Fix what they say (a bad node, a crash that \
         repeats) and submit again; raise max_attempts_without_progress, or 0 to turn the guard off",
        attempts.len()
    );
    Some(NoProgress { attempts: attempts.to_vec(), max, message })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn line(event: serde_json::Value, node: &str, restart: u64) -> RecordedEvent {
        let mut v = event;
        v["node"] = json!(node);
        v["job_id"] = json!("7");
        v["attempt"] = json!(restart);
        RecordedEvent::from_value(v).unwrap()
    }

    fn history() -> Vec<RecordedEvent> {
        vec![
            line(json!({"event": "start"}), "n1", 0),
            line(json!({"event": "checkpoint_saved", "step": 10}), "n1", 0),
            line(json!({"event": "stop", "reason": "SIGTERM"}), "n1", 0),
            line(json!({"event": "start"}), "n2", 1),
            line(json!({"event": "error", "error": "step 11 failed: device lost\nmore"}), "n2", 1),
            line(json!({"event": "node_unhealthy", "node": "n1", "check": "site command", "launch": "7.0"}), "n1", 2),
            line(json!({"event": "node_unhealthy", "node": "n3", "check": "gpu health", "launch": "7.0"}), "n3", 2),
            line(json!({"event": "start"}), "n3", 3),
        ]
    }

    #[test]
    fn attempts_since_the_last_checkpoint_are_counted_with_how_they_ended() {
        let attempts = attempts_without_progress(&history());
        let ends: Vec<(&[String], &str)> = attempts.iter().map(|a| (a.nodes.as_slice(), a.ended.as_str())).collect();
        assert_eq!(ends.len(), 3, "{attempts:?}");
        assert_eq!(ends[0], (&["n2".to_string()][..], "error: step 11 failed: device lost"));
        assert_eq!(ends[1].0, ["n1", "n3"], "two ranks of one attempt failing count once");
        assert!(ends[1].1.contains("node_unhealthy on n1: site command; node_unhealthy on n3: gpu health"));
        assert_eq!(ends[2].1, "no end recorded (killed, or its node failed)");
    }

    #[test]
    fn unhealthy_attempts_of_other_launches_count_apart() {
        let events = vec![
            line(json!({"event": "node_unhealthy", "node": "n1", "check": "c", "launch": "pid 10"}), "n1", 0),
            line(json!({"event": "node_unhealthy", "node": "n1", "check": "c", "launch": "pid 11"}), "n1", 0),
        ];
        assert_eq!(attempts_without_progress(&events).len(), 2);
    }

    #[test]
    fn unhealthy_attempts_of_the_same_step_in_two_restarts_count_apart() {
        // SLURM numbers steps afresh after a requeue: `7.0` in restart 0 and in restart 1.
        let unhealthy = |restart| {
            line(json!({"event": "node_unhealthy", "node": "n1", "check": "c", "launch": "7.0"}), "n1", restart)
        };
        assert_eq!(attempts_without_progress(&[unhealthy(0), unhealthy(1)]).len(), 2);
        assert_eq!(attempts_without_progress(&[unhealthy(1), unhealthy(1)]).len(), 1);
    }

    #[test]
    fn a_new_job_counts_afresh_after_the_verdict_and_the_stopped_job_does_not() {
        let mut events = history();
        events.push(line(json!({"event": "error", "error": "3 attempts in a row…", "why": VERDICT_WHY}), "n3", 3));
        // The job the verdict stopped (another of its ranks reading late): all count.
        assert_eq!(attempts_without_progress(since_last_verdict(&events, Some("7"))).len(), 3);
        // Submitted again as job 8: nothing since the verdict.
        assert!(attempts_without_progress(since_last_verdict(&events, Some("8"))).is_empty());
        // Outside SLURM nothing tells a new launch apart: the verdict stands.
        assert_eq!(since_last_verdict(&events, None).len(), events.len());
        // An error that is not the verdict resets nothing.
        let other = line(json!({"event": "error", "error": "x", "why": "something else"}), "n3", 3);
        let events = [history(), vec![other]].concat();
        assert_eq!(since_last_verdict(&events, Some("8")).len(), events.len());
    }

    #[test]
    fn a_committed_checkpoint_resets_the_count() {
        let mut events = history();
        events.push(line(json!({"event": "checkpoint_saved", "step": 20}), "n3", 3));
        assert!(attempts_without_progress(&events).is_empty());
    }

    #[test]
    fn the_guard_stops_at_its_bound_and_names_each_attempt() {
        let attempts = attempts_without_progress(&history());
        assert_eq!(progress_guard(4, &attempts), None);
        assert_eq!(progress_guard(0, &attempts), None, "0 turns it off");
        let verdict = progress_guard(3, &attempts).unwrap();
        assert!(
            verdict.message.starts_with("3 attempts in a row committed no newer checkpoint"),
            "{}",
            verdict.message
        );
        assert!(verdict.message.contains("on n2 (job 7, restart 1): error: step 11 failed"), "{}", verdict.message);
        assert!(verdict.message.contains("on n1, n3 (job 7, restart 2): node_unhealthy"), "{}", verdict.message);
    }
}
