//! Crash consistency of the checkpoint store, failpoint by failpoint.
//!
//! Every failpoint of the commit protocol is hit once as a crash (a panic
//! caught with `catch_unwind`: nothing is cleaned up, as when the process
//! dies) and once as an I/O error (`return`). Starting from committed
//! checkpoints 10, 20, 30 (keep = 3) we try to save 40, then reopen the store
//! and check that the newest *fully committed* checkpoint loads byte for byte,
//! that nothing committed was lost, that no leftovers survive the reopen, and
//! that the next save works.
//!
//! The same for the branch that replaces an invalid checkpoint of the same
//! step (a resumed run reaching a step saved before whose files were damaged
//! since): starting from 20, 30 and a damaged 40 (keep = 3), we save 40 again.
//!
//! The small checkpoints of these cases go through the page cache (the
//! buffered write path); the sharded cases write the model and optimizer
//! in 4 KiB shards with direct I/O, and crash or fail between the shards.

use crate::support;

use std::panic::{AssertUnwindSafe, catch_unwind};

use rekindle::checkpoint::write_mode::ModeSetting;
use rekindle::checkpoint::{
    CheckpointError, CheckpointStore, MANIFEST_FILE, OPTIMIZER_FILE, Parts, PartsError, REQUIRED_FILES, STATE_FILE,
    SaveReport, VerifyLevel, WriteSettings,
};

use support::{
    Reference, assert_holds_small_snapshot, assert_same_checkpoint_on_disk, flip_byte, leftovers,
    leftovers_with_prefix, save_steps, small_snapshot, temp_store, valid_steps,
};

const KEEP: usize = 3;
const COMMITTED: [u64; 3] = [10, 20, 30];
const NEW_STEP: u64 = 40;
const NEXT_STEP: u64 = 50;

/// How the failpoint fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// The process dies there: a panic, caught, with nothing cleaned up.
    Crash,
    /// The operation there fails: the failpoint returns an error.
    IoError,
}

/// How far the interrupted save of step 40 got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reached {
    /// Interrupted before the rename: 40 was never committed.
    BeforeRename,
    /// Committed (renamed); rotation had not removed anything yet.
    Committed,
    /// Committed, and step 10 was renamed aside to `.trash-…` but not removed.
    Trashed,
}

/// Failpoints that sit inside I/O code and inject an `io::Error` (EIO by default).
fn is_io_failpoint(name: &str) -> bool {
    name.starts_with("checkpoint::before_fsync::") || name.starts_with("checkpoint::after_fsync::")
}

fn attempt_save(store: &CheckpointStore, step: u64) -> std::thread::Result<Result<SaveReport, CheckpointError>> {
    catch_unwind(AssertUnwindSafe(|| store.save(&small_snapshot(step))))
}

/// Shards of at most 4 KiB written with direct I/O: the small snapshot's
/// model is two shards, its optimizer three.
fn sharded_direct() -> WriteSettings {
    WriteSettings { mode: ModeSetting::Direct, shard_bytes: Some(4096), ..WriteSettings::default() }
}

fn run_case(failpoint: &str, fault: Fault, reached: Reached) {
    run_case_with(WriteSettings::default(), failpoint, fault, reached);
}

fn run_case_with(settings: WriteSettings, failpoint: &str, fault: Fault, reached: Reached) {
    let scenario = fail::FailScenario::setup();
    let (_tmp, store) = temp_store(KEEP);
    let store = store.with_write_settings(settings);
    save_steps(&store, &COMMITTED);
    let dir = store.dir().to_path_buf();

    fail::cfg(failpoint, if fault == Fault::Crash { "panic" } else { "return" }).unwrap();
    let outcome = attempt_save(&store, NEW_STEP);
    fail::remove(failpoint);

    match (fault, outcome) {
        (Fault::Crash, Err(_panic)) => {
            // A real crash leaves its debris; reopening must deal with it.
            let expected_debris = match reached {
                Reached::BeforeRename => ".tmp-",
                Reached::Trashed => ".trash-",
                Reached::Committed => "",
            };
            if expected_debris.is_empty() {
                assert_eq!(leftovers(&dir), Vec::<String>::new(), "crash at {failpoint}");
            } else {
                let debris = leftovers_with_prefix(&dir, expected_debris);
                assert_eq!(debris.len(), 1, "crash at {failpoint} should leave one {expected_debris}… dir: {debris:?}");
            }
        }
        (Fault::IoError, Ok(Err(err))) => {
            // Errors after the rename say the checkpoint is committed anyway.
            assert_eq!(err.committed(), reached != Reached::BeforeRename, "{failpoint}: {err}");
            let err = match err {
                CheckpointError::AfterCommit { source, .. } => *source,
                other => other,
            };
            if is_io_failpoint(failpoint) {
                let file = failpoint.rsplit("::").next().unwrap();
                match &err {
                    CheckpointError::Write { step, path, source } => {
                        assert_eq!(*step, NEW_STEP);
                        assert!(path.ends_with(file), "error names {} instead of {file}", path.display());
                        assert_eq!(source.raw_os_error(), Some(nix::libc::EIO), "{err}");
                    }
                    other => panic!("{failpoint}: expected CheckpointError::Write, got {other:?}"),
                }
            } else {
                assert!(
                    matches!(&err, CheckpointError::Injected(name) if name == failpoint),
                    "{failpoint}: expected CheckpointError::Injected, got {err:?}"
                );
            }
            // The partial save is removed by the failing call itself.
            assert_eq!(leftovers_with_prefix(&dir, ".tmp-"), Vec::<String>::new(), "temp dir left by {failpoint}");
            if reached != Reached::Trashed {
                assert_eq!(leftovers(&dir), Vec::<String>::new(), "leftovers after error at {failpoint}");
            }
        }
        (Fault::Crash, Ok(result)) => panic!("failpoint {failpoint} never fired: save returned {result:?}"),
        (Fault::IoError, Ok(Ok(report))) => panic!("failpoint {failpoint} never fired: save returned {report:?}"),
        (Fault::IoError, Err(_)) => panic!("failpoint {failpoint} configured to return an error panicked"),
    }

    let newest = if reached == Reached::BeforeRename { 30 } else { NEW_STEP };
    // Leftovers are never mistaken for checkpoints, even before they are removed.
    let before_reopen = CheckpointStore::open_read_only(&dir).load_latest().unwrap();
    assert_eq!(before_reopen.loaded.map(|l| l.snapshot.step), Some(newest), "before reopen, {failpoint}");

    let store = CheckpointStore::open(&dir, KEEP).unwrap().with_write_settings(settings);
    assert_eq!(leftovers(&dir), Vec::<String>::new(), "leftovers after reopen, {failpoint}");

    let outcome = store.load_latest().unwrap();
    assert!(outcome.rejected.is_empty(), "{failpoint}: rejected {:?}", outcome.rejected);
    let loaded = outcome.loaded.expect("a checkpoint loads");
    assert_eq!(loaded.dir, store.step_dir(newest));
    assert!(loaded.snapshot == small_snapshot(newest), "{failpoint}: loaded snapshot differs from the saved one");

    // Nothing committed was lost: rotation never ran to completion, so every
    // checkpoint committed so far is still there (minus one already trashed).
    let expected: Vec<u64> = match reached {
        Reached::BeforeRename => vec![30, 20, 10],
        Reached::Committed => vec![40, 30, 20, 10],
        Reached::Trashed => vec![40, 30, 20],
    };
    assert_eq!(valid_steps(&store), expected, "{failpoint}");
    let reference = Reference::with(&expected, settings);
    for &step in &expected {
        assert_holds_small_snapshot(&store, step);
        assert_same_checkpoint_on_disk(&store.step_dir(step), &reference.dir(step));
    }

    // The store keeps working: the next save commits and rotates normally.
    let report = store.save(&small_snapshot(NEXT_STEP)).unwrap();
    assert!(!report.already_existed);
    let mut after: Vec<u64> = vec![NEXT_STEP];
    after.extend(expected.iter().copied().take(KEEP - 1));
    assert_eq!(valid_steps(&store), after, "{failpoint}: after the next save");
    assert_eq!(store.load_latest().unwrap().loaded.unwrap().snapshot.step, NEXT_STEP);
    assert_eq!(leftovers(&dir), Vec::<String>::new());
    scenario.teardown();
}

macro_rules! failpoint_cases {
    ($($crash:ident, $error:ident: $point:literal => $reached:ident;)*) => {
        /// Every failpoint of the commit of a new step the cases below exercise.
        const COVERED_COMMIT: &[&str] = &[$($point),*];
        $(
            #[test]
            fn $crash() {
                run_case($point, Fault::Crash, Reached::$reached);
            }
            #[test]
            fn $error() {
                run_case($point, Fault::IoError, Reached::$reached);
            }
        )*
    };
}

failpoint_cases! {
    crash_before_writing_model_keeps_previous_checkpoint,
    error_before_writing_model_is_reported_and_keeps_previous_checkpoint:
        "checkpoint::before_write::model.safetensors" => BeforeRename;
    crash_before_writing_optimizer_keeps_previous_checkpoint,
    error_before_writing_optimizer_is_reported_and_keeps_previous_checkpoint:
        "checkpoint::before_write::optimizer.safetensors" => BeforeRename;
    crash_before_writing_state_keeps_previous_checkpoint,
    error_before_writing_state_is_reported_and_keeps_previous_checkpoint:
        "checkpoint::before_write::state.json" => BeforeRename;

    crash_before_fsync_of_model_keeps_previous_checkpoint,
    error_before_fsync_of_model_is_reported_and_keeps_previous_checkpoint:
        "checkpoint::before_fsync::model.safetensors" => BeforeRename;
    crash_before_fsync_of_optimizer_keeps_previous_checkpoint,
    error_before_fsync_of_optimizer_is_reported_and_keeps_previous_checkpoint:
        "checkpoint::before_fsync::optimizer.safetensors" => BeforeRename;
    crash_before_fsync_of_state_keeps_previous_checkpoint,
    error_before_fsync_of_state_is_reported_and_keeps_previous_checkpoint:
        "checkpoint::before_fsync::state.json" => BeforeRename;
    crash_before_fsync_of_manifest_keeps_previous_checkpoint,
    error_before_fsync_of_manifest_is_reported_and_keeps_previous_checkpoint:
        "checkpoint::before_fsync::MANIFEST.json" => BeforeRename;

    crash_after_fsync_of_model_keeps_previous_checkpoint,
    error_after_fsync_of_model_is_reported_and_keeps_previous_checkpoint:
        "checkpoint::after_fsync::model.safetensors" => BeforeRename;
    crash_after_fsync_of_optimizer_keeps_previous_checkpoint,
    error_after_fsync_of_optimizer_is_reported_and_keeps_previous_checkpoint:
        "checkpoint::after_fsync::optimizer.safetensors" => BeforeRename;
    crash_after_fsync_of_state_keeps_previous_checkpoint,
    error_after_fsync_of_state_is_reported_and_keeps_previous_checkpoint:
        "checkpoint::after_fsync::state.json" => BeforeRename;
    crash_after_fsync_of_manifest_keeps_previous_checkpoint,
    error_after_fsync_of_manifest_is_reported_and_keeps_previous_checkpoint:
        "checkpoint::after_fsync::MANIFEST.json" => BeforeRename;

    crash_before_manifest_keeps_previous_checkpoint,
    error_before_manifest_is_reported_and_keeps_previous_checkpoint:
        "checkpoint::before_manifest" => BeforeRename;
    crash_before_rename_keeps_previous_checkpoint,
    error_before_rename_is_reported_and_keeps_previous_checkpoint:
        "checkpoint::before_rename" => BeforeRename;

    crash_after_rename_keeps_new_checkpoint,
    error_after_rename_is_reported_and_keeps_new_checkpoint:
        "checkpoint::after_rename" => Committed;
    crash_after_commit_keeps_new_checkpoint,
    error_after_commit_is_reported_and_keeps_new_checkpoint:
        "checkpoint::after_commit" => Committed;
    crash_before_rotation_delete_keeps_new_and_old_checkpoints,
    error_before_rotation_delete_is_reported_and_keeps_new_and_old_checkpoints:
        "checkpoint::rotation_delete" => Committed;
    crash_after_rotation_trash_rename_leaves_only_a_removable_leftover,
    error_after_rotation_trash_rename_leaves_only_a_removable_leftover:
        "checkpoint::rotation_trashed" => Trashed;
}

macro_rules! sharded_failpoint_cases {
    ($($crash:ident, $error:ident: $point:literal;)*) => {
        /// The failpoints between the shards of a sharded save (per-file
        /// names the source forms with `{}` or `{name}`).
        const COVERED_SHARDED: &[&str] = &[$($point),*];
        $(
            #[test]
            fn $crash() {
                run_case_with(sharded_direct(), $point, Fault::Crash, Reached::BeforeRename);
            }
            #[test]
            fn $error() {
                run_case_with(sharded_direct(), $point, Fault::IoError, Reached::BeforeRename);
            }
        )*
    };
}

sharded_failpoint_cases! {
    crash_before_the_second_model_shard_leaves_no_checkpoint,
    error_before_the_second_model_shard_is_reported_and_leaves_no_checkpoint:
        "checkpoint::before_write::model-00002-of-00002.safetensors";
    crash_after_the_first_optimizer_shard_is_synced_leaves_no_checkpoint,
    error_after_the_first_optimizer_shard_is_synced_is_reported_and_leaves_no_checkpoint:
        "checkpoint::after_fsync::optimizer-00001-of-00003.safetensors";
    crash_before_the_last_optimizer_shard_is_synced_leaves_no_checkpoint,
    error_before_the_last_optimizer_shard_is_synced_is_reported_and_leaves_no_checkpoint:
        "checkpoint::before_fsync::optimizer-00003-of-00003.safetensors";
    crash_before_the_model_index_leaves_no_checkpoint,
    error_before_the_model_index_is_reported_and_leaves_no_checkpoint:
        "checkpoint::before_write::model.safetensors.index.json";
}

#[test]
fn the_sharded_cases_cut_the_small_snapshot_as_they_name_it() {
    // A save of the store like any other here: without the scenario's lock
    // it ran beside another test's failpoints (process-global) and once
    // failed on a disk-full one of `disk_full` (#44).
    let scenario = fail::FailScenario::setup();
    let (_tmp, store) = temp_store(KEEP);
    let store = store.with_write_settings(sharded_direct());
    let report = store.save(&support::small_snapshot(NEW_STEP)).unwrap();
    let names: Vec<String> = support::manifest_entries(&report.dir).into_iter().map(|e| e.name).collect();
    for point in COVERED_SHARDED {
        let file = point.rsplit("::").next().unwrap();
        assert!(names.iter().any(|n| n == file), "{file} is not among {names:?}");
    }
    let write = report.write.unwrap();
    assert_eq!(write.plan.mode, rekindle::checkpoint::write_mode::IoMode::Direct, "{write:?}");
    scenario.teardown();
}

/// How far the replacement of the damaged step 40 got when its failpoint fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Replace {
    /// Before the damaged 40 was renamed aside: it is still in place.
    MoveAside,
    /// The damaged 40 is aside (`.trash-…`); the new one is not renamed in.
    Rename,
    /// The new 40 is committed; the checkpoints directory is not synced.
    Sync,
    /// The new 40 is committed and synced; the damaged one is not removed.
    RemoveOld,
}

impl Replace {
    fn committed(self) -> bool {
        matches!(self, Replace::Sync | Replace::RemoveOld)
    }
}

/// Saves 10, 20, 30 and 40 (10 is rotated out), then damages 40 keeping its
/// size (one flipped byte).
fn store_with_damaged_newest() -> (tempfile::TempDir, CheckpointStore) {
    let (tmp, store) = temp_store(KEEP);
    save_steps(&store, &[10, 20, 30, NEW_STEP]);
    flip_byte(&store.step_dir(NEW_STEP).join(REQUIRED_FILES[0]));
    (tmp, store)
}

fn run_replace_case(failpoint: &str, fault: Fault, stage: Replace) {
    let scenario = fail::FailScenario::setup();
    let (_tmp, store) = store_with_damaged_newest();
    let dir = store.dir().to_path_buf();
    let step_dir = store.step_dir(NEW_STEP);

    fail::cfg(failpoint, if fault == Fault::Crash { "panic" } else { "return" }).unwrap();
    let outcome = attempt_save(&store, NEW_STEP);
    fail::remove(failpoint);

    // What each stage leaves: (temporary dirs, moved-aside dirs).
    let debris = |tmp: usize, trash: usize| {
        assert_eq!(leftovers_with_prefix(&dir, ".tmp-").len(), tmp, "{failpoint} {fault:?}: {:?}", leftovers(&dir));
        assert_eq!(leftovers_with_prefix(&dir, ".trash-").len(), trash, "{failpoint} {fault:?}: {:?}", leftovers(&dir));
    };
    match (fault, outcome) {
        (Fault::Crash, Err(_panic)) => match stage {
            Replace::MoveAside => debris(1, 0),
            Replace::Rename => debris(1, 1),
            Replace::Sync | Replace::RemoveOld => debris(0, 1),
        },
        (Fault::IoError, Ok(Err(err))) => {
            assert_eq!(err.committed(), stage.committed(), "{failpoint}: {err}");
            let message = err.to_string();
            assert!(message.contains(&step_dir.display().to_string()), "{failpoint}: names the step's dir: {message}");
            let eio = |e: &std::io::Error| assert_eq!(e.raw_os_error(), Some(nix::libc::EIO), "{failpoint}: {message}");
            match (stage, &err) {
                (Replace::MoveAside, CheckpointError::ReplaceMoveAside { step, dir: d, source, .. }) => {
                    assert_eq!((*step, d), (NEW_STEP, &step_dir));
                    eio(source);
                    assert!(message.contains("was not committed"), "{message}");
                    assert!(message.contains("stays where it is"), "{message}");
                    debris(0, 0);
                }
                (Replace::Rename, CheckpointError::ReplaceRename { step, dir: d, aside, source }) => {
                    assert_eq!((*step, d), (NEW_STEP, &step_dir));
                    eio(source);
                    assert!(aside.is_dir(), "the damaged one is aside at {}", aside.display());
                    assert!(message.contains(&aside.display().to_string()), "says where the old one went: {message}");
                    assert!(message.contains("was not committed"), "{message}");
                    debris(0, 1);
                }
                (Replace::Sync, CheckpointError::AfterCommit { step, source, .. }) => {
                    assert_eq!(*step, NEW_STEP);
                    match source.as_ref() {
                        CheckpointError::SyncDir { path, source } => {
                            assert_eq!(path, &dir);
                            eio(source);
                        }
                        other => panic!("{failpoint}: expected SyncDir, got {other:?}"),
                    }
                    assert!(message.contains("syncing the checkpoints directory"), "{message}");
                    debris(0, 1);
                }
                (Replace::RemoveOld, CheckpointError::AfterCommit { step, source, .. }) => {
                    assert_eq!(*step, NEW_STEP);
                    match source.as_ref() {
                        CheckpointError::Remove { path, source } => {
                            assert!(path.is_dir() && leftovers_with_prefix(&dir, ".trash-").len() == 1);
                            eio(source);
                        }
                        other => panic!("{failpoint}: expected Remove, got {other:?}"),
                    }
                    assert!(message.contains("removing the invalid checkpoint it replaced"), "{message}");
                    debris(0, 1);
                }
                (_, other) => panic!("{failpoint}: unexpected error {other:?}"),
            }
        }
        (Fault::Crash, Ok(result)) => panic!("failpoint {failpoint} never fired: save returned {result:?}"),
        (Fault::IoError, Ok(Ok(report))) => panic!("failpoint {failpoint} never fired: save returned {report:?}"),
        (Fault::IoError, Err(_)) => panic!("failpoint {failpoint} configured to return an error panicked"),
    }

    // Before and after the reopen, the newest checkpoint that loads is the
    // new 40 once committed, else 30; the damaged 40 is reported while it is
    // still in place.
    let newest = if stage.committed() { NEW_STEP } else { 30 };
    let damaged_in_place = stage == Replace::MoveAside;
    for store in [CheckpointStore::open_read_only(&dir), CheckpointStore::open(&dir, KEEP).unwrap()] {
        let outcome = store.load_latest().unwrap();
        let loaded = outcome.loaded.expect("a checkpoint loads");
        assert!(loaded.snapshot == small_snapshot(newest), "{failpoint}: loaded step {}", loaded.snapshot.step);
        let rejected: Vec<u64> = outcome.rejected.iter().map(|r| r.step).collect();
        assert_eq!(rejected, if damaged_in_place { vec![NEW_STEP] } else { vec![] }, "{failpoint}");
    }
    assert_eq!(leftovers(&dir), Vec::<String>::new(), "leftovers after reopen, {failpoint}");
    let store = CheckpointStore::open(&dir, KEEP).unwrap();
    let listed: Vec<(u64, bool)> = store.list(VerifyLevel::Full).unwrap().iter().map(|i| (i.step, i.valid)).collect();
    let expected: Vec<(u64, bool)> = match stage {
        Replace::MoveAside => vec![(40, false), (30, true), (20, true)],
        Replace::Rename => vec![(30, true), (20, true)],
        Replace::Sync | Replace::RemoveOld => vec![(40, true), (30, true), (20, true)],
    };
    assert_eq!(listed, expected, "{failpoint}");
    for &(step, valid) in &expected {
        if valid {
            assert_holds_small_snapshot(&store, step);
        }
    }

    // Saving 40 again completes the replacement (or keeps the committed one),
    // and the store goes on rotating normally.
    let report = store.save(&small_snapshot(NEW_STEP)).unwrap();
    assert_eq!(report.already_existed, stage.committed(), "{failpoint}");
    assert_holds_small_snapshot(&store, NEW_STEP);
    store.save(&small_snapshot(NEXT_STEP)).unwrap();
    assert_eq!(valid_steps(&store), vec![NEXT_STEP, NEW_STEP, 30], "{failpoint}: after the next save");
    assert_eq!(leftovers(&dir), Vec::<String>::new());
    scenario.teardown();
}

macro_rules! replace_cases {
    ($($crash:ident, $error:ident: $point:literal => $stage:ident;)*) => {
        /// Every failpoint of the replacement of an invalid checkpoint the cases below exercise.
        const COVERED_REPLACE: &[&str] = &[$($point),*];
        $(
            #[test]
            fn $crash() {
                run_replace_case($point, Fault::Crash, Replace::$stage);
            }
            #[test]
            fn $error() {
                run_replace_case($point, Fault::IoError, Replace::$stage);
            }
        )*
    };
}

replace_cases! {
    crash_before_moving_the_invalid_checkpoint_aside_keeps_previous_checkpoint,
    error_moving_the_invalid_checkpoint_aside_says_nothing_was_committed:
        "checkpoint::replace::move_aside" => MoveAside;
    crash_before_renaming_the_replacement_in_keeps_previous_checkpoint,
    error_renaming_the_replacement_in_says_where_the_invalid_one_went:
        "checkpoint::replace::rename" => Rename;
    crash_before_syncing_after_the_replacement_keeps_the_new_checkpoint,
    error_syncing_after_the_replacement_is_reported_as_after_the_commit:
        "checkpoint::replace::sync" => Sync;
    crash_before_removing_the_replaced_checkpoint_keeps_the_new_checkpoint,
    error_removing_the_replaced_checkpoint_is_reported_as_after_the_commit:
        "checkpoint::replace::remove_old" => RemoveOld;
}

/// Every failpoint named in the store's sources (the commit protocol in
/// store.rs, its I/O in hashed_io.rs). Per-file names are expanded the way the
/// store forms them: `{}` in the loop over the data files, `{name}` in
/// `write_hashed`, which also writes the manifest.
fn failpoints_in_store_source() -> Vec<String> {
    let source = concat!(
        include_str!("../../crates/checkpoint/src/store.rs"),
        include_str!("../../crates/checkpoint/src/encode.rs"),
        include_str!("../../crates/checkpoint/src/hashed_io.rs")
    );
    let mut with_manifest = REQUIRED_FILES.to_vec();
    with_manifest.push(MANIFEST_FILE);
    let expand = |prefix: &str, files: &[&str]| files.iter().map(|f| format!("{prefix}{f}")).collect::<Vec<_>>();
    let mut names: Vec<String> = source
        .split('"')
        .filter(|s| s.starts_with("checkpoint::") && !s.contains(' '))
        .flat_map(|s| {
            if let Some(prefix) = s.strip_suffix("{}") {
                expand(prefix, &REQUIRED_FILES)
            } else if let Some(prefix) = s.strip_suffix("{name}") {
                expand(prefix, &with_manifest)
            } else {
                vec![s.to_string()]
            }
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

#[test]
fn every_failpoint_in_the_store_is_exercised() {
    let in_source = failpoints_in_store_source();
    assert!(in_source.len() >= 17, "found only {in_source:?} in store.rs");
    let mut covered: Vec<String> =
        COVERED_COMMIT.iter().chain(COVERED_REPLACE).chain(COVERED_PARTS).map(|s| s.to_string()).collect();
    covered.sort();
    assert_eq!(covered, in_source, "failpoints in store.rs and the cases here differ");
    covered.dedup();
    let cases = COVERED_COMMIT.len() + COVERED_REPLACE.len() + COVERED_PARTS.len();
    assert_eq!(covered.len(), cases, "a failpoint is covered twice");
    // The sharded cases are the per-file points of other files.
    for point in COVERED_SHARDED {
        let prefix = point.rsplit_once("::").unwrap().0;
        assert!(in_source.iter().any(|p| p.starts_with(prefix)), "{point} is no failpoint of the store");
    }
}

/// The failpoints of a checkpoint written in parts by several ranks (rank
/// 0's own files go through the commit protocol's, above).
const COVERED_PARTS: &[&str] = &["checkpoint::part::before_write"];

/// Step 40 saved in parts by two ranks (rank 1 here a thread of this
/// process, writing into the shared staging directory) while rank 1's part
/// fails with `fault`: as an error its thread reports (the run goes on), or
/// as a crash that takes the whole world down (MPI aborts every rank).
/// Nothing of step 40 may count; the next start removes what was written.
fn run_parts_case(fault: Fault) {
    let scenario = fail::FailScenario::setup();
    let (_tmp, store) = temp_store(KEEP);
    save_steps(&store, &COMMITTED);
    let dir = store.dir().to_path_buf();
    let staging = store.new_shared_staging(NEW_STEP, "test").unwrap();
    let staging = staging.as_str();
    let share = small_snapshot(NEW_STEP);
    fail::cfg(COVERED_PARTS[0], if fault == Fault::Crash { "panic" } else { "return" }).unwrap();
    let follower = CheckpointStore::open_read_only(&dir);
    let mut collect = || {
        let written = std::thread::scope(|s| s.spawn(|| follower.write_share(staging, 1, 2, &share, true)).join());
        match written {
            Ok(entries) => entries.map_err(|e| PartsError::RankFailed { rank: 1, error: e.to_string() }),
            // Rank 1 died: the launcher ends rank 0 too, in the middle of its save.
            Err(panic) => std::panic::resume_unwind(panic),
        }
    };
    let parts = Parts { staging: staging.into(), world: 2, optimizer_in_parts: true, collect: &mut collect };
    let outcome = catch_unwind(AssertUnwindSafe(|| store.save_with(&small_snapshot(NEW_STEP), Some(parts))));
    fail::remove(COVERED_PARTS[0]);
    match (fault, outcome) {
        (Fault::IoError, Ok(Err(err))) => {
            assert!(matches!(err, CheckpointError::Parts { step: NEW_STEP, .. }), "{err}");
            assert!(err.to_string().contains(COVERED_PARTS[0]), "the rank's reason is kept: {err}");
            assert_eq!(leftovers(&dir), Vec::<String>::new(), "the staging directory is removed");
        }
        (Fault::Crash, Err(_panic)) => {
            assert_eq!(leftovers_with_prefix(&dir, ".tmp-"), vec![staging.to_string()], "a dead world's debris");
        }
        (fault, other) => panic!("{fault:?} at {}: {other:?}", COVERED_PARTS[0]),
    }
    assert!(!store.step_dir(NEW_STEP).exists(), "nothing of step 40 was committed");
    let store = CheckpointStore::open(&dir, KEEP).unwrap();
    assert_eq!(leftovers(&dir), Vec::<String>::new(), "leftovers after reopen");
    assert_eq!(valid_steps(&store), vec![30, 20, 10]);
    assert_holds_small_snapshot(&store, 30);
    store.save(&small_snapshot(NEXT_STEP)).unwrap();
    assert_eq!(valid_steps(&store), vec![NEXT_STEP, 30, 20]);
    scenario.teardown();
}

#[test]
fn a_rank_whose_part_fails_leaves_no_checkpoint_of_that_step_and_no_staging() {
    run_parts_case(Fault::IoError);
}

#[test]
fn a_rank_that_dies_in_its_part_leaves_only_a_staging_directory_the_next_start_removes() {
    run_parts_case(Fault::Crash);
}

#[test]
fn crash_between_rotation_deletes_leaves_only_whole_checkpoints() {
    let scenario = fail::FailScenario::setup();
    let (_tmp, store) = temp_store(KEEP);
    save_steps(&store, &COMMITTED);
    // keep = 1 plans three deletes (30, 20, 10): let the first happen, crash at the second.
    let store = CheckpointStore::open(store.dir(), 1).unwrap();
    fail::cfg("checkpoint::rotation_delete", "1*off->panic").unwrap();
    let outcome = attempt_save(&store, NEW_STEP);
    fail::remove("checkpoint::rotation_delete");
    assert!(outcome.is_err(), "the second rotation delete should have crashed");

    let store = CheckpointStore::open(store.dir(), 1).unwrap();
    assert_eq!(leftovers(store.dir()), Vec::<String>::new());
    assert_eq!(valid_steps(&store), vec![40, 20, 10]);
    for step in [40, 20, 10] {
        assert_holds_small_snapshot(&store, step);
    }
    assert_eq!(store.load_latest().unwrap().loaded.unwrap().snapshot, small_snapshot(NEW_STEP));
    store.save(&small_snapshot(NEXT_STEP)).unwrap();
    assert_eq!(valid_steps(&store), vec![NEXT_STEP]);
    scenario.teardown();
}

#[test]
fn crash_while_replacing_an_invalid_checkpoint_of_the_same_step_keeps_previous() {
    let scenario = fail::FailScenario::setup();
    let (_tmp, store) = temp_store(KEEP);
    save_steps(&store, &[10, 20, 30, NEW_STEP]);
    std::fs::remove_file(store.step_dir(NEW_STEP).join(STATE_FILE)).unwrap();

    fail::cfg("checkpoint::before_rename", "panic").unwrap();
    let outcome = attempt_save(&store, NEW_STEP);
    fail::remove("checkpoint::before_rename");
    assert!(outcome.is_err(), "before_rename should have crashed");

    let store = CheckpointStore::open(store.dir(), KEEP).unwrap();
    assert_eq!(leftovers(store.dir()), Vec::<String>::new());
    let outcome = store.load_latest().unwrap();
    assert_eq!(outcome.loaded.unwrap().snapshot, small_snapshot(30));
    assert_eq!(outcome.rejected.len(), 1, "the damaged step 40 is reported");
    assert_eq!(outcome.rejected[0].step, NEW_STEP);

    // Saving the same step again replaces the damaged one.
    let report = store.save(&small_snapshot(NEW_STEP)).unwrap();
    assert!(!report.already_existed);
    assert_eq!(valid_steps(&store), vec![40, 30, 20]);
    assert_holds_small_snapshot(&store, NEW_STEP);
    scenario.teardown();
}

#[test]
fn injected_os_errors_keep_their_code_and_hint() {
    let scenario = fail::FailScenario::setup();
    let (_tmp, store) = temp_store(KEEP);
    save_steps(&store, &COMMITTED);
    let point = "checkpoint::before_fsync::state.json";
    for (arg, code, hint) in [
        ("ENOSPC", nix::libc::ENOSPC, "(disk full)"),
        ("EACCES", nix::libc::EACCES, "(permission denied)"),
        ("EROFS", nix::libc::EROFS, "(read-only filesystem)"),
        ("", nix::libc::EIO, "(I/O error"),
    ] {
        let action = if arg.is_empty() { "return".to_string() } else { format!("return({arg})") };
        fail::cfg(point, &action).unwrap();
        let err = store.save(&small_snapshot(NEW_STEP)).unwrap_err();
        fail::remove(point);
        match &err {
            CheckpointError::Write { source, .. } => assert_eq!(source.raw_os_error(), Some(code), "{action}"),
            other => panic!("{action}: expected CheckpointError::Write, got {other:?}"),
        }
        let message = err.to_string();
        assert!(message.contains(hint), "{action}: message lacks {hint:?}: {message}");
        assert!(message.contains(STATE_FILE), "{action}: message does not name the file: {message}");
        assert_eq!(leftovers(store.dir()), Vec::<String>::new(), "{action}");
    }
    assert_eq!(valid_steps(&store), vec![30, 20, 10]);
    assert_eq!(store.list(VerifyLevel::Full).unwrap().len(), 3);
    scenario.teardown();
}

#[test]
fn a_filesystem_refusing_direct_io_gets_the_same_checkpoint_through_the_page_cache() {
    // `fs::direct_io_unsupported` stands in for a filesystem that refuses
    // O_DIRECT (the store then writes through the page cache): the files
    // must be byte for byte those of a direct save, across several pooled
    // blocks and with an unaligned tail.
    let scenario = fail::FailScenario::setup();
    let snapshot = support::snapshot_for_step(NEW_STEP, (18 << 20) + 4 * 1000);
    let direct_io = WriteSettings { mode: ModeSetting::Direct, ..WriteSettings::default() };
    let (_direct_tmp, direct) = temp_store(KEEP);
    let direct = direct.with_write_settings(direct_io);
    let first = direct.save(&snapshot).unwrap().write.unwrap();
    fail::cfg("fs::direct_io_unsupported", "return").unwrap();
    let (_buffered_tmp, buffered) = temp_store(KEEP);
    let buffered = buffered.with_write_settings(direct_io);
    let saved = buffered.save(&snapshot);
    fail::remove("fs::direct_io_unsupported");
    let refused = saved.unwrap().write.unwrap();
    // The event says the plan was direct and that the filesystem refused it
    // (the first store's is refused only where /tmp refuses O_DIRECT).
    assert!(refused.direct_refused, "{first:?} / {refused:?}");
    assert_same_checkpoint_on_disk(&buffered.step_dir(NEW_STEP), &direct.step_dir(NEW_STEP));
    for store in [&direct, &buffered] {
        assert!(store.list(VerifyLevel::Full).unwrap()[0].valid);
        assert_eq!(store.load_latest().unwrap().loaded.unwrap().snapshot, snapshot);
    }
    scenario.teardown();
}

#[test]
fn a_file_that_cannot_be_mapped_is_read_and_loads_the_same_snapshot() {
    // Loads map safetensors files; `fs::mmap_unsupported` stands in for a
    // file that cannot be mapped (the loader then reads it into the
    // tensors' own buffers). Same snapshot, same verdicts on damage.
    let scenario = fail::FailScenario::setup();
    let snapshot = support::snapshot_for_step(NEW_STEP, (9 << 20) + 4 * 1000);
    let (_tmp, store) = temp_store(KEEP);
    store.save(&snapshot).unwrap();
    // (Compared before the file is damaged below: a mapped snapshot shares
    // the file's pages, so it is used, and dropped, right after loading.)
    assert_eq!(store.load_latest().unwrap().loaded.unwrap().snapshot, snapshot, "mapped");
    fail::cfg("fs::mmap_unsupported", "return").unwrap();
    let read = store.load_latest();
    flip_byte(&store.step_dir(NEW_STEP).join(OPTIMIZER_FILE));
    let damaged = store.load_latest();
    fail::remove("fs::mmap_unsupported");
    assert_eq!(read.unwrap().loaded.unwrap().snapshot, snapshot, "read instead of mapped");
    let damaged = damaged.unwrap();
    assert!(damaged.loaded.is_none(), "a damaged file read instead of mapped is refused too");
    assert_eq!(damaged.rejected[0].failures[0].file, OPTIMIZER_FILE);
    scenario.teardown();
}
