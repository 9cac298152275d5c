//! Host-memory tensors: the unit the checkpoint store writes and reads.
//!
//! The store never sees candle types. The training engine converts its
//! parameters and optimizer state into a [`TensorSet`] (a snapshot in host
//! memory) and the store persists it as safetensors; loading returns the same
//! structure. Keeping the boundary this small lets tests drive the store with
//! hand-made tensors and lets the orchestrator persist a snapshot on a
//! background thread while training continues.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Element types the checkpoint format stores (safetensors names in
/// [`DType::safetensors_name`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DType {
    F32,
    F16,
    BF16,
    F64,
    I64,
    U32,
    U8,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::U32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::U8 => 1,
        }
    }

    /// The dtype string used in a safetensors header.
    pub fn safetensors_name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::F64 => "F64",
            DType::I64 => "I64",
            DType::U32 => "U32",
            DType::U8 => "U8",
        }
    }

    /// Parses a safetensors dtype string; `None` for types we do not store.
    pub fn from_safetensors_name(name: &str) -> Option<Self> {
        Some(match name {
            "F32" => DType::F32,
            "F16" => DType::F16,
            "BF16" => DType::BF16,
            "F64" => DType::F64,
            "I64" => DType::I64,
            "U32" => DType::U32,
            "U8" => DType::U8,
            _ => return None,
        })
    }
}

/// One tensor in host memory: little-endian element bytes, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub data: TensorBytes,
}

/// A tensor's bytes: a buffer of its own, or the memory of a tensor that
/// nothing writes into any more, shared without a copy.
///
/// Sharing is what makes a periodic checkpoint cost training (almost)
/// nothing: every AdamW step replaces the moments with new tensors and
/// keeps the parameter values it computed until the next step begins, so a
/// snapshot between two steps can hand the persister those tensors'
/// memory instead of copying it (`train::snapshot_tensors`), and the writer
/// hashes and writes straight from it.
#[derive(Clone)]
pub enum TensorBytes {
    Owned(Vec<u8>),
    Shared(SharedBytes),
}

impl TensorBytes {
    /// The buffer, when it is one of its own (to be reused for a copy).
    pub fn into_owned(self) -> Option<Vec<u8>> {
        match self {
            TensorBytes::Owned(v) => Some(v),
            TensorBytes::Shared(_) => None,
        }
    }

    /// True for a buffer of its own.
    pub fn is_owned(&self) -> bool {
        matches!(self, TensorBytes::Owned(_))
    }
}

impl std::ops::Deref for TensorBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            TensorBytes::Owned(v) => v,
            TensorBytes::Shared(s) => s.bytes(),
        }
    }
}

impl AsRef<[u8]> for TensorBytes {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl From<Vec<u8>> for TensorBytes {
    fn from(v: Vec<u8>) -> Self {
        TensorBytes::Owned(v)
    }
}

impl PartialEq for TensorBytes {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl std::fmt::Debug for TensorBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = if self.is_owned() { "Owned" } else { "Shared" };
        write!(f, "{kind}({} bytes)", self.len())
    }
}

/// Bytes in memory that another value owns and that nobody writes into
/// while they are shared: the owner is kept alive as long as any clone.
#[derive(Clone)]
pub struct SharedBytes {
    owner: std::sync::Arc<dyn Send + Sync>,
    ptr: *const u8,
    len: usize,
}

// SAFETY: the bytes are immutable for as long as any clone lives (the
// contract of `SharedBytes::new`), and the owner that keeps them allocated
// is itself `Send + Sync`.
unsafe impl Send for SharedBytes {}
// SAFETY: as above: shared reads of immutable memory.
unsafe impl Sync for SharedBytes {}

impl SharedBytes {
    /// Shares the `len` bytes at `ptr`, kept allocated by `owner`.
    ///
    /// # Safety
    /// `ptr..ptr + len` must be initialised memory that stays allocated,
    /// unmoved and *unwritten* as long as `owner` lives (any clone of the
    /// result keeps it alive): e.g. the storage of a candle tensor that no
    /// one writes into any more, owned by a clone of that tensor.
    pub unsafe fn new(owner: std::sync::Arc<dyn Send + Sync>, ptr: *const u8, len: usize) -> Self {
        SharedBytes { owner, ptr, len }
    }

    fn bytes(&self) -> &[u8] {
        // The owner field keeps the memory alive; it is read only here.
        let _ = &self.owner;
        // SAFETY: the contract of `new`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// Bytes that do not hold exactly the elements a tensor's shape says.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TensorError {
    #[error("tensor of shape {shape:?} and dtype {dtype} needs {needed} bytes, got {got}")]
    Size { shape: Vec<usize>, dtype: &'static str, needed: String, got: usize },
    #[error("shared bytes of a tensor of shape {shape:?}: {got} bytes do not fit it")]
    SharedSize { shape: Vec<usize>, got: usize },
}

impl HostTensor {
    /// Builds a tensor, checking that `data` holds exactly `shape` elements.
    pub fn new(dtype: DType, shape: Vec<usize>, data: Vec<u8>) -> Result<Self, TensorError> {
        // Checked: a shape read from a file can claim more elements than a
        // usize holds, and its product must be refused, not wrap or panic.
        let needed = shape.iter().try_fold(dtype.size(), |acc, d| acc.checked_mul(*d));
        if needed != Some(data.len()) {
            let needed = needed.map_or_else(|| "more than 2^64".to_string(), |n| n.to_string());
            return Err(TensorError::Size { shape, dtype: dtype.safetensors_name(), needed, got: data.len() });
        }
        Ok(HostTensor { dtype, shape, data: TensorBytes::Owned(data) })
    }

    /// A tensor over shared bytes (no copy), checked like [`new`](Self::new).
    pub fn shared(dtype: DType, shape: Vec<usize>, data: SharedBytes) -> Result<Self, TensorError> {
        let needed = shape.iter().try_fold(dtype.size(), |acc, d| acc.checked_mul(*d));
        if needed != Some(data.len) {
            return Err(TensorError::SharedSize { shape, got: data.len });
        }
        Ok(HostTensor { dtype, shape, data: TensorBytes::Shared(data) })
    }

    /// An f32 tensor from values (little-endian encoding).
    pub fn from_f32(shape: Vec<usize>, values: &[f32]) -> Self {
        let mut data = Vec::with_capacity(values.len() * 4);
        for v in values {
            data.extend_from_slice(&v.to_le_bytes());
        }
        HostTensor::new(DType::F32, shape, data).expect("shape matches values")
    }

    /// Decodes an f32 tensor's values; `None` for any other dtype. On a
    /// little-endian machine the bytes are the values: one copy into the
    /// new vector, split across cores ([`copy_parallel`]), so that resuming
    /// a large model decodes at memory speed and touches its fresh pages
    /// from every core.
    pub fn to_f32(&self) -> Option<Vec<f32>> {
        if self.dtype != DType::F32 {
            return None;
        }
        if cfg!(target_endian = "big") {
            return Some(self.data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect());
        }
        let mut values = vec![0f32; self.data.len() / 4];
        // SAFETY: `values` owns len × 4 initialised bytes; f32 has no padding
        // and every bit pattern is a valid f32.
        let dst = unsafe { std::slice::from_raw_parts_mut(values.as_mut_ptr().cast::<u8>(), values.len() * 4) };
        copy_parallel(dst, &self.data[..dst.len()]);
        Some(values)
    }
}

/// Below this many bytes a copy runs on the calling thread: starting threads
/// costs more than they save.
const PARALLEL_COPY_MIN: usize = 4 << 20;

/// Copies `src` into `dst` (same length), split across the machine's cores
/// when it is large: a snapshot is a copy of the whole training state, and
/// on most machines one core does not saturate the memory bandwidth.
pub fn copy_parallel(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy_parallel needs buffers of the same length");
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(8);
    if threads < 2 || src.len() < PARALLEL_COPY_MIN {
        dst.copy_from_slice(src);
        return;
    }
    // Pieces rounded to 64 bytes (a cache line) so no two threads share one.
    let piece = src.len().div_ceil(threads).next_multiple_of(64);
    std::thread::scope(|scope| {
        let mut pieces = dst.chunks_mut(piece).zip(src.chunks(piece));
        let first = pieces.next();
        for (d, s) in pieces {
            scope.spawn(move || d.copy_from_slice(s));
        }
        if let Some((d, s)) = first {
            d.copy_from_slice(s);
        }
    });
}

/// Named tensors, ordered by name so files are byte-identical for identical
/// state (hash-map iteration order never leaks into a checkpoint).
pub type TensorSet = BTreeMap<String, HostTensor>;

/// The buffers of `set` that are its own, by name, for a later copy to
/// reuse; shared tensors are let go (holding them would keep the memory of
/// the state they were shared from alive).
pub fn reusable(set: TensorSet) -> TensorSet {
    set.into_iter().filter(|(_, t)| t.data.is_owned()).collect()
}

/// Total payload bytes of a set (without headers).
pub fn payload_bytes(set: &TensorSet) -> u64 {
    set.values().map(|t| t.data.len() as u64).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parallel_copy_copies_every_byte_of_any_length() {
        for len in [0, 1, 63, PARALLEL_COPY_MIN - 1, PARALLEL_COPY_MIN, 3 * PARALLEL_COPY_MIN + 13] {
            let src: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            let mut dst = vec![0xAA; len];
            copy_parallel(&mut dst, &src);
            assert!(dst == src, "length {len}");
        }
    }

    #[test]
    fn f32_values_round_trip_through_their_bytes_at_any_size_and_sharing() {
        for n in [0, 1, 5, PARALLEL_COPY_MIN / 4 + 3] {
            let values: Vec<f32> = (0..n).map(|i| i as f32 * -0.37 + f32::EPSILON).collect();
            let owned = HostTensor::from_f32(vec![n], &values);
            assert!(owned.to_f32().unwrap() == values, "{n} values");
            let bytes = std::sync::Arc::new(owned.data.to_vec());
            // SAFETY: `bytes` is never written and lives as long as `shared`.
            let shared = unsafe { SharedBytes::new(bytes.clone(), bytes.as_ptr(), bytes.len()) };
            let shared = HostTensor::shared(DType::F32, vec![n], shared).unwrap();
            assert_eq!(shared, owned, "shared and owned bytes compare by content");
            assert!(!shared.data.is_owned() && shared.to_f32().unwrap() == values);
            let kept = reusable(TensorSet::from([("s".into(), shared), ("o".into(), owned)]));
            assert_eq!(kept.keys().collect::<Vec<_>>(), ["o"], "only buffers of their own are kept for reuse");
        }
        assert!(HostTensor::new(DType::I64, vec![1], vec![0; 8]).unwrap().to_f32().is_none());
    }

    #[test]
    fn a_shape_whose_byte_count_overflows_is_refused_not_a_panic() {
        // 2^32 · 2^32 · 4 bytes overflows a u64: it used to panic in debug
        // builds (`attempt to multiply with overflow`) and wrap in release.
        let err = HostTensor::new(DType::F32, vec![1 << 32, 1 << 32], vec![0; 4]).unwrap_err();
        assert!(err.to_string().contains("more than 2^64"), "{err}");
        let err = HostTensor::new(DType::U8, vec![usize::MAX, 2], Vec::new()).unwrap_err();
        assert!(err.to_string().contains("more than 2^64"), "{err}");
        assert!(HostTensor::new(DType::I64, vec![2, 0, 3], Vec::new()).is_ok());
        assert!(
            HostTensor::new(DType::F32, vec![3], vec![0; 11])
                .unwrap_err()
                .to_string()
                .contains("needs 12 bytes, got 11")
        );
    }
}
