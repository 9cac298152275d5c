//! Per-rank progress from the program, and the watchdog of `exec`
//! (docs/exec.md, "A rank that hangs").
//!
//! ```text
//! the supervisor   binds a Unix datagram socket in a folder of its own
//!                  (mode 0700, node-local temporary storage) before the
//!                  program starts, and names it in REKINDLE_PROGRESS;
//!                  torchrun's local ranks inherit it
//! every rank       rk.step(step) (and should_stop(step), checkpoint(),
//!                  rk.eval_batch(step, batch))
//!                  sends {"rank": R, "step": S, "activity": "step"|"save"|
//!                  "eval", "batch": B} at most once a second, and at once
//!                  when its activity changes: a clock read per call, no
//!                  file, no collective
//! the supervisor   reads them in its event loop ([`Tracker::take`]): the
//!                  task's lowest step goes into its heartbeat (the world's
//!                  sweepers see it), and where this task decides for the
//!                  world (alone, or task 0) [`Tracker::overdue`] finds a rank
//!                  whose step has not moved for `[watchdog] step` (a save
//!                  past `[watchdog] save`, an evaluation whose batch has
//!                  not moved for `[watchdog] eval`): a hang
//! ```
//!
//! A rank is watched from its first report on: the program's start-up and
//! its resume are not timed (a program that never reports is never called
//! hung). The limits are `run`'s ([`crate::attempt::watchdog::limit`]):
//! fixed, or `"auto"`, 20 times the median step time measured from the
//! reports, at least `[watchdog] floor`.
//!
//! Only the program's own user can send: the socket's folder is private.
//! A datagram that is not a report is counted and dropped, never trusted
//! for anything else.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use serde::Deserialize;

use crate::attempt::watchdog::{Activity, limit, median};
use crate::config::WatchdogSection;
use crate::telemetry::HangEvent;

/// The socket's file name inside its private folder.
const SOCKET_NAME: &str = "progress.sock";
/// The longest path a Unix socket address holds (`sun_path`, less the NUL).
const MAX_SOCKET_PATH: usize = 107;
/// The largest report read; a longer datagram is cut and so not a report.
pub const MAX_REPORT: usize = 512;
/// Step times kept for the median.
const STEP_WINDOW: usize = 101;

/// The socket the program's ranks report to, bound before the program starts.
#[derive(Debug)]
pub struct Channel {
    socket: std::os::unix::net::UnixDatagram,
    path: PathBuf,
    /// Removed (with the socket) when the channel goes.
    _folder: tempfile::TempDir,
}

impl Channel {
    /// Binds the socket in a new private folder under the system's temporary
    /// directory (`$TMPDIR`, node-local on a cluster; `/tmp` when that path
    /// is too long for a socket address).
    pub fn open() -> std::io::Result<Channel> {
        use std::os::unix::fs::PermissionsExt;
        let mut builder = tempfile::Builder::new();
        // Only the user may send (a report could hold off the watchdog).
        builder.prefix("rekindle-progress-").permissions(std::fs::Permissions::from_mode(0o700));
        let folder = match builder.tempdir() {
            Ok(f) if f.path().join(SOCKET_NAME).as_os_str().len() <= MAX_SOCKET_PATH => f,
            _ => builder.tempdir_in("/tmp")?,
        };
        let path = folder.path().join(SOCKET_NAME);
        let socket = std::os::unix::net::UnixDatagram::bind(&path)?;
        socket.set_nonblocking(true)?;
        Ok(Channel { socket, path, _folder: folder })
    }

    /// Where the ranks send (`REKINDLE_PROGRESS`).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The socket for the supervisor's event loop (inside its runtime).
    pub fn socket(&self) -> std::io::Result<tokio::net::UnixDatagram> {
        tokio::net::UnixDatagram::from_std(self.socket.try_clone()?)
    }
}

/// How often a rank reports while its activity stays the same
/// (`PROGRESS_SECONDS` of python/rekindle_client.py).
pub const REPORT_INTERVAL: Duration = Duration::from_secs(1);

/// The fixed `[watchdog]` limits that `exec`'s reports cannot honour: one
/// under two report intervals calls a rank hung between two of its
/// reports. Each as `[watchdog] step = 1.5s`, for a warning at the start.
pub fn too_short(cfg: &WatchdogSection) -> Vec<String> {
    if !cfg.enabled {
        return Vec::new();
    }
    [("step", cfg.step), ("eval", cfg.eval), ("save", cfg.save)]
        .into_iter()
        .filter_map(|(name, limit)| match limit {
            crate::config::Limit::Fixed(d) if d < 2 * REPORT_INTERVAL => {
                Some(format!("[watchdog] {name} = {}", humantime::format_duration(d)))
            }
            _ => None,
        })
        .collect()
}

/// One rank's report.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Report {
    pub rank: usize,
    /// The last step this rank completed (`step`), the step it saves
    /// (`save`) or evaluates after (`eval`).
    pub step: u64,
    #[serde(default = "step_activity")]
    pub activity: String,
    /// In an evaluation: the batches evaluated so far (a new count is
    /// progress; it may start over, as for a second dataloader).
    #[serde(default)]
    pub batch: u64,
}

fn step_activity() -> String {
    "step".into()
}

impl Report {
    /// A report from one datagram; `None` for anything else.
    pub fn parse(bytes: &[u8]) -> Option<Report> {
        let report: Report = serde_json::from_slice(bytes).ok()?;
        matches!(report.activity.as_str(), "step" | "save" | "eval").then_some(report)
    }

    fn activity(&self) -> Activity {
        match self.activity.as_str() {
            "save" => Activity::Save,
            "eval" => Activity::Eval,
            _ => Activity::Step,
        }
    }
}

/// What is known of one rank.
#[derive(Debug, Clone, PartialEq)]
struct Rank {
    /// The last step it completed.
    step: u64,
    activity: Activity,
    /// Batches of the evaluation under way.
    batch: u64,
    /// When its step last moved or its activity changed (the supervisor's clock).
    since: Instant,
    since_wall: SystemTime,
}

/// The ranks of this task's program, as their reports say.
#[derive(Debug, Default)]
pub struct Tracker {
    ranks: BTreeMap<usize, Rank>,
    /// Seconds per step, from the reports of every rank.
    step_times: std::collections::VecDeque<Duration>,
    /// Datagrams that were not reports.
    pub dropped: u64,
}

impl Tracker {
    /// Takes in one datagram received at `now`; whether it was a report.
    pub fn take(&mut self, bytes: &[u8], now: Instant) -> bool {
        match Report::parse(bytes) {
            Some(report) => {
                self.observe(&report, now, SystemTime::now());
                true
            }
            None => {
                self.dropped += 1;
                false
            }
        }
    }

    fn observe(&mut self, report: &Report, now: Instant, wall: SystemTime) {
        let activity = report.activity();
        let fresh = Rank { step: report.step, activity, batch: report.batch, since: now, since_wall: wall };
        let Some(rank) = self.ranks.get_mut(&report.rank) else {
            self.ranks.insert(report.rank, fresh);
            return;
        };
        let moved = report.step > rank.step && activity == Activity::Step && rank.activity == Activity::Step;
        if moved {
            let per_step =
                now.saturating_duration_since(rank.since) / (report.step - rank.step).min(u32::MAX as u64) as u32;
            if self.step_times.len() == STEP_WINDOW {
                self.step_times.pop_front();
            }
            self.step_times.push_back(per_step);
        }
        let evaluated = activity == Activity::Eval && rank.activity == Activity::Eval && report.batch != rank.batch;
        // A step that went back is a resume within the program: a new start.
        if moved || evaluated || activity != rank.activity || report.step != rank.step {
            *rank = fresh;
        }
    }

    /// The lowest step any rank of this task completed (its heartbeat's step).
    pub fn lowest_step(&self) -> Option<u64> {
        self.ranks.values().map(|r| r.step).min()
    }

    /// The median step time measured so far (once enough are known).
    pub fn median_step(&self) -> Option<Duration> {
        median(&self.step_times.iter().copied().collect::<Vec<_>>())
    }

    /// The rank that has been stuck longest past its limit at `now`, as the
    /// `hang` event: its step not moved for `[watchdog] step`, or its save
    /// past `[watchdog] save`. `None` when the watchdog is off.
    pub fn overdue(&self, cfg: &WatchdogSection, now: Instant) -> Option<HangEvent> {
        if !cfg.enabled {
            return None;
        }
        let median_step = self.median_step();
        self.ranks
            .iter()
            .filter_map(|(&rank, r)| {
                let stuck = now.saturating_duration_since(r.since);
                let limit = limit(cfg, r.activity, median_step, 1);
                (stuck > limit).then_some((rank, r, stuck, limit))
            })
            .max_by_key(|(_, _, stuck, limit)| *stuck - *limit)
            .map(|(rank, r, stuck, limit)| HangEvent {
                activity: r.activity.name().into(),
                thread: "program".into(),
                // The step it trains, as `run` records: the one after its last.
                step: if r.activity == Activity::Step { r.step + 1 } else { r.step },
                since: chrono::DateTime::<chrono::Utc>::from(r.since_wall)
                    .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                stuck_seconds: stuck.as_secs_f64(),
                limit_seconds: limit.as_secs_f64(),
                rank: Some(rank),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Limit;

    fn cfg(step: u64, save: u64) -> WatchdogSection {
        WatchdogSection {
            step: Limit::Fixed(Duration::from_secs(step)),
            save: Limit::Fixed(Duration::from_secs(save)),
            ..WatchdogSection::default()
        }
    }

    fn report(rank: usize, step: u64, activity: &str) -> Report {
        Report { rank, step, activity: activity.into(), batch: 0 }
    }

    #[test]
    fn only_a_report_is_taken_and_anything_else_is_counted() {
        assert_eq!(Report::parse(br#"{"rank":1,"step":7,"activity":"save"}"#), Some(report(1, 7, "save")));
        assert_eq!(Report::parse(br#"{"rank":0,"step":3}"#), Some(report(0, 3, "step")));
        let mut t = Tracker::default();
        let now = Instant::now();
        for junk in [&b"rank 1 step 2"[..], br#"{"rank":1,"step":-1}"#, br#"{"rank":1,"step":2,"activity":"nap"}"#] {
            assert!(!t.take(junk, now), "{}", String::from_utf8_lossy(junk));
        }
        assert!(!t.take(br#"{"rank":1,"step":2,"extra":true}"#, now), "unknown keys are no report");
        assert_eq!((t.dropped, t.lowest_step()), (4, None));
        assert!(t.take(br#"{"rank":1,"step":2}"#, now));
        assert_eq!(t.lowest_step(), Some(2));
    }

    #[test]
    fn a_rank_whose_step_does_not_move_for_the_limit_is_hung_and_the_others_are_not() {
        let (mut t, t0, wall) = (Tracker::default(), Instant::now(), SystemTime::now());
        let s = Duration::from_secs;
        t.observe(&report(0, 10, "step"), t0, wall);
        t.observe(&report(1, 10, "step"), t0, wall);
        // Rank 0 goes on, rank 1 stays at step 10.
        for i in 1..=5 {
            t.observe(&report(0, 10 + i, "step"), t0 + s(i), wall);
        }
        let cfg = cfg(4, 60);
        assert_eq!(t.overdue(&cfg, t0 + s(4)), None, "at the limit is not past it");
        let hang = t.overdue(&cfg, t0 + s(5)).expect("rank 1 is past its 4 s");
        assert_eq!(
            (hang.rank, hang.step, hang.activity.as_str(), hang.thread.as_str()),
            (Some(1), 11, "step", "program")
        );
        assert_eq!((hang.stuck_seconds, hang.limit_seconds), (5.0, 4.0));
        assert_eq!(t.lowest_step(), Some(10), "the heartbeat carries the slowest rank's step");
        // A repeated report of the same step is no progress.
        t.observe(&report(1, 10, "step"), t0 + s(6), wall);
        assert_eq!(t.overdue(&cfg, t0 + s(6)).and_then(|h| h.rank), Some(1));
        t.observe(&report(1, 11, "step"), t0 + s(6), wall);
        assert_eq!(t.overdue(&cfg, t0 + s(6)), None);
    }

    #[test]
    fn a_save_has_the_save_limit_and_the_step_after_it_starts_the_clock_again() {
        let (mut t, t0, wall) = (Tracker::default(), Instant::now(), SystemTime::now());
        let s = Duration::from_secs;
        let cfg = cfg(4, 30);
        t.observe(&report(0, 20, "step"), t0, wall);
        t.observe(&report(0, 20, "save"), t0 + s(1), wall);
        assert_eq!(t.overdue(&cfg, t0 + s(20)), None, "a save of 19 s is within its 30 s");
        let hang = t.overdue(&cfg, t0 + s(32)).expect("past the save's limit");
        assert_eq!((hang.activity.as_str(), hang.step), ("save", 20));
        t.observe(&report(0, 20, "step"), t0 + s(32), wall);
        assert_eq!(t.overdue(&cfg, t0 + s(35)), None, "the step clock starts when the save ends");
        assert!(t.overdue(&cfg, t0 + s(37)).is_some());
    }

    #[test]
    fn an_evaluation_is_progress_while_its_batches_move_and_has_the_eval_limit() {
        let (mut t, t0, wall) = (Tracker::default(), Instant::now(), SystemTime::now());
        let s = Duration::from_secs;
        let cfg = WatchdogSection { eval: Limit::Fixed(s(3)), ..cfg(4, 60) };
        let batch = |b| Report { batch: b, ..report(0, 100, "eval") };
        t.observe(&report(0, 100, "step"), t0, wall);
        // An evaluation of 20 s, a batch every 2 s: never hung.
        for b in 1..=10u64 {
            t.observe(&batch(b), t0 + s(2 * b), wall);
            assert_eq!(t.overdue(&cfg, t0 + s(2 * b + 2)), None, "batch {b}");
        }
        let hang = t.overdue(&cfg, t0 + s(24)).expect("no batch for 4 s against the 3 s eval limit");
        assert_eq!((hang.activity.as_str(), hang.step), ("eval", 100));
        assert!(Report::parse(br#"{"rank":0,"step":100,"activity":"eval","batch":3}"#).is_some_and(|r| r.batch == 3));
    }

    #[test]
    fn auto_limits_follow_the_measured_step_time_above_the_floor_and_off_means_never() {
        let (mut t, t0, wall) = (Tracker::default(), Instant::now(), SystemTime::now());
        let cfg = WatchdogSection { floor: Duration::from_secs(2), ..WatchdogSection::default() };
        // Ten steps a report, a report a second: 0.1 s a step, 20x is 2 s = the floor.
        for i in 0..8u64 {
            t.observe(&report(0, i * 10, "step"), t0 + Duration::from_secs(i), wall);
        }
        assert_eq!(t.median_step(), Some(Duration::from_millis(100)));
        let last = t0 + Duration::from_secs(7);
        assert_eq!(t.overdue(&cfg, last + Duration::from_millis(1900)), None);
        assert!(t.overdue(&cfg, last + Duration::from_millis(2100)).is_some());
        let off = WatchdogSection { enabled: false, ..cfg };
        assert_eq!(t.overdue(&off, last + Duration::from_secs(3600)), None);
    }

    #[test]
    fn a_rank_that_starts_over_at_an_older_step_is_a_fresh_start_not_a_hang() {
        let (mut t, t0, wall) = (Tracker::default(), Instant::now(), SystemTime::now());
        t.observe(&report(0, 50, "step"), t0, wall);
        t.observe(&report(0, 40, "step"), t0 + Duration::from_secs(3), wall);
        assert_eq!(t.overdue(&cfg(4, 60), t0 + Duration::from_secs(6)), None);
        assert_eq!(t.lowest_step(), Some(40));
    }

    #[test]
    fn limits_under_two_report_intervals_are_named() {
        let short = WatchdogSection { step: Limit::Fixed(Duration::from_millis(1500)), ..cfg(4, 1) };
        assert_eq!(too_short(&short), ["[watchdog] step = 1s 500ms", "[watchdog] save = 1s"]);
        assert!(too_short(&cfg(2, 60)).is_empty());
        assert!(too_short(&WatchdogSection { enabled: false, ..short }).is_empty());
    }

    #[test]
    fn the_channel_is_private_and_carries_a_report() {
        use std::os::unix::fs::PermissionsExt;
        let channel = Channel::open().expect("bind");
        let folder = channel.path().parent().expect("a folder");
        assert_eq!(std::fs::metadata(folder).expect("stat").permissions().mode() & 0o777, 0o700);
        let sender = std::os::unix::net::UnixDatagram::unbound().expect("socket");
        sender.send_to(br#"{"rank":3,"step":9}"#, channel.path()).expect("send");
        let mut buf = [0u8; MAX_REPORT];
        let n = channel.socket.recv(&mut buf).expect("a datagram waits");
        assert_eq!(Report::parse(&buf[..n]), Some(report(3, 9, "step")));
        let path = channel.path().to_path_buf();
        drop(channel);
        assert!(!path.exists(), "the socket and its folder go with the channel");
    }
}
