//! The run directory as publishing reads it; what to take is `select.rs`'s
//! decision, this is the I/O, all of it through one handle of the run
//! directory ([`crate::confine::Dir`], opened once per publish):
//!
//! - the walk lists directories through that handle without following a
//!   symbolic link (entry types as `lstat` sees them) and enters only those
//!   a pattern reaches into;
//! - each read reaches its file from the handle with no link in any
//!   component (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, so a
//!   directory swapped for a link after the walk is refused too), opens it
//!   with `O_NONBLOCK` and checks on the open handle that it is a regular
//!   file (a FIFO never blocks a publish), admits it by the size that handle
//!   reports, and reads at most `[publish] max_file_mib` of it (a file
//!   growing meanwhile cannot make it read more);
//! - a file with other hard links is refused: its contents are the same
//!   inode as a file under another name, which may lie outside the run
//!   directory (a private key, another user's data: a hard link, unlike a
//!   symbolic one, does not say where its other names are) or be a
//!   checkpoint's (the same weights under another name; said so when it is).
//!   rekindle's own records never have a second name.

use std::cell::OnceCell;
use std::collections::HashSet;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::confine::{self, Dir, Kind};
use crate::telemetry::RefusedFile;

use super::select::{CHECKPOINT_REASON, Decision, EntryKind, SYMLINK_REASON, Selection, admit};

/// Why a file with several hard links is not published.
pub(super) const HARD_LINK_REASON: &str = "a file with other hard links: its other names may be outside the run \
     directory, and a hard link does not say where, so only files with a single name are published";

/// The files of the run directory `root` that `selection` takes (paths
/// relative to it, `/`-separated, sorted), and the entries it refuses. An
/// error only when `root` itself cannot be listed.
pub(super) fn walk(root: &Dir, selection: &Selection) -> io::Result<(Vec<String>, Vec<RefusedFile>)> {
    let (mut taken, mut refused) = (Vec::new(), Vec::new());
    let entries = sorted_entries(root, "")?;
    walk_entries(root, entries, &mut Vec::new(), selection, &mut taken, &mut refused);
    Ok((taken, refused))
}

fn sorted_entries(root: &Dir, rel: &str) -> io::Result<Vec<confine::Entry>> {
    let mut entries = root.entries(rel)?;
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(entries)
}

fn walk_entries(
    root: &Dir,
    entries: Vec<confine::Entry>,
    rel: &mut Vec<String>,
    selection: &Selection,
    taken: &mut Vec<String>,
    refused: &mut Vec<RefusedFile>,
) {
    for entry in entries {
        rel.push(entry.name_lossy());
        let shown = rel.join("/");
        let parts: Vec<&str> = rel.iter().map(String::as_str).collect();
        let mut refuse = |reason: String| refused.push(RefusedFile { file: shown.clone(), reason });
        match selection.decide(&parts, entry_kind(entry.kind)) {
            Decision::Skip => {}
            Decision::Refuse(reason) => refuse(reason),
            _ if entry.name.to_str().is_none() => refuse("its name is not valid UTF-8".into()),
            Decision::Take => taken.push(shown.clone()),
            Decision::Descend => match sorted_entries(root, &shown) {
                Ok(entries) => walk_entries(root, entries, rel, selection, taken, refused),
                Err(e) => refuse(format!("cannot list this directory: {}", reason_of(&e))),
            },
        }
        rel.pop();
    }
}

fn entry_kind(kind: Kind) -> EntryKind {
    match kind {
        Kind::Symlink => EntryKind::Symlink,
        Kind::Dir => EntryKind::Dir,
        Kind::File => EntryKind::File,
        Kind::Other(what) => EntryKind::Other(what),
    }
}

/// What an error of the handle says, in publishing's words: a link on the
/// way is [`SYMLINK_REASON`].
fn reason_of(e: &io::Error) -> String {
    if confine::is_link_refusal(e) { SYMLINK_REASON.to_string() } else { e.to_string() }
}

/// Reads what publishing copies, each file checked on its open handle.
pub(super) struct Reader {
    root: Dir,
    max_bytes: u64,
    /// Where checkpoint files live (`checkpoints/`, `[checkpoint] dir`).
    checkpoint_dirs: Vec<PathBuf>,
    /// (device, inode) of every file under those, listed on first need.
    checkpoint_files: OnceCell<HashSet<(u64, u64)>>,
}

impl Reader {
    pub(super) fn new(root: Dir, max_bytes: u64, checkpoint_dirs: Vec<PathBuf>) -> Reader {
        Reader { root, max_bytes, checkpoint_dirs, checkpoint_files: OnceCell::new() }
    }

    /// The bytes of the run-directory file `rel` (as the walk found it), or
    /// why it is not published.
    pub(super) fn read_inside(&self, rel: &str) -> Result<Vec<u8>, String> {
        let file = self.root.open_read_any(rel).map_err(|e| {
            if confine::is_link_refusal(&e) { SYMLINK_REASON.to_string() } else { format!("cannot open it: {e}") }
        })?;
        self.read_checked(rel, file, true)
    }

    /// The bytes of the newest checkpoint's manifest, published as `rel`;
    /// `Ok(None)` when it is gone.
    pub(super) fn read_manifest(&self, rel: &str, path: &Path) -> Result<Option<Vec<u8>>, String> {
        // Its checkpoint's directory as a handle, the file read through it.
        match Dir::open_parent(path).and_then(|(dir, name)| dir.open_read_any(name)) {
            Ok(file) => self.read_checked(rel, file, false).map(Some),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(reason_of(&e)),
        }
    }

    fn read_checked(&self, rel: &str, file: File, check_links: bool) -> Result<Vec<u8>, String> {
        let meta = file.metadata().map_err(|e| format!("cannot read it: {e}"))?;
        if !meta.is_file() {
            return Err(format!("{}, not a regular file: only regular files are published", confine::kind_of(&meta)));
        }
        if check_links && meta.nlink() > 1 {
            if self.checkpoint_files().contains(&(meta.dev(), meta.ino())) {
                return Err(format!("a hard link to a checkpoint file: {CHECKPOINT_REASON}"));
            }
            return Err(format!("{HARD_LINK_REASON} ({} names)", meta.nlink()));
        }
        admit(rel, meta.len(), self.max_bytes)?;
        let mut bytes = Vec::with_capacity(meta.len() as usize);
        file.take(self.max_bytes.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(|e| format!("cannot read it: {e}"))?;
        // It may have grown since its size was taken.
        admit(rel, bytes.len() as u64, self.max_bytes)?;
        Ok(bytes)
    }

    fn checkpoint_files(&self) -> &HashSet<(u64, u64)> {
        self.checkpoint_files.get_or_init(|| {
            let mut ids = HashSet::new();
            for dir in &self.checkpoint_dirs {
                if let Ok(dir) = Dir::open(dir) {
                    file_ids_under(&dir, Path::new(""), &mut ids);
                }
            }
            ids
        })
    }
}

/// (device, inode) of every regular file under `rel` of `dir`, links not
/// followed; what cannot be listed is left out.
fn file_ids_under(dir: &Dir, rel: &Path, ids: &mut HashSet<(u64, u64)>) {
    let Ok(entries) = dir.entries(rel) else { return };
    for entry in entries {
        let path = rel.join(&entry.name);
        match entry.kind {
            Kind::Dir => file_ids_under(dir, &path, ids),
            Kind::File => {
                if let Ok(meta) = dir.symlink_metadata(&path) {
                    ids.insert((meta.dev(), meta.ino()));
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::stat::Mode;
    use std::os::unix::fs::symlink;

    fn names(refused: &[RefusedFile]) -> Vec<&str> {
        refused.iter().map(|r| r.file.as_str()).collect()
    }

    #[test]
    fn the_walk_takes_regular_files_and_refuses_links_and_special_files() {
        let tmp = tempfile::tempdir().unwrap();
        let (run, outside) = (tmp.path().join("run"), tmp.path().join("outside.txt"));
        std::fs::create_dir_all(run.join("samples/sub")).unwrap();
        std::fs::create_dir_all(run.join("checkpoints/step-0000000001")).unwrap();
        std::fs::write(&outside, "secret").unwrap();
        std::fs::write(run.join("metrics.jsonl"), "{}\n").unwrap();
        std::fs::write(run.join("samples/a.txt"), "a").unwrap();
        std::fs::write(run.join("samples/sub/b.txt"), "b").unwrap();
        std::fs::write(run.join("checkpoints/step-0000000001/w.json"), "w").unwrap();
        symlink(&outside, run.join("passwd.txt")).unwrap();
        symlink(&outside, run.join("samples/key.txt")).unwrap();
        symlink("checkpoints", run.join("ck")).unwrap();
        symlink("samples", run.join("linked")).unwrap();
        nix::unistd::mkfifo(&run.join("samples/pipe.txt"), Mode::S_IRWXU).unwrap();
        let include: Vec<String> = ["*.txt", "samples/**", "ck/**", "**/*.json"].map(String::from).into();
        let (selection, _) = Selection::new(&include, None);
        let (taken, refused) = walk(&Dir::open(&run).unwrap(), &selection).unwrap();
        assert_eq!(taken, ["metrics.jsonl", "samples/a.txt", "samples/sub/b.txt"]);
        assert_eq!(
            names(&refused),
            ["checkpoints", "ck", "linked", "passwd.txt", "samples/key.txt", "samples/pipe.txt"]
        );
        assert!(refused[1].reason.contains("never follows links"), "{:?}", refused[1]);
        assert!(refused[5].reason.starts_with("a FIFO"), "{:?}", refused[5]);
    }

    #[test]
    fn reads_refuse_links_fifos_hard_links_and_files_over_the_cap() {
        let tmp = tempfile::tempdir().unwrap();
        let run = tmp.path().join("run");
        std::fs::create_dir_all(run.join("checkpoints/step-0000000001")).unwrap();
        std::fs::create_dir_all(run.join("real")).unwrap();
        std::fs::write(run.join("real/a.txt"), "a").unwrap();
        std::fs::write(run.join("big.txt"), vec![b'x'; 11]).unwrap();
        let weights = run.join("checkpoints/step-0000000001/model.safetensors");
        std::fs::write(&weights, "weights").unwrap();
        std::fs::hard_link(&weights, run.join("model.json")).unwrap();
        std::fs::write(tmp.path().join("id_rsa"), "outside").unwrap();
        std::fs::hard_link(tmp.path().join("id_rsa"), run.join("shared.txt")).unwrap();
        symlink("real", run.join("dir")).unwrap();
        symlink("/etc/passwd", run.join("passwd.txt")).unwrap();
        nix::unistd::mkfifo(&run.join("pipe.txt"), Mode::S_IRWXU).unwrap();
        let reader = Reader::new(Dir::open(&run).unwrap(), 10, vec![run.join("checkpoints")]);
        assert_eq!(reader.read_inside("real/a.txt").unwrap(), b"a");
        let shared = reader.read_inside("shared.txt").unwrap_err();
        assert!(shared.starts_with("a file with other hard links") && shared.ends_with("(2 names)"), "{shared}");
        assert!(reader.read_inside("dir/a.txt").unwrap_err().contains("never follows links"));
        assert!(reader.read_inside("passwd.txt").unwrap_err().contains("never follows links"));
        assert!(reader.read_inside("pipe.txt").unwrap_err().starts_with("a FIFO"), "never blocks");
        assert!(reader.read_inside("model.json").unwrap_err().contains("hard link to a checkpoint file"));
        assert!(reader.read_inside("big.txt").unwrap_err().contains("11 bytes is over"));
        assert!(reader.read_inside("absent.txt").unwrap_err().starts_with("cannot open it"));
        let manifest = run.join("checkpoints/step-0000000001/MANIFEST.json");
        assert_eq!(reader.read_manifest("MANIFEST.json", &manifest), Ok(None));
        std::fs::write(&manifest, "{}").unwrap();
        assert_eq!(reader.read_manifest("MANIFEST.json", &manifest), Ok(Some(b"{}".to_vec())));
    }
}
