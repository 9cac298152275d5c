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

const DRILLS: [&str; 30] = [
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
    "exec-nodeloss-injob",
    "exec-trainer",
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

/// The attempts drill `drill` is made of, by its design (docs/drills.md):
/// `cancel` is one attempt that is not requeued; `noprogress` is the
/// attempts its guard allows (`max_attempts_without_progress`, which the
/// drill passes in its summary's `extra`; the guard's own refusal is part of
/// the last one), every other drill one attempt that is stopped, killed,
/// hung, crashed or unhealthy and one that resumes and finishes. More means
/// an attempt the drill did not cause (a spurious requeue or restart), fewer
/// that the resume never happened.
fn expected_attempts(drill: &str, summary: &serde_json::Value) -> Option<u64> {
    match drill {
        "cancel" => Some(1),
        "noprogress" => summary["extra"]["max_attempts_without_progress"].as_u64(),
        _ => Some(2),
    }
}

/// Whether the judge's PASS for `drill` is believed, with the summary behind
/// it: checks were made (a judge that made none would print PASS for
/// nothing), none failed, the drill ran exactly the attempts it is made of,
/// and a model compared to its reference was equal.
fn believed(drill: &str, summary: &serde_json::Value) -> Result<(), String> {
    let checks = summary["checks"].as_u64().unwrap_or(0);
    let failed = summary["failed_checks"].as_array().map(Vec::len);
    let (attempts, expected) = (summary["attempts"].as_u64(), expected_attempts(drill, summary));
    if checks < 3 {
        return Err(format!("{checks} checks"));
    }
    if failed != Some(0) {
        return Err(format!("failed checks {failed:?}"));
    }
    if expected.is_none() || attempts != expected {
        return Err(format!("{attempts:?} attempts, the drill is made of {expected:?}"));
    }
    if summary["identical_to_reference"] == serde_json::json!(false) {
        return Err("not identical to its reference".into());
    }
    Ok(())
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
                if let Err(why) = believed(drill, &json) {
                    failures.push(format!("{drill}: PASS without the summary to back it ({why}): {json}"));
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

/// The belief in a PASS fails on doctored summaries: an attempt too few (the
/// resume never happened) or too many (a requeue the drill did not cause),
/// a cancelled job that came back, a noprogress drill past its guard, no
/// checks, a failed check, a model unlike its reference.
#[test]
fn a_pass_is_believed_only_with_the_attempts_the_drill_is_made_of() {
    let summary = |attempts: u64| {
        serde_json::json!({"result": "PASS", "attempts": attempts, "checks": 12, "failed_checks": [],
                           "identical_to_reference": true, "extra": {"max_attempts_without_progress": 2}})
    };
    assert_eq!(believed("term", &summary(2)), Ok(()));
    assert_eq!(believed("cancel", &summary(1)), Ok(()));
    assert_eq!(believed("noprogress", &summary(2)), Ok(()));
    for (drill, attempts) in [("term", 1), ("term", 3), ("dp-nodeloss-injob", 1), ("cancel", 2), ("noprogress", 3)] {
        let err = believed(drill, &summary(attempts)).expect_err(drill);
        assert!(err.contains("attempts, the drill is made of"), "{drill}: {err}");
    }
    let without_guard = serde_json::json!({"attempts": 2, "checks": 12, "failed_checks": []});
    assert!(believed("noprogress", &without_guard).is_err(), "no guard in the summary: nothing to compare with");
    let mut no_attempts = summary(2);
    no_attempts.as_object_mut().unwrap().remove("attempts");
    assert!(believed("term", &no_attempts).is_err());
    let doctored = |key: &str, value: serde_json::Value| {
        let mut s = summary(2);
        s[key] = value;
        believed("term", &s)
    };
    assert!(doctored("checks", 0.into()).is_err());
    assert!(doctored("failed_checks", serde_json::json!([{"check": "x"}])).is_err());
    assert!(doctored("identical_to_reference", false.into()).is_err());
    assert_eq!(doctored("identical_to_reference", serde_json::Value::Null), Ok(()), "no reference to compare with");
}
