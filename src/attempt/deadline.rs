//! Deadline arithmetic for the grace period, as pure functions of instants
//! and durations (no clock reads), so every edge is unit-tested.
//!
//! After the first stop signal SLURM sends SIGKILL at `arrival + grace`
//! (the partition's GraceTime, KillWait, or the `--signal=…@N` lead). We aim
//! to be done `safety_margin` earlier: deadline = arrival + grace − margin.
//! Work after the durable checkpoint (publish, requeue) only gets what is left.

use std::time::{Duration, Instant};

/// The moment by which rekindle must have exited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline {
    pub at: Instant,
}

impl Deadline {
    /// Deadline for a signal that arrived at `arrival`.
    pub fn after_signal(arrival: Instant, grace: Duration, safety_margin: Duration) -> Deadline {
        Deadline { at: arrival + grace.saturating_sub(safety_margin) }
    }

    /// Time left at `now` (zero once passed).
    pub fn remaining(&self, now: Instant) -> Duration {
        self.at.saturating_duration_since(now)
    }

    pub fn passed(&self, now: Instant) -> bool {
        now >= self.at
    }

    /// The budget for an optional step (publish, requeue) at `now`: what is
    /// left, capped at `cap`; `None` when less than `minimum` is left, meaning
    /// "skip it".
    pub fn budget(&self, now: Instant, cap: Duration, minimum: Duration) -> Option<Duration> {
        let left = self.remaining(now);
        (left >= minimum).then(|| left.min(cap))
    }
}

/// What to do after the n-th stop signal (1-based).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignalResponse {
    /// First: checkpoint the last completed step, publish, requeue, exit.
    GracefulStop,
    /// Second: logged; the graceful stop continues.
    Logged,
    /// Third or later: fastest safe exit — skip publishing and requeueing;
    /// a checkpoint already being committed is still finished (its rename is
    /// atomic, so stopping mid-way would only waste it).
    ExitNow,
}

/// The response to the `count`-th signal.
pub fn response_to_signal(count: usize) -> SignalResponse {
    match count {
        0 | 1 => SignalResponse::GracefulStop,
        2 => SignalResponse::Logged,
        _ => SignalResponse::ExitNow,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadline_is_grace_minus_margin_after_arrival() {
        let t0 = Instant::now();
        let d = Deadline::after_signal(t0, Duration::from_secs(120), Duration::from_secs(10));
        assert_eq!(d.remaining(t0), Duration::from_secs(110));
        assert_eq!(d.remaining(t0 + Duration::from_secs(100)), Duration::from_secs(10));
        assert!(!d.passed(t0 + Duration::from_secs(109)));
        assert!(d.passed(t0 + Duration::from_secs(110)));
        assert_eq!(d.remaining(t0 + Duration::from_secs(500)), Duration::ZERO);
    }

    #[test]
    fn margin_larger_than_grace_means_deadline_now() {
        let t0 = Instant::now();
        let d = Deadline::after_signal(t0, Duration::from_secs(5), Duration::from_secs(10));
        assert!(d.passed(t0));
    }

    #[test]
    fn budget_is_capped_and_skipped_when_too_small() {
        let t0 = Instant::now();
        let d = Deadline::after_signal(t0, Duration::from_secs(60), Duration::ZERO);
        assert_eq!(d.budget(t0, Duration::from_secs(30), Duration::from_secs(1)), Some(Duration::from_secs(30)));
        assert_eq!(
            d.budget(t0 + Duration::from_secs(50), Duration::from_secs(30), Duration::from_secs(1)),
            Some(Duration::from_secs(10))
        );
        assert_eq!(d.budget(t0 + Duration::from_millis(59_500), Duration::from_secs(30), Duration::from_secs(1)), None);
    }

    #[test]
    fn third_signal_means_exit_now() {
        assert_eq!(response_to_signal(1), SignalResponse::GracefulStop);
        assert_eq!(response_to_signal(2), SignalResponse::Logged);
        assert_eq!(response_to_signal(3), SignalResponse::ExitNow);
        assert_eq!(response_to_signal(9), SignalResponse::ExitNow);
    }
}
