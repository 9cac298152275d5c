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
//! more cases (12 by default, about 20 s in a debug build);
//! `REKINDLE_HOSTILE_FROM=S` starts at seed `S` (to rerun one case).
//!
//! The TensorBoard surfaces (issue #40): other runs' `*tfevents*` files
//! (one an 8 MiB sparse file, one `my-tfevents-notes.txt`) in the run's own
//! `tensorboard/`, and, in one case in three, a shared log directory
//! (`[telemetry] tensorboard`) holding them: each must be left byte for
//! byte. The newest checkpoint's `MANIFEST.json` and `state.json` and
//! `ranks/0.json` are among the paths too (a damaged newest checkpoint
//! makes the one before it the one that must survive).
//!
//! Run at a few hundred cases (issue #40, 2026-11-27, debug build on a
//! shared 2-vCPU machine):
//! `REKINDLE_HOSTILE_CASES=200 REKINDLE_HOSTILE_LOCAL_CASES=200 cargo test
//! --test it -- hostile:: --nocapture`: both passed in 1,347 s. Run
//! directory: 200 cases, all passed (about 3 to 10 s a case under load).
//! Local root: 200
//! cases in 494 s, 187 set up (13 first attempts committed no local copy)
//! and passed. Findings: a local copy whose `MANIFEST.json` is a 1 GiB
//! sparse file was passed over without a failed `local_checkpoint` (now
//! refused and recorded, checkpoint/local.rs'
//! `issue_40_a_copy_whose_manifest_is_over_its_bound_is_refused_not_passed_over`);
//! and two faults of this test, not of rekindle (a first attempt that
//! commits no local copy; a periodic save landing after its due step).
//!
//! The node-local root (issue #40) has a test of its own: after an attempt
//! that kept local copies, the user's folder, the run's folder, a copy, its
//! `WORLD.json` or a file of it is made another user's, writable by others,
//! a link to outside, a FIFO or (`WORLD.json`, `MANIFEST.json`) a 1 GiB sparse file; the
//! next `run` must finish without hanging, resume from no copy so touched,
//! change nothing outside and record a failed `local_checkpoint`. Case `i`
//! does kind `i mod 14`: the 14 cases by default cover each once
//! (`REKINDLE_HOSTILE_LOCAL_CASES=N` for more).

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
    // Files of the newest checkpoint from before (`NEWEST` is its name):
    // a FIFO or a huge sparse file where a manifest or state is read.
    "checkpoints/NEWEST/MANIFEST.json",
    "checkpoints/NEWEST/state.json",
    "ranks/0.json",
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
    /// A directory holding other runs' TensorBoard files (`*tfevents*`
    /// names, one a huge sparse file): rekindle may add its own beside
    /// them, never trim, truncate or replace them.
    ForeignTfevents,
}

/// The files [`Hostile::ForeignTfevents`] puts in a directory.
const FOREIGN_TFEVENTS: [&str; 3] =
    ["events.out.tfevents.1700000000.othernode.4242.0", "big.tfevents.bin", "my-tfevents-notes.txt"];

/// Fills `dir` with another run's TensorBoard files.
fn foreign_tfevents(dir: &Path) {
    fs::create_dir_all(dir).unwrap();
    fs::write(dir.join(FOREIGN_TFEVENTS[0]), vec![7u8; 3032]).unwrap();
    // Sparse; its size is what a careless trim truncated (kept small: the
    // snapshot hashes it).
    fs::File::create(dir.join(FOREIGN_TFEVENTS[1])).unwrap().set_len(8 << 20).unwrap();
    fs::write(dir.join(FOREIGN_TFEVENTS[2]), b"notes of a person").unwrap();
}

/// The size of [`Hostile::HugeSparse`] (sparse: no disk; small enough for
/// the snapshot's hash to stay quick in a debug build).
const HUGE: u64 = 64 << 20;

const KINDS: [Hostile; 8] = [
    Hostile::LinkToOutsideFile,
    Hostile::LinkToOutsideDir,
    Hostile::Dangling,
    Hostile::Fifo,
    Hostile::ForeignFile,
    Hostile::ForeignDir,
    Hostile::HugeSparse,
    Hostile::ForeignTfevents,
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
        Hostile::ForeignTfevents => foreign_tfevents(&path),
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
    // A damaged newest checkpoint is moved into the quarantine whole.
    if rel.starts_with("checkpoints/NEWEST/") {
        return true;
    }
    match kind {
        Hostile::ForeignFile | Hostile::HugeSparse => own_file,
        Hostile::LinkToOutsideFile | Hostile::LinkToOutsideDir | Hostile::Dangling | Hostile::Fifo => replaced_whole,
        // The staging directory is emptied when `exec` starts (documented).
        // and damaged checkpoints are moved into the quarantine.
        // A real `checkpoints` or `tensorboard` directory in the run
        // directory is rekindle's by its name (written into; the foreign
        // files of a shared TensorBoard directory are tests/it/telemetry.rs').
        // Its directory takes rekindle's own files where it is rekindle's
        // (`tensorboard`); the foreign files are checked one by one.
        Hostile::ForeignTfevents => true,
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
    // The valid checkpoints from before, newest last (under load a
    // periodic save lands some steps after it was due: not always 10, 20).
    let valid_before: Vec<u64> = rekindle::checkpoint::CheckpointStore::open_read_only(run.join("checkpoints"))
        .list(rekindle::checkpoint::VerifyLevel::Full)
        .unwrap()
        .into_iter()
        .filter(|i| i.valid)
        .map(|i| i.step)
        .rev()
        .collect();
    let mut newest_before = if exec { 2 } else { 30 };
    assert_eq!(valid_before.iter().max(), Some(&newest_before), "case {seed}: {valid_before:?}");
    let newest_dir = rekindle::checkpoint::step_dir_name(newest_before);
    let outside_before = listing(&outside);
    let count = 1 + rng.below(4) as usize;
    let mut placed: Vec<(&str, Hostile)> = Vec::new();
    for _ in 0..count {
        let rel = RUN_PATHS[rng.below(RUN_PATHS.len() as u64) as usize];
        let kind = KINDS[rng.below(KINDS.len() as u64) as usize];
        // Other runs' TensorBoard files go where TensorBoard files are.
        let rel = if matches!(kind, Hostile::ForeignTfevents) { "tensorboard" } else { rel };
        // Nothing is placed inside a `checkpoints` put there (through a
        // link, it would be outside), and one put there takes what was
        // placed inside the old one with it.
        if placed.iter().any(|(r, _)| *r == rel || (*r == "checkpoints" && rel.starts_with("checkpoints/"))) {
            continue;
        }
        if rel == "checkpoints" {
            placed.retain(|(r, _)| !r.starts_with("checkpoints/"));
        }
        let at = rel.replace("NEWEST", &newest_dir);
        if rel == "ranks/0.json" && !run.join("ranks").is_dir() {
            continue;
        }
        place(&run, &at, kind, &outside);
        placed.push((rel, kind));
    }
    if placed.iter().any(|(r, _)| r.starts_with("checkpoints/NEWEST/")) {
        // The newest checkpoint was damaged: the one before it is the
        // newest valid one that must survive.
        newest_before = valid_before.iter().copied().filter(|s| *s < newest_before).max().unwrap_or(0);
    }
    // Other runs' TensorBoard files, in the run's own directory or in a
    // shared log directory this attempt is pointed at (one case in three).
    let shared_tb = (rng.below(3) == 0).then(|| tmp.path().join("shared-tb"));
    if let Some(dir) = &shared_tb {
        foreign_tfevents(dir);
    }
    let mut foreign: Vec<std::path::PathBuf> =
        shared_tb.iter().flat_map(|d| FOREIGN_TFEVENTS.map(|f| d.join(f))).collect();
    for (rel, kind) in &placed {
        if matches!(kind, Hostile::ForeignTfevents) {
            let dir = run.join(rel.replace("NEWEST", &newest_dir));
            foreign.extend(FOREIGN_TFEVENTS.map(|f| dir.join(f)));
        }
    }
    let foreign_before: Vec<_> = foreign.iter().map(|p| (p.clone(), snapshot(p))).collect();
    let case = format!("case {seed} ({}): {placed:?}", if exec { "exec" } else { "run" });
    let before: Vec<_> = placed
        .iter()
        .map(|(rel, kind)| (*rel, *kind, snapshot(&run.join(rel.replace("NEWEST", &newest_dir)))))
        .collect();
    let shared_set = shared_tb.map(|d| format!("telemetry.tensorboard=\"{}\"", d.display()));

    // The attempt publishes everything it may to a real repository.
    let (bare, clone) = remote_and_clone(tmp.path());
    let repo = format!("publish.repo=\"{}\"", clone.display());
    let publish = ["--set", "publish.enabled=true", "--set", &repo, "--set", r#"publish.include=["**"]"#];
    let lifecycle = if exec {
        let mut cmd = Command::new(exe());
        cmd.args(["exec", "--set", "lock.stale_after=2s"]).args(publish).arg("--run-dir").arg(&run);
        if let Some(set) = &shared_set {
            cmd.args(["--set", set]);
        }
        cmd.args(["--", "sh", "-c", &sealing_program(&[3, 4])]);
        bounded(cmd, &format!("exec in {case}"))
    } else {
        let mut cmd = Command::new(exe());
        cmd.args(["run", "--config", crate::support::cli::TINY_CONFIG]).args(sets).args(publish);
        if let Some(set) = &shared_set {
            cmd.args(["--set", set]);
        }
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
    for (path, was) in &foreign_before {
        let now = snapshot(path);
        assert_eq!(
            &now,
            was,
            "another run's TensorBoard file {} was changed in {case}; {}",
            path.display(),
            lifecycle.1
        );
    }
    for (rel, kind, was) in &before {
        if !may_change(rel, *kind) {
            let rel = &rel.replace("NEWEST", &newest_dir);
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
    if !(valid.contains(&newest_before) || newer >= KEEP) {
        let (_, verify) = bounded(rekindle(&["verify"], &run), "verify");
        eprintln!("{case}: checkpoints {:?}\n{verify}", listing(&run.join("checkpoints")).keys().collect::<Vec<_>>());
    }
    assert!(
        newest_before == 0 || valid.contains(&newest_before) || newer >= KEEP,
        "the newest valid checkpoint from before (step {newest_before}) is gone with only {valid:?} in {case}; {}",
        lifecycle.1
    );
    !pushed.trim().is_empty()
}

#[test]
fn a_hostile_run_directory_never_costs_what_lies_outside_it_nor_a_valid_checkpoint() {
    let cases: u64 = std::env::var("REKINDLE_HOSTILE_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(12);
    // `REKINDLE_HOSTILE_FROM=S` starts at seed S (to run one case again).
    let from: u64 = std::env::var("REKINDLE_HOSTILE_FROM").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    let started = Instant::now();
    let published = (from..from + cases)
        .filter(|seed| {
            let published = one_case(*seed);
            eprintln!("hostile case {seed} passed ({:?} so far)", started.elapsed());
            published
        })
        .count() as u64;
    // Not vacuous: many attempts get as far as publishing (fewer than
    // half since `config.toml`, `checkpoints` and the lock are among the
    // paths: a link or a FIFO there is refused before anything is done).
    assert!(published * 4 >= cases, "only {published} of {cases} cases published anything");
}

/// What is done to the node-local root (issue #40).
#[derive(Debug, Clone, Copy, PartialEq)]
enum LocalHostile {
    ForeignUserDir,
    ForeignRoot,
    OpenRoot,
    ForeignCopy,
    CopyLinkOutside,
    CopyFifo,
    WorldFifo,
    WorldHuge,
    WorldLinkOutside,
    WorldForeign,
    ModelLinkOutside,
    ModelFifo,
    ManifestFifo,
    ManifestHuge,
}

const LOCAL_KINDS: [LocalHostile; 14] = [
    LocalHostile::ForeignUserDir,
    LocalHostile::ForeignRoot,
    LocalHostile::OpenRoot,
    LocalHostile::ForeignCopy,
    LocalHostile::CopyLinkOutside,
    LocalHostile::CopyFifo,
    LocalHostile::WorldFifo,
    LocalHostile::WorldHuge,
    LocalHostile::WorldLinkOutside,
    LocalHostile::WorldForeign,
    LocalHostile::ModelLinkOutside,
    LocalHostile::ModelFifo,
    LocalHostile::ManifestFifo,
    LocalHostile::ManifestHuge,
];

/// Another user's uid (tests run as root, which may give files away).
const OTHER_UID: u32 = 12345;

fn replace_with(path: &Path, make: impl FnOnce(&Path)) {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(path).unwrap(),
        Ok(_) => fs::remove_file(path).unwrap(),
        Err(_) => {}
    }
    make(path);
}

fn fifo(path: &Path) {
    nix::unistd::mkfifo(path, nix::sys::stat::Mode::S_IRWXU).unwrap();
}

/// Does `kind` to the root `root` (in the user's folder `folder`), whose
/// newest committed copy is `copy`; returns whether it touches that copy
/// only (else the whole tier).
fn place_local(kind: LocalHostile, folder: &Path, root: &Path, copy: &Path, outside: &Path) -> bool {
    use std::os::unix::fs::{PermissionsExt, lchown};
    let world = copy.join("WORLD.json");
    match kind {
        LocalHostile::ForeignUserDir => lchown(folder, Some(OTHER_UID), None).unwrap(),
        LocalHostile::ForeignRoot => lchown(root, Some(OTHER_UID), None).unwrap(),
        LocalHostile::OpenRoot => fs::set_permissions(root, fs::Permissions::from_mode(0o777)).unwrap(),
        LocalHostile::ForeignCopy => lchown(copy, Some(OTHER_UID), None).unwrap(),
        LocalHostile::CopyLinkOutside => replace_with(copy, |p| symlink(outside.join("dir"), p).unwrap()),
        LocalHostile::CopyFifo => replace_with(copy, fifo),
        LocalHostile::WorldFifo => replace_with(&world, fifo),
        LocalHostile::WorldHuge => replace_with(&world, |p| fs::File::create(p).unwrap().set_len(1 << 30).unwrap()),
        LocalHostile::WorldLinkOutside => replace_with(&world, |p| symlink(outside.join("secret.txt"), p).unwrap()),
        LocalHostile::WorldForeign => lchown(&world, Some(OTHER_UID), None).unwrap(),
        LocalHostile::ModelLinkOutside => {
            replace_with(&copy.join("model.safetensors"), |p| symlink(outside.join("secret.txt"), p).unwrap())
        }
        LocalHostile::ModelFifo => replace_with(&copy.join("model.safetensors"), fifo),
        LocalHostile::ManifestFifo => replace_with(&copy.join("MANIFEST.json"), fifo),
        LocalHostile::ManifestHuge => {
            replace_with(&copy.join("MANIFEST.json"), |p| fs::File::create(p).unwrap().set_len(1 << 30).unwrap())
        }
    }
    !matches!(kind, LocalHostile::ForeignUserDir | LocalHostile::ForeignRoot | LocalHostile::OpenRoot)
}

/// Runs local-root case `seed`: the kind `seed` names, in turn; whether
/// it could be set up (its first attempt committed a local copy).
fn one_local_case(seed: u64) -> bool {
    let tmp = tempfile::tempdir().unwrap();
    let outside = tmp.path().join("outside");
    fs::create_dir_all(outside.join("dir/sub")).unwrap();
    fs::write(outside.join("secret.txt"), b"outside the run").unwrap();
    fs::write(outside.join("dir/sub/kept.txt"), b"outside too").unwrap();
    let (run, local) = (tmp.path().join("run"), tmp.path().join("local"));
    let local_dir = format!("recovery.local_dir=\"{}\"", local.display());
    let sets = [
        "run.max_steps=60",
        "checkpoint.every_steps=10",
        "recovery.local=true",
        "recovery.local_every_steps=5",
        &local_dir,
    ];
    let mut first = RunCmd::new(&run);
    for set in sets {
        first = first.set(set);
    }
    first.arg("--stop-at-step").arg("33").run(TIMEOUT).assert_code(EXIT_STOPPED);
    // The newest committed copy, made newer than every durable checkpoint.
    use rekindle::checkpoint::private::{private_dir_name, user};
    let folder = local.join(private_dir_name(user()));
    let root = folder.join(rekindle::checkpoint::local::run_key(&std::path::absolute(&run).unwrap()));
    let mut committed: Vec<u64> = fs::read_dir(&root)
        .unwrap()
        .filter_map(|e| {
            let e = e.unwrap();
            let step = rekindle::checkpoint::parse_step_dir_name(&e.file_name().to_string_lossy())?;
            e.path().join("WORLD.json").is_file().then_some(step)
        })
        .collect();
    committed.sort_unstable();
    // The first attempt's copies are written beside training, and the one
    // in flight when `--stop-at-step` stops it may not commit: a rare
    // attempt leaves none (found at 20 cases). Nothing to make hostile then.
    let Some(&newest) = committed.last() else {
        eprintln!("local case {seed}: the first attempt committed no local copy in {}; not set up", root.display());
        return false;
    };
    for entry in fs::read_dir(run.join("checkpoints")).unwrap() {
        let path = entry.unwrap().path();
        let step = rekindle::checkpoint::parse_step_dir_name(&path.file_name().unwrap().to_string_lossy());
        if step.is_some_and(|s| s >= newest) {
            fs::remove_dir_all(&path).unwrap();
        }
    }
    let copy = root.join(rekindle::checkpoint::step_dir_name(newest));
    let kind = LOCAL_KINDS[(seed % LOCAL_KINDS.len() as u64) as usize];
    let copy_only = place_local(kind, &folder, &root, &copy, &outside);
    let case = format!("local case {seed} ({kind:?} at step {newest}, committed {committed:?})");
    let outside_before = listing(&outside);

    let mut cmd = Command::new(exe());
    cmd.args(["run", "--config", crate::support::cli::TINY_CONFIG]);
    for set in sets {
        cmd.args(["--set", set]);
    }
    cmd.arg("--run-dir").arg(&run);
    let (code, text) = bounded(cmd, &format!("run in {case}"));
    assert_eq!(code, Some(EXIT_DONE), "{case}: {text}");
    assert_eq!(listing(&outside), outside_before, "something outside the run changed in {case}");
    let events = crate::support::runs::events(&run);
    let last_start = events.iter().rposition(|e| e["event"] == "start").unwrap();
    let attempt = &events[last_start..];
    for resume in attempt.iter().filter(|e| e["event"] == "resume" && e["tier"] == "local") {
        assert!(copy_only, "resumed from a local copy of a tier it should refuse in {case}: {resume}");
        assert_ne!(resume["step"].as_u64(), Some(newest), "resumed from the hostile copy in {case}: {resume}");
    }
    let failed = attempt.iter().filter(|e| e["event"] == "local_checkpoint" && e["outcome"] == "failed").count();
    assert!(failed >= 1, "no failed local_checkpoint records the refusal in {case}: {attempt:?}");
    true
}

#[test]
fn issue_40_a_hostile_local_root_is_never_resumed_from_followed_nor_blocked_on() {
    let cases = std::env::var("REKINDLE_HOSTILE_LOCAL_CASES").ok().and_then(|v| v.parse().ok());
    let cases: u64 = cases.unwrap_or(LOCAL_KINDS.len() as u64);
    let started = Instant::now();
    let mut set_up = 0;
    for seed in 0..cases {
        if one_local_case(seed) {
            set_up += 1;
            eprintln!("hostile local case {seed} passed ({:?} so far)", started.elapsed());
        }
    }
    assert!(set_up * 10 >= cases * 9, "only {set_up} of {cases} local cases could be set up");
}
