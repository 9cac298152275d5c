//! The watchdog: a step, an evaluation, a checkpoint save or a publish that
//! runs far longer than it should is a hang (a stuck collective, a dead NFS
//! server, a deadlocked data loader), and a hung job must not sit on its
//! allocation until the time limit.
//!
//! The threads that do the work publish what they are doing ([`Beats`]: one
//! slot per worker thread, "activity X since T at step S", behind a mutex
//! taken twice per activity); the watchdog is its own thread (no async
//! runtime near training) that looks every [`poll_interval`] and, when an
//! activity is past its limit ([`overdue`]), hands the [`Hang`] to the
//! handler it was given, once. The handler (`run/hang.rs`) records, attempts
//! a checkpoint, requeues and exits the process: it cannot join a stuck
//! thread. The limits are pure functions ([`limit`], [`auto_limit`]) of the
//! config and the median step time measured in this attempt.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use crate::config::{Limit, WatchdogSection};

/// What a thread can be stuck in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activity {
    Step,
    Eval,
    Save,
    Publish,
}

impl Activity {
    /// The name in logs and the `hang` event.
    pub fn name(self) -> &'static str {
        match self {
            Activity::Step => "step",
            Activity::Eval => "eval",
            Activity::Save => "save",
            Activity::Publish => "publish",
        }
    }
}

/// The threads whose activities are watched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Worker {
    /// The training thread: steps, evaluations, synchronous saves, publishing.
    Training,
    /// The background persister: periodic saves.
    Persister,
}

impl Worker {
    pub fn name(self) -> &'static str {
        match self {
            Worker::Training => "training",
            Worker::Persister => "persister",
        }
    }

    fn slot(self) -> usize {
        match self {
            Worker::Training => 0,
            Worker::Persister => 1,
        }
    }
}

/// An activity under way.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Busy {
    pub worker: Worker,
    pub activity: Activity,
    /// The training step it concerns (the step being trained, evaluated after, saved).
    pub step: u64,
    pub since: Instant,
    /// `since` on the wall clock, for the records.
    pub since_wall: SystemTime,
}

/// An activity past its limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hang {
    pub busy: Busy,
    pub limit: Duration,
    pub stuck_for: Duration,
}

/// Steps measured before "auto" limits use the median step time: the first
/// steps include start-up work (allocation, kernel compilation) and one
/// sample is no median. Until then "auto" means the floor.
pub const MIN_MEASURED_STEPS: usize = 5;

/// How many recent step times the median is taken over.
const STEP_WINDOW: usize = 101;

/// "auto" limits are this many median step times (see [`auto_limit`]).
pub const AUTO_FACTOR: u32 = 20;

/// Saves and publishes get this many floors under "auto".
pub const SLOW_IO_FLOORS: u32 = 3;

/// The "auto" limit of `activity`. A healthy step rarely takes more than a
/// few times the median (data-loader hiccups, a checkpoint snapshot, GC on
/// the host), so 20× is far out of the normal range yet catches a collective
/// stuck for minutes; the floor (default 10 min) covers the first steps
/// (compilation, cold caches) and tiny models whose steps take milliseconds.
/// An evaluation runs `eval_batches` forward passes, each cheaper than a
/// step, so 20× the median per batch is generous. A save or a publish does
/// not scale with the step time but with bytes and a remote: three floors
/// (default 30 min) is hundreds of GB at the slowest shared filesystem we
/// measured, or a push with all its retries.
pub fn auto_limit(activity: Activity, median_step: Option<Duration>, floor: Duration, eval_batches: usize) -> Duration {
    let scaled = median_step.map(|m| m * AUTO_FACTOR).unwrap_or_default();
    match activity {
        Activity::Step => scaled.max(floor),
        Activity::Eval => (scaled * eval_batches.max(1) as u32).max(floor),
        Activity::Save | Activity::Publish => scaled.max(floor * SLOW_IO_FLOORS),
    }
}

/// The limit of `activity` under `cfg`: its fixed duration, or [`auto_limit`].
pub fn limit(
    cfg: &WatchdogSection,
    activity: Activity,
    median_step: Option<Duration>,
    eval_batches: usize,
) -> Duration {
    let configured = match activity {
        Activity::Step => cfg.step,
        Activity::Eval => cfg.eval,
        Activity::Save => cfg.save,
        Activity::Publish => cfg.publish,
    };
    match configured {
        Limit::Fixed(d) => d,
        Limit::Auto => auto_limit(activity, median_step, cfg.floor, eval_batches),
    }
}

/// The median of `times` once at least [`MIN_MEASURED_STEPS`] are known.
pub fn median(times: &[Duration]) -> Option<Duration> {
    if times.len() < MIN_MEASURED_STEPS {
        return None;
    }
    let mut sorted = times.to_vec();
    sorted.sort();
    Some(sorted[sorted.len() / 2])
}

/// The activity that has been running longest past its limit, if any.
pub fn overdue(busy: &[Busy], limit_of: impl Fn(Activity) -> Duration, now: Instant) -> Option<Hang> {
    busy.iter()
        .filter_map(|b| {
            let stuck_for = now.saturating_duration_since(b.since);
            let limit = limit_of(b.activity);
            (stuck_for > limit).then_some(Hang { busy: *b, limit, stuck_for })
        })
        .max_by_key(|h| h.stuck_for - h.limit)
}

/// How often the watchdog looks: a tenth of the shortest fixed limit, between
/// 50 ms and 1 s (a hang is noticed at most that late; looking costs a mutex).
pub fn poll_interval(cfg: &WatchdogSection) -> Duration {
    [cfg.step, cfg.eval, cfg.save, cfg.publish]
        .into_iter()
        .filter_map(|l| match l {
            Limit::Fixed(d) => Some(d / 10),
            Limit::Auto => None,
        })
        .chain([cfg.floor / 10])
        .min()
        .unwrap_or(Duration::from_secs(1))
        .clamp(Duration::from_millis(50), Duration::from_secs(1))
}

#[derive(Debug, Default)]
struct State {
    slots: [Option<Busy>; 2],
    step_times: VecDeque<Duration>,
    newest_committed: Option<u64>,
    commits: u64,
    progress: Progress,
}

/// Where training stands, as the training thread last published it: what the
/// watchdog writes into `summary.json` when it ends a hung attempt.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Progress {
    /// Steps completed.
    pub step: u64,
    pub last_loss: Option<f64>,
    pub best_loss: Option<f64>,
}

/// What the watched threads are doing, shared with the watchdog.
#[derive(Debug, Clone, Default)]
pub struct Beats {
    state: Arc<Mutex<State>>,
}

impl Beats {
    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave it inconsistent (plain stores).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `worker` starts `activity` for `step`; it ends when the guard drops.
    /// A completed [`Activity::Step`] adds its time to the median's window.
    pub fn begin(&self, worker: Worker, activity: Activity, step: u64) -> BusyGuard {
        let busy = Busy { worker, activity, step, since: Instant::now(), since_wall: SystemTime::now() };
        self.state().slots[worker.slot()] = Some(busy);
        BusyGuard { beats: self.clone(), busy }
    }

    /// What is under way now.
    pub fn busy(&self) -> Vec<Busy> {
        self.state().slots.iter().flatten().copied().collect()
    }

    /// A checkpoint of `step` is committed (by either thread, or resumed
    /// from): what the watchdog falls back on when training is stuck. Set
    /// by the persister itself, so a save that finished while the training
    /// thread hangs still counts.
    pub fn committed(&self, step: u64) {
        let mut state = self.state();
        state.newest_committed = Some(state.newest_committed.map_or(step, |s| s.max(step)));
        state.commits += 1;
    }

    /// The attempt resumed from a checkpoint of `step` (not written by it).
    pub fn resumed_from(&self, step: u64) {
        let mut state = self.state();
        state.newest_committed = Some(state.newest_committed.map_or(step, |s| s.max(step)));
        state.progress.step = step;
    }

    /// The newest committed step: resumed from or [`committed`](Self::committed).
    pub fn newest_committed(&self) -> Option<u64> {
        self.state().newest_committed
    }

    /// Checkpoints committed in this attempt (a save that replaced one of the
    /// same step counts too).
    pub fn commits(&self) -> u64 {
        self.state().commits
    }

    /// The training thread completed a step.
    pub fn progressed(&self, progress: Progress) {
        self.state().progress = progress;
    }

    pub fn progress(&self) -> Progress {
        self.state().progress
    }

    /// The median of the recent step times (`None` until enough are measured).
    pub fn median_step(&self) -> Option<Duration> {
        let times: Vec<Duration> = self.state().step_times.iter().copied().collect();
        median(&times)
    }
}

/// The checkpointer's saves as the watchdog sees them: each an
/// [`Activity::Save`] of [`Worker::Persister`].
impl crate::checkpoint::SaveWatch for Beats {
    fn save_begins(&self, step: u64) -> Box<dyn std::any::Any + Send> {
        Box::new(self.begin(Worker::Persister, Activity::Save, step))
    }
    fn committed(&self, step: u64) {
        Beats::committed(self, step)
    }
}

/// Ends an activity when dropped (also when its work returns an error or panics).
#[must_use = "the activity ends when the guard drops"]
pub struct BusyGuard {
    beats: Beats,
    busy: Busy,
}

impl Drop for BusyGuard {
    fn drop(&mut self) {
        let mut state = self.beats.state();
        let slot = &mut state.slots[self.busy.worker.slot()];
        if *slot == Some(self.busy) {
            *slot = None;
        }
        if self.busy.activity == Activity::Step {
            if state.step_times.len() == STEP_WINDOW {
                state.step_times.pop_front();
            }
            state.step_times.push_back(self.busy.since.elapsed());
        }
    }
}

/// The watchdog thread; stopped when dropped.
pub struct Watchdog {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Watchdog {
    /// Starts watching `beats` under `cfg`; `on_hang` gets the first hang and
    /// is expected to end the process (the thread ends after calling it).
    pub fn spawn(
        cfg: WatchdogSection,
        eval_batches: usize,
        beats: Beats,
        on_hang: Box<dyn FnOnce(Hang) + Send>,
    ) -> std::io::Result<Watchdog> {
        let stop = Arc::new(AtomicBool::new(false));
        let handle = {
            let stop = Arc::clone(&stop);
            std::thread::Builder::new().name("rekindle-watchdog".into()).spawn(move || {
                let every = poll_interval(&cfg);
                while !stop.load(Ordering::SeqCst) {
                    std::thread::sleep(every);
                    let median = beats.median_step();
                    let limit_of = |a| limit(&cfg, a, median, eval_batches);
                    if let Some(hang) = overdue(&beats.busy(), limit_of, Instant::now()) {
                        on_hang(hang);
                        return;
                    }
                }
            })?
        };
        Ok(Watchdog { stop, handle: Some(handle) })
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            // A handler in progress ends the process itself; do not wait for it.
            if h.is_finished() {
                let _ = h.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Duration = Duration::from_secs(60);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn auto_limits_use_the_floor_until_steps_are_measured() {
        let floor = 10 * MIN;
        assert_eq!(auto_limit(Activity::Step, None, floor, 4), floor);
        assert_eq!(auto_limit(Activity::Eval, None, floor, 4), floor);
        assert_eq!(auto_limit(Activity::Save, None, floor, 4), 3 * floor);
        assert_eq!(auto_limit(Activity::Publish, None, floor, 4), 3 * floor);
    }

    #[test]
    fn auto_limits_scale_with_the_median_step_above_the_floor() {
        let floor = 10 * MIN;
        let median = Some(Duration::from_secs(60));
        assert_eq!(auto_limit(Activity::Step, median, floor, 4), 20 * MIN);
        assert_eq!(auto_limit(Activity::Eval, median, floor, 4), 80 * MIN, "20 x median x eval_batches");
        assert_eq!(auto_limit(Activity::Save, median, floor, 4), 30 * MIN, "three floors beat 20 x median");
        let slow = Some(Duration::from_secs(120));
        assert_eq!(auto_limit(Activity::Save, slow, floor, 4), 40 * MIN);
        // Fast steps: the floor holds.
        assert_eq!(auto_limit(Activity::Step, Some(ms(5)), floor, 4), floor);
        assert_eq!(auto_limit(Activity::Eval, Some(ms(5)), floor, 0), floor, "eval_batches 0 counts as 1");
    }

    #[test]
    fn fixed_limits_win_over_auto() {
        let cfg = WatchdogSection { step: Limit::Fixed(ms(2000)), ..WatchdogSection::default() };
        assert_eq!(limit(&cfg, Activity::Step, Some(MIN), 4), ms(2000));
        assert_eq!(limit(&cfg, Activity::Eval, None, 4), 10 * MIN);
    }

    #[test]
    fn the_median_needs_enough_steps_and_ignores_outliers() {
        assert_eq!(median(&[ms(10); 4]), None);
        assert_eq!(median(&[ms(10), ms(11), ms(9000), ms(12), ms(10)]), Some(ms(11)));
    }

    fn busy(worker: Worker, activity: Activity, since: Instant) -> Busy {
        Busy { worker, activity, step: 7, since, since_wall: SystemTime::now() }
    }

    #[test]
    fn only_an_activity_past_its_limit_is_a_hang_and_the_worst_one_is_reported() {
        let t0 = Instant::now();
        let now = t0 + Duration::from_secs(100);
        let limits = |a| if a == Activity::Save { Duration::from_secs(10) } else { Duration::from_secs(95) };
        assert_eq!(overdue(&[], limits, now), None);
        let step = busy(Worker::Training, Activity::Step, t0 + Duration::from_secs(10));
        assert_eq!(overdue(&[step], limits, now), None, "90 s of 95");
        let save = busy(Worker::Persister, Activity::Save, t0 + Duration::from_secs(50));
        let hang = overdue(&[step, save], limits, now).unwrap();
        assert_eq!(
            (hang.busy.activity, hang.limit, hang.stuck_for),
            (Activity::Save, Duration::from_secs(10), Duration::from_secs(50))
        );
        let old_step = busy(Worker::Training, Activity::Step, t0);
        assert_eq!(
            overdue(&[old_step, save], limits, now).unwrap().busy.activity,
            Activity::Save,
            "40 s over beats 5 s over"
        );
    }

    #[test]
    fn the_poll_interval_follows_the_shortest_fixed_limit() {
        assert_eq!(poll_interval(&WatchdogSection::default()), Duration::from_secs(1));
        let short = WatchdogSection { step: Limit::Fixed(ms(2000)), ..WatchdogSection::default() };
        assert_eq!(poll_interval(&short), ms(200));
        let tiny = WatchdogSection { save: Limit::Fixed(ms(100)), ..WatchdogSection::default() };
        assert_eq!(poll_interval(&tiny), ms(50));
    }

    #[test]
    fn beats_track_each_worker_and_measure_steps() {
        let beats = Beats::default();
        {
            let _save = beats.begin(Worker::Persister, Activity::Save, 4);
            let _step = beats.begin(Worker::Training, Activity::Step, 5);
            let busy = beats.busy();
            assert_eq!(
                busy.iter().map(|b| (b.worker, b.activity, b.step)).collect::<Vec<_>>(),
                [(Worker::Training, Activity::Step, 5), (Worker::Persister, Activity::Save, 4)]
            );
        }
        assert!(beats.busy().is_empty());
        assert_eq!(beats.median_step(), None, "one step measured");
        for step in 0..5 {
            drop(beats.begin(Worker::Training, Activity::Step, step));
        }
        assert!(beats.median_step().is_some());
    }

    #[test]
    fn the_newest_committed_step_only_grows() {
        let beats = Beats::default();
        assert_eq!(beats.newest_committed(), None);
        beats.committed(20);
        beats.committed(10);
        assert_eq!(beats.newest_committed(), Some(20), "a late report of an older save does not win");
        beats.committed(30);
        assert_eq!(beats.newest_committed(), Some(30));
        assert_eq!(beats.commits(), 3);
        let resumed = Beats::default();
        resumed.resumed_from(40);
        assert_eq!((resumed.newest_committed(), resumed.commits(), resumed.progress().step), (Some(40), 0, 40));
    }

    #[test]
    fn the_watchdog_calls_the_handler_once_for_a_stuck_activity() {
        let cfg = WatchdogSection { step: Limit::Fixed(ms(100)), ..WatchdogSection::default() };
        let beats = Beats::default();
        let _stuck = beats.begin(Worker::Training, Activity::Step, 3);
        let (tx, rx) = std::sync::mpsc::channel();
        let _dog = Watchdog::spawn(cfg, 1, beats, Box::new(move |hang| tx.send(hang).unwrap())).unwrap();
        let hang = rx.recv_timeout(Duration::from_secs(10)).expect("a hang within 10 s");
        assert_eq!((hang.busy.activity, hang.busy.step, hang.limit), (Activity::Step, 3, ms(100)));
        assert!(hang.stuck_for > ms(100));
        assert!(rx.recv_timeout(ms(300)).is_err(), "reported once");
    }
}
