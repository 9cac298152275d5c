//! The `rekindle` binary: parse the command line, run, map the result to an
//! exit code (the contract lives in `rekindle::exit`).

use std::process::ExitCode;

use clap::Parser;
use rekindle::cli::{Cli, execute};
use rekindle::telemetry::init_logging;

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Failpoints are compiled in only for test builds; this reads FAILPOINTS.
    let _failpoints = fail::FailScenario::setup();
    init_logging(cli.log_options());
    match execute(cli) {
        Ok(outcome) => outcome.into(),
        Err(e) => {
            let outcome = e.outcome();
            // Every error message already names its cause (the `{source}` is
            // part of each message), so print the top-level Display only:
            // walking the source chain as well would repeat the causes.
            eprintln!("error: {e}");
            outcome.into()
        }
    }
}
