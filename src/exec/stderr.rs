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

    /// The redactor fuzzed as a program's stderr reaches it (issue #40):
    /// random bytes and random text around the seeded secrets in every
    /// shape programs print them, cut into reads at random boundaries (in
    /// the middle of a line, a secret, a `\r\n` or a character), split into
    /// bounded lines and redacted as a stream. No seeded secret survives in
    /// any line kept; and redacting twice the text costs less than three
    /// times the CPU time (the thread's, not wall time: a shared machine's
    /// load made wall ratios of 3 to 12 for any shape).
    mod fuzz {
        use super::*;
        use crate::fuzz;
        use crate::telemetry::redact_fuzz_inputs::{SECRETS, SHAPES, marked};
        use proptest::prelude::*;

        fn redactor() -> Redactor {
            Redactor::new(&crate::config::TelemetrySection::default().secret_words)
        }

        /// Every line the tail would keep (before its count bound), fed in
        /// reads of the given sizes.
        fn stream(bytes: &[u8], reads: &[usize]) -> Vec<String> {
            let r = redactor();
            let mut lines = r.lines();
            let mut splitter = LineSplitter::new(LINE_LIMIT);
            let mut out = Vec::new();
            let (mut at, mut i) = (0, 0);
            while at < bytes.len() {
                let n = reads.get(i % reads.len().max(1)).copied().unwrap_or(bytes.len()).clamp(1, bytes.len() - at);
                splitter.feed(&bytes[at..at + n], |line, cut| out.push(tail_line(&mut lines, line, cut)));
                at += n;
                i += 1;
            }
            splitter.finish(|line, cut| out.push(tail_line(&mut lines, line, cut)));
            out
        }

        /// Surrounding text: printable pieces the rules look at, or bytes
        /// with no line ending (a line ending mid-shape is another line).
        fn around() -> impl Strategy<Value = Vec<u8>> {
            const FIXED: [&str; 10] = ["=", ":", "://", "@", " ", "--", "lr=0.1", "é", "***", "step 5/10"];
            let text = proptest::collection::vec(proptest::sample::select(&FIXED[..]), 0..8)
                .prop_map(|p| p.concat().into_bytes());
            let bytes = fuzz::bytes(48).prop_map(|b| b.into_iter().filter(|c| !b"\r\n".contains(c)).collect());
            prop_oneof![text, bytes]
        }

        proptest! {
            #![proptest_config(fuzz::config())]

            #[test]
            fn no_seeded_secret_survives_a_stream_cut_at_random_reads(
                planted in proptest::collection::vec(
                    (around(), proptest::sample::select(&SECRETS[..]), 0usize..SHAPES.len(), 0usize..3),
                    1..6,
                ),
                reads in proptest::collection::vec(1usize..40, 1..8),
            ) {
                let mut input = Vec::new();
                for (before, secret, form, ending) in &planted {
                    input.extend_from_slice(before);
                    input.push(b' ');
                    input.extend_from_slice(SHAPES[*form].replace('X', &marked(secret)).as_bytes());
                    input.extend_from_slice([&b"\n"[..], b"\r\n", b"\r"][*ending]);
                }
                let kept = stream(&input, &reads);
                for line in &kept {
                    prop_assert!(!line.contains("SeCrEt"), "{:?} -> {kept:?}", String::from_utf8_lossy(&input));
                }
            }

            #[test]
            fn random_bytes_in_random_reads_are_redacted_without_panicking(
                bytes in fuzz::bytes(2048),
                reads in proptest::collection::vec(1usize..300, 1..8),
            ) {
                let _ = stream(&bytes, &reads);
            }
        }

        /// The CPU time this thread spent in `f` (not wall time: on a shared
        /// machine other processes' load would be counted too).
        fn cpu_time<T>(f: impl FnOnce() -> T) -> std::time::Duration {
            use nix::libc;
            let used = || {
                let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
                // SAFETY: `t` is a valid timespec for the call to fill.
                let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
                assert_eq!(rc, 0, "the thread's CPU clock");
                std::time::Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
            };
            let before = used();
            let _ = f();
            used().saturating_sub(before)
        }

        /// Text of `bytes` bytes made of the shapes (each with a secret) and
        /// filler, in one line: the redaction of a line is what could be
        /// superlinear (LINE_LIMIT bounds a line in the stream; `text` and
        /// the health command's output are not bounded by it).
        fn mixture(seed: u64, bytes: usize) -> String {
            let mut state = seed;
            let mut next = |n: usize| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (state >> 33) as usize % n
            };
            let mut line = String::new();
            while line.len() < bytes {
                // The YAML shapes are lines of their own (the stream fuzz
                // above has them): flattened, they are no shape at all.
                let shape = SHAPES[next(SHAPES.len())];
                if shape.contains('\n') {
                    continue;
                }
                line.push_str(&shape.replace('X', &marked(SECRETS[next(SECRETS.len())])));
                // Separated as text separates them (glued to the next
                // shape, `X=` or `X"--opt` would be other shapes, not these).
                line.push_str([" ", "; ", " & ", ", ", " | ", " -> ", "\" ", " ("][next(8)]);
            }
            line
        }

        #[test]
        fn redacting_twice_the_text_costs_about_twice_the_time() {
            let r = redactor();
            for seed in 0..4 {
                let (small, big) = (mixture(seed, 256 << 10), mixture(seed, 512 << 10));
                let time = |line: &str| cpu_time(|| std::hint::black_box(r.text(line)));
                // Interleaved, the fastest of each: a shared machine's noise
                // hits both sizes alike.
                let (mut t1, mut t2) = (std::time::Duration::MAX, std::time::Duration::MAX);
                for _ in 0..7 {
                    t1 = t1.min(time(&small));
                    t2 = t2.min(time(&big));
                }
                assert!(
                    t2 < 3 * t1.max(std::time::Duration::from_millis(1)),
                    "seed {seed}: 512 KiB took {t2:?}, 256 KiB {t1:?}"
                );
                let out = r.text(&big);
                if let Some(i) = out.find("SeCrEt") {
                    let from = out.floor_char_boundary(i.saturating_sub(120));
                    let to = out.ceil_char_boundary((i + 80).min(out.len()));
                    panic!("seed {seed}: a secret survived one long line: …{}…", &out[from..to]);
                }
            }
        }
    }
}
