//! The checkpoint store: format versions 1 and 2 (safetensors + `state.json` +
//! `MANIFEST.json` with SHA-256 of every file), the crash-consistent commit
//! protocol, rotation, verification and loading. See docs/checkpoint-format.md.
//!
//! A crate of its own (docs/architecture.md, "Crates"): it knows no attempt,
//! run directory, driver, config or record type, and builds without candle,
//! git2, plotters or tokio. The application decides when to save (its
//! `checkpoint::interval`) and with which write settings.
//!
//! - `layout.rs`: the files and directory names of a checkpoint, [`Snapshot`].
//! - `store.rs`: [`CheckpointStore`]: the commit protocol, rotation, loading the newest.
//! - `files.rs`: checkpoints of a program's own files (`rekindle seal`, `rekindle exec`).
//! - `rotation.rs`: which checkpoints to delete, a pure function.
//! - `quarantine.rs`: where checkpoints that fail verification at resume are moved.
//! - `verify.rs`: what makes a checkpoint valid; reading one through those checks.
//! - `hashed_io.rs`: writes and reads hashed on the same pass; fsyncs.
//! - `world.rs`: a files checkpoint written in parts by the ranks of a distributed program.
//! - `parts.rs`: optimizer state written in parts, one per rank (ZeRO-1), and reassembled at load.
//! - `shards.rs`: the model and optimizer in shards with an index (the Hugging Face layout), and
//!   which rank writes which shard.
//! - `write_mode.rs`: direct or buffered writes, block size and queue depth, measured per filesystem.
//! - `parallel.rs`: files written, verified and loaded on every core.
//! - `local.rs`, `private.rs`: the node-local tier's record and choice, and its root kept private to its user.
//! - `manifest.rs`, `safetensors_io.rs`, `tensor.rs`: the file formats and host tensors.
//! - `error.rs`: [`CheckpointError`] and per-file failures.

// What the store stands on, under the names its modules use.
use rekindle_confine as confine;
#[cfg(test)]
use rekindle_fuzz as fuzz;
use rekindle_units as units;

mod encode;
mod error;
mod files;
mod hashed_io;
mod layout;
pub mod local;
mod manifest;
mod parallel;
mod parts;
#[cfg(test)]
mod parts_tests;
pub mod persist;
pub mod private;
mod quarantine;
pub mod rotation;
mod safetensors_io;
pub mod shards;
mod store;
mod tensor;
mod verify;
mod world;
pub mod write_mode;

pub use error::{CheckpointError, FileFailure, Problem};
pub use files::{FilesOutcome, STAGING_DIR};
pub use layout::{
    CheckpointKind, MODEL_FILE, OPTIMIZER_FILE, REQUIRED_FILES, STATE_FILE, Snapshot, claim_dir, parse_step_dir_name,
    step_dir_name,
};
pub use manifest::{
    FORMAT_VERSION, MANIFEST_FILE, Manifest, ManifestEntry, NEWEST_FORMAT_VERSION, SHARDED_FORMAT_VERSION,
    is_plain_name,
};
pub use parts::{optimizer_part_name, parse_optimizer_part_name};
pub use persist::{PartsError, Persisted, Persister, PersisterDied, SaveWatch, Unwatched};
pub use quarantine::{QUARANTINE_DIR, Quarantined, parse_quarantine_name, quarantine_name};
pub use store::{CheckpointStore, CommitGuard, LoadOutcome, Parts, PartsWritten, SaveReport};
pub use tensor::{
    DType, HostTensor, SharedBytes, TensorBytes, TensorError, TensorSet, copy_parallel, payload_bytes, reusable,
};
pub use verify::{CheckpointInfo, Loaded, VerifyLevel, load_dir, read_manifest, verify_checkpoint_dir};
pub use world::{PartSealed, WorldRank};
pub use write_mode::{WriteChoice, WriteSettings};
