//! The run lifecycle: prepare the run directory, resume from the newest
//! checkpoint that verifies, train, checkpoint periodically and on stop
//! signals, and finish with a summary (`run.rs` and its phases under `run/`).
//! `devices.rs` places the run on devices (GPU plan, CPU fallback,
//! out-of-memory back-off, monitor); `deadline.rs` and `budget.rs` do the
//! time arithmetic of a stop; `watchdog.rs` turns a stuck step, evaluation,
//! save or publish into a requeue; `crash.rs` classifies a crash as
//! transient (requeued) or deterministic (not); `settings.rs` records the
//! training settings in each checkpoint and refuses a resume with others.
//! `exec.rs` runs any program as a child under the same lifecycle
//! (`rekindle exec`, `rekindle seal`).

mod atomic;
mod budget;
mod crash;
mod deadline;
mod devices;
mod error;
mod exec;
mod interval;
mod lock;
mod lost;
mod persist;
mod progress;
mod rank_watch;
mod ranks;
mod run;
mod rundir;
mod settings;
mod status;
mod stop;
mod watchdog;

pub use atomic::write_atomically;
pub use budget::{
    PUBLISH_AFTER_REQUEUE, PUBLISH_RESERVE, SCONTROL_TIMEOUT, exit_now, job_time_left, publish_deadline,
    requeue_deadline, scontrol_timeout, stop_deadline,
};
pub use crash::{CrashAction, classify as classify_crash, decide as decide_after_crash};
pub use deadline::{Deadline, SignalResponse, response_to_signal};
pub use devices::{Devices, INVENTORY_ENV, layout_for};
pub use error::RunError;
pub use exec::{
    ENV_BIN, ENV_CHECKPOINT_DIR, ENV_DEADLINE, ENV_EXEC_PID, ENV_PROTOCOL, ENV_RESUME_FROM, ENV_RUN_DIR, ENV_STOP_FILE,
    ExecOptions, PROTOCOL, STOP_FILE, SealOptions, exec, seal,
};
pub use interval::{
    Bound, CostMeter, Costs, DEFAULT_INTERVAL, IntervalChoice, IntervalInputs, MAX_STALL_FRACTION, Mtbf, MtbfSource,
    Reason, SimJob, Slowdown, choose_interval, history_mtbf, simulate_lost_seconds,
};
pub use lock::{
    Claimant, DEFAULT_STALE_AFTER, LOCK_FILE, LockError, LockInfo, LockOwnership, LockRelease, LockRequest, RunLock,
    Takeover, Verdict, check_every, heartbeat_every, marker_break_after, takeover,
};
pub use persist::{Persisted, Persister, PersisterDied};
pub use run::{RunOptions, run};
pub use rundir::{
    CHECKPOINTS_DIR, CONFIG_FILE, EVENTS_FILE, METRICS_FILE, RunDir, SUMMARY_FILE, checkpoints_dir, prepare,
    resolve_run_dir,
};
pub use status::{CheckpointLine, RunStatus, status};
pub use stop::{StopFlag, StopReason};
pub use watchdog::{Activity, Beats, Worker};
