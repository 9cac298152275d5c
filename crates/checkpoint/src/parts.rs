//! Optimizer state written in parts, one per rank (ZeRO-1: each rank of a
//! data-parallel run holds the moments of one slice of the parameters, and
//! writes that slice itself). A checkpoint then holds, instead of
//! `optimizer.safetensors`, one `optimizer.rank-<r>-of-<n>.safetensors` per
//! rank `r` of a world of `n`. Each part holds, for every parameter its
//! rank's slice touches, the flattened piece of both moments under the
//! moment's own name (`exp_avg.<param>`, 1-D). The slices are contiguous
//! and in rank order over the parameters flattened end to end in name
//! order, so a moment is its pieces joined in rank order: loading
//! reassembles the whole moments ([`assemble`]), and a resume at any world
//! size (or unsharded) re-slices them as it would an unsharded checkpoint.
//!
//! The manifest names every part: a checkpoint counts only with the full
//! set of one world size ([`optimizer_layout`]), each part hashed by the
//! rank that wrote it and listed by rank 0, which commits.

use std::collections::BTreeMap;

use super::layout::OPTIMIZER_FILE;
use super::tensor::{DType, HostTensor, TensorSet};

const PART_PREFIX: &str = "optimizer.rank-";
const PART_SUFFIX: &str = ".safetensors";

/// The file of rank `rank`'s part in a world of `world` ranks:
/// `optimizer.rank-00001-of-00002.safetensors`.
pub fn optimizer_part_name(rank: usize, world: usize) -> String {
    format!("{PART_PREFIX}{rank:05}-of-{world:05}{PART_SUFFIX}")
}

/// The rank and world size of a part's file name.
pub fn parse_optimizer_part_name(name: &str) -> Option<(usize, usize)> {
    let middle = name.strip_prefix(PART_PREFIX)?.strip_suffix(PART_SUFFIX)?;
    let (rank, world) = middle.split_once("-of-")?;
    let number = |s: &str| (s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse().ok()).flatten();
    let (rank, world) = (number(rank)?, number(world)?);
    (rank < world).then_some((rank, world))
}

/// How the optimizer state of a checkpoint whose manifest lists `names` is
/// stored: `Ok(None)` as one `optimizer.safetensors`, `Ok(Some(n))` as the
/// parts of a world of `n`; an error saying what is missing or mixed.
pub fn optimizer_layout<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<Option<usize>, String> {
    let mut whole = false;
    let mut parts = BTreeMap::<usize, Vec<usize>>::new();
    for name in names {
        if name == OPTIMIZER_FILE {
            whole = true;
        } else if let Some((rank, world)) = parse_optimizer_part_name(name) {
            parts.entry(world).or_default().push(rank);
        }
    }
    match (whole, parts.len()) {
        (true, 0) => Ok(None),
        (false, 0) => Err(format!("does not list `{OPTIMIZER_FILE}` or the optimizer parts of every rank")),
        (true, _) => Err(format!("lists both `{OPTIMIZER_FILE}` and optimizer parts")),
        (false, 1) => {
            let (world, mut ranks) = parts.pop_first().expect("one world size");
            ranks.sort_unstable();
            match (0..world).find(|r| ranks.binary_search(r).is_err()) {
                Some(r) => {
                    Err(format!("does not list `{}` (rank {r}'s optimizer part)", optimizer_part_name(r, world)))
                }
                None => Ok(Some(world)),
            }
        }
        (false, _) => {
            let worlds: Vec<String> = parts.keys().map(ToString::to_string).collect();
            Err(format!("lists optimizer parts of several world sizes ({})", worlds.join(", ")))
        }
    }
}

/// The whole moments from the parts of a world (in rank order): each
/// moment of `model`'s parameters is its pieces joined in rank order, with
/// its parameter's shape. An error names the tensor that does not fit
/// (pieces that do not add up to the parameter, mixed dtypes, a tensor
/// that is no moment of a parameter).
pub fn assemble(model: &TensorSet, parts: &[TensorSet]) -> Result<TensorSet, String> {
    for (rank, part) in parts.iter().enumerate() {
        if let Some(name) = part.keys().find(|k| moment_param(k).is_none_or(|p| !model.contains_key(p))) {
            return Err(format!("rank {rank}'s part holds `{name}`, which is no moment of a parameter"));
        }
    }
    let mut whole = TensorSet::new();
    for (param, value) in model {
        for name in [format!("exp_avg.{param}"), format!("exp_avg_sq.{param}")] {
            let pieces: Vec<&HostTensor> = parts.iter().filter_map(|p| p.get(&name)).collect();
            let elements: usize = value.shape.iter().product();
            let Some(first) = pieces.first() else {
                if elements == 0 {
                    // No slice covers a parameter without values.
                    whole.insert(
                        name,
                        HostTensor::new(DType::F32, value.shape.clone(), Vec::new()).map_err(|e| e.to_string())?,
                    );
                    continue;
                }
                return Err(format!("no rank's part holds `{name}`"));
            };
            if let Some(other) = pieces.iter().find(|p| p.dtype != first.dtype) {
                return Err(format!("the pieces of `{name}` mix {:?} and {:?}", first.dtype, other.dtype));
            }
            let bytes: usize = pieces.iter().map(|p| p.data.len()).sum();
            if bytes != elements * first.dtype.size() {
                return Err(format!(
                    "the pieces of `{name}` hold {} values, its parameter {elements}",
                    bytes / first.dtype.size()
                ));
            }
            let mut data = Vec::with_capacity(bytes);
            for piece in &pieces {
                data.extend_from_slice(&piece.data);
            }
            let tensor = HostTensor::new(first.dtype, value.shape.clone(), data).map_err(|e| e.to_string())?;
            whole.insert(name, tensor);
        }
    }
    Ok(whole)
}

/// The parameter whose moment `name` is.
fn moment_param(name: &str) -> Option<&str> {
    name.strip_prefix("exp_avg_sq.").or_else(|| name.strip_prefix("exp_avg."))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_names_round_trip_and_odd_names_are_no_parts() {
        assert_eq!(optimizer_part_name(1, 2), "optimizer.rank-00001-of-00002.safetensors");
        assert_eq!(parse_optimizer_part_name(&optimizer_part_name(3, 4)), Some((3, 4)));
        for odd in [
            "optimizer.safetensors",
            "optimizer.rank-00002-of-00002.safetensors",
            "optimizer.rank-1-of-2.safetensors",
            "optimizer.rank-00001-of-00002.json",
            "optimizer.rank-0000a-of-00002.safetensors",
        ] {
            assert_eq!(parse_optimizer_part_name(odd), None, "{odd}");
        }
    }

    #[test]
    fn a_checkpoint_holds_the_whole_optimizer_or_every_part_of_one_world() {
        let names = |world: usize, ranks: &[usize]| -> Vec<String> {
            ranks.iter().map(|r| optimizer_part_name(*r, world)).collect()
        };
        let layout = |names: &[String]| optimizer_layout(names.iter().map(String::as_str));
        assert_eq!(layout(&[OPTIMIZER_FILE.to_string()]), Ok(None));
        assert_eq!(layout(&names(3, &[2, 0, 1])), Ok(Some(3)));
        let missing = layout(&names(3, &[0, 2])).unwrap_err();
        assert!(missing.contains("optimizer.rank-00001-of-00003.safetensors"), "{missing}");
        assert!(layout(&[]).unwrap_err().contains(OPTIMIZER_FILE));
        let mut mixed = names(2, &[0, 1]);
        mixed.extend(names(3, &[0, 1, 2]));
        assert!(layout(&mixed).unwrap_err().contains("several world sizes"));
        let mut both = names(1, &[0]);
        both.push(OPTIMIZER_FILE.into());
        assert!(layout(&both).unwrap_err().contains("both"));
    }

    fn f32s(shape: Vec<usize>, values: &[f32]) -> HostTensor {
        HostTensor::from_f32(shape, values)
    }

    #[test]
    fn the_pieces_joined_in_rank_order_are_the_whole_moments() {
        // Parameters a (2×2) and b (3), flattened a0..a3 b0..b2, cut for two
        // ranks as 4 + 3 and for three as 3 + 2 + 2.
        let model =
            TensorSet::from([("a".into(), f32s(vec![2, 2], &[0.0; 4])), ("b".into(), f32s(vec![3], &[0.0; 3]))]);
        let m: Vec<f32> = (0..7).map(|i| i as f32).collect();
        let v: Vec<f32> = (0..7).map(|i| 10.0 + i as f32).collect();
        let part = |pieces: &[(&str, usize, usize)]| -> TensorSet {
            let mut set = TensorSet::new();
            for (param, lo, hi) in pieces {
                let at = if *param == "a" { 0 } else { 4 };
                set.insert(format!("exp_avg.{param}"), f32s(vec![hi - lo], &m[at + lo..at + hi]));
                set.insert(format!("exp_avg_sq.{param}"), f32s(vec![hi - lo], &v[at + lo..at + hi]));
            }
            set
        };
        let whole = TensorSet::from([
            ("exp_avg.a".into(), f32s(vec![2, 2], &m[..4])),
            ("exp_avg_sq.a".into(), f32s(vec![2, 2], &v[..4])),
            ("exp_avg.b".into(), f32s(vec![3], &m[4..])),
            ("exp_avg_sq.b".into(), f32s(vec![3], &v[4..])),
        ]);
        let two = [part(&[("a", 0, 4)]), part(&[("b", 0, 3)])];
        assert_eq!(assemble(&model, &two).unwrap(), whole);
        let three = [part(&[("a", 0, 3)]), part(&[("a", 3, 4), ("b", 0, 1)]), part(&[("b", 1, 3)])];
        assert_eq!(assemble(&model, &three).unwrap(), whole);

        let short = [part(&[("a", 0, 3)]), part(&[("b", 0, 3)])];
        assert!(assemble(&model, &short).unwrap_err().contains("`exp_avg.a` hold 3 values, its parameter 4"));
        let mut stray = two.clone();
        stray[1].insert("exp_avg.c".into(), f32s(vec![1], &[0.0]));
        assert!(assemble(&model, &stray).unwrap_err().contains("`exp_avg.c`"));
        assert!(assemble(&model, &two[..1]).unwrap_err().contains("no rank's part holds `exp_avg.b`"));
    }
}
