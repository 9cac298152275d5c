//! `rekindle bench collective`: the gradient sum of a data-parallel step
//! (the deterministic rank-order sum of `distributed::collective`) timed on
//! a vector of a given size, on every rank of a world launched by `mpirun`
//! or `srun`, and checked: every rank knows every rank's input (a pure
//! function of rank and index), so each checks the result against the sum
//! it computes alone, bit for bit, and that repeating the sum gives the same
//! bits. Rank 0 reports.

use std::fmt;
use std::time::Instant;

use serde::Serialize;

use super::checkpoint::Stats;
use crate::distributed::{self, Collective, DistributedError, WorldInfo, sum_in_rank_order};

/// Errors of the collective benchmark.
#[derive(Debug, thiserror::Error)]
pub enum CollectiveBenchError {
    #[error(transparent)]
    Distributed(#[from] DistributedError),
    #[error(
        "the rank-order sum on rank {rank} differs from the sum computed alone at element {index} \
         (got {got:e}, expected {expected:e}): the collective is not exact; report this with `rekindle bench collective --json`"
    )]
    Wrong { rank: usize, index: usize, got: f32, expected: f32 },
    #[error(
        "repeating the sum on rank {rank} gave different bits (iteration {iteration}): the reduction is not deterministic"
    )]
    NotDeterministic { rank: usize, iteration: usize },
}

/// What rank 0 reports.
#[derive(Debug, Clone, Serialize)]
pub struct CollectiveBench {
    pub engine: String,
    pub library: Option<String>,
    pub world_size: usize,
    pub launcher: String,
    pub bytes: u64,
    pub iterations: usize,
    /// Seconds per sum (median, min, max over iterations, slowest rank).
    pub seconds: Stats,
    /// `bytes / median seconds`.
    pub algorithm_gb_per_s: f64,
    /// `2 (n − 1) / n × algorithm bandwidth`: what each rank moved per
    /// second (0 for one rank, where nothing moves).
    pub bus_gb_per_s: f64,
    /// Every rank's result equalled its own rank-order sum, bit for bit,
    /// every iteration.
    pub exact_and_deterministic: bool,
}

impl fmt::Display for CollectiveBench {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "collective sum of {} over {} rank(s) ({}, {}{}): median {:.4} s (min {:.4}, max {:.4}) over {} iterations",
            crate::units::human_bytes(self.bytes),
            self.world_size,
            self.engine,
            self.launcher,
            self.library.as_deref().map(|l| format!(", {l}")).unwrap_or_default(),
            self.seconds.median,
            self.seconds.min,
            self.seconds.max,
            self.iterations
        )?;
        writeln!(
            f,
            "  algorithm bandwidth {:.2} GB/s, bus bandwidth {:.2} GB/s; exact and deterministic: {}",
            self.algorithm_gb_per_s, self.bus_gb_per_s, self.exact_and_deterministic
        )
    }
}

/// Rank `rank`'s input: values of mixed magnitude and sign, so that the
/// order of the sum shows in its bits.
fn input(rank: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| {
            let x = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (rank as u64).wrapping_mul(0xD1B5_4A32_D192_ED03);
            let mantissa = (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            let exponent = ((x >> 8) % 16) as i32 - 8;
            mantissa * 2f32.powi(exponent)
        })
        .collect()
}

/// Runs the benchmark on this rank; `Some` on rank 0.
pub fn run_collective_bench(bytes: u64, iterations: usize) -> Result<Option<CollectiveBench>, CollectiveBenchError> {
    let info = WorldInfo::detect()?;
    let world = distributed::connect(&info)?;
    bench_on(&*world, &info, bytes, iterations.max(1))
}

fn bench_on(
    world: &dyn Collective,
    info: &WorldInfo,
    bytes: u64,
    iterations: usize,
) -> Result<Option<CollectiveBench>, CollectiveBenchError> {
    let len = (bytes / 4) as usize;
    let bytes = len as u64 * 4;
    let (rank, size) = (world.rank(), world.size());
    let mine = input(rank, len);
    let inputs: Vec<Vec<f32>> = (0..size).map(|r| input(r, len)).collect();
    let expected = sum_in_rank_order(inputs.iter().map(Vec::as_slice)).unwrap_or_default();
    drop(inputs);
    let mut times = Vec::with_capacity(iterations);
    let mut first: Option<Vec<f32>> = None;
    for iteration in 0..iterations {
        world.barrier()?;
        let t0 = Instant::now();
        let got = world.sum_in_rank_order(&mine)?;
        let local = t0.elapsed().as_secs_f64();
        // The slowest rank's time is the step's time.
        let slowest = world.max_u64(local.to_bits())?;
        times.push(f64::from_bits(slowest));
        match &first {
            None => {
                if let Some(index) = (0..len).find(|&i| got[i].to_bits() != expected[i].to_bits()) {
                    return Err(CollectiveBenchError::Wrong {
                        rank,
                        index,
                        got: got[index],
                        expected: expected[index],
                    });
                }
                first = Some(got);
            }
            Some(f) if *f != got => return Err(CollectiveBenchError::NotDeterministic { rank, iteration }),
            Some(_) => {}
        }
    }
    if rank != 0 {
        return Ok(None);
    }
    let seconds = Stats::of(&times);
    let algorithm = bytes as f64 / seconds.median / 1e9;
    #[cfg(feature = "mpi")]
    let library = (size > 1).then(distributed::mpi_world::MpiWorld::library_version);
    #[cfg(not(feature = "mpi"))]
    let library = None;
    Ok(Some(CollectiveBench {
        engine: world.engine().into(),
        library,
        world_size: size,
        launcher: info.launcher.to_string(),
        bytes,
        iterations,
        seconds,
        algorithm_gb_per_s: algorithm,
        bus_gb_per_s: algorithm * 2.0 * (size - 1) as f64 / size as f64,
        exact_and_deterministic: true,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::distributed::Solo;

    #[test]
    fn one_rank_is_exact_and_moves_nothing() {
        let r = bench_on(&Solo, &WorldInfo::SINGLE, 4096, 3).unwrap().unwrap();
        assert!(r.exact_and_deterministic);
        assert_eq!((r.world_size, r.engine.as_str(), r.bus_gb_per_s), (1, "solo", 0.0));
    }

    #[test]
    fn inputs_differ_by_rank_and_have_mixed_magnitudes() {
        let (a, b) = (input(0, 64), input(1, 64));
        assert_ne!(a, b);
        let big = a.iter().filter(|x| x.abs() > 1.0).count();
        let small = a.iter().filter(|x| x.abs() < 0.01).count();
        assert!(big > 0 && small > 0, "{a:?}");
    }
}
