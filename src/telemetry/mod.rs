//! Telemetry: log set-up (`tracing`), the run's structured records as types
//! (`events.jsonl`, `metrics.jsonl`, `gpu_stats.jsonl`, `summary.json`; the
//! format is documented in docs/run-directory.md), writing and reading them
//! back, and the attempts they describe; and their exports where people
//! already look (`export.rs`: TensorBoard event files, `tensorboard/`, and
//! a Prometheus textfile, `prometheus.rs`; docs/telemetry.md). This module
//! is the records' vocabulary: it depends on no other part of rekindle.

mod attempts;
mod event;
mod events;
pub(crate) use events::open_in_dir;
mod export;
mod follow;
mod gpu_sample;
mod key_order;
mod logging;
mod metrics;
mod prometheus;
mod rank_beat;
mod records;
mod redact;
#[cfg(test)]
pub(crate) use redact::fuzz_inputs as redact_fuzz_inputs;
#[cfg(test)]
mod release_fixture;
mod summary;
pub mod tensorboard;

pub use attempts::{Attempt, AttemptEnd, AttemptFold, attempts};
pub use event::{
    CheckpointFailed, CheckpointIntervalChosen, CheckpointQuarantined, CheckpointRejected, CheckpointSaved,
    CheckpointStarted, ChildExit, ChildStart, CrashClass, EVENT_NAMES, ErrorEvent, Event, EventContext, Finish,
    FreshStart, GpuFallback, HangEvent, LocalCheckpoint, LockTakeover, MonitorOutcome, NodeUnhealthy, NodesExcluded,
    Nonfinite, OomRetry, PersisterDied, PublishOutcome, RankLost, RecordedEvent, Recovery, RefusedFile, RequeueAnswer,
    RequeueDecision, RequeueRecord, Resume, Signal, Start, Stop, Straggler, events_from,
};
pub use events::{EventLog, JsonlWriter, Relay, TelemetryError, now_rfc3339};
pub use export::{ExportOptions, Exporter, Rewinder, TensorBoardTarget, event_scalars, metric_scalars};
pub use follow::Follow;
pub use gpu_sample::{GpuDevicePoint, GpuDeviceStats, GpuPoint, GpuSample, HostSample, gpu_point, gpu_samples_from};
pub use key_order::first_unsorted_key;
pub use logging::{LogFormat, LogOptions, Lossy, LossyWriter, init_logging, lost_log_lines, report_lost_log_lines};
pub use metrics::{
    MetricPoint, MetricRecord, MetricsLine, RankCompute, StepLine, ValLine, ValPoint, metric_point, metrics_from,
    metrics_step,
};
pub use prometheus::{PromLabels, PromState, write_textfile};
pub use rank_beat::{RankBeat, rank_beat_file};
pub use records::{
    Jsonl, MAX_LINE_BYTES, for_each_jsonl, parse_jsonl, read_events_since, read_jsonl, read_jsonl_tail, time_field,
};
pub use redact::{MASK, Redactor, StreamRedactor};
pub use summary::{Summary, SummaryState};
