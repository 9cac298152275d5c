//! `rekindle report`: one self-contained HTML file about a run — loss,
//! learning rate, throughput and GPU charts (inline SVG drawn with
//! `plotters`), every checkpoint, signal, requeue and resume, and a table of
//! attempts. Reads only the run directory; the page needs no network and no
//! script.
//!
//! - `render.rs`: the whole report, from run directory to file.
//! - `data.rs`: the run's records read back, with checkpoints and markers.
//! - `downsample.rs`: the points of a long run's charts, in bounded memory.
//! - `charts.rs`, `plot.rs`: the SVG charts.
//! - `html.rs`: the page.
//! - `error.rs`: [`ReportError`].

mod charts;
mod data;
mod downsample;
mod error;
mod html;
mod plot;
mod render;

pub use charts::Chart;
pub use data::{CheckpointMark, Marker, MarkerKind, RunData, checkpoints_and_markers};
pub use error::ReportError;
pub use render::{REPORT_FILE, render, write_report};
