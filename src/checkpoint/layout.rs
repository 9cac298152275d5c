//! What a checkpoint is, on disk and in memory: the files of format 1, the
//! `step-<10 digits>` directory names, and the [`Snapshot`] they hold. The
//! lowest file of the store: the commit protocol (`store.rs`) and
//! verification (`verify.rs`) both build on it.

use super::tensor::{TensorSet, payload_bytes};

/// Parameters by name.
pub const MODEL_FILE: &str = "model.safetensors";
/// Optimizer state by parameter name.
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
/// Step, cursor, RNG, scaler, schedule, metrics, host/job info.
pub const STATE_FILE: &str = "state.json";
/// The files every format-1 checkpoint holds besides its manifest.
pub const REQUIRED_FILES: [&str; 3] = [MODEL_FILE, OPTIMIZER_FILE, STATE_FILE];

const STEP_PREFIX: &str = "step-";

/// Everything a checkpoint holds, in host memory.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    pub step: u64,
    pub model: TensorSet,
    pub optimizer: TensorSet,
    /// Everything that is not a tensor; written as `state.json`.
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

/// The step of a `step-<digits>` directory name.
pub fn parse_step_dir_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(STEP_PREFIX)?;
    (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())).then(|| digits.parse().ok()).flatten()
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
    }
}
