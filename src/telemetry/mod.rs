//! Telemetry: log set-up (`tracing`), the run's structured records
//! (`events.jsonl`, `metrics.jsonl`) in the run directory, reading them back,
//! and the attempts they describe.

mod attempts;
mod events;
mod logging;
mod records;

pub use attempts::{Attempt, AttemptEnd, attempts};
pub use events::{EventLog, JsonlWriter, TelemetryError, now_rfc3339};
pub use logging::{LogFormat, LogOptions, init_logging};
pub use records::{
    Event, GpuDeviceSample, GpuSample, Jsonl, MetricPoint, ValPoint, events_from, gpu_samples_from, metrics_from,
    parse_jsonl, read_jsonl, time_field,
};
