//! `rekindle bench interval`: the expected work lost with `[checkpoint]
//! interval = "auto"` (Young/Daly, bounded, `checkpoint::interval`) against
//! fixed checkpoints, over a range of mean times between interruptions, by a
//! seeded Monte-Carlo simulation (`checkpoint::interval::simulate_lost_seconds`).

use std::time::Duration;

use serde::Serialize;

use crate::checkpoint::interval::{
    Costs, IntervalInputs, Mtbf, MtbfSource, SimJob, choose_interval, simulate_lost_seconds,
};

/// What to simulate.
#[derive(Debug, Clone)]
pub struct IntervalBenchOptions {
    /// Training stall per checkpoint (background saves).
    pub stall: Duration,
    /// Time for a snapshot to commit.
    pub persist: Duration,
    /// Training the job needs.
    pub work: Duration,
    /// The fixed interval compared against.
    pub fixed: Duration,
    pub mtbfs: Vec<Duration>,
    pub runs: u32,
    pub seed: u64,
}

/// One mean time between interruptions.
#[derive(Debug, Clone, Serialize)]
pub struct IntervalRow {
    pub mtbf_seconds: f64,
    pub auto_interval_seconds: f64,
    pub bound: Option<String>,
    /// Wall time beyond the work (stalls plus work redone), in hours.
    pub auto_lost_hours: f64,
    pub fixed_lost_hours: f64,
    /// The same, as a share of the work.
    pub auto_lost_fraction: f64,
    pub fixed_lost_fraction: f64,
}

/// The simulation's inputs and its table.
#[derive(Debug, Clone, Serialize)]
pub struct IntervalBench {
    pub stall_seconds: f64,
    pub persist_seconds: f64,
    pub work_seconds: f64,
    pub fixed_seconds: f64,
    pub runs: u32,
    pub seed: u64,
    pub rows: Vec<IntervalRow>,
}

/// Simulates every MTBF of `opts` under the `"auto"` choice and the fixed interval.
pub fn run_interval_bench(opts: &IntervalBenchOptions) -> IntervalBench {
    let job = SimJob {
        stall_seconds: opts.stall.as_secs_f64(),
        persist_seconds: opts.persist.as_secs_f64(),
        work_seconds: opts.work.as_secs_f64(),
    };
    let costs = Costs {
        stall_seconds: job.stall_seconds,
        persist_seconds: job.persist_seconds,
        slowdown_seconds: 0.0,
        background: true,
        saves: 3,
    };
    let rows = opts
        .mtbfs
        .iter()
        .map(|mtbf| {
            let m = mtbf.as_secs_f64();
            let inputs = IntervalInputs {
                costs: Some(costs),
                mtbf: Some(Mtbf { seconds: m, source: MtbfSource::Config }),
                remaining: None,
            };
            let choice = choose_interval(&inputs);
            let auto = simulate_lost_seconds(&job, choice.interval.as_secs_f64(), m, opts.runs, opts.seed);
            let fixed = simulate_lost_seconds(&job, opts.fixed.as_secs_f64(), m, opts.runs, opts.seed);
            IntervalRow {
                mtbf_seconds: m,
                auto_interval_seconds: choice.interval.as_secs_f64(),
                bound: choice.bound.map(|b| b.name().to_string()),
                auto_lost_hours: auto / 3600.0,
                fixed_lost_hours: fixed / 3600.0,
                auto_lost_fraction: auto / job.work_seconds,
                fixed_lost_fraction: fixed / job.work_seconds,
            }
        })
        .collect();
    IntervalBench {
        stall_seconds: job.stall_seconds,
        persist_seconds: job.persist_seconds,
        work_seconds: job.work_seconds,
        fixed_seconds: opts.fixed.as_secs_f64(),
        runs: opts.runs,
        seed: opts.seed,
        rows,
    }
}

fn human(seconds: f64) -> String {
    humantime::format_duration(Duration::from_secs(seconds.round() as u64)).to_string()
}

impl std::fmt::Display for IntervalBench {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "checkpoint interval: stall {}s, write {}s, {} of work, {} runs per cell (seed {})",
            self.stall_seconds,
            self.persist_seconds,
            human(self.work_seconds),
            self.runs,
            self.seed
        )?;
        let fixed = human(self.fixed_seconds);
        writeln!(f)?;
        writeln!(f, "| MTBF | \"auto\" interval | bound | lost, \"auto\" | lost, fixed {fixed} | \"auto\" / fixed |")?;
        writeln!(f, "|---|---|---|---|---|---|")?;
        for r in &self.rows {
            writeln!(
                f,
                "| {} | {} | {} | {:.1} h ({:.2} %) | {:.1} h ({:.2} %) | {:.2} |",
                human(r.mtbf_seconds),
                human(r.auto_interval_seconds),
                r.bound.as_deref().unwrap_or("–"),
                r.auto_lost_hours,
                100.0 * r.auto_lost_fraction,
                r.fixed_lost_hours,
                100.0 * r.fixed_lost_fraction,
                if r.fixed_lost_hours > 0.0 { r.auto_lost_hours / r.fixed_lost_hours } else { 1.0 },
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_loses_no_more_than_fixed_five_minutes_and_prints_a_table() {
        let opts = IntervalBenchOptions {
            stall: Duration::from_secs(5),
            persist: Duration::from_secs(60),
            work: Duration::from_secs(86_400),
            fixed: Duration::from_secs(300),
            mtbfs: vec![Duration::from_secs(1800), Duration::from_secs(86_400)],
            runs: 50,
            seed: 3,
        };
        let bench = run_interval_bench(&opts);
        assert_eq!(bench.rows.len(), 2);
        for r in &bench.rows {
            assert!(r.auto_lost_hours <= r.fixed_lost_hours * 1.05, "{r:?}");
        }
        let text = bench.to_string();
        assert!(text.contains("| 30m | "), "{text}");
        assert!(text.contains("lost, fixed 5m"), "{text}");
    }
}
