//! Hashed file I/O: every byte of a checkpoint is hashed on the same pass
//! that writes or reads it, with the I/O on other threads, so a save or a
//! load costs the longer of I/O and SHA-256 rather than their sum. Also the
//! fsyncs and the free-space query of the commit protocol, and the
//! failpoints inside its I/O (`checkpoint::before_fsync::<file>`,
//! `checkpoint::after_fsync::<file>`, `fs::direct_io_unsupported`, which
//! makes every file take the buffered path below, and `fs::mmap_unsupported`,
//! which makes loads read files instead of mapping them; the store uses
//! [`fail_io`] for its own I/O failpoints too).
//!
//! Writes go through a pool of aligned blocks that lives as long as the
//! process: the first save allocates and touches them, later saves reuse
//! them (fresh memory is slow to touch, docs/performance.md). A block is
//! filled from the tensors' memory and hashed while it is hot in the cache,
//! then handed to one of the file's writer threads, so block *n* is copied
//! and hashed while the blocks before it are on their way to the disk. How
//! the writers write is the file's [`WritePlan`] (`write_mode.rs`: measured
//! per filesystem, or configured): its block size, its writers (the queue
//! depth), and direct I/O or the page cache.
//!
//! - Direct: `O_DIRECT` for the aligned blocks (no page-cache copy, no dirty
//!   pages left for the final fsync); where the filesystem refuses the flag
//!   or an aligned write (`EINVAL`), the file falls back to buffered writes.
//!   Which one was used is detected per file, never assumed.
//! - Buffered: each block's writeback is started as soon as it is written
//!   (`sync_file_range(WRITE)`), so the disk works while the next blocks
//!   are hashed, and blocks a few behind are waited for and dropped from
//!   the page cache (`sync_file_range(WAIT)` + `posix_fadvise(DONTNEED)`):
//!   a checkpoint of any size keeps at most [`DIRTY_BEHIND`] bytes per
//!   file in the cache, and the final fsync has almost nothing left to do.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::ptr::NonNull;
use std::sync::Mutex;
use std::sync::mpsc;

use sha2::{Digest, Sha256};

use super::safetensors_io;
use super::tensor::{HostTensor, SharedBytes, TensorSet};
use super::write_mode::{IoMode, WritePlan};
use crate::confine::Dir;

/// Bytes per read call, and the size of the pooled blocks reads use.
const IO_BUFFER: usize = 8 << 20;

/// Alignment of direct I/O: buffers, file offsets and lengths. 4096 covers
/// every logical block size in use (512 and 4096).
const DIRECT_ALIGN: usize = 4096;

/// Blocks one file's write keeps in flight beyond its writers' (one being
/// filled and hashed, one queued).
const BLOCKS_BESIDE_WRITERS: usize = 2;

/// Bytes the pool keeps between saves; blocks returned beyond it are freed.
const POOL_MAX_BYTES: usize = 256 << 20;

/// Bytes copied and hashed at a time inside a block: small enough that the
/// hash reads what the copy just wrote from the cache.
const HASH_CHUNK: usize = 256 << 10;

/// Buffered writes: bytes per file whose writeback may still be running
/// before a writer waits for the oldest and drops it from the page cache.
/// Enough to keep a disk's queue full (a few of its largest requests), far
/// below what would crowd the cache.
const DIRTY_BEHIND: usize = 64 << 20;

/// One `len`-byte, [`DIRECT_ALIGN`]-aligned block of memory.
struct Block {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a `Block` owns its allocation exclusively (like a `Box<[u8]>`).
unsafe impl Send for Block {}

impl Block {
    fn layout(len: usize) -> std::alloc::Layout {
        std::alloc::Layout::from_size_align(len, DIRECT_ALIGN).expect("valid block layout")
    }

    fn new(len: usize) -> Block {
        let layout = Block::layout(len);
        // SAFETY: the layout has a non-zero size (blocks are at least one
        // aligned page). Zeroed so that the bytes are initialised (and the
        // pages touched once, here).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        Block { ptr, len }
    }

    fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` points to `len` initialised bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        // SAFETY: allocated in `Block::new` with the same layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), Block::layout(self.len)) }
    }
}

/// Blocks kept between saves (of any size; a plan's block size is fixed
/// for the process once measured, so they are nearly always one size).
static POOL: Mutex<Vec<Block>> = Mutex::new(Vec::new());

fn take_block(len: usize) -> Block {
    let len = len.next_multiple_of(DIRECT_ALIGN).max(DIRECT_ALIGN);
    let mut pool = POOL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    match pool.iter().rposition(|b| b.len == len) {
        Some(i) => pool.swap_remove(i),
        None => {
            drop(pool);
            Block::new(len)
        }
    }
}

fn return_block(block: Block) {
    let mut pool = POOL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let kept: usize = pool.iter().map(|b| b.len).sum();
    if kept + block.len <= POOL_MAX_BYTES {
        pool.push(block);
    }
}

/// How a file's bytes reached the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum WriteMode {
    /// `O_DIRECT` for the aligned blocks, the page cache for the tail.
    Direct,
    /// Through the page cache (small files, a buffered plan, or a
    /// filesystem that refused `O_DIRECT`).
    Buffered,
}

/// What [`write_hashed`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Written {
    pub bytes: u64,
    /// Hex SHA-256 of the file.
    pub sha256: String,
    pub mode: WriteMode,
}

/// [`write_hashed_with`] the default plan (buffered): for the small files
/// of a checkpoint and everything not worth a measured plan.
pub(super) fn write_hashed(dir: &Dir, name: &str, parts: &[&[u8]]) -> io::Result<Written> {
    write_hashed_with(dir, name, parts, &WritePlan::DEFAULT)
}

/// Creates `name` in the directory handle `dir` (`O_EXCL`, never through a
/// link: [`Dir::create_new`]), writes the concatenation of `parts` into it as `plan`
/// says, hashing the bytes on the way (nothing is read back), and fsyncs it
/// once.
///
/// Files of at least one aligned page go through the block pipeline (module
/// doc); smaller ones (`state.json`, the manifest) with one buffered write.
pub(super) fn write_hashed_with(dir: &Dir, name: &str, parts: &[&[u8]], plan: &WritePlan) -> io::Result<Written> {
    let mut file = dir.create_new(name, 0o666)?;
    let total: u64 = parts.iter().map(|p| p.len() as u64).sum();
    let (sha256, mode) = if total < DIRECT_ALIGN as u64 {
        let mut h = Sha256::new();
        for part in parts {
            h.update(part);
            file.write_all(part)?;
        }
        (hex::encode(h.finalize()), WriteMode::Buffered)
    } else {
        let direct = plan.mode == IoMode::Direct
            && fail_io("fs::direct_io_unsupported").and_then(|()| set_direct(&file, true)).is_ok();
        write_pipelined(&file, parts, plan, direct)?
    };
    fail_io(&format!("checkpoint::before_fsync::{name}"))?;
    file.sync_all()?;
    fail_io(&format!("checkpoint::after_fsync::{name}"))?;
    if plan.mode == IoMode::Buffered {
        // Durable now: the pages the writers did not drop yet go too.
        drop_cache_range(&file, 0, 0);
    }
    Ok(Written { bytes: total, sha256, mode })
}

/// Drops what the page cache holds of the file `name` of `dir` (clean
/// pages only: call it after an fsync). Advice: errors are ignored.
pub(super) fn drop_cached(dir: &Dir, name: &str) {
    if let Ok(file) = dir.open_read(name) {
        drop_cache_range(&file, 0, 0);
    }
}

/// Turns `O_DIRECT` on or off for an open file; an error (`EINVAL`) where
/// the filesystem does not support it.
fn set_direct(file: &File, on: bool) -> io::Result<()> {
    use nix::libc::{F_GETFL, F_SETFL, O_DIRECT, fcntl};
    let fd = file.as_raw_fd();
    // SAFETY: plain fcntl calls on a descriptor this function borrows.
    let flags = unsafe { fcntl(fd, F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    let flags = if on { flags | O_DIRECT } else { flags & !O_DIRECT };
    // SAFETY: as above.
    if unsafe { fcntl(fd, F_SETFL, flags) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A filled block on its way to the writer: its bytes `[..len]` belong at `offset`.
struct Filled {
    block: Block,
    len: usize,
    offset: u64,
}

/// The block pipeline of [`write_hashed_with`]: this thread copies each part
/// into pooled blocks of the plan's size and hashes every chunk right after
/// copying it; the plan's writer threads write the filled blocks and hand
/// them back. Returns the hex SHA-256 and how the data was written.
fn write_pipelined(file: &File, parts: &[&[u8]], plan: &WritePlan, direct: bool) -> io::Result<(String, WriteMode)> {
    let block_len = plan.block_bytes.next_multiple_of(DIRECT_ALIGN).max(DIRECT_ALIGN);
    let writers_n = plan.queue_depth.max(1);
    let blocks_per_file = writers_n + BLOCKS_BESIDE_WRITERS;
    let (to_writer, filled_rx) = mpsc::sync_channel::<Filled>(blocks_per_file);
    let (free_tx, free_rx) = mpsc::channel::<Block>();
    // Buffered: each writer keeps its share of DIRTY_BEHIND in flight.
    let behind = (DIRTY_BEHIND / block_len / writers_n).max(1);
    std::thread::scope(|scope| {
        // Writers share the queue of filled blocks: with several, blocks
        // are in the device's queue while the next write is being issued.
        // The queue goes away with the last of them, so the filler's `send`
        // fails instead of waiting forever when they all stopped on errors.
        let filled = std::sync::Arc::new(Mutex::new(filled_rx));
        let writers: Vec<_> = (0..writers_n)
            .map(|_| {
                let (filled, free_tx) = (std::sync::Arc::clone(&filled), free_tx.clone());
                scope.spawn(move || write_blocks(file, &filled, free_tx, direct, behind))
            })
            .collect();
        drop((filled, free_tx));
        let mut hasher = Sha256::new();
        let mut allocated = 0;
        let mut offset = 0u64;
        let mut pieces = parts.iter().flat_map(|p| p.chunks(HASH_CHUNK)).peekable();
        let mut sent_all = true;
        while pieces.peek().is_some() {
            let mut block = if allocated < blocks_per_file {
                allocated += 1;
                take_block(block_len)
            } else {
                match free_rx.recv() {
                    Ok(block) => block,
                    // The writer stopped (an error): its result says why.
                    Err(_) => {
                        sent_all = false;
                        break;
                    }
                }
            };
            let mut len = 0;
            let buf = block.as_mut_slice();
            while let Some(piece) = pieces.peek_mut() {
                let n = piece.len().min(block_len - len);
                if n == 0 {
                    break;
                }
                let (now, later) = piece.split_at(n);
                buf[len..len + n].copy_from_slice(now);
                hasher.update(&buf[len..len + n]);
                len += n;
                *piece = later;
                if piece.is_empty() {
                    pieces.next();
                }
            }
            if to_writer.send(Filled { block, len, offset }).is_err() {
                sent_all = false;
                break;
            }
            offset += len as u64;
        }
        drop(to_writer);
        let mut mode = if direct { WriteMode::Direct } else { WriteMode::Buffered };
        for writer in writers {
            if writer.join().unwrap_or_else(|p| std::panic::resume_unwind(p))? == WriteMode::Buffered {
                mode = WriteMode::Buffered;
            }
        }
        for block in free_rx.try_iter() {
            return_block(block);
        }
        if !sent_all {
            return Err(io::Error::other("the writer thread stopped without reporting an error"));
        }
        Ok((hex::encode(hasher.finalize()), mode))
    })
}

/// A writer of [`write_pipelined`] (one per unit of queue depth). With
/// `direct`, aligned lengths go out with `O_DIRECT` and a file's unaligned
/// tail through the page cache (`O_DIRECT` is turned off for it: the flag
/// belongs to the open file, so a block another writer issues after that is
/// buffered too, which changes nothing on disk). A direct write refused with
/// `EINVAL` (a filesystem that accepts the flag but not the I/O) switches the
/// file to buffered writes. Buffered blocks have their writeback started at
/// once; once more than `behind` of this writer's are in flight, the oldest
/// is waited for and dropped from the page cache.
fn write_blocks(
    file: &File,
    filled: &Mutex<mpsc::Receiver<Filled>>,
    free: mpsc::Sender<Block>,
    direct: bool,
    behind: usize,
) -> io::Result<WriteMode> {
    let mut mode = if direct { WriteMode::Direct } else { WriteMode::Buffered };
    let mut in_flight: VecDeque<(u64, usize)> = VecDeque::new();
    loop {
        let next = filled.lock().unwrap_or_else(std::sync::PoisonError::into_inner).recv();
        let Ok(Filled { block, len, offset }) = next else { break };
        let bytes = &block.as_slice()[..len];
        if mode == WriteMode::Direct {
            let aligned = len - len % DIRECT_ALIGN;
            match file.write_all_at(&bytes[..aligned], offset) {
                Ok(()) => {
                    if aligned < len {
                        set_direct(file, false)?;
                        file.write_all_at(&bytes[aligned..], offset + aligned as u64)?;
                    }
                }
                Err(e) if e.raw_os_error() == Some(nix::libc::EINVAL) => {
                    tracing::debug!(error = %e, "direct I/O refused by the filesystem; writing through the page cache");
                    set_direct(file, false)?;
                    mode = WriteMode::Buffered;
                    file.write_all_at(bytes, offset)?;
                }
                Err(e) => return Err(e),
            }
        } else {
            file.write_all_at(bytes, offset)?;
            start_writeback(file, offset, len);
            in_flight.push_back((offset, len));
            if in_flight.len() > behind
                && let Some((old, old_len)) = in_flight.pop_front()
            {
                finish_writeback(file, old, old_len);
            }
        }
        if free.send(block).is_err() {
            break;
        }
    }
    Ok(mode)
}

/// Asks the kernel to start writing back `len` bytes at `offset` now
/// (`sync_file_range(SYNC_FILE_RANGE_WRITE)`), so the disk works while the
/// next blocks are hashed. Only a hint: durability comes from the fsync.
fn start_writeback(file: &File, offset: u64, len: usize) {
    // SAFETY: a plain syscall on a descriptor this function borrows.
    let _ = unsafe {
        nix::libc::sync_file_range(file.as_raw_fd(), offset as i64, len as i64, nix::libc::SYNC_FILE_RANGE_WRITE)
    };
}

/// Waits until the writeback of `len` bytes at `offset` (started by
/// [`start_writeback`]) is done, then drops those pages from the page
/// cache: the write throttles itself to the disk's pace with a bounded
/// window instead of filling the cache with the whole checkpoint. Only
/// advice and waiting: durability comes from the fsync.
fn finish_writeback(file: &File, offset: u64, len: usize) {
    use nix::libc::{SYNC_FILE_RANGE_WAIT_AFTER, SYNC_FILE_RANGE_WAIT_BEFORE, SYNC_FILE_RANGE_WRITE};
    let flags = SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER;
    // SAFETY: a plain syscall on a descriptor this function borrows.
    let _ = unsafe { nix::libc::sync_file_range(file.as_raw_fd(), offset as i64, len as i64, flags) };
    drop_cache_range(file, offset, len);
}

/// `posix_fadvise(DONTNEED)` of `len` bytes at `offset` (0: to the end):
/// the kernel drops those pages if they are clean.
fn drop_cache_range(file: &File, offset: u64, len: usize) {
    // SAFETY: a plain syscall on a descriptor this function borrows.
    let _ = unsafe {
        nix::libc::posix_fadvise(file.as_raw_fd(), offset as i64, len as i64, nix::libc::POSIX_FADV_DONTNEED)
    };
}

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

/// Reads a file and hashes it on the same pass: a second thread hashes each
/// chunk as soon as it is read, so reading and hashing overlap. With `keep`
/// the bytes are returned (read straight into their final buffer); without,
/// two buffers alternate. Returns (bytes, hex sha256, kept bytes). `file`
/// is opened by the caller (through a handle or `confine`).
pub(super) fn read_hashed(mut file: File, keep: bool) -> io::Result<(u64, String, Vec<u8>)> {
    if keep {
        let len = file.metadata()?.len() as usize;
        let mut buf = vec![0u8; len];
        let (mut hasher, mut total, _) = read_into_hashed(&mut file, Sha256::new(), [buf.as_mut_slice()])?;
        buf.truncate(total as usize);
        // A file that grew since stat: hash and keep the rest too.
        let mut rest = Vec::new();
        file.read_to_end(&mut rest)?;
        hasher.update(&rest);
        total += rest.len() as u64;
        buf.extend_from_slice(&rest);
        return Ok((total, hex::encode(hasher.finalize()), buf));
    }
    let (hasher, total) = hash_rest(&mut file, Sha256::new(), 0)?;
    Ok((total, hex::encode(hasher.finalize()), Vec::new()))
}

/// What [`read_tensors_hashed`] read.
pub(super) struct ReadTensors {
    /// Bytes in the file (all of them were hashed).
    pub bytes: u64,
    /// Hex SHA-256 of the file.
    pub sha256: String,
    /// The tensors, or why the bytes are not a safetensors file.
    pub tensors: Result<TensorSet, String>,
}

/// Reads a safetensors file in one pass straight into the buffers its
/// tensors will live in, hashing every byte on the way: the header is read
/// and checked first ([`safetensors_io::parse_layout`]), then each tensor's
/// buffer is allocated at its exact size and filled by `read` while a second
/// thread hashes the chunks already filled. Nothing is copied after the read
/// and nothing is parsed twice. A file whose header does not check is still
/// hashed to its end (the caller reports a hash mismatch before invalid
/// content, as verification does).
pub(super) fn read_tensors_hashed(mut file: File) -> io::Result<ReadTensors> {
    let file_len = file.metadata()?.len();
    let mut hasher = Sha256::new();
    let mut prefix = [0u8; 8];
    let n = read_full(&mut file, &mut prefix)?;
    hasher.update(&prefix[..n]);
    let mut total = n as u64;
    let layout = if n < prefix.len() {
        Err(format!("shorter than a safetensors header ({file_len} bytes)"))
    } else {
        match safetensors_io::checked_header_len(&prefix, file_len) {
            Err(reason) => Err(reason),
            Ok(len) => {
                let mut header = vec![0u8; len];
                let n = read_full(&mut file, &mut header)?;
                hasher.update(&header[..n]);
                total += n as u64;
                safetensors_io::parse_layout(&header, file_len)
            }
        }
    };
    let layout = match layout {
        Ok(layout) => layout,
        Err(reason) => {
            let (hasher, total) = hash_rest(&mut file, hasher, total)?;
            return Ok(ReadTensors { bytes: total, sha256: hex::encode(hasher.finalize()), tensors: Err(reason) });
        }
    };
    let mut buffers: Vec<Vec<u8>> = layout.iter().map(|t| vec![0u8; (t.end - t.start) as usize]).collect();
    let (hasher, read, complete) = read_into_hashed(&mut file, hasher, buffers.iter_mut().map(|b| b.as_mut_slice()))?;
    total += read;
    // Bytes past the end the header announced (a file that grew since stat).
    let (hasher, total) = hash_rest(&mut file, hasher, total)?;
    let tensors = if !complete || total != file_len {
        Err(format!("the file changed while it was read ({file_len} bytes at the start, {total} read)"))
    } else {
        layout
            .into_iter()
            .zip(buffers)
            .map(|(t, data)| {
                let tensor =
                    HostTensor::new(t.dtype, t.shape, data).map_err(|e| format!("tensor `{}`: {e}", t.name))?;
                Ok((t.name, tensor))
            })
            .collect()
    };
    Ok(ReadTensors { bytes: total, sha256: hex::encode(hasher.finalize()), tensors })
}

/// A mapped file is hashed in windows of this many bytes, the kernel asked
/// to read each next window while the current one is hashed.
const MAP_AHEAD: usize = 32 << 20;

/// Maps a safetensors file read-only and hashes every byte of the mapping:
/// the tensors share its pages (the page cache) instead of being read into
/// fresh memory, which a process pays for at the first touch of every page
/// (~0.7 s/GiB on the VMs of docs/performance.md) and which the trainer
/// would copy from once more anyway. Verified like
/// [`read_tensors_hashed`]: the header is checked, every byte hashed, and the
/// hash compared by the caller before any tensor is used. The kernel is
/// asked to read ahead of the hash (`MADV_WILLNEED`), so a cold file is read
/// while the bytes before are hashed. An empty file, or one that cannot be
/// mapped, is read instead.
///
/// The mapping is of a committed checkpoint's file, which rekindle never
/// writes again; another process truncating it while it is mapped would make
/// the reads fault (SIGBUS), as for any mapped file (docs/checkpoint-format.md).
pub(super) fn map_tensors_hashed(file: File) -> io::Result<ReadTensors> {
    let file_len = file.metadata()?.len();
    if file_len == 0 || usize::try_from(file_len).is_err() {
        return read_tensors_hashed(file);
    }
    // `fs::mmap_unsupported` stands in for a file that cannot be mapped.
    // SAFETY: a committed checkpoint's files are never written again (the
    // store writes new checkpoints under new names and only renames and
    // deletes whole directories); see the doc comment for what another
    // process could still do.
    let mapped = fail_io("fs::mmap_unsupported").and_then(|()| unsafe { memmap2::MmapOptions::new().map(&file) });
    let map = match mapped {
        Ok(map) => std::sync::Arc::new(map),
        Err(e) => {
            tracing::debug!(error = %e, "cannot map a checkpoint file; reading it");
            return read_tensors_hashed(file);
        }
    };
    let _ = map.advise(memmap2::Advice::Sequential);
    let bytes: &[u8] = &map;
    // What was mapped is what is checked and shared (the file may have
    // changed size since the length above was read).
    let file_len = bytes.len() as u64;
    let mut hasher = Sha256::new();
    for (i, chunk) in bytes.chunks(MAP_AHEAD).enumerate() {
        // While this window is hashed, the kernel reads the next one.
        let next = (i + 1) * MAP_AHEAD;
        if next < bytes.len() {
            let _ = map.advise_range(memmap2::Advice::WillNeed, next, MAP_AHEAD.min(bytes.len() - next));
        }
        hasher.update(chunk);
    }
    let sha256 = hex::encode(hasher.finalize());
    let tensors = mapped_layout(bytes, file_len).and_then(|(data_start, layout)| {
        layout
            .into_iter()
            .map(|t| {
                let (start, end) = (data_start + t.start as usize, data_start + t.end as usize);
                let owner: std::sync::Arc<dyn Send + Sync> = map.clone();
                // SAFETY: the mapping outlives the bytes (`owner`), and
                // [start, end) lies inside it (the layout covers the data
                // section exactly); nothing of this process writes it.
                let shared = unsafe { SharedBytes::new(owner, bytes[start..end].as_ptr(), end - start) };
                let tensor =
                    HostTensor::shared(t.dtype, t.shape, shared).map_err(|e| format!("tensor `{}`: {e}", t.name))?;
                Ok((t.name, tensor))
            })
            .collect()
    });
    Ok(ReadTensors { bytes: file_len, sha256, tensors })
}

/// Where the data section of a whole safetensors file in memory starts,
/// and its tensors in the order of their bytes (the checks of
/// [`read_tensors_hashed`]).
fn mapped_layout(bytes: &[u8], file_len: u64) -> Result<(usize, Vec<safetensors_io::TensorLayout>), String> {
    let Some(prefix) = bytes.first_chunk::<8>() else {
        return Err(format!("shorter than a safetensors header ({file_len} bytes)"));
    };
    let data_start = 8 + safetensors_io::checked_header_len(prefix, file_len)?;
    safetensors_io::parse_layout(&bytes[8..data_start], file_len).map(|layout| (data_start, layout))
}

/// Fills `buffers` in order from `file` while a second thread feeds each
/// filled chunk to `hasher`. Returns the hasher, the bytes read, and whether
/// every buffer was filled (false when the file ended first).
fn read_into_hashed<'a>(
    file: &mut File,
    hasher: Sha256,
    buffers: impl IntoIterator<Item = &'a mut [u8]>,
) -> io::Result<(Sha256, u64, bool)> {
    std::thread::scope(|scope| {
        // The reader fills disjoint chunks in order and hands each filled
        // chunk, now read-only, to the hasher.
        let (tx, rx) = mpsc::sync_channel::<&[u8]>(4);
        let hashing = scope.spawn(move || {
            let mut hasher = hasher;
            for chunk in rx {
                hasher.update(chunk);
            }
            hasher
        });
        let mut total = 0u64;
        let mut complete = true;
        let mut result = Ok(());
        'buffers: for buffer in buffers {
            prefault(buffer);
            for chunk in buffer.chunks_mut(IO_BUFFER) {
                match read_full(file, chunk) {
                    Ok(n) => {
                        total += n as u64;
                        let filled: &[u8] = chunk;
                        let _ = tx.send(&filled[..n]);
                        if n < filled.len() {
                            complete = false;
                            break 'buffers;
                        }
                    }
                    Err(e) => {
                        result = Err(e);
                        break 'buffers;
                    }
                }
            }
        }
        drop(tx);
        let hasher = hashing.join().expect("hashing thread does not panic");
        result.map(|()| (hasher, total, complete))
    })
}

/// Below this many bytes a buffer is not prefaulted: the system call costs
/// more than the few faults it saves.
const PREFAULT_MIN: usize = 2 << 20;

/// Maps in the pages of a fresh buffer in one system call
/// (`MADV_POPULATE_WRITE`, Linux 5.14+) before `read` fills it. Fresh memory
/// is what a load pays for beyond verification (a fault per 4 KiB page,
/// ~0.7 s/GiB on the VMs measured in docs/performance.md); populating the
/// range in one call took ~8 % less CPU than faulting page by page inside
/// `read` (256 MiB read from the page cache, six rounds interleaved,
/// 0.145 vs 0.158 s). Advice only: on an older kernel, or memory that cannot be
/// populated, the pages fault in as before.
fn prefault(buf: &mut [u8]) {
    const PAGE: usize = 4096;
    if buf.len() < PREFAULT_MIN {
        return;
    }
    let start = buf.as_mut_ptr() as usize;
    let first = start.next_multiple_of(PAGE);
    let end = (start + buf.len()) / PAGE * PAGE;
    let Some(addr) = NonNull::new(first as *mut std::ffi::c_void) else { return };
    if end > first {
        // SAFETY: [first, end) lies inside `buf`, which we borrow mutably;
        // MADV_POPULATE_WRITE only faults pages in, it never changes their
        // contents (fresh pages stay zero, touched ones keep their bytes).
        let _ = unsafe { nix::sys::mman::madvise(addr, end - first, nix::sys::mman::MmapAdvise::MADV_POPULATE_WRITE) };
    }
}

/// Hashes `file` from where it stands to its end through two reused
/// buffers, reading one while the other is hashed. Returns the hasher and
/// `total` plus the bytes read.
fn hash_rest(file: &mut File, mut hasher: Sha256, mut total: u64) -> io::Result<(Sha256, u64)> {
    // Pooled blocks: verifying allocates nothing after the first save or check.
    let mut bufs = [take_block(IO_BUFFER), take_block(IO_BUFFER)];
    let result = (|| {
        let mut current = 0;
        let mut pending: Option<usize> = None;
        loop {
            let (a, b) = bufs.split_at_mut(1);
            let (fill_buf, hash_buf) = if current == 0 {
                (a[0].as_mut_slice(), b[0].as_slice())
            } else {
                (b[0].as_mut_slice(), a[0].as_slice())
            };
            let n = std::thread::scope(|scope| {
                let h = &mut hasher;
                let handle = pending.map(|m| scope.spawn(move || h.update(&hash_buf[..m])));
                let n = read_full(file, fill_buf);
                if let Some(handle) = handle {
                    handle.join().expect("hashing thread does not panic");
                }
                n
            })?;
            if n == 0 {
                return Ok(());
            }
            total += n as u64;
            pending = Some(n);
            current = 1 - current;
        }
    })();
    let [a, b] = bufs;
    return_block(a);
    return_block(b);
    result.map(|()| (hasher, total))
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::tensor::DType;
    use std::path::Path;

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8).collect()
    }

    #[test]
    fn written_files_hold_exactly_the_parts_and_their_hash_at_every_size_alignment_and_plan() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = Dir::open(tmp.path()).unwrap();
        // Empty, tiny, one aligned page, around the block size, and parts
        // that end mid-block and mid-page.
        const B: usize = 1 << 20;
        let cases: Vec<Vec<usize>> = vec![
            vec![],
            vec![1],
            vec![4095],
            vec![4096],
            vec![B],
            vec![B + 1],
            vec![48, 3 * B / 2 + 7, 0, 4096 * 3 + 5],
            vec![B - 1, 2, B + 4093],
        ];
        // Every mode, a block size and queue depth each way (the small
        // blocks make the buffered writers drop pages behind them).
        let plans = [
            WritePlan::DEFAULT,
            WritePlan { mode: IoMode::Buffered, block_bytes: 64 << 10, queue_depth: 3 },
            WritePlan { mode: IoMode::Direct, block_bytes: B, queue_depth: 2 },
            WritePlan { mode: IoMode::Direct, block_bytes: 64 << 10, queue_depth: 5 },
            WritePlan { mode: IoMode::Direct, block_bytes: 8 << 20, queue_depth: 1 },
        ];
        for (p, plan) in plans.iter().enumerate() {
            for (i, sizes) in cases.iter().enumerate() {
                let parts: Vec<Vec<u8>> =
                    sizes.iter().enumerate().map(|(j, &n)| pattern(n, (i * 7 + j + p) as u8)).collect();
                let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
                let name = format!("f{p}-{i}");
                let path = tmp.path().join(&name);
                let written = write_hashed_with(&dir, &name, &refs, plan).unwrap();
                let expected = parts.concat();
                let on_disk = std::fs::read(&path).unwrap();
                assert!(on_disk == expected, "{plan:?}, case {sizes:?}: the file differs from its parts");
                assert_eq!(written.bytes, expected.len() as u64);
                assert_eq!(written.sha256, hex::encode(Sha256::digest(&expected)), "{plan:?}, case {sizes:?}");
                if expected.len() < DIRECT_ALIGN || plan.mode == IoMode::Buffered {
                    assert_eq!(written.mode, WriteMode::Buffered);
                }
                assert_eq!(read_hashed(File::open(&path).unwrap(), false).unwrap().1, written.sha256);
            }
        }
        assert!(write_hashed(&dir, "f0-0", &[b"again"]).is_err(), "never overwrites a file");
    }

    fn safetensors_file(path: &Path) -> (TensorSet, Vec<u8>) {
        let mut set = TensorSet::new();
        set.insert(
            "b".into(),
            HostTensor::new(DType::U8, vec![3, IO_BUFFER / 3 + 1], pattern(3 * (IO_BUFFER / 3 + 1), 1)).unwrap(),
        );
        set.insert("a".into(), HostTensor::from_f32(vec![2, 2], &[1.0, 2.0, 3.0, 4.0]));
        set.insert("c".into(), HostTensor::new(DType::I64, vec![0], Vec::new()).unwrap());
        let mut bytes = Vec::new();
        safetensors_io::write(&mut bytes, &set, &BTreeMap::new()).unwrap();
        std::fs::write(path, &bytes).unwrap();
        (set, bytes)
    }

    #[test]
    fn tensors_are_read_in_one_pass_with_the_hash_of_the_whole_file() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("t.safetensors");
        let (set, bytes) = safetensors_file(&path);
        let read = read_tensors_hashed(File::open(&path).unwrap()).unwrap();
        assert_eq!(read.bytes, bytes.len() as u64);
        assert_eq!(read.sha256, hex::encode(Sha256::digest(&bytes)));
        assert_eq!(read.tensors.unwrap(), set);
        assert_eq!(safetensors_io::read(&bytes).unwrap(), set);
    }

    #[test]
    fn a_damaged_header_is_reported_as_content_and_the_whole_file_is_still_hashed() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("t.safetensors");
        let (_, mut bytes) = safetensors_file(&path);
        bytes[9] = b'[';
        std::fs::write(&path, &bytes).unwrap();
        let read = read_tensors_hashed(File::open(&path).unwrap()).unwrap();
        assert_eq!((read.bytes, read.sha256), (bytes.len() as u64, hex::encode(Sha256::digest(&bytes))));
        assert!(read.tensors.unwrap_err().contains("not a JSON object"));
        // Cut short: the layout no longer matches the file's length.
        std::fs::write(&path, &bytes[..bytes.len() - 5]).unwrap();
        let read = read_tensors_hashed(File::open(&path).unwrap()).unwrap();
        assert_eq!(read.bytes, bytes.len() as u64 - 5);
        assert!(read.tensors.is_err());
        std::fs::write(&path, &bytes[..5]).unwrap();
        assert!(
            read_tensors_hashed(File::open(&path).unwrap())
                .unwrap()
                .tensors
                .unwrap_err()
                .contains("shorter than a safetensors header")
        );
    }
}
