//! Append-only JSON-lines files of a run: `events.jsonl` (lifecycle events,
//! [`Event`]) and `metrics.jsonl` ([`MetricsLine`](super::MetricsLine)). Each line is written with a
//! single `write` call in append mode and flushed, so a crash can cut off at
//! most the last line, and readers skip a torn final line.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::event::{Event, EventContext, EventLine};

/// Errors writing telemetry files.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("cannot write {path}: {source}; check that the run directory is writable")]
    Write { path: PathBuf, source: io::Error },
}

/// `path` opened for appending through its directory's handle
/// ([`crate::confine::Dir`]): the directory (the claimed run directory) is
/// opened as given, the file below it without following a link, created
/// when missing, refused unless it is a regular file.
pub(crate) fn open_in_dir(path: &Path) -> io::Result<File> {
    let (dir, name) = crate::confine::Dir::open_parent(path)?;
    dir.open_append(name)
}

/// An append-only JSON-lines file.
#[derive(Debug)]
pub struct JsonlWriter {
    path: PathBuf,
    file: File,
}

impl JsonlWriter {
    /// Opens `path` for appending, creating it if needed. A torn last line left
    /// by a crash is terminated first so the next record starts on its own line.
    pub fn open(path: impl Into<PathBuf>) -> Result<JsonlWriter, TelemetryError> {
        let path = path.into();
        let err = |source| TelemetryError::Write { path: path.clone(), source };
        // Reached from its directory's handle, never through a symlink
        // left in its place (docs/run-directory.md, Trust boundaries).
        let mut file = open_in_dir(&path).map_err(err)?;
        if ends_torn(&file).map_err(err)? {
            file.write_all(b"\n").map_err(err)?;
        }
        Ok(JsonlWriter { path, file })
    }

    /// Appends one record as a line. It goes through a JSON value first, so
    /// keys come out in alphabetical order whatever the type's field order
    /// (the files have always been written that way).
    pub fn append<T: Serialize>(&mut self, record: &T) -> Result<(), TelemetryError> {
        let value = serde_json::to_value(record).expect("telemetry records serialise");
        let mut line = serde_json::to_vec(&value).expect("telemetry records serialise");
        line.push(b'\n');
        self.file.write_all(&line).map_err(|source| TelemetryError::Write { path: self.path.clone(), source })
    }

    /// Flushes to stable storage (used before exiting after a stop signal).
    pub fn sync(&mut self) -> Result<(), TelemetryError> {
        self.file.sync_data().map_err(|source| TelemetryError::Write { path: self.path.clone(), source })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Another writer that may append a record for this one: a task of an
/// `exec` world hands its records to task 0 (attempt/board.rs), so that one
/// process appends to `events.jsonl` where thousands would (appends from
/// many NFS clients are not atomic). `true` once the record is on stable
/// storage; `false` and this log appends it itself.
pub trait Relay: Send {
    fn relay(&mut self, line: &serde_json::Value) -> bool;
}

/// `events.jsonl`: every record carries `event`, `time` (RFC 3339) and the
/// run's context (node, job id, attempt) next to the event's own fields.
pub struct EventLog {
    writer: JsonlWriter,
    context: EventContext,
    relay: Option<Box<dyn Relay>>,
}

impl std::fmt::Debug for EventLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventLog")
            .field("writer", &self.writer)
            .field("context", &self.context)
            .field("relayed", &self.relay.is_some())
            .finish()
    }
}

impl EventLog {
    /// Opens `<run dir>/events.jsonl`; `context` is added to every event.
    pub fn open(path: impl Into<PathBuf>, context: EventContext) -> Result<EventLog, TelemetryError> {
        Ok(EventLog { writer: JsonlWriter::open(path)?, context, relay: None })
    }

    /// From now on each record goes through `relay` first ([`Relay`]).
    pub fn relay_through(&mut self, relay: Box<dyn Relay>) {
        self.relay = Some(relay);
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        self.writer.path()
    }

    /// Appends `event` with the time and the context.
    pub fn record(&mut self, event: &Event) -> Result<(), TelemetryError> {
        let line = EventLine { time: now_rfc3339(), context: &self.context, event };
        if let Some(relay) = self.relay.as_mut() {
            let value = serde_json::to_value(&line).expect("telemetry records serialise");
            if relay.relay(&value) {
                return Ok(());
            }
            return self.writer.append(&value);
        }
        self.writer.append(&line)
    }

    pub fn sync(&mut self) -> Result<(), TelemetryError> {
        self.writer.sync()
    }
}

/// Current time, RFC 3339 in UTC with milliseconds.
pub fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// Whether the file's last byte is not a newline: a line torn by a crash.
/// Reads that byte alone, however long the file.
fn ends_torn(file: &File) -> std::io::Result<bool> {
    use std::os::unix::fs::FileExt;
    let len = file.metadata()?.len();
    let mut last = [0u8; 1];
    Ok(len > 0 && file.read_at(&mut last, len - 1)? == 1 && last[0] != b'\n')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torn_last_line_is_terminated_before_appending() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("m.jsonl");
        std::fs::write(&path, b"{\"step\":1}\n{\"ste").unwrap();
        let mut w = JsonlWriter::open(&path).unwrap();
        w.append(&serde_json::json!({"step": 2})).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text, "{\"step\":1}\n{\"ste\n{\"step\":2}\n");
    }

    #[test]
    fn events_carry_name_time_and_context() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("events.jsonl");
        let ctx = EventContext { node: "n1".into(), job_id: None, attempt: 0 };
        let mut log = EventLog::open(&path, ctx).unwrap();
        // Any object goes through the envelope; `Other` keeps this test independent of `Start`'s fields.
        log.record(&Event::Other(serde_json::json!({"event": "start", "step": 0}))).unwrap();
        let v: serde_json::Value = serde_json::from_str(std::fs::read_to_string(&path).unwrap().trim()).unwrap();
        assert_eq!(v["event"], "start");
        assert_eq!(v["node"], "n1");
        assert_eq!(v["step"], 0);
        assert!(chrono::DateTime::parse_from_rfc3339(v["time"].as_str().unwrap()).is_ok());
    }
}
