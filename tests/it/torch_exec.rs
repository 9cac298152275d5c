//! `rekindle exec` with real PyTorch (the project's `.venv`, made by `make
//! deps`; CPU only, `OMP_NUM_THREADS=1` so runs are bit-identical across
//! processes): python/examples/train_torch.py stopped by SIGTERM and resumed
//! ends `torch.equal` to an uninterrupted run (model, optimizer, RNG);
//! python/examples/train_ddp.py as two DDP ranks (gloo) under `torchrun
//! --standalone` stops at one agreed step with one world checkpoint and
//! resumes equal to an uninterrupted two-rank run; a rank that dies in the
//! middle of a save leaves no world checkpoint of that step, and the resume
//! from the one before still ends equal; a world where only rank 0 writes
//! commits with the other ranks' empty parts; two tasks of a job step (no
//! srun): a task lost with its node ends the other with 75 within the
//! timeout, and the world resumes equal.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::support::cli::{RunCmd, checkpoint_steps, events_named, last_event, verify};
use crate::support::requires;
use crate::support::scontrol::FakeScontrol;

const TIMEOUT: Duration = Duration::from_secs(300);

fn example(name: &str) -> String {
    format!("{}/python/examples/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// `rekindle exec --run-dir RUN -- COMMAND…` with one CPU thread per process.
fn exec(run: &Path, command: &[&str]) -> RunCmd {
    RunCmd::exec(run, command).env("OMP_NUM_THREADS", "1")
}

/// `.venv/bin/python train_torch.py --steps 60 --every 20 --out OUT EXTRA…`.
fn single(python: &Path, run: &Path, out: &Path, extra: &[&str]) -> RunCmd {
    let (python, program, out) = (python.to_string_lossy(), example("train_torch.py"), out.to_string_lossy());
    let mut command = vec![&*python, &*program, "--steps", "60", "--every", "20", "--out", &*out];
    command.extend_from_slice(extra);
    exec(run, &command)
}

/// `torchrun --standalone --nproc-per-node 2 train_ddp.py --steps 60 --every 20 --out OUT EXTRA…`.
fn ddp(run: &Path, out: &Path, extra: &[&str]) -> RunCmd {
    let torchrun = requires::venv().join("bin/torchrun");
    let (torchrun, program, out) = (torchrun.to_string_lossy(), example("train_ddp.py"), out.to_string_lossy());
    let mut command =
        vec![&*torchrun, "--standalone", "--nproc-per-node", "2", &*program, "--steps", "60", "--every", "20"];
    command.extend_from_slice(&["--out", &*out]);
    command.extend_from_slice(extra);
    exec(run, &command)
}

/// The names of the files of `run`'s checkpoint of `step`, as its manifest lists them.
fn manifest_names(run: &Path, step: u64) -> Vec<String> {
    let path = run.join(format!("checkpoints/step-{step:010}/MANIFEST.json"));
    let manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    manifest["files"].as_array().unwrap().iter().map(|f| f["name"].as_str().unwrap().to_string()).collect()
}

/// Asserts that every torch object saved in `a` equals the one of the same
/// name in `b` (slurm/torch_equal.py: `torch.equal` on every tensor, `==`
/// on everything else): files, or directories of files.
fn assert_torch_equal(python: &Path, a: &Path, b: &Path) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/slurm/torch_equal.py");
    let out = Command::new(python).arg(script).arg(a).arg(b).output().unwrap();
    assert!(
        out.status.success(),
        "{} and {} differ: {}",
        a.display(),
        b.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A trainer's example (`python/examples/<example>`, rekindle's callback
/// in it) stopped by SIGTERM past step 25 and resumed ends equal to an
/// uninterrupted run: the stop saved the current step through the callback,
/// the resume took it from `REKINDLE_RESUME_FROM`.
fn trainer_stopped_and_resumed_ends_equal(example_name: &str) {
    let _ = trainer_of_ranks_stopped_and_resumed_ends_equal(example_name, 1);
}

/// As [`trainer_stopped_and_resumed_ends_equal`], with `ranks` DDP ranks
/// under `torchrun --standalone` when more than one. Returns the run.
fn trainer_of_ranks_stopped_and_resumed_ends_equal(example_name: &str, ranks: usize) -> Option<tempfile::TempDir> {
    let python = requires::trainers()?;
    let tmp = tempfile::tempdir().unwrap();
    let program = example(example_name);
    let torchrun = requires::venv().join("bin/torchrun");
    let nproc = ranks.to_string();
    let run_of = |run: &Path, out: &Path, extra: &[&str]| {
        let (python, torchrun, out) = (python.to_string_lossy(), torchrun.to_string_lossy(), out.to_string_lossy());
        let mut command = if ranks > 1 {
            vec![&*torchrun, "--standalone", "--nproc-per-node", nproc.as_str()]
        } else {
            vec![&*python]
        };
        command.extend_from_slice(&[&*program, "--steps", "60", "--every", "20", "--out", &*out]);
        command.extend_from_slice(extra);
        exec(run, &command)
    };
    let expected = tmp.path().join("reference.pt");
    run_of(&tmp.path().join("reference"), &expected, &[]).run(TIMEOUT).assert_code(0);
    assert_eq!(checkpoint_steps(&tmp.path().join("reference")), vec![20, 40, 60]);

    let (run, out) = (tmp.path().join("run"), tmp.path().join("final.pt"));
    let mut first = run_of(&run, &out, &["--step-seconds", "0.05"]).spawn();
    first.wait_for_step(25, TIMEOUT);
    first.signal(Signal::SIGTERM);
    let stopped = first.wait(TIMEOUT);
    stopped.assert_code(75);
    let stopped_at = last_event(&run, "stop")["step"].as_u64().unwrap();
    assert!(stopped_at >= 25, "the stop checkpoint is of the step it reached: {stopped_at}");
    assert_eq!(checkpoint_steps(&run).last(), Some(&stopped_at), "{}", stopped.tail());
    assert!(stopped.stderr.contains(&format!("stopped at step {stopped_at}")), "{}", stopped.tail());

    let second = run_of(&run, &out, &[]).run(TIMEOUT);
    second.assert_code(0);
    assert!(second.stderr.contains(&format!("starting at step {stopped_at}")), "{}", second.tail());
    assert_torch_equal(&python, &expected, &out);
    assert_eq!(verify(&run).0, Some(0));
    Some(tmp)
}

#[test]
fn a_hugging_face_trainer_with_the_callback_stopped_and_resumed_ends_equal() {
    trainer_stopped_and_resumed_ends_equal("train_hf.py");
}

/// The Trainer's own DDP (accelerate, gloo on the CPU) of two ranks under
/// `torchrun`: each rank seals its part of every save (rank 0 the Trainer's
/// files, rank 1 its `rng_state_1.pth`), the stop is agreed at one step, and
/// the resume ends equal to two ranks never stopped.
#[test]
fn a_hugging_face_trainer_of_two_ddp_ranks_stopped_and_resumed_ends_equal() {
    let Some(tmp) = trainer_of_ranks_stopped_and_resumed_ends_equal("train_hf.py", 2) else { return };
    let run = tmp.path().join("run");
    let newest = *checkpoint_steps(&run).last().unwrap();
    let names = manifest_names(&run, newest);
    for name in ["model.safetensors", "optimizer.pt", "rng_state_0.pth", "rng_state_1.pth"] {
        assert!(names.iter().any(|n| n == name), "the world checkpoint of step {newest} lacks {name}: {names:?}");
    }
}

/// Lightning's DDP (gloo on the CPU) of two ranks under `torchrun`: rank 0
/// writes `last.ckpt` (every rank takes part in the save and the seal), the
/// stop is agreed at one step mid-epoch, and the resume ends equal to two
/// ranks never stopped.
#[test]
fn a_lightning_trainer_of_two_ddp_ranks_stopped_mid_epoch_and_resumed_ends_equal() {
    let Some(tmp) = trainer_of_ranks_stopped_and_resumed_ends_equal("train_lightning.py", 2) else { return };
    let run = tmp.path().join("run");
    let newest = *checkpoint_steps(&run).last().unwrap();
    assert_eq!(manifest_names(&run, newest), ["last.ckpt"], "rank 0's file; rank 1's part is empty");
}

#[test]
fn a_lightning_trainer_with_the_callback_stopped_mid_epoch_and_resumed_ends_equal() {
    trainer_stopped_and_resumed_ends_equal("train_lightning.py");
}

/// The drills' and these tests' judge of equality refuses to call nothing
/// equal: two empty directories, or a side that is missing (a reference run
/// that failed wrote none).
#[test]
fn torch_equal_refuses_empty_or_missing_sides() {
    let Some(python) = requires::torch() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/slurm/torch_equal.py");
    for (x, y, why) in [(&a, &b, "is empty"), (&a, &tmp.path().join("missing"), "does not exist")] {
        let out = Command::new(&python).arg(script).arg(x).arg(y).output().unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && said.contains(why), "{}: {said}", y.display());
    }
}

#[test]
fn the_pytorch_example_stopped_by_sigterm_and_resumed_ends_equal_to_an_uninterrupted_run() {
    let Some(python) = requires::torch() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let expected = tmp.path().join("reference.pt");
    single(&python, &tmp.path().join("reference"), &expected, &[]).run(TIMEOUT).assert_code(0);

    let (run, out) = (tmp.path().join("run"), tmp.path().join("final.pt"));
    let mut first = single(&python, &run, &out, &["--step-seconds", "0.05"]).spawn();
    first.wait_for_step(25, TIMEOUT);
    first.signal(Signal::SIGTERM);
    first.wait(TIMEOUT).assert_code(75);
    let stopped_at = last_event(&run, "stop")["step"].as_u64().unwrap();
    assert!(stopped_at >= 25, "the stop checkpoint is of the step it reached: {stopped_at}");
    assert_eq!(checkpoint_steps(&run).last(), Some(&stopped_at));
    assert!(!out.exists(), "not finished");

    let second = single(&python, &run, &out, &[]).run(TIMEOUT);
    second.assert_code(0);
    assert!(second.stderr.contains(&format!("starting at step {stopped_at}")), "{}", second.tail());
    assert_torch_equal(&python, &expected, &out);
    assert_eq!(verify(&run).0, Some(0));
}

/// Two DDP ranks under `torchrun` (`train_ddp.py EXTRA…`): an uninterrupted
/// run, then one stopped by SIGTERM past step 25 (both ranks agree on the
/// step; its world checkpoint lists `files`, committed by rank 0) and
/// resumed by both ranks from it, ending equal to the uninterrupted one.
fn ddp_stopped_and_resumed_ends_equal(extra: &[&str], files: &[&str]) {
    let Some(python) = requires::torch() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let expected = tmp.path().join("reference");
    let reference = tmp.path().join("reference-run");
    ddp(&reference, &expected, extra).run(TIMEOUT).assert_code(0);
    assert_eq!(checkpoint_steps(&reference), vec![20, 40, 60]);

    let (run, out) = (tmp.path().join("run"), tmp.path().join("final"));
    let mut first = ddp(&run, &out, &[extra, &["--step-seconds", "0.05"]].concat()).spawn();
    first.wait_for_step(25, TIMEOUT);
    first.signal(Signal::SIGTERM);
    let stopped = first.wait(TIMEOUT);
    stopped.assert_code(75);
    // The signal reached the ranks at different moments; they agreed on one step.
    let stopped_at = last_event(&run, "stop")["step"].as_u64().unwrap();
    for rank in 0..2 {
        let line = format!("rank {rank} stopped at step {stopped_at}");
        assert!(stopped.stderr.contains(&line), "no `{line}` in\n{}", stopped.tail());
    }
    // One checkpoint for the world.
    assert_eq!(manifest_names(&run, stopped_at), files);
    let saved = last_event(&run, "checkpoint_saved");
    assert_eq!(saved["step"].as_u64(), Some(stopped_at), "{saved}");
    assert!(saved["parts_wait_seconds"].as_f64().is_some(), "rank 0 committed the world's parts: {saved}");

    let second = ddp(&run, &out, extra).run(TIMEOUT);
    second.assert_code(0);
    for rank in 0..2 {
        let line = format!("rank {rank} of 2 starting at step {stopped_at}");
        assert!(second.stderr.contains(&line), "no `{line}` in\n{}", second.tail());
    }
    assert_torch_equal(&python, &expected, &out);
    assert_eq!(verify(&run).0, Some(0));
}

/// #43: torch.distributed.checkpoint (what FSDP programs save with) into
/// each rank's part: rank 0 writes `.metadata`, each rank its own shards,
/// one world checkpoint holds them all, and `dcp.load` on every rank reads
/// it back to a run equal to an uninterrupted one.
#[test]
fn two_ddp_ranks_saving_through_torch_distributed_checkpoint_stop_and_resume_equal() {
    let files = [".metadata", "__0_0.distcp", "__1_0.distcp", "rng-0.pt", "rng-1.pt"];
    ddp_stopped_and_resumed_ends_equal(&["--dcp"], &files);
}

#[test]
fn two_ddp_ranks_under_torchrun_stop_at_one_step_with_one_world_checkpoint_and_resume_equal() {
    // Rank 0's model and every rank's generator.
    ddp_stopped_and_resumed_ends_equal(&[], &["model.pt", "rng-0.pt", "rng-1.pt"]);
}

#[test]
fn a_rank_that_dies_mid_save_leaves_no_world_checkpoint_and_the_resume_from_the_one_before_ends_equal() {
    let Some(python) = requires::torch() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let expected = tmp.path().join("reference");
    ddp(&tmp.path().join("reference-run"), &expected, &[]).run(TIMEOUT).assert_code(0);

    let (run, out) = (tmp.path().join("run"), tmp.path().join("final"));
    // Rank 1 writes half of its part of step 40 and dies; rank 0 has sealed
    // its own part and waits for rank 1's (at most [distributed] timeout).
    let died = ddp(&run, &out, &["--die-mid-save", "1:40"]).set("distributed.timeout=5s").run(TIMEOUT);
    assert_eq!(died.code(), Some(1), "{}", died.tail());
    assert!(died.stderr.contains("rank 1 dying in the middle of a save at step 40"), "{}", died.tail());
    assert_eq!(checkpoint_steps(&run), vec![20], "no world checkpoint of step 40");
    let exit = last_event(&run, "child_exit");
    assert_eq!(exit["verdict"].as_str(), Some("crashed"), "{exit}");
    let error = last_event(&run, "error");
    assert_eq!(error["class"].as_str(), Some("transient"), "it had sealed step 20 in this attempt: {error}");

    let resumed = ddp(&run, &out, &[]).run(TIMEOUT);
    resumed.assert_code(0);
    assert!(resumed.stderr.contains("rank 1 of 2 starting at step 20"), "{}", resumed.tail());
    assert_eq!(events_named(&run, "checkpoint_rejected").len(), 0, "nothing half-sealed was ever a checkpoint");
    assert_torch_equal(&python, &expected, &out);
}

/// One DDP rank of two under `torchrun --standalone` stops making progress
/// (a deadlocked data loader): the other waits for it in the next all-reduce,
/// so neither reports a step; rekindle's watchdog (`[watchdog] step`) ends
/// the program, records `hang` and exits 75 from the newest world
/// checkpoint, and the resume ends equal to an uninterrupted run.
#[test]
fn a_rank_hung_under_torchrun_is_ended_by_the_watchdog_and_the_resume_ends_equal() {
    let Some(python) = requires::torch() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let expected = tmp.path().join("reference");
    ddp(&tmp.path().join("reference-run"), &expected, &[]).run(TIMEOUT).assert_code(0);

    let (run, out) = (tmp.path().join("run"), tmp.path().join("final"));
    let marker = tmp.path().join("hung-once");
    let hang = format!("1:25:{}", marker.display());
    let hung = ddp(&run, &out, &["--hang", &hang]).set("watchdog.step=4s").run(TIMEOUT);
    hung.assert_code(75);
    assert!(hung.stderr.contains("rank 1 hangs at step 25"), "{}", hung.tail());
    let event = last_event(&run, "hang");
    assert_eq!((event["thread"].as_str(), event["activity"].as_str()), (Some("program"), Some("step")), "{event}");
    // Both ranks stopped: whichever reported last the earlier is named.
    assert!(event["rank"].as_u64().is_some_and(|r| r < 2), "{event}");
    assert!((21..=25).contains(&event["step"].as_u64().unwrap()), "{event}");
    assert_eq!(last_event(&run, "child_exit")["verdict"].as_str(), Some("hang"));
    let stop = last_event(&run, "stop");
    assert_eq!((stop["reason"].as_str(), stop["step"].as_u64()), (Some("hang: step"), Some(20)), "{stop}");

    ddp(&run, &out, &["--hang", &hang]).run(TIMEOUT).assert_code(0);
    assert_torch_equal(&python, &expected, &out);
    assert_eq!(verify(&run).0, Some(0));
}

/// Task `task` of a job step of two under `rekindle exec` (as `sbatch -N1
/// -n2 slurm/orchestrator.slurm --exec …` starts them through `srun`), its
/// program one DDP rank: `python train_ddp.py`, no torchrun.
fn task_of_two(
    python: &Path,
    run: &Path,
    out: &Path,
    task: u32,
    restart: u32,
    fake: &FakeScontrol,
    extra: &[&str],
) -> RunCmd {
    let (python, program, out) = (python.to_string_lossy(), example("train_ddp.py"), out.to_string_lossy());
    let mut command = vec![&*python, &*program, "--steps", "60", "--every", "20", "--out", &*out];
    command.extend_from_slice(extra);
    let (task, restart) = (task.to_string(), restart.to_string());
    let slurm = [
        ("SLURM_JOB_ID", "77"),
        ("SLURM_STEP_ID", "0"),
        ("SLURM_STEP_NUM_TASKS", "2"),
        ("SLURM_PROCID", task.as_str()),
        ("SLURM_LOCALID", task.as_str()),
        ("SLURM_NODEID", "0"),
        ("SLURM_STEP_NUM_NODES", "1"),
        ("SLURM_STEP_TASKS_PER_NODE", "2"),
        ("SLURM_RESTART_COUNT", restart.as_str()),
    ];
    let mut cmd = exec(run, &command).env("PATH", fake.path());
    for (k, v) in slurm {
        cmd = cmd.env(k, v);
    }
    cmd
}

#[test]
fn two_tasks_of_a_job_step_run_one_rank_each_stop_at_one_step_and_resume_equal() {
    let Some(python) = requires::torch() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let expected = tmp.path().join("reference");
    ddp(&tmp.path().join("reference-run"), &expected, &[]).run(TIMEOUT).assert_code(0);
    let fake = FakeScontrol::running_job(tmp.path());

    let (run, out) = (tmp.path().join("run"), tmp.path().join("final"));
    let slow = ["--step-seconds", "0.05"];
    let mut leader = task_of_two(&python, &run, &out, 0, 0, &fake, &slow).spawn();
    let follower = task_of_two(&python, &run, &out, 1, 0, &fake, &slow).spawn();
    leader.wait_for_step(25, TIMEOUT);
    // SLURM signals every task of the step.
    leader.signal(Signal::SIGTERM);
    follower.signal(Signal::SIGTERM);
    let (led, followed) = (leader.wait(TIMEOUT), follower.wait(TIMEOUT));
    led.assert_code(75);
    followed.assert_code(75);
    let stopped_at = last_event(&run, "stop")["step"].as_u64().unwrap();
    let both = format!("{}{}", led.stderr, followed.stderr);
    for rank in 0..2 {
        let line = format!("rank {rank} stopped at step {stopped_at}");
        assert!(both.contains(&line), "no `{line}` in\n{}\n{}", led.tail(), followed.tail());
    }
    assert_eq!(checkpoint_steps(&run).last(), Some(&stopped_at));
    let tasks: Vec<u64> = events_named(&run, "child_start").iter().filter_map(|e| e["task"].as_u64()).collect();
    assert_eq!(tasks.len(), 2, "each task records its program's start: {tasks:?}");
    // Task 1's start went through task 0 (#41: one writer of events.jsonl);
    // its end may too, unless task 0 had ended first.
    let relayed = followed.stderr.split("relayed=").nth(1).and_then(|r| r.split(' ').next()?.parse::<u64>().ok());
    assert!(relayed.is_some_and(|n| n >= 1), "task 1 relayed {relayed:?} records: {}", followed.tail());
    assert_eq!(last_event(&run, "start")["world_size"].as_u64(), Some(2));
    assert!(fake.calls().iter().any(|c| c == "requeue 77"), "task 0 requeued the job: {:?}", fake.calls());

    // The requeued job: both tasks again, the next restart.
    let leader = task_of_two(&python, &run, &out, 0, 1, &fake, &[]).spawn();
    let follower = task_of_two(&python, &run, &out, 1, 1, &fake, &[]).spawn();
    let (led, followed) = (leader.wait(TIMEOUT), follower.wait(TIMEOUT));
    led.assert_code(0);
    followed.assert_code(0);
    let line = format!("rank 1 of 2 starting at step {stopped_at}");
    assert!(followed.stderr.contains(&line), "no `{line}` in\n{}", followed.tail());
    assert_torch_equal(&python, &expected, &out);
    assert_eq!(verify(&run).0, Some(0));
}

#[test]
fn a_task_whose_rank_dies_mid_save_ends_at_once_and_leaves_no_world_checkpoint_of_that_step() {
    let Some(python) = requires::torch() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let fake = FakeScontrol::running_job(tmp.path());
    let (run, out) = (tmp.path().join("run"), tmp.path().join("final"));
    // Task 1's rank writes half of its part of step 40 and dies; task 0's
    // rank waits for that part (at most [distributed] timeout), then fails.
    let die = ["--die-mid-save", "1:40"];
    let leader = task_of_two(&python, &run, &out, 0, 0, &fake, &die).set("distributed.timeout=5s").spawn();
    let follower = task_of_two(&python, &run, &out, 1, 0, &fake, &die).set("distributed.timeout=5s").spawn();
    let followed = follower.wait(TIMEOUT);
    assert_eq!(followed.code(), Some(1), "its program failed unasked: {}", followed.tail());
    assert!(followed.stderr.contains("ending this task, and with it the job step"), "{}", followed.tail());
    let led = leader.wait(TIMEOUT);
    assert_eq!(led.code(), Some(1), "{}", led.tail());
    assert!(led.stderr.contains("rank(s) 1 sealed no part within 5 s"), "{}", led.tail());
    assert_eq!(checkpoint_steps(&run), vec![20], "no world checkpoint of step 40");
    let exits: Vec<(Option<u64>, Option<String>)> = events_named(&run, "child_exit")
        .iter()
        .map(|e| (e["task"].as_u64(), e["verdict"].as_str().map(String::from)))
        .collect();
    assert!(exits.contains(&(Some(1), Some("crashed".into()))), "{exits:?}");
    assert_eq!(last_event(&run, "error")["class"].as_str(), Some("transient"), "it had sealed step 20 in this attempt");
}

#[test]
fn a_task_lost_with_its_node_ends_the_other_within_the_timeout_with_75_and_the_world_resumes_equal() {
    let Some(python) = requires::torch() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let expected = tmp.path().join("reference");
    ddp(&tmp.path().join("reference-run"), &expected, &[]).run(TIMEOUT).assert_code(0);
    let fake = FakeScontrol::running_job(tmp.path());
    let (run, out) = (tmp.path().join("run"), tmp.path().join("final"));
    // One task on each of two nodes, as SLURM lays out `srun -N2 -n2`.
    let on_node = |cmd: RunCmd, task: u32| {
        cmd.set("distributed.timeout=5s")
            .env("SLURMD_NODENAME", format!("n{}", task + 1))
            .env("SLURM_STEP_NODELIST", "n[1-2]")
            .env("SLURM_STEP_NUM_NODES", "2")
            .env("SLURM_STEP_TASKS_PER_NODE", "1(x2)")
            .env("SLURM_NODEID", task.to_string())
            .env("SLURM_LOCALID", "0")
    };
    let slow = ["--step-seconds", "0.05"];
    let mut leader = on_node(task_of_two(&python, &run, &out, 0, 0, &fake, &slow), 0).spawn();
    let follower = on_node(task_of_two(&python, &run, &out, 1, 0, &fake, &slow), 1).spawn();
    leader.wait_for_step(25, TIMEOUT);
    assert_eq!(checkpoint_steps(&run), vec![20]);
    // Node n2 is lost: its supervisor dies at once, its program with it
    // (the parent-death signal); nothing of it writes another byte.
    let lost_at = std::time::Instant::now();
    follower.signal(Signal::SIGKILL);
    let led = leader.wait(TIMEOUT);
    let took = lost_at.elapsed();
    led.assert_code(75);
    assert!(took < Duration::from_secs(5 + 10), "ended {took:?} after the loss ([distributed] timeout 5 s)");
    let _ = follower.wait(TIMEOUT);

    let lost = last_event(&run, "rank_lost");
    assert_eq!((lost["rank"].as_u64(), lost["rank_node"].as_str()), (Some(1), Some("n2")), "{lost}");
    assert_eq!((lost["noticed_by"].as_u64(), lost["world_size"].as_u64()), (Some(0), Some(2)), "{lost}");
    let stop = last_event(&run, "stop");
    assert_eq!((stop["reason"].as_str(), stop["step"].as_u64()), (Some("rank_lost: rank 1"), Some(20)), "{stop}");
    let exit = last_event(&run, "child_exit");
    assert_eq!((exit["task"].as_u64(), exit["verdict"].as_str()), (Some(0), Some("rank_lost")), "{exit}");
    assert_eq!(checkpoint_steps(&run), vec![20], "the world checkpoint before the loss stands");
    assert!(fake.calls().iter().any(|c| c == "requeue 77"), "task 0 requeued the job: {:?}", fake.calls());
    // Each task's node, in the start event and the summary.
    let start = last_event(&run, "start");
    assert_eq!((start["world_size"].as_u64(), &start["rank_nodes"]), (Some(2), &serde_json::json!(["n1", "n2"])));
    let summary: serde_json::Value = serde_json::from_slice(&std::fs::read(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!((summary["state"].as_str(), summary["world_size"].as_u64()), (Some("stopped"), Some(2)), "{summary}");
    assert_eq!(summary["rank_nodes"], serde_json::json!(["n1", "n2"]), "{summary}");

    // The requeued job: both tasks again, from the checkpoint of step 20.
    let leader = on_node(task_of_two(&python, &run, &out, 0, 1, &fake, &[]), 0).spawn();
    let follower = on_node(task_of_two(&python, &run, &out, 1, 1, &fake, &[]), 1).spawn();
    let (led, followed) = (leader.wait(TIMEOUT), follower.wait(TIMEOUT));
    led.assert_code(0);
    followed.assert_code(0);
    assert!(followed.stderr.contains("rank 1 of 2 starting at step 20"), "{}", followed.tail());
    assert_torch_equal(&python, &expected, &out);
    assert_eq!(verify(&run).0, Some(0));
}

/// Two tasks of a job step, one rank each; task 1's rank hangs and task 0's
/// waits for it in the next all-reduce. Task 0 finds the hang (its own rank
/// stopped too), tells task 1 before it ends its program, records `hang`
/// and the requeue; task 1 ends its program as the hang's echo and exits
/// with task 0's 75; the requeued world resumes equal.
#[test]
fn a_rank_hung_in_a_job_step_of_two_tasks_is_ended_by_task_0_and_both_tasks_exit_75() {
    let Some(python) = requires::torch() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let expected = tmp.path().join("reference");
    ddp(&tmp.path().join("reference-run"), &expected, &[]).run(TIMEOUT).assert_code(0);
    let fake = FakeScontrol::running_job(tmp.path());
    let (run, out) = (tmp.path().join("run"), tmp.path().join("final"));
    let marker = tmp.path().join("hung-once");
    let hang = format!("1:25:{}", marker.display());
    let extra = ["--hang", hang.as_str()];
    let task = |n, restart| {
        task_of_two(&python, &run, &out, n, restart, &fake, &extra)
            .set("watchdog.step=4s")
            .set("distributed.timeout=10s")
    };
    let (leader, follower) = (task(0, 0).spawn(), task(1, 0).spawn());
    let (led, followed) = (leader.wait(TIMEOUT), follower.wait(TIMEOUT));
    led.assert_code(75);
    assert_eq!(followed.code(), Some(75), "task 1 exits with task 0's code: {}", followed.tail());
    assert!(followed.stderr.contains("task 0 found a rank hung"), "{}", followed.tail());
    let event = last_event(&run, "hang");
    assert_eq!(
        (event["thread"].as_str(), event["rank"].as_u64()),
        (Some("program"), Some(0)),
        "task 0's own rank: {event}"
    );
    assert_eq!(events_named(&run, "hang").len(), 1, "one hang, recorded by task 0");
    let exits: Vec<(Option<u64>, Option<String>)> = events_named(&run, "child_exit")
        .iter()
        .map(|e| (e["task"].as_u64(), e["verdict"].as_str().map(String::from)))
        .collect();
    assert!(
        exits.contains(&(Some(0), Some("hang".into()))) && exits.contains(&(Some(1), Some("hang".into()))),
        "{exits:?}"
    );
    let stop = last_event(&run, "stop");
    assert_eq!((stop["reason"].as_str(), stop["step"].as_u64()), (Some("hang: step"), Some(20)), "{stop}");
    assert!(fake.calls().iter().any(|c| c == "requeue 77"), "task 0 requeued the job: {:?}", fake.calls());

    let (leader, follower) = (task(0, 1).spawn(), task(1, 1).spawn());
    let (led, followed) = (leader.wait(TIMEOUT), follower.wait(TIMEOUT));
    led.assert_code(0);
    followed.assert_code(0);
    assert_torch_equal(&python, &expected, &out);
    assert_eq!(verify(&run).0, Some(0));
}

#[test]
fn when_only_rank_0_writes_the_other_ranks_empty_parts_still_commit_and_the_resume_ends_equal() {
    // Rank 0's file alone, committed once rank 1's empty part was in.
    ddp_stopped_and_resumed_ends_equal(&["--rank0-only"], &["model.pt"]);
}
