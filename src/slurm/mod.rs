//! SLURM: what the allocation says about this job (environment), the pure
//! requeue decision, the requeue step that asks and carries it out, and the
//! thin `scontrol` (and `sinfo`) interface behind the `SlurmControl` trait,
//! SLURM's node lists (`nodes.rs`), and the batch shell's offer of restarts
//! inside the running job (`injob`).

mod control;
mod env;
pub mod injob;
mod nodes;
mod requeue;
mod requeue_job;

pub use control::{JobView, RequeueAnswer, Scontrol, SlurmControl, SlurmError, parse_show_job};
pub use env::{SlurmEnv, hostname};
pub use nodes::{MAX_ARG_BYTES, PartitionNode, compress_hostlist, expand_hostlist, parse_sinfo_nodes};
pub use requeue::{Decision, RequeueInput, StopKind, decide};
pub use requeue_job::{CrashRequeue, NO_TIME, RequeueRequest, requeue_after_crash, requeue_after_stop};
