//! The end of an attempt. A finished attempt writes its `final` checkpoint,
//! stops the monitor, writes `summary.json`, publishes and records `finish`.
//! A stopped attempt takes its steps in the order of what matters, and no
//! step can derail the next ([`Attempt::stop`]):
//!
//! ```text
//! stop checkpoint ─ requeue decision (scontrol) ─ summary ─ publish ─ `stop` event
//! ```
//!
//! Each step that fails is logged and recorded, and the next one still runs
//! within the deadline; the exit code says what is on disk: 75 with a stop
//! checkpoint of this attempt, or, when it failed, with an earlier checkpoint
//! that verifies and that the log and the `stop` event name; otherwise 1. A
//! stop that cannot wait for a checkpoint, a stop before training began
//! ([`early_stop`]: 75, 0 when already finished, 1 with no checkpoint yet),
//! and failures end here too.

use std::time::Instant;

use crate::checkpoint::{MANIFEST_FILE, VerifyLevel, verify_checkpoint_dir};
use crate::config::Config;
use crate::exit::Outcome;
use crate::slurm::SlurmEnv;
use crate::telemetry::{
    Event, EventLog, Finish, Nonfinite, PublishOutcome, RequeueRecord, Signal, Stop, Summary, SummaryState, now_rfc3339,
};
use crate::train::{NonFiniteEvent, TrainError};

use crate::attempt::budget;
use crate::attempt::crash::{self};
use crate::attempt::deadline::Deadline;
use crate::attempt::devices;
use crate::attempt::ending::{
    Failure, StopRequeue, instant_to_rfc3339, publish_results, record_failure, record_or_log,
};
use crate::attempt::error::RunError;
use crate::attempt::opening;
use crate::attempt::records::{context, recorded};
use crate::attempt::stop::StopReason;
use crate::attempt::watchdog::{Activity, Worker};
use crate::rundir::{EVENTS_FILE, RunDir, SUMMARY_FILE};

use super::Attempt;

/// How an attempt that did not fail ends.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Ending {
    /// `max_steps` reached: exit 0.
    Finished,
    /// A stop signal or `--stop-at-step`: exit 75.
    Stopped { reason: StopReason, arrival: Instant, deadline: Option<Deadline> },
}

impl Ending {
    /// The kind of the checkpoint written first.
    fn checkpoint_kind(&self) -> &'static str {
        match self {
            Ending::Finished => "final",
            Ending::Stopped { .. } => "stop",
        }
    }

    fn summary_state(&self) -> SummaryState {
        match self {
            Ending::Finished => SummaryState::Finished,
            Ending::Stopped { .. } => SummaryState::Stopped,
        }
    }

    fn outcome(&self) -> Outcome {
        match self {
            Ending::Finished => Outcome::Done,
            Ending::Stopped { .. } => Outcome::StoppedWithCheckpoint,
        }
    }
}

/// What the ending path did, for its event.
#[derive(Debug, Clone, PartialEq)]
struct Wrapped {
    /// The step of the checkpoint just written.
    step: u64,
    seconds_to_durable_checkpoint: Option<f64>,
    seconds_left: Option<f64>,
    signals_received: usize,
    publish: PublishOutcome,
    requeue: Option<RequeueRecord>,
    /// Why the stop checkpoint failed, when `step` names an earlier one.
    checkpoint_error: Option<String>,
    /// Steps after the checkpoint that failed and were passed over.
    failures: Vec<String>,
}

/// The event that closes the attempt: `finish` or `stop`.
fn ending_event(ending: &Ending, done: Wrapped) -> Event {
    match ending {
        Ending::Finished => Event::Finish(Finish { step: done.step, publish: done.publish }),
        Ending::Stopped { reason, .. } => Event::Stop(Stop {
            step: Some(done.step),
            reason: reason.name(),
            seconds_to_durable_checkpoint: done.seconds_to_durable_checkpoint,
            // Written as `null` when there is no deadline (--stop-at-step).
            seconds_left: Some(done.seconds_left),
            signals_received: Some(done.signals_received),
            publish: Some(done.publish),
            requeue: done.requeue,
            checkpoint_error: done.checkpoint_error,
            failures: done.failures,
            ..Stop::default()
        }),
    }
}

impl Attempt {
    /// A stop was requested during training: exits at once keeping the
    /// previous checkpoint (third signal, or the deadline passed before the
    /// checkpoint began, and a previous checkpoint verifies), or takes the
    /// stop path. Nothing fallible runs before the checkpoint: the `signal`
    /// event is a record, written best effort.
    pub(super) fn stop(&mut self, reason: StopReason) -> Result<Outcome, RunError> {
        self.still_owner()?;
        let step = self.trainer.step();
        let arrival = reason.arrival().unwrap_or_else(Instant::now);
        let signals = &self.cfg.signals;
        let deadline = budget::stop_deadline(reason, signals.grace, signals.safety_margin);
        tracing::warn!(reason = %reason.name(), step, "stop requested: writing a checkpoint of the last completed step");
        self.record_or_log(&Event::Signal(Signal {
            signal: reason.name(),
            step: Some(step),
            arrival: Some(instant_to_rfc3339(arrival)),
            deadline_in_seconds: Some(budget::seconds_left(deadline, Instant::now())),
            before_training: false,
        }));
        if budget::exit_now(self.stop.count(), deadline, Instant::now())
            && let Some(kept) = self.earlier_valid_checkpoint()
        {
            tracing::error!(
                step = kept,
                dir = %self.store.step_dir(kept).display(),
                "third signal or deadline passed before the checkpoint began: exiting at once, keeping the earlier checkpoint of step {kept}"
            );
            self.record_or_log(&Event::Stop(Stop {
                step: Some(kept),
                reason: reason.name(),
                fast_exit: true,
                signals_received: Some(self.stop.count()),
                ..Stop::default()
            }));
            self.sync_or_log();
            return Ok(Outcome::StoppedWithCheckpoint);
        }
        self.end(Ending::Stopped { reason, arrival, deadline })
    }

    /// The ending path of a finished or stopped attempt.
    pub(super) fn end(&mut self, ending: Ending) -> Result<Outcome, RunError> {
        match ending {
            Ending::Finished => self.finish(),
            Ending::Stopped { reason, arrival, deadline } => self.stop_in_order(reason, arrival, deadline),
        }
    }

    /// `max_steps` reached: final checkpoint, monitor, summary, publish,
    /// `finish`. Any failure fails the run (exit 1): there is no requeue to
    /// protect and no deadline to keep.
    fn finish(&mut self) -> Result<Outcome, RunError> {
        let ending = Ending::Finished;
        let report = self.checkpoint_now(ending.checkpoint_kind())?;
        devices::stop_monitor(self.monitor.take(), &mut self.events)?;
        self.write_summary(ending.summary_state())?;
        let publish = self.publish("finished", None);
        let done = Wrapped {
            step: report.step,
            seconds_to_durable_checkpoint: None,
            seconds_left: None,
            signals_received: self.stop.count(),
            publish,
            requeue: None,
            checkpoint_error: None,
            failures: Vec::new(),
        };
        self.events.record(&ending_event(&ending, done))?;
        tracing::info!(step = report.step, "training finished");
        Ok(ending.outcome())
    }

    /// The stop path, in the order of what matters; see the module header.
    ///
    /// 1. The checkpoint: what the next attempt resumes from.
    /// 2. The requeue decision: what brings the job back. It runs whether the
    ///    checkpoint succeeded or not (without one the next attempt resumes
    ///    from an earlier checkpoint, or starts over: still better than a job
    ///    that ends FAILED), and before publishing, so a slow or broken remote
    ///    can never keep a preempted job from coming back.
    /// 3. `summary.json`, before publishing because publishing copies it.
    /// 4. Publishing. Once SLURM has accepted our requeue it ends the job:
    ///    SIGTERM now, SIGKILL `KillWait` later. So publishing then gets at
    ///    most [`budget::PUBLISH_AFTER_REQUEUE`], and signals arriving after
    ///    the requeue are SLURM's own kill of a job we asked it to end: they
    ///    do not count toward the third-signal fast exit (a forwarded SIGTERM
    ///    and one sent to the step directly would otherwise make three and
    ///    skip publishing every time).
    /// 5. The `stop` event and the sync of `events.jsonl`.
    fn stop_in_order(
        &mut self,
        reason: StopReason,
        arrival: Instant,
        deadline: Option<Deadline>,
    ) -> Result<Outcome, RunError> {
        let ending = Ending::Stopped { reason, arrival, deadline };
        let mut failures = Vec::new();
        // 1. The checkpoint (its failure is recorded as `checkpoint_failed`).
        let saved = self.checkpoint_now(ending.checkpoint_kind());
        // The run directory is another process's now: no requeue (that
        // process runs the job's work), no summary, publish or records.
        if let Err(RunError::LockLost { .. }) = saved {
            return saved.map(|_| ending.outcome());
        }
        self.still_owner()?;
        let to_durable = saved.is_ok().then(|| arrival.elapsed().as_secs_f64());
        if self.stop.count() >= 2 {
            tracing::warn!(signals = self.stop.count(), "more stop signals arrived during the checkpoint");
        }
        let kept = match &saved {
            Ok(report) => Some(report.step),
            Err(e) => {
                tracing::error!(error = %e, "the stop checkpoint failed; going on with the requeue decision");
                self.earlier_valid_checkpoint()
            }
        };
        // 2. The requeue decision, unless it is time to exit at once.
        let finished = self.trainer.step() >= self.cfg.run.max_steps;
        let requeued =
            StopRequeue::decide(&self.cfg, &self.slurm, reason, finished, deadline, &self.stop, &mut self.events);
        // 3. The monitor and the summary that publishing carries.
        if let Err(e) = devices::stop_monitor(self.monitor.take(), &mut self.events) {
            failures.push(self.failed_step("monitor", &e));
        }
        let state = if kept.is_some() { ending.summary_state() } else { SummaryState::Failed };
        if let Err(e) = self.write_summary(state) {
            failures.push(self.failed_step("summary", &e));
        }
        // 4. Publishing, unless cut short.
        let publish = match requeued.publish_deadline(&self.stop, deadline) {
            None => PublishOutcome::Skipped { skipped: "fast exit".into() },
            Some(until) => self.publish(&reason.name(), until),
        };
        let requeue = requeued.record;
        // 5. The records.
        let Some(step) = kept else {
            let (step, error) = (self.trainer.step(), saved.err().map(|e| e.to_string()).unwrap_or_default());
            return Err(RunError::StopWithoutCheckpoint { reason: reason.name(), step, error });
        };
        let checkpoint_error = saved.as_ref().err().map(|e| e.to_string());
        let done = Wrapped {
            step,
            seconds_to_durable_checkpoint: to_durable,
            seconds_left: budget::seconds_left(deadline, Instant::now()),
            signals_received: self.stop.count(),
            publish,
            requeue: Some(requeue),
            checkpoint_error: checkpoint_error.clone(),
            failures,
        };
        self.record_or_log(&ending_event(&ending, done));
        self.sync_or_log();
        match checkpoint_error {
            None => tracing::info!(
                step,
                seconds_to_durable_checkpoint = format!("{:.3}", to_durable.unwrap_or_default()),
                "stopped with a durable checkpoint; run the same command again to continue"
            ),
            Some(error) => tracing::warn!(
                step,
                dir = %self.store.step_dir(step).display(),
                %error,
                "the stop checkpoint failed: keeping the earlier checkpoint of step {step}, which verifies; \
                 run the same command again to continue from it"
            ),
        }
        Ok(ending.outcome())
    }

    /// The newest checkpoint known durable in this attempt (resumed from or
    /// saved), if it still passes the quick check (every file present with
    /// its size: cheap inside a deadline, and it catches a checkpoint that a
    /// failed save of the same step replaced in part).
    fn earlier_valid_checkpoint(&self) -> Option<u64> {
        let step = self.last_durable_step?;
        let failures = verify_checkpoint_dir(&self.store.step_dir(step), VerifyLevel::Quick);
        if failures.is_empty() {
            return Some(step);
        }
        tracing::error!(step, failures = ?failures, "the earlier checkpoint no longer verifies");
        None
    }

    /// Logs a step of the stop path that failed; returns its record (`what: error`).
    fn failed_step(&self, what: &str, error: &RunError) -> String {
        tracing::error!(error = %error, "stop: {what} failed; going on");
        format!("{what}: {error}")
    }

    /// Records an event on the stop path: a failure is logged, never returned.
    fn record_or_log(&mut self, event: &Event) {
        record_or_log(&mut self.events, event);
    }

    fn sync_or_log(&mut self) {
        if let Err(e) = self.events.sync() {
            tracing::error!(error = %e, "could not sync events.jsonl");
        }
    }

    /// Records a failure (best effort: the error itself is what the caller
    /// must see) after classifying it (`crash.rs`): a transient one requeues
    /// the job (the usual requeue rules, at most `[run] max_crash_requeues`
    /// in a row without a new checkpoint, each held back longer), a
    /// deterministic one never does. Then the `error` event, with the class
    /// and what was done, and a failed summary. The exit code stays 1.
    pub(super) fn fail(&mut self, error: &RunError) {
        let steps = self.trainer.step() - self.start_step;
        let (class, why) = crash::classify(error, steps);
        let stop_path =
            matches!(error, RunError::StopWithoutCheckpoint { .. } | RunError::StoppedBeforeFirstCheckpoint { .. });
        tracing::error!(class = ?class, %why, "the run failed; classified before exiting 1");
        let failure = Failure { error, class, why, step: Some(self.trainer.step()), stop_path };
        record_failure(&self.cfg, &self.slurm, failure, &mut self.events, &self.dir.path(EVENTS_FILE));
        let _ = self.write_summary(SummaryState::Failed);
        let _ = self.events.sync();
    }

    /// A non-finite step under `on_nonfinite = "stop"`: checkpoint, then fail.
    pub(super) fn nonfinite_stop(&mut self, ev: NonFiniteEvent) -> Result<Outcome, RunError> {
        self.events.record(&Event::Nonfinite(Nonfinite {
            step: ev.step,
            loss: finite(ev.loss),
            grad_norm: finite(ev.grad_norm),
            action: "stop".into(),
            restored_step: None,
            skipped_batches: None,
        }))?;
        self.checkpoint_now("stop")?;
        Err(RunError::NonFinite { step: ev.step, loss: ev.loss, grad_norm: ev.grad_norm })
    }

    /// The out-of-memory back-off gave up: checkpoint the last completed
    /// step and fail (exit 1: running again unchanged would fail again).
    pub(super) fn out_of_memory_stop(&mut self, error: TrainError) -> Result<Outcome, RunError> {
        let report = self.checkpoint_now("stop")?;
        Err(RunError::OutOfMemory { step: report.step, checkpoint: report.dir, source: error })
    }

    /// Publishes results when `[publish] enabled`; failures are logged, never fatal.
    fn publish(&mut self, reason: &str, deadline: Option<Deadline>) -> PublishOutcome {
        let newest_manifest = self.last_durable_step.map(|s| self.store.step_dir(s).join(MANIFEST_FILE));
        let busy = self.beats.begin(Worker::Training, Activity::Publish, self.trainer.step());
        let outcome = publish_results(
            &self.cfg,
            &self.dir.root,
            newest_manifest,
            self.trainer.step(),
            &self.slurm,
            reason,
            deadline,
            &mut self.events,
        );
        drop(busy);
        outcome
    }

    fn write_summary(&mut self, state: SummaryState) -> Result<(), RunError> {
        let summary = Summary {
            state,
            run: self.cfg.run.name.clone(),
            steps: self.trainer.step(),
            max_steps: Some(self.cfg.run.max_steps),
            final_loss: self.last_loss,
            best_loss: self.best_loss,
            wall_seconds_this_attempt: self.started.elapsed().as_secs_f64(),
            steps_this_attempt: self.trainer.step() - self.start_step,
            resumes: self.resumes,
            checkpoints_written_this_attempt: self.checkpoints_written,
            last_checkpoint_step: self.last_durable_step,
            updated_at: now_rfc3339(),
            world_size: self.rank_nodes.as_ref().map(Vec::len),
            rank_nodes: self.rank_nodes.clone(),
        };
        let path = self.dir.path(SUMMARY_FILE);
        crate::rundir::write_atomically(&path, &summary.to_bytes()).map_err(|source| RunError::RunDir { path, source })
    }
}

/// Records the end of an attempt whose start failed (building, placing or
/// restoring the model, opening the records): classified like any failure
/// (`crash.rs`), requeued when transient, and recorded as `error`, after a
/// `start` event (placement `null`) when this process had not recorded one
/// yet, so that `status` and `report` name the failure instead of an
/// attempt killed without warning. Nothing is recorded for a config error
/// (exit 78: nothing was started), nor when the attempt already recorded
/// its end (a stop before training began, a `[gpu] require` refusal).
/// Best effort: the error itself is what the caller returns.
pub(crate) fn record_failed_start(cfg: &Config, dir: &RunDir, slurm: &SlurmEnv, error: &RunError) {
    if error.outcome() == Outcome::ConfigError || matches!(error, RunError::LockLost { .. }) {
        return;
    }
    let path = dir.path(EVENTS_FILE);
    let past = recorded(&path);
    let pid = std::process::id();
    let ours = past.iter().rposition(|e| matches!(&e.event, Event::Start(s) if s.pid == pid));
    let ended = |e: &Event| matches!(e, Event::Error(_) | Event::Stop(_) | Event::Finish(_));
    if ours.is_some_and(|i| past[i + 1..].iter().any(|e| ended(&e.event))) {
        return;
    }
    let mut events = match EventLog::open(&path, context(slurm)) {
        Ok(events) => events,
        Err(e) => {
            tracing::error!(error = %e, "cannot record the failed start in events.jsonl");
            return;
        }
    };
    if ours.is_none() {
        let start = opening::start_record(cfg, dir, slurm, Some(cfg.run.max_steps), serde_json::Value::Null);
        record_or_log(&mut events, &Event::Start(start));
    }
    let (class, why) = crash::classify(error, 0);
    tracing::error!(class = ?class, %why, "the attempt failed before training began; classified before exiting 1");
    record_failure(cfg, slurm, Failure { error, class, why, step: None, stop_path: false }, &mut events, &path);
    if let Err(e) = events.sync() {
        tracing::error!(error = %e, "could not sync events.jsonl");
    }
}

/// A number as the records write it: `None` (`null`) when not finite.
pub(super) fn finite(x: f64) -> Option<f64> {
    x.is_finite().then_some(x)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attempt::stop::{SignalStop, StopSignal};
    use serde_json::{Value, json};

    fn wrapped() -> Wrapped {
        Wrapped {
            step: 61,
            seconds_to_durable_checkpoint: Some(0.5),
            seconds_left: Some(20.0),
            signals_received: 1,
            publish: PublishOutcome::Skipped { skipped: "publishing disabled".into() },
            requeue: Some(RequeueRecord::skip("not running under SLURM")),
            checkpoint_error: None,
            failures: Vec::new(),
        }
    }

    fn fields(event: &Event) -> Value {
        serde_json::to_value(event).unwrap()
    }

    #[test]
    fn finished_and_stopped_differ_only_in_their_data() {
        let stopped = Ending::Stopped {
            reason: StopReason::Signal(SignalStop { signal: StopSignal::Term, arrival: Instant::now(), sender: None }),
            arrival: Instant::now(),
            deadline: None,
        };
        assert_eq!(
            (Ending::Finished.checkpoint_kind(), Ending::Finished.summary_state(), Ending::Finished.outcome()),
            ("final", SummaryState::Finished, Outcome::Done)
        );
        assert_eq!(
            (stopped.checkpoint_kind(), stopped.summary_state(), stopped.outcome()),
            ("stop", SummaryState::Stopped, Outcome::StoppedWithCheckpoint)
        );
    }

    #[test]
    fn a_finished_attempt_records_its_step_and_publish_only() {
        let v = fields(&ending_event(&Ending::Finished, wrapped()));
        assert_eq!(v, json!({"event": "finish", "step": 61, "publish": {"skipped": "publishing disabled"}}));
    }

    #[test]
    fn a_stopped_attempt_records_timings_signals_publish_and_requeue() {
        let t0 = Instant::now();
        let deadline = Some(Deadline { at: t0 + std::time::Duration::from_secs(30) });
        let ending = Ending::Stopped {
            reason: StopReason::Signal(SignalStop { signal: StopSignal::Term, arrival: t0, sender: None }),
            arrival: t0,
            deadline,
        };
        let v = fields(&ending_event(&ending, wrapped()));
        assert_eq!(
            v,
            json!({"event": "stop", "step": 61, "reason": "SIGTERM", "seconds_to_durable_checkpoint": 0.5,
                   "seconds_left": 20.0, "signals_received": 1, "publish": {"skipped": "publishing disabled"},
                   "requeue": {"decision": "skip", "reason": "not running under SLURM"}})
        );
        // --stop-at-step has no deadline: seconds_left is written, as null.
        let at_step = Ending::Stopped { reason: StopReason::StopAtStep, arrival: t0, deadline: None };
        let v = fields(&ending_event(&at_step, Wrapped { seconds_left: None, ..wrapped() }));
        assert_eq!((&v["reason"], &v["seconds_left"]), (&json!("stop_at_step"), &Value::Null));
        assert!(v.get("fast_exit").is_none() && v.get("before_training").is_none());
    }

    #[test]
    fn non_finite_numbers_are_recorded_as_null() {
        assert_eq!(finite(1.5), Some(1.5));
        assert_eq!(finite(f64::NAN), None);
        assert_eq!(finite(f64::INFINITY), None);
    }
}
