//! Damaged checkpoints: every kind of damage to every file is detected, named
//! with the right file and reason, and loading falls back to the previous
//! checkpoint. The `rekindle verify` and `rekindle checkpoints` commands report
//! the same file and reason, in text and in JSON, with the documented exit codes.

use crate::support;

use std::ffi::OsStr;
use std::fs;
use std::path::Path;

use assert_cmd::prelude::*;

use rekindle::checkpoint::{
    CheckpointStore, FileFailure, MANIFEST_FILE, MODEL_FILE, OPTIMIZER_FILE, Problem, STATE_FILE, VerifyLevel,
};

use serde_json::Value;
use std::process::Command;
use support::{flip_byte, save_steps, small_snapshot, temp_store, truncate_half};

const GOOD: u64 = 1;
const DAMAGED: u64 = 2;

/// Saves steps 1 and 2, damages step 2 with `damage`, and returns the store.
fn store_with_damaged_newest(damage: impl FnOnce(&Path)) -> (tempfile::TempDir, CheckpointStore) {
    let (tmp, store) = temp_store(3);
    save_steps(&store, &[GOOD, DAMAGED]);
    damage(&store.step_dir(DAMAGED));
    (tmp, store)
}

/// Asserts that `load_latest` falls back to step 1 and reports step 2 as
/// failing in `file` for a reason `is_expected` accepts, and that a full
/// listing reports the same.
fn assert_falls_back(
    store: &CheckpointStore,
    file: &str,
    tag: &str,
    is_expected: impl Fn(&Problem) -> bool,
) -> FileFailure {
    let outcome = store.load_latest().unwrap();
    let loaded = outcome.loaded.expect("the previous checkpoint loads");
    assert_eq!(loaded.snapshot, small_snapshot(GOOD), "fell back to the wrong checkpoint");
    assert_eq!(outcome.rejected.len(), 1, "rejected: {:?}", outcome.rejected);
    let rejected = &outcome.rejected[0];
    assert_eq!(rejected.step, DAMAGED);
    assert!(!rejected.valid);
    let failure = rejected
        .failures
        .iter()
        .find(|f| f.file == file)
        .unwrap_or_else(|| panic!("no failure names {file}: {:?}", rejected.failures))
        .clone();
    assert!(is_expected(&failure.problem), "{file}: unexpected problem {:?}", failure.problem);

    let listed = store.list(VerifyLevel::Full).unwrap();
    assert_eq!(listed.iter().map(|i| (i.step, i.valid)).collect::<Vec<_>>(), vec![(DAMAGED, false), (GOOD, true)]);
    assert!(listed[0].failures.contains(&failure), "list(Full) disagrees: {:?}", listed[0].failures);
    assert_cli_reports(store, &failure, tag);
    failure
}

/// Runs the real `rekindle` binary; returns (exit code, stdout).
fn rekindle(args: &[&OsStr]) -> (i32, String) {
    let out = Command::cargo_bin("rekindle").unwrap().args(args).output().expect("run rekindle");
    let code = out.status.code().expect("rekindle exited normally");
    (code, String::from_utf8(out.stdout).expect("utf-8 stdout"))
}

fn rekindle_json(args: &[&OsStr]) -> (i32, Value) {
    let mut with_json = args.to_vec();
    with_json.push(OsStr::new("--json"));
    let (code, stdout) = rekindle(&with_json);
    let json =
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{args:?} --json printed non-JSON ({e}):\n{stdout}"));
    (code, json)
}

/// True when a JSON failure list names `file` with the snake_case `tag`.
fn json_names(failures: &Value, file: &str, tag: &str) -> bool {
    failures.as_array().is_some_and(|fs| fs.iter().any(|f| f["file"] == file && f["problem"] == tag))
}

/// The binary reports the damaged step 2 of `store` like the library does:
/// `verify` exits 1 naming the file and the reason (text and JSON) for the
/// checkpoint and for its run directory, exits 0 for the intact step 1, and
/// `checkpoints --json` lists step 2 invalid with the reason, step 1 valid.
fn assert_cli_reports(store: &CheckpointStore, failure: &FileFailure, tag: &str) {
    let damaged = store.step_dir(DAMAGED);
    let run_dir = store.dir().parent().unwrap();

    let (code, text) = rekindle(&[OsStr::new("verify"), damaged.as_os_str()]);
    assert_eq!(code, 1, "verify of a damaged checkpoint must exit 1:\n{text}");
    assert!(text.contains(&failure.file), "verify output does not name {}:\n{text}", failure.file);
    assert!(
        text.contains(&failure.problem.to_string()),
        "verify output lacks the reason `{}`:\n{text}",
        failure.problem
    );

    let (code, json) = rekindle_json(&[OsStr::new("verify"), damaged.as_os_str()]);
    assert_eq!(code, 1);
    assert_eq!(json["all_valid"], false);
    assert_eq!(json["checkpoints"][0]["valid"], false);
    let failures = &json["checkpoints"][0]["failures"];
    assert!(json_names(failures, &failure.file, tag), "verify --json lacks {} / {tag}: {failures}", failure.file);

    let (code, text) = rekindle(&[OsStr::new("verify"), run_dir.as_os_str()]);
    assert_eq!(code, 1, "verify of a run holding a damaged checkpoint must exit 1:\n{text}");
    let (code, text) = rekindle(&[OsStr::new("verify"), store.step_dir(GOOD).as_os_str()]);
    assert_eq!(code, 0, "verify of the intact checkpoint must exit 0:\n{text}");

    let (code, json) = rekindle_json(&[OsStr::new("checkpoints"), run_dir.as_os_str()]);
    assert_eq!(code, 0);
    assert_eq!(json["resume_step"], GOOD);
    let listed = json["checkpoints"].as_array().unwrap();
    let summary: Vec<(u64, bool)> =
        listed.iter().map(|c| (c["step"].as_u64().unwrap(), c["valid"].as_bool().unwrap())).collect();
    assert_eq!(summary, vec![(DAMAGED, false), (GOOD, true)]);
    assert!(json_names(&listed[0]["failures"], &failure.file, tag), "checkpoints --json: {}", listed[0]);
    assert_eq!(listed[1]["failures"], serde_json::json!([]));
}

fn rewrite_manifest(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join(MANIFEST_FILE);
    let mut manifest: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    edit(&mut manifest);
    fs::write(&path, serde_json::to_vec_pretty(&manifest).unwrap()).unwrap();
}

/// Rewrites the model file *and* its manifest entry (as a buggy writer or a
/// person might): sizes and hashes match, the content does not parse.
fn replace_model_with_rehashed_junk(dir: &Path) {
    replace_model_with_rehashed(dir, b"this is not a safetensors file");
}

/// Replaces the model file with `junk` and records its size and hash in the
/// manifest, so only the content check can refuse it.
fn replace_model_with_rehashed(dir: &Path, junk: &[u8]) {
    fs::write(dir.join(MODEL_FILE), junk).unwrap();
    let sha = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(junk))
    };
    rewrite_manifest(dir, |m| {
        for entry in m["files"].as_array_mut().unwrap() {
            if entry["name"] == MODEL_FILE {
                entry["bytes"] = junk.len().into();
                entry["sha256"] = sha.clone().into();
            }
        }
    });
}

macro_rules! file_damage_cases {
    ($($flip:ident, $truncate:ident, $delete:ident: $file:expr;)*) => {$(
        #[test]
        fn $flip() {
            let (_tmp, store) = store_with_damaged_newest(|dir| flip_byte(&dir.join($file)));
            let failure = assert_falls_back(&store, $file, "sha256_mismatch", |p| matches!(p, Problem::Sha256Mismatch { .. }));
            // A flipped byte keeps the size: only the hash can notice it.
            assert!(store.list(VerifyLevel::Quick).unwrap()[0].valid, "quick verification reads no contents");
            assert!(failure.to_string().contains("sha256 mismatch"), "{failure}");
        }

        #[test]
        fn $truncate() {
            let (_tmp, store) = store_with_damaged_newest(|dir| truncate_half(&dir.join($file)));
            let full = fs::metadata(store.step_dir(GOOD).join($file)).unwrap().len();
            assert_falls_back(&store, $file, "wrong_size", |p| {
                *p == Problem::WrongSize { expected: full, actual: full / 2 }
            });
        }

        #[test]
        fn $delete() {
            let (_tmp, store) = store_with_damaged_newest(|dir| fs::remove_file(dir.join($file)).unwrap());
            assert_falls_back(&store, $file, "missing", |p| *p == Problem::Missing);
        }
    )*};
}

file_damage_cases! {
    flipped_byte_in_model_falls_back_with_sha256_mismatch,
    truncated_model_falls_back_with_wrong_size,
    deleted_model_falls_back_with_missing: MODEL_FILE;
    flipped_byte_in_optimizer_falls_back_with_sha256_mismatch,
    truncated_optimizer_falls_back_with_wrong_size,
    deleted_optimizer_falls_back_with_missing: OPTIMIZER_FILE;
    flipped_byte_in_state_falls_back_with_sha256_mismatch,
    truncated_state_falls_back_with_wrong_size,
    deleted_state_falls_back_with_missing: STATE_FILE;
}

#[test]
fn garbled_manifest_falls_back_with_manifest_invalid() {
    let (_tmp, store) = store_with_damaged_newest(|dir| flip_byte(&dir.join(MANIFEST_FILE)));
    assert_falls_back(&store, MANIFEST_FILE, "manifest_invalid", |p| matches!(p, Problem::ManifestInvalid { .. }));
}

#[test]
fn manifest_of_garbage_bytes_falls_back_with_manifest_invalid() {
    let (_tmp, store) =
        store_with_damaged_newest(|dir| fs::write(dir.join(MANIFEST_FILE), b"\x00\xffgarbage").unwrap());
    assert_falls_back(&store, MANIFEST_FILE, "manifest_invalid", |p| matches!(p, Problem::ManifestInvalid { .. }));
}

#[test]
fn truncated_manifest_falls_back_with_manifest_invalid() {
    let (_tmp, store) = store_with_damaged_newest(|dir| truncate_half(&dir.join(MANIFEST_FILE)));
    assert_falls_back(&store, MANIFEST_FILE, "manifest_invalid", |p| matches!(p, Problem::ManifestInvalid { .. }));
}

#[test]
fn deleted_manifest_falls_back_with_manifest_missing() {
    let (_tmp, store) = store_with_damaged_newest(|dir| fs::remove_file(dir.join(MANIFEST_FILE)).unwrap());
    assert_falls_back(&store, MANIFEST_FILE, "manifest_missing", |p| *p == Problem::ManifestMissing);
}

#[test]
fn manifest_from_a_newer_format_falls_back_with_unknown_format_version() {
    let (_tmp, store) = store_with_damaged_newest(|dir| rewrite_manifest(dir, |m| m["format_version"] = 3.into()));
    assert_falls_back(&store, MANIFEST_FILE, "unknown_format_version", |p| {
        *p == Problem::UnknownFormatVersion { found: 3, supported: 2 }
    });
}

#[test]
fn manifest_entry_outside_the_checkpoint_falls_back_with_path_outside() {
    let (tmp, store) = store_with_damaged_newest(|dir| {
        // A file the entry would point at, with matching size and hash, so
        // only the refusal of the path itself can reject it.
        fs::write(dir.parent().unwrap().join("x"), b"x").unwrap();
        rewrite_manifest(dir, |m| {
            m["files"].as_array_mut().unwrap().push(serde_json::json!({
                "name": "../x",
                "bytes": 1,
                "sha256": "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881",
            }));
        });
    });
    assert_falls_back(&store, "../x", "path_outside", |p| *p == Problem::PathOutside { name: "../x".into() });
    assert!(tmp.path().join("checkpoints/x").exists(), "the file outside is never touched");
}

#[test]
fn symlinked_file_falls_back_with_not_plain_file() {
    let (tmp, store) = store_with_damaged_newest(|dir| {
        // The link points at identical bytes: refused for being a link, not for its content.
        let outside = dir.parent().unwrap().parent().unwrap().join("outside.json");
        fs::rename(dir.join(STATE_FILE), &outside).unwrap();
        std::os::unix::fs::symlink(&outside, dir.join(STATE_FILE)).unwrap();
    });
    assert_falls_back(&store, STATE_FILE, "not_plain_file", |p| *p == Problem::NotPlainFile);
    assert!(tmp.path().join("outside.json").exists());
}

#[test]
fn file_with_matching_hash_but_invalid_content_falls_back_with_invalid_content() {
    let (_tmp, store) = store_with_damaged_newest(replace_model_with_rehashed_junk);
    let outcome = store.load_latest().unwrap();
    assert_eq!(outcome.loaded.unwrap().snapshot.step, GOOD);
    let failures = &outcome.rejected[0].failures;
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!(failures[0].file, MODEL_FILE);
    assert!(matches!(failures[0].problem, Problem::InvalidContent { .. }), "{:?}", failures[0].problem);
}

#[test]
fn every_checkpoint_damaged_loads_nothing_and_reports_all() {
    let (_tmp, store) = temp_store(3);
    save_steps(&store, &[1, 2, 3]);
    for step in [1, 2, 3] {
        flip_byte(&store.step_dir(step).join(OPTIMIZER_FILE));
    }
    let outcome = store.load_latest().unwrap();
    assert!(outcome.loaded.is_none());
    assert_eq!(outcome.rejected.iter().map(|r| r.step).collect::<Vec<_>>(), vec![3, 2, 1]);
}

#[test]
fn verify_exits_zero_for_an_intact_checkpoint_checkpoints_dir_and_run_dir() {
    let (tmp, store) = temp_store(3);
    save_steps(&store, &[1, 2, 3]);
    for path in [store.step_dir(3), store.dir().to_path_buf(), tmp.path().to_path_buf()] {
        let (code, text) = rekindle(&[OsStr::new("verify"), path.as_os_str()]);
        assert_eq!(code, 0, "verify {}:\n{text}", path.display());
        let (code, json) = rekindle_json(&[OsStr::new("verify"), path.as_os_str()]);
        assert_eq!(code, 0);
        assert_eq!(json["all_valid"], true, "{json}");
        assert!(json["checkpoints"].as_array().is_some_and(|c| !c.is_empty()), "{json}");
    }
    let (code, json) = rekindle_json(&[OsStr::new("checkpoints"), tmp.path().as_os_str()]);
    assert_eq!(code, 0);
    assert_eq!(json["resume_step"], 3);
    let steps: Vec<u64> = json["checkpoints"].as_array().unwrap().iter().map(|c| c["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, vec![3, 2, 1]);
    assert!(json["checkpoints"].as_array().unwrap().iter().all(|c| c["valid"] == true));
}

#[test]
fn verify_reports_every_damaged_checkpoint_of_a_run() {
    let (tmp, store) = temp_store(3);
    save_steps(&store, &[1, 2, 3]);
    fs::remove_file(store.step_dir(1).join(OPTIMIZER_FILE)).unwrap();
    flip_byte(&store.step_dir(3).join(MODEL_FILE));
    let (code, text) = rekindle(&[OsStr::new("verify"), tmp.path().as_os_str()]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains(&format!("{MODEL_FILE}: sha256 mismatch")), "{text}");
    assert!(text.contains(&format!("{OPTIMIZER_FILE}: missing")), "{text}");
    let (code, json) = rekindle_json(&[OsStr::new("verify"), store.dir().as_os_str()]);
    assert_eq!(code, 1);
    let valid: Vec<bool> = json["checkpoints"].as_array().unwrap().iter().map(|c| c["valid"] == true).collect();
    assert_eq!(valid, vec![false, true, false]);
    assert!(json_names(&json["checkpoints"][0]["failures"], MODEL_FILE, "sha256_mismatch"), "{json}");
    assert!(json_names(&json["checkpoints"][2]["failures"], OPTIMIZER_FILE, "missing"), "{json}");
}

#[test]
fn verify_rejects_a_file_with_matching_hash_but_invalid_content_like_load_latest_does() {
    let (tmp, store) = store_with_damaged_newest(replace_model_with_rehashed_junk);
    let dir = store.step_dir(DAMAGED);
    assert_eq!(store.load_latest().unwrap().loaded.unwrap().snapshot.step, GOOD);
    let (code, json) = rekindle_json(&[OsStr::new("verify"), dir.as_os_str()]);
    assert_eq!(code, 1, "verify accepts a checkpoint that resume rejects: {json}");
    let (_, json) = rekindle_json(&[OsStr::new("checkpoints"), tmp.path().as_os_str()]);
    assert_eq!(json["resume_step"], GOOD, "checkpoints names a resume point that resume would skip: {json}");
}

/// Runs the real binary; `(exit code, stdout, stderr)`, asserting it did not panic.
fn rekindle_unpanicked(args: &[&OsStr]) -> (i32, String, String) {
    let out = Command::cargo_bin("rekindle").unwrap().args(args).output().expect("run rekindle");
    let (stdout, stderr) =
        (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
    let code = out.status.code().unwrap_or_else(|| panic!("rekindle {args:?} died of a signal:\n{stderr}"));
    assert!(!stderr.contains("panicked"), "rekindle {args:?} panicked:\n{stderr}");
    assert_ne!(code, 101, "rekindle {args:?} exited 101 (a panic):\n{stderr}");
    (code, stdout, stderr)
}

/// A safetensors file whose header is `header` (JSON) and whose data is `data` bytes of zeros.
fn safetensors_with_header(len_prefix: u64, header: &[u8], data: usize) -> Vec<u8> {
    let mut file = len_prefix.to_le_bytes().to_vec();
    file.extend_from_slice(header);
    file.extend(std::iter::repeat_n(0u8, data));
    file
}

/// Hostile files (a safetensors header claiming 2^60 bytes, a shape whose
/// byte count overflows, data offsets past the end, manifest sizes that add
/// past u64::MAX, a garbage lock and summary) through `verify`,
/// `checkpoints`, `status` and `report`: each gives a clean error naming the file and
/// the documented exit code, never a panic (found by the fuzz tests of the
/// readers; see crates/fuzz/src/lib.rs).
#[test]
fn hostile_files_give_a_clean_error_and_exit_code_never_a_panic() {
    let overflowing = br#"{"w":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,4]}}"#;
    let past_end = br#"{"w":{"dtype":"U8","shape":[4],"data_offsets":[18446744073709551611,18446744073709551615]}}"#;
    let cases: [(&str, Vec<u8>, &str); 3] = [
        ("2^60 header", safetensors_with_header(1 << 60, b"{}", 0), "header length 1152921504606846976"),
        ("overflowing shape", safetensors_with_header(overflowing.len() as u64, overflowing, 4), "does not match"),
        (
            "offsets past the end",
            safetensors_with_header(past_end.len() as u64, past_end, 4),
            "starts at byte 18446744073709551611",
        ),
    ];
    for (what, model, reason) in cases {
        let (tmp, store) = store_with_damaged_newest(|dir| replace_model_with_rehashed(dir, &model));
        let damaged = store.step_dir(DAMAGED);
        let (code, text, _) = rekindle_unpanicked(&[OsStr::new("verify"), damaged.as_os_str()]);
        assert_eq!(code, 1, "{what}: verify must exit 1:\n{text}");
        assert!(text.contains(MODEL_FILE) && text.contains(reason), "{what}: verify does not say why:\n{text}");
        let (code, json) = rekindle_json(&[OsStr::new("checkpoints"), tmp.path().as_os_str()]);
        assert_eq!(code, 0, "{what}");
        assert_eq!(json["resume_step"], GOOD, "{what}: {json}");
        fs::copy(support::cli::TINY_CONFIG, tmp.path().join("config.toml")).unwrap();
        let (code, out, _) = rekindle_unpanicked(&[OsStr::new("status"), tmp.path().as_os_str()]);
        assert_eq!(code, 0, "{what}: {out}");
        assert_eq!(store.load_latest().unwrap().loaded.unwrap().snapshot.step, GOOD, "{what}");
    }

    // Manifest sizes that add up past u64::MAX (summed for every listing).
    let (tmp, store) = store_with_damaged_newest(|dir| {
        rewrite_manifest(dir, |m| {
            for entry in m["files"].as_array_mut().unwrap() {
                entry["bytes"] = u64::MAX.into();
            }
        })
    });
    let (code, text, _) = rekindle_unpanicked(&[OsStr::new("verify"), store.step_dir(DAMAGED).as_os_str()]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("wrong size"), "{text}");
    let (code, json) = rekindle_json(&[OsStr::new("checkpoints"), tmp.path().as_os_str()]);
    assert_eq!((code, &json["resume_step"]), (0, &serde_json::json!(GOOD)), "{json}");
    assert_eq!(json["checkpoints"][0]["bytes"], u64::MAX, "{json}");

    // A run directory whose lock, summary and records are garbage or hostile.
    let run = tmp.path();
    fs::copy(support::cli::TINY_CONFIG, run.join("config.toml")).unwrap();
    fs::write(
        run.join("rekindle.lock"),
        br#"{"token":"t","job_id":null,"host":"h","pid":0,"heartbeat":1e308,"started":-1e308}"#,
    )
    .unwrap();
    fs::write(run.join("summary.json"), b"\x00\xff{{{").unwrap();
    fs::write(
        run.join("events.jsonl"),
        b"{\"event\":\"start\",\"time\":\"+262143-12-31T23:59:59Z\"}\n{\"event\":\"stop\",\"step\":18446744073709551615}\n{\"ev",
    )
    .unwrap();
    fs::write(run.join("metrics.jsonl"), b"{\"step\":18446744073709551615,\"loss\":1e308,\"time\":\"x\"}\n[[[[")
        .unwrap();
    for json in [false, true] {
        let mut args = vec![OsStr::new("status"), run.as_os_str()];
        if json {
            args.push(OsStr::new("--json"));
        }
        let (code, out, err) = rekindle_unpanicked(&args);
        assert_eq!(code, 0, "status --json={json}:\n{out}\n{err}");
    }
    let report = run.join("report.html");
    let (code, out, err) =
        rekindle_unpanicked(&[OsStr::new("report"), run.as_os_str(), OsStr::new("--out"), report.as_os_str()]);
    assert_eq!(code, 0, "report:\n{out}\n{err}");
    assert!(fs::read_to_string(&report).unwrap().contains("</html>"));
}
