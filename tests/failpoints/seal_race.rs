//! A program under `rekindle exec` owns its staged directory and may change
//! it while `rekindle seal` works (issue #27): swapped for a symlink to a
//! directory outside the run, or a file swapped for a FIFO. The seal must
//! refuse, write nothing outside, never commit a checkpoint that is a link,
//! and never block. The swaps happen at the failpoints in
//! `crates/checkpoint/src/files.rs`, through callbacks.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rekindle::checkpoint::{CheckpointError, CheckpointStore, MANIFEST_FILE};

fn staged_store() -> (tempfile::TempDir, CheckpointStore, PathBuf, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let store = CheckpointStore::open(tmp.path().join("checkpoints"), 3).unwrap();
    store.reset_staging().unwrap();
    let staged = store.staging_dir().join("s");
    fs::create_dir_all(&staged).unwrap();
    fs::write(staged.join("w.bin"), b"weights").unwrap();
    let outside = tmp.path().join("outside");
    fs::create_dir_all(&outside).unwrap();
    fs::write(outside.join("w.bin"), b"not the program's").unwrap();
    (tmp, store, staged, outside)
}

#[test]
fn a_staged_directory_swapped_for_a_symlink_before_the_move_is_refused_and_nothing_is_written_outside() {
    let scenario = fail::FailScenario::setup();
    let (_tmp, store, staged, outside) = staged_store();
    let (s, o) = (staged.clone(), outside.clone());
    fail::cfg_callback("checkpoint::seal::before_move", move || {
        fs::rename(&s, s.with_extension("away")).unwrap();
        symlink(&o, &s).unwrap();
    })
    .unwrap();
    let err = store.seal(&staged, 1).unwrap_err();
    scenario.teardown();
    assert!(matches!(err, CheckpointError::Seal { .. }), "{err}");
    assert!(err.to_string().contains("swapped while it was sealed"), "{err}");
    assert!(!outside.join(MANIFEST_FILE).exists(), "no manifest written into the link's target");
    assert_eq!(fs::read(outside.join("w.bin")).unwrap(), b"not the program's");
    assert!(fs::symlink_metadata(&staged).unwrap().file_type().is_symlink(), "the link was moved back as it was");
    let names: Vec<String> =
        fs::read_dir(store.dir()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert!(names.iter().all(|n| !n.starts_with("step-") && !n.starts_with(".tmp-")), "nothing committed: {names:?}");
}

#[test]
fn a_staged_file_swapped_for_a_fifo_is_refused_without_blocking_and_left_staged() {
    let scenario = fail::FailScenario::setup();
    let (_tmp, store, staged, _outside) = staged_store();
    let dir = store.dir().to_path_buf();
    let swapped = Arc::new(Mutex::new(None));
    let seen = swapped.clone();
    fail::cfg_callback("checkpoint::seal::after_list", move || {
        let sealing = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.file_name().unwrap().to_string_lossy().starts_with(".tmp-seal-"))
            .expect("the staged directory is sealed under rekindle's own name");
        fs::remove_file(sealing.join("w.bin")).unwrap();
        nix::unistd::mkfifo(&sealing.join("w.bin"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        *seen.lock().unwrap() = Some(sealing);
    })
    .unwrap();
    let started = Instant::now();
    let err = store.seal(&staged, 1).unwrap_err();
    scenario.teardown();
    assert!(started.elapsed() < Duration::from_secs(10), "never blocked on the FIFO");
    assert!(err.to_string().contains("is a FIFO"), "{err}");
    assert!(swapped.lock().unwrap().is_some());
    assert!(staged.is_dir() && !staged.join(MANIFEST_FILE).exists(), "moved back, unsealed");
    assert!(!store.step_dir(1).exists());
}
