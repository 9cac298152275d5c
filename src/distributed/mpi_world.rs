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

use super::collective::{Collective, chunk_bounds, sum_in_rank_order};
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

fn count(n: usize, op: &'static str) -> Result<Count, DistributedError> {
    Count::try_from(n).map_err(|_| DistributedError::LengthMismatch {
        op,
        rank: 0,
        got: n,
        expected: Count::MAX as usize,
    })
}

/// Displacements of consecutive pieces of the given sizes.
fn displacements(counts: &[Count]) -> Vec<Count> {
    counts
        .iter()
        .scan(0, |at, &n| {
            let d = *at;
            *at += n;
            Some(d)
        })
        .collect()
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
        let send_counts = chunks.iter().map(|&(_, n)| count(n, OP)).collect::<Result<Vec<_>, _>>()?;
        let send_displs = chunks.iter().map(|&(s, _)| count(s, OP)).collect::<Result<Vec<_>, _>>()?;
        let recv_counts = vec![count(mine_len, OP)?; self.size];
        let recv_displs = displacements(&recv_counts);
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
        let counts = lens.iter().map(|&n| count(n as usize, OP)).collect::<Result<Vec<_>, _>>()?;
        let displs = displacements(&counts);
        let mut all = vec![0u8; lens.iter().sum::<u64>() as usize];
        {
            let mut recv = PartitionMut::new(&mut all[..], &counts[..], &displs[..]);
            self.world.all_gather_varcount_into(local, &mut recv);
        }
        let mut out = Vec::with_capacity(self.size);
        let mut at = 0;
        for n in lens {
            out.push(all[at..at + n as usize].to_vec());
            at += n as usize;
        }
        Ok(out)
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
