//! Training: models, optimizer, data and the state that goes into checkpoints.
//!
//! The [`Trainer`] owns everything a step reads or changes and turns it into
//! a [`TrainSnapshot`] of host tensors and JSON for the checkpoint store;
//! restoring one continues the run bit-exactly (`docs/determinism.md`).
//! Models plug in through the [`Workload`] trait (`docs/workloads.md`);
//! `mlp` and `gpt` are built in. [`validate_file`] checks JSONL datasets.

mod error;
mod optim;
mod params;
mod rng;
mod scaler;
mod schedule;
mod validate;

pub use error::{TrainError, candle_message};
pub use optim::{AdamW, AdamWConfig, moment_names};
pub use params::{ParamStore, Params};
pub use rng::{RngState, Stream, StreamRng};
pub use scaler::{LossScaler, ScalerState, compute_dtype};
pub use schedule::LrSchedule;
pub use validate::{
    CleanMode, CleanSummary, LengthStats, Problem, ProblemCount, ValidateOptions, ValidationReport, validate_file,
    write_clean,
};
