//! The `rekindle` binary: the whole command line over the built-in models
//! (`rekindle::cli::main_with`; a program with models of its own calls it
//! with its own registry, see docs/workloads.md).

use std::process::ExitCode;

use rekindle::train::Registry;

fn main() -> ExitCode {
    rekindle::cli::main_with(Registry::builtin())
}
