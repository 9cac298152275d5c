//! A run's TensorBoard directory: its event files in the order readers take
//! them (by name), trimming them back to a step (a resume, a rollback), and
//! a new file per writer that sorts after every file already there.
//!
//! Readers (TensorBoard's Python loader and its Rust data server alike) read
//! a run's files in lexicographic order of their names, so a new file's name
//! must sort last whatever the clock of the node that writes it says:
//! `events.out.tfevents.<10-digit seconds>.<host>.<pid>.<n>`, its seconds
//! taken past those of the newest file there.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, BufReader, Write};
use std::path::{Path, PathBuf};

use prost::Message;

use super::proto::{Event, FILE_VERSION, SESSION_START, SessionLog, What};
use super::record::{Tail, frame, read_records};

/// What every event file name starts with (TensorBoard reads files whose
/// name contains `tfevents`).
pub const FILE_PREFIX: &str = "events.out.tfevents.";

/// The event files of `dir`, in the order readers take them (none when
/// `dir` does not exist). Symbolic links and other non-files are skipped.
pub fn event_files(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry?;
        let is_file = entry.file_type()?.is_file();
        if is_file && entry.file_name().to_string_lossy().contains("tfevents") {
            files.push(entry.path());
        }
    }
    files.sort();
    Ok(files)
}

/// The seconds field of a file name rekindle (or TensorFlow, or PyTorch) wrote.
fn stamp_of(path: &Path) -> Option<u64> {
    let name = path.file_name()?.to_str()?;
    name.strip_prefix(FILE_PREFIX)?.split('.').next()?.parse().ok()
}

/// What the event files hold after [`trim`]: the newest step of each scalar
/// tag (its high-water mark: a value of that tag at this step or before is
/// already there).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Kept {
    pub newest_step: BTreeMap<String, u64>,
}

/// Cuts every event file of `dir` back to the records of steps ≤ `step`
/// (and drops a torn or damaged tail), rewriting only the files that
/// change, each by a temporary file and a rename; returns what they keep.
/// The records a resume trains again (steps after its checkpoint) go, so
/// that every step is in the files once.
pub fn trim(dir: &Path, step: u64) -> io::Result<Kept> {
    let mut kept = Kept::default();
    for path in event_files(dir)? {
        let mut keep: Vec<(u64, u64)> = Vec::new(); // (offset, length) of the records kept
        let mut dropped = false;
        let (end, tail) = read_records(BufReader::new(File::open(&path)?), |offset, payload| {
            let event = Event::decode(payload).ok();
            let at = event.as_ref().map_or(0, |e| e.step.max(0) as u64);
            if at > step {
                dropped = true;
                return;
            }
            if let Some(event) = &event {
                for (tag, _) in event.scalars() {
                    let newest = kept.newest_step.entry(tag.to_string()).or_insert(at);
                    *newest = (*newest).max(at);
                }
            }
            keep.push((offset, 12 + payload.len() as u64 + 4));
        })?;
        let len = std::fs::metadata(&path)?.len();
        if dropped || tail != Tail::Clean || end != len {
            rewrite(&path, &keep)?;
        }
    }
    Ok(kept)
}

/// Rewrites `path` with only the records at `keep` (offset, length).
fn rewrite(path: &Path, keep: &[(u64, u64)]) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let source = File::open(path)?;
    let dir = path.parent().unwrap_or(Path::new("."));
    // Not named like an event file: a reader must never take it for one.
    let mut tmp = tempfile::Builder::new().prefix(".rekindle-trim-").tempfile_in(dir)?;
    let mut buf = Vec::new();
    for &(offset, len) in keep {
        buf.resize(len as usize, 0);
        source.read_exact_at(&mut buf, offset)?;
        tmp.write_all(&buf)?;
    }
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    File::open(dir)?.sync_all()
}

/// An event file being written: every record with one `write` (a crash
/// leaves at most the last one torn).
#[derive(Debug)]
pub struct EventFile {
    path: PathBuf,
    file: File,
}

impl EventFile {
    /// Creates a new file in `dir` (created if needed) named to sort after
    /// every event file there, and writes its `file_version` record.
    pub fn create(dir: &Path, host: &str, wall_time: f64) -> io::Result<EventFile> {
        std::fs::create_dir_all(dir)?;
        let newest = event_files(dir)?.iter().filter_map(|p| stamp_of(p)).max();
        let now = wall_time.max(0.0) as u64;
        let stamp = newest.map_or(now, |n| now.max(n + 1));
        let host: String =
            host.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '.' { c } else { '_' }).collect();
        let pid = std::process::id();
        let mut n = 0;
        let (path, file) = loop {
            let path = dir.join(format!("{FILE_PREFIX}{stamp:010}.{host}.{pid}.{n}"));
            match OpenOptions::new().append(true).create_new(true).open(&path) {
                Ok(file) => break (path, file),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && n < 1000 => n += 1,
                Err(e) => return Err(e),
            }
        };
        let mut out = EventFile { path, file };
        out.write(&Event { wall_time, step: 0, what: Some(What::FileVersion(FILE_VERSION.into())) })?;
        Ok(out)
    }

    /// Appends one event.
    pub fn write(&mut self, event: &Event) -> io::Result<()> {
        self.file.write_all(&frame(&event.encode_to_vec()))
    }

    /// Appends a `SessionLog START` at `step`: a reader that holds values
    /// of steps ≥ `step` from an earlier attempt discards them.
    pub fn write_start(&mut self, step: u64, wall_time: f64, msg: String) -> io::Result<()> {
        let what = Some(What::SessionLog(SessionLog { status: SESSION_START, msg }));
        self.write(&Event { wall_time, step: step as i64, what })
    }

    pub fn sync(&mut self) -> io::Result<()> {
        self.file.sync_data()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::super::proto::{Summary, SummaryValue};
    use super::*;

    fn scalar(step: u64, tag: &str, value: f32) -> Event {
        let value = vec![SummaryValue { tag: tag.into(), simple_value: Some(value) }];
        Event { wall_time: 1.0, step: step as i64, what: Some(What::Summary(Summary { value })) }
    }

    fn steps_in(path: &Path) -> Vec<(i64, Option<String>)> {
        let mut out = Vec::new();
        read_records(File::open(path).unwrap(), |_, p| {
            let e = Event::decode(p).unwrap();
            out.push((e.step, e.scalars().next().map(|(t, _)| t.to_string())));
        })
        .unwrap();
        out
    }

    #[test]
    fn a_new_file_sorts_after_every_file_there_whatever_the_clock() {
        let tmp = tempfile::tempdir().unwrap();
        let first = EventFile::create(tmp.path(), "n2", 2_000_000_000.0).unwrap();
        // A node whose clock is behind.
        let second = EventFile::create(tmp.path(), "n1.cluster/x", 1_000_000_000.0).unwrap();
        let names = event_files(tmp.path()).unwrap();
        assert_eq!(names, vec![first.path().to_path_buf(), second.path().to_path_buf()]);
        assert!(second.path().to_string_lossy().contains(".2000000001.n1.cluster_x."), "{:?}", second.path());
        assert_eq!(steps_in(first.path()), vec![(0, None)], "a file starts with its file_version");
    }

    #[test]
    fn trimming_keeps_steps_up_to_the_resume_in_every_file_and_drops_torn_tails() {
        let tmp = tempfile::tempdir().unwrap();
        let mut a = EventFile::create(tmp.path(), "n1", 100.0).unwrap();
        for step in 1..=6 {
            a.write(&scalar(step, "loss", step as f32)).unwrap();
        }
        a.write(&scalar(3, "checkpoint/persist_seconds", 0.5)).unwrap();
        let mut b = EventFile::create(tmp.path(), "n1", 200.0).unwrap();
        b.write(&scalar(4, "loss", 4.0)).unwrap();
        b.write(&scalar(5, "loss", 5.0)).unwrap();
        let (pa, pb) = (a.path().to_path_buf(), b.path().to_path_buf());
        drop((a, b));
        // A record torn by a SIGKILL.
        let torn = frame(&scalar(6, "loss", 6.0).encode_to_vec());
        std::fs::OpenOptions::new().append(true).open(&pb).unwrap().write_all(&torn[..10]).unwrap();

        let kept = trim(tmp.path(), 4).unwrap();
        assert_eq!(kept.newest_step.get("loss"), Some(&4));
        assert_eq!(kept.newest_step.get("checkpoint/persist_seconds"), Some(&3));
        let loss = |p: &Path| steps_in(p).into_iter().filter(|(_, t)| t.is_some()).map(|(s, _)| s).collect::<Vec<_>>();
        assert_eq!(loss(&pa), vec![1, 2, 3, 4, 3], "a value of an earlier step written later stays");
        assert_eq!(loss(&pb), vec![4]);
        assert_eq!(steps_in(&pb)[0], (0, None), "file_version kept");
        // Trimming again changes nothing.
        let before = std::fs::read(&pa).unwrap();
        assert_eq!(trim(tmp.path(), 4).unwrap(), kept);
        assert_eq!(std::fs::read(&pa).unwrap(), before);
        assert!(event_files(tmp.path()).unwrap().len() == 2, "no temporary file left");
        assert_eq!(trim(&tmp.path().join("absent"), 0).unwrap(), Kept::default());
    }
}
