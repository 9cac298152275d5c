//! A run of several ranks (docs/distributed.md): rank 0, the *leader*, runs
//! the whole lifecycle of a one-process run (lock, records, checkpoints,
//! requeue, publish); the other ranks, *followers*, train in lockstep and
//! write nothing but their heartbeat (`rank_watch.rs`). They agree through
//! rounds of one all-gather each: every rank sends a [`Report`] (its node,
//! the stop signal it received), and the leader adds what happens next
//! ([`Lead`]):
//!
//! ```text
//! hello          every rank: its node           (the start event lists them)
//!                leader: the launch's session   (heartbeats carry it)
//! Begin          leader: the step to resume from (or none)
//! Tick × steps   leader: whether it would train; every rank: its signal.
//!                A signal on any rank stops every rank at this boundary.
//! Snapshot       leader: it snapshots a sharded optimizer (ZeRO-1): every
//!                rank joins the gather of the moments
//! End            leader: the exit code; followers exit with it
//! ```
//!
//! Every decision is a pure function of what all ranks sent
//! ([`trains`]), so every rank makes the same one. The leader sends `End`
//! on every way out (also an error before `Begin`), so followers never wait
//! for a round that will not come. A rank that dies is first the launcher's
//! business (`srun --kill-on-bad-exit`, `mpirun`); one that stops without
//! dying, or dies unnoticed, is found by the heartbeats (`rank_watch.rs`),
//! and either way the job comes back from the last committed checkpoint.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::checkpoint::{CheckpointStore, load_dir};
use crate::config::Config;
use crate::distributed::{Collective, SharedWorld};
use crate::exit::Outcome;
use crate::train::{Registry, StepResult, Trainer};

use super::error::RunError;
use super::rank_watch::Pulse;
use super::stop::{StopFlag, StopReason};

/// What the leader says in a round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "lead", rename_all = "snake_case")]
pub enum Lead {
    /// The first round: the launch's identity, which every rank writes in
    /// its heartbeat (`rank_watch.rs`).
    Hello { session: String },
    /// Training begins: restore this step's checkpoint (none: step 0).
    Begin { resume_step: Option<u64> },
    /// A step boundary: whether the leader would train one more step.
    Tick { train: bool },
    /// The run is over: exit with this code.
    End { code: u8 },
    /// The leader takes a snapshot of a sharded optimizer
    /// (`[distributed] shard_optimizer`): every rank joins its gather.
    Snapshot,
}

/// What every rank says in every round.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub node: String,
    /// The first stop signal this rank received, and how long ago.
    pub signal: Option<i32>,
    pub signal_age_s: f64,
    /// Only from the leader.
    pub lead: Option<Lead>,
}

impl Report {
    fn of(node: &str, stop: &StopFlag, lead: Option<Lead>) -> Report {
        let signal = stop.signal().and_then(|r| match r {
            StopReason::Signal(s) => Some(s),
            StopReason::StopAtStep => None,
        });
        let age = stop.first_arrival().map_or(0.0, |t| t.elapsed().as_secs_f64());
        Report { node: node.to_string(), signal, signal_age_s: age, lead }
    }
}

/// Whether the step after this round is trained: the leader would, and no
/// rank got a stop signal.
pub fn trains(reports: &[Report]) -> bool {
    let leader_trains = matches!(reports.first().and_then(|r| r.lead.as_ref()), Some(Lead::Tick { train: true }));
    leader_trains && reports.iter().all(|r| r.signal.is_none())
}

/// The earliest stop signal over all ranks, and its age.
pub fn earliest_signal(reports: &[Report]) -> Option<(i32, f64)> {
    reports.iter().filter_map(|r| r.signal.map(|s| (s, r.signal_age_s))).max_by(|a, b| a.1.total_cmp(&b.1))
}

/// One round: sends `mine`, returns every rank's report in rank order.
fn round(world: &SharedWorld, mine: &Report) -> Result<Vec<Report>, RunError> {
    let bytes = serde_json::to_vec(mine).unwrap_or_default();
    let all = world.all_gather_bytes(&bytes).map_err(RunError::Distributed)?;
    all.iter()
        .enumerate()
        .map(|(rank, b)| {
            serde_json::from_slice(b).map_err(|e| RunError::Ranks {
                what: format!("rank {rank} sent an unreadable report ({e}): are all ranks the same rekindle?"),
            })
        })
        .collect()
}

/// The leader's side of the rounds.
#[derive(Clone)]
pub struct Leader {
    world: SharedWorld,
    node: String,
    /// The leader's heartbeat: the step it stands at, told at every tick.
    pulse: Pulse,
}

impl Leader {
    /// The hello round, announcing the launch's `session`; returns the
    /// leader and every rank's node.
    pub fn hello(
        world: SharedWorld,
        node: String,
        stop: &StopFlag,
        session: String,
        pulse: Pulse,
    ) -> Result<(Leader, Vec<String>), RunError> {
        let reports = round(&world, &Report::of(&node, stop, Some(Lead::Hello { session })))?;
        Ok((Leader { world, node, pulse }, reports.into_iter().map(|r| r.node).collect()))
    }

    pub fn world(&self) -> &SharedWorld {
        &self.world
    }

    pub fn begin(&self, stop: &StopFlag, resume_step: Option<u64>) -> Result<(), RunError> {
        round(&self.world, &Report::of(&self.node, stop, Some(Lead::Begin { resume_step }))).map(drop)
    }

    /// A step boundary after `step` completed steps: returns whether every
    /// rank trains the next step. A signal that reached only other ranks is
    /// recorded in `stop` (with its arrival time there, so the deadline is
    /// the earliest arrival).
    pub fn tick(&self, stop: &StopFlag, train: bool, step: u64) -> Result<bool, RunError> {
        self.pulse.at_step(step);
        let reports = round(&self.world, &Report::of(&self.node, stop, Some(Lead::Tick { train })))?;
        if let Some((sig, age)) = earliest_signal(&reports) {
            stop.merge_remote(
                sig,
                Instant::now().checked_sub(Duration::from_secs_f64(age)).unwrap_or_else(Instant::now),
            );
        }
        Ok(trains(&reports))
    }

    /// Before the leader snapshots a sharded optimizer: every follower joins
    /// the gather of the moments that the snapshot makes.
    pub fn snapshot(&self, stop: &StopFlag) -> Result<(), RunError> {
        round(&self.world, &Report::of(&self.node, stop, Some(Lead::Snapshot))).map(drop)
    }

    /// The last round: every follower exits with `outcome`'s code.
    pub fn end(&self, stop: &StopFlag, outcome: Outcome) {
        let lead = Lead::End { code: outcome.code() };
        if let Err(e) = round(&self.world, &Report::of(&self.node, stop, Some(lead))) {
            tracing::error!(error = %e, "could not tell the other ranks that the run is over");
        }
    }
}

/// The leader's instruction in a round.
fn lead_of(reports: &[Report]) -> Result<Lead, RunError> {
    reports
        .first()
        .and_then(|r| r.lead.clone())
        .ok_or_else(|| RunError::Ranks { what: "rank 0 sent no instruction: are all ranks the same rekindle?".into() })
}

/// A follower's hello round: returns the launch's session, from the leader.
pub fn follower_hello(world: &SharedWorld, node: &str, stop: &StopFlag) -> Result<String, RunError> {
    match lead_of(&round(world, &Report::of(node, stop, None))?)? {
        Lead::Hello { session } => Ok(session),
        other => Err(RunError::Ranks { what: format!("rank 0 began with {other:?} instead of hello") }),
    }
}

/// A follower after its hello: trains in lockstep with the leader, writes
/// nothing but its heartbeat (through `pulse`), and exits with the leader's
/// code.
pub fn follow(
    cfg: &Config,
    registry: &Registry,
    checkpoints: CheckpointStore,
    world: SharedWorld,
    node: String,
    stop: &StopFlag,
    pulse: &Pulse,
) -> Result<Outcome, RunError> {
    let mut trainer: Option<Trainer> = None;
    loop {
        let reports = round(&world, &Report::of(&node, stop, None))?;
        match lead_of(&reports)? {
            Lead::Hello { .. } => return Err(RunError::Ranks { what: "rank 0 said hello twice".into() }),
            Lead::End { code } => return Ok(Outcome::from_code(code)),
            Lead::Snapshot => {
                // The leader snapshots a sharded optimizer: its gather needs
                // every rank's slice; what this rank gathers is not kept.
                let t = trainer.as_ref().ok_or_else(|| RunError::Ranks {
                    what: "rank 0 asked for a snapshot before training began".into(),
                })?;
                t.snapshot()?;
            }
            Lead::Begin { resume_step } => {
                let mut t = Trainer::from_registry(cfg, registry)?;
                if let Some(step) = resume_step {
                    let dir = checkpoints.step_dir(step);
                    let loaded = load_dir(&dir).map_err(|failures| RunError::Ranks {
                        what: format!(
                            "checkpoint {} that rank 0 resumes from does not verify here ({}): is the run \
                             directory on storage every node shares?",
                            dir.display(),
                            failures.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
                        ),
                    })?;
                    let snap = &loaded.snapshot;
                    t.restore(&snap.model, &snap.optimizer, &snap.state["train"])
                        .map_err(|source| RunError::Restore { dir: dir.clone(), source })?;
                    pulse.at_step(step);
                }
                t.join_world(Box::new(world.clone()), cfg.model.dropout)?;
                if cfg.distributed.shard_optimizer {
                    t.shard_optimizer()?;
                }
                trainer = Some(t);
            }
            Lead::Tick { .. } => {
                if !trains(&reports) {
                    continue;
                }
                let t = trainer
                    .as_mut()
                    .ok_or_else(|| RunError::Ranks { what: "rank 0 asked for a step before training began".into() })?;
                match t.train_step(&|| false)? {
                    StepResult::Completed(_) | StepResult::NonFiniteStop(_) | StepResult::Interrupted => {
                        pulse.at_step(t.step());
                    }
                    StepResult::NonFiniteRollback(_) => {
                        return Err(RunError::Ranks { what: "a rollback in a data-parallel run".into() });
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(signal: Option<i32>, age: f64, lead: Option<Lead>) -> Report {
        Report { node: "n".into(), signal, signal_age_s: age, lead }
    }

    #[test]
    fn every_rank_trains_only_when_the_leader_would_and_no_rank_got_a_signal() {
        let tick = |train| Some(Lead::Tick { train });
        assert!(trains(&[report(None, 0.0, tick(true)), report(None, 0.0, None)]));
        assert!(!trains(&[report(None, 0.0, tick(false)), report(None, 0.0, None)]));
        assert!(!trains(&[report(None, 0.0, tick(true)), report(Some(15), 0.2, None)]));
        assert!(!trains(&[report(Some(10), 0.1, tick(true)), report(None, 0.0, None)]));
        assert!(!trains(&[report(None, 0.0, Some(Lead::Begin { resume_step: None }))]));
        assert!(!trains(&[]));
    }

    #[test]
    fn the_earliest_signal_over_ranks_sets_the_deadline() {
        let reports = [report(Some(15), 0.1, None), report(Some(10), 2.5, None), report(None, 0.0, None)];
        assert_eq!(earliest_signal(&reports), Some((10, 2.5)));
        assert_eq!(earliest_signal(&[report(None, 0.0, None)]), None);
    }

    #[test]
    fn reports_round_trip_through_json() {
        for lead in [
            Lead::Hello { session: "n1-7-1".into() },
            Lead::Begin { resume_step: Some(4) },
            Lead::Tick { train: false },
            Lead::End { code: 75 },
        ] {
            let r = report(Some(15), 1.0, Some(lead));
            let back: Report = serde_json::from_slice(&serde_json::to_vec(&r).unwrap()).unwrap();
            assert_eq!(back, r);
        }
    }
}
