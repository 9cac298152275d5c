//! Real git repositories on disk for the publishing tests: a bare "remote"
//! with branch `main`, a clone to commit into, and the `git` command line to
//! check what arrived.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs `git ARGS` in `dir`, panicking on failure; returns stdout.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git").args(args).current_dir(dir).output().expect("git runs");
    assert!(out.status.success(), "git {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A bare remote `ROOT/results.git` with branch main and a clone `ROOT/clone` of it.
pub fn remote_and_clone(root: &Path) -> (PathBuf, PathBuf) {
    let bare = root.join("results.git");
    git(root, &["init", "--bare", "-q", "-b", "main", bare.to_str().unwrap()]);
    let clone = root.join("clone");
    git(root, &["clone", "-q", bare.to_str().unwrap(), clone.to_str().unwrap()]);
    (bare, clone)
}

/// A TCP port on 127.0.0.1 that nothing listens on (bound, then released).
pub fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}
