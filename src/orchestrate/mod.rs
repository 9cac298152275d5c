//! The run lifecycle: prepare the run directory, resume from the newest
//! checkpoint that verifies, train, checkpoint periodically and on stop
//! signals, and finish with a summary.

mod error;
mod progress;
mod run;
mod rundir;
mod stop;

pub use error::RunError;
pub use run::{RunOptions, run};
pub use rundir::{
    CHECKPOINTS_DIR, CONFIG_FILE, EVENTS_FILE, METRICS_FILE, RunDir, SUMMARY_FILE, checkpoints_dir, prepare,
    resolve_run_dir, write_atomically,
};
pub use stop::{StopFlag, StopReason};
