//! How the command line writes: its user-facing output on stdout and its
//! messages on stderr, neither of which may panic (`print!` does on a closed
//! pipe or a full disk), and `--json` or human-readable output from one call.
//! Every handler writes through the `out!`/`outln!`/`errln!` macros here;
//! [`warn_if_stdout_lost`] tells, once the command ends, of output that could
//! not be written.
//!
//! What is printed comes in part from files anyone may have written (a run
//! directory's records, a dataset's lines, a program's error text), so
//! terminal control characters in it are escaped ([`escape_controls`]): a
//! record cannot retitle the terminal, move its cursor or erase lines. The
//! one sequence rekindle sends on purpose (`status --watch` clearing the
//! screen) goes through [`write_out_raw`].

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
    write_out_raw(format_args!("{}", escape_controls(&args.to_string())));
}

/// [`write_out`] without escaping: only for what rekindle itself writes as
/// terminal control (clearing the screen), never for text from a file.
pub(super) fn write_out_raw(args: std::fmt::Arguments<'_>) {
    if STDOUT_ERROR.get().is_some() {
        return;
    }
    let mut stdout = io::stdout().lock();
    if let Err(e) = stdout.write_fmt(args).and_then(|()| stdout.flush()) {
        let _ = STDOUT_ERROR.set(e);
    }
}

/// `text` with every terminal control character but newline and tab
/// written out as an escape: C0 controls (ESC included) as `\x1b`, DEL and
/// C1 controls (which some terminals obey as ESC sequences) as `\u009b`.
/// Borrowed when there is none.
pub fn escape_controls(text: &str) -> std::borrow::Cow<'_, str> {
    let is_control = |c: char| c.is_control() && c != '\n' && c != '\t';
    if !text.chars().any(is_control) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            c if !is_control(c) => out.push(c),
            c if (c as u32) < 0x20 => {
                let _ = std::fmt::Write::write_fmt(&mut out, format_args!("\\x{:02x}", c as u32));
            }
            // JSON's own escape: inside `--json` output (where serde_json
            // leaves DEL and C1 raw) it reads back as the same character.
            c => {
                let _ = std::fmt::Write::write_fmt(&mut out, format_args!("\\u{:04x}", c as u32));
            }
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Whether writing to stdout has failed (a reader gone, a full disk): a
/// command that would go on writing (`status --watch`) stops.
pub(super) fn stdout_lost() -> bool {
    STDOUT_ERROR.get().is_some()
}

/// Writes a message to stderr, never panicking (as `eprintln!` does when
/// stderr cannot be written): a message that cannot be written is dropped.
pub(super) fn write_err(args: std::fmt::Arguments<'_>) {
    let _ = io::stderr().write_fmt(format_args!("{}", escape_controls(&args.to_string())));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_controls_from_records_are_escaped_and_text_is_kept() {
        assert_eq!(escape_controls("step 5\tloss 0.1\nnext"), "step 5\tloss 0.1\nnext");
        assert!(matches!(escape_controls("plain ünïcode"), std::borrow::Cow::Borrowed(_)));
        assert_eq!(escape_controls("\x1b]0;owned\x07x\x1b[2K"), "\\x1b]0;owned\\x07x\\x1b[2K");
        assert_eq!(escape_controls("a\rb\x7fc\u{9b}31m"), "a\\x0db\\u007fc\\u009b31m");
        let json = serde_json::to_string(&serde_json::json!({"reason": "\x1b\u{9b}\x7f"})).unwrap();
        let shown = escape_controls(&json);
        assert_eq!(serde_json::from_str::<serde_json::Value>(&shown).unwrap()["reason"], "\x1b\u{9b}\x7f");
    }
}
