//! How the large files of a checkpoint reach the disk: direct I/O
//! (`O_DIRECT`) or the page cache (with the writeback started block by
//! block and the written pages dropped behind it), the bytes per write and
//! the writes in flight per file. Which is fastest depends on the
//! filesystem and the device — direct I/O was 1.0–1.5× buffered on the VM
//! the save path was first tuned on and 0.8× on another
//! (docs/performance.md) — so with `[checkpoint] write_mode = "auto"` it is
//! measured, not assumed: the first background save large enough to
//! matter writes a few short trial files with each candidate
//! ([`candidates`]), keeps the fastest ([`choose`]), and every later save
//! in the process on the same filesystem reuses the choice (a synchronous
//! save, such as a stop's inside its grace time, never measures: before a
//! measurement it writes through the page cache). The config can fix any
//! part of it.
//!
//! The decisions are pure functions with table tests; the trial writes
//! (`probe`) go through the very write path a save takes
//! (`hashed_io::write_hashed_with`).

use crate::confine::Dir;
use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::sync::Mutex;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::hashed_io::{self, WriteMode};

/// Bytes per write when nothing else was measured or configured.
pub const DEFAULT_BLOCK: usize = 8 << 20;
/// Writes in flight per file when nothing else was measured or configured.
pub const DEFAULT_QUEUE_DEPTH: usize = 2;

/// A save whose tensors hold fewer bytes than this is not worth a
/// measurement: it takes the default plan (or one measured before).
pub const MEASURE_FROM_BYTES: u64 = 256 << 20;

/// Bytes of each trial file of a measurement.
const TRIAL_BYTES: usize = 128 << 20;
/// Every candidate is tried this many times, interleaved, and keeps its
/// fastest trial: on a shared machine the slow ones are other processes'.
const TRIAL_ROUNDS: usize = 2;
/// A candidate measured within this fraction of the fastest counts as fast
/// as it; the first of the tied candidates (in [`candidates`] order) wins.
const TIE: f64 = 0.03;

/// How the writes of a plan reach the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IoMode {
    /// `O_DIRECT`: no page-cache copy; where the filesystem refuses it, the
    /// file falls back to [`IoMode::Buffered`] (detected per file).
    Direct,
    /// Through the page cache: each block's writeback is started right
    /// after it is written, and the pages a few blocks behind are waited
    /// for and dropped, so the cache never holds more than a few blocks of
    /// a checkpoint.
    Buffered,
}

/// How one file is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WritePlan {
    pub mode: IoMode,
    /// Bytes per write call (a multiple of 4 KiB).
    pub block_bytes: usize,
    /// Writes in flight per file (writer threads).
    pub queue_depth: usize,
}

impl WritePlan {
    /// Buffered, 8 MiB blocks, two writers: the plan of small saves.
    pub const DEFAULT: WritePlan =
        WritePlan { mode: IoMode::Buffered, block_bytes: DEFAULT_BLOCK, queue_depth: DEFAULT_QUEUE_DEPTH };
}

impl std::fmt::Display for WritePlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mode = match self.mode {
            IoMode::Direct => "direct",
            IoMode::Buffered => "buffered",
        };
        write!(
            f,
            "{mode}, {} blocks, {} in flight",
            crate::units::human_bytes(self.block_bytes as u64),
            self.queue_depth
        )
    }
}

/// `[checkpoint] write_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ModeSetting {
    /// Measured per filesystem.
    #[default]
    Auto,
    Direct,
    Buffered,
}

/// What the config fixes of the write path (`[checkpoint] write_mode`,
/// `write_block`, `write_queue_depth`, `shard_size`); `None` and
/// [`ModeSetting::Auto`] leave it to rekindle. The application makes them
/// from its `[checkpoint]` section (`rekindle::checkpoint::write_settings`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct WriteSettings {
    pub mode: ModeSetting,
    pub block_bytes: Option<usize>,
    pub queue_depth: Option<usize>,
    /// The largest model or optimizer file before it is split into shards
    /// (`None`: [`super::shards::DEFAULT_SHARD_BYTES`]).
    pub shard_bytes: Option<u64>,
}

/// One measured candidate.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Trial {
    pub plan: WritePlan,
    /// Its fastest trial, durable (fsynced) GB/s.
    pub gbps: f64,
}

/// Why a save writes the way it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChosenBy {
    /// Measured on this filesystem (by this save, or an earlier one of
    /// the process).
    Measured,
    /// Everything fixed by the config.
    Configured,
    /// A save too small to measure for ([`MEASURE_FROM_BYTES`]), before
    /// any measurement on this filesystem.
    Default,
}

/// The write path a save took, recorded in its `checkpoint_saved` event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WriteChoice {
    pub plan: WritePlan,
    pub chosen_by: ChosenBy,
    /// The candidates measured, when this save made the measurement.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trials: Vec<Trial>,
    /// Seconds the measurement took (part of this save's time), when this
    /// save made it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measure_seconds: Option<f64>,
    /// A direct plan whose files the filesystem refused `O_DIRECT` for:
    /// they were written through the page cache.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub direct_refused: bool,
}

/// The plans to measure, in order of preference on a tie: buffered first
/// (it needs nothing of the filesystem), then direct with deeper queues and
/// smaller blocks. What the config fixes narrows the list; a list of one
/// needs no measurement.
pub fn candidates(settings: &WriteSettings) -> Vec<WritePlan> {
    let modes: &[IoMode] = match settings.mode {
        ModeSetting::Auto => &[IoMode::Buffered, IoMode::Direct],
        ModeSetting::Direct => &[IoMode::Direct],
        ModeSetting::Buffered => &[IoMode::Buffered],
    };
    let mut out = Vec::new();
    for &mode in modes {
        // Page-cache writes gain nothing from other block sizes or deeper
        // queues (the kernel batches the writeback); direct ones do.
        let shapes: &[(usize, usize)] = match mode {
            IoMode::Buffered => &[(DEFAULT_BLOCK, DEFAULT_QUEUE_DEPTH)],
            IoMode::Direct => &[(DEFAULT_BLOCK, 2), (DEFAULT_BLOCK, 4), (1 << 20, 8)],
        };
        for &(block, depth) in shapes {
            let plan = WritePlan {
                mode,
                block_bytes: settings.block_bytes.unwrap_or(block),
                queue_depth: settings.queue_depth.unwrap_or(depth),
            };
            if !out.contains(&plan) {
                out.push(plan);
            }
        }
    }
    out
}

/// The fastest of the measured candidates; within [`TIE`] of it, the first
/// in [`candidates`] order. `None` when nothing was measured.
pub fn choose(trials: &[Trial]) -> Option<Trial> {
    let best = trials.iter().map(|t| t.gbps).filter(|g| g.is_finite()).fold(f64::NAN, f64::max);
    if best.is_nan() {
        return None;
    }
    trials.iter().find(|t| t.gbps >= best * (1.0 - TIE)).copied()
}

/// Choices made in this process, per filesystem (device) and settings.
static CHOSEN: Mutex<Vec<((u64, WriteSettings), WriteChoice)>> = Mutex::new(Vec::new());

/// The plan for a save of `payload` tensor bytes into the checkpoints
/// directory `dir`: fixed by `settings`, measured before on this
/// filesystem, measured now (with `measure`, a save of at least
/// [`MEASURE_FROM_BYTES`]), or the default. A measurement that fails (a
/// full disk) is logged and the default taken: the save itself then
/// reports the error, if any. Measurements of the process wait for each
/// other (one at a time measures the disk, not the others).
pub fn plan_for(dir: &Dir, settings: &WriteSettings, payload: u64, measure: bool) -> WriteChoice {
    let chosen = |plan, chosen_by| WriteChoice {
        plan,
        chosen_by,
        trials: Vec::new(),
        measure_seconds: None,
        direct_refused: false,
    };
    let list = candidates(settings);
    if list.len() == 1 {
        return chosen(list[0], ChosenBy::Configured);
    }
    let device = dir.metadata().map(|m| m.dev()).unwrap_or(u64::MAX);
    let key = (device, *settings);
    let mut cache = CHOSEN.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, known)) = cache.iter().find(|(k, _)| *k == key) {
        return chosen(known.plan, ChosenBy::Measured);
    }
    if !measure || payload < MEASURE_FROM_BYTES {
        return chosen(list[0], ChosenBy::Default);
    }
    let started = Instant::now();
    match probe(dir, &list, TRIAL_BYTES.min(payload as usize), TRIAL_ROUNDS) {
        Ok(trials) => {
            let Some(best) = choose(&trials) else { return chosen(list[0], ChosenBy::Default) };
            let choice = WriteChoice {
                plan: best.plan,
                chosen_by: ChosenBy::Measured,
                trials,
                measure_seconds: Some(started.elapsed().as_secs_f64()),
                direct_refused: false,
            };
            tracing::info!(dir = %dir.path().display(), plan = %choice.plan, trials = ?choice.trials, "measured how to write checkpoints on this filesystem");
            cache.push((key, choice.clone()));
            choice
        }
        Err(e) => {
            tracing::warn!(dir = %dir.path().display(), error = %e, "could not measure how to write checkpoints here; writing through the page cache");
            chosen(list[0], ChosenBy::Default)
        }
    }
}

/// Forgets every choice of this process (tests).
#[cfg(test)]
pub(super) fn forget_choices() {
    CHOSEN.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clear();
}

/// Writes a trial file of `bytes` with each plan of `plans`, `rounds`
/// times interleaved, through the save's own write path (hashed, fsynced),
/// in a leftover-named directory of `dir` (removed after; the next open of
/// the store removes it after a crash). Returns each plan's fastest trial;
/// a direct plan the filesystem refused is left out.
pub fn probe(dir: &Dir, plans: &[WritePlan], bytes: usize, rounds: usize) -> std::io::Result<Vec<Trial>> {
    let scratch_name = format!("{}probe-{}", super::store::LEFTOVER_PREFIXES[0], std::process::id());
    let _ = dir.remove_dir_all(&scratch_name);
    dir.create_dir(&scratch_name, 0o777)?;
    let result = (|| {
        let scratch = dir.open_dir(&scratch_name)?;
        // Incompressible bytes, so a compressing filesystem measures the
        // disk; one 8 MiB pattern repeated.
        let mut pattern = vec![0u8; DEFAULT_BLOCK.min(bytes.max(1))];
        fill(&mut pattern);
        let parts: Vec<&[u8]> = std::iter::repeat_n(pattern.as_slice(), bytes.div_ceil(pattern.len())).collect();
        let mut best: HashMap<WritePlan, f64> = HashMap::new();
        let mut refused = Vec::new();
        for round in 0..rounds {
            for (i, plan) in plans.iter().enumerate() {
                let name = format!("trial-{round}-{i}");
                let t0 = Instant::now();
                let written = hashed_io::write_hashed_with(&scratch, &name, &parts, plan)?;
                let gbps = written.bytes as f64 / t0.elapsed().as_secs_f64() / 1e9;
                hashed_io::drop_cached(&scratch, &name);
                scratch.remove_file(&name)?;
                if plan.mode == IoMode::Direct && written.mode != WriteMode::Direct {
                    refused.push(*plan);
                }
                let entry = best.entry(*plan).or_insert(0.0);
                *entry = entry.max(gbps);
            }
        }
        Ok(plans
            .iter()
            .filter(|p| !refused.contains(p))
            .map(|p| Trial { plan: *p, gbps: best.get(p).copied().unwrap_or(0.0) })
            .collect())
    })();
    let _ = dir.remove_dir_all(&scratch_name);
    result
}

/// Cheap pseudo-random bytes (xorshift).
fn fill(buf: &mut [u8]) {
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    for chunk in buf.chunks_mut(8) {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        chunk.copy_from_slice(&seed.to_le_bytes()[..chunk.len()]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(mode: IoMode, block_mib: usize, depth: usize) -> WritePlan {
        WritePlan { mode, block_bytes: block_mib << 20, queue_depth: depth }
    }

    #[test]
    fn candidates_narrow_to_what_the_config_leaves_open() {
        use IoMode::{Buffered, Direct};
        let auto = WriteSettings::default();
        assert_eq!(
            candidates(&auto),
            [plan(Buffered, 8, 2), plan(Direct, 8, 2), plan(Direct, 8, 4), plan(Direct, 1, 8)],
            "buffered first: it wins ties"
        );
        let cases: Vec<(WriteSettings, Vec<WritePlan>)> = vec![
            (WriteSettings { mode: ModeSetting::Buffered, ..auto }, vec![plan(Buffered, 8, 2)]),
            (
                WriteSettings { mode: ModeSetting::Direct, ..auto },
                vec![plan(Direct, 8, 2), plan(Direct, 8, 4), plan(Direct, 1, 8)],
            ),
            (
                WriteSettings { mode: ModeSetting::Direct, block_bytes: Some(4 << 20), ..auto },
                vec![plan(Direct, 4, 2), plan(Direct, 4, 4), plan(Direct, 4, 8)],
            ),
            (
                WriteSettings { mode: ModeSetting::Direct, queue_depth: Some(3), ..auto },
                vec![plan(Direct, 8, 3), plan(Direct, 1, 3)],
            ),
            (
                WriteSettings { block_bytes: Some(2 << 20), queue_depth: Some(1), ..auto },
                vec![plan(Buffered, 2, 1), plan(Direct, 2, 1)],
            ),
            (
                WriteSettings { mode: ModeSetting::Buffered, block_bytes: Some(1 << 20), queue_depth: Some(4), ..auto },
                vec![plan(Buffered, 1, 4)],
            ),
        ];
        for (settings, expected) in cases {
            assert_eq!(candidates(&settings), expected, "{settings:?}");
        }
    }

    #[test]
    fn the_fastest_candidate_wins_and_a_near_tie_goes_to_the_first() {
        use IoMode::{Buffered, Direct};
        let t = |p, gbps| Trial { plan: p, gbps };
        let (b, d2, d4) = (plan(Buffered, 8, 2), plan(Direct, 8, 2), plan(Direct, 8, 4));
        let cases: Vec<(Vec<Trial>, Option<WritePlan>)> = vec![
            // This VM (2026-11-25): direct slower than buffered.
            (vec![t(b, 0.61), t(d2, 0.48), t(d4, 0.52)], Some(b)),
            // The VM the path was tuned on: direct 1.4–1.8 GB/s, buffered 0.9.
            (vec![t(b, 0.9), t(d2, 1.4), t(d4, 1.8)], Some(d4)),
            // Within 3 %: the first (buffered) keeps it.
            (vec![t(b, 1.0), t(d2, 1.02)], Some(b)),
            (vec![t(b, 1.0), t(d2, 1.04)], Some(d2)),
            // Buffered refused nothing, direct was refused (left out).
            (vec![t(b, 0.3)], Some(b)),
            (vec![], None),
            (vec![t(b, f64::NAN), t(d2, 0.5)], Some(d2)),
        ];
        for (trials, expected) in cases {
            assert_eq!(choose(&trials).map(|t| t.plan), expected, "{trials:?}");
        }
    }

    #[test]
    fn a_measurement_is_made_once_per_filesystem_and_small_or_synchronous_saves_never_measure() {
        forget_choices();
        let tmp = tempfile::tempdir().unwrap();
        let dir = Dir::open(tmp.path()).unwrap();
        let settings = WriteSettings { block_bytes: Some(1 << 20), ..WriteSettings::default() };
        let small = plan_for(&dir, &settings, 1 << 20, true);
        assert_eq!((small.chosen_by, small.plan.mode), (ChosenBy::Default, IoMode::Buffered));
        assert!(small.trials.is_empty());
        let configured = WriteSettings { mode: ModeSetting::Direct, queue_depth: Some(2), ..settings };
        let unmeasured = plan_for(&dir, &settings, 1 << 40, false);
        assert_eq!((unmeasured.chosen_by, unmeasured.trials.len()), (ChosenBy::Default, 0), "not asked to measure");
        assert_eq!(plan_for(&dir, &configured, 1 << 40, true).chosen_by, ChosenBy::Configured);
        assert_eq!(plan_for(&dir, &configured, 1 << 40, true).plan, plan(IoMode::Direct, 1, 2));
        // Measured with small trial files (the probe itself, not plan_for's
        // 128 MiB trials, so the test stays quick).
        let trials = probe(&dir, &candidates(&settings), 2 << 20, 1).unwrap();
        assert!(!trials.is_empty() && trials.iter().all(|t| t.gbps > 0.0), "{trials:?}");
        assert!(std::fs::read_dir(tmp.path()).unwrap().next().is_none(), "the probe leaves nothing behind");
    }
}
