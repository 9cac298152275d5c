//! The checkpoint store, which lives in its own crate (crates/checkpoint,
//! `rekindle-checkpoint`: the format, manifests, the commit protocol,
//! rotation, verification and loading; docs/architecture.md, "Crates"),
//! under the path the application has always used for it, and what the
//! application decides about checkpoints: when to save ([`interval`]) and how
//! its config's `[checkpoint]` section asks them written
//! ([`write_settings`]).

pub use rekindle_checkpoint::*;

pub mod interval;

use crate::config::{CheckpointSection, CheckpointWriteMode};

/// The write settings of a `[checkpoint]` section.
pub fn write_settings(c: &CheckpointSection) -> WriteSettings {
    WriteSettings {
        mode: match c.write_mode {
            CheckpointWriteMode::Auto => write_mode::ModeSetting::Auto,
            CheckpointWriteMode::Direct => write_mode::ModeSetting::Direct,
            CheckpointWriteMode::Buffered => write_mode::ModeSetting::Buffered,
        },
        block_bytes: c.write_block.fixed().map(|b| b as usize),
        queue_depth: (c.write_queue_depth > 0).then_some(c.write_queue_depth as usize),
        shard_bytes: c.shard_size.fixed(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The store writes its manifests with sorted keys, as every record
    /// rekindle writes (the checker is telemetry's); earlier versions wrote
    /// the fields in declaration order, and those still read.
    #[test]
    fn manifest_keys_are_alphabetical_and_manifests_in_field_order_still_read() {
        let sorted = |bytes: &[u8]| crate::telemetry::first_unsorted_key(std::str::from_utf8(bytes).unwrap());
        let written = serde_json::to_vec(&serde_json::json!({
            "format_version": 1, "step": 3, "created_at": "2026-01-01T00:00:00Z",
            "rekindle_version": "0.1.0",
            "files": [{"name": "model.safetensors", "bytes": 1, "sha256": "a".repeat(64)}]
        }))
        .unwrap();
        for kind in [CheckpointKind::Native, CheckpointKind::Files] {
            let mut manifest = Manifest::parse(&written).unwrap();
            manifest.kind = kind;
            let bytes = manifest.to_bytes();
            assert_eq!(sorted(&bytes), None);
            assert_eq!(Manifest::parse(&bytes).unwrap(), manifest);
            let earlier = serde_json::to_vec_pretty(&manifest).unwrap();
            assert!(sorted(&earlier).is_some());
            assert_eq!(Manifest::parse(&earlier).unwrap(), manifest);
        }
    }
}
