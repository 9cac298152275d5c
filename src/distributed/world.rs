//! Who this process is: its rank, the world's size and its rank on its node,
//! read from what the launcher put in the environment. A pure function of
//! that environment ([`WorldInfo::from_env`]), so every launcher's variables
//! are tested without launching anything.
//!
//! - `mpirun` (OpenMPI) sets `OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK}`. It
//!   wins over SLURM's variables: `mpirun` inside an `sbatch` allocation
//!   leaves every rank with the batch shell's `SLURM_PROCID=0`.
//! - `srun` sets `SLURM_PROCID`, `SLURM_STEP_NUM_TASKS` and `SLURM_LOCALID`
//!   for each task of a step. The batch shell itself has no
//!   `SLURM_STEP_NUM_TASKS` and is one rank, whatever `SLURM_NTASKS` says.
//! - Anything else is a world of one.

use serde::Serialize;

use super::error::DistributedError;
use super::launcher::Launcher;

/// This process's place in the world.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct WorldInfo {
    /// 0-based rank; rank 0 writes what the world writes once.
    pub rank: usize,
    /// Number of ranks.
    pub size: usize,
    /// Rank among the ranks on this node: picks this rank's GPU.
    pub local_rank: usize,
    pub launcher: Launcher,
}

impl WorldInfo {
    /// The world of a process nobody launched as a rank.
    pub const SINGLE: WorldInfo = WorldInfo { rank: 0, size: 1, local_rank: 0, launcher: Launcher::Single };

    /// Reads this process's environment.
    pub fn detect() -> Result<WorldInfo, DistributedError> {
        WorldInfo::from_env(|key| std::env::var(key).ok())
    }

    /// Reads the launcher's variables through `get`.
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<WorldInfo, DistributedError> {
        let number = |key: &str| -> Result<Option<usize>, DistributedError> {
            match get(key) {
                None => Ok(None),
                Some(v) => v.trim().parse().map(Some).map_err(|_| DistributedError::BadLaunchEnv {
                    what: format!("{key}={v:?} is not a non-negative integer"),
                }),
            }
        };
        let (launcher, rank, size, local) = if let Some(size) = number("OMPI_COMM_WORLD_SIZE")? {
            let rank = number("OMPI_COMM_WORLD_RANK")?.ok_or_else(|| DistributedError::BadLaunchEnv {
                what: "OMPI_COMM_WORLD_SIZE is set but OMPI_COMM_WORLD_RANK is not".into(),
            })?;
            (Launcher::Mpirun, rank, size, number("OMPI_COMM_WORLD_LOCAL_RANK")?)
        } else if let Some(size) = number("SLURM_STEP_NUM_TASKS")? {
            let rank = number("SLURM_PROCID")?.ok_or_else(|| DistributedError::BadLaunchEnv {
                what: "SLURM_STEP_NUM_TASKS is set but SLURM_PROCID is not".into(),
            })?;
            (Launcher::Slurm, rank, size, number("SLURM_LOCALID")?)
        } else {
            return Ok(WorldInfo::SINGLE);
        };
        if size == 0 || rank >= size {
            return Err(DistributedError::BadLaunchEnv {
                what: format!("rank {rank} of a world of {size} ({launcher})"),
            });
        }
        let local_rank = local.unwrap_or(0);
        if local_rank >= size {
            return Err(DistributedError::BadLaunchEnv {
                what: format!("local rank {local_rank} in a world of {size} ({launcher})"),
            });
        }
        Ok(WorldInfo { rank, size, local_rank, launcher })
    }

    /// True for the rank that writes what the world writes once.
    pub fn is_leader(&self) -> bool {
        self.rank == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let owned: Vec<(String, String)> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |key| owned.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
    }

    #[test]
    fn no_launcher_is_a_world_of_one() {
        assert_eq!(WorldInfo::from_env(env(&[])).unwrap(), WorldInfo::SINGLE);
        // The batch shell of a 4-task job is not a step: one rank.
        let batch = env(&[("SLURM_JOB_ID", "7"), ("SLURM_NTASKS", "4"), ("SLURM_PROCID", "0")]);
        assert_eq!(WorldInfo::from_env(batch).unwrap(), WorldInfo::SINGLE);
    }

    #[test]
    fn a_slurm_step_gives_rank_size_and_local_rank() {
        let w =
            WorldInfo::from_env(env(&[("SLURM_STEP_NUM_TASKS", "4"), ("SLURM_PROCID", "3"), ("SLURM_LOCALID", "1")]))
                .unwrap();
        assert_eq!(w, WorldInfo { rank: 3, size: 4, local_rank: 1, launcher: Launcher::Slurm });
        assert!(!w.is_leader());
    }

    #[test]
    fn mpirun_wins_over_the_allocations_slurm_variables() {
        let w = WorldInfo::from_env(env(&[
            ("SLURM_STEP_NUM_TASKS", "1"),
            ("SLURM_PROCID", "0"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
        ]))
        .unwrap();
        assert_eq!(w, WorldInfo { rank: 1, size: 2, local_rank: 1, launcher: Launcher::Mpirun });
    }

    #[test]
    fn inconsistent_variables_are_named() {
        for (pairs, needle) in [
            (vec![("SLURM_STEP_NUM_TASKS", "2")], "SLURM_PROCID is not"),
            (vec![("SLURM_STEP_NUM_TASKS", "2"), ("SLURM_PROCID", "2")], "rank 2 of a world of 2"),
            (vec![("SLURM_STEP_NUM_TASKS", "two"), ("SLURM_PROCID", "0")], "SLURM_STEP_NUM_TASKS=\"two\""),
            (vec![("OMPI_COMM_WORLD_SIZE", "0"), ("OMPI_COMM_WORLD_RANK", "0")], "world of 0"),
            (
                vec![("OMPI_COMM_WORLD_SIZE", "2"), ("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_LOCAL_RANK", "5")],
                "local rank 5",
            ),
        ] {
            let err = WorldInfo::from_env(env(&pairs)).unwrap_err().to_string();
            assert!(err.contains(needle), "{pairs:?}: {err}");
        }
    }
}
