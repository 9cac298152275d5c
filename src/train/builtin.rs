//! The built-in workloads by name: `[model] kind` picks `mlp` or `gpt`. It
//! sits above `workload.rs` and the models, so the trait never names an
//! implementation.

use super::error::TrainError;
use super::gpt::GptWorkload;
use super::mlp::MlpWorkload;
use super::workload::Workload;
use crate::config::{Config, ModelKind};

/// The built-in workload `[model] kind` names (a registered kind is built
/// by [`Registry::workload`](super::Registry::workload)), with its data from `[data]`.
pub fn builtin_workload(cfg: &Config) -> Result<Box<dyn Workload>, TrainError> {
    Ok(match &cfg.model.kind {
        ModelKind::Mlp => Box::new(MlpWorkload::from_config(cfg)?),
        ModelKind::Gpt => Box::new(GptWorkload::from_config(cfg)?),
        ModelKind::Registered(name) => {
            return Err(TrainError::config(
                "model.kind",
                format!("`{name}` is not a built-in model kind (mlp, gpt); a registered kind is built by its Registry"),
            ));
        }
    })
}
