//! Reading a run's JSON-lines records back: `events.jsonl`, `metrics.jsonl`
//! and `gpu_stats.jsonl`, as typed values for `rekindle report` and
//! `rekindle status`.
//!
//! Writers append one line per record, so a crash can leave a torn last line
//! (and a resumed writer terminates it, leaving a torn line in the middle).
//! Readers therefore skip every line that does not parse and count them,
//! never failing on one.

use std::io;
use std::path::Path;

use chrono::{DateTime, Utc};
use serde_json::Value;

/// The lines of a JSON-lines file that parse as JSON objects.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Jsonl {
    pub records: Vec<Value>,
    /// Non-empty lines that did not parse (torn writes).
    pub skipped: usize,
}

/// Reads `path` leniently; a missing file is `Ok(None)`.
pub fn read_jsonl(path: &Path) -> io::Result<Option<Jsonl>> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    Ok(Some(parse_jsonl(&String::from_utf8_lossy(&bytes))))
}

/// Parses JSON lines, skipping (and counting) those that are not JSON objects.
pub fn parse_jsonl(text: &str) -> Jsonl {
    let mut out = Jsonl::default();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        match serde_json::from_str::<Value>(line) {
            Ok(v) if v.is_object() => out.records.push(v),
            _ => out.skipped += 1,
        }
    }
    out
}

/// An RFC 3339 field as a UTC time.
pub fn time_field(v: &Value, key: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(v.get(key)?.as_str()?).ok().map(|t| t.with_timezone(&Utc))
}

/// One line of `events.jsonl`: the common fields typed, the rest in `raw`.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// start, resume, checkpoint_saved, signal, stop, requeue, finish, …
    pub name: String,
    pub time: Option<DateTime<Utc>>,
    pub node: Option<String>,
    pub job_id: Option<String>,
    /// SLURM's restart count when the event was written (0 outside SLURM).
    pub slurm_attempt: Option<u64>,
    /// The event's own `step`, when it has one.
    pub step: Option<u64>,
    pub raw: Value,
}

impl Event {
    /// Types a record; `None` when it has no `event` name.
    pub fn from_value(raw: Value) -> Option<Event> {
        let name = raw.get("event")?.as_str()?.to_string();
        let text = |k: &str| match raw.get(k) {
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Number(n)) => Some(n.to_string()),
            _ => None,
        };
        Some(Event {
            time: time_field(&raw, "time"),
            node: text("node"),
            job_id: text("job_id"),
            slurm_attempt: raw.get("attempt").and_then(Value::as_u64),
            step: raw.get("step").and_then(Value::as_u64),
            name,
            raw,
        })
    }

    /// A string field of the event.
    pub fn str_field(&self, key: &str) -> Option<&str> {
        self.raw.get(key)?.as_str()
    }

    /// A numeric field of the event.
    pub fn f64_field(&self, key: &str) -> Option<f64> {
        self.raw.get(key)?.as_f64()
    }
}

/// Types every record that names an event.
pub fn events_from(records: Vec<Value>) -> Vec<Event> {
    records.into_iter().filter_map(Event::from_value).collect()
}

/// A training line of `metrics.jsonl`.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricPoint {
    pub step: u64,
    pub time: Option<DateTime<Utc>>,
    pub loss: Option<f64>,
    pub lr: Option<f64>,
    pub samples_per_s: Option<f64>,
    pub tokens_per_s: Option<f64>,
}

/// A validation line of `metrics.jsonl`.
#[derive(Debug, Clone, PartialEq)]
pub struct ValPoint {
    pub step: u64,
    pub time: Option<DateTime<Utc>>,
    pub val_loss: f64,
}

/// Splits metric records into training and validation points (each sorted
/// by step). Non-finite values are dropped: they cannot be plotted.
pub fn metrics_from(records: &[Value]) -> (Vec<MetricPoint>, Vec<ValPoint>) {
    let finite = |v: &Value, k: &str| v.get(k).and_then(Value::as_f64).filter(|x| x.is_finite());
    let (mut train, mut val) = (Vec::new(), Vec::new());
    for r in records {
        let Some(step) = r.get("step").and_then(Value::as_u64) else { continue };
        let time = time_field(r, "time");
        if let Some(val_loss) = finite(r, "val_loss") {
            val.push(ValPoint { step, time, val_loss });
        } else if r.get("loss").is_some() {
            train.push(MetricPoint {
                step,
                time,
                loss: finite(r, "loss"),
                lr: finite(r, "lr"),
                samples_per_s: finite(r, "samples_per_s"),
                tokens_per_s: finite(r, "tokens_per_s"),
            });
        }
    }
    train.sort_by_key(|m| m.step);
    val.sort_by_key(|v| v.step);
    (train, val)
}

/// One device in one line of `gpu_stats.jsonl`.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuDeviceSample {
    /// `nvidia 0`, `amd 1`, …: stable across samples.
    pub label: String,
    pub utilization_pct: Option<f64>,
    pub memory_used_mib: Option<f64>,
    pub memory_total_mib: Option<f64>,
}

/// One line of `gpu_stats.jsonl` (see `gpu::monitor` for the writer).
#[derive(Debug, Clone, PartialEq)]
pub struct GpuSample {
    pub time: DateTime<Utc>,
    pub devices: Vec<GpuDeviceSample>,
}

/// Types GPU monitor records; lines without a time are skipped.
pub fn gpu_samples_from(records: &[Value]) -> Vec<GpuSample> {
    let mut out: Vec<GpuSample> = records
        .iter()
        .filter_map(|r| {
            let time = time_field(r, "time")?;
            let devices = r
                .get("devices")
                .and_then(Value::as_array)
                .map(|ds| {
                    ds.iter()
                        .enumerate()
                        .map(|(i, d)| {
                            let vendor = d.get("vendor").and_then(Value::as_str).unwrap_or("gpu");
                            let index = d.get("index").and_then(Value::as_u64).unwrap_or(i as u64);
                            GpuDeviceSample {
                                label: format!("{vendor} {index}"),
                                utilization_pct: d.get("utilization_pct").and_then(Value::as_f64),
                                memory_used_mib: d.get("memory_used_mib").and_then(Value::as_f64),
                                memory_total_mib: d.get("memory_total_mib").and_then(Value::as_f64),
                            }
                        })
                        .collect()
                })
                .unwrap_or_default();
            Some(GpuSample { time, devices })
        })
        .collect();
    out.sort_by_key(|s| s.time);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn torn_lines_are_skipped_and_counted() {
        let j = parse_jsonl("{\"step\":1}\n{\"ste\n{\"step\":2}\n\n{\"step\":3,\"lo");
        assert_eq!(j.records, vec![json!({"step": 1}), json!({"step": 2})]);
        assert_eq!(j.skipped, 2);
    }

    #[test]
    fn missing_file_reads_as_none() {
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(read_jsonl(&tmp.path().join("absent.jsonl")).unwrap(), None);
    }

    #[test]
    fn events_type_common_fields_and_keep_the_rest() {
        let e = Event::from_value(json!({"event": "resume", "time": "2026-11-01T10:00:00.000Z", "node": "n2",
            "job_id": 42, "attempt": 1, "step": 100, "steps_lost": 7}))
        .unwrap();
        assert_eq!(e.name, "resume");
        assert_eq!(e.node.as_deref(), Some("n2"));
        assert_eq!(e.job_id.as_deref(), Some("42"));
        assert_eq!((e.slurm_attempt, e.step), (Some(1), Some(100)));
        assert_eq!(e.raw["steps_lost"], 7);
        assert!(e.time.is_some());
        assert_eq!(Event::from_value(json!({"step": 1})), None);
    }

    #[test]
    fn metrics_split_into_train_and_validation_sorted_by_step() {
        let recs = vec![
            json!({"step": 2, "loss": 0.5, "lr": 0.1, "samples_per_s": 10.0}),
            json!({"step": 1, "loss": 0.9, "lr": 0.1}),
            json!({"step": 2, "val_loss": 0.6}),
            json!({"step": 3, "loss": null}),
        ];
        let (train, val) = metrics_from(&recs);
        assert_eq!(train.iter().map(|m| m.step).collect::<Vec<_>>(), vec![1, 2, 3]);
        assert_eq!(train[2].loss, None);
        assert_eq!(train[1].samples_per_s, Some(10.0));
        assert_eq!(val.len(), 1);
        assert_eq!(val[0].val_loss, 0.6);
    }

    #[test]
    fn gpu_samples_label_devices_by_vendor_and_index() {
        let recs = vec![
            json!({"time": "2026-11-01T10:00:00Z", "devices": [
                {"vendor": "nvidia", "index": 1, "utilization_pct": 90, "memory_used_mib": 1000, "memory_total_mib": 8000}
            ]}),
            json!({"devices": []}),
        ];
        let s = gpu_samples_from(&recs);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].devices[0].label, "nvidia 1");
        assert_eq!(s[0].devices[0].utilization_pct, Some(90.0));
    }
}
