//! What the end of the program means for the attempt, as a pure function:
//! [`verdict`] turns how it ended, whether a stop was requested, whether the
//! lock was lost and whether it sealed a checkpoint in this attempt into
//! finished, stopped, crashed (with a class, as `crash.rs` gives native
//! crashes) or lock lost. A lost task of the world (`world.rs`) is decided
//! by the supervisor, not here: [`Verdict::RankLost`], and so is a hung
//! rank ([`Verdict::Hang`]).

use nix::sys::signal::Signal;

use crate::telemetry::CrashClass;

/// How the program ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildEnd {
    Exited(i32),
    Signaled(i32),
}

impl ChildEnd {
    /// From a process's exit status.
    pub fn from_status(status: std::process::ExitStatus) -> ChildEnd {
        use std::os::unix::process::ExitStatusExt;
        match (status.code(), status.signal()) {
            (Some(code), _) => ChildEnd::Exited(code),
            (None, Some(sig)) => ChildEnd::Signaled(sig),
            // Neither: stopped or continued, which `wait` does not report.
            (None, None) => ChildEnd::Exited(-1),
        }
    }

    /// `exited with code 3`, `was killed by SIGSEGV`.
    pub fn describe(self) -> String {
        match self {
            ChildEnd::Exited(code) => format!("exited with code {code}"),
            ChildEnd::Signaled(sig) => format!("was killed by {}", signal_name(sig)),
        }
    }
}

/// `SIGKILL`, or `signal 99` for a number without a name.
pub fn signal_name(sig: i32) -> String {
    Signal::try_from(sig).map(|s| s.as_str().to_string()).unwrap_or_else(|_| format!("signal {sig}"))
}

/// What the attempt does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Exit 0 with no stop requested: the program is done.
    Finished,
    /// It failed with no stop requested, but only after it sealed the step
    /// `[run] max_steps` names in this attempt: its training is complete and
    /// the failure came in its teardown (e.g. a distributed backend aborting
    /// at exit). The run ends as finished; the record says how it exited.
    TeardownFault { why: String },
    /// A stop was requested: whatever its exit code (a program that saves
    /// and exits 0 on SIGTERM is the common case), the attempt takes the
    /// stop path: 75 with a durable checkpoint, requeue as for `run`.
    Stopped,
    /// It failed with no stop requested.
    Crashed { class: CrashClass, why: String },
    /// Another process took the run directory: it was killed; nothing more is written.
    LockLost,
    /// Another task of the job step was lost (`world.rs`): the program was
    /// ended, or failed as the loss's echo; the world resumes from its
    /// newest checkpoint (never decided by [`verdict`], which sees one task).
    RankLost,
    /// A rank of the program made no progress past its `[watchdog]` limit
    /// (progress.rs): the program was ended; the job resumes from the newest
    /// checkpoint (decided by the supervisor, as [`Verdict::RankLost`]).
    Hang,
}

impl Verdict {
    /// The name the `child_exit` event records.
    pub fn name(&self) -> &'static str {
        match self {
            Verdict::Finished => "finished",
            Verdict::TeardownFault { .. } => "teardown_fault",
            Verdict::Stopped => "stopped",
            Verdict::Crashed { .. } => "crashed",
            Verdict::LockLost => "lock_lost",
            Verdict::RankLost => "rank_lost",
            Verdict::Hang => "hang",
        }
    }
}

/// Decides the [`Verdict`]. A crash is classified as native crashes are by
/// history: one after the program sealed a checkpoint in this attempt
/// failed where the same code had passed (a device, node or I/O failure:
/// transient, requeued within `[run] max_crash_requeues`); one before any
/// seal is a setup error a new attempt would repeat (deterministic); one
/// after it sealed its last step (`completed`: the step `[run] max_steps`
/// names, sealed in this attempt) is a [`Verdict::TeardownFault`].
pub fn verdict(
    end: ChildEnd,
    stop_requested: bool,
    lock_lost: bool,
    sealed_this_attempt: u64,
    completed: Option<u64>,
) -> Verdict {
    if lock_lost {
        return Verdict::LockLost;
    }
    if stop_requested {
        return Verdict::Stopped;
    }
    if end == ChildEnd::Exited(0) {
        return Verdict::Finished;
    }
    let how = end.describe();
    if let Some(step) = completed.filter(|_| sealed_this_attempt > 0) {
        return Verdict::TeardownFault {
            why: format!(
                "the program {how} after sealing step {step}, the last of [run] max_steps: its training is complete, \
                 the failure came in its teardown"
            ),
        };
    }
    if sealed_this_attempt > 0 {
        Verdict::Crashed {
            class: CrashClass::Transient,
            why: format!(
                "the program {how} after sealing {sealed_this_attempt} checkpoint(s) in this attempt: the same code \
                 had run (a device, node or I/O failure)"
            ),
        }
    } else {
        Verdict::Crashed {
            class: CrashClass::Deterministic,
            why: format!(
                "the program {how} before sealing any checkpoint in this attempt (a setup error would fail the same \
                 way again)"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::libc::{SIGABRT, SIGKILL, SIGSEGV};

    #[test]
    fn exit_zero_without_a_stop_is_finished() {
        assert_eq!(verdict(ChildEnd::Exited(0), false, false, 0, None), Verdict::Finished);
        assert_eq!(verdict(ChildEnd::Exited(0), false, false, 3, None), Verdict::Finished);
    }

    #[test]
    fn any_end_after_a_stop_request_is_a_stop() {
        for end in [ChildEnd::Exited(0), ChildEnd::Exited(1), ChildEnd::Signaled(SIGKILL), ChildEnd::Exited(75)] {
            for sealed in [0, 1] {
                assert_eq!(verdict(end, true, false, sealed, None), Verdict::Stopped, "{end:?}");
            }
        }
    }

    #[test]
    fn a_lost_lock_wins_over_everything() {
        assert_eq!(verdict(ChildEnd::Exited(0), true, true, 1, None), Verdict::LockLost);
        assert_eq!(verdict(ChildEnd::Signaled(SIGKILL), false, true, 0, None), Verdict::LockLost);
    }

    #[test]
    fn a_failure_after_the_last_step_was_sealed_is_a_teardown_fault_not_a_crash() {
        let Verdict::TeardownFault { why } = verdict(ChildEnd::Signaled(SIGABRT), false, false, 3, Some(60)) else {
            panic!()
        };
        assert!(why.contains("was killed by SIGABRT after sealing step 60"), "{why}");
        // Not sealed in this attempt (a resume of a complete run that then fails): a crash.
        assert!(matches!(verdict(ChildEnd::Exited(1), false, false, 0, Some(60)), Verdict::Crashed { .. }));
        // A stop or a lost lock still decide first.
        assert_eq!(verdict(ChildEnd::Exited(1), true, false, 3, Some(60)), Verdict::Stopped);
        assert_eq!(verdict(ChildEnd::Exited(1), false, true, 3, Some(60)), Verdict::LockLost);
    }

    #[test]
    fn a_crash_after_a_seal_is_transient_and_before_one_deterministic() {
        let Verdict::Crashed { class, why } = verdict(ChildEnd::Signaled(SIGSEGV), false, false, 2, None) else {
            panic!()
        };
        assert_eq!(class, CrashClass::Transient);
        assert!(why.contains("was killed by SIGSEGV after sealing 2 checkpoint(s)"), "{why}");
        let Verdict::Crashed { class, why } = verdict(ChildEnd::Exited(3), false, false, 0, None) else { panic!() };
        assert_eq!(class, CrashClass::Deterministic);
        assert!(why.contains("exited with code 3 before sealing any checkpoint"), "{why}");
    }

    #[test]
    fn signals_are_named() {
        assert_eq!(signal_name(SIGKILL), "SIGKILL");
        assert_eq!(signal_name(99), "signal 99");
        assert_eq!(ChildEnd::Signaled(SIGKILL).describe(), "was killed by SIGKILL");
    }
}
