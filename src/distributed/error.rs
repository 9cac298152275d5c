//! Errors of the distributed layer.

use super::launcher::Launcher;

#[derive(Debug, thiserror::Error)]
pub enum DistributedError {
    #[error(
        "this process is one of {size} ranks ({launcher}), but this rekindle was built without the `mpi` feature, \
         so its ranks could not train together: rebuild with `cargo build --release --features mpi` \
         (needs the system's OpenMPI: `apt-get install libopenmpi-dev openmpi-bin`), or launch one task"
    )]
    NotBuiltWithMpi { size: usize, launcher: Launcher },
    #[error(
        "the launcher's environment is inconsistent: {what}; launch with `srun` or `mpirun`, or unset those variables"
    )]
    BadLaunchEnv { what: String },
    #[error(
        "MPI says this world has {mpi_size} ranks and this is rank {mpi_rank}, but {launcher} said {size} ranks and \
         rank {rank}: launch with `srun --mpi=pmix` under SLURM or `mpirun` without it, not a mix"
    )]
    WorldMismatch { mpi_size: usize, mpi_rank: usize, size: usize, rank: usize, launcher: Launcher },
    #[error("MPI could not be initialised ({why}): under SLURM launch with `srun --mpi=pmix`; see docs/distributed.md")]
    Init { why: String },
    #[error(
        "collective `{op}`: rank {rank} contributed {got} values, rank 0 {expected}: the ranks run different code or state"
    )]
    LengthMismatch { op: &'static str, rank: usize, got: usize, expected: usize },
    #[error(
        "collective `{op}`: {what} of {elements} elements is past the {limit} one MPI call can address \
         (MPI counts and displacements are 32-bit): split the data into smaller collectives \
         (fewer parameters per reduction, smaller pieces) or use fewer, larger ranks' shares"
    )]
    TooLarge { op: &'static str, what: &'static str, elements: u64, limit: u64 },
    #[error("collective `{op}`: rank {rank} is not in a world of {size} ranks: the ranks run different code or state")]
    NoSuchRank { op: &'static str, rank: usize, size: usize },
}
