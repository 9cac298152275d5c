//! What a checkpoint is, on disk and in memory: its kind, the files of format 1, the
//! `step-<10 digits>` directory names, and the [`Snapshot`] they hold. The
//! lowest file of the store: the commit protocol (`store.rs`) and
//! verification (`verify.rs`) both build on it.

use serde::{Deserialize, Serialize};

use super::tensor::{TensorSet, payload_bytes};

/// Parameters by name.
pub const MODEL_FILE: &str = "model.safetensors";
/// Optimizer state by parameter name.
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
/// Step, cursor, RNG, scaler, schedule, metrics, host/job info.
pub const STATE_FILE: &str = "state.json";
/// The files every format-1 checkpoint holds besides its manifest.
pub const REQUIRED_FILES: [&str; 3] = [MODEL_FILE, OPTIMIZER_FILE, STATE_FILE];

pub(super) const STEP_PREFIX: &str = "step-";

/// What a checkpoint holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointKind {
    /// rekindle's own training state (model, optimizer, `state.json`):
    /// written and resumed by `rekindle run`. Not written to the manifest,
    /// so manifests of this kind are those of every earlier version.
    #[default]
    Native,
    /// Any files a program staged and `rekindle seal` committed: resumed by
    /// `rekindle exec`, which hands the directory to the program.
    Files,
}

impl CheckpointKind {
    /// True for [`CheckpointKind::Native`] (the manifest then omits `kind`).
    pub fn is_native(&self) -> bool {
        *self == CheckpointKind::Native
    }

    /// The name the manifest and messages use.
    pub fn name(self) -> &'static str {
        match self {
            CheckpointKind::Native => "native",
            CheckpointKind::Files => "files",
        }
    }
}

/// Everything a checkpoint holds, in host memory: what the training engine
/// hands out (`Trainer::snapshot`) and what the store writes and loads, one
/// type for both, so nothing is copied field by field between them.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// Steps completed.
    pub step: u64,
    /// Parameters by name.
    pub model: TensorSet,
    /// Optimizer state by parameter name (`exp_avg.<param>`,
    /// `exp_avg_sq.<param>`), or this rank's part of it.
    pub optimizer: TensorSet,
    /// Everything that is not a tensor, as JSON; written as `state.json`.
    /// Opaque to the store. Out of the training engine it is the engine's
    /// own state (docs/determinism.md), which `rekindle run` wraps into its
    /// envelope (`run::envelope`) before saving.
    pub state: serde_json::Value,
}

impl Snapshot {
    /// Tensor payload bytes (what dominates the checkpoint's size).
    pub fn payload_bytes(&self) -> u64 {
        payload_bytes(&self.model) + payload_bytes(&self.optimizer)
    }
}

/// `step-0000001234`.
pub fn step_dir_name(step: u64) -> String {
    format!("{STEP_PREFIX}{step:010}")
}

/// The step of a checkpoint directory's name: only the canonical
/// `step-<10 digits>` ([`step_dir_name`]) is one. `step-3` or
/// `step-00000000003` name the same step but are not rekindle's, so they are
/// never taken for (or rotated in place of) the checkpoint of that step.
pub fn parse_step_dir_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(STEP_PREFIX)?;
    let step: u64 =
        (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())).then(|| digits.parse().ok())??;
    (step_dir_name(step) == name).then_some(step)
}

/// Makes `dir` a checkpoints directory of rekindle's
/// ([`crate::confine::claim_dir`]). Besides a new, empty or marked one, a
/// `[checkpoint] dir` from before the marker is recognised by a committed
/// checkpoint only rekindle writes: a `step-<10 digits>` directory whose
/// manifest reads as rekindle's. A `.staging`, `quarantine` or `.tmp-step-…`
/// name alone proves nothing (anyone may name a directory so), and a
/// directory of someone else's is refused before anything in it is written,
/// moved or removed. `inside_own_run` says it is the default `<run
/// dir>/checkpoints` of a run directory already claimed: a real directory
/// there is the run's by its name, but never a symbolic link (a link there
/// would take rekindle's writes and deletes to a directory it did not make;
/// `[checkpoint] dir` is how a run names one elsewhere).
pub fn claim_dir(dir: &std::path::Path, inside_own_run: bool) -> Result<(), crate::confine::ClaimError> {
    let what =
        if inside_own_run { "the checkpoints directory" } else { "the checkpoints directory ([checkpoint] dir)" };
    if inside_own_run
        && let Ok(meta) = std::fs::symlink_metadata(dir)
        && meta.file_type().is_symlink()
    {
        let target = std::fs::read_link(dir).map_or_else(|_| "?".into(), |t| t.display().to_string());
        return Err(crate::confine::ClaimError::Link { what, path: dir.to_path_buf(), target });
    }
    crate::confine::claim_dir(dir, what, |dir| {
        inside_own_run
            || std::fs::read_dir(dir).is_ok_and(|entries| {
                entries.flatten().any(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    e.file_type().is_ok_and(|t| t.is_dir())
                        && parse_step_dir_name(&name).is_some()
                        && super::verify::read_manifest(&e.path()).is_ok()
                })
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_dir_names_round_trip() {
        assert_eq!(step_dir_name(1234), "step-0000001234");
        assert_eq!(parse_step_dir_name("step-0000001234"), Some(1234));
        assert_eq!(parse_step_dir_name("step-"), None);
        assert_eq!(parse_step_dir_name("step-12a"), None);
        assert_eq!(parse_step_dir_name(".tmp-step-1"), None);
        assert_eq!(parse_step_dir_name("step-3"), None, "not the canonical name of step 3");
        assert_eq!(parse_step_dir_name("step-00000000003"), None);
        assert_eq!(parse_step_dir_name(&step_dir_name(12_345_678_901)), Some(12_345_678_901));
    }
}
