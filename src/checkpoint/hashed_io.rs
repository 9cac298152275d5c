//! Hashed file I/O: every byte of a checkpoint is hashed on the same pass
//! that writes or reads it, with the hashing on a second thread, so a save or
//! a load costs the longer of I/O and SHA-256 rather than their sum. Also the
//! fsyncs and the free-space query of the commit protocol, and the
//! failpoints inside its I/O (`checkpoint::before_fsync::<file>`,
//! `checkpoint::after_fsync::<file>`; the store uses [`fail_io`] for its
//! own I/O failpoints too).

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::Path;

use sha2::{Digest, Sha256};

/// Bytes per write or read call.
const IO_BUFFER: usize = 8 << 20;

/// Creates `path`, writes `parts` into it straight from their memory while a
/// second thread hashes the same bytes, and fsyncs it. Hashing costs about as
/// much CPU as the write, so running them side by side makes a save take the
/// longer of the two instead of their sum; nothing is copied and nothing is
/// read back. Returns (bytes, hex sha256).
pub(super) fn write_hashed(path: &Path, parts: &[&[u8]]) -> io::Result<(u64, String)> {
    let mut file = File::options().write(true).create_new(true).open(path)?;
    let total: u64 = parts.iter().map(|p| p.len() as u64).sum();
    let digest = std::thread::scope(|scope| -> io::Result<String> {
        let hasher = scope.spawn(|| {
            let mut h = Sha256::new();
            for part in parts {
                for chunk in part.chunks(HASH_CHUNK) {
                    h.update(chunk);
                }
            }
            hex::encode(h.finalize())
        });
        let written =
            parts.iter().try_for_each(|part| part.chunks(IO_BUFFER).try_for_each(|chunk| file.write_all(chunk)));
        let digest = hasher.join().expect("hashing thread does not panic");
        written.map(|()| digest)
    })?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    fail_io(&format!("checkpoint::before_fsync::{name}"))?;
    file.sync_all()?;
    fail_io(&format!("checkpoint::after_fsync::{name}"))?;
    Ok((total, digest))
}

/// Bytes hashed per `update` call (keeps the hasher's working set in cache).
const HASH_CHUNK: usize = 1 << 20;

/// A failpoint inside I/O code: its injected error is an `EIO`.
pub(super) fn fail_io(name: &str) -> io::Result<()> {
    let _ = name; // unused when failpoints are compiled out
    fail::fail_point!(name, |arg: Option<String>| {
        let code = match arg.as_deref() {
            Some("ENOSPC") => nix::libc::ENOSPC,
            Some("EACCES") => nix::libc::EACCES,
            Some("EROFS") => nix::libc::EROFS,
            _ => nix::libc::EIO,
        };
        Err(io::Error::from_raw_os_error(code))
    });
    Ok(())
}

pub(super) fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

pub(super) fn available_space(dir: &Path) -> io::Result<u64> {
    let st = nix::sys::statvfs::statvfs(dir).map_err(io::Error::from)?;
    Ok(st.blocks_available() as u64 * st.fragment_size() as u64)
}

/// Reads a file and hashes it on the same pass: a second thread hashes each
/// chunk as soon as it is read, so reading and hashing overlap. With `keep`
/// the bytes are returned (read straight into their final buffer); without,
/// two buffers alternate. Returns (bytes, hex sha256, kept bytes).
pub(super) fn read_hashed(path: &Path, keep: bool) -> io::Result<(u64, String, Vec<u8>)> {
    let mut file = File::open(path)?;
    let len = file.metadata()?.len() as usize;
    if keep {
        let mut buf = vec![0u8; len];
        let (total, digest) = std::thread::scope(|scope| -> io::Result<(u64, String)> {
            // The reader fills disjoint chunks in order and hands each filled
            // chunk, now read-only, to the hasher.
            let (tx, rx) = std::sync::mpsc::sync_channel::<&[u8]>(4);
            let hasher = scope.spawn(move || {
                let mut h = Sha256::new();
                for chunk in rx {
                    h.update(chunk);
                }
                hex::encode(h.finalize())
            });
            let mut total = 0u64;
            let mut result = Ok(());
            for chunk in buf.chunks_mut(IO_BUFFER) {
                match read_full(&mut file, chunk) {
                    Ok(n) => {
                        total += n as u64;
                        let filled: &[u8] = chunk;
                        let _ = tx.send(&filled[..n]);
                        if n < filled.len() {
                            break;
                        }
                    }
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                }
            }
            drop(tx);
            let digest = hasher.join().expect("hashing thread does not panic");
            result.map(|()| (total, digest))
        })?;
        buf.truncate(total as usize);
        // A file that grew since stat: hash and keep the rest too.
        let mut rest = Vec::new();
        file.read_to_end(&mut rest)?;
        if !rest.is_empty() {
            buf.extend_from_slice(&rest);
            let digest = hex::encode(Sha256::digest(&buf));
            return Ok((buf.len() as u64, digest, buf));
        }
        return Ok((total, digest, buf));
    }
    let mut hasher = Sha256::new();
    let mut total = 0u64;
    let mut bufs = [vec![0u8; IO_BUFFER], vec![0u8; IO_BUFFER]];
    let mut current = 0;
    let mut pending: Option<usize> = None;
    loop {
        let (a, b) = bufs.split_at_mut(1);
        let (fill_buf, hash_buf) = if current == 0 { (&mut a[0], &b[0]) } else { (&mut b[0], &a[0]) };
        let n = std::thread::scope(|scope| {
            let h = &mut hasher;
            let handle = pending.map(|m| scope.spawn(move || h.update(&hash_buf[..m])));
            let n = read_full(&mut file, fill_buf);
            if let Some(handle) = handle {
                handle.join().expect("hashing thread does not panic");
            }
            n
        })?;
        if n == 0 {
            break;
        }
        total += n as u64;
        pending = Some(n);
        current = 1 - current;
    }
    Ok((total, hex::encode(hasher.finalize()), Vec::new()))
}

/// Reads until `buf` is full or the file ends; returns the bytes read.
fn read_full(file: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}
