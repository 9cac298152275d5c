//! Saves deterministic checkpoints into a directory, step after step: the
//! process `tests/it/sigkill.rs` kills with SIGKILL at random moments.
//!
//! ```text
//! ckpt_writer DIR [--until STEP] [--payload BYTES] [--keep N]
//! ```
//!
//! Opens the store in `DIR` (removing leftovers of a killed predecessor),
//! resumes after the newest valid checkpoint and saves steps 1, 2, 3, … whose
//! content depends only on the step (`tests/it/support/deterministic.rs`), so
//! whoever reads a checkpoint can tell whether it holds exactly what was
//! saved. Runs until `--until` (forever without it). Prints `resumed N` (0 for
//! an empty store) and `committed N` after each save returns.

use std::path::PathBuf;
use std::process::ExitCode;

use rekindle::checkpoint::CheckpointStore;

#[allow(dead_code)] // the tests use more of it than the writer
#[path = "../tests/it/support/deterministic.rs"]
mod deterministic;

struct Args {
    dir: PathBuf,
    until: Option<u64>,
    payload: usize,
    keep: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut args = std::env::args().skip(1);
    let mut parsed = Args { dir: PathBuf::new(), until: None, payload: 2 << 20, keep: 2 };
    let mut dir = None;
    while let Some(arg) = args.next() {
        let mut value = |flag: &str| args.next().ok_or_else(|| format!("{flag} needs a value"));
        match arg.as_str() {
            "--until" => parsed.until = Some(value("--until")?.parse().map_err(|e| format!("--until: {e}"))?),
            "--payload" => parsed.payload = value("--payload")?.parse().map_err(|e| format!("--payload: {e}"))?,
            "--keep" => parsed.keep = value("--keep")?.parse().map_err(|e| format!("--keep: {e}"))?,
            other if dir.is_none() && !other.starts_with("--") => dir = Some(PathBuf::from(other)),
            other => return Err(format!("unexpected argument `{other}`")),
        }
    }
    parsed.dir = dir.ok_or("usage: ckpt_writer DIR [--until STEP] [--payload BYTES] [--keep N]")?;
    Ok(parsed)
}

fn run(args: &Args) -> Result<(), String> {
    let store = CheckpointStore::open(&args.dir, args.keep).map_err(|e| format!("{e:#}"))?;
    let outcome = store.load_latest().map_err(|e| format!("{e:#}"))?;
    let resumed = outcome.loaded.map_or(0, |l| l.snapshot.step);
    println!("resumed {resumed}");
    let mut step = resumed + 1;
    while args.until.is_none_or(|until| step <= until) {
        store.save(&deterministic::snapshot_for_step(step, args.payload)).map_err(|e| format!("{e:#}"))?;
        println!("committed {step}");
        step += 1;
    }
    Ok(())
}

fn main() -> ExitCode {
    match parse_args().and_then(|args| run(&args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ckpt_writer: {e}");
            ExitCode::FAILURE
        }
    }
}
