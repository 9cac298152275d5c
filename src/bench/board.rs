//! `rekindle bench board`: what the tasks of an `exec` world cost the shared
//! filesystem while they wait for task 0 (`attempt::board`), for N tasks:
//! the real board and links, task 0 and N − 1 waiting tasks as threads of
//! this process over one temporary staging directory. Task 0 opens its
//! board (it holds the lock), takes `--wait` to post the world's start (what
//! verifying a large checkpoint takes), and the end a second later. Counted
//! per task: the files of the shared filesystem it read, and how long after
//! each post it heard it. The files a task reading them every 100 ms would
//! have read (as every task did before the board) are the comparison. The
//! table is docs/scale.md's.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::attempt::board::{Board, Link, Posted, Waited};

/// What to measure.
#[derive(Debug, Clone)]
pub struct BoardBenchOptions {
    /// World sizes (task 0 and the others), one row each.
    pub tasks: Vec<usize>,
    /// How long task 0 takes before it posts the start.
    pub wait: Duration,
    /// Where the staging directories go (a shared filesystem to measure
    /// that one; default: the system's temporary directory).
    pub dir: Option<PathBuf>,
}

/// One world size.
#[derive(Debug, Clone, Serialize)]
pub struct BoardRow {
    pub tasks: usize,
    /// Files read by the waiting tasks, all together, over the wait for the
    /// start and the end.
    pub file_reads: u64,
    /// The same per task and second of waiting.
    pub reads_per_task_second: f64,
    /// What polling every 100 ms would have read per task and second.
    pub polling_reads_per_task_second: f64,
    /// From a post to the slowest task hearing it (start, end).
    pub start_heard_max_seconds: f64,
    pub end_heard_max_seconds: f64,
    /// Tasks that heard over the connection (the others read the files).
    pub connected: usize,
}

/// The options and the table.
#[derive(Debug, Clone, Serialize)]
pub struct BoardBench {
    pub wait_seconds: f64,
    pub dir: PathBuf,
    pub rows: Vec<BoardRow>,
}

#[derive(Debug, thiserror::Error)]
pub enum BoardBenchError {
    #[error(
        "cannot make a staging directory for the benchmark in {path}: {source}; pass --dir with a writable directory"
    )]
    Dir { path: PathBuf, source: std::io::Error },
    #[error("cannot start waiting task {task} of {size}: {source} (a world this size needs {size} threads)")]
    Start { task: usize, size: usize, source: std::io::Error },
    #[error("task 0 could not post the benchmark's {what}: {reason}")]
    Post { what: &'static str, reason: String },
    #[error("a waiting task of {size} did not hear task 0 within a minute of its post (its wait ended: {how})")]
    NotHeard { size: usize, how: String },
    #[error("--tasks needs at least 2 tasks a row")]
    Shape,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Start {
    launch: String,
}
impl Posted for Start {
    const FILE: &'static str = ".bench-start.json";
    fn launch(&self) -> &str {
        &self.launch
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct End {
    launch: String,
}
impl Posted for End {
    const FILE: &'static str = ".bench-end.json";
    fn launch(&self) -> &str {
        &self.launch
    }
}

/// What one waiting task saw: when it heard each post, its file reads,
/// whether it was connected.
type Heard = Result<(Instant, Instant, u64, bool), String>;

/// Measures every world size of `opts`.
pub fn run_board_bench(opts: &BoardBenchOptions) -> Result<BoardBench, BoardBenchError> {
    if opts.tasks.iter().any(|n| *n < 2) {
        return Err(BoardBenchError::Shape);
    }
    let base = opts.dir.clone().unwrap_or_else(std::env::temp_dir);
    let rows = opts.tasks.iter().map(|&n| one_size(opts, &base, n)).collect::<Result<Vec<_>, _>>()?;
    Ok(BoardBench { wait_seconds: opts.wait.as_secs_f64(), dir: base, rows })
}

fn one_size(opts: &BoardBenchOptions, base: &std::path::Path, n: usize) -> Result<BoardRow, BoardBenchError> {
    let tmp = tempfile::Builder::new()
        .prefix("rekindle-bench-board-")
        .tempdir_in(base)
        .map_err(|source| BoardBenchError::Dir { path: base.to_path_buf(), source })?;
    let launch = format!("bench.{n}.r0");
    let started = Instant::now();
    let board = Board::open(tmp.path(), &launch, "localhost", n, None);
    let mut tasks = Vec::with_capacity(n - 1);
    for task in 1..n {
        let (staging, launch, wait) = (tmp.path().to_path_buf(), launch.clone(), opts.wait);
        let handle = std::thread::Builder::new()
            .name(format!("task{task}"))
            .stack_size(256 << 10)
            .spawn(move || -> Heard {
                let mut link = Link::new(&staging, &launch);
                let deadline = Instant::now() + wait + Duration::from_secs(60);
                let never = || None::<()>;
                let start = match link.wait::<Start, ()>(deadline, &never) {
                    Some(Waited::Got(_)) => Instant::now(),
                    other => return Err(format!("{other:?}")),
                };
                let connected = link.connected();
                match link.wait::<End, ()>(deadline, &never) {
                    Some(Waited::Got(_)) => Ok((start, Instant::now(), link.file_reads(), connected)),
                    other => Err(format!("{other:?}")),
                }
            })
            .map_err(|source| BoardBenchError::Start { task, size: n, source })?;
        tasks.push(handle);
    }
    std::thread::sleep(opts.wait.saturating_sub(started.elapsed()));
    let start_at = Instant::now();
    board
        .post(&Start { launch: launch.clone() })
        .map_err(|e| BoardBenchError::Post { what: "start", reason: e.to_string() })?;
    std::thread::sleep(Duration::from_secs(1));
    let end_at = Instant::now();
    board
        .post(&End { launch: launch.clone() })
        .map_err(|e| BoardBenchError::Post { what: "end", reason: e.to_string() })?;
    let (mut reads, mut start_max, mut end_max, mut connected) = (0, 0f64, 0f64, 0);
    for t in tasks {
        let heard = t.join().unwrap_or_else(|_| Err("the task's thread panicked".into()));
        let (heard_start, heard_end, r, c) = heard.map_err(|how| BoardBenchError::NotHeard { size: n, how })?;
        reads += r;
        start_max = start_max.max(heard_start.saturating_duration_since(start_at).as_secs_f64());
        end_max = end_max.max(heard_end.saturating_duration_since(end_at).as_secs_f64());
        connected += usize::from(c);
    }
    let waited = end_at.saturating_duration_since(started).as_secs_f64() + end_max;
    let waiting = (n - 1) as f64;
    Ok(BoardRow {
        tasks: n,
        file_reads: reads,
        reads_per_task_second: reads as f64 / waiting / waited,
        // A read every 100 ms, and one when each wait begins.
        polling_reads_per_task_second: (waited / 0.1 + 2.0) / waited,
        start_heard_max_seconds: start_max,
        end_heard_max_seconds: end_max,
        connected,
    })
}

impl std::fmt::Display for BoardBench {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "board: task 0 posts the start after {:.0} s, the end 1 s later; staging in {}",
            self.wait_seconds,
            self.dir.display()
        )?;
        writeln!(
            f,
            "{:>6} {:>10} {:>16} {:>16} {:>12} {:>12} {:>10}",
            "tasks", "file reads", "reads/task/s", "polling before", "start max s", "end max s", "connected"
        )?;
        for r in &self.rows {
            writeln!(
                f,
                "{:>6} {:>10} {:>16.3} {:>16.2} {:>12.3} {:>12.3} {:>10}",
                r.tasks,
                r.file_reads,
                r.reads_per_task_second,
                r.polling_reads_per_task_second,
                r.start_heard_max_seconds,
                r.end_heard_max_seconds,
                r.connected
            )?;
        }
        Ok(())
    }
}
