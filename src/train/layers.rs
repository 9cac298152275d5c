//! Building blocks of the built-in models, aware of the compute dtype.
//!
//! Like automatic mixed precision elsewhere: parameters are f32; matrix
//! products run in the [`ForwardCtx`]'s compute dtype (weights and inputs
//! cast on the way in, results cast back to f32); layer norm, softmax and
//! the loss stay in f32. With f32 compute every cast is a no-op. All layers
//! are written with differentiable primitive ops so the backward pass covers
//! them.

use candle_core::{D, DType, Tensor};
use candle_nn::{Init, VarBuilder};

use super::workload::ForwardCtx;

/// `y = x W^T + b` over the last dimension of `x` (any rank ≥ 1).
#[derive(Debug, Clone)]
pub struct Linear {
    weight: Tensor,
    bias: Option<Tensor>,
}

impl Linear {
    /// Declares `weight` `[out, in]` (initialised by `init`) and, if
    /// `bias_init` is given, `bias` `[out]`, under `vb`'s prefix.
    pub fn new(
        vb: &VarBuilder<'_>,
        in_dim: usize,
        out_dim: usize,
        init: Init,
        bias_init: Option<Init>,
    ) -> candle_core::Result<Self> {
        let weight = vb.get_with_hints((out_dim, in_dim), "weight", init)?;
        let bias = bias_init.map(|b| vb.get_with_hints(out_dim, "bias", b)).transpose()?;
        Ok(Linear { weight, bias })
    }

    /// Applies the layer; the product runs in the compute dtype, the result is f32.
    pub fn forward(&self, x: &Tensor, ctx: &ForwardCtx<'_>) -> candle_core::Result<Tensor> {
        let dtype = ctx.compute_dtype();
        let (out_dim, in_dim) = self.weight.dims2()?;
        let mut out_shape = x.dims().to_vec();
        let rows: usize = out_shape[..out_shape.len() - 1].iter().product();
        *out_shape.last_mut().expect("rank >= 1") = out_dim;
        let x2 = x.reshape((rows, in_dim))?.to_dtype(dtype)?;
        let mut y = x2.matmul(&self.weight.to_dtype(dtype)?.t()?)?;
        if let Some(b) = &self.bias {
            y = y.broadcast_add(&b.to_dtype(dtype)?)?;
        }
        y.to_dtype(DType::F32)?.reshape(out_shape)
    }
}

/// Layer normalisation over the last dimension, in f32, with a learned
/// scale (`weight`, init 1) and shift (`bias`, init 0).
#[derive(Debug, Clone)]
pub struct LayerNorm {
    weight: Tensor,
    bias: Tensor,
    eps: f64,
}

impl LayerNorm {
    /// Declares `weight` and `bias` of size `dim` under `vb`'s prefix.
    pub fn new(vb: &VarBuilder<'_>, dim: usize) -> candle_core::Result<Self> {
        Ok(LayerNorm {
            weight: vb.get_with_hints(dim, "weight", Init::Const(1.0))?,
            bias: vb.get_with_hints(dim, "bias", Init::Const(0.0))?,
            eps: 1e-5,
        })
    }

    /// Normalises `x` (f32) over its last dimension.
    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let mean = x.mean_keepdim(D::Minus1)?;
        let centered = x.broadcast_sub(&mean)?;
        let var = centered.sqr()?.mean_keepdim(D::Minus1)?;
        let normed = centered.broadcast_div(&var.affine(1.0, self.eps)?.sqrt()?)?;
        normed.broadcast_mul(&self.weight)?.broadcast_add(&self.bias)
    }
}

/// A lookup table `[vocab, dim]`.
#[derive(Debug, Clone)]
pub struct Embedding {
    weight: Tensor,
}

impl Embedding {
    /// Declares `weight` `[vocab, dim]` under `vb`'s prefix.
    pub fn new(vb: &VarBuilder<'_>, vocab: usize, dim: usize, init: Init) -> candle_core::Result<Self> {
        Ok(Embedding { weight: vb.get_with_hints((vocab, dim), "weight", init)? })
    }

    /// Rows of the table for `ids` (u32, any shape); result `[..ids, dim]`, f32.
    pub fn forward(&self, ids: &Tensor) -> candle_core::Result<Tensor> {
        let mut shape = ids.dims().to_vec();
        shape.push(self.weight.dim(1)?);
        self.weight.index_select(&ids.flatten_all()?, 0)?.reshape(shape)
    }
}
