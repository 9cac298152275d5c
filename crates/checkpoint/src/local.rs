//! The node-local checkpoint tier (docs/recovery.md): beside the durable
//! checkpoints on shared storage, every node of a run keeps a whole copy of
//! the newest one or two states on its own storage (`[recovery] local`),
//! from which a restart inside the job resumes without the queue and
//! without losing more than a local interval.
//!
//! A node's copy of step S is an ordinary checkpoint directory
//! (`step-<S>` with its `MANIFEST.json`, written by the same commit
//! protocol) under the node's local root. It counts as a *local
//! checkpoint* only once it also holds `WORLD.json` ([`WorldRecord`]):
//! written after every node of the world reported a copy with the same
//! files (name, size, SHA-256), so a copy that no other node could confirm
//! — a save cut short by the fault — is never resumed from. In a
//! data-parallel run every rank holds the whole model and optimizer state,
//! so each node writes a whole copy of its own and the agreement of their
//! hashes is the replication check; no node depends on one other node.
//!
//! The root is private to its user (`private.rs`): a copy is read only
//! once it and the way to it are the user's alone, and it is resumed from
//! only when its `WORLD.json` names this run ([`WorldRecord::run`]) and
//! every file verifies.
//!
//! Here: the record, where a node's root is ([`resolve_root`]), which
//! local checkpoints a node holds and verify ([`held`]), which one a new
//! world resumes from ([`choose`], pure), and whether one more fits
//! ([`room_for`]). The copying between ranks is the driver's (`run/local.rs`).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::layout::{parse_step_dir_name, step_dir_name};
use super::manifest::ManifestEntry;
use super::private::{self, Untrusted};
use super::verify::{VerifyLevel, read_manifest_at, verify_at};

/// The record that makes a node's copy a local checkpoint of the world.
pub const WORLD_FILE: &str = "WORLD.json";
/// What every user's folder in the local directory is named after
/// (`rekindle-local-<uid>`, `private.rs`).
pub const LOCAL_DIR_NAME: &str = "rekindle-local";
/// 2: the record names its run (`run`); format 1 did not, so a copy of
/// another run could not be told apart and is refused.
const WORLD_FORMAT: u64 = 2;
/// The largest `WORLD.json` read: the manifest's bound, as it lists the
/// same files.
pub const MAX_WORLD_BYTES: u64 = super::verify::MAX_MANIFEST_BYTES;

/// `WORLD.json`: the world agreed on this step's files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorldRecord {
    pub format_version: u64,
    /// The run whose copy this is: its run directory's absolute path
    /// ([`run_identity`]), the path the root's run key is a hash of. Empty
    /// in records of format 1.
    #[serde(default)]
    pub run: String,
    pub step: u64,
    /// The checkpoint's files as every holder's manifest lists them.
    pub files: Vec<ManifestEntry>,
    /// The nodes that wrote a copy, in the order of their writers' ranks.
    pub holders: Vec<String>,
    /// Ranks of the world that wrote it.
    pub world_size: usize,
    /// RFC 3339, UTC.
    pub committed_at: String,
}

impl WorldRecord {
    pub fn new(
        run: String,
        step: u64,
        files: Vec<ManifestEntry>,
        holders: Vec<String>,
        world_size: usize,
    ) -> WorldRecord {
        WorldRecord {
            format_version: WORLD_FORMAT,
            run,
            step,
            files,
            holders,
            world_size,
            committed_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        }
    }

    /// Writes the record into the copy `dir` (a handle on it) atomically
    /// (a synced temporary file, mode 0600, renamed into place, the
    /// directory synced): the copy becomes a local checkpoint.
    pub fn write(&self, dir: &crate::confine::Dir) -> std::io::Result<()> {
        use std::io::Write;
        static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let mut bytes = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        bytes.push(b'\n');
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = format!(".tmp-world-{}-{n}", std::process::id());
        let written = dir.create_new(&tmp, 0o600).and_then(|mut file| {
            file.write_all(&bytes)?;
            file.sync_all()?;
            dir.rename(&tmp, WORLD_FILE)
        });
        if written.is_err() {
            let _ = dir.remove_file(&tmp);
        }
        written?;
        dir.sync()
    }

    /// The record of the copy `dir`, or why there is none usable. Read
    /// without following a link or blocking (a FIFO is refused, not waited
    /// on), and at most [`MAX_WORLD_BYTES`] of it.
    pub fn read(dir: &crate::confine::Dir) -> Result<WorldRecord, Unfit> {
        let path = dir.shown(WORLD_FILE);
        let bytes = match dir.read_bounded(WORLD_FILE, MAX_WORLD_BYTES) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Unfit::Unusable(format!(
                    "no WORLD.json in {}: the world never agreed on this copy",
                    dir.path().display()
                )));
            }
            // A link, a special file, or more than any record rekindle writes.
            Err(e) if matches!(e.kind(), std::io::ErrorKind::InvalidInput | std::io::ErrorKind::InvalidData) => {
                return Err(Unfit::Refused(e.to_string()));
            }
            Err(e) => return Err(Unfit::Unusable(format!("cannot read {}: {e}", path.display()))),
        };
        let record: WorldRecord = serde_json::from_slice(&bytes)
            .map_err(|e| Unfit::Refused(format!("{} is unreadable: {e}", path.display())))?;
        if record.format_version != WORLD_FORMAT {
            return Err(Unfit::Refused(format!(
                "{} has format {} (this rekindle reads {WORLD_FORMAT}, whose record names its run): a copy that \
                 does not say whose it is is never resumed from",
                path.display(),
                record.format_version
            )));
        }
        Ok(record)
    }
}

/// Why a copy is no local checkpoint to resume from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unfit {
    /// Not to be trusted: not the user's alone (another owner, writable by
    /// others, a link or special file), or not this run's. Recorded.
    #[error("{0}")]
    Refused(String),
    /// Never committed, or damaged: ordinary after a fault, only logged.
    #[error("{0}")]
    Unusable(String),
}

impl From<Untrusted> for Unfit {
    fn from(e: Untrusted) -> Unfit {
        Unfit::Refused(e.to_string())
    }
}

/// Why the local tier has no place on this node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LocalPlaceError {
    #[error(
        "no node-local directory: [recovery] local_dir is not set, and neither $SLURM_TMPDIR, $TMPDIR nor /dev/shm \
         exists; set [recovery] local_dir to a directory on this node's own storage"
    )]
    NoDirectory,
    #[error("[recovery] local_dir `{template}` uses {{job}} outside a SLURM job; use {{node}} only, or a fixed path")]
    NoJob { template: String },
    /// The root could not be made, or it (or the way to it) is not the
    /// user's alone (`private.rs`).
    #[error("{0}")]
    Untrusted(#[from] Untrusted),
}

/// The local root of the run whose directory is `run_dir` on node `node`
/// for the user `uid`: `<dir>/rekindle-local-<uid>/<run key>`, where
/// `<dir>` is `template` with `{node}` and `{job}` replaced, else the first
/// of `$SLURM_TMPDIR`, `$TMPDIR` and `/dev/shm` that `exists`. Why a folder
/// per user, named with its uid: `private.rs`.
pub fn resolve_root(
    template: Option<&str>,
    env: impl Fn(&str) -> Option<String>,
    exists: impl Fn(&Path) -> bool,
    node: &str,
    job: Option<&str>,
    run_dir: &Path,
    uid: u32,
) -> Result<PathBuf, LocalPlaceError> {
    let base = match template {
        Some(template) => {
            if template.contains("{job}") && job.is_none() {
                return Err(LocalPlaceError::NoJob { template: template.to_string() });
            }
            PathBuf::from(template.replace("{node}", node).replace("{job}", job.unwrap_or_default()))
        }
        None => ["SLURM_TMPDIR", "TMPDIR"]
            .iter()
            .filter_map(|var| env(var).filter(|v| !v.trim().is_empty()).map(PathBuf::from))
            .chain([PathBuf::from("/dev/shm")])
            .find(|p| exists(p))
            .ok_or(LocalPlaceError::NoDirectory)?,
    };
    Ok(base.join(private::private_dir_name(uid)).join(run_key(run_dir)))
}

/// The run `run_dir` as a [`WorldRecord`] names it: its absolute path (the
/// one [`run_key`] hashes).
pub fn run_identity(run_dir: &Path) -> String {
    std::path::absolute(run_dir).unwrap_or_else(|_| run_dir.to_path_buf()).to_string_lossy().into_owned()
}

/// A run's name in the local tier: the first 16 hex digits of the SHA-256
/// of its run directory's path, so two runs on one node never share copies.
pub fn run_key(run_dir: &Path) -> String {
    let digest = Sha256::digest(run_dir.as_os_str().as_encoded_bytes());
    hex::encode(&digest[..8])
}

/// A local checkpoint this node holds whose files all verify.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldStep {
    pub step: u64,
    pub files: Vec<ManifestEntry>,
}

/// A copy under the root that is no usable local checkpoint, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unusable {
    pub step: u64,
    pub reason: String,
    /// Refused as not the user's alone or not this run's ([`Unfit::Refused`]):
    /// recorded as a failed `local_checkpoint`, not only logged.
    #[serde(default)]
    pub refused: bool,
}

/// The local checkpoints of the run `run` ([`run_identity`]) under `root`
/// (a root [`private::prepare_root`] made) that verify in full (every
/// file's SHA-256), newest first, and the copies that do not, with why. A
/// missing root holds nothing.
pub fn held(root: &Path, run: &str) -> (Vec<HeldStep>, Vec<Unusable>) {
    let mut steps: Vec<u64> = match crate::confine::Dir::open(root).and_then(|root| root.entries("")) {
        Ok(entries) => entries.iter().filter_map(|e| parse_step_dir_name(&e.name_lossy())).collect(),
        Err(_) => Vec::new(),
    };
    steps.sort_unstable_by(|a, b| b.cmp(a));
    let (mut good, mut bad) = (Vec::new(), Vec::new());
    for step in steps {
        match check_copy(&root.join(step_dir_name(step)), step, run) {
            Ok(files) => good.push(HeldStep { step, files }),
            Err(unfit) => {
                let refused = matches!(unfit, Unfit::Refused(_));
                bad.push(Unusable { step, reason: unfit.to_string(), refused });
            }
        }
    }
    (good, bad)
}

/// The files of the copy `dir` of `step` when it is a local checkpoint of
/// the run `run` whose every file verifies. Before anything of it is read,
/// the copy and everything in it must be the user's alone
/// ([`private::check_tree`]: never a link, never a FIFO).
pub fn check_copy(dir: &Path, step: u64, run: &str) -> Result<Vec<ManifestEntry>, Unfit> {
    private::check_tree(dir)?;
    // Everything below is read through one handle of the copy, opened once
    // its tree was found private: a file swapped for a link since is
    // refused by the kernel, never read through.
    let held = crate::confine::Dir::open(dir).map_err(|e| Unfit::Unusable(e.to_string()))?;
    let world = WorldRecord::read(&held)?;
    if world.run != run {
        return Err(Unfit::Refused(format!(
            "{} names the run {}, not this one ({run}): a copy of another run is never resumed from",
            dir.join(WORLD_FILE).display(),
            if world.run.is_empty() { "(none)" } else { world.run.as_str() }
        )));
    }
    let unusable = |why: String| Unfit::Unusable(format!("{}: {why}", dir.display()));
    // A manifest larger than any rekindle writes was put there, as a
    // WORLD.json over its bound is: refused (and recorded), not passed over.
    if let Err(e) = held.read_bounded(super::MANIFEST_FILE, super::verify::MAX_MANIFEST_BYTES)
        && matches!(e.kind(), std::io::ErrorKind::InvalidInput | std::io::ErrorKind::InvalidData)
    {
        return Err(Unfit::Refused(e.to_string()));
    }
    let manifest = read_manifest_at(&held).map_err(|f| unusable(f.to_string()))?;
    if world.step != step || manifest.step != step {
        return Err(unusable(format!("WORLD.json says step {}, MANIFEST.json step {}", world.step, manifest.step)));
    }
    if world.files != manifest.files {
        return Err(unusable("its files are not the ones the world agreed on".into()));
    }
    let failures = verify_at(&held, VerifyLevel::Full);
    if let Some(first) = failures.first() {
        return Err(unusable(format!("does not verify: {first}")));
    }
    Ok(world.files)
}

/// Where a new world resumes from.
#[derive(Debug, Clone, PartialEq)]
pub enum LocalChoice {
    /// The local checkpoint of `step`, copied from rank `holder`'s node.
    Local { step: u64, holder: usize },
    /// The durable tier, and why not a local checkpoint.
    Durable { reason: String },
}

/// The newest local checkpoint any rank holds (`held[r]`: rank `r`'s),
/// when it is newer than the newest durable one (`durable`); its holder is
/// the lowest rank holding it. Copies of one step whose files differ
/// between ranks cannot both be right: that step is passed over.
pub fn choose(held: &[Vec<HeldStep>], durable: Option<u64>) -> LocalChoice {
    let mut steps: Vec<u64> = held.iter().flatten().map(|h| h.step).collect();
    steps.sort_unstable_by(|a, b| b.cmp(a));
    steps.dedup();
    let Some(&newest) = steps.first() else {
        return LocalChoice::Durable { reason: "no node holds a local checkpoint that verifies".into() };
    };
    let mut skipped = Vec::new();
    for step in steps.into_iter().filter(|s| durable.is_none_or(|d| *s > d)) {
        let copies: Vec<(usize, &HeldStep)> = held
            .iter()
            .enumerate()
            .filter_map(|(rank, steps)| steps.iter().find(|h| h.step == step).map(|h| (rank, h)))
            .collect();
        if copies.windows(2).all(|w| w[0].1.files == w[1].1.files) {
            return LocalChoice::Local { step, holder: copies[0].0 };
        }
        skipped.push(step);
    }
    let reason = match (skipped.first(), durable) {
        (Some(step), _) => format!("the local copies of step {step} differ between nodes"),
        (None, Some(d)) => {
            format!("the newest local checkpoint (step {newest}) is not newer than the durable one (step {d})")
        }
        (None, None) => unreachable!("a step newer than no durable checkpoint is always tried"),
    };
    LocalChoice::Durable { reason }
}

/// Why no node of this world can hold the newest local checkpoint the run
/// committed (`last`: its step and the nodes that held it, from the run's
/// records), when it is newer than the durable one (`durable`) and none of
/// those nodes is among this world's (`nodes`): it names them. `None`
/// otherwise (some holder is here, and says itself why its copy is unusable).
pub fn holders_gone(last: Option<(u64, &[String])>, nodes: &[String], durable: Option<u64>) -> Option<String> {
    let (step, holders) = last?;
    if durable.is_some_and(|d| step <= d) || holders.is_empty() || holders.iter().any(|h| nodes.contains(h)) {
        return None;
    }
    Some(format!(
        "every node that held the newest local checkpoint (step {step}: {}) is gone from this world",
        holders.join(", ")
    ))
}

/// Whether a copy of `bytes` fits on `root`'s filesystem: at most `share`
/// of its free space. `Err` says why not (or why it cannot tell).
pub fn room_for(root: &Path, bytes: u64, share: f64) -> Result<(), String> {
    let probe = root.ancestors().find(|p| p.exists()).unwrap_or(Path::new("/"));
    let stat = nix::sys::statvfs::statvfs(probe)
        .map_err(|e| format!("cannot tell the free space of {}: {e}", probe.display()))?;
    let free = (stat.blocks_available() as u64).saturating_mul(stat.fragment_size() as u64);
    fits(bytes, free, share)
}

/// [`room_for`]'s rule: `bytes` ≤ `share` × `free`.
pub fn fits(bytes: u64, free: u64, share: f64) -> Result<(), String> {
    let allowed = (free as f64 * share) as u64;
    if bytes <= allowed {
        return Ok(());
    }
    Err(format!(
        "a copy needs {} but [recovery] local_max_share = {share} of the {} free allows {}",
        crate::units::human_bytes(bytes),
        crate::units::human_bytes(free),
        crate::units::human_bytes(allowed)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, sha: &str) -> ManifestEntry {
        ManifestEntry { name: name.into(), bytes: 4, sha256: sha.into() }
    }

    fn held_step(step: u64, sha: &str) -> HeldStep {
        HeldStep { step, files: vec![entry("model.safetensors", sha)] }
    }

    #[test]
    fn the_newest_local_copy_newer_than_the_durable_one_wins_from_its_lowest_holder() {
        let held = vec![vec![held_step(40, "a"), held_step(30, "b")], vec![], vec![held_step(40, "a")]];
        assert_eq!(choose(&held, Some(20)), LocalChoice::Local { step: 40, holder: 0 });
        let spare_holds_it = vec![vec![], vec![held_step(40, "a")]];
        assert_eq!(choose(&spare_holds_it, None), LocalChoice::Local { step: 40, holder: 1 });
    }

    #[test]
    fn a_durable_checkpoint_as_new_as_the_local_one_is_used_instead() {
        let held = vec![vec![held_step(40, "a")]];
        let LocalChoice::Durable { reason } = choose(&held, Some(40)) else { panic!() };
        assert!(reason.contains("not newer than the durable one (step 40)"), "{reason}");
    }

    #[test]
    fn nothing_held_falls_back_to_the_durable_tier_and_says_so() {
        let LocalChoice::Durable { reason } = choose(&[vec![], vec![]], Some(3)) else { panic!() };
        assert!(reason.contains("no node holds"), "{reason}");
    }

    #[test]
    fn copies_of_a_step_that_differ_are_passed_over_for_an_older_agreed_one() {
        let held = vec![vec![held_step(40, "a"), held_step(30, "c")], vec![held_step(40, "b"), held_step(30, "c")]];
        assert_eq!(choose(&held, Some(20)), LocalChoice::Local { step: 30, holder: 0 });
        let LocalChoice::Durable { reason } = choose(&held, Some(30)) else { panic!() };
        assert!(reason.contains("step 40 differ between nodes"), "{reason}");
    }

    #[test]
    fn when_every_holder_of_the_newest_local_checkpoint_is_gone_they_are_named() {
        let (holders, nodes) = (vec!["n1".to_string(), "n2".to_string()], vec!["n3".to_string(), "n4".to_string()]);
        let gone = holders_gone(Some((60, &holders)), &nodes, Some(50)).unwrap();
        assert_eq!(gone, "every node that held the newest local checkpoint (step 60: n1, n2) is gone from this world");
        assert_eq!(holders_gone(Some((60, &holders)), &holders[1..], Some(50)), None, "n2 is still here");
        assert_eq!(holders_gone(Some((50, &holders)), &nodes, Some(50)), None, "not newer than the durable one");
        assert!(holders_gone(Some((60, &holders)), &nodes, None).is_some());
        assert_eq!(holders_gone(None, &nodes, None), None, "none was ever committed");
    }

    #[test]
    fn the_root_is_the_template_with_node_and_job_or_the_first_tmp_that_exists() {
        let run = Path::new("/shared/runs/a");
        let none = |_: &str| None;
        let root = resolve_root(Some("/scratch/{node}/{job}"), none, |_| true, "n2", Some("77"), run, 1000).unwrap();
        assert_eq!(root, Path::new("/scratch/n2/77/rekindle-local-1000").join(run_key(run)));
        let env = |v: &str| (v == "TMPDIR").then(|| "/tmp/job".to_string());
        let root = resolve_root(None, env, |_| true, "n1", None, run, 1000).unwrap();
        assert!(root.starts_with("/tmp/job/rekindle-local-1000"), "{}", root.display());
        let other = resolve_root(None, env, |_| true, "n1", None, run, 1001).unwrap();
        assert_ne!(root.parent(), other.parent(), "each user has a folder of their own");
        let root = resolve_root(None, env, |p| p == Path::new("/dev/shm"), "n1", None, run, 0).unwrap();
        assert!(root.starts_with("/dev/shm"), "a $TMPDIR that does not exist is passed over: {}", root.display());
        assert_eq!(resolve_root(None, none, |_| false, "n1", None, run, 0), Err(LocalPlaceError::NoDirectory));
        assert!(matches!(
            resolve_root(Some("/x/{job}"), none, |_| true, "n1", None, run, 0),
            Err(LocalPlaceError::NoJob { .. })
        ));
        assert_ne!(run_key(run), run_key(Path::new("/shared/runs/b")));
    }

    #[test]
    fn a_copy_fits_only_within_its_share_of_the_free_space() {
        assert_eq!(fits(50, 100, 0.5), Ok(()));
        let why = fits(51, 100, 0.5).unwrap_err();
        assert!(why.contains("local_max_share = 0.5"), "{why}");
        assert!(room_for(Path::new("/definitely/not/here"), 1, 1.0).is_ok(), "the nearest existing ancestor is asked");
    }

    #[test]
    fn a_copy_without_world_record_or_with_other_files_is_no_local_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let step = dir.path().join(step_dir_name(5));
        std::fs::create_dir(&step).unwrap();
        let (good, bad) = held(dir.path(), "/runs/a");
        assert!(good.is_empty());
        assert!(bad[0].reason.contains("no WORLD.json") && !bad[0].refused, "{:?}", bad);
        WorldRecord::new("/runs/a".into(), 5, vec![entry("x", "y")], vec!["n1".into()], 1)
            .write(&crate::confine::Dir::open(&step).unwrap())
            .unwrap();
        let (_, bad) = held(dir.path(), "/runs/a");
        assert!(bad[0].reason.contains("MANIFEST.json") && !bad[0].refused, "no manifest is named: {:?}", bad);
        std::fs::write(step.join(WORLD_FILE), b"{").unwrap();
        assert!(
            WorldRecord::read(&crate::confine::Dir::open(&step).unwrap())
                .unwrap_err()
                .to_string()
                .contains("unreadable")
        );
    }

    /// Found by the hostile local-root test at 200+ cases (issue #40): a 1
    /// GiB sparse MANIFEST.json made the copy merely unusable, so it was
    /// passed over without a failed `local_checkpoint` saying why.
    #[test]
    fn issue_40_a_copy_whose_manifest_is_over_its_bound_is_refused_not_passed_over() {
        let dir = tempfile::tempdir().unwrap();
        let step = dir.path().join(step_dir_name(5));
        std::fs::create_dir(&step).unwrap();
        WorldRecord::new("/runs/a".into(), 5, vec![entry("x", "y")], vec!["n1".into()], 1)
            .write(&crate::confine::Dir::open(&step).unwrap())
            .unwrap();
        let big = std::fs::File::create(step.join(super::super::MANIFEST_FILE)).unwrap();
        big.set_len(super::super::verify::MAX_MANIFEST_BYTES + 1).unwrap();
        let (good, bad) = held(dir.path(), "/runs/a");
        assert!(good.is_empty());
        assert!(bad[0].refused && bad[0].reason.contains("MANIFEST.json"), "{:?}", bad);
    }

    #[test]
    fn a_copy_that_names_another_run_or_no_run_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let step = dir.path().join(step_dir_name(5));
        std::fs::create_dir(&step).unwrap();
        WorldRecord::new("/runs/b".into(), 5, Vec::new(), vec!["n1".into()], 1)
            .write(&crate::confine::Dir::open(&step).unwrap())
            .unwrap();
        let (good, bad) = held(dir.path(), "/runs/a");
        assert!(good.is_empty());
        assert!(bad[0].refused, "{bad:?}");
        assert!(bad[0].reason.contains("names the run /runs/b, not this one (/runs/a)"), "{bad:?}");
        let old = r#"{"format_version": 1, "step": 5, "files": [], "holders": ["n1"], "world_size": 1,
            "committed_at": "2026-01-01T00:00:00Z"}"#;
        std::fs::write(step.join(WORLD_FILE), old).unwrap();
        let Err(Unfit::Refused(why)) = check_copy(&step, 5, "/runs/a") else { panic!("format 1 is refused") };
        assert!(why.contains("has format 1 (this rekindle reads 2"), "{why}");
    }

    #[test]
    fn a_world_record_that_is_a_fifo_or_huge_is_refused_without_blocking_or_reading_it() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join(WORLD_FILE);
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let Err(Unfit::Refused(why)) = WorldRecord::read(&crate::confine::Dir::open(dir.path()).unwrap()) else {
            panic!("a FIFO is refused")
        };
        assert!(why.contains("is a FIFO"), "{why}");
        std::fs::remove_file(&fifo).unwrap();
        let huge = std::fs::File::create(&fifo).unwrap();
        huge.set_len(1 << 30).unwrap();
        let Err(Unfit::Refused(why)) = WorldRecord::read(&crate::confine::Dir::open(dir.path()).unwrap()) else {
            panic!("1 GiB is refused")
        };
        assert!(why.contains("more than the 16777216 bytes"), "{why}");
    }
}
