//! A failed start leaves nothing behind, and every error says why (issue
//! #33), through the real binary: what is wrong with the config or its data
//! exits 78 before the run directory is touched; an attempt that failed
//! before its first checkpoint blocks no corrected rerun; `run` and `exec`
//! refuse each other's run directories in one line, changing nothing; a
//! failed restore records its `error` event; `doctor` refuses what `run`
//! refuses; a finished run run again says so and writes nothing.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::support::cli::{RunCmd, TINY_CONFIG, checkpoint_steps, events_named};
use crate::support::runs::{EXIT_CONFIG, EXIT_DONE, EXIT_STOPPED, events, outcome, rekindle};

const TIMEOUT: Duration = Duration::from_secs(120);
const EXIT_FAILURE: i32 = 1;

/// Every path under `root` with its bytes and modification time (`None` for
/// a directory): what "untouched" compares.
fn tree(root: &Path) -> BTreeMap<PathBuf, (Option<Vec<u8>>, SystemTime)> {
    let mut out = BTreeMap::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = fs::symlink_metadata(&path).unwrap();
            let bytes = if meta.is_dir() {
                todo.push(path.clone());
                None
            } else {
                Some(fs::read(&path).unwrap())
            };
            out.insert(path, (bytes, meta.modified().unwrap()));
        }
    }
    out
}

/// configs/tiny.toml with `[data]` replaced by `data`, and `[model]` by `model` when given.
fn tiny_with(dir: &Path, name: &str, model: Option<&str>, data: &str) -> PathBuf {
    let tiny = fs::read_to_string(TINY_CONFIG).unwrap();
    let mut text =
        tiny.replace("[data]\nkind = \"synthetic\"\nsynthetic_samples = 2048\n", &format!("[data]\n{data}\n"));
    assert_ne!(text, tiny, "configs/tiny.toml's [data] changed: update this test");
    if let Some(model) = model {
        let start = text.find("[model]").unwrap();
        let end = text.find("[data]").unwrap();
        text.replace_range(start..end, &format!("[model]\n{model}\n\n"));
    }
    let path = dir.join(name);
    fs::write(&path, text).unwrap();
    path
}

fn run_with_config(config: &Path, run_dir: &Path) -> (i32, String, String) {
    let out = rekindle()
        .args(["run", "--config"])
        .arg(config)
        .arg("--run-dir")
        .arg(run_dir)
        .args(["--set", "run.max_steps=12"])
        .output()
        .unwrap();
    outcome(&out)
}

#[test]
fn config_and_data_problems_exit_78_before_the_run_directory_is_touched_and_a_corrected_rerun_starts() {
    let tmp = tempfile::tempdir().unwrap();
    let gpt = "kind = \"gpt\"\nlayers = 1\nwidth = 16\nheads = 2\ncontext = 16";
    let data = tmp.path().join("data.jsonl");
    let line = "{\"text\": \"the cat sees the moon, and the moon sees the cat again and again.\"}\n";
    fs::write(&data, line.repeat(200)).unwrap();
    let cases = [
        // An mlp has no use for text: known from the config alone.
        (tiny_with(tmp.path(), "mlp-jsonl.toml", None, &format!("kind = \"jsonl\"\npath = {data:?}")), "data.kind"),
        // No [data] path at all, and one that does not exist.
        (tiny_with(tmp.path(), "no-path.toml", Some(gpt), "kind = \"jsonl\""), "data.path"),
        (tiny_with(tmp.path(), "missing.toml", Some(gpt), "kind = \"jsonl\"\npath = \"absent.jsonl\""), "data.path"),
    ];
    for (config, key) in &cases {
        let fresh = tmp.path().join(format!("fresh-{}", config.file_stem().unwrap().to_string_lossy()));
        let (code, _, stderr) = run_with_config(config, &fresh);
        assert_eq!(code, EXIT_CONFIG, "{}: {stderr}", config.display());
        assert!(stderr.contains(key), "the error names `{key}`: {stderr}");
        assert!(!fresh.exists(), "{}: the run directory was created", config.display());
    }
    // A run directory that exists (a stopped run) is left exactly as it was.
    let stopped = tmp.path().join("stopped");
    RunCmd::new(&stopped).set("run.max_steps=12").arg("--stop-at-step").arg("4").run(TIMEOUT).assert_code(EXIT_STOPPED);
    let before = tree(&stopped);
    for (config, _) in &cases {
        let (code, _, stderr) = run_with_config(config, &stopped);
        assert_eq!(code, EXIT_CONFIG, "{}: {stderr}", config.display());
    }
    assert_eq!(tree(&stopped), before, "a refused start touched the run directory");
    // Corrected: the gpt on the data that exists starts where the bad ones were refused.
    let fixed = tiny_with(tmp.path(), "fixed.toml", Some(gpt), &format!("kind = \"jsonl\"\npath = {data:?}"));
    let fresh = tmp.path().join("fresh-missing");
    let (code, _, stderr) = run_with_config(&fixed, &fresh);
    assert_eq!(code, EXIT_DONE, "{stderr}");
    assert_eq!(checkpoint_steps(&fresh), [12]);
}

#[test]
fn a_first_attempt_that_failed_before_its_first_checkpoint_blocks_no_corrected_rerun() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let node = tmp.path().join("no-gpus.json");
    fs::write(&node, r#"{"devices": []}"#).unwrap();
    // Fails after the run directory is prepared: no GPU on this (injected) node.
    let failed = RunCmd::new(&dir)
        .set("run.max_steps=12")
        .set("gpu.backend=\"auto\"")
        .set("gpu.require=true")
        .env("REKINDLE_GPU_INVENTORY", &node)
        .run(TIMEOUT);
    failed.assert_code(EXIT_FAILURE);
    assert!(dir.join("config.toml").is_file() && checkpoint_steps(&dir).is_empty());
    assert_eq!(events_named(&dir, "error").len(), 1, "{:?}", events(&dir));
    // Other training settings: nothing to resume, so nothing to refuse.
    let rerun = RunCmd::new(&dir).set("run.max_steps=12").set("optimizer.lr=0.01").run(TIMEOUT);
    rerun.assert_code(EXIT_DONE);
    assert!(fs::read_to_string(dir.join("config.toml")).unwrap().contains("lr = 0.01"));
    assert_eq!(checkpoint_steps(&dir), [12]);
    // With a checkpoint the guard holds again.
    let refused = RunCmd::new(&dir).set("run.max_steps=12").set("optimizer.lr=0.02").run(TIMEOUT);
    refused.assert_code(EXIT_CONFIG);
    assert!(refused.stderr.contains("optimizer.lr"), "{}", refused.tail());
}

/// The line of stderr that says `error:`, which must be the only one.
fn error_line(stderr: &str) -> &str {
    let lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    let at = stderr.find(lines[0]).unwrap();
    assert_eq!(stderr[at..].trim_end(), lines[0], "the error goes on past its line:\n{stderr}");
    lines[0]
}

#[test]
fn run_and_exec_on_each_others_directories_name_the_command_in_one_line_and_change_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let run_dir = tmp.path().join("run");
    RunCmd::new(&run_dir).set("run.max_steps=12").run(TIMEOUT).assert_code(EXIT_DONE);
    let before = tree(&run_dir);
    // The defaults (another model, optimizer…), and the run's own config.
    for with_config in [false, true] {
        let mut exec = RunCmd::exec(&run_dir, &["true"]);
        if with_config {
            exec = exec.arg("--config").arg(TINY_CONFIG).set("run.max_steps=12");
        }
        let refused = exec.run(TIMEOUT);
        refused.assert_code(EXIT_CONFIG);
        let line = error_line(&refused.stderr);
        assert!(line.contains("continue this run directory with `rekindle run`"), "{line}");
        assert_eq!(tree(&run_dir), before, "a refused exec touched the run directory");
    }
    // The run's own command still takes it.
    RunCmd::new(&run_dir).set("run.max_steps=12").run(TIMEOUT).assert_code(EXIT_DONE);

    let exec_dir = tmp.path().join("exec");
    let staged = exec_dir.join("checkpoints/.staging/s");
    let script =
        format!("mkdir -p {s} && echo weights > {s}/w && \"$REKINDLE_BIN\" -q seal {s} --step 1", s = staged.display());
    RunCmd::exec(&exec_dir, &["sh", "-c", &script]).run(TIMEOUT).assert_code(EXIT_DONE);
    let before = tree(&exec_dir);
    for extra in [None, Some("--allow-config-change")] {
        let mut run = RunCmd::new(&exec_dir);
        if let Some(extra) = extra {
            run = run.arg(extra);
        }
        let refused = run.run(TIMEOUT);
        refused.assert_code(EXIT_CONFIG);
        let line = error_line(&refused.stderr);
        assert!(line.contains("continue this run directory with `rekindle exec`"), "{line}");
        assert_eq!(tree(&exec_dir), before, "a refused run touched the run directory");
    }
    RunCmd::exec(&exec_dir, &["true"]).run(TIMEOUT).assert_code(EXIT_DONE);
}

#[test]
fn a_restore_that_fails_on_a_shape_mismatch_records_its_error_event() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    RunCmd::new(&dir).set("run.max_steps=12").arg("--stop-at-step").arg("4").run(TIMEOUT).assert_code(EXIT_STOPPED);
    let wider =
        RunCmd::new(&dir).set("run.max_steps=12").set("model.hidden=[64]").arg("--allow-config-change").run(TIMEOUT);
    wider.assert_code(EXIT_FAILURE);
    assert!(wider.stderr.contains("restoring checkpoint"), "{}", wider.tail());
    let all = events(&dir);
    let last = all.last().unwrap();
    assert_eq!(last["event"], "error", "the attempt's last event: {last}");
    assert!(last["error"].as_str().unwrap().contains("has shape [4, 32]"), "{last}");
    assert_eq!(last["class"], "deterministic");
    assert_eq!(all.iter().filter(|e| e["event"] == "start").count(), 2, "the failed attempt has its own `start`");
    let status = rekindle().arg("status").arg(&dir).output().unwrap();
    let (_, stdout, stderr) = outcome(&status);
    assert!(stdout.contains("it failed: restoring checkpoint"), "{stdout}{stderr}");
}

#[test]
fn doctor_refuses_the_configs_run_refuses_naming_the_problem() {
    let tmp = tempfile::tempdir().unwrap();
    let gpt = "kind = \"gpt\"\nlayers = 1\nwidth = 16\nheads = 2\ncontext = 16";
    let cases = [
        (tiny_with(tmp.path(), "mlp-jsonl.toml", None, "kind = \"jsonl\"\npath = \"x.jsonl\""), "data.kind"),
        (tiny_with(tmp.path(), "missing.toml", Some(gpt), "kind = \"jsonl\"\npath = \"absent.jsonl\""), "data.path"),
    ];
    for (config, key) in &cases {
        let out = rekindle().args(["doctor", "--config"]).arg(config).output().unwrap();
        let (code, stdout, stderr) = outcome(&out);
        assert_ne!(code, EXIT_DONE, "{}: doctor said ready:\n{stdout}{stderr}", config.display());
        assert!(stdout.contains(key) || stderr.contains(key), "doctor names `{key}`:\n{stdout}{stderr}");
        assert!(!stdout.contains(": ready"), "{stdout}");
    }
}

#[test]
fn a_finished_run_run_again_says_so_and_writes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    RunCmd::new(&dir).set("run.max_steps=12").run(TIMEOUT).assert_code(EXIT_DONE);
    let records = |dir: &Path| {
        let mut kept = tree(dir);
        // Written again with the same bytes (the config guard found no change).
        kept.remove(&dir.join("config.toml"));
        kept
    };
    let before = records(&dir);
    let again = RunCmd::new(&dir).set("run.max_steps=12").run(TIMEOUT);
    again.assert_code(EXIT_DONE);
    assert!(again.stderr.contains("this run already finished at step 12"), "{}", again.tail());
    assert!(!again.stderr.contains("checkpoint saved"), "{}", again.tail());
    assert_eq!(records(&dir), before, "a finished run run again wrote something");
}
