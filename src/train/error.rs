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

    /// The ranks of a data-parallel run could not agree (a collective
    /// failed, or ranks disagree on what they hold).
    #[error("step {step}: ranks of the data-parallel run could not agree on {during}: {message}")]
    Collective { step: u64, during: &'static str, message: String },

    /// A micro-batch ran out of device memory. The step was not applied
    /// (the trainer is as after the previous step), so it can be retried
    /// with a smaller micro-batch ([`Trainer::train_step_with_backoff`](super::Trainer::train_step_with_backoff)).
    #[error("step {step}: out of memory in {during} with micro-batch {micro_batch}: {message}")]
    OutOfMemory { step: u64, micro_batch: usize, during: &'static str, message: String },

    /// A step still ran out of memory after the back-off gave up.
    #[error(
        "step {step} ran out of memory {attempts} time(s); gave up at micro-batch {micro_batch} after \
         {retries} halving(s) (the back-off halves at most {max_retries} times, down to 1 sample): {message}"
    )]
    OutOfMemoryRetriesExhausted {
        step: u64,
        attempts: u32,
        retries: u32,
        max_retries: u32,
        micro_batch: usize,
        message: String,
    },

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
    /// `check` is the `rekindle data validate` command line that checks the
    /// file as the run did (its `[data] field` and `max_len`). The strings
    /// are boxed to keep every error small (`RunError` carries this one).
    #[error(
        "{path}: {invalid} of {lines} records are invalid ({summary}); run `{check}` for details, or set `[data] on_invalid = \"skip\"`"
    )]
    InvalidDataset { path: PathBuf, lines: u64, invalid: u64, summary: Box<str>, check: Box<str> },

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

/// Whether a candle error is a device allocation failure (see
/// [`is_out_of_memory_message`]). candle's CUDA errors (`Error::Cuda`) wrap
/// cudarc's, whose text is their `Debug` form, so the message is all there is
/// to go by; the CPU backend aborts on allocation failure instead, so on the
/// CPU this only sees injected failures.
pub fn is_out_of_memory(err: &candle_core::Error) -> bool {
    is_out_of_memory_message(&candle_message(err))
}

/// Whether an error message says a device allocation failed: the CUDA
/// driver's `DriverError(CUDA_ERROR_OUT_OF_MEMORY, "out of memory")`, the
/// runtime's `cudaErrorMemoryAllocation`, cuBLAS's
/// `CublasError(CUBLAS_STATUS_ALLOC_FAILED)` (a matmul's workspace), cuRAND's
/// `CurandError(CURAND_STATUS_ALLOCATION_FAILED)`, or plain "out of memory".
pub fn is_out_of_memory_message(message: &str) -> bool {
    let message = message.to_ascii_lowercase();
    ["out of memory", "out_of_memory", "cudaerrormemoryallocation", "status_alloc_failed", "status_allocation_failed"]
        .iter()
        .any(|needle| message.contains(needle))
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
    fn out_of_memory_is_recognised_through_wrappers() {
        let cuda = candle_core::Error::Msg("DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")".into());
        assert!(is_out_of_memory(&cuda.bt().context("matmul")));
        assert!(is_out_of_memory(&candle_core::Error::Msg("alloc: Out of memory".into())));
        assert!(!is_out_of_memory(&candle_core::Error::Msg("shape mismatch in matmul".into())));
        assert!(!is_out_of_memory(&candle_core::Error::NotCompiledWithCudaSupport));
    }

    #[test]
    fn cuda_cublas_and_curand_allocation_failures_are_out_of_memory() {
        for text in [
            // cudarc's DriverError, with and without the driver's string.
            "DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")",
            "DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"<Failure when calling cuGetErrorString()>\")",
            "CublasError(CUBLAS_STATUS_ALLOC_FAILED)",
            "CublasError(CUBLASLT_STATUS_ALLOC_FAILED)",
            "CurandError(CURAND_STATUS_ALLOCATION_FAILED)",
            "cudaErrorMemoryAllocation",
        ] {
            assert!(is_out_of_memory_message(text), "{text}");
        }
        for text in [
            "DriverError(CUDA_ERROR_ILLEGAL_ADDRESS, \"an illegal memory access was encountered\")",
            "CublasError(CUBLAS_STATUS_EXECUTION_FAILED)",
            "DriverError(CUDA_ERROR_NO_DEVICE, \"no CUDA-capable device is detected\")",
            "missing kernel 'affine'",
        ] {
            assert!(!is_out_of_memory_message(text), "{text}");
        }
    }

    #[test]
    fn candle_messages_carry_no_backtrace() {
        let err = candle_core::Error::Msg("boom".into()).bt().context("while testing");
        assert_eq!(candle_message(&err), "while testing: boom");
    }
}
