//! The [`Workload`] trait: what a model must provide to be trained by
//! rekindle, and the per-call context ([`ForwardCtx`]) it computes with.
//!
//! A workload declares its parameters, turns sample indices into a batch and
//! computes a scalar loss. Everything that decides *which* samples, *which*
//! random numbers and *when* (the data cursor, the RNG streams, the step)
//! stays in the [`Trainer`](super::Trainer), so any workload resumes
//! bit-exactly without doing anything itself. The built-in `mlp` and `gpt`
//! models implement it the same way a user's model would (`builtin.rs`
//! picks one; this file knows none of them); see `docs/workloads.md`.

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;

use super::rng::StreamRng;

/// Which part of the data a batch comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Split {
    /// Training samples, visited in the trainer's seeded per-epoch order.
    Train,
    /// Validation samples, visited in index order by evaluation.
    Validation,
}

/// One micro-batch, built by [`Workload::batch`] and consumed by
/// [`Workload::loss`].
#[derive(Debug, Clone)]
pub struct Batch {
    /// Model input (e.g. features `[B, D]` or token ids `[B, T]`).
    pub inputs: Tensor,
    /// What the loss compares against (e.g. class ids `[B]` or next tokens `[B, T]`).
    pub targets: Tensor,
    /// Tokens in the batch, for language models' throughput metrics.
    pub tokens: Option<usize>,
}

/// What a forward pass may know and draw: the compute dtype, whether it is
/// training, and (only when training) the dropout random stream.
pub struct ForwardCtx<'a> {
    dtype: DType,
    rng: Option<&'a mut StreamRng>,
}

impl<'a> ForwardCtx<'a> {
    /// A training pass: dropout is active and draws from `rng`.
    pub fn training(dtype: DType, rng: &'a mut StreamRng) -> Self {
        ForwardCtx { dtype, rng: Some(rng) }
    }

    /// An evaluation pass: no dropout, no random draws.
    pub fn evaluation(dtype: DType) -> Self {
        ForwardCtx { dtype, rng: None }
    }

    /// Whether this is a training pass.
    pub fn is_training(&self) -> bool {
        self.rng.is_some()
    }

    /// The dtype matrix products should run in (`F32`, `BF16` or `F16`);
    /// parameters are f32 and are cast to it by the workload.
    pub fn compute_dtype(&self) -> DType {
        self.dtype
    }

    /// The training pass's random stream (dropout and any other noise a
    /// model needs); `None` during evaluation. Draws from it are part of the
    /// checkpointed state, so they replay exactly after a resume.
    pub fn rng(&mut self) -> Option<&mut StreamRng> {
        self.rng.as_deref_mut()
    }

    /// Inverted dropout with probability `p`: during training, zeroes each
    /// element with probability `p` and scales the rest by `1 / (1 - p)`;
    /// the identity during evaluation or when `p` is 0.
    pub fn dropout(&mut self, x: &Tensor, p: f64) -> candle_core::Result<Tensor> {
        let Some(rng) = self.rng.as_deref_mut() else { return Ok(x.clone()) };
        if p <= 0.0 {
            return Ok(x.clone());
        }
        if p >= 1.0 {
            return x.zeros_like();
        }
        let keep = (1.0 / (1.0 - p)) as f32;
        let mask: Vec<f32> = (0..x.elem_count()).map(|_| if rng.next_f64() < p { 0.0 } else { keep }).collect();
        let mask = Tensor::from_vec(mask, x.shape(), x.device())?.to_dtype(x.dtype())?;
        x * mask
    }
}

/// A model and its data, trainable by [`Trainer`](super::Trainer).
///
/// The trainer calls [`build`](Workload::build) once, then per micro-batch
/// [`batch`](Workload::batch) with the sample indices its data cursor chose,
/// and [`loss`](Workload::loss). A workload must be deterministic given its
/// inputs: no clocks, no candle random ops (`Tensor::rand*` cannot be
/// seeded on CPU), randomness only from [`ForwardCtx::rng`] or
/// [`ForwardCtx::dropout`].
///
/// # Example
///
/// A custom workload fitting `y = 3x - 1` with one `candle_nn::Linear`:
///
/// ```
/// use candle_core::{Device, Tensor};
/// use candle_nn::{Linear, Module, VarBuilder};
/// use rekindle::config::Config;
/// use rekindle::train::{Batch, ForwardCtx, Split, StepResult, Trainer, Workload};
///
/// struct Line {
///     model: Option<Linear>,
/// }
///
/// impl Workload for Line {
///     fn name(&self) -> &str {
///         "line"
///     }
///
///     fn build(&mut self, vb: VarBuilder<'_>) -> candle_core::Result<()> {
///         // Initial values come from rekindle's seeded init stream.
///         self.model = Some(candle_nn::linear(1, 1, vb.pp("fc"))?);
///         Ok(())
///     }
///
///     fn num_samples(&self, split: Split) -> usize {
///         match split {
///             Split::Train => 64,
///             Split::Validation => 16,
///         }
///     }
///
///     fn batch(&self, split: Split, indices: &[usize], device: &Device) -> candle_core::Result<Batch> {
///         let offset = if split == Split::Train { 0.0 } else { 0.5 };
///         let xs: Vec<f32> = indices.iter().map(|&i| i as f32 / 64.0 + offset).collect();
///         let ys: Vec<f32> = xs.iter().map(|x| 3.0 * x - 1.0).collect();
///         Ok(Batch {
///             inputs: Tensor::from_vec(xs, (indices.len(), 1), device)?,
///             targets: Tensor::from_vec(ys, (indices.len(), 1), device)?,
///             tokens: None,
///         })
///     }
///
///     fn loss(&self, batch: &Batch, _ctx: &mut ForwardCtx<'_>) -> candle_core::Result<Tensor> {
///         let model = self.model.as_ref().expect("built");
///         candle_nn::loss::mse(&model.forward(&batch.inputs)?, &batch.targets)
///     }
/// }
///
/// let mut cfg = Config::default();
/// cfg.train.batch_size = 8;
/// cfg.optimizer.lr = 0.05;
/// cfg.optimizer.weight_decay = 0.0;
/// let mut trainer = Trainer::with_workload(&cfg, Box::new(Line { model: None }))?;
/// let before = trainer.evaluate()?;
/// for _ in 0..100 {
///     match trainer.train_step(&|| false)? {
///         StepResult::Completed(m) => assert!(m.loss.is_finite()),
///         other => panic!("unexpected {other:?}"),
///     }
/// }
/// assert!(trainer.evaluate()? < before / 10.0);
/// assert_eq!(trainer.step(), 100);
/// # Ok::<(), rekindle::train::TrainError>(())
/// ```
pub trait Workload: Send {
    /// A short name, recorded in checkpoints: a restore refuses the state of
    /// a different workload.
    fn name(&self) -> &str;

    /// Declares the parameters through `vb` (f32; names are the builder's
    /// prefixes, e.g. `blocks.0.attn.qkv.weight`) and keeps whatever model
    /// structure the workload needs. Called once.
    fn build(&mut self, vb: VarBuilder<'_>) -> candle_core::Result<()>;

    /// Samples in a split (0 for a split the workload does not have).
    fn num_samples(&self, split: Split) -> usize;

    /// The batch made of samples `indices` (each below `num_samples(split)`).
    fn batch(&self, split: Split, indices: &[usize], device: &Device) -> candle_core::Result<Batch>;

    /// The mean loss of a batch: a scalar (rank-0) tensor. During training
    /// the trainer differentiates it with respect to every parameter.
    fn loss(&self, batch: &Batch, ctx: &mut ForwardCtx<'_>) -> candle_core::Result<Tensor>;
}

/// `docs/workloads.md`, whose example is compiled and run as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../../docs/workloads.md")]
pub struct WorkloadsGuide;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::rng::Stream;

    #[test]
    fn dropout_is_identity_in_evaluation_and_drawn_from_the_stream_in_training() {
        let x = Tensor::ones((4, 50), DType::F32, &Device::Cpu).unwrap();
        let mut eval = ForwardCtx::evaluation(DType::F32);
        assert!(!eval.is_training());
        let same = eval.dropout(&x, 0.5).unwrap();
        assert_eq!(same.to_vec2::<f32>().unwrap(), x.to_vec2::<f32>().unwrap());

        let draw = || {
            let mut rng = StreamRng::new(1, Stream::Dropout);
            let mut ctx = ForwardCtx::training(DType::F32, &mut rng);
            let y = ctx.dropout(&x, 0.5).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            (y, rng.state())
        };
        let (a, state_a) = draw();
        let (b, state_b) = draw();
        assert_eq!(a, b);
        assert_eq!(state_a, state_b);
        assert!(a.iter().all(|&v| v == 0.0 || v == 2.0));
        let zeros = a.iter().filter(|&&v| v == 0.0).count();
        assert!((60..140).contains(&zeros), "{zeros}");
    }
}
