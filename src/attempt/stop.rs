//! The stop: OS signals (SIGTERM, SIGINT, SIGUSR1, SIGUSR2, SIGHUP) become a domain
//! value where they arrive, in the signal handler: which signal
//! ([`StopSignal`]), what it asks for ([`StopIntent`], docs/slurm.md), when
//! it arrived and who sent it ([`SignalStop`]). The training loop polls the
//! flag between micro-batches. The handler only reads the clock and its
//! `siginfo` and does atomic stores (async-signal-safe); everything else
//! happens on the training thread. A signal is a number again only where
//! one is installed or sent ([`StopSignal::raw`], the `nix` conversion).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nix::libc;
use serde::{Deserialize, Serialize};

/// One of the five signals rekindle takes as "checkpoint and stop".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum StopSignal {
    #[serde(rename = "SIGTERM")]
    Term,
    #[serde(rename = "SIGINT")]
    Int,
    #[serde(rename = "SIGUSR1")]
    Usr1,
    #[serde(rename = "SIGUSR2")]
    Usr2,
    /// The terminal went away (an SSH session closed under a run started in
    /// the foreground): without a handler it would end the run with 129 and
    /// no checkpoint.
    #[serde(rename = "SIGHUP")]
    Hup,
}

/// What a stop signal asks for (docs/slurm.md's signal table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopIntent {
    /// SIGTERM, SIGUSR1, SIGUSR2: the cluster stops the job (preemption,
    /// the time-limit warning of `--signal`, `scancel -s`, drills); it is
    /// requeued.
    Cluster,
    /// SIGINT: usually a person at a terminal (or `scancel -s INT`); SIGHUP:
    /// that terminal closed. Not requeued under `requeue = "auto"`.
    Interrupt,
}

impl StopSignal {
    /// Every signal rekindle catches.
    pub const ALL: [StopSignal; 5] =
        [StopSignal::Term, StopSignal::Int, StopSignal::Usr1, StopSignal::Usr2, StopSignal::Hup];

    /// The name events and logs carry (`SIGTERM`, …).
    pub fn name(self) -> &'static str {
        match self {
            StopSignal::Term => "SIGTERM",
            StopSignal::Int => "SIGINT",
            StopSignal::Usr1 => "SIGUSR1",
            StopSignal::Usr2 => "SIGUSR2",
            StopSignal::Hup => "SIGHUP",
        }
    }

    /// What it asks for.
    pub fn intent(self) -> StopIntent {
        match self {
            StopSignal::Int | StopSignal::Hup => StopIntent::Interrupt,
            StopSignal::Term | StopSignal::Usr1 | StopSignal::Usr2 => StopIntent::Cluster,
        }
    }

    /// The OS number: only to install a handler or send the signal.
    pub fn raw(self) -> i32 {
        match self {
            StopSignal::Term => libc::SIGTERM,
            StopSignal::Int => libc::SIGINT,
            StopSignal::Usr1 => libc::SIGUSR1,
            StopSignal::Usr2 => libc::SIGUSR2,
            StopSignal::Hup => libc::SIGHUP,
        }
    }

    /// Its slot in [`StopFlag`]'s atomics (0 is "none").
    fn code(self) -> u8 {
        match self {
            StopSignal::Term => 1,
            StopSignal::Int => 2,
            StopSignal::Usr1 => 3,
            StopSignal::Usr2 => 4,
            StopSignal::Hup => 5,
        }
    }

    fn from_code(code: u8) -> Option<StopSignal> {
        StopSignal::ALL.into_iter().find(|s| s.code() == code)
    }
}

impl std::fmt::Display for StopSignal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl From<StopSignal> for nix::sys::signal::Signal {
    fn from(s: StopSignal) -> Self {
        match s {
            StopSignal::Term => nix::sys::signal::Signal::SIGTERM,
            StopSignal::Int => nix::sys::signal::Signal::SIGINT,
            StopSignal::Usr1 => nix::sys::signal::Signal::SIGUSR1,
            StopSignal::Usr2 => nix::sys::signal::Signal::SIGUSR2,
            StopSignal::Hup => nix::sys::signal::Signal::SIGHUP,
        }
    }
}

/// A stop signal as it arrived: the first one of the attempt (or, in a run
/// of several ranks, the earliest over all ranks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SignalStop {
    pub signal: StopSignal,
    /// When it arrived, by this process's clock.
    pub arrival: Instant,
    /// The pid that sent it (`siginfo`'s `si_pid`), when a process did and
    /// its pid is visible here: none for a signal of the kernel (a
    /// terminal's ^C), from another pid namespace, or another rank's.
    pub sender: Option<u32>,
}

impl SignalStop {
    /// What it asks for.
    pub fn intent(&self) -> StopIntent {
        self.signal.intent()
    }
}

/// Why the run was asked to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    Signal(SignalStop),
    /// `--stop-at-step` reached.
    StopAtStep,
}

impl StopReason {
    /// A stable name for events and logs (`SIGTERM`, `stop_at_step`).
    pub fn name(self) -> String {
        match self {
            StopReason::Signal(s) => s.signal.name().into(),
            StopReason::StopAtStep => "stop_at_step".into(),
        }
    }

    /// When the stop signal arrived (`None` for `--stop-at-step`).
    pub fn arrival(self) -> Option<Instant> {
        match self {
            StopReason::Signal(s) => Some(s.arrival),
            StopReason::StopAtStep => None,
        }
    }
}

#[derive(Debug)]
struct Shared {
    base: Instant,
    /// Set by the first signal's handler before it writes the fields below.
    claimed: AtomicBool,
    /// [`StopSignal::code`] of the first signal (0: none), stored last, so a
    /// reader that sees it sees its arrival and sender.
    first_signal: AtomicU8,
    /// Nanoseconds after `base` at which the first signal arrived (+1; 0: none).
    first_arrival: AtomicU64,
    /// The first signal's sender pid (0: unknown).
    sender: AtomicU32,
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
                claimed: AtomicBool::new(false),
                first_signal: AtomicU8::new(0),
                first_arrival: AtomicU64::new(0),
                sender: AtomicU32::new(0),
                count: AtomicUsize::new(0),
            }),
        }
    }
}

impl StopFlag {
    /// Installs handlers for [`StopSignal::ALL`] that record the signal.
    pub fn install() -> std::io::Result<StopFlag> {
        let flag = StopFlag::default();
        for sig in StopSignal::ALL {
            flag.handle(sig)?;
        }
        Ok(flag)
    }

    /// Installs the handler of one signal.
    fn handle(&self, sig: StopSignal) -> std::io::Result<()> {
        let shared = Arc::clone(&self.shared);
        // SAFETY: the handler only reads the monotonic clock (clock_gettime,
        // async-signal-safe) and its siginfo, and does atomic operations.
        unsafe {
            signal_hook_registry::register_sigaction(sig.raw(), move |info| shared.record(sig, sender_of(info)))?;
        }
        Ok(())
    }

    /// Records a signal as the handler would (for tests and internal stops).
    pub fn raise(&self, sig: StopSignal) {
        self.shared.record(sig, None);
    }

    /// The first stop signal received, if any.
    pub fn signal(&self) -> Option<SignalStop> {
        let signal = StopSignal::from_code(self.shared.first_signal.load(Ordering::SeqCst))?;
        let arrival = match self.shared.first_arrival.load(Ordering::SeqCst) {
            0 => Instant::now(),
            n => self.shared.base + Duration::from_nanos(n - 1),
        };
        let sender = Some(self.shared.sender.load(Ordering::SeqCst)).filter(|&p| p != 0);
        Some(SignalStop { signal, arrival, sender })
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
    pub fn merge_remote(&self, sig: StopSignal, arrival: Instant) {
        let nanos = arrival.saturating_duration_since(self.shared.base).as_nanos() as u64 + 1;
        let current = self.shared.first_arrival.load(Ordering::SeqCst);
        if current == 0 || nanos < current {
            self.shared.claimed.store(true, Ordering::SeqCst);
            self.shared.publish(sig, nanos, None);
        }
        if self.count() == 0 {
            self.shared.count.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// The sending process of a signal, when `info` names one: a signal sent
/// from user space (`kill`, `sigqueue`, `tgkill`, a message queue), whose
/// `si_pid` is set (0 when the sender is outside our pid namespace). Timer,
/// asynchronous I/O and kernel signals name no sender. Reading the struct
/// is async-signal-safe.
fn sender_of(info: &libc::siginfo_t) -> Option<u32> {
    if ![libc::SI_USER, libc::SI_QUEUE, libc::SI_TKILL, libc::SI_MESGQ].contains(&info.si_code) {
        return None;
    }
    // SAFETY: for these codes the kernel fills the kill/rt union member,
    // whose first field is si_pid.
    let pid = unsafe { info.si_pid() };
    u32::try_from(pid).ok().filter(|&p| p != 0)
}

impl Shared {
    fn record(&self, sig: StopSignal, sender: Option<u32>) {
        let nanos = self.base.elapsed().as_nanos() as u64 + 1;
        // Keep the first signal and its time: later ones only count.
        if self.claimed.compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
            self.publish(sig, nanos, sender);
        }
        self.count.fetch_add(1, Ordering::SeqCst);
    }

    fn publish(&self, sig: StopSignal, nanos: u64, sender: Option<u32>) {
        self.first_arrival.store(nanos, Ordering::SeqCst);
        self.sender.store(sender.unwrap_or(0), Ordering::SeqCst);
        self.first_signal.store(sig.code(), Ordering::SeqCst);
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
        flag.raise(StopSignal::Usr1);
        flag.merge_remote(StopSignal::Term, early);
        let first = flag.signal().unwrap();
        assert_eq!(first.signal, StopSignal::Term);
        assert!(first.arrival <= early + Duration::from_micros(1));
        assert_eq!(flag.count(), 1, "the remote signal is not one of ours");
        flag.merge_remote(StopSignal::Usr2, Instant::now());
        assert_eq!(flag.signal(), Some(first), "a later remote signal changes nothing");

        let quiet = StopFlag::default();
        quiet.merge_remote(StopSignal::Term, Instant::now());
        assert!(quiet.is_set());
        assert_eq!((quiet.signal().map(|s| (s.signal, s.sender)), quiet.count()), (Some((StopSignal::Term, None)), 1));
    }

    #[test]
    fn first_signal_and_its_time_are_kept_later_ones_counted() {
        let flag = StopFlag::default();
        assert!(!flag.is_set());
        assert_eq!(flag.signal(), None);
        let before = Instant::now();
        flag.raise(StopSignal::Usr1);
        flag.raise(StopSignal::Term);
        let first = flag.signal().unwrap();
        assert_eq!(first.signal, StopSignal::Usr1);
        assert_eq!(flag.count(), 2);
        assert!(first.arrival >= before && first.arrival <= Instant::now());
        assert_eq!(StopReason::Signal(first).name(), "SIGUSR1");
        assert_eq!(StopReason::StopAtStep.name(), "stop_at_step");
    }

    #[test]
    fn only_sigint_and_sighup_are_interrupts_and_names_and_numbers_are_the_os_ones() {
        let seen: Vec<_> = StopSignal::ALL.iter().map(|s| (s.name(), s.raw(), s.intent())).collect();
        assert_eq!(
            seen,
            vec![
                ("SIGTERM", libc::SIGTERM, StopIntent::Cluster),
                ("SIGINT", libc::SIGINT, StopIntent::Interrupt),
                ("SIGUSR1", libc::SIGUSR1, StopIntent::Cluster),
                ("SIGUSR2", libc::SIGUSR2, StopIntent::Cluster),
                ("SIGHUP", libc::SIGHUP, StopIntent::Interrupt),
            ]
        );
        for s in StopSignal::ALL {
            assert_eq!(nix::sys::signal::Signal::from(s) as i32, s.raw());
            assert_eq!(serde_json::to_string(&s).unwrap(), format!("\"{}\"", s.name()));
            assert_eq!(s.to_string(), s.name());
        }
    }

    #[test]
    fn a_real_signal_is_recorded_with_its_sender() {
        // SIGUSR2 to ourselves: the handler sees kill's siginfo, whose
        // sender is this process. Only SIGUSR2: the test binary keeps its
        // default SIGINT and SIGTERM.
        let flag = StopFlag::default();
        flag.handle(StopSignal::Usr2).unwrap();
        nix::sys::signal::kill(nix::unistd::getpid(), nix::sys::signal::Signal::SIGUSR2).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !flag.is_set() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        let stop = flag.signal().expect("the handler ran");
        assert_eq!((stop.signal, stop.sender), (StopSignal::Usr2, Some(std::process::id())));
    }
}
