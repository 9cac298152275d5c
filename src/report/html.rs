//! The report page: one self-contained HTML document (inline CSS and SVG, no
//! script, no external resource) holding the overview, the charts and the
//! attempts, checkpoints and events tables. Every text taken from the run is
//! escaped.

use std::fmt::Write;

use chrono::{DateTime, Utc};

use crate::units::human_bytes;

use super::charts::Chart;
use super::data::{LeftOut, MAX_ROWS, RunData};
use super::plot;

const STYLE: &str = "
body { font-family: sans-serif; color: #222; margin: 24px auto; max-width: 1040px; padding: 0 12px; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; }
h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #ddd; padding-bottom: 0.2em; }
.sub { color: #666; margin-top: 0; }
dl { display: grid; grid-template-columns: max-content 1fr; gap: 2px 16px; }
dt { color: #666; } dd { margin: 0; }
figure { margin: 12px 0; }
figure svg { max-width: 100%; height: auto; border: 1px solid #eee; }
table { border-collapse: collapse; width: 100%; font-size: 0.9em; }
th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid #eee; vertical-align: top; }
th { background: #f6f6f6; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
.key span { display: inline-block; margin-right: 16px; }
.sw { display: inline-block; width: 14px; height: 3px; vertical-align: middle; margin-right: 4px; }
.dot { display: inline-block; width: 9px; height: 9px; border-radius: 50%; vertical-align: middle; margin-right: 4px; }
.note { color: #666; font-style: italic; }
";

/// Escapes text for HTML element content and attribute values.
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn time(t: Option<DateTime<Utc>>) -> String {
    t.map(|t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string()).unwrap_or_else(|| "-".into())
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map(|v| v.to_string()).unwrap_or_else(|| "-".into())
}

fn secs(v: Option<f64>) -> String {
    v.map(|s| if s < 1.0 { format!("{:.1} ms", s * 1000.0) } else { format!("{s:.2} s") }).unwrap_or_else(|| "-".into())
}

fn css_colour(c: plotters::style::RGBColor) -> String {
    format!("rgb({},{},{})", c.0, c.1, c.2)
}

/// The whole page.
pub fn page(data: &RunData, charts: &[Chart]) -> String {
    let mut h = String::new();
    let name = esc(&data.name);
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>rekindle report: {name}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n\
         <h1>{name}</h1>\n<p class=\"sub\">{} · report written {}</p>\n",
        esc(&data.dir.display().to_string()),
        time(Some(Utc::now()))
    );
    overview(&mut h, data);
    charts_section(&mut h, data, charts);
    if let Some(lines) = data.downsampled {
        let drawn = data.train.len() + data.val.len();
        let _ = writeln!(
            h,
            "<p class=\"note\" id=\"downsampled\">The charts draw {drawn} of the {lines} lines of metrics.jsonl: for \
             each stretch of steps, its lowest and highest loss and its last line (a spike or a dip always shows).</p>"
        );
    }
    attempts_table(&mut h, data);
    checkpoints_table(&mut h, data);
    events_table(&mut h, data);
    let left = data.left_out;
    if left != LeftOut::default() {
        let _ = writeln!(
            h,
            "<p class=\"note\" id=\"left-out\">The tables show the newest {MAX_ROWS} rows each: left out are the \
             first {} attempts, {} checkpoint saves and {} events of events.jsonl.</p>",
            left.attempts, left.checkpoints, left.markers
        );
    }
    if !data.skipped.is_empty() {
        let parts: Vec<String> = data.skipped.iter().map(|(f, n)| format!("{n} in {f}")).collect();
        let _ = writeln!(
            h,
            "<p class=\"note\" id=\"skipped-lines\">Lines that did not parse were left out (torn writes): {}.</p>",
            esc(&parts.join(", "))
        );
    }
    h.push_str("</body>\n</html>\n");
    h
}

fn overview(h: &mut String, data: &RunData) {
    let st = &data.status;
    let mut rows: Vec<(&str, String)> = vec![("state", st.state.clone())];
    rows.push((
        "step",
        match (st.step, st.max_steps) {
            (Some(s), Some(m)) => format!("{s} of {m} ({:.1}%)", 100.0 * s as f64 / m.max(1) as f64),
            (s, _) => opt(s),
        },
    ));
    if let Some(l) = st.last_loss {
        rows.push(("last loss", format!("{l:.5}")));
    }
    if let Some(v) = data.val.last() {
        rows.push(("last validation loss", format!("{:.5} at step {}", v.val_loss, v.step)));
    }
    rows.push(("attempts", format!("{} ({} resumed from a checkpoint)", st.attempts, st.restarts)));
    let valid = st.checkpoints.iter().filter(|c| c.valid).count();
    rows.push(("checkpoints on disk", format!("{valid} valid of {}", st.checkpoints.len())));
    if let Some(last) = data.attempts.last() {
        rows.push(("last attempt", format!("{last}")));
    }
    h.push_str("<section id=\"overview\">\n<dl>\n");
    for (k, v) in rows {
        let _ = writeln!(h, "<dt>{}</dt><dd>{}</dd>", esc(k), esc(&v));
    }
    h.push_str("</dl>\n</section>\n");
}

fn charts_section(h: &mut String, data: &RunData, charts: &[Chart]) {
    h.push_str("<section id=\"charts\">\n<h2>Charts</h2>\n");
    let sw = |c, text: &str| format!("<span><i class=\"sw\" style=\"background:{}\"></i>{text}</span>", css_colour(c));
    let dot =
        |c, text: &str| format!("<span><i class=\"dot\" style=\"background:{}\"></i>{text}</span>", css_colour(c));
    let _ = writeln!(
        h,
        "<p class=\"key\">Vertical lines, labelled with node and attempt: {} {} {} {} {}<br>Numbered dots on the \
         loss: checkpoints (see the table below) {} {} {}</p>",
        sw(plot::SIGNAL, "stop signal / preemption"),
        sw(plot::REQUEUE, "requeue decision"),
        sw(plot::RESUME, "resume"),
        sw(plot::PROBLEM, "error / fresh start"),
        sw(plot::STRAGGLER, "straggler"),
        dot(plot::TRAIN, "periodic"),
        dot(plot::VAL, "on stop"),
        dot(plot::RESUME, "final"),
    );
    if charts.is_empty() {
        h.push_str("<p class=\"note\">No metrics yet: metrics.jsonl is missing or empty.</p>\n");
    }
    for c in charts {
        let _ = writeln!(h, "<figure id=\"{}\">\n{}\n</figure>", c.id, c.svg);
    }
    match &data.gpu {
        None => h.push_str(
            "<p class=\"note\" id=\"no-gpu-stats\">No gpu_stats.jsonl in this run directory: the GPU monitor did not \
             run, so there are no GPU charts.</p>\n",
        ),
        Some(samples) if samples.iter().all(|s| s.devices.is_empty()) => h.push_str(
            "<p class=\"note\" id=\"no-gpu-stats\">gpu_stats.jsonl holds host samples only: the run used no GPU \
             (CPU backend, or no GPU visible), so there are no GPU charts.</p>\n",
        ),
        Some(_) => {}
    }
    h.push_str("</section>\n");
}

fn table(h: &mut String, id: &str, title: &str, head: &[&str], rows: Vec<Vec<String>>, numeric: &[usize]) {
    let _ = writeln!(h, "<section id=\"{id}\">\n<h2>{}</h2>", esc(title));
    if rows.is_empty() {
        h.push_str("<p class=\"note\">None recorded.</p>\n</section>\n");
        return;
    }
    h.push_str("<table>\n<thead><tr>");
    for (i, col) in head.iter().enumerate() {
        let class = if numeric.contains(&i) { " class=\"num\"" } else { "" };
        let _ = write!(h, "<th{class}>{}</th>", esc(col));
    }
    h.push_str("</tr></thead>\n<tbody>\n");
    for row in rows {
        h.push_str("<tr>");
        for (i, cell) in row.iter().enumerate() {
            let class = if numeric.contains(&i) { " class=\"num\"" } else { "" };
            let _ = write!(h, "<td{class}>{}</td>", esc(cell));
        }
        h.push_str("</tr>\n");
    }
    h.push_str("</tbody>\n</table>\n</section>\n");
}

fn attempts_table(h: &mut String, data: &RunData) {
    let rows = data
        .attempts
        .iter()
        .map(|a| {
            vec![
                a.number.to_string(),
                opt(a.node.as_deref()),
                opt(a.slurm_attempt),
                opt(a.job_id.as_deref()),
                time(a.started),
                time(a.ended),
                format!("{} → {}", a.start_step, opt(a.end_step)),
                a.end.short(),
                opt(a.requeue.as_deref()),
                secs(a.seconds_to_checkpoint),
                opt(a.steps_lost),
            ]
        })
        .collect();
    table(
        h,
        "attempts",
        "Attempts",
        &[
            "#",
            "node",
            "SLURM restart",
            "job",
            "start",
            "end",
            "steps",
            "ended because",
            "requeue",
            "signal to durable checkpoint",
            "steps lost",
        ],
        rows,
        &[0, 9, 10],
    );
    h.push_str(
        "<p class=\"note\">Steps lost: steps an attempt trained after its last durable checkpoint, which the next \
         attempt trained again.</p>\n",
    );
}

fn checkpoints_table(h: &mut String, data: &RunData) {
    let rows = data
        .checkpoints
        .iter()
        .map(|c| {
            vec![
                c.number.to_string(),
                c.step.to_string(),
                if c.failed { format!("{} (FAILED)", c.kind) } else { c.kind.clone() },
                format!("{} · attempt {}", c.node.as_deref().unwrap_or("?"), c.attempt),
                time(c.time),
                c.bytes.map(human_bytes).unwrap_or_else(|| "-".into()),
                secs(c.snapshot_seconds),
                secs(c.persist_seconds),
                c.problem.clone().unwrap_or_default(),
            ]
        })
        .collect();
    table(
        h,
        "checkpoints",
        "Checkpoints",
        &["#", "step", "kind", "written by", "time", "size", "training stall", "save (write + fsync)", "note"],
        rows,
        &[0, 1, 5, 6, 7],
    );
}

fn events_table(h: &mut String, data: &RunData) {
    let rows = data
        .markers
        .iter()
        .map(|m| vec![time(m.time), opt(m.step), m.what.clone(), m.whose(), m.detail.clone()])
        .collect();
    table(
        h,
        "events",
        "Signals, requeues and resumes",
        &["time", "step", "event", "node · attempt", "detail"],
        rows,
        &[1],
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_quotes() {
        assert_eq!(esc("<b a=\"x\">&'"), "&lt;b a=&quot;x&quot;&gt;&amp;&#39;");
    }

    #[test]
    fn seconds_read_as_ms_below_one_second() {
        assert_eq!(secs(Some(0.0123)), "12.3 ms");
        assert_eq!(secs(Some(2.5)), "2.50 s");
        assert_eq!(secs(None), "-");
    }
}
