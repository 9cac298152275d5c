//! Log set-up: readable timestamped lines by default (they end up in SLURM's
//! batch logs), JSON lines for log collectors; `RUST_LOG` wins over `-v`/`-q`.

use tracing_subscriber::EnvFilter;

/// How log lines are written to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// `2026-11-22T01:02:03.456Z  INFO message key=value`
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Verbosity and format chosen on the command line.
#[derive(Debug, Clone, Copy, Default)]
pub struct LogOptions {
    /// -v count (1: debug, 2+: trace).
    pub verbose: u8,
    /// -q: warnings and errors only.
    pub quiet: bool,
    pub format: LogFormat,
}

/// Installs the global subscriber. Safe to call more than once (later calls
/// are ignored), which keeps tests that call library entry points simple.
pub fn init_logging(opts: LogOptions) {
    let level = match (opts.quiet, opts.verbose) {
        (true, _) => "warn",
        (false, 0) => "info",
        (false, 1) => "debug",
        (false, _) => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(format!("rekindle={level},warn")));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false);
    let _ = match opts.format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}
