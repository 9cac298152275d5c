//! Following a JSON-lines file of the run while its writer appends to it
//! (the training loop, the monitor, or the program `rekindle exec` runs),
//! for the exports (`export.rs`): each call returns the whole lines added
//! since the last one. A file replaced by a rename (`metrics.jsonl`
//! trimmed back at a resume or a rollback) is read again from its start.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::records::MAX_LINE_BYTES;

/// The most bytes one call reads: a backlog is taken over several calls.
const MAX_READ: u64 = 64 << 20;

/// A JSON-lines file followed by path.
#[derive(Debug)]
pub struct Follow {
    path: PathBuf,
    open: Option<Opened>,
}

#[derive(Debug)]
struct Opened {
    file: File,
    id: (u64, u64),
    offset: u64,
    /// The start of a line not yet ended by its newline.
    partial: Vec<u8>,
}

impl Follow {
    pub fn new(path: impl Into<PathBuf>) -> Follow {
        Follow { path: path.into(), open: None }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The JSON objects of the lines completed since the last call (lines
    /// that do not parse, torn by a crash, are skipped); none while the file
    /// does not exist. A file replaced since (another inode) or cut shorter
    /// is read again from its start.
    pub fn read_new(&mut self) -> io::Result<Vec<Value>> {
        let id = match std::fs::symlink_metadata(&self.path) {
            Ok(meta) if meta.file_type().is_file() => (meta.dev(), meta.ino()),
            Ok(_) => return Err(io::Error::other(format!("{} is not a regular file", self.path.display()))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                self.open = None;
                return Ok(Vec::new());
            }
            Err(e) => return Err(e),
        };
        if self.open.as_ref().is_none_or(|o| o.id != id) {
            let file = crate::confine::open_regular(&self.path)?;
            self.open = Some(Opened { file, id, offset: 0, partial: Vec::new() });
        }
        let open = self.open.as_mut().expect("opened above");
        let len = open.file.metadata()?.len();
        if len < open.offset {
            (open.offset, open.partial) = (0, Vec::new());
        }
        open.file.seek(SeekFrom::Start(open.offset))?;
        let mut bytes = Vec::new();
        (&mut open.file).take(MAX_READ).read_to_end(&mut bytes)?;
        open.offset += bytes.len() as u64;
        let mut records = Vec::new();
        let mut rest = bytes.as_slice();
        while let Some(i) = rest.iter().position(|b| *b == b'\n') {
            open.partial.extend_from_slice(&rest[..i]);
            rest = &rest[i + 1..];
            if let Ok(v @ Value::Object(_)) = serde_json::from_slice::<Value>(&open.partial) {
                records.push(v);
            }
            open.partial.clear();
        }
        open.partial.extend_from_slice(rest);
        if open.partial.len() > MAX_LINE_BYTES {
            // Never a record of rekindle's: dropped rather than kept growing.
            open.partial.clear();
        }
        Ok(records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::io::Write;

    #[test]
    fn returns_whole_new_lines_and_rereads_a_replaced_file() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("metrics.jsonl");
        let mut follow = Follow::new(&path);
        assert!(follow.read_new().unwrap().is_empty(), "no file yet");
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&path).unwrap();
        f.write_all(b"{\"step\":1}\n{\"step\":2}\n{\"st").unwrap();
        assert_eq!(follow.read_new().unwrap(), vec![json!({"step": 1}), json!({"step": 2})]);
        f.write_all(b"ep\":3}\nnot json\n").unwrap();
        assert_eq!(follow.read_new().unwrap(), vec![json!({"step": 3})]);
        assert!(follow.read_new().unwrap().is_empty());
        // Replaced by a rename, as metrics.jsonl is when it is trimmed.
        let tmp_file = tmp.path().join("new");
        std::fs::write(&tmp_file, b"{\"step\":1}\n").unwrap();
        std::fs::rename(&tmp_file, &path).unwrap();
        assert_eq!(follow.read_new().unwrap(), vec![json!({"step": 1})]);
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(tmp.path().join("elsewhere"), &path).unwrap();
        assert!(follow.read_new().is_err(), "a symlink in its place is never followed");
    }
}
