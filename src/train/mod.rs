//! Training: models, optimizer, data and the state that goes into checkpoints.
//!
//! The [`Trainer`] owns everything a step reads or changes and turns it into
//! a [`TrainSnapshot`] of host tensors and JSON for the checkpoint store;
//! restoring one continues the run bit-exactly (`docs/determinism.md`).
//! Models plug in through the [`Workload`] trait (`docs/workloads.md`);
//! `mlp` and `gpt` are built in. [`validate_file`] checks JSONL datasets.

mod data;
mod error;
mod gpt;
mod layers;
mod mlp;
mod optim;
mod params;
mod rng;
mod scaler;
mod schedule;
mod trainer;
mod validate;
mod workload;

#[cfg(test)]
mod tests;

pub use data::{Classification, DataCursor, Sampler, TokenSequences, is_validation};
pub use error::{TrainError, candle_message};
pub use gpt::{Gpt, GptShape, GptWorkload, VOCAB};
pub use layers::{Embedding, LayerNorm, Linear};
pub use mlp::{Mlp, MlpWorkload};
pub use optim::{AdamW, AdamWConfig, moment_names};
pub use params::{ParamStore, Params};
pub use rng::{RngState, Stream, StreamRng};
pub use scaler::{LossScaler, ScalerState, compute_dtype};
pub use schedule::LrSchedule;
pub use trainer::{Counters, NonFiniteEvent, STATE_FORMAT, StepMetrics, StepResult, TrainSnapshot, Trainer};
pub use validate::{
    CleanMode, CleanSummary, LengthStats, Problem, ProblemCount, ValidateOptions, ValidationReport, validate_file,
    write_clean,
};
pub use workload::{Batch, ForwardCtx, Split, Workload, builtin_workload};
