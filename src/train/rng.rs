//! rekindle's own random numbers: seeded ChaCha8 generators, one stream per
//! purpose, whose state is a small JSON value that restores them exactly.
//!
//! candle's CPU generator cannot be seeded, so no random draw of a run goes
//! through candle: initial weights, the data order, dropout masks and the
//! synthetic datasets all come from here. Each purpose has its own ChaCha
//! stream under one key derived from the run seed, so drawing more dropout
//! masks never shifts the data order, and a generator's whole state is
//! (key, stream, word position). Distributions are implemented here on top of
//! `next_u64` (not `rand`'s distribution code, which may change between
//! versions) and keep no cached values, so the word position really is all
//! the state there is.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use super::error::TrainError;

/// What a generator is used for; each purpose is a separate ChaCha stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// Initial parameter values.
    Init,
    /// Dropout masks during training.
    Dropout,
    /// The data order of one epoch (the epoch number selects the sub-stream).
    DataOrder(u64),
    /// Samples of the synthetic datasets.
    Synthetic,
}

impl Stream {
    /// The ChaCha stream number: a purpose tag in the top byte, a sub-stream
    /// (the epoch, for the data order) below it.
    pub fn id(self) -> u64 {
        const SUB: u64 = (1 << 56) - 1;
        match self {
            Stream::Init => 1 << 56,
            Stream::Dropout => 2 << 56,
            Stream::DataOrder(epoch) => (3 << 56) | (epoch & SUB),
            Stream::Synthetic => 4 << 56,
        }
    }
}

/// SplitMix64 step: a fixed, well-mixed function of its input, used to
/// derive keys and per-item hashes from the run seed.
pub fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The 32-byte ChaCha key of a run seed.
fn key_of(seed: u64) -> [u8; 32] {
    let mut key = [0u8; 32];
    let mut x = seed;
    for chunk in key.chunks_exact_mut(8) {
        x = splitmix64(x);
        chunk.copy_from_slice(&x.to_le_bytes());
    }
    key
}

/// A hash of `(seed, domain, index)` in `[0, 1)`; used for per-item
/// decisions such as "is record `index` in the validation split", which must
/// not depend on any other item.
pub fn unit_hash(seed: u64, domain: u64, index: u64) -> f64 {
    let h = splitmix64(splitmix64(seed ^ splitmix64(domain)) ^ index);
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// A seeded generator for one [`Stream`].
#[derive(Debug, Clone, PartialEq)]
pub struct StreamRng {
    rng: ChaCha8Rng,
}

/// The complete state of a [`StreamRng`]: restoring it continues the exact
/// sequence of draws.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RngState {
    /// The ChaCha key, hex-encoded (derived from the run seed).
    pub key: String,
    /// The ChaCha stream number ([`Stream::id`]).
    pub stream: u64,
    /// 32-bit words consumed so far.
    pub word_pos: u64,
}

impl StreamRng {
    /// The generator of `stream` for a run seeded with `seed`.
    pub fn new(seed: u64, stream: Stream) -> Self {
        let mut rng = ChaCha8Rng::from_seed(key_of(seed));
        rng.set_stream(stream.id());
        StreamRng { rng }
    }

    /// Its state, to be stored in a checkpoint.
    pub fn state(&self) -> RngState {
        RngState {
            key: hex::encode(self.rng.get_seed()),
            stream: self.rng.get_stream(),
            // 2^64 words is more than any run can draw; saturate rather than panic.
            word_pos: u64::try_from(self.rng.get_word_pos()).unwrap_or(u64::MAX),
        }
    }

    /// A generator continuing exactly where `state` was taken.
    pub fn from_state(state: &RngState) -> Result<Self, TrainError> {
        let bytes = hex::decode(&state.key).map_err(|e| TrainError::state("rng.key", format!("not hex: {e}")))?;
        let key: [u8; 32] = bytes
            .try_into()
            .map_err(|b: Vec<u8>| TrainError::state("rng.key", format!("expected 32 bytes, got {}", b.len())))?;
        let mut rng = ChaCha8Rng::from_seed(key);
        rng.set_stream(state.stream);
        rng.set_word_pos(u128::from(state.word_pos));
        Ok(StreamRng { rng })
    }

    /// 64 uniformly random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.rng.next_u64()
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.next_f64()
    }

    /// Standard normal (Box–Muller; the second value is discarded so that no
    /// hidden state exists beyond the word position).
    pub fn normal(&mut self) -> f64 {
        // 1 - u lies in (0, 1], so the logarithm is finite.
        let u1 = 1.0 - self.next_f64();
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// Uniform integer in `[0, n)` without modulo bias (Lemire's method);
    /// `n` must be positive.
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "below(0)");
        let threshold = n.wrapping_neg() % n;
        loop {
            let m = u128::from(self.next_u64()) * u128::from(n);
            if (m as u64) >= threshold {
                return (m >> 64) as u64;
            }
        }
    }

    /// A uniformly random permutation of `0..n` (Fisher–Yates).
    pub fn permutation(&mut self, n: usize) -> Vec<usize> {
        let mut perm: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            let j = self.below(i as u64 + 1) as usize;
            perm.swap(i, j);
        }
        perm
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restored_generator_continues_the_same_sequence() {
        let mut a = StreamRng::new(7, Stream::Dropout);
        for _ in 0..13 {
            a.next_f64();
        }
        a.normal();
        let state = a.state();
        let json = serde_json::to_string(&state).unwrap();
        let mut b = StreamRng::from_state(&serde_json::from_str(&json).unwrap()).unwrap();
        let xs: Vec<u64> = (0..100).map(|_| a.next_u64()).collect();
        let ys: Vec<u64> = (0..100).map(|_| b.next_u64()).collect();
        assert_eq!(xs, ys);
        assert_eq!(a, b);
    }

    #[test]
    fn streams_of_one_seed_are_independent_and_seeds_differ() {
        let draw = |seed, stream| {
            let mut r = StreamRng::new(seed, stream);
            (0..4).map(|_| r.next_u64()).collect::<Vec<_>>()
        };
        assert_ne!(draw(1, Stream::Init), draw(1, Stream::Dropout));
        assert_ne!(draw(1, Stream::DataOrder(0)), draw(1, Stream::DataOrder(1)));
        assert_ne!(draw(1, Stream::Init), draw(2, Stream::Init));
        assert_eq!(draw(3, Stream::Synthetic), draw(3, Stream::Synthetic));
    }

    #[test]
    fn draws_have_the_expected_ranges_and_moments() {
        let mut r = StreamRng::new(0, Stream::Synthetic);
        let n = 20_000;
        let normals: Vec<f64> = (0..n).map(|_| r.normal()).collect();
        let mean = normals.iter().sum::<f64>() / n as f64;
        let var = normals.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.03 && (var - 1.0).abs() < 0.05, "mean {mean} var {var}");
        for _ in 0..1000 {
            let u = r.uniform(-2.0, 3.0);
            assert!((-2.0..3.0).contains(&u));
            assert!(r.below(7) < 7);
        }
        let mut perm = r.permutation(50);
        perm.sort_unstable();
        assert_eq!(perm, (0..50).collect::<Vec<_>>());
    }

    #[test]
    fn rejects_a_malformed_state() {
        let mut state = StreamRng::new(0, Stream::Init).state();
        state.key = "abcd".into();
        assert!(matches!(StreamRng::from_state(&state), Err(TrainError::State { .. })));
    }

    #[test]
    fn unit_hash_is_in_range_and_spread() {
        let inside = (0..10_000).filter(|&i| unit_hash(5, 1, i) < 0.25).count();
        assert!((2300..2700).contains(&inside), "{inside}");
    }
}
