//! The command line as users and scripts meet it: help and version, the
//! documented exit codes (0, 2, 75, 78), and config errors reported all at
//! once with their place in the file and a suggestion.

use crate::support;

use std::fs;
use std::path::Path;

use clap::CommandFactory;
use rekindle::cli::Cli;

use support::runs::{EXIT_CONFIG, EXIT_DONE, outcome, rekindle, tiny_config};

/// clap's exit code for a command line it cannot parse.
const EXIT_USAGE: i32 = 2;

fn run_rekindle(args: &[&str]) -> (i32, String, String) {
    outcome(&rekindle().args(args).output().expect("start rekindle"))
}

#[test]
fn help_of_every_subcommand_exits_zero_and_run_help_lists_exit_codes() {
    let subcommands: Vec<String> = Cli::command().get_subcommands().map(|c| c.get_name().to_string()).collect();
    assert!(subcommands.len() >= 3, "expected run, verify, checkpoints: {subcommands:?}");
    for name in &subcommands {
        let (code, stdout, stderr) = run_rekindle(&[name, "--help"]);
        assert_eq!(code, EXIT_DONE, "`rekindle {name} --help` exited {code}:\n{stderr}");
        assert!(stdout.contains("Usage: rekindle"), "`rekindle {name} --help` printed no usage:\n{stdout}");
    }
    let (_, stdout, _) = run_rekindle(&["run", "--help"]);
    for line in ["75  stopped with a durable checkpoint", "78  configuration error", "0   finished"] {
        assert!(stdout.contains(line), "`rekindle run --help` lacks the exit code line `{line}`:\n{stdout}");
    }
    let (code, stdout, _) = run_rekindle(&["--help"]);
    assert_eq!(code, EXIT_DONE);
    assert!(subcommands.iter().all(|s| stdout.contains(s.as_str())), "top-level help lists every subcommand");
}

#[test]
fn version_prints_the_package_version() {
    let (code, stdout, _) = run_rekindle(&["--version"]);
    assert_eq!(code, EXIT_DONE);
    assert_eq!(stdout.trim(), format!("rekindle {}", env!("CARGO_PKG_VERSION")));
}

#[test]
fn config_with_several_problems_lists_each_with_place_key_and_suggestion() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("bad.toml");
    fs::write(
        &config,
        "[run]\nname = \"bad\"\nmax_step = 10\n\n[modle]\nkind = \"mlp\"\n\n[train]\nbatchsize = 4\ngrad_accum = 0\n",
    )
    .unwrap();
    let run_dir = tmp.path().join("run");
    let (code, _, stderr) = run_rekindle(&[
        "run",
        "--config",
        config.to_str().unwrap(),
        "--run-dir",
        run_dir.to_str().unwrap(),
        "--set",
        "optimizer.weight_decy=0.1",
    ]);
    assert_eq!(code, EXIT_CONFIG, "stderr:\n{stderr}");
    let file = config.display().to_string();
    let expected = [
        format!("{file}:3:1: run.max_step: unknown key; did you mean `max_steps`?"),
        format!("{file}:5:1: modle: unknown section; did you mean `model`?"),
        format!("{file}:9:1: train.batchsize: unknown key; did you mean `batch_size`?"),
        format!("{file}:10:1: train.grad_accum: must be at least 1"),
        "from --set: optimizer.weight_decy: unknown key; did you mean `weight_decay`?".to_string(),
    ];
    for problem in &expected {
        assert!(stderr.contains(problem.as_str()), "stderr lacks `{problem}`:\n{stderr}");
    }
    assert!(stderr.contains("5 problems"), "all problems are counted at once:\n{stderr}");
    assert!(!run_dir.exists(), "a config error must not create the run directory");
}

#[test]
fn unknown_flag_is_a_usage_error() {
    let (code, _, stderr) = run_rekindle(&["run", "--config", tiny_config().to_str().unwrap(), "--no-such-flag"]);
    assert_eq!(code, EXIT_USAGE, "stderr:\n{stderr}");
    assert!(stderr.contains("--no-such-flag"), "the error names the flag:\n{stderr}");
}

#[test]
fn run_with_a_missing_config_file_is_a_config_error_naming_the_path_the_reason_and_what_to_do() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("nowhere").join("missing.toml");
    let run_dir = tmp.path().join("run");
    let (code, _, stderr) =
        run_rekindle(&["run", "--config", missing.to_str().unwrap(), "--run-dir", run_dir.to_str().unwrap()]);
    assert_eq!(code, EXIT_CONFIG, "stderr:\n{stderr}");
    assert!(stderr.contains(&missing.display().to_string()), "the error names the path:\n{stderr}");
    // Issue #33: the OS's reason (as `gpus` and `data validate` give it) and a hint.
    assert!(stderr.contains("No such file or directory"), "the error gives the OS's reason:\n{stderr}");
    assert!(stderr.contains("check the path"), "the error says what to do:\n{stderr}");
    assert!(!Path::new(&run_dir).exists(), "nothing is created for a missing config");
}

#[test]
fn a_task_of_a_two_task_step_without_its_world_is_refused_with_exit_78_and_nothing_is_written() {
    // What `srun -n 2 rekindle run ...` looks like to rank 1, but without
    // the world: a build without the `mpi` feature cannot join one; a build
    // with it finds MPI's world (of one, here) is not the step's (of two),
    // as with `srun` without `--mpi=pmix`. Either way nothing is written.
    let tmp = tempfile::tempdir().unwrap();
    let run_dir = tmp.path().join("run");
    let out = rekindle()
        .args(["run", "--config", tiny_config().to_str().unwrap(), "--run-dir", run_dir.to_str().unwrap()])
        .env("SLURM_JOB_ID", "41")
        .env("SLURM_STEP_ID", "0")
        .env("SLURM_STEP_NUM_TASKS", "2")
        .env("SLURM_PROCID", "1")
        .output()
        .expect("start rekindle");
    let (code, _, stderr) = outcome(&out);
    assert_eq!(code, EXIT_CONFIG, "{stderr}");
    if cfg!(feature = "mpi") {
        assert!(stderr.contains("said 2 ranks") && stderr.contains("srun --mpi=pmix"), "{stderr}");
    } else {
        assert!(stderr.contains("2 ranks") && stderr.contains("--features mpi"), "{stderr}");
    }
    assert!(!run_dir.exists(), "a refused run must not create its run directory");
}

/// `slurm/orchestrator.slurm` run by bash, the way SLURM runs it, with only
/// the environment given (no SLURM variables of the test's own environment).
pub(crate) fn orchestrator_script(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("slurm/orchestrator.slurm");
    let mut cmd = std::process::Command::new("bash");
    cmd.arg(script).args(args).env("REKINDLE_BIN", env!("CARGO_BIN_EXE_rekindle"));
    for (key, _) in std::env::vars().filter(|(k, _)| k.starts_with("SLURM")) {
        cmd.env_remove(key);
    }
    cmd.envs(env.iter().copied()).stdin(std::process::Stdio::null()).output().expect("run bash")
}

#[test]
fn orchestrator_script_outside_slurm_runs_rekindle_itself() {
    let tmp = tempfile::tempdir().unwrap();
    let run_dir = tmp.path().join("run");
    let config = tiny_config();
    let out = orchestrator_script(
        &[config.to_str().unwrap(), "--run-dir", run_dir.to_str().unwrap(), "--stop-at-step", "3"],
        &[],
    );
    let (code, _, stderr) = outcome(&out);
    assert_eq!(code, 75, "{stderr}");
    assert!(!stderr.contains("srun"), "no job step outside SLURM: {stderr}");
    assert!(run_dir.join("checkpoints/step-0000000003/MANIFEST.json").is_file(), "{stderr}");
}

#[test]
fn orchestrator_script_refuses_a_task_count_that_is_not_one_before_starting_anything() {
    // Several tasks are one data-parallel run (the `dp` drill); a task count
    // that is not a number is refused with what to do.
    let tmp = tempfile::tempdir().unwrap();
    let run_dir = tmp.path().join("run");
    let config = tiny_config();
    let out = orchestrator_script(
        &[config.to_str().unwrap(), "--run-dir", run_dir.to_str().unwrap()],
        &[("SLURM_JOB_ID", "7"), ("SLURM_NTASKS", "2(x2)")],
    );
    let (code, _, stderr) = outcome(&out);
    assert_eq!(code, EXIT_USAGE, "{stderr}");
    assert!(stderr.contains("is not a task count"), "{stderr}");
    assert!(!run_dir.exists(), "nothing may be written: {stderr}");
}

/// `rekindle bench checkpoint` says whether its reads were cold: without
/// `--cold` the JSON has `cold_cache: false` and why, and the text does not
/// claim cold reads. (`--cold` itself is not run here: it drops the page
/// cache of the whole machine; its failure path is a unit test of
/// src/bench/checkpoint.rs.)
#[test]
fn bench_checkpoint_reports_whether_its_reads_were_cold() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_str().unwrap();
    let (code, stdout, stderr) =
        run_rekindle(&["bench", "checkpoint", "--bytes", "1MiB", "--repeat", "1", "--dir", dir, "--json"]);
    assert_eq!(code, EXIT_DONE, "{stderr}");
    let json: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!((&json["cold_reads"], &json["cold_cache"]), (&false.into(), &false.into()), "{json}");
    assert!(json["cold_cache_reason"].as_str().unwrap().contains("not requested"), "{json}");
    let (code, stdout, stderr) =
        run_rekindle(&["bench", "checkpoint", "--bytes", "1MiB", "--repeat", "1", "--dir", dir]);
    assert_eq!(code, EXIT_DONE, "{stderr}");
    assert!(!stdout.contains("cold reads") && !stdout.contains("NOT COLD"), "{stdout}");
}
