//! The training engine's error type: one `thiserror` enum whose variants say
//! which step, tensor, key or file they concern.
//!
//! candle errors are turned into plain messages here (see [`candle_message`])
//! because, with `RUST_BACKTRACE=1`, candle attaches a full backtrace to every
//! error and that has no place in a user-facing message.

use std::path::PathBuf;

use thiserror::Error;

/// Everything that can go wrong while building, stepping, evaluating,
/// snapshotting or restoring a [`Trainer`](super::Trainer), loading data or
/// validating a dataset.
#[derive(Debug, Error)]
pub enum TrainError {
    /// A config value the engine cannot work with (checked when a trainer is built).
    #[error("invalid config `{key}`: {reason}")]
    Config { key: String, reason: String },

    /// The compute dtype cannot be used on this device.
    #[error("precision `{dtype}` is not supported on {device}: {reason}; use `[precision] dtype = \"f32\"`")]
    UnsupportedDtype { dtype: String, device: String, reason: String },

    /// The workload failed while declaring its parameters.
    #[error("building workload `{workload}` failed: {message}")]
    Build { workload: String, message: String },

    /// A tensor operation failed during a step (batch, forward, backward or update).
    #[error("step {step}: {during} failed: {message}")]
    Step { step: u64, during: &'static str, message: String },

    /// A tensor operation failed during evaluation.
    #[error("evaluation at step {step} failed: {message}")]
    Eval { step: u64, message: String },

    /// Copying a tensor to or from host memory failed.
    #[error("tensor `{name}`: {message}")]
    Tensor { name: String, message: String },

    /// A tensor the trainer needs is absent from a restored set.
    #[error("{set} state is missing tensor `{name}` (expected shape {expected_shape:?}, dtype F32)")]
    MissingTensor { set: &'static str, name: String, expected_shape: Vec<usize> },

    /// A restored set holds a tensor the trainer does not know.
    #[error("{set} state has unexpected tensor `{name}` (not a parameter of this model)")]
    UnexpectedTensor { set: &'static str, name: String },

    /// A restored tensor has the wrong shape or dtype.
    #[error("{set} tensor `{name}` has {found}, expected {expected}")]
    TensorMismatch {
        set: &'static str,
        name: String,
        /// Shape and dtype expected, e.g. `shape [4, 16], dtype F32`.
        expected: String,
        /// Shape and dtype found.
        found: String,
    },

    /// The JSON training state is malformed or belongs to another run.
    #[error("training state `{key}`: {reason}")]
    State { key: String, reason: String },

    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A dataset has invalid records and `[data] on_invalid = "error"`.
    #[error(
        "{path}: {invalid} of {lines} records are invalid ({summary}); run `rekindle data validate {path}` for details, or set `[data] on_invalid = \"skip\"`"
    )]
    InvalidDataset { path: PathBuf, lines: u64, invalid: u64, summary: String },

    /// A dataset split holds too little data to form a single sample.
    #[error("{what}: {reason}")]
    EmptyData { what: String, reason: String },
}

impl TrainError {
    pub(crate) fn config(key: &str, reason: impl Into<String>) -> Self {
        TrainError::Config { key: key.to_string(), reason: reason.into() }
    }

    pub(crate) fn state(key: &str, reason: impl Into<String>) -> Self {
        TrainError::State { key: key.to_string(), reason: reason.into() }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        TrainError::Io { path: path.into(), source }
    }
}

/// A candle error as one readable message, without the backtrace candle
/// attaches when `RUST_BACKTRACE` is set.
pub fn candle_message(err: &candle_core::Error) -> String {
    use candle_core::Error as E;
    match err {
        E::WithBacktrace { inner, .. } => candle_message(inner),
        E::Context { inner, context } => format!("{context}: {}", candle_message(inner)),
        E::WithPath { inner, path } => format!("{}: {}", path.display(), candle_message(inner)),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candle_messages_carry_no_backtrace() {
        let err = candle_core::Error::Msg("boom".into()).bt().context("while testing");
        assert_eq!(candle_message(&err), "while testing: boom");
    }
}
