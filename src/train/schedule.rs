//! The learning-rate schedule: linear warm-up, then cosine decay to `min_lr`.
//!
//! It is a pure function of the step, so its only "state" in a checkpoint is
//! the step itself: restoring the step restores the schedule's position.

use serde::{Deserialize, Serialize};

use crate::config::OptimizerSection;

/// Linear warm-up over `warmup_steps`, then cosine decay from `lr` to
/// `min_lr`, reached at step `decay_steps` (counted from step 0, warm-up
/// included) and held after it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LrSchedule {
    pub lr: f64,
    pub min_lr: f64,
    pub warmup_steps: u64,
    pub decay_steps: u64,
}

impl LrSchedule {
    /// The schedule of `[optimizer]`; `decay_steps` defaults to `max_steps`.
    pub fn from_config(opt: &OptimizerSection, max_steps: u64) -> Self {
        LrSchedule {
            lr: opt.lr,
            min_lr: opt.min_lr,
            warmup_steps: opt.warmup_steps,
            decay_steps: opt.decay_steps.unwrap_or(max_steps),
        }
    }

    /// The learning rate of the optimizer step with 0-based index `step`.
    ///
    /// During warm-up the rate rises linearly so that the last warm-up step
    /// (index `warmup_steps - 1`) uses the full `lr`.
    pub fn lr_at(&self, step: u64) -> f64 {
        if step < self.warmup_steps {
            return self.lr * (step + 1) as f64 / self.warmup_steps as f64;
        }
        if step >= self.decay_steps || self.decay_steps <= self.warmup_steps {
            return self.min_lr;
        }
        let progress = (step - self.warmup_steps) as f64 / (self.decay_steps - self.warmup_steps) as f64;
        let cosine = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
        self.min_lr + (self.lr - self.min_lr) * cosine
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sched(warmup: u64, decay: u64) -> LrSchedule {
        LrSchedule { lr: 1.0, min_lr: 0.1, warmup_steps: warmup, decay_steps: decay }
    }

    #[test]
    fn warm_up_rises_linearly_to_the_full_rate() {
        let s = sched(4, 100);
        assert_eq!(s.lr_at(0), 0.25);
        assert_eq!(s.lr_at(1), 0.5);
        assert_eq!(s.lr_at(3), 1.0);
        // The first decay step starts at the top of the cosine.
        assert_eq!(s.lr_at(4), 1.0);
    }

    #[test]
    fn cosine_reaches_its_midpoint_and_min_lr_at_the_boundaries() {
        let s = sched(0, 100);
        assert_eq!(s.lr_at(0), 1.0);
        assert!((s.lr_at(50) - 0.55).abs() < 1e-12);
        assert!(s.lr_at(99) > 0.1 && s.lr_at(99) < 0.101);
        assert_eq!(s.lr_at(100), 0.1);
        assert_eq!(s.lr_at(10_000), 0.1);
    }

    #[test]
    fn is_monotone_after_warm_up() {
        let s = sched(10, 60);
        let lrs: Vec<f64> = (10..70).map(|t| s.lr_at(t)).collect();
        assert!(lrs.windows(2).all(|w| w[1] <= w[0]));
    }

    #[test]
    fn decay_not_longer_than_warm_up_holds_min_lr_after_warm_up() {
        let s = sched(10, 5);
        assert_eq!(s.lr_at(9), 1.0);
        assert_eq!(s.lr_at(10), 0.1);
    }

    #[test]
    fn decay_defaults_to_max_steps() {
        let opt = OptimizerSection { decay_steps: None, ..OptimizerSection::default() };
        assert_eq!(LrSchedule::from_config(&opt, 321).decay_steps, 321);
        let opt = OptimizerSection { decay_steps: Some(7), ..OptimizerSection::default() };
        assert_eq!(LrSchedule::from_config(&opt, 321).decay_steps, 7);
    }
}
