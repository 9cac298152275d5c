//! Training: models, optimizer, data and the state that goes into checkpoints.
