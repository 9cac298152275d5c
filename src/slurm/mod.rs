//! SLURM: what the allocation says about this job (environment), the pure
//! requeue decision, and the thin `scontrol` interface that carries it out.

mod control;
mod env;
mod requeue;

pub use control::{JobView, RequeueAnswer, Scontrol, SlurmControl, SlurmError, parse_show_job};
pub use env::{SlurmEnv, hostname};
pub use requeue::{Decision, RequeueInput, StopKind, decide};
