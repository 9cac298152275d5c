//! The checkpoint store: format version 1 (safetensors + `state.json` +
//! `MANIFEST.json` with SHA-256 of every file), the crash-consistent commit
//! protocol, rotation, verification and loading. See docs/checkpoint-format.md.

mod error;
mod manifest;
pub mod rotation;
mod safetensors_io;
mod store;
mod tensor;

pub use error::{CheckpointError, FileFailure, Problem};
pub use manifest::{FORMAT_VERSION, MANIFEST_FILE, Manifest, ManifestEntry, is_plain_name};
pub use store::{
    CheckpointInfo, CheckpointStore, LoadOutcome, Loaded, MODEL_FILE, OPTIMIZER_FILE, REQUIRED_FILES, STATE_FILE,
    SaveReport, Snapshot, VerifyLevel, load_dir, parse_step_dir_name, read_manifest, step_dir_name,
    verify_checkpoint_dir,
};
pub use tensor::{DType, HostTensor, TensorSet, payload_bytes};
