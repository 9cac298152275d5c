//! Stragglers: a rank that holds a data-parallel world back, or a process
//! alone whose steps became slower than they were (thermal throttling, a
//! neighbour on the node, a failing disk under the data). A pure detector
//! fed one step at a time; the driver records what it finds (`straggler`
//! events, docs/distributed.md#stragglers).
//!
//! - **Several ranks.** Each step, every rank's *own* seconds (its forward
//!   and backward passes, before it waits for the others in the step's
//!   collectives: `StepMetrics::rank_compute_s`) are compared with the
//!   median of the *other* ranks' that step. Leaving the rank itself out
//!   matters in small worlds: in a world of two, the median of both is
//!   their mean, which a rank can never exceed by half.
//! - **One process.** Each step's seconds are compared with the median of
//!   the attempt's first [`baseline_steps`] steps: the run's own history,
//!   on this node.
//!
//! A step is slow when it takes more than `[health] straggler_factor` times
//! the median *and* at least [`MIN_EXCESS_SECONDS`] more; `[health]
//! straggler_steps` slow steps in a row make a [`Straggler`], reported once
//! per rank for the detector's life (an attempt). A step whose time is not
//! known for a rank breaks that rank's run of slow steps.

use crate::config::HealthSection;
use crate::telemetry;

/// A step at most this much slower than the median is never slow: on a
/// shared node the scheduler alone moves tiny steps by a few milliseconds,
/// and a straggler worth a record costs more than this every step.
pub const MIN_EXCESS_SECONDS: f64 = 0.010;

/// The fewest steps a process alone measures before it compares: the
/// median of fewer is too easily the warm-up's.
pub const MIN_BASELINE_STEPS: u64 = 10;

/// When a step is slow, and for how many steps in a row it must be.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rule {
    /// Slower than the median by more than this factor.
    pub factor: f64,
    /// Slow steps in a row that make a straggler (at least 1).
    pub steps: u64,
}

impl Rule {
    /// The rule of `[health]`, or `None` when `straggler_steps = 0` turns
    /// the detection off.
    pub fn of(health: &HealthSection) -> Option<Rule> {
        (health.straggler_steps > 0).then_some(Rule { factor: health.straggler_factor, steps: health.straggler_steps })
    }

    /// Whether `seconds` is slow against `median`.
    pub fn slow(&self, seconds: f64, median: f64) -> bool {
        seconds > self.factor * median && seconds - median >= MIN_EXCESS_SECONDS
    }
}

/// How many first steps a process alone takes as its own baseline.
pub fn baseline_steps(rule: &Rule) -> u64 {
    rule.steps.max(MIN_BASELINE_STEPS)
}

/// A rank found slow for [`Rule::steps`] steps in a row.
#[derive(Debug, Clone, PartialEq)]
pub struct Straggler {
    /// The slow rank (0 for a process alone).
    pub rank: usize,
    /// The step that completed the run of slow steps.
    pub step: u64,
    /// The median of the rank's own seconds over that run.
    pub step_seconds: f64,
    /// What it was compared with: the median over the run of the other
    /// ranks' per-step median, or a process alone's baseline.
    pub median_seconds: f64,
}

impl Straggler {
    /// Its `straggler` event: `node` is the rank's, `blamed` is `[health]
    /// straggler_blame`, `world_size` the ranks compared (1: a process alone).
    pub fn event(&self, node: String, rule: &Rule, blamed: bool, world_size: usize) -> telemetry::Straggler {
        telemetry::Straggler {
            rank: self.rank,
            rank_node: node,
            step: self.step,
            step_seconds: self.step_seconds,
            median_seconds: self.median_seconds,
            factor: rule.factor,
            steps: rule.steps,
            blamed,
            world_size,
        }
    }
}

/// The median of `values` (the mean of the middle two for an even count);
/// `None` when there are none.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut sorted: Vec<f64> = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    match n {
        0 => None,
        _ if !n.is_multiple_of(2) => Some(sorted[n / 2]),
        _ => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2.0),
    }
}

/// For each rank, the median of the *other* ranks' known times (`None`
/// when no other rank's is known). One sort for the whole world: a rank's
/// others are the sorted times without its own entry, so their median is
/// read off by index (a world of thousands of ranks costs one sort a step,
/// not one per rank).
pub fn medians_of_the_others(times: &[Option<f64>]) -> Vec<Option<f64>> {
    let mut sorted: Vec<(f64, usize)> = times.iter().enumerate().filter_map(|(r, t)| Some(((*t)?, r))).collect();
    sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
    // Where each known rank sits in `sorted`.
    let mut at = vec![None; times.len()];
    for (i, (_, rank)) in sorted.iter().enumerate() {
        at[*rank] = Some(i);
    }
    let median_without = |skip: Option<usize>| {
        let n = sorted.len() - usize::from(skip.is_some());
        // The i-th of the others: `sorted` with index `skip` left out.
        let nth = |i: usize| sorted[if skip.is_some_and(|s| i >= s) { i + 1 } else { i }].0;
        match n {
            0 => None,
            _ if !n.is_multiple_of(2) => Some(nth(n / 2)),
            _ => Some((nth(n / 2 - 1) + nth(n / 2)) / 2.0),
        }
    };
    at.iter().map(|skip| median_without(*skip)).collect()
}

/// One rank's current run of slow steps: its seconds and the medians it
/// was compared with.
#[derive(Debug, Clone, Default)]
struct Run {
    mine: Vec<f64>,
    medians: Vec<f64>,
    reported: bool,
}

impl Run {
    /// Takes in one step; returns the straggler when this step completes
    /// the run (once).
    fn step(
        &mut self,
        rule: &Rule,
        rank: usize,
        step: u64,
        seconds: Option<f64>,
        median: Option<f64>,
    ) -> Option<Straggler> {
        if self.reported {
            return None;
        }
        let (Some(seconds), Some(median)) = (seconds, median) else {
            self.mine.clear();
            self.medians.clear();
            return None;
        };
        if !rule.slow(seconds, median) {
            self.mine.clear();
            self.medians.clear();
            return None;
        }
        self.mine.push(seconds);
        self.medians.push(median);
        if (self.mine.len() as u64) < rule.steps {
            return None;
        }
        self.reported = true;
        let found = Straggler {
            rank,
            step,
            step_seconds: median_or_zero(&self.mine),
            median_seconds: median_or_zero(&self.medians),
        };
        self.mine = Vec::new();
        self.medians = Vec::new();
        Some(found)
    }
}

fn median_or_zero(values: &[f64]) -> f64 {
    median(values).unwrap_or(0.0)
}

/// The detector of one attempt: a world's ranks, or a process alone.
#[derive(Debug, Clone)]
pub struct Detector {
    rule: Rule,
    size: usize,
    kind: Kind,
}

#[derive(Debug, Clone)]
enum Kind {
    /// One run of slow steps per rank.
    World(Vec<Run>),
    /// The first steps until they make the baseline, then the baseline.
    Alone { first: Vec<f64>, baseline: Option<f64>, run: Run },
}

impl Detector {
    /// A detector for a world of `size` ranks (1: a process alone).
    pub fn new(rule: Rule, size: usize) -> Detector {
        let kind = if size > 1 {
            Kind::World(vec![Run::default(); size])
        } else {
            Kind::Alone { first: Vec::new(), baseline: None, run: Run::default() }
        };
        Detector { rule, size, kind }
    }

    /// Its rule.
    pub fn rule(&self) -> &Rule {
        &self.rule
    }

    /// The ranks it watches (1: a process alone).
    pub fn size(&self) -> usize {
        self.size
    }

    /// Takes in step `step`'s seconds: one per rank, in rank order, for a
    /// world (a time that is not finite, or missing, is not known); one for
    /// a process alone. Returns the stragglers this step completes.
    pub fn observe(&mut self, step: u64, seconds: &[f64]) -> Vec<Straggler> {
        let known = |s: Option<&f64>| s.copied().filter(|s| s.is_finite() && *s >= 0.0);
        let rule = &self.rule;
        match &mut self.kind {
            Kind::World(runs) => {
                let times: Vec<Option<f64>> = (0..runs.len()).map(|r| known(seconds.get(r))).collect();
                let medians = medians_of_the_others(&times);
                let mut found = Vec::new();
                for (rank, run) in runs.iter_mut().enumerate() {
                    found.extend(run.step(rule, rank, step, times[rank], medians[rank]));
                }
                found
            }
            Kind::Alone { first, baseline, run } => {
                let Some(s) = known(seconds.first()) else { return Vec::new() };
                let Some(base) = *baseline else {
                    first.push(s);
                    if first.len() as u64 >= baseline_steps(rule) {
                        *baseline = median(first);
                        *first = Vec::new();
                    }
                    return Vec::new();
                };
                run.step(rule, 0, step, Some(s), Some(base)).into_iter().collect()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULE: Rule = Rule { factor: 1.5, steps: 3 };

    /// Feeds `steps` (one slice of seconds per step, from step 1) and
    /// returns every straggler found with the step it was found at.
    fn run(detector: &mut Detector, steps: &[&[f64]]) -> Vec<Straggler> {
        steps.iter().enumerate().flat_map(|(i, s)| detector.observe(i as u64 + 1, s)).collect()
    }

    #[test]
    fn medians_of_odd_even_and_no_values() {
        let cases: [(&[f64], Option<f64>); 4] =
            [(&[], None), (&[0.3], Some(0.3)), (&[0.5, 0.1, 0.2], Some(0.2)), (&[0.4, 0.1, 0.2, 0.3], Some(0.25))];
        for (values, expected) in cases {
            assert_eq!(median(values), expected, "{values:?}");
        }
    }

    #[test]
    fn the_median_of_the_others_leaves_each_rank_out_and_skips_unknown_times() {
        type Times<'a> = &'a [Option<f64>];
        let cases: [(Times, Times); 5] = [
            (&[Some(0.1), Some(0.3)], &[Some(0.3), Some(0.1)]),
            (&[Some(0.75), Some(0.25), Some(0.5)], &[Some(0.375), Some(0.625), Some(0.5)]),
            (&[Some(0.1), None, Some(0.5)], &[Some(0.5), Some(0.3), Some(0.1)]),
            (&[Some(0.1)], &[None]),
            (&[None, None], &[None, None]),
        ];
        for (times, expected) in cases {
            assert_eq!(medians_of_the_others(times), expected, "{times:?}");
        }
        // The same as leaving each rank out by hand, ties and all.
        let times: Vec<Option<f64>> =
            [0.4, 0.1, 0.1, 0.9, 0.3, 0.3, 0.2].iter().map(|t| Some(*t)).chain([None]).collect();
        for (rank, got) in medians_of_the_others(&times).into_iter().enumerate() {
            let others: Vec<f64> =
                times.iter().enumerate().filter(|(r, _)| *r != rank).filter_map(|(_, t)| *t).collect();
            assert_eq!(got, median(&others), "rank {rank}");
        }
    }

    #[test]
    fn a_step_is_slow_past_the_factor_and_the_least_excess() {
        let cases = [
            (0.151, 0.100, true),
            (0.150, 0.100, false), // exactly the factor is not past it
            (0.014, 0.005, false), // 2.8x but only 9 ms more: noise
            (0.016, 0.005, true),  // 3.2x and 11 ms more
            (0.100, 0.100, false),
            (0.050, 0.100, false),
        ];
        for (seconds, median, slow) in cases {
            assert_eq!(RULE.slow(seconds, median), slow, "{seconds} against {median}");
        }
    }

    #[test]
    fn in_a_world_of_two_the_slow_rank_is_found_after_its_run_of_slow_steps_once() {
        let mut d = Detector::new(RULE, 2);
        let slow: &[f64] = &[0.100, 0.300];
        let found = run(&mut d, &[&[0.1, 0.1], slow, slow, slow, slow, slow, slow, slow]);
        assert_eq!(found, [Straggler { rank: 1, step: 4, step_seconds: 0.3, median_seconds: 0.1 }]);
    }

    #[test]
    fn a_run_broken_by_one_normal_step_or_an_unknown_time_starts_again() {
        let mut d = Detector::new(RULE, 2);
        let slow: &[f64] = &[0.1, 0.3];
        let fine: &[f64] = &[0.1, 0.12];
        let unknown: &[f64] = &[0.1, f64::NAN];
        assert!(run(&mut d, &[slow, slow, fine, slow, slow, unknown, slow, slow]).is_empty());
        let found = d.observe(9, slow);
        assert_eq!(found.iter().map(|s| (s.rank, s.step)).collect::<Vec<_>>(), [(1, 9)]);
    }

    #[test]
    fn each_rank_is_judged_against_the_median_of_the_others_and_reported_once() {
        let mut d = Detector::new(RULE, 5);
        // Rank 3 slow from step 1, rank 0 from step 3; the others steady.
        let steps: Vec<Vec<f64>> = (1..=10)
            .map(|step| {
                let r0 = if step >= 3 { 0.9 } else { 0.2 };
                vec![r0, 0.2, 0.21, 0.5 + step as f64 * 0.01, 0.19]
            })
            .collect();
        let refs: Vec<&[f64]> = steps.iter().map(Vec::as_slice).collect();
        let found = run(&mut d, &refs);
        let got: Vec<(usize, u64)> = found.iter().map(|s| (s.rank, s.step)).collect();
        assert_eq!(got, [(3, 3), (0, 5)]);
        // Rank 3's seconds over its run (0.51, 0.52, 0.53) against the
        // others' medians ((0.2, 0.2, 0.21, 0.19) → 0.2 for steps 1–2, and
        // (0.9, 0.2, 0.21, 0.19) → 0.205 at step 3).
        assert!((found[0].step_seconds - 0.52).abs() < 1e-12, "{found:?}");
        assert!((found[0].median_seconds - 0.2).abs() < 1e-12, "{found:?}");
    }

    #[test]
    fn a_world_slow_as_a_whole_has_no_straggler() {
        let mut d = Detector::new(RULE, 3);
        let steps: Vec<Vec<f64>> = (0..20).map(|i| vec![0.1 * (1 + i) as f64; 3]).collect();
        let refs: Vec<&[f64]> = steps.iter().map(Vec::as_slice).collect();
        assert!(run(&mut d, &refs).is_empty());
    }

    #[test]
    fn a_process_alone_compares_with_its_own_first_steps() {
        let rule = Rule { factor: 1.5, steps: 3 };
        let mut d = Detector::new(rule, 1);
        // The baseline: the first MIN_BASELINE_STEPS steps (a slow warm-up
        // step among them does not move the median).
        let mut steps: Vec<f64> = vec![2.0];
        steps.extend([0.1; 9]);
        // Throttled: 0.25 s a step from step 11.
        steps.extend([0.25; 10]);
        let refs: Vec<[f64; 1]> = steps.iter().map(|s| [*s]).collect();
        let refs: Vec<&[f64]> = refs.iter().map(|s| s.as_slice()).collect();
        let found = run(&mut d, &refs);
        assert_eq!(found, [Straggler { rank: 0, step: 13, step_seconds: 0.25, median_seconds: 0.1 }]);
    }

    #[test]
    fn a_process_alone_that_stays_steady_or_gets_faster_is_never_reported() {
        let mut d = Detector::new(RULE, 1);
        let steps: Vec<[f64; 1]> = (0..60).map(|i| [if i < 30 { 0.2 } else { 0.05 }]).collect();
        let refs: Vec<&[f64]> = steps.iter().map(|s| s.as_slice()).collect();
        assert!(run(&mut d, &refs).is_empty());
    }

    #[test]
    fn the_baseline_of_a_process_alone_is_at_least_ten_steps() {
        assert_eq!(baseline_steps(&Rule { factor: 2.0, steps: 1 }), MIN_BASELINE_STEPS);
        assert_eq!(baseline_steps(&Rule { factor: 2.0, steps: 20 }), 20);
    }

    #[test]
    fn the_event_names_the_rank_its_node_the_rule_and_the_blame() {
        let found = Straggler { rank: 1, step: 40, step_seconds: 0.3, median_seconds: 0.1 };
        let e = found.event("n2".into(), &RULE, true, 2);
        let expected = telemetry::Straggler {
            rank: 1,
            rank_node: "n2".into(),
            step: 40,
            step_seconds: 0.3,
            median_seconds: 0.1,
            factor: 1.5,
            steps: 3,
            blamed: true,
            world_size: 2,
        };
        assert_eq!(e, expected);
    }

    #[test]
    fn zero_steps_turns_the_detection_off() {
        let health = HealthSection { straggler_steps: 0, ..HealthSection::default() };
        assert_eq!(Rule::of(&health), None);
        assert_eq!(Rule::of(&HealthSection::default()), Some(Rule { factor: 1.5, steps: 20 }));
    }
}
