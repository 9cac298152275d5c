//! The SLURM drills against a real SLURM: brings the local cluster up
//! (`slurm/local-cluster.sh`, which installs the Debian packages when they are
//! missing), runs every drill of `slurm/drill.sh` with the binary under
//! test, asserts each printed PASS, and brings the cluster down again.
//!
//! Skipped, with a loud SKIPPED line, only where SLURM cannot be installed at
//! all (not root, or no apt-get) — and never when `CI` is set: CI must run them.
//! The drills take a few minutes; their progress goes to stderr
//! (`cargo test --test it drills:: -- --nocapture` shows it live).
//!
//! Also here, because it belongs with them: the unit checks of
//! `slurm/drill_check.py`, the judge, on made-up records
//! (`slurm/test_drill_check.py`): its bounds must be able to fail.

use std::process::{Command, Stdio};

use crate::support::cluster::{LocalCluster, repo};

const DRILLS: [&str; 28] = [
    "term",
    "term-batch",
    "term-full",
    "usr1",
    "warn",
    "warn-batch",
    "preempt",
    "preempt-nosignal",
    "nodeloss",
    "cancel",
    "hang",
    "crash",
    "dp",
    "dp-preempt",
    "dp-nodeloss",
    "dp-nodeloss-injob",
    "dp-nodeloss-injob-nospare",
    "dp-rankkill-injob",
    "dp-nodeloss-wide",
    "hang-injob",
    "own",
    "exec",
    "exec-ddp",
    "exec-torchrun",
    "exec-nodeloss",
    "badnode",
    "noprogress",
    "dp-straggler",
];

/// The JSON summary printed on the line after `<RESULT> <drill>:`.
fn summary_of<'a>(stdout: &'a str, drill: &str) -> Option<(&'a str, serde_json::Value)> {
    let mut lines = stdout.lines();
    while let Some(line) = lines.next() {
        let Some((result, rest)) = line.split_once(' ') else { continue };
        if rest.starts_with(&format!("{drill}:")) && ["PASS", "FAIL"].contains(&result) {
            let json = lines.next().and_then(|l| serde_json::from_str(l).ok())?;
            return Some((line, json));
        }
    }
    None
}

#[test]
fn every_drill_passes_on_the_local_slurm_cluster() {
    if crate::support::requires::slurm().is_none() {
        return;
    }
    let cluster = LocalCluster::up();
    let work = tempfile::tempdir().expect("temp dir");

    let out = Command::new(repo().join("slurm/drill.sh"))
        .args(DRILLS)
        .env("SLURM_CONF", cluster.conf())
        .env("REKINDLE_BIN", env!("CARGO_BIN_EXE_rekindle"))
        .env("DRILL_OWN_BIN", crate::support::example_exe("own_model"))
        .env("DRILL_DIR", work.path())
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .expect("run slurm/drill.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");

    let mut failures = Vec::new();
    for drill in DRILLS {
        match summary_of(&stdout, drill) {
            Some((line, json)) if line.starts_with("PASS") && json["result"] == "PASS" => {
                // The judge's PASS line is believed only with the summary
                // behind it: checks were made (a judge that made none would
                // print PASS for nothing), none failed, an attempt ran, and
                // a model compared to its reference was equal.
                let checks = json["checks"].as_u64().unwrap_or(0);
                let failed = json["failed_checks"].as_array().map(Vec::len);
                let ok = checks >= 3
                    && failed == Some(0)
                    && json["attempts"].as_u64().is_some_and(|n| n >= 1)
                    && json["identical_to_reference"] != serde_json::json!(false);
                if !ok {
                    failures.push(format!(
                        "{drill}: PASS without the summary to back it ({checks} checks, failed {failed:?}, \
                         attempts {}, identical_to_reference {}): {json}",
                        json["attempts"], json["identical_to_reference"]
                    ));
                }
            }
            Some((line, json)) => failures.push(format!("{line}\n    failed checks: {}", json["failed_checks"])),
            None => failures.push(format!("{drill}: no PASS/FAIL line")),
        }
    }
    // The whole output was printed above; CI keeps only the head and the
    // tail of a long log, so the verdict comes last and alone.
    assert!(
        failures.is_empty(),
        "{} of {} drills failed (their output is above):\n{}",
        failures.len(),
        DRILLS.len(),
        failures.join("\n")
    );
    assert!(out.status.success(), "slurm/drill.sh exited with {:?}", out.status);
}

/// The judge's own checks can fail: `slurm/test_drill_check.py` feeds
/// `drill_check.py` made-up records, among them a doctored node loss (a save
/// in flight far longer than the run's saves take) that its bound on the
/// steps lost must reject.
#[test]
fn the_drill_judge_rejects_doctored_records() {
    let out = Command::new("python3")
        .args(["-m", "unittest", "discover", "-s", "slurm", "-p", "test_*.py", "-v"])
        .current_dir(repo())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::null())
        .output()
        .expect("run python3 -m unittest (python3 is needed by the drills anyway)");
    assert!(
        out.status.success(),
        "slurm/test_drill_check.py failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
