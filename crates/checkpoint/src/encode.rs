//! The files a save writes: their names, exact sizes and contents, which
//! rank of a world writes each, and writing them (hashed, fsynced) on every
//! core. The model and the optimizer state are one file each, or shards
//! with an index when larger than the shard size (`shards.rs`); in a world
//! of several ranks they are cut into at least one shard per rank and each
//! rank writes its share, the same plan computed on every rank from the
//! same tensors. A sharded optimizer's parts (ZeRO-1, `parts.rs`) are each
//! written by their rank.

use std::collections::BTreeMap;

use super::error::CheckpointError;
use super::hashed_io::{Written, write_hashed, write_hashed_with};
use super::manifest::ManifestEntry;
use super::parallel::{file_threads, in_parallel, largest_first};
use super::parts::optimizer_part_name;
use super::safetensors_io;
use super::shards::{self, ShardIndex, index_name, shard_name};
use super::tensor::{HostTensor, TensorSet};
use super::write_mode::WritePlan;
use crate::confine::Dir;

/// What a planned file holds.
pub(super) enum Content<'a> {
    /// A safetensors file of these tensors (in this order) and metadata.
    Tensors(Vec<(&'a String, &'a HostTensor)>, BTreeMap<String, String>),
    /// Bytes as they are (`state.json`, a shard index).
    Bytes(Vec<u8>),
}

/// One file of a save.
pub(super) struct PlannedFile<'a> {
    pub name: String,
    /// Its exact size.
    pub size: u64,
    pub content: Content<'a>,
    /// The rank that writes it (0 in a world of one).
    pub rank: usize,
}

/// A tensor set is cut among the ranks of a world only where each rank's
/// share is at least this (or one shard, where the shard size is smaller):
/// a smaller share saves less time than its files cost, and rank 0 writes
/// it alone, as before shares existed.
pub(super) const MIN_RANK_SHARE: u64 = 16 << 20;

/// How the tensor sets of a save are cut into files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Sharding {
    /// The largest shard (`[checkpoint] shard_size`).
    pub shard_bytes: u64,
    /// Ranks writing the checkpoint: each tensor set is cut into at least
    /// this many shards (where it has the tensors).
    pub world: usize,
}

/// The `__metadata__` of a checkpoint's safetensors file holding `content`
/// (`model`, `optimizer`, or a part's file stem) of `step`. `format` is
/// `"pt"`, as `safetensors.torch.save_file` writes it: Hugging Face's
/// loaders (`transformers`, `huggingface_hub.load_torch_model`) refuse a
/// file whose `format` is not a framework they know; `writer` says who
/// wrote it.
pub(super) fn safetensors_metadata(content: &str, step: u64) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("format".to_string(), "pt".to_string()),
        ("writer".to_string(), "rekindle".to_string()),
        ("content".to_string(), content.to_string()),
        ("step".to_string(), step.to_string()),
    ])
}

/// The files of the tensor set `set` saved as `stem` (`"model"`,
/// `"optimizer"`): `<stem>.safetensors` written by rank 0, or, cut by
/// `sharding`, its shards (each with the rank that writes it) and their
/// index (rank 0's).
pub(super) fn tensor_files<'a>(stem: &str, set: &'a TensorSet, step: u64, sharding: Sharding) -> Vec<PlannedFile<'a>> {
    let tensors: Vec<(&String, &HostTensor)> = set.iter().collect();
    let sizes: Vec<u64> = tensors.iter().map(|(_, t)| t.data.len() as u64).collect();
    let total: u64 = sizes.iter().sum();
    let world = sharding.world.max(1);
    let shared = world > 1 && total >= world as u64 * MIN_RANK_SHARE.min(sharding.shard_bytes);
    let ranges = shards::plan(&sizes, sharding.shard_bytes, if shared { world } else { 1 });
    if ranges.len() <= 1 {
        let name = format!("{stem}.safetensors");
        return vec![safetensors_file(name, tensors, safetensors_metadata(stem, step), 0)];
    }
    let shard_sizes: Vec<u64> = ranges.iter().map(|r| sizes[r.clone()].iter().sum()).collect();
    let owners = shards::assign(&shard_sizes, if shared { world } else { 1 });
    let n = ranges.len();
    let index = ShardIndex::of(stem, &tensors, &ranges).to_bytes();
    let mut files: Vec<PlannedFile<'a>> = ranges
        .iter()
        .zip(owners)
        .enumerate()
        .map(|(k, (range, rank))| {
            let mut meta = safetensors_metadata(stem, step);
            meta.insert("shard".into(), format!("{}/{n}", k + 1));
            safetensors_file(shard_name(stem, k + 1, n), tensors[range.clone()].to_vec(), meta, rank)
        })
        .collect();
    files.push(PlannedFile {
        name: index_name(stem),
        size: index.len() as u64,
        content: Content::Bytes(index),
        rank: 0,
    });
    files
}

/// Rank `rank`'s part of a sharded optimizer (`parts.rs`), written by it.
pub(super) fn part_file<'a>(part: &'a TensorSet, step: u64, rank: usize, world: usize) -> PlannedFile<'a> {
    let name = optimizer_part_name(rank, world);
    let mut meta = safetensors_metadata(name.trim_end_matches(".safetensors"), step);
    meta.insert("rank".into(), rank.to_string());
    meta.insert("world_size".into(), world.to_string());
    safetensors_file(name, part.iter().collect(), meta, rank)
}

fn safetensors_file<'a>(
    name: String,
    tensors: Vec<(&'a String, &'a HostTensor)>,
    meta: BTreeMap<String, String>,
    rank: usize,
) -> PlannedFile<'a> {
    let size = safetensors_io::file_size(tensors.iter().copied(), &meta);
    PlannedFile { name, size, content: Content::Tensors(tensors, meta), rank }
}

/// The files ranks other than 0 write for a save of `model` (and of
/// `optimizer`, unless it is in parts: `None`) cut by `sharding`, and, with
/// the optimizer in parts, the parts of ranks 1 and up, each with the rank
/// that writes it: what rank 0 expects from the others before it commits.
pub(super) fn names_from_others(
    model: &TensorSet,
    optimizer: Option<&TensorSet>,
    sharding: Sharding,
) -> BTreeMap<String, usize> {
    let mut names = BTreeMap::new();
    let mut add =
        |files: Vec<PlannedFile<'_>>| names.extend(files.into_iter().filter(|f| f.rank != 0).map(|f| (f.name, f.rank)));
    add(tensor_files("model", model, 0, sharding));
    match optimizer {
        Some(optimizer) => add(tensor_files("optimizer", optimizer, 0, sharding)),
        None => names.extend((1..sharding.world).map(|r| (optimizer_part_name(r, sharding.world), r))),
    }
    names
}

/// Writes every file of `files` into `dir` — the tensor files as `plan`
/// says, the small ones through the page cache — on [`file_threads`]
/// threads, the largest first; returns their manifest entries in the order
/// of `files`, or the first error. Each file has its failpoint
/// `checkpoint::before_write::<name>`.
pub(super) fn write_files(
    dir: &Dir,
    files: &[PlannedFile<'_>],
    plan: &WritePlan,
    step: u64,
) -> Result<Vec<(ManifestEntry, Written)>, CheckpointError> {
    let sizes: Vec<u64> = files.iter().map(|f| f.size).collect();
    let results = in_parallel(files, &largest_first(&sizes), file_threads(), |file| {
        let path = dir.shown(&file.name);
        let werr = |source| CheckpointError::Write { step, path: path.clone(), source };
        failpoint(&format!("checkpoint::before_write::{}", file.name))?;
        let written = match &file.content {
            Content::Tensors(tensors, meta) => {
                let header = safetensors_io::header_of(tensors.iter().copied(), meta);
                let mut parts: Vec<&[u8]> = vec![&header];
                parts.extend(tensors.iter().map(|(_, t)| &t.data[..]));
                write_hashed_with(dir, &file.name, &parts, plan)
            }
            Content::Bytes(b) => write_hashed(dir, &file.name, &[b]),
        }
        .map_err(werr)?;
        tracing::debug!(file = file.name, bytes = written.bytes, mode = ?written.mode, "checkpoint file written");
        let entry = ManifestEntry { name: file.name.clone(), bytes: written.bytes, sha256: written.sha256.clone() };
        Ok((entry, written))
    });
    results.into_iter().collect()
}

fn failpoint(name: &str) -> Result<(), CheckpointError> {
    let _ = name; // unused when failpoints are compiled out
    fail::fail_point!(name, |_| Err(CheckpointError::Injected(name.to_string())));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(sizes: &[usize]) -> TensorSet {
        sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| (format!("t{i:02}"), HostTensor::from_f32(vec![n], &vec![i as f32; n])))
            .collect()
    }

    fn names(files: &[PlannedFile<'_>]) -> Vec<(String, usize)> {
        files.iter().map(|f| (f.name.clone(), f.rank)).collect()
    }

    #[test]
    fn a_set_is_one_file_until_it_outgrows_a_shard_and_every_rank_gets_a_share() {
        let model = set(&[100, 100, 100, 100]);
        let one = Sharding { shard_bytes: 1 << 20, world: 1 };
        assert_eq!(names(&tensor_files("model", &model, 3, one)), [("model.safetensors".into(), 0)]);
        let small = Sharding { shard_bytes: 800, world: 1 };
        assert_eq!(
            names(&tensor_files("model", &model, 3, small)),
            [
                ("model-00001-of-00002.safetensors".into(), 0),
                ("model-00002-of-00002.safetensors".into(), 0),
                ("model.safetensors.index.json".into(), 0),
            ]
        );
        // Two ranks: shares only where each is worth it (a shard here).
        let two = Sharding { shard_bytes: 1 << 20, world: 2 };
        assert_eq!(names(&tensor_files("model", &model, 3, two)), [("model.safetensors".into(), 0)]);
        let two = Sharding { shard_bytes: 800, world: 2 };
        let files = tensor_files("optimizer", &model, 3, two);
        assert_eq!(
            names(&files),
            [
                ("optimizer-00001-of-00002.safetensors".into(), 0),
                ("optimizer-00002-of-00002.safetensors".into(), 1),
                ("optimizer.safetensors.index.json".into(), 0),
            ]
        );
        // Sizes are exact: what the writer will write.
        for f in &files {
            if let Content::Tensors(t, meta) = &f.content {
                let mut bytes = safetensors_io::header_of(t.iter().copied(), meta);
                t.iter().for_each(|(_, t)| bytes.extend_from_slice(&t.data));
                assert_eq!(bytes.len() as u64, f.size, "{}", f.name);
            }
        }
        assert_eq!(
            names_from_others(&model, Some(&model), two),
            BTreeMap::from([
                ("model-00002-of-00002.safetensors".into(), 1),
                ("optimizer-00002-of-00002.safetensors".into(), 1)
            ])
        );
        assert_eq!(
            names_from_others(&model, None, two),
            BTreeMap::from([
                ("model-00002-of-00002.safetensors".into(), 1),
                ("optimizer.rank-00001-of-00002.safetensors".into(), 1)
            ])
        );
        assert!(names_from_others(&model, None, one).is_empty());
    }
}
