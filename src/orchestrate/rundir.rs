//! The run directory: where it is, what it holds, and the config guard that
//! stops a resume from silently continuing with different training settings.
//!
//! ```text
//! <run dir>/
//!   config.toml      the resolved config (every default written out)
//!   checkpoints/     the checkpoint store (unless [checkpoint] dir says otherwise)
//!   events.jsonl     lifecycle events
//!   metrics.jsonl    one line per logged step
//!   summary.json     written when the run finishes or stops
//! ```

use std::path::{Path, PathBuf};

use crate::config::{self, Config};

// Re-exported for the lifecycle, which writes its records next to the config.
use super::atomic::write_atomically;
use super::error::RunError;

/// File names inside a run directory.
pub const CONFIG_FILE: &str = "config.toml";
pub const EVENTS_FILE: &str = "events.jsonl";
pub const METRICS_FILE: &str = "metrics.jsonl";
pub const SUMMARY_FILE: &str = "summary.json";
pub const CHECKPOINTS_DIR: &str = "checkpoints";

/// The largest `config.toml` copied aside (configs are a few KiB).
const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// A prepared run directory.
#[derive(Debug, Clone)]
pub struct RunDir {
    pub root: PathBuf,
    pub checkpoints: PathBuf,
}

impl RunDir {
    pub fn path(&self, file: &str) -> PathBuf {
        self.root.join(file)
    }
}

/// Where the run lives: `--run-dir`, else `[run] dir`, else `runs/<name>`.
pub fn resolve_run_dir(cli_run_dir: Option<&Path>, cfg: &Config) -> PathBuf {
    cli_run_dir
        .map(Path::to_path_buf)
        .or_else(|| cfg.run.dir.clone())
        .unwrap_or_else(|| PathBuf::from("runs").join(&cfg.run.name))
}

/// The checkpoints directory of a run: `[checkpoint] dir` or `<run>/checkpoints`.
pub fn checkpoints_dir(root: &Path, cfg: &Config) -> PathBuf {
    cfg.checkpoint.dir.clone().unwrap_or_else(|| root.join(CHECKPOINTS_DIR))
}

/// Makes `root` and the run's checkpoints directory rekindle's, before
/// anything (the lock included) is written there: a new or empty directory is
/// created or adopted and marked, one that holds someone else's files is
/// refused (exit 78) untouched, and so are `/` and the home directory
/// ([`crate::confine::claim_dir`]). A run directory from before the marker is
/// recognised by the `config.toml` or the `rekindle.lock` rekindle wrote in it.
pub fn claim(root: &Path, cfg: &Config) -> Result<(), RunError> {
    crate::confine::claim_dir(root, "the run directory (--run-dir or [run] dir)", |dir| {
        config::load_with(&dir.join(CONFIG_FILE), &[], &config::AnyKind).is_ok()
            || super::lock::LockInfo::read(&dir.join(super::lock::LOCK_FILE)).is_some()
    })?;
    let checkpoints = checkpoints_dir(root, cfg);
    crate::checkpoint::claim_dir(&checkpoints, checkpoints == root.join(CHECKPOINTS_DIR))
        .map_err(|e| RunError::Checkpoint(e.into()))
}

/// Records the resolved config in the run directory ([`claim`]ed first).
///
/// If the directory already holds a `config.toml` whose training-relevant
/// settings differ from `cfg`, the run is refused with the list of
/// differences unless `allow_config_change` is set (then the old file is kept
/// as `config.toml.prev` and the change is logged).
pub fn prepare(root: &Path, cfg: &Config, allow_config_change: bool) -> Result<RunDir, RunError> {
    let config_path = root.join(CONFIG_FILE);
    if config_path.exists() {
        let previous = config::load_with(&config_path, &[], &config::AnyKind)
            .map_err(|e| RunError::PreviousConfig { path: config_path.clone(), reason: e.to_string() })?;
        let diff = config::training_diff(&previous.config, cfg);
        if !diff.is_empty() {
            if !allow_config_change {
                return Err(RunError::ConfigChanged { path: config_path, diff });
            }
            tracing::warn!(changes = %diff.join(", "), "training settings changed since the last attempt (--allow-config-change)");
            // Replaced, never written through a symlink in its place.
            let previous = crate::confine::read_bounded(&config_path, MAX_CONFIG_BYTES)
                .map_err(|source| RunError::RunDir { path: config_path.clone(), source })?;
            let prev_path = root.join(format!("{CONFIG_FILE}.prev"));
            write_atomically(&prev_path, &previous).map_err(|source| RunError::RunDir { path: prev_path, source })?;
        }
    }
    write_atomically(&config_path, config::to_toml(cfg).as_bytes())
        .map_err(|source| RunError::RunDir { path: config_path.clone(), source })?;
    Ok(RunDir { root: root.to_path_buf(), checkpoints: checkpoints_dir(root, cfg) })
}
