//! The `state.json` of a native checkpoint: the envelope `rekindle run`
//! wraps around the training engine's state, one type for writing it and
//! for reading it back (docs/checkpoint-format.md, `state.json`).
//!
//! It lives here, not in `checkpoint/`, because the checkpoint layer treats
//! `state.json` as opaque JSON: it writes, hashes and verifies the bytes and
//! never reads a key (the benchmark writes `{"bench": true}` there, and the
//! checkpoints `rekindle exec` seals have no `state.json` at all). Every key
//! of the envelope is this driver's: the host and SLURM facts of the attempt
//! that saved, the training settings its resume guard checks
//! (`settings.rs`), the losses so far, and the training engine's own `train`
//! object, which only the engine reads.
//!
//! **Bytes on disk.** The envelope is turned into a [`serde_json::Value`]
//! before it is written (a [`Snapshot`]'s state), and serde_json is built
//! without `preserve_order`, so every object's keys are written in
//! alphabetical order, whatever the field order here; the fields are
//! declared alphabetically anyway, so the two agree.
//!
//! **Reading is as tolerant as the string-keyed lookups it replaces.** A
//! missing key, or one of another type than expected, reads as `None` (or
//! `null` for the JSON objects); unknown keys are ignored; a `state.json`
//! that is not an object reads as all missing. Nothing here refuses a
//! checkpoint: the engine refuses a `train` object it cannot restore, and the
//! settings guard decides what a missing hash means.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use crate::checkpoint::Snapshot;
use crate::config::{self, Config};
use crate::slurm::{self, SlurmEnv};

/// The `state.json` of a checkpoint `rekindle run` writes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StateEnvelope {
    /// Where the checkpoint was written.
    #[serde(default, deserialize_with = "lenient")]
    pub host: HostFacts,
    /// The losses of the steps up to the checkpoint.
    #[serde(default, deserialize_with = "lenient")]
    pub metrics: Losses,
    /// The rekindle that wrote it.
    #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    pub rekindle_version: Option<String>,
    /// The training-relevant config keys ([`config::training_settings`]);
    /// `null` in checkpoints written before they were recorded.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub settings: Value,
    /// Their hash ([`config::training_hash`]): what the resume guard compares.
    #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    pub settings_sha256: Option<String>,
    /// Steps completed.
    #[serde(default, deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    /// The training engine's state (data cursor, RNG, schedule, scaler,
    /// counters: docs/determinism.md), handed back to `Trainer::restore`
    /// as it was read; `null` when missing.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub train: Value,
}

/// `host`: the node, process and SLURM job of the attempt that saved.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HostFacts {
    /// The whole SLURM environment ([`SlurmEnv`]), as JSON.
    #[serde(default)]
    pub allocation: Value,
    #[serde(default, deserialize_with = "lenient")]
    pub hostname: Option<String>,
    /// The SLURM node name (else the hostname): the `resume` event's
    /// `previous_node`.
    #[serde(default, deserialize_with = "lenient")]
    pub node: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    pub pid: Option<u32>,
    #[serde(default, deserialize_with = "lenient")]
    pub slurm_job_id: Option<String>,
    /// `SLURM_RESTART_COUNT` (0 outside SLURM): the `resume` event's
    /// `previous_attempt`.
    #[serde(default, deserialize_with = "lenient")]
    pub slurm_restart_count: Option<u64>,
}

/// `metrics`: the losses so far (`null` before the first step, or when
/// not finite).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Losses {
    #[serde(default, deserialize_with = "lenient")]
    pub best_loss: Option<f64>,
    #[serde(default, deserialize_with = "lenient")]
    pub last_loss: Option<f64>,
}

impl StateEnvelope {
    /// The envelope of a checkpoint of `step` saved now: `train` is the
    /// engine's state, the losses are the run's so far.
    pub fn new(step: u64, train: Value, losses: Losses, slurm: &SlurmEnv, cfg: &Config) -> StateEnvelope {
        StateEnvelope {
            host: HostFacts::of(slurm),
            metrics: losses,
            rekindle_version: Some(env!("CARGO_PKG_VERSION").into()),
            settings: config::training_settings(cfg),
            settings_sha256: Some(config::training_hash(cfg)),
            step: Some(step),
            train,
        }
    }

    /// Reads a checkpoint's state as tolerantly as the module header says.
    pub fn read(state: &Value) -> StateEnvelope {
        StateEnvelope::deserialize(state).unwrap_or_default()
    }

    /// The envelope of a loaded snapshot.
    pub fn of(snapshot: &Snapshot) -> StateEnvelope {
        StateEnvelope::read(&snapshot.state)
    }

    /// The JSON a [`Snapshot`] holds and the store writes as `state.json`.
    pub fn to_value(&self) -> Value {
        // Plain data with string keys: serialising it cannot fail.
        serde_json::to_value(self).expect("a state envelope serialises")
    }

    /// `(last_loss, best_loss)` of the steps up to the checkpoint, as it
    /// recorded them.
    pub fn losses_so_far(&self) -> (Option<f64>, Option<f64>) {
        (self.metrics.last_loss, self.metrics.best_loss)
    }
}

impl HostFacts {
    /// The facts of this process under `slurm`.
    pub fn of(slurm: &SlurmEnv) -> HostFacts {
        HostFacts {
            allocation: serde_json::to_value(slurm).unwrap_or_default(),
            hostname: Some(slurm::hostname()),
            node: Some(slurm.node_name()),
            pid: Some(std::process::id()),
            slurm_job_id: slurm.job_id.clone(),
            slurm_restart_count: Some(u64::from(slurm.restart_count)),
        }
    }
}

/// A field read as `T` when it is one, else as `T::default()` (`None`):
/// what `state["key"].as_str()` and the like gave before this type.
fn lenient<'de, D: Deserializer<'de>, T: DeserializeOwned + Default>(d: D) -> Result<T, D::Error> {
    let value = Value::deserialize(d)?;
    Ok(T::deserialize(value).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::{Path, PathBuf};

    use super::*;

    #[test]
    fn missing_and_mistyped_keys_read_as_none() {
        assert_eq!(StateEnvelope::read(&serde_json::json!({})), StateEnvelope::default());
        assert_eq!(StateEnvelope::read(&serde_json::json!([1, 2])), StateEnvelope::default());
        let odd = serde_json::json!({
            "host": {"node": 7, "slurm_restart_count": "2"},
            "metrics": {"last_loss": 0.5, "best_loss": null},
            "settings_sha256": 3,
            "step": -1,
            "unknown": true,
        });
        let e = StateEnvelope::read(&odd);
        assert_eq!((&e.host.node, e.host.slurm_restart_count), (&None, None));
        assert_eq!(e.losses_so_far(), (Some(0.5), None));
        assert_eq!((e.settings_sha256, e.step, e.train), (None, None, Value::Null));
        let host_not_an_object = StateEnvelope::read(&serde_json::json!({"host": "n1", "step": 3}));
        assert_eq!((host_not_an_object.host, host_not_an_object.step), (HostFacts::default(), Some(3)));
    }

    #[test]
    fn integer_losses_read_as_floats() {
        let e = StateEnvelope::read(&serde_json::json!({"metrics": {"last_loss": 1, "best_loss": 2.5}}));
        assert_eq!(e.losses_so_far(), (Some(1.0), Some(2.5)));
    }

    #[test]
    fn checkpoints_record_where_they_were_written() {
        let env = BTreeMap::from([
            ("SLURM_JOB_ID".to_string(), "7".to_string()),
            ("SLURMD_NODENAME".to_string(), "n3".to_string()),
        ]);
        let info = serde_json::to_value(HostFacts::of(&SlurmEnv::from_map(&env))).unwrap();
        assert_eq!((info["node"].as_str(), info["slurm_job_id"].as_str()), (Some("n3"), Some("7")));
        assert_eq!(info["slurm_restart_count"], 0);
        assert_eq!(info["allocation"]["job_id"], "7");
    }

    /// The `json!` the envelope replaced, kept to show the bytes are the same.
    fn as_written_before(step: u64, train: Value, losses: Losses, slurm: &SlurmEnv, cfg: &Config) -> Value {
        let mut state = serde_json::json!({
            "step": step,
            "train": train,
            "metrics": {"last_loss": losses.last_loss, "best_loss": losses.best_loss},
            "host": {
                "node": slurm.node_name(),
                "hostname": slurm::hostname(),
                "pid": std::process::id(),
                "slurm_job_id": slurm.job_id,
                "slurm_restart_count": slurm.restart_count,
                "allocation": slurm,
            },
            "rekindle_version": env!("CARGO_PKG_VERSION"),
        });
        state["settings"] = config::training_settings(cfg);
        state["settings_sha256"] = Value::String(config::training_hash(cfg));
        state
    }

    #[test]
    fn writes_the_same_bytes_as_the_json_it_replaced() {
        let env = BTreeMap::from([
            ("SLURM_JOB_ID".to_string(), "7".to_string()),
            ("SLURMD_NODENAME".to_string(), "n3".to_string()),
            ("SLURM_RESTART_COUNT".to_string(), "2".to_string()),
        ]);
        let slurm = SlurmEnv::from_map(&env);
        let cfg = Config::default();
        let train = serde_json::json!({"step": 5, "cursor": {"epoch": 0, "position": 80}, "format": 1});
        for losses in [Losses::default(), Losses { best_loss: Some(0.25), last_loss: Some(0.5) }] {
            let before = as_written_before(5, train.clone(), losses, &slurm, &cfg);
            let after = StateEnvelope::new(5, train.clone(), losses, &slurm, &cfg).to_value();
            // As the store writes them.
            assert_eq!(
                String::from_utf8(serde_json::to_vec_pretty(&after).unwrap()).unwrap(),
                String::from_utf8(serde_json::to_vec_pretty(&before).unwrap()).unwrap()
            );
            // The struct's own field order agrees with the file's key order.
            let direct = StateEnvelope::new(5, train.clone(), losses, &slurm, &cfg);
            assert_eq!(serde_json::to_vec_pretty(&direct).unwrap(), serde_json::to_vec_pretty(&before).unwrap());
        }
    }

    /// Every `state.json` under `testdata/`: the `state.json` of each
    /// checkpoint of an earlier release.
    fn fixture_states() -> Vec<PathBuf> {
        fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    walk(&path, out);
                } else if path.file_name().is_some_and(|n| n == crate::checkpoint::STATE_FILE) {
                    out.push(path);
                }
            }
        }
        let mut out = Vec::new();
        walk(&Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata"), &mut out);
        out.sort();
        out
    }

    #[test]
    fn every_fixture_state_reads_into_the_envelope_and_writes_back_the_same_bytes() {
        let states = fixture_states();
        assert!(!states.is_empty(), "testdata holds no state.json");
        for path in states {
            let bytes = std::fs::read(&path).unwrap();
            let value: Value = serde_json::from_slice(&bytes).unwrap();
            let strict: StateEnvelope =
                serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let e = StateEnvelope::read(&value);
            assert_eq!(strict, e, "{}", path.display());
            assert!(e.step.is_some() && e.train.is_object() && e.settings_sha256.is_some(), "{}", path.display());
            assert!(e.host.node.is_some() && e.host.slurm_restart_count.is_some(), "{}", path.display());
            assert!(e.metrics.last_loss.is_some(), "{}", path.display());
            // Against the file's text as parsed, not its bytes: serde_json's
            // float parser (no `float_roundtrip`) may read the last digit of
            // a float such as 0.0024000000000000002 differently, whatever
            // type holds it.
            let text = |v: &Value| String::from_utf8(serde_json::to_vec_pretty(v).unwrap()).unwrap();
            assert_eq!(text(&e.to_value()), text(&value), "{}", path.display());
        }
    }
}
