//! The program's stderr, on a thread of its own: passed through to ours as
//! it comes, split into lines, each redacted (`telemetry::Redactor`, one
//! [`StreamRedactor`] for the stream) and the last [`TAIL_LINES`] kept for the
//! `child_exit` event.
//!
//! Why a thread: the supervisor's one thread handles stops, the deadline,
//! the lock and lost tasks; reading, redacting and writing a line must never
//! delay those (a stalled file system under slurm-%j.out blocks the write; a
//! long line costs its redaction). The supervisor never waits on this
//! thread, except for child.rs's `STDERR_DRAIN` after the program ended.
//!
//! Why lines are bounded: a program may write without a newline for its
//! whole run (a progress bar that only writes `\r`, a binary dump). A line
//! ends at `\n` or `\r` (a `\r\n` is one ending, and an empty line ended by
//! `\r` is no line), and one longer than [`LINE_LIMIT`] keeps its first
//! [`LINE_LIMIT`] bytes: the rest, up to its end, is counted and dropped.
//! The pass-through to our stderr is byte for byte, whatever the lines.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::telemetry::{Redactor, StreamRedactor};

/// Lines of the child's stderr kept for the `child_exit` event.
pub const TAIL_LINES: usize = 20;
/// Bytes kept of each such line (after redaction), before the mark of what
/// was cut.
pub const TAIL_LINE_BYTES: usize = 500;
/// The longest line redacted whole; the rest of a longer one is dropped.
pub const LINE_LIMIT: usize = 64 << 10;

/// The kept tail, shared between the reading thread and the supervisor.
pub type Tail = Arc<Mutex<VecDeque<String>>>;

/// Splits a byte stream into lines of at most `limit` bytes (module header).
#[derive(Debug)]
pub struct LineSplitter {
    limit: usize,
    line: Vec<u8>,
    /// Bytes of the current line past `limit`.
    cut: u64,
    /// The last byte fed was a `\r` (a `\n` right after it ends nothing).
    after_cr: bool,
}

impl LineSplitter {
    pub fn new(limit: usize) -> LineSplitter {
        LineSplitter { limit, line: Vec::new(), cut: 0, after_cr: false }
    }

    /// Feeds `bytes`; `emit` gets each line ended in them (without its
    /// ending) and the count of its bytes cut.
    pub fn feed(&mut self, bytes: &[u8], mut emit: impl FnMut(&[u8], u64)) {
        let mut rest = bytes;
        while !rest.is_empty() {
            let end = rest.iter().position(|&b| b == b'\n' || b == b'\r');
            let body = &rest[..end.unwrap_or(rest.len())];
            let room = self.limit.saturating_sub(self.line.len()).min(body.len());
            self.line.extend_from_slice(&body[..room]);
            self.cut += (body.len() - room) as u64;
            if !body.is_empty() {
                self.after_cr = false;
            }
            let Some(end) = end else { break };
            let ending = rest[end];
            match ending {
                b'\n' if self.after_cr => {}
                b'\r' if self.line.is_empty() && self.cut == 0 => {}
                _ => self.emit(&mut emit),
            }
            self.after_cr = ending == b'\r';
            rest = &rest[end + 1..];
        }
    }

    /// The stream ended: a last line without an ending is emitted.
    pub fn finish(&mut self, mut emit: impl FnMut(&[u8], u64)) {
        if !self.line.is_empty() || self.cut > 0 {
            self.emit(&mut emit);
        }
    }

    fn emit(&mut self, emit: &mut impl FnMut(&[u8], u64)) {
        emit(&self.line, self.cut);
        self.line.clear();
        self.cut = 0;
    }
}

/// Starts the thread that tees `stderr` (the read end of the program's
/// stderr pipe) into ours and keeps its redacted tail in `tail`; the flag
/// it returns is set when the stream ended (every line is in `tail` then).
pub fn tee(stderr: std::io::PipeReader, tail: Tail, redactor: Redactor) -> std::io::Result<Arc<AtomicBool>> {
    let ended = Arc::new(AtomicBool::new(false));
    let done = Arc::clone(&ended);
    std::thread::Builder::new().name("rekindle-stderr".into()).spawn(move || {
        tee_on_this_thread(stderr, std::io::stderr(), &tail, &redactor);
        done.store(true, Ordering::Release);
    })?;
    Ok(ended)
}

/// The loop of [`tee`]: until `input` ends (or fails).
fn tee_on_this_thread(mut input: impl Read, mut ours: impl Write, tail: &Tail, redactor: &Redactor) {
    let mut lines = redactor.lines();
    let mut splitter = LineSplitter::new(LINE_LIMIT);
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        // A write that fails (our stderr closed) loses only the pass-through.
        let _ = ours.write_all(&buf[..n]);
        splitter.feed(&buf[..n], |line, cut| keep_line(tail, &mut lines, line, cut));
    }
    splitter.finish(|line, cut| keep_line(tail, &mut lines, line, cut));
    let _ = ours.flush();
}

/// Adds one stderr line to the bounded tail, redacted before it is cut (a
/// cut must not leave half a secret the rules no longer recognise); the
/// tail's lock is held only to push it.
fn keep_line(tail: &Tail, lines: &mut StreamRedactor<'_>, line: &[u8], cut: u64) {
    let kept = tail_line(lines, line, cut);
    let mut tail = tail.lock().unwrap_or_else(PoisonError::into_inner);
    if tail.len() == TAIL_LINES {
        tail.pop_front();
    }
    tail.push_back(kept);
}

/// A line as the tail keeps it: redacted, cut to [`TAIL_LINE_BYTES`], and
/// marked with the count of bytes cut (here or at [`LINE_LIMIT`]).
fn tail_line(lines: &mut StreamRedactor<'_>, line: &[u8], cut: u64) -> String {
    let text = lines.line(&String::from_utf8_lossy(line));
    let mut end = text.len().min(TAIL_LINE_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let cut = cut + (text.len() - end) as u64;
    if cut == 0 { text } else { format!("{} […{cut} bytes cut]", &text[..end]) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(limit: usize, chunks: &[&[u8]]) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        let mut s = LineSplitter::new(limit);
        for chunk in chunks {
            s.feed(chunk, |l, cut| out.push((String::from_utf8_lossy(l).into_owned(), cut)));
        }
        s.finish(|l, cut| out.push((String::from_utf8_lossy(l).into_owned(), cut)));
        out
    }

    fn lines(list: &[(&str, u64)]) -> Vec<(String, u64)> {
        list.iter().map(|(l, c)| (l.to_string(), *c)).collect()
    }

    #[test]
    fn lines_end_at_newline_or_carriage_return_and_crlf_is_one_ending() {
        assert_eq!(split(100, &[b"a\nb\r\nc\rd"]), lines(&[("a", 0), ("b", 0), ("c", 0), ("d", 0)]));
        assert_eq!(split(100, &[b"a\r", b"\nb\n\n"]), lines(&[("a", 0), ("b", 0), ("", 0)]), "split across reads");
        // A progress bar: `\r` before each update, no newline.
        assert_eq!(split(100, &[b"\r 1%\r 2%", b"\r 3%\n"]), lines(&[(" 1%", 0), (" 2%", 0), (" 3%", 0)]));
    }

    #[test]
    fn a_long_line_is_cut_at_the_limit_and_the_rest_counted() {
        assert_eq!(split(4, &[b"abcdefg\nhi", b"jklmn", b"op\nq"]), lines(&[("abcd", 3), ("hijk", 5), ("q", 0)]));
        assert_eq!(split(4, &[b"abcdef"]), lines(&[("abcd", 2)]), "an unended long line at the end");
    }

    #[test]
    fn the_tail_keeps_the_last_lines_each_bounded_and_marked_when_cut() {
        let tail = Tail::default();
        let r = Redactor::default();
        let mut input = String::new();
        for i in 0..30 {
            input.push_str(&format!("line {i}\n"));
        }
        input.push_str(&"é".repeat(400));
        input.push_str("\r\n\u{fffd} bad utf-8\r\n");
        let mut input = input.into_bytes();
        input.extend_from_slice(b"\xff\xfe tail\n");
        let mut ours = Vec::new();
        tee_on_this_thread(&input[..], &mut ours, &tail, &r);
        assert_eq!(ours, input, "passed through byte for byte");
        let tail = tail.lock().unwrap();
        assert_eq!(tail.len(), TAIL_LINES);
        assert_eq!((tail[0].as_str(), tail[16].as_str()), ("line 13", "line 29"));
        let (kept, mark) = tail[17].split_once(" […").unwrap();
        assert!(kept.len() <= TAIL_LINE_BYTES && kept.chars().all(|c| c == 'é'), "{kept}");
        assert_eq!(mark, format!("{} bytes cut]", 800 - kept.len()));
        assert_eq!(tail[19], "\u{fffd}\u{fffd} tail");
    }

    #[test]
    fn the_tail_is_redacted_before_it_is_cut_and_a_yaml_value_below_its_key_too() {
        let r = Redactor::new(&crate::config::Config::default().telemetry.secret_words);
        let tail = Tail::default();
        // Cut first, this line would end in `https://user:hunter2`: no `@`
        // left to recognise the credentials by.
        let long = format!("{} https://user:hunter2@example.com/x\n", "x".repeat(TAIL_LINE_BYTES - 21));
        let input =
            format!("HF_TOKEN=hf_TEST123 from https://user:hunter2@example.com/x\n{long}password:\n  hunter2\n");
        tee_on_this_thread(input.as_bytes(), std::io::sink(), &tail, &r);
        let tail = tail.lock().unwrap();
        assert_eq!(tail[0], "HF_TOKEN=*** from https://***@example.com/x");
        assert!(tail[1].contains(" https://***@example.") && !tail[1].contains("hunter2"), "{}", tail[1]);
        assert_eq!((tail[2].as_str(), tail[3].as_str()), ("password:", "  ***"));
    }

    #[test]
    fn a_megabyte_line_without_a_newline_costs_a_bounded_buffer() {
        let tail = Tail::default();
        let r = Redactor::new(&crate::config::Config::default().telemetry.secret_words);
        let input = "://".repeat(1 << 20);
        tee_on_this_thread(input.as_bytes(), std::io::sink(), &tail, &r);
        let tail = tail.lock().unwrap();
        assert_eq!(tail.len(), 1);
        let cut: u64 = tail[0].rsplit_once(" […").unwrap().1.trim_end_matches(" bytes cut]").parse().unwrap();
        assert_eq!(cut as usize + TAIL_LINE_BYTES, 3 << 20, "{}", &tail[0][490..]);
    }
}
