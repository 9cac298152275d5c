//! Which nodes an attempt's end blames: a pure function from how the
//! attempt ended to the nodes its next attempt (or in-job step) should
//! leave behind. A node is blamed only where the end points at it; when
//! rekindle cannot tell (a preemption, a `scancel`, the time limit, a
//! shared filesystem error, a bug) it blames nobody.
//!
//! | end | blamed |
//! |---|---|
//! | ranks lost (their heartbeat stopped, their node gone) | each lost rank's node |
//! | the training thread hung in a step or an evaluation | its node |
//! | a save or publish hung | nobody (storage, not the node) |
//! | a transient device error (a step failing after others passed, a GPU probe error) | its node |
//! | another transient crash (I/O on the run directory, a rank that could not agree) | nobody |
//! | a failed health check | the node that failed it (not for `free disk`: the shared storage is full, not the node) |
//! | a deterministic error | nobody (it fails the same way anywhere) |
//! | a stop signal (preemption, `scancel`, the time limit), `--stop-at-step` | nobody |
//!
//! `extra` adds nodes blamed by other means (the nodes of the attempt's
//! blamed stragglers, [`blamed_stragglers`]): they are merged in, once each.

use crate::telemetry::{Event, RecordedEvent};

/// How an attempt ended, as far as blaming a node goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptEnd {
    /// Ranks whose heartbeats stopped: their nodes (empty when unknown).
    RanksLost { nodes: Vec<String> },
    /// The watchdog found `activity` (`step`, `eval`, `save`, `publish`)
    /// stuck on `node`.
    Hang { node: String, activity: String },
    /// A transient crash on `node`; `device` when it was a device error.
    TransientCrash { node: String, device: bool },
    /// The start-of-attempt check `check` failed on `node`.
    Unhealthy { node: String, check: String },
    /// A deterministic error: the same anywhere.
    Deterministic,
    /// A stop signal or `--stop-at-step`: preemption, `scancel`, the time limit.
    Stopped,
}

/// The nodes `end` blames, with `extra` merged in: sorted, each once,
/// empty names dropped.
pub fn blame(end: &AttemptEnd, extra: &[String]) -> Vec<String> {
    let mut nodes: Vec<String> = match end {
        AttemptEnd::RanksLost { nodes } => nodes.clone(),
        AttemptEnd::Hang { node, activity } if activity == "step" || activity == "eval" => vec![node.clone()],
        AttemptEnd::TransientCrash { node, device: true } => vec![node.clone()],
        // Room for a checkpoint is the shared storage's (a quota, a full
        // filesystem): every node would fail it alike.
        AttemptEnd::Unhealthy { check, .. } if check == "free disk" => Vec::new(),
        AttemptEnd::Unhealthy { node, .. } => vec![node.clone()],
        AttemptEnd::Hang { .. }
        | AttemptEnd::TransientCrash { device: false, .. }
        | AttemptEnd::Deterministic
        | AttemptEnd::Stopped => Vec::new(),
    };
    nodes.extend(extra.iter().cloned());
    nodes.retain(|n| !n.trim().is_empty());
    nodes.sort();
    nodes.dedup();
    nodes
}

/// The nodes the newest attempt's `straggler` events blame (`[health]
/// straggler_blame`): `blame`'s extra nodes, so a node that made its rank
/// a straggler is left behind at the next restart like a failed one.
pub fn blamed_stragglers(events: &[RecordedEvent]) -> Vec<String> {
    let from = events.iter().rposition(|e| e.name == "start").unwrap_or(0);
    events[from..]
        .iter()
        .filter_map(|e| match &e.event {
            Event::Straggler(s) if s.blamed => Some(s.rank_node.clone()),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn each_end_blames_its_node_or_nobody() {
        let table: Vec<(AttemptEnd, Vec<String>)> = vec![
            (AttemptEnd::RanksLost { nodes: s(&["n3", "n2", "n3"]) }, s(&["n2", "n3"])),
            (AttemptEnd::RanksLost { nodes: s(&[""]) }, s(&[])),
            (AttemptEnd::Hang { node: "n1".into(), activity: "step".into() }, s(&["n1"])),
            (AttemptEnd::Hang { node: "n1".into(), activity: "eval".into() }, s(&["n1"])),
            (AttemptEnd::Hang { node: "n1".into(), activity: "save".into() }, s(&[])),
            (AttemptEnd::Hang { node: "n1".into(), activity: "publish".into() }, s(&[])),
            (AttemptEnd::TransientCrash { node: "n2".into(), device: true }, s(&["n2"])),
            (AttemptEnd::TransientCrash { node: "n2".into(), device: false }, s(&[])),
            (AttemptEnd::Unhealthy { node: "n1".into(), check: "site command".into() }, s(&["n1"])),
            (AttemptEnd::Unhealthy { node: "n1".into(), check: "free disk".into() }, s(&[])),
            (AttemptEnd::Deterministic, s(&[])),
            (AttemptEnd::Stopped, s(&[])),
        ];
        for (end, want) in table {
            assert_eq!(blame(&end, &[]), want, "{end:?}");
        }
    }

    fn recorded(line: serde_json::Value) -> RecordedEvent {
        RecordedEvent::from_value(line).expect("a valid event")
    }

    #[test]
    fn only_the_newest_attempts_blamed_stragglers_blame_their_nodes() {
        let straggler = |node: &str, blamed: bool| {
            recorded(serde_json::json!({"event": "straggler", "rank": 1, "rank_node": node, "step": 40,
                "step_seconds": 0.3, "median_seconds": 0.1, "factor": 1.5, "steps": 20,
                "blamed": blamed, "world_size": 2}))
        };
        let start = recorded(serde_json::json!({"event": "start", "step": 0}));
        let events = vec![straggler("n1", true), start, straggler("n2", false), straggler("n3", true)];
        assert_eq!(blamed_stragglers(&events), s(&["n3"]), "n1 was an earlier attempt's, n2 not blamed");
        assert_eq!(blamed_stragglers(&events[..1]), s(&["n1"]), "no start recorded: all events count");
        assert_eq!(blamed_stragglers(&[]), s(&[]));
    }

    #[test]
    fn extra_blamed_nodes_are_merged_once() {
        let end = AttemptEnd::Unhealthy { node: "n1".into(), check: "gpu health".into() };
        assert_eq!(blame(&end, &s(&["n4", "n1", " "])), s(&["n1", "n4"]));
        // A straggler's node is blamed even when the end itself blames nobody.
        assert_eq!(blame(&AttemptEnd::Stopped, &s(&["n2"])), s(&["n2"]));
    }
}
