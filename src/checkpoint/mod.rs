//! Checkpoints (placeholder in the train branch): host tensors only.

mod tensor;

pub use tensor::*;
