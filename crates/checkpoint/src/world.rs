//! Checkpoints of files written in parts by the ranks of a distributed
//! program (`rekindle seal DIR --step N --rank R --world-size W`, docs/exec.md
//! "Distributed programs"): one checkpoint per step for the whole world,
//! under one manifest, with the rules of `run`'s checkpoints in parts
//! (`parts.rs`, `store.rs`): each rank hashes its own files, one rank
//! (rank 0) lists them all and commits, and nothing counts unless every
//! rank's part is in.
//!
//! 1. Every rank stages its files in a fresh directory under the staging
//!    directory, as for a plain seal; a rank with nothing to save stages an
//!    empty one (its part still takes part).
//! 2. [`CheckpointStore::seal_part`] moves it under the world's directory,
//!    `.staging/.world-step-<10 digits>-of-<5 digits>/rank-<5 digits>`,
//!    fsyncs and hashes every file, and writes the part's record,
//!    `rank-<5 digits>.json` (its files with their SHA-256), atomically and
//!    last. A rank whose part fails writes `rank-<5 digits>.failed` with
//!    the reason instead, so rank 0 stops waiting at once. It checks only
//!    that the step is not committed yet (one look): whether the step is
//!    newer than the newest checkpoint is rank 0's check, in step 3, so
//!    that a save costs the filesystem O(N), not every rank verifying the
//!    kept checkpoints of every rank.
//! 3. Rank 0 ([`CheckpointStore::commit_world`]) waits for every record
//!    (at most the timeout), checks that no two ranks wrote the same name,
//!    moves every file into one directory of its own and commits it with
//!    the seal's steps (`files.rs`: manifest last, the commit guard, the
//!    rename, the syncs, rotation).
//!
//! A rank that fails or dies before its record is written, a name two ranks
//! wrote, or a timeout leaves no checkpoint of that step: the world's
//! directory is removed (or, if rank 0 died too, the next attempt empties
//! the staging directory) and the previous checkpoint stands. The format
//! is that of any files checkpoint: one flat directory, one manifest.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::error::CheckpointError;
use super::files::{STAGING_DIR, staged_files, sync_and_hash};
use super::hashed_io::write_hashed;
use super::layout::step_dir_name;
use super::manifest::ManifestEntry;
use super::store::{CheckpointStore, PartsWritten, SaveReport, TMP_PREFIX};
use crate::confine::Dir;

/// How the world's directory of a step begins, inside the staging directory.
const WORLD_PREFIX: &str = ".world-";

/// How often rank 0 looks for the other ranks' records: every 20 ms while
/// they come in, backing off to every 200 ms while none does (one listing
/// of the world's directory a look, whatever the world's size).
const POLL: Duration = Duration::from_millis(20);
const MAX_POLL: Duration = Duration::from_millis(200);

/// Who seals: rank `rank` of a world of `world` ranks (two or more).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorldRank {
    pub rank: usize,
    pub world: usize,
}

impl WorldRank {
    /// `Err` with why these cannot be a rank of a world.
    pub fn new(rank: usize, world: usize) -> Result<WorldRank, String> {
        if world < 2 {
            return Err(format!("a world of {world} rank(s) seals as one program: leave out --rank and --world-size"));
        }
        if rank >= world {
            return Err(format!("rank {rank} is not a rank of a world of {world} (0 to {})", world - 1));
        }
        Ok(WorldRank { rank, world })
    }
}

/// What one rank sealed: its part's files, hashed, and where the world's
/// checkpoint will be once rank 0 commits it.
#[derive(Debug, Clone, PartialEq)]
pub struct PartSealed {
    pub step: u64,
    pub who: WorldRank,
    pub files: Vec<ManifestEntry>,
    pub bytes: u64,
    /// The checkpoint's directory once committed.
    pub dir: PathBuf,
}

/// A part's record: what its rank sealed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PartRecord {
    rank: usize,
    world: usize,
    step: u64,
    files: Vec<ManifestEntry>,
}

fn rank_name(rank: usize) -> String {
    format!("rank-{rank:05}")
}

impl CheckpointStore {
    /// The directory where the ranks of a world of `world` put their parts of `step`.
    pub fn world_dir(&self, step: u64, world: usize) -> PathBuf {
        self.dir().join(world_rel(step, world))
    }

    /// Step 2 of the module header for rank `who`: `staged` (directly under
    /// the staging directory, plain files only, maybe none) becomes its
    /// part of the checkpoint of `step`. A failure once the part is named
    /// is also written where rank 0 sees it.
    pub fn seal_part(&self, staged: &Path, step: u64, who: WorldRank) -> Result<PartSealed, CheckpointError> {
        let root = self.root()?;
        let staged_rel = self.check_staged(&root, staged, step)?;
        // Only that the step is not committed: whether it is newer than the
        // newest checkpoint that verifies is rank 0's to check, once, when
        // it commits. Every rank checking it quick-verified every kept
        // checkpoint, every file of every rank's part: N² opens a save
        // (bench/control_plane.py, docs/scale.md).
        let final_dir = self.check_not_committed(staged, step)?;
        let world = world_rel(step, who.world);
        let world_dir = root.shown(&world);
        let refuse = |reason: String| CheckpointError::Seal { dir: staged.to_path_buf(), step, reason };
        match root.create_dir(&world, 0o777) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                return Err(refuse(format!("cannot make the world's directory {}: {e}", world_dir.display())));
            }
            _ => {}
        }
        match root.own_dir(&world) {
            Ok(true) => {}
            Ok(false) => return Err(refuse(format!("the world's directory {} vanished", world_dir.display()))),
            Err(e) => return Err(refuse(e.to_string())),
        }
        let part = world.join(rank_name(who.rank));
        let record = world.join(format!("{}.json", rank_name(who.rank)));
        if root.exists(&part) || root.exists(&record) {
            return Err(refuse(format!(
                "rank {} already sealed its part of step {step} (in {}): each rank seals a step once",
                who.rank,
                world_dir.display()
            )));
        }
        // As for a plain seal: moved under rekindle's name first, then
        // checked and listed there, so that nothing the program swaps in
        // later is read.
        root.rename(&staged_rel, &part)
            .map_err(|e| refuse(format!("cannot move it into {}: {e}", root.shown(&part).display())))?;
        let sealed = self.hash_part(&root, &world, step, who).inspect_err(|e| {
            let failed = format!("{}.failed", rank_name(who.rank));
            let written = root.open_dir(&world).and_then(|w| write_whole(&w, &failed, e.to_string().as_bytes()));
            if let Err(w) = written {
                tracing::warn!(path = %world_dir.join(&failed).display(), error = %w, "could not tell rank 0 that this part failed; it waits until its timeout");
            }
        })?;
        Ok(PartSealed { dir: final_dir, ..sealed })
    }

    /// The files of rank `who`'s part, moved into the world's directory
    /// `world` (relative to the checkpoints directory `root`), fsynced and
    /// hashed, and its record written atomically, last.
    fn hash_part(&self, root: &Dir, world: &Path, step: u64, who: WorldRank) -> Result<PartSealed, CheckpointError> {
        let part = world.join(rank_name(who.rank));
        let part_dir = root.shown(&part);
        let refuse = |reason: String| CheckpointError::Seal { dir: part_dir.clone(), step, reason };
        match root.own_dir(&part) {
            Ok(true) => {}
            Ok(false) => return Err(refuse("it vanished while it was sealed".into())),
            Err(e) => return Err(refuse(format!("it was swapped while it was sealed: {e}"))),
        }
        let held = root.open_dir(&part).map_err(|e| refuse(format!("it was swapped while it was sealed: {e}")))?;
        let names = staged_files(&held, true).map_err(refuse)?;
        let files = sync_and_hash(&held, names, step)?;
        held.sync().map_err(|source| CheckpointError::SyncDir { path: part_dir.clone(), source })?;
        let record = PartRecord { rank: who.rank, world: who.world, step, files };
        let name = format!("{}.json", rank_name(who.rank));
        let path = root.shown(world.join(&name));
        let bytes = serde_json::to_vec(&record).expect("a part record serialises");
        // Tests make a rank die between its files and its record here.
        fail::fail_point!("checkpoint::world::before_record");
        root.open_dir(world).and_then(|w| write_whole(&w, &name, &bytes)).map_err(|source| CheckpointError::Write {
            step,
            path: path.clone(),
            source,
        })?;
        let total = record.files.iter().map(|f| f.bytes).sum();
        Ok(PartSealed { step, who, files: record.files, bytes: total, dir: PathBuf::new() })
    }

    /// Step 3 of the module header, by rank 0 after its own part: waits
    /// until every rank of `world` has sealed its part of `step` (at most
    /// `timeout`; a rank's failure ends the wait at once), then commits
    /// them as one checkpoint. On any failure before the commit the
    /// world's directory is removed: no checkpoint of `step`, earlier ones
    /// untouched.
    pub fn commit_world(&self, step: u64, world: usize, timeout: Duration) -> Result<SaveReport, CheckpointError> {
        let started = Instant::now();
        let root = self.root()?;
        let world_name = world_rel(step, world);
        let world_dir = root.shown(&world_name);
        let abandon = |reason: String| {
            if let Err(e) = root.remove_dir_all(&world_name) {
                tracing::warn!(dir = %world_dir.display(), error = %e, "could not remove the parts of an abandoned world checkpoint; the next attempt removes them");
            }
            CheckpointError::World { step, reason }
        };
        let records = wait_for_parts(&root, &world_name, step, world, timeout).map_err(abandon)?;
        let waited = started.elapsed().as_secs_f64();
        check_parts(&records).map_err(abandon)?;
        let final_dir = self.check_newer(&world_dir, step).map_err(|e| abandon(e.to_string()))?;
        let sealing = format!("{TMP_PREFIX}seal-{}-{}", step_dir_name(step), std::process::id());
        let gathered = gather(&root, &world_name, &sealing, &records).map_err(|reason| {
            let _ = root.remove_dir_all(&sealing);
            abandon(reason)
        });
        let entries = gathered?;
        let own_bytes = records.get(&0).map_or(0, |r| r.files.iter().map(|f| f.bytes).sum());
        let committed = self.commit_files(&root, &sealing, &final_dir, step, entries);
        match committed {
            Ok((bytes, rotated_out)) => {
                let _ = root.remove_dir_all(&world_name);
                let parts = PartsWritten { ranks: world, wait_seconds: waited, own_bytes };
                Ok(SaveReport::committed(step, final_dir, bytes, started, rotated_out, Some(parts), None))
            }
            Err(e) if e.committed() => {
                let _ = root.remove_dir_all(&world_name);
                Err(e)
            }
            Err(e) => {
                let _ = root.remove_dir_all(&sealing);
                let _ = abandon(String::new());
                Err(e)
            }
        }
    }
}

/// The world's directory of `step` for a world of `world`, relative to the
/// checkpoints directory (inside the staging directory).
fn world_rel(step: u64, world: usize) -> PathBuf {
    Path::new(STAGING_DIR).join(format!("{WORLD_PREFIX}{}-of-{world:05}", step_dir_name(step)))
}

/// Writes `name` in `dir` so that it appears whole or not at all: a
/// temporary file of this process, fsynced, renamed into place, the
/// directory fsynced.
fn write_whole(dir: &Dir, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = format!(".{name}.{}.tmp", std::process::id());
    let _ = dir.remove_file(&tmp);
    write_hashed(dir, &tmp, &[bytes])?;
    dir.rename(&tmp, name)?;
    dir.sync()
}

/// Every rank's record, by rank, once all are in; why not otherwise (a
/// rank's `.failed` reason, an unreadable record, the timeout naming the
/// ranks still missing).
fn wait_for_parts(
    root: &Dir,
    world_name: &Path,
    step: u64,
    world: usize,
    timeout: Duration,
) -> Result<BTreeMap<usize, PartRecord>, String> {
    let started = Instant::now();
    let mut records = BTreeMap::new();
    let mut gap = POLL;
    loop {
        // One listing a look; a part's record and a rank's `.failed` appear
        // whole (renamed into place), so only names listed are read, once.
        let listed: std::collections::BTreeSet<std::ffi::OsString> = match root.entries(world_name) {
            Ok(entries) => entries.into_iter().map(|e| e.name).collect(),
            Err(_) if !matches!(root.own_dir(world_name), Ok(true)) => {
                return Err(format!(
                    "the world's directory {} was removed while rank 0 waited",
                    root.shown(world_name).display()
                ));
            }
            Err(_) => Default::default(),
        };
        let before = records.len();
        let missing: Vec<usize> = (0..world).filter(|r| !records.contains_key(r)).collect();
        for rank in missing {
            let failed_name = format!("{}.failed", rank_name(rank));
            if listed.contains(std::ffi::OsStr::new(&failed_name)) {
                let failed = world_name.join(&failed_name);
                let why = root.read_bounded(&failed, 64 << 10).unwrap_or_else(|e| e.to_string().into_bytes());
                return Err(format!("rank {rank} could not seal its part: {}", String::from_utf8_lossy(&why)));
            }
            let name = format!("{}.json", rank_name(rank));
            if !listed.contains(std::ffi::OsStr::new(&name)) {
                continue;
            }
            let rel = world_name.join(&name);
            let path = root.shown(&rel);
            let Ok(bytes) = root.read_bounded(&rel, 64 << 20) else { continue };
            let record: PartRecord = serde_json::from_slice(&bytes)
                .map_err(|e| format!("rank {rank}'s part record {} cannot be read: {e}", path.display()))?;
            if record.rank != rank || record.world != world || record.step != step {
                return Err(format!(
                    "{} is the record of rank {} of {} at step {}, not of rank {rank} of {world} at step {step}",
                    path.display(),
                    record.rank,
                    record.world,
                    record.step
                ));
            }
            records.insert(rank, record);
        }
        gap = if records.len() > before { POLL } else { (gap * 2).min(MAX_POLL) };
        if records.len() == world {
            return Ok(records);
        }
        if started.elapsed() >= timeout {
            let missing: Vec<String> = (0..world).filter(|r| !records.contains_key(r)).map(|r| r.to_string()).collect();
            return Err(format!(
                "rank(s) {} sealed no part within {:.0} s ([distributed] timeout): stopped, dead, or not calling \
                 checkpoint at this step (every rank must, also one with nothing to save)",
                missing.join(", "),
                timeout.as_secs_f64()
            ));
        }
        std::thread::sleep(gap);
    }
}

/// The number of files of the world, or why the parts cannot make one
/// checkpoint: a name written by two ranks, or no file at all.
fn check_parts(records: &BTreeMap<usize, PartRecord>) -> Result<usize, String> {
    let mut owner = BTreeMap::<&str, usize>::new();
    for (rank, record) in records {
        for file in &record.files {
            if let Some(first) = owner.insert(&file.name, *rank) {
                return Err(format!(
                    "ranks {first} and {rank} both wrote `{}`: each file of a world checkpoint is written by one \
                     rank (name per-rank files apart, e.g. `shard-{{rank}}.pt`)",
                    file.name
                ));
            }
        }
    }
    if owner.is_empty() {
        return Err("no rank wrote any file: save something on at least one rank".into());
    }
    Ok(owner.len())
}

/// Moves every rank's files into `sealing` (a new directory of rekindle's
/// own), each checked to be the plain file of the size its rank recorded;
/// their manifest entries, sorted by name.
fn gather(
    root: &Dir,
    world_name: &Path,
    sealing: &str,
    records: &BTreeMap<usize, PartRecord>,
) -> Result<Vec<ManifestEntry>, String> {
    let shown = root.shown(sealing);
    root.create_dir(sealing, 0o777).map_err(|e| format!("cannot make {}: {e}", shown.display()))?;
    let mut entries = Vec::new();
    for (rank, record) in records {
        let part = world_name.join(rank_name(*rank));
        for file in &record.files {
            let from = part.join(&file.name);
            let meta = root.symlink_metadata(&from).map_err(|e| format!("rank {rank}'s `{}`: {e}", file.name))?;
            if !meta.is_file() || meta.len() != file.bytes {
                return Err(format!(
                    "rank {rank}'s `{}` changed after it was sealed ({} bytes recorded, {} now{})",
                    file.name,
                    file.bytes,
                    meta.len(),
                    if meta.is_file() { "" } else { ", not a plain file" }
                ));
            }
            root.rename(&from, Path::new(sealing).join(&file.name))
                .map_err(|e| format!("cannot move rank {rank}'s `{}` into {}: {e}", file.name, shown.display()))?;
            entries.push(file.clone());
        }
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::tests::stage;
    use crate::{MANIFEST_FILE, VerifyLevel, read_manifest, verify_checkpoint_dir};
    use std::fs;

    fn store(dir: &Path) -> CheckpointStore {
        let store = CheckpointStore::open(dir.join("checkpoints"), 3).unwrap();
        store.reset_staging().unwrap();
        store
    }

    fn steps(store: &CheckpointStore) -> Vec<u64> {
        store.list(VerifyLevel::Full).unwrap().iter().filter(|i| i.valid).map(|i| i.step).collect()
    }

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn world_ranks_are_checked() {
        assert!(WorldRank::new(0, 1).unwrap_err().contains("leave out --rank"));
        assert!(WorldRank::new(2, 2).unwrap_err().contains("0 to 1"));
        assert_eq!(WorldRank::new(1, 2), Ok(WorldRank { rank: 1, world: 2 }));
    }

    #[test]
    fn every_ranks_files_are_committed_under_one_manifest_once_all_sealed() {
        let tmp = tempfile::tempdir().unwrap();
        let store = store(tmp.path());
        // Rank 0 writes the model, every rank its own shard; rank 2 nothing.
        let parts: [&[(&str, &[u8])]; 3] =
            [&[("model.pt", b"weights"), ("rng-0.pt", b"r0")], &[("rng-1.pt", b"r1")], &[]];
        for rank in (1..3).rev() {
            let staged = stage(&store, &format!("r{rank}"), parts[rank]);
            let sealed = store.seal_part(&staged, 10, WorldRank::new(rank, 3).unwrap()).unwrap();
            assert_eq!(sealed.dir, store.step_dir(10));
            assert!(!staged.exists());
        }
        assert!(steps(&store).is_empty(), "nothing counts before rank 0 commits");
        let staged = stage(&store, "r0", parts[0]);
        store.seal_part(&staged, 10, WorldRank::new(0, 3).unwrap()).unwrap();
        let report = store.commit_world(10, 3, SECOND).unwrap();
        assert_eq!(report.parts.map(|p| p.ranks), Some(3));
        assert_eq!(steps(&store), vec![10]);
        assert!(verify_checkpoint_dir(&report.dir, VerifyLevel::Full).is_empty());
        let names: Vec<String> = read_manifest(&report.dir).unwrap().files.into_iter().map(|f| f.name).collect();
        assert_eq!(names, ["model.pt", "rng-0.pt", "rng-1.pt"]);
        assert!(!store.world_dir(10, 3).exists(), "the world's directory goes with the commit");
        assert!(report.dir.join(MANIFEST_FILE).is_file());
    }

    #[test]
    fn a_rank_missing_at_the_timeout_leaves_no_checkpoint_and_the_previous_one_stands() {
        let tmp = tempfile::tempdir().unwrap();
        let store = store(tmp.path());
        let one = stage(&store, "one", &[("w", b"1")]);
        store.seal(&one, 5).unwrap();
        let staged = stage(&store, "r0", &[("w", b"2")]);
        store.seal_part(&staged, 6, WorldRank::new(0, 2).unwrap()).unwrap();
        let err = store.commit_world(6, 2, Duration::from_millis(100)).unwrap_err();
        assert!(matches!(err, CheckpointError::World { step: 6, .. }), "{err}");
        assert!(err.to_string().contains("rank(s) 1 sealed no part"), "{err}");
        assert_eq!(steps(&store), vec![5]);
        assert!(!store.world_dir(6, 2).exists());
    }

    #[test]
    fn a_rank_that_fails_ends_the_wait_at_once_with_its_reason() {
        let tmp = tempfile::tempdir().unwrap();
        let store = store(tmp.path());
        let staged = stage(&store, "r0", &[("w", b"2")]);
        store.seal_part(&staged, 6, WorldRank::new(0, 2).unwrap()).unwrap();
        let bad = stage(&store, "r1", &[("ok", b"1")]);
        fs::create_dir(bad.join("sub")).unwrap();
        let err = store.seal_part(&bad, 6, WorldRank::new(1, 2).unwrap()).unwrap_err();
        assert!(err.to_string().contains("`sub` is not a plain file"), "{err}");
        let started = Instant::now();
        let err = store.commit_world(6, 2, Duration::from_secs(60)).unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(err.to_string().contains("rank 1 could not seal its part") && err.to_string().contains("`sub`"));
        assert!(steps(&store).is_empty());
    }

    #[test]
    fn a_name_two_ranks_wrote_or_a_world_without_files_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let store = store(tmp.path());
        for rank in 0..2 {
            let staged = stage(&store, &format!("r{rank}"), &[("model.pt", b"x")]);
            store.seal_part(&staged, 1, WorldRank::new(rank, 2).unwrap()).unwrap();
        }
        let err = store.commit_world(1, 2, SECOND).unwrap_err().to_string();
        assert!(err.contains("ranks 0 and 1 both wrote `model.pt`"), "{err}");
        for rank in 0..2 {
            let staged = stage(&store, &format!("e{rank}"), &[]);
            store.seal_part(&staged, 2, WorldRank::new(rank, 2).unwrap()).unwrap();
        }
        let err = store.commit_world(2, 2, SECOND).unwrap_err().to_string();
        assert!(err.contains("no rank wrote any file"), "{err}");
        assert!(steps(&store).is_empty());
    }

    #[test]
    fn a_part_is_refused_for_a_committed_step_twice_for_one_rank_and_outside_the_staging_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let store = store(tmp.path());
        let one = stage(&store, "one", &[("w", b"1")]);
        store.seal(&one, 5).unwrap();
        let me = WorldRank::new(1, 2).unwrap();
        let stale = stage(&store, "stale", &[("w", b"1")]);
        let err = store.seal_part(&stale, 5, me).unwrap_err().to_string();
        assert!(err.contains("step-0000000005 exists: a step is sealed once"), "{err}");
        assert!(stale.join("w").exists(), "a refused part is left as it was");
        // Older than the newest: the parts are taken (no rank but 0 verifies
        // the kept checkpoints), and rank 0's commit refuses the step.
        for rank in 0..2 {
            let older = stage(&store, &format!("older{rank}"), &[(["a", "b"][rank], b"1")]);
            store.seal_part(&older, 4, WorldRank::new(rank, 2).unwrap()).unwrap();
        }
        let err = store.commit_world(4, 2, SECOND).unwrap_err().to_string();
        assert!(err.contains("step 4 is not newer than the newest checkpoint (step 5"), "{err}");
        assert_eq!(steps(&store), [5]);
        store.seal_part(&stale, 7, me).unwrap();
        let again = stage(&store, "again", &[("w", b"1")]);
        assert!(store.seal_part(&again, 7, me).unwrap_err().to_string().contains("already sealed its part"));
        let outside = tmp.path().join("outside");
        fs::create_dir(&outside).unwrap();
        assert!(store.seal_part(&outside, 8, me).unwrap_err().to_string().contains("directly under the staging"));
    }

    #[test]
    fn a_part_file_changed_after_its_seal_is_never_committed() {
        let tmp = tempfile::tempdir().unwrap();
        let store = store(tmp.path());
        for rank in 0..2 {
            let staged = stage(&store, &format!("r{rank}"), &[(["a", "b"][rank], b"1234")]);
            store.seal_part(&staged, 3, WorldRank::new(rank, 2).unwrap()).unwrap();
        }
        fs::write(store.world_dir(3, 2).join("rank-00001").join("b"), b"12").unwrap();
        let err = store.commit_world(3, 2, SECOND).unwrap_err().to_string();
        assert!(err.contains("rank 1's `b` changed after it was sealed (4 bytes recorded, 2 now)"), "{err}");
        assert!(steps(&store).is_empty());
        let leftovers: Vec<_> = fs::read_dir(store.dir()).unwrap().flatten().map(|e| e.file_name()).collect();
        assert!(!leftovers.iter().any(|n| n.to_string_lossy().starts_with(".tmp-")), "{leftovers:?}");
    }

    #[test]
    fn the_ranks_may_seal_in_any_order_from_threads_with_rank_0_waiting() {
        let tmp = tempfile::tempdir().unwrap();
        let store = store(tmp.path());
        let staged = stage(&store, "r0", &[("model", b"m")]);
        store.seal_part(&staged, 4, WorldRank::new(0, 3).unwrap()).unwrap();
        let report = std::thread::scope(|s| {
            let committer = s.spawn(|| store.commit_world(4, 3, Duration::from_secs(30)));
            for rank in 1..3 {
                // The scenario, not synchronisation: each rank seals late, so
                // rank 0 waits (at least this long: a lower bound below).
                std::thread::sleep(Duration::from_millis(50));
                let staged = stage(&store, &format!("r{rank}"), &[(&format!("shard-{rank}"), b"s")]);
                store.seal_part(&staged, 4, WorldRank::new(rank, 3).unwrap()).unwrap();
            }
            committer.join().unwrap()
        })
        .unwrap();
        assert!(report.parts.unwrap().wait_seconds > 0.05);
        assert_eq!(read_manifest(&report.dir).unwrap().files.len(), 3);
    }
}
