//! Whether to ask SLURM to requeue the job after a stop: a pure function of
//! (policy, why we stopped, progress, restart count, what SLURM says about the
//! job), tested over the whole table. The `scontrol` calls are elsewhere.

use serde::Serialize;

use crate::config::RequeuePolicy;

use super::control::JobView;

/// Why training stopped, as far as requeueing is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopKind {
    /// SIGTERM, SIGUSR1, SIGUSR2: preemption, time-limit warning, drills.
    ClusterSignal,
    /// SIGINT: usually a person at a terminal (or `scancel -s INT`).
    Interrupt,
    /// `--stop-at-step`: the user asked for exactly this stop.
    StopAtStep,
    /// The watchdog found a step, evaluation, save or publish stuck.
    Hang,
    /// A transient crash (I/O or device error) within `[run] max_crash_requeues`.
    TransientCrash,
}

/// Everything the decision depends on.
#[derive(Debug, Clone, PartialEq)]
pub struct RequeueInput {
    pub policy: RequeuePolicy,
    pub stop: StopKind,
    /// Training reached max_steps.
    pub finished: bool,
    /// The id for `scontrol` (`<array>_<task>` for array tasks); `None` outside SLURM.
    pub job_id: Option<String>,
    /// What `scontrol show job` said; `None` when it could not be asked.
    pub job: Option<JobView>,
    /// Why `job` is `None` (e.g. "scontrol not found on PATH").
    pub job_query_error: Option<String>,
    pub restart_count: u32,
    pub max_restarts: u32,
}

/// The decision, with its reason for the log and `events.jsonl` (the
/// record's type, so what is decided is what is written).
pub use crate::telemetry::RequeueDecision as Decision;

/// Job states in which SLURM itself is already ending, requeueing or holding
/// the job: requeueing again would be wrong or fail.
const SLURM_HANDLES_IT: [&str; 8] =
    ["PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "PREEMPTED", "COMPLETING", "COMPLETED", "RESIZING"];

/// Decides whether to run `scontrol requeue`.
pub fn decide(input: &RequeueInput) -> Decision {
    let skip = |reason: &str| Decision::Skip { reason: reason.to_string() };
    if input.policy == RequeuePolicy::Never {
        return skip("[signals] requeue = \"never\"");
    }
    if input.finished {
        return skip("training finished");
    }
    let Some(job_id) = input.job_id.clone() else {
        return skip("not running under SLURM (no SLURM_JOB_ID): run the same command again to continue");
    };
    if input.stop == StopKind::StopAtStep {
        return skip("stopped by --stop-at-step, as asked");
    }
    if input.policy == RequeuePolicy::Auto && input.stop == StopKind::Interrupt {
        return skip("stopped by SIGINT (an interactive interrupt); use requeue = \"always\" to requeue anyway");
    }
    if input.restart_count >= input.max_restarts {
        return Decision::Skip {
            reason: format!(
                "job already restarted {} times ([signals] max_restarts = {}); not requeueing again",
                input.restart_count, input.max_restarts
            ),
        };
    }
    let Some(job) = &input.job else {
        let why = input.job_query_error.as_deref().unwrap_or("no answer");
        return Decision::Skip {
            reason: format!("cannot ask SLURM about job {job_id} ({why}); relying on sbatch --requeue"),
        };
    };
    let state = job.state.to_ascii_uppercase();
    if state.starts_with("CANCELLED") {
        return skip("the job was cancelled by a user: never requeued");
    }
    if state == "COMPLETING" {
        // SLURM 22.05 shows a job as COMPLETING while it kills its processes,
        // whatever ended it: plain scancel (its CANCELLED state is hidden
        // until then), preemption at the end of GraceTime, the time limit, a
        // failed node. Each is SLURM's to requeue or not; `scontrol requeue`
        // cannot tell a cancel from the rest, so it must not be used.
        return skip(
            "job state is COMPLETING: SLURM is ending the job (plain scancel, preemption after GraceTime, \
             time limit or node failure) and requeues it itself where it should",
        );
    }
    if SLURM_HANDLES_IT.contains(&state.as_str()) {
        return Decision::Skip { reason: format!("job state is {state}: SLURM is already ending or requeueing it") };
    }
    if state != "RUNNING" && state != "SUSPENDED" {
        return Decision::Skip { reason: format!("job state is {state}: not a running job, not requeueing") };
    }
    if !job.batch {
        return skip("not a batch job (interactive srun/salloc cannot be requeued)");
    }
    if input.policy == RequeuePolicy::Auto && !job.requeue_allowed {
        return skip(
            "job was submitted without --requeue (Requeue=0); submit with --requeue or set requeue = \"always\"",
        );
    }
    if let Some(since) = &job.preempt_time {
        // Still RUNNING inside the preemption GraceTime (the signal came early,
        // with preempt_send_user_signal). SLURM requeues a preempted job only
        // if it is still running when GraceTime ends; one that exits by itself
        // before then ends FAILED (measured on SLURM 22.05), so requeue it here.
        return Decision::Requeue {
            job_id,
            reason: format!(
                "training not finished; job {state} but being preempted since {since}: SLURM does not requeue \
                 a job that exits inside its GraceTime; restart {}",
                input.restart_count
            ),
        };
    }
    Decision::Requeue { job_id, reason: format!("training not finished; job {state}, restart {}", input.restart_count) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(state: &str, batch: bool, requeue_allowed: bool) -> JobView {
        JobView {
            state: state.into(),
            reason: None,
            batch,
            requeue_allowed,
            restarts: 0,
            node_list: None,
            preempt_time: None,
            excluded: vec![],
            partition: None,
            num_nodes: None,
        }
    }

    fn base() -> RequeueInput {
        RequeueInput {
            policy: RequeuePolicy::Auto,
            stop: StopKind::ClusterSignal,
            finished: false,
            job_id: Some("77".into()),
            job: Some(job("RUNNING", true, true)),
            job_query_error: None,
            restart_count: 0,
            max_restarts: 5,
        }
    }

    fn requeues(input: &RequeueInput) -> bool {
        matches!(decide(input), Decision::Requeue { .. })
    }

    #[test]
    fn sigterm_on_running_requeueable_batch_job_requeues() {
        assert_eq!(
            decide(&base()),
            Decision::Requeue { job_id: "77".into(), reason: "training not finished; job RUNNING, restart 0".into() }
        );
    }

    #[test]
    fn cancelled_job_is_never_requeued_whatever_the_policy() {
        for policy in [RequeuePolicy::Auto, RequeuePolicy::Always] {
            for state in ["CANCELLED", "CANCELLED+", "cancelled"] {
                let input = RequeueInput { policy, job: Some(job(state, true, true)), ..base() };
                assert!(!requeues(&input), "{policy:?} {state}");
            }
        }
    }

    #[test]
    fn running_job_inside_its_preemption_grace_time_is_requeued_because_slurm_would_not() {
        let preempted = JobView { preempt_time: Some("2026-11-22T02:42:07".into()), ..job("RUNNING", true, true) };
        let d = decide(&RequeueInput { job: Some(preempted.clone()), ..base() });
        assert!(matches!(&d, Decision::Requeue { reason, .. } if reason.contains("being preempted")), "{d:?}");
        // The usual blockers still hold.
        assert!(!requeues(&RequeueInput { policy: RequeuePolicy::Never, job: Some(preempted.clone()), ..base() }));
        assert!(!requeues(&RequeueInput { finished: true, job: Some(preempted.clone()), ..base() }));
        let no_flag = JobView { requeue_allowed: false, ..preempted };
        assert!(!requeues(&RequeueInput { job: Some(no_flag), ..base() }));
    }

    #[test]
    fn completing_job_is_left_to_slurm_as_a_plain_scancel_shows_completing() {
        for policy in [RequeuePolicy::Auto, RequeuePolicy::Always] {
            let d = decide(&RequeueInput { policy, job: Some(job("COMPLETING", true, true)), ..base() });
            assert!(matches!(&d, Decision::Skip { reason } if reason.contains("plain scancel")), "{d:?}");
        }
    }

    #[test]
    fn states_slurm_already_handles_are_left_alone() {
        for state in SLURM_HANDLES_IT {
            let input = RequeueInput { policy: RequeuePolicy::Always, job: Some(job(state, true, true)), ..base() };
            assert!(!requeues(&input), "{state}");
        }
        let failed = RequeueInput { job: Some(job("FAILED", true, true)), ..base() };
        assert!(!requeues(&failed));
    }

    #[test]
    fn never_policy_finished_run_and_workstation_skip() {
        assert!(!requeues(&RequeueInput { policy: RequeuePolicy::Never, ..base() }));
        assert!(!requeues(&RequeueInput { finished: true, ..base() }));
        assert!(!requeues(&RequeueInput { job_id: None, job: None, ..base() }));
    }

    #[test]
    fn stop_at_step_is_never_requeued_and_sigint_only_with_always() {
        for policy in [RequeuePolicy::Auto, RequeuePolicy::Always] {
            assert!(!requeues(&RequeueInput { policy, stop: StopKind::StopAtStep, ..base() }));
        }
        assert!(!requeues(&RequeueInput { stop: StopKind::Interrupt, ..base() }));
        assert!(requeues(&RequeueInput { policy: RequeuePolicy::Always, stop: StopKind::Interrupt, ..base() }));
    }

    #[test]
    fn a_hang_or_a_transient_crash_requeues_like_a_cluster_signal() {
        for stop in [StopKind::Hang, StopKind::TransientCrash] {
            assert!(requeues(&RequeueInput { stop, ..base() }), "{stop:?}");
            assert!(!requeues(&RequeueInput { stop, job: Some(job("RUNNING", true, false)), ..base() }), "{stop:?}");
            assert!(!requeues(&RequeueInput { stop, restart_count: 5, ..base() }), "{stop:?}");
        }
    }

    #[test]
    fn max_restarts_stops_requeueing() {
        assert!(requeues(&RequeueInput { restart_count: 4, ..base() }));
        let d = decide(&RequeueInput { restart_count: 5, ..base() });
        assert!(matches!(&d, Decision::Skip { reason } if reason.contains("max_restarts")), "{d:?}");
    }

    #[test]
    fn unanswered_query_relies_on_sbatch_requeue() {
        let d =
            decide(&RequeueInput { job: None, job_query_error: Some("scontrol not found on PATH".into()), ..base() });
        assert!(matches!(&d, Decision::Skip { reason } if reason.contains("scontrol not found")), "{d:?}");
    }

    #[test]
    fn auto_needs_requeue_flag_and_batch_job_always_only_batch() {
        assert!(!requeues(&RequeueInput { job: Some(job("RUNNING", true, false)), ..base() }));
        assert!(requeues(&RequeueInput {
            policy: RequeuePolicy::Always,
            job: Some(job("RUNNING", true, false)),
            ..base()
        }));
        for policy in [RequeuePolicy::Auto, RequeuePolicy::Always] {
            assert!(!requeues(&RequeueInput { policy, job: Some(job("RUNNING", false, true)), ..base() }));
        }
    }

    #[test]
    fn whole_table_never_requeues_when_any_blocker_holds() {
        // Exhaustive over the discrete inputs: a requeue happens only when no
        // blocker applies. Being preempted (PreemptTime set) is no blocker.
        let policies = [RequeuePolicy::Auto, RequeuePolicy::Always, RequeuePolicy::Never];
        let stops = [
            StopKind::ClusterSignal,
            StopKind::Interrupt,
            StopKind::StopAtStep,
            StopKind::Hang,
            StopKind::TransientCrash,
        ];
        let states = ["RUNNING", "SUSPENDED", "CANCELLED", "PENDING", "COMPLETING", "PREEMPTED", "FAILED"];
        for policy in policies {
            for stop in stops {
                for finished in [false, true] {
                    for in_slurm in [false, true] {
                        for state in states {
                            for batch in [false, true] {
                                for flag in [false, true] {
                                    for (restarts, preempted) in [(0, false), (5, false), (0, true), (5, true)] {
                                        let input = RequeueInput {
                                            policy,
                                            stop,
                                            finished,
                                            job_id: in_slurm.then(|| "9".to_string()),
                                            job: Some(JobView {
                                                preempt_time: preempted.then(|| "2026-11-22T02:42:07".into()),
                                                ..job(state, batch, flag)
                                            }),
                                            job_query_error: None,
                                            restart_count: restarts,
                                            max_restarts: 5,
                                        };
                                        let expect = policy != RequeuePolicy::Never
                                            && !finished
                                            && in_slurm
                                            && stop != StopKind::StopAtStep
                                            && (stop != StopKind::Interrupt || policy == RequeuePolicy::Always)
                                            && restarts < 5
                                            && (state == "RUNNING" || state == "SUSPENDED")
                                            && batch
                                            && (flag || policy == RequeuePolicy::Always);
                                        assert_eq!(requeues(&input), expect, "{input:?}");
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}
