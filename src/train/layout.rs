//! How one optimizer step's samples are cut up: data-parallel replicas, each
//! with a contiguous shard of the step's samples, computed in micro-batches
//! with gradient accumulation.
//!
//! A step always trains on `batch_size × grad_accum` samples taken from the
//! data cursor in order (the effective batch); the [`Layout`] only decides
//! the pieces. Replica `r` takes samples `r·s .. (r+1)·s` of the step
//! (`s = micro_batch × grad_accum`), cut into `grad_accum` micro-batches.
//! Every piece is the same size, so the mean of the per-micro-batch mean
//! losses (and of their gradients) is the mean over the whole step whatever
//! the layout: layouts differ only in float summation order.
//!
//! Pure arithmetic, unit-tested here; the trainer executes it
//! (`trainer/`) and the out-of-memory back-off halves it (`oom.rs`).

use std::fmt;

use serde::Serialize;

/// Replicas × micro-batch × accumulation; the product is the effective batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Layout {
    /// Data-parallel replicas: gradients are computed per replica over its
    /// own shard, then averaged in replica order before the update.
    pub replicas: usize,
    /// Samples per micro-batch per replica.
    pub micro_batch: usize,
    /// Micro-batches per replica per step.
    pub grad_accum: usize,
}

impl Layout {
    /// One replica, `batch_size` samples per micro-batch, `grad_accum` of
    /// them: the layout `[train]` describes when `micro_batch` is unset.
    pub fn single(batch_size: usize, grad_accum: usize) -> Layout {
        Layout { replicas: 1, micro_batch: batch_size, grad_accum }
    }

    /// `replicas` replicas sharing `effective` samples, each cut into
    /// micro-batches of the largest divisor of its share that is at most
    /// `max_micro_batch`. `None` when `replicas` is 0 or does not divide
    /// `effective`.
    pub fn fit(effective: usize, replicas: usize, max_micro_batch: usize) -> Option<Layout> {
        if replicas == 0 || effective == 0 || !effective.is_multiple_of(replicas) {
            return None;
        }
        let per_replica = effective / replicas;
        let micro_batch = largest_divisor_at_most(per_replica, max_micro_batch);
        Some(Layout { replicas, micro_batch, grad_accum: per_replica / micro_batch })
    }

    /// Samples per optimizer step over all replicas.
    pub fn samples_per_step(&self) -> usize {
        self.replicas * self.per_replica()
    }

    /// Samples per replica per step.
    pub fn per_replica(&self) -> usize {
        self.micro_batch * self.grad_accum
    }

    /// The back-off after running out of memory: the largest micro-batch of
    /// at most half the current one that divides the per-replica share,
    /// with the accumulation that keeps the share (for powers of two: half
    /// the micro-batch, twice the accumulation). `None` at one sample.
    pub fn halved(&self) -> Option<Layout> {
        if self.micro_batch <= 1 {
            return None;
        }
        Layout::fit(self.samples_per_step(), self.replicas, self.micro_batch / 2)
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} replica(s) × micro-batch {} × {} accumulation step(s) = {} samples per step",
            self.replicas,
            self.micro_batch,
            self.grad_accum,
            self.samples_per_step()
        )
    }
}

/// The largest divisor of `n` that is at most `cap` (at least 1).
pub(crate) fn largest_divisor_at_most(n: usize, cap: usize) -> usize {
    let cap = cap.min(n).max(1);
    (1..=cap).rev().find(|&d| n.is_multiple_of(d)).unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_is_the_config_as_written() {
        let l = Layout::single(16, 2);
        assert_eq!((l.replicas, l.micro_batch, l.grad_accum, l.samples_per_step()), (1, 16, 2, 32));
    }

    #[test]
    fn fit_shares_the_batch_and_takes_the_largest_divisor_that_fits() {
        assert_eq!(Layout::fit(64, 2, 64), Some(Layout { replicas: 2, micro_batch: 32, grad_accum: 1 }));
        assert_eq!(Layout::fit(64, 2, 8), Some(Layout { replicas: 2, micro_batch: 8, grad_accum: 4 }));
        // 48 per replica: 12 is the largest divisor of 48 at most 15.
        assert_eq!(Layout::fit(96, 2, 15), Some(Layout { replicas: 2, micro_batch: 12, grad_accum: 4 }));
        assert_eq!(Layout::fit(7, 1, 3), Some(Layout { replicas: 1, micro_batch: 1, grad_accum: 7 }));
        assert_eq!(Layout::fit(10, 4, 10), None, "4 replicas cannot share 10 samples evenly");
        assert_eq!(Layout::fit(10, 0, 10), None);
        for (effective, replicas, cap) in [(32, 1, 5), (96, 4, 7), (30, 3, 100), (1, 1, 1)] {
            let l = Layout::fit(effective, replicas, cap).unwrap();
            assert_eq!(l.samples_per_step(), effective, "{l}");
            assert!(l.micro_batch <= cap, "{l}");
        }
    }

    #[test]
    fn halving_keeps_the_effective_batch_until_one_sample() {
        let mut l = Layout::single(32, 1);
        let mut seen = vec![(l.micro_batch, l.grad_accum)];
        while let Some(next) = l.halved() {
            assert_eq!(next.samples_per_step(), 32);
            assert_eq!(next.replicas, 1);
            l = next;
            seen.push((l.micro_batch, l.grad_accum));
        }
        assert_eq!(seen, [(32, 1), (16, 2), (8, 4), (4, 8), (2, 16), (1, 32)]);
    }

    #[test]
    fn halving_an_odd_share_takes_the_next_divisor_down() {
        // 2 replicas × 12 samples: 12 → 6 → 3 → 1.
        let l = Layout { replicas: 2, micro_batch: 12, grad_accum: 1 };
        let a = l.halved().unwrap();
        let b = a.halved().unwrap();
        let c = b.halved().unwrap();
        assert_eq!([a.micro_batch, b.micro_batch, c.micro_batch], [6, 3, 1]);
        assert_eq!([a.grad_accum, b.grad_accum, c.grad_accum], [2, 4, 12]);
        assert!(c.halved().is_none());
        assert!(c.samples_per_step() == 24 && c.replicas == 2);
    }

    #[test]
    fn display_names_every_factor() {
        let text = Layout { replicas: 2, micro_batch: 4, grad_accum: 3 }.to_string();
        assert_eq!(text, "2 replica(s) × micro-batch 4 × 3 accumulation step(s) = 24 samples per step");
    }
}
