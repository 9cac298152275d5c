//! Mixed precision: the compute dtype and the dynamic loss scaler.
//!
//! Parameters (the "master weights") and optimizer moments stay f32; with
//! `bf16` or `f16` the workload casts weights and activations to the compute
//! dtype for its matrix products. f16's narrow range needs loss scaling: the
//! loss is multiplied by `scale` before the backward pass and the gradients
//! divided by it after; a step whose gradients are not finite is skipped and
//! the scale backed off, and after `growth_interval` good steps in a row the
//! scale grows again. The scaler's state is serialisable so that a resumed
//! run continues with the same scale.

use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};

use super::error::{TrainError, candle_message};
use crate::config::{Precision, PrecisionSection};

/// The candle dtype of a `[precision] dtype`, after checking that the device
/// can run a matrix product and the casts in it.
pub fn compute_dtype(precision: Precision, device: &Device) -> Result<DType, TrainError> {
    let dtype = match precision {
        Precision::F32 => return Ok(DType::F32),
        Precision::Bf16 => DType::BF16,
        Precision::F16 => DType::F16,
    };
    let probe = || -> candle_core::Result<()> {
        let a = Tensor::ones((2, 3), DType::F32, device)?.to_dtype(dtype)?;
        let b = Tensor::ones((3, 2), DType::F32, device)?.to_dtype(dtype)?;
        let c = a.matmul(&b)?.to_dtype(DType::F32)?;
        c.sum_all()?.to_scalar::<f32>()?;
        Ok(())
    };
    probe().map_err(|e| TrainError::UnsupportedDtype {
        dtype: format!("{precision:?}").to_lowercase(),
        device: format!("{device:?}"),
        reason: candle_message(&e),
    })?;
    Ok(dtype)
}

/// Serialises an `f64` as the shortest decimal string that parses back to
/// the same bits: serde_json's default float parsing is only "best effort",
/// and a resumed run must see the exact scale.
pub(crate) mod exact_f64 {
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{v:?}"))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(|e| D::Error::custom(format!("`{text}` is not a number: {e}")))
    }
}

/// The serialisable state of a [`LossScaler`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScalerState {
    /// Whether loss scaling is active (only with f16).
    pub enabled: bool,
    /// The current scale (an exact decimal string in JSON).
    #[serde(with = "exact_f64")]
    pub scale: f64,
    /// Finite steps since the last change of scale.
    pub growth_tracker: u64,
}

/// Dynamic loss scaling as used for f16 training.
#[derive(Debug, Clone, PartialEq)]
pub struct LossScaler {
    state: ScalerState,
    growth_factor: f64,
    backoff_factor: f64,
    growth_interval: u64,
}

impl LossScaler {
    /// A scaler for `[precision]`; enabled only when the dtype is f16.
    pub fn from_config(p: &PrecisionSection) -> Self {
        let enabled = p.dtype == Precision::F16;
        LossScaler {
            state: ScalerState { enabled, scale: if enabled { p.initial_scale } else { 1.0 }, growth_tracker: 0 },
            growth_factor: p.growth_factor,
            backoff_factor: p.backoff_factor,
            growth_interval: p.growth_interval,
        }
    }

    /// Whether the scaler is active.
    pub fn enabled(&self) -> bool {
        self.state.enabled
    }

    /// The factor the loss is multiplied by (1 when disabled).
    pub fn scale(&self) -> f64 {
        if self.state.enabled { self.state.scale } else { 1.0 }
    }

    /// Records the outcome of a step: backs off after non-finite gradients,
    /// grows after `growth_interval` finite steps in a row. Returns whether
    /// the step's update may be applied.
    pub fn update(&mut self, grads_finite: bool) -> bool {
        if !self.state.enabled {
            return grads_finite;
        }
        if grads_finite {
            self.state.growth_tracker += 1;
            if self.growth_interval > 0 && self.state.growth_tracker >= self.growth_interval {
                let grown = self.state.scale * self.growth_factor;
                // Never grow into infinity: keep the old scale instead.
                if grown.is_finite() {
                    self.state.scale = grown;
                }
                self.state.growth_tracker = 0;
            }
        } else {
            self.state.scale *= self.backoff_factor;
            self.state.growth_tracker = 0;
        }
        grads_finite
    }

    /// The state to checkpoint.
    pub fn state(&self) -> ScalerState {
        self.state
    }

    /// Restores a checkpointed state (factors and interval come from the config).
    pub fn load_state(&mut self, state: ScalerState) -> Result<(), TrainError> {
        if !(state.scale.is_finite() && state.scale > 0.0) {
            return Err(TrainError::state("scaler.scale", format!("{} is not a valid scale", state.scale)));
        }
        self.state = state;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16_scaler(interval: u64) -> LossScaler {
        LossScaler::from_config(&PrecisionSection {
            dtype: Precision::F16,
            initial_scale: 1024.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: interval,
        })
    }

    #[test]
    fn backs_off_on_non_finite_gradients_and_skips_the_step() {
        let mut s = f16_scaler(3);
        s.update(true);
        assert!(!s.update(false));
        assert_eq!(s.scale(), 512.0);
        assert_eq!(s.state().growth_tracker, 0);
        assert!(!s.update(false));
        assert_eq!(s.scale(), 256.0);
    }

    #[test]
    fn grows_after_growth_interval_finite_steps() {
        let mut s = f16_scaler(3);
        assert!(s.update(true));
        assert!(s.update(true));
        assert_eq!(s.scale(), 1024.0);
        assert!(s.update(true));
        assert_eq!(s.scale(), 2048.0);
        assert_eq!(s.state().growth_tracker, 0);
    }

    #[test]
    fn is_disabled_and_neutral_without_f16() {
        let mut s = LossScaler::from_config(&PrecisionSection::default());
        assert!(!s.enabled());
        assert_eq!(s.scale(), 1.0);
        assert!(!s.update(false));
        assert_eq!(s.scale(), 1.0);
    }

    #[test]
    fn state_round_trips_through_json_exactly() {
        let mut s = f16_scaler(2);
        s.state.scale = 0.1 + 0.2; // 0.30000000000000004: 17 significant digits
        let json = serde_json::to_string(&s.state()).unwrap();
        let back: ScalerState = serde_json::from_str(&json).unwrap();
        assert_eq!(back.scale.to_bits(), s.state().scale.to_bits());
        let mut t = f16_scaler(2);
        t.load_state(back).unwrap();
        assert_eq!(t, s);
    }

    #[test]
    fn f32_needs_no_probe_and_half_types_work_on_cpu() {
        assert_eq!(compute_dtype(Precision::F32, &Device::Cpu).unwrap(), DType::F32);
        assert_eq!(compute_dtype(Precision::Bf16, &Device::Cpu).unwrap(), DType::BF16);
        assert_eq!(compute_dtype(Precision::F16, &Device::Cpu).unwrap(), DType::F16);
    }
}
