//! Errors of `rekindle report`.

use std::io;
use std::path::PathBuf;

/// Why a report could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("{path} is not a run directory (no {file}); pass the directory `rekindle run` wrote to")]
    NotARunDir { path: PathBuf, file: &'static str },
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("cannot write the report to {path}: {source}; check that its directory exists and is writable")]
    Write { path: PathBuf, source: io::Error },
    /// `--out` names something that is not a regular file (the message of
    /// `source` says what, where, and what to do).
    #[error("--out: {source}")]
    Out { path: PathBuf, source: io::Error },
    #[error("drawing the {chart} chart failed: {message}")]
    Draw { chart: &'static str, message: String },
}
