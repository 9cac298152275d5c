//! `[checkpoint] interval = "auto"`: the periodic checkpoint interval from
//! measured costs, as pure functions (the attempt feeds them measurements
//! and records their choices, `run/saving.rs`).
//!
//! Young/Daly: with a checkpoint costing `C` of training time and
//! interruptions that lose work arriving every `M` on average, checkpointing
//! every `T` wastes a fraction `C/T` on the checkpoints and, per
//! interruption, the work since the last *committed* checkpoint: `T/2` on
//! average plus the time `P` a background write takes to commit. The waste
//! per unit of time, `C/T + (T/2 + P)/M`, is smallest at `T = √(2·C·M)`;
//! `P` adds the same to every `T` (it bounds `T` from below instead: a save
//! falling due before the previous one is written would wait for it).
//!
//! `C` is what training pays per checkpoint: for background saves the
//! snapshot stall plus the slowdown of the steps trained while the write
//! ran ([`Slowdown`]: the persister hashes and writes on cores training
//! would use; the stall alone is microseconds since snapshots share the
//! tensors no step writes into), for inline saves (`async = false`) the
//! stall plus the write. `M` comes from `[checkpoint]
//! mtbf`, else from the run's earlier attempts ([`history_mtbf`]). The
//! interval is bounded below (saves never stall training more than
//! [`MAX_STALL_FRACTION`] of the time; never before the previous write is
//! committed; never under [`FLOOR`]) and above by the SLURM job's remaining
//! time (one more save must fit before the end). Until a save has been
//! measured, [`DEFAULT_INTERVAL`] (or a quarter of the MTBF when shorter).

use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::telemetry::{Attempt, AttemptEnd, CheckpointIntervalChosen};

/// The interval before a save is measured, or without an interruption rate.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(300);
/// Saves may stall training at most this fraction of the time.
pub const MAX_STALL_FRACTION: f64 = 0.05;
/// The shortest interval ever chosen.
pub const FLOOR: Duration = Duration::from_secs(1);
/// A new choice is recorded when it differs from the recorded one by more
/// than this fraction.
pub const NOTICEABLE_CHANGE: f64 = 0.2;
/// Measured saves kept for the medians.
const RECENT_SAVES: usize = 10;

/// Where the mean time between interruptions came from.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum MtbfSource {
    /// `[checkpoint] mtbf`.
    Config,
    /// The run's earlier attempts: `interruptions` of them lost work, over
    /// `seconds` of running.
    History { interruptions: u64, seconds: f64 },
}

/// A mean time between interruptions that lose work.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Mtbf {
    pub seconds: f64,
    pub source: MtbfSource,
}

/// What saving measured: medians of the recent saves.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Costs {
    /// Training stalled this long per save (the snapshot).
    pub stall_seconds: f64,
    /// Writing a snapshot to storage took this long.
    pub persist_seconds: f64,
    /// Training time lost to a background write beyond its stall: the
    /// steps trained while it ran took this much longer than usual.
    pub slowdown_seconds: f64,
    /// Saves are written in the background (`[checkpoint] async`).
    pub background: bool,
    pub saves: u32,
}

impl Costs {
    /// The training time a checkpoint costs: the stall, plus the slowdown
    /// of training during a background write, or the write when training
    /// waits for it.
    pub fn checkpoint_cost(&self) -> f64 {
        if self.background {
            self.stall_seconds + self.slowdown_seconds
        } else {
            self.stall_seconds + self.persist_seconds
        }
    }

    fn measured_as(&self) -> &'static str {
        if self.background { "snapshot_stall_and_slowdown" } else { "snapshot_and_write" }
    }
}

/// Everything the choice depends on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IntervalInputs {
    /// `None` until a save has been measured.
    pub costs: Option<Costs>,
    pub mtbf: Option<Mtbf>,
    /// Time left before the job's end time, when known.
    pub remaining: Option<Duration>,
}

/// Why the interval is what it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// √(2 × cost × mtbf), bounded.
    YoungDaly,
    /// No save measured yet: a conservative default.
    Unmeasured,
    /// No interruption rate known: the default.
    NoMtbf,
}

impl Reason {
    pub fn name(self) -> &'static str {
        match self {
            Reason::YoungDaly => "young_daly",
            Reason::Unmeasured => "unmeasured",
            Reason::NoMtbf => "no_mtbf",
        }
    }
}

/// The bound that set the interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    StallFraction,
    PersistTime,
    Floor,
    RemainingTime,
}

impl Bound {
    pub fn name(self) -> &'static str {
        match self {
            Bound::StallFraction => "stall_fraction",
            Bound::PersistTime => "persist_time",
            Bound::Floor => "floor",
            Bound::RemainingTime => "remaining_time",
        }
    }
}

/// The interval chosen, and why.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IntervalChoice {
    pub interval: Duration,
    pub reason: Reason,
    /// √(2 × cost × mtbf) before the bounds.
    pub young_daly_seconds: Option<f64>,
    pub bound: Option<Bound>,
}

/// The periodic checkpoint interval for `inputs` (see the module docs).
pub fn choose_interval(inputs: &IntervalInputs) -> IntervalChoice {
    let (mut seconds, reason, young_daly_seconds) = match (inputs.costs, inputs.mtbf) {
        (None, Some(m)) => (DEFAULT_INTERVAL.as_secs_f64().min(m.seconds / 4.0), Reason::Unmeasured, None),
        (None, None) => (DEFAULT_INTERVAL.as_secs_f64(), Reason::Unmeasured, None),
        (Some(_), None) => (DEFAULT_INTERVAL.as_secs_f64(), Reason::NoMtbf, None),
        (Some(c), Some(m)) => {
            let t = (2.0 * c.checkpoint_cost() * m.seconds).sqrt();
            (t, Reason::YoungDaly, Some(t))
        }
    };
    let mut bound = None;
    let mut lower = vec![(FLOOR.as_secs_f64(), Bound::Floor)];
    if let Some(c) = inputs.costs {
        lower.push((c.checkpoint_cost() / MAX_STALL_FRACTION, Bound::StallFraction));
        if c.background {
            lower.push((c.persist_seconds, Bound::PersistTime));
        }
    }
    for (at_least, b) in lower {
        if seconds < at_least {
            (seconds, bound) = (at_least, Some(b));
        }
    }
    if let Some(remaining) = inputs.remaining {
        let save = inputs.costs.map_or(0.0, |c| c.stall_seconds + c.persist_seconds);
        let at_most = (remaining.as_secs_f64() - save).max(FLOOR.as_secs_f64());
        if seconds > at_most {
            (seconds, bound) = (at_most, Some(Bound::RemainingTime));
        }
    }
    IntervalChoice { interval: Duration::from_secs_f64(seconds), reason, young_daly_seconds, bound }
}

/// True when `new` differs from the interval last recorded by more than
/// [`NOTICEABLE_CHANGE`] (always, when none was recorded).
pub fn noticeably_different(recorded: Option<Duration>, new: Duration) -> bool {
    recorded.is_none_or(|old| {
        let old = old.as_secs_f64();
        (new.as_secs_f64() - old).abs() > NOTICEABLE_CHANGE * old
    })
}

/// True when the choice is made again after the `saves`-th measured save:
/// after each of the first three (the first costs settle), then every tenth.
pub fn recompute_after(saves: u32) -> bool {
    saves <= 3 || saves.is_multiple_of(10)
}

/// True when an attempt lost work: it ended without a recorded end (killed,
/// node failure, out of memory), with an error, or exiting at once after a
/// signal (keeping an older checkpoint), or the next attempt says it did.
/// A signal stop with a durable stop checkpoint, a `--stop-at-step` and a
/// finish lose nothing and are not interruptions for Young/Daly.
pub fn lost_work(a: &Attempt) -> bool {
    a.steps_lost.is_some_and(|s| s > 0)
        || match &a.end {
            AttemptEnd::Unrecorded | AttemptEnd::Failed { .. } => true,
            AttemptEnd::Stopped { fast_exit, .. } => *fast_exit,
            AttemptEnd::Finished => false,
        }
}

/// The mean time between interruptions of the earlier `attempts` of a run:
/// the seconds they ran (start to their last event) over the number that
/// lost work ([`lost_work`]); `None` when none did, or none ran.
pub fn history_mtbf(attempts: &[Attempt]) -> Option<Mtbf> {
    let seconds: f64 =
        attempts.iter().filter_map(|a| Some((a.ended? - a.started?).num_milliseconds().max(0) as f64 / 1000.0)).sum();
    let interruptions = attempts.iter().filter(|a| lost_work(a)).count() as u64;
    if interruptions == 0 || seconds <= 0.0 {
        return None;
    }
    Some(Mtbf { seconds: seconds / interruptions as f64, source: MtbfSource::History { interruptions, seconds } })
}

/// The median of the recent saves' stall and write times.
#[derive(Debug, Clone, Default)]
pub struct CostMeter {
    stalls: Vec<f64>,
    persists: Vec<f64>,
    slowdowns: Vec<f64>,
    saves: u32,
}

impl CostMeter {
    /// Adds one save's measurements.
    pub fn measured(&mut self, stall_seconds: f64, persist_seconds: f64, slowdown_seconds: f64) {
        for (list, v) in [
            (&mut self.stalls, stall_seconds),
            (&mut self.persists, persist_seconds),
            (&mut self.slowdowns, slowdown_seconds),
        ] {
            if list.len() == RECENT_SAVES {
                list.remove(0);
            }
            list.push(v.max(0.0));
        }
        self.saves += 1;
    }

    pub fn saves(&self) -> u32 {
        self.saves
    }

    /// The costs so far (`None` before the first save).
    pub fn costs(&self, background: bool) -> Option<Costs> {
        Some(Costs {
            stall_seconds: median(&self.stalls)?,
            persist_seconds: median(&self.persists)?,
            slowdown_seconds: median(&self.slowdowns)?,
            background,
            saves: self.saves,
        })
    }
}

/// Step times kept for the typical step with no save in flight.
const RECENT_STEPS: usize = 64;

/// How much a background save slows training down: the steps that ended
/// while it was in flight, against the mean of the recent steps with none
/// in flight (the mean, not the median: step times are skewed, and
/// against the median even a save that slowed nothing would cost the
/// difference at every step).
#[derive(Debug, Clone, Default)]
pub struct Slowdown {
    idle: std::collections::VecDeque<f64>,
    during_seconds: f64,
    during_steps: u32,
}

impl Slowdown {
    /// One step of `seconds`, which ended while a save was in flight or not.
    pub fn step(&mut self, seconds: f64, saving: bool) {
        if saving {
            self.during_seconds += seconds.max(0.0);
            self.during_steps += 1;
        } else {
            if self.idle.len() == RECENT_STEPS {
                self.idle.pop_front();
            }
            self.idle.push_back(seconds.max(0.0));
        }
    }

    /// A save begins: what was counted for an earlier one that was never
    /// measured (it failed, already existed, or its thread died) is dropped.
    pub fn save_started(&mut self) {
        (self.during_seconds, self.during_steps) = (0.0, 0);
    }

    /// A save ended: the training time it cost beyond its stall (never
    /// negative; 0 before any step without a save was seen), and a fresh
    /// count for the next one.
    pub fn save_ended(&mut self) -> f64 {
        let typical = match self.idle.len() {
            0 => f64::INFINITY,
            n => self.idle.iter().sum::<f64>() / n as f64,
        };
        let extra = (self.during_seconds - f64::from(self.during_steps) * typical).max(0.0);
        self.save_started();
        extra
    }
}

fn median(values: &[f64]) -> Option<f64> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// The `checkpoint_interval` event of a choice made at `step`.
pub fn interval_event(
    step: u64,
    inputs: &IntervalInputs,
    choice: &IntervalChoice,
    previous: Option<Duration>,
) -> CheckpointIntervalChosen {
    let (interruptions, history_seconds) = match inputs.mtbf.map(|m| m.source) {
        Some(MtbfSource::History { interruptions, seconds }) => (Some(interruptions), Some(seconds)),
        _ => (None, None),
    };
    CheckpointIntervalChosen {
        step,
        interval_seconds: choice.interval.as_secs_f64(),
        reason: choice.reason.name().into(),
        young_daly_seconds: choice.young_daly_seconds,
        bound: choice.bound.map(|b| b.name().into()),
        cost_seconds: inputs.costs.map(|c| c.checkpoint_cost()),
        cost_measured_as: inputs.costs.map(|c| c.measured_as().into()),
        saves_measured: inputs.costs.map_or(0, |c| c.saves),
        persist_seconds: inputs.costs.map(|c| c.persist_seconds),
        slowdown_seconds: inputs.costs.map(|c| c.slowdown_seconds),
        mtbf_seconds: inputs.mtbf.map(|m| m.seconds),
        mtbf_source: match inputs.mtbf.map(|m| m.source) {
            Some(MtbfSource::Config) => "config",
            Some(MtbfSource::History { .. }) => "history",
            None => "none",
        }
        .into(),
        interruptions,
        history_seconds,
        remaining_seconds: inputs.remaining.map(|r| r.as_secs_f64()),
        previous_seconds: previous.map(|p| p.as_secs_f64()),
    }
}

/// A simulated job: what a checkpoint costs and how much training it needs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimJob {
    /// Training stall per checkpoint (background saves).
    pub stall_seconds: f64,
    /// Time for a snapshot to commit after its stall.
    pub persist_seconds: f64,
    /// Training the job needs, in seconds of uninterrupted work.
    pub work_seconds: f64,
}

/// Seconds of wall time beyond the job's work that checkpointing every
/// `interval` (of training between snapshots) costs, averaged over `runs`
/// Monte-Carlo runs with exponentially distributed interruptions of mean
/// `mtbf` (seeded: the same arguments give the same answer): the stalls,
/// plus at each interruption the work since the last committed checkpoint
/// (a snapshot commits `persist_seconds` after its stall). Restarting costs
/// the same under any interval and is left out.
pub fn simulate_lost_seconds(job: &SimJob, interval: f64, mtbf: f64, runs: u32, seed: u64) -> f64 {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut total = 0.0;
    for _ in 0..runs {
        total += simulate_once(job, interval, mtbf, &mut rng) - job.work_seconds;
    }
    total / f64::from(runs.max(1))
}

/// The wall time one simulated job takes.
fn simulate_once(job: &SimJob, interval: f64, mtbf: f64, rng: &mut ChaCha8Rng) -> f64 {
    let mut wall = 0.0;
    let mut committed = 0.0;
    loop {
        // One attempt, from the committed work, until done or interrupted.
        let uniform = ((rng.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        let lifetime = -mtbf * uniform.ln();
        let (mut t, mut done) = (0.0, committed);
        // The newest snapshot and when it commits (attempt time).
        let mut pending: Option<(f64, f64)> = None;
        loop {
            // A save due while the previous one is still being written is
            // taken once it commits; training goes on meanwhile.
            let due = pending.map_or(interval, |(at, _)| interval.max(at - t));
            let chunk = due.min(job.work_seconds - done);
            let end = t + chunk;
            if end > lifetime {
                wall += lifetime;
                if let Some((at, work)) = pending
                    && at <= lifetime
                {
                    committed = work;
                }
                break;
            }
            (t, done) = (end, done + chunk);
            // `due` waited for the pending snapshot's commit: it is durable now.
            if let Some((_, work)) = pending {
                committed = work;
            }
            if done >= job.work_seconds {
                return wall + t;
            }
            // A snapshot (the stall) of `done`, committed after its write.
            if t + job.stall_seconds > lifetime {
                wall += lifetime;
                break;
            }
            t += job.stall_seconds;
            pending = Some((t + job.persist_seconds, done));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    fn background(stall: f64, persist: f64) -> Costs {
        Costs { stall_seconds: stall, persist_seconds: persist, slowdown_seconds: 0.0, background: true, saves: 3 }
    }

    fn config(secs: f64) -> Option<Mtbf> {
        Some(Mtbf { seconds: secs, source: MtbfSource::Config })
    }

    fn close(d: Duration, secs: f64) -> bool {
        (d.as_secs_f64() - secs).abs() < 1e-6
    }

    #[test]
    fn young_daly_is_the_square_root_of_twice_cost_times_mtbf() {
        // 5 s stall, 6 h between interruptions: √(2·5·21600) ≈ 464.8 s.
        let c = choose_interval(&IntervalInputs {
            costs: Some(background(5.0, 60.0)),
            mtbf: config(21_600.0),
            remaining: None,
        });
        assert_eq!((c.reason, c.bound), (Reason::YoungDaly, None));
        assert!(close(c.interval, (2.0f64 * 5.0 * 21_600.0).sqrt()), "{c:?}");
        assert!(close(c.interval, c.young_daly_seconds.unwrap()));
    }

    #[test]
    fn inline_saves_count_the_write_as_cost() {
        let mut costs = background(1.0, 7.0);
        costs.background = false;
        assert_eq!(costs.checkpoint_cost(), 8.0);
        let c = choose_interval(&IntervalInputs { costs: Some(costs), mtbf: config(3600.0), remaining: None });
        assert!(close(c.interval, (2.0f64 * 8.0 * 3600.0).sqrt()), "{c:?}");
        assert_eq!(background(1.0, 7.0).checkpoint_cost(), 1.0, "a background write overlaps training");
    }

    #[test]
    fn before_a_save_is_measured_the_default_or_a_quarter_of_the_mtbf() {
        let none = IntervalInputs { costs: None, mtbf: None, remaining: None };
        let c = choose_interval(&none);
        assert_eq!((c.interval, c.reason, c.bound), (DEFAULT_INTERVAL, Reason::Unmeasured, None));
        let c = choose_interval(&IntervalInputs { mtbf: config(600.0), ..none });
        assert!(close(c.interval, 150.0));
        let c = choose_interval(&IntervalInputs { mtbf: config(86_400.0), ..none });
        assert_eq!(c.interval, DEFAULT_INTERVAL);
        let c = choose_interval(&IntervalInputs { costs: Some(background(0.1, 1.0)), ..none });
        assert_eq!((c.interval, c.reason), (DEFAULT_INTERVAL, Reason::NoMtbf));
    }

    #[test]
    fn the_stall_never_exceeds_its_fraction_nor_a_save_waits_for_the_previous() {
        // 2 s stall, 10 min mtbf: √2400 ≈ 49 s would stall 4 %… but 20 × 2 = 40 < 49: no bound.
        let c = choose_interval(&IntervalInputs {
            costs: Some(background(2.0, 1.0)),
            mtbf: config(600.0),
            remaining: None,
        });
        assert_eq!(c.bound, None);
        // 10 s stall, 10 min mtbf: √12000 ≈ 110 s stalls 9 %: 200 s.
        let c = choose_interval(&IntervalInputs {
            costs: Some(background(10.0, 1.0)),
            mtbf: config(600.0),
            remaining: None,
        });
        assert_eq!(c.bound, Some(Bound::StallFraction));
        assert!(close(c.interval, 200.0));
        // A 300 s write: not due before it commits.
        let c = choose_interval(&IntervalInputs {
            costs: Some(background(2.0, 300.0)),
            mtbf: config(600.0),
            remaining: None,
        });
        assert_eq!((c.bound, c.interval), (Some(Bound::PersistTime), S(300)));
        // Millisecond saves and a short mtbf: the floor.
        let c = choose_interval(&IntervalInputs {
            costs: Some(background(0.001, 0.01)),
            mtbf: config(20.0),
            remaining: None,
        });
        assert_eq!((c.bound, c.interval), (Some(Bound::Floor), FLOOR));
    }

    #[test]
    fn a_save_still_fits_before_the_job_ends() {
        // Young/Daly says ~465 s, but only 200 s are left and a save takes 5 + 60.
        let inputs =
            IntervalInputs { costs: Some(background(5.0, 60.0)), mtbf: config(21_600.0), remaining: Some(S(200)) };
        let c = choose_interval(&inputs);
        assert_eq!((c.bound, c.interval), (Some(Bound::RemainingTime), S(135)));
        // With hours left the bound does not apply.
        assert_eq!(choose_interval(&IntervalInputs { remaining: Some(S(36_000)), ..inputs }).bound, None);
        // Nothing left: the floor, not zero.
        assert_eq!(choose_interval(&IntervalInputs { remaining: Some(S(0)), ..inputs }).interval, FLOOR);
        // Unmeasured: the default, cut to what is left.
        let c = choose_interval(&IntervalInputs { costs: None, mtbf: None, remaining: Some(S(100)) });
        assert_eq!((c.reason, c.bound, c.interval), (Reason::Unmeasured, Some(Bound::RemainingTime), S(100)));
    }

    #[test]
    fn only_noticeable_changes_are_recorded() {
        assert!(noticeably_different(None, S(100)));
        assert!(!noticeably_different(Some(S(100)), S(119)));
        assert!(!noticeably_different(Some(S(100)), S(81)));
        assert!(noticeably_different(Some(S(100)), S(121)));
        assert!(noticeably_different(Some(S(100)), S(79)));
    }

    #[test]
    fn recomputed_after_the_first_three_saves_then_every_tenth() {
        let at: Vec<u32> = (1..=30).filter(|&n| recompute_after(n)).collect();
        assert_eq!(at, [1, 2, 3, 10, 20, 30]);
    }

    #[test]
    fn the_cost_is_the_median_of_the_recent_saves() {
        let mut m = CostMeter::default();
        assert_eq!(m.costs(true), None);
        m.measured(0.5, 3.0, 0.2);
        m.measured(9.0, 1.0, 0.1);
        m.measured(0.7, 2.0, 0.4);
        let c = m.costs(true).unwrap();
        assert_eq!((c.stall_seconds, c.persist_seconds, c.slowdown_seconds, c.saves), (0.7, 2.0, 0.2, 3));
        assert!((c.checkpoint_cost() - 0.9).abs() < 1e-12, "background: stall + slowdown");
        assert!((m.costs(false).unwrap().checkpoint_cost() - 2.7).abs() < 1e-12, "inline: stall + write");
        for _ in 0..RECENT_SAVES {
            m.measured(1.0, 1.0, 0.0);
        }
        assert_eq!(m.costs(false).unwrap().stall_seconds, 1.0, "only the recent saves count");
        assert_eq!(m.saves(), 13);
    }

    #[test]
    fn a_background_save_costs_what_the_steps_during_it_took_beyond_the_usual_step() {
        let mut s = Slowdown::default();
        for t in [1.0, 0.75, 1.25, 1.0] {
            s.step(t, false);
        }
        s.step(1.5, true);
        s.step(1.25, true);
        assert!((s.save_ended() - 0.75).abs() < 1e-12, "2.75 s against 2 × the usual 1 s");
        assert_eq!(s.save_ended(), 0.0, "counted once");
        s.step(0.5, true); // faster than usual: no negative cost
        assert_eq!(s.save_ended(), 0.0);
        // A save that was never measured (it failed) leaves nothing behind.
        s.step(9.0, true);
        s.save_started();
        s.step(1.5, true);
        assert!((s.save_ended() - 0.5).abs() < 1e-12);
        // Skewed step times: a save that slowed nothing costs nothing (the
        // median would charge it the mean's excess at every step).
        let mut skewed = Slowdown::default();
        for t in [1.0, 1.0, 1.0, 4.0].repeat(8) {
            skewed.step(t, false);
        }
        for t in [1.0, 1.0, 1.0, 4.0] {
            skewed.step(t, true);
        }
        assert_eq!(skewed.save_ended(), 0.0);
        let mut fresh = Slowdown::default();
        fresh.step(3.0, true);
        assert_eq!(fresh.save_ended(), 0.0, "no usual step known yet: nothing to compare with");
    }

    fn attempt(start: u32, end: u32, how: AttemptEnd) -> Attempt {
        let t = |s: u32| chrono::DateTime::from_timestamp(1_790_000_000 + i64::from(s), 0);
        Attempt {
            number: 1,
            node: None,
            job_id: None,
            slurm_attempt: None,
            started: t(start),
            ended: t(end),
            start_step: 0,
            end_step: None,
            end: how,
            seconds_to_checkpoint: None,
            requeue: None,
            steps_lost: None,
            checkpoints_saved: 0,
            program: None,
        }
    }

    #[test]
    fn history_counts_the_attempts_that_lost_work_over_the_time_run() {
        let stopped = |fast_exit| AttemptEnd::Stopped { reason: "SIGTERM".into(), fast_exit, before_training: false };
        let clean = [attempt(0, 600, stopped(false)), attempt(700, 900, AttemptEnd::Finished)];
        assert_eq!(history_mtbf(&clean), None, "stops with a checkpoint lose no work");
        assert_eq!(history_mtbf(&[]), None);
        let rough = [
            attempt(0, 1000, AttemptEnd::Unrecorded),
            attempt(1000, 1500, stopped(true)),
            attempt(1500, 2000, AttemptEnd::Failed { error: "boom".into() }),
            attempt(2000, 3000, stopped(false)),
        ];
        let m = history_mtbf(&rough).unwrap();
        assert_eq!(m.seconds, 1000.0);
        assert_eq!(m.source, MtbfSource::History { interruptions: 3, seconds: 3000.0 });
        let mut lost = attempt(0, 400, stopped(false));
        lost.steps_lost = Some(30);
        assert!(lost_work(&lost), "the next attempt said it trained steps again");
    }

    #[test]
    fn the_event_names_its_inputs() {
        let inputs = IntervalInputs {
            costs: Some(background(5.0, 60.0)),
            mtbf: Some(Mtbf { seconds: 1000.0, source: MtbfSource::History { interruptions: 3, seconds: 3000.0 } }),
            remaining: Some(S(7200)),
        };
        let c = choose_interval(&inputs);
        let e = interval_event(40, &inputs, &c, Some(S(300)));
        assert_eq!((e.step, e.reason.as_str(), e.mtbf_source.as_str()), (40, "young_daly", "history"));
        assert_eq!((e.interruptions, e.history_seconds, e.cost_seconds), (Some(3), Some(3000.0), Some(5.0)));
        assert_eq!((e.remaining_seconds, e.previous_seconds), (Some(7200.0), Some(300.0)));
        assert_eq!(e.cost_measured_as.as_deref(), Some("snapshot_stall_and_slowdown"));
        assert_eq!(e.slowdown_seconds, Some(0.0));
        assert_eq!(e.interval_seconds, 100.0, "√(2·5·1000) = 100");
    }

    #[test]
    fn the_simulation_is_seeded_and_agrees_with_the_model() {
        let job = SimJob { stall_seconds: 5.0, persist_seconds: 0.0, work_seconds: 86_400.0 };
        assert_eq!(
            simulate_lost_seconds(&job, 300.0, 3600.0, 20, 7),
            simulate_lost_seconds(&job, 300.0, 3600.0, 20, 7)
        );
        // No interruptions to speak of: only the stalls, 5 s per 300 s of work.
        let lost = simulate_lost_seconds(&job, 300.0, 1e12, 1, 1);
        assert!((lost - 5.0 * (86_400.0 / 300.0 - 1.0)).abs() < 1e-6, "{lost}");
        // The Young/Daly interval loses less than intervals 4× off either way.
        let t = (2.0f64 * 5.0 * 3600.0).sqrt();
        let at = |i: f64| simulate_lost_seconds(&job, i, 3600.0, 400, 11);
        assert!(at(t) < at(t / 4.0) && at(t) < at(t * 4.0), "{} {} {}", at(t / 4.0), at(t), at(t * 4.0));
        // First order: waste ≈ C/T + T/(2M) of the time.
        let model = 86_400.0 * (5.0 / t + t / 7200.0);
        assert!((at(t) / model - 1.0).abs() < 0.25, "simulated {} vs model {model}", at(t));
    }
}
