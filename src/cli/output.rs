//! How the command line writes: its user-facing output on stdout and its
//! messages on stderr, neither of which may panic (`print!` does on a closed
//! pipe or a full disk), and `--json` or human-readable output from one call.
//! Every handler writes through the `out!`/`outln!`/`errln!` macros here;
//! [`warn_if_stdout_lost`] tells, once the command ends, of output that could
//! not be written.

use std::io::{self, Write};
use std::sync::OnceLock;

use serde::Serialize;

/// `print!` to stdout through [`write_out`]: cannot panic.
macro_rules! out {
    ($($arg:tt)*) => { $crate::cli::output::write_out(format_args!($($arg)*)) };
}

/// `println!` to stdout through [`write_out`]: cannot panic.
macro_rules! outln {
    ($($arg:tt)*) => { $crate::cli::output::write_out(format_args!("{}\n", format_args!($($arg)*))) };
}

/// `eprintln!` through [`write_err`]: cannot panic.
macro_rules! errln {
    ($($arg:tt)*) => { $crate::cli::output::write_err(format_args!("{}\n", format_args!($($arg)*))) };
}

/// The first error writing the command's output to stdout; output after it
/// is dropped.
static STDOUT_ERROR: OnceLock<io::Error> = OnceLock::new();

/// Writes the command's output to stdout, never panicking (as `print!` does
/// on a closed pipe or a full disk): once a write fails, that error is kept
/// and later output dropped. A reader that went away (`rekindle status |
/// head -1`) ends the output quietly; any other failure is told on stderr as
/// the command ends. Either way the exit code stays the command's own: it
/// reports what the command found or did, not whether it could be printed.
pub(super) fn write_out(args: std::fmt::Arguments<'_>) {
    if STDOUT_ERROR.get().is_some() {
        return;
    }
    let mut stdout = io::stdout().lock();
    if let Err(e) = stdout.write_fmt(args).and_then(|()| stdout.flush()) {
        let _ = STDOUT_ERROR.set(e);
    }
}

/// Whether writing to stdout has failed (a reader gone, a full disk): a
/// command that would go on writing (`status --watch`) stops.
pub(super) fn stdout_lost() -> bool {
    STDOUT_ERROR.get().is_some()
}

/// Writes a message to stderr, never panicking (as `eprintln!` does when
/// stderr cannot be written): a message that cannot be written is dropped.
pub(super) fn write_err(args: std::fmt::Arguments<'_>) {
    let _ = io::stderr().write_fmt(args);
}

/// Warns on stderr when the command's output could not all be written to
/// stdout, unless only because its reader went away.
pub(super) fn warn_if_stdout_lost() {
    if let Some(e) = STDOUT_ERROR.get()
        && e.kind() != io::ErrorKind::BrokenPipe
    {
        errln!(
            "warning: this command's output could not be written to stdout ({e}) and is incomplete: run it again with stdout somewhere it can be written"
        );
    }
}

/// Prints `value` as pretty JSON (`--json`) or as its human-readable Display.
pub(super) fn emit<T: Serialize + std::fmt::Display>(value: &T, json: bool) {
    if json {
        outln!("{}", serde_json::to_string_pretty(value).expect("command output serialises"));
    } else {
        out!("{value}");
    }
}
