//! The node-local root as a place only its user can change (docs/recovery.md,
//! "Where the copies are, and who can touch them"): making it, and deciding
//! whether a directory or file under it may be trusted before anything of it
//! is read.
//!
//! The root of a run is `<base>/rekindle-local-<uid>/<run key>`: the user's
//! folder carries the uid in its own name, beside other users' folders in
//! the base (`/dev/shm`, `$TMPDIR`, `[recovery] local_dir`), rather than
//! under a `rekindle-local/` folder every user shares: whoever made a shared
//! folder first would own it, and could rename or replace what the others
//! keep in it. Another user who makes `rekindle-local-<uid>` before us can
//! only deny us the tier (it is refused: not ours), never feed us state.
//!
//! The rules ([`judge_own`], [`judge_ancestor`], pure over what `lstat` says):
//! - the user's folder, the run's folder and everything in a copy are real
//!   directories and regular files (never links, FIFOs, devices), owned by
//!   the user and writable by nobody else; the two folders are made `0700`
//!   and checked after they are made;
//! - every directory above the user's folder is owned by the user or root,
//!   and writable by others only when sticky (`/tmp`, `/dev/shm`), so no
//!   other user can rename a component away and put another in its place.
//!
//! Together these are why checked paths may then be read by path (the
//! store, the verifier and the loader are path-based): between the check and
//! the read only the user or root can change anything on the way.

use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Group or other may write.
const WRITABLE_BY_OTHERS: u32 = 0o022;
const STICKY: u32 = 0o1000;

/// The user's folder in a base: `rekindle-local-<uid>`.
pub fn private_dir_name(uid: u32) -> String {
    format!("{}-{uid}", super::local::LOCAL_DIR_NAME)
}

/// The effective uid: whose files rekindle's own are.
pub fn user() -> u32 {
    // SAFETY: geteuid takes nothing, touches no memory and cannot fail
    // (nix offers it only behind its `user` feature, not enabled here).
    unsafe { nix::libc::geteuid() }
}

/// What a directory entry is, as `lstat` says (a link is never followed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
    Link,
    Other(&'static str),
}

impl Kind {
    fn words(self) -> &'static str {
        match self {
            Kind::Dir => "a directory",
            Kind::File => "a regular file",
            Kind::Link => "a symbolic link",
            Kind::Other(what) => what,
        }
    }
}

/// One entry's kind, owner and mode bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    pub kind: Kind,
    pub uid: u32,
    pub mode: u32,
}

/// Why something under (or above) the node-local root is not trusted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Untrusted {
    #[error(
        "{path} is {found}, not {want}: rekindle never follows a link nor reads a special file in the node-local \
         tier"
    )]
    Kind { path: PathBuf, found: &'static str, want: &'static str },
    #[error(
        "{path} is owned by uid {owner}, not by this user (uid {user}): state another user left there is never \
         resumed from"
    )]
    Owner { path: PathBuf, owner: u32, user: u32 },
    #[error("{path} can be written by other users (mode {mode:04o}): state there could be anyone's")]
    Writable { path: PathBuf, mode: u32 },
    #[error(
        "{path}, on the way to the node-local root, is owned by uid {owner} (neither this user, uid {user}, nor \
         root): its owner could replace what is below it"
    )]
    AncestorOwner { path: PathBuf, owner: u32, user: u32 },
    #[error(
        "{path}, on the way to the node-local root, can be written by other users and is not sticky (mode \
         {mode:04o}): they could replace what is below it; point [recovery] local_dir at a directory only you \
         can write"
    )]
    AncestorWritable { path: PathBuf, mode: u32 },
    #[error("cannot make the local directory {path}: {reason}")]
    Make { path: PathBuf, reason: String },
    #[error("cannot inspect {path}: {reason}")]
    Inspect { path: PathBuf, reason: String },
}

/// Whether `seen`, at `path` inside the user's folder (or the folder
/// itself), may be trusted as `want` (a directory or a regular file).
pub fn judge_own(path: &Path, seen: Seen, want: Kind, user: u32) -> Result<(), Untrusted> {
    if seen.kind != want {
        return Err(Untrusted::Kind { path: path.to_path_buf(), found: seen.kind.words(), want: want.words() });
    }
    if seen.uid != user {
        return Err(Untrusted::Owner { path: path.to_path_buf(), owner: seen.uid, user });
    }
    if seen.mode & WRITABLE_BY_OTHERS != 0 {
        return Err(Untrusted::Writable { path: path.to_path_buf(), mode: seen.mode & 0o7777 });
    }
    Ok(())
}

/// Whether `seen`, a directory above the user's folder, keeps other users
/// from replacing what is below it.
pub fn judge_ancestor(path: &Path, seen: Seen, user: u32) -> Result<(), Untrusted> {
    if seen.uid != user && seen.uid != 0 {
        return Err(Untrusted::AncestorOwner { path: path.to_path_buf(), owner: seen.uid, user });
    }
    if seen.mode & WRITABLE_BY_OTHERS != 0 && seen.mode & STICKY == 0 {
        return Err(Untrusted::AncestorWritable { path: path.to_path_buf(), mode: seen.mode & 0o7777 });
    }
    Ok(())
}

/// `path` as `lstat` sees it; `None` when nothing is there.
pub fn look(path: &Path) -> Result<Option<Seen>, Untrusted> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Untrusted::Inspect { path: path.to_path_buf(), reason: e.to_string() }),
    };
    let t = meta.file_type();
    let kind = if t.is_symlink() {
        Kind::Link
    } else if t.is_dir() {
        Kind::Dir
    } else if t.is_file() {
        Kind::File
    } else if t.is_fifo() {
        Kind::Other("a FIFO")
    } else if t.is_socket() {
        Kind::Other("a socket")
    } else {
        Kind::Other("a device")
    };
    Ok(Some(Seen { kind, uid: meta.uid(), mode: meta.mode() }))
}

fn look_present(path: &Path) -> Result<Seen, Untrusted> {
    look(path)?.ok_or_else(|| Untrusted::Inspect { path: path.to_path_buf(), reason: "it is gone".into() })
}

/// Makes the run's local root `root` (`<base>/rekindle-local-<uid>/<run
/// key>`, [`super::local::resolve_root`]) and checks the way to it: the base
/// is made if missing (mode 0755 whatever the umask; it is the user's
/// choice, or the system's), every directory above the user's folder must
/// pass [`judge_ancestor`], and the user's folder and the run's folder are
/// made `0700` and must pass
/// [`judge_own`] (checked after they are made, and also when they were
/// there already).
pub fn prepare_root(root: &Path) -> Result<(), Untrusted> {
    let user = user();
    let make = |e: io::Error| Untrusted::Make { path: root.to_path_buf(), reason: e.to_string() };
    let private = root.parent().ok_or_else(|| make(io::Error::other("it has no parent")))?;
    let base = private.parent().ok_or_else(|| make(io::Error::other("it has no base")))?;
    if let Ok(meta) = std::fs::metadata(base)
        && !meta.is_dir()
    {
        return Err(make(io::Error::from_raw_os_error(nix::libc::ENOTDIR)));
    }
    // Levels made here are writable by the user alone whatever the umask
    // (002 would make them group-writable, and refused below).
    std::fs::DirBuilder::new().recursive(true).mode(0o755).create(base).map_err(make)?;
    // The base itself may be reached through a link (a site's /scratch
    // pointing at local disk): the directories it resolves to are checked.
    let real = std::fs::canonicalize(base).map_err(make)?;
    for dir in real.ancestors() {
        judge_ancestor(dir, look_present(dir)?, user)?;
    }
    for dir in [private, root] {
        make_private(dir).map_err(make)?;
        judge_own(dir, look_present(dir)?, Kind::Dir, user)?;
    }
    Ok(())
}

/// Creates `dir` with mode `0700` (exactly: the umask may only take bits
/// away, and none are left to give), unless something is there already.
fn make_private(dir: &Path) -> io::Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)),
        // Whatever is there is judged by the caller.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// Whether the copy `dir` (a `step-…` folder under a prepared root) and
/// everything in it may be read: a directory of the user's, holding only
/// the user's regular files (and directories like it), none writable by
/// others. Nothing is opened: only `lstat` and the directories' listings.
pub fn check_tree(dir: &Path) -> Result<(), Untrusted> {
    let user = user();
    judge_own(dir, look_present(dir)?, Kind::Dir, user)?;
    let listing =
        std::fs::read_dir(dir).map_err(|e| Untrusted::Inspect { path: dir.to_path_buf(), reason: e.to_string() })?;
    for entry in listing {
        let entry = entry.map_err(|e| Untrusted::Inspect { path: dir.to_path_buf(), reason: e.to_string() })?;
        let path = entry.path();
        let seen = look_present(&path)?;
        if seen.kind == Kind::Dir {
            check_tree(&path)?;
        } else {
            judge_own(&path, seen, Kind::File, user)?;
        }
    }
    Ok(())
}

/// Takes write permission for group and others away from the copy `dir`
/// and everything in it (links are neither followed nor changed), so that a
/// copy rekindle wrote under a umask such as 002 (files 0664, directories
/// 0775, as docs/run-directory.md suggests for labs) passes [`check_tree`].
pub fn keep_private(dir: &Path) -> io::Result<()> {
    let meta = std::fs::symlink_metadata(dir)?;
    if meta.file_type().is_symlink() {
        return Ok(());
    }
    if meta.mode() & WRITABLE_BY_OTHERS != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(meta.mode() & 0o7755))?;
    }
    if meta.is_dir() {
        for entry in std::fs::read_dir(dir)? {
            keep_private(&entry?.path())?;
        }
    }
    Ok(())
}

/// [`check_tree`], when something is at `dir`.
pub fn check_tree_if_present(dir: &Path) -> Result<(), Untrusted> {
    match look(dir)? {
        None => Ok(()),
        Some(_) => check_tree(dir),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(kind: Kind, uid: u32, mode: u32) -> Seen {
        Seen { kind, uid, mode }
    }

    #[test]
    fn only_the_users_own_directories_and_regular_files_writable_by_none_else_are_trusted() {
        let p = Path::new("/x");
        assert_eq!(judge_own(p, seen(Kind::Dir, 7, 0o40700), Kind::Dir, 7), Ok(()));
        assert_eq!(judge_own(p, seen(Kind::File, 7, 0o100644), Kind::File, 7), Ok(()), "readable is fine");
        let err = judge_own(p, seen(Kind::Dir, 12345, 0o40700), Kind::Dir, 7).unwrap_err();
        assert_eq!(err, Untrusted::Owner { path: p.into(), owner: 12345, user: 7 });
        assert!(err.to_string().contains("owned by uid 12345, not by this user (uid 7)"), "{err}");
        for mode in [0o40770, 0o40702, 0o41777] {
            assert!(matches!(judge_own(p, seen(Kind::Dir, 7, mode), Kind::Dir, 7), Err(Untrusted::Writable { .. })));
        }
        let link = judge_own(p, seen(Kind::Link, 7, 0o120777), Kind::Dir, 7).unwrap_err();
        assert!(link.to_string().contains("is a symbolic link, not a directory"), "{link}");
        let fifo = judge_own(p, seen(Kind::Other("a FIFO"), 7, 0o10600), Kind::File, 7).unwrap_err();
        assert!(fifo.to_string().contains("is a FIFO, not a regular file"), "{fifo}");
    }

    #[test]
    fn a_directory_above_may_be_roots_or_the_users_and_shared_only_when_sticky() {
        let p = Path::new("/dev/shm");
        assert_eq!(judge_ancestor(p, seen(Kind::Dir, 0, 0o41777), 7), Ok(()), "/dev/shm, /tmp");
        assert_eq!(judge_ancestor(p, seen(Kind::Dir, 7, 0o40755), 7), Ok(()));
        assert!(matches!(judge_ancestor(p, seen(Kind::Dir, 0, 0o40777), 7), Err(Untrusted::AncestorWritable { .. })));
        assert!(matches!(judge_ancestor(p, seen(Kind::Dir, 9, 0o40755), 7), Err(Untrusted::AncestorOwner { .. })));
    }

    #[test]
    fn the_root_is_made_private_and_checked_and_a_link_in_its_place_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("base").join(private_dir_name(user())).join("key");
        prepare_root(&root).unwrap();
        for dir in [root.parent().unwrap(), &root] {
            let mode = std::fs::metadata(dir).unwrap().permissions().mode();
            assert_eq!(mode & 0o7777, 0o700, "{}", dir.display());
        }
        prepare_root(&root).unwrap();
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        let linked = tmp.path().join("other").join(private_dir_name(user()));
        std::fs::create_dir_all(linked.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &linked).unwrap();
        let err = prepare_root(&linked.join("key")).unwrap_err();
        assert!(err.to_string().contains("is a symbolic link, not a directory"), "{err}");
        assert!(!elsewhere.join("key").exists(), "nothing is made through the link");
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(matches!(prepare_root(&root), Err(Untrusted::Writable { .. })));
    }

    #[test]
    fn a_copy_holding_a_link_or_a_fifo_is_refused_before_it_is_read() {
        let tmp = tempfile::tempdir().unwrap();
        let copy = tmp.path().join("step-0000000005");
        std::fs::create_dir(&copy).unwrap();
        std::fs::write(copy.join("model.safetensors"), b"w").unwrap();
        assert_eq!(check_tree(&copy), Ok(()));
        std::os::unix::fs::symlink("/etc/passwd", copy.join("state.json")).unwrap();
        assert!(check_tree(&copy).unwrap_err().to_string().contains("symbolic link"));
        std::fs::remove_file(copy.join("state.json")).unwrap();
        nix::unistd::mkfifo(&copy.join("WORLD.json"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert!(check_tree(&copy).unwrap_err().to_string().contains("a FIFO"));
        std::fs::remove_file(copy.join("WORLD.json")).unwrap();
        for (path, mode) in [(&copy, 0o775), (&copy.join("model.safetensors"), 0o664)] {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
        }
        assert!(matches!(check_tree(&copy), Err(Untrusted::Writable { .. })), "written under umask 002");
        keep_private(&copy).unwrap();
        assert_eq!(check_tree(&copy), Ok(()));
        let link = tmp.path().join("step-0000000006");
        std::os::unix::fs::symlink(&copy, &link).unwrap();
        assert!(check_tree(&link).unwrap_err().to_string().contains("symbolic link, not a directory"));
        assert_eq!(check_tree_if_present(&tmp.path().join("absent")), Ok(()));
    }
}
