//! The checklist `rekindle doctor` prints and the start-of-attempt check
//! records: one line per check, ok, warn, fail or skip, what it found, and
//! whether it is required (a failed required check means the run should not
//! start, or the attempt ends untrained).

use std::fmt;

use serde::{Deserialize, Serialize};

/// The outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckStatus {
    Ok,
    Warn,
    Fail,
    /// Not applicable here (e.g. publishing not configured).
    Skip,
}

/// One line of the checklist.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    pub name: String,
    pub status: CheckStatus,
    pub detail: String,
    /// A failure of a required check means the run should not start.
    pub required: bool,
}

/// Every check, in the order they ran. Serialised as
/// `{"checks": [...], "required_failed": bool}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checklist {
    pub checks: Vec<Check>,
}

impl Serialize for Checklist {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct View<'a> {
            checks: &'a [Check],
            required_failed: bool,
        }
        View { checks: &self.checks, required_failed: self.any_required_failed() }.serialize(serializer)
    }
}

impl Checklist {
    /// True when any required check failed (the CLI exits non-zero then).
    pub fn any_required_failed(&self) -> bool {
        self.checks.iter().any(|c| c.required && c.status == CheckStatus::Fail)
    }

    /// The check named `name`, if it ran.
    pub fn get(&self, name: &str) -> Option<&Check> {
        self.checks.iter().find(|c| c.name == name)
    }

    pub(crate) fn push(&mut self, name: &str, status: CheckStatus, required: bool, detail: impl Into<String>) {
        self.checks.push(Check { name: name.to_string(), status, detail: detail.into(), required });
    }
}

impl fmt::Display for Checklist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let count = |s| self.checks.iter().filter(|c| c.status == s).count();
        for c in &self.checks {
            let mark = match c.status {
                CheckStatus::Ok => " ok ",
                CheckStatus::Warn => "warn",
                CheckStatus::Fail => "FAIL",
                CheckStatus::Skip => "skip",
            };
            let required = if c.required && c.status == CheckStatus::Fail { " (required)" } else { "" };
            writeln!(f, "[{mark}] {}{required}: {}", c.name, c.detail)?;
        }
        let verdict = if self.any_required_failed() { "a required check failed" } else { "ready" };
        writeln!(
            f,
            "{} ok, {} warning(s), {} failed, {} skipped: {verdict}",
            count(CheckStatus::Ok),
            count(CheckStatus::Warn),
            count(CheckStatus::Fail),
            count(CheckStatus::Skip)
        )
    }
}

impl Checklist {
    /// An empty checklist.
    pub fn new() -> Checklist {
        Checklist { checks: Vec::new() }
    }

    /// The first required check that failed, in the order they ran.
    pub fn first_required_failure(&self) -> Option<&Check> {
        self.checks.iter().find(|c| c.required && c.status == CheckStatus::Fail)
    }

    /// Appends every check of `other`.
    pub fn extend(&mut self, other: Checklist) {
        self.checks.extend(other.checks);
    }
}

impl Default for Checklist {
    fn default() -> Self {
        Checklist::new()
    }
}
