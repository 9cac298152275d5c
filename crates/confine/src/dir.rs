//! Directory handles: a directory rekindle writes in, opened once, and
//! everything below it reached relative to that open handle — never through
//! a symbolic link (in any component, the last one included), never above it
//! (`..`, absolute paths), never blocking on a FIFO or a device.
//!
//! Resolution goes through Linux `openat2(2)` with `RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`: the kernel refuses a link or
//! an escape atomically, during the lookup, so a directory swapped for a link
//! after the handle was opened is refused, not followed. On a kernel without
//! `openat2` (before 5.6) the same walk is done one component at a time with
//! `openat(O_NOFOLLOW)` from the handle. Relative paths here never hold `..`
//! or a root: such a path is refused before any system call.
//!
//! Operations that act on a name (create, rename, remove, metadata) resolve
//! the name's parent as above and then act on the last component with the
//! `*at` call that does not follow it: a link is renamed or removed as a link,
//! never its target. [`Dir::remove_dir_all`] descends only into real
//! directories, each opened with `O_NOFOLLOW` from its parent's handle.
//!
//! This is the only module that opens files of a handle-only module
//! (docs/run-directory.md, "Trust boundaries"; `tests/it/architecture.rs`).

use std::ffi::{OsStr, OsString};
use std::fs::{File, Metadata};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::Mode;
use nix::unistd::UnlinkatFlags;

/// A directory rekindle works in, held open: see the module doc.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
    /// Where the directory was when it was opened: for messages only, never
    /// opened again by path.
    path: PathBuf,
}

/// A directory's `flock`, held until dropped ([`Dir::try_lock_for`]).
#[derive(Debug)]
pub struct DirLock {
    _lock: nix::fcntl::Flock<OwnedFd>,
}

/// What an entry of a directory is, as `lstat` sees it (a link is a link).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
    Symlink,
    /// A FIFO, socket, device or anything else: what it is, in words
    /// (`"a FIFO"`, `"a socket"`, `"a device"`).
    Other(&'static str),
}

/// An entry of [`Dir::entries`].
#[derive(Debug, Clone)]
pub struct Entry {
    pub name: OsString,
    pub kind: Kind,
}

impl Entry {
    /// The name as text (lossily, for names that are not UTF-8).
    pub fn name_lossy(&self) -> String {
        self.name.to_string_lossy().into_owned()
    }
}

impl Kind {
    pub fn is_dir(self) -> bool {
        self == Kind::Dir
    }
    pub fn is_file(self) -> bool {
        self == Kind::File
    }
}

fn resolve() -> ResolveFlag {
    ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_NO_MAGICLINKS
}

impl Dir {
    /// Opens the directory at `path` as a handle. `path` is one rekindle
    /// already decided to work in (claimed with [`super::claim_dir`], or
    /// trusted by `checkpoint::private`): it is resolved as given, and its
    /// last component must be a directory; what is below is then reached
    /// only through the handle.
    pub fn open(path: &Path) -> io::Result<Dir> {
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        let fd = nix::fcntl::open(path, flags, Mode::empty())
            .map_err(|e| with_path(&path.display().to_string(), e.into()))?;
        Ok(Dir { fd, path: path.to_path_buf() })
    }

    /// Opens the directory a person named at `path` (a `[telemetry]
    /// tensorboard` directory, the Prometheus textfile's directory), made
    /// with its parents (mode `mode` less the umask) when missing. Unlike
    /// [`Dir::open`], the last component must be the directory itself: a
    /// symbolic link in its place is refused (`O_NOFOLLOW`), so a shared
    /// directory cannot be swapped for a link to somebody else's. The
    /// components above it are resolved as given (scratch space linked from
    /// a home directory is common).
    pub fn open_named(path: &Path, mode: u32) -> io::Result<Dir> {
        use std::os::unix::fs::DirBuilderExt;
        let shown = path.display().to_string();
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let open = || nix::fcntl::open(path, flags, Mode::empty());
        let fd = match open() {
            Err(Errno::ENOENT) => {
                std::fs::DirBuilder::new().recursive(true).mode(mode).create(path).map_err(|e| with_path(&shown, e))?;
                open()
            }
            other => other,
        };
        let fd = fd.map_err(|e| match e {
            // O_NOFOLLOW|O_DIRECTORY on a link says ELOOP, or ENOTDIR on some kernels.
            Errno::ELOOP | Errno::ENOTDIR
                if nix::sys::stat::lstat(path).is_ok_and(|st| st.st_mode & nix::libc::S_IFMT == nix::libc::S_IFLNK) =>
            {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "{shown} is a symbolic link: rekindle writes in a directory only as the directory itself, \
                         never through a link in its place (whose target another user may choose); name the \
                         real directory, or remove the link"
                    ),
                )
            }
            e => with_path(&shown, e.into()),
        })?;
        Ok(Dir { fd, path: path.to_path_buf() })
    }

    /// The directory holding the file `path` names, opened as [`Dir::open`]
    /// does (`.` when `path` has no directory), and the file's name in it:
    /// how a file rekindle writes in a directory it claimed is reached
    /// through that directory's handle. `InvalidInput` when `path` names no
    /// file (ends in `..` or `/`).
    pub fn open_parent(path: &Path) -> io::Result<(Dir, OsString)> {
        let name = path
            .file_name()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("{} names no file", path.display())))?;
        let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        Ok((Dir::open(dir)?, name.to_os_string()))
    }

    /// Where the directory was when it was opened (for messages).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `rel` below this directory, as a path for messages.
    pub fn shown(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.path.join(rel)
    }

    /// Another handle to the same directory.
    pub fn try_clone(&self) -> io::Result<Dir> {
        Ok(Dir { fd: self.fd.try_clone()?, path: self.path.clone() })
    }

    /// The directory `rel` below this one, as a handle of its own.
    pub fn open_dir(&self, rel: impl AsRef<Path>) -> io::Result<Dir> {
        let rel = rel.as_ref();
        let fd = self.open_beneath(rel, OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty())?;
        Ok(Dir { fd, path: self.path.join(rel) })
    }

    /// Makes the directory `rel` (mode `mode`, less the umask); its parent
    /// must exist. `AlreadyExists` when something is there, whatever it is.
    pub fn create_dir(&self, rel: impl AsRef<Path>, mode: u32) -> io::Result<()> {
        let rel = rel.as_ref();
        let (parent, name) = self.parent_of(rel)?;
        nix::sys::stat::mkdirat(&parent, name, Mode::from_bits_truncate(mode)).map_err(|e| self.error(rel, e.into()))
    }

    /// Opens `rel` for reading: a regular file, never blocking.
    pub fn open_read(&self, rel: impl AsRef<Path>) -> io::Result<File> {
        let rel = rel.as_ref();
        let fd = self.open_beneath(rel, OFlag::O_RDONLY | OFlag::O_NONBLOCK, Mode::empty())?;
        self.regular(rel, File::from(fd))
    }

    /// Opens `rel` for reading whatever it is, never blocking (a FIFO or a
    /// device too): for a caller that says what it found on the open handle
    /// (`fstat`), as publishing does. Links are refused as everywhere.
    pub fn open_read_any(&self, rel: impl AsRef<Path>) -> io::Result<File> {
        let flags = OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY;
        Ok(File::from(self.open_beneath(rel.as_ref(), flags, Mode::empty())?))
    }

    /// The whole of `rel`, a regular file of at most `limit` bytes.
    pub fn read_bounded(&self, rel: impl AsRef<Path>, limit: u64) -> io::Result<Vec<u8>> {
        let rel = rel.as_ref();
        let file = self.open_read(rel)?;
        super::read_whole(&self.shown(rel), file, limit, "rekindle reads of such a file: it is not one rekindle wrote")
    }

    /// Creates `rel`, which must not exist (`O_EXCL`: a link or a file left
    /// there is never written through), for writing, with `mode` less the
    /// umask.
    pub fn create_new(&self, rel: impl AsRef<Path>, mode: u32) -> io::Result<File> {
        let rel = rel.as_ref();
        let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL;
        Ok(File::from(self.open_beneath(rel, flags, Mode::from_bits_truncate(mode))?))
    }

    /// Opens `rel` for appending (and reading), creating it (mode 0666 less
    /// the umask) if it is missing; refused unless it is a regular file.
    pub fn open_append(&self, rel: impl AsRef<Path>) -> io::Result<File> {
        let rel = rel.as_ref();
        let flags = OFlag::O_RDWR | OFlag::O_APPEND | OFlag::O_CREAT | OFlag::O_NONBLOCK;
        let fd = self.open_beneath(rel, flags, Mode::from_bits_truncate(0o666))?;
        self.regular(rel, File::from(fd))
    }

    /// The entries of the directory `rel` (`""` or `"."` for this one),
    /// each with what `lstat` says it is; `.` and `..` left out.
    pub fn entries(&self, rel: impl AsRef<Path>) -> io::Result<Vec<Entry>> {
        let rel = rel.as_ref();
        let fd = self.open_beneath(rel, OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty())?;
        list(fd).map_err(|e| self.error(rel, e))
    }

    /// Renames `from` to `to`, both below this directory; neither is
    /// followed if it is a link (a link is moved as a link).
    pub fn rename(&self, from: impl AsRef<Path>, to: impl AsRef<Path>) -> io::Result<()> {
        let (from, to) = (from.as_ref(), to.as_ref());
        let (from_parent, from_name) = self.parent_of(from)?;
        let (to_parent, to_name) = self.parent_of(to)?;
        nix::fcntl::renameat(&from_parent, from_name, &to_parent, to_name).map_err(|e| {
            io::Error::new(
                io::Error::from(e).kind(),
                format!("cannot rename {} to {}: {e}", self.shown(from).display(), self.shown(to).display()),
            )
        })
    }

    /// Makes `to` a second name of the file `from` (both below this
    /// directory; `from` is not followed if it is a link). `AlreadyExists`
    /// when something is at `to`: the one exclusive create that works on
    /// every shared filesystem (NFS included), for a file written whole
    /// under a temporary name first.
    pub fn hard_link(&self, from: impl AsRef<Path>, to: impl AsRef<Path>) -> io::Result<()> {
        let (from, to) = (from.as_ref(), to.as_ref());
        let (from_parent, from_name) = self.parent_of(from)?;
        let (to_parent, to_name) = self.parent_of(to)?;
        nix::unistd::linkat(&from_parent, from_name, &to_parent, to_name, AtFlags::empty()).map_err(|e| {
            io::Error::new(
                io::Error::from(e).kind(),
                format!("cannot link {} to {}: {e}", self.shown(to).display(), self.shown(from).display()),
            )
        })
    }

    /// Removes the file (or link, or other non-directory) `rel`.
    pub fn remove_file(&self, rel: impl AsRef<Path>) -> io::Result<()> {
        let rel = rel.as_ref();
        let (parent, name) = self.parent_of(rel)?;
        nix::unistd::unlinkat(&parent, name, UnlinkatFlags::NoRemoveDir).map_err(|e| self.error(rel, e.into()))
    }

    /// Removes `rel` and, if it is a real directory, everything in it. A link
    /// anywhere in the tree is removed as a link: nothing outside this
    /// directory is ever reached.
    pub fn remove_dir_all(&self, rel: impl AsRef<Path>) -> io::Result<()> {
        let rel = rel.as_ref();
        let (parent, name) = self.parent_of(rel)?;
        remove_tree(parent.as_fd(), name).map_err(|e| self.error(rel, e))
    }

    /// What `rel` is, not following it if it is a link.
    pub fn symlink_metadata(&self, rel: impl AsRef<Path>) -> io::Result<Metadata> {
        let rel = rel.as_ref();
        let (parent, name) = self.parent_of(rel)?;
        let flags = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let fd = nix::fcntl::openat(&parent, name, flags, Mode::empty()).map_err(|e| self.error(rel, e.into()))?;
        File::from(fd).metadata()
    }

    /// What this directory itself is (`fstat` of the handle).
    pub fn metadata(&self) -> io::Result<Metadata> {
        File::from(self.fd.try_clone()?).metadata()
    }

    /// The name, directly in this directory, of `path`: a path a program or
    /// a person gave, spelled as they like (relative, or through a link to
    /// this directory), whose parent must be this very directory (the same
    /// device and inode as the handle). It only looks (a `stat` of the
    /// parent); what is at the name is then reached through the handle.
    pub fn name_of(&self, path: &Path) -> io::Result<OsString> {
        use std::os::unix::fs::MetadataExt;
        let not_here = || {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not directly in {}", path.display(), self.path.display()),
            )
        };
        let name = match path.components().next_back() {
            Some(Component::Normal(name)) => name,
            _ => return Err(not_here()),
        };
        let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let seen = nix::sys::stat::stat(parent).map_err(|e| with_path(&parent.display().to_string(), e.into()))?;
        let me = self.metadata()?;
        if (seen.st_dev as u64, seen.st_ino as u64) != (me.dev(), me.ino()) {
            return Err(not_here());
        }
        Ok(name.to_os_string())
    }

    /// Whether anything (a link included) is at `rel`.
    pub fn exists(&self, rel: impl AsRef<Path>) -> bool {
        self.symlink_metadata(rel).is_ok()
    }

    /// Whether `rel` is a real directory: `Ok(false)` when nothing is there,
    /// an error naming what it is otherwise (a link to a directory included).
    pub fn own_dir(&self, rel: impl AsRef<Path>) -> io::Result<bool> {
        let rel = rel.as_ref();
        match self.symlink_metadata(rel) {
            Ok(meta) if meta.is_dir() => Ok(true),
            Ok(meta) => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} is {}, not a directory rekindle made: rekindle never works through a link or in place \
                     of a file; remove it (rekindle recreates the directory)",
                    self.shown(rel).display(),
                    super::kind_of(&meta)
                ),
            )),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Flushes this directory's entries (the names created, renamed or
    /// removed in it) to disk.
    pub fn sync(&self) -> io::Result<()> {
        nix::unistd::fsync(&self.fd).map_err(|e| with_path(&self.path.display().to_string(), e.into()))
    }

    /// This directory's `flock`, exclusive, taken through a new open of the
    /// directory (so two handles of one process take turns too), tried until
    /// `wait` has passed: `Ok(None)` when a holder kept it that long (a
    /// process frozen while it held it must not freeze the others: the
    /// caller goes on without). Released when the value drops. Advisory,
    /// and for node-local directories: `flock` across NFS clients is not.
    pub fn try_lock_for(&self, wait: std::time::Duration) -> io::Result<Option<DirLock>> {
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        let until = std::time::Instant::now() + wait;
        let mut fd = nix::fcntl::openat(&self.fd, ".", flags, Mode::empty())
            .map_err(|e| with_path(&self.path.display().to_string(), e.into()))?;
        loop {
            match nix::fcntl::Flock::lock(fd, nix::fcntl::FlockArg::LockExclusiveNonblock) {
                Ok(lock) => return Ok(Some(DirLock { _lock: lock })),
                Err((back, Errno::EWOULDBLOCK)) if std::time::Instant::now() < until => {
                    fd = back;
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                Err((_, Errno::EWOULDBLOCK)) => return Ok(None),
                Err((_, e)) => return Err(with_path(&self.path.display().to_string(), e.into())),
            }
        }
    }

    /// Free bytes for an unprivileged user on this directory's filesystem.
    pub fn available_space(&self) -> io::Result<u64> {
        let st = nix::sys::statvfs::fstatvfs(&self.fd).map_err(io::Error::from)?;
        Ok(st.blocks_available() as u64 * st.fragment_size() as u64)
    }

    /// Opens `rel` below this directory with `flags` (plus `O_CLOEXEC`),
    /// refusing links in every component and any escape.
    fn open_beneath(&self, rel: &Path, flags: OFlag, mode: Mode) -> io::Result<OwnedFd> {
        let rel = checked_rel(rel).map_err(|e| self.error(rel, e))?;
        let flags = flags | OFlag::O_CLOEXEC;
        // RESOLVE_NO_SYMLINKS refuses a link as the last component too
        // (ELOOP); O_NOFOLLOW is left to the fallback, since with O_PATH it
        // would open the link itself and fail O_DIRECTORY with ENOTDIR.
        let how = OpenHow::new().flags(flags).mode(mode).resolve(resolve());
        match nix::fcntl::openat2(&self.fd, rel.as_path(), how) {
            Err(Errno::ENOSYS) => walk(self.fd.as_fd(), &rel, flags | OFlag::O_NOFOLLOW, mode),
            other => other.map_err(io::Error::from),
        }
        .map_err(|e| self.error(&rel, e))
    }

    /// The handle of `rel`'s parent (resolved as [`open_beneath`]) and
    /// `rel`'s last component.
    fn parent_of<'a>(&self, rel: &'a Path) -> io::Result<(OwnedFd, &'a OsStr)> {
        checked_rel(rel).map_err(|e| self.error(rel, e))?;
        let name = rel.file_name().ok_or_else(|| self.error(rel, escape()))?;
        let parent = rel.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let fd = self.open_beneath(parent, OFlag::O_PATH | OFlag::O_DIRECTORY, Mode::empty())?;
        Ok((fd, name))
    }

    fn regular(&self, rel: &Path, file: File) -> io::Result<File> {
        super::checked(&self.shown(rel), file)
    }

    /// `e` about `rel`, saying which file and, for a refused link or escape, why.
    fn error(&self, rel: &Path, e: io::Error) -> io::Error {
        let shown = self.shown(rel);
        match e.raw_os_error() {
            Some(code) if code == Errno::ELOOP as i32 => io::Error::new(
                io::ErrorKind::InvalidInput,
                LinkRefused(format!(
                    "{} is, or passes through, a symbolic link: rekindle reaches what is below {} only without \
                     following links; remove the link (rekindle recreates what it needs)",
                    shown.display(),
                    self.path.display()
                )),
            ),
            Some(code) if code == Errno::EXDEV as i32 => io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} is not below {}: rekindle never reaches outside a directory it works in",
                    shown.display(),
                    self.path.display()
                ),
            ),
            _ => with_path(&shown.display().to_string(), e),
        }
    }
}

/// The error of a path refused because a symbolic link is on it.
#[derive(Debug)]
struct LinkRefused(String);

impl std::fmt::Display for LinkRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LinkRefused {}

/// Whether `e` is a [`Dir`]'s refusal of a symbolic link on the way (in any
/// component, the last one included).
pub fn is_link_refusal(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<LinkRefused>())
}

fn with_path(shown: &str, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{shown}: {e}"))
}

fn escape() -> io::Error {
    io::Error::from_raw_os_error(Errno::EXDEV as i32)
}

/// `rel` as a plain relative path (`.` components dropped; `""` is `.`), or
/// `EXDEV` for an absolute path or one holding `..`.
fn checked_rel(rel: &Path) -> io::Result<PathBuf> {
    let mut out = PathBuf::new();
    for c in rel.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => return Err(escape()),
        }
    }
    if out.as_os_str().is_empty() {
        out.push(".");
    }
    Ok(out)
}

/// The fallback of `openat2`: one component at a time from `start`, each
/// opened with `O_NOFOLLOW` (`rel` is already free of `..` and roots).
fn walk(start: BorrowedFd<'_>, rel: &Path, flags: OFlag, mode: Mode) -> io::Result<OwnedFd> {
    let parts: Vec<&OsStr> = rel.components().map(|c| c.as_os_str()).collect();
    let mut here: OwnedFd = start.try_clone_to_owned()?;
    for (i, part) in parts.iter().enumerate() {
        let last = i + 1 == parts.len();
        let f = if last { flags } else { OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC };
        here = nix::fcntl::openat(&here, *part, f, if last { mode } else { Mode::empty() }).map_err(|e| {
            // O_PATH|O_DIRECTORY|O_NOFOLLOW on a link says ENOTDIR: say ELOOP.
            if e == Errno::ENOTDIR && !last && is_link(&here, part) { Errno::ELOOP.into() } else { io::Error::from(e) }
        })?;
    }
    Ok(here)
}

fn is_link(dir: &OwnedFd, name: &OsStr) -> bool {
    nix::sys::stat::fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)
        .is_ok_and(|st| st.st_mode & nix::libc::S_IFMT == nix::libc::S_IFLNK)
}

fn kind_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<Kind> {
    let st = nix::sys::stat::fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)?;
    Ok(match st.st_mode & nix::libc::S_IFMT {
        nix::libc::S_IFDIR => Kind::Dir,
        nix::libc::S_IFREG => Kind::File,
        nix::libc::S_IFLNK => Kind::Symlink,
        nix::libc::S_IFIFO => Kind::Other("a FIFO"),
        nix::libc::S_IFSOCK => Kind::Other("a socket"),
        _ => Kind::Other("a device"),
    })
}

fn list(fd: OwnedFd) -> io::Result<Vec<Entry>> {
    let keep = fd.try_clone()?;
    let dir = nix::dir::Dir::from_fd(fd)?;
    let mut out = Vec::new();
    for entry in dir {
        let entry = entry?;
        let name = OsStr::from_bytes(entry.file_name().to_bytes());
        if name == "." || name == ".." {
            continue;
        }
        // The type the directory entry carries (no system call); `lstat`
        // only where the filesystem gives none. An entry removed between
        // the listing and its `lstat` (a temporary file renamed away) is
        // not there any more: left out, not an error.
        use nix::dir::Type;
        let kind = match entry.file_type() {
            Some(Type::Directory) => Kind::Dir,
            Some(Type::File) => Kind::File,
            Some(Type::Symlink) => Kind::Symlink,
            Some(Type::Fifo) => Kind::Other("a FIFO"),
            Some(Type::Socket) => Kind::Other("a socket"),
            Some(Type::CharacterDevice | Type::BlockDevice) => Kind::Other("a device"),
            None => match kind_at(keep.as_fd(), name) {
                Ok(kind) => kind,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            },
        };
        out.push(Entry { name: name.to_os_string(), kind });
    }
    Ok(out)
}

/// Removes `name` in `parent`: a real directory with everything in it,
/// anything else (a link included) as a name.
fn remove_tree(parent: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    if kind_at(parent, name)? == Kind::Dir {
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        match nix::fcntl::openat(parent, name, flags, Mode::empty()) {
            Ok(dir) => {
                for entry in list(dir.try_clone()?)? {
                    remove_tree(dir.as_fd(), &entry.name)?;
                }
                return nix::unistd::unlinkat(parent, name, UnlinkatFlags::RemoveDir).map_err(io::Error::from);
            }
            // Swapped for a link or a file since it was looked at: removed as a name below.
            Err(Errno::ELOOP | Errno::ENOTDIR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    nix::unistd::unlinkat(parent, name, UnlinkatFlags::NoRemoveDir).map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::{PermissionsExt, symlink};

    /// A handle on `<tmp>/root` with `sub/f` in it, and `<tmp>/outside/secret`
    /// linked from `root/link` (to the directory) and `root/flink` (to the file).
    fn setup() -> (tempfile::TempDir, Dir) {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/f"), b"mine").unwrap();
        std::fs::create_dir(tmp.path().join("outside")).unwrap();
        std::fs::write(tmp.path().join("outside/secret"), b"theirs").unwrap();
        symlink(tmp.path().join("outside"), root.join("link")).unwrap();
        symlink(tmp.path().join("outside/secret"), root.join("flink")).unwrap();
        let dir = Dir::open(&root).unwrap();
        (tmp, dir)
    }

    fn outside_untouched(tmp: &tempfile::TempDir) {
        let names: Vec<_> =
            std::fs::read_dir(tmp.path().join("outside")).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![OsString::from("secret")], "nothing added or removed outside");
        assert_eq!(std::fs::read(tmp.path().join("outside/secret")).unwrap(), b"theirs");
    }

    fn refused_link(e: io::Error) {
        assert!(e.to_string().contains("symbolic link"), "{e}");
    }

    fn refused_escape(e: io::Error) {
        assert!(e.to_string().contains("not below"), "{e}");
    }

    #[test]
    fn reading_refuses_a_link_last_or_in_between_and_an_escape() {
        let (tmp, dir) = setup();
        assert_eq!(dir.read_bounded("sub/f", 10).unwrap(), b"mine");
        refused_link(dir.read_bounded("flink", 10).unwrap_err());
        refused_link(dir.read_bounded("link/secret", 10).unwrap_err());
        refused_escape(dir.read_bounded("../outside/secret", 10).unwrap_err());
        refused_escape(dir.read_bounded("sub/../../outside/secret", 10).unwrap_err());
        refused_escape(dir.read_bounded(tmp.path().join("outside/secret"), 10).unwrap_err());
        assert!(dir.read_bounded("sub/f", 3).unwrap_err().to_string().contains("more than the 3 bytes"));
        refused_link(dir.open_dir("link").unwrap_err());
        refused_link(dir.entries("link").unwrap_err());
        refused_escape(dir.entries("..").unwrap_err());
    }

    #[test]
    fn creating_refuses_a_link_last_or_in_between_and_an_escape() {
        let (tmp, dir) = setup();
        let mut f = dir.create_new("sub/new", 0o600).unwrap();
        f.write_all(b"x").unwrap();
        assert_eq!(std::fs::metadata(dir.shown("sub/new")).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(dir.create_new("sub/new", 0o600).unwrap_err().kind(), io::ErrorKind::AlreadyExists);
        assert!(dir.create_new("flink", 0o600).is_err(), "a link in place is never written through");
        refused_link(dir.create_new("link/new", 0o600).unwrap_err());
        refused_escape(dir.create_new("../outside/new", 0o600).unwrap_err());
        refused_link(dir.open_append("flink").unwrap_err());
        refused_link(dir.open_append("link/log").unwrap_err());
        dir.create_dir("sub/d", 0o755).unwrap();
        assert!(dir.create_dir("link", 0o755).is_err(), "something is there");
        refused_link(dir.create_dir("link/d", 0o755).unwrap_err());
        refused_escape(dir.create_dir("../outside/d", 0o755).unwrap_err());
        outside_untouched(&tmp);
    }

    #[test]
    fn renaming_and_removing_move_a_link_as_a_link_and_never_reach_outside() {
        let (tmp, dir) = setup();
        dir.create_dir("q", 0o755).unwrap();
        dir.rename("link", "q/moved").unwrap();
        assert!(dir.symlink_metadata("q/moved").unwrap().file_type().is_symlink(), "moved as a link");
        refused_link(dir.rename("q/moved/secret", "stolen").unwrap_err());
        refused_escape(dir.rename("../outside/secret", "stolen").unwrap_err());
        refused_escape(dir.rename("sub/f", "../outside/f").unwrap_err());
        refused_link(dir.remove_file("q/moved/secret").unwrap_err());
        refused_link(dir.remove_dir_all("q/moved/secret").unwrap_err());
        refused_escape(dir.remove_dir_all("..").unwrap_err());
        refused_escape(dir.remove_file("../outside/secret").unwrap_err());
        // A tree holding links: the links go, their targets stay.
        symlink(tmp.path().join("outside"), dir.shown("sub/inner-link")).unwrap();
        dir.remove_dir_all("sub").unwrap();
        dir.remove_dir_all("q").unwrap();
        dir.remove_file("flink").unwrap();
        assert!(dir.entries("").unwrap().is_empty());
        outside_untouched(&tmp);
    }

    #[test]
    fn metadata_and_listing_tell_a_link_from_what_it_points_to() {
        let (_tmp, dir) = setup();
        let mut kinds: Vec<_> = dir.entries(".").unwrap().into_iter().map(|e| (e.name_lossy(), e.kind)).collect();
        kinds.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            kinds,
            vec![("flink".into(), Kind::Symlink), ("link".into(), Kind::Symlink), ("sub".into(), Kind::Dir)]
        );
        assert!(dir.symlink_metadata("link").unwrap().file_type().is_symlink());
        refused_link(dir.symlink_metadata("link/secret").unwrap_err());
        assert!(dir.own_dir("sub").unwrap());
        assert!(!dir.own_dir("absent").unwrap());
        assert!(dir.own_dir("link").unwrap_err().to_string().contains("a symbolic link"));
        assert!(dir.exists("flink") && !dir.exists("absent"));
        dir.sync().unwrap();
        assert!(dir.available_space().unwrap() > 0);
    }

    #[test]
    fn a_directory_swapped_for_a_link_after_opening_is_not_followed() {
        let (tmp, dir) = setup();
        let staging = dir.open_dir("sub").unwrap();
        // Swapped below the handle: the old handle keeps the real directory
        // (moved aside), and a lookup by name from the root refuses the link.
        std::fs::rename(dir.shown("sub"), dir.shown("moved")).unwrap();
        symlink(tmp.path().join("outside"), dir.shown("sub")).unwrap();
        assert_eq!(staging.read_bounded("f", 10).unwrap(), b"mine");
        refused_link(dir.create_new("sub/x", 0o600).unwrap_err());
        refused_link(dir.read_bounded("sub/secret", 10).unwrap_err());
        dir.remove_dir_all("sub").unwrap();
        outside_untouched(&tmp);
    }

    #[test]
    fn the_fallback_walk_without_openat2_refuses_links_too() {
        let (_tmp, dir) = setup();
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        assert!(walk(dir.fd.as_fd(), Path::new("sub/f"), flags, Mode::empty()).is_ok());
        let e = walk(dir.fd.as_fd(), Path::new("link/secret"), flags, Mode::empty()).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(Errno::ELOOP as i32), "{e}");
        let e = walk(dir.fd.as_fd(), Path::new("flink"), flags, Mode::empty()).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(Errno::ELOOP as i32), "{e}");
    }

    #[test]
    fn a_named_directory_is_made_when_missing_and_refused_when_a_link_stands_in_its_place() {
        let tmp = tempfile::tempdir().unwrap();
        let made = Dir::open_named(&tmp.path().join("a/b"), 0o777).unwrap();
        assert!(made.metadata().unwrap().is_dir());
        made.create_new("f", 0o600).unwrap();
        assert!(tmp.path().join("a/b/f").is_file(), "the handle is of the directory made");
        // A link as the last component: refused, and nothing made where it points.
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        symlink(&elsewhere, tmp.path().join("tb")).unwrap();
        let e = Dir::open_named(&tmp.path().join("tb"), 0o777).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("is a symbolic link"), "{e}");
        // A dangling link is refused too, and not made into a directory.
        symlink(tmp.path().join("nowhere"), tmp.path().join("dangling")).unwrap();
        let e = Dir::open_named(&tmp.path().join("dangling"), 0o777).unwrap_err();
        assert!(e.to_string().contains("is a symbolic link"), "{e}");
        assert!(!tmp.path().join("nowhere").exists());
        // A link above the last component is resolved as given.
        symlink(tmp.path().join("a"), tmp.path().join("via")).unwrap();
        assert!(Dir::open_named(&tmp.path().join("via/b"), 0o777).unwrap().exists("f"));
        // A file in its place is an error naming it.
        std::fs::write(tmp.path().join("file"), b"x").unwrap();
        let e = Dir::open_named(&tmp.path().join("file"), 0o777).unwrap_err();
        assert!(e.to_string().contains("file"), "{e}");
    }

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let (_tmp, dir) = setup();
        nix::unistd::mkfifo(&dir.shown("fifo"), Mode::S_IRWXU).unwrap();
        assert!(dir.read_bounded("fifo", 10).unwrap_err().to_string().contains("is a FIFO"));
        assert!(dir.open_append("fifo").unwrap_err().to_string().contains("is a FIFO"));
        assert_eq!(dir.entries("").unwrap().iter().find(|e| e.name == "fifo").unwrap().kind, Kind::Other("a FIFO"));
    }
}
