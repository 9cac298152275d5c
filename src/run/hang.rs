//! The end of an attempt that hangs: what the watchdog (`watchdog.rs`) does
//! once a step, an evaluation, a save or a publish has run past its limit.
//! It runs on the watchdog's thread, never on the stuck one, and ends the
//! process itself: a stuck thread cannot be joined or unwound.
//!
//! ```text
//! `hang` event ─ checkpoint of the last completed step (only when the stuck
//! thread is the persister: the training thread writes it, asked through the
//! [`HangDesk`]) ─ requeue decision (scontrol) ─ `stop` (or `error`) event ─
//! summary.json ─ release the lock ─ exit 75 (a checkpoint verifies) or 1 (none)
//! ```
//!
//! Through the [`HangDesk`] the training thread also learns that the attempt
//! is ending (at its next micro-batch boundary) and stops there, so a step
//! that was only slow cannot race the watchdog's records and exit.
//!
//! Time: the checkpoint attempt may use the same budget as a stop signal's
//! (`[signals] grace` less `safety_margin`, from the moment the hang is
//! seen): it writes to the filesystem that may be the stuck one. Each
//! `scontrol` call then gets its usual timeout. If the records themselves
//! hang (a dead NFS server holds `events.jsonl` too), the watchdog exits
//! anyway once that budget and the `scontrol` timeouts have passed, with the
//! code known from memory.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::checkpoint::{CheckpointStore, VerifyLevel, verify_checkpoint_dir};
use crate::config::Config;
use crate::distributed::abort_world;
use crate::exit::Outcome;
use crate::slurm::SlurmEnv;
use crate::telemetry::{
    CrashClass, ErrorEvent, Event, EventLog, HangEvent, RequeueRecord, Stop, Summary, SummaryState, now_rfc3339,
};

use crate::attempt::budget::SCONTROL_TIMEOUT;
use crate::attempt::deadline::Deadline;
use crate::attempt::error::RunError;
use crate::attempt::lost::{
    continue_in_job, continue_in_job_after_hang, hang_end, lost_end, lost_error, lost_message, lost_reason,
    rank_lost_events, requeue_like_a_hang,
};
use crate::attempt::rank_watch::Lost;
use crate::attempt::records::context;
use crate::attempt::watchdog::{Beats, Hang, Worker};
use crate::confine::write_atomically;
use crate::rundir::EVENTS_FILE;
use crate::rundir::lock::LockRelease;

use super::Attempt;

/// How the watchdog tells the training thread that it is ending the
/// attempt, and asks it (when it is free) for a checkpoint.
#[derive(Debug, Default)]
pub(super) struct HangDesk {
    /// The watchdog is ending the attempt: training must not go on (a step
    /// that was only slow must not race the watchdog's records and exit).
    ended: AtomicBool,
    /// ... and it wants a checkpoint of the last completed step.
    requested: AtomicBool,
    reply: Mutex<Option<Sender<Result<u64, RunError>>>>,
}

impl HangDesk {
    /// True once the watchdog is ending the attempt: training must stop.
    pub(super) fn ended(&self) -> bool {
        self.ended.load(Ordering::SeqCst)
    }

    fn requested(&self) -> bool {
        self.requested.load(Ordering::SeqCst)
    }

    /// The attempt ends; no checkpoint wanted (the training thread is the stuck one).
    fn end(&self) {
        self.ended.store(true, Ordering::SeqCst);
    }

    /// The attempt ends, with a checkpoint wanted. The request is in place
    /// before `ended` is set, so a thread that sees `ended` sees it too.
    fn request(&self, reply: Sender<Result<u64, RunError>>) {
        *self.reply.lock().unwrap_or_else(|p| p.into_inner()) = Some(reply);
        self.requested.store(true, Ordering::SeqCst);
        self.ended.store(true, Ordering::SeqCst);
    }

    fn answer(&self, result: Result<u64, RunError>) {
        if let Some(tx) = self.reply.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = tx.send(result);
        }
    }
}

impl Attempt {
    /// The watchdog is ending the attempt. When it found the persister stuck
    /// it wants a checkpoint: writes one of the last completed step beside
    /// the stuck save (never waiting for it) and answers. Then waits for the
    /// watchdog to end the process: training must not go on meanwhile.
    pub(super) fn yield_to_watchdog(&mut self) -> ! {
        if self.hang.requested() {
            tracing::warn!(
                step = self.trainer.step(),
                "watchdog: writing a checkpoint of the last completed step beside the stuck save"
            );
            let result = self.save_now("hang").map(|r| r.step);
            if let Err(e) = self.events.sync() {
                tracing::error!(error = %e, "could not sync events.jsonl");
            }
            self.hang.answer(result);
        } else {
            tracing::warn!(step = self.trainer.step(), "watchdog: ending the attempt; training stops here");
        }
        loop {
            std::thread::park();
        }
    }
}

/// What the watchdog needs to end a hung attempt without the training thread.
pub(super) struct HangHandler {
    pub(super) cfg: Config,
    pub(super) slurm: SlurmEnv,
    pub(super) events: PathBuf,
    pub(super) store: CheckpointStore,
    pub(super) beats: Beats,
    pub(super) desk: Arc<HangDesk>,
    pub(super) lock: LockRelease,
    /// `<run dir>/summary.json`, and what it needs beyond [`Beats`].
    pub(super) summary: PathBuf,
    pub(super) start_step: u64,
    pub(super) resumes: u64,
    pub(super) started: Instant,
}

/// Why the attempt cannot go on.
pub(super) enum Cause {
    /// An activity ran past its `[watchdog]` limit.
    Hang(Hang),
    /// Other ranks of the world stopped beating (`attempt/rank_watch.rs`); the
    /// training thread waits for them in a collective.
    RanksLost { lost: Vec<Lost>, size: usize, timeout: Duration },
}

impl HangHandler {
    /// Records, checkpoints where it can, requeues, releases the lock and
    /// exits the process (aborting the MPI world, if any); never returns.
    pub(super) fn handle(self, hang: Hang) -> ! {
        self.end(Cause::Hang(hang))
    }

    /// The same for ranks lost from this leader's world: no checkpoint (the
    /// training thread is in a collective that cannot finish).
    /// A leader the verdict names (it was frozen, and thawed after another
    /// rank found it lost) is not the recorder: it waits, as a follower
    /// does, for the recorder to end the world (which ends this process),
    /// and ends it itself if that does not come.
    pub(super) fn handle_lost(self, lost: Vec<Lost>, size: usize) -> ! {
        if crate::attempt::rank_watch::recorder(&lost, size) != Some(0) {
            tracing::error!("this leader was found lost by another rank (it stopped answering); the world ends");
            std::thread::sleep(self.cfg.signals.grace + 2 * SCONTROL_TIMEOUT);
            let code =
                if self.beats.newest_committed().is_some() { Outcome::StoppedWithCheckpoint } else { Outcome::Failure };
            abort_world(code.code());
        }
        let timeout = self.cfg.distributed.timeout;
        self.end(Cause::RanksLost { lost, size, timeout })
    }

    fn end(self, cause: Cause) -> ! {
        let budget = self.cfg.signals.grace.saturating_sub(self.cfg.signals.safety_margin);
        let deadline = Deadline { at: Instant::now() + budget };
        // What to exit with if even the records hang: from memory only.
        let fallback =
            if self.beats.newest_committed().is_some() { Outcome::StoppedWithCheckpoint } else { Outcome::Failure };
        let (tx, rx) = mpsc::channel();
        let spawned = std::thread::Builder::new().name("rekindle-hang".into()).spawn(move || {
            let _ = tx.send(self.end_attempt(cause, deadline));
        });
        let outcome = match spawned {
            Ok(_) => rx.recv_timeout(budget + 2 * SCONTROL_TIMEOUT + Duration::from_secs(5)).unwrap_or_else(|_| {
                tracing::error!("watchdog: the hang's records did not finish in time (the filesystem may be stuck too); exiting anyway");
                fallback
            }),
            Err(e) => {
                tracing::error!(error = %e, "watchdog: cannot start the thread that records the hang; exiting");
                fallback
            }
        };
        // With other ranks, they are stuck in a collective with this one:
        // MPI_Abort makes the launcher end them all.
        abort_world(outcome.code())
    }

    fn end_attempt(self, cause: Cause, deadline: Deadline) -> Outcome {
        let mut events = match EventLog::open(&self.events, context(&self.slurm)) {
            Ok(log) => Some(log),
            Err(e) => {
                tracing::error!(error = %e, "watchdog: cannot open events.jsonl; going on without records");
                None
            }
        };
        match &cause {
            Cause::Hang(hang) => {
                let what = hang.busy.activity.name();
                tracing::error!(
                    activity = what,
                    thread = hang.busy.worker.name(),
                    step = hang.busy.step,
                    stuck_s = format!("{:.1}", hang.stuck_for.as_secs_f64()),
                    limit_s = format!("{:.1}", hang.limit.as_secs_f64()),
                    "HANG: {what} at step {} has run past its [watchdog] limit; ending this attempt",
                    hang.busy.step
                );
                record(&mut events, &Event::Hang(hang_event(hang)));
            }
            Cause::RanksLost { lost, size, timeout } => {
                tracing::error!("LOST RANKS: {}", lost_message(lost, *timeout));
                for event in rank_lost_events(lost, 0, *size, *timeout) {
                    record(&mut events, &event);
                }
            }
        }
        sync(&mut events);
        // The checkpoint: only a free training thread can take a snapshot.
        match &cause {
            Cause::Hang(hang) if hang.busy.worker == Worker::Persister => {
                let (tx, rx) = mpsc::channel();
                self.desk.request(tx);
                match rx.recv_timeout(deadline.remaining(Instant::now())) {
                    Ok(Ok(step)) => tracing::warn!(step, "watchdog: checkpoint of the last completed step written"),
                    Ok(Err(e)) => {
                        tracing::error!(error = %e, "watchdog: the checkpoint of the last completed step failed")
                    }
                    Err(_) => tracing::error!("watchdog: the training thread did not write a checkpoint in time"),
                }
            }
            _ => {
                self.desk.end();
                tracing::error!(
                    newest = ?self.beats.newest_committed(),
                    "the training thread itself is stuck: no new checkpoint; the next attempt resumes from the newest durable one"
                );
            }
        }
        let kept = self.beats.newest_committed().filter(|step| {
            let failures = verify_checkpoint_dir(&self.store.step_dir(*step), VerifyLevel::Quick);
            failures.is_empty() || {
                tracing::error!(step, ?failures, "watchdog: the newest checkpoint no longer verifies");
                false
            }
        });
        // A publish that hangs after the final checkpoint: training is done,
        // nothing to requeue; exit 75 all the same (a rerun publishes).
        // Hangs count toward `[run] max_crash_requeues` like transient
        // crashes: a job that hangs at the same place every time must stop.
        let in_job = match &cause {
            Cause::RanksLost { lost, .. } => {
                continue_in_job(&self.cfg, &self.slurm, lost, kept, &self.events).map(|(r, x)| (r, Some(x)))
            }
            Cause::Hang(hang) => {
                continue_in_job_after_hang(&self.cfg, &self.slurm, hang.busy.activity.name(), kept, &self.events)
            }
        };
        let (requeue, excluded) = match in_job {
            Some((record, excluded)) => (record, excluded),
            None => {
                let (reason, end) = match &cause {
                    Cause::Hang(hang) => (
                        format!("hang: {}", hang.busy.activity.name()),
                        hang_end(&self.slurm, hang.busy.activity.name()),
                    ),
                    Cause::RanksLost { lost, .. } => (lost_reason(lost), lost_end(lost)),
                };
                requeue_like_a_hang(
                    &self.cfg,
                    &self.slurm,
                    &self.events,
                    kept,
                    Some(self.cfg.run.max_steps),
                    &reason,
                    &end,
                )
            }
        };
        record(&mut events, &Event::Requeue(requeue.clone()));
        if let Some(excluded) = excluded {
            record(&mut events, &Event::NodesExcluded(excluded));
        }
        let outcome = match kept {
            Some(step) => {
                let stop = match &cause {
                    Cause::Hang(hang) => hang_stop(hang, step, requeue),
                    Cause::RanksLost { lost, .. } => {
                        Stop { step: Some(step), reason: lost_reason(lost), requeue: Some(requeue), ..Stop::default() }
                    }
                };
                record(&mut events, &Event::Stop(stop));
                tracing::warn!(step, "exiting 75; the next attempt resumes from the checkpoint of step {step}");
                Outcome::StoppedWithCheckpoint
            }
            None => {
                let error = match &cause {
                    Cause::Hang(hang) => hang_error(hang, requeue),
                    Cause::RanksLost { lost, timeout, .. } => lost_error(lost, *timeout, requeue),
                };
                record(&mut events, &Event::Error(error));
                tracing::error!("exiting 1: no checkpoint verifies; the next attempt starts from step 0");
                Outcome::Failure
            }
        };
        sync(&mut events);
        let state = if kept.is_some() { SummaryState::Stopped } else { SummaryState::Failed };
        if let Err(e) = write_atomically(&self.summary, &self.summary(state, kept).to_bytes()) {
            tracing::error!(error = %e, "watchdog: could not write summary.json");
        }
        self.lock.release();
        outcome
    }

    /// `summary.json` of the hung attempt, from what the threads published.
    fn summary(&self, state: SummaryState, kept: Option<u64>) -> Summary {
        let progress = self.beats.progress();
        Summary {
            state,
            run: self.cfg.run.name.clone(),
            steps: progress.step,
            max_steps: Some(self.cfg.run.max_steps),
            final_loss: progress.last_loss,
            best_loss: progress.best_loss,
            wall_seconds_this_attempt: self.started.elapsed().as_secs_f64(),
            steps_this_attempt: progress.step.saturating_sub(self.start_step),
            resumes: self.resumes,
            checkpoints_written_this_attempt: self.beats.commits(),
            last_checkpoint_step: kept,
            updated_at: now_rfc3339(),
            ..Summary::default()
        }
    }
}

/// The `hang` event.
fn hang_event(hang: &Hang) -> HangEvent {
    HangEvent {
        activity: hang.busy.activity.name().into(),
        thread: hang.busy.worker.name().into(),
        step: hang.busy.step,
        since: rfc3339(hang.busy.since_wall),
        stuck_seconds: hang.stuck_for.as_secs_f64(),
        limit_seconds: hang.limit.as_secs_f64(),
        rank: None,
    }
}

/// The `stop` event of a hang that ended with a durable checkpoint.
fn hang_stop(hang: &Hang, step: u64, requeue: RequeueRecord) -> Stop {
    Stop { step: Some(step), reason: hang_reason(hang), requeue: Some(requeue), ..Stop::default() }
}

/// The `error` event of a hang with no checkpoint to resume from.
fn hang_error(hang: &Hang, requeue: RequeueRecord) -> ErrorEvent {
    ErrorEvent {
        step: Some(hang.busy.step),
        error: format!(
            "{} at step {} hung for {:.0}s (limit {:.0}s) and no checkpoint verifies",
            hang.busy.activity.name(),
            hang.busy.step,
            hang.stuck_for.as_secs_f64(),
            hang.limit.as_secs_f64()
        ),
        class: Some(CrashClass::Transient),
        why: Some("a hang (stuck collective, filesystem or data loader)".into()),
        requeue: Some(requeue),
        ..ErrorEvent::default()
    }
}

/// `hang: <activity>`, the `stop` event's reason.
fn hang_reason(hang: &Hang) -> String {
    format!("hang: {}", hang.busy.activity.name())
}

fn rfc3339(t: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(t).to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn record(events: &mut Option<EventLog>, event: &Event) {
    if let Some(log) = events
        && let Err(e) = log.record(event)
    {
        tracing::error!(error = %e, event = event.name(), "watchdog: could not record an event; going on");
    }
}

fn sync(events: &mut Option<EventLog>) {
    if let Some(log) = events
        && let Err(e) = log.sync()
    {
        tracing::error!(error = %e, "watchdog: could not sync events.jsonl");
    }
}

/// `<run dir>/events.jsonl`.
pub(super) fn events_path(root: &std::path::Path) -> PathBuf {
    root.join(EVENTS_FILE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attempt::watchdog::{Activity, Busy};

    fn hang(worker: Worker, activity: Activity) -> Hang {
        Hang {
            busy: Busy {
                worker,
                activity,
                step: 12,
                since: Instant::now(),
                since_wall: SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_000_000),
            },
            limit: Duration::from_secs(2),
            stuck_for: Duration::from_millis(2500),
        }
    }

    #[test]
    fn a_hang_records_what_was_stuck_since_when_and_its_limit() {
        let e = hang_event(&hang(Worker::Persister, Activity::Save));
        assert_eq!((e.activity.as_str(), e.thread.as_str(), e.step), ("save", "persister", 12));
        assert_eq!((e.stuck_seconds, e.limit_seconds), (2.5, 2.0));
        assert_eq!(e.since, "2026-11-18T11:06:40.000Z");
    }

    #[test]
    fn a_hang_ends_with_a_stop_naming_the_checkpoint_or_an_error_without_one() {
        let requeue = RequeueRecord::skip("not running under SLURM");
        let stop = hang_stop(&hang(Worker::Training, Activity::Step), 10, requeue.clone());
        assert_eq!((stop.step, stop.reason.as_str()), (Some(10), "hang: step"));
        assert_eq!(stop.requeue, Some(requeue.clone()));
        let error = hang_error(&hang(Worker::Training, Activity::Eval), requeue);
        assert_eq!(error.class, Some(CrashClass::Transient));
        assert!(error.error.contains("eval at step 12 hung for 2s (limit 2s)"), "{}", error.error);
    }

    #[test]
    fn the_desk_carries_one_answer_to_the_watchdog() {
        let stuck = HangDesk::default();
        stuck.end();
        assert!(stuck.ended() && !stuck.requested(), "a stuck training thread is asked for nothing");
        let desk = HangDesk::default();
        assert!(!desk.ended() && !desk.requested());
        desk.answer(Ok(1)); // nobody asked: dropped
        let (tx, rx) = mpsc::channel();
        desk.request(tx);
        assert!(desk.ended() && desk.requested());
        desk.answer(Ok(7));
        desk.answer(Ok(8));
        assert!(matches!(rx.recv().unwrap(), Ok(7)));
        assert!(rx.try_recv().is_err(), "one answer");
    }
}
