//! Helpers shared by the integration tests: deterministic snapshots, a look at
//! what lies on disk (leftovers, file bytes, manifests), file damage, the real
//! `rekindle` binary as a child process ([`cli`]), finished runs and what they
//! leave behind ([`runs`]), git repositories on disk ([`git`]), a stand-in `scontrol` ([`scontrol`]), the local SLURM cluster
//! ([`cluster`]), and what some
//! tests need from the machine ([`requires`]).
//!
//! Both test binaries (`tests/it/`, `tests/failpoints/`) include this module,
//! and each uses a different part of it.
#![allow(dead_code)]

pub mod cli;
pub mod cluster;
pub mod deterministic;
pub mod git;
pub mod requires;
pub mod runs;
pub mod scontrol;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use sha2::{Digest, Sha256};

use rekindle::checkpoint::{
    CheckpointStore, MANIFEST_FILE, ManifestEntry, Snapshot, VerifyLevel, read_manifest, verify_checkpoint_dir,
};

pub use deterministic::snapshot_for_step;

/// Payload bytes of the snapshots most tests save: small, so debug builds stay quick.
pub const SMALL_PAYLOAD: usize = 64 << 10;

/// A snapshot of `step` with [`SMALL_PAYLOAD`] bytes of tensors.
pub fn small_snapshot(step: u64) -> Snapshot {
    snapshot_for_step(step, SMALL_PAYLOAD)
}

/// A fresh temporary directory and a store in its `checkpoints` subdirectory.
pub fn temp_store(keep: usize) -> (tempfile::TempDir, CheckpointStore) {
    let tmp = tempfile::tempdir().expect("create temp dir");
    let store = CheckpointStore::open(tmp.path().join("checkpoints"), keep).expect("open store");
    (tmp, store)
}

/// Saves `small_snapshot(step)` for each step, panicking on any error.
pub fn save_steps(store: &CheckpointStore, steps: &[u64]) {
    for &step in steps {
        store.save(&small_snapshot(step)).unwrap_or_else(|e| panic!("saving step {step}: {e:#}"));
    }
}

/// Names in `dir` left by interrupted saves (`.tmp-…`) or deletes (`.trash-…`).
pub fn leftovers(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".tmp-") || n.starts_with(".trash-"))
        .collect();
    names.sort();
    names
}

/// Leftover names with the given prefix (`.tmp-` or `.trash-`).
pub fn leftovers_with_prefix(dir: &Path, prefix: &str) -> Vec<String> {
    leftovers(dir).into_iter().filter(|n| n.starts_with(prefix)).collect()
}

/// Steps of the `step-*` directories, newest first, after asserting that every
/// one of them verifies completely (every hash checked).
pub fn valid_steps(store: &CheckpointStore) -> Vec<u64> {
    let infos = store.list(VerifyLevel::Full).expect("list checkpoints");
    for info in &infos {
        assert!(info.valid, "committed checkpoint {} does not verify: {:?}", info.dir.display(), info.failures);
    }
    infos.iter().map(|i| i.step).collect()
}

/// The bytes of every file of a checkpoint except its manifest (which holds a
/// creation time and so differs between two saves of the same state).
pub fn data_files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()))
        .map(|e| e.expect("dir entry"))
        .filter(|e| e.file_name() != MANIFEST_FILE)
        .map(|e| (e.file_name().to_string_lossy().into_owned(), fs::read(e.path()).expect("read file")))
        .collect()
}

/// The manifest's file entries (names, sizes, hashes) of a checkpoint.
pub fn manifest_entries(dir: &Path) -> Vec<ManifestEntry> {
    read_manifest(dir).unwrap_or_else(|f| panic!("manifest of {}: {f}", dir.display())).files
}

/// Asserts that two checkpoint directories hold byte-identical files and
/// manifests that agree on every file's name, size and hash.
pub fn assert_same_checkpoint_on_disk(actual: &Path, reference: &Path) {
    let (a, r) = (data_files(actual), data_files(reference));
    assert_eq!(a.keys().collect::<Vec<_>>(), r.keys().collect::<Vec<_>>(), "file names of {}", actual.display());
    for (name, bytes) in &a {
        assert!(bytes == &r[name], "{} differs from the reference save in {}", name, reference.display());
    }
    assert_eq!(manifest_entries(actual), manifest_entries(reference), "manifest of {}", actual.display());
}

/// A store holding a reference save of each step, to compare files against.
pub struct Reference {
    _tmp: tempfile::TempDir,
    store: CheckpointStore,
}

impl Reference {
    /// Saved by a store writing as `settings` say (shards, write mode).
    pub fn with(steps: &[u64], settings: rekindle::checkpoint::WriteSettings) -> Reference {
        let (tmp, store) = temp_store(usize::MAX);
        let store = store.with_write_settings(settings);
        save_steps(&store, steps);
        Reference { _tmp: tmp, store }
    }

    pub fn dir(&self, step: u64) -> PathBuf {
        self.store.step_dir(step)
    }
}

/// Asserts that the checkpoint of `step` verifies fully and holds exactly
/// `small_snapshot(step)`.
pub fn assert_holds_small_snapshot(store: &CheckpointStore, step: u64) {
    let dir = store.step_dir(step);
    let failures = verify_checkpoint_dir(&dir, VerifyLevel::Full);
    assert!(failures.is_empty(), "{} does not verify: {failures:?}", dir.display());
    let loaded = rekindle::checkpoint::load_dir(&dir).unwrap_or_else(|f| panic!("loading {}: {f:?}", dir.display()));
    assert!(
        loaded.snapshot == small_snapshot(step),
        "{} does not hold the snapshot saved for step {step}",
        dir.display()
    );
}

/// Flips every bit of one byte in the middle of `path`.
pub fn flip_byte(path: &Path) {
    let mut bytes = fs::read(path).expect("read file to damage");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    fs::write(path, bytes).expect("write damaged file");
}

/// Cuts `path` to half its length.
pub fn truncate_half(path: &Path) {
    let len = fs::metadata(path).expect("stat file to truncate").len();
    fs::OpenOptions::new().write(true).open(path).and_then(|f| f.set_len(len / 2)).expect("truncate");
}

/// An example binary (`examples/<name>.rs`), built next to the test
/// binaries by `cargo test` (or `cargo build --examples`):
/// target/debug/deps/it-… → target/debug/examples/<name>.
/// Runs `cmd` as a user's shell would run it: stdin closed, stdout and
/// stderr into the files `out` and `err`, without the test environment's
/// SLURM, failpoint and log-level variables, and in a process group of its
/// own, so that `timeout` ends everything it started. `None` when it was
/// killed at the timeout.
pub fn run_as_user(mut cmd: Command, out: &Path, err: &Path, timeout: Duration) -> Option<ExitStatus> {
    cmd.stdin(Stdio::null());
    cmd.stdout(fs::File::create(out).unwrap()).stderr(fs::File::create(err).unwrap());
    for (key, _) in std::env::vars_os() {
        let name = key.to_string_lossy();
        if name.starts_with("SLURM") || name == "FAILPOINTS" || name == "RUST_LOG" {
            cmd.env_remove(&key);
        }
    }
    cmd.process_group(0);
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("start {cmd:?}: {e}"));
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Some(status);
        }
        if started.elapsed() > timeout {
            let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(child.id() as i32), Signal::SIGKILL);
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn example_exe(name: &str) -> PathBuf {
    let me = std::env::current_exe().expect("current_exe");
    let profile_dir = me.parent().and_then(Path::parent).expect("test binary lives in <target>/<profile>/deps");
    let exe = profile_dir.join("examples").join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        exe.is_file(),
        "{} is missing: run `cargo build --examples` (or a plain `cargo test`, which builds examples) first",
        exe.display()
    );
    exe
}

/// Every path under `root`, relative to it, with what it is: a file's
/// SHA-256, a link's target (never followed), `dir`, or `special`. What
/// "nothing changed there" compares.
pub fn listing(root: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        let Ok(entries) = fs::read_dir(&dir) else { continue };
        for entry in entries {
            let path = entry.unwrap().path();
            out.insert(path.strip_prefix(root).unwrap().to_path_buf(), describe(&path, &mut todo));
        }
    }
    out
}

fn describe(path: &Path, todo: &mut Vec<PathBuf>) -> String {
    let Ok(meta) = fs::symlink_metadata(path) else { return "gone".into() };
    if meta.file_type().is_symlink() {
        format!("link {}", fs::read_link(path).unwrap().display())
    } else if meta.is_dir() {
        todo.push(path.to_path_buf());
        "dir".into()
    } else if meta.is_file() {
        // The mode too: narrowing a file's mode changes it as much as its bytes.
        let mode = std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o7777;
        format!("{mode:o} {}", hex::encode(Sha256::digest(fs::read(path).unwrap())))
    } else {
        "special".into()
    }
}

/// `path` and everything under it, as [`listing`] sees it.
pub fn snapshot(path: &Path) -> BTreeMap<PathBuf, String> {
    let mut todo = Vec::new();
    let mut out = BTreeMap::from([(PathBuf::new(), describe(path, &mut todo))]);
    if !todo.is_empty() {
        out.extend(listing(path));
    }
    out
}

/// What a command did, measured: its exit code (`None`: a signal), its
/// output, its peak resident memory and how long it ran.
#[derive(Debug)]
pub struct Measured {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub max_rss_bytes: u64,
    pub elapsed: Duration,
}

/// Measures a command's peak memory through a small intermediate process:
/// forks it from its own (small) address space, execs the command, reaps it
/// with `wait4` and writes `{"status": …, "maxrss_kib": …}` to argv[1]. A
/// child forked (or posix_spawned) straight from the test binary starts
/// with the test binary's address space, whose high-water mark Linux keeps
/// in the child's `ru_maxrss` across `exec`: under a parallel test run that
/// is hundreds of MiB of other tests' memory, not the command's.
const MEASURE: &str = r#"
import json, os, sys
pid = os.fork()
if pid == 0:
    os.execvp(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as f:
    json.dump({"status": status, "maxrss_kib": usage.ru_maxrss}, f)
"#;

/// Runs `cmd` (stdin closed, output to files: no pipe can fill and block
/// it), killed after `timeout` (with the intermediate, as one process
/// group); its own peak memory from `wait4` (see [`MEASURE`]), not the
/// test binary's nor other tests' children's.
pub fn run_measured(cmd: Command, timeout: Duration) -> Measured {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let (out, err, result) = (dir.path().join("out"), dir.path().join("err"), dir.path().join("result.json"));
    let mut measured = Command::new("python3");
    measured.args(["-c", MEASURE]).arg(&result).arg(cmd.get_program()).args(cmd.get_args());
    for (key, value) in cmd.get_envs() {
        match value {
            Some(v) => measured.env(key, v),
            None => measured.env_remove(key),
        };
    }
    if let Some(cwd) = cmd.get_current_dir() {
        measured.current_dir(cwd);
    }
    measured.process_group(0);
    measured.stdin(Stdio::null()).stdout(fs::File::create(&out).unwrap()).stderr(fs::File::create(&err).unwrap());
    let started = Instant::now();
    let mut child = measured.spawn().expect("python3 runs the memory measurement (make deps installs it)");
    let pgid = nix::unistd::Pid::from_raw(child.id() as i32);
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if started.elapsed() > timeout {
            let _ = nix::sys::signal::killpg(pgid, Signal::SIGKILL);
            let _ = child.wait();
            panic!(
                "{cmd:?} did not end within {timeout:?} (a hang):\n{}",
                fs::read_to_string(&err).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let elapsed = started.elapsed();
    let stderr = fs::read_to_string(&err).unwrap_or_default();
    let record: serde_json::Value = fs::read(&result)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_else(|| panic!("{cmd:?} could not be measured (did it start?):\n{stderr}"));
    let status = record["status"].as_i64().unwrap() as nix::libc::c_int;
    let code = nix::libc::WIFEXITED(status).then(|| nix::libc::WEXITSTATUS(status));
    Measured {
        code,
        stdout: fs::read_to_string(&out).unwrap_or_default(),
        stderr,
        max_rss_bytes: record["maxrss_kib"].as_u64().unwrap() * 1024,
        elapsed,
    }
}
