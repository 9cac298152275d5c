//! The collective operations ranks use to agree, behind one trait so the
//! training loop is the same code for one process ([`Solo`]) and for MPI
//! (`mpi_world.rs`, the `mpi` feature).
//!
//! **Determinism.** Bit-exact resume needs every reduction to give the same
//! bits every time for a fixed world size. MPI's own `MPI_SUM` does not
//! promise an order (it may change with the algorithm MPI picks for a
//! message size), so the float sum here is ours: each rank owns one
//! contiguous chunk of the vector ([`chunk_bounds`]), receives that chunk
//! from every rank (all-to-all), adds the pieces in rank order
//! ([`sum_in_rank_order`]: `((x₀ + x₁) + x₂) + …`, the order one process
//! averaging its replicas uses), and the summed chunks are gathered back
//! (all-gather). That is a reduce-scatter plus an all-gather: each rank
//! sends and receives about twice the vector, as a ring all-reduce would,
//! whatever the world size.

use std::sync::{Arc, Mutex, PoisonError};

use super::error::DistributedError;

/// Collective operations over all ranks of the world. Every rank must make
/// the same calls in the same order (they block until all ranks arrive).
/// `Send` (a trainer moves to its own thread) but not `Sync`: one thread
/// at a time makes the calls, which is what MPI is initialised for
/// (`MPI_THREAD_SERIALIZED`).
pub trait Collective: Send {
    /// This process's rank.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn size(&self) -> usize;
    /// The engine's name for records (`solo`, `mpi`).
    fn engine(&self) -> &'static str;
    /// Element-wise sum over ranks of `local` (the same length everywhere),
    /// added in rank order: every rank gets the same bits, every time.
    fn sum_in_rank_order(&self, local: &[f32]) -> Result<Vec<f32>, DistributedError>;
    /// The largest `local` over ranks (a stop flag, the earliest deadline
    /// as a negated time, …).
    fn max_u64(&self, local: u64) -> Result<u64, DistributedError>;
    /// Every rank's `local` bytes, in rank order, on every rank.
    fn all_gather_bytes(&self, local: &[u8]) -> Result<Vec<Vec<u8>>, DistributedError>;
    /// Rank `root`'s `data` on every rank (the others' `data` is ignored:
    /// pass `&[]`). A tree or pipeline in MPI, so sending one rank's bytes
    /// to all takes O(log N) steps, where an all-gather in which only that
    /// rank contributes passes them along a ring of N hops.
    fn broadcast_bytes(&self, root: usize, data: &[u8]) -> Result<Vec<u8>, DistributedError>;
    /// Returns once every rank has called it.
    fn barrier(&self) -> Result<(), DistributedError>;
}

/// The world of one process: every operation is the identity.
#[derive(Debug, Clone, Copy, Default)]
pub struct Solo;

impl Collective for Solo {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn engine(&self) -> &'static str {
        "solo"
    }
    fn sum_in_rank_order(&self, local: &[f32]) -> Result<Vec<f32>, DistributedError> {
        Ok(local.to_vec())
    }
    fn max_u64(&self, local: u64) -> Result<u64, DistributedError> {
        Ok(local)
    }
    fn all_gather_bytes(&self, local: &[u8]) -> Result<Vec<Vec<u8>>, DistributedError> {
        Ok(vec![local.to_vec()])
    }
    fn broadcast_bytes(&self, root: usize, data: &[u8]) -> Result<Vec<u8>, DistributedError> {
        check_root("broadcast_bytes", root, 1)?;
        Ok(data.to_vec())
    }
    fn barrier(&self) -> Result<(), DistributedError> {
        Ok(())
    }
}

/// One world shared by several owners (the trainer's step and the
/// orchestrator's agreements): each call locks it, so the calls stay
/// serialised as MPI needs.
#[derive(Clone)]
pub struct SharedWorld(Arc<Mutex<Box<dyn Collective>>>);

impl SharedWorld {
    pub fn new(world: Box<dyn Collective>) -> SharedWorld {
        SharedWorld(Arc::new(Mutex::new(world)))
    }

    fn with<T>(&self, f: impl FnOnce(&dyn Collective) -> T) -> T {
        f(&**self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl Collective for SharedWorld {
    fn rank(&self) -> usize {
        self.with(|w| w.rank())
    }
    fn size(&self) -> usize {
        self.with(|w| w.size())
    }
    fn engine(&self) -> &'static str {
        self.with(|w| w.engine())
    }
    fn sum_in_rank_order(&self, local: &[f32]) -> Result<Vec<f32>, DistributedError> {
        self.with(|w| w.sum_in_rank_order(local))
    }
    fn max_u64(&self, local: u64) -> Result<u64, DistributedError> {
        self.with(|w| w.max_u64(local))
    }
    fn all_gather_bytes(&self, local: &[u8]) -> Result<Vec<Vec<u8>>, DistributedError> {
        self.with(|w| w.all_gather_bytes(local))
    }
    fn broadcast_bytes(&self, root: usize, data: &[u8]) -> Result<Vec<u8>, DistributedError> {
        self.with(|w| w.broadcast_bytes(root, data))
    }
    fn barrier(&self) -> Result<(), DistributedError> {
        self.with(|w| w.barrier())
    }
}

/// `Ok` when `root` is a rank of a world of `size`; every rank checks the
/// same two numbers, so all refuse together before any sends a byte.
pub fn check_root(op: &'static str, root: usize, size: usize) -> Result<(), DistributedError> {
    if root < size { Ok(()) } else { Err(DistributedError::NoSuchRank { op, rank: root, size }) }
}

/// `(start, len)` of each rank's chunk of a vector of `len` values split
/// over `ranks`: contiguous, in rank order, sizes differing by at most one
/// (the first `len % ranks` chunks are one longer).
pub fn chunk_bounds(len: usize, ranks: usize) -> Vec<(usize, usize)> {
    let ranks = ranks.max(1);
    let (base, extra) = (len / ranks, len % ranks);
    let mut start = 0;
    (0..ranks)
        .map(|r| {
            let n = base + usize::from(r < extra);
            let chunk = (start, n);
            start += n;
            chunk
        })
        .collect()
}

/// Adds equal-length `pieces` element-wise in the order given:
/// `((p₀ + p₁) + p₂) + …`. `None` if their lengths differ.
pub fn sum_in_rank_order<'a>(pieces: impl IntoIterator<Item = &'a [f32]>) -> Option<Vec<f32>> {
    let mut pieces = pieces.into_iter();
    let mut total = pieces.next()?.to_vec();
    for piece in pieces {
        if piece.len() != total.len() {
            return None;
        }
        for (t, x) in total.iter_mut().zip(piece) {
            *t += *x;
        }
    }
    Some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_vector_in_order_and_differ_by_at_most_one() {
        for len in [0, 1, 2, 7, 8, 1000, 1001] {
            for ranks in 1..=5 {
                let chunks = chunk_bounds(len, ranks);
                assert_eq!(chunks.len(), ranks);
                let mut next = 0;
                for &(start, n) in &chunks {
                    assert_eq!(start, next, "len {len}, ranks {ranks}: {chunks:?}");
                    next += n;
                }
                assert_eq!(next, len);
                let sizes: Vec<usize> = chunks.iter().map(|c| c.1).collect();
                assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1, "{sizes:?}");
            }
        }
    }

    #[test]
    fn sum_is_left_to_right_in_rank_order() {
        // f32 addition is not associative: these three give different bits
        // summed in another order, so the test pins the order.
        let (a, b, c) = ([1e8f32, 1.0], [-1e8f32, 1e-8], [1.0f32, -1.0]);
        let got = sum_in_rank_order([&a[..], &b[..], &c[..]]).unwrap();
        assert_eq!(got, vec![(1e8f32 + -1e8) + 1.0, (1.0f32 + 1e-8) + -1.0]);
        assert_ne!(got[0], 1e8f32 + (-1e8 + 1.0), "the other order differs here");
        assert_eq!(sum_in_rank_order([&a[..], &[1.0f32][..]]), None);
        assert_eq!(sum_in_rank_order(std::iter::empty()), None);
    }

    #[test]
    fn solo_is_the_identity() {
        let s = Solo;
        assert_eq!((s.rank(), s.size()), (0, 1));
        assert_eq!(s.sum_in_rank_order(&[1.5, -2.0]).unwrap(), vec![1.5, -2.0]);
        assert_eq!(s.max_u64(9).unwrap(), 9);
        assert_eq!(s.all_gather_bytes(b"x").unwrap(), vec![b"x".to_vec()]);
        assert_eq!(s.broadcast_bytes(0, b"y").unwrap(), b"y".to_vec());
        let err = s.broadcast_bytes(1, b"y").unwrap_err();
        assert!(err.to_string().contains("rank 1") && err.to_string().contains("world of 1"), "{err}");
        s.barrier().unwrap();
    }
}
