//! The end of a `rekindle run` attempt whose world lost ranks
//! (`attempt/rank_watch.rs`): what the records and the decision are is
//! shared with `exec` (`attempt/lost.rs`); here the MPI world is aborted.
//!
//! ```text
//! recorder (lowest rank still beating): the records of attempt/lost.rs ─
//!     MPI_Abort(75 or 1)
//! other survivors: wait for the recorder's abort (it ends them), at most
//!     [signals] grace and two scontrol timeouts, then MPI_Abort themselves
//! ```

use std::path::PathBuf;

use crate::checkpoint::CheckpointStore;
use crate::config::Config;
use crate::distributed::abort_world;
use crate::exit::Outcome;
use crate::slurm::SlurmEnv;
use crate::telemetry::{Event, EventContext, EventLog};

use crate::attempt::budget::SCONTROL_TIMEOUT;
use crate::attempt::lost::{lost_message, newest_valid, record_loss};
use crate::attempt::rank_watch::{Lost, recorder};

/// What a rank that is not (or not yet) running the leader's attempt needs
/// to end a world that lost ranks: a follower, or the leader before its
/// attempt began.
pub struct WorldEnd {
    pub cfg: Config,
    pub slurm: SlurmEnv,
    /// `<run dir>/events.jsonl`.
    pub events: PathBuf,
    pub store: CheckpointStore,
    pub rank: usize,
    pub size: usize,
}

impl WorldEnd {
    /// Records the loss when this rank is the recorder, else waits for the
    /// recorder to abort the world; then aborts it. Never returns.
    pub fn handle(self, lost: Vec<Lost>) -> ! {
        let timeout = self.cfg.distributed.timeout;
        tracing::error!(rank = self.rank, "LOST RANKS: {}", lost_message(&lost, timeout));
        if recorder(&lost, self.size) != Some(self.rank) {
            // The recorder aborts the world once its records are written;
            // that ends this process too. Aborting first would kill it mid-record.
            std::thread::sleep(self.cfg.signals.grace + 2 * SCONTROL_TIMEOUT);
            let code =
                if newest_valid(&self.store).is_some() { Outcome::StoppedWithCheckpoint } else { Outcome::Failure };
            abort_world(code.code());
        }
        let newest = newest_valid(&self.store);
        let context = EventContext {
            node: self.slurm.node_name(),
            job_id: self.slurm.job_id.clone(),
            attempt: self.slurm.restart_count,
        };
        let mut log = EventLog::open(&self.events, context)
            .map_err(|e| tracing::error!(error = %e, "cannot open events.jsonl; ending without records"))
            .ok();
        let mut record = |event: &Event| {
            if let Some(log) = log.as_mut()
                && let Err(e) = log.record(event)
            {
                tracing::error!(error = %e, event = event.name(), "could not record an event; going on");
            }
        };
        let outcome = record_loss(
            &mut record,
            &self.cfg,
            &self.slurm,
            &self.events,
            &lost,
            self.rank,
            self.size,
            newest,
            Some(self.cfg.run.max_steps),
        );
        if let Some(log) = log.as_mut()
            && let Err(e) = log.sync()
        {
            tracing::error!(error = %e, "could not sync events.jsonl");
        }
        abort_world(outcome.code())
    }
}
