//! The stop flag: OS signals (SIGTERM, SIGINT, SIGUSR1, SIGUSR2) translated
//! into a domain reason with its arrival time, polled by the training loop
//! between micro-batches. The signal handler only does atomic stores
//! (async-signal-safe); everything else happens on the training thread.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

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

#[derive(Debug)]
struct Shared {
    base: Instant,
    first_signal: AtomicUsize,
    /// Nanoseconds after `base` at which the first signal arrived (+1; 0: none).
    first_arrival: AtomicU64,
    count: AtomicUsize,
}

/// Shared record of the stop signals received.
#[derive(Debug, Clone)]
pub struct StopFlag {
    shared: Arc<Shared>,
}

impl Default for StopFlag {
    fn default() -> Self {
        StopFlag {
            shared: Arc::new(Shared {
                base: Instant::now(),
                first_signal: AtomicUsize::new(0),
                first_arrival: AtomicU64::new(0),
                count: AtomicUsize::new(0),
            }),
        }
    }
}

/// The signals that mean "checkpoint and stop".
pub const STOP_SIGNALS: [i32; 4] = [libc::SIGTERM, libc::SIGINT, libc::SIGUSR1, libc::SIGUSR2];

impl StopFlag {
    /// Installs handlers for [`STOP_SIGNALS`] that record the signal.
    pub fn install() -> std::io::Result<StopFlag> {
        let flag = StopFlag::default();
        for sig in STOP_SIGNALS {
            let shared = Arc::clone(&flag.shared);
            // SAFETY: the handler only reads the monotonic clock
            // (clock_gettime, async-signal-safe) and does atomic operations.
            unsafe {
                signal_hook::low_level::register(sig, move || shared.record(sig))?;
            }
        }
        Ok(flag)
    }

    /// Records a signal as the handler would (for tests and internal stops).
    pub fn raise(&self, sig: i32) {
        self.shared.record(sig);
    }

    /// The first stop signal received, if any.
    pub fn signal(&self) -> Option<StopReason> {
        match self.shared.first_signal.load(Ordering::SeqCst) {
            0 => None,
            n => Some(StopReason::Signal(n as i32)),
        }
    }

    /// When the first signal arrived.
    pub fn first_arrival(&self) -> Option<Instant> {
        match self.shared.first_arrival.load(Ordering::SeqCst) {
            0 => None,
            n => Some(self.shared.base + Duration::from_nanos(n - 1)),
        }
    }

    /// How many stop signals arrived so far.
    pub fn count(&self) -> usize {
        self.shared.count.load(Ordering::SeqCst)
    }

    pub fn is_set(&self) -> bool {
        self.count() > 0
    }

    /// Records a stop signal another rank of a data-parallel run received
    /// at `arrival` (by this process's clock): counted once, and it becomes
    /// the first signal when it arrived before any this process received,
    /// so the deadline is the earliest arrival over all ranks.
    pub fn merge_remote(&self, sig: i32, arrival: Instant) {
        let nanos = arrival.saturating_duration_since(self.shared.base).as_nanos() as u64 + 1;
        let current = self.shared.first_arrival.load(Ordering::SeqCst);
        if current == 0 || nanos < current {
            self.shared.first_signal.store(sig as usize, Ordering::SeqCst);
            self.shared.first_arrival.store(nanos, Ordering::SeqCst);
        }
        if self.count() == 0 {
            self.shared.count.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Shared {
    fn record(&self, sig: i32) {
        let nanos = self.base.elapsed().as_nanos() as u64 + 1;
        // Keep the first signal and its time: later ones only count.
        if self.first_signal.compare_exchange(0, sig as usize, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
            self.first_arrival.store(nanos, Ordering::SeqCst);
        }
        self.count.fetch_add(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_remote_signal_counts_once_and_wins_only_when_earlier() {
        let flag = StopFlag::default();
        let early = Instant::now();
        std::thread::sleep(Duration::from_millis(5));
        flag.raise(libc::SIGUSR1);
        flag.merge_remote(libc::SIGTERM, early);
        assert_eq!(flag.signal(), Some(StopReason::Signal(libc::SIGTERM)));
        assert!(flag.first_arrival().unwrap() <= early + Duration::from_micros(1));
        assert_eq!(flag.count(), 1, "the remote signal is not one of ours");
        flag.merge_remote(libc::SIGUSR2, Instant::now());
        assert_eq!(flag.signal(), Some(StopReason::Signal(libc::SIGTERM)), "a later remote signal changes nothing");

        let quiet = StopFlag::default();
        quiet.merge_remote(libc::SIGTERM, Instant::now());
        assert!(quiet.is_set());
        assert_eq!((quiet.signal(), quiet.count()), (Some(StopReason::Signal(libc::SIGTERM)), 1));
    }

    #[test]
    fn first_signal_and_its_time_are_kept_later_ones_counted() {
        let flag = StopFlag::default();
        assert!(!flag.is_set());
        let before = Instant::now();
        flag.raise(libc::SIGUSR1);
        flag.raise(libc::SIGTERM);
        assert_eq!(flag.signal(), Some(StopReason::Signal(libc::SIGUSR1)));
        assert_eq!(flag.count(), 2);
        let arrival = flag.first_arrival().unwrap();
        assert!(arrival >= before && arrival <= Instant::now());
        assert_eq!(StopReason::Signal(libc::SIGUSR1).name(), "SIGUSR1");
    }
}
