//! Whether a node can be trusted with an attempt, and what to do about one
//! that cannot: the checks `rekindle doctor` and the start of every attempt
//! share (`node.rs`, `storage.rs`, the site command in `command.rs`, the
//! checklist in `checklist.rs`); which nodes an attempt's end blames
//! (`blame.rs`); which of them the job leaves behind, bounded
//! (`exclude.rs`); and the guard against attempts that make no progress
//! (`progress.rs`). Decisions are pure; the attempt (`crate::attempt`)
//! carries them out.

mod blame;
mod checklist;
mod command;
mod exclude;
mod node;
mod progress;
mod storage;

pub use blame::{AttemptEnd, blame, blamed_stragglers};
pub use checklist::{Check, CheckStatus, Checklist};
pub use command::{
    CommandEnd, CommandRun, INHERITED, INHERITED_PREFIXES, OUTPUT_LIMIT, SiteRun, run_site_command, site_env,
};
pub use exclude::{ExclusionInput, ExclusionPlan, plan_exclusion};
pub use node::{FS_TIMEOUT, NODE_WIDE, NodeInput, node_checks};
pub use progress::{
    AttemptSummary, Guard, NoProgress, Starting, VERDICT_WHY, attempts_without_progress, progress_guard,
};
pub use storage::StorageProbe;
