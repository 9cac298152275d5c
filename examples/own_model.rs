//! A model of your own under the whole `rekindle` command line: a small 1-D
//! convolutional classifier of noisy waves, registered as `[model] kind =
//! "conv"` next to the built-in `mlp` and `gpt` (see docs/workloads.md).
//!
//! ```text
//! cargo build --release --example own_model
//! target/release/examples/own_model run --config configs/own_model.toml
//! REKINDLE_BIN=target/release/examples/own_model sbatch slurm/orchestrator.slurm configs/own_model.toml
//! ```
//!
//! Every subcommand of `rekindle` works (`run`, `verify`, `checkpoints`,
//! `status`, `report`, `gpus`, `doctor`, `bench`): signals, periodic
//! background saves, requeue, the lock, publishing and the summary come with
//! it. The model's own settings are `[model.settings]`, read into
//! [`ConvSettings`]: an unknown key or a wrong type there is a config error
//! with file, line, key and suggestion, like any other.

use std::process::ExitCode;

use candle_core::{D, Device, Tensor};
use candle_nn::{Init, VarBuilder};
use rekindle::config::Config;
use rekindle::train::{Batch, ForwardCtx, Registry, Split, Workload};
use serde::Deserialize;

fn main() -> ExitCode {
    rekindle::cli::main_with(Registry::builtin().with("conv", ConvWaves::new))
}

/// `[model.settings]` of `kind = "conv"`; every key has a default.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConvSettings {
    /// Samples per wave (>= kernel).
    pub length: usize,
    /// Channels of both convolutions (>= 1).
    pub channels: usize,
    /// Kernel width of both convolutions (odd, >= 1).
    pub kernel: usize,
    /// Wave classes: class `c` has `c + 1` periods per wave (>= 2).
    pub classes: usize,
    /// Training samples (>= 1).
    pub train_samples: usize,
    /// Validation samples.
    pub val_samples: usize,
    /// Amplitude of the noise added to each wave (>= 0).
    pub noise: f32,
}

impl Default for ConvSettings {
    fn default() -> Self {
        ConvSettings {
            length: 32,
            channels: 8,
            kernel: 5,
            classes: 4,
            train_samples: 1024,
            val_samples: 128,
            noise: 0.5,
        }
    }
}

/// Two convolutions, ReLU, dropout, mean over time and a linear head, on
/// waves generated from `[run] seed`.
struct ConvWaves {
    settings: ConvSettings,
    seed: u64,
    dropout: f64,
    params: Option<Params>,
}

struct Params {
    conv1: (Tensor, Tensor),
    conv2: (Tensor, Tensor),
    head: (Tensor, Tensor),
}

impl ConvWaves {
    /// The workload of a config: its `[model.settings]` (already checked
    /// against [`ConvSettings`] when the config loaded) and what it shares
    /// with every model (`[run] seed`, `[model] dropout`). An error here is
    /// reported as a config error of `model.settings`.
    fn new(cfg: &Config, settings: ConvSettings) -> Result<ConvWaves, String> {
        let s = &settings;
        let problem = if s.channels == 0 {
            Some("channels must be at least 1")
        } else if s.kernel.is_multiple_of(2) {
            Some("kernel must be odd (the waves keep their length)")
        } else if s.length < s.kernel {
            Some("length must be at least kernel")
        } else if s.classes < 2 {
            Some("classes must be at least 2")
        } else if s.train_samples == 0 {
            Some("train_samples must be at least 1")
        } else if !(s.noise >= 0.0 && s.noise.is_finite()) {
            Some("noise must be a number >= 0")
        } else {
            None
        };
        match problem {
            Some(problem) => Err(format!("{problem} (got {settings:?})")),
            None => Ok(ConvWaves { settings, seed: cfg.run.seed, dropout: cfg.model.dropout, params: None }),
        }
    }

    /// Sample `index` of `split`: its class and its wave. A pure function of
    /// the seed and the index, so a resumed run sees the same data.
    fn sample(&self, split: Split, index: usize) -> (u32, Vec<f32>) {
        let s = &self.settings;
        let id = match split {
            Split::Train => index as u64,
            Split::Validation => (s.train_samples + index) as u64,
        };
        let class = (mix(self.seed, id, u64::MAX) % s.classes as u64) as usize;
        let phase = unit(mix(self.seed, id, u64::MAX - 1)) * std::f32::consts::TAU;
        let wave = (0..s.length)
            .map(|t| {
                let angle = std::f32::consts::TAU * (class + 1) as f32 * t as f32 / s.length as f32 + phase;
                angle.sin() + s.noise * (2.0 * unit(mix(self.seed, id, t as u64)) - 1.0)
            })
            .collect();
        (class as u32, wave)
    }
}

/// A 64-bit hash of `(seed, sample, position)` (SplitMix64 finalizer).
fn mix(seed: u64, sample: u64, position: u64) -> u64 {
    let mut z = seed ^ sample.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ position.wrapping_mul(0xD1B5_4A32_D192_ED03);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `bits` as a float in [0, 1).
fn unit(bits: u64) -> f32 {
    (bits >> 40) as f32 / (1u64 << 24) as f32
}

impl Workload for ConvWaves {
    fn name(&self) -> &str {
        "conv"
    }

    fn build(&mut self, vb: VarBuilder<'_>) -> candle_core::Result<()> {
        let s = &self.settings;
        let (c, k) = (s.channels, s.kernel);
        let kaiming = candle_nn::init::DEFAULT_KAIMING_NORMAL;
        let zero = Init::Const(0.0);
        let head_bound = 1.0 / (c as f64).sqrt();
        self.params = Some(Params {
            conv1: (vb.get_with_hints((c, 1, k), "conv1.weight", kaiming)?, vb.get_with_hints(c, "conv1.bias", zero)?),
            conv2: (vb.get_with_hints((c, c, k), "conv2.weight", kaiming)?, vb.get_with_hints(c, "conv2.bias", zero)?),
            head: (
                vb.get_with_hints((s.classes, c), "head.weight", Init::Uniform { lo: -head_bound, up: head_bound })?,
                vb.get_with_hints(s.classes, "head.bias", zero)?,
            ),
        });
        Ok(())
    }

    fn num_samples(&self, split: Split) -> usize {
        match split {
            Split::Train => self.settings.train_samples,
            Split::Validation => self.settings.val_samples,
        }
    }

    fn batch(&self, split: Split, indices: &[usize], device: &Device) -> candle_core::Result<Batch> {
        let (labels, waves): (Vec<u32>, Vec<Vec<f32>>) = indices.iter().map(|&i| self.sample(split, i)).unzip();
        let inputs = Tensor::from_vec(waves.concat(), (indices.len(), 1, self.settings.length), device)?;
        Ok(Batch { inputs, targets: Tensor::from_vec(labels, indices.len(), device)?, tokens: None })
    }

    fn loss(&self, batch: &Batch, ctx: &mut ForwardCtx<'_>) -> candle_core::Result<Tensor> {
        let p = self.params.as_ref().expect("build is called before loss");
        let dtype = ctx.compute_dtype();
        let pad = self.settings.kernel / 2;
        // Weights are f32 master copies: compute in `dtype`, gradients flow
        // back through the casts.
        let conv = |x: &Tensor, (w, b): &(Tensor, Tensor)| -> candle_core::Result<Tensor> {
            let y = x.conv1d(&w.to_dtype(dtype)?, pad, 1, 1, 1)?;
            y.broadcast_add(&b.to_dtype(dtype)?.reshape((1, (), 1))?)?.relu()
        };
        let h = conv(&batch.inputs.to_dtype(dtype)?, &p.conv1)?;
        let h = ctx.dropout(&h, self.dropout)?;
        let h = conv(&h, &p.conv2)?;
        let pooled = h.mean(D::Minus1)?;
        let logits = pooled.matmul(&p.head.0.to_dtype(dtype)?.t()?)?.broadcast_add(&p.head.1.to_dtype(dtype)?)?;
        candle_nn::loss::cross_entropy(&logits.to_dtype(candle_core::DType::F32)?, &batch.targets)
    }
}
