//! `rekindle report` on a real run directory: the tiny config stopped at step
//! 70 on n1, resumed and stopped at 130 on n2, then (its step-130 checkpoint
//! damaged) resumed from 100 on n3 and finished. The HTML must hold the loss,
//! validation, learning-rate and throughput curves, a vertical line and a
//! label for every signal, requeue and resume, a dot and a table row for
//! every checkpoint, and one attempts-table row per attempt; GPU charts appear
//! exactly when `gpu_stats.jsonl` exists; torn last lines are tolerated.
//! `rekindle status` on the same run says why the last attempt ended.

use crate::support;

use std::path::{Path, PathBuf};

use serde_json::Value;

use support::runs::{EVAL_EVERY, expect_exit, rekindle, three_attempt_run};

// Colours of the charts (src/report/plot.rs), as the SVG writes them.
const TRAIN: &str = "#1F77B4";
const VAL: &str = "#FF7F0E";
const SIGNAL: &str = "#D62728";
const REQUEUE: &str = "#9467BD";
const RESUME: &str = "#2CA02C";

/// The three-attempt run in a fresh temporary directory.
fn stopped_and_resumed_run() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().expect("temp dir");
    let run = tmp.path().join("run");
    three_attempt_run(&run);
    (tmp, run)
}

/// Runs `rekindle report RUN` and returns the HTML it wrote to `RUN/report.html`.
fn report(run: &Path) -> String {
    let out = expect_exit(rekindle().arg("report").arg(run), 0);
    let path = run.join("report.html");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains(&path.display().to_string()), "report did not say where it wrote: {stdout}");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

fn events(run: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(run.join("events.jsonl")).expect("events.jsonl");
    text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

fn count_events(events: &[Value], name: &str) -> usize {
    events.iter().filter(|e| e["event"] == name).count()
}

/// The `<figure id="ID">` element, or `None`.
fn figure<'a>(html: &'a str, id: &str) -> Option<&'a str> {
    let start = html.find(&format!("<figure id=\"{id}\">"))?;
    let len = html[start..].find("</figure>").expect("figure is closed");
    Some(&html[start..start + len])
}

fn chart<'a>(html: &'a str, id: &str) -> &'a str {
    let fig = figure(html, id).unwrap_or_else(|| panic!("no figure {id} in the report"));
    assert!(fig.contains("<svg"), "figure {id} holds no <svg>");
    fig
}

/// Point counts of the polylines stroked in `colour`.
fn polylines(svg: &str, colour: &str) -> Vec<usize> {
    svg.split("<polyline")
        .skip(1)
        .map(|p| &p[..p.find("/>").expect("polyline is closed")])
        .filter(|p| p.contains(&format!("stroke=\"{colour}\"")))
        .map(|p| {
            let pts = &p[p.find("points=\"").expect("points") + 8..];
            pts[..pts.find('"').unwrap()].split_whitespace().count()
        })
        .collect()
}

/// Polylines of more than two points: data series (event lines and legend
/// swatches have two).
fn series(svg: &str, colour: &str) -> Vec<usize> {
    let mut v: Vec<usize> = polylines(svg, colour).into_iter().filter(|&n| n > 2).collect();
    v.sort();
    v
}

/// Vertical event lines (two-point polylines spanning the plot) in `colour`.
fn vertical_lines(svg: &str, colour: &str) -> usize {
    svg.split("<polyline")
        .skip(1)
        .map(|p| &p[..p.find("/>").unwrap()])
        .filter(|p| p.contains(&format!("stroke=\"{colour}\"")) && p.contains("stroke-width=\"2\""))
        .filter(|p| {
            let pts = &p[p.find("points=\"").unwrap() + 8..];
            let xy: Vec<&str> = pts[..pts.find('"').unwrap()].split_whitespace().collect();
            xy.len() == 2 && xy[0].split(',').next() == xy[1].split(',').next()
        })
        .count()
}

/// Texts of the SVG's event-marker labels (`what · node · attempt N`).
fn marker_labels(svg: &str) -> Vec<String> {
    svg.split("<text")
        .skip(1)
        .map(|t| {
            let body = &t[t.find('>').unwrap() + 1..];
            body[..body.find("</text>").unwrap()].trim().to_string()
        })
        .filter(|t| t.contains(" · attempt "))
        .collect()
}

/// The body rows of the table in `<section id="ID">`, as cell texts.
fn table_rows(html: &str, id: &str) -> Vec<Vec<String>> {
    let start = html.find(&format!("<section id=\"{id}\">")).unwrap_or_else(|| panic!("no section {id}"));
    let section = &html[start..start + html[start..].find("</section>").unwrap()];
    let Some(body) = section.split("<tbody>").nth(1) else { return Vec::new() };
    body.split("<tr>")
        .skip(1)
        .map(|row| {
            row.split("<td")
                .skip(1)
                .map(|cell| {
                    let text = &cell[cell.find('>').unwrap() + 1..];
                    text[..text.find("</td>").unwrap()].to_string()
                })
                .collect()
        })
        .collect()
}

#[test]
fn report_holds_curves_markers_checkpoints_and_attempts_of_a_stopped_and_resumed_run() {
    let (_tmp, run) = stopped_and_resumed_run();
    let html = report(&run);
    let evs = events(&run);

    // Self-contained: no script, no external resource; the only URL is the SVG namespace.
    assert!(html.starts_with("<!DOCTYPE html>"));
    for needle in ["<script", "<link", "src=", "url(", "@import"] {
        assert!(!html.contains(needle), "the report contains {needle}");
    }
    assert!(!html.replace("http://www.w3.org/2000/svg", "").contains("http"), "the report refers to a URL");

    // Curves: every step's train loss and learning rate exactly once (200
    // steps, lost steps re-trained), validation every EVAL_EVERY steps, and
    // throughput in one segment per attempt (1–70, 71–100 as 101–130 were
    // lost, 101–200).
    let loss = chart(&html, "chart-loss");
    assert_eq!(series(loss, TRAIN), vec![200], "train loss curve");
    assert_eq!(series(loss, VAL), vec![(200 / EVAL_EVERY) as usize], "validation loss curve");
    assert_eq!(series(chart(&html, "chart-lr"), TRAIN), vec![200], "learning-rate curve");
    assert_eq!(series(chart(&html, "chart-throughput"), TRAIN), vec![30, 70, 100], "throughput per attempt");

    // A vertical line per signal, requeue decision and resume, on every chart,
    // labelled with what happened, the node and the attempt.
    let (signals, requeues, resumes) =
        (count_events(&evs, "signal"), count_events(&evs, "requeue"), count_events(&evs, "resume"));
    assert_eq!((signals, requeues, resumes), (2, 2, 2), "events of the run: {evs:#?}");
    let expected = [
        ("stop_at_step", "n1 · attempt 1"),
        ("no requeue", "n1 · attempt 1"),
        ("resume", "n2 · attempt 2"),
        ("stop_at_step", "n2 · attempt 2"),
        ("no requeue", "n2 · attempt 2"),
        ("resume", "n3 · attempt 3"),
    ];
    for id in ["chart-loss", "chart-lr", "chart-throughput"] {
        let svg = chart(&html, id);
        assert_eq!(vertical_lines(svg, SIGNAL), signals, "signal lines on {id}");
        assert_eq!(vertical_lines(svg, REQUEUE), requeues, "requeue lines on {id}");
        assert_eq!(vertical_lines(svg, RESUME), resumes, "resume lines on {id}");
        let labels = marker_labels(svg);
        for (what, whose) in expected {
            assert!(
                labels
                    .iter()
                    .any(|l| l.ends_with(whose) && l.split(" · ").next().unwrap().split(", ").any(|w| w == what)),
                "{id} has no label for {what} on {whose}: {labels:?}"
            );
        }
    }
    // On the step axis the stop, its requeue decision and the next resume
    // share a step, so their labels stand side by side.
    for label in ["stop_at_step, no requeue · n1 · attempt 1", "resume · n2 · attempt 2"] {
        assert!(marker_labels(chart(&html, "chart-loss")).contains(&label.to_string()), "loss chart lacks {label:?}");
    }
    assert_eq!(table_rows(&html, "events").len(), signals + requeues + resumes);

    // A numbered dot and a table row (with size and timings) per checkpoint saved.
    let saved: Vec<u64> =
        evs.iter().filter(|e| e["event"] == "checkpoint_saved").map(|e| e["step"].as_u64().unwrap()).collect();
    assert_eq!(saved, vec![50, 70, 100, 130, 150, 200]);
    assert_eq!(loss.matches(" r=\"5\"").count(), saved.len(), "checkpoint dots on the loss chart");
    let ckpt_rows = table_rows(&html, "checkpoints");
    assert_eq!(ckpt_rows.iter().map(|r| r[1].parse::<u64>().unwrap()).collect::<Vec<_>>(), saved);
    assert_eq!(
        ckpt_rows.iter().map(|r| r[2].as_str()).collect::<Vec<_>>(),
        ["periodic", "stop", "periodic", "stop", "periodic", "final"]
    );
    for row in &ckpt_rows {
        assert!(row[5].ends_with("KiB"), "size column: {row:?}");
        assert!(row[6].ends_with("ms") || row[6].ends_with(" s"), "stall column: {row:?}");
        assert!(row[7].ends_with("ms") || row[7].ends_with(" s"), "save column: {row:?}");
    }

    // One row per attempt: node, SLURM restart, steps, why it ended, steps lost.
    let attempts = table_rows(&html, "attempts");
    assert_eq!(attempts.len(), 3, "{attempts:?}");
    let col = |i: usize| attempts.iter().map(|r| r[i].as_str()).collect::<Vec<_>>();
    assert_eq!(col(0), ["1", "2", "3"]);
    assert_eq!(col(1), ["n1", "n2", "n3"]);
    assert_eq!(col(2), ["0", "1", "2"]);
    assert_eq!(col(6), ["0 → 70", "70 → 130", "100 → 200"]);
    assert_eq!(col(7), ["stop_at_step", "stop_at_step", "finished"]);
    assert_eq!(col(10), ["0", "30", "-"]);
    assert!(attempts[0][9].ends_with("ms") || attempts[0][9].ends_with(" s"), "time to checkpoint: {attempts:?}");

    // No gpu_stats.jsonl: no GPU charts, and the page says why.
    assert!(figure(&html, "chart-gpu-util").is_none());
    assert!(figure(&html, "chart-gpu-memory").is_none());
    assert!(html.contains("id=\"no-gpu-stats\""));
}

/// Writes a gpu_stats.jsonl with two devices, `per_attempt` samples spread
/// over each attempt's span, and a torn last line.
fn write_gpu_stats(run: &Path, per_attempt: usize) {
    let evs = events(run);
    let time = |e: &Value| chrono::DateTime::parse_from_rfc3339(e["time"].as_str().unwrap()).unwrap();
    let mut spans = Vec::new();
    for (i, e) in evs.iter().enumerate() {
        if e["event"] == "start" {
            let end = evs[i..].iter().find(|x| x["event"] == "stop" || x["event"] == "finish").unwrap();
            spans.push((time(e), time(end)));
        }
    }
    let mut text = String::new();
    for (start, end) in spans {
        for k in 0..per_attempt {
            let t = start + (end - start) * k as i32 / (per_attempt as i32 - 1);
            let line = serde_json::json!({
                "time": t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                "devices": [
                    {"vendor": "nvidia", "index": 0, "utilization_pct": 90 - k, "memory_used_mib": 30000 + k,
                     "memory_total_mib": 81559, "temperature_c": 60, "power_w": 400.0},
                    {"vendor": "nvidia", "index": 1, "utilization_pct": 40 + k, "memory_used_mib": 20000,
                     "memory_total_mib": 81559, "temperature_c": 55, "power_w": 250.0}
                ],
                "host": {"cpu_pct": 50.0, "ram_used_mib": 1000, "ram_total_mib": 24000, "disk_free_mib": 5000}
            });
            text.push_str(&format!("{line}\n"));
        }
    }
    text.push_str("{\"time\":\"2026-11-22T02:4");
    std::fs::write(run.join("gpu_stats.jsonl"), text).unwrap();
}

#[test]
fn report_draws_gpu_utilisation_and_memory_when_gpu_stats_exist() {
    let (_tmp, run) = stopped_and_resumed_run();
    write_gpu_stats(&run, 5);
    let html = report(&run);
    let util = chart(&html, "chart-gpu-util");
    let mem = chart(&html, "chart-gpu-memory");
    // One segment per attempt per device (device 0 in the first colour,
    // device 1 in the second).
    assert_eq!(series(util, TRAIN), vec![5, 5, 5], "device 0 utilisation");
    assert_eq!(series(util, VAL), vec![5, 5, 5], "device 1 utilisation");
    // Memory: used and total per device.
    assert_eq!(series(mem, TRAIN).len(), 6, "device 0 memory used and total");
    for label in ["nvidia 0 utilisation", "nvidia 1 utilisation"] {
        assert!(util.contains(label), "utilisation legend lacks {label}");
    }
    for label in ["nvidia 0 used", "nvidia 0 total", "nvidia 1 used"] {
        assert!(mem.contains(label), "memory legend lacks {label}");
    }
    // Event lines on the GPU charts too.
    assert_eq!(vertical_lines(util, RESUME), 2);
    assert!(!html.contains("id=\"no-gpu-stats\""));
    assert!(html.contains("1 in gpu_stats.jsonl"), "the torn line is reported");
}

#[test]
fn report_skips_torn_last_lines_of_metrics_and_events() {
    let (_tmp, run) = stopped_and_resumed_run();
    for (file, torn) in [("metrics.jsonl", "{\"step\":201,\"loss\":0.1,\"lr"), ("events.jsonl", "{\"event\":\"sig")] {
        let path = run.join(file);
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str(torn);
        std::fs::write(&path, text).unwrap();
    }
    let html = report(&run);
    assert_eq!(series(chart(&html, "chart-loss"), TRAIN), vec![200]);
    assert_eq!(table_rows(&html, "attempts").len(), 3);
    assert!(html.contains("1 in events.jsonl, 1 in metrics.jsonl"), "torn lines are reported");
}

#[test]
fn report_out_writes_where_asked_and_a_non_run_directory_is_an_error() {
    let (tmp, run) = stopped_and_resumed_run();
    let out = tmp.path().join("elsewhere.html");
    expect_exit(rekindle().arg("report").arg(&run).arg("--out").arg(&out), 0);
    let html = std::fs::read_to_string(&out).expect("report at --out");
    assert!(figure(&html, "chart-loss").is_some());
    assert!(!run.join("report.html").exists(), "--out must replace the default path");

    let not_a_run = tmp.path().join("empty");
    std::fs::create_dir(&not_a_run).unwrap();
    let failed = expect_exit(rekindle().arg("report").arg(&not_a_run), 1);
    let stderr = String::from_utf8_lossy(&failed.stderr);
    assert!(stderr.contains("is not a run directory (no config.toml)"), "{stderr}");
}

#[test]
fn status_says_why_the_last_attempt_ended() {
    let (_tmp, run) = stopped_and_resumed_run();
    let out = expect_exit(rekindle().arg("status").arg(&run), 0);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("state     finished"), "{text}");
    assert!(text.contains("ended     attempt 3 on n3 ended because it reached max_steps at step 200"), "{text}");
    let json: Value = serde_json::from_slice(&expect_exit(rekindle().arg("status").arg(&run).arg("--json"), 0).stdout)
        .expect("status --json");
    assert_eq!(json["last_ended_attempt"]["number"], 3);
    assert_eq!(json["last_ended_attempt"]["end"]["kind"], "finished");
}

/// Issue #40: `report` on a long run (a million lines of `metrics.jsonl`)
/// took 963 MB and wrote a 16 MB page. It streams the file and draws a
/// bounded number of points (the lowest, highest and last loss of each
/// stretch), so memory and the page stay small, and the page says so.
#[test]
fn report_on_a_long_history_is_downsampled_in_bounded_memory_and_page_size() {
    use std::io::Write;
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    std::fs::create_dir(&run).unwrap();
    std::fs::write(run.join("config.toml"), "[run]\nname = \"long\"\n").unwrap();
    let lines: u64 = 1_000_000;
    let mut metrics = std::io::BufWriter::new(std::fs::File::create(run.join("metrics.jsonl")).unwrap());
    for step in 1..=lines {
        let loss = if step == 500_000 { 99.0 } else { 1.0 + (step % 97) as f64 / 97.0 };
        writeln!(metrics, r#"{{"step":{step},"loss":{loss},"lr":0.001,"samples_per_s":100.0,"elapsed_s":0.01}}"#)
            .unwrap();
    }
    drop(metrics);
    let mut cmd = std::process::Command::new(support::cli::exe());
    cmd.arg("report").arg(&run);
    let m = support::run_measured(cmd, std::time::Duration::from_secs(300));
    assert_eq!(m.code, Some(0), "{}", m.stderr);
    let page = std::fs::metadata(run.join("report.html")).unwrap().len();
    assert!(page < 4 << 20, "a {page}-byte page");
    assert!(m.max_rss_bytes < 256 << 20, "report used {} MiB", m.max_rss_bytes >> 20);
    let html = std::fs::read_to_string(run.join("report.html")).unwrap();
    assert!(html.contains(&format!("of the {lines} lines of metrics.jsonl")), "the page says it is downsampled");
    let drawn = series(chart(&html, "chart-loss"), TRAIN);
    assert!(drawn.iter().all(|n| *n <= 3000), "{drawn:?} points drawn");
    eprintln!("report of {lines} lines: {page} bytes, {} MiB, {:?}", m.max_rss_bytes >> 20, m.elapsed);
}

/// Issue #40: `status` and `report` read `events.jsonl` whole into typed
/// events (a long run's, or a hostile one's, millions of lines cost
/// gigabytes). They now stream it, keeping counts, the newest events of
/// each kind and the newest rows of each table; the page says what it left
/// out. Measured through the binary on 1.2M lines (~170 MB).
#[test]
fn issue_40_status_and_report_on_a_million_events_stay_in_bounded_memory() {
    use std::io::Write;
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    std::fs::create_dir(&run).unwrap();
    std::fs::write(run.join("config.toml"), "[run]\nname = \"many-events\"\nmax_steps = 2000000\n").unwrap();
    let mut events = std::io::BufWriter::new(std::fs::File::create(run.join("events.jsonl")).unwrap());
    let t = "2026-11-01T10:00:00.000Z";
    let (attempts, per_attempt) = (2_000u64, 600u64);
    for a in 0..attempts {
        let step0 = a * per_attempt;
        writeln!(events, r#"{{"event":"start","time":"{t}","node":"n{a}","job_id":"7","attempt":{a}}}"#).unwrap();
        writeln!(events, r#"{{"event":"resume","time":"{t}","node":"n{a}","step":{step0},"steps_lost":1}}"#).unwrap();
        for i in 0..per_attempt - 3 {
            let step = step0 + i;
            writeln!(
                events,
                r#"{{"event":"checkpoint_saved","time":"{t}","node":"n{a}","job_id":"7","attempt":{a},"step":{step},"kind":"periodic","bytes":1000,"snapshot_seconds":0.01,"persist_seconds":0.2}}"#
            )
            .unwrap();
        }
        writeln!(events, r#"{{"event":"stop","time":"{t}","node":"n{a}","step":{},"reason":"SIGTERM"}}"#, step0 + 599)
            .unwrap();
    }
    drop(events);
    let lines = attempts * per_attempt;
    let size = std::fs::metadata(run.join("events.jsonl")).unwrap().len();

    let mut cmd = std::process::Command::new(support::cli::exe());
    cmd.args(["status", "--json"]).arg(&run);
    let st = support::run_measured(cmd, std::time::Duration::from_secs(300));
    assert_eq!(st.code, Some(0), "{}", st.stderr);
    let status: serde_json::Value = serde_json::from_str(&st.stdout).unwrap();
    assert_eq!((status["attempts"].as_u64(), status["restarts"].as_u64()), (Some(attempts), Some(attempts)));
    assert_eq!(status["state"], "stopped");
    assert_eq!(status["last_ended_attempt"]["number"].as_u64(), Some(attempts));
    assert!(st.max_rss_bytes < 64 << 20, "status used {} MiB", st.max_rss_bytes >> 20);
    // Debug build on a shared machine: 25 s measured; a run read whole took minutes.
    let limit = std::time::Duration::from_secs(200);
    assert!(st.elapsed < limit, "status took {:?}", st.elapsed);

    let mut cmd = std::process::Command::new(support::cli::exe());
    cmd.arg("report").arg(&run);
    let rp = support::run_measured(cmd, std::time::Duration::from_secs(300));
    assert_eq!(rp.code, Some(0), "{}", rp.stderr);
    let page = std::fs::metadata(run.join("report.html")).unwrap().len();
    assert!(page < 8 << 20, "a {page}-byte page");
    assert!(rp.max_rss_bytes < 128 << 20, "report used {} MiB", rp.max_rss_bytes >> 20);
    assert!(rp.elapsed < limit, "report took {:?}", rp.elapsed);
    let html = std::fs::read_to_string(run.join("report.html")).unwrap();
    assert!(html.contains("id=\"left-out\""), "the page says what it left out");
    assert!(html.contains(&format!("{attempts} (")), "the overview counts every attempt");
    eprintln!(
        "{lines} events ({} MiB): status {} MiB in {:?}; report {} MiB in {:?}, a {page}-byte page",
        size >> 20,
        st.max_rss_bytes >> 20,
        st.elapsed,
        rp.max_rss_bytes >> 20,
        rp.elapsed
    );
}
