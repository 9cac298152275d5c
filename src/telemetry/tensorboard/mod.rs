//! TensorBoard event files of a run (`[telemetry] tensorboard`): scalars
//! per step, written so that a run stopped, killed and resumed any number
//! of times shows as one curve, each step once.
//!
//! How a resume avoids duplicate steps (docs/telemetry.md), against the
//! behaviour of TensorBoard's own readers: its Python `EventAccumulator`
//! (files with `file_version` `brain.Event:2`) discards every value at or
//! after the step of a `SessionLog START`, and keeps a value seen again at
//! a step it already holds as a second point; its Rust data server drops
//! a tag's values from a step on when that tag goes back to it. So:
//! - each attempt (and each rollback) trims the run's own files back to the
//!   step it resumes from ([`LogDir::trim`]; files it did not create, in a
//!   directory shared with other runs, are never touched): steps trained
//!   again are never twice on disk, whoever reads them;
//! - it writes a new file, named to sort after the others, that holds only
//!   values newer than what the files already hold for each tag (older
//!   steps a killed attempt had not written yet are filled in from
//!   `metrics.jsonl`), then a `START` at the first step it will train: a
//!   TensorBoard that read the orphaned steps while they existed drops them.

mod files;
mod proto;
mod record;

use std::collections::BTreeMap;
use std::io;
use std::path::Path;

pub use files::{EventFile, FILE_PREFIX, Kept, LogDir, event_files, is_own_name};
pub use proto::{Event, FILE_VERSION, SESSION_START, SessionLog, Summary, SummaryValue, What};
pub use record::{MAX_RECORD_BYTES, Tail, frame, masked_crc, read_records};

/// The scalars of one run's attempt, written into its TensorBoard directory.
#[derive(Debug)]
pub struct TensorBoard {
    dir: LogDir,
    host: String,
    file: EventFile,
    /// The newest step of each tag in the files: a value at this step or
    /// before is there already, and is never written again.
    newest: BTreeMap<String, u64>,
}

impl TensorBoard {
    /// Opens `dir` for an attempt that resumed from `step` (0: a fresh
    /// start): trims the run's own files (those named in `record`) to it
    /// and starts a new one.
    pub fn open(dir: &Path, record: &Path, host: &str, step: u64, wall_time: f64) -> io::Result<TensorBoard> {
        TensorBoard::start(LogDir::open(dir, record)?, host, step, wall_time)
    }

    fn start(dir: LogDir, host: &str, step: u64, wall_time: f64) -> io::Result<TensorBoard> {
        let kept = dir.trim(step)?;
        let file = dir.create(host, wall_time)?;
        Ok(TensorBoard { dir, host: host.to_string(), file, newest: kept.newest_step })
    }

    /// Writes the values of `step` that are newer than what the files hold
    /// for their tag (non-finite ones are left out); nothing when none is.
    pub fn write(&mut self, step: u64, wall_time: f64, values: &[(String, f64)]) -> io::Result<()> {
        let fresh: Vec<SummaryValue> = values
            .iter()
            .filter(|(tag, v)| v.is_finite() && self.newest.get(tag).is_none_or(|n| step > *n))
            .map(|(tag, v)| SummaryValue { tag: tag.clone(), simple_value: Some(*v as f32) })
            .collect();
        if fresh.is_empty() {
            return Ok(());
        }
        for v in &fresh {
            self.newest.insert(v.tag.clone(), step);
        }
        let what = Some(What::Summary(Summary { value: fresh }));
        self.file.write(&Event { wall_time, step: step as i64, what })
    }

    /// Marks where this attempt's own steps begin: a `SessionLog START` at
    /// `step + 1`, after the steps up to `step` were filled in.
    pub fn begin_after(&mut self, step: u64, wall_time: f64, msg: String) -> io::Result<()> {
        self.file.write_start(step + 1, wall_time, msg)
    }

    /// Training went back to `step` (a rollback): the files are trimmed to
    /// it and continue in a new file that begins after it.
    pub fn rewind(&mut self, step: u64, wall_time: f64, msg: String) -> io::Result<()> {
        self.file.sync()?;
        let kept = self.dir.trim(step)?;
        self.file = self.dir.create(&self.host, wall_time)?;
        self.newest = kept.newest_step;
        self.begin_after(step, wall_time, msg)
    }

    /// Flushes the current file to stable storage.
    pub fn sync(&mut self) -> io::Result<()> {
        self.file.sync()
    }

    /// The file being written.
    pub fn path(&self) -> &Path {
        self.file.path()
    }
}

/// Reading event files back in tests.
#[cfg(test)]
pub(crate) mod tests_support {
    use super::*;
    use prost::Message;

    /// Every (step, tag, value) of the files in reading order, START as tag "START".
    pub(crate) fn read_all(dir: &Path) -> Vec<(u64, String, f32)> {
        let mut out = Vec::new();
        for path in event_files(dir).unwrap() {
            read_records(std::fs::File::open(path).unwrap(), |_, p| {
                let e = Event::decode(p).unwrap();
                if let Some(What::SessionLog(s)) = &e.what {
                    assert_eq!(s.status, SESSION_START);
                    out.push((e.step as u64, "START".into(), 0.0));
                }
                out.extend(e.scalars().map(|(t, v)| (e.step as u64, t.to_string(), v)));
            })
            .unwrap();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::tests_support::read_all;
    use super::*;

    fn loss(v: f64) -> Vec<(String, f64)> {
        vec![("loss".to_string(), v), ("lr".to_string(), f64::NAN)]
    }

    #[test]
    fn a_resume_keeps_each_step_once_and_fills_in_what_a_killed_attempt_had_not_written() {
        let tmp = tempfile::tempdir().unwrap();
        let record = tmp.path().join("tensorboard.files");
        let tb_dir = tmp.path().join("tb");
        let mut tb = TensorBoard::open(&tb_dir, &record, "n1", 0, 100.0).unwrap();
        tb.begin_after(0, 100.0, "start".into()).unwrap();
        for step in 1..=8 {
            tb.write(step, 100.0, &loss(step as f64)).unwrap();
        }
        drop(tb);
        // Resumed from step 5: 6..8 are trained again.
        let mut tb = TensorBoard::open(&tb_dir, &record, "n2", 5, 200.0).unwrap();
        tb.write(4, 200.0, &loss(40.0)).unwrap(); // already there: not again
        tb.begin_after(5, 200.0, "resume".into()).unwrap();
        tb.write(6, 200.0, &loss(60.0)).unwrap();
        tb.write(6, 200.0, &loss(61.0)).unwrap(); // a second value of a step: not written
        let got = read_all(&tb_dir);
        let losses: Vec<(u64, f32)> = got.iter().filter(|(_, t, _)| t == "loss").map(|(s, _, v)| (*s, *v)).collect();
        assert_eq!(losses, vec![(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0), (5, 5.0), (6, 60.0)]);
        let starts: Vec<u64> = got.iter().filter(|(_, t, _)| t == "START").map(|(s, _, _)| *s).collect();
        assert_eq!(starts, vec![1, 6]);
        assert!(got.iter().all(|(_, t, _)| t != "lr"), "non-finite values are left out");

        // A rollback to step 3 within the attempt.
        tb.rewind(3, 300.0, "rollback".into()).unwrap();
        tb.write(4, 300.0, &loss(44.0)).unwrap();
        let losses: Vec<(u64, f32)> =
            read_all(&tb_dir).into_iter().filter(|(_, t, _)| t == "loss").map(|(s, _, v)| (s, v)).collect();
        assert_eq!(losses, vec![(1, 1.0), (2, 2.0), (3, 3.0), (4, 44.0)]);
        assert_eq!(event_files(&tb_dir).unwrap().len(), 3);
    }
}
