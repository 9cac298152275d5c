//! Training: models, optimizer, data and the state that goes into checkpoints.
//!
//! The [`Trainer`] owns everything a step reads or changes and turns it into
//! a [`Snapshot`](crate::checkpoint::Snapshot) of host tensors and JSON for the checkpoint store;
//! restoring one continues the run bit-exactly (`docs/determinism.md`).
//! Models plug in through the [`Workload`] trait (`docs/workloads.md`);
//! `mlp` and `gpt` are built in. [`validate_file`] checks JSONL datasets.
//! A step's samples are cut up by a [`Layout`] (data-parallel replicas,
//! micro-batch, accumulation); an out-of-memory step is retried with a
//! smaller one (`oom.rs`); [`footprint`] estimates the memory a config needs.

mod builtin;
mod data;
mod error;
mod footprint;
mod gpt;
mod layers;
mod layout;
mod mlp;
mod oom;
mod optim;
mod params;
mod registry;
mod rng;
mod scaler;
mod schedule;
mod trainer;
mod validate;
mod workload;

#[cfg(test)]
mod replica_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod world_tests;

pub use builtin::builtin_workload;
pub use data::{Classification, DataCursor, Sampler, TokenSequences, is_validation};
pub use error::{TrainError, candle_message, is_out_of_memory, is_out_of_memory_message};
pub use footprint::{CHECKPOINT_BYTES_PER_PARAM, checkpoint_bytes, footprint, footprint_for};
pub use gpt::{Gpt, GptShape, GptWorkload, VOCAB};
pub use layers::{Embedding, LayerNorm, Linear};
pub use layout::Layout;
pub use mlp::{Mlp, MlpWorkload};
pub use oom::{MAX_OOM_RETRIES, OomRetry};
pub use optim::{AdamW, AdamWConfig, Piece, ShardRange, moment_names, pieces, snapshot_tensors};
pub use params::{ParamStore, Params, from_host};
pub use registry::Registry;
pub use rng::{RngState, Stream, StreamRng};
pub use scaler::{LossScaler, ScalerState, compute_dtype};
pub use schedule::LrSchedule;
pub use trainer::{Counters, NonFiniteEvent, STATE_FORMAT, StepMetrics, StepResult, Trainer};
pub use validate::{
    CleanMode, CleanSummary, LengthStats, Problem, ProblemCount, ValidateOptions, ValidationReport, validate_file,
    write_clean,
};
pub use workload::{Batch, ForwardCtx, Split, Workload};
