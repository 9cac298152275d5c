//! Checkpoints during an attempt: periodic ones (snapshotted on this
//! thread, persisted in the background), the synchronous one at a stop or
//! the end, what each records, and the rollback after a non-finite step.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::checkpoint::{CheckpointError, Parts, SaveReport, Snapshot, reusable};
use crate::config::{CheckpointInterval, CheckpointSection};
use crate::telemetry::{self, CheckpointFailed, CheckpointSaved, CheckpointStarted, Event, JsonlWriter, Nonfinite};
use crate::train::NonFiniteEvent;

use super::Attempt;
use super::ending::finite;
use super::envelope::{Losses, StateEnvelope};
use crate::attempt::budget::job_time_left;
use crate::attempt::error::RunError;
use crate::attempt::records::{set_aside_rejected, truncate_metrics};
use crate::attempt::stop::StopFlag;
use crate::attempt::watchdog::{Activity, Worker};
use crate::checkpoint::interval::{
    CostMeter, IntervalInputs, Mtbf, MtbfSource, Slowdown, choose_interval, history_mtbf, interval_event,
    noticeably_different, recompute_after,
};
use crate::checkpoint::persist::{InParts, PartEntries, PartsError, Persisted, PersisterDied};
use crate::run::ranks::{Leader, PartsInbox};
use crate::rundir::METRICS_FILE;

/// The state of `[checkpoint] interval = "auto"` in an attempt: the
/// interruption rate (fixed for the attempt), the measured saves, the
/// interval in force and the one last recorded.
#[derive(Debug, Clone)]
pub(super) struct AutoInterval {
    mtbf: Option<Mtbf>,
    meter: CostMeter,
    /// Step times with and without a background save in flight.
    pub(super) slowdown: Slowdown,
    current: Duration,
    recorded: Option<Duration>,
}

impl AutoInterval {
    /// For `interval = "auto"`: the MTBF from `[checkpoint] mtbf`, else from
    /// the earlier attempts in `events` (read before this attempt records
    /// its `start`, which would otherwise count as an attempt with no end).
    pub(super) fn for_config(c: &CheckpointSection, events: &Path) -> Option<AutoInterval> {
        if c.interval != CheckpointInterval::Auto {
            return None;
        }
        let mtbf = match c.mtbf {
            Some(d) => Some(Mtbf { seconds: d.as_secs_f64(), source: MtbfSource::Config }),
            None => history_mtbf(&earlier_attempts(events)),
        };
        Some(AutoInterval {
            mtbf,
            meter: CostMeter::default(),
            slowdown: Slowdown::default(),
            current: crate::checkpoint::interval::DEFAULT_INTERVAL,
            recorded: None,
        })
    }
}

/// The attempts recorded in `events` so far (none when it cannot be read:
/// the interval then falls back to the default, with a warning).
fn earlier_attempts(events: &Path) -> Vec<telemetry::Attempt> {
    match telemetry::read_jsonl(events) {
        Ok(Some(lines)) => telemetry::attempts(&telemetry::events_from(lines.records)),
        Ok(None) => Vec::new(),
        Err(e) => {
            tracing::warn!(error = %e, path = %events.display(), "cannot read the earlier attempts; no interruption history for interval = \"auto\"");
            Vec::new()
        }
    }
}

impl Attempt {
    /// True when a periodic checkpoint is due after `step`.
    pub(super) fn periodic_checkpoint_due(&self, step: u64) -> bool {
        let interval = match (self.cfg.checkpoint.interval, &self.auto_interval) {
            (CheckpointInterval::Fixed(d), _) => d,
            (CheckpointInterval::Auto, Some(auto)) => auto.current,
            (CheckpointInterval::Auto, None) => crate::checkpoint::interval::DEFAULT_INTERVAL,
        };
        periodic_due(step, self.cfg.checkpoint.every_steps, self.last_checkpoint.elapsed(), interval)
    }

    /// Chooses the `"auto"` interval again from what is known now, and
    /// records a `checkpoint_interval` event when it moved noticeably.
    pub(super) fn choose_interval(&mut self, step: u64) -> Result<(), RunError> {
        let background = self.cfg.checkpoint.async_save;
        let remaining = job_time_left(self.slurm.end_time, chrono::Utc::now().timestamp());
        let Some(auto) = &mut self.auto_interval else { return Ok(()) };
        let inputs = IntervalInputs { costs: auto.meter.costs(background), mtbf: auto.mtbf, remaining };
        let choice = choose_interval(&inputs);
        let previous = auto.current;
        auto.current = choice.interval;
        if !noticeably_different(auto.recorded, choice.interval) {
            return Ok(());
        }
        let event = interval_event(step, &inputs, &choice, auto.recorded.map(|_| previous));
        auto.recorded = Some(choice.interval);
        tracing::info!(
            step,
            interval_s = format!("{:.1}", event.interval_seconds),
            reason = %event.reason,
            bound = ?event.bound,
            cost_s = ?event.cost_seconds,
            mtbf_s = ?event.mtbf_seconds,
            mtbf_source = %event.mtbf_source,
            "checkpoint interval chosen"
        );
        self.events.record(&Event::CheckpointInterval(event))?;
        Ok(())
    }

    /// Snapshots into host memory (the stall) and persists in the background
    /// (or inline with `[checkpoint] async = false`).
    ///
    /// A save that falls due while the previous one is still being written
    /// waits for it, and is taken at the first step boundary after it
    /// commits: skipping it would leave up to two intervals unsaved, and
    /// the steps lost to a dead node would depend on how loaded it was.
    pub(super) fn periodic_checkpoint(&mut self) -> Result<(), RunError> {
        let step = self.trainer.step();
        if self.persister.busy() {
            if self.save_due_since.is_none() {
                tracing::warn!(step, "previous checkpoint is still being written; this one waits for it");
                self.save_due_since = Some(step);
            }
            return Ok(());
        }
        let due_step = self.save_due_since.take().unwrap_or(step);
        self.last_checkpoint = Instant::now();
        let t0 = Instant::now();
        let (snapshot, parts) = self.snapshot()?;
        let stall = t0.elapsed().as_secs_f64();
        if self.cfg.checkpoint.async_save {
            self.events.record(&Event::CheckpointStarted(CheckpointStarted {
                step,
                kind: "periodic".into(),
                due_step,
                snapshot_seconds: stall,
            }))?;
            if let Some(auto) = &mut self.auto_interval {
                auto.slowdown.save_started();
            }
            self.parts_inbox = parts.as_ref().map(|p| PartsInbox::new(&p.staging, p.world));
            match self.persister.submit(snapshot, stall, parts) {
                Ok(()) => Ok(()),
                Err(died) => self.on_persister_death(died),
            }
        } else {
            let payload_bytes = snapshot.payload_bytes();
            let busy = self.beats.begin(Worker::Training, Activity::Save, snapshot.step);
            let result = self.save_snapshot(&snapshot, parts);
            drop(busy);
            let step = snapshot.step;
            self.handle_persisted(Persisted {
                step,
                payload_bytes,
                snapshot_seconds: stall,
                result,
                buffers: Some(snapshot),
            })
        }
    }

    /// Commits `snapshot` on this thread; written in `parts`, once the
    /// other ranks reported theirs (rounds with them until they did).
    fn save_snapshot(&self, snapshot: &Snapshot, parts: Option<InParts>) -> Result<SaveReport, CheckpointError> {
        let (Some(parts), Some(leader)) = (parts, &self.leader) else { return self.store.save(snapshot) };
        let timeout = self.cfg.distributed.timeout;
        let mut collect = || collect_parts(leader, &self.stop, snapshot.step, &parts.staging, parts.world, timeout);
        self.store.save_with(
            snapshot,
            Some(Parts {
                staging: parts.staging.clone(),
                world: parts.world,
                optimizer_in_parts: parts.optimizer_in_parts,
                collect: &mut collect,
            }),
        )
    }

    /// Hands the parts the other ranks reported to the persister, once every
    /// rank's part of the checkpoint it is writing is in.
    pub(super) fn forward_parts(&mut self) {
        let (Some(leader), Some(inbox)) = (&self.leader, &mut self.parts_inbox) else { return };
        if let Some(entries) = inbox.add(leader.take_parts(inbox.staging())) {
            self.parts_inbox = None;
            self.persister.deliver(entries);
        }
    }

    /// Waits for the save in flight, if any. One written in parts needs the
    /// other ranks' reports, which come only in rounds: until they are in
    /// (at most `[distributed] timeout`), this makes rounds in which no rank
    /// trains.
    fn wait_persister(&mut self) -> Result<Option<Persisted>, PersisterDied> {
        let waiting = Instant::now();
        while self.persister.awaits_parts() {
            let round = match &self.leader {
                Some(leader) => {
                    leader.tick(&self.stop, false, self.trainer.step()).map(drop).map_err(|e| e.to_string())
                }
                None => Err("no other rank to report them".to_string()),
            };
            let overdue = waiting.elapsed() > self.cfg.distributed.timeout;
            let given_up = match (round, &self.parts_inbox) {
                (Err(e), _) => Some(PartsError::NoAgreement(e)),
                (Ok(()), Some(inbox)) if overdue => Some(inbox.overdue(waiting.elapsed())),
                _ => None,
            };
            if let Some(reason) = given_up {
                self.parts_inbox = None;
                self.persister.deliver(Err(reason));
                break;
            }
            self.forward_parts();
            if self.persister.awaits_parts() {
                std::thread::sleep(PARTS_PAUSE);
            }
        }
        self.persister.wait()
    }

    pub(super) fn collect_background(&mut self) -> Result<(), RunError> {
        match self.persister.poll() {
            Ok(Some(p)) => self.handle_persisted(p),
            Ok(None) => Ok(()),
            Err(died) => self.on_persister_death(died),
        }
    }

    /// The persister died during training. It is restarted: a panic in the
    /// save path most likely concerns one save, while the training state
    /// (the expensive part) is intact on this thread, so one death must not
    /// end a long run, nor (as before) silently end its checkpointing. The
    /// lost save counts as a failed one, so a thread that keeps dying stops
    /// the run like saves that keep failing: after one synchronous checkpoint
    /// attempt on this thread (which does not go through the persister),
    /// with an error that says so.
    fn on_persister_death(&mut self, died: PersisterDied) -> Result<(), RunError> {
        let Err(error) = self.record_persister_death(died) else { return Ok(()) };
        match self.checkpoint_now("stop") {
            Ok(report) => tracing::warn!(step = report.step, "synchronous checkpoint written before stopping"),
            Err(e) => {
                tracing::error!(error = %e, "the synchronous checkpoint failed too; earlier checkpoints are intact")
            }
        }
        Err(error)
    }

    /// Logs and records a dead persister, counts its lost save as a failed
    /// one and restarts it; an error (and no restart) once deaths and failed
    /// saves in a row reach `[checkpoint] max_consecutive_failures`.
    fn record_persister_death(&mut self, died: PersisterDied) -> Result<(), RunError> {
        self.consecutive_failures += 1;
        let count = self.consecutive_failures;
        let give_up = count >= self.cfg.checkpoint.max_consecutive_failures;
        let action = if give_up { "stopping" } else { "restarted" };
        tracing::error!(step = ?died.step, error = %died.error, failures_in_a_row = count, action, "background checkpoint thread died; the save in flight is lost");
        let event = Event::PersisterDied(telemetry::PersisterDied {
            step: died.step,
            error: died.error.clone(),
            action: action.into(),
            consecutive_failures: count,
        });
        if let Err(e) = self.events.record(&event) {
            tracing::error!(error = %e, "could not record the persister_died event");
        }
        if give_up {
            return Err(RunError::PersisterDied { count, error: died.error });
        }
        self.persister.restart().map_err(|source| RunError::RunDir { path: self.dir.checkpoints.clone(), source })
    }

    /// Records a finished periodic save; too many failures in a row stop the run.
    fn handle_persisted(&mut self, mut p: Persisted) -> Result<(), RunError> {
        if let Some(buffers) = p.buffers.take() {
            // Shared tensors are let go: only buffers of their own are reused.
            self.spare = Some((reusable(buffers.model), reusable(buffers.optimizer)));
        }
        match p.result {
            Ok(report) => {
                self.consecutive_failures = 0;
                self.record_saved(&report, "periodic", p.payload_bytes, p.snapshot_seconds)
            }
            Err(e) if e.not_owner() && self.lock.is_lost() => Err(self.refused_for_lock(p.step, &e)),
            Err(e) if e.committed() => {
                // Durable and loadable; only the directory sync or rotation failed.
                tracing::warn!(step = p.step, error = %e, "checkpoint committed with a warning");
                self.consecutive_failures = 0;
                self.mark_durable(p.step);
                self.events.record(&Event::CheckpointSaved(CheckpointSaved {
                    step: p.step,
                    kind: "periodic".into(),
                    warning: Some(e.to_string()),
                    ..CheckpointSaved::default()
                }))?;
                Ok(())
            }
            Err(e) => {
                self.consecutive_failures += 1;
                tracing::warn!(step = p.step, error = %e, failures_in_a_row = self.consecutive_failures, "background checkpoint failed; training continues, earlier checkpoints are intact");
                self.events.record(&Event::CheckpointFailed(CheckpointFailed {
                    step: p.step,
                    kind: "periodic".into(),
                    error: e.to_string(),
                    consecutive_failures: Some(self.consecutive_failures),
                }))?;
                if self.consecutive_failures >= self.cfg.checkpoint.max_consecutive_failures {
                    return Err(RunError::CheckpointsFailing { count: self.consecutive_failures, last: e });
                }
                Ok(())
            }
        }
    }

    /// `step` is committed: the newest checkpoint to fall back on, here and
    /// for the watchdog.
    fn mark_durable(&mut self, step: u64) {
        self.last_durable_step = Some(step);
        self.beats.committed(step);
    }

    fn record_saved(&mut self, r: &SaveReport, kind: &str, payload: u64, stall: f64) -> Result<(), RunError> {
        self.mark_durable(r.step);
        if !r.already_existed {
            self.checkpoints_written += 1;
        }
        // Periodic saves measure the cost (a stop or final save ends the
        // attempt; one that already existed wrote nothing).
        let measure = kind == "periodic" && !r.already_existed;
        let remeasured = self.auto_interval.as_mut().filter(|_| measure).map(|auto| {
            let slowdown = auto.slowdown.save_ended();
            auto.meter.measured(stall, r.seconds, slowdown);
            recompute_after(auto.meter.saves())
        });
        tracing::info!(
            step = r.step,
            kind,
            bytes = r.bytes,
            stall_s = format!("{stall:.4}"),
            persist_s = format!("{:.3}", r.seconds),
            "checkpoint saved"
        );
        self.events.record(&Event::CheckpointSaved(saved_event(r, kind, payload, stall)))?;
        if remeasured == Some(true) {
            self.choose_interval(self.trainer.step())?;
        }
        Ok(())
    }

    /// The snapshot of a checkpoint of the current step; with other ranks,
    /// every rank writes its share into the staging directory of
    /// [`InParts`] (and with a sharded optimizer, this snapshot's optimizer
    /// state is this rank's part).
    fn snapshot(&mut self) -> Result<(Snapshot, Option<InParts>), RunError> {
        let step = self.trainer.step();
        let mut snapshot = self.trainer.snapshot_part(self.spare.take())?;
        // The other ranks snapshot the same step when told below (nothing
        // trains in between), and write their shares only where they have
        // one (a state too small to share is rank 0's alone).
        let (world, optimizer_in_parts) = (self.trainer.rank_and_size().1, self.trainer.optimizer_shard().is_some());
        let parts = match &self.leader {
            Some(leader) if world > 1 && self.store.shared_by_ranks(&snapshot, world, optimizer_in_parts) => {
                let staging = leader.snapshot(&self.stop, &self.store, step)?;
                Some(InParts { staging, world, optimizer_in_parts })
            }
            _ => None,
        };
        let losses = Losses { best_loss: self.best_loss, last_loss: self.last_loss };
        // The engine's own state becomes the envelope's `train` object.
        let train = std::mem::take(&mut snapshot.state);
        snapshot.state = StateEnvelope::new(snapshot.step, train, losses, &self.slurm, &self.cfg).to_value();
        Ok((snapshot, parts))
    }

    /// Writes a checkpoint of the current step synchronously (after any save
    /// in flight). Used where the run ends (stop, final, non-finite and
    /// out-of-memory stops), so nothing but the save itself can fail it: a
    /// failed save in flight (even one that makes too many in a row) and an
    /// event that cannot be written are logged, and the save is still tried.
    /// `last_durable_step` is set as soon as the checkpoint is committed.
    pub(super) fn checkpoint_now(&mut self, kind: &str) -> Result<SaveReport, RunError> {
        self.still_owner()?;
        let in_flight = match self.wait_persister() {
            Ok(Some(p)) => self.handle_persisted(p),
            Ok(None) => Ok(()),
            Err(died) => self.record_persister_death(died),
        };
        if let Err(e) = in_flight {
            tracing::error!(error = %e, "the background save in flight failed; writing the {kind} checkpoint anyway");
        }
        self.save_now(kind)
    }

    /// Writes a checkpoint of the current step synchronously, whatever the
    /// persister is doing (the watchdog uses it beside a stuck background
    /// save), and records it.
    pub(super) fn save_now(&mut self, kind: &str) -> Result<SaveReport, RunError> {
        self.still_owner()?;
        let t0 = Instant::now();
        let (snapshot, parts) = self.snapshot()?;
        let stall = t0.elapsed().as_secs_f64();
        let payload = snapshot.payload_bytes();
        let step = snapshot.step;
        let busy = self.beats.begin(Worker::Training, Activity::Save, step);
        let result = self.save_snapshot(&snapshot, parts);
        drop(busy);
        if let Err(e) = &result
            && e.not_owner()
            && self.lock.is_lost()
        {
            return Err(self.refused_for_lock(step, e));
        }
        let recorded = match &result {
            Ok(report) => {
                self.last_checkpoint = Instant::now();
                self.record_saved(report, kind, payload, stall)
            }
            Err(e) if e.committed() => {
                tracing::warn!(step, error = %e, "checkpoint committed with a warning");
                self.last_checkpoint = Instant::now();
                self.mark_durable(step);
                self.events
                    .record(&Event::CheckpointSaved(CheckpointSaved {
                        step,
                        kind: kind.into(),
                        warning: Some(e.to_string()),
                        ..CheckpointSaved::default()
                    }))
                    .map_err(RunError::from)
            }
            Err(e) => {
                tracing::error!(step, kind, error = %e, "checkpoint failed; earlier checkpoints are intact");
                self.events
                    .record(&Event::CheckpointFailed(CheckpointFailed {
                        step,
                        kind: kind.into(),
                        error: e.to_string(),
                        consecutive_failures: None,
                    }))
                    .map_err(RunError::from)
            }
        };
        if let Err(e) = recorded {
            tracing::error!(error = %e, "could not record the {kind} checkpoint's event");
        }
        match result {
            Ok(report) => Ok(report),
            Err(e) if e.committed() => Ok(SaveReport {
                step,
                dir: self.store.step_dir(step),
                bytes: payload,
                seconds: t0.elapsed().as_secs_f64(),
                already_existed: false,
                rotated_out: Vec::new(),
                parts: None,
                write: None,
            }),
            Err(e) => Err(e.into()),
        }
    }

    /// A save refused because the run-directory lock is no longer ours (the
    /// store logged it): never recorded, since the directory belongs to
    /// another process now, and the attempt ends with `LockLost`. (A save
    /// refused because the lock could not be read is an ordinary failed save.)
    fn refused_for_lock(&self, step: u64, e: &crate::checkpoint::CheckpointError) -> RunError {
        if e.committed() {
            tracing::error!(step, error = %e, "checkpoint committed, but rotation was refused: the lock is lost");
        }
        RunError::LockLost { dir: self.dir.root.clone() }
    }

    /// Reloads the newest checkpoint that verifies (newer ones that do not are
    /// recorded and quarantined, as at start) and moves the data cursor past
    /// the offending batch.
    pub(super) fn rollback(&mut self, ev: NonFiniteEvent) -> Result<(), RunError> {
        match self.wait_persister() {
            Ok(Some(p)) => self.handle_persisted(p)?,
            Ok(None) => {}
            Err(died) => self.on_persister_death(died)?,
        }
        let outcome = self.store.load_latest()?;
        set_aside_rejected(&self.store, &mut self.events, &outcome.rejected)?;
        let Some(loaded) = outcome.loaded else {
            return Err(RunError::NothingToRollBackTo { step: ev.step, dir: self.dir.checkpoints.clone() });
        };
        let snap = &loaded.snapshot;
        let state = StateEnvelope::of(snap);
        self.trainer
            .restore(&snap.model, &snap.optimizer, &state.train)
            .map_err(|source| RunError::Restore { dir: loaded.dir.clone(), source })?;
        let skipped = self.trainer.skip_past(&ev)?;
        (self.last_loss, self.best_loss) = state.losses_so_far();
        tracing::warn!(
            failed_step = ev.step,
            restored_step = snap.step,
            skipped_batches = skipped,
            "non-finite step: rolled back to the last checkpoint and skipped past its data"
        );
        self.events.record(&Event::Nonfinite(Nonfinite {
            step: ev.step,
            loss: finite(ev.loss),
            grad_norm: finite(ev.grad_norm),
            action: "rollback".into(),
            restored_step: Some(snap.step),
            skipped_batches: Some(skipped),
        }))?;
        truncate_metrics(&self.dir.path(METRICS_FILE), snap.step)?;
        self.metrics = JsonlWriter::open(self.dir.path(METRICS_FILE))?;
        self.exports.rewind(snap.step);
        Ok(())
    }
}

/// Between two rounds of a leader waiting for the other ranks' parts.
const PARTS_PAUSE: Duration = Duration::from_millis(5);

/// The other ranks' entries for the save of `step` into `staging`, written
/// in parts by a world of `world`: rounds in which no rank trains, until
/// every follower reported its part, a round fails, or `timeout` passed.
fn collect_parts(
    leader: &Leader,
    stop: &StopFlag,
    step: u64,
    staging: &str,
    world: usize,
    timeout: Duration,
) -> PartEntries {
    let mut inbox = PartsInbox::new(staging, world);
    let waiting = Instant::now();
    loop {
        leader.tick(stop, false, step).map_err(|e| PartsError::NoAgreement(e.to_string()))?;
        if let Some(entries) = inbox.add(leader.take_parts(staging)) {
            return entries;
        }
        if waiting.elapsed() > timeout {
            return Err(inbox.overdue(waiting.elapsed()));
        }
        std::thread::sleep(PARTS_PAUSE);
    }
}

/// A checkpoint falls due every `every_steps` steps (0: never by steps) and
/// whenever `interval` has passed since the last one.
fn periodic_due(step: u64, every_steps: u64, since_last: Duration, interval: Duration) -> bool {
    (every_steps > 0 && step.is_multiple_of(every_steps)) || since_last >= interval
}

/// The `checkpoint_saved` event of a save that went through.
fn saved_event(r: &SaveReport, kind: &str, payload: u64, stall: f64) -> CheckpointSaved {
    let gbps = if r.seconds > 0.0 { r.bytes as f64 / r.seconds / 1e9 } else { 0.0 };
    CheckpointSaved {
        step: r.step,
        kind: kind.into(),
        bytes: Some(r.bytes),
        payload_bytes: Some(payload),
        snapshot_seconds: Some(stall),
        persist_seconds: Some(r.seconds),
        gb_per_s: Some(gbps),
        already_existed: Some(r.already_existed),
        dir: Some(r.dir.clone()),
        rotated_out: Some(r.rotated_out.clone()),
        optimizer_parts: r.parts.map(|p| p.ranks as u64),
        parts_wait_seconds: r.parts.map(|p| p.wait_seconds),
        own_bytes: r.parts.map(|p| p.own_bytes),
        write: r.write.clone(),
        warning: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periodic_checkpoints_fall_due_by_steps_or_by_time() {
        let (hour, second) = (Duration::from_secs(3600), Duration::from_secs(1));
        assert!(periodic_due(50, 25, second, hour));
        assert!(!periodic_due(51, 25, second, hour));
        assert!(!periodic_due(50, 0, second, hour), "every_steps = 0: by time only");
        assert!(periodic_due(51, 25, hour, hour));
        assert!(periodic_due(1, 0, hour + second, hour));
    }

    #[test]
    fn a_saved_checkpoint_records_size_timings_and_rotation() {
        let r = SaveReport {
            step: 50,
            dir: "ckpt/step-50".into(),
            bytes: 2_000_000_000,
            seconds: 2.0,
            already_existed: false,
            rotated_out: vec!["ckpt/step-25".into()],
            parts: None,
            write: None,
        };
        let e = saved_event(&r, "periodic", 1_900_000_000, 0.25);
        assert_eq!(
            (e.step, e.kind.as_str(), e.bytes, e.payload_bytes),
            (50, "periodic", Some(2_000_000_000), Some(1_900_000_000))
        );
        assert_eq!((e.snapshot_seconds, e.persist_seconds, e.gb_per_s), (Some(0.25), Some(2.0), Some(1.0)));
        assert_eq!(e.rotated_out, Some(vec!["ckpt/step-25".into()]));
        assert_eq!(e.warning, None);
        assert_eq!((e.optimizer_parts, e.parts_wait_seconds), (None, None), "one process wrote it all");
        let in_parts = SaveReport {
            parts: Some(crate::checkpoint::PartsWritten { ranks: 2, wait_seconds: 0.5, own_bytes: 1 }),
            ..r.clone()
        };
        let e = saved_event(&in_parts, "periodic", 1, 0.0);
        assert_eq!((e.optimizer_parts, e.parts_wait_seconds), (Some(2), Some(0.5)));
        let instant = SaveReport { seconds: 0.0, ..r };
        assert_eq!(saved_event(&instant, "stop", 1, 0.0).gb_per_s, Some(0.0), "no division by zero");
    }
}
