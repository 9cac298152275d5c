//! How the gradients of a step are combined: the replicas of this process
//! ([`average_replicas`]) and the ranks of a world ([`average_across_ranks`],
//! [`gather_losses`], ZeRO-1's [`all_gather_f32`]), each in a fixed order so
//! that the result is bit-identical whoever finished first.

use super::*;

/// The all-reduce: the mean of the replicas' gradients, summed in replica
/// order (so the result does not depend on which replica finished first).
/// One replica is returned as it is, bit for bit.
pub(super) fn average_replicas(
    mut replicas: Vec<BTreeMap<String, Tensor>>,
) -> candle_core::Result<BTreeMap<String, Tensor>> {
    if replicas.len() <= 1 {
        return Ok(replicas.pop().unwrap_or_default());
    }
    let n = replicas.len();
    let mut iter = replicas.into_iter();
    let mut total = iter.next().unwrap_or_default();
    for replica in iter {
        for (name, g) in replica {
            let sum = match total.remove(&name) {
                Some(t) => (t + g)?,
                None => g,
            };
            total.insert(name, sum);
        }
    }
    for g in total.values_mut() {
        *g = g.affine(1.0 / n as f64, 0.0)?;
    }
    Ok(total)
}

/// Every rank's `mine`, end to end in rank order (ZeRO-1's all-gather).
pub(super) fn all_gather_f32(world: &dyn Collective, mine: Vec<f32>) -> Result<Vec<f32>, String> {
    let bytes: Vec<u8> = mine.iter().flat_map(|x| x.to_le_bytes()).collect();
    let all = world.all_gather_bytes(&bytes).map_err(|e| e.to_string())?;
    let mut whole = Vec::with_capacity(all.iter().map(Vec::len).sum::<usize>() / 4);
    for (rank, part) in all.iter().enumerate() {
        if part.len() % 4 != 0 {
            return Err(format!("rank {rank} sent {} bytes, not whole f32 values", part.len()));
        }
        whole.extend(part.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])));
    }
    Ok(whole)
}

/// What every rank told of its part of a step.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Gathered {
    /// Every rank's micro-batch losses, in rank order (so in step order).
    pub losses: Vec<f64>,
    /// The world's token count.
    pub tokens: Option<u64>,
    /// Each rank's seconds of its own work, in rank order.
    pub compute_s: Vec<f64>,
}

/// Every rank's micro-batch losses, tokens and `compute_s` (its own
/// seconds of work in the step, which rides along for 8 bytes instead of a
/// collective of its own).
pub(super) fn gather_losses(
    world: &dyn Collective,
    step: u64,
    mine: &[f64],
    tokens: Option<u64>,
    compute_s: f64,
) -> Result<Gathered, TrainError> {
    let agree = |e: crate::distributed::DistributedError| TrainError::Collective {
        step,
        during: "the losses",
        message: e.to_string(),
    };
    // tokens (u64::MAX: none), compute_s, then the losses.
    let mut bytes: Vec<u8> = tokens.map_or(u64::MAX, |t| t).to_le_bytes().to_vec();
    bytes.extend(compute_s.to_le_bytes());
    bytes.extend(mine.iter().flat_map(|l| l.to_le_bytes()));
    let all = world.all_gather_bytes(&bytes).map_err(agree)?;
    let mut losses = Vec::with_capacity(mine.len() * all.len());
    let mut total_tokens: Option<u64> = None;
    let mut all_compute = Vec::with_capacity(all.len());
    for (rank, b) in all.iter().enumerate() {
        if b.len() < 16 || !b.len().is_multiple_of(8) {
            return Err(TrainError::Collective {
                step,
                during: "the losses",
                message: format!("rank {rank} sent {} bytes", b.len()),
            });
        }
        let words: Vec<[u8; 8]> = b.chunks_exact(8).map(|c| c.try_into().unwrap_or([0; 8])).collect();
        let t = u64::from_le_bytes(words[0]);
        if t != u64::MAX {
            *total_tokens.get_or_insert(0) += t;
        }
        all_compute.push(f64::from_le_bytes(words[1]));
        losses.extend(words[2..].iter().map(|w| f64::from_le_bytes(*w)));
    }
    Ok(Gathered { losses, tokens: total_tokens, compute_s: all_compute })
}

/// The average over ranks of each rank's replica gradient: the rank-order
/// sum (`((g₀ + g₁) + g₂) + …`, f32, as [`average_replicas`] adds one
/// process's replicas) scaled by `1 / ranks`, identical on every rank.
pub(super) fn average_across_ranks(
    world: &dyn Collective,
    step: u64,
    local: BTreeMap<String, Tensor>,
    device: &Device,
) -> Result<BTreeMap<String, Tensor>, TrainError> {
    let fail = |during: &'static str| {
        move |e: candle_core::Error| TrainError::Step { step, during, message: candle_message(&e) }
    };
    let agree = |e: crate::distributed::DistributedError| TrainError::Collective {
        step,
        during: "the gradient sum",
        message: e.to_string(),
    };
    // The same tensors, in the same order, on every rank: compare names
    // and shapes first, or the sum would add unrelated numbers.
    let layout: Vec<(String, Vec<usize>)> = local.iter().map(|(n, t)| (n.clone(), t.dims().to_vec())).collect();
    let described = serde_json::to_vec(&layout).unwrap_or_default();
    for (rank, theirs) in world.all_gather_bytes(&described).map_err(agree)?.iter().enumerate() {
        if *theirs != described {
            return Err(TrainError::Collective {
                step,
                during: "the gradient sum",
                message: format!("rank {rank} has gradients of other tensors or shapes than rank {}", world.rank()),
            });
        }
    }
    let mut flat: Vec<f32> = Vec::with_capacity(local.values().map(Tensor::elem_count).sum());
    for t in local.values() {
        flat.extend(t.flatten_all().and_then(|t| t.to_vec1::<f32>()).map_err(fail("reading gradients"))?);
    }
    let summed = world.sum_in_rank_order(&flat).map_err(agree)?;
    let n = world.size() as f64;
    let mut out = BTreeMap::new();
    let mut at = 0;
    for (name, shape) in layout {
        let len: usize = shape.iter().product();
        let t = Tensor::from_slice(&summed[at..at + len], shape.as_slice(), device)
            .and_then(|t| t.affine(1.0 / n, 0.0))
            .map_err(fail("averaging gradients across ranks"))?;
        at += len;
        out.insert(name, t);
    }
    Ok(out)
}
