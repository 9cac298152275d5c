//! Push retry timing as pure functions: exponential backoff from
//! `[publish] retry_initial`, capped at `retry_max`, never past the deadline.

use std::time::{Duration, Instant};

/// Wait before attempt `attempt` (1-based; the first attempt does not wait).
pub fn retry_delay(attempt: u32, initial: Duration, max: Duration) -> Duration {
    if attempt <= 1 {
        return Duration::ZERO;
    }
    let factor = 2u32.saturating_pow(attempt - 2);
    initial.saturating_mul(factor).min(max)
}

/// How long to wait before attempt `attempt`, or `None` when that attempt
/// should not happen: attempts exhausted, or the wait plus `min_attempt` (the
/// least time a push needs) would pass the deadline.
pub fn next_wait(
    attempt: u32,
    max_attempts: u32,
    initial: Duration,
    max: Duration,
    now: Instant,
    deadline: Option<Instant>,
    min_attempt: Duration,
) -> Option<Duration> {
    if attempt > max_attempts {
        return None;
    }
    let wait = retry_delay(attempt, initial, max);
    match deadline {
        Some(d) if now + wait + min_attempt > d => None,
        _ => Some(wait),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn delays_double_from_initial_and_are_capped() {
        let delays: Vec<u64> = (1..=8).map(|a| retry_delay(a, S(5), S(300)).as_secs()).collect();
        assert_eq!(delays, vec![0, 5, 10, 20, 40, 80, 160, 300]);
    }

    #[test]
    fn attempts_stop_at_the_maximum() {
        let now = Instant::now();
        assert_eq!(next_wait(5, 5, S(5), S(300), now, None, S(1)), Some(S(40)));
        assert_eq!(next_wait(6, 5, S(5), S(300), now, None, S(1)), None);
    }

    #[test]
    fn no_wait_runs_past_the_deadline() {
        let now = Instant::now();
        let deadline = Some(now + S(10));
        assert_eq!(next_wait(2, 5, S(5), S(300), now, deadline, S(1)), Some(S(5)));
        assert_eq!(next_wait(3, 5, S(5), S(300), now, deadline, S(1)), None);
        assert_eq!(next_wait(1, 5, S(5), S(300), now + S(10), deadline, S(1)), None);
    }
}
