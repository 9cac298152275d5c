//! Training: models, optimizer, data and the state that goes into checkpoints.
//!
//! Placeholder while the training engine lands on its branch: the types the
//! orchestrator uses, with a constructor that refuses to train.

use crate::checkpoint::TensorSet;
use crate::config::Config;

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error("the training engine is not part of this build yet")]
    NotBuilt,
}

pub struct StepMetrics {
    pub step: u64,
    pub loss: f64,
}

impl StepMetrics {
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({"step": self.step, "loss": self.loss})
    }
}

pub enum StepResult {
    Completed(StepMetrics),
    Interrupted,
}

pub struct TrainSnapshot {
    pub step: u64,
    pub model: TensorSet,
    pub optimizer: TensorSet,
    pub state: serde_json::Value,
}

pub struct Trainer;

impl Trainer {
    pub fn new(_cfg: &Config) -> Result<Trainer, TrainError> {
        Err(TrainError::NotBuilt)
    }
    pub fn step(&self) -> u64 {
        0
    }
    pub fn train_step(&mut self, _stop: &dyn Fn() -> bool) -> Result<StepResult, TrainError> {
        Err(TrainError::NotBuilt)
    }
    pub fn evaluate(&mut self) -> Result<f64, TrainError> {
        Err(TrainError::NotBuilt)
    }
    pub fn snapshot(&self) -> Result<TrainSnapshot, TrainError> {
        Err(TrainError::NotBuilt)
    }
    pub fn restore(&mut self, _m: &TensorSet, _o: &TensorSet, _s: &serde_json::Value) -> Result<(), TrainError> {
        Err(TrainError::NotBuilt)
    }
}
