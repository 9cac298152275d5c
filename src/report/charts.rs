//! The report's charts, each built from [`RunData`]: loss (train and
//! validation) and learning rate over steps, throughput over time, each
//! rank's seconds per step over steps, and GPU utilisation and memory over
//! time. Every chart carries the event markers;
//! the loss chart also carries the checkpoint dots.

use plotters::chart::SeriesLabelPosition;

use super::data::{Marker, RunData};
use super::error::ReportError;
use super::plot::{DEVICE_COLOURS, LineChart, Series, TRAIN, VAL, XAxis};

/// One drawn chart and the id of the figure holding it.
#[derive(Debug, Clone)]
pub struct Chart {
    /// `chart-loss`, `chart-lr`, `chart-throughput`, `chart-step-time`, `chart-gpu-util`, `chart-gpu-memory`.
    pub id: &'static str,
    pub svg: String,
}

/// Every chart the data allows, in page order.
pub fn all(data: &RunData) -> Result<Vec<Chart>, ReportError> {
    let mut out = Vec::new();
    if !data.train.is_empty() {
        out.push(Chart { id: "chart-loss", svg: loss(data).to_svg("loss")? });
        out.push(Chart { id: "chart-lr", svg: lr(data).to_svg("learning rate")? });
    }
    if let Some(chart) = throughput(data) {
        out.push(Chart { id: "chart-throughput", svg: chart.to_svg("throughput")? });
    }
    if let Some(chart) = step_time(data) {
        out.push(Chart { id: "chart-step-time", svg: chart.to_svg("step time")? });
    }
    if let Some((util, mem)) = gpu(data) {
        out.push(Chart { id: "chart-gpu-util", svg: util.to_svg("GPU utilisation")? });
        out.push(Chart { id: "chart-gpu-memory", svg: mem.to_svg("GPU memory")? });
    }
    Ok(out)
}

fn step_markers(data: &RunData) -> Vec<(f64, &Marker)> {
    data.markers.iter().filter_map(|m| Some((m.step? as f64, m))).collect()
}

fn time_markers(data: &RunData) -> Vec<(f64, &Marker)> {
    let Some(origin) = data.origin() else { return Vec::new() };
    data.markers.iter().filter_map(|m| Some((seconds_since(origin, m.time?), m))).collect()
}

fn seconds_since(origin: chrono::DateTime<chrono::Utc>, t: chrono::DateTime<chrono::Utc>) -> f64 {
    (t - origin).num_milliseconds() as f64 / 1000.0
}

/// Train loss (a line over every logged step), validation loss (dotted
/// line), and a numbered dot per checkpoint on the train curve.
fn loss(data: &RunData) -> LineChart<'_> {
    let train: Vec<(f64, f64)> = data.train.iter().filter_map(|m| Some((m.step as f64, m.loss?))).collect();
    let mut series = vec![Series::new("train loss", TRAIN, vec![train])];
    if !data.val.is_empty() {
        let val = data.val.iter().map(|v| (v.step as f64, v.val_loss)).collect();
        series.push(Series { dots: true, ..Series::new("validation loss", VAL, vec![val]) });
    }
    // Each dot sits on the train loss of the nearest logged step at or before it.
    let loss_at = |step: u64| {
        let i = data.train.partition_point(|m| m.step <= step);
        data.train[..i].iter().rev().find_map(|m| m.loss).or_else(|| data.train.iter().find_map(|m| m.loss))
    };
    let checkpoints = data.checkpoints.iter().filter_map(|c| Some(((c.step as f64, loss_at(c.step)?), c))).collect();
    LineChart {
        caption: "Loss",
        x_desc: "step",
        y_desc: "loss",
        x_axis: XAxis::Steps,
        series,
        markers: step_markers(data),
        checkpoints,
        y_range: None,
        legend: SeriesLabelPosition::UpperRight,
    }
}

fn lr(data: &RunData) -> LineChart<'_> {
    let points = data.train.iter().filter_map(|m| Some((m.step as f64, m.lr?))).collect();
    LineChart {
        caption: "Learning rate",
        x_desc: "step",
        y_desc: "learning rate",
        x_axis: XAxis::Steps,
        series: vec![Series::new("learning rate", TRAIN, vec![points])],
        markers: step_markers(data),
        checkpoints: Vec::new(),
        y_range: None,
        legend: SeriesLabelPosition::UpperRight,
    }
}

/// Splits time-stamped points into one segment per attempt, so the line
/// breaks where the run waited between attempts.
fn by_attempt(data: &RunData, points: Vec<(chrono::DateTime<chrono::Utc>, f64)>) -> Vec<Vec<(f64, f64)>> {
    let Some(origin) = data.origin() else { return Vec::new() };
    let mut segments: Vec<(usize, Vec<(f64, f64)>)> = Vec::new();
    for (t, v) in points {
        let attempt = data.attempt_at(t);
        let p = (seconds_since(origin, t), v);
        match segments.last_mut() {
            Some((a, seg)) if *a == attempt => seg.push(p),
            _ => segments.push((attempt, vec![p])),
        }
    }
    segments.into_iter().map(|(_, s)| s).collect()
}

/// Tokens per second for language models, samples per second otherwise.
fn throughput(data: &RunData) -> Option<LineChart<'_>> {
    let tokens = data.train.iter().any(|m| m.tokens_per_s.is_some());
    let points: Vec<_> = data
        .train
        .iter()
        .filter_map(|m| Some((m.time?, if tokens { m.tokens_per_s? } else { m.samples_per_s? })))
        .collect();
    if points.is_empty() {
        return None;
    }
    let unit = if tokens { "tokens/s" } else { "samples/s" };
    Some(LineChart {
        caption: "Throughput",
        x_desc: "time since the run began",
        y_desc: unit,
        x_axis: XAxis::Seconds,
        series: vec![Series::new(unit, TRAIN, by_attempt(data, points))],
        markers: time_markers(data),
        checkpoints: Vec::new(),
        y_range: None,
        legend: SeriesLabelPosition::UpperRight,
    })
}

/// Seconds per step of each rank (its own work, `rank_compute_s`), or of
/// the one process (`elapsed_s`), over steps: a straggler is the line
/// above the others, a throttled process a line that climbs.
fn step_time(data: &RunData) -> Option<LineChart<'_>> {
    let ranks = data.train.iter().map(|m| m.rank_step_s.len()).max().unwrap_or(0);
    let series: Vec<Series> = (0..ranks)
        .map(|rank| {
            let points = data
                .train
                .iter()
                .filter_map(|m| Some((m.step as f64, m.rank_step_s.get(rank).copied().flatten()?)))
                .collect();
            let name = if ranks > 1 { format!("rank {rank}") } else { "seconds per step".into() };
            Series::new(name, DEVICE_COLOURS[rank % DEVICE_COLOURS.len()], vec![points])
        })
        .filter(|s| s.segments.iter().any(|p| !p.is_empty()))
        .collect();
    // A world larger than `[telemetry] rank_times_max`: its summary, three
    // lines whatever the number of ranks.
    let spread = |name: &str, colour, of: fn(&crate::telemetry::RankCompute) -> Option<f64>| {
        let points =
            data.train.iter().filter_map(|m| Some((m.step as f64, of(m.rank_spread.as_ref()?)?))).collect::<Vec<_>>();
        (!points.is_empty()).then(|| Series::new(name.to_string(), colour, vec![points]))
    };
    let summarised: Vec<Series> = [
        spread("slowest rank", DEVICE_COLOURS[1], |r| r.max_s),
        spread("median rank", DEVICE_COLOURS[0], |r| r.median_s),
        spread("fastest rank", DEVICE_COLOURS[2 % DEVICE_COLOURS.len()], |r| r.min_s),
    ]
    .into_iter()
    .flatten()
    .collect();
    let per_rank = ranks > 1 || !summarised.is_empty();
    let series: Vec<Series> = series.into_iter().chain(summarised).collect();
    if series.is_empty() {
        return None;
    }
    Some(LineChart {
        caption: if per_rank { "Step time per rank (own work, without waiting for the others)" } else { "Step time" },
        x_desc: "step",
        y_desc: "seconds per step",
        x_axis: XAxis::Steps,
        series,
        markers: step_markers(data),
        checkpoints: Vec::new(),
        y_range: None,
        legend: SeriesLabelPosition::UpperRight,
    })
}

/// Utilisation (%) and memory used (GiB, with each device's total as a faint
/// line) per device over time.
fn gpu(data: &RunData) -> Option<(LineChart<'_>, LineChart<'_>)> {
    let samples = data.gpu.as_ref().filter(|s| s.iter().any(|s| !s.devices.is_empty()))?;
    let mut labels: Vec<&str> = Vec::new();
    for d in samples.iter().flat_map(|s| &s.devices) {
        if !labels.contains(&d.label.as_str()) {
            labels.push(&d.label);
        }
    }
    let (mut util, mut mem) = (Vec::new(), Vec::new());
    for (i, label) in labels.iter().enumerate() {
        let colour = DEVICE_COLOURS[i % DEVICE_COLOURS.len()];
        let of = |f: &dyn Fn(&crate::telemetry::GpuDevicePoint) -> Option<f64>| {
            let points = samples
                .iter()
                .filter_map(|s| Some((s.time, f(s.devices.iter().find(|d| d.label == *label)?)?)))
                .collect();
            by_attempt(data, points)
        };
        util.push(Series::new(format!("{label} utilisation"), colour, of(&|d| d.utilization_pct)));
        mem.push(Series::new(format!("{label} used"), colour, of(&|d| d.memory_used_mib.map(|m| m / 1024.0))));
        let total = of(&|d| d.memory_total_mib.map(|m| m / 1024.0));
        if total.iter().any(|s| !s.is_empty()) {
            mem.push(Series { faint: true, ..Series::new(format!("{label} total"), colour, total) });
        }
    }
    let time_chart = |caption, y_desc, series, y_range| LineChart {
        caption,
        x_desc: "time since the run began",
        y_desc,
        x_axis: XAxis::Seconds,
        series,
        markers: time_markers(data),
        checkpoints: Vec::new(),
        y_range,
        legend: SeriesLabelPosition::LowerRight,
    };
    let mem_max = mem.iter().flat_map(|s| s.segments.iter().flatten()).map(|p| p.1).fold(0.0, f64::max);
    Some((
        time_chart("GPU utilisation", "utilisation %", util, Some((0.0, 105.0))),
        time_chart("GPU memory", "memory (GiB)", mem, Some((0.0, (mem_max * 1.08).max(1.0)))),
    ))
}
