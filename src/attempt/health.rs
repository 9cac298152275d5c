//! The start of every attempt, on every node, before the run directory is
//! touched (both drivers call [`before_start`]):
//!
//! ```text
//! progress guard   [run] max_attempts_without_progress attempts in a row
//!                  committed no newer checkpoint (crate::health::progress):
//!                  `error` (the attempts' nodes and ends), exit 79, no requeue
//! node check       crate::health::node_checks (the node-wide ones once a
//!                  node in a job step: node_verdict.rs); a required check
//!                  that fails:
//!                  `node_unhealthy` ─ a new in-job step without this node
//!                  when the batch shell offers one and the job has another
//!                  node, else the requeue (as a transient crash, no hold)
//!                  and the node excluded from the requeued job ─ exit 75
//!                  with a checkpoint to resume from, else 1; never trains
//! ```
//!
//! And the exclusion itself ([`exclude_blamed`]), which every requeue that
//! blames nodes shares: the job's `ExcNodeList` after `scontrol requeue`,
//! planned by `crate::health::plan_exclusion` (bounded, never leaving the
//! partition unable to run the job), recorded as `nodes_excluded`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::checkpoint::{CheckpointStore, VerifyLevel};
use crate::config::Config;
use crate::gpu::{EnvMap, GpuProbe, InventoryProbe, SystemProbe};
use crate::health::{
    AttemptEnd, Check, Checklist, ExclusionInput, ExclusionPlan, FS_TIMEOUT, Guard, NODE_WIDE, NodeInput, Starting,
    StorageProbe, VERDICT_WHY, blame, node_checks, plan_exclusion, progress_guard,
};
use crate::rundir::{self, EVENTS_FILE};
use crate::slurm::injob::InJobOffer;
use crate::slurm::{self, RequeueRequest, Scontrol, SlurmControl, SlurmEnv, StopKind, expand_hostlist};
use crate::telemetry::{
    ErrorEvent, Event, EventLog, NodeUnhealthy, NodesExcluded, RecordedEvent, Redactor, RequeueRecord,
};

use super::budget;
use super::devices::INVENTORY_ENV;
use super::ending::{ask_for_in_job_restart, record_or_log};
use super::error::RunError;
use super::node_verdict::NodeVerdict;
use super::records::{context, recorded};
use super::stop::StopFlag;

/// The progress guard, then the node check (module docs). `records`: this
/// process writes the run's records (one process, or rank 0): it records the
/// guard's verdict; every rank checks its own node and records its own
/// failure.
///
/// A stop while a check runs ends it (the site command is killed at once)
/// and blames nothing: the attempt goes on to the driver's own early stop.
pub(crate) fn before_start(
    cfg: &Config,
    slurm: &SlurmEnv,
    root: &Path,
    records: bool,
    stop: &StopFlag,
) -> Result<(), RunError> {
    let events_path = root.join(EVENTS_FILE);
    // Every rank decides (they read the same records) and exits 79 alike,
    // so the batch shell sees rekindle's own code; one records it. The guard
    // counts the attempts since the last checkpoint or finish: only those
    // records are read (from the end of the file), not the run's history.
    let since_progress = |e: &crate::telemetry::RecordedEvent| e.name == "checkpoint_saved" || e.name == "finish";
    let history = match crate::telemetry::read_events_since(&events_path, since_progress) {
        Ok(events) => events.unwrap_or_default(),
        Err(e) => {
            tracing::warn!(error = %e, path = %events_path.display(), "cannot read the events back; counting no earlier attempts");
            Vec::new()
        }
    };
    let config = crate::config::config_hash(cfg);
    let starting = Starting { job_id: slurm.job_id.as_deref(), config: &config };
    match progress_guard(cfg.run.max_attempts_without_progress, &history, &starting) {
        Guard::Train => {}
        Guard::Warn(verdict) => tracing::warn!(message = %verdict.message, "no progress in earlier attempts"),
        Guard::Refuse(verdict) => {
            tracing::error!(message = %verdict.message, "not training: no progress");
            if records {
                record_guard(slurm, &events_path, &verdict.message);
            }
            return Err(RunError::NoProgress { message: verdict.message });
        }
    }
    if !cfg.health.check {
        return Ok(());
    }
    let env: EnvMap = crate::gpu::utf8_env();
    let inventory = std::env::var_os(INVENTORY_ENV).filter(|v| !v.is_empty()).map(PathBuf::from);
    let probe: Box<dyn GpuProbe> = match &inventory {
        Some(path) => Box::new(InventoryProbe::new(path)),
        None => Box::new(SystemProbe::new()),
    };
    let checkpoints = rundir::checkpoints_dir(root, cfg);
    // What is the node's (NODE_WIDE) is checked by its first rank, whose
    // verdict the node's other ranks take (node_verdict.rs).
    let share = NodeVerdict::for_launch(slurm);
    let given = match &share {
        Some(share) if !share.first => {
            let bound = 2 * FS_TIMEOUT + cfg.health.timeout + Duration::from_secs(10);
            let given = share.wait(bound, &|| stop.is_set());
            if given.is_none() {
                if stop.is_set() {
                    tracing::warn!(node = %slurm.node_name(), "a stop came while waiting for this node's checks: the node is not blamed");
                    return Ok(());
                }
                tracing::warn!(node = %slurm.node_name(), seconds = bound.as_secs(), "the node's first rank left no verdict of its checks: this rank makes them itself");
            }
            given
        }
        _ => None,
    };
    let node_wide = given.is_none();
    // The free-disk check needs the newest checkpoint's size: its
    // manifest's, one small read a node (verifying it read every rank's
    // files on every node).
    let expected = if node_wide { newest_size(&checkpoints) } else { None };
    let offer = InJobOffer::from_process();
    let node = slurm.node_name();
    let started = Instant::now();
    let list = node_checks(&NodeInput {
        health: &cfg.health,
        backend: cfg.gpu.backend,
        env: &env,
        probe: probe.as_ref(),
        inventory: inventory.is_some(),
        run_dir: root,
        checkpoint_dir: &checkpoints,
        expected_checkpoint_bytes: expected,
        storage: StorageProbe::Write,
        restarting: slurm.restart_count > 0 || offer.as_ref().is_some_and(|o| o.restarts > 0),
        node: &node,
        stopped: &|| stop.is_set(),
        redactor: &Redactor::new(&cfg.telemetry.secret_words),
        node_wide,
    });
    let list = match (given, &share) {
        (Some(given), _) => with_node_verdict(list, given),
        // A first rank stopped mid-check leaves nothing: its list says
        // what a stop cut short, not the node's health.
        (None, Some(share)) if share.first && !stop.is_set() => {
            let node_checks: Vec<Check> =
                list.checks.iter().filter(|c| NODE_WIDE.contains(&c.name.as_str())).cloned().collect();
            share.publish(&node_checks);
            list
        }
        (None, _) => list,
    };
    let Some(failed) = list.first_required_failure().cloned() else {
        if stop.is_set() {
            tracing::warn!(node = %node, "a stop came during the node check: the check was ended, the node is not blamed");
            return Ok(());
        }
        tracing::info!(node = %node, seconds = started.elapsed().as_secs_f64(), "this node passed its health check");
        return Ok(());
    };
    tracing::error!(node = %node, check = %failed.name, detail = %failed.detail, "this node failed its health check; not training");
    // A rank that skipped the node's checks failed its own device's: what
    // comes next depends on the newest checkpoint all the same.
    let newest = newest_checkpoint(&checkpoints);
    // Records go into the run directory: claim it first, as any attempt
    // would (a directory that is not rekindle's is refused, not written).
    rundir::claim(root, cfg)?;
    let mut events = EventLog::open(&events_path, context(slurm))?;
    record_or_log(
        &mut events,
        &Event::NodeUnhealthy(NodeUnhealthy {
            node: node.clone(),
            check: failed.name.clone(),
            detail: failed.detail.clone(),
            checks: serde_json::to_value(&list).unwrap_or_default(),
            launch: launch_of(slurm),
            config_sha256: Some(config),
        }),
    );
    let cause = format!("node_unhealthy: {}", failed.name);
    let end = AttemptEnd::Unhealthy { node: node.clone(), check: failed.name.clone() };
    // A rank that made the node's checks itself because its first rank left
    // no verdict (it died, or hangs) asks SLURM itself: nobody else will.
    let localid = if share.as_ref().is_some_and(|s| !s.first) && node_wide { None } else { slurm.localid };
    let next = match slurm_caller(&failed.name, localid) {
        SlurmCaller::ThisRank => leave_node_behind(cfg, slurm, &cause, &end, offer.as_ref(), newest, &mut events),
        SlurmCaller::NodeLeader => {
            tracing::info!(check = %failed.name, "the node's first rank (SLURM_LOCALID 0) asks SLURM for the node");
            format!(
                "the node's first rank (SLURM_LOCALID 0) asks SLURM to restart or requeue without {node}: \
                 its `{}` check is this node's",
                failed.name
            )
        }
    };
    let _ = events.sync();
    Err(RunError::Unhealthy { node, check: failed.name, detail: failed.detail, next, resumable: newest.is_some() })
}

/// `list` (this rank's own checks, the node's skipped) with the node's
/// checks as its first rank made them.
fn with_node_verdict(mut list: Checklist, node: Vec<Check>) -> Checklist {
    list.checks.retain(|c| !NODE_WIDE.contains(&c.name.as_str()));
    list.checks.extend(node);
    list
}

/// The guard's `error` event (best effort: the exit code says it anyway).
fn record_guard(slurm: &SlurmEnv, events_path: &Path, message: &str) {
    match EventLog::open(events_path, context(slurm)) {
        Ok(mut events) => record_or_log(
            &mut events,
            &Event::Error(ErrorEvent {
                step: None,
                error: message.to_string(),
                class: None,
                why: Some(VERDICT_WHY.into()),
                requeue: Some(RequeueRecord::skip("no progress: the job is not requeued")),
                hold_seconds: None,
                hold_error: None,
            }),
        ),
        Err(e) => tracing::error!(error = %e, "could not record the guard's error event"),
    }
}

/// Which rank of a node asks slurmctld after a failed check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SlurmCaller {
    /// This rank: its failure may be its own, or it is the node's first.
    ThisRank,
    /// The node's first rank (`SLURM_LOCALID` 0), which fails the same
    /// node-wide check: this rank records its failure and calls nothing.
    NodeLeader,
}

/// Who calls `scontrol`/`sinfo` (2–5 calls) after failed check `check`
/// (#41): a node-wide failure on every rank of a node (a hung mount, clock
/// skew) once made every rank call, 8 × the calls on a node of 8 GPUs, and
/// 2,600 RPCs within seconds at 512 ranks; now one rank per node calls.
/// A rank with no `SLURM_LOCALID` (outside a step, `mpirun`) calls itself.
pub(crate) fn slurm_caller(check: &str, localid: Option<u32>) -> SlurmCaller {
    match localid {
        Some(l) if l > 0 && NODE_WIDE.contains(&check) => SlurmCaller::NodeLeader,
        _ => SlurmCaller::ThisRank,
    }
}

/// What launched this attempt (`NodeUnhealthy::launch`).
fn launch_of(slurm: &SlurmEnv) -> String {
    match (&slurm.job_id, &slurm.step_id) {
        (Some(job), Some(step)) => format!("{job}.{step}"),
        _ => format!("pid {}", std::process::id()),
    }
}

/// The newest checkpoint that verifies (quick), read only.
fn newest_checkpoint(dir: &Path) -> Option<u64> {
    if !dir.is_dir() {
        return None;
    }
    CheckpointStore::open_read_only(dir).newest_valid(VerifyLevel::Quick).ok()?.map(|i| i.step)
}

/// The recorded size of the newest checkpoint (its manifest's), read only.
fn newest_size(dir: &Path) -> Option<u64> {
    if !dir.is_dir() {
        return None;
    }
    CheckpointStore::open_read_only(dir).newest_manifest().ok()?.map(|(_, m)| m.total_bytes())
}

/// After a failed check: a new in-job step without this node when the
/// batch shell offers one and the job has another node to run on, else the
/// requeue with the node excluded. Returns what happens next, for the error.
fn leave_node_behind(
    cfg: &Config,
    slurm: &SlurmEnv,
    cause: &str,
    end: &AttemptEnd,
    offer: Option<&InJobOffer>,
    newest: Option<u64>,
    events: &mut EventLog,
) -> String {
    let blamed = blame(end, &straggler_blame(events.path()));
    if cfg.health.exclude
        && others_left(slurm, &blamed, offer)
        && let Some(record) = ask_for_in_job_restart(cfg, slurm, cause, &blamed, &blamed, newest, events.path())
    {
        record_or_log(events, &Event::Requeue(record));
        record_in_job_exclusion(events, cause, &blamed, offer);
        return format!("the batch shell starts a new step without {}", blamed.join(", "));
    }
    let req = RequeueRequest {
        policy: cfg.signals.requeue,
        stop: StopKind::TransientCrash,
        finished: newest.is_some_and(|s| s >= cfg.run.max_steps),
        job_id: slurm.control_id(),
        restart_count: slurm.restart_count,
        max_restarts: cfg.signals.max_restarts,
    };
    let timeout = || budget::scontrol_timeout(None, Instant::now());
    let record = slurm::requeue_after_stop(&Scontrol, &req, &timeout);
    record_or_log(events, &Event::Requeue(record.clone()));
    let excluded = exclude_blamed(cfg, slurm, &Scontrol, cause, &blamed, &record, events.path(), &timeout);
    if let Some(excluded) = &excluded {
        record_or_log(events, &Event::NodesExcluded(excluded.clone()));
    }
    match (&record.answer, excluded) {
        (Some(_), Some(e)) if !e.added.is_empty() => format!("the job was requeued without {}", e.added.join(", ")),
        (Some(_), _) => "the job was requeued (no node excluded: see nodes_excluded)".into(),
        (None, _) => format!(
            "the job was not requeued ({}): run it again elsewhere{}",
            record.error.as_deref().unwrap_or(record.decision.reason()),
            if cfg.health.exclude { format!(", e.g. with --exclude={}", blamed.join(",")) } else { String::new() }
        ),
    }
}

/// Whether the job's allocation has a node besides `blamed` and those the
/// batch shell already left out: only then can a new in-job step run
/// without the blamed ones (else the requeue leaves them behind).
/// The nodes this attempt's blamed stragglers ran on (`[health]
/// straggler_blame`), read back from its events: nothing when none were
/// blamed or the events cannot be read (blame is then what the end says).
pub(crate) fn straggler_blame(events_path: &Path) -> Vec<String> {
    // This attempt's events only, streamed (a long run's history is not held).
    match crate::telemetry::read_events_since(events_path, |e| e.name == "start") {
        Ok(Some(attempt)) => crate::health::blamed_stragglers(&attempt),
        Ok(None) => Vec::new(),
        Err(e) => {
            tracing::warn!(events = %events_path.display(), error = %e, "cannot read the events for blamed stragglers");
            Vec::new()
        }
    }
}

pub(crate) fn others_left(slurm: &SlurmEnv, blamed: &[String], offer: Option<&InJobOffer>) -> bool {
    let nodes = slurm.nodelist.as_deref().map(expand_hostlist).unwrap_or_default();
    nodes.into_iter().any(|n| !blamed.contains(&n) && !offer.is_some_and(|o| o.excluded.contains(&n)))
}

/// Records the nodes an in-job restart request leaves out.
fn record_in_job_exclusion(events: &mut EventLog, cause: &str, blamed: &[String], offer: Option<&InJobOffer>) {
    record_or_log(events, &Event::NodesExcluded(in_job_exclusion(cause, blamed, offer)));
}

/// The `nodes_excluded` record of an in-job restart request that leaves
/// `blamed` out of the next step (the nodes the shell left out before too).
pub(crate) fn in_job_exclusion(cause: &str, blamed: &[String], offer: Option<&InJobOffer>) -> NodesExcluded {
    let mut excluded: Vec<String> = offer.map(|o| o.excluded.clone()).unwrap_or_default();
    excluded.extend(blamed.iter().cloned());
    excluded.sort();
    excluded.dedup();
    NodesExcluded {
        cause: cause.into(),
        blamed: blamed.to_vec(),
        added: blamed.to_vec(),
        excluded,
        how: "in_job".into(),
        note: None,
        error: None,
    }
}

/// The nodes rekindle excluded from job `job_id` before (its records).
fn excluded_before(events: &[RecordedEvent], job_id: Option<&str>) -> Vec<String> {
    let mut nodes: Vec<String> = events
        .iter()
        .filter(|e| e.job_id.as_deref() == job_id)
        .filter_map(|e| match &e.event {
            Event::NodesExcluded(x) if x.how == "requeue" => Some(x.added.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    nodes.sort();
    nodes.dedup();
    nodes
}

/// After a requeue (`requeue`) whose end blamed `blamed`: the job's
/// excluded nodes planned and set through `control`; the `nodes_excluded`
/// record for the caller to write (`events`: the run's records so far,
/// which say what was excluded before). `None` when nothing is blamed.
#[allow(clippy::too_many_arguments)]
pub(crate) fn exclude_blamed(
    cfg: &Config,
    slurm: &SlurmEnv,
    control: &dyn SlurmControl,
    cause: &str,
    blamed: &[String],
    requeue: &RequeueRecord,
    events: &Path,
    timeout: &dyn Fn() -> Option<Duration>,
) -> Option<NodesExcluded> {
    if blamed.is_empty() {
        return None;
    }
    let mut record = NodesExcluded {
        cause: cause.into(),
        blamed: blamed.to_vec(),
        how: "requeue".into(),
        ..NodesExcluded::default()
    };
    let job_id = slurm.control_id();
    match (&job_id, requeue.answer) {
        _ if !cfg.health.exclude => record.note = Some("[health] exclude = false".into()),
        (Some(job_id), Some(_)) => {
            let before = excluded_before(&recorded(events), slurm.job_id.as_deref());
            set_exclusion(cfg, control, job_id, blamed, &before, &mut record, timeout)
        }
        _ => {
            record.note = Some(format!(
                "the job was not requeued ({}): nothing to exclude the node(s) from",
                requeue.error.as_deref().unwrap_or(requeue.decision.reason())
            ))
        }
    }
    if let Some(error) = &record.error {
        tracing::error!(%error, blamed = ?blamed, "could not exclude the blamed node(s); the next attempt may land on them");
    } else if !record.added.is_empty() {
        tracing::warn!(added = ?record.added, excluded = ?record.excluded, "the requeued job leaves the blamed node(s) behind");
    }
    Some(record)
}

/// The job's exclusions now and the plan for `blamed` (`show_job`, then
/// `sinfo` on its partition), or why it could not be made.
fn plan_for_job(
    cfg: &Config,
    control: &dyn SlurmControl,
    job_id: &str,
    blamed: &[String],
    before: &[String],
    timeout: &dyn Fn() -> Option<Duration>,
) -> Result<(Vec<String>, ExclusionPlan), String> {
    let t = timeout().ok_or(slurm::NO_TIME)?;
    let job = control.show_job(job_id, t).map_err(|e| e.to_string())?;
    let partition = job.partition.as_deref().map(|p| p.split(',').next().unwrap_or(p).to_string());
    let (nodes, partition_error) = match (&partition, timeout()) {
        (Some(p), Some(t)) => match control.partition_nodes(p, t) {
            Ok(nodes) => (Some(nodes), None),
            Err(e) => (None, Some(e.to_string())),
        },
        (None, _) => (None, Some("scontrol shows no partition".to_string())),
        (_, None) => (None, Some(slurm::NO_TIME.to_string())),
    };
    let plan = plan_exclusion(&ExclusionInput {
        enabled: cfg.health.exclude,
        blamed,
        current: &job.excluded,
        added_before: before,
        max_added: cfg.health.max_excluded_nodes,
        partition: partition.as_deref().zip(nodes.as_deref()),
        partition_error: partition_error.as_deref(),
        nodes_needed: job.num_nodes.unwrap_or(1),
    });
    Ok((job.excluded, plan))
}

/// Plans and sets the exclusion of a requeued job.
fn set_exclusion(
    cfg: &Config,
    control: &dyn SlurmControl,
    job_id: &str,
    blamed: &[String],
    before: &[String],
    record: &mut NodesExcluded,
    timeout: &dyn Fn() -> Option<Duration>,
) {
    let (current, plan) = match plan_for_job(cfg, control, job_id, blamed, before, timeout) {
        Ok(planned) => planned,
        Err(e) => return record.error = Some(e),
    };
    record.excluded = current;
    match plan {
        ExclusionPlan::Skip { reason } => record.note = Some(reason),
        ExclusionPlan::Exclude { list, added, note } => {
            record.note = note;
            match timeout()
                .ok_or(slurm::NO_TIME.to_string())
                .and_then(|t| control.set_excluded(job_id, &list, t).map_err(|e| e.to_string()))
            {
                Ok(()) => {
                    record.added = added;
                    record.excluded = list;
                }
                Err(e) => record.error = Some(e),
            }
        }
    }
}

/// For an in-job restart request: the exclusion list the batch shell sets
/// should it requeue the job instead (`RestartRequest::requeue_exclude`),
/// planned now as after a requeue; empty when nothing is to be set or the
/// plan could not be made (logged).
pub(crate) fn requeue_exclusion_for_request(
    cfg: &Config,
    slurm: &SlurmEnv,
    control: &dyn SlurmControl,
    blamed: &[String],
    events: &Path,
) -> Vec<String> {
    let Some(job_id) = slurm.control_id().filter(|_| cfg.health.exclude && !blamed.is_empty()) else {
        return Vec::new();
    };
    let before = excluded_before(&recorded(events), slurm.job_id.as_deref());
    let timeout = || budget::scontrol_timeout(None, Instant::now());
    match plan_for_job(cfg, control, &job_id, blamed, &before, &timeout) {
        Ok((_, ExclusionPlan::Exclude { list, .. })) => list,
        Ok((_, ExclusionPlan::Skip { reason })) => {
            tracing::info!(%reason, "should the batch shell requeue the job, it excludes no node");
            Vec::new()
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot plan the exclusion for a requeue by the batch shell");
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    #[test]
    fn a_node_wide_failure_is_taken_to_slurm_by_one_rank_per_node() {
        // 8 ranks on a node whose mount hangs: one caller, not 8 (#41).
        for check in NODE_WIDE {
            let callers = (0..8).filter(|&l| slurm_caller(check, Some(l)) == SlurmCaller::ThisRank).count();
            assert_eq!(callers, 1, "{check}");
        }
        // A device of one rank's own: that rank calls, whatever its place.
        for check in ["devices", "device memory", "gpu health"] {
            assert_eq!(slurm_caller(check, Some(5)), SlurmCaller::ThisRank, "{check}");
        }
        assert_eq!(slurm_caller("clock skew", None), SlurmCaller::ThisRank);
    }

    #[test]
    fn the_node_wide_checks_are_the_ones_the_node_check_runs() {
        // A renamed check would silently fall back to a caller per rank.
        let names = ["run directory", "clock skew", "checkpoint directory", "checkpoint round-trip", "site command"];
        let node = include_str!("../health/node.rs");
        let storage = include_str!("../health/storage.rs");
        for name in names {
            let pattern = format!("let name = \"{name}\"");
            assert!(node.contains(&pattern) || storage.contains(&pattern), "{name}");
        }
    }

    use super::*;
    use crate::slurm::{JobView, PartitionNode, RequeueAnswer, SlurmError};
    use crate::telemetry::RequeueDecision;

    /// A stand-in for `scontrol` and `sinfo`: a job, a partition, and the
    /// calls received.
    struct Fake {
        job: JobView,
        partition: Result<Vec<PartitionNode>, SlurmError>,
        update: Result<(), SlurmError>,
        calls: RefCell<Vec<String>>,
    }

    impl Fake {
        fn new(excluded: &[&str]) -> Fake {
            Fake {
                job: JobView {
                    state: "PENDING".into(),
                    reason: None,
                    batch: true,
                    requeue_allowed: true,
                    restarts: 1,
                    node_list: None,
                    preempt_time: None,
                    excluded: excluded.iter().map(|n| n.to_string()).collect(),
                    partition: Some("debug".into()),
                    num_nodes: Some(1),
                },
                partition: Ok(["n1", "n2", "n3"]
                    .iter()
                    .map(|n| PartitionNode { name: n.to_string(), state: "idle".into() })
                    .collect()),
                update: Ok(()),
                calls: RefCell::new(Vec::new()),
            }
        }
    }

    impl SlurmControl for Fake {
        fn show_job(&self, job_id: &str, _: Duration) -> Result<JobView, SlurmError> {
            self.calls.borrow_mut().push(format!("show {job_id}"));
            Ok(self.job.clone())
        }
        fn requeue(&self, _: &str, _: Duration) -> Result<RequeueAnswer, SlurmError> {
            unreachable!("the exclusion never requeues")
        }
        fn hold_for(&self, _: &str, _: Duration, _: Duration) -> Result<(), SlurmError> {
            unreachable!("the exclusion never holds")
        }
        fn set_excluded(&self, job_id: &str, nodes: &[String], _: Duration) -> Result<(), SlurmError> {
            self.calls.borrow_mut().push(format!("exclude {job_id} {}", nodes.join(",")));
            self.update.clone()
        }
        fn partition_nodes(&self, partition: &str, _: Duration) -> Result<Vec<PartitionNode>, SlurmError> {
            self.calls.borrow_mut().push(format!("sinfo {partition}"));
            self.partition.clone()
        }
    }

    fn requeued() -> RequeueRecord {
        RequeueRecord {
            decision: RequeueDecision::Requeue { job_id: "42".into(), reason: "r".into() },
            answer: Some(RequeueAnswer::Requeued),
            error: None,
        }
    }

    fn slurm() -> SlurmEnv {
        SlurmEnv { job_id: Some("42".into()), node: Some("n1".into()), ..SlurmEnv::default() }
    }

    fn ten() -> Option<Duration> {
        Some(Duration::from_secs(10))
    }

    fn exclude(cfg: &Config, fake: &Fake, requeue: &RequeueRecord, events: &Path) -> Option<NodesExcluded> {
        exclude_blamed(cfg, &slurm(), fake, "node_unhealthy: site command", &["n1".into()], requeue, events, &ten)
    }

    #[test]
    fn a_requeued_job_gets_the_blamed_node_added_to_its_own_exclusions() {
        let dir = tempfile::tempdir().unwrap();
        let fake = Fake::new(&["n9"]);
        let record = exclude(&Config::default(), &fake, &requeued(), &dir.path().join("events.jsonl")).unwrap();
        assert_eq!((record.added, record.excluded), (vec!["n1".to_string()], vec!["n1".to_string(), "n9".into()]));
        assert_eq!((record.how.as_str(), record.note, record.error), ("requeue", None, None));
        assert_eq!(*fake.calls.borrow(), ["show 42", "sinfo debug", "exclude 42 n1,n9"]);
    }

    #[test]
    fn nothing_is_set_when_turned_off_not_requeued_or_refused() {
        let dir = tempfile::tempdir().unwrap();
        let events = dir.path().join("events.jsonl");
        let mut off = Config::default();
        off.health.exclude = false;
        let fake = Fake::new(&[]);
        let record = exclude(&off, &fake, &requeued(), &events).unwrap();
        assert_eq!(record.note.as_deref(), Some("[health] exclude = false"));
        assert!(fake.calls.borrow().is_empty());

        let skipped = RequeueRecord::skip("cannot ask SLURM about job 42 (scontrol not found on PATH)");
        let record = exclude(&Config::default(), &fake, &skipped, &events).unwrap();
        assert!(record.note.unwrap().contains("not requeued (cannot ask SLURM"), "no silent fallback");
        assert!(fake.calls.borrow().is_empty());

        let refused = Fake {
            update: Err(SlurmError::Failed {
                args: "scontrol update".into(),
                code: Some(1),
                stderr: "no longer pending".into(),
            }),
            ..Fake::new(&[])
        };
        let record = exclude(&Config::default(), &refused, &requeued(), &events).unwrap();
        assert!(record.added.is_empty());
        assert!(record.error.unwrap().contains("no longer pending"));
    }

    #[test]
    fn earlier_exclusions_of_the_same_job_count_toward_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let events = dir.path().join("events.jsonl");
        let mut log = EventLog::open(&events, context(&slurm())).unwrap();
        for node in ["n2", "n3"] {
            log.record(&Event::NodesExcluded(NodesExcluded {
                added: vec![node.into()],
                how: "requeue".into(),
                ..NodesExcluded::default()
            }))
            .unwrap();
        }
        let fake = Fake::new(&["n2", "n3"]);
        let record = exclude(&Config::default(), &fake, &requeued(), &events).unwrap();
        assert!(record.added.is_empty());
        assert!(record.note.unwrap().contains("max_excluded_nodes = 2 reached (n2, n3"), "{:?}", fake.calls);
    }

    #[test]
    fn an_in_job_step_can_leave_a_node_out_only_when_another_is_left() {
        let two = SlurmEnv { nodelist: Some("n[1-2]".into()), ..slurm() };
        let n1 = ["n1".to_string()];
        assert!(others_left(&two, &n1, None));
        let offer = InJobOffer { file: "/r".into(), restarts: 1, max: 3, excluded: vec!["n2".into()] };
        assert!(!others_left(&two, &n1, Some(&offer)), "n2 was left out before");
        let one = SlurmEnv { nodelist: Some("n1".into()), ..slurm() };
        assert!(!others_left(&one, &n1, None));
        assert!(!others_left(&slurm(), &n1, None), "no node list: no other node known");
    }

    #[test]
    fn an_in_job_request_carries_the_exclusion_a_requeue_would_set() {
        let dir = tempfile::tempdir().unwrap();
        let events = dir.path().join("events.jsonl");
        let fake = Fake::new(&["n9"]);
        let list = requeue_exclusion_for_request(&Config::default(), &slurm(), &fake, &["n1".into()], &events);
        assert_eq!(list, ["n1", "n9"]);
        assert_eq!(*fake.calls.borrow(), ["show 42", "sinfo debug"], "planned, not set: the job still runs");
        let mut off = Config::default();
        off.health.exclude = false;
        assert!(requeue_exclusion_for_request(&off, &slurm(), &fake, &["n1".into()], &events).is_empty());
    }

    #[test]
    fn nothing_blamed_records_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let fake = Fake::new(&[]);
        let out =
            exclude_blamed(&Config::default(), &slurm(), &fake, "stop", &[], &requeued(), &dir.path().join("e"), &ten);
        assert_eq!(out, None);
    }

    #[test]
    fn the_guard_refuses_an_attempt_after_enough_without_progress() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("run");
        std::fs::create_dir_all(&root).unwrap();
        let mut log = EventLog::open(root.join(EVENTS_FILE), context(&slurm())).unwrap();
        for _ in 0..2 {
            log.record(&Event::Start(Default::default())).unwrap();
            log.record(&Event::Error(ErrorEvent { error: "device lost".into(), ..Default::default() })).unwrap();
        }
        let mut cfg = Config::default();
        cfg.run.max_attempts_without_progress = 2;
        cfg.health.check = false;
        let err = before_start(&cfg, &slurm(), &root, true, &StopFlag::default()).unwrap_err();
        assert_eq!(err.outcome(), crate::exit::Outcome::NoProgress);
        assert!(err.to_string().contains("on n1 (job 42, restart 0): error: device lost"), "{err}");
        let last = recorded(&root.join(EVENTS_FILE)).pop().unwrap();
        assert_eq!(last.name, "error");
        // Under a larger bound the attempt goes on (its node check is off here).
        cfg.run.max_attempts_without_progress = 3;
        assert!(before_start(&cfg, &slurm(), &root, true, &StopFlag::default()).is_ok());
    }

    #[test]
    fn a_node_that_fails_its_check_records_why_and_does_not_train() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("run");
        let mut cfg = Config::default();
        cfg.health.command = Some("echo bad HCA; exit 1".into());
        // Outside SLURM: no requeue, no exclusion to set.
        let err = before_start(&cfg, &SlurmEnv::default(), &root, true, &StopFlag::default()).unwrap_err();
        assert!(
            matches!(&err, RunError::Unhealthy { check, resumable: false, .. } if check == "site command"),
            "{err}"
        );
        assert_eq!(err.outcome(), crate::exit::Outcome::Failure);
        let events = recorded(&root.join(EVENTS_FILE));
        let names: Vec<&str> = events.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["node_unhealthy", "requeue", "nodes_excluded"]);
        // Not requeued (no SLURM here), so nothing to exclude the node from, said so.
        let Event::NodesExcluded(x) = &events[2].event else { panic!("{:?}", events[2]) };
        assert!(x.note.as_deref().unwrap().contains("not requeued"), "{x:?}");
        assert!(err.to_string().contains("run it again elsewhere"), "{err}");
        assert!(err.to_string().contains("output: bad HCA"), "{err}");
    }
}
