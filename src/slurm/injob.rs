//! Restarts inside the running job (docs/recovery.md): the batch shell
//! (`slurm/orchestrator.slurm`, submitted with `--no-kill`) offers them by
//! exporting where rekindle may ask for one, and how many it has done; when
//! a step ends because a rank or its node was lost, rekindle writes a
//! [`RestartRequest`] there instead of requeueing the job, and the shell
//! launches a new step on the nodes left, without the ones named.
//!
//! ```text
//! REKINDLE_INJOB_REQUEST   the file to write the request to (shared storage)
//! REKINDLE_INJOB_RESTARTS  in-job restarts done so far in this allocation
//! REKINDLE_INJOB_MAX       how many the shell allows (default 3)
//! REKINDLE_INJOB_EXCLUDED  nodes excluded so far (lost), comma-separated
//! ```
//!
//! The request also carries `requeue_exclude`, the job's exclusion list
//! to set should the shell requeue the job instead (`crate::health`'s plan
//! for the blamed nodes, made when asking).
//!
//! The request is `key=value` lines, so that a shell script reads it
//! without a JSON parser; unknown keys are ignored and `#` starts a comment.

use std::path::{Path, PathBuf};

/// The variables the batch shell exports to every step it launches.
pub const REQUEST_VAR: &str = "REKINDLE_INJOB_REQUEST";
pub const RESTARTS_VAR: &str = "REKINDLE_INJOB_RESTARTS";
pub const MAX_VAR: &str = "REKINDLE_INJOB_MAX";
/// Nodes the shell excluded so far, comma-separated (lost nodes).
pub const EXCLUDED_VAR: &str = "REKINDLE_INJOB_EXCLUDED";

/// The batch shell's offer, read from the step's environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InJobOffer {
    /// Where to write the request.
    pub file: PathBuf,
    /// In-job restarts already done in this allocation.
    pub restarts: u32,
    /// The most the shell does.
    pub max: u32,
    /// Nodes the shell excluded from this allocation's steps so far.
    pub excluded: Vec<String>,
}

impl InJobOffer {
    /// The offer in the process environment, if the batch shell made one.
    pub fn from_process() -> Option<InJobOffer> {
        InJobOffer::from_env(|name| std::env::var(name).ok())
    }

    /// The offer in an environment (`None` without one, or when a count is
    /// not a number: a shell that says nothing clear offers nothing).
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Option<InJobOffer> {
        let file = get(REQUEST_VAR).filter(|f| !f.trim().is_empty())?;
        let number = |name: &str, default: u32| match get(name) {
            None => Some(default),
            Some(text) => text.trim().parse().ok(),
        };
        let excluded = get(EXCLUDED_VAR)
            .map(|list| list.split(',').map(str::trim).filter(|n| !n.is_empty()).map(str::to_string).collect())
            .unwrap_or_default();
        Some(InJobOffer {
            file: PathBuf::from(file),
            restarts: number(RESTARTS_VAR, 0)?,
            max: number(MAX_VAR, 3)?,
            excluded,
        })
    }

    /// Whether another restart fits the shell's bound.
    pub fn available(&self) -> bool {
        self.restarts < self.max
    }

    /// Why this offer cannot be taken, when it cannot.
    pub fn refusal(&self) -> Option<String> {
        (!self.available()).then(|| {
            format!(
                "{} in-job restarts already in this allocation (the batch shell allows {}, {MAX_VAR})",
                self.restarts, self.max
            )
        })
    }
}

/// What the step asks of the batch shell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestartRequest {
    /// What ended the step: `rank_lost`, ...
    pub reason: String,
    /// Nodes the next step must not use.
    pub exclude: Vec<String>,
    /// The checkpoint step the next step is expected to resume from (the
    /// newest durable one; the node-local tier may hold a newer one).
    pub step: Option<u64>,
    /// The job's whole exclusion list (`ExcNodeList`) to set should the
    /// shell requeue the job instead of restarting in it: rekindle's plan
    /// for the blamed nodes (bounded, the user's own exclusions kept);
    /// empty to leave the job's exclusions as they are.
    pub requeue_exclude: Vec<String>,
    /// `<rank>@<node>` of the writer.
    pub written_by: String,
}

impl RestartRequest {
    /// The file's text.
    pub fn to_text(&self) -> String {
        let mut text = String::from("# rekindle in-job restart request (docs/recovery.md)\naction=restart\n");
        text.push_str(&format!("reason={}\n", one_line(&self.reason)));
        text.push_str(&format!("exclude={}\n", self.exclude.iter().map(|n| one_line(n)).collect::<Vec<_>>().join(",")));
        if let Some(step) = self.step {
            text.push_str(&format!("step={step}\n"));
        }
        if !self.requeue_exclude.is_empty() {
            let nodes: Vec<String> = self.requeue_exclude.iter().map(|n| one_line(n)).collect();
            text.push_str(&format!("requeue_exclude={}\n", nodes.join(",")));
        }
        text.push_str(&format!("written_by={}\n", one_line(&self.written_by)));
        text
    }

    /// Reads a request back (for tests and `status`): `None` when the text
    /// is not one (no `action=restart`).
    pub fn parse(text: &str) -> Option<RestartRequest> {
        let mut request = RestartRequest {
            reason: String::new(),
            exclude: Vec::new(),
            step: None,
            requeue_exclude: Vec::new(),
            written_by: String::new(),
        };
        let names = |value: &str| -> Vec<String> {
            value.split(',').map(str::trim).filter(|n| !n.is_empty()).map(str::to_string).collect()
        };
        let mut restart = false;
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
            let Some((key, value)) = line.split_once('=') else { continue };
            match key.trim() {
                "action" => restart = value.trim() == "restart",
                "reason" => request.reason = value.trim().to_string(),
                "exclude" => request.exclude = names(value),
                "requeue_exclude" => request.requeue_exclude = names(value),
                "step" => request.step = value.trim().parse().ok(),
                "written_by" => request.written_by = value.trim().to_string(),
                _ => {}
            }
        }
        restart.then_some(request)
    }

    /// Writes the request to `path` atomically (a temporary file beside it,
    /// synced, renamed), so the shell never reads half of one.
    /// The directory is opened as a handle; the temporary file is created
    /// there `O_EXCL` and renamed over the name (`confine::write_atomically`).
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        crate::confine::write_atomically(path, self.to_text().as_bytes())
    }
}

/// Node names and reasons come from the environment and other ranks: a
/// newline or a comma in one must not make a second key or node.
fn one_line(text: &str) -> String {
    text.chars().map(|c| if c.is_control() || c == ',' { ' ' } else { c }).collect::<String>().trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
    }

    #[test]
    fn no_request_file_means_no_offer() {
        assert_eq!(InJobOffer::from_env(env(&[(RESTARTS_VAR, "0")])), None);
        assert_eq!(InJobOffer::from_env(env(&[(REQUEST_VAR, " ")])), None);
    }

    #[test]
    fn the_offer_counts_restarts_against_the_shells_bound() {
        let offer =
            InJobOffer::from_env(env(&[(REQUEST_VAR, "/shared/r"), (RESTARTS_VAR, "2"), (EXCLUDED_VAR, "n2, n4,")]))
                .unwrap();
        assert_eq!((offer.restarts, offer.max, offer.available()), (2, 3, true));
        assert_eq!(offer.excluded, vec!["n2", "n4"]);
        let spent = InJobOffer::from_env(env(&[(REQUEST_VAR, "/r"), (RESTARTS_VAR, "3"), (MAX_VAR, "3")])).unwrap();
        assert!(!spent.available());
        assert!(spent.refusal().unwrap().contains("3 in-job restarts already"), "{:?}", spent.refusal());
        let none = InJobOffer::from_env(env(&[(REQUEST_VAR, "/r"), (MAX_VAR, "0")])).unwrap();
        assert!(!none.available(), "REKINDLE_INJOB_MAX=0 turns in-job restarts off");
    }

    #[test]
    fn a_count_that_is_not_a_number_is_no_offer() {
        assert_eq!(InJobOffer::from_env(env(&[(REQUEST_VAR, "/r"), (RESTARTS_VAR, "one")])), None);
    }

    #[test]
    fn a_request_round_trips_and_cannot_smuggle_keys_or_nodes() {
        let request = RestartRequest {
            reason: "rank_lost: rank 1\nexclude=n1".into(),
            exclude: vec!["n2".into(), "n3,n4".into()],
            step: Some(120),
            requeue_exclude: vec!["n2".into(), "n9".into()],
            written_by: "0@n1".into(),
        };
        let text = request.to_text();
        assert!(text.contains("action=restart\n"), "{text}");
        assert!(text.contains("exclude=n2,n3 n4\n"), "{text}");
        let back = RestartRequest::parse(&text).unwrap();
        assert_eq!(back.exclude, vec!["n2", "n3 n4"]);
        assert!(text.contains("requeue_exclude=n2,n9\n"), "{text}");
        assert_eq!(back.requeue_exclude, vec!["n2", "n9"]);
        assert_eq!((back.step, back.written_by.as_str()), (Some(120), "0@n1"));
        assert_eq!(back.reason, "rank_lost: rank 1 exclude=n1");
        assert_eq!(RestartRequest::parse("reason=x\n"), None, "no action=restart, no request");
    }

    #[test]
    fn the_request_is_written_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("req");
        let request = RestartRequest {
            reason: "rank_lost".into(),
            exclude: vec![],
            step: None,
            requeue_exclude: vec![],
            written_by: "1@n2".into(),
        };
        request.write(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(RestartRequest::parse(&text), Some(request));
        assert!(text.contains("exclude=\n"), "an empty exclusion is written as such: {text}");
        assert!(!text.contains("requeue_exclude"), "nothing to set on a requeue, nothing said: {text}");
    }
}
