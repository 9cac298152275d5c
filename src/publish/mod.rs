//! Publishing a run's small artefacts (metrics, events, config, summary, the
//! newest manifest — never weights) to a git repository on exit, with pushes
//! retried inside the time left before the deadline.
//!
//! - `select.rs`: what may be published (patterns, links, checkpoints,
//!   types, sizes), as pure decisions.
//! - `files.rs`: the walk and the reads, never through a link, never
//!   blocking, bounded.
//! - `git.rs`: the commit and the pushes.
//! - `worktree.rs`: the clone's `runs/<run>/` refreshed through a handle.
//! - `backoff.rs`: the waits between push attempts.

mod backoff;
mod files;
mod git;
mod select;
mod worktree;

pub use backoff::{next_wait, retry_delay};
pub use git::{PublishError, PublishReport, PublishRequest, publish, redact_url};
pub use select::{ARTEFACTS, CHECKPOINT_REASON, PUBLISHABLE_EXTENSIONS, SYMLINK_REASON, admit};
