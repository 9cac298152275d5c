//! A hostile run directory (issues #27, #40): after a first attempt, random
//! symlinks (to files and directories outside the run, dangling), FIFOs,
//! large sparse files, foreign files and directories and stray `step-*`
//! names are put at the paths rekindle touches (`config.toml`, the
//! TensorBoard directory and its record, `checkpoints` itself among them), then `run` (or `exec` with `seal`), `verify`,
//! `checkpoints`, `status` and `report` run over it; the attempt publishes
//! (`include = ["**"]`) to a real bare repository. Whatever they decide to
//! do, these hold:
//!
//! - nothing outside the run directory changes (a listing with hashes), and
//!   nothing from outside it nor any checkpoint file is published;
//! - no command hangs (each under a timeout) or panics (exit 101);
//! - what rekindle did not make is left as it was: stray names, and links;
//! - the newest valid checkpoint from before is still there and verifies,
//!   unless `keep` newer valid ones replaced it.
//!
//! Deterministic: case `i` uses seed `i`. `REKINDLE_HOSTILE_CASES=N` runs
//! more cases (12 by default, about 20 s in a debug build).

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::cli::{RunCmd, exe};
use crate::support::deterministic::SplitMix;
use crate::support::git::remote_and_clone;
use crate::support::runs::{EXIT_DONE, EXIT_STOPPED};
use crate::support::{listing, snapshot};

const TIMEOUT: Duration = Duration::from_secs(60);
const KEEP: usize = 3;

/// Paths inside a run directory that rekindle reads, writes, lists or removes.
const RUN_PATHS: &[&str] = &[
    "config.toml",
    "events.jsonl",
    "metrics.jsonl",
    "summary.json",
    "gpu_stats.jsonl",
    "config.toml.prev",
    "rekindle.lock",
    "report.html",
    "ranks",
    "tensorboard",
    "tensorboard.files",
    "checkpoints",
    "checkpoints/.staging",
    "checkpoints/quarantine",
    "checkpoints/.seal.lock",
    "checkpoints/.tmp-x",
    "checkpoints/.trash-y",
    "checkpoints/step-5",
    "checkpoints/step-40",
    "checkpoints/step-0000000099",
];

/// What is put there.
#[derive(Debug, Clone, Copy)]
enum Hostile {
    LinkToOutsideFile,
    LinkToOutsideDir,
    Dangling,
    Fifo,
    ForeignFile,
    ForeignDir,
    /// A sparse file larger than every bound a reader of rekindle's has
    /// (16 MiB for configs and manifests, 1 MiB a record line): read whole,
    /// it would cost its size in memory.
    HugeSparse,
}

/// The size of [`Hostile::HugeSparse`] (sparse: no disk; small enough for
/// the snapshot's hash to stay quick in a debug build).
const HUGE: u64 = 64 << 20;

const KINDS: [Hostile; 7] = [
    Hostile::LinkToOutsideFile,
    Hostile::LinkToOutsideDir,
    Hostile::Dangling,
    Hostile::Fifo,
    Hostile::ForeignFile,
    Hostile::ForeignDir,
    Hostile::HugeSparse,
];

fn place(run: &Path, rel: &str, kind: Hostile, outside: &Path) {
    let path = run.join(rel);
    match fs::symlink_metadata(&path) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(&path).unwrap(),
        Ok(_) => fs::remove_file(&path).unwrap(),
        Err(_) => {}
    }
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    match kind {
        Hostile::LinkToOutsideFile => symlink(outside.join("secret.txt"), &path).unwrap(),
        Hostile::LinkToOutsideDir => symlink(outside.join("dir"), &path).unwrap(),
        Hostile::Dangling => symlink(outside.join("nowhere"), &path).unwrap(),
        Hostile::Fifo => nix::unistd::mkfifo(&path, nix::sys::stat::Mode::S_IRWXU).unwrap(),
        Hostile::ForeignFile => fs::write(&path, b"someone else's bytes").unwrap(),
        Hostile::ForeignDir => {
            fs::create_dir_all(path.join("sub")).unwrap();
            fs::write(path.join("sub/theirs.txt"), b"someone else's file").unwrap();
        }
        Hostile::HugeSparse => fs::File::create(&path).unwrap().set_len(HUGE).unwrap(),
    }
}

/// Whether rekindle may replace or remove what is at `rel` when `kind` is
/// there. A foreign regular file under one of its own file names is its to
/// append to or replace; a link under a name it replaces atomically is
/// replaced by its own file (never written through: the outside listing
/// checks that); a foreign directory under a canonical checkpoint name is a
/// damaged checkpoint to it, and what is in the staging directory is
/// emptied out when `exec` starts; damaged checkpoints are moved into the
/// quarantine directory. Everything else must stay as it was: links
/// and FIFOs where it appends or reads, stray names, foreign directories.
/// (A name replaced whole is renamed over, which never opens what was there.)
fn may_change(rel: &str, kind: Hostile) -> bool {
    let own_file = matches!(
        rel,
        "events.jsonl"
            | "metrics.jsonl"
            | "summary.json"
            | "gpu_stats.jsonl"
            | "config.toml.prev"
            | "report.html"
            | "rekindle.lock"
            | "checkpoints/.seal.lock"
            | "tensorboard.files"
            | "config.toml"
    );
    let replaced_whole = matches!(rel, "summary.json" | "config.toml.prev" | "report.html" | "config.toml");
    match kind {
        Hostile::ForeignFile | Hostile::HugeSparse => own_file,
        Hostile::LinkToOutsideFile | Hostile::LinkToOutsideDir | Hostile::Dangling | Hostile::Fifo => replaced_whole,
        // The staging directory is emptied when `exec` starts (documented).
        // and damaged checkpoints are moved into the quarantine.
        // A real `checkpoints` or `tensorboard` directory in the run
        // directory is rekindle's by its name (written into; the foreign
        // files of a shared TensorBoard directory are tests/it/telemetry.rs').
        Hostile::ForeignDir => matches!(
            rel,
            "checkpoints/step-0000000099"
                | "checkpoints/.staging"
                | "checkpoints/quarantine"
                | "checkpoints"
                | "tensorboard"
        ),
    }
}

/// `(code, stdout+stderr)` of a command, killed (and the test failed) after [`TIMEOUT`].
fn bounded(mut cmd: Command, what: &str) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let (out, err) = (dir.path().join("out"), dir.path().join("err"));
    cmd.stdin(Stdio::null()).stdout(fs::File::create(&out).unwrap()).stderr(fs::File::create(&err).unwrap());
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("SLURM") || key == "FAILPOINTS" {
            cmd.env_remove(key);
        }
    }
    let mut child = cmd.spawn().unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > TIMEOUT {
            let _ = child.kill();
            panic!("{what} hung for {TIMEOUT:?}:\n{}", fs::read_to_string(&err).unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text =
        format!("{}{}", fs::read_to_string(&out).unwrap_or_default(), fs::read_to_string(&err).unwrap_or_default());
    assert!(status.code().is_some(), "{what} died of a signal: {status:?}\n{text}");
    assert!(status.code() != Some(101) && !text.contains("panicked"), "{what} panicked:\n{text}");
    (status.code(), text)
}

fn rekindle(args: &[&str], run: &Path) -> Command {
    let mut cmd = Command::new(exe());
    cmd.args(args).arg(run);
    cmd
}

/// A program for `rekindle exec` that stages and seals the given steps.
fn sealing_program(steps: &[u64]) -> String {
    steps
        .iter()
        .map(|s| {
            format!(
                "d=\"$REKINDLE_CHECKPOINT_DIR/s{s}\" && mkdir -p \"$d\" && echo {s} > \"$d/w\" && \
                 \"$REKINDLE_BIN\" -q seal \"$d\" --step {s}"
            )
        })
        .collect::<Vec<_>>()
        .join(" && ")
}

/// Runs case `seed`; whether its attempt published anything.
fn one_case(seed: u64) -> bool {
    let mut rng = SplitMix(seed.wrapping_mul(7919) + 1);
    let tmp = tempfile::tempdir().unwrap();
    let outside = tmp.path().join("outside");
    fs::create_dir_all(outside.join("dir/sub")).unwrap();
    fs::write(outside.join("secret.txt"), b"outside the run").unwrap();
    fs::write(outside.join("dir/sub/kept.txt"), b"outside too").unwrap();
    let run = tmp.path().join("run");
    let exec = rng.below(3) == 0;
    // A foreign file in place of the lock is an unreadable lock, taken over
    // once it stayed the same for stale_after: the shortest allowed.
    let sets = ["--set", "run.max_steps=60", "--set", "checkpoint.every_steps=10", "--set", "lock.stale_after=2s"];
    if exec {
        let program = sealing_program(&[1, 2]);
        RunCmd::exec(&run, &["sh", "-c", &program]).run(TIMEOUT).assert_code(EXIT_DONE);
    } else {
        let first = RunCmd::new(&run).set("run.max_steps=60").set("checkpoint.every_steps=10");
        first.arg("--stop-at-step").arg("30").run(TIMEOUT).assert_code(EXIT_STOPPED);
    }
    let newest_before = if exec { 2 } else { 30 };
    let outside_before = listing(&outside);
    let count = 1 + rng.below(4) as usize;
    let mut placed: Vec<(&str, Hostile)> = Vec::new();
    for _ in 0..count {
        let rel = RUN_PATHS[rng.below(RUN_PATHS.len() as u64) as usize];
        let kind = KINDS[rng.below(KINDS.len() as u64) as usize];
        // Nothing is placed inside a `checkpoints` put there (through a
        // link, it would be outside), and one put there takes what was
        // placed inside the old one with it.
        if placed.iter().any(|(r, _)| *r == rel || (*r == "checkpoints" && rel.starts_with("checkpoints/"))) {
            continue;
        }
        if rel == "checkpoints" {
            placed.retain(|(r, _)| !r.starts_with("checkpoints/"));
        }
        place(&run, rel, kind, &outside);
        placed.push((rel, kind));
    }
    let case = format!("case {seed} ({}): {placed:?}", if exec { "exec" } else { "run" });
    let before: Vec<_> = placed.iter().map(|(rel, kind)| (*rel, *kind, snapshot(&run.join(rel)))).collect();

    // The attempt publishes everything it may to a real repository.
    let (bare, clone) = remote_and_clone(tmp.path());
    let repo = format!("publish.repo=\"{}\"", clone.display());
    let publish = ["--set", "publish.enabled=true", "--set", &repo, "--set", r#"publish.include=["**"]"#];
    let lifecycle = if exec {
        let mut cmd = Command::new(exe());
        cmd.args(["exec", "--set", "lock.stale_after=2s"]).args(publish).arg("--run-dir").arg(&run);
        cmd.args(["--", "sh", "-c", &sealing_program(&[3, 4])]);
        bounded(cmd, &format!("exec in {case}"))
    } else {
        let mut cmd = Command::new(exe());
        cmd.args(["run", "--config", crate::support::cli::TINY_CONFIG]).args(sets).args(publish);
        cmd.arg("--run-dir").arg(&run);
        bounded(cmd, &format!("run in {case}"))
    };
    for args in [&["verify"][..], &["checkpoints"], &["status"], &["report"]] {
        bounded(rekindle(args, &run), &format!("{args:?} in {case}"));
    }

    assert_eq!(listing(&outside), outside_before, "something outside the run changed in {case}");
    let pushed =
        Command::new("git").args(["ls-tree", "-r", "--name-only", "main"]).current_dir(&bare).output().unwrap();
    let pushed = String::from_utf8_lossy(&pushed.stdout).into_owned();
    assert!(!pushed.contains("checkpoints/"), "checkpoint files were published in {case}:\n{pushed}");
    let grep = Command::new("git").args(["grep", "-l", "outside", "main"]).current_dir(&bare).output().unwrap();
    assert!(grep.stdout.is_empty(), "a file from outside the run was published in {case}: {grep:?}");
    for (rel, kind, was) in &before {
        if !may_change(rel, *kind) {
            assert_eq!(&snapshot(&run.join(rel)), was, "{rel} ({kind:?}) was changed in {case}; {}", lifecycle.1);
        }
    }
    if placed.iter().any(|(r, _)| *r == "checkpoints") {
        // The checkpoints themselves were replaced.
        return !pushed.trim().is_empty();
    }
    let store = rekindle::checkpoint::CheckpointStore::open_read_only(run.join("checkpoints"));
    let valid: Vec<u64> = store
        .list(rekindle::checkpoint::VerifyLevel::Full)
        .unwrap()
        .into_iter()
        .filter(|i| i.valid)
        .map(|i| i.step)
        .collect();
    let newer = valid.iter().filter(|s| **s > newest_before).count();
    assert!(
        valid.contains(&newest_before) || newer >= KEEP,
        "the newest valid checkpoint from before (step {newest_before}) is gone with only {valid:?} in {case}; {}",
        lifecycle.1
    );
    !pushed.trim().is_empty()
}

#[test]
fn a_hostile_run_directory_never_costs_what_lies_outside_it_nor_a_valid_checkpoint() {
    let cases: u64 = std::env::var("REKINDLE_HOSTILE_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(12);
    let published = (0..cases).filter(|seed| one_case(*seed)).count() as u64;
    // Not vacuous: many attempts get as far as publishing (fewer than
    // half since `config.toml`, `checkpoints` and the lock are among the
    // paths: a link or a FIFO there is refused before anything is done).
    assert!(published * 4 >= cases, "only {published} of {cases} cases published anything");
}
