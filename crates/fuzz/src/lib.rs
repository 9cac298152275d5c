//! Shared pieces of the property tests that fuzz every reader of what
//! rekindle reads back (`MANIFEST.json`, `state.json`, safetensors headers,
//! the lock file, `events.jsonl`/`metrics.jsonl`/`gpu_stats.jsonl` lines,
//! `summary.json`, config TOML and `--set` overrides, GPU inventories, data
//! JSONL through `rekindle data validate` and `--clean`, and
//! whole damaged run directories through `status` and `report`). Each
//! reader's fuzz test lives beside it (a `fuzz` module in its tests) and
//! asserts the same thing: any input gives a value or a typed error, never a
//! panic, and no allocation is sized by an untrusted length before that
//! length is checked against the bytes actually there.
//!
//! `cargo test --lib fuzz` runs them all; `make fuzz` runs them with many
//! more cases.
//!
//! Inputs come in two kinds: arbitrary bytes, and a valid file with
//! [`Mutation`]s applied (byte flips, truncations, inserted bytes, a number
//! replaced by a hostile one, deep nesting), which reach far deeper into a
//! parser than random bytes do.
//!
//! Case counts: [`config`] runs [`DEFAULT_CASES`] per test so that all of
//! them together take seconds in a debug build; `PROPTEST_CASES=N` raises it
//! (e.g. for a longer fuzzing session).
//!
//! Seeds: the default run (`make test`, CI) draws its cases from a fixed
//! seed, [`DEFAULT_SEED`], so it tests the same inputs every time and a
//! red run is a change's doing, not the draw's (a random seed once failed
//! one landing in ten on a redaction shape no change had touched). Finding
//! new inputs is `make fuzz`'s job: with `PROPTEST_CASES` set the seed is
//! random unless `PROPTEST_RNG_SEED` names one, and what it finds becomes
//! a named regression test beside the fix.

use proptest::prelude::*;
use proptest::test_runner::Config;

/// Cases per fuzz test when `PROPTEST_CASES` is not set.
pub const DEFAULT_CASES: u32 = 64;

/// The seed of the default run's cases (module header, Seeds).
pub const DEFAULT_SEED: u64 = 0x7265_6b69_6e64_6c65;

/// The proptest configuration of every fuzz test.
pub fn config() -> Config {
    let mut c = Config::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        c.cases = DEFAULT_CASES;
        if std::env::var_os("PROPTEST_RNG_SEED").is_none() {
            c.rng_seed = proptest::test_runner::RngSeed::Fixed(DEFAULT_SEED);
        }
    }
    // A failing case is reported with its minimal input; no regression files
    // are written into the source tree (a named regression test is added
    // beside the fix instead).
    c.failure_persistence = None;
    c
}

/// Numbers that break arithmetic: overflow u64/i64/usize, negative where
/// unsigned is expected, beyond f64, not a number at all.
pub const HOSTILE_NUMBERS: &[&str] = &[
    "18446744073709551615",
    "18446744073709551616",
    "9223372036854775807",
    "-9223372036854775808",
    "1152921504606846976",
    "4294967296",
    "-1",
    "0",
    "1e309",
    "-1e309",
    "1e-400",
    "99999999999999999999999999999999999999",
    "0.5",
    "nan",
    "inf",
];

/// One change to a valid input.
#[derive(Debug, Clone)]
pub enum Mutation {
    /// XOR the byte at this position (modulo the length) with a non-zero mask.
    Flip(usize, u8),
    /// Cut the input at this position (modulo the length + 1).
    Truncate(usize),
    /// Insert these bytes at this position.
    Insert(usize, Vec<u8>),
    /// Replace the n-th run of ASCII digits (modulo their count) with one of
    /// [`HOSTILE_NUMBERS`].
    Number(usize, usize),
    /// Wrap the whole input in this many `[`…`]` (deep nesting).
    Nest(usize),
}

impl Mutation {
    /// Applies the mutation to `bytes`.
    pub fn apply(&self, bytes: &mut Vec<u8>) {
        match self {
            Mutation::Flip(at, mask) if !bytes.is_empty() => {
                let i = at % bytes.len();
                bytes[i] ^= mask.max(&1);
            }
            Mutation::Flip(..) => {}
            Mutation::Truncate(at) => bytes.truncate(at % (bytes.len() + 1)),
            Mutation::Insert(at, new) => {
                let i = at % (bytes.len() + 1);
                bytes.splice(i..i, new.iter().copied());
            }
            Mutation::Number(nth, which) => {
                let runs = digit_runs(bytes);
                if !runs.is_empty() {
                    let (start, end) = runs[nth % runs.len()];
                    let number = HOSTILE_NUMBERS[which % HOSTILE_NUMBERS.len()];
                    bytes.splice(start..end, number.bytes());
                }
            }
            Mutation::Nest(depth) => {
                let mut nested = vec![b'['; *depth];
                nested.append(bytes);
                nested.extend(std::iter::repeat_n(b']', *depth));
                *bytes = nested;
            }
        }
    }
}

/// `(start, end)` of every maximal run of ASCII digits, `-` included at its start.
fn digit_runs(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut runs = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i].is_ascii_digit() {
            let start = if i > 0 && bytes[i - 1] == b'-' { i - 1 } else { i };
            let mut end = i;
            while end < bytes.len() && bytes[end].is_ascii_digit() {
                end += 1;
            }
            runs.push((start, end));
            i = end;
        } else {
            i += 1;
        }
    }
    runs
}

/// Any one [`Mutation`].
pub fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<usize>(), any::<u8>()).prop_map(|(at, mask)| Mutation::Flip(at, mask)),
        2 => any::<usize>().prop_map(Mutation::Truncate),
        2 => (any::<usize>(), proptest::collection::vec(any::<u8>(), 1..16)).prop_map(|(at, b)| Mutation::Insert(at, b)),
        4 => (any::<usize>(), any::<usize>()).prop_map(|(nth, which)| Mutation::Number(nth, which)),
        1 => (1usize..4096).prop_map(Mutation::Nest),
    ]
}

/// `valid` with one to four mutations applied.
pub fn mutated(valid: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(mutation(), 1..5).prop_map(move |mutations| {
        let mut bytes = valid.clone();
        for m in &mutations {
            m.apply(&mut bytes);
        }
        bytes
    })
}

/// Arbitrary bytes, up to `max` long.
pub fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutations_change_what_they_say() {
        let mut b = b"{\"a\": 12, \"b\": -3}".to_vec();
        Mutation::Number(0, 0).apply(&mut b);
        assert_eq!(b, b"{\"a\": 18446744073709551615, \"b\": -3}");
        Mutation::Number(1, 7).apply(&mut b);
        assert_eq!(b, b"{\"a\": 18446744073709551615, \"b\": 0}");
        Mutation::Truncate(3).apply(&mut b);
        assert_eq!(b, b"{\"a");
        Mutation::Nest(2).apply(&mut b);
        assert_eq!(b, b"[[{\"a]]");
        Mutation::Flip(0, 0).apply(&mut b);
        assert_eq!(b[0], b'[' ^ 1);
    }
}
