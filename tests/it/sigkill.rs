//! SIGKILL at random moments: a real process (`examples/ckpt_writer.rs`)
//! saves deterministic checkpoints and is killed, again and again. After every
//! kill the newest checkpoint must load and hold exactly the data of its step,
//! no committed checkpoint may be invalid, no reported commit may be lost, and
//! the next writer must resume where the last one left off.
//!
//! `REKINDLE_SIGKILL_TRIALS` sets the number of kills (default 50);
//! `REKINDLE_SIGKILL_SEED` replays the delays of an earlier run (the seed is
//! printed on stderr).

use crate::support;

use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rekindle::checkpoint::{CheckpointStore, VerifyLevel};

use support::deterministic::SplitMix;
use support::{leftovers, snapshot_for_step};

const DEFAULT_TRIALS: usize = 50;
/// Tensor bytes per checkpoint: a few MiB, so a kill often lands mid-write.
const PAYLOAD: usize = 2 << 20;
const KEEP: usize = 2;
/// Longest wait before a kill; a debug-build save of PAYLOAD takes ~50–100 ms.
const MAX_DELAY_MS: u64 = 250;

fn writer_exe() -> PathBuf {
    support::example_exe("ckpt_writer")
}

/// A running writer and the threads collecting its output.
struct Writer {
    child: Child,
    stdout: JoinHandle<String>,
    stderr: JoinHandle<String>,
}

fn collect(mut pipe: impl Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut out = String::new();
        let _ = pipe.read_to_string(&mut out);
        out
    })
}

impl Writer {
    fn spawn(exe: &Path, dir: &Path, extra: &[&str]) -> Writer {
        let mut child = Command::new(exe)
            .arg(dir)
            .args(["--payload", &PAYLOAD.to_string(), "--keep", &KEEP.to_string()])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", exe.display()));
        let stdout = collect(child.stdout.take().unwrap());
        let stderr = collect(child.stderr.take().unwrap());
        Writer { child, stdout, stderr }
    }

    /// Waits for the writer to end on its own; returns (success, stdout, stderr).
    fn wait(mut self) -> (bool, String, String) {
        let status = self.child.wait().expect("wait for writer");
        (status.success(), self.stdout.join().unwrap(), self.stderr.join().unwrap())
    }

    /// SIGKILLs the writer; returns its stdout, failing if it had died on its own.
    fn kill(mut self) -> String {
        self.child.kill().expect("SIGKILL the writer");
        let status = self.child.wait().expect("wait for writer");
        let stdout = self.stdout.join().unwrap();
        let stderr = self.stderr.join().unwrap();
        assert_eq!(status.signal(), Some(9), "the writer ended before the kill ({status}); stderr:\n{stderr}");
        stdout
    }
}

/// What the writer printed: the step it resumed from, and the steps it committed.
fn parse_output(stdout: &str) -> (Option<u64>, Vec<u64>) {
    let mut resumed = None;
    let mut committed = Vec::new();
    for line in stdout.lines() {
        match line.split_once(' ') {
            Some(("resumed", n)) => resumed = Some(n.parse().unwrap()),
            Some(("committed", n)) => committed.push(n.parse().unwrap()),
            _ => panic!("unexpected writer output line {line:?}"),
        }
    }
    (resumed, committed)
}

/// Steps of the committed `step-…` directories in `dir`, ascending.
fn committed_steps(dir: &Path) -> Vec<u64> {
    let mut steps: Vec<u64> = std::fs::read_dir(dir)
        .map(|rd| rd.flatten().filter_map(|e| e.file_name().to_str()?.strip_prefix("step-")?.parse().ok()).collect())
        .unwrap_or_default();
    steps.sort_unstable();
    steps
}

/// Checks the store as a restarting job would see it, without touching it;
/// returns the newest step (0 when there is none yet).
fn check_after_kill(dir: &Path, trial: usize) -> u64 {
    let store = CheckpointStore::open_read_only(dir);
    if !dir.exists() {
        return 0;
    }
    for info in store.list(VerifyLevel::Full).unwrap() {
        assert!(
            info.valid,
            "trial {trial}: committed checkpoint {} is invalid: {:?}",
            info.dir.display(),
            info.failures
        );
    }
    let outcome = store.load_latest().unwrap();
    assert!(outcome.rejected.is_empty(), "trial {trial}: rejected {:?}", outcome.rejected);
    match outcome.loaded {
        None => 0,
        Some(loaded) => {
            let step = loaded.snapshot.step;
            assert!(
                loaded.snapshot == snapshot_for_step(step, PAYLOAD),
                "trial {trial}: checkpoint of step {step} does not hold the data saved for that step"
            );
            step
        }
    }
}

#[test]
fn sigkill_at_random_moments_never_leaves_a_partial_checkpoint() {
    let exe = writer_exe();
    let trials: usize = std::env::var("REKINDLE_SIGKILL_TRIALS")
        .map_or(DEFAULT_TRIALS, |v| v.parse().unwrap_or_else(|e| panic!("REKINDLE_SIGKILL_TRIALS={v:?}: {e}")));
    let seed: u64 = std::env::var("REKINDLE_SIGKILL_SEED").map_or_else(
        |_| std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64,
        |v| v.parse().unwrap_or_else(|e| panic!("REKINDLE_SIGKILL_SEED={v:?}: {e}")),
    );
    eprintln!("sigkill: {trials} trials, REKINDLE_SIGKILL_SEED={seed}");
    let mut rng = SplitMix(seed);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("checkpoints");
    let started = Instant::now();

    let mut newest = 0;
    let mut reported = 0;
    let mut killed_mid_save = 0;
    for trial in 0..trials {
        let writer = Writer::spawn(&exe, &dir, &[]);
        // Every other trial waits for a new commit first, so the trials make
        // progress however loaded the machine is.
        if trial % 2 == 1 {
            let t0 = Instant::now();
            while committed_steps(&dir).last().copied().unwrap_or(0) <= newest {
                assert!(t0.elapsed() < Duration::from_secs(120), "trial {trial}: no new commit in 120 s");
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        std::thread::sleep(Duration::from_millis(rng.below(MAX_DELAY_MS + 1)));
        let (resumed, committed) = parse_output(&writer.kill());

        if let Some(resumed) = resumed {
            assert_eq!(resumed, newest, "trial {trial}: the writer did not resume from the newest checkpoint");
        }
        if dir.exists() && leftovers(&dir).iter().any(|n| n.starts_with(".tmp-")) {
            killed_mid_save += 1;
        }
        let now = check_after_kill(&dir, trial);
        let last_reported = committed.last().copied().unwrap_or(reported);
        assert!(now >= newest, "trial {trial}: newest checkpoint went back from {newest} to {now}");
        assert!(
            now >= last_reported,
            "trial {trial}: the writer reported step {last_reported} committed, newest is {now}"
        );
        newest = now;
        reported = last_reported;
    }
    eprintln!(
        "sigkill: {trials} kills in {:.1}s, newest step {newest}, {killed_mid_save} kills left a partial save behind",
        started.elapsed().as_secs_f64()
    );
    // Guard against a vacuous run: the kills must have hit actual saves.
    assert!(newest > 0, "no checkpoint was ever committed: the delays are too short for this machine");
    if trials >= DEFAULT_TRIALS {
        assert!(killed_mid_save > 0, "no kill landed during a save: the test exercised nothing");
    }

    // The next writer continues from where the killed ones left off and finishes cleanly.
    let until = newest + KEEP as u64;
    let (ok, stdout, stderr) = Writer::spawn(&exe, &dir, &["--until", &until.to_string()]).wait();
    assert!(ok, "the writer failed after the kills:\n{stderr}");
    let (resumed, committed) = parse_output(&stdout);
    assert_eq!(resumed, Some(newest));
    assert_eq!(committed, (newest + 1..=until).collect::<Vec<_>>());
    let store = CheckpointStore::open(&dir, KEEP).unwrap();
    assert_eq!(leftovers(&dir), Vec::<String>::new());
    let steps: Vec<u64> = store.list(VerifyLevel::Full).unwrap().iter().filter(|i| i.valid).map(|i| i.step).collect();
    assert_eq!(steps, (newest + 1..=until).rev().collect::<Vec<_>>());
    assert_eq!(check_after_kill(&dir, trials), until);
}
