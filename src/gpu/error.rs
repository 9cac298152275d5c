//! Errors of GPU detection, inventories, placement and monitoring. A missing
//! driver library is not an error (it is a note on the probe result): these
//! variants are for things the user has to fix.

use std::io;
use std::path::PathBuf;

/// Everything in `gpu/` that can fail.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("cannot read GPU inventory {path}: {source}")]
    InventoryRead { path: PathBuf, source: io::Error },
    #[error("GPU inventory {path} is not valid JSON at line {line}, column {column}: {message}")]
    InventorySyntax { path: PathBuf, line: usize, column: usize, message: String },
    #[error("GPU inventory {path}: `{field}` {message}")]
    InventoryField {
        path: PathBuf,
        /// JSON path of the offending value, e.g. `devices[1].memory_total_mib`.
        field: String,
        message: String,
    },
    /// No placement fits (or the request is invalid); the reason says why
    /// and what would help.
    #[error("no placement: {reason}")]
    NoPlacement { reason: String },
    #[error("{vendor} probe failed: {message}")]
    Probe { vendor: &'static str, message: String },
    #[error("cannot write GPU statistics to {path}: {source}")]
    StatsWrite { path: PathBuf, source: io::Error },
    #[error("cannot start the GPU monitor thread: {0}")]
    MonitorSpawn(io::Error),
}
