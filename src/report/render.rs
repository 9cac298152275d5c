//! The report of a run from its directory to a file: load the records, draw
//! the charts, lay out the page, write it atomically.

use std::path::{Path, PathBuf};

use super::charts;
use super::data::RunData;
use super::error::ReportError;
use super::html;

/// Default report file name, inside the run directory.
pub const REPORT_FILE: &str = "report.html";

/// The report of the run in `dir`, as HTML.
pub fn render(dir: &Path) -> Result<String, ReportError> {
    let data = RunData::load(dir)?;
    let charts = charts::all(&data)?;
    Ok(html::page(&data, &charts))
}

/// Writes the report of the run in `dir` to `out` (default
/// `<dir>/report.html`) atomically; returns where it went.
pub fn write_report(dir: &Path, out: Option<&Path>) -> Result<PathBuf, ReportError> {
    // Checked before the work: a refused --out costs no rendering.
    if let Some(out) = out {
        crate::confine::replaceable_file(out).map_err(|source| ReportError::Out { path: out.to_path_buf(), source })?;
    }
    let html = render(dir)?;
    let path = out.map(Path::to_path_buf).unwrap_or_else(|| dir.join(REPORT_FILE));
    crate::rundir::write_atomically(&path, html.as_bytes())
        .map_err(|source| ReportError::Write { path: path.clone(), source })?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_without_records_yet_renders_with_notes_instead_of_charts() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join(crate::rundir::CONFIG_FILE), "[run]\nname = \"fresh\"\n").unwrap();
        let html = render(tmp.path()).unwrap();
        assert!(html.contains("<title>rekindle report: fresh</title>"));
        assert!(html.contains("No metrics yet"));
        assert!(!html.contains("<figure"));
        assert!(!html.contains("<svg"));
    }

    #[test]
    fn a_run_of_two_ranks_draws_each_ranks_step_time_and_marks_its_straggler() {
        use serde_json::json;
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join(crate::rundir::CONFIG_FILE), "[run]\nname = \"dp\"\n").unwrap();
        let metrics: String = (1..=30)
            .map(|step| {
                let slow = if step > 10 { 0.3 } else { 0.1 };
                let line = json!({"step": step, "loss": 1.0, "lr": 0.1, "elapsed_s": slow + 0.01,
                                  "rank_compute_s": [0.1, slow], "time": "2026-11-01T10:00:00Z"});
                format!("{line}\n")
            })
            .collect();
        std::fs::write(tmp.path().join(crate::rundir::METRICS_FILE), metrics).unwrap();
        let events = [
            json!({"event": "start", "node": "n1", "time": "2026-11-01T10:00:00Z"}),
            json!({"event": "straggler", "node": "n1", "time": "2026-11-01T10:00:05Z", "rank": 1, "rank_node": "n2",
                   "step": 30, "step_seconds": 0.3, "median_seconds": 0.1, "factor": 1.5, "steps": 20,
                   "blamed": false, "world_size": 2}),
        ];
        let text: String = events.iter().map(|e| format!("{e}\n")).collect();
        std::fs::write(tmp.path().join(crate::rundir::EVENTS_FILE), text).unwrap();
        let html = render(tmp.path()).unwrap();
        let figure = html.split("<figure id=\"chart-step-time\">").nth(1).expect("a step-time chart");
        let figure = figure.split("</figure>").next().unwrap();
        for wanted in ["Step time per rank", "rank 0", "rank 1", "straggler rank 1"] {
            assert!(figure.contains(wanted), "{wanted} missing from the chart");
        }
        assert!(
            html.contains("rank 1 on n2 from step 30: 0.300 s a step against the other ranks&#39; median"),
            "{html}"
        );
        // A process alone: its step time, no ranks.
        let alone = tempfile::tempdir().unwrap();
        std::fs::write(alone.path().join(crate::rundir::CONFIG_FILE), "[run]\nname = \"one\"\n").unwrap();
        let line = json!({"step": 1, "loss": 1.0, "lr": 0.1, "elapsed_s": 0.2, "time": "2026-11-01T10:00:00Z"});
        std::fs::write(alone.path().join(crate::rundir::METRICS_FILE), format!("{line}\n")).unwrap();
        let html = render(alone.path()).unwrap();
        let figure = html.split("<figure id=\"chart-step-time\">").nth(1).expect("a step-time chart");
        assert!(figure.contains("Step time") && !figure.contains("rank 0"));
    }

    mod fuzz {
        use crate::fuzz;
        use crate::rundir::status::tests::fuzz::{damaged_run_dir, write_run_dir};
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(fuzz::config())]

            /// `rekindle report` over the damaged run directories that
            /// `rekindle status` is fuzzed with: an error or a page, never a panic.
            #[test]
            fn the_report_of_a_damaged_run_dir_never_panics(files in damaged_run_dir()) {
                let tmp = write_run_dir(&files);
                let _ = super::super::render(tmp.path());
            }
        }
    }

    #[test]
    fn a_directory_without_config_is_not_a_run() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(matches!(render(tmp.path()), Err(ReportError::NotARunDir { .. })));
    }
}
