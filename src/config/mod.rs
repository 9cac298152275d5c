//! The run configuration: TOML in, a validated [`Config`] out.
//!
//! - `schema.rs`: the serde structs and their defaults.
//! - `error.rs`: [`ConfigError`] and [`Problem`].
//! - `keys.rs`: the key names the schema accepts.

mod error;
mod keys;
mod schema;

pub use error::{ConfigError, Problem};
pub use keys::{all_keys, section_keys, sections};
pub use schema::*;
