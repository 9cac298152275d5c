//! The built-in `mlp` workload: a multi-layer perceptron classifier on the
//! synthetic Gaussian-cluster data.
//!
//! Parameters: `layers.<i>.weight` / `layers.<i>.bias` for each hidden layer
//! (ReLU, then dropout), and `head.weight` / `head.bias` for the logits.

use candle_core::{Device, Tensor};
use candle_nn::{Init, VarBuilder};

use super::data::Classification;
use super::error::TrainError;
use super::layers::Linear;
use super::workload::{Batch, ForwardCtx, Split, Workload};
use crate::config::{Config, DataKind};

/// The network.
#[derive(Debug, Clone)]
pub struct Mlp {
    layers: Vec<Linear>,
    head: Linear,
    dropout: f64,
}

fn fan_in_uniform(fan_in: usize) -> Init {
    let bound = 1.0 / (fan_in.max(1) as f64).sqrt();
    Init::Uniform { lo: -bound, up: bound }
}

impl Mlp {
    /// Declares the parameters of `input_dim -> hidden... -> classes`.
    pub fn new(
        vb: &VarBuilder<'_>,
        input_dim: usize,
        hidden: &[usize],
        classes: usize,
        dropout: f64,
    ) -> candle_core::Result<Self> {
        let mut layers = Vec::with_capacity(hidden.len());
        let mut width = input_dim;
        for (i, &h) in hidden.iter().enumerate() {
            let vb = vb.pp("layers").pp(i);
            layers.push(Linear::new(
                &vb,
                width,
                h,
                candle_nn::init::DEFAULT_KAIMING_NORMAL,
                Some(fan_in_uniform(width)),
            )?);
            width = h;
        }
        let head = Linear::new(
            &vb.pp("head"),
            width,
            classes,
            candle_nn::init::DEFAULT_KAIMING_UNIFORM,
            Some(fan_in_uniform(width)),
        )?;
        Ok(Mlp { layers, head, dropout })
    }

    /// Logits `[B, classes]` (f32) of features `[B, input_dim]`.
    pub fn forward(&self, x: &Tensor, ctx: &mut ForwardCtx<'_>) -> candle_core::Result<Tensor> {
        let mut h = x.clone();
        for layer in &self.layers {
            h = layer.forward(&h, ctx)?.relu()?;
            h = ctx.dropout(&h, self.dropout)?;
        }
        self.head.forward(&h, ctx)
    }
}

/// The `mlp` workload: [`Mlp`] on [`Classification`] data, cross-entropy loss.
pub struct MlpWorkload {
    data: Classification,
    input_dim: usize,
    hidden: Vec<usize>,
    dropout: f64,
    model: Option<Mlp>,
}

impl MlpWorkload {
    /// The workload of `[model]` (kind `mlp`) and `[data]` (kind `synthetic`).
    pub fn from_config(cfg: &Config) -> Result<Self, TrainError> {
        let m = &cfg.model;
        if cfg.data.kind != DataKind::Synthetic {
            return Err(TrainError::config(
                "data.kind",
                "the mlp model trains on synthetic data only; use kind = \"synthetic\"",
            ));
        }
        if m.input_dim == 0 || m.classes < 2 || m.hidden.contains(&0) {
            return Err(TrainError::config(
                "model",
                format!(
                    "mlp needs input_dim > 0, classes >= 2 and non-zero hidden widths (got {}, {}, {:?})",
                    m.input_dim, m.classes, m.hidden
                ),
            ));
        }
        let data = Classification::synthetic(
            cfg.run.seed,
            cfg.data.synthetic_samples,
            m.input_dim,
            m.classes,
            cfg.data.val_fraction,
        )?;
        Ok(MlpWorkload { data, input_dim: m.input_dim, hidden: m.hidden.clone(), dropout: m.dropout, model: None })
    }
}

impl Workload for MlpWorkload {
    fn name(&self) -> &str {
        "mlp"
    }

    fn build(&mut self, vb: VarBuilder<'_>) -> candle_core::Result<()> {
        self.model = Some(Mlp::new(&vb, self.input_dim, &self.hidden, self.data.classes(), self.dropout)?);
        Ok(())
    }

    fn num_samples(&self, split: Split) -> usize {
        self.data.len(split)
    }

    fn batch(&self, split: Split, indices: &[usize], device: &Device) -> candle_core::Result<Batch> {
        let (inputs, targets) = self.data.batch(split, indices, device)?;
        Ok(Batch { inputs, targets, tokens: None })
    }

    fn loss(&self, batch: &Batch, ctx: &mut ForwardCtx<'_>) -> candle_core::Result<Tensor> {
        let Some(model) = &self.model else { candle_core::bail!("mlp workload used before build") };
        let logits = model.forward(&batch.inputs, ctx)?;
        candle_nn::loss::cross_entropy(&logits, &batch.targets)
    }
}
