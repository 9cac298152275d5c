//! Checkpoint content derived from the step alone, so a test — or another
//! process, such as `examples/ckpt_writer.rs` — can recompute exactly what a
//! checkpoint of step N must hold and compare it bit for bit.
//!
//! Shared by the integration tests (`tests/it/support/mod.rs`) and the writer
//! example (through `#[path]`), so both sides use one definition.

use rekindle::checkpoint::{DType, HostTensor, Snapshot, TensorSet};

/// Columns of the generated matrices.
const COLS: usize = 64;

/// SplitMix64: tiny, fast and good enough to make every byte depend on its seed.
#[derive(Debug, Clone)]
pub struct SplitMix(pub u64);

impl SplitMix {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A value in `0..n` (n > 0); the modulo bias is irrelevant here.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// A seed for one tensor of one step, so no two tensors share a stream.
fn seed(step: u64, name: &str) -> u64 {
    name.bytes().fold(step.wrapping_mul(0x100_0000_01B3), |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01B3))
}

/// An f32 tensor whose values are exact binary fractions in [-0.5, 0.5).
fn f32_tensor(step: u64, name: &str, shape: Vec<usize>) -> HostTensor {
    let mut rng = SplitMix(seed(step, name));
    let n: usize = shape.iter().product();
    let values: Vec<f32> = (0..n).map(|_| (rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32 - 0.5).collect();
    HostTensor::from_f32(shape, &values)
}

/// The snapshot a checkpoint of `step` holds: about `payload_bytes` of tensor
/// data (at least one row), spread over model and optimizer, of several dtypes.
pub fn snapshot_for_step(step: u64, payload_bytes: usize) -> Snapshot {
    let rows = (payload_bytes / (2 * COLS * 4)).max(1);
    let mut model = TensorSet::new();
    model.insert("layer.weight".into(), f32_tensor(step, "layer.weight", vec![rows, COLS]));
    model.insert("layer.bias".into(), f32_tensor(step, "layer.bias", vec![COLS]));
    let mut rng = SplitMix(seed(step, "embed.weight"));
    let half: Vec<u8> = (0..16 * 8).flat_map(|_| (rng.next_u64() as u16 & 0x3bff).to_le_bytes()).collect();
    model.insert("embed.weight".into(), HostTensor::new(DType::F16, vec![16, 8], half).expect("f16 shape"));

    let mut optimizer = TensorSet::new();
    optimizer.insert("layer.weight.exp_avg".into(), f32_tensor(step, "layer.weight.exp_avg", vec![rows, COLS]));
    optimizer.insert("layer.bias.exp_avg".into(), f32_tensor(step, "layer.bias.exp_avg", vec![COLS]));
    optimizer.insert(
        "step".into(),
        HostTensor::new(DType::I64, vec![1], (step as i64).to_le_bytes().to_vec()).expect("i64 shape"),
    );

    // Floats here are binary fractions, exact in any decimal round trip.
    let state = serde_json::json!({
        "step": step,
        "epoch": step / 100,
        "cursor": { "shard": step % 7, "offset": step * 32 },
        "rng": { "seed": 1234, "stream": 0, "word_pos": step * 7 },
        "lr": step as f64 / 1024.0,
        "loss_scale": 65536.0,
    });
    Snapshot { step, model, optimizer, state }
}
