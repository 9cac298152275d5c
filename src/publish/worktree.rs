//! The clone's working tree after a publish: when the publish branch is
//! checked out, `runs/<run>/` there and in the index are made to match the
//! new commit, and nothing else is touched.
//!
//! All of it goes through one handle of the clone's working tree
//! ([`crate::confine::Dir`]), never by path: each published file is
//! written to a temporary file (`O_EXCL`) in its directory's handle and
//! renamed over its name, so a link left at a file's name is replaced, not
//! written through; a directory on the way is reached with no link in any
//! component, so `runs/<run> -> /elsewhere` (or a link deeper down, put
//! there before or while the refresh runs) is refused, never followed.
//! Before anything is written the whole of `runs/<run>/` is looked at for
//! a link ([`link_on_the_way`]): then nothing is written, and the reason
//! goes into the report (`worktree`), and so does a tree that holds
//! anything but regular files there or names a `.git`. Files the previous
//! commit had and the new one has not are removed first; files git never
//! tracked are left alone. Once every file is in place, the index entries
//! under `runs/<run>/` are set from the new tree, with the stat of the
//! files as written, so `git status` is clean after it.
//!
//! The commit and the push never need the working tree (`git.rs`).

use std::collections::HashSet;
use std::fs::Permissions;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use git2::{IndexEntry, IndexTime, ObjectType, Oid, Repository, Tree};

use crate::confine::TempFile;
use crate::confine::{Dir, Kind};

/// When `branch_ref` is checked out, makes `runs/<run_name>/` of the
/// working tree and the index match `new` (the files of `old` that `new`
/// lacks removed). `Some(why)` when it was left as it was, and why.
pub(super) fn refresh(
    repo: &Repository,
    branch_ref: &str,
    run_name: &str,
    old: Option<&Tree<'_>>,
    new: &Tree<'_>,
) -> Option<String> {
    let workdir = repo.workdir()?;
    let on_branch = repo.head().ok().and_then(|h| h.name().ok().map(|n| n == branch_ref)).unwrap_or(false);
    if !on_branch {
        return None;
    }
    let left = |why: String| {
        tracing::warn!(%why, "publishing leaves the clone's working tree as it is");
        Some(why)
    };
    let root = match Dir::open(workdir) {
        Ok(root) => root,
        Err(e) => return left(format!("cannot open the clone's working tree: {e}")),
    };
    let base: PathBuf = ["runs"].into_iter().chain(run_name.split('/').filter(|p| !p.is_empty())).collect();
    if let Some(link) = link_on_the_way(&root, &base) {
        return left(format!(
            "{} in the clone is a symbolic link: its working tree is not refreshed, since writing there would \
             go through it, outside the clone (the commit and the push are made without it); replace the link \
             with a directory to have runs/{run_name}/ checked out again",
            link.display()
        ));
    }
    match write_tree(repo, &root, &base, old, new) {
        Ok(()) => None,
        Err(e) => {
            left(format!("published commit made, but refreshing runs/{run_name}/ in the working tree failed: {e}"))
        }
    }
}

/// The blobs of `tree` under `base`, as (path relative to the working
/// tree, blob, file mode).
fn blobs_under(repo: &Repository, tree: &Tree<'_>, base: &Path) -> Vec<(PathBuf, Oid, i32)> {
    let Ok(entry) = tree.get_path(base) else { return Vec::new() };
    let Ok(sub) = repo.find_tree(entry.id()) else { return Vec::new() };
    let mut out = Vec::new();
    let _ = sub.walk(git2::TreeWalkMode::PreOrder, |dir, e| {
        if e.kind() == Some(ObjectType::Blob)
            && let Ok(name) = e.name()
        {
            out.push((base.join(dir).join(name), e.id(), e.filemode()));
        }
        git2::TreeWalkResult::Ok
    });
    out
}

fn write_tree(
    repo: &Repository,
    root: &Dir,
    base: &Path,
    old: Option<&Tree<'_>>,
    new: &Tree<'_>,
) -> Result<(), String> {
    let blobs = blobs_under(repo, new, base);
    // Checked before anything is written: regular files only, each named
    // by plain components, none of them `.git` (what libgit2's checkout
    // refused up front).
    for (rel, _, mode) in &blobs {
        if !matches!(*mode, 0o100644 | 0o100755) {
            return Err(format!("{} is not a regular file in the commit (mode {mode:o})", rel.display()));
        }
        if !rel.components().all(|c| matches!(c, Component::Normal(n) if !n.eq_ignore_ascii_case(".git"))) {
            return Err(format!("{} is not a path rekindle writes in a working tree", rel.display()));
        }
    }
    // What the previous commit had there and this one has not goes first
    // (a file that became a directory leaves room for it).
    let kept: HashSet<&PathBuf> = blobs.iter().map(|(rel, _, _)| rel).collect();
    let gone: Vec<PathBuf> = old
        .map(|t| blobs_under(repo, t, base))
        .unwrap_or_default()
        .into_iter()
        .map(|(rel, _, _)| rel)
        .filter(|rel| !kept.contains(rel))
        .collect();
    for rel in &gone {
        let _ = root.remove_file(rel);
    }
    let mut entries = Vec::with_capacity(blobs.len());
    for (rel, id, mode) in &blobs {
        let parent = rel.parent().unwrap_or(Path::new(""));
        make_dirs(root, parent).map_err(|e| e.to_string())?;
        let blob = repo.find_blob(*id).map_err(|e| e.message().to_string())?;
        let dir = root.open_dir(parent).map_err(|e| e.to_string())?;
        let mut tmp = TempFile::new_in(&dir, ".rekindle-publish-").map_err(|e| e.to_string())?;
        std::io::Write::write_all(&mut tmp, blob.content()).map_err(|e| e.to_string())?;
        if *mode == 0o100755 {
            // Executable wherever it is readable, as git checks one out.
            let m = tmp.file.metadata().map_err(|e| e.to_string())?.permissions().mode();
            tmp.file.set_permissions(Permissions::from_mode(m | ((m & 0o444) >> 2))).map_err(|e| e.to_string())?;
        }
        tmp.persist(rel.file_name().unwrap_or_default()).map_err(|e| e.to_string())?;
        let meta = root.symlink_metadata(rel).map_err(|e| e.to_string())?;
        entries.push(index_entry(rel, *id, *mode, &meta));
    }
    // The index last, once every file is in place.
    let mut index = repo.index().map_err(|e| e.message().to_string())?;
    for rel in &gone {
        let _ = index.remove_path(rel);
    }
    for entry in &entries {
        index.add(entry).map_err(|e| e.message().to_string())?;
    }
    index.write().map_err(|e| e.message().to_string())
}

/// Makes `rel` and the directories above it, through `root`.
fn make_dirs(root: &Dir, rel: &Path) -> std::io::Result<()> {
    let mut at = PathBuf::new();
    for part in rel.components() {
        at.push(part);
        if !root.own_dir(&at)? {
            match root.create_dir(&at, 0o777) {
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => root.own_dir(&at).map(|_| ())?,
                other => other?,
            }
        }
    }
    Ok(())
}

/// The index entry of the file `rel` just written, as `git add` would make it.
fn index_entry(rel: &Path, id: Oid, mode: i32, meta: &std::fs::Metadata) -> IndexEntry {
    use std::os::unix::fs::MetadataExt;
    IndexEntry {
        ctime: IndexTime::new(meta.ctime() as i32, meta.ctime_nsec() as u32),
        mtime: IndexTime::new(meta.mtime() as i32, meta.mtime_nsec() as u32),
        dev: meta.dev() as u32,
        ino: meta.ino() as u32,
        mode: mode as u32,
        uid: meta.uid(),
        gid: meta.gid(),
        file_size: meta.len() as u32,
        id,
        flags: 0,
        flags_extended: 0,
        path: rel.to_string_lossy().as_bytes().to_vec(),
    }
}

/// The first symbolic link (relative to the working tree) that refreshing
/// `base` would meet: on its path (`runs`, `runs/<run>`) or anywhere under
/// it. Listed through the handle, without following links.
fn link_on_the_way(root: &Dir, base: &Path) -> Option<PathBuf> {
    let mut at = PathBuf::new();
    for part in base.components() {
        at.push(part);
        match root.symlink_metadata(&at) {
            Ok(meta) if meta.file_type().is_symlink() => return Some(at),
            Ok(meta) if meta.is_dir() => {}
            // Missing, or a file the refresh refuses in place: nothing
            // below it to go through.
            _ => return None,
        }
    }
    let mut todo = vec![at];
    while let Some(dir) = todo.pop() {
        for entry in root.entries(&dir).into_iter().flatten() {
            let rel = dir.join(&entry.name);
            match entry.kind {
                Kind::Symlink => return Some(rel),
                Kind::Dir => todo.push(rel),
                _ => {}
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tree holding `runs/demo/` with `files` (name, bytes, mode).
    fn tree_of<'r>(repo: &'r Repository, files: &[(&str, &[u8], i32)]) -> Tree<'r> {
        let mut demo = repo.treebuilder(None).unwrap();
        for (name, bytes, mode) in files {
            demo.insert(name, repo.blob(bytes).unwrap(), *mode).unwrap();
        }
        let mut runs = repo.treebuilder(None).unwrap();
        runs.insert("demo", demo.write().unwrap(), 0o040000).unwrap();
        let mut top = repo.treebuilder(None).unwrap();
        top.insert("runs", runs.write().unwrap(), 0o040000).unwrap();
        repo.find_tree(top.write().unwrap()).unwrap()
    }

    #[test]
    fn the_refresh_writes_the_new_files_removes_the_gone_and_leaves_the_index_clean() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = Repository::init(tmp.path()).unwrap();
        let old = tree_of(&repo, &[("a.txt", b"a", 0o100644), ("gone.txt", b"g", 0o100644)]);
        let new = tree_of(&repo, &[("a.txt", b"A", 0o100644), ("run.sh", b"#!/bin/sh\n", 0o100755)]);
        let sig = git2::Signature::now("t", "t@example.com").unwrap();
        repo.commit(Some("HEAD"), &sig, &sig, "m", &new, &[]).unwrap();
        let branch = repo.head().unwrap().name().unwrap().to_string();
        let demo = tmp.path().join("runs/demo");
        std::fs::create_dir_all(&demo).unwrap();
        std::fs::write(demo.join("gone.txt"), "g").unwrap();
        std::fs::write(demo.join("mine.txt"), "never tracked").unwrap();
        assert_eq!(refresh(&repo, &branch, "demo", Some(&old), &new), None);
        assert_eq!(std::fs::read(demo.join("a.txt")).unwrap(), b"A");
        assert!(!demo.join("gone.txt").exists(), "what the new commit lacks is removed");
        assert_eq!(std::fs::read(demo.join("mine.txt")).unwrap(), b"never tracked", "untracked files stay");
        let mode = std::fs::metadata(demo.join("run.sh")).unwrap().permissions().mode();
        assert_ne!(mode & 0o100, 0, "an executable blob is checked out executable: {mode:o}");
        let mut opts = git2::StatusOptions::new();
        opts.include_untracked(false);
        let dirty: Vec<String> = repo
            .statuses(Some(&mut opts))
            .unwrap()
            .iter()
            .filter(|e| e.status() != git2::Status::CURRENT)
            .map(|e| format!("{:?} {:?}", e.path(), e.status()))
            .collect();
        assert!(dirty.is_empty(), "git status is clean: {dirty:?}");
    }

    #[test]
    fn a_tree_holding_a_link_is_refused_before_anything_is_written() {
        // (libgit2 refuses to build a tree naming `.git`; one fetched from
        // elsewhere is refused by the same check as a link.)
        let tmp = tempfile::tempdir().unwrap();
        let repo = Repository::init(tmp.path()).unwrap();
        let sig = git2::Signature::now("t", "t@example.com").unwrap();
        for files in [&[("a.txt", &b"a"[..], 0o100644), ("l", b"/etc", 0o120000)][..], &[("l", b"/etc", 0o120000)]] {
            let new = tree_of(&repo, files);
            let parent = repo.head().ok().and_then(|h| h.peel_to_commit().ok());
            repo.commit(Some("HEAD"), &sig, &sig, "m", &new, &parent.iter().collect::<Vec<_>>()).unwrap();
            let branch = repo.head().unwrap().name().unwrap().to_string();
            let why = refresh(&repo, &branch, "demo", None, &new).expect("refused");
            assert!(why.contains("runs/demo/"), "{why}");
            assert!(!tmp.path().join("runs/demo/a.txt").exists(), "nothing written: {why}");
        }
    }

    #[test]
    fn a_link_on_the_way_to_the_runs_checkout_or_under_it_is_found_without_following_it() {
        let tmp = tempfile::tempdir().unwrap();
        let (clone, elsewhere) = (tmp.path().join("clone"), tmp.path().join("elsewhere"));
        std::fs::create_dir_all(elsewhere.join("deep")).unwrap();
        std::fs::create_dir_all(&clone).unwrap();
        let root = Dir::open(&clone).unwrap();
        let demo = Path::new("runs/demo");
        assert_eq!(link_on_the_way(&root, demo), None, "nothing there yet");
        std::os::unix::fs::symlink(&elsewhere, clone.join("runs")).unwrap();
        assert_eq!(link_on_the_way(&root, demo), Some(PathBuf::from("runs")));
        std::fs::remove_file(clone.join("runs")).unwrap();
        std::fs::create_dir_all(clone.join("runs/other")).unwrap();
        std::os::unix::fs::symlink(&elsewhere, clone.join("runs/demo")).unwrap();
        assert_eq!(link_on_the_way(&root, demo), Some(PathBuf::from("runs/demo")));
        assert_eq!(link_on_the_way(&root, Path::new("runs/other")), None, "another run's folder is not on the way");
        std::fs::remove_file(clone.join("runs/demo")).unwrap();
        std::fs::create_dir_all(clone.join("runs/demo/samples")).unwrap();
        std::os::unix::fs::symlink(&elsewhere, clone.join("runs/demo/samples/deep")).unwrap();
        assert_eq!(link_on_the_way(&root, demo), Some(PathBuf::from("runs/demo/samples/deep")));
    }

    #[test]
    fn a_link_put_at_a_files_name_is_replaced_and_a_directory_link_refused() {
        // What the pre-check cannot see (a link made after it) the handle
        // refuses: a file's link is replaced by the file, a directory's
        // link is never entered.
        let tmp = tempfile::tempdir().unwrap();
        let (clone, elsewhere) = (tmp.path().join("clone"), tmp.path().join("elsewhere"));
        std::fs::create_dir_all(clone.join("runs/demo")).unwrap();
        std::fs::create_dir_all(&elsewhere).unwrap();
        std::fs::write(elsewhere.join("a.txt"), "theirs").unwrap();
        std::os::unix::fs::symlink(elsewhere.join("a.txt"), clone.join("runs/demo/a.txt")).unwrap();
        std::os::unix::fs::symlink(&elsewhere, clone.join("runs/demo/samples")).unwrap();
        let root = Dir::open(&clone).unwrap();
        let dir = root.open_dir("runs/demo").unwrap();
        let mut tmp_file = TempFile::new_in(&dir, ".t").unwrap();
        std::io::Write::write_all(&mut tmp_file, b"ours").unwrap();
        tmp_file.persist("a.txt").unwrap();
        assert_eq!(std::fs::read(elsewhere.join("a.txt")).unwrap(), b"theirs");
        assert_eq!(std::fs::read(clone.join("runs/demo/a.txt")).unwrap(), b"ours");
        let err = make_dirs(&root, Path::new("runs/demo/samples/x")).unwrap_err();
        assert!(err.to_string().contains("symbolic link"), "{err}");
        assert!(!elsewhere.join("x").exists());
    }
}
