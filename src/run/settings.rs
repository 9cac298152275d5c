//! The training settings a native checkpoint records, and the resume guard
//! on them: the checkpoint-side twin of the `config.toml` guard
//! (`rundir::prepare`), which still holds when `config.toml` is gone or the
//! checkpoints live elsewhere (`[checkpoint] dir`).
//!
//! Each `state.json` holds `settings` (the training-relevant keys,
//! [`config::training_settings`]) and `settings_sha256` (their hash,
//! [`config::training_hash`]). A resume compares the hash with the config's;
//! `settings` only names what differs. A checkpoint without the hash (written
//! before it existed) resumes unchecked.
//!
//! The guard runs twice: on the newest checkpoint before the run directory
//! is prepared ([`check_newest`]; a refused resume must leave `config.toml`
//! as it was, or restoring the old settings would then be refused by the
//! `config.toml` guard), and on the checkpoint the attempt actually loads
//! ([`check`]; an older one when the newest does not verify).

use std::path::Path;

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::checkpoint::{CheckpointKind, CheckpointStore, Loaded, STATE_FILE, VerifyLevel, read_manifest};
use crate::config::{self, Config};

use super::envelope::StateEnvelope;
use crate::attempt::error::RunError;

/// Refuses to resume from `loaded` when its recorded settings hash is not
/// `cfg`'s, unless `allow_config_change` (then it only warns).
pub fn check(cfg: &Config, loaded: &Loaded, allow_config_change: bool) -> Result<(), RunError> {
    let diff = differences(cfg, &StateEnvelope::of(&loaded.snapshot));
    if diff.is_empty() {
        return Ok(());
    }
    if !allow_config_change {
        return Err(RunError::CheckpointSettingsChanged { dir: loaded.dir.clone(), diff });
    }
    tracing::warn!(
        checkpoint = %loaded.dir.display(),
        changes = %diff.join(", "),
        "training settings differ from the checkpoint's (--allow-config-change)"
    );
    Ok(())
}

/// [`check`] on the newest checkpoint in `checkpoints` whose manifest and
/// `state.json` check out (the file's size and SHA-256, no other file read),
/// without loading it; passes when there is none, or with
/// `allow_config_change` (the attempt's [`check`] warns then).
pub fn check_newest(checkpoints: &Path, cfg: &Config, allow_config_change: bool) -> Result<(), RunError> {
    if allow_config_change {
        return Ok(());
    }
    let infos = CheckpointStore::open_read_only(checkpoints).list(VerifyLevel::Quick).unwrap_or_default();
    for info in infos.into_iter().filter(|i| i.valid) {
        let Ok(manifest) = read_manifest(&info.dir) else { continue };
        if manifest.kind != CheckpointKind::Native {
            // Not `rekindle run`'s: the attempt refuses it, saying why.
            return Ok(());
        }
        let Some(entry) = manifest.files.iter().find(|f| f.name == STATE_FILE) else { continue };
        let Ok(bytes) = crate::confine::read_bounded(&info.dir.join(STATE_FILE), entry.bytes) else { continue };
        if hex::encode(Sha256::digest(&bytes)) != entry.sha256 {
            continue;
        }
        let Ok(state) = serde_json::from_slice::<Value>(&bytes) else { continue };
        let diff = differences(cfg, &StateEnvelope::read(&state));
        return match diff.is_empty() {
            true => Ok(()),
            false => Err(RunError::CheckpointSettingsChanged { dir: info.dir, diff }),
        };
    }
    Ok(())
}

/// What differs between the settings `state` records and `cfg`'s: nothing
/// when the hashes match or `state` records none; else the changed keys, or
/// one line saying they cannot be named.
fn differences(cfg: &Config, state: &StateEnvelope) -> Vec<String> {
    let Some(recorded) = state.settings_sha256.as_deref() else {
        return Vec::new();
    };
    if recorded == config::training_hash(cfg) {
        return Vec::new();
    }
    let named = match &state.settings {
        settings @ Value::Object(_) => config::settings_diff(settings, cfg),
        _ => Vec::new(),
    };
    if named.is_empty() {
        return vec![format!(
            "settings_sha256: {recorded:?} -> {:?} (state.json does not say which keys)",
            config::training_hash(cfg)
        )];
    }
    named
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::checkpoint::{Manifest, Snapshot, TensorSet};

    fn loaded(state: Value) -> Loaded {
        Loaded {
            dir: PathBuf::from("ckpt/step-0000000020"),
            manifest: Manifest {
                format_version: 1,
                kind: Default::default(),
                step: 20,
                created_at: String::new(),
                rekindle_version: String::new(),
                files: Vec::new(),
            },
            snapshot: Snapshot { step: 20, model: TensorSet::new(), optimizer: TensorSet::new(), state },
        }
    }

    fn state_of(cfg: &Config) -> Value {
        let state = StateEnvelope {
            step: Some(20),
            settings: config::training_settings(cfg),
            settings_sha256: Some(config::training_hash(cfg)),
            ..StateEnvelope::default()
        };
        // Through the file's text, as a resume reads it.
        serde_json::from_slice(&serde_json::to_vec_pretty(&state).unwrap()).unwrap()
    }

    #[test]
    fn same_settings_resume() {
        let cfg = Config::default();
        check(&cfg, &loaded(state_of(&cfg)), false).unwrap();
    }

    #[test]
    fn changed_settings_are_refused_by_name_unless_allowed() {
        let old = Config::default();
        let mut new = old.clone();
        new.optimizer.lr = 0.5;
        new.train.grad_clip = 7.0;
        let err = check(&new, &loaded(state_of(&old)), false).unwrap_err();
        let RunError::CheckpointSettingsChanged { dir, diff } = &err else { panic!("{err}") };
        assert_eq!(dir, &PathBuf::from("ckpt/step-0000000020"));
        assert_eq!(diff.len(), 2, "{diff:?}");
        assert!(diff[0].starts_with("optimizer.lr:") && diff[1].starts_with("train.grad_clip:"), "{diff:?}");
        assert_eq!(err.outcome(), crate::exit::Outcome::ConfigError, "the config guard's exit code");
        assert!(err.to_string().contains("--allow-config-change"), "{err}");
        check(&new, &loaded(state_of(&old)), true).unwrap();
    }

    #[test]
    fn settings_outside_training_do_not_count() {
        let old = Config::default();
        let mut new = old.clone();
        new.checkpoint.keep = 11;
        new.run.name = "other".into();
        check(&new, &loaded(state_of(&old)), false).unwrap();
    }

    #[test]
    fn checkpoints_without_the_hash_resume_unchecked() {
        let mut new = Config::default();
        new.optimizer.lr = 0.5;
        check(&new, &loaded(serde_json::json!({"step": 20, "train": {}})), false).unwrap();
    }

    #[test]
    fn a_hash_without_settings_is_still_refused() {
        let old = Config::default();
        let mut new = old.clone();
        new.model.width = 7;
        let mut state = state_of(&old);
        state.as_object_mut().unwrap().remove("settings");
        let err = check(&new, &loaded(state), false).unwrap_err();
        assert!(err.to_string().contains("does not say which keys"), "{err}");
    }
}
