//! The requeue step after a stop: ask SLURM about the job (when the decision
//! needs it), [`decide`], and carry a `Requeue` decision out, each call to
//! SLURM through a [`SlurmControl`] and bounded by what the deadline leaves.
//! Returns the record `events.jsonl` keeps (the caller writes it), so the
//! whole path is tested with a fake control, without a cluster.

use std::time::Duration;

use crate::config::RequeuePolicy;
use crate::telemetry::RequeueRecord;

use super::control::SlurmControl;
use super::requeue::{Decision, RequeueInput, StopKind, decide};

/// Recorded when the deadline leaves too little time for an `scontrol` call.
pub const NO_TIME: &str = "no time left before the deadline";

/// What the requeue step needs to know about the run and the job.
#[derive(Debug, Clone, PartialEq)]
pub struct RequeueRequest {
    pub policy: RequeuePolicy,
    pub stop: StopKind,
    /// Training reached max_steps.
    pub finished: bool,
    /// The id for `scontrol` (`<array>_<task>` for array tasks); `None` outside SLURM.
    pub job_id: Option<String>,
    pub restart_count: u32,
    pub max_restarts: u32,
}

/// Decides whether to requeue and carries the decision out. `timeout` gives
/// the time one `scontrol` call may take at the moment it is made, `None`
/// when too little is left (then none is made: running past the deadline
/// means SIGKILL). Failures are recorded, never returned: an unanswered
/// query is a skip that relies on `sbatch --requeue`, a failed requeue keeps
/// the decision and records the error.
pub fn requeue_after_stop(
    control: &dyn SlurmControl,
    req: &RequeueRequest,
    timeout: &dyn Fn() -> Option<Duration>,
) -> RequeueRecord {
    let needs_query = req.job_id.is_some() && req.stop != StopKind::StopAtStep && req.policy != RequeuePolicy::Never;
    let (job, job_query_error) = match (&req.job_id, needs_query) {
        (Some(id), true) => match timeout().map(|t| control.show_job(id, t)) {
            Some(Ok(j)) => (Some(j), None),
            Some(Err(e)) => (None, Some(e.to_string())),
            None => (None, Some(NO_TIME.to_string())),
        },
        _ => (None, None),
    };
    let decision = decide(&RequeueInput {
        policy: req.policy,
        stop: req.stop,
        finished: req.finished,
        job_id: req.job_id.clone(),
        job,
        job_query_error,
        restart_count: req.restart_count,
        max_restarts: req.max_restarts,
    });
    let mut record = RequeueRecord { decision: decision.clone(), answer: None, error: None };
    match &decision {
        Decision::Requeue { job_id, reason } => {
            tracing::info!(job = %job_id, %reason, "requeueing the job");
            match timeout()
                .ok_or(NO_TIME.to_string())
                .and_then(|t| control.requeue(job_id, t).map_err(|e| e.to_string()))
            {
                Ok(answer) => record.answer = Some(answer),
                Err(e) => {
                    tracing::error!(error = %e, "scontrol requeue failed; relying on sbatch --requeue");
                    record.error = Some(e);
                }
            }
        }
        Decision::Skip { reason } => tracing::info!(%reason, "not requeueing"),
    }
    record
}

/// What the requeue after a transient crash did: the requeue record, and
/// the hold (backoff) set on the requeued job.
#[derive(Debug, Clone, PartialEq)]
pub struct CrashRequeue {
    pub record: RequeueRecord,
    /// Seconds the job is held back before it may start again (set only once
    /// SLURM accepted the requeue).
    pub hold_seconds: Option<u64>,
    /// Why the hold could not be set: the job then starts after SLURM's own
    /// requeue delay, without the backoff.
    pub hold_error: Option<String>,
}

/// The requeue after a transient crash: the same decision and `scontrol
/// requeue` as after a stop ([`requeue_after_stop`] with
/// [`StopKind::TransientCrash`]), then, once SLURM accepted it, a hold of
/// `hold` (`scontrol update JobId=… StartTime=now+N`) so that a crash
/// that repeats does not restart at once, again and again. A failed hold is
/// recorded, never undoes the requeue.
pub fn requeue_after_crash(
    control: &dyn SlurmControl,
    req: &RequeueRequest,
    hold: Duration,
    timeout: &dyn Fn() -> Option<Duration>,
) -> CrashRequeue {
    let req = RequeueRequest { stop: StopKind::TransientCrash, ..req.clone() };
    let record = requeue_after_stop(control, &req, timeout);
    let mut out = CrashRequeue { record, hold_seconds: None, hold_error: None };
    let (Decision::Requeue { job_id, .. }, Some(_)) = (&out.record.decision, out.record.answer) else { return out };
    if hold.is_zero() {
        return out;
    }
    match timeout()
        .ok_or(NO_TIME.to_string())
        .and_then(|t| control.hold_for(job_id, hold, t).map_err(|e| e.to_string()))
    {
        Ok(()) => {
            tracing::info!(job = %job_id, seconds = hold.as_secs(), "the requeued job is held back before it starts again");
            out.hold_seconds = Some(hold.as_secs());
        }
        Err(e) => {
            tracing::warn!(job = %job_id, error = %e, "could not hold the requeued job back; it starts after SLURM's own delay");
            out.hold_error = Some(e);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::cell::{Cell, RefCell};

    use super::*;
    use crate::slurm::{JobView, PartitionNode, RequeueAnswer, SlurmError};
    use crate::telemetry::RequeueDecision;

    /// A stand-in for `scontrol`: canned answers, and the calls it received.
    struct FakeControl {
        job: Result<JobView, SlurmError>,
        requeue: Result<RequeueAnswer, SlurmError>,
        hold: Result<(), SlurmError>,
        calls: RefCell<Vec<String>>,
    }

    impl FakeControl {
        fn new(state: &str) -> FakeControl {
            FakeControl {
                job: Ok(JobView {
                    state: state.into(),
                    reason: None,
                    batch: true,
                    requeue_allowed: true,
                    restarts: 0,
                    node_list: Some("n1".into()),
                    preempt_time: None,
                    excluded: vec![],
                    partition: None,
                    num_nodes: None,
                }),
                requeue: Ok(RequeueAnswer::Requeued),
                hold: Ok(()),
                calls: RefCell::new(Vec::new()),
            }
        }

        fn calls(&self) -> Vec<String> {
            self.calls.borrow().clone()
        }
    }

    impl SlurmControl for FakeControl {
        fn show_job(&self, job_id: &str, timeout: Duration) -> Result<JobView, SlurmError> {
            self.calls.borrow_mut().push(format!("show {job_id} {}s", timeout.as_secs()));
            self.job.clone()
        }

        fn requeue(&self, job_id: &str, timeout: Duration) -> Result<RequeueAnswer, SlurmError> {
            self.calls.borrow_mut().push(format!("requeue {job_id} {}s", timeout.as_secs()));
            self.requeue.clone()
        }

        fn hold_for(&self, job_id: &str, delay: Duration, timeout: Duration) -> Result<(), SlurmError> {
            self.calls.borrow_mut().push(format!("hold {job_id} {}s {}s", delay.as_secs(), timeout.as_secs()));
            self.hold.clone()
        }

        fn set_excluded(&self, job_id: &str, nodes: &[String], _timeout: Duration) -> Result<(), SlurmError> {
            self.calls.borrow_mut().push(format!("exclude {job_id} {}", nodes.join(",")));
            Ok(())
        }

        fn partition_nodes(&self, partition: &str, _timeout: Duration) -> Result<Vec<PartitionNode>, SlurmError> {
            self.calls.borrow_mut().push(format!("sinfo {partition}"));
            Ok(vec![])
        }
    }

    fn request() -> RequeueRequest {
        RequeueRequest {
            policy: RequeuePolicy::Auto,
            stop: StopKind::ClusterSignal,
            finished: false,
            job_id: Some("42".into()),
            restart_count: 0,
            max_restarts: 5,
        }
    }

    fn ten_seconds() -> Option<Duration> {
        Some(Duration::from_secs(10))
    }

    #[test]
    fn a_running_job_is_asked_about_then_requeued_and_the_answer_recorded() {
        let slurm = FakeControl::new("RUNNING");
        let record = requeue_after_stop(&slurm, &request(), &ten_seconds);
        assert!(matches!(&record.decision, RequeueDecision::Requeue { job_id, .. } if job_id == "42"));
        assert_eq!((record.answer, record.error.as_deref()), (Some(RequeueAnswer::Requeued), None));
        assert_eq!(slurm.calls(), vec!["show 42 10s", "requeue 42 10s"]);
        let v = serde_json::to_value(&record).unwrap();
        assert_eq!(v["decision"], "requeue");
        assert_eq!(v["answer"], "requeued");
        assert!(v.get("error").is_none());
    }

    #[test]
    fn already_pending_counts_as_an_answer() {
        let slurm = FakeControl { requeue: Ok(RequeueAnswer::AlreadyPending), ..FakeControl::new("RUNNING") };
        let record = requeue_after_stop(&slurm, &request(), &ten_seconds);
        assert_eq!(record.answer, Some(RequeueAnswer::AlreadyPending));
    }

    #[test]
    fn a_failed_requeue_keeps_the_decision_and_records_the_error() {
        let failed =
            SlurmError::Failed { args: "scontrol requeue 42".into(), code: Some(1), stderr: "access denied".into() };
        let slurm = FakeControl { requeue: Err(failed), ..FakeControl::new("RUNNING") };
        let record = requeue_after_stop(&slurm, &request(), &ten_seconds);
        assert_eq!(record.decision.name(), "requeue");
        assert_eq!(record.answer, None);
        assert!(record.error.as_deref().unwrap().contains("access denied"), "{record:?}");
    }

    #[test]
    fn a_query_that_times_out_is_a_skip_relying_on_sbatch_requeue() {
        let timeout = SlurmError::Timeout { args: "scontrol show job -o 42".into(), seconds: 10.0 };
        let slurm = FakeControl { job: Err(timeout), ..FakeControl::new("RUNNING") };
        let record = requeue_after_stop(&slurm, &request(), &ten_seconds);
        assert_eq!(record.decision.name(), "skip");
        assert!(record.decision.reason().contains("did not answer within 10.0s"), "{record:?}");
        assert!(record.decision.reason().contains("relying on sbatch --requeue"), "{record:?}");
        assert_eq!(slurm.calls(), vec!["show 42 10s"], "no requeue without an answer");
    }

    #[test]
    fn no_time_left_means_no_scontrol_call_at_all() {
        let slurm = FakeControl::new("RUNNING");
        let record = requeue_after_stop(&slurm, &request(), &|| None);
        assert_eq!(record.decision.name(), "skip");
        assert!(record.decision.reason().contains(NO_TIME), "{record:?}");
        assert!(slurm.calls().is_empty());
    }

    #[test]
    fn time_running_out_between_query_and_requeue_records_no_time_as_the_error() {
        let slurm = FakeControl::new("RUNNING");
        let left = Cell::new(1);
        let once = || (left.replace(0) > 0).then_some(Duration::from_secs(3));
        let record = requeue_after_stop(&slurm, &request(), &once);
        assert_eq!(record.decision.name(), "requeue");
        assert_eq!(record.error.as_deref(), Some(NO_TIME));
        assert_eq!(slurm.calls(), vec!["show 42 3s"]);
    }

    #[test]
    fn slurm_is_not_asked_when_the_answer_cannot_matter() {
        for req in [
            RequeueRequest { job_id: None, ..request() },
            RequeueRequest { stop: StopKind::StopAtStep, ..request() },
            RequeueRequest { policy: RequeuePolicy::Never, ..request() },
        ] {
            let slurm = FakeControl::new("RUNNING");
            let record = requeue_after_stop(&slurm, &req, &ten_seconds);
            assert_eq!(record.decision.name(), "skip", "{req:?}");
            assert!(slurm.calls().is_empty(), "{req:?}");
        }
    }

    #[test]
    fn a_cancelled_job_is_asked_about_but_not_requeued() {
        let slurm = FakeControl::new("CANCELLED");
        let record = requeue_after_stop(&slurm, &request(), &ten_seconds);
        assert_eq!(record, RequeueRecord::skip("the job was cancelled by a user: never requeued"));
        assert_eq!(slurm.calls(), vec!["show 42 10s"]);
    }

    const MINUTE: Duration = Duration::from_secs(60);

    #[test]
    fn a_transient_crash_requeues_then_holds_the_job_back() {
        let slurm = FakeControl::new("RUNNING");
        let out = requeue_after_crash(&slurm, &request(), 2 * MINUTE, &ten_seconds);
        assert_eq!(out.record.decision.name(), "requeue");
        assert!(out.record.decision.reason().contains("training not finished"), "{out:?}");
        assert_eq!((out.hold_seconds, out.hold_error), (Some(120), None));
        assert_eq!(slurm.calls(), vec!["show 42 10s", "requeue 42 10s", "hold 42 120s 10s"]);
    }

    #[test]
    fn a_failed_hold_is_recorded_and_keeps_the_requeue() {
        let refused =
            SlurmError::Failed { args: "scontrol update".into(), code: Some(1), stderr: "Job is not pending".into() };
        let slurm = FakeControl { hold: Err(refused), ..FakeControl::new("RUNNING") };
        let out = requeue_after_crash(&slurm, &request(), MINUTE, &ten_seconds);
        assert_eq!(out.record.answer, Some(RequeueAnswer::Requeued));
        assert_eq!(out.hold_seconds, None);
        assert!(out.hold_error.as_deref().unwrap().contains("not pending"), "{out:?}");
    }

    #[test]
    fn no_hold_without_an_accepted_requeue() {
        // Skipped (cancelled job), refused requeue, or no hold asked for.
        let cancelled = FakeControl::new("CANCELLED");
        let out = requeue_after_crash(&cancelled, &request(), MINUTE, &ten_seconds);
        assert_eq!((out.record.decision.name(), out.hold_seconds), ("skip", None));
        assert_eq!(cancelled.calls(), vec!["show 42 10s"]);
        let failed = SlurmError::Failed { args: "scontrol requeue 42".into(), code: Some(1), stderr: "denied".into() };
        let refused = FakeControl { requeue: Err(failed), ..FakeControl::new("RUNNING") };
        let out = requeue_after_crash(&refused, &request(), MINUTE, &ten_seconds);
        assert_eq!((out.hold_seconds, out.hold_error), (None, None));
        assert_eq!(refused.calls(), vec!["show 42 10s", "requeue 42 10s"]);
        let zero = FakeControl::new("RUNNING");
        requeue_after_crash(&zero, &request(), Duration::ZERO, &ten_seconds);
        assert_eq!(zero.calls(), vec!["show 42 10s", "requeue 42 10s"]);
    }

    #[test]
    fn crash_requeues_follow_the_requeue_rules() {
        for req in [
            RequeueRequest { job_id: None, ..request() },
            RequeueRequest { policy: RequeuePolicy::Never, ..request() },
            RequeueRequest { restart_count: 5, ..request() },
        ] {
            let slurm = FakeControl::new("RUNNING");
            let out = requeue_after_crash(&slurm, &req, MINUTE, &ten_seconds);
            assert_eq!(out.record.decision.name(), "skip", "{req:?}");
            assert!(!slurm.calls().iter().any(|c| c.starts_with("requeue") || c.starts_with("hold")), "{req:?}");
        }
    }
}
