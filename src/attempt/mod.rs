//! What every attempt shares, whichever driver runs it (`run`'s candle
//! trainer in [`crate::run`], `exec`'s child program in [`crate::exec`]):
//! the stop that ends it ([`stop`]) and the time it leaves ([`deadline`],
//! [`budget`]), what a crash means ([`crash`]), the watchdog that turns a
//! stuck step, save or publish into a requeue ([`watchdog`]), progress
//! reporting ([`progress`]), the stragglers it notices ([`straggler`]),
//! the devices it runs on ([`devices`]), its
//! error ([`error`]), what it records ([`records`]) and exports
//! ([`exports`]), the steps of its end that both drivers take
//! ([`ending`]), the opening both run in one sequence ([`opening`]), and the node check and progress guard at its start, with
//! the exclusion of blamed nodes ([`health`]). It never imports a driver.

pub mod board;
pub mod budget;
pub mod crash;
pub mod deadline;
pub mod devices;
pub mod ending;
pub mod error;
pub mod exports;
pub mod health;
pub mod lost;
pub(crate) mod node_verdict;
pub mod opening;
pub mod progress;
pub mod rank_watch;
pub mod records;
pub mod stop;
pub mod straggler;
pub mod watchdog;

pub use budget::{
    PUBLISH_AFTER_REQUEUE, PUBLISH_RESERVE, SCONTROL_TIMEOUT, exit_now, job_time_left, publish_deadline,
    requeue_deadline, scontrol_timeout, stop_deadline,
};
pub use crash::{CrashAction, classify as classify_crash, decide as decide_after_crash};
pub use deadline::{Deadline, SignalResponse, response_to_signal};
pub use devices::{Devices, INVENTORY_ENV, layout_for};
pub use error::RunError;
pub use stop::{SignalStop, StopFlag, StopIntent, StopReason, StopSignal};
pub use watchdog::{Activity, Beats, Worker};
