//! The records an attempt keeps, whichever driver runs it: the events
//! already in `events.jsonl` ([`recorded`]), the context every new one
//! carries ([`context`]), what the start of an attempt records about its
//! checkpoints (rejected, quarantined, a fresh start, a resume, a lock
//! taken over), and `metrics.jsonl` trimmed back to the step resumed from.

use std::path::Path;

use chrono::{DateTime, Utc};

use crate::checkpoint::{CheckpointInfo, CheckpointStore};
use crate::rundir::lock::Takeover;
use crate::rundir::{RunDir, SUMMARY_FILE};
use crate::slurm::SlurmEnv;
use crate::telemetry::{
    CheckpointQuarantined, CheckpointRejected, Event, EventContext, EventLog, FreshStart, LockTakeover, Resume,
    Summary, metrics_step,
};

use super::error::RunError;

/// The events of the run so far, as far as they can be read back (for the
/// crash-requeue count; unreadable lines and an unreadable file count as none).
pub(crate) fn recorded_events(path: &std::path::Path) -> Vec<crate::telemetry::Event> {
    recorded(path).into_iter().map(|e| e.event).collect()
}

/// [`recorded_events`] with their envelopes (time, node, …).
pub(crate) fn recorded(path: &std::path::Path) -> Vec<crate::telemetry::RecordedEvent> {
    match crate::telemetry::read_jsonl(path) {
        Ok(Some(lines)) => crate::telemetry::events_from(lines.records),
        Ok(None) => Vec::new(),
        Err(e) => {
            tracing::warn!(error = %e, path = %path.display(), "cannot read the events back; counting no earlier requeues");
            Vec::new()
        }
    }
}

/// Fields added to every event.
pub(crate) fn context(slurm: &SlurmEnv) -> EventContext {
    EventContext { node: slurm.node_name(), job_id: slurm.job_id.clone(), attempt: slurm.restart_count }
}

/// A `checkpoint_rejected` event (and a warning) per checkpoint that does not
/// verify, then each is moved to quarantine and a `checkpoint_quarantined`
/// event says where (or why it could not be moved).
pub(crate) fn set_aside_rejected(
    store: &CheckpointStore,
    events: &mut EventLog,
    rejected: &[CheckpointInfo],
) -> Result<(), RunError> {
    record_rejected(events, rejected)?;
    for q in store.quarantine(rejected) {
        events.record(&Event::CheckpointQuarantined(CheckpointQuarantined {
            step: q.step,
            dir: q.dir.clone(),
            reason: q.reason(),
            failures: serde_json::to_value(&q.failures).unwrap_or_default(),
            moved_to: q.moved_to.as_ref().ok().cloned(),
            error: q.moved_to.as_ref().err().map(|e| e.to_string()),
        }))?;
    }
    Ok(())
}

/// The `lock_takeover` event of a lock taken over from a holder judged gone.
pub(super) fn takeover_event(t: &Takeover) -> Event {
    let previous = t.previous.as_ref();
    Event::LockTakeover(LockTakeover {
        reason: t.reason.clone(),
        previous_host: previous.map(|p| p.host.clone()),
        previous_pid: previous.map(|p| p.pid),
        previous_job_id: previous.and_then(|p| p.job_id.clone()),
        previous_restart_count: previous.and_then(|p| p.restart_count),
        heartbeat_age_seconds: t.heartbeat_age_s.filter(|a| a.is_finite()),
        waited_seconds: t.waited_s,
    })
}

/// A `checkpoint_rejected` event (and a warning) per checkpoint that does not verify.
fn record_rejected(events: &mut EventLog, rejected: &[CheckpointInfo]) -> Result<(), RunError> {
    for r in rejected {
        let reasons: Vec<String> = r.failures.iter().map(|f| f.to_string()).collect();
        events.record(&Event::CheckpointRejected(CheckpointRejected {
            step: r.step,
            dir: r.dir.clone(),
            failures: serde_json::to_value(&r.failures).unwrap_or_default(),
        }))?;
        tracing::warn!(step = r.step, reasons = %reasons.join("; "), "skipping checkpoint that does not verify");
    }
    Ok(())
}

/// No checkpoint to resume from: say so, loudly when some were rejected.
pub(crate) fn fresh_start(events: &mut EventLog, rejected: usize) -> Result<(), RunError> {
    if rejected == 0 {
        tracing::info!("no checkpoint yet: starting from step 0");
        return Ok(());
    }
    tracing::error!(
        rejected,
        "NO CHECKPOINT VERIFIES: starting fresh from step 0 (the invalid ones are kept for inspection in checkpoints/quarantine/)"
    );
    events.record(&Event::FreshStart(FreshStart { reason: "no checkpoint verifies".into(), rejected }))?;
    Ok(())
}

/// The `resume` event of a checkpoint of `step` in `from`, committed at
/// `created_at` (RFC 3339), as far as the checkpoint's manifest tells (no
/// previous node or attempt: those are in a native checkpoint's state).
pub(crate) fn resume_record(
    step: u64,
    from: &Path,
    created_at: &str,
    last_logged: Option<u64>,
    slurm: &SlurmEnv,
    now: DateTime<Utc>,
) -> Resume {
    let since_checkpoint = DateTime::parse_from_rfc3339(created_at)
        .ok()
        .map(|t| (now - t.with_timezone(&Utc)).num_milliseconds() as f64 / 1000.0);
    Resume {
        step,
        from: from.to_path_buf(),
        previous_node: None,
        previous_attempt: None,
        this_node: slurm.node_name(),
        restart_count: slurm.restart_count,
        steps_lost: last_logged.map(|s| s.saturating_sub(step)).unwrap_or(0),
        seconds_since_checkpoint: since_checkpoint,
        tier: None,
        source_node: None,
        fallback_reason: None,
    }
}

/// How the attempt before this one ended, when it ended in a fault: what
/// (`rank_lost`, `error`, `hang`, or `killed` when it recorded no end at
/// all), when the fault happened (a lost rank's last heartbeat, the
/// record's time, or a killed attempt's last record) and in which allocation.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PreviousFault {
    pub kind: String,
    pub at: Option<DateTime<Utc>>,
    pub job_id: Option<String>,
    pub restart_count: Option<u64>,
}

/// The fault that ended the last attempt recorded in `events`, if it ended
/// in one (a graceful stop or a finish is no fault).
pub(crate) fn previous_fault(events: &[crate::telemetry::RecordedEvent]) -> Option<PreviousFault> {
    let last_start = events.iter().rposition(|e| e.name == "start")?;
    let attempt = &events[last_start..];
    let fault = attempt.iter().rev().find(|e| matches!(e.name.as_str(), "rank_lost" | "error" | "hang"));
    let (kind, at) = match fault {
        Some(fault) => match &fault.event {
            Event::RankLost(lost) => {
                let silent = chrono::Duration::milliseconds((lost.silent_seconds * 1000.0) as i64);
                (fault.name.clone(), fault.time.map(|t| t - silent))
            }
            _ => (fault.name.clone(), fault.time),
        },
        None if attempt.iter().any(|e| matches!(e.name.as_str(), "stop" | "finish")) => return None,
        None => ("killed".to_string(), attempt.last().and_then(|e| e.time)),
    };
    Some(PreviousFault { kind, at, job_id: attempt[0].job_id.clone(), restart_count: attempt[0].slurm_attempt })
}

pub(crate) fn previous_summary(dir: &RunDir) -> Option<Summary> {
    Summary::read(&dir.path(SUMMARY_FILE))
}

/// The highest step in metrics.jsonl (what the previous attempt reached),
/// read a line at a time (a long run's file is hundreds of megabytes).
pub(crate) fn last_logged_step(path: &Path) -> Option<u64> {
    let mut newest = None;
    crate::telemetry::for_each_jsonl(path, |line| newest = newest.max(metrics_step(&line))).ok()??;
    newest
}

/// Keeps only metric lines of steps ≤ `step` (and drops a torn last line),
/// a line at a time: what is kept goes to a temporary file beside it, which
/// replaces it only when a line was dropped (memory: one line, whatever the
/// file's size).
pub(crate) fn truncate_metrics(path: &Path, step: u64) -> Result<(), RunError> {
    use std::io::{BufRead, Read, Write};
    let fail = |source| RunError::RunDir { path: path.to_path_buf(), source };
    // Through the run directory's handle: never through a symlink or FIFO
    // in its place (docs/run-directory.md, Trust boundaries).
    let (dir, name) = match crate::confine::Dir::open_parent(path) {
        Ok(opened) => opened,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => return Err(fail(source)),
    };
    let file = match dir.open_read(&name) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => return Err(fail(source)),
    };
    let mut kept = std::io::BufWriter::new(crate::confine::TempFile::new_in(&dir, ".tmp").map_err(fail)?);
    let mut reader = std::io::BufReader::new(file);
    let (mut line, mut dropped) = (Vec::new(), false);
    loop {
        line.clear();
        let max = crate::telemetry::MAX_LINE_BYTES as u64 + 1;
        if (&mut reader).take(max).read_until(b'\n', &mut line).map_err(fail)? == 0 {
            break;
        }
        let whole = line.ends_with(b"\n");
        let over_long = !whole && line.len() as u64 == max;
        let keep =
            !over_long && serde_json::from_slice(&line).ok().and_then(|v| metrics_step(&v)).is_some_and(|s| s <= step);
        if keep {
            kept.write_all(&line).map_err(fail)?;
            if !whole {
                // A last line without its newline is ended, as a writer would.
                kept.write_all(b"\n").map_err(fail)?;
                dropped = true;
            }
            continue;
        }
        dropped = true;
        if over_long {
            // Over the line bound: the rest of it goes too, unread.
            while !line.is_empty() && !line.ends_with(b"\n") {
                line.clear();
                if (&mut reader).take(max).read_until(b'\n', &mut line).map_err(fail)? == 0 {
                    break;
                }
            }
        }
    }
    if dropped {
        let tmp = kept.into_inner().map_err(|e| fail(e.into_error()))?;
        tmp.persist(&name).map_err(fail)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const METRICS: &str = "{\"step\":4,\"loss\":1.0}\n{\"step\":6,\"val_loss\":0.9}\n{\"step\":8,\"loss\":0.8}\n";

    #[test]
    fn truncating_metrics_keeps_steps_up_to_the_checkpoint_and_drops_a_torn_line() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("metrics.jsonl");
        std::fs::write(&path, format!("{METRICS}{{\"step\":9,\"lo")).unwrap();
        truncate_metrics(&path, 6).unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "{\"step\":4,\"loss\":1.0}\n{\"step\":6,\"val_loss\":0.9}\n"
        );
        // Nothing to drop: the file is left alone; a missing file is fine.
        truncate_metrics(&path, 100).unwrap();
        assert!(std::fs::read_to_string(&path).unwrap().ends_with("0.9}\n"));
        truncate_metrics(&tmp.path().join("absent.jsonl"), 0).unwrap();
    }

    #[test]
    fn truncating_metrics_ends_a_whole_last_line_and_drops_an_over_long_one() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("metrics.jsonl");
        let long = format!("{{\"step\":5,\"pad\":\"{}\"}}\n", "x".repeat(crate::telemetry::MAX_LINE_BYTES + 10));
        std::fs::write(&path, format!("{METRICS}{long}{{\"step\":7,\"loss\":0.8}}")).unwrap();
        truncate_metrics(&path, 7).unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "{\"step\":4,\"loss\":1.0}\n{\"step\":6,\"val_loss\":0.9}\n{\"step\":7,\"loss\":0.8}\n"
        );
    }

    #[test]
    fn the_last_logged_step_counts_every_kind_of_line() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("metrics.jsonl");
        std::fs::write(&path, format!("{METRICS}{{\"step\":10,\"val_loss\":0.7}}\n{{\"step\":11")).unwrap();
        assert_eq!(last_logged_step(&path), Some(10));
        assert_eq!(last_logged_step(&tmp.path().join("absent.jsonl")), None);
    }
}
