//! What started this process — `mpirun`, a SLURM job step, or nothing —
//! and so where its rank came from. Its own file because both the world
//! (`world.rs`, which detects it) and the errors (`error.rs`, which name it)
//! use it, and neither should import the other for it.

use std::fmt;

use serde::Serialize;

/// What started this process (and so where its rank came from).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Launcher {
    /// No launcher: one process, rank 0 of 1.
    Single,
    /// A SLURM job step (`srun`).
    Slurm,
    /// OpenMPI's `mpirun`/`mpiexec`.
    Mpirun,
}

impl fmt::Display for Launcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Launcher::Single => "a single process",
            Launcher::Slurm => "a SLURM job step (srun)",
            Launcher::Mpirun => "mpirun",
        })
    }
}
