//! The integration tests, as one test binary: each module is one area (the
//! command line, signals, resume, the report…), all sharing [`support`]. One
//! binary links candle once instead of once per file, which is most of the
//! time `cargo test` spends building them.
//!
//! Run one area with `cargo test --test it signals::`, one test with its full
//! name. Tests that need root, Python, Chromium or SLURM are listed in
//! [`support::requires`].
//!
//! No test here may configure a failpoint: failpoints are process-global, and
//! the checkpoint saves that corruption, Python interop and the harness run in
//! this process would hit them. Failpoint tests live in their own binary
//! (`tests/failpoints/`); `no_test_here_configures_failpoints` keeps it so.

mod support;

mod architecture;
mod boundary;
mod chaos;
mod claims;
mod cli;
mod control_plane;
mod corruption;
mod demo;
mod distributed;
mod documented;
mod documented_commands;
mod drills;
mod exec;
mod failed_start;
mod gpu_check;
mod gpu_run;
mod health;
mod hostile;
mod injob;
mod interval;
mod kill_chain;
mod lock;
mod logging;
mod own_model;
mod publish;
mod python_interop;
mod recovery;
mod report;
mod report_browser;
mod resume;
mod sigkill;
mod signals;
mod straggler;
mod telemetry;
mod torch_exec;
mod watchdog;

use std::fs;
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("listing {}: {e}", dir.display())) {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

#[test]
fn no_test_here_configures_failpoints() {
    // Built at run time so that this file does not match itself.
    let needles = [["fail", "::"].concat(), ["Fail", "Scenario"].concat(), ["fail", "_point!"].concat()];
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join("it");
    let offenders: Vec<String> = rust_files(&dir)
        .into_iter()
        .filter(|file| {
            let text = fs::read_to_string(file).expect("read test source");
            needles.iter().any(|n| text.contains(n.as_str()))
        })
        .map(|file| file.display().to_string())
        .collect();
    assert!(offenders.is_empty(), "failpoints belong in tests/failpoints/ (they are process-global): {offenders:?}");
}
