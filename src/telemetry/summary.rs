//! `summary.json`: how the last attempt ended and what the run has done so
//! far, rewritten atomically when an attempt finishes, stops or fails.

use serde::{Deserialize, Serialize};

/// How the attempt that wrote the summary ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SummaryState {
    /// Reached `max_steps`.
    Finished,
    /// Stopped with a durable checkpoint (signal or `--stop-at-step`).
    Stopped,
    /// Failed (its `error` event says why).
    Failed,
    /// A state this version does not know.
    #[default]
    #[serde(other)]
    Unknown,
}

/// `summary.json`. Read leniently: a missing field takes its default.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Summary {
    pub state: SummaryState,
    /// `[run] name`.
    pub run: String,
    /// Steps completed.
    pub steps: u64,
    /// `[run] max_steps`; `null` for `rekindle exec` when the config does not set it.
    pub max_steps: Option<u64>,
    /// Loss of the last step with a finite loss (`null`: none yet).
    pub final_loss: Option<f64>,
    pub best_loss: Option<f64>,
    pub wall_seconds_this_attempt: f64,
    pub steps_this_attempt: u64,
    /// Attempts that resumed from a checkpoint, over the whole run.
    pub resumes: u64,
    pub checkpoints_written_this_attempt: u64,
    /// Step of the newest durable checkpoint (`null`: none).
    pub last_checkpoint_step: Option<u64>,
    /// RFC 3339, UTC.
    pub updated_at: String,
    /// Ranks of a data-parallel attempt (absent for one process).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub world_size: Option<usize>,
    /// The node of each rank, in rank order (absent for one process).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank_nodes: Option<Vec<String>>,
}

/// The largest `summary.json` read back (they are a few KiB).
pub const MAX_SUMMARY_BYTES: u64 = 16 << 20;

impl Summary {
    /// Parses `summary.json`; `None` when it is not a JSON object.
    pub fn parse(bytes: &[u8]) -> Option<Summary> {
        serde_json::from_slice(bytes).ok()
    }

    /// Reads a `summary.json`; `None` when missing or unreadable.
    pub fn read(path: &std::path::Path) -> Option<Summary> {
        Summary::parse(&crate::confine::read_bounded(path, MAX_SUMMARY_BYTES).ok()?)
    }

    /// The file's bytes: pretty JSON, keys in alphabetical order as before.
    pub fn to_bytes(&self) -> Vec<u8> {
        let value = serde_json::to_value(self).expect("summary serialises");
        serde_json::to_vec_pretty(&value).expect("summary serialises")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_every_field_and_reads_back_leniently() {
        let s = Summary { state: SummaryState::Stopped, run: "r".into(), steps: 7, resumes: 1, ..Summary::default() };
        let v: serde_json::Value = serde_json::from_slice(&s.to_bytes()).unwrap();
        assert_eq!(v["state"], "stopped");
        assert_eq!(v["final_loss"], serde_json::Value::Null);
        assert_eq!(v.as_object().unwrap().len(), 12);
        assert_eq!(Summary::parse(&s.to_bytes()), Some(s));
        let old = Summary::parse(br#"{"state": "paused", "resumes": 3, "extra": true}"#).unwrap();
        assert_eq!((old.state, old.resumes), (SummaryState::Unknown, 3));
        assert_eq!(Summary::parse(b"[1]"), None);
    }
}
