//! The stop flag: OS signals (SIGTERM, SIGINT, SIGUSR1, SIGUSR2) translated
//! into a domain reason that the training loop polls between micro-batches.
//! The signal handler only stores a number; everything else happens on the
//! training thread.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use nix::libc;

/// Why the run was asked to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    Signal(i32),
    /// `--stop-at-step` reached.
    StopAtStep,
}

impl StopReason {
    /// A stable name for events and logs (`SIGTERM`, `stop_at_step`).
    pub fn name(self) -> String {
        match self {
            StopReason::Signal(libc::SIGTERM) => "SIGTERM".into(),
            StopReason::Signal(libc::SIGINT) => "SIGINT".into(),
            StopReason::Signal(libc::SIGUSR1) => "SIGUSR1".into(),
            StopReason::Signal(libc::SIGUSR2) => "SIGUSR2".into(),
            StopReason::Signal(n) => format!("signal {n}"),
            StopReason::StopAtStep => "stop_at_step".into(),
        }
    }
}

/// A shared flag holding the first stop signal's number (0: none).
#[derive(Debug, Clone, Default)]
pub struct StopFlag {
    signal: Arc<AtomicUsize>,
}

/// The signals that mean "checkpoint and stop".
pub const STOP_SIGNALS: [i32; 4] = [libc::SIGTERM, libc::SIGINT, libc::SIGUSR1, libc::SIGUSR2];

impl StopFlag {
    /// Installs handlers for [`STOP_SIGNALS`] that record the signal.
    pub fn install() -> std::io::Result<StopFlag> {
        let flag = StopFlag::default();
        for sig in STOP_SIGNALS {
            // Keep the first signal: later ones must not overwrite the reason.
            let cell = Arc::clone(&flag.signal);
            // SAFETY: the handler only performs an atomic compare-exchange,
            // which is async-signal-safe.
            unsafe {
                signal_hook::low_level::register(sig, move || {
                    let _ = cell.compare_exchange(0, sig as usize, Ordering::SeqCst, Ordering::SeqCst);
                })?;
            }
        }
        Ok(flag)
    }

    /// The first stop signal received, if any.
    pub fn signal(&self) -> Option<StopReason> {
        match self.signal.load(Ordering::SeqCst) {
            0 => None,
            n => Some(StopReason::Signal(n as i32)),
        }
    }

    pub fn is_set(&self) -> bool {
        self.signal.load(Ordering::SeqCst) != 0
    }
}
