//! The git side of publishing, with `git2` (libgit2; no `git` binary needed on
//! compute nodes).
//!
//! 1. Copy the artefacts into a new commit on `[publish] branch` of the local
//!    clone at `[publish] repo`, under `runs/<run name>/`. The commit is built
//!    from trees directly (the clone's index and other files are untouched;
//!    when the branch is checked out, only `runs/<run name>/` is refreshed).
//! 2. Push the branch — which also pushes commits earlier runs could not push.
//!    Failures are retried with exponential backoff, never past the deadline.
//!    A push rejected because the remote moved on is reconciled by fetching
//!    and merging (runs write disjoint directories, so this never conflicts).
//!
//! Credentials come from ssh-agent (ssh remotes) and git credential helpers
//! (https); URLs are redacted before they reach a log line or an event.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use git2::{Cred, CredentialType, ObjectType, Oid, PushOptions, RemoteCallbacks, Repository, Signature, Tree};
use serde::Serialize;

use crate::config::PublishSection;
use crate::telemetry::RefusedFile;

use super::backoff::next_wait;

/// Everything one publish needs.
#[derive(Debug, Clone)]
pub struct PublishRequest<'a> {
    pub cfg: &'a PublishSection,
    pub run_name: &'a str,
    pub run_dir: &'a Path,
    /// `MANIFEST.json` of the newest checkpoint (published as `runs/<run>/MANIFEST.json`).
    pub newest_manifest: Option<PathBuf>,
    pub step: u64,
    pub job_id: Option<String>,
    pub node: String,
    /// Why the run exited: `finished`, `SIGTERM`, …
    pub reason: String,
    /// No push attempt starts after this.
    pub deadline: Option<Instant>,
}

/// What publishing did (recorded in `events.jsonl`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct PublishReport {
    /// The new commit, or `None` when nothing changed since the last publish.
    pub commit: Option<String>,
    pub pushed: bool,
    pub attempts: u32,
    pub files: Vec<String>,
    /// Files that were not published, each with the reason (type not on the
    /// allow-list, over `[publish] max_file_mib`, or under `checkpoints/`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<RefusedFile>,
    /// The last push error, when not pushed (secrets redacted).
    pub last_error: Option<String>,
}

/// Errors that prevent even the local commit.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("[publish] repo {path} is not a git repository ({reason}); clone your results repository there first")]
    NotARepo { path: PathBuf, reason: String },
    #[error("publishing into {path}: {what} failed: {reason}")]
    Git { path: PathBuf, what: &'static str, reason: String },
    #[error("cannot read {path} to publish it: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("[publish] include pattern `{pattern}` is invalid: {reason}")]
    Pattern { pattern: String, reason: String },
}

/// The kinds of file publishing may copy: small text artefacts and figures.
/// An allow-list, not a deny-list of weight formats: a file of any other
/// type (weights under any name, archives, binaries, pickles) is never pushed.
pub const PUBLISHABLE_EXTENSIONS: [&str; 13] =
    ["json", "jsonl", "toml", "yaml", "yml", "txt", "md", "csv", "tsv", "log", "html", "svg", "png"];

/// Whether the run-directory file `rel` (of `size` bytes) may be published,
/// or why not. Pure: the whole publishing policy, tested without a disk.
pub fn admit(rel: &str, size: u64, max_bytes: u64) -> Result<(), String> {
    if rel.starts_with("checkpoints/") {
        return Err("checkpoint contents are never published (only the newest MANIFEST.json is)".into());
    }
    let ext = Path::new(rel).extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    match ext {
        Some(ext) if PUBLISHABLE_EXTENSIONS.contains(&ext.as_str()) => {}
        _ => {
            return Err(format!(
                "not a publishable type (allowed: .{}); weights and other binary files are never published",
                PUBLISHABLE_EXTENSIONS.join(", .")
            ));
        }
    }
    if size > max_bytes {
        return Err(format!(
            "{size} bytes is over [publish] max_file_mib = {} MiB; raise it or leave the file out of [publish] include",
            max_bytes >> 20
        ));
    }
    Ok(())
}

/// Removes credentials from a URL (`https://user:token@host/x` → `https://***@host/x`).
pub fn redact_url(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => match rest.split_once('@') {
            Some((_, host)) if !rest.split('/').next().unwrap_or("").is_empty() && rest.find('@') < rest.find('/') => {
                format!("{scheme}://***@{host}")
            }
            _ => url.to_string(),
        },
        None => url.to_string(),
    }
}

fn redact_message(msg: &str) -> String {
    msg.split_whitespace()
        .map(|w| if w.contains("://") { redact_url(w) } else { w.to_string() })
        .collect::<Vec<_>>()
        .join(" ")
}

/// (path in the repository under `runs/<run>/`, file in the run directory).
type Artefact = (String, PathBuf);

/// The artefacts to publish, and the files left out.
fn collect_files(req: &PublishRequest<'_>) -> Result<(Vec<Artefact>, Vec<RefusedFile>), PublishError> {
    let mut candidates = Vec::new();
    for name in ["config.toml", "metrics.jsonl", "events.jsonl", "summary.json", "gpu_stats.jsonl"] {
        let path = req.run_dir.join(name);
        if path.is_file() {
            candidates.push((name.to_string(), path));
        }
    }
    if let Some(manifest) = &req.newest_manifest
        && manifest.is_file()
    {
        candidates.push(("MANIFEST.json".to_string(), manifest.clone()));
    }
    for pattern in &req.cfg.include {
        let full = req.run_dir.join(pattern);
        let paths = glob::glob(&full.to_string_lossy())
            .map_err(|e| PublishError::Pattern { pattern: pattern.clone(), reason: e.to_string() })?;
        for path in paths.flatten() {
            let Ok(rel) = path.strip_prefix(req.run_dir) else { continue };
            let rel = rel.to_string_lossy().into_owned();
            if path.is_file() && !candidates.iter().any(|(r, _)| *r == rel) {
                candidates.push((rel, path));
            }
        }
    }
    let max_bytes = req.cfg.max_file_mib.saturating_mul(1 << 20);
    let (mut files, mut refused) = (Vec::new(), Vec::new());
    for (rel, path) in candidates {
        let size = std::fs::metadata(&path).map_err(|source| PublishError::Read { path: path.clone(), source })?.len();
        match admit(&rel, size, max_bytes) {
            Ok(()) => files.push((rel, path)),
            Err(reason) => {
                tracing::warn!(file = %rel, %reason, "not publishing");
                refused.push(RefusedFile { file: rel, reason });
            }
        }
    }
    Ok((files, refused))
}

/// Returns `base` with `blob` at `path` (creating intermediate trees).
fn upsert(repo: &Repository, base: Option<&Tree<'_>>, path: &[&str], blob: Oid) -> Result<Oid, git2::Error> {
    let mut builder = repo.treebuilder(base)?;
    if let [name] = path {
        builder.insert(name, blob, 0o100644)?;
    } else {
        let sub = match base.and_then(|t| t.get_name(path[0])) {
            Some(entry) if entry.kind() == Some(ObjectType::Tree) => Some(repo.find_tree(entry.id())?),
            _ => None,
        };
        let oid = upsert(repo, sub.as_ref(), &path[1..], blob)?;
        builder.insert(path[0], oid, 0o040000)?;
    }
    builder.write()
}

/// Replaces (or removes) the subtree at `path` of `base` by `subtree`.
fn graft(repo: &Repository, base: &Tree<'_>, path: &[&str], subtree: Option<Oid>) -> Result<Oid, git2::Error> {
    let mut builder = repo.treebuilder(Some(base))?;
    if let [name] = path {
        match subtree {
            Some(oid) => {
                builder.insert(name, oid, 0o040000)?;
            }
            None => {
                let _ = builder.remove(name);
            }
        }
    } else {
        let sub = match base.get_name(path[0]) {
            Some(entry) if entry.kind() == Some(ObjectType::Tree) => repo.find_tree(entry.id())?,
            _ => repo.find_tree(repo.treebuilder(None)?.write()?)?,
        };
        let oid = graft(repo, &sub, &path[1..], subtree)?;
        builder.insert(path[0], oid, 0o040000)?;
    }
    builder.write()
}

fn message(req: &PublishRequest<'_>) -> String {
    let template =
        req.cfg.message.clone().unwrap_or_else(|| "rekindle: {run} at step {step} (job {job}, {reason})".to_string());
    template
        .replace("{run}", req.run_name)
        .replace("{step}", &req.step.to_string())
        .replace("{job}", req.job_id.as_deref().unwrap_or("none"))
        .replace("{reason}", &req.reason)
        .replace("{node}", &req.node)
}

/// Commits the artefacts locally, then pushes within the deadline.
///
/// An error means not even the local commit could be made; push failures
/// are reported in the returned [`PublishReport`] (the commit stays local).
pub fn publish(req: &PublishRequest<'_>) -> Result<PublishReport, PublishError> {
    let repo_path = req.cfg.repo.clone().unwrap_or_default();
    let repo = Repository::open(&repo_path)
        .map_err(|e| PublishError::NotARepo { path: repo_path.clone(), reason: e.message().to_string() })?;
    let git = |what: &'static str| {
        let path = repo_path.clone();
        move |e: git2::Error| PublishError::Git { path, what, reason: redact_message(e.message()) }
    };
    let branch_ref = format!("refs/heads/{}", req.cfg.branch);
    let remote_ref = format!("refs/remotes/{}/{}", req.cfg.remote, req.cfg.branch);

    // Parent: the local branch, else the remote-tracking branch, else none (unborn).
    let parent = match repo.find_reference(&branch_ref).or_else(|_| repo.find_reference(&remote_ref)) {
        Ok(r) => Some(r.peel_to_commit().map_err(git("reading the branch tip"))?),
        Err(_) => None,
    };
    let base_tree = parent.as_ref().map(|c| c.tree()).transpose().map_err(git("reading the tree"))?;

    let (files, refused) = collect_files(req)?;
    let mut tree_oid = match &base_tree {
        Some(t) => t.id(),
        None => repo.treebuilder(None).and_then(|b| b.write()).map_err(git("creating a tree"))?,
    };
    for (rel, path) in &files {
        let bytes = std::fs::read(path).map_err(|source| PublishError::Read { path: path.clone(), source })?;
        let blob = repo.blob(&bytes).map_err(git("writing a blob"))?;
        let mut components = vec!["runs", req.run_name];
        components.extend(rel.split('/'));
        let base = repo.find_tree(tree_oid).map_err(git("reading the tree"))?;
        tree_oid = upsert(&repo, Some(&base), &components, blob).map_err(git("building the tree"))?;
    }

    let mut report =
        PublishReport { files: files.iter().map(|(r, _)| r.clone()).collect(), refused, ..Default::default() };
    if base_tree.as_ref().map(|t| t.id()) != Some(tree_oid) {
        let tree = repo.find_tree(tree_oid).map_err(git("reading the tree"))?;
        let sig = repo
            .signature()
            .or_else(|_| Signature::now("rekindle", "rekindle@localhost"))
            .map_err(git("making a signature"))?;
        let parents: Vec<&git2::Commit<'_>> = parent.iter().collect();
        let oid =
            repo.commit(Some(&branch_ref), &sig, &sig, &message(req), &tree, &parents).map_err(git("committing"))?;
        report.commit = Some(oid.to_string());
        refresh_checkout(&repo, &branch_ref, req.run_name);
    } else if repo.find_reference(&branch_ref).is_err() {
        // Nothing new, but the local branch did not exist yet: create it.
        if let Some(p) = &parent {
            repo.reference(&branch_ref, p.id(), true, "rekindle: track remote branch")
                .map_err(git("creating branch"))?;
        }
    }
    push_with_retries(&repo, req, &mut report);
    Ok(report)
}

/// When the publish branch is checked out, make `runs/<run>/` in the working
/// tree and index match the new commit (nothing else is touched).
fn refresh_checkout(repo: &Repository, branch_ref: &str, run_name: &str) {
    if repo.is_bare() {
        return;
    }
    let on_branch = repo.head().ok().and_then(|h| h.name().ok().map(|n| n == branch_ref)).unwrap_or(false);
    if on_branch {
        let mut checkout = git2::build::CheckoutBuilder::new();
        checkout.force().path(format!("runs/{run_name}"));
        if let Err(e) = repo.checkout_head(Some(&mut checkout)) {
            tracing::warn!(error = %e.message(), "published commit made, but refreshing the working tree failed");
        }
    }
}

fn callbacks<'a>(config: &'a git2::Config, tries: &'a RefCell<u32>) -> RemoteCallbacks<'a> {
    let mut cbs = RemoteCallbacks::new();
    cbs.credentials(move |url, username, allowed| {
        // libgit2 asks again after a refused credential: stop after a few.
        *tries.borrow_mut() += 1;
        if *tries.borrow() > 3 {
            return Err(git2::Error::from_str("credentials refused (ssh-agent / credential helper)"));
        }
        if allowed.contains(CredentialType::SSH_KEY) {
            Cred::ssh_key_from_agent(username.unwrap_or("git"))
        } else if allowed.contains(CredentialType::USER_PASS_PLAINTEXT) {
            Cred::credential_helper(config, url, username)
        } else {
            Cred::default()
        }
    });
    cbs
}

fn push_once(repo: &Repository, req: &PublishRequest<'_>) -> Result<(), String> {
    let mut remote = repo.find_remote(&req.cfg.remote).map_err(|e| redact_message(e.message()))?;
    let config = repo.config().map_err(|e| e.message().to_string())?;
    let tries = RefCell::new(0);
    let rejection = RefCell::new(None::<String>);
    let mut cbs = callbacks(&config, &tries);
    cbs.push_update_reference(|refname, status| {
        if let Some(msg) = status {
            *rejection.borrow_mut() = Some(format!("{refname} rejected: {msg}"));
        }
        Ok(())
    });
    let mut opts = PushOptions::new();
    opts.remote_callbacks(cbs);
    let spec = format!("refs/heads/{0}:refs/heads/{0}", req.cfg.branch);
    remote.push(&[spec.as_str()], Some(&mut opts)).map_err(|e| redact_message(e.message()))?;
    drop(opts);
    match rejection.into_inner() {
        Some(msg) => Err(redact_message(&msg)),
        None => Ok(()),
    }
}

/// Fetches the remote branch and, when it moved on, merges it under our commits
/// (our `runs/<run>/` wins; runs write disjoint directories).
fn reconcile(repo: &Repository, req: &PublishRequest<'_>) -> Result<(), String> {
    let msg = |e: git2::Error| redact_message(e.message());
    let mut remote = repo.find_remote(&req.cfg.remote).map_err(msg)?;
    let config = repo.config().map_err(msg)?;
    let tries = RefCell::new(0);
    let mut fetch = git2::FetchOptions::new();
    fetch.remote_callbacks(callbacks(&config, &tries));
    let remote_ref = format!("refs/remotes/{}/{}", req.cfg.remote, req.cfg.branch);
    let spec = format!("+refs/heads/{}:{remote_ref}", req.cfg.branch);
    remote.fetch(&[spec.as_str()], Some(&mut fetch), None).map_err(msg)?;
    let Ok(theirs) = repo.find_reference(&remote_ref).and_then(|r| r.peel_to_commit()) else { return Ok(()) };
    let branch_ref = format!("refs/heads/{}", req.cfg.branch);
    let ours = repo.find_reference(&branch_ref).and_then(|r| r.peel_to_commit()).map_err(msg)?;
    if ours.id() == theirs.id() || repo.graph_descendant_of(ours.id(), theirs.id()).map_err(msg)? {
        return Ok(());
    }
    let path = ["runs", req.run_name];
    let our_sub = ours.tree().map_err(msg)?.get_path(Path::new(&format!("runs/{}", req.run_name))).ok().map(|e| e.id());
    let merged = graft(repo, &theirs.tree().map_err(msg)?, &path, our_sub).map_err(msg)?;
    let tree = repo.find_tree(merged).map_err(msg)?;
    let sig = repo.signature().or_else(|_| Signature::now("rekindle", "rekindle@localhost")).map_err(msg)?;
    let text = format!("rekindle: merge {} into {} for run {}", remote_ref, req.cfg.branch, req.run_name);
    repo.commit(Some(&branch_ref), &sig, &sig, &text, &tree, &[&ours, &theirs]).map_err(msg)?;
    refresh_checkout(repo, &branch_ref, req.run_name);
    Ok(())
}

/// The least time a push (or the fetch that reconciles) needs; with less left
/// before the deadline it is not started.
const MIN_NETWORK_TIME: Duration = Duration::from_millis(500);

/// Bounds libgit2's network waits (connect, and each read or write) by the time
/// left before the deadline, so a silent remote cannot eat the grace period.
/// Called before every network operation, as the time left shrinks.
fn bound_network_waits(deadline: Option<Instant>) {
    let ms = deadline
        .map(|d| d.saturating_duration_since(Instant::now()).as_millis().clamp(1, 10_000) as i32)
        .unwrap_or(10_000);
    // SAFETY: plain libgit2 global option setters; publishing is the only
    // libgit2 user, on this thread, and no network operation is under way.
    unsafe {
        let _ = git2::opts::set_server_connect_timeout_in_milliseconds(ms);
        let _ = git2::opts::set_server_timeout_in_milliseconds(ms);
    }
}

fn push_with_retries(repo: &Repository, req: &PublishRequest<'_>, report: &mut PublishReport) {
    let cfg = req.cfg;
    let mut attempt = 1;
    while let Some(wait) = next_wait(
        attempt,
        cfg.max_attempts,
        cfg.retry_initial,
        cfg.retry_max,
        Instant::now(),
        req.deadline,
        MIN_NETWORK_TIME,
    ) {
        std::thread::sleep(wait);
        report.attempts = attempt;
        bound_network_waits(req.deadline);
        match push_once(repo, req) {
            Ok(()) => {
                report.pushed = true;
                report.last_error = None;
                tracing::info!(attempt, remote = %cfg.remote, branch = %cfg.branch, "published results");
                return;
            }
            Err(e) => {
                tracing::warn!(attempt, error = %e, "push failed");
                report.last_error = Some(e);
                if req.deadline.is_some_and(|d| Instant::now() + MIN_NETWORK_TIME > d) {
                    break;
                }
                bound_network_waits(req.deadline);
                if let Err(e) = reconcile(repo, req) {
                    tracing::debug!(error = %e, "fetch to reconcile failed");
                }
            }
        }
        attempt += 1;
    }
    tracing::warn!(
        attempts = report.attempts,
        "results committed locally but not pushed; the next run pushes them first"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_redacted_from_urls() {
        assert_eq!(redact_url("https://user:s3cret@example.com/r.git"), "https://***@example.com/r.git");
        assert_eq!(redact_url("https://example.com/a@b"), "https://example.com/a@b");
        assert_eq!(redact_url("/srv/git/results.git"), "/srv/git/results.git");
        assert_eq!(
            redact_message("failed to push to https://tok@github.com/x.git: 403"),
            "failed to push to https://***@github.com/x.git: 403"
        );
    }

    #[test]
    fn only_allowed_types_under_the_size_cap_are_published() {
        const MIB: u64 = 1 << 20;
        for ok in ["metrics.jsonl", "samples/a.txt", "plots/loss.svg", "plots/LOSS.PNG", "notes.md", "eval.csv"] {
            assert_eq!(admit(ok, 10, MIB), Ok(()), "{ok}");
        }
        for weights in ["model.safetensors", "x/y.pt", "w.bin", "opt.ckpt", "a.npz", "m.gguf", "w.pkl", "w.h5"] {
            let why = admit(weights, 10, MIB).unwrap_err();
            assert!(why.contains("not a publishable type"), "{weights}: {why}");
        }
        for unknown in ["Makefile", "archive.tar.gz", "core", "data.parquet", "run.jsonl.bak"] {
            assert!(admit(unknown, 10, MIB).is_err(), "a file of unknown type is never pushed: {unknown}");
        }
        let why = admit("checkpoints/step-1/state.json", 10, MIB).unwrap_err();
        assert!(why.contains("checkpoint contents"), "{why}");
        assert_eq!(admit("metrics.jsonl", MIB, MIB), Ok(()), "the cap itself is allowed");
        let why = admit("metrics.jsonl", MIB + 1, MIB).unwrap_err();
        assert!(why.contains("over [publish] max_file_mib = 1 MiB"), "{why}");
    }
}
