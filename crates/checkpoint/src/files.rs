//! Checkpoints of a program's own files (`kind = "files"`, `rekindle exec`):
//! the program writes any files into a fresh directory under the staging
//! directory ([`STAGING_DIR`], inside the checkpoints directory so that the
//! commit is a rename on one filesystem), then [`CheckpointStore::seal`]
//! commits it with the protocol of native checkpoints (`store.rs`):
//!
//! 1. refuse what is not a checkpoint to be: a directory outside the staging
//!    directory (or a symlink to one), a step not newer than the newest
//!    checkpoint, an empty directory, anything but plain files in it;
//! 2. fsync every file and hash it (SHA-256);
//! 3. write `MANIFEST.json` (kind `files`) last, fsync it and the directory;
//! 4. ask the commit guard (the run-directory lock is still ours);
//! 5. rename it to `step-<10 digits>`, fsync the checkpoints and staging
//!    directories;
//! 6. rotate with the same planner (keep N, never the newest valid one).
//!
//! A staged directory that was never sealed is never a checkpoint: it has no
//! manifest and no `step-` name, and `rekindle exec` empties the staging
//! directory when an attempt starts.
//!
//! All of it goes through the checkpoints directory's handle: the path a
//! program names is only looked at to find its name in the staging
//! directory ([`Dir::name_of`]); the move, the listing, the reads, the
//! manifest and the renames are resolved below the handle, never through a
//! link (a handle-only module, `tests/it/architecture.rs`).

use std::path::{Path, PathBuf};
use std::time::Instant;

use super::error::CheckpointError;
use super::hashed_io::{read_hashed, write_hashed};
use super::layout::CheckpointKind;
use super::layout::step_dir_name;
use super::manifest::{FORMAT_VERSION, MANIFEST_FILE, Manifest, ManifestEntry, is_plain_name};
use super::store::{CheckpointStore, SaveReport, TMP_PREFIX, refuse_other_kind};
use super::verify::{CheckpointInfo, VerifyLevel};
use crate::confine::{Dir, Kind};

/// The staging directory's name inside the checkpoints directory. It starts
/// with a dot: nothing that lists checkpoints (`step-*`) or quarantined ones
/// ever looks at it.
pub const STAGING_DIR: &str = ".staging";

/// The newest files checkpoint that verifies, and the newer ones that do not.
#[derive(Debug, Clone)]
pub struct FilesOutcome {
    /// The newest checkpoint whose every file verifies (size and SHA-256).
    pub newest: Option<CheckpointInfo>,
    /// Newer checkpoints that failed, newest first, with the reasons.
    pub rejected: Vec<CheckpointInfo>,
}

impl CheckpointStore {
    /// Where a program stages the directories it asks to seal.
    pub fn staging_dir(&self) -> PathBuf {
        self.dir().join(STAGING_DIR)
    }

    /// Creates the staging directory, empty: whatever an earlier attempt
    /// staged and never sealed is removed (it is not a checkpoint, and a
    /// program must not find it). Returns the paths removed.
    pub fn reset_staging(&self) -> Result<Vec<PathBuf>, CheckpointError> {
        let root = self.root()?;
        let staging = self.staging_dir();
        // A symlink (or a file) by that name is not rekindle's: emptying it
        // would empty whatever it points to. Refused, never followed.
        let exists =
            root.own_dir(STAGING_DIR).map_err(|source| CheckpointError::ListDir { path: staging.clone(), source })?;
        let mut removed = Vec::new();
        if exists {
            let entries = root
                .entries(STAGING_DIR)
                .map_err(|source| CheckpointError::ListDir { path: staging.clone(), source })?;
            removed.extend(entries.into_iter().map(|e| staging.join(e.name)));
            removed.sort();
            if !removed.is_empty() {
                // Never follows a symlink, at the top or below.
                root.remove_dir_all(STAGING_DIR)
                    .map_err(|source| CheckpointError::Remove { path: staging.clone(), source })?;
            }
        }
        if !exists || !removed.is_empty() {
            root.create_dir(STAGING_DIR, 0o777)
                .map_err(|source| CheckpointError::CreateDir { path: staging.clone(), source })?;
        }
        Ok(removed)
    }

    /// Seals `staged`, a directory directly under [`staging_dir`](Self::staging_dir),
    /// into the checkpoint of `step` (see the module header), then rotates.
    /// On a refusal or an error before the rename nothing is committed and
    /// `staged` is left as it was.
    pub fn seal(&self, staged: &Path, step: u64) -> Result<SaveReport, CheckpointError> {
        let started = Instant::now();
        let root = self.root()?;
        let refuse = |reason: String| CheckpointError::Seal { dir: staged.to_path_buf(), step, reason };
        let staged_rel = self.check_staged(&root, staged, step)?;
        let final_dir = self.check_newer(staged, step)?;
        // The program owns the staged name and may change what it points to
        // at any moment: move the directory under a name of rekindle's first,
        // then check that what was moved is a real directory, and work only
        // there. A symlink or anything swapped in is moved back, refused.
        // A `.tmp-` name: if this process dies mid-seal, the next start removes it.
        let sealing = format!("{TMP_PREFIX}seal-{}-{}", step_dir_name(step), std::process::id());
        // Tests swap the staged directory for a symlink here (`fail::cfg_callback`).
        fail::fail_point!("checkpoint::seal::before_move");
        root.rename(&staged_rel, &sealing).map_err(|e| refuse(format!("cannot move it aside to seal it: {e}")))?;
        let back = |why: String| {
            if let Err(e) = root.rename(&sealing, &staged_rel) {
                tracing::warn!(from = %root.shown(&sealing).display(), to = %root.shown(&staged_rel).display(), error = %e, "could not move a refused staged directory back; the next start removes it");
            }
            refuse(why)
        };
        match root.own_dir(&sealing) {
            Ok(true) => {}
            Ok(false) => return Err(refuse("it vanished while it was sealed".into())),
            Err(e) => return Err(back(format!("it was swapped while it was sealed: {e}"))),
        }
        match self.seal_moved(&root, &sealing, &final_dir, step) {
            Ok((bytes, rotated_out)) => {
                Ok(SaveReport::committed(step, final_dir, bytes, started, rotated_out, None, None))
            }
            Err(e) if e.committed() => Err(e),
            Err(CheckpointError::Seal { reason, .. }) => Err(back(reason)),
            Err(e) => {
                let _ = back(String::new());
                Err(e)
            }
        }
    }

    /// Steps 2 to 6 of the module header on `sealing` (a name in the
    /// checkpoints directory `root`), the staged directory moved under
    /// rekindle's own name: the bytes committed and the checkpoints rotated
    /// out. Before the rename into `final_dir` nothing in `sealing` but its
    /// manifest is changed, and the manifest is removed again on a failure.
    fn seal_moved(
        &self,
        root: &Dir,
        sealing: &str,
        final_dir: &Path,
        step: u64,
    ) -> Result<(u64, Vec<PathBuf>), CheckpointError> {
        let refuse = |reason: String| CheckpointError::Seal { dir: root.shown(sealing), step, reason };
        let held = root.open_dir(sealing).map_err(|e| refuse(format!("cannot open it: {e}")))?;
        let entries = staged_files(&held, false).map_err(refuse)?;
        // Tests swap a listed file for a FIFO here.
        fail::fail_point!("checkpoint::seal::after_list");
        let files = sync_and_hash(&held, entries, step)?;
        self.commit_files(root, sealing, final_dir, step, files)
    }

    /// Steps 3 to 6 of the module header on `sealing`, a directory of
    /// rekindle's own name in the checkpoints directory `root` holding
    /// exactly `files`, each fsynced and hashed already: the bytes committed
    /// and the checkpoints rotated out. Shared by a seal and by the commit of
    /// a world's parts (`world.rs`).
    pub(super) fn commit_files(
        &self,
        root: &Dir,
        sealing: &str,
        final_dir: &Path,
        step: u64,
        files: Vec<ManifestEntry>,
    ) -> Result<(u64, Vec<PathBuf>), CheckpointError> {
        let werr = |path: &Path| {
            let path = path.to_path_buf();
            move |source| CheckpointError::Write { step, path, source }
        };
        let manifest = Manifest {
            format_version: FORMAT_VERSION,
            kind: CheckpointKind::Files,
            step,
            created_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            rekindle_version: env!("CARGO_PKG_VERSION").to_string(),
            files,
        };
        let sealing_path = root.shown(sealing);
        let held = root.open_dir(sealing).map_err(werr(&sealing_path))?;
        let manifest_path = held.shown(MANIFEST_FILE);
        let manifest_bytes =
            write_hashed(&held, MANIFEST_FILE, &[&manifest.to_bytes()]).map_err(werr(&manifest_path))?.bytes;
        let unsealed = |e: CheckpointError| {
            let _ = held.remove_file(MANIFEST_FILE);
            e
        };
        held.sync().map_err(werr(&sealing_path)).map_err(unsealed)?;
        fail::fail_point!("checkpoint::seal::before_rename", |_| Err(unsealed(CheckpointError::Injected(
            "checkpoint::seal::before_rename".into()
        ))));
        // Not ours to commit: the directory goes back to staging, never sealed.
        self.may_write(step).map_err(unsealed)?;
        root.rename(sealing, step_dir_name(step)).map_err(werr(final_dir)).map_err(unsealed)?;
        let after = |stage: &'static str| {
            let dir = final_dir.to_path_buf();
            move |e| CheckpointError::AfterCommit { step, dir, stage, source: Box::new(e) }
        };
        let sync_err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| CheckpointError::SyncDir { path, source }
        };
        root.sync().map_err(sync_err(self.dir())).map_err(after("syncing the checkpoints directory"))?;
        root.open_dir(STAGING_DIR)
            .and_then(|staging| staging.sync())
            .map_err(sync_err(&self.staging_dir()))
            .map_err(after("syncing the staging directory"))?;
        let rotated_out =
            self.may_write(step).and_then(|()| self.rotate(step)).map_err(after("rotating out old checkpoints"))?;
        Ok((manifest.total_bytes() + manifest_bytes, rotated_out))
    }

    /// The directory the checkpoint of `step` will be committed to, when
    /// `step` is newer than the newest valid checkpoint (a files checkpoint)
    /// and nothing is in its way; a refusal to seal `dir` otherwise.
    pub(super) fn check_newer(&self, dir: &Path, step: u64) -> Result<PathBuf, CheckpointError> {
        let refuse = |reason: String| CheckpointError::Seal { dir: dir.to_path_buf(), step, reason };
        let newest = self.newest_valid(VerifyLevel::Quick)?;
        if let Some(newest) = &newest {
            refuse_other_kind(&newest.dir, CheckpointKind::Files)?;
            if step <= newest.step {
                return Err(refuse(format!(
                    "step {step} is not newer than the newest checkpoint (step {}, {}); seal a later step",
                    newest.step,
                    newest.dir.display()
                )));
            }
        }
        self.check_not_committed(dir, step)
    }

    /// Refused when the checkpoint of `step` exists (it cannot be the newest
    /// that verifies and still be sealed again); its directory otherwise.
    /// One look, where [`Self::check_newer`] verifies the kept checkpoints.
    pub(super) fn check_not_committed(&self, dir: &Path, step: u64) -> Result<PathBuf, CheckpointError> {
        let final_dir = self.step_dir(step);
        if self.root()?.exists(step_dir_name(step)) {
            return Err(CheckpointError::Seal {
                dir: dir.to_path_buf(),
                step,
                reason: format!(
                    "{} exists: a step is sealed once; seal a later step (if it does not verify, move it away or run \
                     `rekindle exec` again, which quarantines it)",
                    final_dir.display()
                ),
            });
        }
        Ok(final_dir)
    }

    /// `staged`'s path relative to the checkpoints directory `root`
    /// (`.staging/<name>`), when it is a real directory directly under the
    /// staging directory.
    pub(super) fn check_staged(&self, root: &Dir, staged: &Path, step: u64) -> Result<PathBuf, CheckpointError> {
        let refuse = |reason: String| CheckpointError::Seal { dir: staged.to_path_buf(), step, reason };
        let staging = self.staging_dir();
        // Through a staging directory that is a link, `staged` would be a
        // directory elsewhere, moved into the checkpoints and later rotated.
        match root.own_dir(STAGING_DIR) {
            Ok(true) => {}
            Ok(false) => return Err(refuse(format!("there is no staging directory {}", staging.display()))),
            Err(e) => return Err(refuse(e.to_string())),
        }
        let held = root
            .open_dir(STAGING_DIR)
            .map_err(|e| refuse(format!("the staging directory {} cannot be opened: {e}", staging.display())))?;
        let name = held.name_of(staged).map_err(|e| match e.kind() {
            std::io::ErrorKind::InvalidInput => refuse(format!(
                "it is not a directory directly under the staging directory {} (REKINDLE_CHECKPOINT_DIR): \
                 only a directory staged there can be renamed into the checkpoints atomically",
                staging.display()
            )),
            _ => refuse(format!("cannot resolve it: {e}")),
        })?;
        let meta = held.symlink_metadata(&name).map_err(|e| refuse(format!("cannot read it: {e}")))?;
        if meta.file_type().is_symlink() || !meta.is_dir() {
            return Err(refuse("not a directory (a symlink is refused too): stage the files in a directory".into()));
        }
        Ok(Path::new(STAGING_DIR).join(name))
    }

    /// The newest files checkpoint that verifies fully, and the newer ones
    /// that do not (for the caller to record and quarantine). A valid native
    /// checkpoint on the way is [`CheckpointError::WrongKind`].
    pub fn newest_files_checkpoint(&self) -> Result<FilesOutcome, CheckpointError> {
        let mut rejected = Vec::new();
        if let Err(CheckpointError::ListDir { source, .. }) = self.root()
            && source.kind() == std::io::ErrorKind::NotFound
        {
            return Ok(FilesOutcome { newest: None, rejected });
        }
        for info in self.list(VerifyLevel::Quick)? {
            if !info.valid {
                rejected.push(info);
                continue;
            }
            refuse_other_kind(&info.dir, CheckpointKind::Files)?;
            let failures = self.verify_step(info.step, VerifyLevel::Full);
            if failures.is_empty() {
                return Ok(FilesOutcome { newest: Some(info), rejected });
            }
            rejected.push(CheckpointInfo { valid: false, failures, ..info });
        }
        Ok(FilesOutcome { newest: None, rejected })
    }
}

/// Fsyncs each of the files `names` of `dir` (the program wrote them: their
/// data reaches the disk here) and hashes it as it reads it back: their
/// manifest entries. Each file is opened once through the handle, without
/// following a link or blocking on a FIFO swapped in; one that is no longer
/// a plain file is refused.
pub(super) fn sync_and_hash(dir: &Dir, names: Vec<String>, step: u64) -> Result<Vec<ManifestEntry>, CheckpointError> {
    let mut files = Vec::new();
    for name in names {
        let path = dir.shown(&name);
        let file = dir.open_read(&name).and_then(|f| f.sync_all().map(|()| f)).map_err(|e| CheckpointError::Seal {
            dir: dir.path().to_path_buf(),
            step,
            reason: format!("`{name}`: {e}"),
        })?;
        let (bytes, sha256, _) =
            read_hashed(file, false).map_err(|source| CheckpointError::Write { step, path: path.clone(), source })?;
        files.push(ManifestEntry { name, bytes, sha256 });
    }
    Ok(files)
}

/// The names of the files of a staged directory, sorted, or why it cannot be
/// sealed: holding anything but plain files with plain names, or empty
/// (unless `may_be_empty`: a rank's part of a world checkpoint, where only
/// some ranks write files).
pub(super) fn staged_files(dir: &Dir, may_be_empty: bool) -> Result<Vec<String>, String> {
    let mut names = Vec::new();
    let entries = dir.entries("").map_err(|e| format!("cannot list it: {e}"))?;
    for entry in entries {
        let name = entry.name.into_string().map_err(|n| format!("{n:?} is not a UTF-8 file name"))?;
        if entry.kind == Kind::Symlink {
            return Err(format!("`{name}` is a symlink: a checkpoint holds its own data; copy the file in"));
        }
        if !entry.kind.is_file() {
            return Err(format!(
                "`{name}` is not a plain file (a subdirectory?): a checkpoint is one flat directory of files"
            ));
        }
        if name == MANIFEST_FILE || !is_plain_name(&name) {
            return Err(format!("`{name}` is a name rekindle reserves for the checkpoint's manifest"));
        }
        names.push(name);
    }
    if names.is_empty() && !may_be_empty {
        return Err("it is empty: write the checkpoint's files into it first".into());
    }
    names.sort();
    Ok(names)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::{Snapshot, TensorSet};
    use std::fs;

    /// A directory `name` under the staging directory holding `files`.
    pub(crate) fn stage(store: &CheckpointStore, name: &str, files: &[(&str, &[u8])]) -> PathBuf {
        let dir = store.staging_dir().join(name);
        fs::create_dir_all(&dir).unwrap();
        for (file, bytes) in files {
            fs::write(dir.join(file), bytes).unwrap();
        }
        dir
    }

    fn steps(store: &CheckpointStore) -> Vec<u64> {
        store.list(VerifyLevel::Full).unwrap().iter().filter(|i| i.valid).map(|i| i.step).collect()
    }

    #[test]
    fn a_sealed_directory_is_a_checkpoint_that_verifies_with_every_file_hashed() {
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(tmp.path().join("checkpoints"), 3).unwrap();
        store.reset_staging().unwrap();
        // Names that mean something to native checkpoints are the program's own here.
        let staged = stage(&store, "a", &[("weights.npy", b"\x93NUMPY..."), ("state.json", b"not json")]);
        let report = store.seal(&staged, 10).unwrap();
        assert_eq!(report.dir, store.step_dir(10));
        assert!(!staged.exists(), "renamed, not copied");
        assert!(crate::verify_checkpoint_dir(&report.dir, VerifyLevel::Full).is_empty());
        let manifest = super::super::read_manifest(&report.dir).unwrap();
        assert_eq!(manifest.kind, CheckpointKind::Files);
        let names: Vec<&str> = manifest.files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["state.json", "weights.npy"]);
        let outcome = store.newest_files_checkpoint().unwrap();
        assert_eq!(outcome.newest.unwrap().step, 10);
        assert!(outcome.rejected.is_empty());
    }

    #[test]
    fn sealing_rotates_like_native_checkpoints() {
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(tmp.path(), 2).unwrap();
        store.reset_staging().unwrap();
        for step in [1, 2, 3] {
            let staged = stage(&store, &format!("s{step}"), &[("x", &[step as u8])]);
            store.seal(&staged, step).unwrap();
        }
        assert_eq!(steps(&store), vec![3, 2]);
    }

    #[test]
    fn what_cannot_be_a_checkpoint_is_refused_and_left_staged() {
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(tmp.path().join("c"), 3).unwrap();
        store.reset_staging().unwrap();
        let ok = stage(&store, "ok", &[("x", b"1")]);
        store.seal(&ok, 5).unwrap();
        let refused = |dir: &Path, step: u64, says: &str| {
            let err = store.seal(dir, step).unwrap_err();
            assert!(matches!(err, CheckpointError::Seal { .. }), "{err}");
            assert!(err.to_string().contains(says), "{err} should say {says}");
        };
        let older = stage(&store, "older", &[("x", b"2")]);
        refused(&older, 5, "not newer than the newest checkpoint (step 5");
        refused(&older, 4, "not newer");
        let empty = stage(&store, "empty", &[]);
        refused(&empty, 6, "it is empty");
        let outside = tmp.path().join("outside");
        fs::create_dir_all(&outside).unwrap();
        fs::write(outside.join("x"), b"1").unwrap();
        refused(&outside, 6, "not a directory directly under the staging directory");
        let link = store.staging_dir().join("link");
        std::os::unix::fs::symlink(&outside, &link).unwrap();
        refused(&link, 6, "a symlink is refused");
        let with_link = stage(&store, "with_link", &[("a", b"1")]);
        std::os::unix::fs::symlink(outside.join("x"), with_link.join("b")).unwrap();
        refused(&with_link, 6, "`b` is a symlink");
        let nested = stage(&store, "nested", &[("a", b"1")]);
        fs::create_dir(nested.join("sub")).unwrap();
        refused(&nested, 6, "`sub` is not a plain file");
        let manifest = stage(&store, "manifest", &[(MANIFEST_FILE, b"{}")]);
        refused(&manifest, 6, "reserves");
        refused(&store.staging_dir().join("absent"), 6, "cannot read it");
        assert!(older.join("x").exists() && !older.join(MANIFEST_FILE).exists(), "left as it was");
        assert_eq!(steps(&store), vec![5]);
    }

    #[test]
    fn a_guard_that_refuses_leaves_the_directory_staged_and_unsealed() {
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(tmp.path(), 3)
            .unwrap()
            .with_commit_guard(crate::CommitGuard::new(|| Err("the lock is another's")));
        store.reset_staging().unwrap();
        let staged = stage(&store, "a", &[("x", b"1")]);
        let err = store.seal(&staged, 1).unwrap_err();
        assert!(err.not_owner(), "{err}");
        assert!(staged.join("x").exists() && !staged.join(MANIFEST_FILE).exists());
        assert!(steps(&store).is_empty());
    }

    #[test]
    fn exec_refuses_native_checkpoints_and_rejects_damaged_newer_ones() {
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(tmp.path(), 3).unwrap();
        store.reset_staging().unwrap();
        for step in [1, 2] {
            let staged = stage(&store, &format!("s{step}"), &[("w", b"weights")]);
            store.seal(&staged, step).unwrap();
        }
        fs::write(store.step_dir(2).join("w"), b"weighTs").unwrap();
        let outcome = store.newest_files_checkpoint().unwrap();
        assert_eq!(outcome.newest.unwrap().step, 1);
        assert_eq!(outcome.rejected.iter().map(|i| i.step).collect::<Vec<_>>(), vec![2]);

        let native = CheckpointStore::open(tmp.path().join("native"), 3).unwrap();
        native
            .save(&Snapshot { step: 1, model: TensorSet::new(), optimizer: TensorSet::new(), state: "s".into() })
            .unwrap();
        let err = native.newest_files_checkpoint().unwrap_err();
        assert!(matches!(err, CheckpointError::WrongKind { found: CheckpointKind::Native, .. }), "{err}");
        assert!(err.to_string().contains("`rekindle exec` hands a program only checkpoints it sealed"), "{err}");
        native.reset_staging().unwrap();
        let staged = stage(&native, "s", &[("w", b"1")]);
        assert!(matches!(native.seal(&staged, 2).unwrap_err(), CheckpointError::WrongKind { .. }));
    }

    #[test]
    fn resetting_the_staging_directory_removes_what_was_never_sealed() {
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(tmp.path(), 3).unwrap();
        assert!(store.reset_staging().unwrap().is_empty());
        let half = stage(&store, "half", &[("w", b"half written")]);
        fs::write(store.staging_dir().join("stray"), b"x").unwrap();
        let removed = store.reset_staging().unwrap();
        assert_eq!(removed.len(), 2);
        assert!(!half.exists() && store.staging_dir().is_dir());
        assert!(steps(&store).is_empty());
    }
}
