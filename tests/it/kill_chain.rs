//! One run, SIGKILLed again and again: the real `rekindle run` is started,
//! killed at a random moment (while it loads, trains, writes a background
//! checkpoint or commits one), and started again in the same run directory,
//! at least 100 times. After every kill, every committed checkpoint must
//! verify in full and the newest must not go back; every new attempt must
//! resume from the newest checkpoint. At the end the chain is brought to a
//! fixed step and compared, byte for byte, with a run that was never
//! interrupted.
//!
//! This is the issue-15 acceptance test for crash consistency of the whole
//! orchestrator (the checkpoint store alone is covered by `sigkill`).
//!
//! `REKINDLE_KILL_CHAIN` sets the number of kills (default 100);
//! `REKINDLE_KILL_CHAIN_SEED` replays the delays of an earlier run (the seed
//! is printed on stderr).

use crate::support;

use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::time::{Duration, Instant};

use rekindle::checkpoint::{CheckpointStore, VerifyLevel};

use support::deterministic::SplitMix;
use support::runs::{Training, assert_same_checkpoint, assert_same_metrics, checkpoint_steps, events_named, step_dir};

const DEFAULT_KILLS: usize = 100;
/// Longest wait before a kill. A debug build starts in ~50 ms and then
/// trains a step every few ms: most kills land in training, some during
/// start-up, some while a checkpoint is written or committed.
const MAX_DELAY_MS: u64 = 300;
/// How far past the newest checkpoint the chain is finally brought, and so
/// how much of the comparison is trained after the last kill.
const STEPS_AFTER_LAST_KILL: u64 = 15;
/// The failpoint that keeps each save of the chain in flight for 30 ms.
const SLOW_SAVE: &str = "checkpoint::before_rename=sleep(30)";

/// A run long enough never to finish during the kills: the chain and the
/// reference both stop at the same step with `--stop-at-step` instead, so
/// their learning-rate schedules are the same.
fn training() -> Training {
    Training::tiny_mlp(1_000_000)
        .set("optimizer.warmup_steps=10")
        .set("checkpoint.every_steps=10")
        .set("checkpoint.keep=3")
}

/// Checks the run directory as the next attempt will find it; returns the
/// newest committed step (0 when there is none).
fn check_after_kill(run_dir: &Path, kill: usize) -> u64 {
    let dir = run_dir.join("checkpoints");
    if !dir.exists() {
        return 0;
    }
    let infos = CheckpointStore::open_read_only(&dir)
        .list(VerifyLevel::Full)
        .unwrap_or_else(|e| panic!("kill {kill}: listing {}: {e}", dir.display()));
    for info in &infos {
        assert!(
            info.valid,
            "kill {kill}: committed checkpoint {} does not verify: {:?}",
            info.dir.display(),
            info.failures
        );
    }
    infos.iter().map(|i| i.step).max().unwrap_or(0)
}

fn kills_wanted() -> usize {
    std::env::var("REKINDLE_KILL_CHAIN")
        .map_or(DEFAULT_KILLS, |v| v.parse().unwrap_or_else(|e| panic!("REKINDLE_KILL_CHAIN={v:?}: {e}")))
}

fn seed() -> u64 {
    std::env::var("REKINDLE_KILL_CHAIN_SEED").map_or_else(
        |_| std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64,
        |v| v.parse().unwrap_or_else(|e| panic!("REKINDLE_KILL_CHAIN_SEED={v:?}: {e}")),
    )
}

#[test]
fn a_hundred_sigkills_of_one_run_end_byte_identical_to_an_uninterrupted_run() {
    let (kills, seed) = (kills_wanted(), seed());
    eprintln!("kill_chain: {kills} kills, REKINDLE_KILL_CHAIN_SEED={seed}");
    let mut rng = SplitMix(seed);
    let training = training();
    let tmp = tempfile::tempdir().unwrap();
    let run_dir = tmp.path().join("chain");
    let started = Instant::now();

    let mut newest = 0;
    let (mut mid_save, mut before_first_checkpoint, mut resumes) = (0, 0, 0);
    for kill in 0..kills {
        let resumes_before = events_named(&run_dir, "resume").len();
        // Every save holds its staged directory 30 ms before the commit (a
        // failpoint of the real binary): a tiny model's save otherwise lasts
        // well under a millisecond and the kills would almost never land in
        // one, the case this test exists for.
        let stderr = fs::File::create(run_dir.with_extension("stderr")).expect("create stderr file");
        let mut child = training
            .command(&run_dir, &[])
            .env("FAILPOINTS", SLOW_SAVE)
            .stdout(std::process::Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("start rekindle");
        // Every other kill waits for this attempt to commit a checkpoint
        // first, so the chain moves on however loaded the machine is; the
        // random delay after it lands the kill anywhere (start-up, training,
        // a save in flight, a commit).
        if kill % 2 == 1 {
            let t0 = Instant::now();
            while checkpoint_steps(&run_dir).last().copied().unwrap_or(0) <= newest {
                assert!(child.try_wait().expect("poll rekindle").is_none(), "kill {kill}: rekindle ended early");
                assert!(t0.elapsed() < Duration::from_secs(120), "kill {kill}: no new checkpoint in 120 s");
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        std::thread::sleep(Duration::from_millis(rng.below(MAX_DELAY_MS + 1)));
        if let Some(status) = child.try_wait().expect("poll rekindle") {
            let stderr = fs::read_to_string(run_dir.with_extension("stderr")).unwrap_or_default();
            panic!("kill {kill}: rekindle ended on its own ({status}) before the kill:\n{stderr}");
        }
        child.kill().expect("SIGKILL rekindle");
        let status = child.wait().expect("reap rekindle");
        assert_eq!(status.signal(), Some(9), "kill {kill}: rekindle ended with {status}, not SIGKILL");

        let staged = fs::read_dir(run_dir.join("checkpoints"))
            .map(|rd| rd.flatten().any(|e| e.file_name().to_string_lossy().starts_with(".tmp-")))
            .unwrap_or(false);
        mid_save += usize::from(staged);
        let now = check_after_kill(&run_dir, kill);
        before_first_checkpoint += usize::from(now == 0);
        assert!(now >= newest, "kill {kill}: the newest checkpoint went back from step {newest} to {now}");
        // An attempt killed after it resumed must have resumed from the
        // newest checkpoint the previous kill left.
        let new_resumes = events_named(&run_dir, "resume");
        if let Some(resume) = new_resumes.get(resumes_before) {
            assert_eq!(new_resumes.len(), resumes_before + 1, "kill {kill}: one attempt, one resume event");
            assert_eq!(
                resume["step"].as_u64(),
                Some(newest),
                "kill {kill}: resumed from {resume}, newest was {newest}"
            );
            resumes += 1;
        }
        newest = now;
    }
    assert!(newest >= 20, "the chain made almost no progress (newest checkpoint {newest}): the delays are too short");
    // Not vacuous: a share of the kills must have found a save in flight.
    if kills >= DEFAULT_KILLS {
        assert!(
            mid_save * 20 >= kills,
            "only {mid_save} of {kills} kills landed while a save was in flight: the chain did not test that case"
        );
    }

    // Bring the chain to a step past its last checkpoint, then train the
    // reference to the same step in one process.
    let target = newest + STEPS_AFTER_LAST_KILL;
    training.stop_at(&run_dir, target);
    let reference = tmp.path().join("reference");
    training.stop_at(&reference, target);
    assert_same_checkpoint(&run_dir, &reference, target);
    assert_same_metrics(&run_dir, &reference, target);
    assert!(step_dir(&run_dir, target).is_dir());
    assert_eq!(check_after_kill(&run_dir, kills), target);
    eprintln!(
        "kill_chain: {kills} kills in {:.1}s; {resumes} attempts resumed before their kill, newest checkpoint after the kills {newest}, \
         {mid_save} kills left a save in flight, {before_first_checkpoint} before the first checkpoint; \
         byte-identical at step {target}",
        started.elapsed().as_secs_f64(),
    );
}
