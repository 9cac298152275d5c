//! Which `[model] kind`s a config may name and how their `[model.settings]`
//! are checked. The config loader knows no workload; the program's
//! [`Registry`](crate::train::Registry) tells it through [`ModelKinds`].

/// The model kinds a program can build, as the config loader sees them.
pub trait ModelKinds {
    /// Every kind this program can build, built-in ones included, in the
    /// order error messages list them.
    fn names(&self) -> Vec<String>;

    /// Checks `settings` (all of `[model.settings]`, or one key of it) for
    /// `kind`: `Err` holds serde's message (unknown field, invalid type,
    /// missing field). Only called for a kind [`names`](Self::names) lists.
    fn check_settings(&self, kind: &str, settings: &toml::Table) -> Result<(), String>;

    /// Whether any kind is accepted unchecked (reading back a run
    /// directory's own `config.toml`, validated when the run started).
    fn accepts_any(&self) -> bool {
        false
    }
}

/// The built-in kinds only: `mlp` and `gpt`, which take no settings table.
#[derive(Debug, Clone, Copy, Default)]
pub struct BuiltinKinds;

impl ModelKinds for BuiltinKinds {
    fn names(&self) -> Vec<String> {
        super::ModelKind::BUILTIN.iter().map(|name| name.to_string()).collect()
    }

    fn check_settings(&self, _kind: &str, _settings: &toml::Table) -> Result<(), String> {
        Ok(())
    }
}

/// Any kind, with any settings: for configs a run already validated (a run
/// directory's `config.toml`), read by commands that need only its
/// run-level keys (`status`, `report`, `verify`).
#[derive(Debug, Clone, Copy, Default)]
pub struct AnyKind;

impl ModelKinds for AnyKind {
    fn names(&self) -> Vec<String> {
        BuiltinKinds.names()
    }

    fn check_settings(&self, _kind: &str, _settings: &toml::Table) -> Result<(), String> {
        Ok(())
    }

    fn accepts_any(&self) -> bool {
        true
    }
}
