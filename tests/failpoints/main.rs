//! The integration tests that configure failpoints in this process, in a test
//! binary of their own.
//!
//! Failpoints (`fail::cfg`) are process-global: in the shared `it` binary, a
//! failpoint set here would fire inside another test's checkpoint save running
//! on a parallel thread. Holding a lock around every in-process save there
//! would make that unlikely; a separate process makes it impossible. Within
//! this binary every test that runs the checkpoint store holds a
//! `fail::FailScenario`, whose global lock runs them one at a time.
//! Tests that run the `rekindle` binary as a child (its failpoints come
//! from the `FAILPOINTS` variable) are not affected and live in `it`.
//!
//! Run them with `cargo test --test failpoints`.

#[path = "../it/support/mod.rs"]
mod support;

mod crash_consistency;
mod disk_full;
mod seal_race;
