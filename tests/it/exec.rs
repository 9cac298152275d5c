//! `rekindle exec -- CMD` driving a real numpy training program
//! (python/examples/train_numpy.py, checkpointing weights, Adam moments and
//! RNG state through python/rekindle_client.py): a stop mid-run and the
//! resume end byte-identical to an uninterrupted run; a program that ignores
//! the stop is killed at the deadline and its last sealed checkpoint is
//! used; a half-staged checkpoint is never sealed nor used; a crash is
//! classified with the program's stderr; a SIGKILLed rekindle takes the
//! program along; `run` and `exec` refuse each other's checkpoints; in a job
//! step of two tasks (no srun), task 0 lost with its node is recorded by
//! task 1, which exits 75, and the world resumes from its checkpoint.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

use crate::support::cli::{RunCmd, TINY_CONFIG, checkpoint_steps, events_named, exe, last_event, verify};
use crate::support::requires;
use crate::support::scontrol::FakeScontrol;

const TIMEOUT: Duration = Duration::from_secs(120);
const STEPS: &str = "60";

fn program() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/python/examples/train_numpy.py").to_string()
}

/// `rekindle exec --run-dir DIR -- python3 train_numpy.py --steps 60 --out OUT EXTRA…`.
fn exec(run_dir: &Path, out: &Path, extra: &[&str]) -> RunCmd {
    let program = program();
    let out = out.to_string_lossy().into_owned();
    let mut command = vec!["python3", program.as_str(), "--steps", STEPS, "--every", "5", "--out", out.as_str()];
    command.extend_from_slice(extra);
    RunCmd::exec(run_dir, &command)
}

/// The final weights of an uninterrupted run.
fn reference(tmp: &Path) -> Vec<u8> {
    let out = tmp.join("reference.npy");
    exec(&tmp.join("reference"), &out, &[]).run(TIMEOUT).assert_code(0);
    std::fs::read(out).unwrap()
}

fn rekindle(args: &[&str], dir: &Path) -> (Option<i32>, String) {
    let out = Command::new(exe()).args(args).arg(dir).output().unwrap();
    (out.status.code(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

fn staged_leftovers(run_dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(run_dir.join("checkpoints/.staging"))
        .map(|d| d.filter_map(|e| Some(e.ok()?.path())).collect())
        .unwrap_or_default()
}

#[test]
fn a_sigterm_mid_run_seals_a_checkpoint_exits_75_and_the_resume_ends_byte_identical() {
    let Some(()) = requires::python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let expected = reference(tmp.path());
    let run = tmp.path().join("run");
    let out = tmp.path().join("w.npy");
    let mut first = exec(&run, &out, &["--step-seconds", "0.05"]).spawn();
    first.wait_for_step(12, TIMEOUT);
    first.signal(Signal::SIGTERM);
    let exited = first.wait(TIMEOUT);
    exited.assert_code(75);
    let child_exit = last_event(&run, "child_exit");
    assert_eq!((child_exit["verdict"].as_str(), child_exit["stop_requested"].as_bool()), (Some("stopped"), Some(true)));
    let stopped_at = last_event(&run, "stop")["step"].as_u64().unwrap();
    assert!(stopped_at >= 12, "{stopped_at}");
    assert_eq!(checkpoint_steps(&run).last(), Some(&stopped_at), "the stop checkpoint is the newest");
    let stop = last_event(&run, "stop");
    assert!(stop["checkpoint_error"].is_null(), "it sealed a checkpoint after the stop: {stop}");
    let to_durable = stop["seconds_to_durable_checkpoint"].as_f64().unwrap_or_else(|| panic!("{stop}"));
    // The program answers at its next step (50 ms) and seals a few KB, but
    // the seal is a fresh debug `rekindle` process on a loaded 2-vCPU CI
    // machine: judge only that it came well inside the default grace (110 s
    // to the deadline), not how fast the machine is (issue #34).
    assert!(to_durable < 30.0, "from the signal to the seal: {stop}");
    assert!(!out.exists(), "not finished");

    let second = exec(&run, &out, &[]).run(TIMEOUT);
    second.assert_code(0);
    let resume = last_event(&run, "resume");
    assert_eq!(resume["step"].as_u64(), Some(stopped_at));
    let start = last_event(&run, "child_start");
    assert!(start["resume_from"].as_str().unwrap().ends_with(&format!("step-{stopped_at:010}")), "{start}");
    assert!(second.stderr.contains(&format!("starting at step {stopped_at}")), "{}", second.tail());
    assert_eq!(std::fs::read(&out).unwrap(), expected, "final weights differ from an uninterrupted run's");

    // The read-only commands work unchanged on such a run directory.
    let (code, text) = verify(&run);
    assert_eq!(code, Some(0), "{text}");
    let (code, text) = rekindle(&["checkpoints"], &run);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains(STEPS), "{text}");
    let (code, text) = rekindle(&["status"], &run);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains(&format!("ended because the program finished at step {STEPS}")), "{text}");
    let (code, text) = rekindle(&["report"], &run);
    assert_eq!(code, Some(0), "{text}");
    let html = std::fs::read_to_string(run.join("report.html")).unwrap();
    assert!(html.contains("<svg"), "the report plots the program's metrics");
}

/// A closed terminal (SIGHUP) under `exec`: the program gets the SIGTERM of
/// the contract, seals its step, and rekindle exits 75 as for SIGTERM.
#[test]
fn a_sighup_is_forwarded_as_the_stop_and_the_program_seals_its_step() {
    let Some(()) = requires::python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (run, out) = (tmp.path().join("run"), tmp.path().join("w.npy"));
    let mut first = exec(&run, &out, &["--step-seconds", "0.05"]).spawn();
    first.wait_for_step(12, TIMEOUT);
    first.signal(Signal::SIGHUP);
    first.wait(TIMEOUT).assert_code(75);
    let stop = last_event(&run, "stop");
    assert_eq!(stop["reason"].as_str(), Some("SIGHUP"), "{stop}");
    let stopped_at = stop["step"].as_u64().unwrap_or_else(|| panic!("{stop}"));
    assert!(stopped_at >= 12, "{stop}");
    assert_eq!(checkpoint_steps(&run).last(), Some(&stopped_at), "the stop checkpoint is the newest");
    let child_exit = last_event(&run, "child_exit");
    assert_eq!(child_exit["verdict"].as_str(), Some("stopped"), "{child_exit}");
}

#[test]
fn a_program_that_ignores_the_stop_is_killed_at_the_deadline_and_its_last_sealed_checkpoint_is_used() {
    let Some(()) = requires::python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let expected = reference(tmp.path());
    let run = tmp.path().join("run");
    let out = tmp.path().join("w.npy");
    let mut first = exec(&run, &out, &["--step-seconds", "0.05", "--ignore-stop"])
        .set("signals.grace=3s")
        .set("signals.safety_margin=1s")
        .spawn();
    first.wait_for_step(12, TIMEOUT);
    first.signal(Signal::SIGTERM);
    let exited = first.wait(TIMEOUT);
    exited.assert_code(75);
    let child_exit = last_event(&run, "child_exit");
    assert_eq!(child_exit["killed_at_deadline"], true, "{child_exit}");
    assert_eq!(child_exit["signal"], "SIGKILL", "{child_exit}");
    let stop = last_event(&run, "stop");
    let kept = stop["step"].as_u64().unwrap();
    assert_eq!(kept % 5, 0, "a periodic checkpoint: the program never answered the stop");
    assert_eq!(checkpoint_steps(&run).last(), Some(&kept), "the last sealed checkpoint stands");
    // Killed at the deadline, the requeue is still decided (half the safety
    // margin is left for it): outside SLURM that decision is "no requeue".
    assert_ne!(stop["requeue"]["reason"], "fast exit", "the job must come back: {stop}");
    assert!(stop["requeue"]["decision"].is_string(), "{stop}");
    assert_eq!(verify(&run).0, Some(0), "the last sealed checkpoint is intact");

    exec(&run, &out, &[]).run(TIMEOUT).assert_code(0);
    assert_eq!(last_event(&run, "resume")["step"].as_u64(), Some(kept));
    assert_eq!(std::fs::read(&out).unwrap(), expected);
}

#[test]
fn a_checkpoint_half_staged_when_the_program_dies_is_never_sealed_nor_used() {
    let Some(()) = requires::python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let expected = reference(tmp.path());
    let run = tmp.path().join("run");
    let out = tmp.path().join("w.npy");
    let died = exec(&run, &out, &["--die-mid-save", "12"]).run(TIMEOUT);
    died.assert_code(1);
    assert_eq!(checkpoint_steps(&run), vec![5, 10], "step 12 was never sealed");
    assert_eq!(staged_leftovers(&run).len(), 1, "the half-written directory stays staged");
    let error = last_event(&run, "error");
    assert_eq!(error["class"], "transient", "it died after sealing in this attempt: {error}");
    assert!(died.stderr.contains("exited with code 9"), "{}", died.tail());

    exec(&run, &out, &[]).run(TIMEOUT).assert_code(0);
    assert_eq!(last_event(&run, "resume")["step"].as_u64(), Some(10), "resumed from the last sealed one");
    assert!(staged_leftovers(&run).is_empty(), "the next attempt removed it");
    assert_eq!(std::fs::read(&out).unwrap(), expected);
}

#[test]
fn a_crashing_program_is_classified_and_its_stderr_tail_recorded() {
    let Some(()) = requires::python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let crashed = exec(&run, &tmp.path().join("w.npy"), &["--crash-at", "3"]).run(TIMEOUT);
    crashed.assert_code(1);
    let child_exit = last_event(&run, "child_exit");
    assert_eq!((child_exit["exit_code"].as_i64(), child_exit["verdict"].as_str()), (Some(3), Some("crashed")));
    let tail: Vec<&str> = child_exit["stderr_tail"].as_array().unwrap().iter().map(|l| l.as_str().unwrap()).collect();
    assert_eq!(tail.last(), Some(&"RuntimeError: simulated crash at step 3"), "{child_exit}");
    let error = last_event(&run, "error");
    assert_eq!(error["class"], "deterministic", "it crashed before sealing anything: {error}");
    assert!(error["why"].as_str().unwrap().contains("exited with code 3 before sealing"), "{error}");
    let summary: Value = serde_json::from_slice(&std::fs::read(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["state"], "failed", "{summary}");
}

#[test]
fn a_sigkilled_rekindle_takes_its_program_along() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let mut running = RunCmd::exec(&run, &["sleep", "600"]).spawn();
    let start = running.wait_for_event("child_start", TIMEOUT);
    let child = Pid::from_raw(start["pid"].as_i64().unwrap() as i32);
    assert!(kill(child, None).is_ok(), "the program runs");
    running.signal(Signal::SIGKILL);
    running.wait(TIMEOUT);
    let t0 = std::time::Instant::now();
    while kill(child, None).is_ok() && !is_zombie(child) {
        assert!(t0.elapsed() < Duration::from_secs(10), "the program {child} outlived a SIGKILLed rekindle");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A process that has died but is not reaped yet (its new parent reaps it).
pub(crate) fn is_zombie(pid: Pid) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')))
        .unwrap_or(false)
}

#[test]
fn run_and_exec_refuse_each_others_checkpoints_and_say_which_command_continues() {
    let tmp = tempfile::tempdir().unwrap();
    let exec_dir = tmp.path().join("exec");
    let staged = exec_dir.join("checkpoints/.staging/s");
    // A program that seals one checkpoint of step 1.
    let script =
        format!("mkdir -p {s} && echo weights > {s}/w && \"$REKINDLE_BIN\" -q seal {s} --step 1", s = staged.display());
    RunCmd::exec(&exec_dir, &["sh", "-c", &script]).run(TIMEOUT).assert_code(0);
    assert_eq!(checkpoint_steps(&exec_dir), vec![1]);
    let refused = RunCmd::new(&exec_dir).arg("--allow-config-change").run(TIMEOUT);
    // Found before anything is written: a config error (tests/it/failed_start.rs).
    refused.assert_code(78);
    assert!(refused.stderr.contains("continue this run directory with `rekindle exec`"), "{}", refused.tail());
    assert_eq!(checkpoint_steps(&exec_dir), vec![1], "neither quarantined nor removed");

    let run_dir = tmp.path().join("run");
    RunCmd::new(&run_dir).set("run.max_steps=12").run(TIMEOUT).assert_code(0);
    let refused =
        RunCmd::exec(&run_dir, &["true"]).arg("--config").arg(TINY_CONFIG).set("run.max_steps=12").run(TIMEOUT);
    refused.assert_code(78);
    assert!(refused.stderr.contains("continue this run directory with `rekindle run`"), "{}", refused.tail());
}

#[test]
fn seal_outside_exec_takes_the_lock_and_refuses_what_is_not_staged() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    RunCmd::exec(&run, &["true"]).run(TIMEOUT).assert_code(0);
    let staging = run.join("checkpoints/.staging");
    std::fs::create_dir_all(staging.join("a")).unwrap();
    std::fs::write(staging.join("a/x.bin"), b"state").unwrap();
    let seal = |dir: &Path, step: &str| {
        let out = Command::new(exe())
            .args(["seal", "--run-dir"])
            .arg(&run)
            .arg(dir)
            .args(["--step", step])
            .env_remove("REKINDLE_EXEC_PID")
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stdout, stderr) = seal(&staging.join("a"), "7");
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.trim().ends_with("step-0000000007"), "{stdout}");
    let saved: Vec<Value> = events_named(&run, "checkpoint_saved");
    assert_eq!((saved.len(), saved[0]["kind"].as_str()), (1, Some("sealed")));
    let outside = tmp.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("x"), b"1").unwrap();
    let (code, _, stderr) = seal(&outside, "8");
    assert_eq!(code, Some(1));
    assert!(stderr.contains("not a directory directly under the staging directory"), "{stderr}");
    assert_eq!(last_event(&run, "checkpoint_failed")["kind"], "sealed");
    assert_eq!(checkpoint_steps(&run), vec![7]);
}

#[test]
fn the_orchestrator_script_runs_exec_outside_slurm_and_once_per_task_in_a_job_of_several() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let run_arg = run.to_str().unwrap();
    let out = crate::cli::orchestrator_script(&["--exec", "--run-dir", run_arg, "--", "sh", "-c", "exit 0"], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("srun"), "no job step outside SLURM: {stderr}");
    assert_eq!(last_event(&run, "child_exit")["verdict"], "finished");

    // Several tasks: accepted (one rekindle per task), launched with srun,
    // which this PATH lacks: the script says so before it starts anything.
    let bin = tmp.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let bash = Command::new("sh").args(["-c", "command -v bash"]).output().unwrap();
    std::os::unix::fs::symlink(String::from_utf8_lossy(&bash.stdout).trim(), bin.join("bash")).unwrap();
    let path = bin.to_string_lossy();
    let out = crate::cli::orchestrator_script(
        &["--exec", "--run-dir", run_arg, "--", "true"],
        &[("SLURM_JOB_ID", "7"), ("SLURM_NTASKS", "2"), ("PATH", &path)],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("rekindle exec runs the program once per task, task 0 leading"), "{stderr}");
    assert!(stderr.contains("srun not found on PATH inside the job"), "{stderr}");
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let out = crate::cli::orchestrator_script(&["--exec", "--run-dir", run_arg, "true"], &[]);
    assert_eq!(out.status.code(), Some(2), "no `--` before the command: usage");
}

#[test]
fn the_pytorch_example_and_the_helper_compile() {
    let Some(()) = requires::python() else { return };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tmp = tempfile::tempdir().unwrap();
    let files = [
        "python/examples/train_torch.py",
        "python/examples/train_ddp.py",
        "python/examples/train_numpy.py",
        "python/rekindle_client.py",
    ];
    for file in files {
        // By the system's python3 too (torch_exec.rs runs them with torch).
        let out = Command::new("python3")
            .args(["-c", "import py_compile, sys; py_compile.compile(sys.argv[1], cfile=sys.argv[2], doraise=True)"])
            .arg(root.join(file))
            .arg(tmp.path().join("out.pyc"))
            .output()
            .unwrap();
        assert!(out.status.success(), "{file}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let torch = std::fs::read_to_string(root.join("python/examples/train_torch.py")).unwrap();
    assert_eq!(torch.lines().filter(|l| l.ends_with("# rekindle")).count(), 5, "docs/exec.md promises five lines");
}

#[test]
fn seals_from_parallel_threads_of_a_program_run_one_at_a_time() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    // Eight seals at once, with rotation (keep = 2) in every one of them.
    let script = r#"for i in 1 2 3 4 5 6 7 8; do
        d="$REKINDLE_CHECKPOINT_DIR/s$i"; mkdir "$d"; head -c 100000 /dev/urandom > "$d/w"
        "$REKINDLE_BIN" -q seal "$d" --step "$i" >/dev/null 2>&1 &
    done; wait"#;
    RunCmd::exec(&run, &["sh", "-c", script]).set("checkpoint.keep=2").run(TIMEOUT).assert_code(0);
    let saved = events_named(&run, "checkpoint_saved");
    assert!(!saved.is_empty());
    assert!(saved.iter().all(|e| e["warning"].is_null()), "a seal met another's rename: {saved:?}");
    let steps: Vec<u64> = saved.iter().map(|e| e["step"].as_u64().unwrap()).collect();
    assert!(steps.windows(2).all(|w| w[0] < w[1]), "sealed out of order: {steps:?}");
    assert_eq!(checkpoint_steps(&run).len(), saved.len().min(2), "{steps:?}");
    assert_eq!(verify(&run).0, Some(0));
}

#[test]
fn a_seal_that_dies_before_its_rename_leaves_no_checkpoint_and_the_next_attempt_clears_it() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    // The seal process dies after writing the manifest, before the rename
    // (a failpoint of the real binary); the program then exits 0.
    let script = r#"d="$REKINDLE_CHECKPOINT_DIR/s"; mkdir "$d"; echo w > "$d/w"
        FAILPOINTS=checkpoint::seal::before_rename=panic "$REKINDLE_BIN" -q seal "$d" --step 1 2>/dev/null
        echo "seal exited $?" >&2"#;
    let first = RunCmd::exec(&run, &["sh", "-c", script]).run(TIMEOUT);
    first.assert_code(0);
    assert!(first.stderr.contains("seal exited 101"), "{}", first.tail());
    assert!(checkpoint_steps(&run).is_empty(), "nothing was sealed");
    // A seal works on the staged directory moved under a name of its own.
    let sealing: Vec<_> = std::fs::read_dir(run.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(".tmp-seal-step-0000000001-"))
        .collect();
    assert_eq!(sealing.len(), 1, "{sealing:?}");
    assert!(sealing[0].join("MANIFEST.json").is_file(), "it died after writing the manifest");
    assert!(!run.join("checkpoints/.staging/s").exists(), "moved out of the program's reach");
    RunCmd::exec(&run, &["sh", "-c", "test -z \"$REKINDLE_RESUME_FROM\""]).run(TIMEOUT).assert_code(0);
    assert!(!sealing[0].exists(), "the next attempt removed it");
    assert!(events_named(&run, "resume").is_empty());
}

#[test]
fn a_program_that_cannot_start_is_a_deterministic_error_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let failed = RunCmd::exec(&run, &["/nonexistent/train", "--lr", "1"]).run(TIMEOUT);
    failed.assert_code(1);
    assert!(failed.stderr.contains("cannot start the program `/nonexistent/train --lr 1`"), "{}", failed.tail());
    let error = last_event(&run, "error");
    assert_eq!(error["class"], "deterministic", "{error}");
    assert_eq!(error["requeue"]["decision"], "skip", "{error}");
    assert!(events_named(&run, "child_start").is_empty());
}

#[test]
fn a_damaged_newest_checkpoint_is_quarantined_and_the_program_resumes_from_the_one_before() {
    let Some(()) = requires::python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let out = tmp.path().join("w.npy");
    exec(&run, &out, &[]).run(TIMEOUT).assert_code(0);
    let expected = std::fs::read(&out).unwrap();
    std::fs::remove_file(&out).unwrap();
    assert_eq!(checkpoint_steps(&run), vec![50, 55, 60]);
    crate::support::flip_byte(&run.join("checkpoints/step-0000000060/w.npy"));

    let again = exec(&run, &out, &[]).run(TIMEOUT);
    again.assert_code(0);
    let quarantined = last_event(&run, "checkpoint_quarantined");
    assert_eq!(quarantined["step"], 60, "{quarantined}");
    assert!(quarantined["reason"].as_str().unwrap().contains("w.npy: sha256 mismatch"), "{quarantined}");
    assert_eq!(last_event(&run, "resume")["step"], 55);
    assert!(last_event(&run, "child_start")["resume_from"].as_str().unwrap().ends_with("step-0000000055"));
    assert_eq!(std::fs::read(&out).unwrap(), expected, "the steps after 55 were trained again, identically");
    let (code, text) = rekindle(&["checkpoints"], &run);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("quarantine"), "{text}");
}

#[test]
fn a_lost_lock_kills_the_program_and_writes_nothing_more() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let mut running = RunCmd::exec(&run, &["sleep", "600"]).spawn();
    let start = running.wait_for_event("child_start", TIMEOUT);
    let child = Pid::from_raw(start["pid"].as_i64().unwrap() as i32);
    // Another process takes the run directory over: the lock names it now.
    let lock = run.join("rekindle.lock");
    let mut info: Value = serde_json::from_slice(&std::fs::read(&lock).unwrap()).unwrap();
    info["token"] = "another-process".into();
    info["pid"] = 1.into();
    std::fs::write(&lock, serde_json::to_vec(&info).unwrap()).unwrap();
    let before = crate::support::cli::events(&run).len();
    let exited = running.wait(TIMEOUT);
    exited.assert_code(1);
    assert!(exited.stderr.contains("took over the lock"), "{}", exited.tail());
    assert!(kill(child, None).is_err() || is_zombie(child), "the program {child} outlived the lost lock");
    assert_eq!(crate::support::cli::events(&run).len(), before, "nothing more is recorded");
}

#[test]
fn a_stop_forwarded_while_a_seal_is_in_flight_does_not_kill_the_seal() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    // The seal waits 10 s before its rename; the program's process group
    // (the seal included) gets SIGTERM meanwhile; the program waits for the
    // seal and says whether the seal was still running when the TERM came.
    // The test signals within milliseconds of the seal's pause; the pause
    // only has to outlast a loaded machine's scheduling delays (it was 2 s:
    // issue #34), and if it did not, "got TERM while the seal ran" is
    // missing and the test fails.
    let script = r#"trap 'kill -0 $seal 2>/dev/null && echo "program got TERM while the seal ran" >&2' TERM
        d="$REKINDLE_CHECKPOINT_DIR/s"; mkdir "$d"; echo w > "$d/w"
        FAILPOINTS='checkpoint::seal::before_rename=sleep(10000)' "$REKINDLE_BIN" -q seal "$d" --step 1 >/dev/null &
        seal=$!
        while kill -0 $seal 2>/dev/null; do wait $seal; rc=$?; done
        echo "seal exited $rc" >&2"#;
    let mut running = RunCmd::exec(&run, &["sh", "-c", script]).spawn();
    // The seal writes its manifest into the directory it moved out of
    // staging just before the failpoint's pause: from then on it has set its
    // stop signals to be ignored (its first act) and is in flight. (A fixed
    // sleep after the seal's start stood in for this before: issue #34.)
    running.wait_until("the seal's manifest, before its rename", TIMEOUT, |_| {
        std::fs::read_dir(run.join("checkpoints")).is_ok_and(|entries| {
            entries.filter_map(Result::ok).any(|e| {
                e.file_name().to_string_lossy().starts_with(".tmp-seal-step-0000000001-")
                    && e.path().join("MANIFEST.json").is_file()
            })
        })
    });
    running.signal(Signal::SIGTERM);
    let exited = running.wait(TIMEOUT);
    exited.assert_code(75);
    assert!(exited.stderr.contains("program got TERM while the seal ran"), "{}", exited.tail());
    assert!(exited.stderr.contains("seal exited 0"), "{}", exited.tail());
    assert_eq!(checkpoint_steps(&run), vec![1]);
    assert_eq!(last_event(&run, "stop")["step"], 1);
}

/// The stop that `exec` forwards to the program's process group can reach a
/// seal the program has just started, before the seal has set itself to
/// ignore it (loading a debug binary takes milliseconds, more on a loaded
/// machine): `rekindle_client.py` starts the seal with the stop signals
/// blocked, so it is never killed and the checkpoint is sealed. Here the
/// seal's stand-in sends itself SIGTERM before it becomes the real seal;
/// before the fix it died of it, and the checkpoint with it (found by
/// `make test-under-load`: a stop lost the stop checkpoint, issue #34).
#[test]
fn a_stop_that_reaches_a_seal_as_it_starts_does_not_kill_it() {
    let Some(()) = requires::python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let program = r##"
import os, signal, sys
import rekindle_client as rk
real = os.environ["REKINDLE_BIN"]
stand_in = os.path.join(os.environ["STAND_IN_DIR"], "seal")
with open(stand_in, "w") as f:
    f.write("#!%s\nimport os, signal, sys\n"
            "os.kill(os.getpid(), signal.SIGTERM)\n"
            "os.execv(%r, [%r] + sys.argv[1:])\n" % (sys.executable, real, real))
os.chmod(stand_in, 0o755)
os.environ["REKINDLE_BIN"] = stand_in
def save(d):
    with open(os.path.join(d, "w"), "w") as f:
        f.write("weights")
print(rk.checkpoint(1, save))
"##;
    let python = concat!(env!("CARGO_MANIFEST_DIR"), "/python");
    let exited = RunCmd::exec(&run, &["python3", "-c", program])
        .env("PYTHONPATH", python)
        .env("STAND_IN_DIR", tmp.path())
        .run(TIMEOUT);
    exited.assert_code(0);
    assert_eq!(checkpoint_steps(&run), vec![1], "{}", exited.tail());
}

/// A program that aborts in its teardown (as gloo can at interpreter exit)
/// after sealing the step `[run] max_steps` names has finished its training:
/// the run ends finished (exit 0, `finish`), its `child_exit` says
/// `teardown_fault`; without `max_steps` rekindle cannot know, and it stays
/// a crash.
#[test]
fn an_abort_after_sealing_the_last_step_is_a_teardown_fault_and_the_run_finishes() {
    let Some(()) = requires::python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let program = r##"
import os
import rekindle_client as rk
def save(d):
    with open(os.path.join(d, "w"), "w") as f:
        f.write("weights")
rk.checkpoint(5, save)
os.abort()
"##;
    let python = concat!(env!("CARGO_MANIFEST_DIR"), "/python");
    let run = tmp.path().join("run");
    let exited =
        RunCmd::exec(&run, &["python3", "-c", program]).env("PYTHONPATH", python).set("run.max_steps=5").run(TIMEOUT);
    exited.assert_code(0);
    let child_exit = last_event(&run, "child_exit");
    assert_eq!(child_exit["verdict"].as_str(), Some("teardown_fault"), "{child_exit}");
    assert_eq!(last_event(&run, "finish")["step"].as_u64(), Some(5));
    assert!(exited.stderr.contains("the failure came in its teardown"), "{}", exited.tail());

    let unbounded = tmp.path().join("unbounded");
    RunCmd::exec(&unbounded, &["python3", "-c", program]).env("PYTHONPATH", python).run(TIMEOUT).assert_code(1);
    assert_eq!(last_event(&unbounded, "child_exit")["verdict"].as_str(), Some("crashed"));
}

/// A program whose rank stops reporting progress (`rk.step`) for `[watchdog]
/// step` is hung: rekindle records `hang` (the rank, the step it was in),
/// ends the program and exits 75 from the newest checkpoint; the rerun
/// resumes from it and finishes.
#[test]
fn a_rank_that_stops_reporting_progress_is_ended_by_the_watchdog_and_the_run_resumes() {
    let Some(()) = requires::python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let program = r##"
import os, sys, time
import rekindle_client as rk
start = rk.resume_step() or 0
def save(d, step):
    with open(os.path.join(d, "w"), "w") as f:
        f.write(str(step))
for step in range(start + 1, 13):
    time.sleep(0.05)
    rk.step(step)
    if step % 4 == 0:
        rk.checkpoint(step, lambda d: save(d, step))
    if step == 10 and start == 0:
        print("hanging at step 10", file=sys.stderr, flush=True)
        while True:  # SIGTERM only sets the client's stop flag
            time.sleep(1)
print("finished", file=sys.stderr, flush=True)
"##;
    let python = concat!(env!("CARGO_MANIFEST_DIR"), "/python");
    let run = tmp.path().join("run");
    let exec = || RunCmd::exec(&run, &["python3", "-c", program]).env("PYTHONPATH", python).set("watchdog.step=2s");
    let hung = exec().run(TIMEOUT);
    hung.assert_code(75);
    assert!(hung.stderr.contains("hanging at step 10"), "{}", hung.tail());
    let hang = last_event(&run, "hang");
    assert_eq!(
        (hang["thread"].as_str(), hang["activity"].as_str(), hang["rank"].as_u64()),
        (Some("program"), Some("step"), Some(0)),
        "{hang}"
    );
    // The step it was in: after the last one it reported (at most a second stale).
    let step = hang["step"].as_u64().unwrap();
    assert!((5..=11).contains(&step), "{hang}");
    assert_eq!(hang["limit_seconds"].as_f64(), Some(2.0), "{hang}");
    assert!(hang["stuck_seconds"].as_f64().unwrap() > 2.0, "{hang}");
    assert_eq!(last_event(&run, "child_exit")["verdict"].as_str(), Some("hang"));
    let stop = last_event(&run, "stop");
    assert_eq!((stop["reason"].as_str(), stop["step"].as_u64()), (Some("hang: step"), Some(8)), "{stop}");
    assert_eq!(checkpoint_steps(&run), vec![4, 8]);

    let resumed = exec().run(TIMEOUT);
    resumed.assert_code(0);
    assert!(resumed.stderr.contains("finished"), "{}", resumed.tail());
    assert_eq!(checkpoint_steps(&run), vec![4, 8, 12]);
    assert_eq!(events_named(&run, "hang").len(), 1, "the resumed attempt ran past step 10 unhindered");
}

/// An evaluation longer than `[watchdog] step` whose batches are reported
/// (`rk.eval_batch`, as the trainers' callbacks do) is not a hang: the
/// watchdog times the gap between batches, against `[watchdog] eval`.
#[test]
fn a_long_evaluation_that_reports_its_batches_is_not_a_hang() {
    let Some(()) = requires::python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let program = r##"
import sys, time
import rekindle_client as rk
for step in range(1, 6):
    time.sleep(0.05)
    rk.step(step)
for batch in range(1, 13):
    time.sleep(0.5)
    rk.eval_batch(5, batch)
rk.step(6)
print("evaluated for 6 s", file=sys.stderr, flush=True)
"##;
    let python = concat!(env!("CARGO_MANIFEST_DIR"), "/python");
    let run = tmp.path().join("run");
    let ran = RunCmd::exec(&run, &["python3", "-c", program])
        .env("PYTHONPATH", python)
        .set("watchdog.step=2s")
        .set("watchdog.eval=2s")
        .run(TIMEOUT);
    ran.assert_code(0);
    assert!(ran.stderr.contains("evaluated for 6 s"), "{}", ran.tail());
    assert!(events_named(&run, "hang").is_empty(), "{}", ran.tail());
}

/// Under SLURM the lock names the node as SLURM does (SLURMD_NODENAME),
/// which need not be the host name (the local cluster's n1 and n2 run on
/// one host): the program's seals must still find their supervisor. The
/// `exec` drill failed exactly so before the seal asked the same name.
#[test]
fn seals_find_their_supervisor_on_a_slurm_node_whose_name_is_not_the_host_name() {
    let Some(()) = requires::python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let out = tmp.path().join("w.npy");
    exec(&run, &out, &[]).env("SLURMD_NODENAME", "not-this-host").run(TIMEOUT).assert_code(0);
    assert!(!checkpoint_steps(&run).is_empty(), "the program sealed no checkpoint");
    assert_eq!(std::fs::read(&out).unwrap(), reference(tmp.path()));
}

/// Task `task` of a job step of two, one per node (n1, n2), as `srun -N2
/// -n2` starts them, running `sh -c SCRIPT`; `[distributed] timeout` 3 s.
fn task_on_node(run: &Path, script: &str, task: u32, restart: u32, fake: &FakeScontrol) -> RunCmd {
    let (node, task, restart) = (format!("n{}", task + 1), task.to_string(), restart.to_string());
    let slurm = [
        ("SLURM_JOB_ID", "77"),
        ("SLURM_STEP_ID", "0"),
        ("SLURM_STEP_NUM_TASKS", "2"),
        ("SLURM_PROCID", task.as_str()),
        ("SLURM_LOCALID", "0"),
        ("SLURM_NODEID", task.as_str()),
        ("SLURM_STEP_NUM_NODES", "2"),
        ("SLURM_STEP_NODELIST", "n[1-2]"),
        ("SLURM_STEP_TASKS_PER_NODE", "1(x2)"),
        ("SLURM_RESTART_COUNT", restart.as_str()),
        ("SLURMD_NODENAME", node.as_str()),
    ];
    let mut cmd = RunCmd::exec(run, &["sh", "-c", script]).set("distributed.timeout=3s").env("PATH", fake.path());
    for (k, v) in slurm {
        cmd = cmd.env(k, v);
    }
    cmd
}

/// Each task seals its part of step 1 (rank 0's seal commits the world's
/// checkpoint once both are in) and then waits forever; a resumed task says
/// where from and ends.
const SEAL_THEN_WAIT: &str = r#"set -e
if [ -n "$REKINDLE_RESUME_FROM" ]; then echo "task $RANK resumes from $REKINDLE_RESUME_FROM" >&2; exit 0; fi
d="$REKINDLE_CHECKPOINT_DIR/part-$RANK"; mkdir -p "$d"; echo "$RANK" > "$d/part-$RANK.txt"
"$REKINDLE_BIN" seal "$d" --step 1 --rank "$RANK" --world-size "$WORLD_SIZE" >/dev/null
exec sleep 600"#;

#[test]
fn when_task_0_is_lost_with_its_node_task_1_records_it_and_exits_75_and_the_world_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let fake = FakeScontrol::running_job(tmp.path());
    let run = tmp.path().join("run");
    let mut leader = task_on_node(&run, SEAL_THEN_WAIT, 0, 0, &fake).spawn();
    let follower = task_on_node(&run, SEAL_THEN_WAIT, 1, 0, &fake).spawn();
    leader.wait_until("the world checkpoint of step 1", TIMEOUT, |_| checkpoint_steps(&run) == [1]);
    // Node n1 is lost: task 0's rekindle dies, its program with it.
    let lost_at = std::time::Instant::now();
    leader.signal(Signal::SIGKILL);
    let followed = follower.wait(TIMEOUT);
    let took = lost_at.elapsed();
    followed.assert_code(75);
    assert!(took < Duration::from_secs(3 + 10), "task 1 ended {took:?} after the loss (timeout 3 s)");
    assert!(followed.stderr.contains("another task of the job step was lost"), "{}", followed.tail());
    let _ = leader.wait(TIMEOUT);

    let lost = last_event(&run, "rank_lost");
    assert_eq!((lost["rank"].as_u64(), lost["rank_node"].as_str()), (Some(0), Some("n1")), "{lost}");
    assert_eq!((lost["noticed_by"].as_u64(), lost["world_size"].as_u64()), (Some(1), Some(2)), "{lost}");
    assert!(lost["silent_seconds"].as_f64().unwrap() > 3.0, "{lost}");
    let stop = last_event(&run, "stop");
    assert_eq!((stop["reason"].as_str(), stop["step"].as_u64()), (Some("rank_lost: rank 0"), Some(1)), "{stop}");
    let exit = last_event(&run, "child_exit");
    assert_eq!((exit["task"].as_u64(), exit["verdict"].as_str()), (Some(1), Some("rank_lost")), "{exit}");
    assert!(fake.calls().iter().any(|c| c == "requeue 77"), "task 1 requeued the job: {:?}", fake.calls());
    let start = last_event(&run, "start");
    assert_eq!((start["world_size"].as_u64(), &start["rank_nodes"]), (Some(2), &serde_json::json!(["n1", "n2"])));

    // The requeued job: task 0 takes the dead holder's lock over, and both
    // programs get the world checkpoint of step 1.
    let leader = task_on_node(&run, SEAL_THEN_WAIT, 0, 1, &fake).spawn();
    let follower = task_on_node(&run, SEAL_THEN_WAIT, 1, 1, &fake).spawn();
    let (led, followed) = (leader.wait(TIMEOUT), follower.wait(TIMEOUT));
    led.assert_code(0);
    followed.assert_code(0);
    let step1 = run.join("checkpoints/step-0000000001");
    for (task, out) in [(0, &led), (1, &followed)] {
        let line = format!("task {task} resumes from {}", step1.display());
        assert!(out.stderr.contains(&line), "no `{line}` in\n{}", out.tail());
    }
    assert_eq!(verify(&run).0, Some(0));
    // Task 1's records reach events.jsonl once each, whichever way they
    // went: through task 0 while it lived and served (#41: one writer of the
    // file), else written by task 1 itself (task 0 lost in the first launch;
    // gone before task 1's program started in the second, whose program
    // ends at once).
    for name in ["child_start", "child_exit"] {
        let of_task_1: Vec<u64> = events_named(&run, name)
            .iter()
            .filter(|e| e["task"].as_u64() == Some(1))
            .map(|e| e["attempt"].as_u64().unwrap_or(99))
            .collect();
        assert_eq!(of_task_1, [0, 1], "task 1's {name} once an attempt");
    }
}

/// A task whose own rank hangs while task 0's ranks go on (nothing binds
/// them: no collective) hears no notice from task 0: at twice `[watchdog]
/// step` it records the hang itself, ends its program and exits 1 (under
/// srun its failure ends the job step, and task 0 takes that as a stop).
#[test]
fn a_task_whose_own_rank_hangs_while_task_0s_go_on_records_it_and_ends_its_task() {
    let Some(()) = requires::python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let fake = FakeScontrol::running_job(tmp.path());
    let run = tmp.path().join("run");
    let program = tmp.path().join("steps.py");
    std::fs::write(
        &program,
        r##"
import os, sys, time
import rekindle_client as rk
rank = int(os.environ["RANK"])
for step in range(1, 201):
    time.sleep(0.05)
    rk.step(step)
    if rank == 1 and step == 10:
        print("rank 1 hangs at step 10", file=sys.stderr, flush=True)
        while True:
            time.sleep(1)
"##,
    )
    .unwrap();
    let script = format!("exec python3 {}", program.display());
    let python = concat!(env!("CARGO_MANIFEST_DIR"), "/python");
    let task = |n| task_on_node(&run, &script, n, 0, &fake).env("PYTHONPATH", python).set("watchdog.step=2s");
    let (leader, follower) = (task(0).spawn(), task(1).spawn());
    let followed = follower.wait(TIMEOUT);
    assert_eq!(followed.code(), Some(1), "{}", followed.tail());
    assert!(followed.stderr.contains("task 0 said nothing of it"), "{}", followed.tail());
    assert!(followed.stderr.contains("while task 0's went on"), "{}", followed.tail());
    let _ = leader.wait(TIMEOUT);
    let hang = last_event(&run, "hang");
    assert_eq!((hang["rank"].as_u64(), hang["thread"].as_str()), (Some(1), Some("program")), "{hang}");
    assert!(hang["stuck_seconds"].as_f64().unwrap() >= 4.0, "twice the 2 s limit: {hang}");
    let exit = events_named(&run, "child_exit").into_iter().find(|e| e["task"].as_u64() == Some(1)).unwrap();
    assert_eq!(exit["verdict"].as_str(), Some("hang"), "{exit}");
}

/// A program (python3, `rekindle_client`) that writes `stderr` (a Python
/// expression of bytes), creates `$MARK`, waits for the stop, seals a
/// checkpoint of step 1 when `seal`, and exits `code`.
fn stderr_program(stderr: &str, seal: bool, code: i32) -> String {
    format!(
        r#"
import os, sys, time
sys.path.insert(0, {client:?})
import rekindle_client as rk
rk.install_stop_handler()
sys.stderr.buffer.write({stderr})
sys.stderr.flush()
open(os.environ["MARK"], "w").close()
while not rk.should_stop():
    time.sleep(0.01)
if {seal}:
    rk.checkpoint(1, lambda d: open(os.path.join(d, "w.bin"), "w").write("w"))
sys.stderr.write("\rstopped\n")
sys.exit({code})
"#,
        client = concat!(env!("CARGO_MANIFEST_DIR"), "/python"),
        seal = if seal { "True" } else { "False" },
    )
}

fn wait_for_file(path: &Path, running: &mut crate::support::cli::Running) {
    running.wait_until(&path.display().to_string(), TIMEOUT, |_| path.exists());
}

/// Issue #40: a 1 MB stderr line was redacted on the supervisor's thread in
/// quadratic time; a SIGTERM waited minutes behind it and the program was
/// SIGKILLed without its checkpoint.
#[test]
fn a_megabyte_stderr_line_does_not_delay_the_stop() {
    let Some(()) = requires::python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let mark = tmp.path().join("written");
    // One line of `://` ended, then one left open while the program waits.
    let program = stderr_program(r#"b"://" * 349526 + b"\n" + b"://" * 349526"#, true, 0);
    let mut running = RunCmd::exec(&run, &["python3", "-c", &program])
        .set("signals.grace=6s")
        .set("signals.safety_margin=1s")
        .env("MARK", &mark)
        .spawn();
    wait_for_file(&mark, &mut running);
    // The scenario, not synchronisation: the SIGTERM comes while the open
    // line is still being taken in (any moment in the first seconds would do:
    // the bug held the stop for minutes).
    std::thread::sleep(Duration::from_millis(500));
    running.signal(Signal::SIGTERM);
    let sent = std::time::Instant::now();
    let exited = running.wait(Duration::from_secs(60));
    let took = exited.at - sent;
    exited.assert_code(75);
    assert!(took < Duration::from_secs(5), "rekindle exited {took:?} after the SIGTERM (grace 6s)");
    let child_exit = last_event(&run, "child_exit");
    assert_eq!(child_exit["verdict"], "stopped", "{child_exit}");
    assert_eq!(child_exit["killed_at_deadline"], false, "{child_exit}");
    assert_eq!(checkpoint_steps(&run), vec![1], "the program sealed its stop checkpoint");
    let tail: Vec<&str> = child_exit["stderr_tail"].as_array().unwrap().iter().map(|l| l.as_str().unwrap()).collect();
    assert_eq!(tail.len(), 3, "{tail:?}");
    for long in &tail[..2] {
        // 1 MB each, kept to their first 500 bytes and marked.
        assert!(long.starts_with("://://") && long.ends_with(&format!(" […{} bytes cut]", 349526 * 3 - 500)), "{long}");
    }
    assert_eq!(tail[2], "stopped", "a `\\r` ends the open line");
}

/// A progress bar that only writes `\r` (tqdm) reaches the tail line by line,
/// each bounded, and rekindle's memory stays bounded however long it runs.
#[test]
fn a_carriage_return_progress_bar_is_kept_in_bounded_lines_and_bounded_memory() {
    let Some(()) = requires::python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let mark = tmp.path().join("written");
    // 40 MB of updates, then 24 MB with no line ending at all.
    let stderr =
        r##"b"".join(b"\rtraining %6d |%s|" % (i, b"#" * 180) for i in range(200000)) + b"\r" + b"x" * (24 << 20)"##;
    let program = stderr_program(stderr, false, 0);
    let mut running = RunCmd::exec(&run, &["python3", "-c", &program]).env("MARK", &mark).spawn();
    wait_for_file(&mark, &mut running);
    // The program's write returned before it made the mark, so all but a
    // pipe's worth is read already; wait until rekindle has read every byte
    // (its read count, /proc/<pid>/io's rchar, counts them with the few it
    // reads elsewhere) so the peak below includes the end of the 24 MB line.
    let written: u64 = 200_000 * 199 + 1 + (24 << 20);
    let read = || {
        let io = std::fs::read_to_string(format!("/proc/{}/io", running.pid())).unwrap_or_default();
        io.lines().find_map(|l| l.strip_prefix("rchar:")).and_then(|v| v.trim().parse::<u64>().ok()).unwrap_or(0)
    };
    let t0 = std::time::Instant::now();
    while read() < written {
        assert!(t0.elapsed() < TIMEOUT, "rekindle read {} of the {written} bytes written to its stderr pipe", read());
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = std::fs::read_to_string(format!("/proc/{}/status", running.pid())).unwrap();
    let peak_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    running.signal(Signal::SIGTERM);
    let exited = running.wait(TIMEOUT);
    assert!(exited.code().is_some(), "{}", exited.tail());
    assert!(peak_kib < 48 << 10, "rekindle's peak memory was {peak_kib} KiB after 64 MB of stderr");
    let child_exit = last_event(&run, "child_exit");
    let tail: Vec<&str> = child_exit["stderr_tail"].as_array().unwrap().iter().map(|l| l.as_str().unwrap()).collect();
    assert_eq!(tail.len(), 20, "{tail:?}");
    assert!(tail[17].starts_with("training 199999 |###") && tail[17].len() < 300, "{}", tail[17]);
    assert!(
        tail[18].starts_with("xxx") && tail[18].ends_with(&format!(" […{} bytes cut]", (24 << 20) - 500)),
        "{}",
        &tail[18][490..]
    );
    assert_eq!(tail[19], "stopped");
}

/// Issue #40: `rekindle seal` loaded `<run>/config.toml` following links and
/// without a bound (a link to another run's config chose where its
/// checkpoint went; a FIFO there blocked the program's seal forever). It now
/// reads it as `status` does: a regular file only, bounded, never blocking.
#[test]
fn issue_40_seal_refuses_a_linked_or_fifo_config_without_blocking() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    RunCmd::exec(&run, &["true"]).run(TIMEOUT).assert_code(0);
    let staged = run.join("checkpoints/.staging/a");
    std::fs::create_dir_all(&staged).unwrap();
    std::fs::write(staged.join("x.bin"), b"state").unwrap();
    let elsewhere = tmp.path().join("elsewhere.toml");
    std::fs::rename(run.join("config.toml"), &elsewhere).unwrap();
    let seal = || {
        let mut child = Command::new(exe())
            .args(["seal", "--run-dir"])
            .arg(&run)
            .arg(&staged)
            .args(["--step", "7"])
            .env_remove("REKINDLE_EXEC_PID")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let t0 = std::time::Instant::now();
        while child.try_wait().unwrap().is_none() {
            if t0.elapsed() > Duration::from_secs(30) {
                child.kill().unwrap();
                panic!("seal blocked on config.toml");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = child.wait_with_output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    std::os::unix::fs::symlink(&elsewhere, run.join("config.toml")).unwrap();
    let (code, stderr) = seal();
    assert_ne!(code, Some(0), "a linked config.toml is not loaded: {stderr}");
    assert!(stderr.contains("config.toml"), "{stderr}");
    std::fs::remove_file(run.join("config.toml")).unwrap();
    nix::unistd::mkfifo(&run.join("config.toml"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    let (code, stderr) = seal();
    assert_ne!(code, Some(0), "a FIFO config.toml is refused: {stderr}");
    assert!(checkpoint_steps(&run).is_empty(), "nothing sealed");
}
