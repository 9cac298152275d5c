//! `metrics.jsonl`: a [`StepLine`] every `[train] log_every` steps (and at
//! `max_steps`), and a [`ValLine`] every `[train] eval_every` steps. Non-finite
//! numbers are written as `null`. Also the report's views of those lines.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::records::time_field;

/// One line of `metrics.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum MetricsLine {
    Step(StepLine),
    Val(ValLine),
}

/// A training step.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StepLine {
    /// Steps completed, this one included.
    pub step: u64,
    /// Mean loss over the step's micro-batches.
    pub loss: Option<f64>,
    pub lr: Option<f64>,
    /// Global L2 norm of the gradient before clipping.
    pub grad_norm: Option<f64>,
    pub clipped: bool,
    /// Samples in the step.
    pub samples: u64,
    /// Tokens in the step (language models; `null` otherwise).
    pub tokens: Option<u64>,
    pub samples_per_s: Option<f64>,
    pub tokens_per_s: Option<f64>,
    /// The loss scale after the step (f16 only; `null` otherwise).
    pub loss_scale: Option<f64>,
    /// The update was skipped: a loss or gradient was not finite.
    pub skipped_nonfinite: bool,
    /// Epoch of the data cursor after the step.
    pub epoch: u64,
    /// Wall-clock seconds of the step.
    pub elapsed_s: Option<f64>,
    /// A run of several ranks: each rank's seconds of its own forward and
    /// backward in the step (not its wait for the others), in rank order;
    /// only for worlds of at most `[telemetry] rank_times_max` ranks.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rank_compute_s: Vec<f64>,
    /// A run of several ranks: the same seconds summarised, whatever the
    /// world size (a line stays O(1) in the number of ranks).
    /// (Boxed: most lines are of one process, and a line is an enum variant.)
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank_compute: Option<Box<RankCompute>>,
    /// RFC 3339, UTC.
    pub time: String,
}

/// Each rank's own seconds of a step, summarised: what tells a straggler
/// at any world size in a few numbers (docs/run-directory.md).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RankCompute {
    /// Ranks whose seconds are known (finite).
    pub ranks: u64,
    pub min_s: Option<f64>,
    pub median_s: Option<f64>,
    pub max_s: Option<f64>,
    /// The rank of `max_s` (the lowest such rank on a tie).
    pub slowest_rank: Option<u64>,
}

impl RankCompute {
    /// The summary of `seconds` (in rank order; a value that is not finite,
    /// an unknown time, is left out); `None` for fewer than two ranks.
    pub fn of(seconds: &[f64]) -> Option<RankCompute> {
        if seconds.len() < 2 {
            return None;
        }
        let mut known: Vec<(f64, usize)> =
            seconds.iter().enumerate().filter(|(_, s)| s.is_finite()).map(|(r, s)| (*s, r)).collect();
        // By seconds, then by rank: the slowest is the lowest rank on a tie.
        known.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.cmp(&a.1)));
        let n = known.len();
        let median = match n {
            0 => None,
            _ if n % 2 == 1 => Some(known[n / 2].0),
            _ => Some((known[n / 2 - 1].0 + known[n / 2].0) / 2.0),
        };
        Some(RankCompute {
            ranks: n as u64,
            min_s: known.first().map(|k| k.0),
            median_s: median,
            max_s: known.last().map(|k| k.0),
            slowest_rank: known.last().map(|k| k.1 as u64),
        })
    }
}

/// A validation loss.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ValLine {
    pub step: u64,
    pub val_loss: Option<f64>,
    pub time: String,
}

impl MetricsLine {
    /// Types a record: a validation line has `val_loss`, a step line `loss`;
    /// anything else (or a line without a step) is `None`.
    pub fn from_value(v: &Value) -> Option<MetricsLine> {
        v.get("step")?.as_u64()?;
        if v.get("val_loss").is_some() {
            serde_json::from_value(v.clone()).ok().map(MetricsLine::Val)
        } else if v.get("loss").is_some() {
            serde_json::from_value(v.clone()).ok().map(MetricsLine::Step)
        } else {
            None
        }
    }

    pub fn step(&self) -> u64 {
        match self {
            MetricsLine::Step(s) => s.step,
            MetricsLine::Val(v) => v.step,
        }
    }
}

/// The step of a metrics record of either kind.
pub fn metrics_step(v: &Value) -> Option<u64> {
    v.get("step")?.as_u64()
}

/// A training line of `metrics.jsonl`, for plotting.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricPoint {
    pub step: u64,
    pub time: Option<DateTime<Utc>>,
    pub loss: Option<f64>,
    pub lr: Option<f64>,
    pub samples_per_s: Option<f64>,
    pub tokens_per_s: Option<f64>,
    /// Seconds per step of each rank: its own work (`rank_compute_s`) in a
    /// run of several ranks, the step's wall time (`elapsed_s`) for one
    /// process; `None` where a rank's time is missing or not finite.
    pub rank_step_s: Vec<Option<f64>>,
    /// A run of more ranks than `[telemetry] rank_times_max`: their seconds
    /// summarised (`rank_compute`), where `rank_step_s` is empty.
    pub rank_spread: Option<RankCompute>,
}

/// A validation line of `metrics.jsonl`, for plotting.
#[derive(Debug, Clone, PartialEq)]
pub struct ValPoint {
    pub step: u64,
    pub time: Option<DateTime<Utc>>,
    pub val_loss: f64,
}

/// Splits metric records into training and validation points (each sorted
/// by step). Non-finite values are dropped: they cannot be plotted.
pub fn metrics_from(records: &[Value]) -> (Vec<MetricPoint>, Vec<ValPoint>) {
    let (mut train, mut val) = (Vec::new(), Vec::new());
    for r in records {
        match metric_point(r) {
            Some(MetricRecord::Train(m)) => train.push(m),
            Some(MetricRecord::Val(v)) => val.push(v),
            None => {}
        }
    }
    train.sort_by_key(|m| m.step);
    val.sort_by_key(|v| v.step);
    (train, val)
}

/// One line of `metrics.jsonl` for plotting.
#[derive(Debug, Clone, PartialEq)]
pub enum MetricRecord {
    Train(MetricPoint),
    Val(ValPoint),
}

/// What a line of `metrics.jsonl` plots (a reader that streams the file
/// takes it a line at a time); `None` for a line that is neither, or a
/// validation line without a finite loss.
pub fn metric_point(r: &Value) -> Option<MetricRecord> {
    let finite = |x: Option<f64>| x.filter(|x| x.is_finite());
    let time = time_field(r, "time");
    match MetricsLine::from_value(r)? {
        MetricsLine::Val(v) => {
            finite(v.val_loss).map(|val_loss| MetricRecord::Val(ValPoint { step: v.step, time, val_loss }))
        }
        MetricsLine::Step(s) => Some(MetricRecord::Train(MetricPoint {
            step: s.step,
            time,
            loss: finite(s.loss),
            lr: finite(s.lr),
            samples_per_s: finite(s.samples_per_s),
            tokens_per_s: finite(s.tokens_per_s),
            rank_step_s: if !s.rank_compute_s.is_empty() {
                s.rank_compute_s.iter().map(|t| finite(Some(*t))).collect()
            } else if s.rank_compute.is_some() {
                Vec::new()
            } else {
                vec![finite(s.elapsed_s)]
            },
            rank_spread: s.rank_compute.filter(|_| s.rank_compute_s.is_empty()).map(|b| *b),
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rank_seconds_are_summarised_in_a_few_numbers_at_any_world_size() {
        assert_eq!(RankCompute::of(&[]), None);
        assert_eq!(RankCompute::of(&[0.5]), None, "one process has no ranks to compare");
        let r = RankCompute::of(&[0.2, 0.9, 0.1, 0.9]).unwrap();
        assert_eq!(
            r,
            RankCompute { ranks: 4, min_s: Some(0.1), median_s: Some(0.55), max_s: Some(0.9), slowest_rank: Some(1) },
            "median of an even count is the mean of the middle two; the slowest is the lowest rank on a tie"
        );
        let r = RankCompute::of(&[0.3, f64::NAN, 0.1]).unwrap();
        assert_eq!((r.ranks, r.median_s, r.slowest_rank), (2, Some(0.2), Some(0)), "an unknown time is left out");
        // 4,096 ranks: the same five fields.
        let many: Vec<f64> = (0..4096).map(|r| if r == 4000 { 9.0 } else { 1.0 + (r % 7) as f64 / 100.0 }).collect();
        let r = RankCompute::of(&many).unwrap();
        assert_eq!((r.ranks, r.max_s, r.slowest_rank, r.min_s), (4096, Some(9.0), Some(4000), Some(1.0)));
        let line = MetricsLine::Step(StepLine { step: 1, rank_compute: Some(Box::new(r)), ..StepLine::default() });
        assert!(serde_json::to_string(&line).unwrap().len() < 400, "a step line stays short");
    }

    #[test]
    fn step_and_val_lines_write_their_own_fields_only() {
        let step = MetricsLine::Step(StepLine { step: 3, loss: Some(f64::NAN), lr: Some(0.1), ..StepLine::default() });
        let v = serde_json::to_value(&step).unwrap();
        assert_eq!(v["loss"], Value::Null);
        assert_eq!(v["tokens"], Value::Null);
        assert!(v.get("val_loss").is_none());
        assert_eq!(v.as_object().unwrap().len(), 14);
        let val =
            serde_json::to_value(MetricsLine::Val(ValLine { step: 3, val_loss: Some(0.5), time: "t".into() })).unwrap();
        assert_eq!(val, json!({"step": 3, "val_loss": 0.5, "time": "t"}));
        assert_eq!(MetricsLine::from_value(&val).map(|l| l.step()), Some(3));
        assert!(matches!(MetricsLine::from_value(&v), Some(MetricsLine::Step(_))));
        assert_eq!(MetricsLine::from_value(&json!({"step": 1})), None);
        assert_eq!(metrics_step(&json!({"step": 1})), Some(1));
    }
}
