//! Publishing a run's small artefacts (metrics, events, config, summary, the
//! newest manifest — never weights) to a git repository on exit, with pushes
//! retried inside the time left before the deadline.

mod backoff;
mod git;

pub use backoff::{next_wait, retry_delay};
pub use git::{PUBLISHABLE_EXTENSIONS, PublishError, PublishReport, PublishRequest, admit, publish, redact_url};
