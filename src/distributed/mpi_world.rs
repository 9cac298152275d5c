//! The MPI engine (the `mpi` feature): rsmpi over the system's OpenMPI.
//!
//! MPI is initialised once per process asking for `MPI_THREAD_MULTIPLE`
//! (Debian's OpenMPI 4.1 provides it) and requiring at least
//! `MPI_THREAD_SERIALIZED`: the trainer's thread makes the collective calls,
//! one at a time, and a watch thread may call `MPI_Abort` while it is blocked
//! in one (which only `MULTIPLE` formally allows). [`MpiWorld`] is `Send` (the
//! trainer owning it may move to its own thread) and not `Sync`, so the
//! type system keeps the calls serialised. The world it reports must be the one the
//! launcher's variables described ([`WorldInfo`]), or the ranks were started
//! by something else than they think (e.g. `srun` without `--mpi=pmix`,
//! where every task initialises a world of its own).

use mpi::Count;
use mpi::collective::SystemOperation;
use mpi::datatype::{Partition, PartitionMut};
use mpi::environment::Universe;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use super::collective::{Collective, check_root, chunk_bounds, sum_in_rank_order};
use super::error::DistributedError;
use super::world::WorldInfo;

/// An initialised MPI world; dropping it finalises MPI.
pub struct MpiWorld {
    // Declared before `_universe`: the communicator must go first.
    world: SimpleCommunicator,
    _universe: Universe,
    rank: usize,
    size: usize,
}

// SAFETY: MPI handles are plain C handles into the library; the library is
// initialised with at least MPI_THREAD_SERIALIZED (checked in `initialize`), which
// allows calls from any thread as long as no two are concurrent. `MpiWorld`
// is not `Sync` and every call takes `&self`, so only the one thread owning
// it at a time can call.
unsafe impl Send for MpiWorld {}

impl MpiWorld {
    /// Initialises MPI and checks it sees the world the launcher described.
    pub fn initialize(info: &WorldInfo) -> Result<MpiWorld, DistributedError> {
        let (universe, level) = mpi::initialize_with_threading(mpi::Threading::Multiple)
            .ok_or_else(|| DistributedError::Init { why: "MPI was already initialised in this process".into() })?;
        if level < mpi::Threading::Serialized {
            return Err(DistributedError::Init {
                why: format!(
                    "the MPI library provides thread level {level:?}, and rekindle needs at least Serialized \
                     (calls from the trainer's own thread): use an MPI built with thread support (OpenMPI does by default)"
                ),
            });
        }
        let world = universe.world();
        let (mpi_rank, mpi_size) = (world.rank() as usize, world.size() as usize);
        if (mpi_rank, mpi_size) != (info.rank, info.size) {
            return Err(DistributedError::WorldMismatch {
                mpi_size,
                mpi_rank,
                size: info.size,
                rank: info.rank,
                launcher: info.launcher,
            });
        }
        Ok(MpiWorld { world, _universe: universe, rank: mpi_rank, size: mpi_size })
    }

    /// The MPI library's own description (OpenMPI's version line).
    pub fn library_version() -> String {
        // It ends in a NUL byte (FACTS.md).
        mpi::environment::library_version().unwrap_or_default().trim_end_matches('\0').trim().to_string()
    }
}

/// `n` as an MPI count, or [`DistributedError::TooLarge`]: rsmpi's counts
/// are `i32`, and a cast would wrap silently in release builds (#41).
fn count(n: usize, op: &'static str, what: &'static str) -> Result<Count, DistributedError> {
    Count::try_from(n).map_err(|_| DistributedError::TooLarge {
        op,
        what,
        elements: n as u64,
        limit: Count::MAX as u64,
    })
}

/// Displacements of consecutive pieces of the given sizes, each checked:
/// the last piece's offset is the sum of the others, which passes
/// `i32::MAX` long before any one count does (ranks × piece).
fn displacements(counts: &[Count], op: &'static str) -> Result<Vec<Count>, DistributedError> {
    let mut at: u64 = 0;
    let mut out = Vec::with_capacity(counts.len());
    for &n in counts {
        out.push(count(at as usize, op, "a displacement")?);
        at += n.max(0) as u64;
    }
    Ok(out)
}

/// How [`MpiWorld::all_gather_bytes`] splits a gather whose total passes
/// what one MPI call addresses: in round `k` rank `r` sends bytes
/// `[k·piece, k·piece + counts[k][r])` of its buffer, and the counts of a
/// round sum to at most `limit`. One round when everything fits.
fn gather_rounds(lens: &[u64], limit: u64) -> (u64, Vec<Vec<u64>>) {
    let total: u64 = lens.iter().sum();
    let longest = lens.iter().copied().max().unwrap_or(0);
    if total <= limit {
        return (longest.max(1), vec![lens.to_vec()]);
    }
    let piece = (limit / lens.len().max(1) as u64).max(1);
    let rounds = longest.div_ceil(piece);
    let plan = (0..rounds).map(|k| lens.iter().map(|&n| n.saturating_sub(k * piece).min(piece)).collect()).collect();
    (piece, plan)
}

/// The byte ranges [`MpiWorld::broadcast_bytes`] sends one `MPI_Bcast`
/// each: consecutive, covering `len`, none longer than `limit` (rsmpi
/// takes a slice's length as an `i32` count, and panics past it). Empty
/// for nothing to send.
fn broadcast_pieces(len: u64, limit: u64) -> Vec<std::ops::Range<usize>> {
    let limit = limit.max(1);
    (0..len.div_ceil(limit)).map(|k| (k * limit) as usize..((k + 1) * limit).min(len) as usize).collect()
}

impl Collective for MpiWorld {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn engine(&self) -> &'static str {
        "mpi"
    }

    fn sum_in_rank_order(&self, local: &[f32]) -> Result<Vec<f32>, DistributedError> {
        const OP: &str = "sum_in_rank_order";
        // Every rank must contribute the same length: agree on it first,
        // a mismatch would otherwise corrupt buffers or hang.
        let lens = self.all_gather_u64(local.len() as u64);
        if let Some((rank, &got)) = lens.iter().enumerate().find(|(_, l)| **l != lens[0]) {
            return Err(DistributedError::LengthMismatch {
                op: OP,
                rank,
                got: got as usize,
                expected: lens[0] as usize,
            });
        }
        let chunks = chunk_bounds(local.len(), self.size);
        let (mine_start, mine_len) = chunks[self.rank];
        // Reduce-scatter: chunk r of every rank goes to rank r.
        // Element counts: past i32::MAX (8 GiB of f32 on one rank) it is
        // refused, before any rank sends a byte (every rank sees the same
        // lengths, so all refuse together).
        count(local.len(), OP, "the vector")?;
        let send_counts = chunks.iter().map(|&(_, n)| count(n, OP, "a chunk")).collect::<Result<Vec<_>, _>>()?;
        let send_displs = chunks.iter().map(|&(s, _)| count(s, OP, "a displacement")).collect::<Result<Vec<_>, _>>()?;
        let recv_counts = vec![count(mine_len, OP, "a chunk")?; self.size];
        let recv_displs = displacements(&recv_counts, OP)?;
        let mut pieces = vec![0f32; mine_len * self.size];
        {
            let send = Partition::new(local, &send_counts[..], &send_displs[..]);
            let mut recv = PartitionMut::new(&mut pieces[..], &recv_counts[..], &recv_displs[..]);
            self.world.all_to_all_varcount_into(&send, &mut recv);
        }
        let mine = if mine_len == 0 {
            Vec::new()
        } else {
            sum_in_rank_order(pieces.chunks(mine_len)).expect("equal pieces by construction")
        };
        debug_assert_eq!(mine.len(), mine_len);
        let _ = mine_start;
        // All-gather the summed chunks back into the whole vector.
        let mut total = vec![0f32; local.len()];
        {
            let mut recv = PartitionMut::new(&mut total[..], &send_counts[..], &send_displs[..]);
            self.world.all_gather_varcount_into(&mine[..], &mut recv);
        }
        Ok(total)
    }

    fn max_u64(&self, local: u64) -> Result<u64, DistributedError> {
        let mut out = 0u64;
        self.world.all_reduce_into(&local, &mut out, SystemOperation::max());
        Ok(out)
    }

    fn all_gather_bytes(&self, local: &[u8]) -> Result<Vec<Vec<u8>>, DistributedError> {
        const OP: &str = "all_gather_bytes";
        let lens = self.all_gather_u64(local.len() as u64);
        let mut out: Vec<Vec<u8>> = lens.iter().map(|&n| Vec::with_capacity(n as usize)).collect();
        // Every rank computes the same plan from the same lengths, so all
        // make the same calls: more than one only past 2 GiB in total
        // (e.g. 64 ranks × 64 MiB pieces), each within MPI's 32-bit counts.
        let (piece, rounds) = gather_rounds(&lens, Count::MAX as u64);
        let mut all = Vec::new();
        for (k, round) in rounds.iter().enumerate() {
            let counts = round.iter().map(|&n| count(n as usize, OP, "a piece")).collect::<Result<Vec<_>, _>>()?;
            let displs = displacements(&counts, OP)?;
            let from = (k as u64 * piece).min(local.len() as u64) as usize;
            let mine = &local[from..from + round[self.rank] as usize];
            all.clear();
            all.resize(round.iter().sum::<u64>() as usize, 0u8);
            {
                let mut recv = PartitionMut::new(&mut all[..], &counts[..], &displs[..]);
                self.world.all_gather_varcount_into(mine, &mut recv);
            }
            let mut at = 0;
            for (rank, &n) in round.iter().enumerate() {
                out[rank].extend_from_slice(&all[at..at + n as usize]);
                at += n as usize;
            }
        }
        Ok(out)
    }

    fn broadcast_bytes(&self, root: usize, data: &[u8]) -> Result<Vec<u8>, DistributedError> {
        check_root("broadcast_bytes", root, self.size)?;
        let from = self.world.process_at_rank(count(root, "broadcast_bytes", "the root rank")?);
        // The length first, so every rank sizes its buffer and computes the
        // same pieces from the same number, and all make the same calls.
        let mut len = data.len() as u64;
        from.broadcast_into(&mut len);
        let mut buf = if self.rank == root { data.to_vec() } else { vec![0u8; len as usize] };
        for piece in broadcast_pieces(len, Count::MAX as u64) {
            from.broadcast_into(&mut buf[piece]);
        }
        Ok(buf)
    }

    fn barrier(&self) -> Result<(), DistributedError> {
        self.world.barrier();
        Ok(())
    }
}

/// `MPI_Abort(MPI_COMM_WORLD, code)` when MPI is initialised and not yet
/// finalised; returns otherwise. Called from a thread other than the one
/// blocked in the collective, which `MPI_THREAD_MULTIPLE` allows (with only
/// `SERIALIZED` provided it is outside the standard, yet OpenMPI's abort
/// asks its runtime to kill every rank and exits). A guard thread exits the
/// process if the abort does not end it within 10 s.
pub(super) fn abort_if_initialized(code: u8) {
    if !mpi::environment::is_initialized() || mpi::environment::is_finalized() {
        return;
    }
    let _ = std::thread::Builder::new().name("rekindle-abort-guard".into()).spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(10));
        std::process::exit(i32::from(code));
    });
    tracing::error!(code, "aborting the MPI world (MPI_Abort): the launcher ends every rank");
    SimpleCommunicator::world().abort(std::os::raw::c_int::from(code))
}

impl MpiWorld {
    fn all_gather_u64(&self, local: u64) -> Vec<u64> {
        let mut all = vec![0u64; self.size];
        self.world.all_gather_into(&local, &mut all[..]);
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: u64 = Count::MAX as u64;

    #[test]
    fn counts_past_i32_are_refused_with_the_sizes() {
        let three_gib = 3usize << 30;
        match count(three_gib, "all_gather_bytes", "a piece").unwrap_err() {
            DistributedError::TooLarge { op, elements, limit, .. } => {
                assert_eq!((op, elements, limit), ("all_gather_bytes", three_gib as u64, LIMIT));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(count(Count::MAX as usize, "x", "y").unwrap(), Count::MAX);
    }

    #[test]
    fn displacements_that_would_wrap_are_refused() {
        // 64 ranks × 64 MiB: every count fits, their sum does not (#41:
        // it wrapped to negative offsets in release builds).
        let counts = vec![64 << 20; 64];
        let err = displacements(&counts, "all_gather_bytes").unwrap_err();
        assert!(err.to_string().contains("32-bit"), "{err}");
        assert_eq!(displacements(&[3, 0, 5], "x").unwrap(), vec![0, 3, 3]);
        let last = displacements(&vec![1 << 24; 128], "x").unwrap();
        assert_eq!(*last.last().unwrap(), 127 << 24);
    }

    #[test]
    fn a_broadcast_past_two_gib_is_sent_in_pieces_that_each_fit_and_cover_it_in_order() {
        assert!(broadcast_pieces(0, LIMIT).is_empty(), "nothing to send: only the length goes");
        assert_eq!(broadcast_pieces(5, LIMIT), vec![0..5]);
        assert_eq!(broadcast_pieces(10, 4), vec![0..4, 4..8, 8..10]);
        assert_eq!(broadcast_pieces(8, 4), vec![0..4, 4..8]);
        let len = (5u64 << 30) + 3;
        let pieces = broadcast_pieces(len, LIMIT);
        assert_eq!(pieces.len(), 3);
        let mut at = 0;
        for piece in &pieces {
            assert_eq!(piece.start, at);
            count(piece.len(), "broadcast_bytes", "a piece").unwrap();
            at = piece.end;
        }
        assert_eq!(at as u64, len);
    }

    #[test]
    fn a_gather_that_fits_is_one_round() {
        let (_, rounds) = gather_rounds(&[5, 0, 7], LIMIT);
        assert_eq!(rounds, vec![vec![5, 0, 7]]);
    }

    #[test]
    fn a_gather_past_two_gib_is_split_into_rounds_that_each_fit() {
        // ZeRO-1 at ~537 M f32 parameters on 2 ranks, uneven; 64 × 64 MiB.
        for lens in [vec![3u64 << 30, (3u64 << 30) - 17], vec![64u64 << 20; 64], vec![5u64 << 30, 0, 1]] {
            let (piece, rounds) = gather_rounds(&lens, LIMIT);
            assert!(rounds.len() > 1, "{lens:?}");
            for round in &rounds {
                assert!(round.iter().sum::<u64>() <= LIMIT, "{round:?}");
                let counts: Vec<Count> = round.iter().map(|&n| count(n as usize, "x", "y").unwrap()).collect();
                displacements(&counts, "x").unwrap();
            }
            // Each rank's bytes are sent once, in order, all of them.
            for (r, &len) in lens.iter().enumerate() {
                let mut at = 0u64;
                for (k, round) in rounds.iter().enumerate() {
                    if round[r] > 0 {
                        assert_eq!(k as u64 * piece, at, "rank {r} round {k}");
                    }
                    at += round[r];
                }
                assert_eq!(at, len, "rank {r}");
            }
        }
    }
}
