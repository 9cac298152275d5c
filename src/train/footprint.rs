//! The memory a config's workload needs, for the placement plan: model state
//! from the real parameter count, activations per sample from an estimate
//! per built-in model (for a registered one: the size of its parameters). Used by `rekindle gpus`, `rekindle doctor` and the
//! device selection of `rekindle run`.

use crate::config::{Config, ModelKind, Precision};
use crate::gpu::Footprint;

use super::error::TrainError;
use super::registry::Registry;
use super::trainer::Trainer;

/// Bytes a checkpoint holds per parameter: the f32 parameter and AdamW's
/// two f32 moments, whatever the compute dtype.
pub const CHECKPOINT_BYTES_PER_PARAM: u64 = 12;

/// The footprint of `cfg`'s workload with `param_count` parameters.
pub fn footprint_for(cfg: &Config, param_count: usize) -> Footprint {
    let bytes = match cfg.precision.dtype {
        Precision::F32 => 4,
        Precision::Bf16 | Precision::F16 => 2,
    };
    // Activations kept for the backward pass, ~4 tensors per layer output.
    let per_sample = match &cfg.model.kind {
        ModelKind::Mlp => cfg.model.hidden.iter().sum::<usize>() as u64 * 4 * bytes,
        ModelKind::Gpt => {
            let (l, c, w) = (cfg.model.layers as u64, cfg.model.context as u64, cfg.model.width as u64);
            let attn = cfg.model.heads as u64 * c * c;
            l * (16 * c * w + 2 * attn) * bytes + c * 256 * 4 * 2
        }
        // Nothing is known of a registered model's shapes: assume the
        // activations of one sample take as much as its parameters.
        ModelKind::Registered(_) => param_count as u64 * bytes,
    };
    Footprint::estimate_from_params(param_count as u64, bytes, per_sample)
}

/// The footprint of `cfg`'s workload, building it (from `registry`) once to
/// count its parameters.
pub fn footprint(cfg: &Config, registry: &Registry) -> Result<Footprint, TrainError> {
    Ok(footprint_for(cfg, Trainer::with_workload(cfg, registry.workload(cfg)?)?.param_count()))
}

/// About the bytes one checkpoint of `param_count` parameters takes.
pub fn checkpoint_bytes(param_count: usize) -> u64 {
    param_count as u64 * CHECKPOINT_BYTES_PER_PARAM
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mlp_footprint_counts_state_and_hidden_activations() {
        let mut cfg = Config::default();
        cfg.model.hidden = vec![64, 32];
        let f = footprint_for(&cfg, 1000);
        assert_eq!((f.param_bytes, f.grad_bytes, f.optimizer_bytes), (4000, 4000, 8000));
        assert_eq!(f.activation_bytes_per_sample, 96 * 4 * 4);
        cfg.precision.dtype = Precision::Bf16;
        let half = footprint_for(&cfg, 1000);
        assert_eq!((half.param_bytes, half.optimizer_bytes), (2000, 8000), "moments stay f32");
        assert_eq!(half.activation_bytes_per_sample, f.activation_bytes_per_sample / 2);
    }

    #[test]
    fn footprint_builds_the_model_to_count_parameters() {
        let mut cfg = Config::default();
        cfg.model.input_dim = 4;
        cfg.model.hidden = vec![8];
        cfg.model.classes = 2;
        // 4×8 + 8 + 8×2 + 2 = 58 parameters.
        assert_eq!(footprint(&cfg, &Registry::builtin()).unwrap().param_bytes, 58 * 4);
        assert_eq!(checkpoint_bytes(58), 58 * 12);
    }

    #[test]
    fn a_registered_model_is_assumed_to_keep_activations_the_size_of_its_parameters() {
        let mut cfg = Config::default();
        cfg.model.kind = ModelKind::Registered("mine".into());
        assert_eq!(footprint_for(&cfg, 1000).activation_bytes_per_sample, 4000);
        cfg.precision.dtype = Precision::Bf16;
        assert_eq!(footprint_for(&cfg, 1000).activation_bytes_per_sample, 2000);
    }
}
