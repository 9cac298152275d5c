//! The run configuration: TOML in, a validated [`Config`] out.
//!
//! - `schema.rs`: the serde structs and their defaults.
//! - `error.rs`: [`ConfigError`] and [`Problem`].

mod error;
mod schema;

pub use error::{ConfigError, Problem};
pub use schema::*;
