//! Training data: the built-in datasets and the data cursor.
//!
//! - [`Classification`]: synthetic Gaussian clusters for the `mlp` model.
//! - [`TokenSequences`]: byte-level sequences for the `gpt` model, from a
//!   synthetic structured corpus, a JSONL file (one object per line, text
//!   in a named field) or a plain UTF-8 text file, packed to the context
//!   length.
//! - [`DataCursor`] and [`Sampler`]: which training samples come next. An
//!   epoch visits every training sample once in a permutation derived only
//!   from the seed and the epoch number, so the cursor (epoch, position) is
//!   all a checkpoint needs: a resumed run computes the same permutation and
//!   continues at the same position, without replaying anything.
//!
//! The train/validation split is a per-item seeded hash (see
//! [`is_validation`]): whether an item is held out never depends on other
//! items, on file order elsewhere or on the number of epochs.

use std::path::Path;

use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};

use super::error::TrainError;
use super::rng::{Stream, StreamRng, unit_hash};
use super::validate::{ValidateOptions, scan_file};
use super::workload::Split;
use crate::config::{DataSection, OnInvalid};

/// Hash domains of the split rule (one per kind of item, so the synthetic
/// sets and files do not share decisions).
const SPLIT_SAMPLES: u64 = 0x5350_4c49_5401;
const SPLIT_RECORDS: u64 = 0x5350_4c49_5402;
const SPLIT_WINDOWS: u64 = 0x5350_4c49_5403;

/// The seeded split rule: item `index` is held out for validation when its
/// hash falls below `val_fraction`.
pub fn is_validation(seed: u64, domain: u64, index: u64, val_fraction: f64) -> bool {
    unit_hash(seed, domain, index) < val_fraction
}

/// Position in the training data: `position` samples of epoch `epoch`'s
/// permutation have been consumed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataCursor {
    pub epoch: u64,
    pub position: u64,
}

/// Turns a cursor into sample indices, caching the current epoch's permutation.
#[derive(Debug, Clone)]
pub struct Sampler {
    seed: u64,
    len: usize,
    cached: Option<(u64, Vec<usize>)>,
}

impl Sampler {
    /// A sampler over `len` training samples for a run seeded with `seed`.
    pub fn new(seed: u64, len: usize) -> Self {
        Sampler { seed, len, cached: None }
    }

    /// The order of epoch `epoch`: a pure function of (seed, epoch, len).
    pub fn permutation(seed: u64, epoch: u64, len: usize) -> Vec<usize> {
        StreamRng::new(seed, Stream::DataOrder(epoch)).permutation(len)
    }

    /// The next `n` sample indices after `cursor`, advancing it; a batch that
    /// reaches the end of an epoch continues with the next epoch's order.
    /// Empty when there are no samples.
    pub fn take(&mut self, cursor: &mut DataCursor, n: usize) -> Vec<usize> {
        let mut out = Vec::with_capacity(n);
        if self.len == 0 {
            return out;
        }
        while out.len() < n {
            if cursor.position >= self.len as u64 {
                cursor.epoch += 1;
                cursor.position = 0;
            }
            let (seed, len, epoch) = (self.seed, self.len, cursor.epoch);
            if self.cached.as_ref().map(|(e, _)| *e) != Some(epoch) {
                self.cached = Some((epoch, Self::permutation(seed, epoch, len)));
            }
            let perm = &self.cached.as_ref().expect("permutation cached above").1;
            let start = cursor.position as usize;
            let count = (n - out.len()).min(len - start);
            out.extend_from_slice(&perm[start..start + count]);
            cursor.position += count as u64;
        }
        // Keep one representation per position: the end of an epoch is the
        // start of the next (as `skip` also produces).
        if cursor.position >= self.len as u64 {
            cursor.epoch += 1;
            cursor.position = 0;
        }
        out
    }

    /// Advances `cursor` by `n` samples without producing them.
    pub fn skip(&self, cursor: &mut DataCursor, n: u64) {
        let len = self.len as u64;
        if len == 0 {
            return;
        }
        let absolute = cursor.position + n;
        cursor.epoch += absolute / len;
        cursor.position = absolute % len;
    }
}

fn empty(what: &str, reason: impl Into<String>) -> TrainError {
    TrainError::EmptyData { what: what.to_string(), reason: reason.into() }
}

/// Labelled feature vectors: Gaussian clusters around one random centre per class.
#[derive(Debug, Clone)]
pub struct Classification {
    input_dim: usize,
    classes: usize,
    train: (Vec<f32>, Vec<u32>),
    val: (Vec<f32>, Vec<u32>),
}

impl Classification {
    /// `samples` points in `input_dim` dimensions, `classes` clusters with
    /// unit-normal centres and noise of standard deviation 1, all drawn from
    /// the seed's synthetic stream.
    pub fn synthetic(
        seed: u64,
        samples: usize,
        input_dim: usize,
        classes: usize,
        val_fraction: f64,
    ) -> Result<Self, TrainError> {
        let mut rng = StreamRng::new(seed, Stream::Synthetic);
        let centres: Vec<f64> = (0..classes * input_dim).map(|_| rng.normal()).collect();
        let mut data = Classification { input_dim, classes, train: Default::default(), val: Default::default() };
        for i in 0..samples {
            let class = rng.below(classes as u64) as usize;
            let split = if is_validation(seed, SPLIT_SAMPLES, i as u64, val_fraction) {
                &mut data.val
            } else {
                &mut data.train
            };
            let centre = &centres[class * input_dim..(class + 1) * input_dim];
            split.0.extend(centre.iter().map(|c| (c + rng.normal()) as f32));
            split.1.push(class as u32);
        }
        if data.train.1.is_empty() {
            return Err(empty(
                "synthetic classification data",
                format!("no training samples among {samples} (val_fraction {val_fraction})"),
            ));
        }
        Ok(data)
    }

    /// Number of classes.
    pub fn classes(&self) -> usize {
        self.classes
    }

    /// Samples in `split`.
    pub fn len(&self, split: Split) -> usize {
        self.part(split).1.len()
    }

    /// Whether `split` is empty.
    pub fn is_empty(&self, split: Split) -> bool {
        self.len(split) == 0
    }

    fn part(&self, split: Split) -> &(Vec<f32>, Vec<u32>) {
        match split {
            Split::Train => &self.train,
            Split::Validation => &self.val,
        }
    }

    /// Features `[B, input_dim]` (f32) and labels `[B]` (u32) of `indices`.
    pub fn batch(&self, split: Split, indices: &[usize], device: &Device) -> candle_core::Result<(Tensor, Tensor)> {
        let (xs, ys) = self.part(split);
        let d = self.input_dim;
        let mut features = Vec::with_capacity(indices.len() * d);
        let mut labels = Vec::with_capacity(indices.len());
        for &i in indices {
            features.extend_from_slice(&xs[i * d..(i + 1) * d]);
            labels.push(ys[i]);
        }
        Ok((Tensor::from_vec(features, (indices.len(), d), device)?, Tensor::from_vec(labels, indices.len(), device)?))
    }
}

/// Byte sequences of `context + 1` tokens: inputs are the first `context`,
/// targets the last `context` (next-byte prediction).
#[derive(Debug, Clone)]
pub struct TokenSequences {
    context: usize,
    train: Vec<u8>,
    val: Vec<u8>,
}

/// Words of the synthetic corpus: a tiny grammar whose regularities a small
/// model picks up quickly, so its loss visibly falls.
const SUBJECTS: &[&str] = &["the cat", "a dog", "the old bird", "my friend", "a small fox", "the teacher"];
const VERBS: &[&str] = &["sees", "likes", "chases", "finds", "paints", "remembers"];
const OBJECTS: &[&str] = &["the red ball", "a green tree", "the river", "an apple", "the moon", "a quiet house"];
const ENDINGS: &[&str] = &[".\n", ". ", "!\n", ". "];

impl TokenSequences {
    /// Windows of a structured synthetic corpus ("the cat sees the moon. ..."),
    /// `samples` of them before the split.
    pub fn synthetic(seed: u64, samples: usize, context: usize, val_fraction: f64) -> Result<Self, TrainError> {
        let mut rng = StreamRng::new(seed, Stream::Synthetic);
        let mut pick = |words: &[&'static str]| words[rng.below(words.len() as u64) as usize];
        let needed = samples * context + 1;
        let mut corpus = Vec::with_capacity(needed + 64);
        while corpus.len() < needed {
            for part in [pick(SUBJECTS), " ", pick(VERBS), " ", pick(OBJECTS), pick(ENDINGS)] {
                corpus.extend_from_slice(part.as_bytes());
            }
        }
        let mut seqs = TokenSequences { context, train: Vec::new(), val: Vec::new() };
        for i in 0..samples {
            let window = &corpus[i * context..i * context + context + 1];
            let dst = if is_validation(seed, SPLIT_SAMPLES, i as u64, val_fraction) {
                &mut seqs.val
            } else {
                &mut seqs.train
            };
            dst.extend_from_slice(window);
        }
        if seqs.train.is_empty() {
            return Err(empty(
                "synthetic text data",
                format!("no training sequences among {samples} (val_fraction {val_fraction})"),
            ));
        }
        Ok(seqs)
    }

    /// Sequences from a JSONL file: each valid record's text (field
    /// `data.field`) is assigned to a split by the seeded rule on its line
    /// number, followed by a newline, concatenated and cut into windows.
    /// Invalid records stop loading (`on_invalid = "error"`) or are skipped
    /// and counted (`"skip"`).
    pub fn from_jsonl(path: &Path, data: &DataSection, seed: u64, context: usize) -> Result<Self, TrainError> {
        let opts = ValidateOptions { field: data.field.clone(), max_len: data.max_len, ..ValidateOptions::default() };
        let (report, records) = scan_file(path, &opts, true)?;
        if report.invalid > 0 {
            match data.on_invalid {
                OnInvalid::Error => {
                    return Err(TrainError::InvalidDataset {
                        path: path.to_path_buf(),
                        lines: report.lines,
                        invalid: report.invalid,
                        summary: report.summary().into(),
                        check: opts.command_line(path).into(),
                    });
                }
                OnInvalid::Skip => tracing::warn!(
                    path = %path.display(),
                    skipped = report.invalid,
                    problems = %report.summary(),
                    "skipping invalid records"
                ),
            }
        }
        let (mut train, mut val) = (Vec::new(), Vec::new());
        for (line, text) in records {
            let dst = if is_validation(seed, SPLIT_RECORDS, line, data.val_fraction) { &mut val } else { &mut train };
            dst.extend_from_slice(text.as_bytes());
            dst.push(b'\n');
        }
        let pack = |stream: Vec<u8>| -> Vec<u8> {
            let n = stream.len().saturating_sub(1) / context;
            (0..n).flat_map(|i| stream[i * context..i * context + context + 1].iter().copied()).collect()
        };
        let seqs = TokenSequences { context, train: pack(train), val: pack(val) };
        if seqs.train.is_empty() {
            return Err(empty(
                &path.display().to_string(),
                format!(
                    "the training split holds fewer than {} bytes, too little for one sequence of context {context}",
                    context + 1
                ),
            ));
        }
        Ok(seqs)
    }

    /// Sequences from a plain text file (`[data] kind = "text"`): its bytes
    /// as they are, cut into consecutive windows of `context + 1` bytes (a
    /// window's last byte is the next one's first, so every pair of
    /// neighbouring bytes is a target once), each window assigned to a split
    /// by the seeded rule on its index. The bytes after the last whole
    /// window are not used.
    ///
    /// The file must be UTF-8 text without NUL characters ([`text_problem`]):
    /// the model would train on any bytes, but a file that is not text is
    /// almost always the wrong file (a checkpoint, an archive, a JSONL file's
    /// compressed copy), and training on it would only waste the allocation.
    pub fn from_text(path: &Path, seed: u64, context: usize, val_fraction: f64) -> Result<Self, TrainError> {
        let bytes = std::fs::read(path).map_err(|e| TrainError::io(path, e))?;
        if let Some(problem) = text_problem(&bytes) {
            return Err(TrainError::config(
                "data.path",
                format!(
                    "{} is not a UTF-8 text file: {problem}; data.kind = \"text\" trains on plain text \
                     (JSONL records: kind = \"jsonl\")",
                    path.display()
                ),
            ));
        }
        let windows = bytes.len().saturating_sub(1) / context;
        let mut seqs = TokenSequences { context, train: Vec::new(), val: Vec::new() };
        for i in 0..windows {
            let dst = if is_validation(seed, SPLIT_WINDOWS, i as u64, val_fraction) {
                &mut seqs.val
            } else {
                &mut seqs.train
            };
            dst.extend_from_slice(&bytes[i * context..i * context + context + 1]);
        }
        if seqs.train.is_empty() {
            let reason = if windows == 0 {
                format!(
                    "it holds {} bytes, too few for one sequence of model.context + 1 = {} bytes",
                    bytes.len(),
                    context + 1
                )
            } else {
                format!(
                    "none of its {windows} sequences of {} bytes fell in the training split (data.val_fraction \
                     {val_fraction}): give more text or lower data.val_fraction",
                    context + 1
                )
            };
            return Err(empty(&path.display().to_string(), reason));
        }
        Ok(seqs)
    }

    /// Sequences in `split`.
    pub fn len(&self, split: Split) -> usize {
        self.part(split).len() / (self.context + 1)
    }

    /// Whether `split` is empty.
    pub fn is_empty(&self, split: Split) -> bool {
        self.len(split) == 0
    }

    fn part(&self, split: Split) -> &[u8] {
        match split {
            Split::Train => &self.train,
            Split::Validation => &self.val,
        }
    }

    /// The raw `context + 1` bytes of sequence `index`.
    pub fn sequence(&self, split: Split, index: usize) -> &[u8] {
        let n = self.context + 1;
        &self.part(split)[index * n..(index + 1) * n]
    }

    /// Inputs and targets `[B, context]` (u32 token ids) of `indices`.
    pub fn batch(&self, split: Split, indices: &[usize], device: &Device) -> candle_core::Result<(Tensor, Tensor)> {
        let t = self.context;
        let mut inputs = Vec::with_capacity(indices.len() * t);
        let mut targets = Vec::with_capacity(indices.len() * t);
        for &i in indices {
            let seq = self.sequence(split, i);
            inputs.extend(seq[..t].iter().map(|&b| u32::from(b)));
            targets.extend(seq[1..].iter().map(|&b| u32::from(b)));
        }
        let shape = (indices.len(), t);
        Ok((Tensor::from_vec(inputs, shape, device)?, Tensor::from_vec(targets, shape, device)?))
    }
}

/// Why `bytes` is not UTF-8 text without NUL characters, with the 1-based
/// line and column (in bytes) and the byte offset of the first offence;
/// `None` when it is.
pub fn text_problem(bytes: &[u8]) -> Option<String> {
    let (at, what) = match std::str::from_utf8(bytes) {
        Err(e) => (e.valid_up_to(), "invalid UTF-8"),
        Ok(text) => (text.find('\0')?, "a NUL character"),
    };
    let before = &bytes[..at];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let column = at - before.iter().rposition(|&b| b == b'\n').map_or(0, |nl| nl + 1) + 1;
    Some(format!("{what} at line {line}, column {column} (byte offset {at})"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn cursor_crosses_epoch_boundaries_identically_after_a_restart() {
        let mut straight = Sampler::new(3, 10);
        let mut cursor = DataCursor::default();
        let all: Vec<Vec<usize>> = (0..7).map(|_| straight.take(&mut cursor, 4)).collect();
        assert_eq!(cursor, DataCursor { epoch: 2, position: 8 });

        // Every epoch is a permutation, and batches straddle the boundary.
        let flat: Vec<usize> = all.concat();
        for epoch in flat.chunks(10).take(2) {
            let mut sorted = epoch.to_vec();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..10).collect::<Vec<_>>());
        }
        assert_ne!(&flat[..10], &flat[10..20], "epochs use different orders");

        // A fresh sampler from a saved cursor continues exactly.
        let mut saved = DataCursor::default();
        let mut first = Sampler::new(3, 10);
        for _ in 0..2 {
            first.take(&mut saved, 4);
        }
        let json = serde_json::to_string(&saved).unwrap();
        let mut resumed_cursor: DataCursor = serde_json::from_str(&json).unwrap();
        let mut resumed = Sampler::new(3, 10);
        let rest: Vec<Vec<usize>> = (0..5).map(|_| resumed.take(&mut resumed_cursor, 4)).collect();
        assert_eq!(rest, all[2..]);
        assert_eq!(resumed_cursor, cursor);
    }

    #[test]
    fn skip_moves_the_cursor_like_taking() {
        let mut s = Sampler::new(0, 7);
        let mut taken = DataCursor { epoch: 1, position: 5 };
        let mut skipped = taken;
        s.take(&mut taken, 16);
        s.skip(&mut skipped, 16);
        assert_eq!(taken, skipped);
        assert_eq!(skipped, DataCursor { epoch: 4, position: 0 });
    }

    #[test]
    fn synthetic_sets_are_deterministic_and_split() {
        let a = Classification::synthetic(1, 500, 4, 3, 0.2).unwrap();
        let b = Classification::synthetic(1, 500, 4, 3, 0.2).unwrap();
        assert_eq!(a.train, b.train);
        let (tr, va) = (a.len(Split::Train), a.len(Split::Validation));
        assert_eq!(tr + va, 500);
        assert!((60..140).contains(&va), "{va}");
        let (x, y) = a.batch(Split::Validation, &[0, 2], &Device::Cpu).unwrap();
        assert_eq!(x.dims(), [2, 4]);
        assert_eq!(y.dims(), [2]);

        let t = TokenSequences::synthetic(1, 40, 8, 0.25).unwrap();
        assert_eq!(t.len(Split::Train) + t.len(Split::Validation), 40);
        let seq = t.sequence(Split::Train, 0);
        assert!(seq.iter().all(|b| b.is_ascii()));
        let (inp, tgt) = t.batch(Split::Train, &[0], &Device::Cpu).unwrap();
        assert_eq!(inp.to_vec2::<u32>().unwrap()[0][1..], tgt.to_vec2::<u32>().unwrap()[0][..7]);
    }

    #[test]
    fn text_is_cut_into_overlapping_windows_and_split_by_index() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.txt");
        let text: String = (0..200).map(|i| format!("line {i}: shall I compare thee?\n")).collect();
        std::fs::write(&path, &text).unwrap();
        let seqs = TokenSequences::from_text(&path, 3, 16, 0.2).unwrap();
        let windows = (text.len() - 1) / 16;
        assert_eq!(seqs.len(Split::Train) + seqs.len(Split::Validation), windows);
        assert!(seqs.len(Split::Validation) > windows / 10 && seqs.len(Split::Validation) < windows / 3);
        // Each window is the text at its own offset, so every split holds
        // the file's bytes in order; the split decision is per window index.
        let (mut train, mut val) = (0, 0);
        for i in 0..windows {
            let window = &text.as_bytes()[i * 16..i * 16 + 17];
            if is_validation(3, SPLIT_WINDOWS, i as u64, 0.2) {
                assert_eq!(seqs.sequence(Split::Validation, val), window);
                val += 1;
            } else {
                assert_eq!(seqs.sequence(Split::Train, train), window);
                train += 1;
            }
        }
        let other_seed = TokenSequences::from_text(&path, 4, 16, 0.2).unwrap();
        assert_ne!(other_seed.val, seqs.val, "the split follows the seed");
        let again = TokenSequences::from_text(&path, 3, 16, 0.2).unwrap();
        assert_eq!((seqs.train, seqs.val), (again.train, again.val));
    }

    #[test]
    fn text_that_is_not_utf8_or_too_short_is_refused_with_where_and_why() {
        assert_eq!(text_problem("Shall I compare thee\nto a summer's day?\n".as_bytes()), None);
        assert_eq!(text_problem(b""), None);
        assert_eq!(
            text_problem(b"ok\nfine \xff here").as_deref(),
            Some("invalid UTF-8 at line 2, column 6 (byte offset 8)")
        );
        assert_eq!(text_problem(b"\0abc").as_deref(), Some("a NUL character at line 1, column 1 (byte offset 0)"));
        // A multi-byte character cut short at the end of the file.
        assert_eq!(text_problem("caf\u{e9}".as_bytes()), None);
        assert!(text_problem(&"caf\u{e9}".as_bytes()[..4]).unwrap().starts_with("invalid UTF-8 at line 1, column 4"));

        let dir = tempfile::tempdir().unwrap();
        let binary = dir.path().join("model.safetensors");
        std::fs::write(&binary, [8u8, 0, 0, 0, 0, 0, 0, 0, b'{', b'}']).unwrap();
        let err = TokenSequences::from_text(&binary, 0, 4, 0.1).unwrap_err();
        let TrainError::Config { key, reason } = &err else { panic!("{err}") };
        assert_eq!(key, "data.path");
        assert!(
            reason.contains("model.safetensors is not a UTF-8 text file: a NUL character at line 1, column 2"),
            "{reason}"
        );

        let short = dir.path().join("short.txt");
        std::fs::write(&short, "four").unwrap();
        let err = TokenSequences::from_text(&short, 0, 4, 0.1).unwrap_err();
        assert!(
            matches!(&err, TrainError::EmptyData { reason, .. } if reason.contains("holds 4 bytes, too few for one sequence of model.context + 1 = 5 bytes")),
            "{err}"
        );
        std::fs::write(&short, "fives").unwrap();
        assert_eq!(TokenSequences::from_text(&short, 0, 4, 0.0).unwrap().len(Split::Train), 1);
        let err = TokenSequences::from_text(&short, 0, 4, 0.999_999).unwrap_err();
        assert!(
            matches!(&err, TrainError::EmptyData { reason, .. } if reason.contains("none of its 1 sequences")),
            "{err}"
        );

        let missing = dir.path().join("missing.txt");
        assert!(matches!(TokenSequences::from_text(&missing, 0, 4, 0.1), Err(TrainError::Io { .. })));
    }

    #[test]
    fn jsonl_is_packed_split_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.jsonl");
        let mut f = std::fs::File::create(&path).unwrap();
        for i in 0..50 {
            writeln!(f, "{{\"body\": \"record number {i} says hello\"}}").unwrap();
        }
        writeln!(f, "not json").unwrap();
        drop(f);
        let mut data = DataSection { field: "body".into(), val_fraction: 0.2, ..DataSection::default() };
        let err = TokenSequences::from_jsonl(&path, &data, 0, 16).unwrap_err();
        assert!(matches!(err, TrainError::InvalidDataset { invalid: 1, lines: 51, .. }), "{err}");

        data.on_invalid = OnInvalid::Skip;
        let seqs = TokenSequences::from_jsonl(&path, &data, 0, 16).unwrap();
        assert!(seqs.len(Split::Train) > 40 && seqs.len(Split::Validation) > 5);
        assert!(seqs.sequence(Split::Train, 0).starts_with(b"record number "));
        assert!(seqs.train.contains(&b'\n'), "records are separated by newlines");
        // Consecutive windows overlap by the one byte that is both a target and the next input.
        assert_eq!(seqs.sequence(Split::Train, 0)[16], seqs.sequence(Split::Train, 1)[0]);
        let again = TokenSequences::from_jsonl(&path, &data, 0, 16).unwrap();
        assert_eq!(seqs.train, again.train);
    }
}
