//! `rekindle bench liveness`: what the lost-rank watch (`attempt::rank_watch`)
//! costs the shared filesystem and how fast it finds a loss, for N ranks on
//! M nodes, with the real watch code: N watches in this process (a thread
//! each, as every rank runs one), each told it runs on node `r / per_node`,
//! beating into one temporary run directory. Counted while they run
//! (`rank_watch::io_counts`): metadata operations on that directory (what a
//! site's metadata server serves), on node-local storage, and the longest
//! sweep one watcher made of the others' beats. Then one rank stops beating
//! without saying done (what a SIGSTOPped or frozen rank does) and the time
//! until a survivor's watch names it is measured; a rank named that was not
//! stopped is a false loss. The table is docs/scale.md's.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::attempt::rank_watch::{Lost, RankWatch, WatchSetup, beat_interval, io_counts};

/// What to measure.
#[derive(Debug, Clone)]
pub struct LivenessBenchOptions {
    /// World sizes, one row each.
    pub ranks: Vec<usize>,
    /// Ranks per simulated node.
    pub per_node: usize,
    /// `[distributed] timeout`.
    pub timeout: Duration,
    /// How long the steady state is counted.
    pub measure: Duration,
    /// Where the run directories go (a shared filesystem to measure it;
    /// default: the system's temporary directory).
    pub dir: Option<PathBuf>,
}

/// One world size.
#[derive(Debug, Clone, Serialize)]
pub struct LivenessRow {
    pub ranks: usize,
    pub nodes: usize,
    pub beat_seconds: f64,
    /// Shared-filesystem metadata operations per second, all ranks together.
    pub shared_ops_per_second: f64,
    /// The same per rank, and per node.
    pub shared_ops_per_rank_second: f64,
    pub shared_ops_per_node_second: f64,
    /// Node-local operations per second, all ranks together.
    pub local_ops_per_second: f64,
    /// The longest sweep of the others' beats one watcher made (a sweep
    /// longer than the timeout makes every rank look lost).
    pub longest_sweep_seconds: f64,
    /// From the stopped rank's last beat to the first survivor naming it
    /// (`None`: not named within three timeouts).
    pub detection_seconds: Option<f64>,
    /// Ranks named lost that were never stopped.
    pub false_losses: usize,
}

/// The options and the table.
#[derive(Debug, Clone, Serialize)]
pub struct LivenessBench {
    pub timeout_seconds: f64,
    pub measure_seconds: f64,
    pub per_node: usize,
    pub dir: PathBuf,
    pub rows: Vec<LivenessRow>,
}

#[derive(Debug, thiserror::Error)]
pub enum LivenessBenchError {
    #[error("cannot make a run directory for the benchmark in {path}: {source}; pass --dir with a writable directory")]
    Dir { path: PathBuf, source: std::io::Error },
    #[error("cannot start the watch of rank {rank} of {size}: {source} (a world this size needs {size} threads)")]
    Start { rank: usize, size: usize, source: std::io::Error },
    #[error("--ranks needs at least 2 ranks a row, and --per-node at least 1")]
    Shape,
}

/// A verdict a watch reached: when, which rank's watch, the ranks it named.
type Named = (Instant, usize, Vec<Lost>);

/// Measures every world size of `opts`.
pub fn run_liveness_bench(opts: &LivenessBenchOptions) -> Result<LivenessBench, LivenessBenchError> {
    if opts.ranks.iter().any(|n| *n < 2) || opts.per_node == 0 {
        return Err(LivenessBenchError::Shape);
    }
    let base = opts.dir.clone().unwrap_or_else(std::env::temp_dir);
    let rows = opts.ranks.iter().map(|&n| one_size(opts, &base, n)).collect::<Result<Vec<_>, _>>()?;
    Ok(LivenessBench {
        timeout_seconds: opts.timeout.as_secs_f64(),
        measure_seconds: opts.measure.as_secs_f64(),
        per_node: opts.per_node,
        dir: base,
        rows,
    })
}

fn one_size(opts: &LivenessBenchOptions, base: &std::path::Path, n: usize) -> Result<LivenessRow, LivenessBenchError> {
    let tmp = tempfile::Builder::new()
        .prefix("rekindle-bench-liveness-")
        .tempdir_in(base)
        .map_err(|source| LivenessBenchError::Dir { path: base.to_path_buf(), source })?;
    let dir = tmp.path().join(crate::attempt::rank_watch::RANKS_DIR);
    // A launch of its own per row (as every launch has): the node-local
    // beat folders are per launch.
    let session = crate::attempt::rank_watch::new_session(&format!("bench{n}"));
    let found: Arc<Mutex<Vec<Named>>> = Arc::default();
    let mut watches = Vec::with_capacity(n);
    for rank in 0..n {
        let setup = WatchSetup {
            dir: dir.clone(),
            rank,
            size: n,
            node: format!("node{}", rank / opts.per_node),
            session: session.clone(),
            timeout: opts.timeout,
        };
        let found = Arc::clone(&found);
        let handler =
            Box::new(move |lost| found.lock().unwrap_or_else(|p| p.into_inner()).push((Instant::now(), rank, lost)));
        watches.push(Some(RankWatch::start(setup, handler).map_err(|source| LivenessBenchError::Start {
            rank,
            size: n,
            source,
        })?));
    }
    // The steady state, counted after a first beat of every rank.
    std::thread::sleep(beat_interval(opts.timeout) * 2);
    io_counts::reset();
    let t0 = Instant::now();
    std::thread::sleep(opts.measure);
    let (shared, local, longest_sweep) = io_counts::read();
    let seconds = t0.elapsed().as_secs_f64();
    // The last rank stops beating without saying done.
    let victim = n - 1;
    let stopped_at = watches[victim].take().map_or_else(Instant::now, RankWatch::stop_beating);
    let deadline = stopped_at + 3 * opts.timeout;
    let detection = loop {
        let named = found
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find_map(|(at, _, lost)| lost.iter().any(|l| l.rank == victim).then_some(*at));
        if let Some(at) = named {
            break Some(at.saturating_duration_since(stopped_at).as_secs_f64());
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let false_losses = {
        let found = found.lock().unwrap_or_else(|p| p.into_inner());
        let mut named: Vec<usize> =
            found.iter().flat_map(|(_, _, lost)| lost.iter().map(|l| l.rank)).filter(|r| *r != victim).collect();
        named.sort_unstable();
        named.dedup();
        if std::env::var_os("REKINDLE_BENCH_DEBUG").is_some() {
            for (at, by, lost) in found.iter() {
                let ranks: Vec<(usize, f64)> = lost.iter().map(|l| (l.rank, l.silent.as_secs_f64())).collect();
                eprintln!("{:?} after stop: rank {by} named {ranks:?}", at.checked_duration_since(stopped_at));
            }
        }
        named.len()
    };
    for w in watches.into_iter().flatten() {
        w.finish();
    }
    let nodes = n.div_ceil(opts.per_node);
    Ok(LivenessRow {
        ranks: n,
        nodes,
        beat_seconds: beat_interval(opts.timeout).as_secs_f64(),
        shared_ops_per_second: shared as f64 / seconds,
        shared_ops_per_rank_second: shared as f64 / seconds / n as f64,
        shared_ops_per_node_second: shared as f64 / seconds / nodes as f64,
        local_ops_per_second: local as f64 / seconds,
        longest_sweep_seconds: longest_sweep,
        detection_seconds: detection,
        false_losses,
    })
}

impl std::fmt::Display for LivenessBench {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "liveness: timeout {:.0} s, {} ranks a node, counted over {:.0} s, in {}",
            self.timeout_seconds,
            self.per_node,
            self.measure_seconds,
            self.dir.display()
        )?;
        writeln!(
            f,
            "{:>6} {:>6} {:>7} {:>14} {:>10} {:>10} {:>12} {:>12} {:>11} {:>6}",
            "ranks",
            "nodes",
            "beat s",
            "shared ops/s",
            "per rank",
            "per node",
            "local ops/s",
            "sweep max s",
            "detected s",
            "false"
        )?;
        for r in &self.rows {
            writeln!(
                f,
                "{:>6} {:>6} {:>7.2} {:>14.0} {:>10.2} {:>10.2} {:>12.0} {:>12.4} {:>11} {:>6}",
                r.ranks,
                r.nodes,
                r.beat_seconds,
                r.shared_ops_per_second,
                r.shared_ops_per_rank_second,
                r.shared_ops_per_node_second,
                r.local_ops_per_second,
                r.longest_sweep_seconds,
                r.detection_seconds.map_or("never".to_string(), |s| format!("{s:.2}")),
                r.false_losses
            )?;
        }
        Ok(())
    }
}
