//! The run-directory lock between real processes: several
//! `examples/lock_contender.rs` processes ask for one stale lock at the same
//! moment, round after round; exactly one may win each round. (The lock's
//! rules through `rekindle run` itself are tested in `signals.rs`.)
//!
//! `REKINDLE_LOCK_RACE_ROUNDS` sets the number of rounds (default 40).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::json;

const DEFAULT_ROUNDS: usize = 40;
const CONTENDERS: usize = 4;
/// Longest wait for the losers of a round to give up. A winner holds the
/// lock until they all have (`--hold-until`), never for a fixed time: a
/// loaded machine could start a contender after a timed hold had ended, and
/// it would win a second time (the 1 s hold this replaced left that to
/// chance: issue #34).
const LOSERS_LIMIT: Duration = Duration::from_secs(120);

fn contender_exe() -> PathBuf {
    crate::support::example_exe("lock_contender")
}

fn unix_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

/// The pid of a process that has exited.
fn dead_pid() -> u32 {
    let mut child = Command::new("true").spawn().expect("spawn true");
    let pid = child.id();
    child.wait().expect("wait true");
    pid
}

/// A lock left by a dead holder: on this host (`racer`) with a pid that is
/// gone, or on another node with a heartbeat an hour old.
fn stale_lock(dir: &Path, round: usize) {
    let now = unix_now();
    let lock = if round.is_multiple_of(2) {
        json!({"token": "dead-here", "job_id": null, "host": "racer", "pid": dead_pid(),
               "heartbeat": now, "started": now, "lineage": "abc", "generation": 3})
    } else {
        json!({"token": "dead-there", "job_id": "5", "host": "gone-node", "pid": 1,
               "heartbeat": now - 3600.0, "started": now - 7200.0})
    };
    std::fs::write(dir.join("rekindle.lock"), serde_json::to_vec(&lock).unwrap()).unwrap();
}

/// Starts `CONTENDERS` processes that all ask for the lock at the same
/// moment; once all but one have exited (the losers, if exactly one won), the
/// winner is told to let go. Their outputs, in start order.
fn race(dir: &Path) -> Vec<Output> {
    let exe = contender_exe();
    let signals = tempfile::tempdir().expect("temp dir");
    let release = signals.path().join("release");
    let start_at = unix_now() + 0.5;
    let mut children: Vec<Child> = (0..CONTENDERS)
        .map(|_| {
            Command::new(&exe)
                .arg(dir)
                .args(["--host", "racer", "--start-at", &format!("{start_at:.3}")])
                .arg("--hold-until")
                .arg(&release)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn lock_contender")
        })
        .collect();
    // With two winners only two would exit: the limit then releases them,
    // and the caller's assertions say what happened.
    let t0 = Instant::now();
    while exited(&mut children) < CONTENDERS - 1 && t0.elapsed() < LOSERS_LIMIT {
        std::thread::sleep(Duration::from_millis(10));
    }
    std::fs::write(&release, b"").expect("write the release file");
    children.into_iter().map(|c| c.wait_with_output().expect("wait lock_contender")).collect()
}

/// How many of `children` have exited.
fn exited(children: &mut [Child]) -> usize {
    children.iter_mut().filter_map(|c| c.try_wait().expect("poll lock_contender")).count()
}

#[test]
fn racing_contenders_for_a_stale_lock_exactly_one_wins_every_round() {
    let rounds = std::env::var("REKINDLE_LOCK_RACE_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(DEFAULT_ROUNDS);
    assert!(rounds > 0, "REKINDLE_LOCK_RACE_ROUNDS=0 would pass without racing anything");
    for round in 0..rounds {
        let tmp = tempfile::tempdir().expect("temp dir");
        stale_lock(tmp.path(), round);
        let outputs = race(tmp.path());
        let says: Vec<String> = outputs
            .iter()
            .map(|o| format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
            .collect();
        let winners: Vec<&String> = says.iter().filter(|s| s.starts_with("won ")).collect();
        assert_eq!(winners.len(), 1, "round {round}: {says:#?}");
        let winner = winners[0];
        assert!(winner.contains("still-owner"), "round {round}: the winner lost the lock: {says:#?}");
        let winner_pid = winner.split_whitespace().nth(1).unwrap();
        for (out, said) in outputs.iter().zip(&says) {
            if said == winner {
                assert_eq!(out.status.code(), Some(0), "round {round}: {said}");
            } else {
                assert_eq!(out.status.code(), Some(1), "round {round}: {said}");
                assert!(said.contains(&format!("in use by pid {winner_pid} on racer")), "round {round}: {said}");
            }
        }
        let left: Vec<String> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(left.is_empty(), "round {round}: the lock, a marker or a temporary file was left: {left:?}");
    }
    eprintln!("{rounds} rounds of {CONTENDERS} contenders: exactly one winner each");
}

#[test]
fn a_contender_refused_while_a_live_process_holds_the_lock_leaves_it_alone() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let exe = contender_exe();
    let signals = tempfile::tempdir().expect("temp dir");
    let release = signals.path().join("release");
    let holder = Command::new(&exe)
        .arg(tmp.path())
        .args(["--host", "racer", "--job", "9", "--hold-until"])
        .arg(&release)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn holder");
    let lock = tmp.path().join("rekindle.lock");
    let t0 = Instant::now();
    while !lock.exists() {
        assert!(t0.elapsed() < Duration::from_secs(60), "the holder never took the lock");
        std::thread::sleep(Duration::from_millis(10));
    }
    // The same job id, a later attempt, on the same host: the holder is alive.
    let refused = Command::new(&exe)
        .arg(tmp.path())
        .args(["--host", "racer", "--job", "9", "--restart", "1"])
        .output()
        .expect("run contender");
    let said = String::from_utf8_lossy(&refused.stdout);
    assert_eq!(refused.status.code(), Some(1), "{said}");
    assert!(said.contains(&format!("in use by pid {} on racer (job 9)", holder.id())), "{said}");
    std::fs::write(&release, b"").expect("write the release file");
    let held = holder.wait_with_output().expect("wait holder");
    assert!(String::from_utf8_lossy(&held.stdout).contains("still-owner"), "{held:?}");
}
