//! One line chart as an SVG string, drawn with `plotters`' SVG backend: line
//! series (each possibly in several segments), vertical event lines with
//! rotated labels, and numbered checkpoint dots. Knows nothing of runs;
//! [`super::charts`] says what goes in each chart.

use std::fmt::Display;

use plotters::coord::Shift;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use super::data::{CheckpointMark, Marker, MarkerKind};
use super::error::ReportError;

/// Pixel size of every chart (the page scales them down on narrow screens).
pub const WIDTH: u32 = 1000;
pub const HEIGHT: u32 = 340;

/// Colours shared by the charts and the page's key.
pub const TRAIN: RGBColor = RGBColor(31, 119, 180);
pub const VAL: RGBColor = RGBColor(255, 127, 14);
pub const SIGNAL: RGBColor = RGBColor(214, 39, 40);
pub const REQUEUE: RGBColor = RGBColor(148, 103, 189);
pub const RESUME: RGBColor = RGBColor(44, 160, 44);
pub const PROBLEM: RGBColor = RGBColor(20, 20, 20);
pub const STRAGGLER: RGBColor = RGBColor(188, 189, 34);
const TEXT: RGBColor = RGBColor(40, 40, 40);
const GRID: RGBColor = RGBColor(230, 230, 230);

/// Colours for one series per device.
pub const DEVICE_COLOURS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// The colour of a marker's vertical line.
pub fn marker_colour(kind: MarkerKind) -> RGBColor {
    match kind {
        MarkerKind::Signal => SIGNAL,
        MarkerKind::Requeue => REQUEUE,
        MarkerKind::Resume => RESUME,
        MarkerKind::Problem => PROBLEM,
        MarkerKind::Straggler => STRAGGLER,
    }
}

/// The colour of a checkpoint dot, by kind.
pub fn checkpoint_colour(c: &CheckpointMark) -> RGBColor {
    match (c.failed, c.kind.as_str()) {
        (true, _) => SIGNAL,
        (false, "stop") => VAL,
        (false, "final") => RESUME,
        _ => TRAIN,
    }
}

/// How x values are labelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XAxis {
    Steps,
    /// Seconds since the run's first record, labelled h:mm:ss.
    Seconds,
}

/// A named line, drawn as one polyline per segment (gaps between attempts).
#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    pub colour: RGBColor,
    pub segments: Vec<Vec<(f64, f64)>>,
    /// Also dot every point (sparse series such as validation loss).
    pub dots: bool,
    /// Thin and dashed-looking (a reference line such as memory total).
    pub faint: bool,
}

impl Series {
    pub fn new(name: impl Into<String>, colour: RGBColor, segments: Vec<Vec<(f64, f64)>>) -> Series {
        Series { name: name.into(), colour, segments, dots: false, faint: false }
    }

    fn points(&self) -> impl Iterator<Item = &(f64, f64)> {
        self.segments.iter().flatten()
    }
}

/// Everything one chart shows.
#[derive(Debug, Clone)]
pub struct LineChart<'a> {
    pub caption: &'a str,
    pub x_desc: &'a str,
    pub y_desc: &'a str,
    pub x_axis: XAxis,
    pub series: Vec<Series>,
    /// Vertical lines at these x values.
    pub markers: Vec<(f64, &'a Marker)>,
    /// Dots at these points, numbered as in the checkpoints table.
    pub checkpoints: Vec<((f64, f64), &'a CheckpointMark)>,
    /// Fixed y range (else from the data).
    pub y_range: Option<(f64, f64)>,
    /// Where the series legend goes (none for a single series).
    pub legend: SeriesLabelPosition,
}

fn draw_err(chart: &'static str) -> impl Fn(&dyn Display) -> ReportError {
    move |e| ReportError::Draw { chart, message: e.to_string() }
}

/// `lo..hi` widened by `pad` of its span (or by 1 when it is a single value).
fn padded(lo: f64, hi: f64, pad: f64) -> (f64, f64) {
    if !(lo.is_finite() && hi.is_finite()) {
        return (0.0, 1.0);
    }
    let span = hi - lo;
    if span <= f64::EPSILON * hi.abs().max(1.0) {
        let d = if lo.abs() > 0.0 { lo.abs() * 0.1 } else { 1.0 };
        return (lo - d, hi + d);
    }
    (lo - span * pad, hi + span * pad)
}

fn min_max(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    values.filter(|v| v.is_finite()).fold(None, |acc, v| match acc {
        None => Some((v, v)),
        Some((lo, hi)) => Some((lo.min(v), hi.max(v))),
    })
}

/// `h:mm:ss` (or `m:ss` under an hour) for a number of seconds.
pub fn clock(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    let (h, m, s) = (s / 3600, (s / 60) % 60, s % 60);
    if h > 0 { format!("{h}:{m:02}:{s:02}") } else { format!("{m}:{s:02}") }
}

/// A time-axis label: `h:mm:ss`/`m:ss`, or seconds with as many decimals as
/// neighbouring labels need to differ when the whole axis spans under two
/// minutes.
pub fn time_label(secs: f64, span: f64) -> String {
    if span >= 120.0 {
        return clock(secs);
    }
    // About ten labels: a tenth of the span sets the precision.
    let decimals = (-(span / 10.0).log10()).ceil().clamp(0.0, 3.0) as usize;
    format!("{secs:.decimals$}s")
}

/// `0.5000` → `0.5`, `2.50` → `2.5`, `3.0` → `3`.
fn trim_zeros(s: String) -> String {
    if s.contains('.') && !s.contains('e') { s.trim_end_matches('0').trim_end_matches('.').to_string() } else { s }
}

/// Compact numbers for y labels: 0.0123, 1.5k, 2.3M.
fn short_number(v: f64) -> String {
    let s = fixed_number(v);
    match s.strip_suffix(['k', 'M']) {
        Some(num) => format!("{}{}", trim_zeros(num.to_string()), &s[num.len()..]),
        None => trim_zeros(s),
    }
}

fn fixed_number(v: f64) -> String {
    let a = v.abs();
    if a >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.1}k", v / 1e3)
    } else if a >= 100.0 || a == 0.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else if a >= 1e-3 {
        format!("{v:.4}")
    } else {
        format!("{v:.1e}")
    }
}

impl LineChart<'_> {
    /// Draws the chart; `name` names it in errors.
    pub fn to_svg(&self, name: &'static str) -> Result<String, ReportError> {
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
            root.fill(&WHITE).map_err(|e| draw_err(name)(&e))?;
            self.draw_on(&root).map_err(|e| draw_err(name)(&e))?;
            root.present().map_err(|e| draw_err(name)(&e))?;
        }
        Ok(svg)
    }

    fn ranges(&self) -> ((f64, f64), (f64, f64)) {
        let xs = self.series.iter().flat_map(|s| s.points().map(|p| p.0));
        let xs = xs.chain(self.markers.iter().map(|m| m.0)).chain(self.checkpoints.iter().map(|c| c.0.0));
        let (x0, x1) = min_max(xs).unwrap_or((0.0, 1.0));
        // Both axes start at 0: step 0, and the run's first record.
        let x = match self.x_axis {
            XAxis::Steps => (x0.min(0.0), x1.max(1.0)),
            XAxis::Seconds => (x0.min(0.0), x1 + (x1 - x0.min(0.0)).max(1.0) * 0.01),
        };
        let y = self.y_range.unwrap_or_else(|| {
            let ys = self.series.iter().flat_map(|s| s.points().map(|p| p.1));
            let (y0, y1) = min_max(ys).unwrap_or((0.0, 1.0));
            let (lo, hi) = padded(y0, y1, 0.06);
            // Non-negative quantities never need a negative axis.
            (if y0 >= 0.0 { lo.max(0.0) } else { lo }, hi)
        });
        (x, y)
    }

    fn draw_on(&self, root: &DrawingArea<SVGBackend<'_>, Shift>) -> Result<(), Box<dyn std::error::Error + '_>> {
        let ((x0, x1), (y0, y1)) = self.ranges();
        let mut chart = ChartBuilder::on(root)
            .caption(self.caption, ("sans-serif", 22).into_font().color(&TEXT))
            .margin(12)
            .x_label_area_size(42)
            .y_label_area_size(64)
            .build_cartesian_2d(x0..x1, y0..y1)?;
        let x_fmt = |x: &f64| match self.x_axis {
            XAxis::Steps => format!("{x:.0}"),
            XAxis::Seconds => time_label(*x, x1 - x0),
        };
        let y_fmt = |y: &f64| short_number(*y);
        chart
            .configure_mesh()
            .x_desc(self.x_desc)
            .y_desc(self.y_desc)
            .x_label_formatter(&x_fmt)
            .y_label_formatter(&y_fmt)
            .x_labels(10)
            .y_labels(6)
            .light_line_style(WHITE)
            .bold_line_style(GRID)
            .axis_desc_style(("sans-serif", 16).into_font().color(&TEXT))
            .label_style(("sans-serif", 14).into_font().color(&TEXT))
            .draw()?;

        self.draw_markers(&mut chart, y0, y1)?;
        for s in &self.series {
            let style = if s.faint { s.colour.mix(0.5).stroke_width(1) } else { s.colour.stroke_width(2) };
            for (i, seg) in s.segments.iter().enumerate() {
                let anno = chart.draw_series(LineSeries::new(seg.iter().copied(), style))?;
                if i == 0 && self.series.len() > 1 {
                    let c = s.colour;
                    anno.label(s.name.as_str())
                        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2)));
                }
                if s.dots {
                    chart.draw_series(seg.iter().map(|p| Circle::new(*p, 3, s.colour.filled())))?;
                }
            }
        }
        let numbered = self.checkpoints.len() <= 40;
        chart.draw_series(self.checkpoints.iter().map(|(p, c)| {
            let colour = checkpoint_colour(c);
            let style = if c.failed { colour.stroke_width(2) } else { colour.filled() };
            let label = if numbered { c.number.to_string() } else { String::new() };
            EmptyElement::at(*p)
                + Circle::new((0, 0), 5, style)
                + Text::new(label, (-4, -20), ("sans-serif", 14).into_font().color(&colour))
        }))?;
        if self.series.len() > 1 {
            chart
                .configure_series_labels()
                .position(self.legend.clone())
                .background_style(WHITE.mix(0.85))
                .border_style(GRID)
                .label_font(("sans-serif", 15).into_font().color(&TEXT))
                .draw()?;
        }
        Ok(())
    }

    /// Vertical lines, one per marker, and their labels in clusters (see
    /// [`cluster_labels`]) so that no two labels overprint each other.
    fn draw_markers<DB: DrawingBackend>(
        &self,
        chart: &mut ChartContext<'_, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
        y0: f64,
        y1: f64,
    ) -> Result<(), Box<dyn std::error::Error + '_>>
    where
        DB::ErrorType: 'static,
    {
        let mut sorted: Vec<(f64, i32, &Marker)> =
            self.markers.iter().map(|(x, m)| (*x, chart.backend_coord(&(*x, y1)).0, *m)).collect();
        sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
        for (x, _, m) in &sorted {
            let style = marker_colour(m.kind).stroke_width(2);
            chart.draw_series(std::iter::once(PathElement::new(vec![(*x, y0), (*x, y1)], style)))?;
        }
        for cluster in cluster_labels(&sorted) {
            for (k, (text, kind)) in cluster.labels.into_iter().enumerate() {
                let font =
                    ("sans-serif", 14).into_font().transform(FontTransform::Rotate90).color(&marker_colour(kind));
                let dx = LABEL_STEP * (k as i32 + 1);
                chart
                    .draw_series(std::iter::once(EmptyElement::at((cluster.x, y1)) + Text::new(text, (dx, 6), font)))?;
            }
        }
        Ok(())
    }
}

/// Pixels between a line and its first label, and between label columns.
const LABEL_STEP: i32 = 16;

/// Labels drawn side by side, right of the line at `x`.
#[derive(Debug, Clone, PartialEq)]
struct LabelCluster {
    x: f64,
    /// One per node and attempt: `SIGTERM, requeue · n1 · attempt 1`, in the
    /// colour of its first marker.
    labels: Vec<(String, MarkerKind)>,
}

/// Groups markers (x, pixel x, marker; sorted by x) into label clusters: a
/// marker whose line falls within the band of the current cluster's labels
/// joins it, its words added to the label of its node and attempt (or a new
/// label column), so labels never overprint each other.
fn cluster_labels(sorted: &[(f64, i32, &Marker)]) -> Vec<LabelCluster> {
    /// A cluster being built: where its first line is, and its label columns.
    struct Open {
        px: i32,
        x: f64,
        columns: Vec<Column>,
    }
    struct Column {
        who: String,
        whats: Vec<String>,
        kind: MarkerKind,
    }
    let mut open: Vec<Open> = Vec::new();
    for (x, px, m) in sorted {
        let joins = open.last().is_some_and(|c| *px <= c.px + LABEL_STEP * (c.columns.len() as i32 + 1));
        if !joins {
            open.push(Open { px: *px, x: *x, columns: Vec::new() });
        }
        let cluster = open.last_mut().expect("a cluster");
        match cluster.columns.iter_mut().find(|c| c.who == m.whose()) {
            Some(c) => c.whats.push(m.what.clone()),
            None => cluster.columns.push(Column { who: m.whose(), whats: vec![m.what.clone()], kind: m.kind }),
        }
    }
    open.into_iter()
        .map(|c| LabelCluster {
            x: c.x,
            labels: c
                .columns
                .into_iter()
                .map(|col| (format!("{} · {}", col.whats.join(", "), col.who), col.kind))
                .collect(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_prints_minutes_under_an_hour_and_hours_above() {
        assert_eq!(clock(0.0), "0:00");
        assert_eq!(clock(75.4), "1:15");
        assert_eq!(clock(3725.0), "1:02:05");
    }

    #[test]
    fn short_time_axes_are_labelled_in_seconds() {
        assert_eq!(time_label(3.0, 10.0), "3s");
        assert_eq!(time_label(1.25, 5.0), "1.2s");
        assert_eq!(time_label(0.375, 0.6), "0.38s");
        assert_eq!(time_label(75.0, 600.0), "1:15");
    }

    #[test]
    fn short_numbers_stay_short() {
        assert_eq!(short_number(0.0), "0");
        assert_eq!(short_number(0.01234), "0.0123");
        assert_eq!(short_number(2.5), "2.5");
        assert_eq!(short_number(0.5), "0.5");
        assert_eq!(short_number(250.0), "250");
        assert_eq!(short_number(12_345.0), "12.3k");
        assert_eq!(short_number(20_000.0), "20k");
        assert_eq!(short_number(0.00003), "3.0e-5");
    }

    #[test]
    fn padding_widens_a_single_value_into_a_range() {
        assert_eq!(padded(2.0, 2.0, 0.1), (1.8, 2.2));
        assert_eq!(padded(0.0, 0.0, 0.1), (-1.0, 1.0));
        assert_eq!(padded(0.0, 10.0, 0.1), (-1.0, 11.0));
    }

    fn marker(kind: MarkerKind, what: &str, node: &str, attempt: usize) -> Marker {
        Marker {
            kind,
            what: what.into(),
            node: Some(node.into()),
            attempt,
            step: None,
            time: None,
            detail: String::new(),
        }
    }

    #[test]
    fn nearby_markers_share_a_cluster_with_one_label_per_node_and_attempt() {
        let sig = marker(MarkerKind::Signal, "SIGTERM", "n1", 1);
        let req = marker(MarkerKind::Requeue, "requeue", "n1", 1);
        let res = marker(MarkerKind::Resume, "resume", "n2", 2);
        let late = marker(MarkerKind::Signal, "SIGUSR1", "n2", 2);
        // 5 px apart (same label), 28 px (within two label columns), 200 px (apart).
        let sorted = [(10.0, 100, &sig), (10.5, 105, &req), (12.0, 128, &res), (30.0, 328, &late)];
        let clusters = cluster_labels(&sorted);
        assert_eq!(clusters.len(), 2, "{clusters:?}");
        assert_eq!(clusters[0].x, 10.0);
        assert_eq!(
            clusters[0].labels,
            vec![
                ("SIGTERM, requeue · n1 · attempt 1".to_string(), MarkerKind::Signal),
                ("resume · n2 · attempt 2".to_string(), MarkerKind::Resume)
            ]
        );
        assert_eq!(clusters[1].labels, vec![("SIGUSR1 · n2 · attempt 2".to_string(), MarkerKind::Signal)]);
    }

    #[test]
    fn a_marker_just_past_the_label_band_starts_a_new_cluster() {
        let a = marker(MarkerKind::Signal, "SIGTERM", "n1", 1);
        let b = marker(MarkerKind::Resume, "resume", "n2", 2);
        // One label: the band ends LABEL_STEP * 2 px right of the line.
        assert_eq!(cluster_labels(&[(0.0, 0, &a), (1.0, 2 * LABEL_STEP, &b)]).len(), 1);
        assert_eq!(cluster_labels(&[(0.0, 0, &a), (1.0, 2 * LABEL_STEP + 1, &b)]).len(), 2);
    }

    #[test]
    fn a_chart_is_an_svg_with_one_polyline_per_segment() {
        let chart = LineChart {
            caption: "c",
            x_desc: "x",
            y_desc: "y",
            x_axis: XAxis::Seconds,
            series: vec![Series::new("a", TRAIN, vec![vec![(0.0, 1.0), (1.0, 2.0)], vec![(5.0, 1.0), (6.0, 3.0)]])],
            markers: vec![],
            checkpoints: vec![],
            y_range: None,
            legend: SeriesLabelPosition::UpperRight,
        };
        let svg = chart.to_svg("test").unwrap();
        assert!(svg.starts_with("<svg"), "{svg}");
        // Axes and ticks are polylines too: count the series colour.
        assert_eq!(svg.matches("<polyline fill=\"none\" opacity=\"1\" stroke=\"#1F77B4\"").count(), 2, "{svg}");
    }
}
