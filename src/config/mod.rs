//! The run configuration: TOML in, a validated [`Config`] out.
//!
//! - `schema.rs`: the serde structs and their defaults.
//! - `load.rs`: reading, `--set` overrides, per-key errors with places.
//! - `validate.rs`: semantic checks (ranges, relations between keys).
//! - `error.rs`: [`ConfigError`] and [`Problem`].
//! - `keys.rs`: the key names the schema accepts.
//! - `kinds.rs`: which model kinds a config may name ([`ModelKinds`]).
//! - `diff.rs`: training-relevant differences and hash, for resume.

mod diff;
mod error;
mod keys;
mod kinds;
mod load;
mod schema;
mod validate;

pub use diff::{config_hash, settings_diff, training_diff, training_hash, training_settings};
pub use error::{ConfigError, Problem};
pub use keys::{all_keys, section_keys, sections};
pub use kinds::{AnyKind, BuiltinKinds, ModelKinds};
pub use load::{LoadedConfig, MAX_CONFIG_BYTES, from_str, from_str_with, load, load_recorded, load_with, to_toml};
pub use schema::*;
pub use validate::{check_include_pattern, validate};
