//! Log set-up: readable timestamped lines by default (they end up in SLURM's
//! batch logs), JSON lines for log collectors; `RUST_LOG` wins over `-v`/`-q`.
//!
//! The log is the least important thing rekindle writes: a line that cannot
//! be written (stderr on a full file system, a closed pipe, stderr gone) is
//! dropped and counted, never an error and never a panic, so training, its
//! checkpoints and the exit code go on as if it had been written.
//! [`report_lost_log_lines`] says how many were lost, once, at the end.

use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

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

/// Log lines of this process that could not be written to stderr.
static LOST_LINES: AtomicU64 = AtomicU64::new(0);

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
        .with_writer(Lossy::new(io::stderr, &LOST_LINES))
        // Our writer never fails; should a write error reach the layer all
        // the same, it must not print about it (with `eprintln!`, which
        // panics when stderr is what failed).
        .log_internal_errors(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false);
    let _ = match opts.format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// Log lines of this process that could not be written to stderr so far.
pub fn lost_log_lines() -> u64 {
    LOST_LINES.load(Ordering::Relaxed)
}

/// Logs a warning with the number of log lines lost so far, if any: seen
/// when stderr accepts lines again (a full file system that got space back),
/// and itself counted as lost otherwise. Called once, as the command ends.
pub fn report_lost_log_lines() {
    let lost = lost_log_lines();
    if lost > 0 {
        tracing::warn!(lost_lines = lost, "{lost} log line(s) could not be written to stderr and were dropped");
    }
}

/// A [`MakeWriter`] whose writers never fail: a log line (one writer, made
/// per event by the fmt layer) that cannot be written in full is dropped and
/// counted in `lost`, and the layer is told it was written.
#[derive(Debug, Clone, Copy)]
pub struct Lossy<M> {
    inner: M,
    lost: &'static AtomicU64,
}

impl<M> Lossy<M> {
    /// Wraps `inner`, counting the lines it could not write in `lost`.
    pub fn new(inner: M, lost: &'static AtomicU64) -> Lossy<M> {
        Lossy { inner, lost }
    }
}

impl<'a, M: MakeWriter<'a>> MakeWriter<'a> for Lossy<M> {
    type Writer = LossyWriter<M::Writer>;

    fn make_writer(&'a self) -> Self::Writer {
        LossyWriter { inner: self.inner.make_writer(), lost: self.lost, failed: false }
    }
}

/// One log line's writer of [`Lossy`]: after its first error it writes
/// nothing more, and when dropped it counts its line as lost.
#[derive(Debug)]
pub struct LossyWriter<W> {
    inner: W,
    lost: &'static AtomicU64,
    failed: bool,
}

impl<W: Write> Write for LossyWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.failed {
            return Ok(buf.len());
        }
        loop {
            match self.inner.write(buf) {
                // A writer that takes nothing would make `write_all` fail.
                Ok(0) if !buf.is_empty() => break,
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        self.failed = true;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if !self.failed && self.inner.flush().is_err() {
            self.failed = true;
        }
        Ok(())
    }
}

impl<W> Drop for LossyWriter<W> {
    fn drop(&mut self) {
        if self.failed {
            self.lost.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::{Arc, Mutex};

    /// A writer that fails (with `error`) once `room` bytes are taken, or
    /// takes everything while `room` is `None`.
    #[derive(Clone)]
    struct Sink {
        taken: Arc<Mutex<Vec<u8>>>,
        room: Arc<Mutex<Option<usize>>>,
        error: io::ErrorKind,
    }

    impl Sink {
        fn new(error: io::ErrorKind) -> Sink {
            Sink { taken: Arc::default(), room: Arc::default(), error }
        }

        fn text(&self) -> String {
            String::from_utf8(self.taken.lock().unwrap().clone()).unwrap()
        }
    }

    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let mut room = self.room.lock().unwrap();
            let n = match *room {
                None => buf.len(),
                Some(0) => return Err(io::Error::from(self.error)),
                Some(left) => buf.len().min(left),
            };
            if let Some(left) = room.as_mut() {
                *left -= n;
            }
            self.taken.lock().unwrap().extend_from_slice(&buf[..n]);
            Ok(n)
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Sink {
        type Writer = Sink;

        fn make_writer(&'a self) -> Sink {
            self.clone()
        }
    }

    /// Writes `line` as the fmt layer does: one writer, one `write_all`.
    fn log_line(make: &Lossy<Sink>, line: &str) -> io::Result<()> {
        make.make_writer().write_all(line.as_bytes())
    }

    #[test]
    fn lines_that_fit_are_written_and_none_is_counted_lost() {
        static LOST: AtomicU64 = AtomicU64::new(0);
        let sink = Sink::new(io::ErrorKind::StorageFull);
        let make = Lossy::new(sink.clone(), &LOST);
        log_line(&make, "one\n").unwrap();
        log_line(&make, "two\n").unwrap();
        assert_eq!(sink.text(), "one\ntwo\n");
        assert_eq!(LOST.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_full_disk_drops_and_counts_each_line_without_an_error() {
        static LOST: AtomicU64 = AtomicU64::new(0);
        let sink = Sink::new(io::ErrorKind::StorageFull);
        let make = Lossy::new(sink.clone(), &LOST);
        log_line(&make, "kept\n").unwrap();
        *sink.room.lock().unwrap() = Some(3);
        // Cut after three bytes, then full: the cut line counts as lost.
        log_line(&make, "torn line\n").unwrap();
        log_line(&make, "dropped\n").unwrap();
        log_line(&make, "dropped too\n").unwrap();
        assert_eq!(sink.text(), "kept\ntor");
        assert_eq!(LOST.load(Ordering::Relaxed), 3);
        // Space again: lines are written again, and the count stays.
        *sink.room.lock().unwrap() = None;
        log_line(&make, "back\n").unwrap();
        assert!(sink.text().ends_with("back\n"));
        assert_eq!(LOST.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn a_closed_pipe_is_a_lost_line_not_an_error() {
        static LOST: AtomicU64 = AtomicU64::new(0);
        let sink = Sink::new(io::ErrorKind::BrokenPipe);
        *sink.room.lock().unwrap() = Some(0);
        let make = Lossy::new(sink.clone(), &LOST);
        for _ in 0..5 {
            log_line(&make, "nobody reads this\n").unwrap();
        }
        let mut writer = make.make_writer();
        writer.flush().unwrap();
        drop(writer);
        assert_eq!(LOST.load(Ordering::Relaxed), 5);
        assert_eq!(sink.text(), "");
    }

    #[test]
    fn a_subscriber_on_a_failing_writer_keeps_logging_and_counts() {
        static LOST: AtomicU64 = AtomicU64::new(0);
        let sink = Sink::new(io::ErrorKind::StorageFull);
        *sink.room.lock().unwrap() = Some(0);
        let subscriber = tracing_subscriber::fmt()
            .with_writer(Lossy::new(sink.clone(), &LOST))
            .log_internal_errors(false)
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(step = 1, "first");
            tracing::warn!("second");
        });
        assert_eq!(LOST.load(Ordering::Relaxed), 2);
        assert_eq!(sink.text(), "");
    }
}
