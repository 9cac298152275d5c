//! `rekindle bench ...`: each benchmark's flags turned into its options, and
//! its result printed (the numbers of docs/performance.md).

use super::CliError;
use super::args::{
    BenchBoardArgs, BenchCheckpointArgs, BenchCollectiveArgs, BenchIntervalArgs, BenchLivenessArgs, BenchTrainArgs,
    WriteModeArg,
};
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
        write: write_settings(args),
    };
    let result = crate::bench::run_checkpoint_bench(&opts)?;
    emit(&result, args.output.json);
    Ok(Outcome::Done)
}

/// The write settings of `bench checkpoint`'s flags.
fn write_settings(args: &BenchCheckpointArgs) -> crate::checkpoint::WriteSettings {
    use crate::checkpoint::write_mode::ModeSetting;
    crate::checkpoint::WriteSettings {
        mode: match args.write_mode {
            WriteModeArg::Auto => ModeSetting::Auto,
            WriteModeArg::Direct => ModeSetting::Direct,
            WriteModeArg::Buffered => ModeSetting::Buffered,
        },
        block_bytes: args.write_block.map(|b| b as usize),
        queue_depth: args.write_queue_depth,
        shard_bytes: args.shard_size,
    }
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

pub(super) fn liveness(args: &BenchLivenessArgs) -> Result<Outcome, CliError> {
    let opts = crate::bench::LivenessBenchOptions {
        ranks: args.ranks.clone(),
        per_node: args.per_node,
        timeout: args.timeout,
        measure: args.measure,
        dir: args.dir.clone(),
    };
    emit(&crate::bench::run_liveness_bench(&opts)?, args.output.json);
    Ok(Outcome::Done)
}

pub(super) fn board(args: &BenchBoardArgs) -> Result<Outcome, CliError> {
    let opts = crate::bench::BoardBenchOptions { tasks: args.tasks.clone(), wait: args.wait, dir: args.dir.clone() };
    emit(&crate::bench::run_board_bench(&opts)?, args.output.json);
    Ok(Outcome::Done)
}
