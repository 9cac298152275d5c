//! A full disk: on a real, small tmpfs, a save that does not fit fails with a
//! typed error, leaves no partial checkpoint behind, and every earlier
//! checkpoint still verifies and loads. Covers the free-space pre-check, a
//! real ENOSPC from the kernel in the middle of the write (the disk filled up
//! after the check passed), and an injected ENOSPC at fsync.
//!
//! Mounting needs root (CAP_SYS_ADMIN); without it the tmpfs tests print a
//! loud SKIPPED line and pass, except in CI (`support::requires`). The
//! free-space pre-check also runs without root, against a free-space answer
//! injected through the `fs::available_space` failpoint.
//!
//! Failpoints are process-global, so every test here holds a
//! `fail::FailScenario` and they run one at a time.

use crate::support;

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use rekindle::checkpoint::{CheckpointError, CheckpointStore, MODEL_FILE, OPTIMIZER_FILE, Snapshot};

use support::requires::Need;
use support::{leftovers, snapshot_for_step, valid_steps};

/// Tensor bytes per checkpoint: a 4 MiB tmpfs holds a few of them.
const PAYLOAD: usize = 640 << 10;

fn snapshot(step: u64) -> Snapshot {
    snapshot_for_step(step, PAYLOAD)
}

/// A tmpfs mounted on a fresh temporary directory, unmounted on drop (also
/// when the test fails).
struct Tmpfs {
    path: PathBuf,
    // Dropped after `drop` below has unmounted, so it removes an empty directory.
    _dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Result<Tmpfs, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let path = dir.path().to_path_buf();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&path)
            .output()
            .map_err(|e| format!("running mount: {e}"))?;
        if !out.status.success() {
            return Err(format!("mount exited with {}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim()));
        }
        Ok(Tmpfs { path, _dir: dir })
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let ok = Command::new("umount").arg(&self.path).status().is_ok_and(|s| s.success());
        if !ok {
            // Busy (a file still open): detach it lazily rather than leak a mount.
            let _ = Command::new("umount").arg("-l").arg(&self.path).status();
        }
    }
}

/// Mounts a tmpfs, or prints why not and returns `None` (the caller skips).
fn tmpfs_or_skip(size: &str) -> Option<Tmpfs> {
    match Tmpfs::mount(size) {
        Ok(t) => Some(t),
        // As root a failed mount is a failure, not a missing permission.
        // SAFETY: geteuid has no preconditions and cannot fail.
        Err(e) if unsafe { nix::libc::geteuid() } == 0 => panic!("cannot mount a tmpfs as root: {e}"),
        Err(e) => support::requires::unmet(Need::Root, format_args!("cannot mount a tmpfs: {e}")),
    }
}

/// Writes zeros to `path` until the filesystem refuses with ENOSPC.
fn fill_disk(path: &Path) {
    let mut file = fs::File::create(path).expect("create filler file");
    let chunk = vec![0u8; 64 << 10];
    loop {
        match file.write(&chunk) {
            Ok(0) => panic!("write returned 0 before the disk was full"),
            Ok(_) => {}
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(nix::libc::ENOSPC), "filling {}: {e}", path.display());
                break;
            }
        }
    }
}

/// After a failed save: no partial directory, every earlier checkpoint
/// verifies and holds its data, and the newest of them loads.
fn assert_earlier_checkpoints_intact(store: &CheckpointStore, saved: &[u64]) {
    assert_eq!(leftovers(store.dir()), Vec::<String>::new(), "a partial save was left behind");
    let mut newest_first = saved.to_vec();
    newest_first.reverse();
    assert_eq!(valid_steps(store), newest_first);
    for &step in saved {
        let loaded = rekindle::checkpoint::load_dir(&store.step_dir(step)).unwrap();
        assert!(loaded.snapshot == snapshot(step), "checkpoint {step} changed");
    }
    let latest = store.load_latest().unwrap();
    assert!(latest.rejected.is_empty());
    assert_eq!(latest.loaded.unwrap().snapshot.step, *saved.last().unwrap());
}

fn expect_enospc_write(err: &CheckpointError, step: u64, file: &str) {
    match err {
        CheckpointError::Write { step: s, path, source } => {
            assert_eq!(*s, step);
            assert!(path.ends_with(file), "error names {} instead of {file}", path.display());
            assert_eq!(source.raw_os_error(), Some(nix::libc::ENOSPC), "{err}");
        }
        other => panic!("expected CheckpointError::Write with ENOSPC, got {other:?}"),
    }
    let message = err.to_string();
    assert!(message.contains("(disk full)"), "message lacks the disk-full hint: {message}");
    assert!(message.contains("earlier checkpoints are untouched"), "{message}");
}

#[test]
fn saving_until_the_disk_is_full_fails_the_space_check_and_keeps_earlier_checkpoints() {
    let scenario = fail::FailScenario::setup();
    let Some(tmpfs) = tmpfs_or_skip("4m") else { return };
    // Keep everything: rotation must not make room behind the test's back.
    let store = CheckpointStore::open(tmpfs.path.join("checkpoints"), 1000).unwrap();
    let mut saved = Vec::new();
    let err = loop {
        let step = saved.len() as u64 + 1;
        assert!(step <= 20, "a 4 MiB tmpfs took 20 checkpoints of {PAYLOAD} bytes: the space check never fired");
        match store.save(&snapshot(step)) {
            Ok(_) => saved.push(step),
            Err(e) => break e,
        }
    };
    assert!(saved.len() >= 2, "expected a few checkpoints to fit before the disk filled up, got {saved:?}");
    let failed_step = saved.len() as u64 + 1;
    match &err {
        CheckpointError::NoSpace { step, path, needed, available } => {
            assert_eq!(*step, failed_step);
            assert_eq!(path, store.dir());
            assert!(needed > available, "NoSpace with {needed} needed and {available} available");
            assert!(*needed > PAYLOAD as u64, "needed {needed} is less than the tensors alone");
        }
        other => panic!("expected CheckpointError::NoSpace, got {other:?}"),
    }
    assert!(err.to_string().contains("free space"), "the message says what to do: {err}");
    assert!(!store.step_dir(failed_step).exists());
    assert_earlier_checkpoints_intact(&store, &saved);
    drop(tmpfs);
    scenario.teardown();
}

/// The free-space pre-check on any machine, root or not: the filesystem's
/// answer is replaced by the `fs::available_space` failpoint (the
/// tmpfs test above checks the same against a real full filesystem).
#[test]
fn the_free_space_pre_check_refuses_a_save_that_does_not_fit_before_writing_anything() {
    let scenario = fail::FailScenario::setup();
    let tmp = tempfile::tempdir().unwrap();
    let store = CheckpointStore::open(tmp.path().join("checkpoints"), 3).unwrap();
    store.save(&snapshot(1)).unwrap();
    // One byte short of the payload alone (the check adds 1 MiB of slack).
    fail::cfg("fs::available_space", &format!("return({})", PAYLOAD - 1)).unwrap();
    let err = store.save(&snapshot(2)).expect_err("a save that does not fit");
    fail::remove("fs::available_space");
    match &err {
        CheckpointError::NoSpace { step, path, needed, available } => {
            assert_eq!((*step, path, *available), (2, &store.dir().to_path_buf(), PAYLOAD as u64 - 1));
            assert!(*needed > PAYLOAD as u64 + (1 << 20), "needed {needed}: payload plus 1 MiB of slack");
        }
        other => panic!("expected CheckpointError::NoSpace, got {other:?}"),
    }
    let message = err.to_string();
    assert!(message.contains("not enough free space") && message.contains("earlier checkpoints are untouched"));
    assert!(!store.step_dir(2).exists());
    assert_earlier_checkpoints_intact(&store, &[1]);
    // Exactly enough passes.
    let needed = match err {
        CheckpointError::NoSpace { needed, .. } => needed,
        _ => unreachable!(),
    };
    fail::cfg("fs::available_space", &format!("return({needed})")).unwrap();
    let saved = store.save(&snapshot(2));
    fail::remove("fs::available_space");
    saved.unwrap();
    assert_earlier_checkpoints_intact(&store, &[1, 2]);
    scenario.teardown();
}

#[test]
fn disk_filling_up_during_the_write_fails_with_enospc_and_removes_the_partial_save() {
    let scenario = fail::FailScenario::setup();
    let Some(tmpfs) = tmpfs_or_skip("4m") else { return };
    let store = CheckpointStore::open(tmpfs.path.join("checkpoints"), 3).unwrap();
    store.save(&snapshot(1)).unwrap();

    // The space check passes; then another writer takes every free block
    // before the optimizer file is written, so the kernel itself says ENOSPC.
    let filler = tmpfs.path.join("filler");
    let fill_at = filler.clone();
    fail::cfg_callback(format!("checkpoint::before_write::{OPTIMIZER_FILE}"), move || fill_disk(&fill_at)).unwrap();
    let result = store.save(&snapshot(2));
    fail::remove(format!("checkpoint::before_write::{OPTIMIZER_FILE}"));
    assert!(filler.exists(), "the disk was never filled: the failpoint did not run");
    let err = result.expect_err("the save cannot succeed on a full disk");
    // The files are written in parallel: once the disk is full, whichever
    // write needs a block next gets ENOSPC first (the model file when it was
    // still being written, else the optimizer's). Either is the truth.
    let failed = match &err {
        CheckpointError::Write { path, .. } => path.file_name().map(|n| n.to_string_lossy().into_owned()),
        _ => None,
    };
    let file = if failed.as_deref() == Some(MODEL_FILE) { MODEL_FILE } else { OPTIMIZER_FILE };
    expect_enospc_write(&err, 2, file);
    assert!(!store.step_dir(2).exists());
    assert_earlier_checkpoints_intact(&store, &[1]);

    // Once space is freed the same step saves normally.
    fs::remove_file(&filler).unwrap();
    store.save(&snapshot(2)).unwrap();
    assert_earlier_checkpoints_intact(&store, &[1, 2]);
    drop(tmpfs);
    scenario.teardown();
}

#[test]
fn injected_enospc_at_fsync_is_reported_as_disk_full_and_keeps_earlier_checkpoints() {
    let scenario = fail::FailScenario::setup();
    let tmp = tempfile::tempdir().unwrap();
    let store = CheckpointStore::open(tmp.path().join("checkpoints"), 3).unwrap();
    store.save(&snapshot(1)).unwrap();
    store.save(&snapshot(2)).unwrap();

    let point = format!("checkpoint::before_fsync::{MODEL_FILE}");
    fail::cfg(&point, "return(ENOSPC)").unwrap();
    let result = store.save(&snapshot(3));
    fail::remove(&point);
    expect_enospc_write(&result.expect_err("the injected ENOSPC fails the save"), 3, MODEL_FILE);
    assert!(!store.step_dir(3).exists());
    assert_earlier_checkpoints_intact(&store, &[1, 2]);

    store.save(&snapshot(3)).unwrap();
    assert_earlier_checkpoints_intact(&store, &[1, 2, 3]);
    scenario.teardown();
}
