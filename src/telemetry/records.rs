//! Reading a run's JSON-lines files back (`events.jsonl`, `metrics.jsonl`,
//! `gpu_stats.jsonl`) as JSON objects, which `event.rs`, `metrics.rs` and
//! `gpu_sample.rs` then type.
//!
//! Writers append one line per record, so a crash can leave a torn last line
//! (and a resumed writer terminates it, leaving a torn line in the middle).
//! Readers therefore skip every line that does not parse and count them,
//! never failing on one.

use std::io::{self, BufRead, Read};
use std::path::Path;

use chrono::{DateTime, Utc};
use serde_json::Value;

/// The lines of a JSON-lines file that parse as JSON objects.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Jsonl {
    pub records: Vec<Value>,
    /// Non-empty lines that did not parse (torn writes).
    pub skipped: usize,
}

/// Longest line a reader takes: no record rekindle writes comes near it, so a
/// longer one is counted as skipped, never read into memory whole.
pub const MAX_LINE_BYTES: usize = 1 << 20;

/// Reads `path` leniently, a line at a time (a line over
/// [`MAX_LINE_BYTES`] is skipped); a missing file is `Ok(None)`. A symlink,
/// FIFO or device in its place is an error, never followed or blocked on.
pub fn read_jsonl(path: &Path) -> io::Result<Option<Jsonl>> {
    read_jsonl_tail(path, u64::MAX)
}

/// As [`read_jsonl`], but only the lines that begin in the last `max_bytes`
/// of the file (a line cut by that boundary is left out, not counted): a
/// reader that needs the newest records of a long run (`rekindle status`
/// over a sweep, refreshed by `--watch`) costs the same at step 10⁶ as at
/// step 10³.
pub fn read_jsonl_tail(path: &Path, max_bytes: u64) -> io::Result<Option<Jsonl>> {
    let mut records = Vec::new();
    let Some(skipped) = scan_jsonl(path, max_bytes, |v| records.push(v))? else { return Ok(None) };
    Ok(Some(Jsonl { records, skipped }))
}

/// Calls `each` with every record of `path` in order, holding one line at a
/// time (a reader that keeps only what it needs, such as `rekindle report`'s
/// downsampled charts, costs the same memory at step 10⁶ as at step 10³);
/// returns how many lines were skipped (torn, not JSON objects, or over
/// [`MAX_LINE_BYTES`]), `Ok(None)` when the file is missing. Opened as
/// [`read_jsonl`] opens.
pub fn for_each_jsonl(path: &Path, each: impl FnMut(Value)) -> io::Result<Option<usize>> {
    scan_jsonl(path, u64::MAX, each)
}

/// The typed events of `path` from the newest one `restart` holds for on
/// (inclusive; all of them when none does): a reader that needs only the
/// current attempt (`restart` = a `start`) or the events since the last
/// checkpoint. Read from the end of the file backwards, a chunk at a time,
/// until that event: what it costs is the bytes after it, not the run's
/// history (every task of a world reads these when it starts or ends: the
/// progress guard, the crash count, its attempt's seals; a long run's
/// `events.jsonl` read whole by each of thousands of tasks is gigabytes off
/// the shared filesystem). Lines are taken as [`read_jsonl`] takes them
/// (torn ones and those over [`MAX_LINE_BYTES`] skipped); opened as it
/// opens; `Ok(None)` when the file is missing.
pub fn read_events_since(
    path: &Path,
    restart: impl Fn(&super::RecordedEvent) -> bool,
) -> io::Result<Option<Vec<super::RecordedEvent>>> {
    read_back(path, restart, BACK_CHUNK)
}

/// How much the backward reader reads at a time.
const BACK_CHUNK: usize = 64 * 1024;

fn read_back(
    path: &Path,
    restart: impl Fn(&super::RecordedEvent) -> bool,
    chunk: usize,
) -> io::Result<Option<Vec<super::RecordedEvent>>> {
    use std::io::{Seek, SeekFrom};
    let mut file = match crate::confine::open_regular(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut pos = file.metadata()?.len();
    // Newest first; reversed at the end.
    let mut found = Vec::new();
    // The pieces of the line that begins before `pos` and ends after it,
    // newest first (joined once the line's start is found: a long line read
    // in many chunks is copied once, not once a chunk).
    let mut carry: Vec<Vec<u8>> = Vec::new();
    let mut carried = 0usize;
    // The line being carried is over MAX_LINE_BYTES: dropped up to its start.
    let mut overlong = false;
    let take = |first: &[u8], carry: &[Vec<u8>], found: &mut Vec<super::RecordedEvent>| -> bool {
        let mut line = first.to_vec();
        for piece in carry.iter().rev() {
            line.extend_from_slice(piece);
        }
        let Some(Ok(v)) = parse_line(&String::from_utf8_lossy(&line)) else { return false };
        let Some(ev) = super::RecordedEvent::from_value(v) else { return false };
        let stop = restart(&ev);
        found.push(ev);
        stop
    };
    while pos > 0 {
        let start = pos.saturating_sub(chunk as u64);
        let mut buf = vec![0u8; (pos - start) as usize];
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(&mut buf)?;
        pos = start;
        // From the last newline back: every line after a newline in this
        // chunk is whole (with what was carried after it).
        let mut end = buf.len();
        while let Some(nl) = buf[..end].iter().rposition(|b| *b == b'\n') {
            let piece = &buf[nl + 1..end];
            if !overlong && piece.len() + carried <= MAX_LINE_BYTES && take(piece, &carry, &mut found) {
                found.reverse();
                return Ok(Some(found));
            }
            (carry, carried, overlong) = (Vec::new(), 0, false);
            end = nl;
        }
        // The end of a line that begins in an earlier chunk.
        if !overlong {
            if carried + end > MAX_LINE_BYTES {
                (carry, carried, overlong) = (Vec::new(), 0, true);
            } else {
                carry.push(buf[..end].to_vec());
                carried += end;
            }
        }
    }
    // The file's first line.
    if !overlong {
        take(&[], &carry, &mut found);
    }
    found.reverse();
    Ok(Some(found))
}

fn scan_jsonl(path: &Path, max_bytes: u64, mut each: impl FnMut(Value)) -> io::Result<Option<usize>> {
    use std::io::{Seek, SeekFrom};
    let mut file = match crate::confine::open_regular(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let len = file.metadata()?.len();
    let cut = len > max_bytes;
    if cut {
        // One byte before the window: a newline there means the window
        // starts with a whole line.
        file.seek(SeekFrom::Start(len - max_bytes - 1))?;
    }
    let mut reader = io::BufReader::new(file);
    if cut {
        skip_line(&mut reader)?;
    }
    let mut skipped = 0;
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = (&mut reader).take(MAX_LINE_BYTES as u64 + 1).read_until(b'\n', &mut line)?;
        if n == 0 {
            break;
        }
        if line.len() > MAX_LINE_BYTES {
            skipped += 1;
            if !line.ends_with(b"\n") {
                skip_line(&mut reader)?;
            }
            continue;
        }
        match parse_line(&String::from_utf8_lossy(&line)) {
            Some(Ok(v)) => each(v),
            Some(Err(())) => skipped += 1,
            None => {}
        }
    }
    Ok(Some(skipped))
}

/// Consumes the rest of the current line, holding one buffer at a time.
fn skip_line(reader: &mut impl BufRead) -> io::Result<()> {
    loop {
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            return Ok(());
        }
        if let Some(i) = buf.iter().position(|b| *b == b'\n') {
            reader.consume(i + 1);
            return Ok(());
        }
        let n = buf.len();
        reader.consume(n);
    }
}

/// A line's record; `None` for a blank line, `Err` for one that is not a JSON object.
fn parse_line(line: &str) -> Option<Result<Value, ()>> {
    if line.trim().is_empty() {
        return None;
    }
    Some(serde_json::from_str::<Value>(line).ok().filter(Value::is_object).ok_or(()))
}

fn add_line(out: &mut Jsonl, line: &str) {
    match parse_line(line) {
        Some(Ok(v)) => out.records.push(v),
        Some(Err(())) => out.skipped += 1,
        None => {}
    }
}

/// Parses JSON lines, skipping (and counting) those that are not JSON objects.
pub fn parse_jsonl(text: &str) -> Jsonl {
    let mut out = Jsonl::default();
    for line in text.lines() {
        add_line(&mut out, line);
    }
    out
}

/// An RFC 3339 field as a UTC time.
pub fn time_field(v: &Value, key: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(v.get(key)?.as_str()?).ok().map(|t| t.with_timezone(&Utc))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::{RecordedEvent as Event, gpu_samples_from, metrics_from};
    use serde_json::json;

    #[test]
    fn an_overlong_line_is_skipped_without_being_kept_and_the_next_one_reads() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("events.jsonl");
        let long = format!("{{\"pad\":\"{}\"}}", "x".repeat(3 * MAX_LINE_BYTES));
        std::fs::write(&path, format!("{{\"step\":1}}\n{long}\n{{\"step\":2}}\n{{\"step\":3")).unwrap();
        let j = read_jsonl(&path).unwrap().unwrap();
        assert_eq!(j.records, vec![json!({"step": 1}), json!({"step": 2})]);
        assert_eq!(j.skipped, 2);
        std::os::unix::fs::symlink(&path, tmp.path().join("link")).unwrap();
        assert!(read_jsonl(&tmp.path().join("link")).is_err(), "a symlink is refused");
        assert!(read_jsonl(&tmp.path().join("absent")).unwrap().is_none());
    }

    /// The forward reading the backward one must agree with: every line in
    /// order, the kept ones cleared at each mark.
    fn forward_since(path: &Path, restart: impl Fn(&Event) -> bool) -> Option<Vec<Event>> {
        let mut kept = Vec::new();
        for_each_jsonl(path, |v| {
            if let Some(ev) = Event::from_value(v) {
                if restart(&ev) {
                    kept.clear();
                }
                kept.push(ev);
            }
        })
        .unwrap()
        .map(|_| kept)
    }

    #[test]
    fn the_backward_reader_finds_what_the_forward_one_does_at_any_chunk_size() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("events.jsonl");
        let ev = |name: &str, step: u64| {
            format!("{{\"event\":\"{name}\",\"step\":{step},\"time\":\"2026-12-07T00:00:00Z\"}}\n")
        };
        let long = format!("{{\"event\":\"signal\",\"pad\":\"{}\"}}\n", "x".repeat(MAX_LINE_BYTES + 10));
        let files = [
            String::new(),
            ev("start", 0),
            format!("{}{}{}", ev("start", 0), ev("checkpoint_saved", 5), ev("stop", 5)),
            format!("{}{}torn{{\n{}\n{}", ev("start", 0), ev("checkpoint_saved", 5), ev("start", 5), ev("stop", 7)),
            format!("{}{long}{}{}", ev("checkpoint_saved", 1), ev("start", 1), ev("error", 2)),
            format!("{long}{}", ev("start", 3)),
            // A last line with no newline (torn by a crash mid-write).
            format!("{}{}{{\"event\":\"st", ev("start", 0), ev("checkpoint_saved", 4)),
            (0..200).map(|i| ev(if i % 17 == 0 { "checkpoint_saved" } else { "start" }, i)).collect(),
        ];
        let names = |v: Option<Vec<Event>>| -> Vec<(String, Option<u64>)> {
            v.unwrap().iter().map(|e| (e.name.clone(), e.raw.get("step").and_then(Value::as_u64))).collect()
        };
        for (i, text) in files.iter().enumerate() {
            std::fs::write(&path, text).unwrap();
            for mark in ["checkpoint_saved", "start", "nothing"] {
                let is = |e: &Event| e.name == mark;
                let forward = names(forward_since(&path, is));
                for chunk in [1, 7, 64, 4096, BACK_CHUNK] {
                    assert_eq!(
                        names(read_back(&path, is, chunk).unwrap()),
                        forward,
                        "file {i}, mark {mark}, chunk {chunk}"
                    );
                }
            }
        }
        assert!(read_events_since(&tmp.path().join("absent"), |_| true).unwrap().is_none());
        std::os::unix::fs::symlink(&path, tmp.path().join("link")).unwrap();
        assert!(read_events_since(&tmp.path().join("link"), |_| true).is_err(), "a symlink is refused");
    }

    #[test]
    fn the_backward_reader_stops_at_the_mark_and_reads_no_further() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("events.jsonl");
        // A history of 4 MB before the last start: read backwards in 64 KiB
        // chunks, one chunk holds everything after it.
        let old = "{\"event\":\"log\",\"time\":\"2026-12-07T00:00:00Z\"}\n".repeat(100_000);
        std::fs::write(&path, format!("{old}{{\"event\":\"start\"}}\n{{\"event\":\"stop\"}}\n")).unwrap();
        let seen = std::cell::Cell::new(0);
        let got = read_events_since(&path, |e| {
            seen.set(seen.get() + 1);
            e.name == "start"
        })
        .unwrap()
        .unwrap();
        assert_eq!(got.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(), ["start", "stop"]);
        assert_eq!(seen.get(), 2, "no event before the mark was parsed");
    }

    #[test]
    fn a_tail_holds_the_lines_that_begin_in_it_whole() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("metrics.jsonl");
        let lines: String = (101..=200).map(|s| format!("{{\"step\":{s}}}\n")).collect();
        std::fs::write(&path, &lines).unwrap();
        let steps = |max: u64| -> Vec<u64> {
            let j = read_jsonl_tail(&path, max).unwrap().unwrap();
            assert_eq!(j.skipped, 0, "a cut line is not a torn one");
            j.records.iter().map(|r| r["step"].as_u64().unwrap()).collect()
        };
        // Each line is 13 bytes: 26 bytes are the last two lines exactly,
        // 27 the same plus the newline of the one before, 25 cut one.
        assert_eq!(steps(26), vec![199, 200]);
        assert_eq!(steps(27), vec![199, 200]);
        assert_eq!(steps(25), vec![200]);
        assert_eq!(steps(13 * 100), (101..=200).collect::<Vec<_>>());
        assert_eq!(steps(u64::MAX), (101..=200).collect::<Vec<_>>());
        assert!(read_jsonl_tail(&tmp.path().join("absent"), 10).unwrap().is_none());
    }

    #[test]
    fn events_since_keep_only_the_newest_restart_on() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("events.jsonl");
        let lines = ["start\",\"node\":\"n1", "stop", "start\",\"node\":\"n2", "stop"];
        std::fs::write(&path, lines.map(|l| format!("{{\"event\":\"{l}\"}}\n")).concat()).unwrap();
        let since = read_events_since(&path, |e| e.name == "start").unwrap().unwrap();
        assert_eq!(
            since.iter().map(|e| (e.name.as_str(), e.node.as_deref())).collect::<Vec<_>>(),
            [("start", Some("n2")), ("stop", None)]
        );
        assert_eq!(read_events_since(&path, |_| false).unwrap().unwrap().len(), 4);
        assert!(read_events_since(&tmp.path().join("absent"), |_| true).unwrap().is_none());
    }

    #[test]
    fn torn_lines_are_skipped_and_counted() {
        let j = parse_jsonl("{\"step\":1}\n{\"ste\n{\"step\":2}\n\n{\"step\":3,\"lo");
        assert_eq!(j.records, vec![json!({"step": 1}), json!({"step": 2})]);
        assert_eq!(j.skipped, 2);
    }

    #[test]
    fn missing_file_reads_as_none() {
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(read_jsonl(&tmp.path().join("absent.jsonl")).unwrap(), None);
    }

    #[test]
    fn events_type_common_fields_and_keep_the_rest() {
        let e = Event::from_value(json!({"event": "resume", "time": "2026-11-01T10:00:00.000Z", "node": "n2",
            "job_id": 42, "attempt": 1, "step": 100, "steps_lost": 7}))
        .unwrap();
        assert_eq!(e.name, "resume");
        assert_eq!(e.node.as_deref(), Some("n2"));
        assert_eq!(e.job_id.as_deref(), Some("42"));
        assert_eq!((e.slurm_attempt, e.step), (Some(1), Some(100)));
        assert_eq!(e.raw["steps_lost"], 7);
        assert!(e.time.is_some());
        assert_eq!(Event::from_value(json!({"step": 1})), None);
    }

    #[test]
    fn metrics_split_into_train_and_validation_sorted_by_step() {
        let recs = vec![
            json!({"step": 2, "loss": 0.5, "lr": 0.1, "samples_per_s": 10.0}),
            json!({"step": 1, "loss": 0.9, "lr": 0.1}),
            json!({"step": 2, "val_loss": 0.6}),
            json!({"step": 3, "loss": null}),
        ];
        let (train, val) = metrics_from(&recs);
        assert_eq!(train.iter().map(|m| m.step).collect::<Vec<_>>(), vec![1, 2, 3]);
        assert_eq!(train[2].loss, None);
        assert_eq!(train[1].samples_per_s, Some(10.0));
        assert_eq!(val.len(), 1);
        assert_eq!(val[0].val_loss, 0.6);
    }

    #[test]
    fn gpu_samples_label_devices_by_vendor_and_index() {
        let recs = vec![
            json!({"time": "2026-11-01T10:00:00Z", "devices": [
                {"vendor": "nvidia", "index": 1, "utilization_pct": 90, "memory_used_mib": 1000, "memory_total_mib": 8000}
            ]}),
            json!({"devices": []}),
        ];
        let s = gpu_samples_from(&recs);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].devices[0].label, "nvidia 1");
        assert_eq!(s[0].devices[0].utilization_pct, Some(90.0));
    }

    /// Property tests over arbitrary and mutated record files (the
    /// lenient readers of `events.jsonl`, `metrics.jsonl`,
    /// `gpu_stats.jsonl`, and `summary.json`); see `crate::fuzz`.
    mod fuzz {
        use super::*;
        use crate::fuzz;
        use crate::telemetry::{Summary, attempts, events_from};
        use proptest::prelude::*;

        fn fixture(file: &str) -> Vec<u8> {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/run-0.1.0-slurm").join(file);
            std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        }

        /// Every typed reader of a JSON-lines file, as `status` and `report` use them.
        fn read_every_way(bytes: &[u8]) {
            let j = parse_jsonl(&String::from_utf8_lossy(bytes));
            let events = events_from(j.records.clone());
            for e in &events {
                let _ = (e.event.step(), e.event.name(), e.name.as_str());
            }
            let _ = attempts(&events).iter().map(|a| (a.end.short(), a.because())).collect::<Vec<_>>();
            let _ = metrics_from(&j.records);
            let _ = gpu_samples_from(&j.records);
            for r in &j.records {
                let _ = crate::telemetry::metrics_step(r);
                let _ = time_field(r, "time");
            }
            let _ = Summary::parse(bytes);
        }

        proptest! {
            #![proptest_config(fuzz::config())]

            #[test]
            fn arbitrary_bytes_are_records_or_skipped(bytes in fuzz::bytes(512)) {
                read_every_way(&bytes);
            }

            #[test]
            fn mutated_events_are_records_or_skipped(bytes in fuzz::mutated(fixture("events.jsonl"))) {
                read_every_way(&bytes);
            }

            #[test]
            fn mutated_metrics_are_records_or_skipped(bytes in fuzz::mutated(fixture("metrics.jsonl"))) {
                read_every_way(&bytes);
            }

            #[test]
            fn mutated_gpu_stats_are_records_or_skipped(bytes in fuzz::mutated(fixture("gpu_stats.jsonl"))) {
                read_every_way(&bytes);
            }

            #[test]
            fn mutated_summaries_parse_or_are_none(bytes in fuzz::mutated(fixture("summary.json"))) {
                read_every_way(&bytes);
            }
        }
    }
}
