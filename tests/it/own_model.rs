//! A model of your own under the whole command line: `examples/own_model.rs`
//! is `rekindle::cli::main_with` over a registry with a 1-D convolutional
//! model (`kind = "conv"`, settings in `[model.settings]`). Its run is
//! stopped by SIGTERM after a periodic checkpoint, resumed and finished
//! byte-identical to an uninterrupted run; its config errors are reported
//! with file, line, key and suggestion; the plain `rekindle` refuses the kind.

use crate::support;

use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

use support::runs::{
    EXIT_CONFIG, EXIT_DONE, EXIT_STOPPED, Training, assert_same_checkpoint, assert_same_metrics, checkpoint_steps,
    events_named, expect_exit, last_logged_step, own_model, rekindle, summary,
};

/// Longest a run of the example may take to reach a point (debug build,
/// shared machine).
const WAIT_LIMIT: Duration = Duration::from_secs(120);

#[test]
fn own_model_stopped_by_sigterm_after_a_periodic_save_resumes_and_ends_byte_identical() {
    let training = Training::own_model(120)
        .set("checkpoint.every_steps=20")
        .set("train.eval_every=40")
        .set("model.settings.channels=6");
    let tmp = tempfile::tempdir().unwrap();
    let reference = tmp.path().join("reference");
    training.run_to_end(&reference);
    let n = training.max_steps();
    assert_eq!(checkpoint_steps(&reference).last(), Some(&n));
    let run_config = fs::read_to_string(reference.join("config.toml")).unwrap();
    assert!(run_config.contains("channels = 6"), "--set model.settings.channels is in the run's config:\n{run_config}");

    // The same run, sent SIGTERM once its first periodic checkpoint is in.
    let dir = tmp.path().join("stopped");
    let mut child = training.spawn(&dir);
    let started = Instant::now();
    while !events_named(&dir, "checkpoint_saved").iter().any(|e| e["kind"] == "periodic") {
        if let Some(status) = child.try_wait().expect("poll own_model") {
            let stderr = fs::read_to_string(dir.with_extension("stderr")).unwrap_or_default();
            panic!("the run ended ({status}) before its first periodic checkpoint\n{stderr}");
        }
        assert!(started.elapsed() < WAIT_LIMIT, "no periodic checkpoint within {WAIT_LIMIT:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).expect("send SIGTERM");
    let status = child.wait().expect("reap own_model");
    let stderr = fs::read_to_string(dir.with_extension("stderr")).unwrap_or_default();
    assert_eq!(status.code(), Some(EXIT_STOPPED), "{status:?} (signal {:?})\n{stderr}", status.signal());

    let stopped_at = *checkpoint_steps(&dir).last().expect("a stop checkpoint");
    assert!(stopped_at < n, "the run finished ({stopped_at}) before SIGTERM arrived; lengthen it");
    assert_eq!(last_logged_step(&dir), Some(stopped_at), "the stop checkpoint is not of the last trained step");
    let saves = events_named(&dir, "checkpoint_saved");
    assert!(saves.iter().any(|e| e["kind"] == "periodic" && e["step"].as_u64() < Some(stopped_at)), "{saves:?}");
    assert!(saves.iter().any(|e| e["kind"] == "stop" && e["step"] == stopped_at), "{saves:?}");
    assert_eq!(events_named(&dir, "stop")[0]["reason"], "SIGTERM");

    training.run_to_end(&dir);
    let resumed: Vec<Value> = events_named(&dir, "resume").iter().map(|e| e["step"].clone()).collect();
    assert_eq!(resumed, [Value::from(stopped_at)]);
    assert_same_checkpoint(&dir, &reference, n);
    assert_same_metrics(&dir, &reference, n);
    assert_eq!(summary(&dir)["resumes"], 1);

    // The rest of the command line, through the same program.
    let status = expect_exit(own_model().args(["status", "--json"]).arg(&dir), EXIT_DONE);
    let status: Value = serde_json::from_slice(&status.stdout).expect("status --json is JSON");
    assert_eq!(status["state"], "finished", "{status}");
    expect_exit(own_model().arg("verify").arg(&dir), EXIT_DONE);
    expect_exit(own_model().arg("checkpoints").arg(&dir), EXIT_DONE);
    expect_exit(own_model().arg("report").arg(&dir), EXIT_DONE);
    let config = support::runs::own_model_config();
    let gpus = expect_exit(own_model().arg("gpus").arg("--config").arg(&config), EXIT_DONE);
    assert!(String::from_utf8_lossy(&gpus.stdout).contains("plan: cpu"), "{gpus:?}");
    let bench_dir = tmp.path().join("bench");
    fs::create_dir(&bench_dir).unwrap();
    let mut bench = own_model();
    bench.args(["bench", "train", "--steps", "4", "--every", "2", "--json", "--config"]).arg(&config);
    let bench = expect_exit(bench.arg("--dir").arg(&bench_dir), EXIT_DONE);
    serde_json::from_slice::<Value>(&bench.stdout).expect("bench train --json is JSON");
    // A run directory is readable by the plain binary too.
    let plain = expect_exit(rekindle().args(["status", "--json"]).arg(&dir), EXIT_DONE);
    let plain: Value = serde_json::from_slice(&plain.stdout).expect("status --json is JSON");
    assert_eq!(plain["state"], "finished", "{plain}");
    expect_exit(rekindle().arg("verify").arg(&dir), EXIT_DONE);
    expect_exit(rekindle().arg("report").arg(&dir), EXIT_DONE);
    expect_exit(rekindle().arg("checkpoints").arg(&dir), EXIT_DONE);
}

/// `examples/own_model.rs`'s `main`, `configs/own_model.toml` and the test
/// above are what docs/workloads.md shows; keep them the same.
#[test]
fn docs_show_the_example_as_it_is() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let docs = fs::read_to_string(root.join("docs/workloads.md")).unwrap();
    let example = fs::read_to_string(root.join("examples/own_model.rs")).unwrap();
    let main = example.find("fn main()").map(|start| &example[start..]).expect("fn main");
    let main = &main[..=main.find("\n}").expect("end of main") + 1];
    assert!(docs.contains(main), "docs/workloads.md does not show examples/own_model.rs's main:\n{main}");
    let settings = example.find("#[derive(Debug, Clone, Deserialize)]").expect("ConvSettings");
    let settings = &example[settings..];
    let settings = &settings[..=settings.find("\n}").expect("end of ConvSettings") + 1];
    assert!(docs.contains(settings), "docs/workloads.md does not show ConvSettings as it is:\n{settings}");
}

#[test]
fn own_model_settings_errors_name_file_line_key_and_suggestion() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("conv.toml");
    fs::write(
        &config,
        "[run]\nmax_steps = 5\n\n[model]\nkind = \"conv\"\n\n[model.settings]\nchanels = 8\nkernel = \"5\"\nnoise = 0.1\n",
    )
    .unwrap();
    let run_dir = tmp.path().join("run");
    let out =
        expect_exit(own_model().arg("run").arg("--config").arg(&config).arg("--run-dir").arg(&run_dir), EXIT_CONFIG);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let at = config.display();
    assert!(stderr.contains("has 2 problems"), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "{at}:8:1: model.settings.chanels: unknown key; did you mean `channels`? allowed: length, channels, \
             kernel, classes, train_samples, val_samples, noise"
        )),
        "{stderr}"
    );
    assert!(
        stderr
            .contains(&format!("{at}:9:1: model.settings.kernel: expected a non-negative integer, found string \"5\"")),
        "{stderr}"
    );
    assert!(!run_dir.exists(), "a refused config must leave no run directory");

    // A kind nobody registered, through the same program: the registered
    // kinds are offered.
    fs::write(&config, "[model]\nkind = \"cnov\"\n").unwrap();
    let out =
        expect_exit(own_model().arg("run").arg("--config").arg(&config).arg("--run-dir").arg(&run_dir), EXIT_CONFIG);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "{at}:2:1: model.kind: `cnov` is not allowed; did you mean `conv`? allowed: mlp, gpt, conv"
        )),
        "{stderr}"
    );

    // Settings of the right type that the constructor refuses: a config
    // error found before the run directory is touched (the workload is
    // built first), with the constructor's message.
    fs::write(&config, "[run]\nmax_steps = 5\n\n[model]\nkind = \"conv\"\n\n[model.settings]\nkernel = 4\n").unwrap();
    let out =
        expect_exit(own_model().arg("run").arg("--config").arg(&config).arg("--run-dir").arg(&run_dir), EXIT_CONFIG);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("invalid config `model.settings`: building the `conv` workload failed: kernel must be odd"),
        "{stderr}"
    );
    assert!(!run_dir.exists(), "a refused config must leave no run directory");

    // The plain `rekindle` binary does not build it, and says who does.
    let own_config = support::runs::own_model_config();
    let out =
        expect_exit(rekindle().arg("run").arg("--config").arg(&own_config).arg("--run-dir").arg(&run_dir), EXIT_CONFIG);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("model.kind: `conv` is not allowed; allowed: mlp, gpt; a model of your own"), "{stderr}");
    assert!(!run_dir.exists());
}

#[test]
fn orchestrator_script_runs_a_program_of_your_own_from_rekindle_bin() {
    let tmp = tempfile::tempdir().unwrap();
    let run_dir = tmp.path().join("run");
    let config = support::runs::own_model_config();
    let exe = support::runs::own_model_exe();
    let out = crate::cli::orchestrator_script(
        &[config.to_str().unwrap(), "--run-dir", run_dir.to_str().unwrap(), "--stop-at-step", "3"],
        &[("REKINDLE_BIN", exe.to_str().unwrap())],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(EXIT_STOPPED), "{stderr}");
    assert!(run_dir.join("checkpoints/step-0000000003/MANIFEST.json").is_file(), "{stderr}");
    let state = fs::read(run_dir.join("checkpoints/step-0000000003/state.json")).unwrap();
    let state: Value = serde_json::from_slice(&state).expect("state.json is JSON");
    assert_eq!(state["train"]["workload"], "conv", "the checkpoint is of the registered model");
}
