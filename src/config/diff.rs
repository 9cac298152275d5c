//! Config-change detection for resume: which keys that shape the trained
//! weights differ between the config a checkpoint was trained with and the
//! config now given, and the hash of those keys that every checkpoint
//! records (`state.json`, docs/checkpoint-format.md).
//!
//! Training-relevant: `run.seed`, `model.*`, `data.*`, `train.*` except
//! `train.log_every` and `train.micro_batch`, `optimizer.*`, `precision.*`.
//! Not: `run.name`, `run.dir`, `checkpoint.*`, `signals.*`, `publish.*`,
//! `gpu.*`. `train.micro_batch` is left out like `gpu.*`: it only cuts the
//! same samples into different pieces (and with `"auto"` it depends on the
//! node a run lands on), so it changes float summation order, not what is
//! trained.
//!
//! `run.max_steps` shapes training only as the default of
//! `optimizer.decay_steps` (the learning-rate schedule's length; nothing else
//! in a step depends on it), so the settings hold the *effective*
//! `optimizer.decay_steps` and not `run.max_steps`: with `decay_steps` set,
//! `max_steps` may change (a run extended or cut short trains every step it
//! shares with the old one identically); without it, a new `max_steps` is a
//! new decay length and shows as `optimizer.decay_steps`.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::schema::Config;

/// The key of the effective decay length in the settings.
const DECAY_KEY: &str = "optimizer.decay_steps";

/// Each training-relevant key whose value differs, in key order, as
/// `model.width: 64 -> 128` (strings quoted, unset values as `unset`; a
/// decay length that comes from `run.max_steps` is marked so).
pub fn training_diff(old: &Config, new: &Config) -> Vec<String> {
    diff(&training_view(old), Some(old), &training_view(new), new)
}

/// The training-relevant settings of `config` as one JSON object,
/// `"section.key": value` (what [`training_hash`] hashes; a checkpoint
/// records it beside the hash so a refusal can name what changed).
pub fn training_settings(config: &Config) -> Value {
    Value::Object(training_view(config).into_iter().collect())
}

/// Lower-case hex SHA-256 of [`training_settings`] serialised as compact
/// JSON with its keys in alphabetical order (serde_json's map is sorted):
/// equal for two configs exactly when [`training_diff`] finds nothing.
pub fn training_hash(config: &Config) -> String {
    let canonical = serde_json::to_vec(&training_settings(config)).expect("a JSON value serialises");
    hex::encode(Sha256::digest(&canonical))
}

/// Lower-case hex SHA-256 of the whole config (every key, training or
/// not) serialised as compact JSON with its keys in alphabetical order: two
/// attempts ran with the same settings exactly when their hashes are equal.
/// The progress guard (`crate::health`) counts afresh after a change.
pub fn config_hash(config: &Config) -> String {
    let value = serde_json::to_value(config).expect("a config serialises");
    hex::encode(Sha256::digest(serde_json::to_vec(&value).expect("a JSON value serialises")))
}

/// [`training_diff`] between settings recorded earlier (the
/// [`training_settings`] a checkpoint holds) and `config`'s; a recorded
/// value that is not an object counts as no keys at all.
pub fn settings_diff(recorded: &Value, config: &Config) -> Vec<String> {
    let old: BTreeMap<String, Value> =
        recorded.as_object().map(|o| o.iter().map(|(k, v)| (k.clone(), v.clone())).collect()).unwrap_or_default();
    diff(&old, None, &training_view(config), config)
}

fn diff(
    old: &BTreeMap<String, Value>,
    old_config: Option<&Config>,
    new: &BTreeMap<String, Value>,
    new_config: &Config,
) -> Vec<String> {
    let mut keys: Vec<&String> = old.keys().chain(new.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter_map(|key| {
            let (a, b) = (old.get(key), new.get(key));
            (a != b).then(|| {
                let (was, now) = (note(key, old_config), note(key, Some(new_config)));
                format!("{key}: {}{was} -> {}{now}", show(a), show(b))
            })
        })
        .collect()
}

/// Marks a decay length that is `run.max_steps` standing in for an unset
/// `optimizer.decay_steps`.
fn note(key: &str, config: Option<&Config>) -> &'static str {
    match config {
        Some(c) if key == DECAY_KEY && c.optimizer.decay_steps.is_none() => " (run.max_steps)",
        _ => "",
    }
}

fn is_training_relevant(section: &str, key: &str) -> bool {
    match section {
        "run" => key == "seed",
        "train" => !matches!(key, "log_every" | "micro_batch"),
        "model" | "data" | "optimizer" | "precision" => true,
        _ => false,
    }
}

/// `section.key` -> value for the training-relevant keys, sorted by key.
fn training_view(config: &Config) -> BTreeMap<String, Value> {
    let mut view = BTreeMap::new();
    add_section(&mut view, "run", &config.run);
    add_section(&mut view, "model", &config.model);
    add_section(&mut view, "data", &config.data);
    add_section(&mut view, "train", &config.train);
    add_section(&mut view, "optimizer", &config.optimizer);
    add_section(&mut view, "precision", &config.precision);
    // The schedule's length, whichever key gives it (LrSchedule::from_config).
    let decay = config.optimizer.decay_steps.unwrap_or(config.run.max_steps);
    view.insert(DECAY_KEY.to_string(), Value::from(decay));
    view
}

fn add_section<T: Serialize + std::fmt::Debug>(view: &mut BTreeMap<String, Value>, name: &str, section: &T) {
    match serde_json::to_value(section) {
        Ok(Value::Object(fields)) => {
            for (key, value) in fields {
                if is_training_relevant(name, &key) {
                    view.insert(format!("{name}.{key}"), value);
                }
            }
        }
        // Only a non-UTF-8 path gets here, which no TOML file can hold;
        // still, a change must show, so compare the debug form.
        _ => {
            view.insert(name.to_string(), Value::String(format!("{section:?}")));
        }
    }
}

fn show(value: Option<&Value>) -> String {
    match value {
        None | Some(Value::Null) => "unset".to_string(),
        Some(value) => value.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::ModelKind;

    #[test]
    fn identical_configs_have_no_diff() {
        assert!(training_diff(&Config::default(), &Config::default()).is_empty());
    }

    #[test]
    fn training_diff_names_key_and_both_values() {
        let old = Config::default();
        let mut new = old.clone();
        new.model.width = 128;
        new.model.kind = ModelKind::Gpt;
        new.data.path = Some("d.jsonl".into());
        assert_eq!(
            training_diff(&old, &new),
            ["data.path: unset -> \"d.jsonl\"", "model.kind: \"mlp\" -> \"gpt\"", "model.width: 64 -> 128",]
        );
    }

    #[test]
    fn training_diff_ignores_checkpoint_section() {
        let old = Config::default();
        let mut new = old.clone();
        new.checkpoint.keep = 10;
        new.checkpoint.interval = crate::config::CheckpointInterval::Fixed(Duration::from_secs(1));
        new.signals.grace = Duration::from_secs(600);
        new.publish.enabled = true;
        new.gpu.headroom = 0.5;
        new.run.name = "renamed".into();
        new.run.dir = Some("elsewhere".into());
        new.train.log_every = 100;
        new.train.micro_batch = Some(crate::config::MicroBatch::Auto);
        assert!(training_diff(&old, &new).is_empty());
    }

    #[test]
    fn training_diff_sees_seed_steps_and_train_keys() {
        let old = Config::default();
        let mut new = old.clone();
        new.run.seed = 7;
        new.run.max_steps = 5;
        new.train.eval_every = 10;
        new.optimizer.lr = 0.5;
        new.precision.growth_interval = 1;
        assert_eq!(training_diff(&old, &new).len(), 5);
    }

    #[test]
    fn training_view_covers_exactly_the_relevant_keys() {
        let view = training_view(&Config::default());
        assert!(view.contains_key("run.seed"));
        assert!(view.contains_key("model.hidden"));
        assert!(view.contains_key("optimizer.decay_steps"));
        assert!(!view.contains_key("run.name"));
        assert!(!view.contains_key("train.log_every"));
        assert!(!view.contains_key("train.micro_batch"));
        assert!(!view.contains_key("run.max_steps"), "it shapes training only as the decay length");
        assert!(!view.keys().any(|k| k.starts_with("checkpoint.")));
        let keys: Vec<_> = view.keys().cloned().collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted);
    }

    #[test]
    fn max_steps_may_change_when_decay_steps_is_set() {
        let mut old = Config::default();
        old.optimizer.decay_steps = Some(1000);
        let mut new = old.clone();
        new.run.max_steps = 5000;
        assert!(training_diff(&old, &new).is_empty());
        assert_eq!(training_hash(&old), training_hash(&new));
    }

    #[test]
    fn max_steps_without_decay_steps_is_the_decay_length() {
        let old = Config::default();
        let mut new = old.clone();
        new.run.max_steps = 5000;
        assert_eq!(training_diff(&old, &new), ["optimizer.decay_steps: 1000 (run.max_steps) -> 5000 (run.max_steps)"]);
        assert_ne!(training_hash(&old), training_hash(&new));
        // Pinning the old length while extending the run changes nothing trained.
        new.optimizer.decay_steps = Some(old.run.max_steps);
        assert!(training_diff(&old, &new).is_empty());
        new.optimizer.decay_steps = Some(2000);
        assert_eq!(training_diff(&old, &new), ["optimizer.decay_steps: 1000 (run.max_steps) -> 2000"]);
    }

    #[test]
    fn hash_is_hex_sha256_and_changes_exactly_with_the_diff() {
        let old = Config::default();
        let hash = training_hash(&old);
        assert_eq!(hash.len(), 64);
        assert!(hash.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        let mut same = old.clone();
        same.checkpoint.keep = 9;
        same.train.log_every = 3;
        assert_eq!(training_hash(&same), hash);
        let mut other = old.clone();
        other.optimizer.lr = 0.5;
        assert_ne!(training_hash(&other), hash);
    }

    #[test]
    fn recorded_settings_name_what_changed_after_a_round_trip_through_json() {
        let old = Config::default();
        let text = serde_json::to_string(&training_settings(&old)).unwrap();
        let recorded: Value = serde_json::from_str(&text).unwrap();
        assert!(settings_diff(&recorded, &old).is_empty());
        let mut new = old.clone();
        new.optimizer.lr = 0.5;
        new.train.grad_clip = 2.0;
        let diff = settings_diff(&recorded, &new);
        assert_eq!(diff.len(), 2, "{diff:?}");
        assert!(diff[0].starts_with("optimizer.lr: ") && diff[1].starts_with("train.grad_clip: "), "{diff:?}");
        assert_eq!(settings_diff(&Value::Null, &new).len(), training_view(&new).len());
    }
}
