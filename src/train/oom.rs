//! The out-of-memory back-off: a step that runs out of device memory is
//! retried with half the micro-batch and twice the accumulation (the same
//! samples in the same order, the same effective batch), at most
//! [`MAX_OOM_RETRIES`] times; then the caller stops the run with a
//! checkpoint of the last completed step.
//!
//! A failed step changes nothing in the trainer (it works on copies and
//! commits only at the end), so a retry starts from exactly the state the
//! first attempt did. The smaller layout is kept for the following steps.

use serde::Serialize;

use super::error::TrainError;
use super::layout::Layout;
use super::trainer::{StepResult, Trainer};

/// Retries of one step before giving up.
pub const MAX_OOM_RETRIES: u32 = 5;

/// One retry after running out of memory (an `oom_retry` event).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OomRetry {
    /// The step being retried (1-based, as its metrics will say).
    pub step: u64,
    /// 1 for the first retry of this step, up to [`MAX_OOM_RETRIES`].
    pub retry: u32,
    /// The layout that ran out of memory.
    pub from: Layout,
    /// The layout of the retry.
    pub to: Layout,
    /// The out-of-memory error.
    pub error: String,
}

impl Trainer {
    /// [`train_step`](Self::train_step), retrying the same step after
    /// [`TrainError::OutOfMemory`] with the layout [`Layout::halved`]
    /// (effective batch unchanged), after freeing what the failed attempt
    /// held. `on_retry` hears of each retry before it runs. After
    /// [`MAX_OOM_RETRIES`] retries, or when the micro-batch is already one
    /// sample, returns [`TrainError::OutOfMemoryRetriesExhausted`]; the
    /// trainer is then as after the previous step.
    pub fn train_step_with_backoff(
        &mut self,
        should_stop: &dyn Fn() -> bool,
        on_retry: &mut dyn FnMut(&OomRetry),
    ) -> Result<StepResult, TrainError> {
        if self.rank_and_size().1 > 1 {
            // Ranks must keep one layout: no back-off in a world.
            return self.train_step(should_stop);
        }
        let mut retries = 0;
        loop {
            let (step, micro_batch, message) = match self.train_step(should_stop) {
                Err(ref e @ TrainError::OutOfMemory { step, micro_batch, .. }) => (step, micro_batch, e.to_string()),
                other => return other,
            };
            let from = self.layout();
            let next = if retries < MAX_OOM_RETRIES { from.halved() } else { None };
            let Some(to) = next else {
                return Err(TrainError::OutOfMemoryRetriesExhausted {
                    step,
                    attempts: retries + 1,
                    retries,
                    max_retries: MAX_OOM_RETRIES,
                    micro_batch,
                    message,
                });
            };
            retries += 1;
            self.set_layout(to)?;
            self.free_device_memory();
            let retry = OomRetry { step, retry: retries, from, to, error: message };
            tracing::warn!(
                step,
                retry = retries,
                from = %from,
                to = %to,
                "out of memory: retrying the step with half the micro-batch and twice the accumulation"
            );
            on_retry(&retry);
        }
    }

    /// Gives memory back before a retry. Everything the failed attempt held
    /// (activations, gradients) was dropped when it returned, and candle's
    /// CUDA allocator returns freed buffers to the driver at once, so what
    /// is left is waiting for queued work to finish (a no-op on the CPU).
    fn free_device_memory(&self) {
        if let Err(e) = self.device().synchronize() {
            tracing::warn!(error = %super::candle_message(&e), "device synchronize before an out-of-memory retry failed");
        }
    }
}
