//! Data-parallel runs across processes: who this process is in the world
//! ([`world`]), and the collective operations ranks use to agree
//! ([`collective`]): a deterministic sum of gradients, a stop flag folded
//! into a maximum, gathering what each rank wrote.
//!
//! A single process needs none of this: [`Solo`] is the one-rank world and
//! costs nothing. A run launched as several ranks (`srun -n N`, `mpirun -n
//! N`) needs the `mpi` cargo feature, which links the system's MPI library
//! (OpenMPI; see docs/distributed.md); a build without it refuses a world of
//! more than one rank with a message naming the feature.

pub mod collective;
pub mod error;
pub mod launcher;
#[cfg(feature = "mpi")]
pub mod mpi_world;
pub mod threads;
pub mod world;

pub use collective::{Collective, SharedWorld, Solo, sum_in_rank_order};
pub use error::DistributedError;
pub use launcher::Launcher;
pub use threads::ThreadRank;
pub use world::WorldInfo;

/// The collective engine for `info`: [`Solo`] for a world of one rank; MPI
/// (initialised here, once per process) for more, when built with the `mpi`
/// feature.
pub fn connect(info: &WorldInfo) -> Result<Box<dyn Collective>, DistributedError> {
    if info.size <= 1 {
        return Ok(Box::new(Solo));
    }
    #[cfg(feature = "mpi")]
    {
        Ok(Box::new(mpi_world::MpiWorld::initialize(info)?))
    }
    #[cfg(not(feature = "mpi"))]
    {
        Err(DistributedError::NotBuiltWithMpi { size: info.size, launcher: info.launcher })
    }
}

/// Ends this process with exit code `code` and, in an MPI world, every other
/// rank with it: `MPI_Abort` on the world communicator, so the launcher
/// (`mpirun`, `srun`) ends ranks that are stopped or stuck in a collective
/// and reports `code`. Without MPI (one rank) it is a plain exit. Safe to
/// call from any thread: a rank that gets here has given up on the world,
/// and if the abort itself hangs the process exits on its own after 10 s.
pub fn abort_world(code: u8) -> ! {
    #[cfg(feature = "mpi")]
    mpi_world::abort_if_initialized(code);
    std::process::exit(i32::from(code))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_world_of_one_connects_without_mpi() {
        let world = connect(&WorldInfo::SINGLE).unwrap();
        assert_eq!((world.rank(), world.size(), world.engine()), (0, 1, "solo"));
    }

    #[cfg(not(feature = "mpi"))]
    #[test]
    fn a_world_of_two_is_refused_naming_the_feature() {
        let info = WorldInfo { rank: 1, size: 2, local_rank: 0, launcher: Launcher::Slurm };
        let err = connect(&info).err().expect("refused").to_string();
        assert!(err.contains("`mpi` feature") && err.contains("--features mpi") && err.contains("2 ranks"), "{err}");
    }
}
