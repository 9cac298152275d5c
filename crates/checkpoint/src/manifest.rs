//! `MANIFEST.json`: the commit record of a checkpoint. A directory is a
//! checkpoint only if it holds a manifest that parses, has a known format
//! version, and names only plain files inside the directory. Its `kind`
//! says what the files are: rekindle's own training state (`native`, what
//! `rekindle run` writes) or any files a program staged and `rekindle seal`
//! committed (`files`, under `rekindle exec`); each lifecycle resumes only
//! from its own kind.

use std::path::{Component, Path};

use serde::{Deserialize, Serialize};

use super::error::{FileFailure, Problem};
use super::layout::{CheckpointKind, MODEL_FILE, STATE_FILE};
use super::parts::{optimizer_layout, parse_optimizer_part_name};
use super::shards::shard_layout;

/// The format version of checkpoints without shards: what this build
/// writes unless a checkpoint needs [`SHARDED_FORMAT_VERSION`], so that
/// earlier versions of rekindle read them.
pub const FORMAT_VERSION: u64 = 1;
/// Format 2: format 1 plus the model or optimizer state in shards with
/// their index (`shards.rs`). Written only by a checkpoint that has them;
/// an earlier rekindle then says *unknown format version* instead of
/// taking the checkpoint for a damaged one.
pub const SHARDED_FORMAT_VERSION: u64 = 2;
/// The newest format version this build reads (it reads every one from 1).
pub const NEWEST_FORMAT_VERSION: u64 = SHARDED_FORMAT_VERSION;
/// File name of the manifest inside a checkpoint directory.
pub const MANIFEST_FILE: &str = "MANIFEST.json";

/// One file of a checkpoint as recorded at commit time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManifestEntry {
    /// Name relative to the checkpoint directory (a plain file name).
    pub name: String,
    pub bytes: u64,
    /// Lower-case hex SHA-256 of the file's content.
    pub sha256: String,
}

/// The manifest of one checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format_version: u64,
    /// Absent (native) in every checkpoint `rekindle run` writes.
    #[serde(default, skip_serializing_if = "CheckpointKind::is_native")]
    pub kind: CheckpointKind,
    pub step: u64,
    /// RFC 3339, UTC.
    pub created_at: String,
    pub rekindle_version: String,
    pub files: Vec<ManifestEntry>,
}

impl Manifest {
    /// Total bytes of the files the manifest names (the manifest itself
    /// excluded). Saturating: the sizes are read from a file and may add up
    /// past `u64::MAX` (such a manifest never verifies: no file has that size).
    pub fn total_bytes(&self) -> u64 {
        self.files.iter().fold(0u64, |sum, f| sum.saturating_add(f.bytes))
    }

    /// What the manifest lacks of what a checkpoint of its kind must list,
    /// if anything. A native one: the model (`model.safetensors`, or every
    /// shard of it with its index, `shards.rs`), `state.json`, and the
    /// optimizer state whole (`optimizer.safetensors`), in shards with
    /// their index, or as the parts of every rank of one world
    /// (`parts.rs`). A files one: nothing in particular (it must list at
    /// least one file, see [`Manifest::parse`]). Shards need format 2.
    pub fn missing_required(&self) -> Option<String> {
        if self.kind == CheckpointKind::Files {
            return None;
        }
        let names = || self.files.iter().map(|f| f.name.as_str());
        let model = match shard_layout("model", names()) {
            Err(reason) => return Some(reason),
            Ok(shards) => shards,
        };
        if model.is_none() && !names().any(|n| n == MODEL_FILE) {
            return Some(format!("does not list `{MODEL_FILE}`"));
        }
        if !names().any(|n| n == STATE_FILE) {
            return Some(format!("does not list `{STATE_FILE}`"));
        }
        let optimizer = match shard_layout("optimizer", names()) {
            Err(reason) => return Some(reason),
            Ok(Some(_)) if names().any(|n| parse_optimizer_part_name(n).is_some()) => {
                return Some("lists both optimizer shards and optimizer parts of ranks".into());
            }
            Ok(Some(n)) => Some(n),
            Ok(None) => {
                if let Err(reason) = optimizer_layout(names()) {
                    return Some(reason);
                }
                None
            }
        };
        if (model.is_some() || optimizer.is_some()) && self.format_version < SHARDED_FORMAT_VERSION {
            return Some(format!("lists shards, which need format version {SHARDED_FORMAT_VERSION}"));
        }
        None
    }

    /// How many shards the tensor set `stem` (`"model"`, `"optimizer"`) is
    /// in: `None` as one file (or optimizer parts of ranks).
    pub fn shards(&self, stem: &str) -> Option<usize> {
        shard_layout(stem, self.files.iter().map(|f| f.name.as_str())).ok().flatten()
    }

    /// How the optimizer state is stored: `None` as one
    /// `optimizer.safetensors`, `Some(n)` as the parts of a world of `n`
    /// ranks (a manifest that [`missing_required`](Self::missing_required)
    /// accepts has one or the other).
    pub fn optimizer_parts(&self) -> Option<usize> {
        optimizer_layout(self.files.iter().map(|f| f.name.as_str())).ok().flatten()
    }

    /// Parses manifest bytes, checking the format version and every file name.
    pub fn parse(bytes: &[u8]) -> Result<Manifest, FileFailure> {
        let fail = |problem| FileFailure { file: MANIFEST_FILE.to_string(), problem };
        // Read the version first so a future format with other fields reports
        // "unknown version" rather than a confusing schema error.
        let value: serde_json::Value = serde_json::from_slice(bytes)
            .map_err(|e| fail(Problem::ManifestInvalid { reason: format!("not JSON: {e}") }))?;
        let version = value
            .get("format_version")
            .and_then(|v| v.as_u64())
            .ok_or_else(|| fail(Problem::ManifestInvalid { reason: "no numeric `format_version`".into() }))?;
        if !(FORMAT_VERSION..=NEWEST_FORMAT_VERSION).contains(&version) {
            return Err(fail(Problem::UnknownFormatVersion { found: version, supported: NEWEST_FORMAT_VERSION }));
        }
        let manifest: Manifest =
            serde_json::from_value(value).map_err(|e| fail(Problem::ManifestInvalid { reason: e.to_string() }))?;
        if manifest.kind == CheckpointKind::Files && manifest.files.is_empty() {
            return Err(fail(Problem::ManifestInvalid { reason: "a files checkpoint that lists no file".into() }));
        }
        let mut seen = std::collections::BTreeSet::new();
        for entry in &manifest.files {
            if !is_plain_name(&entry.name) || entry.name == MANIFEST_FILE {
                return Err(FileFailure {
                    file: entry.name.clone(),
                    problem: Problem::PathOutside { name: entry.name.clone() },
                });
            }
            if !seen.insert(entry.name.as_str()) {
                return Err(fail(Problem::ManifestInvalid { reason: format!("`{}` is listed twice", entry.name) }));
            }
            if entry.sha256.len() != 64 || !entry.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(fail(Problem::ManifestInvalid {
                    reason: format!("sha256 of `{}` is not 64 hex digits", entry.name),
                }));
            }
        }
        Ok(manifest)
    }

    /// Serialises the manifest (pretty JSON, keys of every object in
    /// alphabetical order, trailing newline).
    pub fn to_bytes(&self) -> Vec<u8> {
        let value = serde_json::to_value(self).expect("manifest serialises");
        let mut out = serde_json::to_vec_pretty(&value).expect("manifest serialises");
        out.push(b'\n');
        out
    }
}

/// True for a single normal path component: no `..`, no `/`, not absolute,
/// not empty, not `.`.
pub fn is_plain_name(name: &str) -> bool {
    let mut components = Path::new(name).components();
    matches!((components.next(), components.next()), (Some(Component::Normal(_)), None))
        && !name.contains('/')
        && !name.contains('\\')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest_with(name: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "format_version": 1, "step": 3, "created_at": "2026-01-01T00:00:00Z",
            "rekindle_version": "0.1.0",
            "files": [{"name": name, "bytes": 1, "sha256": "a".repeat(64)}]
        }))
        .unwrap()
    }

    #[test]
    fn plain_names_are_accepted_and_everything_else_refused() {
        assert!(is_plain_name("model.safetensors"));
        for bad in ["", ".", "..", "../x", "/etc/passwd", "a/b", "./a", "a\\b"] {
            assert!(!is_plain_name(bad), "{bad:?} must be refused");
        }
    }

    #[test]
    fn manifest_naming_a_parent_path_is_path_outside() {
        let err = Manifest::parse(&manifest_with("../model.safetensors")).unwrap_err();
        assert!(matches!(err.problem, Problem::PathOutside { .. }), "{err}");
        let err = Manifest::parse(&manifest_with("/abs")).unwrap_err();
        assert!(matches!(err.problem, Problem::PathOutside { .. }), "{err}");
    }

    #[test]
    fn native_manifests_omit_the_kind_and_files_manifests_name_it() {
        let native = Manifest::parse(&manifest_with("model.safetensors")).unwrap();
        assert_eq!(native.kind, CheckpointKind::Native);
        assert!(!String::from_utf8(native.to_bytes()).unwrap().contains("\"kind\""), "earlier versions' bytes");
        let files = Manifest { kind: CheckpointKind::Files, ..native.clone() };
        let text = String::from_utf8(files.to_bytes()).unwrap();
        assert!(text.contains("\"kind\": \"files\""), "{text}");
        let back = Manifest::parse(text.as_bytes()).unwrap();
        assert_eq!((back.kind, back.missing_required()), (CheckpointKind::Files, None));
        assert_eq!(native.missing_required().as_deref(), Some("does not list `state.json`"), "it lists only the model");
        let empty = Manifest { files: Vec::new(), ..files };
        assert!(matches!(Manifest::parse(&empty.to_bytes()).unwrap_err().problem, Problem::ManifestInvalid { .. }));
        let mut odd: serde_json::Value = serde_json::from_slice(&manifest_with("a")).unwrap();
        odd["kind"] = "torch".into();
        let err = Manifest::parse(&serde_json::to_vec(&odd).unwrap()).unwrap_err();
        assert!(matches!(err.problem, Problem::ManifestInvalid { .. }), "{err}");
    }

    #[test]
    fn a_native_manifest_lists_the_model_and_optimizer_whole_or_in_shards_of_format_2() {
        let with = |version: u64, names: &[&str]| {
            let files =
                names.iter().map(|n| ManifestEntry { name: n.to_string(), bytes: 1, sha256: "a".repeat(64) }).collect();
            Manifest {
                format_version: version,
                kind: CheckpointKind::Native,
                step: 1,
                created_at: String::new(),
                rekindle_version: String::new(),
                files,
            }
        };
        let sharded = [
            "model.safetensors.index.json",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "optimizer.safetensors.index.json",
            "optimizer-00001-of-00001.safetensors",
            "state.json",
        ];
        let m = with(2, &sharded);
        assert_eq!(m.missing_required(), None);
        assert_eq!((m.shards("model"), m.shards("optimizer"), m.optimizer_parts()), (Some(2), Some(1), None));
        assert!(with(1, &sharded).missing_required().unwrap().contains("need format version 2"));
        let whole = ["model.safetensors", "optimizer.safetensors", "state.json"];
        assert_eq!((with(1, &whole).missing_required(), with(2, &whole).missing_required()), (None, None));
        let cases: Vec<(Vec<&str>, &str)> = vec![
            (vec!["state.json", "optimizer.safetensors"], "does not list `model.safetensors`"),
            (vec!["model.safetensors", "optimizer.safetensors"], "does not list `state.json`"),
            (vec!["model-00001-of-00001.safetensors", "state.json", "optimizer.safetensors"], "index"),
            (vec!["model.safetensors", "state.json"], "optimizer"),
            (
                vec![
                    "model.safetensors",
                    "state.json",
                    "optimizer.safetensors.index.json",
                    "optimizer-00001-of-00001.safetensors",
                    "optimizer.rank-00000-of-00001.safetensors",
                ],
                "both optimizer shards and optimizer parts",
            ),
        ];
        for (names, why) in cases {
            let missing = with(2, &names).missing_required().unwrap_or_default();
            assert!(missing.contains(why), "{names:?}: {missing}");
        }
    }

    #[test]
    fn unknown_format_version_is_reported_as_such() {
        let bytes = br#"{"format_version": 3, "whatever": true}"#;
        let err = Manifest::parse(bytes).unwrap_err();
        assert_eq!(err.problem, Problem::UnknownFormatVersion { found: 3, supported: 2 });
        let err = Manifest::parse(br#"{"format_version": 0}"#).unwrap_err();
        assert_eq!(err.problem, Problem::UnknownFormatVersion { found: 0, supported: 2 });
    }

    #[test]
    fn garbage_and_truncated_manifests_are_invalid() {
        assert!(matches!(Manifest::parse(b"\x00garbage").unwrap_err().problem, Problem::ManifestInvalid { .. }));
        let full = manifest_with("model.safetensors");
        let err = Manifest::parse(&full[..full.len() / 2]).unwrap_err();
        assert!(matches!(err.problem, Problem::ManifestInvalid { .. }));
    }

    #[test]
    fn round_trips_and_rejects_duplicates() {
        let m = Manifest::parse(&manifest_with("model.safetensors")).unwrap();
        assert_eq!(Manifest::parse(&m.to_bytes()).unwrap(), m);
        let mut dup = m.clone();
        dup.files.push(dup.files[0].clone());
        assert!(Manifest::parse(&dup.to_bytes()).is_err());
    }

    #[test]
    fn sizes_adding_up_past_u64_max_saturate_instead_of_panicking() {
        // Two entries of u64::MAX bytes: summing them panicked in debug builds
        // (`rekindle checkpoints`, `rekindle verify`, rotation's size checks).
        let mut m = Manifest::parse(&manifest_with("model.safetensors")).unwrap();
        m.files[0].bytes = u64::MAX;
        m.files.push(ManifestEntry { name: "state.json".into(), bytes: u64::MAX, sha256: "b".repeat(64) });
        let m = Manifest::parse(&m.to_bytes()).unwrap();
        assert_eq!(m.total_bytes(), u64::MAX);
    }

    /// Property tests over arbitrary and mutated manifests; see `crate::fuzz`.
    mod fuzz {
        use super::*;
        use crate::fuzz;
        use proptest::prelude::*;

        fn valid() -> Vec<u8> {
            let files = ["model.safetensors", "optimizer.safetensors", "state.json"]
                .map(|n| serde_json::json!({"name": n, "bytes": 12345, "sha256": "0123456789abcdef".repeat(4)}));
            serde_json::to_vec_pretty(&serde_json::json!({
                "format_version": 1, "step": 120, "created_at": "2026-01-01T00:00:00Z",
                "rekindle_version": "0.1.0", "files": files,
            }))
            .unwrap()
        }

        fn check(bytes: &[u8]) -> Result<(), TestCaseError> {
            if let Ok(m) = Manifest::parse(bytes) {
                let _ = m.total_bytes();
                prop_assert!(m.files.iter().all(|f| is_plain_name(&f.name) && f.name != MANIFEST_FILE));
                prop_assert_eq!(Manifest::parse(&m.to_bytes()), Ok(m));
            }
            Ok(())
        }

        proptest! {
            #![proptest_config(fuzz::config())]

            #[test]
            fn arbitrary_bytes_parse_or_give_a_named_failure(bytes in fuzz::bytes(256)) {
                check(&bytes)?;
            }

            #[test]
            fn mutated_manifests_parse_or_give_a_named_failure(bytes in fuzz::mutated(valid())) {
                check(&bytes)?;
            }
        }
    }
}
