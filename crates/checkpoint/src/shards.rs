//! The model and the optimizer state in shards: a tensor set larger than
//! the shard size is written as `model-00001-of-00004.safetensors`, … plus
//! `model.safetensors.index.json`, the layout of Hugging Face's sharded
//! checkpoints (`transformers`, `huggingface_hub` and `safetensors` read it
//! as it is), and likewise `optimizer-…-of-….safetensors` with
//! `optimizer.safetensors.index.json`. A shard holds whole tensors,
//! consecutive in name order; the index maps every tensor to its shard.
//!
//! Shards are what lets SHA-256 — one core per stream — run on every core:
//! each shard is its own file, hashed as it is written, and verified and
//! loaded beside the others. In a world of several ranks they are also how
//! every rank writes its share ([`assign`]).
//!
//! A set that fits one shard stays one file (`model.safetensors`), as in
//! every checkpoint before shards existed.

use std::collections::BTreeMap;
use std::ops::Range;

use serde::{Deserialize, Serialize};

use super::tensor::HostTensor;

/// The shard size of `[checkpoint] shard_size = "auto"`: small enough that
/// a 1 GiB checkpoint is three files of a third each (three streams to
/// hash), large enough that a 96 GB one is under 200 files.
pub const DEFAULT_SHARD_BYTES: u64 = 512 << 20;

const INDEX_SUFFIX: &str = ".safetensors.index.json";
const SHARD_SUFFIX: &str = ".safetensors";

/// The stems that may be sharded: the file `model.safetensors` becomes
/// `model-….safetensors`.
pub const SHARDED_STEMS: [&str; 2] = ["model", "optimizer"];

/// `model-00002-of-00004.safetensors`: shard `k` (from 1) of `n`.
pub fn shard_name(stem: &str, k: usize, n: usize) -> String {
    format!("{stem}-{k:05}-of-{n:05}{SHARD_SUFFIX}")
}

/// The stem, shard number (from 1) and count of a shard's file name.
pub fn parse_shard_name(name: &str) -> Option<(&str, usize, usize)> {
    let middle = name.strip_suffix(SHARD_SUFFIX)?;
    let (head, n) = middle.rsplit_once("-of-")?;
    let (stem, k) = head.rsplit_once('-')?;
    let number = |s: &str| (s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse().ok()).flatten();
    let (k, n): (usize, usize) = (number(k)?, number(n)?);
    (SHARDED_STEMS.contains(&stem) && (1..=n).contains(&k)).then_some((stem, k, n))
}

/// `model.safetensors.index.json`.
pub fn index_name(stem: &str) -> String {
    format!("{stem}{INDEX_SUFFIX}")
}

/// The stem of an index file's name.
pub fn parse_index_name(name: &str) -> Option<&str> {
    name.strip_suffix(INDEX_SUFFIX).filter(|stem| SHARDED_STEMS.contains(stem))
}

/// How the files of one stem are laid out, from the names a manifest
/// lists: `Ok(None)` as the single `<stem>.safetensors`, `Ok(Some(n))` as
/// `n` shards with their index; an error saying what is missing or mixed.
/// `Ok(None)` also when nothing of the stem is listed (the caller decides
/// whether that is allowed).
pub fn shard_layout<'a>(stem: &str, names: impl IntoIterator<Item = &'a str>) -> Result<Option<usize>, String> {
    let single = format!("{stem}{SHARD_SUFFIX}");
    let index = index_name(stem);
    let (mut whole, mut has_index) = (false, false);
    let mut shards = BTreeMap::<usize, Vec<usize>>::new();
    for name in names {
        if name == single {
            whole = true;
        } else if name == index {
            has_index = true;
        } else if let Some((s, k, n)) = parse_shard_name(name)
            && s == stem
        {
            shards.entry(n).or_default().push(k);
        }
    }
    if whole && (has_index || !shards.is_empty()) {
        return Err(format!("lists both `{single}` and shards of it"));
    }
    if shards.len() > 1 {
        let counts: Vec<String> = shards.keys().map(ToString::to_string).collect();
        return Err(format!("lists `{stem}` shards of several counts ({})", counts.join(", ")));
    }
    match (has_index, shards.pop_first()) {
        (false, None) => Ok(None),
        (true, None) => Err(format!("lists `{index}` but no shard of `{stem}`")),
        (false, Some(_)) => Err(format!("lists shards of `{stem}` but not their index `{index}`")),
        (true, Some((n, mut ks))) => {
            ks.sort_unstable();
            match (1..=n).find(|k| ks.binary_search(k).is_err()) {
                Some(k) => Err(format!("does not list `{}` (shard {k} of {n})", shard_name(stem, k, n))),
                None => Ok(Some(n)),
            }
        }
    }
}

/// Splits tensors of `sizes` bytes (in name order) into consecutive shards
/// of at most `max_bytes` each (a larger tensor alone in its own), and into
/// at least `min_shards` where there are that many tensors: the shard limit
/// is lowered to the even share. Returns each shard's range of tensors; one
/// range (or none, for no tensors) means no sharding.
pub fn plan(sizes: &[u64], max_bytes: u64, min_shards: usize) -> Vec<Range<usize>> {
    let total: u64 = sizes.iter().sum();
    let share = total.div_ceil(min_shards.max(1) as u64).max(1);
    let limit = max_bytes.max(1).min(share);
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0u64);
    for (i, &size) in sizes.iter().enumerate() {
        if i > start && bytes + size > limit {
            out.push(start..i);
            (start, bytes) = (i, 0);
        }
        bytes += size;
    }
    if start < sizes.len() {
        out.push(start..sizes.len());
    }
    out
}

/// Which rank of a world of `world` writes each shard of `sizes` bytes: the
/// shards in order, cut into `world` runs of about equal bytes (a shard
/// goes to the rank whose share holds its middle byte), so every rank's
/// share is contiguous and about `1/world` of the bytes.
pub fn assign(sizes: &[u64], world: usize) -> Vec<usize> {
    let world = world.max(1) as u128;
    let total: u128 = sizes.iter().map(|&s| s as u128).sum::<u128>().max(1);
    let mut start = 0u128;
    sizes
        .iter()
        .map(|&size| {
            let middle = start + size as u128 / 2;
            start += size as u128;
            ((middle * world / total).min(world - 1)) as usize
        })
        .collect()
}

/// `model.safetensors.index.json`, as Hugging Face writes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardIndex {
    pub metadata: IndexMetadata,
    /// Tensor name → the shard's file name.
    pub weight_map: BTreeMap<String, String>,
}

/// The index's `metadata`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexMetadata {
    /// Bytes of tensor data over every shard (headers excluded).
    pub total_size: u64,
    /// rekindle's marker (`"rekindle"`); other writers' indexes lack it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<String>,
}

impl ShardIndex {
    /// The index of `tensors` cut into `shards` (ranges of `tensors`) of `stem`.
    pub fn of(stem: &str, tensors: &[(&String, &HostTensor)], shards: &[Range<usize>]) -> ShardIndex {
        let mut weight_map = BTreeMap::new();
        for (k, range) in shards.iter().enumerate() {
            for (name, _) in &tensors[range.clone()] {
                weight_map.insert((*name).clone(), shard_name(stem, k + 1, shards.len()));
            }
        }
        let total_size = tensors.iter().map(|(_, t)| t.data.len() as u64).sum();
        ShardIndex { metadata: IndexMetadata { total_size, format: Some("rekindle".into()) }, weight_map }
    }

    /// Pretty JSON with a trailing newline (keys in alphabetical order).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = serde_json::to_vec_pretty(self).expect("index serialises");
        out.push(b'\n');
        out
    }

    /// Parses an index's bytes.
    pub fn parse(bytes: &[u8]) -> Result<ShardIndex, String> {
        serde_json::from_slice(bytes).map_err(|e| format!("not a shard index: {e}"))
    }

    /// Checks the index against what the shards hold (`held`: each shard's
    /// file name and its tensors' names and byte counts): every tensor in
    /// exactly one shard, the one the index names, and `total_size` their
    /// bytes. The error names the first tensor that does not fit.
    pub fn check(&self, held: &[(String, Vec<(String, u64)>)]) -> Result<(), String> {
        let mut seen = BTreeMap::<&str, &str>::new();
        let mut total = 0u64;
        for (file, tensors) in held {
            for (name, bytes) in tensors {
                if let Some(other) = seen.insert(name, file) {
                    return Err(format!("tensor `{name}` is in both `{other}` and `{file}`"));
                }
                match self.weight_map.get(name) {
                    Some(listed) if listed == file => {}
                    Some(listed) => {
                        return Err(format!("tensor `{name}` is in `{file}`, the index says `{listed}`"));
                    }
                    None => return Err(format!("tensor `{name}` of `{file}` is not in the index")),
                }
                total = total.saturating_add(*bytes);
            }
        }
        if let Some(name) = self.weight_map.keys().find(|n| !seen.contains_key(n.as_str())) {
            return Err(format!("the index lists `{name}`, which no shard holds"));
        }
        if total != self.metadata.total_size {
            return Err(format!(
                "the index's total_size is {}, the shards hold {total} bytes",
                self.metadata.total_size
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_names_round_trip_and_odd_names_are_no_shards() {
        assert_eq!(shard_name("model", 2, 4), "model-00002-of-00004.safetensors");
        assert_eq!(parse_shard_name("model-00002-of-00004.safetensors"), Some(("model", 2, 4)));
        assert_eq!(parse_shard_name("optimizer-00001-of-00001.safetensors"), Some(("optimizer", 1, 1)));
        for odd in [
            "model.safetensors",
            "model-00000-of-00004.safetensors",
            "model-00005-of-00004.safetensors",
            "model-1-of-4.safetensors",
            "weights-00001-of-00002.safetensors",
            "model-00001-of-00002.json",
            "optimizer.rank-00001-of-00002.safetensors",
        ] {
            assert_eq!(parse_shard_name(odd), None, "{odd}");
        }
        assert_eq!(index_name("model"), "model.safetensors.index.json");
        assert_eq!(parse_index_name("optimizer.safetensors.index.json"), Some("optimizer"));
        assert_eq!(parse_index_name("state.safetensors.index.json"), None);
    }

    #[test]
    fn a_stem_is_one_file_or_every_shard_of_one_count_with_its_index() {
        let layout = |names: &[&str]| shard_layout("model", names.iter().copied());
        let index = "model.safetensors.index.json";
        type Case<'a> = (Vec<&'a str>, Result<Option<usize>, &'a str>);
        let cases: Vec<Case> = vec![
            (vec!["model.safetensors", "state.json"], Ok(None)),
            (vec!["state.json"], Ok(None)),
            (vec![index, "model-00002-of-00002.safetensors", "model-00001-of-00002.safetensors"], Ok(Some(2))),
            (vec![index, "model-00001-of-00003.safetensors", "model-00003-of-00003.safetensors"], Err("shard 2 of 3")),
            (vec!["model-00001-of-00001.safetensors"], Err("not their index")),
            (vec![index], Err("no shard")),
            (vec!["model.safetensors", index, "model-00001-of-00001.safetensors"], Err("both")),
            (
                vec![index, "model-00001-of-00001.safetensors", "model-00001-of-00002.safetensors"],
                Err("several counts (1, 2)"),
            ),
            // Another stem's shards are not this one's business.
            (vec!["model.safetensors", "optimizer-00001-of-00002.safetensors"], Ok(None)),
        ];
        for (names, expected) in cases {
            match (layout(&names), expected) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{names:?}"),
                (Err(got), Err(want)) => assert!(got.contains(want), "{names:?}: {got}"),
                (got, want) => panic!("{names:?}: {got:?}, expected {want:?}"),
            }
        }
    }

    #[test]
    fn shards_hold_consecutive_tensors_up_to_the_limit_and_at_least_the_minimum() {
        // (sizes, limit, minimum shards, each shard's (start, end) tensors)
        type Case = (Vec<u64>, u64, usize, Vec<(usize, usize)>);
        let cases: Vec<Case> = vec![
            (vec![], 10, 1, vec![]),
            (vec![4, 4, 4], 100, 1, vec![(0, 3)]),
            (vec![4, 4, 4], 8, 1, vec![(0, 2), (2, 3)]),
            (vec![4, 4, 4], 4, 1, vec![(0, 1), (1, 2), (2, 3)]),
            // A tensor bigger than the limit is alone in its shard.
            (vec![1, 20, 1, 1], 5, 1, vec![(0, 1), (1, 2), (2, 4)]),
            (vec![20], 5, 1, vec![(0, 1)]),
            // Two ranks: at least two shards, each about half.
            (vec![4, 4, 4, 4], 100, 2, vec![(0, 2), (2, 4)]),
            (vec![3, 3, 3], 100, 2, vec![(0, 1), (1, 2), (2, 3)]),
            // Fewer tensors than the minimum: one each.
            (vec![7], 100, 4, vec![(0, 1)]),
            (vec![0, 0, 5], 100, 1, vec![(0, 3)]),
        ];
        for (sizes, max, min, expected) in cases {
            let got: Vec<(usize, usize)> = plan(&sizes, max, min).into_iter().map(|r| (r.start, r.end)).collect();
            assert_eq!(got, expected, "{sizes:?} max {max} min {min}");
        }
    }

    #[test]
    fn every_rank_gets_a_contiguous_share_of_about_its_bytes() {
        let cases: Vec<(Vec<u64>, usize, Vec<usize>)> = vec![
            (vec![5, 5], 2, vec![0, 1]),
            (vec![5, 5, 5, 5], 2, vec![0, 0, 1, 1]),
            (vec![5, 5, 5], 2, vec![0, 0, 1]),
            (vec![10], 3, vec![1]),
            (vec![1, 1, 1, 1, 1, 1], 3, vec![0, 0, 1, 1, 2, 2]),
            (vec![9, 1, 1, 1], 2, vec![0, 1, 1, 1]),
            (vec![4, 4], 1, vec![0, 0]),
            (vec![0, 0], 2, vec![0, 0]),
        ];
        for (sizes, world, expected) in cases {
            assert_eq!(assign(&sizes, world), expected, "{sizes:?} over {world}");
        }
    }

    #[test]
    fn an_index_checks_that_every_tensor_is_where_it_says() {
        let a = HostTensor::from_f32(vec![2], &[1.0, 2.0]);
        let b = HostTensor::from_f32(vec![1], &[3.0]);
        let (na, nb) = ("a".to_string(), "b".to_string());
        let index = ShardIndex::of("model", &[(&na, &a), (&nb, &b)], &[0..1, 1..2]);
        assert_eq!(index.weight_map["b"], "model-00002-of-00002.safetensors");
        assert_eq!(index.metadata.total_size, 12);
        assert_eq!(ShardIndex::parse(&index.to_bytes()), Ok(index.clone()));
        let held = |a_in: &str| {
            vec![
                (a_in.to_string(), vec![("a".to_string(), 8)]),
                ("model-00002-of-00002.safetensors".to_string(), vec![("b".to_string(), 4)]),
            ]
        };
        assert_eq!(index.check(&held("model-00001-of-00002.safetensors")), Ok(()));
        let moved = index.check(&held("model-00002-of-00002.safetensors")).unwrap_err();
        assert!(moved.contains("tensor `a` is in `model-00002-of-00002.safetensors`, the index says"), "{moved}");
        let mut twice = held("model-00001-of-00002.safetensors");
        twice[1].1.push(("a".to_string(), 8));
        assert!(index.check(&twice).unwrap_err().contains("in both"));
        let mut missing = held("model-00001-of-00002.safetensors");
        missing[1].1.clear();
        assert!(index.check(&missing).unwrap_err().contains("`b`, which no shard holds"));
        let mut wrong = index.clone();
        wrong.metadata.total_size = 11;
        assert!(wrong.check(&held("model-00001-of-00002.safetensors")).unwrap_err().contains("total_size"));
        assert!(ShardIndex::parse(b"[1]").unwrap_err().contains("not a shard index"));
    }
}
