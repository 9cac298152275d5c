//! The built-in `gpt` workload: a small decoder-only byte-level language
//! model (vocabulary: the 256 byte values) on the synthetic corpus, a JSONL
//! file or a plain text file.
//!
//! Architecture (pre-norm): token + position embeddings, `layers` blocks of
//! causal multi-head self-attention and a 4x MLP (GELU), each with layer norm
//! and a residual connection, a final layer norm and an output head.
//! Parameter names:
//! `tok_emb.weight`, `pos_emb.weight`,
//! `blocks.<i>.ln1.{weight,bias}`, `blocks.<i>.attn.qkv.{weight,bias}`,
//! `blocks.<i>.attn.proj.{weight,bias}`, `blocks.<i>.ln2.{weight,bias}`,
//! `blocks.<i>.mlp.fc.{weight,bias}`, `blocks.<i>.mlp.proj.{weight,bias}`,
//! `ln_f.{weight,bias}`, `head.weight`.

use candle_core::{D, DType, Device, Tensor};
use candle_nn::{Init, VarBuilder};

use super::data::TokenSequences;
use super::error::TrainError;
use super::layers::{Embedding, LayerNorm, Linear};
use super::workload::{Batch, ForwardCtx, Split, Workload};
use crate::config::{Config, DataKind};

/// Bytes are the tokens.
pub const VOCAB: usize = 256;

/// Shape of a [`Gpt`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GptShape {
    pub layers: usize,
    pub width: usize,
    pub heads: usize,
    pub context: usize,
    pub dropout: f64,
}

struct Block {
    ln1: LayerNorm,
    qkv: Linear,
    proj: Linear,
    ln2: LayerNorm,
    fc: Linear,
    fc_proj: Linear,
}

/// The model.
pub struct Gpt {
    shape: GptShape,
    tok_emb: Embedding,
    pos_emb: Embedding,
    blocks: Vec<Block>,
    ln_f: LayerNorm,
    head: Linear,
    /// `[context, context]`: 0 on and below the diagonal, a large negative above.
    causal_mask: Tensor,
}

impl Gpt {
    /// Declares the parameters (GPT-2 style init: N(0, 0.02), residual
    /// projections scaled by `1/sqrt(2 * layers)`, zero biases).
    pub fn new(vb: &VarBuilder<'_>, shape: GptShape) -> candle_core::Result<Self> {
        let GptShape { layers, width, context, .. } = shape;
        let normal = Init::Randn { mean: 0.0, stdev: 0.02 };
        let residual = Init::Randn { mean: 0.0, stdev: 0.02 / (2.0 * layers.max(1) as f64).sqrt() };
        let zero = Some(Init::Const(0.0));
        let mut blocks = Vec::with_capacity(layers);
        for i in 0..layers {
            let vb = vb.pp("blocks").pp(i);
            blocks.push(Block {
                ln1: LayerNorm::new(&vb.pp("ln1"), width)?,
                qkv: Linear::new(&vb.pp("attn").pp("qkv"), width, 3 * width, normal, zero)?,
                proj: Linear::new(&vb.pp("attn").pp("proj"), width, width, residual, zero)?,
                ln2: LayerNorm::new(&vb.pp("ln2"), width)?,
                fc: Linear::new(&vb.pp("mlp").pp("fc"), width, 4 * width, normal, zero)?,
                fc_proj: Linear::new(&vb.pp("mlp").pp("proj"), 4 * width, width, residual, zero)?,
            });
        }
        let mask: Vec<f32> =
            (0..context * context).map(|i| if i % context > i / context { -1e9 } else { 0.0 }).collect();
        Ok(Gpt {
            shape,
            tok_emb: Embedding::new(&vb.pp("tok_emb"), VOCAB, width, normal)?,
            pos_emb: Embedding::new(&vb.pp("pos_emb"), context, width, normal)?,
            blocks,
            ln_f: LayerNorm::new(&vb.pp("ln_f"), width)?,
            head: Linear::new(&vb.pp("head"), width, VOCAB, normal, None)?,
            causal_mask: Tensor::from_vec(mask, (context, context), vb.device())?,
        })
    }

    fn attention(&self, block: &Block, x: &Tensor, ctx: &mut ForwardCtx<'_>) -> candle_core::Result<Tensor> {
        let (b, t, c) = x.dims3()?;
        let h = self.shape.heads;
        let hd = c / h;
        let dtype = ctx.compute_dtype();
        let qkv = block.qkv.forward(x, ctx)?;
        let split = |i: usize| -> candle_core::Result<Tensor> {
            qkv.narrow(2, i * c, c)?.reshape((b, t, h, hd))?.transpose(1, 2)?.contiguous()?.to_dtype(dtype)
        };
        let (q, k, v) = (split(0)?, split(1)?, split(2)?);
        let scores = q.matmul(&k.t()?.contiguous()?)?.to_dtype(DType::F32)?.affine(1.0 / (hd as f64).sqrt(), 0.0)?;
        let mask = self.causal_mask.narrow(0, 0, t)?.narrow(1, 0, t)?;
        let probs = candle_nn::ops::softmax(&scores.broadcast_add(&mask)?, D::Minus1)?;
        let probs = ctx.dropout(&probs, self.shape.dropout)?;
        let out = probs.to_dtype(dtype)?.matmul(&v)?.to_dtype(DType::F32)?;
        let out = out.transpose(1, 2)?.reshape((b, t, c))?;
        block.proj.forward(&out, ctx)
    }

    /// Next-byte logits `[B, T, 256]` (f32) of token ids `[B, T]` (u32, `T <= context`).
    pub fn forward(&self, ids: &Tensor, ctx: &mut ForwardCtx<'_>) -> candle_core::Result<Tensor> {
        let (_, t) = ids.dims2()?;
        let positions = Tensor::arange(0u32, t as u32, ids.device())?;
        let mut x = self.tok_emb.forward(ids)?.broadcast_add(&self.pos_emb.forward(&positions)?)?;
        x = ctx.dropout(&x, self.shape.dropout)?;
        for block in &self.blocks {
            let attn = self.attention(block, &block.ln1.forward(&x)?, ctx)?;
            x = (x + ctx.dropout(&attn, self.shape.dropout)?)?;
            let hidden = block.fc.forward(&block.ln2.forward(&x)?, ctx)?.gelu()?;
            let mlp = block.fc_proj.forward(&hidden, ctx)?;
            x = (x + ctx.dropout(&mlp, self.shape.dropout)?)?;
        }
        self.head.forward(&self.ln_f.forward(&x)?, ctx)
    }
}

/// The `gpt` workload: [`Gpt`] on [`TokenSequences`], mean next-byte cross-entropy.
pub struct GptWorkload {
    data: TokenSequences,
    shape: GptShape,
    model: Option<Gpt>,
}

impl GptWorkload {
    /// The workload of `[model]` (kind `gpt`) and `[data]` (synthetic, jsonl or text).
    pub fn from_config(cfg: &Config) -> Result<Self, TrainError> {
        let m = &cfg.model;
        if m.layers == 0 || m.width == 0 || m.heads == 0 || m.context == 0 {
            return Err(TrainError::config("model", "gpt needs layers, width, heads and context > 0"));
        }
        if !m.width.is_multiple_of(m.heads) {
            return Err(TrainError::config(
                "model.heads",
                format!("width {} is not divisible by heads {}", m.width, m.heads),
            ));
        }
        let (seed, val_fraction) = (cfg.run.seed, cfg.data.val_fraction);
        let path = || {
            cfg.data.path.as_deref().ok_or_else(|| {
                TrainError::config("data.path", format!("required for kind = \"{}\"", cfg.data.kind.name()))
            })
        };
        // A file that cannot be read is the config's to fix: say which key.
        let unreadable = |e: TrainError| match e {
            TrainError::Io { path, source } => {
                TrainError::config("data.path", format!("cannot read {}: {source}", path.display()))
            }
            other => other,
        };
        let data = match cfg.data.kind {
            DataKind::Synthetic => {
                TokenSequences::synthetic(seed, cfg.data.synthetic_samples, m.context, val_fraction)?
            }
            DataKind::Jsonl => TokenSequences::from_jsonl(path()?, &cfg.data, seed, m.context).map_err(unreadable)?,
            DataKind::Text => TokenSequences::from_text(path()?, seed, m.context, val_fraction).map_err(unreadable)?,
        };
        let shape =
            GptShape { layers: m.layers, width: m.width, heads: m.heads, context: m.context, dropout: m.dropout };
        Ok(GptWorkload { data, shape, model: None })
    }
}

impl Workload for GptWorkload {
    fn name(&self) -> &str {
        "gpt"
    }

    fn build(&mut self, vb: VarBuilder<'_>) -> candle_core::Result<()> {
        self.model = Some(Gpt::new(&vb, self.shape)?);
        Ok(())
    }

    fn num_samples(&self, split: Split) -> usize {
        self.data.len(split)
    }

    fn batch(&self, split: Split, indices: &[usize], device: &Device) -> candle_core::Result<Batch> {
        let (inputs, targets) = self.data.batch(split, indices, device)?;
        Ok(Batch { inputs, targets, tokens: Some(indices.len() * self.shape.context) })
    }

    fn loss(&self, batch: &Batch, ctx: &mut ForwardCtx<'_>) -> candle_core::Result<Tensor> {
        let Some(model) = &self.model else { candle_core::bail!("gpt workload used before build") };
        let logits = model.forward(&batch.inputs, ctx)?;
        candle_nn::loss::cross_entropy(&logits.flatten_to(1)?, &batch.targets.flatten_all()?)
    }
}
