//! A run's TensorBoard directory: its event files in the order readers take
//! them (by name), trimming rekindle's own files back to a step (a resume, a
//! rollback), and a new file per writer that sorts after every file there.
//!
//! Readers (TensorBoard's Python loader and its Rust data server alike) read
//! a run's files in lexicographic order of their names, so a new file's name
//! must sort last whatever the clock of the node that writes it says:
//! `events.out.tfevents.<10-digit seconds>.<host>.<pid>.<n>`, its seconds
//! taken past those of the newest file there.
//!
//! Ownership: the directory may be shared (`[telemetry] tensorboard =
//! "/shared/tb/logs"`, other runs, other programs' `*tfevents*` files), and
//! PyTorch names its files exactly as rekindle does, so a name proves
//! nothing. The run directory keeps a record of the files this run created
//! (`tensorboard.files`, one name a line, written right after the file is
//! created with `O_EXCL`); only a file named there, with rekindle's exact
//! name pattern, that is a regular file is ever trimmed. The directory is
//! opened once without following a link, and every file in it is reached
//! relative to that handle, never through a link.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::fs::File;
use std::io::{self, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use prost::Message;

use super::proto::{Event, FILE_VERSION, SESSION_START, SessionLog, What};
use super::record::{Tail, frame, read_records};
use crate::confine::{Dir, Kind};

/// What every event file name starts with (TensorBoard reads files whose
/// name contains `tfevents`).
pub const FILE_PREFIX: &str = "events.out.tfevents.";

/// The largest record of own files read back (a line per file an attempt
/// created: tens of thousands of attempts).
const MAX_RECORD_FILE_BYTES: u64 = 1 << 20;

/// The names of the event files in `dir`, in the order readers take them,
/// whoever wrote them. Links and other non-files are skipped. Only names are
/// read: this never touches a file.
fn event_names(dir: &Dir) -> io::Result<Vec<String>> {
    let mut names: Vec<String> = dir
        .entries("")?
        .into_iter()
        .filter(|e| e.kind == Kind::File)
        .map(|e| e.name_lossy())
        .filter(|n| n.contains("tfevents"))
        .collect();
    names.sort();
    Ok(names)
}

/// The event files of the directory at `dir` (none when it does not
/// exist), in the order readers take them, whoever wrote them: what a
/// reader of a run's TensorBoard directory sees (tests and `report`).
pub fn event_files(dir: &Path) -> io::Result<Vec<PathBuf>> {
    match Dir::open(dir) {
        Ok(d) => Ok(event_names(&d)?.into_iter().map(|n| dir.join(n)).collect()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// The seconds field of a file name rekindle (or TensorFlow, or PyTorch) wrote.
fn stamp_of(name: &str) -> Option<u64> {
    name.strip_prefix(FILE_PREFIX)?.split('.').next()?.parse().ok()
}

/// Whether `name` is exactly of the form rekindle gives its files:
/// `events.out.tfevents.<10 digits>.<host>.<pid>.<n>` (the host made of
/// ASCII letters, digits, `-`, `.` and `_`).
pub fn is_own_name(name: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let Some(rest) = name.strip_prefix(FILE_PREFIX) else { return false };
    let Some((stamp, rest)) = rest.split_once('.') else { return false };
    let Some((rest, n)) = rest.rsplit_once('.') else { return false };
    let Some((host, pid)) = rest.rsplit_once('.') else { return false };
    stamp.len() == 10
        && digits(stamp)
        && digits(pid)
        && digits(n)
        && !host.is_empty()
        && host.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_')
}

/// What the event files hold after [`LogDir::trim`]: the newest step of
/// each scalar tag (its high-water mark: a value of that tag at this step
/// or before is already there).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Kept {
    pub newest_step: BTreeMap<String, u64>,
}

/// A TensorBoard directory held open as a handle, and the run directory's
/// handle where the run records the files it created there (module
/// header). Every file of either is reached through its handle
/// (`confine::Dir`): this module opens nothing by path
/// (`tests/it/architecture.rs`, `HANDLE_ONLY`).
#[derive(Debug)]
pub struct LogDir {
    dir: Dir,
    run: Dir,
    record: OsString,
}

fn with_path(path: &Path, e: impl Into<io::Error>) -> io::Error {
    let e = e.into();
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

impl LogDir {
    /// Opens `path` (made when missing), refusing a symbolic link in its
    /// place; `record` is the run's record of its own files there, a file
    /// directly in the (claimed) run directory.
    pub fn open(path: &Path, record: &Path) -> io::Result<LogDir> {
        let dir = Dir::open_named(path, 0o777).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("the TensorBoard directory: {e} (set [telemetry] tensorboard to the directory to write in)"),
            )
        })?;
        let name = record.file_name().ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("{} names no file", record.display()))
        })?;
        let run = Dir::open(record.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")))?;
        Ok(LogDir { dir, run, record: name.to_os_string() })
    }

    /// The names of the files this run created here, as recorded (names
    /// not of rekindle's form are ignored: a hand-edited record cannot
    /// hand another file over to it).
    fn own_names(&self) -> io::Result<BTreeSet<String>> {
        let bytes = match self.run.read_bounded(&self.record, MAX_RECORD_FILE_BYTES) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(BTreeSet::new()),
            Err(e) => return Err(e),
        };
        Ok(String::from_utf8_lossy(&bytes).lines().filter(|n| is_own_name(n)).map(str::to_string).collect())
    }

    /// Cuts every event file this run created here back to the records of
    /// steps ≤ `step` (and drops a torn or damaged tail), rewriting only
    /// the files that change, each by a temporary file and a rename; returns
    /// what they keep. The records a resume trains again (steps after its
    /// checkpoint) go, so that every step is in the files once. Every other
    /// file stays as it is, and so does a recorded name that is now a link
    /// or anything but a regular file.
    pub fn trim(&self, step: u64) -> io::Result<Kept> {
        let mut kept = Kept::default();
        let files: BTreeSet<String> = event_names(&self.dir)?.into_iter().collect();
        for name in self.own_names()?.intersection(&files) {
            // Listed as a regular file a moment ago; swapped since for a
            // link or a FIFO, the handle refuses it (InvalidInput): left alone.
            let file = match self.dir.open_read(name) {
                Ok(file) => file,
                Err(e) if matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::InvalidInput) => continue,
                Err(e) => return Err(e),
            };
            let mut keep: Vec<(u64, u64)> = Vec::new(); // (offset, length) of the records kept
            let mut dropped = false;
            let (end, tail) = read_records(BufReader::new(&file), |offset, payload| {
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
            if dropped || tail != Tail::Clean || end != file.metadata()?.len() {
                self.rewrite(name, &file, &keep)?;
            }
        }
        Ok(kept)
    }

    /// Rewrites `name` (open as `source`) with only the records at `keep`
    /// (offset, length), keeping its mode.
    fn rewrite(&self, name: &str, source: &File, keep: &[(u64, u64)]) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        let mode = source.metadata()?.permissions().mode() & 0o7777;
        // Not named like an event file: a reader must never take it for one.
        let (tmp_name, mut tmp) = (0..1000)
            .find_map(|n| {
                let tmp_name = format!(".rekindle-trim-{}-{n}", std::process::id());
                match self.dir.create_new(&tmp_name, 0o600) {
                    Ok(file) => Some(Ok((tmp_name, file))),
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => None,
                    Err(e) => Some(Err(e)),
                }
            })
            .unwrap_or_else(|| Err(io::Error::other("no free temporary name to trim an event file")))?;
        let written = (|| {
            let mut buf = Vec::new();
            for &(offset, len) in keep {
                buf.resize(len as usize, 0);
                source.read_exact_at(&mut buf, offset)?;
                tmp.write_all(&buf)?;
            }
            tmp.set_permissions(std::fs::Permissions::from_mode(mode))?;
            tmp.sync_all()?;
            self.dir.rename(&tmp_name, name)
        })();
        if let Err(e) = written {
            let _ = self.dir.remove_file(&tmp_name);
            return Err(with_path(&self.dir.shown(name), e));
        }
        self.dir.sync()
    }

    /// Creates a new event file here named to sort after every event file
    /// there, records it as this run's, and writes its `file_version`.
    pub fn create(&self, host: &str, wall_time: f64) -> io::Result<EventFile> {
        let newest = event_names(&self.dir)?.iter().filter_map(|n| stamp_of(n)).max();
        let now = wall_time.max(0.0) as u64;
        let stamp = newest.map_or(now, |n| now.max(n + 1));
        let host: String =
            host.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '.' { c } else { '_' }).collect();
        let host = if host.is_empty() { "_".to_string() } else { host };
        let pid = std::process::id();
        let mut n = 0;
        let (name, file) = loop {
            let name = format!("{FILE_PREFIX}{stamp:010}.{host}.{pid}.{n}");
            // O_EXCL: a name already there, whoever's, is never written.
            match self.dir.create_new(&name, 0o666) {
                Ok(file) => break (name, file),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && n < 1000 => n += 1,
                Err(e) => return Err(e),
            }
        };
        // Recorded only once created: a name in the record is always a
        // file this run made (O_EXCL), never one it found there.
        let recorded = self
            .run
            .open_append(&self.record)
            .and_then(|mut r| r.write_all(format!("{name}\n").as_bytes()).and_then(|()| r.sync_data()));
        if let Err(e) = recorded {
            let _ = self.dir.remove_file(&name);
            return Err(with_path(&self.run.shown(&self.record), e));
        }
        let mut out = EventFile { path: self.dir.shown(&name), file };
        out.write(&Event { wall_time, step: 0, what: Some(What::FileVersion(FILE_VERSION.into())) })?;
        Ok(out)
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// An event file being written: every record with one `write` (a crash
/// leaves at most the last one torn).
#[derive(Debug)]
pub struct EventFile {
    path: PathBuf,
    file: File,
}

impl EventFile {
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

    /// A TensorBoard directory `tb` in `tmp`, its record beside it.
    fn log_dir(tmp: &Path) -> LogDir {
        LogDir::open(&tmp.join("tb"), &tmp.join("tensorboard.files")).unwrap()
    }

    #[test]
    fn a_new_file_sorts_after_every_file_there_whatever_the_clock() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = log_dir(tmp.path());
        let first = dir.create("n2", 2_000_000_000.0).unwrap();
        // A node whose clock is behind.
        let second = dir.create("n1.cluster/x", 1_000_000_000.0).unwrap();
        let names = event_files(dir.path()).unwrap();
        assert_eq!(names, vec![first.path().to_path_buf(), second.path().to_path_buf()]);
        assert!(second.path().to_string_lossy().contains(".2000000001.n1.cluster_x."), "{:?}", second.path());
        assert_eq!(steps_in(first.path()), vec![(0, None)], "a file starts with its file_version");
        let record = std::fs::read_to_string(tmp.path().join("tensorboard.files")).unwrap();
        let recorded: Vec<&str> = record.lines().collect();
        let name = |f: &EventFile| f.path().file_name().unwrap().to_str().unwrap().to_string();
        assert_eq!(recorded, vec![name(&first), name(&second)], "each file recorded as the run's own");
    }

    #[test]
    fn trimming_keeps_steps_up_to_the_resume_in_every_file_and_drops_torn_tails() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = log_dir(tmp.path());
        let mut a = dir.create("n1", 100.0).unwrap();
        for step in 1..=6 {
            a.write(&scalar(step, "loss", step as f32)).unwrap();
        }
        a.write(&scalar(3, "checkpoint/persist_seconds", 0.5)).unwrap();
        let mut b = dir.create("n1", 200.0).unwrap();
        b.write(&scalar(4, "loss", 4.0)).unwrap();
        b.write(&scalar(5, "loss", 5.0)).unwrap();
        let (pa, pb) = (a.path().to_path_buf(), b.path().to_path_buf());
        drop((a, b));
        std::fs::set_permissions(&pa, std::fs::Permissions::from_mode(0o640)).unwrap();
        // A record torn by a SIGKILL.
        let torn = frame(&scalar(6, "loss", 6.0).encode_to_vec());
        std::fs::OpenOptions::new().append(true).open(&pb).unwrap().write_all(&torn[..10]).unwrap();

        let kept = dir.trim(4).unwrap();
        assert_eq!(kept.newest_step.get("loss"), Some(&4));
        assert_eq!(kept.newest_step.get("checkpoint/persist_seconds"), Some(&3));
        let loss = |p: &Path| steps_in(p).into_iter().filter(|(_, t)| t.is_some()).map(|(s, _)| s).collect::<Vec<_>>();
        assert_eq!(loss(&pa), vec![1, 2, 3, 4, 3], "a value of an earlier step written later stays");
        assert_eq!(loss(&pb), vec![4]);
        assert_eq!(steps_in(&pb)[0], (0, None), "file_version kept");
        assert_eq!(std::fs::metadata(&pa).unwrap().permissions().mode() & 0o777, 0o640, "its mode kept");
        // Trimming again changes nothing.
        let before = std::fs::read(&pa).unwrap();
        assert_eq!(dir.trim(4).unwrap(), kept);
        assert_eq!(std::fs::read(&pa).unwrap(), before);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2, "no temporary file left");
    }

    #[test]
    fn only_the_runs_own_files_are_trimmed_in_a_shared_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = log_dir(tmp.path());
        let mut own = dir.create("n1", 100.0).unwrap();
        own.write(&scalar(9, "loss", 9.0)).unwrap();
        drop(own);
        // Another run's file, named exactly like rekindle's (PyTorch does
        // so too), and files that merely mention tfevents.
        let mut foreign = frame(
            &Event { wall_time: 1.0, step: 0, what: Some(What::FileVersion(FILE_VERSION.into())) }.encode_to_vec(),
        );
        foreign.extend(frame(&scalar(9, "loss", 1.0).encode_to_vec()));
        foreign.extend(b"torn");
        let others = [
            ("events.out.tfevents.0000000100.n1.4242.0", foreign),
            ("big.tfevents.bin", vec![7; 100]),
            ("my-tfevents-notes.txt", b"notes".to_vec()),
        ];
        for (name, bytes) in &others {
            std::fs::write(dir.path().join(name), bytes).unwrap();
            std::fs::set_permissions(dir.path().join(name), std::fs::Permissions::from_mode(0o664)).unwrap();
        }
        // A link where an event file of the run's own was: never followed.
        let outside = tmp.path().join("outside.tfevents");
        std::fs::write(&outside, b"outside").unwrap();
        let linked = "events.out.tfevents.0000000001.n1.1.0";
        std::os::unix::fs::symlink(&outside, dir.path().join(linked)).unwrap();
        let mut record = crate::confine::open_append(&tmp.path().join("tensorboard.files")).unwrap();
        // Names not of rekindle's form are ignored even when recorded.
        record.write_all(format!("{linked}\nbig.tfevents.bin\n../outside.tfevents\n").as_bytes()).unwrap();

        let kept = dir.trim(0).unwrap();
        assert_eq!(kept.newest_step.get("loss"), None, "the foreign file's loss is not the run's");
        for (name, bytes) in &others {
            assert_eq!(&std::fs::read(dir.path().join(name)).unwrap(), bytes, "{name} untouched");
            let mode = std::fs::metadata(dir.path().join(name)).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o664, "{name}'s mode untouched");
        }
        assert_eq!(std::fs::read(&outside).unwrap(), b"outside");
        assert!(std::fs::symlink_metadata(dir.path().join(linked)).unwrap().file_type().is_symlink());
    }

    #[test]
    fn names_of_rekindles_form_are_recognised_exactly() {
        assert!(is_own_name("events.out.tfevents.1700000000.n1.cluster_x.123.0"));
        assert!(is_own_name("events.out.tfevents.1700000000.h.1.12"));
        for other in [
            "events.out.tfevents.1700000000.h.1.0.v2",
            "events.out.tfevents.170000000.h.1.0",
            "events.out.tfevents.1700000000..1.0",
            "events.out.tfevents.1700000000.h/..1.0",
            "big.tfevents.bin",
            "x.events.out.tfevents.1700000000.h.1.0",
        ] {
            assert!(!is_own_name(other), "{other}");
        }
    }

    #[test]
    fn a_link_in_place_of_the_directory_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, tmp.path().join("tb")).unwrap();
        let err = LogDir::open(&tmp.path().join("tb"), &tmp.path().join("r")).unwrap_err();
        assert!(err.to_string().contains("is a symbolic link"), "{err}");
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
    }
}
