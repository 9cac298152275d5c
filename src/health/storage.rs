//! The checks of where a run keeps its state, seen from this node: free
//! space for a checkpoint, and a real checkpoint written, verified and
//! read back beside the checkpoint directory.

use std::path::Path;
use std::time::Instant;

use crate::checkpoint::{CheckpointStore, HostTensor, Snapshot, TensorSet, VerifyLevel};
use crate::gpu::{free_disk_bytes, nearest_existing};
use crate::units::mib_or_gib;

use super::checklist::{CheckStatus, Checklist};

pub(crate) fn check_disk(list: &mut Checklist, dir: &Path, expected: Option<u64>) {
    let free = match free_disk_bytes(dir) {
        Ok(free) => free,
        Err(e) => {
            list.push(
                "free disk",
                CheckStatus::Fail,
                true,
                format!("cannot read free space for {}: {e}", dir.display()),
            );
            return;
        }
    };
    let place = format!("{} free on the filesystem of {}", mib_or_gib(free), dir.display());
    match expected {
        None => list.push("free disk", CheckStatus::Ok, true, format!("{place} (checkpoint size unknown)")),
        Some(need) if free < need => list.push(
            "free disk",
            CheckStatus::Fail,
            true,
            format!(
                "{place}, but one checkpoint needs about {}: free space or move [checkpoint] dir",
                mib_or_gib(need)
            ),
        ),
        // The next checkpoint is written before an old one rotates out.
        Some(need) if free < need.saturating_mul(2) => list.push(
            "free disk",
            CheckStatus::Warn,
            true,
            format!("{place}: room for one checkpoint of about {} but not two", mib_or_gib(need)),
        ),
        Some(need) => list.push(
            "free disk",
            CheckStatus::Ok,
            true,
            format!("{place}; a checkpoint needs about {}", mib_or_gib(need)),
        ),
    }
}

/// How the place of the checkpoints is tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageProbe {
    /// `rekindle doctor`: a tiny checkpoint saved, verified and loaded with
    /// the real store (`checkpoint round-trip`).
    RoundTrip,
    /// The start of an attempt: a file written, fsynced, renamed and
    /// removed beside the checkpoints (`checkpoint directory`); the
    /// attempt's own first save is the round trip, and a check must not
    /// cost what a save does.
    Write,
}

/// The directory the probes work in: the nearest existing ancestor of the
/// checkpoint directory's parent (same filesystem as the checkpoints).
fn probe_base(ckpt_dir: &Path) -> Result<std::path::PathBuf, String> {
    let parent = ckpt_dir.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    nearest_existing(parent).map_err(|e| format!("{}: {e}", parent.display()))
}

/// Writes, fsyncs, renames and removes a small file beside the checkpoint
/// directory: it is writable, and the filesystem answers.
pub(crate) fn check_writable(list: &mut Checklist, ckpt_dir: &Path) {
    let name = "checkpoint directory";
    let base = match probe_base(ckpt_dir) {
        Ok(base) => base,
        Err(e) => return list.push(name, CheckStatus::Fail, true, e),
    };
    let started = Instant::now();
    let written = (|| -> std::io::Result<()> {
        use std::io::Write;
        let mut file = tempfile::Builder::new().prefix(".rekindle-health-").tempfile_in(&base)?;
        file.write_all(&[0u8; 64 << 10])?;
        file.as_file().sync_all()?;
        // Renamed to a name as unique as the temporary one: the ranks of
        // every node check the same shared directory at once, and their
        // pids may be alike (containers).
        let target = file.path().with_extension("renamed");
        let persisted = file.persist(&target).map_err(|e| e.error)?;
        drop(persisted);
        std::fs::remove_file(&target)
    })();
    match written {
        Ok(()) => list.push(
            name,
            CheckStatus::Ok,
            true,
            format!(
                "wrote, fsynced, renamed and removed a 64 KiB file in {} in {:.1} ms",
                base.display(),
                started.elapsed().as_secs_f64() * 1000.0
            ),
        ),
        Err(e) => list.push(name, CheckStatus::Fail, true, format!("cannot write a file in {}: {e}", base.display())),
    }
}

/// Saves, verifies and loads a tiny checkpoint with the real store in a
/// temporary directory beside the checkpoint directory (same filesystem),
/// then removes it.
pub(crate) fn check_round_trip(list: &mut Checklist, ckpt_dir: &Path) {
    let name = "checkpoint round-trip";
    let base = match probe_base(ckpt_dir) {
        Ok(base) => base,
        Err(e) => return list.push(name, CheckStatus::Fail, true, e),
    };
    let tmp = match tempfile::Builder::new().prefix(".rekindle-doctor-").tempdir_in(&base) {
        Ok(tmp) => tmp,
        Err(e) => {
            return list.push(
                name,
                CheckStatus::Fail,
                true,
                format!("cannot create a directory in {}: {e}", base.display()),
            );
        }
    };
    match round_trip(&tmp.path().join("checkpoints")) {
        Ok(detail) => list.push(name, CheckStatus::Ok, true, format!("{detail} in {}", base.display())),
        Err(e) => list.push(name, CheckStatus::Fail, true, format!("in {}: {e}", base.display())),
    }
}

fn round_trip(dir: &Path) -> Result<String, String> {
    let started = Instant::now();
    let model: TensorSet = [("w".to_string(), HostTensor::from_f32(vec![2, 2], &[1.0, -2.0, 3.5, 0.25]))].into();
    let optimizer: TensorSet = [("w.m".to_string(), HostTensor::from_f32(vec![2, 2], &[0.0; 4]))].into();
    let snapshot = Snapshot { step: 1, model, optimizer, state: serde_json::json!({"doctor": true}) };
    let store = CheckpointStore::open(dir, 1).map_err(|e| e.to_string())?;
    let report = store.save(&snapshot).map_err(|e| format!("save failed: {e}"))?;
    let listed = store.list(VerifyLevel::Full).map_err(|e| e.to_string())?;
    if !listed.iter().any(|c| c.valid && c.step == 1) {
        return Err("the saved checkpoint does not verify".into());
    }
    let loaded = store.load_latest().map_err(|e| e.to_string())?.loaded.ok_or("the saved checkpoint did not load")?;
    if loaded.snapshot != snapshot {
        return Err("the loaded checkpoint differs from what was saved".into());
    }
    Ok(format!(
        "wrote, fsynced, renamed, verified and reloaded a {}-byte checkpoint in {:.1} ms",
        report.bytes,
        started.elapsed().as_secs_f64() * 1000.0
    ))
}
