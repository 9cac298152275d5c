//! Ranks of a data-parallel world, launched for real: `mpirun -n N
//! rekindle …` (OpenMPI, no SLURM). The collective sum every data-parallel
//! step uses must be exact (each rank checks it against the sum it computes
//! alone, bit for bit) and deterministic; a binary built without the `mpi`
//! feature must refuse to be one of several ranks, naming the feature.
//!
//! `rekindle run` over two ranks: stopped (by `--stop-at-step`, or by a
//! SIGTERM that reaches only one rank) and resumed at two ranks, it ends byte
//! for byte as two ranks never stopped; resumed at one rank, it sees every
//! sample exactly once and ends close to it (not bit-exact: the float
//! summation order changes). A rank SIGKILLed mid-run (either one) leaves
//! every committed checkpoint valid, the launcher ends the other, and the
//! run resumes from the newest checkpoint exactly.

use crate::support;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use support::cli::verify;
use support::requires;
use support::runs::{
    EXIT_DONE, EXIT_STOPPED, Training, assert_same_checkpoint, assert_same_metrics, checkpoint_steps, events_named,
    last_logged_step, losses, rekindle, step_dir, summary,
};

/// `mpirun -n ranks rekindle ARGS…` as root on a 2-vCPU machine: no core
/// binding (both ranks pinned to one core are ~25× slower, FACTS.md), and
/// more ranks than cores allowed.
fn mpirun(ranks: usize, args: &[&str]) -> Output {
    mpirun_command(ranks, rekindle(), args).output().expect("run mpirun")
}

/// `mpirun -n ranks` around `cmd` (its program, arguments and environment).
fn mpirun_command(ranks: usize, cmd: Command, args: &[&str]) -> Command {
    let mut mpi = mpirun_with_env(&cmd);
    mpi.args(["-n", &ranks.to_string()]).arg(cmd.get_program()).args(cmd.get_args()).args(args);
    mpi
}

/// `mpirun` with `cmd`'s environment, as root, without core binding.
pub(crate) fn mpirun_with_env(cmd: &Command) -> Command {
    let mut mpi = Command::new("mpirun");
    mpi.args(["--bind-to", "none", "--oversubscribe"])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    for (key, value) in cmd.get_envs() {
        match value {
            Some(v) => mpi.env(key, v),
            None => mpi.env_remove(key),
        };
    }
    mpi
}

/// `cmd` over `ranks` ranks, one application context per rank (`mpirun -n
/// 1 … : -n 1 …`), each with the `KEY=VALUE` settings `env(rank)` gives it
/// (`-x KEY=VALUE`) besides `cmd`'s environment.
pub(crate) fn mpirun_per_rank(ranks: usize, cmd: Command, env: impl Fn(usize) -> Vec<String>) -> Command {
    let mut mpi = mpirun_with_env(&cmd);
    for r in 0..ranks {
        if r > 0 {
            mpi.arg(":");
        }
        mpi.args(["-n", "1"]);
        for setting in env(r) {
            mpi.args(["-x", &setting]);
        }
        mpi.arg(cmd.get_program()).args(cmd.get_args());
    }
    mpi
}

/// `cmd` over `ranks` ranks with the failpoints `failpoints` on rank
/// `rank` alone (`-x FAILPOINTS=…` in its application context).
fn mpirun_failing_on(ranks: usize, cmd: Command, rank: usize, failpoints: &str) -> Command {
    mpirun_per_rank(ranks, cmd, |r| if r == rank { vec![format!("FAILPOINTS={failpoints}")] } else { Vec::new() })
}

/// The tiny mlp for `max_steps`, checkpointing every 10 steps.
fn training(max_steps: u64) -> Training {
    Training::tiny_mlp(max_steps).set("checkpoint.every_steps=10")
}

/// `training` over `ranks` ranks in `run_dir`; asserts the exit code.
fn run_ranks(training: &Training, ranks: usize, run_dir: &Path, extra: &[&str], expected: i32) {
    let out = mpirun_command(ranks, training.command(run_dir, extra), &[]).output().expect("run mpirun");
    assert_eq!(
        out.status.code(),
        Some(expected),
        "mpirun -n {ranks} rekindle run {extra:?}: {:?}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

fn json_of(out: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "exit {:?}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("one JSON report from rank 0 ({e}):\n{stdout}"))
}

#[test]
fn the_rank_order_sum_over_two_and_three_ranks_is_exact_and_deterministic() {
    let Some(()) = requires::mpi() else { return };
    for ranks in [2, 3] {
        // An odd length: chunks of different sizes.
        let report =
            json_of(&mpirun(ranks, &["bench", "collective", "--bytes", "400012", "--iterations", "3", "--json"]));
        assert_eq!(report["world_size"], ranks, "{report}");
        assert_eq!(report["engine"], "mpi", "{report}");
        assert_eq!(report["launcher"], "mpirun", "{report}");
        assert_eq!(report["exact_and_deterministic"], true, "{report}");
        assert!(report["library"].as_str().is_some_and(|l| l.contains("Open MPI")), "{report}");
    }
}

#[test]
fn one_process_needs_no_mpi() {
    let out =
        rekindle().args(["bench", "collective", "--bytes", "4096", "--iterations", "2", "--json"]).output().unwrap();
    let report = json_of(&out);
    assert_eq!((report["world_size"].as_u64(), report["engine"].as_str()), (Some(1), Some("solo")), "{report}");
}

#[test]
fn a_rank_of_a_bigger_world_is_refused_without_the_mpi_feature_and_named_with_it() {
    // What mpirun tells each rank, without mpirun: a build without the
    // feature must refuse at once; a build with it must not pretend to be
    // alone (MPI_Init finds no world of 2 and the mismatch is named).
    let out = rekindle()
        .args(["bench", "collective", "--bytes", "4096"])
        .env("SLURM_STEP_NUM_TASKS", "2")
        .env("SLURM_PROCID", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    if cfg!(feature = "mpi") {
        assert!(stderr.contains("srun --mpi=pmix"), "{stderr}");
    } else {
        assert!(stderr.contains("without the `mpi` feature") && stderr.contains("--features mpi"), "{stderr}");
    }
}

#[test]
fn two_ranks_stopped_and_resumed_end_byte_identical_to_two_ranks_never_stopped() {
    let Some(()) = requires::mpi() else { return };
    let training = training(40);
    let tmp = tempfile::tempdir().unwrap();
    let (reference, stopped) = (tmp.path().join("reference"), tmp.path().join("stopped"));
    run_ranks(&training, 2, &reference, &[], EXIT_DONE);
    run_ranks(&training, 2, &stopped, &["--stop-at-step", "15"], EXIT_STOPPED);
    assert!(step_dir(&stopped, 15).is_dir());
    run_ranks(&training, 2, &stopped, &[], EXIT_DONE);
    assert_same_checkpoint(&stopped, &reference, 40);
    assert_same_metrics(&stopped, &reference, 40);
    // One writer: rank 0. The start event names both ranks' nodes.
    let start = &events_named(&reference, "start")[0];
    assert_eq!(start["world_size"], 2, "{start}");
    assert_eq!(start["rank_nodes"].as_array().map(Vec::len), Some(2), "{start}");
    assert_eq!(events_named(&reference, "start").len(), 1, "only rank 0 writes records");
    assert_eq!(summary(&reference)["world_size"], 2);
}

#[test]
fn a_rank_sigkilled_mid_run_leaves_every_committed_checkpoint_valid_and_the_run_resumable() {
    let Some(()) = requires::mpi() else { return };
    let training = training(100_000);
    let tmp = tempfile::tempdir().unwrap();
    for victim in [0, 1] {
        let run_dir = tmp.path().join(format!("killed-rank-{victim}"));
        let (mut child, pid) =
            start_until_saved(&training, 2, &run_dir, 2, victim, Stdio::null(), Duration::from_secs(60));
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL).unwrap();
        // The launcher ends the other rank: nobody waits forever in a collective.
        let status = child.wait().unwrap();
        assert!(!status.success(), "rank {victim} killed, yet mpirun says {status}");
        // mpirun may return before the other rank is gone: it ends once MPI
        // notices the broken connection (seconds), as srun -K would end it.
        let t1 = Instant::now();
        while rank_pid(&run_dir, 1 - victim).is_some() || lock_holder(&run_dir).is_some() {
            assert!(t1.elapsed() < Duration::from_secs(60), "rank {} outlived rank {victim} by 60 s", 1 - victim);
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!(
            "rank {victim} SIGKILLed: the other rank was gone {:.1} s after mpirun returned",
            t1.elapsed().as_secs_f64()
        );
        let (code, out) = verify(&run_dir);
        assert_eq!(code, Some(0), "rank {victim} killed: every committed checkpoint must verify:\n{out}");
        let newest = *checkpoint_steps(&run_dir).last().expect("committed checkpoints");
        // Resumed at two ranks from the newest committed one, a few steps on,
        // it equals two ranks never stopped.
        let target = newest + 7;
        run_ranks(&training, 2, &run_dir, &["--stop-at-step", &target.to_string()], EXIT_STOPPED);
        let resume = events_named(&run_dir, "resume").pop().expect("a resume event");
        assert_eq!(resume["step"], newest, "resumed from the newest committed checkpoint: {resume}");
        let reference = tmp.path().join(format!("reference-{victim}"));
        run_ranks(&training, 2, &reference, &["--stop-at-step", &target.to_string()], EXIT_STOPPED);
        assert_same_checkpoint(&run_dir, &reference, target);
    }
}

/// The pid in `run_dir`'s lock file while that process exists (a zombie
/// included: the lock counts it alive until it is reaped).
fn lock_holder(run_dir: &Path) -> Option<i32> {
    let lock: Value = serde_json::from_slice(&std::fs::read(run_dir.join("rekindle.lock")).ok()?).ok()?;
    let pid = nix::unistd::Pid::from_raw(lock["pid"].as_i64()? as i32);
    nix::sys::signal::kill(pid, None).is_ok().then_some(pid.as_raw())
}

/// Starts `training` over `ranks` ranks in `run_dir` (stdout discarded,
/// stderr as given) and waits, at most `within`, until `checkpoints`
/// checkpoints are saved and rank `victim`'s process is found: the launcher
/// and that rank's pid, for a test to stop or kill it mid-run.
fn start_until_saved(
    training: &Training,
    ranks: usize,
    run_dir: &Path,
    checkpoints: usize,
    victim: usize,
    stderr: Stdio,
    within: Duration,
) -> (Child, i32) {
    let mut child = mpirun_command(ranks, training.command(run_dir, &[]), &[])
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("start mpirun");
    let t0 = Instant::now();
    // The victim must also have told the others a completed step in its
    // heartbeat (what a `rank_lost` event reports), which its beat thread
    // writes a fraction of the timeout later than the step itself.
    let beat_has_step = || rank_beat(run_dir, victim).is_some_and(|b| b["step"].is_u64());
    loop {
        let saved = events_named(run_dir, "checkpoint_saved").len() >= checkpoints;
        if let (true, true, Some(pid)) = (saved, beat_has_step(), rank_pid(run_dir, victim)) {
            return (child, pid);
        }
        assert!(child.try_wait().unwrap().is_none(), "mpirun ended before {checkpoints} checkpoint(s) were saved");
        assert!(t0.elapsed() < within, "fewer than {checkpoints} checkpoint(s) in {within:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Rank `rank`'s newest beat as the others see it: in its node's file,
/// `<run dir>/ranks/node-<node>.json` (src/attempt/rank_watch.rs).
pub fn rank_beat(run_dir: &Path, rank: usize) -> Option<Value> {
    std::fs::read_dir(run_dir.join("ranks"))
        .ok()?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("node-"))
        .filter_map(|e| serde_json::from_slice::<Value>(&std::fs::read(e.path()).ok()?).ok())
        .flat_map(|node| node["beats"].as_array().cloned().unwrap_or_default())
        .filter(|b| b["rank"] == rank)
        .max_by_key(|b| b["seq"].as_u64())
}

/// The pid of rank `rank` of the run writing `run_dir` (OpenMPI tells each
/// rank its number in `OMPI_COMM_WORLD_RANK`).
fn rank_pid(run_dir: &Path, rank: usize) -> Option<i32> {
    let needle = run_dir.to_string_lossy().to_string();
    let want = format!("OMPI_COMM_WORLD_RANK={rank}");
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|entry| {
        let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
        let environ = std::fs::read(entry.path().join("environ")).ok()?;
        let args = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let is_rank = environ.split(|b| *b == 0).any(|kv| kv == want.as_bytes());
        (args.contains(" run ") && args.contains(&needle) && is_rank).then_some(pid)
    })
}

#[test]
fn a_sigterm_to_one_rank_stops_both_at_one_step_with_one_checkpoint_and_the_resume_is_exact() {
    let Some(()) = requires::mpi() else { return };
    let training = training(100_000);
    let tmp = tempfile::tempdir().unwrap();
    let run_dir = tmp.path().join("run");
    let mut child: Child = mpirun_command(2, training.command(&run_dir, &[]), &[])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start mpirun");
    let t0 = Instant::now();
    let follower = loop {
        let trained = last_logged_step(&run_dir).is_some_and(|s| s >= 12);
        if let (true, Some(pid)) = (trained, rank_pid(&run_dir, 1)) {
            break pid;
        }
        assert!(child.try_wait().unwrap().is_none(), "mpirun ended before the signal");
        assert!(t0.elapsed() < Duration::from_secs(60), "the ranks did not train 12 steps in 60 s");
        std::thread::sleep(Duration::from_millis(20));
    };
    // Only rank 1 gets it: rank 0 must learn it from the step's agreement.
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(follower), nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(EXIT_STOPPED), "{status}");
    let stop = events_named(&run_dir, "stop").pop().expect("a stop event from rank 0");
    assert_eq!(stop["reason"], "SIGTERM", "{stop}");
    let step = stop["step"].as_u64().unwrap();
    assert_eq!(last_logged_step(&run_dir), Some(step), "both ranks stopped at the step of the checkpoint");
    assert!(step_dir(&run_dir, step).is_dir());

    // The same run resumed at two ranks to a fixed step equals an
    // uninterrupted two-rank run to that step.
    let target = step + 5;
    run_ranks(&training, 2, &run_dir, &["--stop-at-step", &target.to_string()], EXIT_STOPPED);
    let reference = tmp.path().join("reference");
    run_ranks(&training, 2, &reference, &["--stop-at-step", &target.to_string()], EXIT_STOPPED);
    assert_same_checkpoint(&run_dir, &reference, target);
    assert_same_metrics(&run_dir, &reference, target);
}

#[test]
fn two_ranks_resumed_at_one_see_every_sample_once_and_land_close() {
    let Some(()) = requires::mpi() else { return };
    let training = training(40);
    let tmp = tempfile::tempdir().unwrap();
    let (reference, elastic) = (tmp.path().join("reference"), tmp.path().join("elastic"));
    run_ranks(&training, 2, &reference, &[], EXIT_DONE);
    run_ranks(&training, 2, &elastic, &["--stop-at-step", "15"], EXIT_STOPPED);
    training.run_to_end(&elastic);
    // Every step once; the same samples consumed (data cursor and counters).
    let state = |dir: &Path| -> Value {
        let bytes = std::fs::read(step_dir(dir, 40).join("state.json")).unwrap();
        serde_json::from_slice::<Value>(&bytes).unwrap()["train"].clone()
    };
    let (a, b) = (state(&elastic), state(&reference));
    for key in ["cursor", "counters", "step"] {
        assert_eq!(a[key], b[key], "`{key}` differs after the world size changed");
    }
    let (la, lb) = (losses(&elastic, 40), losses(&reference, 40));
    for (step, (x, y)) in la.iter().zip(&lb).enumerate() {
        assert!((x - y).abs() <= 1e-4 * y.abs().max(1.0), "step {}: loss {x} at 2 → 1 ranks, {y} at 2", step + 1);
    }
    assert_eq!(la[..15], lb[..15], "the steps before the stop are the same records");
}

#[test]
fn a_rank_stopped_without_dying_is_named_lost_within_the_timeout_and_the_world_ends_resumable() {
    let Some(()) = requires::mpi() else { return };
    const TIMEOUT_S: u64 = 2;
    let training = training(100_000).set(&format!("distributed.timeout=\"{TIMEOUT_S}s\""));
    let tmp = tempfile::tempdir().unwrap();
    for victim in [1usize, 0] {
        let run_dir = tmp.path().join(format!("stopped-rank-{victim}"));
        let (mut child, pid) =
            start_until_saved(&training, 2, &run_dir, 2, victim, Stdio::piped(), Duration::from_secs(60));
        let victim_pid = nix::unistd::Pid::from_raw(pid);
        // Stopped, not dead: MPI sees nothing wrong, the other rank waits in
        // the next collective; only the heartbeats tell.
        nix::sys::signal::kill(victim_pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
        let stopped_at = Instant::now();
        let deadline = Duration::from_secs(TIMEOUT_S + 20);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if stopped_at.elapsed() > deadline {
                let _ = nix::sys::signal::kill(victim_pid, nix::sys::signal::Signal::SIGKILL);
                let _ = child.kill();
                panic!("rank {victim} stopped: mpirun still running after {deadline:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let took = stopped_at.elapsed();
        let stderr = std::io::read_to_string(child.stderr.take().unwrap()).unwrap_or_default();
        eprintln!("rank {victim} SIGSTOPped: mpirun ended {:.1} s later with {status}", took.as_secs_f64());
        // The launcher ends the stopped rank too (SIGKILL reaches a stopped process).
        let t1 = Instant::now();
        while rank_pid(&run_dir, victim).is_some() || lock_holder(&run_dir).is_some() {
            if t1.elapsed() > Duration::from_secs(30) {
                let _ = nix::sys::signal::kill(victim_pid, nix::sys::signal::Signal::SIGKILL);
                panic!("the stopped rank {victim} outlived mpirun by 30 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(status.code(), Some(EXIT_STOPPED), "rank {victim} stopped: {status}\nstderr:\n{stderr}");
        let lost = events_named(&run_dir, "rank_lost");
        assert_eq!(lost.len(), 1, "one rank_lost event: {lost:?}");
        let event = &lost[0];
        assert_eq!(event["rank"], victim, "{event}");
        assert_eq!(event["noticed_by"], 1 - victim, "the lowest rank still beating records it: {event}");
        assert_eq!(event["world_size"], 2, "{event}");
        assert_eq!(event["pid"], pid, "{event}");
        assert!(event["step"].as_u64().is_some(), "{event}");
        assert!(!event["rank_node"].as_str().unwrap_or_default().is_empty(), "{event}");
        // Not before the timeout; after it, as soon as a watcher reads the
        // beats again (every tenth of it, idle). The upper bound only tells
        // a loss the heartbeats caught from one noticed some other way (the
        // launcher's abort, seconds on), with room for a watcher thread
        // that a loaded machine runs late (it was 5 s: issue #34).
        let silent = event["silent_seconds"].as_f64().unwrap();
        assert!(silent > TIMEOUT_S as f64 && silent < TIMEOUT_S as f64 + 10.0, "{event}");
        let stop = events_named(&run_dir, "stop").pop().expect("a stop event");
        assert_eq!(stop["reason"], format!("rank_lost: rank {victim}"), "{stop}");
        let (code, out) = verify(&run_dir);
        assert_eq!(code, Some(0), "rank {victim} stopped: every committed checkpoint must verify:\n{out}");
        let newest = *checkpoint_steps(&run_dir).last().expect("committed checkpoints");
        // The stop names the newest checkpoint committed when the loss was
        // noticed. Rank 0's background save in flight at the SIGSTOP may
        // still commit after it: the launcher's abort sends the stopped
        // rank SIGCONT before killing it. That one is newer, and valid.
        let stopped_at_step = stop["step"].as_u64().expect("the stop names a checkpoint");
        let started = events_named(&run_dir, "checkpoint_started");
        assert!(
            stopped_at_step == newest
                || (stopped_at_step < newest && started.iter().any(|e| e["step"].as_u64() == Some(newest))),
            "the stop names step {stopped_at_step}, the newest checkpoint is {newest} and was no save in flight: {stop}"
        );
        // The rerun resumes from the newest and equals two ranks never stopped.
        let target = newest + 7;
        run_ranks(&training, 2, &run_dir, &["--stop-at-step", &target.to_string()], EXIT_STOPPED);
        let resume = events_named(&run_dir, "resume").pop().expect("a resume event");
        assert_eq!(resume["step"], newest, "resumed from the newest committed checkpoint: {resume}");
        let reference = tmp.path().join(format!("reference-{victim}"));
        run_ranks(&training, 2, &reference, &["--stop-at-step", &target.to_string()], EXIT_STOPPED);
        assert_same_checkpoint(&run_dir, &reference, target);
        assert_same_metrics(&run_dir, &reference, target);
    }
}

#[test]
fn a_sharded_optimizer_run_equals_the_unsharded_one_and_resumes_across_world_sizes() {
    let Some(()) = requires::mpi() else { return };
    let plain = training(30);
    let sharded = training(30).set("distributed.shard_optimizer=true");
    let tmp = tempfile::tempdir().unwrap();
    let dir = |name: &str| tmp.path().join(name);

    // Two ranks, sharded, stopped and resumed: byte for byte two ranks unsharded.
    run_ranks(&plain, 2, &dir("reference"), &[], EXIT_DONE);
    run_ranks(&sharded, 2, &dir("sharded"), &["--stop-at-step", "15"], EXIT_STOPPED);
    run_ranks(&sharded, 2, &dir("sharded"), &[], EXIT_DONE);
    let kept = checkpoint_steps(&dir("sharded"));
    assert!(kept.contains(&30), "{kept:?}");
    for step in kept.into_iter().filter(|s| step_dir(&dir("reference"), *s).is_dir()) {
        assert_same_checkpoint(&dir("sharded"), &dir("reference"), step);
    }
    assert_same_metrics(&dir("sharded"), &dir("reference"), 30);
    let start = |d: &str| events_named(&dir(d), "start")[0]["optimizer_sharded"].clone();
    assert_eq!((start("sharded"), start("reference")), (Value::Bool(true), Value::Bool(false)));

    // 2 sharded ranks → 1 process: the same as 2 unsharded ranks → 1.
    run_ranks(&sharded, 2, &dir("2-to-1-sharded"), &["--stop-at-step", "15"], EXIT_STOPPED);
    sharded.run_to_end(&dir("2-to-1-sharded"));
    run_ranks(&plain, 2, &dir("2-to-1-plain"), &["--stop-at-step", "15"], EXIT_STOPPED);
    plain.run_to_end(&dir("2-to-1-plain"));
    assert_same_checkpoint(&dir("2-to-1-sharded"), &dir("2-to-1-plain"), 30);

    // 1 process → 2 sharded ranks: the same as 1 → 2 unsharded.
    plain.stop_at(&dir("1-to-2-sharded"), 15);
    run_ranks(&sharded, 2, &dir("1-to-2-sharded"), &[], EXIT_DONE);
    plain.stop_at(&dir("1-to-2-plain"), 15);
    run_ranks(&plain, 2, &dir("1-to-2-plain"), &[], EXIT_DONE);
    assert_same_checkpoint(&dir("1-to-2-sharded"), &dir("1-to-2-plain"), 30);
    assert_same_metrics(&dir("1-to-2-sharded"), &dir("1-to-2-plain"), 30);

    // 3 sharded ranks (one optimizer part each) → 2 sharded ranks: the same
    // as 3 unsharded ranks → 2.
    let (plain, sharded) = (plain.set("train.batch_size=12"), sharded.set("train.batch_size=12"));
    run_ranks(&sharded, 3, &dir("3-to-2-sharded"), &["--stop-at-step", "15"], EXIT_STOPPED);
    let parts = std::fs::read_dir(step_dir(&dir("3-to-2-sharded"), 15)).unwrap().count();
    assert_eq!(parts, 6, "model, state, manifest and one optimizer part per rank");
    run_ranks(&sharded, 2, &dir("3-to-2-sharded"), &[], EXIT_DONE);
    run_ranks(&plain, 3, &dir("3-to-2-plain"), &["--stop-at-step", "15"], EXIT_STOPPED);
    run_ranks(&plain, 2, &dir("3-to-2-plain"), &[], EXIT_DONE);
    assert_same_checkpoint(&dir("3-to-2-sharded"), &dir("3-to-2-plain"), 30);
}

#[test]
fn two_ranks_each_write_about_half_of_a_sharded_checkpoint_and_it_resumes_exactly_at_any_world_size() {
    let Some(()) = requires::mpi() else { return };
    // Four hidden layers of 48: weights of 3–9 KiB, cut into 4 KiB shards
    // among the ranks (issue 31: every rank writes its share).
    let plain = training(30).set("model.hidden=[48,48,48,48]");
    let shared = plain.clone().set("checkpoint.shard_size=\"4KiB\"");
    let tmp = tempfile::tempdir().unwrap();
    let dir = |name: &str| tmp.path().join(name);

    // Two ranks, stopped and resumed: the same values as two ranks writing
    // whole files, never stopped.
    run_ranks(&plain, 2, &dir("reference"), &[], EXIT_DONE);
    run_ranks(&shared, 2, &dir("shared"), &["--stop-at-step", "15"], EXIT_STOPPED);
    run_ranks(&shared, 2, &dir("shared"), &[], EXIT_DONE);
    let last = step_dir(&dir("shared"), 30);
    let names: Vec<String> =
        std::fs::read_dir(&last).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    for index in ["model.safetensors.index.json", "optimizer.safetensors.index.json"] {
        assert!(names.iter().any(|n| n == index), "{index} in {names:?}");
    }
    assert!(!names.iter().any(|n| n == "model.safetensors"), "{names:?}");
    assert_eq!(verify(&last).0, Some(0), "{}", verify(&last).1);
    for step in checkpoint_steps(&dir("shared")).into_iter().filter(|s| step_dir(&dir("reference"), *s).is_dir()) {
        assert_same_checkpoint(&dir("shared"), &dir("reference"), step);
    }
    assert_same_metrics(&dir("shared"), &dir("reference"), 30);

    // Each rank wrote about half of every checkpoint's bytes.
    let saved = events_named(&dir("shared"), "checkpoint_saved");
    assert!(saved.len() >= 3, "{saved:?}");
    for event in &saved {
        let (own, all) = (event["own_bytes"].as_f64().unwrap(), event["bytes"].as_f64().unwrap());
        assert!((0.3..0.7).contains(&(own / all)), "rank 0 wrote {own} of {all} bytes: {event}");
        assert_eq!(event["optimizer_parts"], 2, "{event}");
    }

    // Two ranks → one process: the same as two ranks writing whole files → one.
    run_ranks(&shared, 2, &dir("2-to-1"), &["--stop-at-step", "15"], EXIT_STOPPED);
    shared.run_to_end(&dir("2-to-1"));
    run_ranks(&plain, 2, &dir("2-to-1-plain"), &["--stop-at-step", "15"], EXIT_STOPPED);
    plain.run_to_end(&dir("2-to-1-plain"));
    assert_same_checkpoint(&dir("2-to-1"), &dir("2-to-1-plain"), 30);
}

/// The `.tmp-…` staging directories left in `run_dir`'s checkpoints directory.
fn staging_dirs(run_dir: &Path) -> Vec<String> {
    std::fs::read_dir(run_dir.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".tmp-"))
        .collect()
}

#[test]
fn a_rank_that_cannot_write_its_part_fails_that_checkpoint_alone_and_the_run_goes_on() {
    let Some(()) = requires::mpi() else { return };
    let sharded = training(50).set("distributed.shard_optimizer=true");
    let tmp = tempfile::tempdir().unwrap();
    let run_dir = tmp.path().join("run");
    // Rank 1's first part fails; rank 0 writes its files as usual.
    let cmd = sharded.command(&run_dir, &[]);
    let out = mpirun_failing_on(2, cmd, 1, "checkpoint::part::before_write=1*return").output().unwrap();
    assert_eq!(out.status.code(), Some(EXIT_DONE), "{}", String::from_utf8_lossy(&out.stderr));
    let failed = events_named(&run_dir, "checkpoint_failed");
    assert_eq!(failed.len(), 1, "{failed:?}");
    let error = failed[0]["error"].as_str().unwrap();
    assert_eq!(failed[0]["step"], 10);
    assert!(error.contains("rank 1 could not write its part") && error.contains("nothing was committed"), "{error}");
    // A later periodic save commits: at step 20, or later when rank 0's
    // persister is still busy then (a loaded machine defers saves; in CI
    // one was deferred past step 29).
    let kept = checkpoint_steps(&run_dir);
    let periodic_after = kept.iter().any(|s| (20..50).contains(s));
    assert!(!kept.contains(&10) && periodic_after && kept.contains(&50), "{kept:?}");
    assert!(staging_dirs(&run_dir).is_empty(), "{:?}", staging_dirs(&run_dir));
    let (code, out) = verify(&run_dir);
    assert_eq!(code, Some(0), "{out}");
    // What was committed is the unsharded run's state.
    let reference = tmp.path().join("reference");
    run_ranks(&training(50), 2, &reference, &[], EXIT_DONE);
    assert_same_checkpoint(&run_dir, &reference, 50);
}

#[test]
fn a_rank_killed_while_writing_its_part_leaves_no_partial_checkpoint_and_the_run_resumes_exactly() {
    let Some(()) = requires::mpi() else { return };
    let sharded = training(100_000).set("distributed.shard_optimizer=true");
    let tmp = tempfile::tempdir().unwrap();
    let run_dir = tmp.path().join("run");
    // Rank 1 writes its first part, then hangs in the second (step 20, or
    // a little later when a loaded machine defers that periodic save).
    let cmd = sharded.command(&run_dir, &[]);
    let mut child = mpirun_failing_on(2, cmd, 1, "checkpoint::part::before_write=1*off->sleep(60000)")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let second_started =
        || events_named(&run_dir, "checkpoint_started").iter().any(|e| e["step"].as_u64().is_some_and(|s| s > 10));
    while !second_started() || staging_dirs(&run_dir).is_empty() {
        assert!(child.try_wait().unwrap().is_none(), "mpirun ended before the second save began");
        assert!(t0.elapsed() < Duration::from_secs(90), "no second save within 90 s");
        std::thread::sleep(Duration::from_millis(10));
    }
    let victim = rank_pid(&run_dir, 1).expect("rank 1 runs");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(victim), nix::sys::signal::Signal::SIGKILL).unwrap();
    assert!(!child.wait().unwrap().success());
    let t1 = Instant::now();
    while rank_pid(&run_dir, 0).is_some() || lock_holder(&run_dir).is_some() {
        assert!(t1.elapsed() < Duration::from_secs(60), "rank 0 outlived rank 1 by 60 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Rank 0 wrote its files of that save, but without rank 1's part nothing
    // was committed: step 10 is the newest checkpoint, and it verifies.
    assert_eq!(checkpoint_steps(&run_dir).last(), Some(&10));
    let (code, out) = verify(&run_dir);
    assert_eq!(code, Some(0), "{out}");
    run_ranks(&sharded, 2, &run_dir, &["--stop-at-step", "17"], EXIT_STOPPED);
    assert_eq!(events_named(&run_dir, "resume").pop().expect("a resume")["step"], 10);
    assert!(staging_dirs(&run_dir).is_empty(), "the next start removed the leftovers");
    let reference = tmp.path().join("reference");
    run_ranks(&training(100_000), 2, &reference, &["--stop-at-step", "17"], EXIT_STOPPED);
    assert_same_checkpoint(&run_dir, &reference, 17);
}

/// A long sharded run checkpointing every 10 steps whose saves the watchdog
/// finds stuck after 2 s, with a short grace (the hang checkpoint's budget).
fn watched_sharded() -> Training {
    training(10_000_000)
        .set("distributed.shard_optimizer=true")
        .set("watchdog.save=\"2s\"")
        .set("signals.grace=\"20s\"")
        .set("signals.safety_margin=\"5s\"")
}

#[test]
fn a_sharded_world_whose_background_save_is_stuck_gets_a_hang_checkpoint_written_in_parts() {
    let Some(()) = requires::mpi() else { return };
    let watched = watched_sharded();
    let tmp = tempfile::tempdir().unwrap();
    let run_dir = tmp.path().join("run");
    // Rank 0's first background save (step 10) commits; the next never
    // starts writing, while the other rank's part of it is written and
    // reported. The watchdog then has the training thread write the last
    // completed step beside it: a second save in parts, with its own
    // staging directory and reports.
    let mut cmd = watched.command(&run_dir, &[]);
    cmd.env("FAILPOINTS", "persist::before_save=1*off->sleep(600000)");
    let started = Instant::now();
    let out = mpirun_command(2, cmd, &[]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(EXIT_STOPPED), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(90), "took {:?}", started.elapsed());
    let hang = events_named(&run_dir, "hang").pop().expect("a hang event");
    assert_eq!((&hang["activity"], &hang["thread"]), (&"save".into(), &"persister".into()), "{hang}");
    let saved = events_named(&run_dir, "checkpoint_saved").pop().unwrap();
    assert_eq!((&saved["kind"], &saved["optimizer_parts"]), (&"hang".into(), &2.into()), "{saved}");
    let step = saved["step"].as_u64().unwrap();
    assert!(step > hang["step"].as_u64().unwrap(), "{saved} after {hang}");
    assert_eq!(checkpoint_steps(&run_dir).last(), Some(&step));
    let (code, verified) = verify(&run_dir);
    assert_eq!(code, Some(0), "{verified}");
    // And it is the state two unsharded ranks reach at that step.
    let reference = tmp.path().join("reference");
    run_ranks(&training(10_000_000), 2, &reference, &["--stop-at-step", &step.to_string()], EXIT_STOPPED);
    assert_same_checkpoint(&run_dir, &reference, step);
}

#[test]
fn a_rank_whose_part_hangs_does_not_hang_the_world_the_watchdog_ends_it_resumable() {
    let Some(()) = requires::mpi() else { return };
    let watched = watched_sharded();
    let tmp = tempfile::tempdir().unwrap();
    let run_dir = tmp.path().join("run");
    // Rank 1 writes its part of step 10, then hangs in the next: rank 0's
    // save waits for it until the watchdog finds the save stuck. The hang
    // checkpoint beside it needs rank 1's part too, which rank 1 refuses at
    // once (its last one is still being written) instead of waiting for it
    // and missing the rounds: the world ends with step 10, exit 75.
    let cmd = watched.command(&run_dir, &[]);
    let started = Instant::now();
    let out = mpirun_failing_on(2, cmd, 1, "checkpoint::part::before_write=1*off->sleep(600000)").output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(EXIT_STOPPED), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(90), "took {:?}", started.elapsed());
    let hang = events_named(&run_dir, "hang").pop().expect("a hang event");
    assert_eq!((&hang["activity"], &hang["thread"]), (&"save".into(), &"persister".into()), "{hang}");
    let failed = events_named(&run_dir, "checkpoint_failed").pop().expect("the hang checkpoint failed");
    let error = failed["error"].as_str().unwrap();
    assert!(error.contains("rank 1") && error.contains("still being written"), "{failed}");
    assert_eq!(checkpoint_steps(&run_dir), vec![10]);
    let (code, verified) = verify(&run_dir);
    assert_eq!(code, Some(0), "{verified}");
    run_ranks(
        &training(10_000_000).set("distributed.shard_optimizer=true"),
        2,
        &run_dir,
        &["--stop-at-step", "13"],
        EXIT_STOPPED,
    );
    assert_eq!(events_named(&run_dir, "resume").pop().expect("a resume")["step"], 10);
}

/// The Python of docs/checkpoint-format.md that joins a sharded checkpoint's
/// optimizer parts: the block after "In Python (the moments of a sharded".
fn joining_snippet() -> String {
    let doc = include_str!("../../docs/checkpoint-format.md");
    let after = doc.split("In Python (the moments of a sharded").nth(1).expect("the snippet's paragraph");
    let block = after.split("```python\n").nth(1).and_then(|b| b.split("```").next());
    block.expect("a python block").to_string()
}

#[test]
fn the_documented_python_joins_a_sharded_checkpoints_parts_into_the_unsharded_moments() {
    let Some(()) = requires::mpi() else { return };
    let Some(()) = requires::python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (sharded, plain) = (tmp.path().join("sharded"), tmp.path().join("plain"));
    run_ranks(&training(10).set("distributed.shard_optimizer=true"), 2, &sharded, &[], EXIT_DONE);
    run_ranks(&training(10), 2, &plain, &[], EXIT_DONE);
    let snippet =
        joining_snippet().replace("runs/tiny/checkpoints/step-0000000200", &step_dir(&sharded, 10).to_string_lossy());
    let check = format!(
        "{snippet}\nref = load_file({:?})\nassert sorted(ref) == sorted(optimizer), (sorted(ref), sorted(optimizer))\n\
         assert all(np.array_equal(ref[k], optimizer[k]) for k in ref)\nprint(len(parts), len(optimizer))\n",
        step_dir(&plain, 10).join("optimizer.safetensors").to_string_lossy()
    );
    let out = Command::new("python3").args(["-c", &check]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}\n{check}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout.split_whitespace().next(), Some("2"), "two parts joined: {stdout}");
}

#[test]
fn of_three_ranks_one_stopped_is_recorded_once_by_rank_0_while_rank_1_waits_for_its_abort() {
    let Some(()) = requires::mpi() else { return };
    const TIMEOUT_S: u64 = 2;
    let training = training(100_000).set("train.batch_size=12").set(&format!("distributed.timeout=\"{TIMEOUT_S}s\""));
    let tmp = tempfile::tempdir().unwrap();
    let run_dir = tmp.path().join("run");
    let (mut child, pid) = start_until_saved(&training, 3, &run_dir, 1, 2, Stdio::null(), Duration::from_secs(90));
    let victim = nix::unistd::Pid::from_raw(pid);
    nix::sys::signal::kill(victim, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let stopped_at = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if stopped_at.elapsed() > Duration::from_secs(TIMEOUT_S + 20) {
            let _ = nix::sys::signal::kill(victim, nix::sys::signal::Signal::SIGKILL);
            let _ = child.kill();
            panic!("rank 2 of 3 stopped: mpirun still running after {} s", TIMEOUT_S + 20);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // Rank 1 noticed too, but only waits: had it aborted first, rank 0's
    // records could have been cut short.
    assert_eq!(status.code(), Some(EXIT_STOPPED), "{status}");
    let lost = events_named(&run_dir, "rank_lost");
    assert_eq!(lost.len(), 1, "one writer, one event: {lost:?}");
    assert_eq!((&lost[0]["rank"], &lost[0]["noticed_by"], &lost[0]["world_size"]), (&2.into(), &0.into(), &3.into()));
    assert_eq!(events_named(&run_dir, "stop").pop().expect("a stop event")["reason"], "rank_lost: rank 2");
    let (code, out) = verify(&run_dir);
    assert_eq!(code, Some(0), "every committed checkpoint verifies:\n{out}");
    let t1 = Instant::now();
    while rank_pid(&run_dir, 2).is_some() || lock_holder(&run_dir).is_some() {
        assert!(t1.elapsed() < Duration::from_secs(30), "the stopped rank outlived mpirun by 30 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A world of ranks on a node with GPUs trains on the CPU and says why: ranks
/// on GPUs need NCCL, which this version does not build, and rank 0 alone on
/// a GPU would make collectives (its first step's snapshot, a rebuild on the
/// CPU) the other ranks never join. The run ends as two ranks without GPUs.
#[test]
fn ranks_on_a_node_with_gpus_train_on_the_cpu_and_say_so() {
    let Some(()) = requires::mpi() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let node = tmp.path().join("node.json");
    let device = r#"{"vendor": "nvidia", "name": "H100", "memory_total_mib": 81559, "memory_free_mib": 80000}"#;
    std::fs::write(&node, format!(r#"{{"devices": [{device}, {device}]}}"#)).unwrap();
    let training = training(20).set("gpu.backend=\"auto\"");
    let with_gpus = tmp.path().join("with-gpus");
    let mut cmd = mpirun_command(2, training.command(&with_gpus, &[]), &[]);
    let out = cmd.env("REKINDLE_GPU_INVENTORY", &node).output().expect("run mpirun");
    assert_eq!(out.status.code(), Some(EXIT_DONE), "{}", String::from_utf8_lossy(&out.stderr));
    let fallback = events_named(&with_gpus, "gpu_fallback");
    assert_eq!(fallback.len(), 1, "{fallback:?}");
    let reason = fallback[0]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("a data-parallel run of 2 ranks trains on the CPU"), "{reason}");
    assert!(reason.contains("NCCL"), "{reason}");

    let plain = tmp.path().join("plain");
    run_ranks(&training, 2, &plain, &[], EXIT_DONE);
    assert_same_checkpoint(&with_gpus, &plain, 20);
}
