//! The parameter store: named f32 candle `Var`s, ordered by name, whose
//! initial values come from rekindle's seeded init stream.
//!
//! Workloads declare parameters through an ordinary `candle_nn::VarBuilder`
//! (so `candle_nn::linear(..)` and friends work unchanged); the builder is
//! backed by this store, which honours the builder's `Init` hint with draws
//! from [`StreamRng`] instead of candle's unseedable generator. Parameters
//! are kept in a `BTreeMap`, so every walk over them (optimizer, gradient
//! norm, snapshot) has one fixed order. This file also converts between
//! candle tensors and the checkpoint's host tensors.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use candle_core::{DType, Device, Shape, Tensor, Var};
use candle_nn::init::NormalOrUniform;
use candle_nn::var_builder::SimpleBackend;
use candle_nn::{Init, VarBuilder};

use super::error::{TrainError, candle_message};
use super::rng::StreamRng;
use crate::checkpoint::{DType as HostDType, HostTensor, SharedBytes, TensorSet};

/// Named parameters, in name order.
pub type Params = BTreeMap<String, Var>;

/// Creates parameters on request of a `VarBuilder` and remembers them by name.
#[derive(Clone)]
pub struct ParamStore {
    inner: Arc<Mutex<StoreInner>>,
    device: Device,
}

struct StoreInner {
    vars: Params,
    rng: StreamRng,
    /// Values to start from instead of drawing (a checkpoint's parameters).
    initial: Option<Arc<TensorSet>>,
}

impl ParamStore {
    /// An empty store drawing initial values from `rng`.
    pub fn new(device: Device, rng: StreamRng) -> Self {
        ParamStore { inner: Arc::new(Mutex::new(StoreInner { vars: Params::new(), rng, initial: None })), device }
    }

    /// An empty store whose parameters start from `initial` (a checkpoint's
    /// model tensors, about to be restored): a parameter found there as f32
    /// of the requested shape is built from those values and nothing is
    /// drawn for it, so resuming a large model does not first draw its
    /// initial weights only to overwrite them. Any other parameter is drawn
    /// from `rng` as usual; restoring then reports it as missing or
    /// mismatched, as it would have.
    pub fn with_initial(device: Device, rng: StreamRng, initial: Arc<TensorSet>) -> Self {
        let inner = StoreInner { vars: Params::new(), rng, initial: Some(initial) };
        ParamStore { inner: Arc::new(Mutex::new(inner)), device }
    }

    /// A `VarBuilder` (f32) whose parameters live in this store.
    pub fn var_builder(&self) -> VarBuilder<'static> {
        VarBuilder::from_backend(Box::new(self.clone()), DType::F32, self.device.clone())
    }

    /// The parameters created so far and the init generator's state after them.
    pub fn into_parts(self) -> (Params, StreamRng) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        // The initial values are in the parameters now; a `VarBuilder` a
        // workload kept must not keep them alive too.
        inner.initial = None;
        (inner.vars.clone(), inner.rng.clone())
    }

    fn init_values(rng: &mut StreamRng, shape: &Shape, init: Init) -> Vec<f32> {
        let n = shape.elem_count();
        match init {
            Init::Const(c) => vec![c as f32; n],
            Init::Randn { mean, stdev } => (0..n).map(|_| (mean + stdev * rng.normal()) as f32).collect(),
            Init::Uniform { lo, up } => (0..n).map(|_| rng.uniform(lo, up) as f32).collect(),
            Init::Kaiming { dist, fan, non_linearity } => {
                let fan = fan.for_shape(shape).max(1);
                let std = non_linearity.gain() / (fan as f64).sqrt();
                match dist {
                    NormalOrUniform::Normal => (0..n).map(|_| (std * rng.normal()) as f32).collect(),
                    NormalOrUniform::Uniform => {
                        let bound = 3f64.sqrt() * std;
                        (0..n).map(|_| rng.uniform(-bound, bound) as f32).collect()
                    }
                }
            }
        }
    }
}

impl SimpleBackend for ParamStore {
    fn get(&self, s: Shape, name: &str, h: Init, dtype: DType, dev: &Device) -> candle_core::Result<Tensor> {
        if dtype != DType::F32 {
            candle_core::bail!(
                "parameter `{name}` requested as {dtype:?}: parameters are f32 master weights; cast them in the forward pass"
            );
        }
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(var) = inner.vars.get(name) {
            // A second request for a name shares the parameter (weight tying).
            if var.shape() != &s {
                candle_core::bail!(
                    "parameter `{name}` requested with shape {s:?}, but it exists with {:?}",
                    var.shape()
                );
            }
            return Ok(var.as_tensor().clone());
        }
        let given = inner
            .initial
            .as_ref()
            .and_then(|set| set.get(name))
            .filter(|t| t.shape == s.dims() && check_host("model", name, s.dims(), Some(t)).is_ok())
            .and_then(HostTensor::to_f32);
        let values = match given {
            Some(values) => values,
            None => Self::init_values(&mut inner.rng, &s, h),
        };
        // `Var::from_vec` keeps the vector as the variable's storage
        // (`Var::from_tensor` would copy it once more).
        let var = Var::from_vec(values, s, dev)?;
        let tensor = var.as_tensor().clone();
        inner.vars.insert(name.to_string(), var);
        Ok(tensor)
    }

    fn get_unchecked(&self, name: &str, _dtype: DType, _dev: &Device) -> candle_core::Result<Tensor> {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        match inner.vars.get(name) {
            Some(var) => Ok(var.as_tensor().clone()),
            None => candle_core::bail!("parameter `{name}` does not exist yet; declare it with a shape"),
        }
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).vars.contains_key(name)
    }
}

/// Total number of scalar parameters.
pub fn param_count(params: &Params) -> usize {
    params.values().map(|v| v.elem_count()).sum()
}

/// A host copy of an f32 tensor (any layout).
#[cfg(test)]
pub fn to_host(name: &str, t: &Tensor) -> Result<HostTensor, TrainError> {
    to_host_reusing(name, t, None)
}

/// A host copy of an f32 tensor, written into `reuse`'s buffer when it has the
/// right size. A contiguous CPU tensor is copied straight from its storage
/// with one pass and no allocation: this copy is the whole training stall of
/// a periodic checkpoint, so it runs at memory speed.
pub fn to_host_reusing(name: &str, t: &Tensor, reuse: Option<HostTensor>) -> Result<HostTensor, TrainError> {
    let err = |e: candle_core::Error| TrainError::Tensor { name: name.to_string(), message: candle_message(&e) };
    let shape = t.dims().to_vec();
    let bytes = t.elem_count() * 4;
    let mut data =
        reuse.and_then(|h| h.data.into_owned()).filter(|d| d.len() == bytes).unwrap_or_else(|| vec![0u8; bytes]);
    let copied = {
        let (storage, layout) = t.storage_and_layout();
        match (&*storage, layout.contiguous_offsets()) {
            (candle_core::Storage::Cpu(cpu), Some((start, end))) if t.dtype() == DType::F32 => {
                let values: &[f32] = cpu.as_slice().map_err(err)?;
                copy_f32_le(&values[start..end], &mut data);
                true
            }
            _ => false,
        }
    };
    if !copied {
        let values: Vec<f32> =
            t.to_dtype(DType::F32).and_then(|t| t.flatten_all()).and_then(|t| t.to_vec1()).map_err(err)?;
        copy_f32_le(&values, &mut data);
    }
    HostTensor::new(HostDType::F32, shape, data)
        .map_err(|reason| TrainError::Tensor { name: name.to_string(), message: reason.to_string() })
}

/// The host tensor of an f32 tensor in CPU memory *without a copy*: its
/// bytes are shared with the tensor's storage, which a clone of the tensor
/// keeps alive. `None` when the tensor is elsewhere (a GPU), of another
/// dtype, not contiguous, or the machine is big-endian: copy it instead.
///
/// # Safety
/// Nothing may write into `t`'s storage while the result (or a clone of
/// it) lives: pass only tensors no one holds for writing, such as the
/// moments an AdamW step has replaced or the parameter values it kept
/// (never a `Var`, which the next step sets in place).
pub unsafe fn to_host_shared(name: &str, t: &Tensor) -> Result<Option<HostTensor>, TrainError> {
    if cfg!(target_endian = "big") || t.dtype() != DType::F32 {
        return Ok(None);
    }
    let err = |reason: String| TrainError::Tensor { name: name.to_string(), message: reason };
    let (ptr, len) = {
        let (storage, layout) = t.storage_and_layout();
        let (candle_core::Storage::Cpu(cpu), Some((start, end))) = (&*storage, layout.contiguous_offsets()) else {
            return Ok(None);
        };
        let values = &cpu.as_slice::<f32>().map_err(|e| err(candle_message(&e)))?[start..end];
        (values.as_ptr().cast::<u8>(), std::mem::size_of_val(values))
    };
    let owner: Arc<dyn Send + Sync> = Arc::new(t.clone());
    // SAFETY: `owner` (a clone of `t`) keeps the storage allocated; a CPU
    // storage's buffer never moves; the caller guarantees nobody writes
    // into it while the bytes are shared.
    let bytes = unsafe { SharedBytes::new(owner, ptr, len) };
    HostTensor::shared(HostDType::F32, t.dims().to_vec(), bytes).map(Some).map_err(|e| err(e.to_string()))
}

/// Writes `values` as little-endian bytes into `out` (same length × 4): on
/// a little-endian machine a plain copy of their memory, split across cores
/// (the snapshot's stall is this copy).
fn copy_f32_le(values: &[f32], out: &mut [u8]) {
    #[cfg(target_endian = "little")]
    {
        // SAFETY: f32 has no padding and any initialised memory is valid u8;
        // the slice covers exactly the values' bytes.
        let bytes = unsafe { std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), std::mem::size_of_val(values)) };
        crate::checkpoint::copy_parallel(out, bytes);
    }
    #[cfg(not(target_endian = "little"))]
    for (dst, v) in out.chunks_exact_mut(4).zip(values) {
        dst.copy_from_slice(&v.to_le_bytes());
    }
}

/// Checks a host tensor against the expected f32 shape.
pub fn check_host(
    set: &'static str,
    name: &str,
    expected: &[usize],
    found: Option<&HostTensor>,
) -> Result<(), TrainError> {
    let found = found.ok_or_else(|| TrainError::MissingTensor {
        set,
        name: name.to_string(),
        expected_shape: expected.to_vec(),
    })?;
    if found.dtype != HostDType::F32
        || found.shape != expected
        || found.data.len() != expected.iter().product::<usize>() * 4
    {
        return Err(TrainError::TensorMismatch {
            set,
            name: name.to_string(),
            expected: format!("shape {expected:?}, dtype F32"),
            found: format!("shape {:?}, dtype {}", found.shape, found.dtype.safetensors_name()),
        });
    }
    Ok(())
}

/// True when `t` is a contiguous f32 CPU tensor whose values are exactly
/// `host`'s bytes (checked by [`check_host`]): restoring it would change
/// nothing. Any other tensor (on a GPU, another layout) answers false.
pub fn holds_host_values(t: &Tensor, host: &HostTensor) -> bool {
    if t.dtype() != DType::F32 || !cfg!(target_endian = "little") {
        return false;
    }
    let (storage, layout) = t.storage_and_layout();
    match (&*storage, layout.contiguous_offsets()) {
        (candle_core::Storage::Cpu(cpu), Some((start, end))) => match cpu.as_slice::<f32>() {
            Ok(values) => {
                let values = &values[start..end];
                // SAFETY: f32 has no padding; the slice covers exactly the values' bytes.
                let bytes =
                    unsafe { std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), std::mem::size_of_val(values)) };
                bytes == &host.data[..]
            }
            Err(_) => false,
        },
        _ => false,
    }
}

/// A device tensor from a host tensor already checked by [`check_host`].
pub fn from_host(name: &str, t: &HostTensor, device: &Device) -> Result<Tensor, TrainError> {
    let values =
        t.to_f32().ok_or_else(|| TrainError::Tensor { name: name.to_string(), message: "not an f32 tensor".into() })?;
    Tensor::from_vec(values, t.shape.as_slice(), device)
        .map_err(|e| TrainError::Tensor { name: name.to_string(), message: candle_message(&e) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::rng::Stream;

    fn store(seed: u64) -> ParamStore {
        ParamStore::new(Device::Cpu, StreamRng::new(seed, Stream::Init))
    }

    fn values(params: &Params, name: &str) -> Vec<f32> {
        params[name].as_tensor().flatten_all().unwrap().to_vec1().unwrap()
    }

    #[test]
    fn same_seed_gives_identical_parameters_named_by_prefix() {
        let build = |seed| {
            let s = store(seed);
            let vb = s.var_builder();
            candle_nn::linear(3, 4, vb.pp("layers").pp(0)).unwrap();
            candle_nn::embedding(5, 2, vb.pp("emb")).unwrap();
            s.into_parts().0
        };
        let (a, b, c) = (build(1), build(1), build(2));
        let names: Vec<&String> = a.keys().collect();
        assert_eq!(names, ["emb.weight", "layers.0.bias", "layers.0.weight"]);
        for name in a.keys() {
            assert_eq!(values(&a, name), values(&b, name));
            assert_ne!(values(&a, name), values(&c, name));
        }
    }

    #[test]
    fn honours_init_hints() {
        let s = store(0);
        let vb = s.var_builder();
        vb.get_with_hints(7, "ones", Init::Const(1.0)).unwrap();
        vb.get_with_hints((64, 256), "k", candle_nn::init::DEFAULT_KAIMING_NORMAL).unwrap();
        vb.get_with_hints(1000, "u", Init::Uniform { lo: -0.5, up: 0.5 }).unwrap();
        let p = s.into_parts().0;
        assert!(values(&p, "ones").iter().all(|&v| v == 1.0));
        let k = values(&p, "k");
        let std = (k.iter().map(|v| v * v).sum::<f32>() / k.len() as f32).sqrt();
        // Kaiming normal, ReLU gain, fan-in 256: std = sqrt(2/256) ~ 0.088.
        assert!((std - 0.0884).abs() < 0.005, "{std}");
        assert!(values(&p, "u").iter().all(|v| (-0.5..0.5).contains(v)));
    }

    #[test]
    fn shares_a_name_and_refuses_a_shape_conflict() {
        let s = store(0);
        let vb = s.var_builder();
        let a = vb.get_with_hints((2, 2), "w", Init::Const(0.0)).unwrap();
        let b = vb.get_with_hints((2, 2), "w", Init::Const(1.0)).unwrap();
        assert_eq!(a.id(), b.id());
        assert!(vb.get_with_hints((3, 2), "w", Init::Const(0.0)).is_err());
        assert!(vb.get_with_hints_dtype(2, "h", Init::Const(0.0), DType::F16).is_err());
    }

    #[test]
    fn host_round_trip_is_bit_exact_and_checked() {
        let t = Tensor::new(&[[1.5f32, -0.0], [f32::MIN_POSITIVE, 3.25]], &Device::Cpu).unwrap();
        let h = to_host("x", &t).unwrap();
        check_host("model", "x", &[2, 2], Some(&h)).unwrap();
        let back = from_host("x", &h, &Device::Cpu).unwrap();
        assert_eq!(to_host("x", &back).unwrap(), h);
        assert!(matches!(check_host("model", "x", &[4], Some(&h)), Err(TrainError::TensorMismatch { .. })));
        assert!(matches!(check_host("model", "x", &[2, 2], None), Err(TrainError::MissingTensor { .. })));
    }
}
