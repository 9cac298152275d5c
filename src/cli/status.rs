//! `rekindle status DIR…`: one screen about one run (`rundir::status`), or
//! one line per run over many (`rundir::row`: a sweep, a job array's
//! `runs/*`), filtered by state and sorted; `--json` for scripts, `--watch`
//! to refresh in place.

use std::fmt::Write as _;
use std::io::IsTerminal;

use super::CliError;
use super::args::{StatusArgs, StatusSort};
use super::output::{emit, stdout_lost};
use crate::exit::Outcome;
use crate::rundir::{self, RunRow, SortBy};

pub(super) fn status(args: &StatusArgs) -> Result<Outcome, CliError> {
    let one = args.run_dirs.len() == 1 && !args.table && args.state.is_empty();
    if one && !rundir::is_run_dir(&args.run_dirs[0]) {
        return Err(CliError::NotARunDir { path: args.run_dirs[0].clone(), file: rundir::CONFIG_FILE });
    }
    let terminal = std::io::stdout().is_terminal();
    let mut frames = 0u64;
    loop {
        if args.watch {
            watch_header(args, terminal);
        }
        if one {
            let st = rundir::status(&args.run_dirs[0]);
            if args.watch && args.output.json {
                outln!("{}", serde_json::to_string(&st).expect("status serialises"));
            } else {
                emit(&st, args.output.json);
            }
        } else {
            let rows = rows(args);
            if args.output.json {
                let json = if args.watch { serde_json::to_string(&rows) } else { serde_json::to_string_pretty(&rows) };
                outln!("{}", json.expect("rows serialise"));
            } else {
                out!("{}", table(&rows, args.run_dirs.len()));
            }
        }
        frames += 1;
        if !args.watch || args.count.is_some_and(|n| frames >= n) || stdout_lost() {
            return Ok(Outcome::Done);
        }
        std::thread::sleep(args.interval);
    }
}

/// The line above each refresh: the terminal cleared first, or a blank
/// line between refreshes written elsewhere (a file, a pipe).
fn watch_header(args: &StatusArgs, terminal: bool) {
    if args.output.json {
        return;
    }
    if terminal {
        super::output::write_out_raw(format_args!("\x1b[H\x1b[2J"));
    }
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    outln!("every {}: rekindle status (Ctrl-C stops)  {now}", humantime::format_duration(args.interval));
    if !terminal {
        outln!("");
    }
}

/// The rows of the directories asked for, filtered and sorted.
fn rows(args: &StatusArgs) -> Vec<RunRow> {
    let mut rows: Vec<RunRow> = args
        .run_dirs
        .iter()
        .map(|d| rundir::row(d))
        .filter(|r| args.state.is_empty() || args.state.contains(&r.state))
        .collect();
    let by = match args.sort {
        StatusSort::Dir => SortBy::Dir,
        StatusSort::State => SortBy::State,
        StatusSort::Progress => SortBy::Progress,
        StatusSort::CheckpointAge => SortBy::CheckpointAge,
    };
    rundir::sort_rows(&mut rows, by);
    rows
}

/// A duration in at most two units: `45s`, `12m05s`, `3h05m`, `2d04h`.
fn short_age(seconds: f64) -> String {
    let s = seconds.max(0.0) as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86400, s % 86400 / 3600),
    }
}

const HEADER: [&str; 11] = ["RUN", "JOB", "STATE", "STEP", "%", "LOSS", "CKPT", "AGE", "ATT", "LAST STOP", "NODE"];

/// The cells of a row, in the order of [`HEADER`]; a directory that is
/// not a run has its reason in place of the run's columns.
fn cells(r: &RunRow) -> Vec<String> {
    let dash = || "-".to_string();
    let mut cells = vec![r.dir.display().to_string(), r.job.clone().unwrap_or_else(dash), r.state.clone()];
    if let Some(problem) = &r.problem {
        cells.push(problem.clone());
        return cells;
    }
    cells.extend([
        match (r.step, r.max_steps) {
            (Some(s), Some(m)) => format!("{s}/{m}"),
            (Some(s), None) => s.to_string(),
            _ => dash(),
        },
        r.progress.map_or_else(dash, |p| format!("{:.1}%", 100.0 * p)),
        r.last_loss.map_or_else(dash, |l| format!("{l:.4}")),
        r.checkpoint_step.map_or_else(dash, |s| s.to_string()),
        r.checkpoint_age_seconds.map_or_else(dash, short_age),
        r.attempts.to_string(),
        r.last_stop.clone().unwrap_or_else(dash),
        match (&r.node, r.stragglers.is_empty()) {
            (node, true) => node.clone().unwrap_or_else(dash),
            (node, false) => format!("{} (straggler: {})", node.as_deref().unwrap_or("-"), r.stragglers.join(", ")),
        },
    ]);
    cells
}

/// The table, aligned, with a count by state below it (of `given`
/// directories when a filter left some out).
fn table(rows: &[RunRow], given: usize) -> String {
    let lines: Vec<Vec<String>> = rows.iter().map(cells).collect();
    let mut widths: Vec<usize> = HEADER.iter().map(|h| h.len()).collect();
    for line in lines.iter().filter(|l| l.len() == HEADER.len()) {
        for (w, c) in widths.iter_mut().zip(line) {
            *w = (*w).max(c.chars().count());
        }
    }
    // A reason spans the columns after STATE: only the first three align it.
    for line in lines.iter().filter(|l| l.len() < HEADER.len()) {
        for (w, c) in widths.iter_mut().zip(line.iter().take(3)) {
            *w = (*w).max(c.chars().count());
        }
    }
    let numeric = |i: usize| matches!(i, 3..=8);
    let mut out = String::new();
    let header: Vec<String> = HEADER.iter().map(|h| h.to_string()).collect();
    for line in std::iter::once(&header).chain(&lines) {
        let mut text = String::new();
        for (i, cell) in line.iter().enumerate() {
            let last = i + 1 == line.len();
            let pad = widths[i].saturating_sub(cell.chars().count());
            if numeric(i) && line.len() == HEADER.len() {
                let _ = write!(text, "{}{cell}", " ".repeat(pad));
            } else if last {
                text.push_str(cell);
            } else {
                let _ = write!(text, "{cell}{}", " ".repeat(pad));
            }
            if !last {
                text.push_str("  ");
            }
        }
        let _ = writeln!(out, "{}", text.trim_end());
    }
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for state in rundir::ROW_STATES {
        let n = rows.iter().filter(|r| r.state == state).count();
        if n > 0 {
            counts.push((state, n));
        }
    }
    let shown: Vec<String> = counts.iter().map(|(s, n)| format!("{n} {s}")).collect();
    let of = if rows.len() < given { format!(" (of {given} directories)") } else { String::new() };
    let _ = writeln!(
        out,
        "{} run{}{of}{}{}",
        rows.len(),
        if rows.len() == 1 { "" } else { "s" },
        if shown.is_empty() { "" } else { ": " },
        shown.join(", ")
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_show_in_two_units_at_most() {
        let cases = [
            (0.0, "0s"),
            (59.9, "59s"),
            (61.0, "1m01s"),
            (3600.0 * 3.0 + 300.0, "3h05m"),
            (86400.0 * 2.0 + 7200.0, "2d02h"),
        ];
        for (secs, text) in cases {
            assert_eq!(short_age(secs), text);
        }
    }

    #[test]
    fn the_table_aligns_runs_and_gives_a_reason_for_other_directories() {
        let run = RunRow {
            dir: "runs/lr-1".into(),
            job: Some("100_1".into()),
            state: "running".into(),
            step: Some(1200),
            max_steps: Some(5000),
            progress: Some(0.24),
            last_loss: Some(0.43125),
            checkpoint_step: Some(1000),
            checkpoint_age_seconds: Some(192.0),
            attempts: 2,
            last_stop: Some("SIGTERM".into()),
            node: Some("n1".into()),
            ..RunRow::default()
        };
        let slow = RunRow {
            dir: "runs/lr-2".into(),
            state: "stopped".into(),
            attempts: 1,
            node: Some("n3".into()),
            stragglers: vec!["rank 1 on n4".into()],
            ..RunRow::default()
        };
        let junk = RunRow {
            dir: "runs/photos".into(),
            state: "foreign".into(),
            problem: Some("not a rekindle run directory (no config.toml)".into()),
            ..RunRow::default()
        };
        let text = table(&[run, junk, slow], 3);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "RUN          JOB    STATE         STEP      %    LOSS  CKPT    AGE  ATT  LAST STOP  NODE"
        );
        assert_eq!(lines[1], "runs/lr-1    100_1  running  1200/5000  24.0%  0.4313  1000  3m12s    2  SIGTERM    n1");
        assert_eq!(lines[2], "runs/photos  -      foreign  not a rekindle run directory (no config.toml)");
        assert_eq!(
            lines[3],
            "runs/lr-2    -      stopped          -      -       -     -      -    1  -          n3 (straggler: rank 1 on n4)"
        );
        assert_eq!(lines[4], "3 runs: 1 running, 1 stopped, 1 foreign");
    }
}
