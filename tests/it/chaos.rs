//! The chaos campaign (`make chaos`, issue #44): random faults drawn from
//! every phase of an attempt and from every driver, against the real binary
//! and real processes, and after every fault the promises checked from what
//! is on disk.
//!
//! **Drivers** (a "life" is one run directory of one driver, taken through
//! a few faults in a row and then to its end): `run` with one rank (the
//! tiny MLP), `run` with two MPI ranks, `run` with two ranks and the
//! node-local tier, `exec` with the numpy example and `exec` with the
//! PyTorch example. Lives take the drivers in turn, so every driver is
//! drilled in every campaign.
//!
//! **Faults**: SIGKILL of every process of the attempt (`kill`), SIGKILL of
//! rank 1 alone (`kill-rank`), SIGSTOP of rank 1 past `[distributed]
//! timeout` (`stop-rank`), SIGTERM as SLURM sends it (`term`), a committed
//! checkpoint's weights corrupted on disk between attempts (`corrupt`), a
//! filesystem that is full (`disk-full`: the `fs::available_space`
//! failpoint answers 1 byte, then SIGTERM) and a persister that stalls
//! (`stall`: `persist::before_save=sleep(2000)`, then SIGTERM). Each lands
//! after a random delay, every other one after the attempt committed a new
//! checkpoint, and is recorded in the phase it hit, read from the run
//! directory at the moment it is sent: `startup` (no `start` event yet),
//! `restart` (started, nothing trained yet: loading, resuming, spreading a
//! local copy), `training`, `mid-save` (a durable checkpoint staged and not
//! committed; every save is held 30 ms before its commit by a failpoint so
//! that kills land there), `mid-local-commit` (a node-local copy written and
//! not yet agreed) or `mid-seal` (an `exec` program's checkpoint staged).
//!
//! **After every fault**: every committed checkpoint verifies in full
//! (except the one the campaign corrupted, until an attempt quarantines
//! it); the newest committed checkpoint never goes back (except past the
//! corrupted one); the next attempt resumes from the newest checkpoint that
//! verifies (a SIGTERM's checkpoint exactly: 0 steps lost; under the local
//! tier, from a copy at least that new) and never from the corrupted one;
//! no process panics. **At the end of each life** the run is brought to its
//! end and compared with an uninterrupted run of the same driver: byte for
//! byte (weights, optimizer, `state.json`'s training state, every step's
//! metrics logged once) for `run`, the output weights byte for byte for the
//! numpy program and `torch.equal` for PyTorch.
//!
//! **Reproducing**: `REKINDLE_CHAOS_SEED` replays the campaign's choices
//! (drivers, faults, delays, waits); where a fault lands also depends on
//! the machine's timing, so a failure prints the whole sequence that led to
//! it. `REKINDLE_CHAOS_FAULTS` sets how many faults must land (the short
//! campaign of `make test`: 30 with a fixed seed; `make chaos`: 1,000 with
//! a fresh seed); `REKINDLE_CHAOS_REPORT=FILE` writes the table of faults
//! per kind and phase there. The last full result is in docs/drills.md.

use crate::support;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use serde_json::Value;

use rekindle::checkpoint::{CheckpointStore, VerifyLevel};

use support::deterministic::SplitMix;
use support::requires;
use support::runs::{EXIT_DONE, EXIT_STOPPED, Training, assert_same_checkpoint, assert_same_metrics, jsonl};

/// Faults the campaign of `make test` lands, and its seed.
const SHORT_FAULTS: usize = 30;
const SHORT_SEED: u64 = 20_261_127;
/// Steps of a `run` life, and the steps of an `exec` program.
const RUN_STEPS: u64 = 300;
const EXEC_STEPS: &str = "60";
/// The longest random delay before a fault.
const MAX_DELAY_MS: u64 = 1500;
/// How long an attempt may take to end after its fault.
const END_LIMIT: Duration = Duration::from_secs(120);
/// Every attempt's failpoints: a step takes at least 5 ms (so that a life
/// lasts long enough to be hit several times) and every durable save or
/// seal is held 30 ms before its commit (else a tiny model's save lasts
/// under a millisecond and no kill would land in one).
const BASE_FAILPOINTS: &str =
    "train::step=sleep(5);checkpoint::before_rename=sleep(30);checkpoint::seal::before_rename=sleep(30)";

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Driver {
    Run1,
    Run2,
    RunLocal,
    ExecNumpy,
    ExecTorch,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    Kill,
    KillRank,
    StopRank,
    Term,
    Corrupt,
    DiskFull,
    Stall,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    Startup,
    Restart,
    Training,
    MidSave,
    MidLocalCommit,
    MidSeal,
    AtRest,
}

impl Driver {
    fn name(self) -> &'static str {
        match self {
            Driver::Run1 => "run-1",
            Driver::Run2 => "run-2",
            Driver::RunLocal => "run-2-local",
            Driver::ExecNumpy => "exec-numpy",
            Driver::ExecTorch => "exec-torch",
        }
    }

    fn ranks(self) -> usize {
        if matches!(self, Driver::Run2 | Driver::RunLocal) { 2 } else { 1 }
    }

    fn is_exec(self) -> bool {
        matches!(self, Driver::ExecNumpy | Driver::ExecTorch)
    }

    /// The faults this driver takes, with their weights.
    fn faults(self) -> &'static [(Fault, u64)] {
        match self {
            Driver::Run1 => {
                &[(Fault::Kill, 5), (Fault::Term, 2), (Fault::Corrupt, 1), (Fault::DiskFull, 1), (Fault::Stall, 1)]
            }
            Driver::Run2 => {
                &[(Fault::Kill, 4), (Fault::KillRank, 2), (Fault::StopRank, 1), (Fault::Term, 2), (Fault::Corrupt, 1)]
            }
            Driver::RunLocal => &[(Fault::Kill, 4), (Fault::KillRank, 2), (Fault::StopRank, 1), (Fault::Term, 2)],
            Driver::ExecNumpy => &[(Fault::Kill, 4), (Fault::Term, 2), (Fault::Corrupt, 1), (Fault::DiskFull, 1)],
            Driver::ExecTorch => &[(Fault::Kill, 2), (Fault::Term, 1)],
        }
    }
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::Kill => "kill",
            Fault::KillRank => "kill-rank",
            Fault::StopRank => "stop-rank",
            Fault::Term => "term",
            Fault::Corrupt => "corrupt",
            Fault::DiskFull => "disk-full",
            Fault::Stall => "stall",
        }
    }

    /// The failpoints of the attempt this fault hits, besides the base ones.
    fn failpoints(self) -> &'static str {
        match self {
            Fault::DiskFull => ";fs::available_space=return(1)",
            Fault::Stall => ";persist::before_save=sleep(2000)",
            _ => "",
        }
    }
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Startup => "startup",
            Phase::Restart => "restart",
            Phase::Training => "training",
            Phase::MidSave => "mid-save",
            Phase::MidLocalCommit => "mid-local-commit",
            Phase::MidSeal => "mid-seal",
            Phase::AtRest => "at-rest",
        }
    }
}

/// What happened so far, printed if the campaign fails: the seed and every
/// fault with where it landed.
struct Journal {
    seed: u64,
    lines: Vec<String>,
}

impl Journal {
    fn note(&mut self, line: String) {
        eprintln!("chaos: {line}");
        self.lines.push(line);
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "chaos: FAILED; replay with REKINDLE_CHAOS_SEED={} (where faults land also depends on timing). \
                 The sequence that led here:\n  {}",
                self.seed,
                self.lines.join("\n  ")
            );
        }
    }
}

/// One attempt of a life, running: its launcher (rekindle, or mpirun) and
/// how to reach its ranks.
struct Attempt {
    child: Child,
    stderr: PathBuf,
}

impl Drop for Attempt {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = killpg(Pid::from_raw(self.child.id() as i32), Signal::SIGKILL);
            let _ = self.child.wait();
        }
    }
}

/// The campaign's fixed parts: where it works, its references.
struct Campaign {
    tmp: tempfile::TempDir,
    host: String,
    references: BTreeMap<Driver, PathBuf>,
}

impl Campaign {
    fn training(&self, driver: Driver) -> Training {
        let t = Training::tiny_mlp(RUN_STEPS)
            .set("optimizer.warmup_steps=10")
            .set("checkpoint.every_steps=10")
            .set("checkpoint.keep=3")
            .set("lock.stale_after=\"2s\"")
            .set("distributed.timeout=\"2s\"");
        if driver == Driver::RunLocal {
            t.set("recovery.local=true")
                .set("recovery.local_every_steps=5")
                .set(&format!("recovery.local_dir=\"{}/local/{{node}}\"", self.tmp.path().display()))
        } else {
            t
        }
    }

    /// The nodes of a driver's ranks: rank 0 on this host (so a dead
    /// holder's lock is taken over by its pid, at once), rank 1 on a made-up
    /// node.
    fn nodes(&self, driver: Driver) -> Vec<String> {
        let mut nodes = vec![self.host.clone()];
        if driver.ranks() == 2 {
            nodes.push("chaos-b".into());
        }
        nodes
    }

    /// The command of one attempt of `driver` in `run`, with `failpoints`.
    fn command(&self, driver: Driver, run: &Path, failpoints: Option<&str>) -> Command {
        let mut cmd =
            if driver.is_exec() { exec_command(driver, run) } else { self.training(driver).command(run, &[]) };
        match failpoints {
            Some(f) => cmd.env("FAILPOINTS", f),
            None => cmd.env_remove("FAILPOINTS"),
        };
        if driver.ranks() == 1 {
            cmd.env("SLURMD_NODENAME", &self.host);
            return cmd;
        }
        let nodes = self.nodes(driver);
        crate::distributed::mpirun_per_rank(nodes.len(), cmd, |r| vec![format!("SLURMD_NODENAME={}", nodes[r])])
    }

    fn spawn(&self, driver: Driver, run: &Path, failpoints: &str) -> Attempt {
        let stderr = run.with_extension("stderr");
        let file = fs::File::create(&stderr).expect("create the attempt's stderr file");
        let child = self
            .command(driver, run, Some(failpoints))
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("start the attempt");
        Attempt { child, stderr }
    }

    /// Runs `driver` in `run` to its end without faults; returns its stderr.
    fn run_to_end(&self, driver: Driver, run: &Path) {
        let out = self.command(driver, run, None).stdin(Stdio::null()).output().expect("start the run");
        assert_eq!(
            out.status.code(),
            Some(EXIT_DONE),
            "{} in {} did not finish: {:?}\nstderr:\n{}",
            driver.name(),
            run.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Trains a life to its end. A world that stops itself on the way (exit
    /// 75: on a loaded machine a rank can fall silent for the 2 s timeout)
    /// is started again, at most three times: that is the product working.
    fn finish_life(&self, driver: Driver, run: &Path, journal: &mut Journal) {
        for _ in 0..3 {
            let out = self.command(driver, run, None).stdin(Stdio::null()).output().expect("start the run");
            match out.status.code() {
                Some(EXIT_DONE) => return,
                Some(EXIT_STOPPED) => journal.note(format!(
                    "{}: the last attempt stopped itself (exit 75), started again: {}",
                    run.display(),
                    String::from_utf8_lossy(&out.stderr)
                        .lines()
                        .filter(|l| l.contains("ERROR"))
                        .collect::<Vec<_>>()
                        .join(" / ")
                )),
                _ => panic!(
                    "{} in {} did not finish: {:?}\nstderr:\n{}",
                    driver.name(),
                    run.display(),
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                ),
            }
        }
        panic!("{} in {} stopped itself three times in a row", driver.name(), run.display());
    }

    /// The uninterrupted run of `driver` (made once per campaign).
    fn reference(&mut self, driver: Driver) -> PathBuf {
        if let Some(r) = self.references.get(&driver) {
            return r.clone();
        }
        let dir = self.tmp.path().join(format!("reference-{}", driver.name()));
        self.run_to_end(driver, &dir);
        self.references.insert(driver, dir.clone());
        dir
    }

    /// Asserts that the life in `run` ended as its driver's uninterrupted run did.
    fn assert_same_end(&mut self, driver: Driver, run: &Path) {
        let reference = self.reference(driver);
        match driver {
            Driver::Run1 | Driver::Run2 | Driver::RunLocal => {
                assert_same_checkpoint(run, &reference, RUN_STEPS);
                assert_same_metrics(run, &reference, RUN_STEPS);
            }
            Driver::ExecNumpy => {
                let (a, b) = (fs::read(exec_out(run)), fs::read(exec_out(&reference)));
                let (a, b) = (a.expect("the life's final weights"), b.expect("the reference's final weights"));
                assert!(a == b, "{}: the program's final weights differ from the uninterrupted run's", run.display());
            }
            Driver::ExecTorch => {
                let python = requires::venv().join("bin/python");
                let script = concat!(env!("CARGO_MANIFEST_DIR"), "/slurm/torch_equal.py");
                let out =
                    Command::new(python).arg(script).arg(exec_out(run)).arg(exec_out(&reference)).output().unwrap();
                assert!(
                    out.status.success(),
                    "{}: not torch.equal to the uninterrupted run: {}",
                    run.display(),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }
}

/// Where an `exec` life's program writes its final weights (numpy's
/// `np.save` adds `.npy` to any other name).
fn exec_out(run: &Path) -> PathBuf {
    run.with_extension("npy")
}

/// `rekindle exec --run-dir RUN -- <the driver's program>`, unsteered by the
/// test's own environment.
fn exec_command(driver: Driver, run: &Path) -> Command {
    let examples = concat!(env!("CARGO_MANIFEST_DIR"), "/python/examples");
    let out = exec_out(run);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rekindle"));
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("SLURM") {
            cmd.env_remove(key);
        }
    }
    cmd.args(["-q", "exec", "--run-dir"]).arg(run).arg("--");
    match driver {
        Driver::ExecNumpy => {
            cmd.arg("python3").arg(format!("{examples}/train_numpy.py"));
            cmd.args(["--steps", EXEC_STEPS, "--every", "5", "--step-seconds", "0.02", "--out"]).arg(out);
        }
        _ => {
            cmd.arg(requires::venv().join("bin/python")).arg(format!("{examples}/train_torch.py"));
            cmd.args(["--steps", EXEC_STEPS, "--every", "10", "--step-seconds", "0.02", "--out"]).arg(out);
            cmd.env("OMP_NUM_THREADS", "1");
        }
    }
    cmd
}

/// The pids of the `rekindle` ranks of `run` by their heartbeats (in the
/// nodes' files, `ranks/node-<node>.json`), each checked to be a live
/// process of an attempt in `run` (a stale file's pid may have been reused).
fn rank_pids(run: &Path) -> BTreeMap<u64, Pid> {
    let mut pids = BTreeMap::new();
    let beats = fs::read_dir(run.join("ranks"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("node-"))
        .filter_map(|e| serde_json::from_slice::<Value>(&fs::read(e.path()).ok()?).ok())
        .flat_map(|node| node["beats"].as_array().cloned().unwrap_or_default());
    for beat in beats {
        let (Some(rank), Some(pid)) = (beat["rank"].as_u64(), beat["pid"].as_i64()) else { continue };
        let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let ours = cmdline.split(|b| *b == 0).any(|arg| arg == run.as_os_str().as_encoded_bytes());
        if ours && pid > 1 {
            pids.insert(rank, Pid::from_raw(pid as i32));
        }
    }
    pids
}

/// Every live process of an attempt in `run`: those with `run`, or a path
/// under it, as an argument (`--run-dir RUN`; an `exec` program's `rekindle
/// seal RUN/checkpoints/.staging/…`). mpirun starts ranks outside its
/// process group, a rank that has not written its heartbeat yet is named
/// nowhere else, and a seal blocks the stop signals and outlives the
/// program that started it (as SLURM's cgroup would not let it).
fn attempt_pids(run: &Path) -> Vec<Pid> {
    let me = std::process::id() as i32;
    let want = run.as_os_str().as_encoded_bytes();
    let under = |arg: &[u8]| arg == want || (arg.starts_with(want) && arg.get(want.len()) == Some(&b'/'));
    let mut pids = Vec::new();
    for entry in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        let cmdline = fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if pid != me && cmdline.split(|b| *b == 0).any(under) {
            pids.push(Pid::from_raw(pid));
        }
    }
    pids
}

/// SIGKILLs every process of the attempt in `run` until none is left.
fn kill_all(run: &Path, what: &str) {
    let t0 = Instant::now();
    loop {
        let left = attempt_pids(run);
        if left.is_empty() {
            return;
        }
        for pid in &left {
            let _ = kill(*pid, Signal::SIGKILL);
            let _ = kill(*pid, Signal::SIGCONT);
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "{what}: processes {left:?} survive SIGKILL");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn events(run: &Path) -> Vec<Value> {
    jsonl(&run.join("events.jsonl"))
}

/// The newest committed checkpoint of `run` that verifies, checking that
/// every committed one verifies but `corrupted`.
fn check_store(run: &Path, corrupted: Option<u64>, what: &str) -> u64 {
    let dir = run.join("checkpoints");
    if !dir.exists() {
        return 0;
    }
    let infos = CheckpointStore::open_read_only(&dir)
        .list(VerifyLevel::Full)
        .unwrap_or_else(|e| panic!("{what}: listing {}: {e}", dir.display()));
    let mut newest = 0;
    for info in &infos {
        if Some(info.step) == corrupted {
            assert!(!info.valid, "{what}: the corrupted checkpoint of step {} verifies", info.step);
            continue;
        }
        assert!(info.valid, "{what}: committed checkpoint {} does not verify: {:?}", info.dir.display(), info.failures);
        newest = newest.max(info.step);
    }
    newest
}

/// Which phase `run`'s attempt is in, read from the run directory.
fn phase_of(driver: Driver, run: &Path, events_before: usize, tmp: &Path) -> Phase {
    let all = events(run);
    let new = &all[events_before.min(all.len())..];
    if !new.iter().any(|e| e["event"] == "start") {
        return Phase::Startup;
    }
    let staged = |dir: PathBuf, prefix: &str| {
        fs::read_dir(dir).into_iter().flatten().flatten().any(|e| e.file_name().to_string_lossy().starts_with(prefix))
    };
    if driver.is_exec() {
        if staged(run.join("checkpoints/.staging"), "") {
            return Phase::MidSeal;
        }
    } else if staged(run.join("checkpoints"), ".tmp-") {
        return Phase::MidSave;
    }
    if driver == Driver::RunLocal && local_uncommitted(&tmp.join("local")) {
        return Phase::MidLocalCommit;
    }
    // Nothing trained by this attempt yet: it is loading, resuming or
    // spreading a local copy (under `exec`: the program is not started).
    if driver.is_exec() {
        return if new.iter().any(|e| e["event"] == "child_start") { Phase::Training } else { Phase::Restart };
    }
    let resumed = new.iter().find(|e| e["event"] == "resume").and_then(|e| e["step"].as_u64()).unwrap_or(0);
    let trained = jsonl(&run.join("metrics.jsonl")).iter().filter_map(|m| m["step"].as_u64()).max().unwrap_or(0);
    if trained <= resumed { Phase::Restart } else { Phase::Training }
}

/// Whether any node's local root holds a copy written but not agreed (a
/// step folder without WORLD.json).
fn local_uncommitted(local: &Path) -> bool {
    let mut stack = vec![local.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("step-") {
                if !path.join("WORLD.json").exists() {
                    return true;
                }
            } else if stack.len() < 64 {
                stack.push(path);
            }
        }
    }
    false
}

/// Flips a byte in the middle of the newest committed checkpoint's weights;
/// returns its step.
fn corrupt_newest(run: &Path, driver: Driver) -> Option<u64> {
    let dir = run.join("checkpoints");
    let infos = CheckpointStore::open_read_only(&dir).list(VerifyLevel::Full).ok()?;
    let newest = infos.iter().filter(|i| i.valid).max_by_key(|i| i.step)?;
    let file = if driver.is_exec() {
        // The program's own largest file that the manifest lists.
        let manifest: Value = serde_json::from_slice(&fs::read(newest.dir.join("MANIFEST.json")).ok()?).ok()?;
        manifest["files"]
            .as_array()?
            .iter()
            .filter_map(|f| f["name"].as_str())
            .map(|name| newest.dir.join(name))
            .max_by_key(|p| fs::metadata(p).map(|m| m.len()).unwrap_or(0))?
    } else {
        newest.dir.join("model.safetensors")
    };
    let mut bytes = fs::read(&file).ok()?;
    let mid = bytes.len() / 2;
    *bytes.get_mut(mid)? ^= 0x5a;
    fs::write(&file, bytes).ok()?;
    Some(newest.step)
}

/// Sends `sig` to every rank of the attempt (their pids by heartbeat, the
/// launcher for one rank).
fn signal_ranks(driver: Driver, run: &Path, attempt: &Attempt, sig: Signal) {
    if driver.ranks() == 1 {
        let _ = kill(Pid::from_raw(attempt.child.id() as i32), sig);
        return;
    }
    for pid in rank_pids(run).values() {
        let _ = kill(*pid, sig);
    }
}

/// Waits for an attempt whose rank 1 was SIGSTOPped to end. A rank frozen
/// after its last beat said `done` (between its end and its exit) is beyond
/// what rank 0 can see: the launcher waits for it, as `srun` would until the
/// node is declared down. After a minute such a rank is SIGKILLed, as the
/// cluster would, and the journal says so; a rank frozen before saying done
/// must have been found and the world ended by then.
fn wait_stopped_rank(attempt: &mut Attempt, run: &Path, journal: &mut Journal, what: &str) -> ExitStatus {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(60) {
        if let Some(status) = attempt.child.try_wait().expect("poll the attempt") {
            return status;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let beat = crate::distributed::rank_beat(run, 1);
    assert!(
        beat.as_ref().is_some_and(|b| b["done"] == true),
        "{what}: rank 1 was stopped before it said done and the world did not end within 60 s: {beat:?}"
    );
    journal.note(format!("{what}: rank 1 froze after saying done; ended as the cluster would (SIGKILL)"));
    kill_all(run, what);
    wait_end(attempt, END_LIMIT, what)
}

/// Waits for the attempt to end; SIGKILLs what is left after `limit`.
fn wait_end(attempt: &mut Attempt, limit: Duration, what: &str) -> ExitStatus {
    let t0 = Instant::now();
    loop {
        if let Some(status) = attempt.child.try_wait().expect("poll the attempt") {
            return status;
        }
        if t0.elapsed() > limit {
            let _ = killpg(Pid::from_raw(attempt.child.id() as i32), Signal::SIGKILL);
            let _ = attempt.child.wait();
            let stderr = fs::read_to_string(&attempt.stderr).unwrap_or_default();
            panic!("{what}: the attempt did not end within {limit:?} of its fault; stderr:\n{stderr}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// What one life owes the checks of its next attempt.
struct LifeState {
    /// The newest committed checkpoint that verifies.
    newest: u64,
    /// A checkpoint the campaign corrupted that no attempt quarantined yet.
    corrupted: Option<u64>,
    /// The step a SIGTERM's checkpoint saved: the next resume is exactly it.
    stopped_at: Option<u64>,
}

/// Counts of landed faults by driver, kind and phase.
type Counts = BTreeMap<(Driver, Fault, Phase), usize>;

fn pick(rng: &mut SplitMix, weighted: &[(Fault, u64)]) -> Fault {
    let total: u64 = weighted.iter().map(|(_, w)| w).sum();
    let mut x = rng.below(total);
    for (f, w) in weighted {
        if x < *w {
            return *f;
        }
        x -= w;
    }
    weighted[0].0
}

/// One attempt of `driver` in `run` hit by `fault`; returns the phase it
/// landed in, or `None` when the attempt finished before the fault came.
#[allow(clippy::too_many_arguments)]
fn one_fault(
    c: &Campaign,
    driver: Driver,
    run: &Path,
    fault: Fault,
    rng: &mut SplitMix,
    life: &mut LifeState,
    journal: &mut Journal,
    what: &str,
) -> Option<Phase> {
    if fault == Fault::Corrupt {
        let step = corrupt_newest(run, driver)?;
        life.corrupted = Some(step);
        life.newest = check_store(run, life.corrupted, what);
        // A SIGTERM's checkpoint that is now corrupt is no longer the one to
        // resume from: the newest that verifies is.
        life.stopped_at = None;
        journal.note(format!("{what}: corrupted the weights of the committed checkpoint of step {step}"));
        return Some(Phase::AtRest);
    }
    let events_before = events(run).len();
    let mut attempt = c.spawn(driver, run, &format!("{BASE_FAILPOINTS}{}", fault.failpoints()));
    let wait_for_save = rng.below(2) == 1;
    let delay = Duration::from_millis(rng.below(MAX_DELAY_MS + 1));
    if wait_for_save {
        let t0 = Instant::now();
        while check_newest_quick(run) <= life.newest
            && attempt.child.try_wait().expect("poll").is_none()
            && t0.elapsed() < Duration::from_secs(60)
        {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    std::thread::sleep(delay);
    let phase = phase_of(driver, run, events_before, c.tmp.path());
    let landed = attempt.child.try_wait().expect("poll").is_none();
    if landed {
        match fault {
            Fault::Kill => {
                let _ = killpg(Pid::from_raw(attempt.child.id() as i32), Signal::SIGKILL);
                for pid in attempt_pids(run) {
                    let _ = kill(pid, Signal::SIGKILL);
                }
            }
            Fault::KillRank => {
                if let Some(pid) = rank_pids(run).get(&1) {
                    let _ = kill(*pid, Signal::SIGKILL);
                }
            }
            Fault::StopRank => {
                if let Some(pid) = rank_pids(run).get(&1) {
                    let _ = kill(*pid, Signal::SIGSTOP);
                }
            }
            Fault::Term | Fault::DiskFull | Fault::Stall => signal_ranks(driver, run, &attempt, Signal::SIGTERM),
            Fault::Corrupt => unreachable!("handled above"),
        }
    }
    let status = if fault == Fault::StopRank && landed {
        wait_stopped_rank(&mut attempt, run, journal, what)
    } else {
        wait_end(&mut attempt, END_LIMIT, what)
    };
    // Whatever is left of the attempt (a SIGSTOPped rank; mpirun may end
    // before its ranks): gone before the checks and the next attempt.
    kill_all(run, what);
    let stderr = fs::read_to_string(&attempt.stderr).unwrap_or_default();
    assert!(!stderr.contains("panicked at"), "{what}: a process panicked:\n{stderr}");
    let tail = if !landed && !status.success() {
        let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty() && !l.starts_with("---")).collect();
        format!(": it failed on its own first: {}", lines[lines.len().saturating_sub(3)..].join(" / "))
    } else {
        String::new()
    };
    journal.note(format!(
        "{what}: {} {}after {} ms, landed {}, ended {status}{tail}",
        fault.name(),
        if wait_for_save { "after a new checkpoint and " } else { "" },
        delay.as_millis(),
        if landed { phase.name() } else { "nowhere (the attempt had ended)" }
    ));
    check_attempt(driver, run, events_before, fault, landed, status, &stderr, life, what);
    landed.then_some(phase)
}

/// The newest committed step, by name only (cheap enough to poll).
fn check_newest_quick(run: &Path) -> u64 {
    fs::read_dir(run.join("checkpoints"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| rekindle::checkpoint::parse_step_dir_name(&e.file_name().to_string_lossy()))
        .max()
        .unwrap_or(0)
}

/// The checks after one attempt (see the module's header).
#[allow(clippy::too_many_arguments)]
fn check_attempt(
    driver: Driver,
    run: &Path,
    events_before: usize,
    fault: Fault,
    landed: bool,
    status: ExitStatus,
    stderr: &str,
    life: &mut LifeState,
    what: &str,
) {
    let all = events(run);
    let new = &all[events_before.min(all.len())..];
    // The resume of this attempt, if it got that far.
    if let Some(resume) = new.iter().find(|e| e["event"] == "resume") {
        let step = resume["step"].as_u64().unwrap_or(0);
        assert_ne!(Some(step), life.corrupted, "{what}: resumed from the corrupted checkpoint: {resume}");
        let tier_local = resume["tier"] == "local";
        if let Some(stopped) = life.stopped_at {
            assert!(
                step == stopped || (tier_local && step >= stopped),
                "{what}: SIGTERM's checkpoint was step {stopped}, the next attempt resumed from {resume}"
            );
        } else if tier_local {
            assert!(step >= life.newest, "{what}: a local copy older than the newest durable one: {resume}");
        } else {
            assert_eq!(step, life.newest, "{what}: not resumed from the newest checkpoint that verifies: {resume}");
        }
        life.stopped_at = None;
    }
    if let Some(bad) = life.corrupted
        && new.iter().any(|e| e["event"] == "checkpoint_quarantined" && e["step"].as_u64() == Some(bad))
    {
        // Moved aside: a checkpoint of that step from now on is a new one,
        // trained again, and must verify like any other.
        life.corrupted = None;
    }
    let newest = check_store(run, life.corrupted, what);
    assert!(newest >= life.newest, "{what}: the newest checkpoint went back from step {} to {newest}", life.newest);
    life.newest = newest;
    match fault {
        Fault::Term if landed && status.code() == Some(EXIT_STOPPED) => {
            let stop =
                new.iter().rfind(|e| e["event"] == "stop").unwrap_or_else(|| panic!("{what}: exit 75, no stop event"));
            if let Some(step) = stop["step"].as_u64()
                && stop["checkpoint_error"].is_null()
                && step > 0
            {
                assert_eq!(newest, step, "{what}: the stop's checkpoint (step {step}) is not the newest: {stop}");
                life.stopped_at = Some(step);
            }
        }
        Fault::Term if landed => {
            // Exit 1 (not 75, which promises a durable checkpoint): stopped
            // before anything durable existed (before training began, or an
            // `exec` program still starting), and nothing verifies.
            let unsealed = status.code() == Some(1) && newest == 0;
            assert!(
                status.code() == Some(EXIT_DONE) || status.signal() == Some(15) || unsealed,
                "{what}: SIGTERM ended the attempt with {status}:\n{stderr}"
            )
        }
        Fault::Kill if landed && driver.ranks() == 1 => {
            assert_eq!(status.signal(), Some(9), "{what}: SIGKILL ended the attempt with {status}")
        }
        _ => {}
    }
}

/// Runs a campaign of `faults` landed faults from `seed`; returns its
/// report.
fn campaign(faults: usize, seed: u64) -> String {
    let drivers = available_drivers();
    let mut journal = Journal { seed, lines: Vec::new() };
    let mut rng = SplitMix(seed);
    let mut c = Campaign {
        tmp: tempfile::tempdir().unwrap(),
        host: nix::unistd::gethostname().unwrap().to_string_lossy().into_owned(),
        references: BTreeMap::new(),
    };
    let started = Instant::now();
    let (mut counts, mut missed, mut lives) = (Counts::new(), 0usize, 0usize);
    let mut per_life = BTreeMap::<Driver, usize>::new();
    while counts.values().sum::<usize>() < faults {
        let driver = drivers[lives % drivers.len()];
        let run = c.tmp.path().join(format!("life-{lives}"));
        let mut life = LifeState { newest: 0, corrupted: None, stopped_at: None };
        let planned = 2 + rng.below(5) as usize;
        for i in 0..planned {
            let mut fault = pick(&mut rng, driver.faults());
            if fault == Fault::Corrupt && life.corrupted.is_some() {
                // One corrupted checkpoint at a time: the checks follow it
                // until an attempt quarantines it.
                fault = Fault::Kill;
            }
            let what = format!("life {lives} ({}), fault {i}", driver.name());
            match one_fault(&c, driver, &run, fault, &mut rng, &mut life, &mut journal, &what) {
                Some(phase) => *counts.entry((driver, fault, phase)).or_default() += 1,
                None => missed += 1,
            }
        }
        // The end of the life: trained to its end, as an uninterrupted run.
        c.finish_life(driver, &run, &mut journal);
        let what = format!("life {lives} ({}), the end", driver.name());
        let all = events(&run);
        if let Some(resume) = all.iter().rfind(|e| e["event"] == "resume") {
            assert_ne!(resume["step"].as_u64(), life.corrupted, "{what}: resumed from the corrupted checkpoint");
        }
        check_store(&run, None, &what);
        c.assert_same_end(driver, &run);
        journal.note(format!("{what}: equal to the uninterrupted run"));
        *per_life.entry(driver).or_default() += 1;
        lives += 1;
        // Nothing of a finished life is needed again: keep the disk small.
        let _ = fs::remove_dir_all(&run);
        if driver == Driver::RunLocal {
            let _ = fs::remove_dir_all(c.tmp.path().join("local"));
        }
    }
    let report = report(&counts, &per_life, missed, seed, started.elapsed());
    // Not vacuous: every kind drawn landed, and in more than one phase once
    // there are enough of them; a share of the kills found a save in flight.
    let by_kind = |f: Fault| counts.iter().filter(|((_, k, _), _)| *k == f).map(|(_, n)| n).sum::<usize>();
    let kills = by_kind(Fault::Kill);
    let mid_save: usize = counts
        .iter()
        .filter(|((_, k, p), _)| {
            *k == Fault::Kill && matches!(p, Phase::MidSave | Phase::MidSeal | Phase::MidLocalCommit)
        })
        .map(|(_, n)| n)
        .sum();
    if faults >= 200 {
        assert!(mid_save * 20 >= kills, "only {mid_save} of {kills} kills landed in a save or commit:\n{report}");
        for f in
            [Fault::Kill, Fault::KillRank, Fault::StopRank, Fault::Term, Fault::Corrupt, Fault::DiskFull, Fault::Stall]
        {
            assert!(by_kind(f) > 0, "no {} fault landed:\n{report}", f.name());
        }
    }
    assert!(kills > 0, "no kill landed:\n{report}");
    report
}

/// The drivers this machine can run (all of them in CI: a missing one
/// fails there, as every requirement does).
fn available_drivers() -> Vec<Driver> {
    let mut drivers = vec![Driver::Run1];
    if requires::mpi().is_some() {
        drivers.extend([Driver::Run2, Driver::RunLocal]);
    }
    if requires::python().is_some() {
        drivers.push(Driver::ExecNumpy);
    }
    if requires::torch().is_some() {
        drivers.push(Driver::ExecTorch);
    }
    drivers
}

/// The table of landed faults: kind by phase, with the drivers' lives.
fn report(counts: &Counts, lives: &BTreeMap<Driver, usize>, missed: usize, seed: u64, took: Duration) -> String {
    let phases = [
        Phase::Startup,
        Phase::Restart,
        Phase::Training,
        Phase::MidSave,
        Phase::MidLocalCommit,
        Phase::MidSeal,
        Phase::AtRest,
    ];
    let total: usize = counts.values().sum();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "chaos campaign: seed {seed}, {total} faults landed ({missed} more came after their attempt had ended), \
         {} lives, {:.0} s",
        lives.values().sum::<usize>(),
        took.as_secs_f64()
    );
    let _ = write!(out, "| fault |");
    for p in phases {
        let _ = write!(out, " {} |", p.name());
    }
    let _ = writeln!(out, " all |");
    let _ = writeln!(out, "|---|{}---|", "---|".repeat(phases.len()));
    for f in [Fault::Kill, Fault::KillRank, Fault::StopRank, Fault::Term, Fault::Corrupt, Fault::DiskFull, Fault::Stall]
    {
        let n = |p: Phase| counts.iter().filter(|((_, k, q), _)| *k == f && *q == p).map(|(_, n)| n).sum::<usize>();
        let _ = write!(out, "| {} |", f.name());
        for p in phases {
            let _ = write!(out, " {} |", n(p));
        }
        let _ = writeln!(out, " {} |", phases.iter().map(|p| n(*p)).sum::<usize>());
    }
    let _ = write!(out, "lives per driver:");
    for (d, n) in lives {
        let landed: usize = counts.iter().filter(|((k, _, _), _)| k == d).map(|(_, n)| n).sum();
        let _ = write!(out, " {} {n} ({landed} faults);", d.name());
    }
    out.push('\n');
    out
}

fn env_number(key: &str, default: u64) -> u64 {
    std::env::var(key).map_or(default, |v| v.parse().unwrap_or_else(|e| panic!("{key}={v:?}: {e}")))
}

#[test]
fn a_campaign_of_random_faults_loses_nothing_committed_and_every_life_ends_as_if_uninterrupted() {
    let faults = env_number("REKINDLE_CHAOS_FAULTS", SHORT_FAULTS as u64) as usize;
    let seed = env_number("REKINDLE_CHAOS_SEED", SHORT_SEED);
    eprintln!("chaos: {faults} faults, REKINDLE_CHAOS_SEED={seed}");
    let report = campaign(faults, seed);
    eprintln!("{report}");
    if let Ok(path) = std::env::var("REKINDLE_CHAOS_REPORT") {
        fs::write(&path, &report).unwrap_or_else(|e| panic!("writing {path}: {e}"));
    }
}
