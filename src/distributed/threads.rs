//! Ranks as threads of one process: a [`Collective`] with the same
//! semantics as MPI's (every rank makes the same calls in the same order;
//! each blocks until all have arrived), for tests of the data-parallel
//! training step and of anything else built on the trait, without
//! launching processes.

use std::sync::{Arc, Barrier, Mutex, PoisonError};

use super::collective::{Collective, check_root, sum_in_rank_order};
use super::error::DistributedError;

struct Shared {
    slots: Mutex<Vec<Vec<u8>>>,
    barrier: Barrier,
}

/// One rank of a world of threads; see [`ThreadRank::world`].
pub struct ThreadRank {
    rank: usize,
    size: usize,
    shared: Arc<Shared>,
}

impl ThreadRank {
    /// The `size` ranks of a new world: hand one to each thread.
    pub fn world(size: usize) -> Vec<ThreadRank> {
        let size = size.max(1);
        let shared = Arc::new(Shared { slots: Mutex::new(vec![Vec::new(); size]), barrier: Barrier::new(size) });
        (0..size).map(|rank| ThreadRank { rank, size, shared: Arc::clone(&shared) }).collect()
    }
}

impl Collective for ThreadRank {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn engine(&self) -> &'static str {
        "threads"
    }

    fn sum_in_rank_order(&self, local: &[f32]) -> Result<Vec<f32>, DistributedError> {
        let bytes: Vec<u8> = local.iter().flat_map(|x| x.to_le_bytes()).collect();
        let all = self.all_gather_bytes(&bytes)?;
        let floats: Vec<Vec<f32>> = all
            .iter()
            .map(|b| b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
            .collect();
        if let Some((rank, f)) = floats.iter().enumerate().find(|(_, f)| f.len() != local.len()) {
            return Err(DistributedError::LengthMismatch {
                op: "sum_in_rank_order",
                rank,
                got: f.len(),
                expected: local.len(),
            });
        }
        Ok(sum_in_rank_order(floats.iter().map(Vec::as_slice)).unwrap_or_default())
    }

    fn max_u64(&self, local: u64) -> Result<u64, DistributedError> {
        let all = self.all_gather_bytes(&local.to_le_bytes())?;
        Ok(all.iter().map(|b| u64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8]))).max().unwrap_or(local))
    }

    fn all_gather_bytes(&self, local: &[u8]) -> Result<Vec<Vec<u8>>, DistributedError> {
        {
            let mut slots = self.shared.slots.lock().unwrap_or_else(PoisonError::into_inner);
            slots[self.rank] = local.to_vec();
        }
        self.shared.barrier.wait();
        let all = self.shared.slots.lock().unwrap_or_else(PoisonError::into_inner).clone();
        // Nobody writes the next call's value before everyone has read this one.
        self.shared.barrier.wait();
        Ok(all)
    }

    fn broadcast_bytes(&self, root: usize, data: &[u8]) -> Result<Vec<u8>, DistributedError> {
        check_root("broadcast_bytes", root, self.size)?;
        if self.rank == root {
            self.shared.slots.lock().unwrap_or_else(PoisonError::into_inner)[root] = data.to_vec();
        }
        self.shared.barrier.wait();
        let got = self.shared.slots.lock().unwrap_or_else(PoisonError::into_inner)[root].clone();
        // As in a gather: the root writes no next value before all have read.
        self.shared.barrier.wait();
        Ok(got)
    }

    fn barrier(&self) -> Result<(), DistributedError> {
        self.shared.barrier.wait();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_ranks_gather_sum_and_agree_like_mpi() {
        let handles: Vec<_> = ThreadRank::world(3)
            .into_iter()
            .map(|r| {
                std::thread::spawn(move || {
                    let me = r.rank();
                    let gathered = r.all_gather_bytes(&[me as u8; 2]).unwrap();
                    let max = r.max_u64(10 + me as u64).unwrap();
                    let sum = r.sum_in_rank_order(&[me as f32, 1.0]).unwrap();
                    // Only the root's bytes count; the others' are ignored.
                    let from_1 = r.broadcast_bytes(1, &[me as u8; 3]).unwrap();
                    let from_2 = r.broadcast_bytes(2, if me == 2 { b"two" } else { b"" }).unwrap();
                    assert!(r.broadcast_bytes(3, b"").is_err(), "no rank 3 in a world of 3");
                    r.barrier().unwrap();
                    (gathered, max, sum, from_1, from_2)
                })
            })
            .collect();
        for h in handles {
            let (gathered, max, sum, from_1, from_2) = h.join().unwrap();
            assert_eq!((from_1, from_2), (vec![1, 1, 1], b"two".to_vec()));
            assert_eq!(gathered, vec![vec![0, 0], vec![1, 1], vec![2, 2]]);
            assert_eq!(max, 12);
            assert_eq!(sum, vec![3.0, 3.0]);
        }
    }
}
