//! The thin interface to SLURM's control commands. `SlurmControl` is the seam:
//! [`Scontrol`] runs the real `scontrol` (found on PATH, so tests and drills can
//! put a stand-in first), every call bounded by a timeout so a hung
//! controller cannot eat the grace period.

use std::collections::BTreeMap;
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::nodes::{MAX_ARG_BYTES, PartitionNode, compress_hostlist, expand_hostlist, parse_sinfo_nodes};
pub use crate::telemetry::RequeueAnswer;

/// Errors talking to SLURM.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SlurmError {
    #[error("{0} not found on PATH (inside a container? see docs/slurm.md, \"Without scontrol\")")]
    NotFound(String),
    #[error("`{args}` did not answer within {seconds:.1}s")]
    Timeout { args: String, seconds: f64 },
    #[error("`{args}` failed (exit {code:?}): {stderr}")]
    Failed { args: String, code: Option<i32>, stderr: String },
    #[error("cannot run scontrol: {0}")]
    Spawn(String),
    #[error(
        "`{args}` printed more than {limit} bytes; rekindle keeps no more (the \
         partition's node list is beyond any cluster it was built for: report it)"
    )]
    OutputTooLarge { args: String, limit: usize },
    #[error(
        "the exclusion list of {nodes} node(s) is {bytes} bytes even compressed, past the {limit} bytes one \
         argument may hold: lower [health] max_excluded_nodes or the job's own --exclude"
    )]
    ArgumentTooLong { nodes: usize, bytes: usize, limit: usize },
    #[error("`scontrol show job {job_id}` printed nothing usable: {output}")]
    Unparseable { job_id: String, output: String },
}

/// The part of `scontrol show job` the requeue decision needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct JobView {
    /// JobState, e.g. RUNNING, CANCELLED, COMPLETING, PENDING.
    pub state: String,
    pub reason: Option<String>,
    /// BatchFlag=1: a batch job (sbatch), which can be requeued.
    pub batch: bool,
    /// Requeue=1: submitted with --requeue (or the cluster default).
    pub requeue_allowed: bool,
    pub restarts: u32,
    pub node_list: Option<String>,
    /// PreemptTime: when SLURM began preempting the job (its GraceTime runs
    /// from here); `None` when it is not being preempted.
    pub preempt_time: Option<String>,
    /// ExcNodeList: the nodes the job may not run on, expanded (the user's
    /// `--exclude` and what was added since).
    pub excluded: Vec<String>,
    /// Partition: where the job runs (a comma list when several were asked).
    pub partition: Option<String>,
    /// NumNodes: how many nodes the job needs (the low end of a range).
    pub num_nodes: Option<u32>,
}

/// SLURM control operations rekindle uses.
pub trait SlurmControl {
    fn show_job(&self, job_id: &str, timeout: Duration) -> Result<JobView, SlurmError>;
    fn requeue(&self, job_id: &str, timeout: Duration) -> Result<RequeueAnswer, SlurmError>;
    /// Holds a (requeued) job back: it may not start before `delay` from now.
    fn hold_for(&self, job_id: &str, delay: Duration, timeout: Duration) -> Result<(), SlurmError>;
    /// Sets a pending job's excluded nodes (`ExcNodeList`) to `nodes`.
    /// SLURM refuses it while the job runs: call it after the requeue.
    fn set_excluded(&self, job_id: &str, nodes: &[String], timeout: Duration) -> Result<(), SlurmError>;
    /// The nodes of `partition` and their states (`sinfo`).
    fn partition_nodes(&self, partition: &str, timeout: Duration) -> Result<Vec<PartitionNode>, SlurmError>;
}

/// The real `scontrol` on PATH.
#[derive(Debug, Clone, Default)]
pub struct Scontrol;

impl SlurmControl for Scontrol {
    fn show_job(&self, job_id: &str, timeout: Duration) -> Result<JobView, SlurmError> {
        let out = run_scontrol(&["show", "job", "-o", job_id], timeout)?;
        parse_show_job(&out).ok_or_else(|| SlurmError::Unparseable { job_id: job_id.into(), output: out })
    }

    fn requeue(&self, job_id: &str, timeout: Duration) -> Result<RequeueAnswer, SlurmError> {
        match run_scontrol(&["requeue", job_id], timeout) {
            Ok(_) => Ok(RequeueAnswer::Requeued),
            Err(SlurmError::Failed { stderr, .. })
                if stderr.to_ascii_lowercase().contains("pending")
                    || stderr.to_ascii_lowercase().contains("already") =>
            {
                Ok(RequeueAnswer::AlreadyPending)
            }
            Err(e) => Err(e),
        }
    }

    fn hold_for(&self, job_id: &str, delay: Duration, timeout: Duration) -> Result<(), SlurmError> {
        run_scontrol(&["update", &format!("JobId={job_id}"), &start_time_after(delay)], timeout).map(|_| ())
    }

    fn set_excluded(&self, job_id: &str, nodes: &[String], timeout: Duration) -> Result<(), SlurmError> {
        let arg = exclusion_argument(nodes)?;
        run_scontrol(&["update", &format!("JobId={job_id}"), &arg], timeout).map(|_| ())
    }

    fn partition_nodes(&self, partition: &str, timeout: Duration) -> Result<Vec<PartitionNode>, SlurmError> {
        let out = run_slurm("sinfo", &["-h", "-N", "-p", partition, "-o", "%N %t"], timeout)?;
        Ok(parse_sinfo_nodes(&out))
    }
}

/// The `StartTime=` argument of `scontrol update` for a start no earlier
/// than `delay` from now (SLURM's `now+N` counts seconds).
pub fn start_time_after(delay: Duration) -> String {
    format!("StartTime=now+{}", delay.as_secs())
}

/// The `ExcNodeList=` argument for `nodes`, compressed (`n[1-3,5]`) so a
/// list of any partition's size fits one argument; an error, before any
/// call, if even the compressed form is past [`MAX_ARG_BYTES`].
pub fn exclusion_argument(nodes: &[String]) -> Result<String, SlurmError> {
    let arg = format!("ExcNodeList={}", compress_hostlist(nodes));
    if arg.len() >= MAX_ARG_BYTES {
        return Err(SlurmError::ArgumentTooLong { nodes: nodes.len(), bytes: arg.len(), limit: MAX_ARG_BYTES });
    }
    Ok(arg)
}

/// Parses one-line `scontrol show job -o` output (`Key=Value` tokens).
pub fn parse_show_job(output: &str) -> Option<JobView> {
    let fields: BTreeMap<&str, &str> = output.split_whitespace().filter_map(|tok| tok.split_once('=')).collect();
    let state = fields.get("JobState")?.to_string();
    Some(JobView {
        state,
        reason: fields.get("Reason").filter(|r| **r != "None").map(|r| r.to_string()),
        batch: fields.get("BatchFlag").is_some_and(|v| *v == "1"),
        requeue_allowed: fields.get("Requeue").is_some_and(|v| *v == "1"),
        restarts: fields.get("Restarts").and_then(|v| v.parse().ok()).unwrap_or(0),
        node_list: fields.get("NodeList").filter(|v| **v != "(null)").map(|v| v.to_string()),
        preempt_time: fields
            .get("PreemptTime")
            .filter(|v| !["None", "Unknown", "(null)"].contains(v))
            .map(|v| v.to_string()),
        excluded: fields.get("ExcNodeList").map(|v| expand_hostlist(v)).unwrap_or_default(),
        partition: fields.get("Partition").filter(|v| **v != "(null)").map(|v| v.to_string()),
        num_nodes: fields.get("NumNodes").and_then(|v| v.split('-').next()?.parse().ok()),
    })
}

/// Runs `scontrol ARGS`, ending it after `timeout`.
///
/// It runs with the stop signals ignored: a requeue (or the hold right
/// after it) makes SLURM signal the job's processes, and the batch shell
/// forwards its own copy to the step, so an `scontrol` of ours would be
/// killed by the very requeue it asked for, before it reports (or makes)
/// the hold. The timeout still ends it (SIGKILL).
fn run_scontrol(args: &[&str], timeout: Duration) -> Result<String, SlurmError> {
    run_slurm("scontrol", args, timeout)
}

/// The most of a SLURM command's standard output kept: `sinfo -N` prints a
/// line of ~20–40 bytes per node and partition, so 10,000 nodes in a few
/// partitions is a few MiB; 64 MiB leaves room for 100,000-node sites while
/// a runaway command cannot take the supervisor's memory.
pub const MAX_STDOUT_BYTES: usize = 64 << 20;

/// The most of its standard error kept (the message of a failure): the
/// first 64 KiB; the rest is read and dropped so the child never blocks.
pub const MAX_STDERR_BYTES: usize = 64 << 10;

/// Runs SLURM's `program ARGS` (as [`run_scontrol`] describes).
fn run_slurm(program: &str, args: &[&str], timeout: Duration) -> Result<String, SlurmError> {
    let joined = format!("{program} {}", args.join(" "));
    run_program(program, program, &joined, args, timeout)
}

/// Reads `pipe` to its end on a thread of its own, keeping the first
/// `limit` bytes and whether more came.
///
/// Both pipes are drained *while the child runs*: a pipe holds 64 KiB, and
/// a child that fills it blocks in write(2) and never exits, so reading
/// only after the exit deadlocked `sinfo` on partitions of ~4,000 nodes
/// until the timeout (#41).
fn drain<R: Read + Send + 'static>(pipe: Option<R>, limit: usize) -> std::sync::mpsc::Receiver<(Vec<u8>, bool)> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let (mut kept, mut over) = (Vec::new(), false);
        if let Some(mut pipe) = pipe {
            let mut buf = [0u8; 64 << 10];
            loop {
                match pipe.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        let room = limit.saturating_sub(kept.len());
                        kept.extend_from_slice(&buf[..n.min(room)]);
                        over |= n > room;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => break,
                }
            }
        }
        let _ = tx.send((kept, over));
    });
    rx
}

/// Runs `path ARGS` as SLURM's `program` (named so in errors), with the
/// stop signals ignored, its output read as it comes, ended after `timeout`.
fn run_program(
    program: &str,
    path: &str,
    joined: &str,
    args: &[&str],
    timeout: Duration,
) -> Result<String, SlurmError> {
    use std::os::unix::process::CommandExt;
    let mut command = Command::new(path);
    // SAFETY: between fork and exec only sigaction(2), which is
    // async-signal-safe, is called.
    unsafe {
        command.pre_exec(|| {
            use nix::sys::signal::{SigHandler, Signal, signal};
            for sig in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGUSR1, Signal::SIGUSR2] {
                signal(sig, SigHandler::SigIgn).map_err(std::io::Error::from)?;
            }
            Ok(())
        });
    }
    let mut child = match command.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()
    {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(SlurmError::NotFound(program.into())),
        Err(e) => return Err(SlurmError::Spawn(e.to_string())),
    };
    let stdout = drain(child.stdout.take(), MAX_STDOUT_BYTES);
    let stderr = drain(child.stderr.take(), MAX_STDERR_BYTES);
    let deadline = Instant::now() + timeout;
    let timed_out = |child: &mut std::process::Child| {
        let _ = child.kill();
        let _ = child.wait();
        // The readers are left behind: a grandchild may still hold the
        // pipes open; they end when it does.
        SlurmError::Timeout { args: joined.to_string(), seconds: timeout.as_secs_f64() }
    };
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => return Err(timed_out(&mut child)),
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => return Err(SlurmError::Spawn(e.to_string())),
        }
    };
    // The child is gone; its output ends once no grandchild holds the
    // pipes, within what is left of the timeout.
    let left = |now: Instant| deadline.saturating_duration_since(now).max(Duration::from_millis(100));
    let (out, out_over) = stdout
        .recv_timeout(left(Instant::now()))
        .map_err(|_| SlurmError::Timeout { args: joined.to_string(), seconds: timeout.as_secs_f64() })?;
    let (err, _) = stderr.recv_timeout(left(Instant::now())).unwrap_or_default();
    let stderr = String::from_utf8_lossy(&err).trim().to_string();
    if !status.success() {
        return Err(SlurmError::Failed { args: joined.to_string(), code: status.code(), stderr });
    }
    if out_over {
        return Err(SlurmError::OutputTooLarge { args: joined.to_string(), limit: MAX_STDOUT_BYTES });
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_scontrol_one_line_output() {
        let line = "JobId=17 JobName=train UserId=root(0) JobState=RUNNING Reason=None Dependency=(null) \
                    Requeue=1 Restarts=2 BatchFlag=1 Reboot=0 NodeList=n1 BatchHost=n1";
        let job = parse_show_job(line).unwrap();
        assert_eq!(
            job,
            JobView {
                state: "RUNNING".into(),
                reason: None,
                batch: true,
                requeue_allowed: true,
                restarts: 2,
                node_list: Some("n1".into()),
                preempt_time: None,
                excluded: vec![],
                partition: None,
                num_nodes: None,
            }
        );
    }

    #[test]
    fn parses_preempt_time_of_a_job_inside_its_grace_time() {
        // As SLURM 22.05 prints a job being preempted (GraceTime running).
        let line = "JobId=9 JobState=RUNNING Reason=None Requeue=1 Restarts=0 BatchFlag=1 \
                    PreemptEligibleTime=2026-11-22T02:42:03 PreemptTime=2026-11-22T02:42:07 NodeList=n1";
        assert_eq!(parse_show_job(line).unwrap().preempt_time.as_deref(), Some("2026-11-22T02:42:07"));
        let idle = "JobId=9 JobState=RUNNING PreemptTime=None BatchFlag=1";
        assert_eq!(parse_show_job(idle).unwrap().preempt_time, None);
    }

    #[test]
    fn parses_the_exclusions_partition_and_node_count() {
        let line = "JobId=9 JobState=PENDING Partition=debug NumNodes=2-3 ExcNodeList=n[1-2],n9 BatchFlag=1";
        let job = parse_show_job(line).unwrap();
        assert_eq!(job.excluded, ["n1", "n2", "n9"]);
        assert_eq!((job.partition.as_deref(), job.num_nodes), (Some("debug"), Some(2)));
        let none = parse_show_job("JobId=9 JobState=PENDING ExcNodeList=(null)").unwrap();
        assert!(none.excluded.is_empty());
    }

    #[test]
    fn a_hold_is_a_start_time_in_seconds_from_now() {
        assert_eq!(start_time_after(Duration::from_secs(120)), "StartTime=now+120");
    }

    /// An executable `sinfo` stand-in in `dir` running `body` (sh).
    fn fake(dir: &std::path::Path, name: &str, body: &str) -> String {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path.to_str().unwrap().to_string()
    }

    fn run_fake(path: &str, timeout: Duration) -> Result<String, SlurmError> {
        run_program("sinfo", path, "sinfo -h -N", &[], timeout)
    }

    #[test]
    fn a_partition_of_ten_thousand_nodes_is_read_whole_and_at_once() {
        // #41: output past the 64 KiB pipe buffer deadlocked until the
        // timeout. 50,000 lines of ~28 bytes: > 1 MiB, stderr busy too.
        let dir = tempfile::tempdir().unwrap();
        let path = fake(
            dir.path(),
            "sinfo",
            "i=0; while [ $i -lt 50000 ]; do echo \"rack-07-gpu-node-$i mix\"; echo \"noise $i\" >&2; i=$((i+1)); done",
        );
        let started = Instant::now();
        let out = run_fake(&path, Duration::from_secs(60)).unwrap();
        let took = started.elapsed();
        assert!(out.len() > 1 << 20, "{} bytes", out.len());
        let nodes = parse_sinfo_nodes(&out);
        assert_eq!(nodes.len(), 50_000);
        assert!(out.ends_with("rack-07-gpu-node-49999 mix\n"));
        assert!(took < Duration::from_secs(30), "took {took:?}");
    }

    #[test]
    fn a_command_that_hangs_is_ended_at_the_timeout_even_with_a_full_pipe() {
        let dir = tempfile::tempdir().unwrap();
        let path = fake(dir.path(), "sinfo", "head -c 200000 /dev/zero; exec sleep 30");
        let started = Instant::now();
        let err = run_fake(&path, Duration::from_millis(500)).unwrap_err();
        assert!(matches!(err, SlurmError::Timeout { .. }), "{err:?}");
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    }

    #[test]
    fn a_failure_reports_its_stderr_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let path = fake(dir.path(), "sinfo", "head -c 1000000 /dev/zero | tr '\\0' x >&2; echo; echo boom >&2; exit 3");
        match run_fake(&path, Duration::from_secs(30)).unwrap_err() {
            SlurmError::Failed { code, stderr, .. } => {
                assert_eq!(code, Some(3));
                assert_eq!(stderr.len(), MAX_STDERR_BYTES);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_exclusion_list_is_passed_compressed_and_refused_past_one_argument() {
        let nodes: Vec<String> = (1..=10_000).map(|i| format!("n{i}")).collect();
        assert_eq!(exclusion_argument(&nodes).unwrap(), "ExcNodeList=n[1-10000]");
        // Names that share no number cannot be compressed: 20,000 of them
        // are past what one argument holds, and the error says so.
        let odd: Vec<String> = (0..20_000).map(|i| format!("host-{i}-x")).collect();
        match exclusion_argument(&odd).unwrap_err() {
            SlurmError::ArgumentTooLong { nodes, bytes, limit } => {
                assert_eq!((nodes, limit), (20_000, MAX_ARG_BYTES));
                assert!(bytes > limit);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn missing_job_state_is_unparseable() {
        assert_eq!(parse_show_job("slurm_load_jobs error: Invalid job id specified"), None);
    }
}
