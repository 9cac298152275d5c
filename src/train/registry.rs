//! The workloads a program can train, by `[model] kind`: the built-in `mlp`
//! and `gpt`, and the ones the program registers with [`Registry::with`].
//! `rekindle::cli::main_with` gives a program the whole `rekindle` command
//! line over its registry (`docs/workloads.md`).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::de::DeserializeOwned;

use super::builtin::builtin_workload;
use super::error::TrainError;
use super::workload::{Split, Workload};
use crate::config::{Config, ModelKind, ModelKinds};

/// Builds a registered workload from the config (its settings already
/// deserialized inside).
type Build = dyn Fn(&Config) -> Result<Box<dyn Workload>, TrainError> + Send + Sync;

/// Checks a `[model.settings]` table (or one key of it) against the
/// registered settings type; `Err` is serde's message.
type Check = fn(&toml::Table) -> Result<(), String>;

#[derive(Clone)]
struct Registered {
    build: Arc<Build>,
    check: Check,
}

/// The model kinds a program can build. Cheap to clone (the builders are shared).
#[derive(Clone)]
pub struct Registry {
    registered: BTreeMap<String, Registered>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").field("kinds", &self.names()).finish()
    }
}

impl Default for Registry {
    fn default() -> Self {
        Registry::builtin()
    }
}

impl Registry {
    /// The built-in kinds `mlp` and `gpt`: what the `rekindle` binary builds.
    pub fn builtin() -> Registry {
        Registry { registered: BTreeMap::new() }
    }

    /// Adds the kind `name`: a config with `[model] kind = "<name>"` has its
    /// `[model.settings]` table deserialized into `S` (unknown keys and wrong
    /// types are config errors with file, line and key, like any other; use
    /// `#[serde(deny_unknown_fields)]` on `S` to have unknown keys refused)
    /// and the workload built by `build` from the whole config and those
    /// settings. An error from `build` is reported as a config error of
    /// `model.settings`, so say in it what to change.
    ///
    /// # Panics
    ///
    /// If `name` is `mlp` or `gpt`, empty, or already registered: a program
    /// error, found the first time the program runs.
    pub fn with<S, W, E, F>(mut self, name: &str, build: F) -> Registry
    where
        S: DeserializeOwned + 'static,
        W: Workload + 'static,
        E: std::fmt::Display,
        F: Fn(&Config, S) -> Result<W, E> + Send + Sync + 'static,
    {
        assert!(!name.is_empty(), "a registered model kind needs a name");
        assert!(!ModelKind::BUILTIN.contains(&name), "`{name}` is a built-in model kind; register another name");
        assert!(!self.registered.contains_key(name), "model kind `{name}` is registered twice");
        let kind = name.to_string();
        let build = move |cfg: &Config| -> Result<Box<dyn Workload>, TrainError> {
            let settings = deserialize::<S>(&cfg.model.settings)
                .map_err(|reason| TrainError::config("model.settings", format!("for kind `{kind}`: {reason}")))?;
            let workload = build(cfg, settings).map_err(|e| {
                TrainError::config("model.settings", format!("building the `{kind}` workload failed: {e}"))
            })?;
            Ok(Box::new(workload) as Box<dyn Workload>)
        };
        let check: Check = |table| deserialize::<S>(table).map(drop);
        self.registered.insert(name.to_string(), Registered { build: Arc::new(build), check });
        self
    }

    /// Every kind, built-in ones first.
    pub fn names(&self) -> Vec<String> {
        ModelKind::BUILTIN.iter().map(|n| n.to_string()).chain(self.registered.keys().cloned()).collect()
    }

    /// The workload `[model] kind` names, built from the config.
    pub fn workload(&self, cfg: &Config) -> Result<Box<dyn Workload>, TrainError> {
        match &cfg.model.kind {
            ModelKind::Mlp | ModelKind::Gpt => builtin_workload(cfg),
            ModelKind::Registered(name) => match self.registered.get(name) {
                Some(registered) => (registered.build)(cfg),
                None => Err(TrainError::config(
                    "model.kind",
                    format!(
                        "`{name}` is not a model kind this program builds (it builds {}); a model of your own \
                         is run by the program that registers it (docs/workloads.md)",
                        self.names().join(", ")
                    ),
                )),
            },
        }
    }
}

impl Registry {
    /// [`workload`](Self::workload), checked for what training needs and
    /// the config alone cannot tell: the data loads (a `[data] path` that
    /// exists and parses), the training split has samples, and so does the
    /// validation split when `[train] eval_every` evaluates within
    /// `max_steps`. `rekindle run` calls it before it touches the run
    /// directory, and `rekindle doctor` runs the same check: an error here
    /// is the config's or its data's.
    pub fn checked_workload(&self, cfg: &Config) -> Result<Box<dyn Workload>, TrainError> {
        let workload = self.workload(cfg)?;
        let what = |split: &str| format!("the {split} split of workload `{}`", workload.name());
        if workload.num_samples(Split::Train) == 0 {
            return Err(TrainError::EmptyData { what: what("training"), reason: "it has no samples".into() });
        }
        let evaluates = cfg.train.eval_every > 0 && cfg.train.eval_every <= cfg.run.max_steps;
        if evaluates && workload.num_samples(Split::Validation) == 0 {
            return Err(TrainError::EmptyData {
                what: what("validation"),
                reason: format!(
                    "it has no samples, and train.eval_every = {} evaluates on it: raise data.val_fraction \
                     (now {}), give more data, or set train.eval_every = 0",
                    cfg.train.eval_every, cfg.data.val_fraction
                ),
            });
        }
        Ok(workload)
    }
}

impl ModelKinds for Registry {
    fn names(&self) -> Vec<String> {
        Registry::names(self)
    }

    fn check_settings(&self, kind: &str, settings: &toml::Table) -> Result<(), String> {
        match self.registered.get(kind) {
            Some(registered) => (registered.check)(settings),
            None => Ok(()),
        }
    }
}

/// `table` as an `S`, or serde's message.
fn deserialize<S: DeserializeOwned>(table: &toml::Table) -> Result<S, String> {
    toml::Value::Table(table.clone()).try_into::<S>().map_err(|e| e.message().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::from_str_with;

    #[derive(serde::Deserialize, Default)]
    #[serde(deny_unknown_fields, default)]
    struct Settings {
        width: usize,
        label: String,
    }

    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Required {
        #[allow(dead_code)]
        depth: usize,
    }

    struct Fixed(usize);

    impl Workload for Fixed {
        fn name(&self) -> &str {
            "fixed"
        }
        fn build(&mut self, vb: candle_nn::VarBuilder<'_>) -> candle_core::Result<()> {
            candle_nn::linear(self.0, 1, vb.pp("fc")).map(drop)
        }
        fn num_samples(&self, _: super::super::Split) -> usize {
            4
        }
        fn batch(
            &self,
            _: super::super::Split,
            indices: &[usize],
            device: &candle_core::Device,
        ) -> candle_core::Result<super::super::Batch> {
            let x = candle_core::Tensor::zeros((indices.len(), self.0), candle_core::DType::F32, device)?;
            Ok(super::super::Batch { inputs: x.clone(), targets: x, tokens: None })
        }
        fn loss(
            &self,
            batch: &super::super::Batch,
            _: &mut super::super::ForwardCtx<'_>,
        ) -> candle_core::Result<candle_core::Tensor> {
            batch.inputs.sum_all()
        }
    }

    fn registry() -> Registry {
        Registry::builtin()
            .with(
                "fixed",
                |_cfg: &Config, s: Settings| {
                    if s.width == 0 { Err("width must be at least 1".to_string()) } else { Ok(Fixed(s.width)) }
                },
            )
            .with("needs", |_cfg: &Config, _s: Required| Ok::<_, String>(Fixed(1)))
    }

    fn problems(text: &str) -> Vec<String> {
        match from_str_with(text, "t.toml", &[], &registry()) {
            Ok(_) => Vec::new(),
            Err(e) => e
                .problems()
                .iter()
                .map(|p| format!("{}:{} {}: {}", p.line.unwrap_or(0), p.column.unwrap_or(0), p.key, p.message))
                .collect(),
        }
    }

    #[test]
    fn registered_kind_builds_from_its_settings() {
        let cfg = from_str_with("[model]\nkind = \"fixed\"\n[model.settings]\nwidth = 3\n", "t.toml", &[], &registry())
            .unwrap()
            .config;
        assert_eq!(cfg.model.kind, ModelKind::Registered("fixed".into()));
        // The built-in models' keys are accepted and not checked for it.
        let text = "[model]\nkind = \"fixed\"\nheads = 0\nhidden = []\n[model.settings]\nwidth = 3\n";
        assert!(from_str_with(text, "t.toml", &[], &registry()).is_ok());
        let workload = registry().workload(&cfg).unwrap();
        assert_eq!(workload.name(), "fixed");
        assert_eq!(registry().names(), ["mlp", "gpt", "fixed", "needs"]);
    }

    #[test]
    fn unknown_keys_and_wrong_types_in_settings_are_placed_with_a_suggestion() {
        let found = problems("[model]\nkind = \"fixed\"\n[model.settings]\nwidht = 3\nlabel = 4\n");
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].starts_with("4:1 model.settings.widht: unknown key; did you mean `width`?"), "{found:?}");
        assert!(found[1].starts_with("5:1 model.settings.label: expected a string, found integer"), "{found:?}");
    }

    #[test]
    fn settings_are_overridden_key_by_key_from_the_command_line() {
        let sets = ["model.settings.width=5".to_string(), "model.settings.label=\"x\"".to_string()];
        let text = "[model]\nkind = \"fixed\"\n[model.settings]\nwidth = 3\nlabel = \"a\"\n";
        let cfg = from_str_with(text, "t.toml", &sets, &registry()).unwrap().config;
        assert_eq!(cfg.model.settings["width"].as_integer(), Some(5));
        assert_eq!(cfg.model.settings["label"].as_str(), Some("x"));
        // Without a table in the file, and with an unknown key: placed on the override.
        let sets = ["model.settings.widht=5".to_string()];
        let err = from_str_with("[model]\nkind = \"fixed\"\n", "t.toml", &sets, &registry()).unwrap_err();
        let problem = &err.problems()[0];
        assert!(problem.from_set && problem.key == "model.settings.widht", "{err}");
        assert!(problem.message.starts_with("unknown key; did you mean `width`?"), "{err}");
        let bad = ["model.width.x=1".to_string()];
        let err = from_str_with("", "t.toml", &bad, &registry()).unwrap_err();
        assert!(err.problems()[0].message.contains("`model.settings.key`"), "{err}");
    }

    #[test]
    fn missing_required_settings_are_reported_for_the_table() {
        let found = problems("[model]\nkind = \"needs\"\n[model.settings]\n");
        assert_eq!(found, ["3:1 model.settings: the key `depth` is missing and has no default; add it"]);
    }

    #[test]
    fn unknown_kinds_are_refused_with_the_registered_ones_listed() {
        let found = problems("[model]\nkind = \"fixd\"\n");
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].starts_with(
                "2:1 model.kind: `fixd` is not allowed; did you mean `fixed`? allowed: mlp, gpt, fixed, needs"
            ),
            "{found:?}"
        );
        // The plain binary knows only the built-in kinds.
        let plain = crate::config::from_str("[model]\nkind = \"fixed\"\n", "t.toml", &[]).unwrap_err();
        assert!(plain.problems()[0].message.contains("allowed: mlp, gpt"), "{plain}");
        // Settings are for registered kinds only.
        let found = problems("[model]\nkind = \"mlp\"\n[model.settings]\nwidth = 1\n");
        assert!(
            found[0].starts_with("3:1 model.settings: is for the settings of a registered model kind"),
            "{found:?}"
        );
    }

    #[test]
    fn an_error_of_the_builder_is_a_config_error_of_the_settings() {
        let cfg = from_str_with("[model]\nkind = \"fixed\"\n", "t.toml", &[], &registry()).unwrap().config;
        let err = registry().workload(&cfg).map(|_| ()).unwrap_err();
        assert!(
            matches!(&err, TrainError::Config { key, reason } if key == "model.settings" && reason.contains("width must be at least 1")),
            "{err}"
        );
        let mut other = cfg.clone();
        other.model.kind = ModelKind::Registered("nope".into());
        assert!(Registry::builtin().workload(&other).is_err());
    }
}
