//! The exit-code contract, in one place. Scripts (and `slurm/orchestrator.slurm`)
//! rely on these numbers; README.md ("Exit codes") and `rekindle --help` repeat them.

use std::process::ExitCode;

/// What a finished command means for the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// 0: the work is done (training finished, verification passed), also
    /// when it was done before: a finished run run again writes nothing.
    Done,
    /// 75 (EX_TEMPFAIL): stopped with a durable checkpoint; run again to continue.
    StoppedWithCheckpoint,
    /// 78 (EX_CONFIG): the configuration cannot be used (the config, its
    /// model or data, a changed training setting, a run directory the other
    /// command continues), found before anything was started or changed.
    ConfigError,
    /// 2: the command line was invalid (clap's own code).
    UsageError,
    /// 79: `[run] max_attempts_without_progress` attempts of this SLURM job
    /// in a row committed no newer checkpoint: this attempt (a requeue or an
    /// in-job restart) did not train and the job is not requeued (the
    /// message names the attempts' nodes and how they ended).
    NoProgress,
    /// 1: anything else, including a failed verification and a stop that
    /// leaves no durable checkpoint to continue from.
    Failure,
}

impl Outcome {
    /// The numeric exit status.
    pub fn code(self) -> u8 {
        match self {
            Outcome::Done => 0,
            Outcome::Failure => 1,
            Outcome::UsageError => 2,
            Outcome::StoppedWithCheckpoint => 75,
            Outcome::ConfigError => 78,
            Outcome::NoProgress => 79,
        }
    }

    /// The outcome of a code (a data-parallel run's followers exit with the
    /// leader's); an unknown code is a failure.
    pub fn from_code(code: u8) -> Outcome {
        match code {
            0 => Outcome::Done,
            2 => Outcome::UsageError,
            75 => Outcome::StoppedWithCheckpoint,
            78 => Outcome::ConfigError,
            79 => Outcome::NoProgress,
            _ => Outcome::Failure,
        }
    }
}

impl From<Outcome> for ExitCode {
    fn from(o: Outcome) -> ExitCode {
        ExitCode::from(o.code())
    }
}

/// The table printed at the end of `rekindle --help`.
pub const EXIT_CODES_HELP: &str = "\
Exit codes:
  0   finished (training done, verification passed; a run already finished
      says so and writes nothing)
  1   failure (including a checkpoint that does not verify, and a stop with no
      checkpoint to continue from: the next run starts at step 0)
  2   usage error on the command line
  75  stopped with a durable checkpoint: run the same command again to continue
  78  configuration error (the config, its model or data, a changed training
      setting, the other command's run directory): nothing was started or
      changed
  79  no progress: [run] max_attempts_without_progress attempts of this
      SLURM job in a row committed no newer checkpoint; not trained, not
      requeued (the message names each attempt's node and how it ended)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_outcome_round_trips_through_its_code() {
        for o in [
            Outcome::Done,
            Outcome::StoppedWithCheckpoint,
            Outcome::ConfigError,
            Outcome::UsageError,
            Outcome::Failure,
            Outcome::NoProgress,
        ] {
            assert_eq!(Outcome::from_code(o.code()), o);
        }
        assert_eq!(Outcome::from_code(9), Outcome::Failure);
    }
}
