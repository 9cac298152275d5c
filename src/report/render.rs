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
