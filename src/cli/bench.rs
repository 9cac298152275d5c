//! `rekindle bench ...`: each benchmark's flags turned into its options, and
//! its result printed (the numbers of docs/performance.md).

use super::CliError;
use super::args::{BenchCheckpointArgs, BenchCollectiveArgs, BenchIntervalArgs, BenchTrainArgs};
use super::output::emit;
use crate::config;
use crate::exit::Outcome;
use crate::train::Registry;

pub(super) fn checkpoint(args: &BenchCheckpointArgs) -> Result<Outcome, CliError> {
    let opts = crate::bench::CheckpointBenchOptions {
        bytes: args.bytes,
        dir: args.dir.clone(),
        repeat: args.repeat,
        cold: args.cold,
    };
    let result = crate::bench::run_checkpoint_bench(&opts)?;
    emit(&result, args.output.json);
    Ok(Outcome::Done)
}

pub(super) fn train(args: &BenchTrainArgs, registry: &Registry) -> Result<Outcome, CliError> {
    let cfg = config::load_with(&args.config, &args.set.overrides, registry)?.config;
    let result = crate::bench::run_train_bench(&cfg, registry, args.steps, args.every, args.dir.clone())?;
    emit(&result, args.output.json);
    Ok(Outcome::Done)
}

pub(super) fn collective(args: &BenchCollectiveArgs) -> Result<Outcome, CliError> {
    if let Some(result) = crate::bench::run_collective_bench(args.bytes, args.iterations)? {
        emit(&result, args.output.json);
    }
    Ok(Outcome::Done)
}

pub(super) fn interval(args: &BenchIntervalArgs) -> Result<Outcome, CliError> {
    let opts = crate::bench::IntervalBenchOptions {
        stall: args.stall,
        persist: args.persist,
        work: args.work,
        fixed: args.fixed,
        mtbfs: args.mtbf.clone(),
        runs: args.runs,
        seed: args.seed,
    };
    emit(&crate::bench::run_interval_bench(&opts), args.output.json);
    Ok(Outcome::Done)
}
