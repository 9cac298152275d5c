//! Config-change detection for resume: which keys that shape the trained
//! weights differ between the config a checkpoint was trained with and the
//! config now given.
//!
//! Training-relevant: `run.seed`, `run.max_steps`, `model.*`, `data.*`,
//! `train.*` except `train.log_every` and `train.micro_batch`, `optimizer.*`,
//! `precision.*`. Not: `run.name`, `run.dir`, `checkpoint.*`, `signals.*`,
//! `publish.*`, `gpu.*`. `train.micro_batch` is left out like `gpu.*`: it
//! only cuts the same samples into different pieces (and with `"auto"` it
//! depends on the node a run lands on), so it changes float summation order,
//! not what is trained.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use super::schema::Config;

/// Each training-relevant key whose value differs, in key order, as
/// `model.width: 64 -> 128` (strings quoted, unset values as `unset`).
pub fn training_diff(old: &Config, new: &Config) -> Vec<String> {
    let (old, new) = (training_view(old), training_view(new));
    let mut keys: Vec<&String> = old.keys().chain(new.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter_map(|key| {
            let (a, b) = (old.get(key), new.get(key));
            (a != b).then(|| format!("{key}: {} -> {}", show(a), show(b)))
        })
        .collect()
}

fn is_training_relevant(section: &str, key: &str) -> bool {
    match section {
        "run" => matches!(key, "seed" | "max_steps"),
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
        assert!(!view.keys().any(|k| k.starts_with("checkpoint.")));
        let keys: Vec<_> = view.keys().cloned().collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted);
    }
}
