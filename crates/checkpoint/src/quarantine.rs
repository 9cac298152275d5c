//! Quarantine: where a checkpoint goes when a run looking for one to resume
//! from finds that it does not verify (a hash that no longer matches, a torn
//! copy, a missing file). It is moved, not deleted: the damage is evidence,
//! and a checkpoint that only failed to read (a flaky network filesystem) can
//! be moved back by hand.
//!
//! A quarantined checkpoint lives in `<checkpoints>/quarantine/`, under
//! `step-<10 digits>-<UTC time, YYYYMMDDTHHMMSSZ>` (and `-<n>` when that name
//! is taken). Nothing that looks for checkpoints looks there: listing,
//! loading and rotation read only the `step-<10 digits>` entries of the
//! checkpoints directory itself, and a quarantined name is not one of those
//! even if it were. So a damaged checkpoint is never counted as valid again
//! (by the size-only check of rotation, say) and never deleted by rotation.
//! `rekindle checkpoints` and `rekindle verify` list them apart.
//!
//! Everything here goes through the checkpoints directory's handle
//! ([`Dir`]): a `quarantine` that is a link (or a checkpoint swapped for one)
//! is refused, never followed, so a damaged checkpoint never leaves the run.

use std::path::PathBuf;

use chrono::{DateTime, Utc};

use super::error::{CheckpointError, FileFailure};
use super::layout::{parse_step_dir_name, step_dir_name};
use super::verify::{CheckpointInfo, VerifyLevel, inspect_at, read_manifest_at, unopened};
use crate::confine::Dir;

/// The directory inside the checkpoints directory that holds quarantined checkpoints.
pub const QUARANTINE_DIR: &str = "quarantine";

/// A checkpoint that failed verification at resume, and where it was moved.
#[derive(Debug)]
pub struct Quarantined {
    pub step: u64,
    /// Where it was (`…/checkpoints/step-…`).
    pub dir: PathBuf,
    /// What failed, file by file.
    pub failures: Vec<FileFailure>,
    /// Its new path, or why it could not be moved (it then stays where it was).
    pub moved_to: Result<PathBuf, CheckpointError>,
}

impl Quarantined {
    /// The failures as one line: `model.safetensors: sha256 mismatch: …; …`.
    pub fn reason(&self) -> String {
        self.failures.iter().map(|f| f.to_string()).collect::<Vec<_>>().join("; ")
    }
}

/// `step-0000000300-20261123T134501Z`, or with `-<n>` for the `n`-th
/// quarantine of the same step in the same second (`n` ≥ 2).
pub fn quarantine_name(step: u64, at: DateTime<Utc>, n: u32) -> String {
    let base = format!("{}-{}", step_dir_name(step), at.format("%Y%m%dT%H%M%SZ"));
    if n <= 1 { base } else { format!("{base}-{n}") }
}

/// The step of a quarantined checkpoint's name (`step-<10 digits>-…`).
pub fn parse_quarantine_name(name: &str) -> Option<u64> {
    let (step_part, rest) = name.split_at_checked(15)?;
    rest.starts_with('-').then(|| parse_step_dir_name(step_part)).flatten()
}

/// Moves the checkpoint directory of `step` (`step-<10 digits>` of the
/// checkpoints directory `checkpoints`) into `quarantine/` under a name no
/// other quarantined checkpoint has, durably (both directories are synced).
/// Returns its new path.
pub(super) fn move_to_quarantine(checkpoints: &Dir, step: u64) -> Result<PathBuf, CheckpointError> {
    let from = step_dir_name(step);
    let now = Utc::now();
    let to = (1..)
        .map(|n| format!("{QUARANTINE_DIR}/{}", quarantine_name(step, now, n)))
        .find(|p| !checkpoints.exists(p))
        .expect("an unused quarantine name exists");
    let failed =
        |source| CheckpointError::Quarantine { dir: checkpoints.shown(&from), to: checkpoints.shown(&to), source };
    // Never into a link to elsewhere: the checkpoint would leave the run.
    if !checkpoints.own_dir(QUARANTINE_DIR).map_err(failed)? {
        checkpoints.create_dir(QUARANTINE_DIR, 0o777).map_err(failed)?;
    }
    let qdir = checkpoints.open_dir(QUARANTINE_DIR).map_err(failed)?;
    checkpoints.rename(&from, &to).map_err(failed)?;
    checkpoints.sync().map_err(failed)?;
    qdir.sync().map_err(failed)?;
    Ok(checkpoints.shown(&to))
}

/// Every quarantined checkpoint in `checkpoints/quarantine/`, newest step
/// first (then newest quarantine first), with what verification at `level`
/// finds now. Entries that are not directories are ignored.
pub(super) fn list_quarantined(checkpoints: &Dir, level: VerifyLevel) -> Result<Vec<CheckpointInfo>, CheckpointError> {
    let qdir = checkpoints.shown(QUARANTINE_DIR);
    match checkpoints.own_dir(QUARANTINE_DIR) {
        Ok(true) => {}
        Ok(false) => return Ok(Vec::new()),
        Err(e) => {
            tracing::warn!(error = %e, "quarantined checkpoints not listed");
            return Ok(Vec::new());
        }
    }
    let list_err = |source| CheckpointError::ListDir { path: qdir.clone(), source };
    let mut found = Vec::new();
    for entry in checkpoints.entries(QUARANTINE_DIR).map_err(list_err)? {
        if !entry.kind.is_dir() {
            continue;
        }
        let name = entry.name_lossy();
        let path = qdir.join(&entry.name);
        // Through the checkpoints directory's handle: a directory swapped
        // for a link since it was listed is refused, not read through.
        let held = checkpoints.open_dir(std::path::Path::new(QUARANTINE_DIR).join(&entry.name));
        // A directory put here by hand may be named anything: its manifest then says the step.
        let manifest_step = || held.as_ref().ok().and_then(|d| read_manifest_at(d).ok()).map(|m| m.step);
        let step = parse_quarantine_name(&name).or_else(manifest_step).unwrap_or(0);
        let info = match &held {
            Ok(d) => inspect_at(d, step, level),
            Err(e) => unopened(path, step, e),
        };
        found.push((name, info));
    }
    found.sort_by(|(na, a), (nb, b)| b.step.cmp(&a.step).then(nb.cmp(na)));
    Ok(found.into_iter().map(|(_, info)| info).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quarantine_names_carry_the_step_and_the_time_and_never_parse_as_checkpoints() {
        let at = DateTime::parse_from_rfc3339("2026-11-23T13:45:01.250Z").unwrap().with_timezone(&Utc);
        let name = quarantine_name(300, at, 1);
        assert_eq!(name, "step-0000000300-20261123T134501Z");
        assert_eq!(quarantine_name(300, at, 3), "step-0000000300-20261123T134501Z-3");
        assert_eq!(parse_quarantine_name(&name), Some(300));
        assert_eq!(parse_quarantine_name("step-0000000300-20261123T134501Z-3"), Some(300));
        assert_eq!(parse_step_dir_name(&name), None, "a quarantined name is never a checkpoint name");
        assert_eq!(parse_quarantine_name("step-0000000300"), None);
        assert_eq!(parse_quarantine_name("notes.txt"), None);
        assert_eq!(parse_quarantine_name("stép-000000030-x"), None);
    }
}
