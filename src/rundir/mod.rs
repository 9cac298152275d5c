//! The run directory: where it is, what it holds, and the guards that stop a
//! resume from silently continuing with different training settings, or
//! with the other command (`run` continues rekindle's own checkpoints,
//! `exec` the ones a program sealed). Both guards protect a run to
//! continue: a directory with no checkpoint yet holds none, so they let
//! anything start there (a first attempt that failed blocks nothing).
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

use crate::checkpoint::{CheckpointKind, CheckpointStore};
use crate::config::{self, Config};

// Re-exported for the lifecycle, which writes its records next to the config.
mod error;
pub mod lock;
pub(crate) mod status;
mod sweep;

pub use crate::confine::write_atomically;
pub use error::{RunDirError, RunDirRefusal};
pub use lock::{
    Claimant, DEFAULT_STALE_AFTER, LOCK_FILE, LockError, LockInfo, LockOwnership, LockRelease, LockRequest, RunLock,
    Takeover, Verdict, check_every, heartbeat_every, marker_break_after, takeover,
};
pub use status::{
    CheckpointLine, RunStatus, is_run_dir, recovery_line, resume_tier, status, straggler_line, untrained_by_node_check,
};
pub use sweep::{ROW_STATES, RunRow, SortBy, row, row_of, sort_rows};

/// File names inside a run directory.
pub const CONFIG_FILE: &str = "config.toml";
pub const EVENTS_FILE: &str = "events.jsonl";
pub const METRICS_FILE: &str = "metrics.jsonl";
pub const SUMMARY_FILE: &str = "summary.json";
pub const CHECKPOINTS_DIR: &str = "checkpoints";
/// TensorBoard event files (`[telemetry] tensorboard = true`).
pub const TENSORBOARD_DIR: &str = "tensorboard";
/// The event files this run created in its TensorBoard directory, one name
/// a line: the only ones it ever trims (the directory may be shared).
pub const TENSORBOARD_RECORD: &str = "tensorboard.files";

/// The largest `config.toml` copied aside (the largest read).
const MAX_CONFIG_BYTES: u64 = config::MAX_CONFIG_BYTES;

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
pub fn claim(root: &Path, cfg: &Config) -> Result<(), RunDirError> {
    crate::confine::claim_dir(root, "the run directory (--run-dir or [run] dir)", |dir| {
        config::load_recorded(&dir.join(CONFIG_FILE)).is_ok()
            || crate::rundir::lock::LockInfo::read(&dir.join(crate::rundir::lock::LOCK_FILE)).is_some()
    })?;
    let checkpoints = checkpoints_dir(root, cfg);
    crate::checkpoint::claim_dir(&checkpoints, checkpoints == root.join(CHECKPOINTS_DIR))
        .map_err(|e| RunDirError::Checkpoint(e.into()))
}

/// The command that continues a run directory, by the kind of checkpoint
/// it writes.
fn command_of(kind: CheckpointKind) -> &'static str {
    match kind {
        CheckpointKind::Native => "run",
        CheckpointKind::Files => "exec",
    }
}

/// The checkpoints directories a run in `root` may have written: `cfg`'s and
/// the one of the `config.toml` already there (when it differs and parses).
fn earlier_checkpoint_dirs(root: &Path, cfg: &Config) -> Vec<PathBuf> {
    let mut dirs = vec![checkpoints_dir(root, cfg)];
    if let Ok(previous) = config::load_recorded(&root.join(CONFIG_FILE)) {
        let theirs = checkpoints_dir(root, &previous.config);
        if !dirs.contains(&theirs) {
            dirs.push(theirs);
        }
    }
    dirs
}

/// The step and kind of the newest checkpoint in `dir` whose manifest reads.
fn newest_checkpoint(dir: &Path) -> Option<(u64, CheckpointKind)> {
    CheckpointStore::open_read_only(dir).newest_manifest().ok()?.map(|(step, m)| (step, m.kind))
}

/// Whether `dir` holds a checkpoint, valid or not (one that cannot be listed
/// counts as held: the guard then errs on the side of the run).
fn holds_checkpoint(dir: &Path) -> bool {
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        _ => CheckpointStore::open_read_only(dir).steps().map_or(true, |steps| !steps.is_empty()),
    }
}

/// Refuses (exit 78) a run directory whose newest checkpoint is of the
/// other command's kind, saying in one line which command continues it.
/// Reads only: called after [`claim`] and before the lock, so a refused
/// command leaves the directory as it was. `wanted`: the kind this command
/// writes and resumes.
pub fn refuse_other_command(root: &Path, cfg: &Config, wanted: CheckpointKind) -> Result<(), RunDirError> {
    for dir in earlier_checkpoint_dirs(root, cfg) {
        if let Some((step, kind)) = newest_checkpoint(&dir) {
            if kind == wanted {
                return Ok(());
            }
            return Err(RunDirRefusal::OtherCommand {
                dir: root.to_path_buf(),
                step,
                theirs: command_of(kind),
                ours: command_of(wanted),
            }
            .into());
        }
    }
    Ok(())
}

/// Records the resolved config in the run directory ([`claim`]ed first).
///
/// If the directory already holds a `config.toml` whose training-relevant
/// settings differ from `cfg` and a checkpoint to resume from, the run is
/// refused with the list of differences unless `allow_config_change` is set
/// (then the old file is kept as `config.toml.prev` and the change is
/// logged). Without a checkpoint there is nothing to continue: the old
/// `config.toml` is replaced (an attempt that failed before its first
/// checkpoint never blocks a corrected one).
pub fn prepare(root: &Path, cfg: &Config, allow_config_change: bool) -> Result<RunDir, RunDirError> {
    let config_path = root.join(CONFIG_FILE);
    let resumable = || earlier_checkpoint_dirs(root, cfg).iter().any(|d| holds_checkpoint(d));
    if config_path.exists() {
        let previous = match config::load_recorded(&config_path) {
            Ok(previous) => Some(previous.config),
            Err(e) if resumable() => {
                return Err(RunDirRefusal::PreviousConfig { path: config_path.clone(), reason: e.to_string() }.into());
            }
            Err(e) => {
                tracing::warn!(path = %config_path.display(), error = %e, "replacing an unreadable config.toml: there is no checkpoint to resume");
                None
            }
        };
        let diff = previous.map(|p| config::training_diff(&p, cfg)).unwrap_or_default();
        if !diff.is_empty() && !resumable() {
            tracing::info!(changes = %diff.join(", "), "no checkpoint yet: this config replaces the previous attempt's (nothing to resume)");
        } else if !diff.is_empty() {
            if !allow_config_change {
                return Err(RunDirRefusal::ConfigChanged { path: config_path, diff }.into());
            }
            tracing::warn!(changes = %diff.join(", "), "training settings changed since the last attempt (--allow-config-change)");
            // Replaced, never written through a symlink in its place.
            let previous = crate::confine::read_bounded(&config_path, MAX_CONFIG_BYTES)
                .map_err(|source| RunDirError::Io { path: config_path.clone(), source })?;
            let prev_path = root.join(format!("{CONFIG_FILE}.prev"));
            write_atomically(&prev_path, &previous).map_err(|source| RunDirError::Io { path: prev_path, source })?;
        }
    }
    write_atomically(&config_path, config::to_toml(cfg).as_bytes())
        .map_err(|source| RunDirError::Io { path: config_path.clone(), source })?;
    Ok(RunDir { root: root.to_path_buf(), checkpoints: checkpoints_dir(root, cfg) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::Manifest;

    fn cfg(lr: f64) -> Config {
        let mut cfg = Config::default();
        cfg.optimizer.lr = lr;
        cfg
    }

    /// A checkpoint directory of `kind` for `step`: its manifest, listing
    /// files that are not there (the kind is all the guards read).
    fn checkpoint(root: &Path, step: u64, kind: CheckpointKind) {
        let dir = root.join(CHECKPOINTS_DIR).join(crate::checkpoint::step_dir_name(step));
        std::fs::create_dir_all(&dir).unwrap();
        let manifest = Manifest {
            format_version: 1,
            kind,
            step,
            created_at: "2026-11-23T12:00:00.000Z".into(),
            rekindle_version: "test".into(),
            files: match kind {
                CheckpointKind::Native => crate::checkpoint::REQUIRED_FILES.to_vec(),
                CheckpointKind::Files => vec!["w"],
            }
            .into_iter()
            .map(|name| crate::checkpoint::ManifestEntry { name: name.into(), bytes: 0, sha256: "0".repeat(64) })
            .collect(),
        };
        std::fs::write(dir.join(crate::checkpoint::MANIFEST_FILE), manifest.to_bytes()).unwrap();
    }

    #[test]
    fn other_training_settings_replace_the_config_while_there_is_no_checkpoint() {
        let tmp = tempfile::tempdir().unwrap();
        prepare(tmp.path(), &cfg(1e-3), false).unwrap();
        prepare(tmp.path(), &cfg(2e-3), false).unwrap();
        let written = config::load_with(&tmp.path().join(CONFIG_FILE), &[], &config::AnyKind).unwrap().config;
        assert_eq!(written.optimizer.lr, 2e-3);
        assert!(!tmp.path().join("config.toml.prev").exists(), "nothing was resumed, so nothing changed");
        // An unreadable config.toml blocks nothing either.
        std::fs::write(tmp.path().join(CONFIG_FILE), "not toml [").unwrap();
        prepare(tmp.path(), &cfg(3e-3), false).unwrap();
    }

    #[test]
    fn with_a_checkpoint_other_training_settings_are_refused_unless_allowed() {
        let tmp = tempfile::tempdir().unwrap();
        prepare(tmp.path(), &cfg(1e-3), false).unwrap();
        checkpoint(tmp.path(), 5, CheckpointKind::Native);
        let before = std::fs::read(tmp.path().join(CONFIG_FILE)).unwrap();
        let err = prepare(tmp.path(), &cfg(2e-3), false).unwrap_err();
        assert!(
            matches!(&err, RunDirError::Refused(RunDirRefusal::ConfigChanged { diff, .. }) if diff[0].starts_with("optimizer.lr")),
            "{err}"
        );
        assert_eq!(std::fs::read(tmp.path().join(CONFIG_FILE)).unwrap(), before);
        prepare(tmp.path(), &cfg(2e-3), true).unwrap();
        assert_eq!(std::fs::read(tmp.path().join("config.toml.prev")).unwrap(), before);
        std::fs::write(tmp.path().join(CONFIG_FILE), "not toml [").unwrap();
        assert!(matches!(
            prepare(tmp.path(), &cfg(2e-3), false),
            Err(RunDirError::Refused(RunDirRefusal::PreviousConfig { .. }))
        ));
    }

    #[test]
    fn the_other_commands_checkpoints_are_refused_naming_the_command_that_continues_them() {
        let tmp = tempfile::tempdir().unwrap();
        let cfg = Config::default();
        // No checkpoint: either command may start there.
        refuse_other_command(tmp.path(), &cfg, CheckpointKind::Native).unwrap();
        refuse_other_command(tmp.path(), &cfg, CheckpointKind::Files).unwrap();
        checkpoint(tmp.path(), 3, CheckpointKind::Files);
        refuse_other_command(tmp.path(), &cfg, CheckpointKind::Files).unwrap();
        let err = refuse_other_command(tmp.path(), &cfg, CheckpointKind::Native).unwrap_err();
        assert!(matches!(err, RunDirError::Refused(RunDirRefusal::OtherCommand { .. })), "{err}");
        let text = err.to_string();
        assert!(text.contains("continue this run directory with `rekindle exec`") && !text.contains('\n'), "{text}");
        assert!(text.contains("(newest: step 3)"), "{text}");
        // The newest checkpoint decides.
        checkpoint(tmp.path(), 7, CheckpointKind::Native);
        refuse_other_command(tmp.path(), &cfg, CheckpointKind::Native).unwrap();
        let err = refuse_other_command(tmp.path(), &cfg, CheckpointKind::Files).unwrap_err();
        assert!(err.to_string().contains("continue this run directory with `rekindle run`"), "{err}");
    }
}
