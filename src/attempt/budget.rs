//! How the time left after a stop signal is shared out, as pure functions of
//! instants (no clock reads): the deadline of a stop, when to skip straight
//! to the exit, what the requeue step may use (a reserve kept back for
//! publishing), what publishing may use (bounded further once SLURM has
//! accepted a requeue and will kill the job), and what one `scontrol` call
//! may take. See `deadline.rs` for the deadline itself.

use std::time::{Duration, Instant};

use crate::attempt::deadline::{Deadline, SignalResponse, response_to_signal};
use crate::attempt::stop::StopReason;

/// Time kept back from the requeue step for publishing, at most: enough for
/// its local commit (milliseconds), so a hanging `scontrol` still leaves a
/// commit for the next attempt to push. Small, because the requeue matters
/// more and each `scontrol` call needs its time.
pub const PUBLISH_RESERVE: Duration = Duration::from_secs(1);

/// Longest publishing may take once SLURM has accepted a requeue. After
/// `scontrol requeue` SLURM ends the job: SIGTERM to its processes, SIGKILL
/// `KillWait` later (SLURM's default 30 s; 20 s on the local test cluster;
/// rekindle cannot know the cluster's value without another `scontrol` call).
/// Half the default leaves the records time to be written before the kill.
pub const PUBLISH_AFTER_REQUEUE: Duration = Duration::from_secs(15);

/// Longest a single `scontrol` call may take.
pub const SCONTROL_TIMEOUT: Duration = Duration::from_secs(10);

/// Below this, an `scontrol` call is not even started.
pub const SCONTROL_MINIMUM: Duration = Duration::from_millis(200);

/// The deadline of a stop: a signal's grace period (less the safety margin)
/// from its arrival; `--stop-at-step` has none.
pub fn stop_deadline(reason: StopReason, grace: Duration, margin: Duration) -> Option<Deadline> {
    match reason {
        StopReason::Signal(s) => Some(Deadline::after_signal(s.arrival, grace, margin)),
        StopReason::StopAtStep => None,
    }
}

/// True when the fastest safe exit is due: a third signal, or the deadline passed.
pub fn exit_now(signals: usize, deadline: Option<Deadline>, now: Instant) -> bool {
    response_to_signal(signals) == SignalResponse::ExitNow || deadline.is_some_and(|d| d.passed(now))
}

/// The deadline of the requeue step: it comes before publishing (the requeue
/// is what brings the job back; a published commit is a copy of the
/// records), but a hanging `scontrol` must not starve publishing of the few
/// milliseconds its local commit needs, so a tenth of the time left is kept
/// back, at most [`PUBLISH_RESERVE`].
pub fn requeue_deadline(deadline: Option<Deadline>, now: Instant) -> Option<Deadline> {
    deadline.map(|d| {
        let reserve = (d.remaining(now) / 10).min(PUBLISH_RESERVE);
        Deadline { at: d.at.checked_sub(reserve).unwrap_or(d.at) }
    })
}

/// The deadline for publishing: the stop's deadline, and, when SLURM accepted
/// a requeue at `requeued_at`, at most [`PUBLISH_AFTER_REQUEUE`] after it
/// (SLURM's SIGKILL follows the requeue by `KillWait`, whatever our deadline
/// says). `--stop-at-step` never requeues, so it keeps no deadline.
pub fn publish_deadline(deadline: Option<Deadline>, requeued_at: Option<Instant>) -> Option<Deadline> {
    let after_requeue = requeued_at.map(|t| Deadline { at: t + PUBLISH_AFTER_REQUEUE });
    match (deadline, after_requeue) {
        (Some(d), Some(r)) => Some(if r.at < d.at { r } else { d }),
        (d, r) => d.or(r),
    }
}

/// True when publishing is to be skipped after the requeue step: a third
/// signal or a passed deadline, as for [`exit_now`], except that once SLURM
/// accepted our requeue only the signals received *before* the requeue
/// count: the SIGTERMs that follow (to the step, and forwarded by the batch
/// shell) are SLURM ending the job we asked it to end, bounded by its
/// SIGKILL and [`PUBLISH_AFTER_REQUEUE`], not a request to quit at once.
pub fn skip_publish(
    signals_before_requeue: usize,
    signals_now: usize,
    requeued: bool,
    deadline: Option<Deadline>,
    now: Instant,
) -> bool {
    let counted = if requeued { signals_before_requeue } else { signals_now };
    exit_now(counted, deadline, now)
}

/// The time one `scontrol` call may take at `now`: what is left (capped at
/// [`SCONTROL_TIMEOUT`]); `None` when less than [`SCONTROL_MINIMUM`] is left.
/// Without a deadline, the cap.
pub fn scontrol_timeout(deadline: Option<Deadline>, now: Instant) -> Option<Duration> {
    match deadline {
        Some(d) => d.budget(now, SCONTROL_TIMEOUT, SCONTROL_MINIMUM),
        None => Some(SCONTROL_TIMEOUT),
    }
}

/// Seconds left before the deadline (`None` without one), as the records write them.
pub fn seconds_left(deadline: Option<Deadline>, now: Instant) -> Option<f64> {
    deadline.map(|d| d.remaining(now).as_secs_f64())
}

/// Time left before the SLURM job's end time (`SLURM_JOB_END_TIME`, Unix
/// seconds) at `now_unix`: `None` without one, zero once it has passed.
pub fn job_time_left(end_time: Option<i64>, now_unix: i64) -> Option<Duration> {
    end_time.map(|end| Duration::from_secs(u64::try_from(end.saturating_sub(now_unix)).unwrap_or(0)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attempt::stop::{SignalStop, StopSignal};

    const S: fn(u64) -> Duration = Duration::from_secs;

    fn deadline_in(t0: Instant, secs: u64) -> Option<Deadline> {
        Some(Deadline { at: t0 + S(secs) })
    }

    #[test]
    fn a_signal_has_a_deadline_and_stop_at_step_none() {
        let t0 = Instant::now();
        let term = SignalStop { signal: StopSignal::Term, arrival: t0, sender: None };
        let d = stop_deadline(StopReason::Signal(term), S(60), S(10)).unwrap();
        assert_eq!(d.remaining(t0), S(50));
        assert_eq!(stop_deadline(StopReason::StopAtStep, S(60), S(10)), None);
    }

    #[test]
    fn the_third_signal_or_a_passed_deadline_means_exit_now() {
        let t0 = Instant::now();
        assert!(!exit_now(1, deadline_in(t0, 5), t0));
        assert!(!exit_now(2, deadline_in(t0, 5), t0));
        assert!(exit_now(3, deadline_in(t0, 5), t0));
        assert!(exit_now(1, deadline_in(t0, 5), t0 + S(5)));
        assert!(!exit_now(1, None, t0 + S(500)), "no deadline never passes");
        assert!(exit_now(3, None, t0));
    }

    #[test]
    fn the_requeue_leaves_a_tenth_of_the_time_for_publishing_at_most_the_reserve() {
        let t0 = Instant::now();
        // 60 s left: a tenth is 6 s, capped at the 1 s reserve.
        assert_eq!(requeue_deadline(deadline_in(t0, 60), t0).unwrap().remaining(t0), S(59));
        // 5 s left: a tenth (0.5 s) is kept.
        let ms = Duration::from_millis;
        assert_eq!(requeue_deadline(deadline_in(t0, 5), t0).unwrap().remaining(t0), ms(4_500));
        // Passed: nothing to share, the deadline stays.
        let d = deadline_in(t0, 1);
        assert_eq!(requeue_deadline(d, t0 + S(2)), d);
        assert_eq!(requeue_deadline(None, t0), None);
    }

    #[test]
    fn publishing_after_an_accepted_requeue_ends_before_slurm_kills_the_job() {
        let t0 = Instant::now();
        // Not requeued: the stop's own deadline.
        assert_eq!(publish_deadline(deadline_in(t0, 100), None), deadline_in(t0, 100));
        // Requeued at t0 + 2 s with 100 s left: SLURM's kill comes first.
        let d = publish_deadline(deadline_in(t0, 100), Some(t0 + S(2))).unwrap();
        assert_eq!(d.remaining(t0), S(2) + PUBLISH_AFTER_REQUEUE);
        // Requeued with only 4 s left: the stop's deadline comes first.
        assert_eq!(publish_deadline(deadline_in(t0, 4), Some(t0)), deadline_in(t0, 4));
        assert_eq!(publish_deadline(None, None), None);
        assert_eq!(publish_deadline(None, Some(t0)).unwrap().remaining(t0), PUBLISH_AFTER_REQUEUE);
    }

    #[test]
    fn signals_after_an_accepted_requeue_do_not_skip_publishing_a_passed_deadline_does() {
        let t0 = Instant::now();
        let d = deadline_in(t0, 10);
        // One signal before the requeue, two more from SLURM's kill after it.
        assert!(!skip_publish(1, 3, true, d, t0));
        // The same three signals without a requeue: a third means exit now.
        assert!(skip_publish(1, 3, false, d, t0));
        assert!(!skip_publish(1, 2, false, d, t0));
        // A third signal before the requeue, or a passed deadline, skips either way.
        assert!(skip_publish(3, 3, true, d, t0));
        assert!(skip_publish(1, 1, true, d, t0 + S(10)));
        assert!(!skip_publish(1, 1, true, None, t0 + S(500)));
    }

    #[test]
    fn an_scontrol_call_gets_what_is_left_capped_and_none_below_the_minimum() {
        let t0 = Instant::now();
        assert_eq!(scontrol_timeout(deadline_in(t0, 60), t0), Some(SCONTROL_TIMEOUT));
        assert_eq!(scontrol_timeout(deadline_in(t0, 3), t0), Some(S(3)));
        assert_eq!(scontrol_timeout(deadline_in(t0, 3), t0 + Duration::from_millis(2_900)), None);
        assert_eq!(scontrol_timeout(None, t0), Some(SCONTROL_TIMEOUT));
    }

    #[test]
    fn the_job_time_left_counts_down_to_its_end_time() {
        assert_eq!(job_time_left(Some(1_790_003_600), 1_790_000_000), Some(S(3600)));
        assert_eq!(job_time_left(Some(1_790_000_000), 1_790_000_500), Some(S(0)));
        assert_eq!(job_time_left(None, 1_790_000_000), None);
    }

    #[test]
    fn seconds_left_is_none_without_a_deadline_and_zero_once_passed() {
        let t0 = Instant::now();
        assert_eq!(seconds_left(deadline_in(t0, 4), t0), Some(4.0));
        assert_eq!(seconds_left(deadline_in(t0, 4), t0 + S(9)), Some(0.0));
        assert_eq!(seconds_left(None, t0), None);
    }
}
