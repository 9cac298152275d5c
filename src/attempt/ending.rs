//! The steps of an attempt's end that both drivers take (`run`'s
//! [`crate::run`] and `exec`'s [`crate::exec`]): the requeue decision of a
//! stop ([`StopRequeue`]), a stop before training began ([`early_stop`]),
//! publishing ([`publish_results`]) and the requeue after a failure
//! ([`requeue_after_failure`]). Records on these paths are best effort
//! ([`record_or_log`]): nothing may keep the requeue from running.

use std::time::Instant;

use crate::config::Config;
use crate::exit::Outcome;
use crate::publish::{self, PublishRequest};
use crate::slurm::injob::{InJobOffer, RestartRequest};
use crate::slurm::{self, RequeueRequest, Scontrol, SlurmEnv, StopKind};
use crate::telemetry::{CrashClass, ErrorEvent, Event, EventLog, Finish, PublishOutcome, RequeueRecord, Signal, Stop};

use super::budget;
use super::crash::{self, CrashAction};
use super::deadline::Deadline;
use super::error::RunError;
use super::health::{exclude_blamed, in_job_exclusion, others_left, requeue_exclusion_for_request, straggler_blame};
use super::records::recorded_events;
use super::stop::{StopFlag, StopIntent, StopReason};
use crate::health::{AttemptEnd, blame};

/// Step 2 of a stop path (`run`'s `Attempt::stop_in_order`, and `rekindle
/// exec`'s): the requeue decision, skipped when it is time to exit at once
/// (a third signal, or the deadline passed), and what publishing (step 4)
/// may then do.
pub(crate) struct StopRequeue {
    pub record: RequeueRecord,
    fast_exit: bool,
    /// Stop signals before the requeue: SLURM's SIGTERM for our own requeue
    /// may arrive before `scontrol requeue` has even returned.
    signals_before: usize,
    /// When SLURM accepted the requeue.
    requeued_at: Option<Instant>,
}

impl StopRequeue {
    /// Decides (and records) the requeue of a stop by `reason`.
    pub(crate) fn decide(
        cfg: &Config,
        alloc: &SlurmEnv,
        reason: StopReason,
        finished: bool,
        deadline: Option<Deadline>,
        stop: &StopFlag,
        events: &mut EventLog,
    ) -> StopRequeue {
        let signals_before = stop.count();
        let fast_exit = budget::exit_now(signals_before, deadline, Instant::now());
        let record = if fast_exit {
            tracing::warn!("skipping requeue and publish: third signal or deadline passed");
            RequeueRecord::skip("fast exit")
        } else {
            let requeue_deadline = budget::requeue_deadline(deadline, Instant::now());
            requeue_and_record(cfg, alloc, reason, finished, requeue_deadline, events)
        };
        let requeued_at = record.answer.is_some().then(Instant::now);
        StopRequeue { record, fast_exit, signals_before, requeued_at }
    }

    /// `None` when publishing is cut short: a fast exit, or a third signal
    /// or a passed deadline since, unless SLURM is already ending the job
    /// for our requeue (its signals are expected; its kill bounds the time).
    /// Otherwise the deadline publishing gets.
    pub(crate) fn publish_deadline(&self, stop: &StopFlag, deadline: Option<Deadline>) -> Option<Option<Deadline>> {
        let cut_short = self.fast_exit
            || budget::skip_publish(
                self.signals_before,
                stop.count(),
                self.requeued_at.is_some(),
                deadline,
                Instant::now(),
            );
        (!cut_short).then(|| budget::publish_deadline(deadline, self.requeued_at))
    }
}

/// A stop signal before training began: nothing new to save, but the job is
/// still requeued when it should be. A job preempted (or warned of its time
/// limit) while it loads exits inside its GraceTime, and SLURM does not
/// requeue a job that exits by itself: without this it would end FAILED.
///
/// The exit code says what is on disk ([`early_stop_outcome`]): 75 with an
/// earlier checkpoint to resume from; 0 when that checkpoint is of
/// `max_steps` (the run is finished: a `finish` event, no requeue); and with
/// no checkpoint at all, [`RunError::StoppedBeforeFirstCheckpoint`] (exit 1,
/// after the same requeue decision), since 75 promises a durable checkpoint.
///
/// `max_steps`: the step at which the run is finished (`[run] max_steps`;
/// `u64::MAX` under `rekindle exec`, where only the program knows).
pub(super) fn early_stop(
    stop: &StopFlag,
    events: &mut EventLog,
    durable: Option<u64>,
    max_steps: u64,
    cfg: &Config,
    alloc: &SlurmEnv,
) -> Result<Option<Outcome>, RunError> {
    let Some(signal) = stop.signal() else { return Ok(None) };
    let reason = StopReason::Signal(signal);
    let ending = early_stop_outcome(durable, max_steps);
    match ending {
        EarlyStop::Finished => tracing::warn!(
            reason = %reason.name(),
            step = durable,
            "stop signal before training began, and the run is already finished: exiting 0"
        ),
        EarlyStop::Resumable => tracing::warn!(
            reason = %reason.name(),
            step = durable,
            "stop signal before training began: exiting; earlier checkpoints are intact"
        ),
        EarlyStop::NoCheckpoint => tracing::warn!(
            reason = %reason.name(),
            "stop signal before training began and before any checkpoint: there is no checkpoint yet, \
             the next attempt starts at step 0"
        ),
    }
    // Records, best effort: nothing may keep the requeue from running.
    record_or_log(
        events,
        &Event::Signal(Signal { signal: reason.name(), step: durable, before_training: true, ..Signal::default() }),
    );
    let deadline = Deadline::after_signal(signal.arrival, cfg.signals.grace, cfg.signals.safety_margin);
    let closing = match (ending, durable) {
        // A finished run has nothing to come back for: no requeue decision.
        (EarlyStop::Finished, Some(step)) => Event::Finish(Finish {
            step,
            publish: PublishOutcome::Skipped { skipped: "stop signal before training began".into() },
        }),
        _ => {
            let requeue = if budget::exit_now(stop.count(), Some(deadline), Instant::now()) {
                RequeueRecord::skip("fast exit")
            } else {
                requeue_and_record(cfg, alloc, reason, false, Some(deadline), events)
            };
            Event::Stop(Stop {
                step: durable,
                reason: reason.name(),
                before_training: true,
                requeue: Some(requeue),
                ..Stop::default()
            })
        }
    };
    record_or_log(events, &closing);
    if let Err(e) = events.sync() {
        tracing::error!(error = %e, "could not sync events.jsonl");
    }
    match ending {
        EarlyStop::Finished => Ok(Some(Outcome::Done)),
        EarlyStop::Resumable => Ok(Some(Outcome::StoppedWithCheckpoint)),
        EarlyStop::NoCheckpoint => Err(RunError::StoppedBeforeFirstCheckpoint { reason: reason.name() }),
    }
}

/// What a stop before training began leaves behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EarlyStop {
    /// The newest checkpoint is of `max_steps`: nothing left to train (exit 0).
    Finished,
    /// An earlier checkpoint to resume from (exit 75).
    Resumable,
    /// No checkpoint yet: nothing to resume from (exit 1).
    NoCheckpoint,
}

/// Decides [`EarlyStop`] from the newest durable checkpoint's step.
fn early_stop_outcome(durable: Option<u64>, max_steps: u64) -> EarlyStop {
    match durable {
        Some(step) if step >= max_steps => EarlyStop::Finished,
        Some(_) => EarlyStop::Resumable,
        None => EarlyStop::NoCheckpoint,
    }
}

/// Records an event on a stop path: a failure is logged, never returned.
pub(crate) fn record_or_log(events: &mut EventLog, event: &Event) {
    if let Err(e) = events.record(event) {
        tracing::error!(error = %e, event = event.name(), "could not record an event; going on");
    }
}

/// The requeue step through the real `scontrol`, each call bounded by what
/// `deadline` leaves; records the `requeue` event (best effort) and returns it.
pub(crate) fn requeue_and_record(
    cfg: &Config,
    alloc: &SlurmEnv,
    reason: StopReason,
    finished: bool,
    deadline: Option<Deadline>,
    events: &mut EventLog,
) -> RequeueRecord {
    let req = RequeueRequest {
        policy: cfg.signals.requeue,
        stop: stop_kind(reason),
        finished,
        job_id: alloc.control_id(),
        restart_count: alloc.restart_count,
        max_restarts: cfg.signals.max_restarts,
    };
    let timeout = || budget::scontrol_timeout(deadline, Instant::now());
    let record = slurm::requeue_after_stop(&Scontrol, &req, &timeout);
    // A record: failing to write it must not undo a requeue SLURM accepted.
    if let Err(e) = events.record(&Event::Requeue(record.clone())) {
        tracing::error!(error = %e, "could not record the requeue event");
    }
    // A stop blames no node by itself (preemption, scancel, the time limit);
    // a blamed straggler's node comes in as `blame`'s extra ones.
    let path = events.path().to_path_buf();
    let blamed = blame(&AttemptEnd::Stopped, &straggler_blame(&path));
    if let Some(excluded) =
        exclude_blamed(cfg, alloc, &Scontrol, reason.name().as_str(), &blamed, &record, &path, &timeout)
    {
        record_or_log(events, &Event::NodesExcluded(excluded));
    }
    record
}

/// Publishes the run directory when `[publish] enabled` and records the
/// `publish` event (best effort); failures are logged, never fatal.
/// `newest_manifest`: the manifest of the newest durable checkpoint, which
/// the commit names.
#[allow(clippy::too_many_arguments)]
pub(crate) fn publish_results(
    cfg: &Config,
    run_dir: &std::path::Path,
    newest_manifest: Option<std::path::PathBuf>,
    step: u64,
    alloc: &SlurmEnv,
    reason: &str,
    deadline: Option<Deadline>,
    events: &mut EventLog,
) -> PublishOutcome {
    if !cfg.publish.enabled {
        return PublishOutcome::Skipped { skipped: "publishing disabled".into() };
    }
    let req = PublishRequest {
        cfg: &cfg.publish,
        run_name: &cfg.run.name,
        run_dir,
        newest_manifest,
        checkpoint_dir: cfg.checkpoint.dir.clone(),
        step,
        job_id: alloc.job_id.clone(),
        node: alloc.node_name(),
        reason: reason.to_string(),
        deadline: deadline.map(|d| d.at),
    };
    // Tests make publishing hang here (`run::publish=sleep(…)`).
    fail::fail_point!("run::publish");
    let outcome = match publish::publish(&req) {
        Ok(report) => PublishOutcome::Done {
            commit: report.commit,
            pushed: report.pushed,
            attempts: report.attempts,
            files: report.files,
            refused: report.refused,
            last_error: report.last_error,
            worktree: report.worktree,
        },
        Err(e) => {
            tracing::error!(error = %e, "publishing failed");
            PublishOutcome::Failed { error: e.to_string() }
        }
    };
    let _ = events.record(&Event::Publish(outcome.clone()));
    outcome
}

/// A failure as its `error` event records it.
pub(crate) struct Failure<'a> {
    pub error: &'a RunError,
    pub class: CrashClass,
    /// Why it was classified so.
    pub why: String,
    /// The step it happened at (of the newest checkpoint, for `exec`), if any.
    pub step: Option<u64>,
    /// Its stop path already made the requeue decision.
    pub stop_path: bool,
}

/// The requeue decision after `failure` ([`requeue_after_failure`]) and the
/// `error` event that records it with its class and what was done (best
/// effort: the error itself is what the caller returns).
pub(crate) fn record_failure(
    cfg: &Config,
    alloc: &SlurmEnv,
    failure: Failure<'_>,
    events: &mut EventLog,
    events_path: &std::path::Path,
) {
    let end = AttemptEnd::TransientCrash {
        node: alloc.node_name(),
        device: crash::is_device_error(failure.error, failure.class),
    };
    let blamed = blame(&end, &straggler_blame(events_path));
    let (requeue, hold_seconds, hold_error) =
        requeue_after_failure(cfg, alloc, failure.class, failure.stop_path, &blamed, events, events_path);
    record_or_log(
        events,
        &Event::Error(ErrorEvent {
            step: failure.step,
            error: failure.error.to_string(),
            class: Some(failure.class),
            why: Some(failure.why),
            requeue: Some(requeue),
            hold_seconds,
            hold_error,
        }),
    );
}

/// The requeue decision after a failure of `class` (`crash.rs`): a
/// transient one requeues the job (the usual requeue rules, at most `[run]
/// max_crash_requeues` in a row without a new checkpoint, counted from
/// `events_path`, each held back longer), a deterministic one never does,
/// nor one whose stop path already decided (`stop_path`). Records the
/// `requeue` event when there was one; returns it with the hold.
/// `blamed`: the nodes the crash blames (a device error: this node), left
/// out of the next step or the requeued job.
fn requeue_after_failure(
    cfg: &Config,
    alloc: &SlurmEnv,
    class: CrashClass,
    stop_path: bool,
    blamed: &[String],
    events: &mut EventLog,
    events_path: &std::path::Path,
) -> (RequeueRecord, Option<u64>, Option<String>) {
    let in_a_row = crash::crash_requeues_in_a_row(&recorded_events(events_path));
    // A device error's node is left out of the next in-job step where
    // `[health] exclude` allows and another node is left to run it (a lost
    // node is gone anyway; this one is not). A job of one node restarts on
    // it: the requeue, not the in-job path, is what leaves a node behind.
    let offer = InJobOffer::from_process();
    let leave_out: &[String] =
        if cfg.health.exclude && others_left(alloc, blamed, offer.as_ref()) { blamed } else { &[] };
    match crash::decide(class, in_a_row, cfg.run.max_crash_requeues, stop_path) {
        CrashAction::Requeue { .. }
            if let Some(in_job) =
                ask_for_in_job_restart(cfg, alloc, CRASH_CAUSE, leave_out, blamed, None, events_path) =>
        {
            if !leave_out.is_empty() {
                record_or_log(events, &Event::NodesExcluded(in_job_exclusion(CRASH_CAUSE, leave_out, offer.as_ref())));
            }
            (in_job, None, None)
        }
        CrashAction::Requeue { hold } => {
            let req = RequeueRequest {
                policy: cfg.signals.requeue,
                stop: StopKind::TransientCrash,
                finished: false,
                job_id: alloc.control_id(),
                restart_count: alloc.restart_count,
                max_restarts: cfg.signals.max_restarts,
            };
            let timeout = || budget::scontrol_timeout(None, Instant::now());
            let out = slurm::requeue_after_crash(&Scontrol, &req, hold, &timeout);
            record_or_log(events, &Event::Requeue(out.record.clone()));
            let excluded =
                exclude_blamed(cfg, alloc, &Scontrol, CRASH_CAUSE, blamed, &out.record, events_path, &timeout);
            if let Some(excluded) = excluded {
                record_or_log(events, &Event::NodesExcluded(excluded));
            }
            (out.record, out.hold_seconds, out.hold_error)
        }
        CrashAction::NoRequeue { reason } => {
            tracing::error!(%reason, "not requeueing after this failure");
            (RequeueRecord::skip(reason), None, None)
        }
    }
}

/// The cause a crash's exclusion records.
const CRASH_CAUSE: &str = "crash: transient";

/// With `[recovery] in_job` and a batch shell that offers restarts inside
/// the job (`slurm::injob`): asks it for a new step without the nodes in
/// `exclude`, instead of requeueing the job; the `requeue` record that says
/// so. `None` (requeue as before) without an offer, once the shell's bound
/// is spent, or when the request cannot be written.
/// `blamed`: the nodes the end blames, which the request's plan for a
/// requeue by the shell leaves behind (`exclude` may name fewer: a job of
/// one node restarts in the job on it, but its requeue must not).
/// `events`: the run's records (what was excluded before counts toward
/// the bound of the exclusion the request carries for a requeue).
pub(crate) fn ask_for_in_job_restart(
    cfg: &Config,
    alloc: &SlurmEnv,
    reason: &str,
    exclude: &[String],
    blamed: &[String],
    step: Option<u64>,
    events: &std::path::Path,
) -> Option<RequeueRecord> {
    if !cfg.recovery.in_job {
        return None;
    }
    let offer = InJobOffer::from_process()?;
    if let Some(why) = offer.refusal() {
        tracing::warn!(%why, "not restarting in the job; requeueing");
        return None;
    }
    let rank = std::env::var("SLURM_PROCID").unwrap_or_else(|_| "0".into());
    let request = RestartRequest {
        reason: reason.to_string(),
        exclude: exclude.to_vec(),
        step,
        requeue_exclude: requeue_exclusion_for_request(cfg, alloc, &Scontrol, blamed, events),
        written_by: format!("{rank}@{}", alloc.node_name()),
    };
    match request.write(&offer.file) {
        Ok(()) => {
            let without = if exclude.is_empty() {
                "no node excluded".to_string()
            } else {
                format!("without {}", exclude.join(", "))
            };
            let reason = format!(
                "continuing in the job: in-job restart {} of {} ({without}); the batch shell launches the next step",
                offer.restarts + 1,
                offer.max
            );
            tracing::warn!("{reason}");
            Some(RequeueRecord::skip(reason))
        }
        Err(e) => {
            tracing::error!(file = %offer.file.display(), error = %e, "cannot ask the batch shell for an in-job restart; requeueing");
            None
        }
    }
}

/// Why training stopped, as the requeue decision sees it.
pub(crate) fn stop_kind(reason: StopReason) -> StopKind {
    match reason {
        StopReason::Signal(s) => match s.intent() {
            StopIntent::Interrupt => StopKind::Interrupt,
            StopIntent::Cluster => StopKind::ClusterSignal,
        },
        StopReason::StopAtStep => StopKind::StopAtStep,
    }
}

pub(crate) fn instant_to_rfc3339(t: Instant) -> String {
    let ago = chrono::Duration::from_std(t.elapsed()).unwrap_or_default();
    (chrono::Utc::now() - ago).to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attempt::stop::{SignalStop, StopSignal};

    #[test]
    fn sigint_is_an_interrupt_other_signals_come_from_the_cluster() {
        let kind = |signal| stop_kind(StopReason::Signal(SignalStop { signal, arrival: Instant::now(), sender: None }));
        assert_eq!(kind(StopSignal::Int), StopKind::Interrupt);
        for signal in [StopSignal::Term, StopSignal::Usr1, StopSignal::Usr2] {
            assert_eq!(kind(signal), StopKind::ClusterSignal, "{signal}");
        }
        assert_eq!(stop_kind(StopReason::StopAtStep), StopKind::StopAtStep);
    }

    #[test]
    fn a_stop_before_training_exits_by_what_is_on_disk() {
        assert_eq!(early_stop_outcome(None, 100), EarlyStop::NoCheckpoint);
        assert_eq!(early_stop_outcome(Some(0), 100), EarlyStop::Resumable);
        assert_eq!(early_stop_outcome(Some(99), 100), EarlyStop::Resumable);
        assert_eq!(early_stop_outcome(Some(100), 100), EarlyStop::Finished);
        assert_eq!(early_stop_outcome(Some(150), 100), EarlyStop::Finished);
    }
}
