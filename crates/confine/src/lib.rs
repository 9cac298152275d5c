//! How rekindle opens the files of a run directory it reads back or appends
//! to, so that the directory stays a boundary (docs/run-directory.md, "Trust
//! boundaries"): never through a symbolic link, never blocking on a FIFO or a
//! device, never reading more than a stated bound.
//!
//! Every open here passes `O_NOFOLLOW` (a symlink as the last component is
//! refused by the kernel, atomically, not checked and then opened) and
//! `O_NONBLOCK` (opening a FIFO returns at once instead of waiting for a
//! writer), then checks on the open handle that it is a regular file. Reads
//! are bounded twice: the size the handle reports, and the bytes actually
//! read (a file that grows while it is read cannot make a reader allocate
//! more than its bound).
//!
//! Directory handles: [`Dir`] (`confine/dir.rs`) is a directory opened once;
//! everything below it is reached relative to the handle, never through a
//! link in any component and never outside it. The modules that write only
//! through handles are listed in `tests/it/architecture.rs`.
//!
//! Directories: [`own_dir`] tells whether a path rekindle is about to create,
//! list or empty is a real directory and not a link to one elsewhere.
//!
//! The errors are plain [`io::Error`]s whose message says what the path is
//! and why it is refused, so every caller's typed error keeps its own shape.
//!
//! Ownership: [`claim_dir`] decides whether rekindle may make a directory its
//! own (the run directory, the checkpoints directory). A directory rekindle
//! made holds [`MARKER_FILE`]; one it did not make is adopted only when it is
//! empty (or, for directories from before the marker, when it holds what only
//! rekindle writes); anything else is refused, so a mistyped `--run-dir` or
//! `[checkpoint] dir` never has its files truncated, rotated or removed.

use std::fs::{File, Metadata, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;

pub mod atomic;
mod dir;
pub use atomic::{TempFile, write_atomically};
pub use dir::{Dir, DirLock, Entry, Kind, is_link_refusal};

/// The file that marks a directory as rekindle's own.
pub const MARKER_FILE: &str = ".rekindle";

const MARKER_TEXT: &str = "This directory is managed by rekindle: it creates, rotates and removes files here.\n";

/// Why a directory is not rekindle's to use.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    #[error(
        "{what} {path} is {reason}: rekindle creates and deletes files in its directories, so it never uses \
         one like this; choose a new or empty directory"
    )]
    Refused { what: &'static str, path: PathBuf, reason: String },
    #[error(
        "{what} {path} exists, is not empty ({entries}) and was not made by rekindle (no {MARKER_FILE} file \
         in it): rekindle would truncate, rotate or remove files there; choose a new or empty directory, or, \
         if it really is a run of rekindle's from before {MARKER_FILE} existed, create an empty {MARKER_FILE} \
         file in it"
    )]
    Foreign { what: &'static str, path: PathBuf, entries: String },
    #[error(
        "{what} {path} is a symbolic link (to {target}): rekindle never reaches through a link inside the run \
         directory, so that it cannot write or delete files of a directory it did not make; nothing was \
         written or removed. Remove the link (rekindle then makes the directory), or, to keep checkpoints \
         there, set [checkpoint] dir = \"{target}\" (checked like any [checkpoint] dir)"
    )]
    Link { what: &'static str, path: PathBuf, target: String },
    #[error("cannot prepare {what} {path}: {source}")]
    Io { what: &'static str, path: PathBuf, source: io::Error },
}

/// The flags of every open here besides the access mode.
fn guard_flags() -> i32 {
    (OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC).bits()
}

/// What kind of file `meta` describes, in words for a message.
pub fn kind_of(meta: &Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_symlink() {
        "a symbolic link"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_block_device() || t.is_char_device() {
        "a device"
    } else if t.is_file() {
        "a regular file"
    } else {
        "not a regular file"
    }
}

fn refused(path: &Path, what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "{} is {what}, not a regular file: rekindle never follows links or reads special files in a run \
             directory; remove it (rekindle recreates what it needs)",
            path.display()
        ),
    )
}

/// `ELOOP` from `O_NOFOLLOW` means the last component is a symlink: say so.
fn explain(path: &Path, e: io::Error) -> io::Error {
    if e.raw_os_error() == Some(nix::libc::ELOOP) { refused(path, "a symbolic link") } else { e }
}

fn checked(path: &Path, file: File) -> io::Result<File> {
    let meta = file.metadata()?;
    if meta.is_file() { Ok(file) } else { Err(refused(path, kind_of(&meta))) }
}

/// Opens `path` for reading: a regular file, reached without following a
/// symlink as its last component, never blocking.
pub fn open_regular(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new().read(true).custom_flags(guard_flags()).open(path).map_err(|e| explain(path, e))?;
    checked(path, file)
}

/// Opens `path` for appending (and reading), creating it (mode 0666 less the umask) if it
/// is missing; refused unless it is a regular file (a symlink left in its
/// place is never written through).
pub fn open_append(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .mode(0o666)
        .custom_flags(guard_flags())
        .open(path)
        .map_err(|e| explain(path, e))?;
    checked(path, file)
}

/// The whole of `path`, a regular file of at most `limit` bytes.
pub fn read_bounded(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    read_whole(path, open_regular(path)?, limit, "rekindle reads of such a file: it is not one rekindle wrote")
}

/// The whole of `path`, a file a person named (`--config`): as
/// [`read_bounded`] (a regular file, never blocking, at most `limit` bytes),
/// except that a symbolic link to it is followed, as people link configs.
pub fn read_named_bounded(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    let flags = (OFlag::O_NONBLOCK | OFlag::O_CLOEXEC).bits();
    let file = checked(path, OpenOptions::new().read(true).custom_flags(flags).open(path)?)?;
    read_whole(path, file, limit, "rekindle reads of such a file")
}

fn read_whole(path: &Path, file: File, limit: u64, what: &str) -> io::Result<Vec<u8>> {
    let size = file.metadata()?.len();
    let too_large = |size: u64| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is {size} bytes, more than the {limit} bytes {what}", path.display()),
        )
    };
    if size > limit {
        return Err(too_large(size));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    file.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

/// [`read_bounded`], with `None` when `path` does not exist.
pub fn read_bounded_if_exists(path: &Path, limit: u64) -> io::Result<Option<Vec<u8>>> {
    match read_bounded(path, limit) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Whether `path` is a directory rekindle may work inside: `Ok(true)` when
/// it is a real directory, `Ok(false)` when nothing is there, and an error
/// naming what it is otherwise (a symlink, even to a directory, is refused:
/// emptying or renaming through it would reach outside the run directory).
pub fn own_dir(path: &Path) -> io::Result<bool> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_dir() => Ok(true),
        Ok(meta) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} is {}, not a directory rekindle made: rekindle never works through a link or in place \
                 of a file; remove it (rekindle recreates the directory)",
                path.display(),
                kind_of(&meta)
            ),
        )),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Whether a file the user named for rekindle to write (`report --out`,
/// `data validate --out`) may be put at `path`, replacing what is there by a
/// rename: `Ok` when nothing is there or a regular file is; an error naming
/// what is there otherwise (a symbolic link, a directory, a device, a FIFO,
/// a socket), which is then left as it is: a rename would put a regular
/// file in place of a device node or a link, not write to it.
pub fn replaceable_file(path: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_file() => Ok(()),
        Ok(meta) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} is {}, not a regular file: rekindle writes its output only as a regular file (new, or \
                 replacing one) and leaves this as it is; name a file path instead",
                path.display(),
                kind_of(&meta)
            ),
        )),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

impl ClaimError {
    /// An I/O failure, not a refusal (the directory may be fine).
    pub fn is_io(&self) -> bool {
        matches!(self, ClaimError::Io { .. })
    }
}

/// Makes `path` rekindle's directory (`what` names it in messages, e.g.
/// "the run directory"): created with [`MARKER_FILE`] when missing, adopted
/// (marked) when empty or when `made_by_rekindle` recognises what is in it,
/// accepted when marked. The filesystem root and the home directory are
/// refused whatever they hold; so is a directory of someone else's files.
/// `path` itself may be a symlink to a directory (a user may point
/// `--run-dir` at scratch space that way); what rekindle makes inside is
/// never reached through one.
pub fn claim_dir(path: &Path, what: &'static str, made_by_rekindle: impl Fn(&Path) -> bool) -> Result<(), ClaimError> {
    let io = |source| ClaimError::Io { what, path: path.to_path_buf(), source };
    let refused = |reason: &str| ClaimError::Refused { what, path: path.to_path_buf(), reason: reason.into() };
    if let Ok(real) = std::fs::canonicalize(path) {
        if real.parent().is_none() {
            return Err(refused("the filesystem root"));
        }
        if std::env::var_os("HOME").and_then(|h| std::fs::canonicalize(h).ok()).is_some_and(|home| home == real) {
            return Err(refused("your home directory"));
        }
    }
    match std::fs::metadata(path) {
        Ok(meta) if !meta.is_dir() => return Err(refused(&format!("{}, not a directory", kind_of(&meta)))),
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            std::fs::create_dir_all(path).map_err(io)?;
            return mark(path).map_err(io);
        }
        Err(e) => return Err(io(e)),
    }
    let marker = path.join(MARKER_FILE);
    match std::fs::symlink_metadata(&marker) {
        Ok(meta) if meta.is_file() => return Ok(()),
        Ok(meta) => return Err(io(refused_marker(&marker, &meta))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
    }
    let mut names = Vec::new();
    for entry in std::fs::read_dir(path).map_err(io)? {
        names.push(entry.map_err(io)?.file_name().to_string_lossy().into_owned());
    }
    if names.is_empty() || made_by_rekindle(path) {
        return mark(path).map_err(io);
    }
    // Another process (a rank of the same run) may have claimed it since.
    if is_claimed(path) {
        return Ok(());
    }
    names.sort();
    let shown = names.iter().take(5).map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ");
    let more = if names.len() > 5 { format!(" and {} more", names.len() - 5) } else { String::new() };
    Err(ClaimError::Foreign { what, path: path.to_path_buf(), entries: format!("{shown}{more}") })
}

/// Whether `path` holds [`MARKER_FILE`] (a regular file).
pub fn is_claimed(path: &Path) -> bool {
    std::fs::symlink_metadata(path.join(MARKER_FILE)).is_ok_and(|m| m.is_file())
}

fn refused_marker(marker: &Path, meta: &Metadata) -> io::Error {
    refused(marker, kind_of(meta))
}

fn mark(dir: &Path) -> io::Result<()> {
    let marker = dir.join(MARKER_FILE);
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o666)
        .custom_flags(guard_flags())
        .open(&marker)
        .or_else(|e| if e.kind() == io::ErrorKind::AlreadyExists { open_append(&marker) } else { Err(e) })?;
    if file.metadata()?.len() == 0 {
        io::Write::write_all(&mut file, MARKER_TEXT.as_bytes())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn a_symlink_is_never_read_nor_appended_to() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::write(&outside, b"secret").unwrap();
        let link = tmp.path().join("events.jsonl");
        symlink(&outside, &link).unwrap();
        let err = read_bounded(&link, 100).unwrap_err();
        assert!(err.to_string().contains("is a symbolic link"), "{err}");
        let err = open_append(&link).unwrap_err();
        assert!(err.to_string().contains("is a symbolic link"), "{err}");
        assert_eq!(std::fs::read(&outside).unwrap(), b"secret", "the target is untouched");
        let dangling = tmp.path().join("dangling");
        symlink(tmp.path().join("nowhere"), &dangling).unwrap();
        assert!(open_append(&dangling).unwrap_err().to_string().contains("symbolic link"));
        assert!(!tmp.path().join("nowhere").exists(), "a dangling link's target is not created");
    }

    #[test]
    fn a_fifo_or_a_device_is_refused_without_blocking() {
        let tmp = tempfile::tempdir().unwrap();
        let fifo = tmp.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert!(read_bounded(&fifo, 10).unwrap_err().to_string().contains("is a FIFO"));
        assert!(open_append(&fifo).is_err(), "no reader: refused, never blocked");
        assert!(read_bounded(Path::new("/dev/zero"), 10).unwrap_err().to_string().contains("is a device"));
    }

    #[test]
    fn a_named_file_may_be_a_link_but_never_a_fifo_nor_too_large() {
        let tmp = tempfile::tempdir().unwrap();
        let real = tmp.path().join("real.toml");
        std::fs::write(&real, b"[run]\n").unwrap();
        symlink(&real, tmp.path().join("link.toml")).unwrap();
        assert_eq!(read_named_bounded(&tmp.path().join("link.toml"), 100).unwrap(), b"[run]\n");
        let fifo = tmp.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert!(read_named_bounded(&fifo, 10).unwrap_err().to_string().contains("is a FIFO"));
        let big = tmp.path().join("big.toml");
        std::fs::File::create(&big).unwrap().set_len(1 << 30).unwrap();
        let err = read_named_bounded(&big, 16 << 20).unwrap_err().to_string();
        assert!(err.contains("1073741824 bytes, more than the 16777216 bytes"), "{err}");
    }

    #[test]
    fn reads_are_bounded_and_missing_files_are_none() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("f");
        std::fs::write(&path, vec![b'x'; 11]).unwrap();
        assert!(read_bounded(&path, 10).unwrap_err().to_string().contains("11 bytes, more than the 10"));
        assert_eq!(read_bounded(&path, 11).unwrap().len(), 11);
        assert!(read_bounded_if_exists(&tmp.path().join("absent"), 10).unwrap().is_none());
        let mut f = open_append(&tmp.path().join("new")).unwrap();
        io::Write::write_all(&mut f, b"line\n").unwrap();
        assert_eq!(read_bounded(&tmp.path().join("new"), 5).unwrap(), b"line\n");
    }

    #[test]
    fn a_directory_is_claimed_when_new_empty_marked_or_recognised_and_refused_otherwise() {
        let tmp = tempfile::tempdir().unwrap();
        let never = |_: &Path| false;
        let new = tmp.path().join("a/b");
        claim_dir(&new, "the run directory", never).unwrap();
        assert!(is_claimed(&new));
        claim_dir(&new, "the run directory", never).unwrap();
        let empty = tmp.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        claim_dir(&empty, "the run directory", never).unwrap();
        assert!(is_claimed(&empty));
        let users = tmp.path().join("users");
        std::fs::create_dir(&users).unwrap();
        std::fs::write(users.join("metrics.jsonl"), b"mine").unwrap();
        let err = claim_dir(&users, "the run directory", never).unwrap_err();
        assert!(matches!(err, ClaimError::Foreign { .. }), "{err}");
        assert!(err.to_string().contains("`metrics.jsonl`"), "{err}");
        assert!(!is_claimed(&users), "nothing written into a refused directory");
        claim_dir(&users, "the run directory", |p| p.join("metrics.jsonl").exists()).unwrap();
        assert!(is_claimed(&users));
        let err = claim_dir(Path::new("/"), "[checkpoint] dir", never).unwrap_err();
        assert!(err.to_string().contains("the filesystem root"), "{err}");
        std::fs::write(tmp.path().join("file"), b"").unwrap();
        let err = claim_dir(&tmp.path().join("file"), "the run directory", never).unwrap_err();
        assert!(err.to_string().contains("a regular file, not a directory"), "{err}");
        let odd = tmp.path().join("odd");
        std::fs::create_dir(&odd).unwrap();
        symlink("/etc/passwd", odd.join(MARKER_FILE)).unwrap();
        assert!(claim_dir(&odd, "the run directory", never).unwrap_err().to_string().contains("symbolic link"));
    }

    #[test]
    fn output_goes_only_where_a_regular_file_is_or_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(replaceable_file(&tmp.path().join("new.html")).is_ok());
        std::fs::write(tmp.path().join("old.html"), b"").unwrap();
        assert!(replaceable_file(&tmp.path().join("old.html")).is_ok());
        symlink(tmp.path().join("old.html"), tmp.path().join("link")).unwrap();
        assert!(replaceable_file(&tmp.path().join("link")).unwrap_err().to_string().contains("a symbolic link"));
        assert!(replaceable_file(tmp.path()).unwrap_err().to_string().contains("a directory"));
        assert!(replaceable_file(Path::new("/dev/null")).unwrap_err().to_string().contains("a device"));
    }

    #[test]
    fn only_a_real_directory_is_one_to_work_in() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(own_dir(tmp.path()).unwrap());
        assert!(!own_dir(&tmp.path().join("absent")).unwrap());
        let link = tmp.path().join("link");
        symlink(tmp.path(), &link).unwrap();
        assert!(own_dir(&link).unwrap_err().to_string().contains("is a symbolic link"));
        std::fs::write(tmp.path().join("file"), b"").unwrap();
        assert!(own_dir(&tmp.path().join("file")).unwrap_err().to_string().contains("is a regular file"));
    }
}
