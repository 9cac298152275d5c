//! The checkpoint store: the commit protocol that makes a checkpoint either
//! fully there or not there at all, rotation, and finding the newest
//! checkpoint to load. What a valid checkpoint is lives in `verify.rs`; the
//! hashed writes and fsyncs in `hashed_io.rs`.
//!
//! Commit protocol (see docs/checkpoint-format.md):
//! 1. check free space against the exact bytes to be written;
//! 2. write every file into a temporary sibling `.tmp-step-…` inside the
//!    checkpoints directory, hashing the bytes as they are written;
//! 3. fsync each file; write `MANIFEST.json` last and fsync it; fsync the
//!    temporary directory;
//! 4. ask the [`CommitGuard`], if any, whether this process may still write
//!    (the run-directory lock is still its own); if not, abort: nothing is
//!    renamed and the temporary directory is removed;
//! 5. rename it to `step-<10 digits>` and fsync the checkpoints directory;
//! 6. rotate (after asking the guard again): old checkpoints are first renamed to `.trash-…` (atomic), then
//!    removed, so a crash mid-delete never leaves a half checkpoint behind.
//!
//! Saving a step whose `step-…` directory exists but does not verify replaces
//! it: the old one is renamed to `.trash-…`, the new one renamed in, the
//! directory synced, the old one removed; each of those has a failpoint
//! (`checkpoint::replace::…`) and its own error, so a failure says which of
//! them failed and whether the new checkpoint is committed.
//!
//! Rotation never deletes the checkpoint it runs for (the planner is told its
//! step), and never counts as valid a checkpoint known to be bad. Those that
//! fail full verification at resume are quarantined (`quarantine.rs`), out of
//! rotation's sight; one that cannot be moved is remembered by the store (and
//! its clones) as invalid until a save of its step replaces it. And rotation
//! does not take the quick check's word for a checkpoint newer than the one
//! just committed: such a checkpoint is only there when a resumed run fell
//! back past it, so it is verified fully before it may count toward `keep`.
//! Older checkpoints keep the quick check: verifying them fully at every save
//! would cost a read of every kept checkpoint.
//!
//! A directory without a valid manifest is never a checkpoint; leftovers of
//! interrupted saves and deletes are removed when the store is opened.
//!
//! Every write, rename, removal and fsync of the protocol goes through the
//! checkpoints directory's handle ([`crate::confine::Dir`]), opened once when
//! the store is opened (after [`claim_dir`]): a link anywhere below it — a
//! `.tmp-…` or `step-…` name, a staging directory swapped for a link while a
//! save runs — is refused by the kernel, never followed. This module opens
//! nothing by path (`tests/it/architecture.rs`, handle-only modules); the
//! readers (`verify.rs`) still open committed checkpoints by path, each file
//! with `O_NOFOLLOW`.

use std::collections::BTreeSet;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use serde::Serialize;

use super::encode::{Content, PlannedFile, Sharding, names_from_others, part_file, tensor_files, write_files};
use super::error::{CheckpointError, FileFailure};
use super::hashed_io::{WriteMode, fail_io, write_hashed};
use super::layout::CheckpointKind;
use super::layout::{STATE_FILE, STEP_PREFIX, Snapshot, claim_dir, parse_step_dir_name, step_dir_name};
use super::manifest::{FORMAT_VERSION, MANIFEST_FILE, Manifest, ManifestEntry, SHARDED_FORMAT_VERSION, is_plain_name};
use super::quarantine::{self, Quarantined};
use super::rotation::{self, Action, Candidate};
use super::shards::{DEFAULT_SHARD_BYTES, parse_shard_name};
use super::tensor::TensorSet;
use super::verify::{CheckpointInfo, Loaded, VerifyLevel, inspect_at, load_dir, read_manifest_at, unopened, verify_at};
use super::write_mode::{IoMode, WriteChoice, WriteSettings, plan_for};
use crate::confine::Dir;

pub(super) const TMP_PREFIX: &str = ".tmp-";
const TRASH_PREFIX: &str = ".trash-";

/// How the temporary directories rekindle makes in a checkpoints directory
/// begin: a save's (`.tmp-step-…`, also a save in parts'), a seal's
/// (`.tmp-seal-step-…`), a rotation's (`.trash-step-…`). Only these are
/// leftovers it removes.
pub(super) const LEFTOVER_PREFIXES: [&str; 3] = [".tmp-step-", ".tmp-seal-step-", ".trash-step-"];

/// Slack on top of the exact file sizes for the manifest and filesystem metadata.
const SPACE_SLACK: u64 = 1 << 20;

/// What a successful save did.
#[derive(Debug, Clone, Serialize)]
pub struct SaveReport {
    pub step: u64,
    pub dir: PathBuf,
    /// Bytes written (all files including the manifest).
    pub bytes: u64,
    /// Seconds from the first byte to the durable rename.
    pub seconds: f64,
    /// True when a valid checkpoint of this step already existed and was kept.
    pub already_existed: bool,
    /// Checkpoints removed by rotation.
    pub rotated_out: Vec<PathBuf>,
    /// A checkpoint written in parts ([`CheckpointStore::save_with`]): how
    /// many ranks wrote one, and how long this process waited for the
    /// other ranks' after writing its own files.
    pub parts: Option<PartsWritten>,
    /// How this process wrote its files (`write_mode.rs`); `None` when
    /// nothing was written.
    pub write: Option<WriteChoice>,
}

impl SaveReport {
    /// The report of a save of `step` committed as `dir` (`bytes` written,
    /// since `started`), after rotation removed `rotated_out`.
    pub(crate) fn committed(
        step: u64,
        dir: PathBuf,
        bytes: u64,
        started: std::time::Instant,
        rotated_out: Vec<PathBuf>,
        parts: Option<PartsWritten>,
        write: Option<WriteChoice>,
    ) -> SaveReport {
        let seconds = started.elapsed().as_secs_f64();
        SaveReport { step, dir, bytes, seconds, already_existed: false, rotated_out, parts, write }
    }
}

/// The parts of a checkpoint written in parts, in its [`SaveReport`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PartsWritten {
    pub ranks: usize,
    pub wait_seconds: f64,
    /// Bytes this process wrote of the checkpoint's files (the others
    /// wrote the rest).
    pub own_bytes: u64,
}

/// The result of looking for the newest valid checkpoint.
#[derive(Debug, Clone)]
pub struct LoadOutcome {
    /// The newest checkpoint that verified, if any.
    pub loaded: Option<Loaded>,
    /// Newer checkpoints that failed, newest first, with the reasons.
    pub rejected: Vec<CheckpointInfo>,
}

/// The other ranks' shares of a checkpoint that every rank of a world
/// writes part of, for [`CheckpointStore::save_with`]: the model's shards
/// (`shards.rs`) cut among the ranks, and the optimizer state's either the
/// same way or, when it is itself in parts (ZeRO-1, `parts.rs`), each
/// rank's own part.
pub struct Parts<'a> {
    /// The staging directory every rank writes into: a `.tmp-…` name inside
    /// the checkpoints directory, the same on every rank.
    pub staging: String,
    /// Ranks in the world; this process is rank 0.
    pub world: usize,
    /// The optimizer state is in parts (`[distributed] shard_optimizer`):
    /// the snapshot's optimizer is this rank's part. Otherwise every rank
    /// holds all of it, and it is cut into shards like the model.
    pub optimizer_in_parts: bool,
    /// Waits until every other rank has written its share
    /// ([`CheckpointStore::write_share`]) and returns their manifest
    /// entries (ranks 1, 2, …), or why they will not come.
    /// Called exactly once per save, also when the save failed before it
    /// needed them (the staging directory is removed after it returns).
    pub collect: &'a mut dyn FnMut() -> Result<Vec<ManifestEntry>, super::persist::PartsError>,
}

/// Asked right before each commit (and before rotation deletes anything):
/// `Ok` when this process may still write into the checkpoints directory,
/// else why not. The store knows nothing of who decides: the run passes a
/// check of its run-directory lock; the store records that check's error,
/// as text, as the reason of [`CheckpointError::NotOwner`] (a record: it
/// must stay cloneable and serializable).
#[derive(Clone)]
pub struct CommitGuard(Arc<dyn Fn() -> Result<(), String> + Send + Sync>);

impl CommitGuard {
    pub fn new<E: std::fmt::Display>(check: impl Fn() -> Result<(), E> + Send + Sync + 'static) -> CommitGuard {
        CommitGuard(Arc::new(move || check().map_err(|e| e.to_string())))
    }

    fn check(&self, step: u64) -> Result<(), CheckpointError> {
        (self.0)().map_err(|reason| CheckpointError::NotOwner { step, reason })
    }
}

impl std::fmt::Debug for CommitGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CommitGuard")
    }
}

/// A checkpoints directory and its rotation policy.
#[derive(Debug, Clone)]
pub struct CheckpointStore {
    dir: PathBuf,
    /// The checkpoints directory, held open since the store was opened
    /// (`None` for a read-only view, which opens it per listing).
    root: Option<Arc<Dir>>,
    keep: usize,
    /// Steps whose checkpoint failed full verification and could not be
    /// quarantined: rotation counts them invalid until a save of that step
    /// replaces them. Shared by the clones (the persister's among them).
    known_bad: Arc<Mutex<BTreeSet<u64>>>,
    guard: Option<CommitGuard>,
    /// How the files are written and cut into shards (`[checkpoint]
    /// write_mode`, `write_block`, `write_queue_depth`, `shard_size`).
    write: WriteSettings,
    /// Saves through this store may measure the write path where nothing
    /// was measured yet ([`with_write_measurement`](Self::with_write_measurement)).
    measure: bool,
}

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

impl CheckpointStore {
    /// Opens (creating if needed) a checkpoints directory and removes leftovers
    /// of interrupted saves and deletes, logging each one. Only the process that
    /// owns the run directory may open its store for writing.
    ///
    /// The directory must be rekindle's ([`claim_dir`]): a directory of
    /// someone else's files is refused before anything in it is touched.
    pub fn open(dir: impl Into<PathBuf>, keep: usize) -> Result<CheckpointStore, CheckpointError> {
        let dir = dir.into();
        claim_dir(&dir, false)?;
        let root = Dir::open(&dir).map_err(|source| CheckpointError::CreateDir { path: dir.clone(), source })?;
        let store = CheckpointStore {
            dir,
            root: Some(Arc::new(root)),
            keep: keep.max(1),
            known_bad: Arc::default(),
            guard: None,
            write: WriteSettings::default(),
            measure: false,
        };
        let root = store.root()?;
        for leftover in store.leftovers()? {
            let path = root.shown(&leftover);
            tracing::warn!(path = %path.display(), "removing leftover of an interrupted checkpoint save or delete");
            root.remove_dir_all(&leftover).map_err(|source| CheckpointError::Remove { path, source })?;
        }
        for stray in store.strays()? {
            tracing::warn!(path = %stray.display(), "named like a checkpoint but not one of rekindle's (not a step-<10 digits> directory): never loaded, counted or rotated; left alone");
        }
        Ok(store)
    }

    /// A read-only view of a checkpoints directory: nothing is created or removed.
    pub fn open_read_only(dir: impl Into<PathBuf>) -> CheckpointStore {
        CheckpointStore {
            dir: dir.into(),
            root: None,
            keep: usize::MAX,
            known_bad: Arc::default(),
            guard: None,
            write: WriteSettings::default(),
            measure: false,
        }
    }

    /// The same store, writing as `settings` say (from `[checkpoint]`,
    /// [`WriteSettings::of`]).
    pub fn with_write_settings(self, settings: WriteSettings) -> CheckpointStore {
        CheckpointStore { write: settings, ..self }
    }

    /// How the tensor sets of a save by a world of `world` are cut into files.
    fn sharding(&self, world: usize) -> Sharding {
        Sharding { shard_bytes: self.write.shard_bytes.unwrap_or(DEFAULT_SHARD_BYTES), world: world.max(1) }
    }

    /// The same store, whose saves measure the write path on this
    /// filesystem where nothing was measured yet (`write_mode.rs`): the
    /// background persister's. Other saves take what was measured, else the
    /// default, so that a stop checkpoint inside its grace time never pays
    /// for a measurement.
    pub fn with_write_measurement(self) -> CheckpointStore {
        CheckpointStore { measure: true, ..self }
    }

    /// The write plan of a save of `payload` tensor bytes (`write_mode.rs`).
    fn write_choice(&self, root: &Dir, payload: u64) -> WriteChoice {
        plan_for(root, &self.write, payload, self.measure)
    }

    /// The same store, asking `guard` right before each commit and rotation.
    pub fn with_commit_guard(self, guard: CommitGuard) -> CheckpointStore {
        CheckpointStore { guard: Some(guard), ..self }
    }

    pub(super) fn may_write(&self, step: u64) -> Result<(), CheckpointError> {
        self.guard.as_ref().map_or(Ok(()), |g| g.check(step))
    }

    /// The checkpoints directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The handle of the checkpoints directory: the one opened with the
    /// store, or, for a read-only view, one opened now.
    pub fn root(&self) -> Result<Arc<Dir>, CheckpointError> {
        match &self.root {
            Some(root) => Ok(Arc::clone(root)),
            None => Dir::open(&self.dir)
                .map(Arc::new)
                .map_err(|source| CheckpointError::ListDir { path: self.dir.clone(), source }),
        }
    }

    /// The directory a checkpoint of `step` is committed to.
    pub fn step_dir(&self, step: u64) -> PathBuf {
        self.dir.join(step_dir_name(step))
    }

    /// What verification at `level` finds in the checkpoint of `step`,
    /// reached through the root's handle (never through a link).
    pub(super) fn verify_step(&self, step: u64, level: VerifyLevel) -> Vec<super::error::FileFailure> {
        match self
            .root()
            .map_err(|e| e.to_string())
            .and_then(|r| r.open_dir(step_dir_name(step)).map_err(|e| e.to_string()))
        {
            Ok(held) => verify_at(&held, level),
            Err(reason) => vec![super::error::FileFailure {
                file: super::manifest::MANIFEST_FILE.into(),
                problem: super::error::Problem::ManifestUnreadable { reason },
            }],
        }
    }

    /// The shared staging directory `name` of a save of `step` (refused
    /// unless it is a plain `.tmp-step-…` name: it comes from another rank).
    fn shared_staging_dir<'a>(&self, step: u64, name: &'a str) -> Result<&'a str, CheckpointError> {
        let prefix = LEFTOVER_PREFIXES[0];
        if !is_plain_name(name) || !name.starts_with(prefix) {
            return Err(CheckpointError::Parts {
                step,
                reason: format!("`{name}` is no staging directory name (a plain `{prefix}…` name)"),
            });
        }
        Ok(name)
    }

    /// Makes a new staging directory for a save of `step` in parts, shared
    /// by every rank of the launch `session`, and returns its name: rank 0
    /// makes it before it tells the other ranks to write into it, and only
    /// rank 0 ever makes it ([`write_part`](Self::write_part) does not), so
    /// a part written late, for a save already committed or abandoned, has
    /// no directory to land in.
    pub fn new_shared_staging(&self, step: u64, session: &str) -> Result<String, CheckpointError> {
        let session: String =
            session.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
        let name = format!(
            "{TMP_PREFIX}{}-ranks-{session}-{}",
            step_dir_name(step),
            TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let root = self.root()?;
        let dir = self.shared_staging_dir(step, &name)?;
        root.create_dir(dir, 0o777).map_err(|source| CheckpointError::Write { step, path: root.shown(dir), source })?;
        Ok(name)
    }

    /// Writes this rank's share of the checkpoint of `snapshot.step`
    /// (rank `rank` of `world`) into the staging directory `staging` that
    /// every rank of the save shares: the model shards (and, unless
    /// `optimizer_in_parts`, the optimizer shards) that the plan every rank
    /// computes alike gives this rank (`encode.rs`), and with
    /// `optimizer_in_parts` its part of the optimizer state, which
    /// `snapshot.optimizer` then is. Each file is hashed as it is written
    /// and fsynced; returns their manifest entries for rank 0, which lists
    /// them and commits ([`save_with`](Self::save_with)). Rank 0 removes the
    /// staging directory if the save fails, so nothing written here counts
    /// unless the whole checkpoint is committed.
    pub fn write_share(
        &self,
        staging: &str,
        rank: usize,
        world: usize,
        snapshot: &Snapshot,
        optimizer_in_parts: bool,
    ) -> Result<Vec<ManifestEntry>, CheckpointError> {
        let step = snapshot.step;
        let root = self.root()?;
        let name = self.shared_staging_dir(step, staging)?;
        check_tensors(step, &snapshot.model)?;
        check_tensors(step, &snapshot.optimizer)?;
        let dir = match root.open_dir(name) {
            Ok(dir) => dir,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(CheckpointError::Parts {
                    step,
                    reason: format!(
                        "the staging directory {} is gone: rank 0 committed or abandoned this save already",
                        root.shown(name).display()
                    ),
                });
            }
            Err(source) => return Err(CheckpointError::Write { step, path: root.shown(name), source }),
        };
        // Tests make one rank's part fail (`=return`) or hang (`=sleep(…)`) here.
        failpoint("checkpoint::part::before_write")?;
        let files = share_files(snapshot, optimizer_in_parts, self.sharding(world), rank);
        let choice = self.write_choice(&root, files.iter().map(|f| f.size).sum());
        let written = write_files(&dir, &files, &choice.plan, step)?;
        for (entry, w) in &written {
            tracing::debug!(file = %entry.name, bytes = w.bytes, mode = ?w.mode, "this rank's share written");
        }
        Ok(written.into_iter().map(|(entry, _)| entry).collect())
    }

    /// Whether ranks other than 0 of a world of `world` write part of the
    /// checkpoint of `snapshot` (rank 0's, [`save_with`](Self::save_with)):
    /// always with the optimizer in parts, otherwise where the model or the
    /// optimizer is large enough to be cut into shares (`encode.rs`).
    pub fn shared_by_ranks(&self, snapshot: &Snapshot, world: usize, optimizer_in_parts: bool) -> bool {
        let optimizer = (!optimizer_in_parts).then_some(&snapshot.optimizer);
        world > 1
            && (optimizer_in_parts || !names_from_others(&snapshot.model, optimizer, self.sharding(world)).is_empty())
    }

    /// Directories left by interrupted saves, seals and deletes, by the
    /// names rekindle gives them ([`LEFTOVER_PREFIXES`]). Anything else by
    /// such a name (a file, a symlink) is not rekindle's: it is reported and
    /// left alone, and so is any other name (`.tmp-cache`).
    fn leftovers(&self) -> Result<Vec<std::ffi::OsString>, CheckpointError> {
        let mut out = Vec::new();
        for entry in self.read_dir()? {
            let name = entry.name_lossy();
            if LEFTOVER_PREFIXES.iter().any(|p| name.starts_with(p)) {
                if entry.kind.is_dir() {
                    out.push(entry.name);
                } else {
                    tracing::warn!(path = %self.dir.join(&entry.name).display(), "not a leftover of rekindle's (not a directory): left alone");
                }
            }
        }
        Ok(out)
    }

    /// Entries of the checkpoints directory that look like checkpoints but
    /// are not rekindle's: `step-…` names that are not the canonical
    /// `step-<10 digits>` of their step, and symlinks by any checkpoint
    /// name. They are never listed, loaded, counted or rotated.
    pub fn strays(&self) -> Result<Vec<PathBuf>, CheckpointError> {
        let mut out = Vec::new();
        for entry in self.read_dir()? {
            if entry.name_lossy().starts_with(STEP_PREFIX) && self.checkpoint_entry(&entry).is_none() {
                out.push(self.dir.join(&entry.name));
            }
        }
        out.sort();
        Ok(out)
    }

    /// The step of a checkpoint entry: a real directory (not a symlink to
    /// one) under the canonical name of its step.
    fn checkpoint_entry(&self, entry: &crate::confine::Entry) -> Option<u64> {
        let step = parse_step_dir_name(&entry.name_lossy())?;
        entry.kind.is_dir().then_some(step)
    }

    fn read_dir(&self) -> Result<Vec<crate::confine::Entry>, CheckpointError> {
        self.root()?.entries("").map_err(|source| CheckpointError::ListDir { path: self.dir.clone(), source })
    }

    /// Commits `snapshot` durably, then rotates old checkpoints out.
    ///
    /// On any error the partial temporary directory is removed and every
    /// committed checkpoint is left untouched.
    pub fn save(&self, snapshot: &Snapshot) -> Result<SaveReport, CheckpointError> {
        self.save_with(snapshot, None)
    }

    /// [`save`](Self::save) of a checkpoint whose optimizer state the ranks
    /// of a world write in parts (`parts`): `snapshot.optimizer` is rank
    /// 0's part, written here beside the model and state into the staging
    /// directory every rank writes into; the manifest lists every rank's
    /// part once `parts.collect` returns their entries, and only then is the
    /// checkpoint committed. On any failure (here, or a rank's) nothing is
    /// committed: the staging directory is removed once every rank has
    /// reported, so no rank writes into it afterwards.
    pub fn save_with(&self, snapshot: &Snapshot, mut parts: Option<Parts<'_>>) -> Result<SaveReport, CheckpointError> {
        let mut collected = false;
        let result = self.save_inner(snapshot, parts.as_mut(), &mut collected);
        if let Some(parts) = parts
            && !collected
        {
            // The other ranks may still be writing into the staging
            // directory: wait for them, then remove what they wrote.
            if let Err(reason) = (parts.collect)() {
                tracing::warn!(step = snapshot.step, %reason, "the other ranks' parts of an abandoned checkpoint");
            }
            if let Ok(root) = self.root()
                && root.exists(&parts.staging)
                && let Err(e) = root.remove_dir_all(&parts.staging)
            {
                tracing::warn!(path = %root.shown(&parts.staging).display(), error = %e, "could not remove the staging directory of an abandoned checkpoint; the next start removes it");
            }
        }
        result
    }

    fn save_inner(
        &self,
        snapshot: &Snapshot,
        parts: Option<&mut Parts<'_>>,
        collected: &mut bool,
    ) -> Result<SaveReport, CheckpointError> {
        let started = Instant::now();
        let step = snapshot.step;
        let root = self.root()?;
        let final_name = step_dir_name(step);
        let final_dir = self.step_dir(step);
        // Only a real directory is looked into: a link by this name (planted
        // while the store was open) is not read through; it is moved aside
        // as a link when the new checkpoint takes its name.
        if matches!(root.own_dir(&final_name), Ok(true))
            && root.open_dir(&final_name).is_ok_and(|held| verify_at(&held, VerifyLevel::Full).is_empty())
        {
            // Deterministic training: the same step holds the same state, so an
            // existing valid checkpoint is as good as a new one.
            tracing::info!(step, dir = %final_dir.display(), "checkpoint of this step already exists and verifies; keeping it");
            self.known_bad().remove(&step);
            return Ok(SaveReport {
                step,
                dir: final_dir,
                bytes: 0,
                seconds: started.elapsed().as_secs_f64(),
                already_existed: true,
                rotated_out: Vec::new(),
                parts: None,
                write: None,
            });
        }

        check_tensors(step, &snapshot.model)?;
        check_tensors(step, &snapshot.optimizer)?;
        let (world, in_parts) = parts.as_ref().map_or((1, false), |p| (p.world, p.optimizer_in_parts));
        let mut files = share_files(snapshot, in_parts, self.sharding(world), 0);
        let state = serde_json::to_vec_pretty(&snapshot.state).map_err(|e| CheckpointError::BadTensor {
            step,
            name: STATE_FILE.into(),
            reason: e.to_string(),
        })?;
        files.push(PlannedFile {
            name: STATE_FILE.to_string(),
            size: state.len() as u64,
            content: Content::Bytes(state),
            rank: 0,
        });
        let needed: u64 = files.iter().map(|f| f.size).sum::<u64>() + SPACE_SLACK;
        let available =
            root.available_space().map_err(|source| CheckpointError::Write { step, path: self.dir.clone(), source })?;
        // `fs::available_space=return(BYTES)` stands in for the
        // filesystem's answer, so the pre-check is tested on every machine
        // (a real small filesystem needs root to mount). Not a `checkpoint::`
        // point: those are the crash and error points of the commit protocol,
        // each exercised by tests/failpoints/crash_consistency.rs.
        let available = injected_available_space().unwrap_or(available);
        if available < needed {
            return Err(CheckpointError::NoSpace { step, path: self.dir.clone(), needed, available });
        }

        let tmp = match &parts {
            Some(p) => self.shared_staging_dir(step, &p.staging)?.to_string(),
            None => format!(
                "{TMP_PREFIX}{}-{}-{}",
                step_dir_name(step),
                std::process::id(),
                TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
            ),
        };
        match self.write_and_commit(&root, snapshot, &files, &tmp, &final_name, parts, collected) {
            Ok((bytes, parts, write)) => {
                self.known_bad().remove(&step);
                let rotated_out = self.may_write(step).and_then(|()| self.rotate(step)).map_err(|e| {
                    CheckpointError::AfterCommit {
                        step,
                        dir: final_dir.clone(),
                        stage: "rotating out old checkpoints",
                        source: Box::new(e),
                    }
                })?;
                Ok(SaveReport::committed(step, final_dir, bytes, started, rotated_out, parts, Some(write)))
            }
            Err(e) => {
                if root.exists(&tmp)
                    && let Err(rm) = root.remove_dir_all(&tmp)
                {
                    tracing::warn!(path = %root.shown(&tmp).display(), error = %rm, "could not remove partial checkpoint; it will be removed at the next start");
                }
                Err(e)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn write_and_commit(
        &self,
        root: &Dir,
        snapshot: &Snapshot,
        files: &[PlannedFile<'_>],
        tmp_name: &str,
        final_name: &str,
        parts: Option<&mut Parts<'_>>,
        collected: &mut bool,
    ) -> Result<(u64, Option<PartsWritten>, WriteChoice), CheckpointError> {
        let step = snapshot.step;
        let werr = |path: &Path| {
            let path = path.to_path_buf();
            move |source| CheckpointError::Write { step, path, source }
        };
        let (tmp_path, final_path) = (root.shown(tmp_name), root.shown(final_name));
        let (tmp_path, final_dir) = (tmp_path.as_path(), final_path.as_path());
        // The other ranks may have made the shared staging directory first.
        match root.create_dir(tmp_name, 0o777) {
            Err(e) if parts.is_some() && e.kind() == std::io::ErrorKind::AlreadyExists => {}
            other => other.map_err(werr(tmp_path))?,
        }
        // Held from here on: the staging directory swapped for a link
        // meanwhile is not followed (the handle is the directory made here).
        let tmp = root.open_dir(tmp_name).map_err(werr(tmp_path))?;
        // How to write, measured at the first large save on this
        // filesystem (`write_mode.rs`); the files on every core: SHA-256 of
        // one stream runs on one core, so separate files (shards) are what
        // lets hashing use more.
        let tensor_bytes = files.iter().filter(|f| matches!(f.content, Content::Tensors(..))).map(|f| f.size).sum();
        let mut choice = self.write_choice(root, tensor_bytes);
        let written = write_files(&tmp, files, &choice.plan, step)?;
        choice.direct_refused = choice.plan.mode == IoMode::Direct
            && written.iter().any(|(e, w)| {
                w.mode == WriteMode::Buffered
                    && w.bytes >= choice.plan.block_bytes as u64
                    && e.name.ends_with(".safetensors")
            });
        let own_bytes: u64 = written.iter().map(|(e, _)| e.bytes).sum();
        let mut entries: Vec<ManifestEntry> = written.into_iter().map(|(e, _)| e).collect();
        let mut written_in_parts = None;
        if let Some(parts) = parts {
            // Every other rank's share, written and hashed by that rank.
            *collected = true;
            let waiting = Instant::now();
            let theirs = (parts.collect)().map_err(|e| CheckpointError::Parts { step, reason: e.to_string() })?;
            written_in_parts =
                Some(PartsWritten { ranks: parts.world, wait_seconds: waiting.elapsed().as_secs_f64(), own_bytes });
            let optimizer = (!parts.optimizer_in_parts).then_some(&snapshot.optimizer);
            let expected = names_from_others(&snapshot.model, optimizer, self.sharding(parts.world));
            entries.extend(
                check_part_entries(&tmp, theirs, &expected)
                    .map_err(|reason| CheckpointError::Parts { step, reason })?,
            );
        }
        let sharded = entries.iter().any(|e| parse_shard_name(&e.name).is_some());
        let manifest = Manifest {
            format_version: if sharded { SHARDED_FORMAT_VERSION } else { FORMAT_VERSION },
            kind: CheckpointKind::Native,
            step,
            created_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            rekindle_version: env!("CARGO_PKG_VERSION").to_string(),
            files: entries,
        };
        failpoint("checkpoint::before_manifest")?;
        let manifest_path = tmp.shown(MANIFEST_FILE);
        let manifest_bytes =
            write_hashed(&tmp, MANIFEST_FILE, &[&manifest.to_bytes()]).map_err(werr(&manifest_path))?.bytes;
        tmp.sync().map_err(werr(tmp_path))?;
        failpoint("checkpoint::before_rename")?;
        // The last moment to find out that another process owns the directory
        // now. Logged here: a save in flight when the run stops for the lost
        // lock ends after anyone would read its result.
        if let Err(e) = self.may_write(step) {
            tracing::error!(step, "{e}");
            return Err(e);
        }

        let after = |stage: &'static str| {
            move |e| CheckpointError::AfterCommit { step, dir: final_dir.to_path_buf(), stage, source: Box::new(e) }
        };
        let sync_err = |source| CheckpointError::SyncDir { path: self.dir.clone(), source };
        if root.exists(final_name) {
            // An invalid checkpoint of the same step (a valid one was kept
            // above): move it aside atomically, put the new one in its place,
            // then remove it. Until the second rename no committed state has
            // changed but the invalid one's name.
            let aside_name = self.trash_name(step);
            let aside = root.shown(&aside_name);
            tracing::warn!(dir = %final_dir.display(), aside = %aside.display(), "replacing an invalid checkpoint of the same step");
            fail_io("checkpoint::replace::move_aside").and_then(|()| root.rename(final_name, &aside_name)).map_err(
                |source| CheckpointError::ReplaceMoveAside {
                    step,
                    dir: final_dir.to_path_buf(),
                    to: aside.clone(),
                    source,
                },
            )?;
            fail_io("checkpoint::replace::rename").and_then(|()| root.rename(tmp_name, final_name)).map_err(
                |source| CheckpointError::ReplaceRename {
                    step,
                    dir: final_dir.to_path_buf(),
                    aside: aside.clone(),
                    source,
                },
            )?;
            fail_io("checkpoint::replace::sync").and_then(|()| root.sync()).map_err(sync_err).map_err(after(
                "syncing the checkpoints directory after replacing an invalid checkpoint of the same step",
            ))?;
            fail_io("checkpoint::replace::remove_old")
                .and_then(|()| root.remove_dir_all(&aside_name))
                .map_err(|source| CheckpointError::Remove { path: aside.clone(), source })
                .map_err(after("removing the invalid checkpoint it replaced (the next start removes it)"))?;
        } else {
            root.rename(tmp_name, final_name).map_err(werr(final_dir))?;
            failpoint("checkpoint::after_rename").map_err(after("syncing the checkpoints directory"))?;
            root.sync().map_err(sync_err).map_err(after("syncing the checkpoints directory"))?;
        }
        failpoint("checkpoint::after_commit").map_err(after("the commit's last step"))?;
        Ok((manifest.total_bytes() + manifest_bytes, written_in_parts, choice))
    }

    fn trash_name(&self, step: u64) -> String {
        format!(
            "{TRASH_PREFIX}{}-{}-{}",
            step_dir_name(step),
            std::process::id(),
            TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// Applies the rotation plan for the checkpoint of step `committed`, just
    /// committed: deletes what the pure planner says, each checkpoint first
    /// renamed aside so it disappears atomically. Checkpoints newer than
    /// `committed` are verified fully before they count as valid (see the
    /// module doc); the others get the quick check.
    pub(super) fn rotate(&self, committed: u64) -> Result<Vec<PathBuf>, CheckpointError> {
        let infos = self.list(VerifyLevel::Quick)?;
        let known_bad = self.known_bad().clone();
        let candidates: Vec<Candidate> = infos
            .iter()
            .map(|i| {
                if known_bad.contains(&i.step) {
                    return Candidate { step: i.step, valid: false };
                }
                if i.step <= committed || !i.valid {
                    return Candidate { step: i.step, valid: i.valid };
                }
                let failures = self.verify_step(i.step, VerifyLevel::Full);
                if !failures.is_empty() {
                    tracing::warn!(step = i.step, dir = %i.dir.display(), failures = %join(&failures), committed, "a checkpoint newer than the one just committed does not verify; rotation does not count it");
                }
                Candidate { step: i.step, valid: failures.is_empty() }
            })
            .collect();
        let root = self.root()?;
        let mut removed = Vec::new();
        for action in rotation::plan(&candidates, self.keep, committed) {
            if let Action::Delete { step, reason } = action {
                failpoint("checkpoint::rotation_delete")?;
                let dir = self.step_dir(step);
                let trash = self.trash_name(step);
                tracing::info!(step, ?reason, dir = %dir.display(), "rotating out checkpoint");
                root.rename(step_dir_name(step), &trash)
                    .map_err(|source| CheckpointError::Remove { path: dir.clone(), source })?;
                root.sync().map_err(|source| CheckpointError::Remove { path: dir.clone(), source })?;
                // Renamed aside but not yet removed: a crash here must leave only a leftover.
                failpoint("checkpoint::rotation_trashed")?;
                root.remove_dir_all(&trash)
                    .map_err(|source| CheckpointError::Remove { path: root.shown(&trash), source })?;
                removed.push(dir);
            }
        }
        Ok(removed)
    }

    /// The newest checkpoint that verifies at `level`: inspected newest
    /// first, stopping at the first that verifies, where [`Self::list`]
    /// inspects every one. What "resume from" and "is this step newer"
    /// need, at the cost of one checkpoint's files when the newest verifies
    /// (a world's checkpoint holds a file or more a rank: every kept one
    /// inspected by every caller made a save or a restart cost N² opens,
    /// bench/control_plane.py).
    pub fn newest_valid(&self, level: VerifyLevel) -> Result<Option<CheckpointInfo>, CheckpointError> {
        let root = self.root()?;
        for (step, entry) in self.listed_newest_first()? {
            let info = match root.open_dir(&entry.name) {
                Ok(held) => inspect_at(&held, step, level),
                Err(e) => unopened(self.dir.join(&entry.name), step, &e),
            };
            if info.valid {
                return Ok(Some(info));
            }
        }
        Ok(None)
    }

    /// The step and manifest of the newest checkpoint whose manifest reads,
    /// nothing else verified: what the free-disk check (its size) and the
    /// guard against the other command's run directory (its kind) need,
    /// one small file read.
    pub fn newest_manifest(&self) -> Result<Option<(u64, Manifest)>, CheckpointError> {
        let root = self.root()?;
        Ok(self.listed_newest_first()?.into_iter().find_map(|(step, entry)| {
            let held = root.open_dir(&entry.name).ok()?;
            read_manifest_at(&held).ok().map(|m| (step, m))
        }))
    }

    /// The steps of the checkpoint directories, newest first, nothing in
    /// them read.
    pub fn steps(&self) -> Result<Vec<u64>, CheckpointError> {
        Ok(self.listed_newest_first()?.into_iter().map(|(step, _)| step).collect())
    }

    fn listed_newest_first(&self) -> Result<Vec<(u64, crate::confine::Entry)>, CheckpointError> {
        let mut found: Vec<(u64, crate::confine::Entry)> =
            self.read_dir()?.into_iter().filter_map(|e| Some((self.checkpoint_entry(&e)?, e))).collect();
        found.sort_by_key(|(step, _)| std::cmp::Reverse(*step));
        Ok(found)
    }

    /// Every `step-*` checkpoint directory, newest first, with verification results.
    pub fn list(&self, level: VerifyLevel) -> Result<Vec<CheckpointInfo>, CheckpointError> {
        let mut infos = Vec::new();
        let root = self.root()?;
        for entry in self.read_dir()? {
            let Some(step) = self.checkpoint_entry(&entry) else { continue };
            // Through the root's handle: a checkpoint swapped for a link
            // since it was listed is refused, not read through.
            infos.push(match root.open_dir(&entry.name) {
                Ok(held) => inspect_at(&held, step, level),
                Err(e) => unopened(self.dir.join(&entry.name), step, &e),
            });
        }
        infos.sort_by_key(|i| std::cmp::Reverse(i.step));
        Ok(infos)
    }

    /// Moves each checkpoint of `rejected` (what [`load_latest`](Self::load_latest)
    /// found damaged) into `quarantine/`, logging each move. A checkpoint that
    /// cannot be moved stays where it is (and is reported as such); this store
    /// and its clones remember it, and rotation never counts it as valid until
    /// a save of its step replaces it. Only the process that owns the run
    /// directory may call this.
    pub fn quarantine(&self, rejected: &[CheckpointInfo]) -> Vec<Quarantined> {
        rejected
            .iter()
            .map(|info| {
                let moved_to = self.root().and_then(|root| quarantine::move_to_quarantine(&root, info.step));
                if moved_to.is_err() {
                    self.known_bad().insert(info.step);
                }
                match &moved_to {
                    Ok(to) => tracing::warn!(step = info.step, from = %info.dir.display(), to = %to.display(), failures = %join(&info.failures), "quarantined a checkpoint that does not verify; it is kept for inspection and never loaded or rotated"),
                    Err(e) => tracing::error!(step = info.step, error = %e, "could not quarantine a checkpoint that does not verify"),
                }
                Quarantined { step: info.step, dir: info.dir.clone(), failures: info.failures.clone(), moved_to }
            })
            .collect()
    }

    fn known_bad(&self) -> std::sync::MutexGuard<'_, BTreeSet<u64>> {
        // The set stays consistent whatever panicked while holding it.
        self.known_bad.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The quarantined checkpoints (`quarantine/`), newest step first, with
    /// what verification at `level` finds in them now.
    pub fn list_quarantined(&self, level: VerifyLevel) -> Result<Vec<CheckpointInfo>, CheckpointError> {
        quarantine::list_quarantined(&*self.root()?, level)
    }

    /// Loads the newest checkpoint that verifies completely (every hash and
    /// every file parses). Newer ones that fail are returned with the reasons.
    pub fn load_latest(&self) -> Result<LoadOutcome, CheckpointError> {
        let mut rejected = Vec::new();
        if self.root.is_none() && matches!(Dir::open(&self.dir), Err(e) if e.kind() == io::ErrorKind::NotFound) {
            return Ok(LoadOutcome { loaded: None, rejected });
        }
        for info in self.list(VerifyLevel::Quick)? {
            if info.valid {
                refuse_other_kind(&info.dir, CheckpointKind::Native)?;
            }
            let attempt = if info.valid { load_dir(&info.dir) } else { Err(info.failures.clone()) };
            match attempt {
                Ok(loaded) => return Ok(LoadOutcome { loaded: Some(loaded), rejected }),
                Err(failures) => {
                    tracing::warn!(dir = %info.dir.display(), failures = %join(&failures), "checkpoint does not verify; falling back to an older one");
                    rejected.push(CheckpointInfo { valid: false, failures, ..info });
                }
            }
        }
        Ok(LoadOutcome { loaded: None, rejected })
    }
}

/// [`CheckpointError::WrongKind`] when the checkpoint in `dir` (which passed
/// the quick check) is not of the kind `wanted`: a lifecycle never resumes
/// from, quarantines or rotates as damaged another lifecycle's checkpoint.
pub(super) fn refuse_other_kind(dir: &Path, wanted: CheckpointKind) -> Result<(), CheckpointError> {
    match super::verify::read_manifest(dir) {
        Ok(m) if m.kind != wanted => Err(CheckpointError::WrongKind { dir: dir.to_path_buf(), found: m.kind }),
        _ => Ok(()),
    }
}

/// The files rank `rank` writes of `snapshot`'s tensors, cut by
/// `sharding` (`encode.rs`): its model shards, and its optimizer shards or,
/// with `optimizer_in_parts`, its optimizer part (the snapshot's optimizer).
/// A world of one writes every file.
fn share_files(snapshot: &Snapshot, optimizer_in_parts: bool, sharding: Sharding, rank: usize) -> Vec<PlannedFile<'_>> {
    let mut files = tensor_files("model", &snapshot.model, snapshot.step, sharding);
    if optimizer_in_parts {
        files.push(part_file(&snapshot.optimizer, snapshot.step, rank, sharding.world));
    } else {
        files.extend(tensor_files("optimizer", &snapshot.optimizer, snapshot.step, sharding));
    }
    files.retain(|f| f.rank == rank);
    files
}

/// Every tensor's data has the size its shape and dtype say.
fn check_tensors(step: u64, set: &TensorSet) -> Result<(), CheckpointError> {
    for (name, t) in set {
        let elems: usize = t.shape.iter().product();
        if elems * t.dtype.size() != t.data.len() {
            return Err(CheckpointError::BadTensor {
                step,
                name: name.clone(),
                reason: format!("shape {:?} does not match {} data bytes", t.shape, t.data.len()),
            });
        }
    }
    Ok(())
}

/// The entries the other ranks reported for their shares: exactly the
/// files `expected` of them (name → the rank that writes it), each once,
/// each in `staging` as a plain file of the size reported (its hash was
/// computed as it was written and fsynced).
fn check_part_entries(
    staging: &Dir,
    theirs: Vec<ManifestEntry>,
    expected: &std::collections::BTreeMap<String, usize>,
) -> Result<Vec<ManifestEntry>, String> {
    let mut seen = BTreeSet::new();
    for entry in &theirs {
        let Some(rank) = expected.get(&entry.name) else {
            return Err(format!("another rank reported `{}`, which no rank but 0 writes", entry.name));
        };
        if !seen.insert(entry.name.as_str()) {
            return Err(format!("rank {rank}'s `{}` was reported twice", entry.name));
        }
        match staging.symlink_metadata(&entry.name) {
            Ok(m) if m.file_type().is_file() && m.len() == entry.bytes => {}
            Ok(m) => {
                return Err(format!(
                    "rank {rank}'s `{}` in {} is not the plain file of {} bytes it reported ({} bytes)",
                    entry.name,
                    staging.path().display(),
                    entry.bytes,
                    m.len()
                ));
            }
            Err(e) => {
                return Err(format!("rank {rank}'s `{}` is not in {}: {e}", entry.name, staging.path().display()));
            }
        }
    }
    if let Some((missing, rank)) = expected.iter().find(|(n, _)| !seen.contains(n.as_str())) {
        return Err(format!("rank {rank} did not report `{missing}`"));
    }
    Ok(theirs)
}

fn failpoint(name: &str) -> Result<(), CheckpointError> {
    let _ = name; // unused when failpoints are compiled out
    fail::fail_point!(name, |_| Err(CheckpointError::Injected(name.to_string())));
    Ok(())
}

/// The free space the `fs::available_space` failpoint reports, if set.
fn injected_available_space() -> Option<u64> {
    fail::fail_point!("fs::available_space", |bytes| bytes.and_then(|b| b.trim().parse().ok()));
    None
}

fn join(failures: &[FileFailure]) -> String {
    failures.iter().map(|f| f.to_string()).collect::<Vec<_>>().join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Problem;
    use crate::layout::MODEL_FILE;
    use crate::tensor::HostTensor;
    use std::fs;

    fn snapshot(step: u64) -> Snapshot {
        let mut model = TensorSet::new();
        model.insert("layer.weight".into(), HostTensor::from_f32(vec![2, 3], &[step as f32, 1.0, 2.0, 3.0, 4.0, 5.0]));
        let mut optimizer = TensorSet::new();
        optimizer.insert("layer.weight.m".into(), HostTensor::from_f32(vec![2], &[0.5, step as f32]));
        Snapshot { step, model, optimizer, state: serde_json::json!({"step": step, "cursor": [0, step]}) }
    }

    #[test]
    fn saved_checkpoint_loads_back_identically() {
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(tmp.path().join("checkpoints"), 3).unwrap();
        let report = store.save(&snapshot(7)).unwrap();
        assert_eq!(report.dir, store.step_dir(7));
        assert!(report.bytes > 0);
        let outcome = store.load_latest().unwrap();
        assert!(outcome.rejected.is_empty());
        assert_eq!(outcome.loaded.unwrap().snapshot, snapshot(7));
    }

    #[test]
    fn keeps_last_three_valid_checkpoints() {
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(tmp.path(), 3).unwrap();
        for step in 1..=5 {
            store.save(&snapshot(step)).unwrap();
        }
        let steps: Vec<u64> = store.list(VerifyLevel::Full).unwrap().iter().map(|i| i.step).collect();
        assert_eq!(steps, vec![5, 4, 3]);
    }

    #[test]
    fn keeps_last_valid_checkpoint_when_newest_is_corrupt() {
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(tmp.path(), 3).unwrap();
        store.save(&snapshot(1)).unwrap();
        store.save(&snapshot(2)).unwrap();
        let model = store.step_dir(2).join(MODEL_FILE);
        let mut bytes = fs::read(&model).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x01;
        fs::write(&model, bytes).unwrap();
        let outcome = store.load_latest().unwrap();
        assert_eq!(outcome.loaded.unwrap().snapshot.step, 1);
        assert_eq!(outcome.rejected.len(), 1);
        assert!(matches!(outcome.rejected[0].failures[0].problem, Problem::Sha256Mismatch { .. }));
        assert_eq!(outcome.rejected[0].failures[0].file, MODEL_FILE);
    }

    /// The newest-first lookups read only what they need: a truncated
    /// newest checkpoint (its manifest intact) is passed over by the
    /// verifying one and named by the manifest one; an empty directory (no
    /// manifest) by neither; every step directory is listed by `steps`.
    #[test]
    fn the_newest_lookups_pass_over_what_they_must() {
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(tmp.path(), 5).unwrap();
        for step in 1..=3 {
            store.save(&snapshot(step)).unwrap();
        }
        let model = store.step_dir(3).join(MODEL_FILE);
        let bytes = fs::read(&model).unwrap();
        fs::write(&model, &bytes[..bytes.len() - 1]).unwrap();
        fs::create_dir(store.step_dir(9)).unwrap();
        assert_eq!(store.newest_valid(VerifyLevel::Quick).unwrap().map(|i| i.step), Some(2));
        let (step, manifest) = store.newest_manifest().unwrap().unwrap();
        assert_eq!(step, 3);
        assert_eq!(manifest.total_bytes(), store.list(VerifyLevel::Quick).unwrap()[1].bytes);
        assert_eq!(store.steps().unwrap(), [9, 3, 2, 1]);
        let empty = CheckpointStore::open_read_only(tmp.path().join("none"));
        assert!(empty.steps().is_err(), "a checkpoints directory that is not there cannot be listed");
    }

    #[test]
    fn directory_without_manifest_is_not_a_checkpoint() {
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(tmp.path(), 3).unwrap();
        store.save(&snapshot(1)).unwrap();
        fs::create_dir(store.step_dir(9)).unwrap();
        let infos = store.list(VerifyLevel::Full).unwrap();
        assert_eq!(infos[0].step, 9);
        assert_eq!(infos[0].failures[0].problem, Problem::ManifestMissing);
        assert_eq!(store.load_latest().unwrap().loaded.unwrap().snapshot.step, 1);
    }

    #[test]
    fn leftover_temporary_directories_are_removed_at_open() {
        let tmp = tempfile::tempdir().unwrap();
        let partial = tmp.path().join(".tmp-step-0000000003-1-0");
        fs::create_dir_all(&partial).unwrap();
        fs::write(partial.join(MODEL_FILE), b"half").unwrap();
        let trash = tmp.path().join(".trash-step-0000000001-1-0");
        fs::create_dir_all(&trash).unwrap();
        // Names alone do not make a directory rekindle's: unmarked, it is
        // refused and nothing in it is removed.
        assert!(matches!(CheckpointStore::open(tmp.path(), 3), Err(CheckpointError::Claim(_))));
        assert!(partial.exists() && trash.exists());
        fs::write(tmp.path().join(crate::confine::MARKER_FILE), b"").unwrap();
        CheckpointStore::open(tmp.path(), 3).unwrap();
        assert!(!partial.exists() && !trash.exists());
    }

    #[test]
    fn resaving_a_valid_step_keeps_the_existing_checkpoint() {
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(tmp.path(), 3).unwrap();
        store.save(&snapshot(4)).unwrap();
        let again = store.save(&snapshot(4)).unwrap();
        assert!(again.already_existed);
    }

    #[test]
    fn resaving_over_an_invalid_checkpoint_of_the_same_step_replaces_it() {
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(tmp.path(), 3).unwrap();
        store.save(&snapshot(4)).unwrap();
        fs::remove_file(store.step_dir(4).join(STATE_FILE)).unwrap();
        let again = store.save(&snapshot(4)).unwrap();
        assert!(!again.already_existed);
        assert!(crate::verify_checkpoint_dir(&store.step_dir(4), VerifyLevel::Full).is_empty());
    }

    /// Flips one byte in the middle of the model file: same size, wrong hash.
    fn rot(store: &CheckpointStore, step: u64) {
        let model = store.step_dir(step).join(MODEL_FILE);
        let mut bytes = fs::read(&model).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0xff;
        fs::write(&model, bytes).unwrap();
    }

    #[test]
    fn rotation_never_deletes_the_checkpoint_it_just_committed_past_newer_damaged_ones() {
        // Issue 15: newer checkpoints that keep their size pass the quick
        // check; with keep = 1 they used to outrank the checkpoint just
        // committed, which rotation then deleted.
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(tmp.path(), 3).unwrap();
        store.save(&snapshot(30)).unwrap();
        store.save(&snapshot(40)).unwrap();
        rot(&store, 30);
        rot(&store, 40);
        let store = CheckpointStore::open(tmp.path(), 1).unwrap();
        let report = store.save(&snapshot(10)).unwrap();
        assert!(crate::verify_checkpoint_dir(&store.step_dir(10), VerifyLevel::Full).is_empty());
        assert_eq!(report.rotated_out, vec![store.step_dir(40), store.step_dir(30)], "the damaged ones go");
        assert_eq!(store.load_latest().unwrap().loaded.unwrap().snapshot, snapshot(10));
        // A newer checkpoint that does verify counts toward keep, but the
        // committed one still stays.
        store.save(&snapshot(50)).unwrap();
        let store = CheckpointStore::open(tmp.path(), 1).unwrap();
        store.save(&snapshot(20)).unwrap();
        let steps: Vec<u64> = store.list(VerifyLevel::Full).unwrap().iter().map(|i| i.step).collect();
        assert_eq!(steps, vec![50, 20]);
    }

    #[test]
    fn quarantined_checkpoints_are_moved_aside_listed_apart_and_never_rotated() {
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(tmp.path(), 1).unwrap();
        store.save(&snapshot(10)).unwrap();
        let store = CheckpointStore::open(tmp.path(), 3).unwrap();
        store.save(&snapshot(20)).unwrap();
        rot(&store, 20);
        let outcome = store.load_latest().unwrap();
        assert_eq!(outcome.loaded.unwrap().snapshot.step, 10);
        let quarantined = store.quarantine(&outcome.rejected);
        assert_eq!(quarantined.len(), 1);
        let moved_to = quarantined[0].moved_to.as_ref().unwrap().clone();
        assert_eq!(moved_to.parent().unwrap(), tmp.path().join(super::super::quarantine::QUARANTINE_DIR));
        assert!(moved_to.file_name().unwrap().to_string_lossy().starts_with("step-0000000020-"));
        assert!(quarantined[0].reason().contains("model.safetensors: sha256 mismatch"), "{}", quarantined[0].reason());
        assert!(!store.step_dir(20).exists());

        let listed: Vec<u64> = store.list(VerifyLevel::Full).unwrap().iter().map(|i| i.step).collect();
        assert_eq!(listed, vec![10], "a quarantined checkpoint is not listed as one");
        let q = store.list_quarantined(VerifyLevel::Full).unwrap();
        assert_eq!((q.len(), q[0].step, q[0].valid), (1, 20, false));
        assert_eq!(q[0].dir, moved_to);
        assert!(matches!(q[0].failures[0].problem, Problem::Sha256Mismatch { .. }));

        // Rotation (keep = 1) and reopening leave it alone.
        let store = CheckpointStore::open(tmp.path(), 1).unwrap();
        store.save(&snapshot(30)).unwrap();
        store.save(&snapshot(40)).unwrap();
        assert!(moved_to.is_dir());
        assert_eq!(store.list_quarantined(VerifyLevel::Quick).unwrap().len(), 1);
        let listed: Vec<u64> = store.list(VerifyLevel::Full).unwrap().iter().map(|i| i.step).collect();
        assert_eq!(listed, vec![40]);

        // The same step quarantined again (in the same second) gets its own name.
        store.save(&snapshot(20)).unwrap();
        rot(&store, 20);
        let info = store.list(VerifyLevel::Full).unwrap().into_iter().find(|i| i.step == 20).unwrap();
        let again = store.quarantine(&[info]);
        let second = again[0].moved_to.as_ref().unwrap();
        assert_ne!(second, &moved_to);
        assert_eq!(store.list_quarantined(VerifyLevel::Quick).unwrap().len(), 2);
    }

    #[test]
    fn a_checkpoint_that_cannot_be_quarantined_stays_put_and_never_outranks_the_one_just_committed() {
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(tmp.path(), 1).unwrap();
        store.save(&snapshot(20)).unwrap();
        rot(&store, 20);
        // A file where the quarantine directory should go: the move fails.
        fs::write(tmp.path().join(super::super::quarantine::QUARANTINE_DIR), b"in the way").unwrap();
        let outcome = store.load_latest().unwrap();
        assert!(outcome.loaded.is_none());
        let quarantined = store.quarantine(&outcome.rejected);
        let err = quarantined[0].moved_to.as_ref().unwrap_err();
        assert!(matches!(err, CheckpointError::Quarantine { .. }), "{err:?}");
        assert!(err.to_string().contains(&store.step_dir(20).display().to_string()), "{err}");
        assert!(store.step_dir(20).is_dir(), "left where it was");
        assert!(store.list_quarantined(VerifyLevel::Full).unwrap().is_empty());

        // Saving an older step (the fresh start's first checkpoint): the damaged,
        // newer one is verified fully, does not count, and goes instead.
        let report = store.save(&snapshot(10)).unwrap();
        assert_eq!(report.rotated_out, vec![store.step_dir(20)]);
        assert_eq!(store.load_latest().unwrap().loaded.unwrap().snapshot, snapshot(10));
    }

    #[test]
    fn a_damaged_checkpoint_left_in_place_never_counts_toward_keep_even_once_older_than_the_newest() {
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(tmp.path(), 2).unwrap();
        store.save(&snapshot(10)).unwrap();
        store.save(&snapshot(40)).unwrap();
        rot(&store, 40);
        fs::write(tmp.path().join(super::super::quarantine::QUARANTINE_DIR), b"in the way").unwrap();
        let outcome = store.load_latest().unwrap();
        assert_eq!(outcome.loaded.unwrap().snapshot.step, 10);
        assert!(store.quarantine(&outcome.rejected)[0].moved_to.is_err());
        // The run goes past step 40 without a checkpoint there; at 50 the
        // damaged 40 is older than the one committed, and passes the quick
        // check, but the store knows better: 10 is kept, 40 goes.
        let clone = store.clone();
        let report = clone.save(&snapshot(50)).unwrap();
        assert_eq!(report.rotated_out, vec![store.step_dir(40)]);
        let steps: Vec<u64> = store.list(VerifyLevel::Full).unwrap().iter().map(|i| i.step).collect();
        assert_eq!(steps, vec![50, 10]);
    }

    #[test]
    fn a_guard_that_refuses_stops_the_commit_before_the_rename() {
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(tmp.path(), 3).unwrap();
        store.save(&snapshot(1)).unwrap();
        let refusing = store.clone().with_commit_guard(CommitGuard::new(|| Err("the lock is another's")));
        let err = refusing.save(&snapshot(2)).unwrap_err();
        assert!(matches!(&err, CheckpointError::NotOwner { step: 2, reason } if reason == "the lock is another's"));
        assert!(err.not_owner() && !err.committed());
        assert!(err.to_string().contains("refused to commit the checkpoint of step 2"), "{err}");
        let steps: Vec<u64> = store.list(VerifyLevel::Full).unwrap().iter().map(|i| i.step).collect();
        assert_eq!(steps, vec![1]);
        assert!(store.leftovers().unwrap().is_empty(), "the staged directory was left");
    }

    #[test]
    fn a_guard_asked_again_before_rotation_keeps_old_checkpoints_when_the_lock_is_lost_after_the_commit() {
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(tmp.path(), 1).unwrap();
        store.save(&snapshot(1)).unwrap();
        // Allows the commit, refuses what follows it.
        let asked = std::sync::Arc::new(AtomicU64::new(0));
        let guard = {
            let asked = std::sync::Arc::clone(&asked);
            CommitGuard::new(move || match asked.fetch_add(1, Ordering::SeqCst) {
                0 => Ok(()),
                _ => Err("lost just after the commit"),
            })
        };
        let err = store.clone().with_commit_guard(guard).save(&snapshot(2)).unwrap_err();
        assert!(err.committed() && err.not_owner(), "{err}");
        let steps: Vec<u64> = store.list(VerifyLevel::Full).unwrap().iter().map(|i| i.step).collect();
        assert_eq!(steps, vec![2, 1], "rotation deleted a checkpoint after the lock was lost");
    }

    #[test]
    fn a_run_refuses_to_resume_from_a_files_checkpoint_and_says_why() {
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(tmp.path(), 3).unwrap();
        store.save(&snapshot(1)).unwrap();
        let manifest_path = store.step_dir(1).join(MANIFEST_FILE);
        let mut manifest = Manifest::parse(&fs::read(&manifest_path).unwrap()).unwrap();
        manifest.kind = CheckpointKind::Files;
        fs::write(&manifest_path, manifest.to_bytes()).unwrap();
        let err = store.load_latest().unwrap_err();
        assert!(matches!(err, CheckpointError::WrongKind { found: CheckpointKind::Files, .. }), "{err}");
        assert!(err.to_string().contains("rekindle exec"), "{err}");
        assert!(store.step_dir(1).is_dir(), "neither quarantined nor removed");
    }

    #[test]
    fn symlinked_file_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open(tmp.path().join("c"), 3).unwrap();
        store.save(&snapshot(1)).unwrap();
        let state = store.step_dir(1).join(STATE_FILE);
        let outside = tmp.path().join("outside.json");
        fs::rename(&state, &outside).unwrap();
        std::os::unix::fs::symlink(&outside, &state).unwrap();
        let failures = crate::verify_checkpoint_dir(&store.step_dir(1), VerifyLevel::Full);
        assert_eq!(failures, vec![FileFailure { file: STATE_FILE.into(), problem: Problem::NotPlainFile }]);
    }
}
