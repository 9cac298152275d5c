//! Checkpoints written in parts (`parts.rs`) through the store: rank 0's
//! [`CheckpointStore::save_with`] and the other ranks'
//! [`CheckpointStore::write_share`], here from threads of one process (the
//! ranks of a real world: tests/it/distributed.rs).

use std::fs;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::error::{CheckpointError, Problem};
use super::layout::{STATE_FILE, Snapshot};
use super::manifest::{MANIFEST_FILE, Manifest, ManifestEntry};
use super::parts::optimizer_part_name;
use super::persist::PartsError;
use super::store::{CheckpointStore, Parts};
use super::tensor::{HostTensor, TensorSet};
use super::verify::{VerifyLevel, verify_checkpoint_dir};
use super::write_mode::WriteSettings;

/// Parameters a (2×2) and b (3): flattened a0..a3 b0..b2, cut for three
/// ranks as 3 + 2 + 2 (what `distributed::chunk_bounds` gives for 7).
const CUTS: [&[(&str, usize, usize)]; 3] = [&[("a", 0, 3)], &[("a", 3, 4), ("b", 0, 1)], &[("b", 1, 3)]];

fn moment(i: usize, second: bool) -> f32 {
    if second { 100.0 + i as f32 } else { i as f32 }
}

fn model() -> TensorSet {
    TensorSet::from([
        ("a".into(), HostTensor::from_f32(vec![2, 2], &[1.0, 2.0, 3.0, 4.0])),
        ("b".into(), HostTensor::from_f32(vec![3], &[5.0, 6.0, 7.0])),
    ])
}

/// The whole moments, as an unsharded optimizer would save them.
fn whole_moments() -> TensorSet {
    let values = |at: usize, n: usize, second| (at..at + n).map(|i| moment(i, second)).collect::<Vec<_>>();
    TensorSet::from([
        ("exp_avg.a".into(), HostTensor::from_f32(vec![2, 2], &values(0, 4, false))),
        ("exp_avg_sq.a".into(), HostTensor::from_f32(vec![2, 2], &values(0, 4, true))),
        ("exp_avg.b".into(), HostTensor::from_f32(vec![3], &values(4, 3, false))),
        ("exp_avg_sq.b".into(), HostTensor::from_f32(vec![3], &values(4, 3, true))),
    ])
}

/// Rank `rank`'s part: its pieces of both moments, 1-D.
fn part(rank: usize) -> TensorSet {
    let mut set = TensorSet::new();
    for (param, lo, hi) in CUTS[rank] {
        let at = if *param == "a" { 0 } else { 4 };
        for (name, second) in [(format!("exp_avg.{param}"), false), (format!("exp_avg_sq.{param}"), true)] {
            let values: Vec<f32> = (at + lo..at + hi).map(|i| moment(i, second)).collect();
            set.insert(name, HostTensor::from_f32(vec![hi - lo], &values));
        }
    }
    set
}

fn snapshot(step: u64, optimizer: TensorSet) -> Snapshot {
    Snapshot { step, model: model(), optimizer, state: serde_json::json!({"step": step}) }
}

/// Shards of at most 8 bytes: the model's two tensors are cut among the
/// ranks (rank 0 and rank 2 write one each).
fn tiny_shards() -> WriteSettings {
    WriteSettings { shard_bytes: Some(8), ..WriteSettings::default() }
}

/// Ranks 1 and 2 writing their shares from their own view of the
/// checkpoints directory, as followers do, with the default shard size.
fn other_ranks(dir: &Path, staging: &str, step: u64) -> Result<Vec<ManifestEntry>, PartsError> {
    other_ranks_with(dir, staging, step, WriteSettings::default())
}

fn other_ranks_with(
    dir: &Path,
    staging: &str,
    step: u64,
    settings: WriteSettings,
) -> Result<Vec<ManifestEntry>, PartsError> {
    let follower = CheckpointStore::open_read_only(dir).with_write_settings(settings);
    std::thread::scope(|s| {
        let writers: Vec<_> = (1..3)
            .map(|r| {
                let follower = &follower;
                s.spawn(move || follower.write_share(staging, r, 3, &snapshot(step, part(r)), true))
            })
            .collect();
        writers
            .into_iter()
            .zip(1..)
            .map(|(w, rank)| w.join().unwrap().map_err(|e| PartsError::RankFailed { rank, error: e.to_string() }))
            .collect::<Result<Vec<Vec<ManifestEntry>>, _>>()
            .map(|shares| shares.concat())
    })
}

fn leftovers(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.') && n != crate::confine::MARKER_FILE)
        .collect()
}

#[test]
fn three_ranks_parts_commit_as_one_checkpoint_that_loads_as_the_whole_state() {
    let tmp = tempfile::tempdir().unwrap();
    let store = CheckpointStore::open(tmp.path(), 3).unwrap().with_write_settings(tiny_shards());
    let staging = store.new_shared_staging(12, "test").unwrap();
    let staging = staging.as_str();
    let mut collect = || other_ranks_with(tmp.path(), staging, 12, tiny_shards());
    let parts = Parts { staging: staging.into(), world: 3, optimizer_in_parts: true, collect: &mut collect };
    store.save_with(&snapshot(12, part(0)), Some(parts)).unwrap();

    let dir = store.step_dir(12);
    let manifest = Manifest::parse(&fs::read(dir.join(MANIFEST_FILE)).unwrap()).unwrap();
    let mut names: Vec<&str> = manifest.files.iter().map(|f| f.name.as_str()).collect();
    names.sort_unstable();
    // The model's two tensors are two shards (one per rank where there
    // are tensors enough), written by the ranks whose share of the bytes
    // holds them: 0 and 2. Rank 0 also writes the index.
    let expected = [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "optimizer.rank-00000-of-00003.safetensors",
        "optimizer.rank-00001-of-00003.safetensors",
        "optimizer.rank-00002-of-00003.safetensors",
        STATE_FILE,
    ];
    assert_eq!(names, expected);
    assert_eq!(manifest.optimizer_parts(), Some(3));
    assert_eq!(manifest.shards("model"), Some(2));
    assert_eq!(manifest.format_version, crate::SHARDED_FORMAT_VERSION);
    assert!(verify_checkpoint_dir(&dir, VerifyLevel::Full).is_empty());
    assert!(leftovers(tmp.path()).is_empty(), "the staging directory became the checkpoint");
    let loaded = store.load_latest().unwrap().loaded.unwrap();
    assert_eq!(loaded.snapshot, snapshot(12, whole_moments()), "the moments reassembled in rank order");

    // Every part is hashed like any file: a damaged one is named.
    let damaged = dir.join(optimizer_part_name(2, 3));
    let mut bytes = fs::read(&damaged).unwrap();
    *bytes.last_mut().unwrap() ^= 1;
    fs::write(&damaged, bytes).unwrap();
    let failures = verify_checkpoint_dir(&dir, VerifyLevel::Full);
    assert_eq!(failures.len(), 1);
    assert_eq!(failures[0].file, optimizer_part_name(2, 3));
    assert!(matches!(failures[0].problem, Problem::Sha256Mismatch { .. }));
}

#[test]
fn a_manifest_without_every_ranks_part_is_no_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let store = CheckpointStore::open(tmp.path(), 3).unwrap();
    let staging = store.new_shared_staging(4, "test").unwrap();
    let staging = staging.as_str();
    let mut collect = || other_ranks(tmp.path(), staging, 4);
    store
        .save_with(
            &snapshot(4, part(0)),
            Some(Parts { staging: staging.into(), world: 3, optimizer_in_parts: true, collect: &mut collect }),
        )
        .unwrap();
    let path = store.step_dir(4).join(MANIFEST_FILE);
    let mut manifest = Manifest::parse(&fs::read(&path).unwrap()).unwrap();
    manifest.files.retain(|f| f.name != optimizer_part_name(1, 3));
    fs::write(&path, manifest.to_bytes()).unwrap();
    let failures = verify_checkpoint_dir(&store.step_dir(4), VerifyLevel::Quick);
    assert_eq!(failures.len(), 1);
    let reason = failures[0].to_string();
    assert!(reason.contains("does not list `optimizer.rank-00001-of-00003.safetensors`"), "{reason}");
}

#[test]
fn a_rank_that_cannot_write_its_part_leaves_nothing_committed_and_no_staging() {
    let tmp = tempfile::tempdir().unwrap();
    let store = CheckpointStore::open(tmp.path(), 3).unwrap();
    store.save(&snapshot(1, whole_moments())).unwrap();
    let staging = store.new_shared_staging(2, "test").unwrap();
    let staging = staging.as_str();
    let mut collect = || {
        // Rank 1 wrote its part, rank 2 failed.
        let follower = CheckpointStore::open_read_only(tmp.path());
        follower.write_share(staging, 1, 3, &snapshot(2, part(1)), true).unwrap();
        Err(PartsError::RankFailed { rank: 2, error: "disk full".into() })
    };
    let err = store
        .save_with(
            &snapshot(2, part(0)),
            Some(Parts { staging: staging.into(), world: 3, optimizer_in_parts: true, collect: &mut collect }),
        )
        .unwrap_err();
    assert!(matches!(err, CheckpointError::Parts { step: 2, .. }), "{err}");
    assert!(err.to_string().contains("rank 2") && err.to_string().contains("nothing was committed"), "{err}");
    assert!(!store.step_dir(2).exists());
    assert!(leftovers(tmp.path()).is_empty(), "{:?}", leftovers(tmp.path()));
    assert_eq!(store.load_latest().unwrap().loaded.unwrap().snapshot.step, 1, "the earlier checkpoint is intact");
}

#[test]
fn a_save_that_fails_before_the_parts_waits_for_them_then_removes_them() {
    let tmp = tempfile::tempdir().unwrap();
    let store = CheckpointStore::open(tmp.path(), 3).unwrap();
    let staging = store.new_shared_staging(3, "test").unwrap();
    let staging = staging.as_str();
    let mut bad = snapshot(3, part(0));
    bad.model.get_mut("a").unwrap().shape = vec![5];
    let calls = AtomicUsize::new(0);
    let mut collect = || {
        calls.fetch_add(1, Ordering::SeqCst);
        other_ranks(tmp.path(), staging, 3)
    };
    let err = store
        .save_with(
            &bad,
            Some(Parts { staging: staging.into(), world: 3, optimizer_in_parts: true, collect: &mut collect }),
        )
        .unwrap_err();
    assert!(matches!(err, CheckpointError::BadTensor { .. }), "{err}");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the other ranks are waited for exactly once");
    assert!(leftovers(tmp.path()).is_empty(), "what they wrote is removed: {:?}", leftovers(tmp.path()));
    assert!(store.list(VerifyLevel::Quick).unwrap().is_empty());
}

#[test]
fn a_part_is_written_only_into_a_staging_directory_of_the_checkpoints_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let store = CheckpointStore::open_read_only(tmp.path());
    for bad in ["../elsewhere", "step-0000000001", ".tmp-a/b", "", "/tmp/.tmp-x"] {
        let err = store.write_share(bad, 1, 2, &snapshot(1, part(1)), true).unwrap_err();
        assert!(matches!(err, CheckpointError::Parts { .. }), "{bad:?}: {err}");
    }
    // Only rank 0 makes the directory: a part late for a save already
    // committed (or abandoned) has nowhere to go.
    let err = store.write_share(".tmp-step-0000000001-ranks-x-0", 1, 2, &snapshot(1, part(1)), true).unwrap_err();
    assert!(err.to_string().contains("is gone"), "{err}");
    assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 0);
}

#[test]
fn rank_0_commits_only_parts_that_are_in_the_staging_directory_as_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let store = CheckpointStore::open(tmp.path(), 3).unwrap();
    for (step, lie) in [(5, "size"), (6, "absent")] {
        let staging = store.new_shared_staging(step, "test").unwrap();
        let mut collect = || {
            let mut entries = other_ranks(tmp.path(), &staging, step)?;
            match lie {
                "size" => entries[1].bytes += 1,
                _ => fs::remove_file(tmp.path().join(&staging).join(&entries[0].name)).unwrap(),
            }
            Ok(entries)
        };
        let parts = Parts { staging: staging.clone(), world: 3, optimizer_in_parts: true, collect: &mut collect };
        let err = store.save_with(&snapshot(step, part(0)), Some(parts)).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, CheckpointError::Parts { .. }), "{text}");
        let rank = if lie == "size" { "rank 2" } else { "rank 1" };
        assert!(text.contains(rank), "{lie}: {text}");
        assert!(!store.step_dir(step).exists() && leftovers(tmp.path()).is_empty(), "{lie}");
    }
}
