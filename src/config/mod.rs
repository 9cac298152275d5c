//! The run configuration: TOML in, a validated [`Config`] out.

mod schema;

pub use schema::*;
