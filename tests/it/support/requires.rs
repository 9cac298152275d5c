//! What some tests need beyond cargo, in one place. Every test that needs
//! more than the build asks here, so this is their list:
//!
//! | need | tests | outside CI, when missing |
//! |---|---|---|
//! | root (mount a tmpfs) | `failpoints`: `disk_full::saving_until_the_disk_is_full…`, `disk_full::disk_filling_up_during_the_write…` | skipped |
//! | `python3` with `safetensors` and `numpy` | `it`: `python_interop::numpy_loads_…`, `python_interop::bf16_tensors_…`, `exec::*` (numpy programs) | fails, unless `REKINDLE_SKIP_PYTHON=1` |
//! | PyTorch in the project's virtual environment (`.venv`, made by `make deps`) | `it`: `torch_exec::*` | fails, unless `REKINDLE_SKIP_TORCH=1` |
//! | Chromium (`REKINDLE_CHROMIUM` or on PATH) | `it`: `report_browser::*` | fails, unless `REKINDLE_SKIP_CHROMIUM=1` |
//! | `python3` with `tensorboard` (and `numpy` for the exec test) | `it`: `telemetry::*tensorboard*` | fails, unless `REKINDLE_SKIP_TENSORBOARD=1` |
//! | `promtool` and `prometheus-node-exporter` (Debian `prometheus`, `prometheus-node-exporter`) | `it`: `telemetry::the_prometheus_textfile_*` | skipped |
//! | `strace` | `it`: `control_plane::*` (bench/control_plane.py) | skipped |
//! | SLURM, or root and apt-get to install it | `it`: `drills::*` | skipped |
//! | a build with `--features mpi`, and OpenMPI's `mpirun` | `it`: `distributed::*` (those launching ranks) | skipped |
//! | an NVIDIA GPU, its driver, and a build with `--features cuda` | `it`: `gpu_check::*` | `#[ignore]`d everywhere; `make gpu-check` runs them (docs/gpus.md) |
//!
//! A test missing what it needs either returns after a loud
//! `SKIPPED: <test>: <why>` line on stderr or fails. In CI (`CI` set, and
//! not to `false`; `.ci/run` sets it) it always fails: CI must run every
//! test. Every skip is also appended to [`skips_file`], which `make test`
//! empties before the tests and prints after them (`make skip-summary`),
//! so a skip is never hidden in a passing test's captured output.

use std::fmt::Display;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What a test needs from the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Root, to mount a tmpfs.
    Root,
    /// `python3` that imports `safetensors` and `numpy`.
    Python,
    /// `.venv/bin/python` (the project's virtual environment) that imports `torch`.
    Torch,
    /// A headless Chromium.
    Chromium,
    /// SLURM's daemons and clients, or root and apt-get to install them.
    Slurm,
    /// This build has the `mpi` feature, and `mpirun` is on PATH.
    Mpi,
    /// `python3` that imports `tensorboard` (TensorBoard's own event reader).
    TensorBoard,
    /// Prometheus' `promtool` and node_exporter (`prometheus-node-exporter`).
    Prometheus,
    /// `strace`, which bench/control_plane.py counts system calls with.
    Strace,
}

impl Need {
    /// The variable that, set to `1` outside CI, lets the test skip; `None`
    /// where skipping needs no permission.
    fn opt_out(self) -> Option<&'static str> {
        match self {
            Need::Root | Need::Slurm | Need::Mpi | Need::Prometheus | Need::Strace => None,
            Need::TensorBoard => Some("REKINDLE_SKIP_TENSORBOARD"),
            Need::Python => Some("REKINDLE_SKIP_PYTHON"),
            Need::Torch => Some("REKINDLE_SKIP_TORCH"),
            Need::Chromium => Some("REKINDLE_SKIP_CHROMIUM"),
        }
    }

    /// How to get it.
    fn remedy(self) -> &'static str {
        match self {
            Need::Root => "run the tests as root",
            Need::Python => "run `pip install safetensors numpy`",
            Need::Torch => "run `make deps` (it makes .venv with torch and numpy from PyPI)",
            Need::Slurm => "run as root on Debian/Ubuntu, or apt-get install slurmctld slurmd slurm-client munge",
            Need::Mpi => {
                "apt-get install libopenmpi-dev openmpi-bin, and run `cargo test --features mpi` (as `make test` does)"
            }
            Need::Chromium => {
                "run `make deps` (apt-get install chromium) or set REKINDLE_CHROMIUM to a Chromium binary"
            }
            Need::TensorBoard => "run `make deps` (pip install tensorboard numpy)",
            Need::Prometheus => "run `make deps` (apt-get install prometheus prometheus-node-exporter)",
            Need::Strace => "run `make deps` (apt-get install strace)",
        }
    }
}

/// Whether this is CI: `CI` set to anything but empty or `false`.
pub fn in_ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "false")
}

/// The running test's name: libtest names each test's thread after it.
fn current_test() -> String {
    std::thread::current().name().unwrap_or("unknown test").to_string()
}

/// The test cannot run here because `why`: prints the SKIPPED line and
/// returns `None` (the caller returns), or panics in CI and where an opt-out
/// variable exists but is not set to `1`.
pub fn unmet<T>(need: Need, why: impl Display) -> Option<T> {
    let test = current_test();
    if in_ci() {
        panic!("{test} needs {need:?} and CI must run it, but {why}: {}", need.remedy());
    }
    if let Some(var) = need.opt_out()
        && !std::env::var(var).is_ok_and(|v| v == "1")
    {
        panic!("{test} needs {need:?}, but {why}: {}, or (outside CI only) set {var}=1 to skip it", need.remedy());
    }
    eprintln!("\n*** SKIPPED: {test}: {why} ({}) ***\n", need.remedy());
    record_skip(&format!("{test}: {why} ({})", need.remedy()));
    None
}

/// Where every skip of a test run is recorded, one line each, so that
/// `make test` prints them after the run (libtest hides a passing test's
/// output, SKIPPED line included) and `make skip-summary` can show them.
pub fn skips_file() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("rekindle-skipped-tests.txt")
}

fn record_skip(line: &str) {
    use std::io::Write;
    let appended = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(skips_file())
        .and_then(|mut f| writeln!(f, "{line}"));
    if let Err(e) = appended {
        eprintln!("*** could not record the skip in {}: {e} ***", skips_file().display());
    }
}

/// `Some(())` when `python3` imports `safetensors` and `numpy`; otherwise see [`unmet`].
pub fn python() -> Option<()> {
    python_imports(Path::new("python3"), "safetensors, numpy", Need::Python)
}

/// `Some(())` when `python` imports `modules` (`import {modules}`);
/// otherwise see [`unmet`] for `need`.
fn python_imports(python: &Path, modules: &str, need: Need) -> Option<()> {
    let probe = Command::new(python).args(["-c", &format!("import {modules}")]).output();
    let problem = match probe {
        Ok(out) if out.status.success() => return Some(()),
        Ok(out) => String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or("").to_string(),
        Err(e) => format!("cannot run {}: {e}", python.display()),
    };
    unmet(need, format_args!("{} cannot import {modules} ({problem})", python.display()))
}

/// The project's virtual environment, `.venv` (`make deps` installs torch there).
pub fn venv() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv")
}

/// `Some(python)`, the virtual environment's interpreter, when it imports
/// `torch`; otherwise see [`unmet`].
pub fn torch() -> Option<PathBuf> {
    let python = venv().join("bin/python");
    python_imports(&python, "torch, numpy", Need::Torch).map(|()| python)
}

/// `Some(python)`, the virtual environment's interpreter, when it imports
/// `torch`, `huggingface_hub` and `safetensors` (`make deps` installs them
/// there); otherwise see [`unmet`].
pub fn hf_hub() -> Option<PathBuf> {
    let python = torch()?;
    python_imports(&python, "huggingface_hub, safetensors", Need::Torch).map(|()| python)
}

/// `Some(python)`, the virtual environment's interpreter, when it imports
/// the trainers `exec`'s callbacks serve (`transformers` with `accelerate`,
/// `lightning`) and the client package (`rekindle`, `pip install -e
/// ./python`); `make deps` installs them there. Otherwise see [`unmet`].
pub fn trainers() -> Option<PathBuf> {
    let python = torch()?;
    python_imports(&python, "transformers, accelerate, lightning, rekindle.hf, rekindle.lightning", Need::Torch)
        .map(|()| python)
}

/// The Chromium binary: `REKINDLE_CHROMIUM`, else `chromium` or
/// `chromium-browser` on PATH; otherwise see [`unmet`].
pub fn chromium() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("REKINDLE_CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    let found = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .flat_map(|dir| ["chromium", "chromium-browser"].map(|name| dir.join(name)))
            .find(|p| p.is_file())
    });
    found.or_else(|| unmet(Need::Chromium, "chromium not found on PATH; the report was not opened in a browser"))
}

/// `Some(())` when `python3` imports `tensorboard` and `numpy`; otherwise see [`unmet`].
pub fn tensorboard() -> Option<()> {
    python_imports(Path::new("python3"), "tensorboard, numpy", Need::TensorBoard)
}

/// `Some(())` when `strace` is on PATH; otherwise see [`unmet`].
pub fn strace() -> Option<()> {
    if on_path("strace") { Some(()) } else { unmet(Need::Strace, "strace is not on PATH") }
}

/// `Some(())` when `promtool` and `prometheus-node-exporter` are on PATH;
/// otherwise see [`unmet`].
pub fn prometheus() -> Option<()> {
    for tool in ["promtool", "prometheus-node-exporter"] {
        if !on_path(tool) {
            return unmet(Need::Prometheus, format_args!("{tool} is not on PATH"));
        }
    }
    Some(())
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(tool).is_file()))
}

/// `Some(())` when SLURM is installed, or can be (root and apt-get:
/// `slurm/local-cluster.sh up` installs it); otherwise see [`unmet`].
pub fn slurm() -> Option<()> {
    if ["slurmctld", "slurmd", "sbatch", "munged"].iter().all(|t| on_path(t)) {
        return Some(());
    }
    if !on_path("apt-get") {
        return unmet(Need::Slurm, "SLURM is not installed and there is no apt-get to install it");
    }
    let uid = Command::new("id").arg("-u").output().map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    if uid.as_deref().unwrap_or("") != "0" {
        return unmet(Need::Slurm, "SLURM is not installed and installing it needs root");
    }
    Some(())
}

/// `Some(())` when this build has the `mpi` feature and `mpirun` is on
/// PATH; otherwise see [`unmet`].
pub fn mpi() -> Option<()> {
    if !cfg!(feature = "mpi") {
        return unmet(Need::Mpi, "the tests were built without the `mpi` feature");
    }
    if !on_path("mpirun") {
        return unmet(Need::Mpi, "mpirun is not on PATH");
    }
    Some(())
}
