//! What a world that lost ranks (`rank_watch.rs`) records and decides,
//! whichever driver ran it: `run`'s data-parallel ranks (`run/lost.rs`,
//! `run/hang.rs`) and `exec`'s supervisors of a job step of several tasks
//! (`exec/world.rs`). The survivors cannot finish a collective, so nobody
//! can take a checkpoint; the job comes back from the newest committed one,
//! as after a hang:
//!
//! ```text
//! recorder (lowest rank still beating): `rank_lost` per lost rank ─ an
//!     in-job restart without the lost nodes where the batch shell offers
//!     one, else the requeue decision (as a hang's: counted toward [run]
//!     max_crash_requeues) ─ `stop` (reason `rank_lost: rank 1`) or `error`
//! ```
//!
//! Exit 75 when a committed checkpoint verifies (the rerun resumes from it),
//! 1 when none does, as a hang.

use std::time::{Duration, Instant};

use crate::checkpoint::{CheckpointStore, VerifyLevel};
use crate::config::Config;
use crate::exit::Outcome;
use crate::slurm::{self, RequeueRequest, Scontrol, SlurmEnv, StopKind};
use crate::telemetry::{CrashClass, ErrorEvent, Event, NodesExcluded, RankLost, RequeueRecord, Stop};

use crate::attempt::budget;
use crate::attempt::crash::{self, CrashAction};
use crate::attempt::ending::ask_for_in_job_restart;
use crate::attempt::health::{exclude_blamed, in_job_exclusion, others_left, straggler_blame};
use crate::attempt::rank_watch::Lost;
use crate::health::{AttemptEnd, blame};
use crate::slurm::injob::InJobOffer;

/// The `rank_lost` events of `lost`, as rank `me` of `size` noticed them.
pub fn rank_lost_events(lost: &[Lost], me: usize, size: usize, timeout: Duration) -> Vec<Event> {
    lost.iter()
        .map(|l| {
            Event::RankLost(RankLost {
                rank: l.rank,
                rank_node: l.node.clone(),
                pid: l.pid,
                step: l.step,
                silent_seconds: l.silent.as_secs_f64(),
                timeout_seconds: timeout.as_secs_f64(),
                noticed_by: me,
                world_size: size,
            })
        })
        .collect()
}

/// `rank_lost: rank 1` (or `ranks 0, 2`): the `stop` event's reason.
pub fn lost_reason(lost: &[Lost]) -> String {
    let ranks = lost.iter().map(|l| l.rank.to_string()).collect::<Vec<_>>().join(", ");
    let noun = if lost.len() == 1 { "rank" } else { "ranks" };
    format!("rank_lost: {noun} {ranks}")
}

/// The error message of a loss, for logs and the `error` event.
pub fn lost_message(lost: &[Lost], timeout: Duration) -> String {
    let each = lost
        .iter()
        .map(|l| {
            let node = if l.node.is_empty() { "its node unknown".to_string() } else { format!("on {}", l.node) };
            let step = l.step.map_or("with no step reported".to_string(), |s| format!("after step {s}"));
            format!("rank {} ({node}, pid {}) silent for {:.1}s {step}", l.rank, l.pid, l.silent.as_secs_f64())
        })
        .collect::<Vec<_>>()
        .join("; ");
    format!(
        "{each}: its heartbeat did not change for [distributed] timeout ({:.0}s); the world is ended and the \
         job resumes from the newest committed checkpoint",
        timeout.as_secs_f64()
    )
}

/// The requeue after an attempt that cannot go on (a hang, lost ranks):
/// counted toward `[run] max_crash_requeues` like a transient crash, then
/// the nodes `end` blames left behind (`attempt::health::exclude_blamed`;
/// the `nodes_excluded` record to write, if any). `newest` is the newest
/// checkpoint that verifies; `max_steps` where the run ends (`run`'s `[run]
/// max_steps`; `None` for `exec`, whose program alone knows when it is done:
/// a checkpoint at or past it means training is finished, nothing to
/// requeue).
pub fn requeue_like_a_hang(
    cfg: &Config,
    slurm_env: &SlurmEnv,
    events: &std::path::Path,
    newest: Option<u64>,
    max_steps: Option<u64>,
    cause: &str,
    end: &AttemptEnd,
) -> (RequeueRecord, Option<NodesExcluded>) {
    let finished = newest.zip(max_steps).is_some_and(|(step, max)| step >= max);
    let record = requeue_hang(cfg, slurm_env, events, finished);
    let timeout = || budget::scontrol_timeout(None, Instant::now());
    let blamed = blame(end, &straggler_blame(events));
    let excluded = exclude_blamed(cfg, slurm_env, &Scontrol, cause, &blamed, &record, events, &timeout);
    (record, excluded)
}

fn requeue_hang(cfg: &Config, slurm_env: &SlurmEnv, events: &std::path::Path, finished: bool) -> RequeueRecord {
    let req = RequeueRequest {
        policy: cfg.signals.requeue,
        stop: StopKind::Hang,
        finished,
        job_id: slurm_env.control_id(),
        restart_count: slurm_env.restart_count,
        max_restarts: cfg.signals.max_restarts,
    };
    let in_a_row = crash::crash_requeues_in_a_row(&read_events(events));
    match crash::decide(CrashClass::Transient, in_a_row, cfg.run.max_crash_requeues, false) {
        CrashAction::NoRequeue { reason } if !finished => {
            tracing::error!(%reason, "not requeueing");
            RequeueRecord::skip(reason)
        }
        _ => slurm::requeue_after_stop(&Scontrol, &req, &|| budget::scontrol_timeout(None, Instant::now())),
    }
}

/// What a loss blames: the lost ranks' nodes (`crate::health::blame`).
pub fn lost_end(lost: &[Lost]) -> AttemptEnd {
    AttemptEnd::RanksLost { nodes: lost.iter().map(|l| l.node.clone()).collect() }
}

/// A world that lost ranks asks the batch shell for a new step without
/// their nodes (`attempt::ending::ask_for_in_job_restart`); the requeue
/// record and the `nodes_excluded` one.
pub fn continue_in_job(
    cfg: &Config,
    slurm_env: &SlurmEnv,
    lost: &[Lost],
    newest: Option<u64>,
    events: &std::path::Path,
) -> Option<(RequeueRecord, NodesExcluded)> {
    // The lost nodes are gone whatever `[health] exclude` says; a blamed
    // straggler's node is left out only when it asks for exclusions.
    let stragglers = if cfg.health.exclude { straggler_blame(events) } else { Vec::new() };
    let exclude = blame(&lost_end(lost), &stragglers);
    let reason = lost_reason(lost);
    let record = ask_for_in_job_restart(cfg, slurm_env, &reason, &exclude, &exclude, newest, events)?;
    Some((record, in_job_exclusion(&reason, &exclude, InJobOffer::from_process().as_ref())))
}

/// What a hang of `activity` blames: this node in a step of one node; no
/// node in a step over several (only the leader has a watchdog, and a rank
/// stuck on another node stalls the leader's collective just the same: the
/// leader's own node is no likelier the sick one).
pub fn hang_end(slurm_env: &SlurmEnv, activity: &str) -> AttemptEnd {
    let node = if slurm_env.nodes.unwrap_or(1) > 1 { String::new() } else { slurm_env.node_name() };
    AttemptEnd::Hang { node, activity: activity.into() }
}

/// A hang of `activity` under a batch shell that offers restarts inside
/// the job: a new step instead of a requeue, without the hung node where
/// `[health] exclude` allows and another node is left to run it (a job of
/// one node restarts on it; should the shell requeue instead, the request's
/// plan leaves it behind; a step over several nodes blames none,
/// [`hang_end`]). Gated by `[run] max_crash_requeues` as the requeue it
/// replaces (past it, `None` and the usual refusal); the restarts
/// themselves are bounded by the shell (`REKINDLE_INJOB_MAX`). The
/// requeue record and the `nodes_excluded` one when a node is left out.
pub fn continue_in_job_after_hang(
    cfg: &Config,
    slurm_env: &SlurmEnv,
    activity: &str,
    newest: Option<u64>,
    events: &std::path::Path,
) -> Option<(RequeueRecord, Option<NodesExcluded>)> {
    // Training done (a publish that hangs after the final checkpoint):
    // nothing for a new step to do.
    if newest.is_some_and(|step| step >= cfg.run.max_steps) {
        return None;
    }
    let in_a_row = crash::crash_requeues_in_a_row(&read_events(events));
    if let CrashAction::NoRequeue { .. } =
        crash::decide(CrashClass::Transient, in_a_row, cfg.run.max_crash_requeues, false)
    {
        return None;
    }
    let cause = format!("hang: {activity}");
    let end = hang_end(slurm_env, activity);
    let stragglers = if cfg.health.exclude { straggler_blame(events) } else { Vec::new() };
    let blamed = blame(&end, &stragglers);
    let offer = InJobOffer::from_process();
    let leave_out: &[String] =
        if cfg.health.exclude && others_left(slurm_env, &blamed, offer.as_ref()) { &blamed } else { &[] };
    let record = ask_for_in_job_restart(cfg, slurm_env, &cause, leave_out, &blamed, newest, events)?;
    let excluded = (!leave_out.is_empty()).then(|| in_job_exclusion(&cause, leave_out, offer.as_ref()));
    Some((record, excluded))
}

fn read_events(path: &std::path::Path) -> Vec<Event> {
    // The crash count starts afresh at each checkpoint saved: the events
    // from the newest one on are all it needs (streamed, not the history).
    let saved = |e: &crate::telemetry::RecordedEvent| matches!(e.event, Event::CheckpointSaved(_));
    match crate::telemetry::read_events_since(path, saved) {
        Ok(Some(events)) => events.into_iter().map(|e| e.event).collect(),
        _ => Vec::new(),
    }
}

/// The newest checkpoint of `store` that verifies (quick: sizes and manifest).
pub fn newest_valid(store: &CheckpointStore) -> Option<u64> {
    match store.newest_valid(VerifyLevel::Quick) {
        Ok(newest) => newest.map(|i| i.step),
        Err(e) => {
            tracing::error!(error = %e, "cannot list the checkpoints");
            None
        }
    }
}

/// The records of a loss, written by the recorder ([`recorder`](crate::attempt::rank_watch::recorder))
/// through `record`: `rank_lost` per lost rank (as rank `me` of `size` saw
/// them), the in-job restart without their nodes where the batch shell
/// offers one, else the requeue decision of a hang (`requeue` and
/// `nodes_excluded`), then `stop` (reason `rank_lost: …`) when `newest`, the
/// newest checkpoint that verifies, is some, else `error`. The outcome: 75
/// with a checkpoint to resume from, else 1. `events` is `events.jsonl`
/// (read for the crash history and the stragglers blamed); `max_steps` as
/// for [`requeue_like_a_hang`].
#[allow(clippy::too_many_arguments)]
pub fn record_loss(
    record: &mut dyn FnMut(&Event),
    cfg: &Config,
    slurm_env: &SlurmEnv,
    events: &std::path::Path,
    lost: &[Lost],
    me: usize,
    size: usize,
    newest: Option<u64>,
    max_steps: Option<u64>,
) -> Outcome {
    let timeout = cfg.distributed.timeout;
    for event in rank_lost_events(lost, me, size, timeout) {
        record(&event);
    }
    let (requeue, excluded) = match continue_in_job(cfg, slurm_env, lost, newest, events) {
        Some((record, excluded)) => (record, Some(excluded)),
        None => requeue_like_a_hang(cfg, slurm_env, events, newest, max_steps, &lost_reason(lost), &lost_end(lost)),
    };
    record(&Event::Requeue(requeue.clone()));
    if let Some(excluded) = excluded {
        record(&Event::NodesExcluded(excluded));
    }
    match newest {
        Some(step) => {
            record(&Event::Stop(Stop {
                step: Some(step),
                reason: lost_reason(lost),
                requeue: Some(requeue),
                ..Stop::default()
            }));
            tracing::warn!(step, "exiting 75; the next attempt resumes from the checkpoint of step {step}");
            Outcome::StoppedWithCheckpoint
        }
        None => {
            record(&Event::Error(lost_error(lost, timeout, requeue)));
            tracing::error!("exiting 1: no checkpoint verifies; the next attempt starts from step 0");
            Outcome::Failure
        }
    }
}

/// The records of a hang the program's watchdog found under `exec`
/// (`exec/progress.rs`; `run`'s are `run/hang.rs`'s, which also attempts a
/// checkpoint), after the `hang` event itself: the in-job restart where the
/// batch shell offers one (without this node in a step of one node,
/// [`continue_in_job_after_hang`]), else the requeue decision of a hang
/// (`requeue` and `nodes_excluded`), then `stop` (reason `hang: step`) when
/// `newest`, the newest checkpoint that verifies, is some, else `error`.
/// The outcome: 75 with a checkpoint to resume from, else 1.
pub fn record_hang(
    record: &mut dyn FnMut(&Event),
    cfg: &Config,
    slurm_env: &SlurmEnv,
    events: &std::path::Path,
    hang: &crate::telemetry::HangEvent,
    newest: Option<u64>,
) -> Outcome {
    let cause = format!("hang: {}", hang.activity);
    let (requeue, excluded) = match continue_in_job_after_hang(cfg, slurm_env, &hang.activity, newest, events) {
        Some(done) => done,
        None => {
            let end = hang_end(slurm_env, &hang.activity);
            requeue_like_a_hang(cfg, slurm_env, events, newest, None, &cause, &end)
        }
    };
    record(&Event::Requeue(requeue.clone()));
    if let Some(excluded) = excluded {
        record(&Event::NodesExcluded(excluded));
    }
    match newest {
        Some(step) => {
            record(&Event::Stop(Stop { step: Some(step), reason: cause, requeue: Some(requeue), ..Stop::default() }));
            tracing::warn!(step, "exiting 75; the next attempt resumes from the checkpoint of step {step}");
            Outcome::StoppedWithCheckpoint
        }
        None => {
            let rank = hang.rank.map(|r| format!("rank {r}'s ")).unwrap_or_default();
            record(&Event::Error(ErrorEvent {
                step: Some(hang.step),
                error: format!(
                    "{rank}{} at step {} made no progress for {:.0}s (limit {:.0}s) and no checkpoint verifies",
                    hang.activity, hang.step, hang.stuck_seconds, hang.limit_seconds
                ),
                class: Some(CrashClass::Transient),
                why: Some("a hang (stuck collective, filesystem or data loader)".into()),
                requeue: Some(requeue),
                ..ErrorEvent::default()
            }));
            tracing::error!("exiting 1: no checkpoint verifies; the next attempt starts from step 0");
            Outcome::Failure
        }
    }
}

/// The `error` event of a loss with no checkpoint to resume from.
pub fn lost_error(lost: &[Lost], timeout: Duration, requeue: RequeueRecord) -> ErrorEvent {
    ErrorEvent {
        step: lost.iter().filter_map(|l| l.step).max(),
        error: format!("{}; no checkpoint verifies", lost_message(lost, timeout)),
        class: Some(CrashClass::Transient),
        why: Some("a rank of the world was lost (stopped, dead, or its node gone)".into()),
        requeue: Some(requeue),
        ..ErrorEvent::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lost(rank: usize, node: &str, step: Option<u64>) -> Lost {
        Lost { rank, node: node.into(), pid: 99, step, silent: Duration::from_millis(3400) }
    }

    #[test]
    fn a_hang_blames_its_node_only_in_a_step_of_one_node() {
        let on = |nodes| SlurmEnv { node: Some("n1".into()), nodes, ..SlurmEnv::default() };
        let blamed = |nodes| blame(&hang_end(&on(nodes), "step"), &[]);
        assert_eq!(blamed(Some(1)), ["n1"]);
        assert_eq!(blamed(None), ["n1"], "outside a step: this node alone");
        assert!(blamed(Some(3)).is_empty(), "the leader's node is no likelier the sick one");
    }

    #[test]
    fn one_event_per_lost_rank_names_it_its_node_step_and_silence() {
        let events = rank_lost_events(&[lost(1, "n2", Some(17)), lost(2, "", None)], 0, 3, Duration::from_secs(3));
        let Event::RankLost(e) = &events[0] else { panic!("{events:?}") };
        assert_eq!(
            (e.rank, e.rank_node.as_str(), e.pid, e.step, e.noticed_by, e.world_size),
            (1, "n2", 99, Some(17), 0, 3)
        );
        assert_eq!((e.silent_seconds, e.timeout_seconds), (3.4, 3.0));
        assert_eq!(events.len(), 2);
    }

    #[test]
    fn the_reason_and_message_name_every_lost_rank() {
        assert_eq!(lost_reason(&[lost(1, "n2", Some(3))]), "rank_lost: rank 1");
        assert_eq!(lost_reason(&[lost(0, "a", None), lost(2, "b", None)]), "rank_lost: ranks 0, 2");
        let m = lost_message(&[lost(1, "n2", Some(3)), lost(2, "", None)], Duration::from_secs(3));
        assert!(m.contains("rank 1 (on n2, pid 99) silent for 3.4s after step 3"), "{m}");
        assert!(m.contains("rank 2 (its node unknown, pid 99) silent for 3.4s with no step reported"), "{m}");
        assert!(m.contains("[distributed] timeout (3s)"), "{m}");
    }

    #[test]
    fn a_loss_without_a_checkpoint_is_a_transient_error() {
        let e = lost_error(&[lost(1, "n2", Some(3))], Duration::from_secs(3), RequeueRecord::skip("not under SLURM"));
        assert_eq!((e.class, e.step), (Some(CrashClass::Transient), Some(3)));
        assert!(e.error.ends_with("no checkpoint verifies"), "{}", e.error);
    }
}
