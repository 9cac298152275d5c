//! Telemetry: log set-up (`tracing`) and the run's structured records
//! (`events.jsonl`, `metrics.jsonl`) in the run directory.

mod events;
mod logging;

pub use events::{EventLog, JsonlWriter, TelemetryError};
pub use logging::{LogFormat, LogOptions, init_logging};
