//! Who may take the run-directory lock over, as pure functions of what the
//! lock file says and what this process watched ([`takeover`],
//! [`unreadable`]), and the timings that follow from the stale timeout
//! ([`heartbeat_every`], [`check_every`], [`marker_break_after`]). The rules
//! and why they hold are in the parent module's header; the file protocol
//! that acts on a verdict is there too. Nothing here touches a disk or a
//! process: liveness comes in as a function, time as numbers.

use std::time::Duration;

use super::LockInfo;

/// A stale timeout recorded in a lock file above this is ignored as bogus.
const MAX_RECORDED_STALE_AFTER: f64 = 86_400.0;

/// How often the holder rewrites its heartbeat: a sixth of the stale timeout,
/// at most 10 s, so five heartbeats in a row can be late before it looks dead.
pub fn heartbeat_every(stale_after: Duration) -> Duration {
    (stale_after / 6).min(Duration::from_secs(10))
}

/// How often the holder reads the lock to see whether it is still its own
/// (and how often a waiting contender polls): at most every second.
pub fn check_every(stale_after: Duration) -> Duration {
    heartbeat_every(stale_after).min(Duration::from_secs(1))
}

/// How long a marker must sit unchanged before its maker counts as crashed:
/// a third of the stale timeout. Shorter than the stale timeout minus a
/// heartbeat, so a holder blocked by a crashed contender's marker breaks it
/// and heartbeats again before it could look stale itself.
pub fn marker_break_after(stale_after: Duration) -> Duration {
    stale_after / 3
}

impl LockInfo {
    /// The stale timeout that applies to this lock: the longer of `mine` and
    /// the holder's own (when it recorded a sensible one).
    pub fn stale_limit(&self, mine: Duration) -> Duration {
        self.recorded_stale_after().map_or(mine, |theirs| mine.max(theirs))
    }

    /// The stale timeout the holder recorded, when it is a sensible one.
    pub fn recorded_stale_after(&self) -> Option<Duration> {
        self.stale_after_s
            .filter(|s| s.is_finite() && *s > 0.0 && *s <= MAX_RECORDED_STALE_AFTER)
            .map(Duration::from_secs_f64)
    }

    /// Seconds since the heartbeat by the clock of `now`.
    pub fn age(&self, now: f64) -> f64 {
        now - self.heartbeat
    }
}

/// Who is asking for the lock, and when.
#[derive(Debug, Clone)]
pub struct Claimant {
    pub job_id: Option<String>,
    pub host: String,
    pub restart_count: u32,
    /// The job step this process runs in (`SLURM_STEP_ID`).
    pub step_id: Option<String>,
    /// Nodes the batch shell excluded from this allocation's steps after
    /// they were lost (in-job restarts, `slurm::injob`).
    pub excluded: Vec<String>,
    /// Unix seconds by this host's clock.
    pub now: f64,
}

/// What to do about a lock someone else holds.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// The holder is provably gone: take the lock over (why).
    TakeOver(String),
    /// An earlier attempt of this job on another node, heartbeat still fresh:
    /// watch it go stale (why).
    Wait(String),
    /// The holder is alive: keep out.
    Live,
}

/// Whether the lock `held` may be taken over by `me`. `holder_alive` says
/// whether the holder's process exists on this host (asked only for a lock of
/// this host); `unchanged_for` is how long this process has watched the lock
/// file's bytes stay the same, by its monotonic clock.
pub fn takeover(
    held: &LockInfo,
    me: &Claimant,
    holder_alive: impl Fn(&LockInfo) -> bool,
    stale_after: Duration,
    unchanged_for: Duration,
) -> Verdict {
    if held.host == me.host {
        return if holder_alive(held) {
            Verdict::Live
        } else {
            Verdict::TakeOver(format!("its process {} on this host is gone", held.pid))
        };
    }
    let limit = held.stale_limit(stale_after);
    let age = held.age(me.now);
    if age > limit.as_secs_f64() {
        return Verdict::TakeOver(format!(
            "its heartbeat on {} is {age:.0}s old by this node's clock (stale after {:.0}s)",
            held.host,
            limit.as_secs_f64()
        ));
    }
    if unchanged_for >= limit {
        return Verdict::TakeOver(format!(
            "its heartbeat on {} has not moved for {:.0}s (stale after {:.0}s; its clock may differ from ours)",
            held.host,
            unchanged_for.as_secs_f64(),
            limit.as_secs_f64()
        ));
    }
    let same_job = held.job_id.is_some() && held.job_id == me.job_id;
    // An earlier step of this very allocation (an in-job restart): its node
    // was lost when the batch shell excluded it, and a heartbeat that stopped
    // moving for two beats confirms the holder is gone with it.
    let earlier_step = held.step_id.is_some() && held.step_id != me.step_id;
    if same_job && held.restart_count == Some(me.restart_count) && earlier_step {
        let beats = 2 * heartbeat_every(limit);
        if me.excluded.contains(&held.host) && unchanged_for >= beats {
            return Verdict::TakeOver(format!(
                "its node {} was lost: the batch shell excluded it from this job's steps, and its heartbeat has not \
                 moved for {:.0}s (two beats)",
                held.host,
                unchanged_for.as_secs_f64()
            ));
        }
        return Verdict::Wait(format!(
            "it belongs to an earlier step ({}) of this job on {}, whose heartbeat is {age:.0}s old; waiting up to \
             {:.0}s for it to go stale{}",
            held.step_id.as_deref().unwrap_or_default(),
            held.host,
            limit.as_secs_f64(),
            if me.excluded.contains(&held.host) { " or to stop moving for two beats" } else { "" }
        ));
    }
    // An old lock file has no restart count: it may be an earlier attempt.
    let earlier = held.restart_count.is_none_or(|theirs| theirs < me.restart_count);
    if same_job && earlier {
        return Verdict::Wait(format!(
            "it belongs to an earlier attempt of this job ({}) on {}, whose heartbeat is {age:.0}s old: SLURM \
             requeued the job without that node, which may still be running it; waiting up to {:.0}s for its \
             heartbeat to go stale",
            held.job_id.as_deref().unwrap_or_default(),
            held.host,
            limit.as_secs_f64()
        ));
    }
    Verdict::Live
}

/// What to do about a lock file that does not parse (never written torn by
/// this module: a damaged file, or a foreign one): take it over once it has
/// not changed for the stale timeout, else watch it.
pub fn unreadable(unchanged_for: Duration, stale_after: Duration) -> Verdict {
    if unchanged_for >= stale_after {
        Verdict::TakeOver(format!("it is unreadable and has not changed for {:.0}s", unchanged_for.as_secs_f64()))
    } else {
        Verdict::Wait(format!(
            "it is unreadable; waiting up to {:.0}s to see whether a live holder rewrites it",
            stale_after.as_secs_f64()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(host: &str, pid: u32, job: Option<&str>, heartbeat: f64) -> LockInfo {
        LockInfo {
            token: "t".into(),
            job_id: job.map(Into::into),
            host: host.into(),
            pid,
            heartbeat,
            restart_count: Some(0),
            ..LockInfo::default()
        }
    }

    fn me(host: &str, job: Option<&str>, now: f64) -> Claimant {
        Claimant {
            job_id: job.map(Into::into),
            host: host.into(),
            restart_count: 0,
            step_id: Some("0".into()),
            excluded: Vec::new(),
            now,
        }
    }

    fn requeued(host: &str, job: &str, now: f64) -> Claimant {
        Claimant { restart_count: 1, ..me(host, Some(job), now) }
    }

    const STALE: Duration = Duration::from_secs(60);
    const NEVER: Duration = Duration::ZERO;
    fn alive(_: &LockInfo) -> bool {
        true
    }
    fn dead(_: &LockInfo) -> bool {
        false
    }

    fn takes_over(v: &Verdict) -> bool {
        matches!(v, Verdict::TakeOver(_))
    }

    #[test]
    fn live_lock_on_other_host_with_fresh_heartbeat_is_respected() {
        let v = takeover(&held("n1", 10, Some("5"), 100.0), &me("n2", Some("6"), 110.0), alive, STALE, NEVER);
        assert_eq!(v, Verdict::Live);
    }

    #[test]
    fn same_host_is_judged_by_the_process_alone() {
        let lock = held("n1", 10, None, 100.0);
        let v = takeover(&lock, &me("n1", None, 101.0), dead, STALE, NEVER);
        assert_eq!(v, Verdict::TakeOver("its process 10 on this host is gone".into()));
        assert_eq!(takeover(&lock, &me("n1", None, 101.0), alive, STALE, NEVER), Verdict::Live);
        // A live process with a heartbeat long stale (a hung process) is still live.
        assert_eq!(takeover(&lock, &me("n1", None, 10_000.0), alive, STALE, STALE * 2), Verdict::Live);
    }

    #[test]
    fn a_live_holder_with_the_same_job_id_on_this_host_is_refused() {
        // Two tasks of one job, or a second run inside the same allocation.
        let lock = held("n1", 10, Some("42"), 100.0);
        assert_eq!(takeover(&lock, &me("n1", Some("42"), 101.0), alive, STALE, NEVER), Verdict::Live);
        assert_eq!(takeover(&lock, &requeued("n1", "42", 101.0), alive, STALE, NEVER), Verdict::Live);
    }

    #[test]
    fn an_earlier_attempt_of_this_job_on_another_node_is_waited_for_not_taken_over() {
        let lock = held("n1", 10, Some("42"), 100.0);
        let v = takeover(&lock, &requeued("n2", "42", 101.0), alive, STALE, NEVER);
        assert!(matches!(&v, Verdict::Wait(why) if why.contains("earlier attempt of this job (42) on n1")), "{v:?}");
        // Stale by our clock, or unchanged for the timeout as we watched: taken over.
        assert!(takes_over(&takeover(&lock, &requeued("n2", "42", 161.0), alive, STALE, NEVER)));
        assert!(takes_over(&takeover(&lock, &requeued("n2", "42", 101.0), alive, STALE, STALE)));
        // An old lock file without a restart count may be an earlier attempt.
        let old = LockInfo { restart_count: None, ..lock.clone() };
        assert!(matches!(takeover(&old, &me("n2", Some("42"), 101.0), alive, STALE, NEVER), Verdict::Wait(_)));
    }

    #[test]
    fn the_same_or_a_later_attempt_of_this_job_on_another_node_is_live() {
        // Same restart count: another task of the same attempt, not an earlier one.
        let lock = held("n1", 10, Some("42"), 100.0);
        assert_eq!(takeover(&lock, &me("n2", Some("42"), 101.0), alive, STALE, NEVER), Verdict::Live);
        let later = LockInfo { restart_count: Some(3), ..lock };
        assert_eq!(takeover(&later, &requeued("n2", "42", 101.0), alive, STALE, NEVER), Verdict::Live);
    }

    #[test]
    fn stale_heartbeat_on_another_host_is_taken_over() {
        let lock = held("n1", 10, None, 100.0);
        assert!(takes_over(&takeover(&lock, &me("n2", None, 161.0), alive, STALE, NEVER)));
        assert_eq!(takeover(&lock, &me("n2", None, 159.0), alive, STALE, NEVER), Verdict::Live);
    }

    #[test]
    fn a_holder_clock_running_ahead_is_judged_by_what_we_watched() {
        // Its heartbeat is an hour in our future: by our clock it never ages.
        let lock = held("n1", 10, None, 3700.0);
        assert_eq!(takeover(&lock, &me("n2", None, 100.0), alive, STALE, STALE / 2), Verdict::Live);
        let v = takeover(&lock, &me("n2", None, 100.0), alive, STALE, STALE);
        assert!(matches!(&v, Verdict::TakeOver(why) if why.contains("has not moved for 60s")), "{v:?}");
    }

    #[test]
    fn a_holder_clock_running_behind_by_less_than_the_timeout_is_not_stale() {
        // Written 50 s "ago" by our clock because its clock is 50 s behind:
        // still inside the timeout, and it moved as we watched.
        let lock = held("n1", 10, None, 50.0);
        assert_eq!(takeover(&lock, &me("n2", None, 100.0), alive, STALE, NEVER), Verdict::Live);
    }

    #[test]
    fn the_longer_of_both_timeouts_applies() {
        let lock = LockInfo { stale_after_s: Some(120.0), ..held("n1", 10, None, 100.0) };
        assert_eq!(takeover(&lock, &me("n2", None, 200.0), alive, STALE, NEVER), Verdict::Live);
        assert!(takes_over(&takeover(&lock, &me("n2", None, 221.0), alive, STALE, NEVER)));
        // A bogus recorded timeout is ignored.
        for bogus in [f64::NAN, -1.0, f64::INFINITY, 1e300] {
            let lock = LockInfo { stale_after_s: Some(bogus), ..held("n1", 10, None, 100.0) };
            assert_eq!(lock.stale_limit(STALE), STALE);
        }
    }

    #[test]
    fn an_unreadable_lock_is_taken_over_once_it_stayed_the_same_for_the_timeout() {
        assert!(matches!(unreadable(STALE / 2, STALE), Verdict::Wait(_)));
        assert!(takes_over(&unreadable(STALE, STALE)));
    }

    #[test]
    fn timings_follow_the_stale_timeout() {
        assert_eq!(heartbeat_every(STALE), Duration::from_secs(10));
        assert_eq!(check_every(STALE), Duration::from_secs(1));
        assert_eq!(marker_break_after(STALE), Duration::from_secs(20));
        let short = Duration::from_secs(3);
        assert_eq!(heartbeat_every(short), Duration::from_millis(500));
        assert_eq!(check_every(short), Duration::from_millis(500));
        // The ten-minute timeout still heartbeats every 10 s.
        assert_eq!(heartbeat_every(Duration::from_secs(600)), Duration::from_secs(10));
    }

    /// Property tests over arbitrary and mutated lock files; see `crate::fuzz`.
    mod fuzz {
        use super::*;
        use crate::fuzz;
        use crate::rundir::lock::holder_alive;
        use proptest::prelude::*;

        fn valid() -> Vec<u8> {
            let info = LockInfo {
                token: "n1-4242-1700000000.5".into(),
                job_id: Some("77".into()),
                host: "n1".into(),
                pid: 4242,
                heartbeat: 1_700_000_000.5,
                started: 1_699_999_000.25,
                ..LockInfo::default()
            };
            serde_json::to_vec_pretty(&info).unwrap()
        }

        fn check(bytes: &[u8]) {
            if let Some(held) = LockInfo::parse(bytes) {
                for (host, job, now) in [("n1", Some("77"), 1e9), ("n2", None, f64::MAX), ("n1", None, -1.0)] {
                    let _ = takeover(&held, &me(host, job, now), |_| true, STALE, Duration::ZERO);
                    let _ = takeover(&held, &me(host, job, now), holder_alive, STALE, STALE);
                }
            }
        }

        proptest! {
            #![proptest_config(fuzz::config())]

            #[test]
            fn arbitrary_bytes_are_a_lock_or_none(bytes in fuzz::bytes(256)) {
                check(&bytes);
            }

            #[test]
            fn mutated_lock_files_are_a_lock_or_none(bytes in fuzz::mutated(valid())) {
                check(&bytes);
            }
        }
    }

    fn in_earlier_step(host: &str, job: &str, heartbeat: f64) -> LockInfo {
        LockInfo { step_id: Some("0".into()), ..held(host, 10, Some(job), heartbeat) }
    }

    fn next_step(host: &str, job: &str, now: f64, excluded: &[&str]) -> Claimant {
        Claimant {
            step_id: Some("1".into()),
            excluded: excluded.iter().map(|s| s.to_string()).collect(),
            ..me(host, Some(job), now)
        }
    }

    #[test]
    fn an_earlier_step_on_a_node_the_batch_shell_excluded_is_taken_over_once_its_beat_stops() {
        let lock = in_earlier_step("n1", "7", 100.0);
        let me = next_step("n3", "7", 105.0, &["n1"]);
        let two_beats = 2 * heartbeat_every(STALE);
        assert!(matches!(takeover(&lock, &me, alive, STALE, two_beats / 2), Verdict::Wait(_)));
        let v = takeover(&lock, &me, alive, STALE, two_beats);
        assert!(matches!(&v, Verdict::TakeOver(why) if why.contains("node n1 was lost")), "{v:?}");
    }

    #[test]
    fn an_earlier_step_on_a_node_still_in_the_job_is_waited_for_not_refused() {
        let lock = in_earlier_step("n1", "7", 100.0);
        let me = next_step("n3", "7", 105.0, &["n2"]);
        let v = takeover(&lock, &me, alive, STALE, STALE / 2);
        assert!(matches!(&v, Verdict::Wait(why) if why.contains("earlier step (0)")), "{v:?}");
        assert!(takes_over(&takeover(&lock, &me, alive, STALE, STALE)), "it goes stale like any holder");
        let other_job = next_step("n3", "8", 105.0, &["n1"]);
        assert_eq!(takeover(&lock, &other_job, alive, STALE, STALE / 2), Verdict::Live);
    }
}
