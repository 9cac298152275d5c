//! Takes the run-directory lock of a directory through the real lock code:
//! the process `tests/it/lock.rs` starts several of at once to race for one
//! stale lock.
//!
//! ```text
//! lock_contender DIR --host NAME [--job ID] [--restart N] [--stale-after SECS]
//!                [--start-at UNIX_SECS] [--hold SECS | --hold-until PATH]
//! ```
//!
//! Sleeps until `--start-at` (so that several processes started one after
//! another ask at the same moment), asks for the lock as `NAME` (the node
//! name the lock records), and prints `won PID` or `refused: ERROR`. A winner
//! holds the lock for `--hold` seconds (default 0.5), or until `PATH` exists
//! (`--hold-until`: the test says when, so no loaded machine can make a
//! hold end before the others have asked; at most ten minutes), checks it
//! is still its own (`still-owner` or `lost: WHY`), then releases it. Exit status: 0 won
//! and kept it, 1 refused, 2 usage or I/O error, 3 won but lost it.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rekindle::rundir::{LockError, LockRequest, RunLock};

struct Args {
    dir: PathBuf,
    request: LockRequest,
    start_at: Option<f64>,
    hold: Hold,
}

/// How long a winner keeps the lock.
enum Hold {
    For(Duration),
    Until(PathBuf),
}

/// The longest `--hold-until` waits for its file.
const HOLD_UNTIL_LIMIT: Duration = Duration::from_secs(600);

impl Hold {
    fn wait(&self) {
        match self {
            Hold::For(d) => std::thread::sleep(*d),
            Hold::Until(path) => wait_for(path),
        }
    }
}

fn wait_for(path: &Path) {
    let t0 = std::time::Instant::now();
    while !path.exists() && t0.elapsed() < HOLD_UNTIL_LIMIT {
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn parse_args() -> Result<Args, String> {
    let mut args = std::env::args().skip(1);
    let mut dir = None;
    let mut request = LockRequest {
        job_id: None,
        host: String::new(),
        restart_count: 0,
        step_id: None,
        stale_after: Duration::from_secs(60),
        excluded: Vec::new(),
    };
    let (mut start_at, mut hold) = (None, Hold::For(Duration::from_millis(500)));
    let seconds = |flag: &str, v: String| -> Result<f64, String> {
        v.parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s >= 0.0)
            .ok_or_else(|| format!("{flag}: `{v}` is not seconds"))
    };
    while let Some(arg) = args.next() {
        let mut value = |flag: &str| args.next().ok_or_else(|| format!("{flag} needs a value"));
        match arg.as_str() {
            "--host" => request.host = value("--host")?,
            "--job" => request.job_id = Some(value("--job")?),
            "--restart" => {
                request.restart_count = value("--restart")?.parse().map_err(|e| format!("--restart: {e}"))?
            }
            "--stale-after" => {
                request.stale_after = Duration::from_secs_f64(seconds("--stale-after", value("--stale-after")?)?)
            }
            "--start-at" => start_at = Some(seconds("--start-at", value("--start-at")?)?),
            "--hold" => hold = Hold::For(Duration::from_secs_f64(seconds("--hold", value("--hold")?)?)),
            "--hold-until" => hold = Hold::Until(PathBuf::from(value("--hold-until")?)),
            other if dir.is_none() && !other.starts_with("--") => dir = Some(PathBuf::from(other)),
            other => return Err(format!("unexpected argument `{other}`")),
        }
    }
    let usage = "usage: lock_contender DIR --host NAME [--job ID] [--restart N] [--stale-after SECS] \
                 [--start-at UNIX_SECS] [--hold SECS | --hold-until PATH]";
    if request.host.is_empty() {
        return Err(usage.into());
    }
    Ok(Args { dir: dir.ok_or(usage)?, request, start_at, hold })
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("lock_contender: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(at) = args.start_at {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
        std::thread::sleep(Duration::from_secs_f64((at - now).max(0.0)));
    }
    match RunLock::acquire(&args.dir, args.request) {
        Ok(lock) => {
            println!("won {}", std::process::id());
            args.hold.wait();
            let code = match lock.ownership().confirm() {
                Ok(()) => {
                    println!("still-owner");
                    ExitCode::SUCCESS
                }
                Err(why) => {
                    println!("lost: {why}");
                    ExitCode::from(3)
                }
            };
            drop(lock);
            code
        }
        Err(e @ (LockError::Held { .. } | LockError::HolderAlive { .. } | LockError::GaveUp { .. })) => {
            println!("refused: {e}");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("lock_contender: {e}");
            ExitCode::from(2)
        }
    }
}
