//! `rekindle run`, `exec` and `seal`: the commands that train, the two
//! drivers (`run` for the built-in and registered candle models, `exec` for
//! any program) and the checkpoint commit a program under `exec` asks for.
//! Thin: flags become the driver's options, the driver does the work.

use super::CliError;
use super::args::{ExecArgs, RunArgs, SealArgs};
use crate::exec;
use crate::exit::Outcome;
use crate::run::RunOptions;
use crate::train::Registry;

pub(super) fn run(args: RunArgs, registry: &Registry) -> Result<Outcome, CliError> {
    let opts = RunOptions {
        registry: registry.clone(),
        config_path: args.config,
        overrides: args.set.overrides,
        run_dir: args.run_dir,
        allow_config_change: args.allow_config_change,
        stop_at_step: args.stop_at_step,
    };
    Ok(crate::run::run(&opts)?)
}

pub(super) fn exec(args: ExecArgs) -> Result<Outcome, CliError> {
    let opts = exec::ExecOptions {
        config_path: args.config,
        overrides: args.set.overrides,
        run_dir: args.run_dir,
        allow_config_change: args.allow_config_change,
        command: args.command,
    };
    Ok(exec::exec(&opts)?)
}

pub(super) fn seal(args: SealArgs) -> Result<Outcome, CliError> {
    let opts = exec::SealOptions {
        staged: args.dir,
        step: args.step,
        run_dir: args.run_dir,
        rank: args.rank.zip(args.world_size),
    };
    let dir = exec::seal(&opts)?;
    outln!("{}", dir.display());
    Ok(Outcome::Done)
}
