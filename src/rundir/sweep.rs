//! `rekindle status DIR…` over many run directories (a sweep, a job
//! array's `runs/*`): one [`RunRow`] per directory, read like `status` from
//! the directory alone. A directory that is not a run (someone else's, a
//! file, a path that does not exist) or whose run cannot be read (its
//! `config.toml` damaged or unreadable) gets a row saying why, never an
//! error: one bad directory must not hide the others.

use std::io;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::config;
use crate::telemetry::Event;

use super::status::{RunStatus, status};
use super::{CONFIG_FILE, EVENTS_FILE, LOCK_FILE, METRICS_FILE};

/// The states a row can be in: those of `status`, and the two of a
/// directory whose run cannot be shown.
pub const ROW_STATES: [&str; 7] = ["running", "stopped", "finished", "failed", "new", "damaged", "foreign"];

/// One line of `rekindle status DIR…`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RunRow {
    /// The directory as given.
    pub dir: PathBuf,
    /// `[run] name` (`null` when the config cannot be read).
    pub name: Option<String>,
    /// The SLURM job of the newest attempt (`<array job>_<task>` for an array task).
    pub job: Option<String>,
    /// running, stopped, finished, failed, new; damaged or foreign (then `problem` says why).
    pub state: String,
    pub step: Option<u64>,
    pub max_steps: Option<u64>,
    /// `step / max_steps`, 0 to 1.
    pub progress: Option<f64>,
    pub last_loss: Option<f64>,
    /// The newest checkpoint that verifies (a quick check: sizes and manifest).
    pub checkpoint_step: Option<u64>,
    pub checkpoint_age_seconds: Option<f64>,
    pub attempts: u64,
    /// The reason of the last `stop` (the signal, or `stop_at_step`).
    pub last_stop: Option<String>,
    /// Where the run runs (while running) or last ran.
    pub node: Option<String>,
    /// The stragglers of the newest attempt, as `rank 1 on n2` (`this
    /// process on n1` for a process alone).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stragglers: Vec<String>,
    /// Why the directory is shown as damaged or foreign.
    pub problem: Option<String>,
}

/// The row of `dir`.
pub fn row(dir: &Path) -> RunRow {
    let trouble = |state: &str, problem: String| RunRow {
        dir: dir.to_path_buf(),
        state: state.into(),
        problem: Some(problem),
        ..RunRow::default()
    };
    match std::fs::metadata(dir) {
        Ok(meta) if !meta.is_dir() => {
            return trouble("foreign", format!("not a directory ({})", crate::confine::kind_of(&meta)));
        }
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return trouble("foreign", "no such directory".into()),
        Err(e) => return trouble("damaged", format!("cannot read it: {e}")),
    }
    if let Err(e) = std::fs::read_dir(dir) {
        return trouble("damaged", format!("cannot list it: {e}"));
    }
    let config_path = dir.join(CONFIG_FILE);
    if !config_path.exists() {
        let ours = crate::confine::is_claimed(dir)
            || [EVENTS_FILE, METRICS_FILE, LOCK_FILE].iter().any(|f| dir.join(f).exists());
        if ours && crate::rundir::is_run_dir(dir) {
            let st = status(dir);
            if let Some((node, check, _)) = crate::rundir::untrained_by_node_check(&st) {
                let problem =
                    format!("nothing trained: every attempt failed its node check (the last: `{check}` on {node})");
                return RunRow { problem: Some(problem), ..row_of(&st) };
            }
        }
        return if ours {
            trouble(
                "damaged",
                format!(
                    "{CONFIG_FILE} is missing: its settings are unknown (restore it, or run it again with its config)"
                ),
            )
        } else {
            trouble("foreign", format!("not a rekindle run directory (no {CONFIG_FILE})"))
        };
    }
    let cfg = match config::load_recorded(&config_path) {
        Ok(loaded) => loaded.config,
        Err(e) => {
            // The problems, one per line after a heading: on one line.
            let text = e.to_string();
            let problems: Vec<&str> = text.lines().skip(1).map(str::trim).filter(|l| !l.is_empty()).collect();
            let why = if problems.is_empty() { text.trim().to_string() } else { problems.join("; ") };
            return trouble("damaged", format!("{CONFIG_FILE} does not load: {why}"));
        }
    };
    let st = status(dir);
    RunRow { name: Some(cfg.run.name), ..row_of(&st) }
}

/// The line of a run's status.
pub fn row_of(st: &RunStatus) -> RunRow {
    let newest = st.checkpoints.iter().find(|c| c.valid);
    let last_stop = match st.last_stop.as_ref().map(|e| &e.event) {
        Some(Event::Stop(stop)) => Some(if stop.reason.is_empty() { "?".to_string() } else { stop.reason.clone() }),
        _ => None,
    };
    RunRow {
        dir: st.run_dir.clone(),
        name: None,
        job: st.job.clone(),
        state: st.state.clone(),
        step: st.step,
        max_steps: st.max_steps,
        progress: st.progress,
        last_loss: st.last_loss,
        checkpoint_step: newest.map(|c| c.step),
        checkpoint_age_seconds: newest.and(st.last_checkpoint_age_seconds),
        attempts: st.attempts,
        last_stop,
        node: st.node.clone(),
        stragglers: st
            .stragglers
            .iter()
            .filter_map(|e| match &e.event {
                Event::Straggler(s) => Some(super::status::straggler_who(s)),
                _ => None,
            })
            .collect(),
        problem: None,
    }
}

/// How `rekindle status DIR…` orders its lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortBy {
    /// By directory, as given (`runs/*` sorts as the shell does).
    Dir,
    /// By state (running, stopped, failed, new, finished, damaged, foreign), then directory.
    State,
    /// Least progress first.
    Progress,
    /// Oldest newest-checkpoint first (runs without one first of all).
    CheckpointAge,
}

/// Sorts `rows` (stable: ties keep the directory order).
pub fn sort_rows(rows: &mut [RunRow], by: SortBy) {
    rows.sort_by(|a, b| a.dir.cmp(&b.dir));
    let rank = |s: &str| {
        ["running", "stopped", "failed", "new", "finished", "damaged", "foreign"].iter().position(|x| *x == s)
    };
    match by {
        SortBy::Dir => {}
        SortBy::State => rows.sort_by_key(|r| rank(&r.state)),
        SortBy::Progress => rows.sort_by(|a, b| a.progress.unwrap_or(-1.0).total_cmp(&b.progress.unwrap_or(-1.0))),
        SortBy::CheckpointAge => rows.sort_by(|a, b| {
            let age = |r: &RunRow| r.checkpoint_age_seconds.unwrap_or(f64::INFINITY);
            age(b).total_cmp(&age(a))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_that_is_not_a_run_gets_a_row_saying_why() {
        let tmp = tempfile::tempdir().unwrap();
        let row_state = |p: &Path| {
            let r = row(p);
            (r.state, r.problem.unwrap_or_default())
        };
        let file = tmp.path().join("file");
        std::fs::write(&file, "x").unwrap();
        assert_eq!(row_state(&file), ("foreign".into(), "not a directory (a regular file)".into()));
        assert_eq!(row_state(&tmp.path().join("absent")), ("foreign".into(), "no such directory".into()));
        let photos = tmp.path().join("photos");
        std::fs::create_dir(&photos).unwrap();
        std::fs::write(photos.join("a.jpg"), "x").unwrap();
        assert_eq!(row_state(&photos).1, "not a rekindle run directory (no config.toml)");
        let lost_config = tmp.path().join("lost");
        std::fs::create_dir(&lost_config).unwrap();
        std::fs::write(lost_config.join(EVENTS_FILE), "{}\n").unwrap();
        assert_eq!(row_state(&lost_config).0, "damaged");
        let bad = tmp.path().join("bad");
        std::fs::create_dir(&bad).unwrap();
        std::fs::write(bad.join(CONFIG_FILE), "[run]\nname = 3\n").unwrap();
        let (state, why) = row_state(&bad);
        assert_eq!(state, "damaged");
        assert!(why.starts_with("config.toml does not load: "), "{why}");
    }

    #[test]
    fn rows_sort_by_the_chosen_key_keeping_directory_order_for_ties() {
        let r = |dir: &str, state: &str, progress: Option<f64>, age: Option<f64>| RunRow {
            dir: dir.into(),
            state: state.into(),
            progress,
            checkpoint_age_seconds: age,
            ..RunRow::default()
        };
        let mut rows = vec![
            r("c", "finished", Some(1.0), Some(10.0)),
            r("a", "running", Some(0.5), Some(100.0)),
            r("b", "foreign", None, None),
            r("d", "running", Some(0.1), Some(5.0)),
        ];
        let dirs = |rows: &[RunRow]| rows.iter().map(|r| r.dir.to_string_lossy().to_string()).collect::<Vec<_>>();
        sort_rows(&mut rows, SortBy::Dir);
        assert_eq!(dirs(&rows), ["a", "b", "c", "d"]);
        sort_rows(&mut rows, SortBy::State);
        assert_eq!(dirs(&rows), ["a", "d", "c", "b"]);
        sort_rows(&mut rows, SortBy::Progress);
        assert_eq!(dirs(&rows), ["b", "d", "a", "c"]);
        sort_rows(&mut rows, SortBy::CheckpointAge);
        assert_eq!(dirs(&rows), ["b", "a", "c", "d"]);
    }
}
