//! The guard against requeue loops that make no progress: from the run's
//! records, the attempts since the last checkpoint committed or the last
//! finish, each with its node and how it ended; `[run]
//! max_attempts_without_progress` of them in a row and an *automatic* next
//! attempt (a requeue or an in-job restart of the same SLURM job) does not
//! train (exit 79, `crate::exit`). A start by a person (outside SLURM, or
//! the first attempt of a job just submitted) is never refused by it: it is
//! warned, with the history. A changed config starts the count afresh.
//!
//! An attempt begins with its `start` event, or, when the start-of-attempt
//! check failed, with its `node_unhealthy` (ranks of one attempt that fail
//! together, with the same `launch`, count once). An attempt killed with its node records no end:
//! it still counts, which is why the guard reads the records at the start
//! of the next attempt rather than trusting an end to decide.

use crate::telemetry::{Event, RecordedEvent};

/// The `why` of the `error` event that records the guard's verdict.
pub const VERDICT_WHY: &str = "no progress ([run] max_attempts_without_progress)";

/// One attempt since the last checkpoint committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptSummary {
    /// What launched it, for an attempt that began with `node_unhealthy`.
    launch: Option<String>,
    /// The hash of its config (`config::config_hash`), when recorded.
    config: Option<String>,
    /// Its node(s).
    pub nodes: Vec<String>,
    pub job_id: Option<String>,
    /// SLURM's restart count.
    pub restart: Option<u64>,
    /// How it ended, as its records say.
    pub ended: String,
}

/// The attempts since the last `checkpoint_saved` or `finish`, oldest first,
/// that ran with the config whose hash is `config`: an attempt recorded with
/// another config ends the count (the user changed something; older records
/// without a hash count as the same config).
pub fn attempts_without_progress(events: &[RecordedEvent], config: Option<&str>) -> Vec<AttemptSummary> {
    let mut attempts: Vec<AttemptSummary> = Vec::new();
    // Whether the newest attempt began with `node_unhealthy`.
    let mut unhealthy_open = false;
    for e in events {
        let node = e.node.clone().unwrap_or_default();
        match &e.event {
            // A finished run made progress as much as a checkpoint does: a
            // program under `exec` that finishes at once (nothing left to
            // train) must not count toward the guard run after run.
            Event::CheckpointSaved(_) | Event::Finish(_) => {
                attempts.clear();
                unhealthy_open = false;
            }
            Event::Start(start) => {
                attempts.push(AttemptSummary {
                    launch: None,
                    config: start.config_sha256.clone(),
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
                        config: u.config_sha256.clone(),
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
            _ => {}
        }
    }
    if let Some(changed) = attempts.iter().rposition(|a| a.config.as_deref().is_some_and(|c| Some(c) != config)) {
        attempts.drain(..=changed);
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

/// The attempt about to start, as the guard sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Starting<'a> {
    /// `SLURM_JOB_ID`; `None` outside SLURM.
    pub job_id: Option<&'a str>,
    /// `config::config_hash` of the config it runs with.
    pub config: &'a str,
}

/// The guard's verdict on the attempt about to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Guard {
    /// Fewer attempts without progress than the bound (or the guard is off).
    Train,
    /// The bound is reached, but a person started this attempt: it trains,
    /// with this message as a warning.
    Warn(NoProgress),
    /// The bound is reached by an automatic restart: it does not train.
    Refuse(NoProgress),
}

/// The guard's verdict: the attempts that made no progress, and the message
/// that names them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoProgress {
    pub attempts: Vec<AttemptSummary>,
    pub max: u32,
    pub message: String,
}

/// Decides about the attempt `starting` from the run's records `events`
/// (`[run] max_attempts_without_progress` = `max`; 0 turns the guard off).
/// In a SLURM job only that job's attempts count: a loop is a job requeued
/// or restarted again and again, and a job submitted anew is a person's
/// decision, so the bound can only be reached by an automatic start (a
/// requeue or an in-job restart of the job). Outside SLURM every start is
/// a person's.
pub fn progress_guard(max: u32, events: &[RecordedEvent], starting: &Starting) -> Guard {
    let mut attempts = attempts_without_progress(events, Some(starting.config));
    if let Some(job) = starting.job_id {
        attempts.retain(|a| a.job_id.as_deref() == Some(job));
    }
    if max == 0 || attempts.len() < max as usize {
        return Guard::Train;
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
    let counted = attempts.len();
    let verdict = |message| NoProgress { attempts, max, message };
    match starting.job_id {
        Some(job) => Guard::Refuse(verdict(format!(
            "{counted} attempts of job {job} in a row committed no newer checkpoint ([run] \
             max_attempts_without_progress = {max}): not training again and not requeueing; the attempts were \
             {each}. Fix what they say (a bad node: leave it out with `sbatch --exclude`; a crash that repeats: \
             `rekindle status` and the job's output), then submit the job again: a new job, or a changed config, \
             counts afresh. Or raise max_attempts_without_progress (0 turns the guard off)"
        ))),
        None => Guard::Warn(verdict(format!(
            "{counted} attempts in a row committed no newer checkpoint ([run] max_attempts_without_progress = \
             {max}): training anyway, because this start is a person's (outside SLURM), and the guard only stops \
             a job's automatic requeues and restarts; the attempts were {each}"
        ))),
    }
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

    fn in_job(job: &str) -> Starting<'_> {
        Starting { job_id: Some(job), config: "c1" }
    }

    #[test]
    fn attempts_since_the_last_checkpoint_are_counted_with_how_they_ended() {
        let attempts = attempts_without_progress(&history(), None);
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
        assert_eq!(attempts_without_progress(&events, None).len(), 2);
    }

    #[test]
    fn unhealthy_attempts_of_the_same_step_in_two_restarts_count_apart() {
        // SLURM numbers steps afresh after a requeue: `7.0` in restart 0 and in restart 1.
        let unhealthy = |restart| {
            line(json!({"event": "node_unhealthy", "node": "n1", "check": "c", "launch": "7.0"}), "n1", restart)
        };
        assert_eq!(attempts_without_progress(&[unhealthy(0), unhealthy(1)], None).len(), 2);
        assert_eq!(attempts_without_progress(&[unhealthy(1), unhealthy(1)], None).len(), 1);
    }

    #[test]
    fn a_committed_checkpoint_resets_the_count() {
        let mut events = history();
        events.push(line(json!({"event": "checkpoint_saved", "step": 20}), "n3", 3));
        assert!(attempts_without_progress(&events, None).is_empty());
    }

    #[test]
    fn a_finish_is_progress_and_resets_the_count() {
        // `rekindle exec -- true` six times: each a clean finish, none counted.
        let finished = |pid: u64| {
            [line(json!({"event": "start", "pid": pid}), "n1", 0), line(json!({"event": "finish"}), "n1", 0)]
        };
        let events: Vec<RecordedEvent> = (0..6).flat_map(finished).collect();
        assert!(attempts_without_progress(&events, None).is_empty());
        assert_eq!(progress_guard(5, &events, &in_job("7")), Guard::Train);
    }

    #[test]
    fn an_attempt_with_another_config_ends_the_count() {
        let start = |config: &str| line(json!({"event": "start", "config_sha256": config}), "n1", 0);
        let events = [start("c0"), start("c0"), start("c1"), start("c1")];
        assert_eq!(attempts_without_progress(&events, Some("c1")).len(), 2, "the two with c0 do not count");
        assert!(attempts_without_progress(&events, Some("c2")).is_empty(), "a new config counts afresh");
        // Records of older versions carry no hash: they count as the same config.
        let old = [line(json!({"event": "start"}), "n1", 0), start("c1")];
        assert_eq!(attempts_without_progress(&old, Some("c1")).len(), 2);
    }

    #[test]
    fn in_a_job_only_its_own_attempts_count_and_the_guard_refuses_at_its_bound_naming_each() {
        let events = history();
        assert_eq!(progress_guard(4, &events, &in_job("7")), Guard::Train);
        assert_eq!(progress_guard(0, &events, &in_job("7")), Guard::Train, "0 turns it off");
        let Guard::Refuse(verdict) = progress_guard(3, &events, &in_job("7")) else { panic!("refused") };
        assert!(
            verdict.message.starts_with("3 attempts of job 7 in a row committed no newer checkpoint"),
            "{}",
            verdict.message
        );
        assert!(verdict.message.contains("on n2 (job 7, restart 1): error: step 11 failed"), "{}", verdict.message);
        assert!(verdict.message.contains("on n1, n3 (job 7, restart 2): node_unhealthy"), "{}", verdict.message);
        assert!(verdict.message.contains("submit the job again"), "{}", verdict.message);
        // The same run submitted again as job 8: a person's start, and none of its attempts yet.
        assert_eq!(progress_guard(1, &events, &in_job("8")), Guard::Train);
    }

    #[test]
    fn outside_slurm_the_guard_warns_and_never_refuses() {
        let events: Vec<RecordedEvent> = (0..6)
            .map(|pid| RecordedEvent::from_value(json!({"event": "start", "pid": pid, "node": "n1"})).unwrap())
            .collect();
        let Guard::Warn(verdict) = progress_guard(5, &events, &Starting { job_id: None, config: "c1" }) else {
            panic!("warned")
        };
        assert!(verdict.message.contains("training anyway"), "{}", verdict.message);
        assert_eq!(verdict.attempts.len(), 6);
    }
}
