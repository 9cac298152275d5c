//! The git side of publishing, with `git2` (libgit2; no `git` binary needed on
//! compute nodes).
//!
//! 1. Copy the artefacts (chosen by `select.rs`, read by `files.rs`: never
//!    through a link, never of a checkpoint) into a new commit on `[publish]
//!    branch` of the local clone at `[publish] repo`, under `runs/<run
//!    name>/`; what is left out is reported, not fatal. The commit is built
//!    from trees directly (the clone's index and other files are untouched;
//!    when the branch is checked out, only `runs/<run name>/` is refreshed,
//!    through a handle of the working tree (`worktree.rs`), and not at all
//!    when a symbolic link is on that path or under it. The commit and the
//!    push do not need the working tree; `worktree` in the report says why
//!    it was left as it was).
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
use super::files::{Reader, walk};
use super::select::Selection;

/// Everything one publish needs.
#[derive(Debug, Clone)]
pub struct PublishRequest<'a> {
    pub cfg: &'a PublishSection,
    pub run_name: &'a str,
    pub run_dir: &'a Path,
    /// `MANIFEST.json` of the newest checkpoint (published as `runs/<run>/MANIFEST.json`).
    pub newest_manifest: Option<PathBuf>,
    /// `[checkpoint] dir`, when set: nothing under it is published (nor
    /// under `<run dir>/checkpoints`), whatever path reaches it.
    pub checkpoint_dir: Option<PathBuf>,
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
    /// Files that were not published, each with the reason: a symbolic link
    /// (never followed), not a regular file, a type not on the allow-list,
    /// over `[publish] max_file_mib`, or of the checkpoints.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<RefusedFile>,
    /// The last push error, when not pushed (secrets redacted).
    pub last_error: Option<String>,
    /// Why the clone's checked-out `runs/<run>/` was not refreshed (a
    /// symbolic link on its path or under it); `None` when it was, or when
    /// the branch is not checked out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worktree: Option<String>,
}

/// Errors that prevent even the local commit.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("[publish] repo {path} is not a git repository ({reason}); clone your results repository there first")]
    NotARepo { path: PathBuf, reason: String },
    #[error("publishing into {path}: {what} failed: {reason}")]
    Git { path: PathBuf, what: &'static str, reason: String },
    #[error("cannot list the run directory {path} to publish it: {source}")]
    Read { path: PathBuf, source: std::io::Error },
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

/// Where an artefact comes from.
enum Source {
    /// A file of the run directory, by its path relative to it.
    RunDir,
    /// The newest checkpoint's manifest.
    Manifest(PathBuf),
}

/// What one publish copies: each artefact's path under `runs/<run>/` and
/// where it comes from, the entries refused on the way, and the reader.
struct Selected {
    sources: Vec<(String, Source)>,
    refused: Vec<RefusedFile>,
    reader: Reader,
}

/// The artefacts to publish (module header; the rules are `select.rs`'s).
fn select<'a>(req: &PublishRequest<'a>) -> Result<Selected, PublishError> {
    let inside = req.checkpoint_dir.as_deref().and_then(|dir| relative_inside(req.run_dir, dir));
    let (selection, mut refused) = Selection::new(&req.cfg.include, inside);
    // The run directory, opened once: the walk and every read go through it.
    let root = crate::confine::Dir::open(req.run_dir)
        .map_err(|source| PublishError::Read { path: req.run_dir.to_path_buf(), source })?;
    let (found, walk_refused) =
        walk(&root, &selection).map_err(|source| PublishError::Read { path: req.run_dir.to_path_buf(), source })?;
    refused.extend(walk_refused);
    let mut sources = Vec::new();
    if let Some(manifest) = &req.newest_manifest {
        sources.push(("MANIFEST.json".to_string(), Source::Manifest(manifest.clone())));
    }
    let manifest_given = req.newest_manifest.is_some();
    sources.extend(
        found.into_iter().filter(|rel| !(manifest_given && rel == "MANIFEST.json")).map(|rel| (rel, Source::RunDir)),
    );
    let mut checkpoint_dirs = vec![req.run_dir.join("checkpoints")];
    checkpoint_dirs.extend(req.checkpoint_dir.clone());
    let reader = Reader::new(root, req.cfg.max_file_mib.saturating_mul(1 << 20), checkpoint_dirs);
    Ok(Selected { sources, refused, reader })
}

/// The components of `dir` relative to `root` when it lies inside it (both
/// resolved: a checkpoint directory named through a link still counts).
fn relative_inside(root: &Path, dir: &Path) -> Option<Vec<String>> {
    let root = std::fs::canonicalize(root).ok()?;
    let dir = std::fs::canonicalize(dir).or_else(|_| std::path::absolute(dir)).ok()?;
    let rel = dir.strip_prefix(&root).ok()?;
    Some(rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect())
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

    let Selected { sources, mut refused, reader } = select(req)?;
    let mut tree_oid = match &base_tree {
        Some(t) => t.id(),
        None => repo.treebuilder(None).and_then(|b| b.write()).map_err(git("creating a tree"))?,
    };
    let mut files = Vec::new();
    for (rel, source) in sources {
        let read = match &source {
            Source::RunDir => reader.read_inside(&rel).map(Some),
            Source::Manifest(path) => reader.read_manifest(&rel, path),
        };
        let bytes = match read {
            Ok(Some(bytes)) => bytes,
            Ok(None) => continue,
            Err(reason) => {
                refused.push(RefusedFile { file: rel, reason });
                continue;
            }
        };
        let blob = repo.blob(&bytes).map_err(git("writing a blob"))?;
        let mut components = vec!["runs", req.run_name];
        components.extend(rel.split('/'));
        let base = repo.find_tree(tree_oid).map_err(git("reading the tree"))?;
        tree_oid = upsert(&repo, Some(&base), &components, blob).map_err(git("building the tree"))?;
        files.push(rel);
    }
    for r in &refused {
        tracing::warn!(file = %r.file, reason = %r.reason, "not publishing");
    }

    let mut report = PublishReport { files, refused, ..Default::default() };
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
        report.worktree = super::worktree::refresh(&repo, &branch_ref, req.run_name, base_tree.as_ref(), &tree);
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
    // A link on the way was reported with the commit, and is logged again.
    let before = ours.tree().ok();
    let _ = super::worktree::refresh(repo, &branch_ref, req.run_name, before.as_ref(), &tree);
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
}
