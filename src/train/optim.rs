//! rekindle's AdamW: Adam with decoupled weight decay (Loshchilov & Hutter),
//! with its state in the open.
//!
//! candle's `AdamW` keeps its moments and step private, so it cannot be
//! checkpointed. This one stores the first and second moments per parameter
//! *name* (a `BTreeMap`, so the update order and the checkpoint layout are
//! fixed) plus the step count used for bias correction, and converts them to
//! and from the checkpoint's host tensors. Weight decay applies to every
//! parameter, as in candle's `AdamW`.
//!
//! ZeRO-1 ([`AdamW::shard_to`]): in a data-parallel run each rank may keep
//! the moments of only its slice of the parameters, flattened and laid end
//! to end in name order (the slice `distributed::chunk_bounds` gives the
//! rank). Every rank holds the whole summed gradient, updates its slice
//! with the same element-wise arithmetic as the whole tensor, and the
//! updated slices are all-gathered into every rank's parameters
//! ([`AdamW::step_sharded`]), so the parameters are bit for bit those of
//! the unsharded optimizer. At a checkpoint each rank writes its pieces
//! ([`AdamW::state_shared`] without a gather: its part, `checkpoint::parts`),
//! and loading joins them into the whole state, so what a checkpoint holds
//! does not depend on sharding or world size ([`AdamW::state_gathered`]
//! gathers the whole state in memory, for every rank at once).

use std::collections::BTreeMap;

use candle_core::{DType, Device, Tensor};

use super::error::{TrainError, candle_message};
use super::params::{Params, check_host, from_host, to_host_reusing, to_host_shared};
use crate::checkpoint::{HostTensor, TensorSet};
use crate::config::OptimizerSection;

/// AdamW hyper-parameters other than the learning rate (which the schedule
/// supplies per step).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWConfig {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

impl AdamWConfig {
    /// The hyper-parameters of `[optimizer]`.
    pub fn from_config(opt: &OptimizerSection) -> Self {
        AdamWConfig { beta1: opt.beta1, beta2: opt.beta2, eps: opt.eps, weight_decay: opt.weight_decay }
    }
}

struct Moments {
    /// Exponential moving average of the gradient.
    m: Tensor,
    /// Exponential moving average of the squared gradient.
    v: Tensor,
}

/// AdamW over named parameters; state keyed by parameter name.
pub struct AdamW {
    hyper: AdamWConfig,
    /// Whole moments per parameter; sharded: 1-D moments of each
    /// parameter's piece inside this rank's slice.
    moments: BTreeMap<String, Moments>,
    step: u64,
    shard: Option<Sharded>,
    /// Each parameter's value as the last update computed it (CPU only),
    /// the tensor its `Var` was set from: nothing writes into it, so a
    /// snapshot can take it instead of copying the `Var`, which the next
    /// step overwrites. Dropped when the next step begins
    /// ([`release_values`](Self::release_values)) and whenever the
    /// parameters change otherwise (state loaded).
    values: BTreeMap<String, Tensor>,
}

/// This rank's slice `[start, end)` of the parameters flattened end to end
/// in name order (ZeRO-1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardRange {
    pub start: usize,
    pub end: usize,
}

/// The piece `[lo, lo + len)` of one parameter's flattened elements that
/// lies inside a [`ShardRange`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    pub lo: usize,
    pub len: usize,
}

struct Sharded {
    range: ShardRange,
    pieces: BTreeMap<String, Piece>,
}

/// The pieces of the parameters (name → element count, in name order) that
/// lie inside `range`; parameters outside it have none.
pub fn pieces<'a>(sizes: impl IntoIterator<Item = (&'a String, usize)>, range: ShardRange) -> BTreeMap<String, Piece> {
    let mut at = 0;
    let mut out = BTreeMap::new();
    for (name, n) in sizes {
        let (lo, hi) = (range.start.max(at), range.end.min(at + n));
        if lo < hi {
            out.insert(name.clone(), Piece { lo: lo - at, len: hi - lo });
        }
        at += n;
    }
    out
}

/// An all-gather of `f32`s in rank order (every rank's slice, end to end).
pub type GatherF32<'a> = &'a dyn Fn(Vec<f32>) -> Result<Vec<f32>, String>;

/// Checkpoint names of a parameter's two moment tensors.
pub fn moment_names(param: &str) -> (String, String) {
    (format!("exp_avg.{param}"), format!("exp_avg_sq.{param}"))
}

/// What a checkpoint's snapshot does on the training thread: the host
/// tensors of the parameters and the optimizer's moments, and its step
/// count. Tensors that nothing writes into any more are shared, not copied
/// (`checkpoint::TensorBytes`): the parameter values the last update
/// computed (the optimizer keeps them until the next step begins) and the
/// moments (each step replaces them), in CPU memory. Anything else is
/// copied now into `reuse`'s buffers: a parameter with no update kept (step
/// 0, right after a resume, after a skipped step) from its `Var`, which the
/// next step sets in place; tensors on a GPU. `gather` is the all-gather of
/// a sharded optimizer's world, whose moments are gathered now.
pub fn snapshot_tensors(
    params: &Params,
    optimizer: &AdamW,
    gather: Option<GatherF32<'_>>,
    reuse: Option<(TensorSet, TensorSet)>,
) -> Result<(TensorSet, TensorSet, u64), TrainError> {
    let (mut reuse_model, mut reuse_optimizer) = reuse.unwrap_or_default();
    let mut model = TensorSet::new();
    for (name, var) in params {
        // SAFETY: a kept value is the tensor the last update set the `Var`
        // from; nothing writes into it (the next step computes new ones).
        let shared = match optimizer.values.get(name) {
            Some(value) => unsafe { to_host_shared(name, value)? },
            None => None,
        };
        let host = match shared {
            Some(host) => host,
            None => to_host_reusing(name, var.as_tensor(), reuse_model.remove(name))?,
        };
        model.insert(name.clone(), host);
    }
    let (moments, optimizer_step) = optimizer.state_shared(params, gather, &mut reuse_optimizer)?;
    Ok((model, moments, optimizer_step))
}

impl AdamW {
    /// An optimizer for `params` with zero moments and step 0.
    pub fn new(params: &Params, hyper: AdamWConfig) -> Result<Self, TrainError> {
        let mut moments = BTreeMap::new();
        for (name, var) in params {
            let zeros = || {
                Tensor::zeros(var.shape(), DType::F32, var.device())
                    .map_err(|e| TrainError::Tensor { name: name.clone(), message: candle_message(&e) })
            };
            moments.insert(name.clone(), Moments { m: zeros()?, v: zeros()? });
        }
        Ok(AdamW { hyper, moments, step: 0, shard: None, values: BTreeMap::new() })
    }

    /// The slice this optimizer keeps the moments of (`None`: all of them).
    pub fn shard_range(&self) -> Option<ShardRange> {
        self.shard.as_ref().map(|s| s.range)
    }

    /// Keeps only the moments of `range` of the flattened `params` (ZeRO-1):
    /// the rest are dropped. An optimizer already sharded is first
    /// refused: re-slicing goes through the whole state (a checkpoint).
    pub fn shard_to(&mut self, params: &Params, range: ShardRange) -> Result<(), TrainError> {
        if self.shard.is_some() {
            return Err(TrainError::state("optimizer", "is already sharded; restore a whole state to re-slice it"));
        }
        let total: usize = params.values().map(|v| v.elem_count()).sum();
        if range.start > range.end || range.end > total {
            return Err(TrainError::state(
                "optimizer",
                format!("shard {}..{} does not fit {total} parameters", range.start, range.end),
            ));
        }
        let pieces = pieces(params.iter().map(|(n, v)| (n, v.elem_count())), range);
        let mut moments = BTreeMap::new();
        for (name, piece) in &pieces {
            let state = &self.moments[name];
            let cut = |t: &Tensor| {
                t.flatten_all()
                    .and_then(|f| f.narrow(0, piece.lo, piece.len))
                    .and_then(|f| f.contiguous())
                    .map_err(|e| TrainError::Tensor { name: name.clone(), message: candle_message(&e) })
            };
            moments.insert(name.clone(), Moments { m: cut(&state.m)?, v: cut(&state.v)? });
        }
        self.moments = moments;
        self.shard = Some(Sharded { range, pieces });
        Ok(())
    }

    /// [`step`](Self::step) of a sharded optimizer: updates this rank's
    /// slice with the same element-wise arithmetic, then `gather` (an
    /// all-gather over the ranks) returns every rank's updated slice, end to
    /// end, and every parameter is set from it. Bit for bit the unsharded
    /// update, whatever the world size.
    pub fn step_sharded(
        &mut self,
        params: &Params,
        grads: &BTreeMap<String, Tensor>,
        lr: f64,
        gather: GatherF32<'_>,
    ) -> candle_core::Result<()> {
        let Some(shard) = &self.shard else { candle_core::bail!("step_sharded on an optimizer that is not sharded") };
        let AdamWConfig { beta1, beta2, eps, weight_decay } = self.hyper;
        let t = (self.step + 1) as f64;
        let correction1 = 1.0 - beta1.powf(t);
        let correction2 = 1.0 - beta2.powf(t);
        let mut mine = Vec::with_capacity(shard.range.end - shard.range.start);
        let mut updated = Vec::new();
        for (name, piece) in &shard.pieces {
            let var = &params[name];
            let flat = var.as_tensor().flatten_all()?.narrow(0, piece.lo, piece.len)?;
            let Some(grad) = grads.get(name) else {
                mine.extend(flat.to_dtype(DType::F32)?.to_vec1::<f32>()?);
                continue;
            };
            let Some(state) = self.moments.get(name) else {
                candle_core::bail!("optimizer has no state for parameter `{name}`")
            };
            let grad = grad.to_dtype(DType::F32)?.flatten_all()?.narrow(0, piece.lo, piece.len)?;
            let m = (state.m.affine(beta1, 0.0)? + grad.affine(1.0 - beta1, 0.0)?)?;
            let v = (state.v.affine(beta2, 0.0)? + grad.sqr()?.affine(1.0 - beta2, 0.0)?)?;
            let m_hat = m.affine(1.0 / correction1, 0.0)?;
            let v_hat = v.affine(1.0 / correction2, 0.0)?;
            let direction = (m_hat / v_hat.sqrt()?.affine(1.0, eps)?)?;
            let theta = flat.affine(1.0 - lr * weight_decay, 0.0)?;
            let theta = (theta - direction.affine(lr, 0.0)?)?;
            mine.extend(theta.to_dtype(DType::F32)?.to_vec1::<f32>()?);
            updated.push((name.clone(), m, v));
        }
        let whole = gather(mine).map_err(candle_core::Error::Msg)?;
        let total: usize = params.values().map(|v| v.elem_count()).sum();
        if whole.len() != total {
            candle_core::bail!("the ranks' slices hold {} values, the parameters {total}", whole.len());
        }
        // Apply only once everything is computed and gathered.
        let mut values = Vec::with_capacity(params.len());
        let mut at = 0;
        for (name, var) in params {
            let n = var.elem_count();
            let value = Tensor::from_slice(&whole[at..at + n], var.shape(), var.device())?.to_dtype(var.dtype())?;
            values.push((name, value));
            at += n;
        }
        self.values.clear();
        for (name, value) in values {
            params[name].set(&value)?;
            if value.device().is_cpu() {
                self.values.insert(name.clone(), value.detach());
            }
        }
        for (name, m, v) in updated {
            self.moments.insert(name, Moments { m, v });
        }
        self.step += 1;
        Ok(())
    }

    /// The whole state of a sharded optimizer, as [`state`](Self::state)
    /// gives it unsharded: `gather` all-gathers every rank's slice of the
    /// moments. Every rank must call it at the same time.
    pub fn state_gathered(&self, params: &Params, gather: GatherF32<'_>) -> Result<(TensorSet, u64), TrainError> {
        let Some(shard) = &self.shard else { return self.state() };
        let fail = |name: &str| {
            let name = name.to_string();
            move |e: candle_core::Error| TrainError::Tensor { name: name.clone(), message: candle_message(&e) }
        };
        let mut set = TensorSet::new();
        for first in [true, false] {
            let mut mine = Vec::with_capacity(shard.range.end - shard.range.start);
            for name in shard.pieces.keys() {
                let state = &self.moments[name];
                let t = if first { &state.m } else { &state.v };
                mine.extend(t.to_vec1::<f32>().map_err(fail(name))?);
            }
            let whole = gather(mine).map_err(|message| TrainError::Tensor { name: "optimizer".into(), message })?;
            let mut at = 0;
            for (name, var) in params {
                let n = var.elem_count();
                let Some(values) = whole.get(at..at + n) else {
                    return Err(TrainError::state("optimizer", "the ranks' slices do not cover the parameters"));
                };
                let (m_name, v_name) = moment_names(name);
                set.insert(if first { m_name } else { v_name }, HostTensor::from_f32(var.dims().to_vec(), values));
                at += n;
            }
        }
        Ok((set, self.step))
    }

    /// [`load_state`](Self::load_state) of a whole state into this
    /// optimizer, sharded or not: a sharded one keeps its slice of it.
    pub fn load_whole_state(
        &mut self,
        params: &Params,
        set: &TensorSet,
        step: u64,
        device: &Device,
    ) -> Result<(), TrainError> {
        let Some(range) = self.shard_range() else { return self.load_state(set, step, device) };
        let mut whole = AdamW::new(params, self.hyper)?;
        whole.load_state(set, step, device)?;
        whole.shard_to(params, range)?;
        *self = whole;
        Ok(())
    }

    /// Keeps a copy of each parameter's current value for snapshots, as an
    /// update leaves them: the state between two steps, without computing
    /// one (`rekindle bench checkpoint` measures a snapshot from there; an
    /// update of a large state holds several times its size at once).
    pub fn keep_values(&mut self, params: &Params) -> candle_core::Result<()> {
        self.values.clear();
        for (name, var) in params {
            if var.device().is_cpu() {
                self.values.insert(name.clone(), var.as_tensor().copy()?);
            }
        }
        Ok(())
    }

    /// Drops the parameter values the last update kept for snapshots: a
    /// step about to begin would otherwise hold them beside its own
    /// activations and updates. (A snapshot that took them keeps its own
    /// handles until its copies are made.)
    pub fn release_values(&mut self) {
        self.values.clear();
    }

    /// Updates applied so far (the `t` of the bias correction).
    pub fn step_count(&self) -> u64 {
        self.step
    }

    /// One update with learning rate `lr`. Parameters without a gradient in
    /// `grads` are left alone (their moments too).
    pub fn step(&mut self, params: &Params, grads: &BTreeMap<String, Tensor>, lr: f64) -> candle_core::Result<()> {
        let AdamWConfig { beta1, beta2, eps, weight_decay } = self.hyper;
        let t = (self.step + 1) as f64;
        // Bias corrections of the zero-initialised moments.
        let correction1 = 1.0 - beta1.powf(t);
        let correction2 = 1.0 - beta2.powf(t);
        let mut updated = Vec::new();
        for (name, var) in params {
            let Some(grad) = grads.get(name) else { continue };
            let Some(state) = self.moments.get(name) else {
                candle_core::bail!("optimizer has no state for parameter `{name}`")
            };
            let grad = grad.to_dtype(DType::F32)?;
            let m = (state.m.affine(beta1, 0.0)? + grad.affine(1.0 - beta1, 0.0)?)?;
            let v = (state.v.affine(beta2, 0.0)? + grad.sqr()?.affine(1.0 - beta2, 0.0)?)?;
            let m_hat = m.affine(1.0 / correction1, 0.0)?;
            let v_hat = v.affine(1.0 / correction2, 0.0)?;
            let direction = (m_hat / v_hat.sqrt()?.affine(1.0, eps)?)?;
            // Decoupled weight decay: shrink the weights, then take the Adam step.
            let theta = var.as_tensor().affine(1.0 - lr * weight_decay, 0.0)?;
            let theta = (theta - direction.affine(lr, 0.0)?)?;
            updated.push((name.clone(), theta, m, v));
        }
        // Apply only once every update has been computed, so an error above
        // leaves parameters and moments as they were.
        self.values.clear();
        for (name, theta, m, v) in updated {
            params[&name].set(&theta)?;
            if theta.device().is_cpu() {
                // Detached: `theta` was computed from a `Var`, so candle
                // recorded the operation, which holds two more tensors of
                // the parameter's size; the kept value needs only its storage.
                self.values.insert(name.clone(), theta.detach());
            }
            self.moments.insert(name, Moments { m, v });
        }
        self.step += 1;
        Ok(())
    }

    /// Host copies of the moments (`exp_avg.<param>`, `exp_avg_sq.<param>`)
    /// and the step count.
    pub fn state(&self) -> Result<(TensorSet, u64), TrainError> {
        let mut set = TensorSet::new();
        for (name, state) in &self.moments {
            let (m_name, v_name) = moment_names(name);
            let m = to_host_reusing(&m_name, &state.m, None)?;
            let v = to_host_reusing(&v_name, &state.v, None)?;
            set.insert(m_name, m);
            set.insert(v_name, v);
        }
        Ok((set, self.step))
    }

    /// The moments as a snapshot takes them, with the step count: shared
    /// with their tensors in CPU memory (every step *replaces* them with
    /// new tensors and never writes into the old ones), copied into
    /// `reuse`'s buffers elsewhere (a GPU). A sharded optimizer gathers its
    /// moments with `gather` (a collective every rank joins); without one
    /// it gives this rank's pieces (1-D, under the moments' names), its part
    /// of a checkpoint written in parts (`checkpoint::parts`).
    pub fn state_shared(
        &self,
        params: &Params,
        gather: Option<GatherF32<'_>>,
        reuse: &mut TensorSet,
    ) -> Result<(TensorSet, u64), TrainError> {
        if let (Some(_), Some(gather)) = (&self.shard, gather) {
            return self.state_gathered(params, gather);
        }
        let mut set = TensorSet::new();
        for (name, state) in &self.moments {
            let (m_name, v_name) = moment_names(name);
            for (name, t) in [(m_name, &state.m), (v_name, &state.v)] {
                // SAFETY: moments are never written into (see above).
                let host = match unsafe { to_host_shared(&name, t)? } {
                    Some(host) => host,
                    None => to_host_reusing(&name, t, reuse.remove(&name))?,
                };
                set.insert(name, host);
            }
        }
        Ok((set, self.step))
    }

    /// Replaces the moments and step count with a checkpointed state. The
    /// set must hold exactly both moments of every parameter, f32, with the
    /// parameter's shape; nothing changes if it does not.
    pub fn load_state(&mut self, set: &TensorSet, step: u64, device: &Device) -> Result<(), TrainError> {
        let mut loaded = BTreeMap::new();
        for (name, state) in &self.moments {
            let (m_name, v_name) = moment_names(name);
            let shape = state.m.dims();
            check_host("optimizer", &m_name, shape, set.get(&m_name))?;
            check_host("optimizer", &v_name, shape, set.get(&v_name))?;
            let m = from_host(&m_name, &set[&m_name], device)?;
            let v = from_host(&v_name, &set[&v_name], device)?;
            loaded.insert(name.clone(), Moments { m, v });
        }
        if let Some(extra) = set.keys().find(|k| {
            let param = k.strip_prefix("exp_avg_sq.").or_else(|| k.strip_prefix("exp_avg."));
            !param.is_some_and(|p| self.moments.contains_key(p))
        }) {
            return Err(TrainError::UnexpectedTensor { set: "optimizer", name: extra.clone() });
        }
        self.moments = loaded;
        self.step = step;
        // The parameters are about to be set from the same checkpoint.
        self.values.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::params::ParamStore;
    use crate::train::params::to_host;
    use crate::train::rng::{Stream, StreamRng};
    use candle_nn::{Module, Optimizer};

    /// A two-layer tanh network and an MSE loss on fixed data.
    fn model(seed: u64) -> (Params, impl Fn(&Params) -> Tensor) {
        let store = ParamStore::new(Device::Cpu, StreamRng::new(seed, Stream::Init));
        let vb = store.var_builder();
        let l1 = candle_nn::linear(4, 8, vb.pp("l1")).unwrap();
        let l2 = candle_nn::linear(8, 2, vb.pp("l2")).unwrap();
        let (params, _) = store.into_parts();
        let mut data = StreamRng::new(99, Stream::Synthetic);
        let x: Vec<f32> = (0..6 * 4).map(|_| data.normal() as f32).collect();
        let y: Vec<f32> = (0..6 * 2).map(|_| data.normal() as f32).collect();
        let x = Tensor::from_vec(x, (6, 4), &Device::Cpu).unwrap();
        let y = Tensor::from_vec(y, (6, 2), &Device::Cpu).unwrap();
        let loss = move |_: &Params| {
            let h = l1.forward(&x).unwrap().tanh().unwrap();
            let out = l2.forward(&h).unwrap();
            (out - &y).unwrap().sqr().unwrap().mean_all().unwrap()
        };
        (params, loss)
    }

    fn grads_of(params: &Params, loss: &Tensor) -> BTreeMap<String, Tensor> {
        let store = loss.backward().unwrap();
        params.iter().map(|(n, v)| (n.clone(), store.get(v).unwrap().clone())).collect()
    }

    #[test]
    fn matches_candle_adamw_step_by_step() {
        let (ours, our_loss) = model(3);
        let (theirs, their_loss) = model(3);
        let hyper = AdamWConfig { beta1: 0.9, beta2: 0.99, eps: 1e-8, weight_decay: 0.1 };
        let lr = 0.01;
        let mut opt = AdamW::new(&ours, hyper).unwrap();
        let mut reference = candle_nn::AdamW::new(
            theirs.values().cloned().collect(),
            candle_nn::ParamsAdamW { lr, beta1: 0.9, beta2: 0.99, eps: 1e-8, weight_decay: 0.1 },
        )
        .unwrap();
        for step in 0..15 {
            let loss = our_loss(&ours);
            opt.step(&ours, &grads_of(&ours, &loss), lr).unwrap();
            reference.backward_step(&their_loss(&theirs)).unwrap();
            for (name, var) in &ours {
                let diff = (var.as_tensor() - theirs[name].as_tensor()).unwrap().abs().unwrap();
                let max = diff.flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap();
                assert!(max < 1e-6, "step {step}, {name}: max difference {max}");
            }
        }
        assert_eq!(opt.step_count(), 15);
    }

    #[test]
    fn state_round_trip_continues_identically() {
        let hyper = AdamWConfig { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01 };
        let (a, loss_a) = model(5);
        let mut opt_a = AdamW::new(&a, hyper).unwrap();
        for _ in 0..3 {
            opt_a.step(&a, &grads_of(&a, &loss_a(&a)), 0.01).unwrap();
        }
        let (set, step) = opt_a.state().unwrap();
        assert_eq!(step, 3);
        assert_eq!(set.len(), 8);
        assert!(set.contains_key("exp_avg.l1.weight") && set.contains_key("exp_avg_sq.l2.bias"));

        let (b, loss_b) = model(5);
        for (name, var) in &a {
            b[name].set(var.as_tensor()).unwrap();
        }
        let mut opt_b = AdamW::new(&b, hyper).unwrap();
        opt_b.load_state(&set, step, &Device::Cpu).unwrap();
        for _ in 0..3 {
            opt_a.step(&a, &grads_of(&a, &loss_a(&a)), 0.01).unwrap();
            opt_b.step(&b, &grads_of(&b, &loss_b(&b)), 0.01).unwrap();
        }
        for (name, var) in &a {
            assert_eq!(to_host(name, var).unwrap(), to_host(name, &b[name]).unwrap());
        }
        assert_eq!(opt_a.state().unwrap(), opt_b.state().unwrap());
    }

    #[test]
    fn a_slice_of_the_flattened_parameters_is_cut_into_pieces_in_name_order() {
        let names: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        let sizes = || names.iter().zip([4, 3, 5]);
        let cut = |start, end| pieces(sizes(), ShardRange { start, end });
        assert_eq!(
            cut(2, 9),
            BTreeMap::from([
                ("a".into(), Piece { lo: 2, len: 2 }),
                ("b".into(), Piece { lo: 0, len: 3 }),
                ("c".into(), Piece { lo: 0, len: 2 })
            ])
        );
        assert_eq!(cut(4, 7), BTreeMap::from([("b".into(), Piece { lo: 0, len: 3 })]));
        assert_eq!(cut(10, 12), BTreeMap::from([("c".into(), Piece { lo: 3, len: 2 })]));
        assert!(cut(5, 5).is_empty(), "an empty slice (more ranks than values) has no pieces");
    }

    #[test]
    fn a_sharded_optimizer_keeps_its_slice_and_is_sharded_once() {
        let (p, _) = model(1);
        let hyper = AdamWConfig { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0 };
        let mut opt = AdamW::new(&p, hyper).unwrap();
        let total: usize = p.values().map(|v| v.elem_count()).sum();
        let range = ShardRange { start: 3, end: total - 2 };
        opt.shard_to(&p, range).unwrap();
        assert_eq!(opt.shard_range(), Some(range));
        let kept: usize = opt.moments.values().map(|m| m.m.elem_count()).sum();
        assert_eq!(kept, range.end - range.start);
        let err = opt.shard_to(&p, range).unwrap_err();
        assert!(err.to_string().contains("already sharded"), "{err}");
        let mut opt = AdamW::new(&p, hyper).unwrap();
        let err = opt.shard_to(&p, ShardRange { start: 0, end: total + 1 }).unwrap_err();
        assert!(err.to_string().contains("does not fit"), "{err}");
    }

    #[test]
    fn load_state_names_the_missing_or_unexpected_tensor() {
        let (p, _) = model(1);
        let hyper = AdamWConfig { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0 };
        let mut opt = AdamW::new(&p, hyper).unwrap();
        let (mut set, _) = opt.state().unwrap();
        set.remove("exp_avg_sq.l1.bias");
        let err = opt.load_state(&set, 1, &Device::Cpu).unwrap_err();
        assert!(err.to_string().contains("exp_avg_sq.l1.bias"), "{err}");
        let (mut set, _) = opt.state().unwrap();
        set.insert("exp_avg.nope".into(), crate::checkpoint::HostTensor::from_f32(vec![1], &[0.0]));
        let err = opt.load_state(&set, 1, &Device::Cpu).unwrap_err();
        assert!(matches!(err, TrainError::UnexpectedTensor { ref name, .. } if name == "exp_avg.nope"), "{err}");
        assert_eq!(opt.step_count(), 0);
    }
}
