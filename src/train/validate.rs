//! Dataset validation for JSONL text files (`rekindle data validate`) and
//! the cleaned copy it can write.
//!
//! Every line is checked for one problem, the first that applies, in this
//! order: invalid UTF-8, blank line, JSON syntax, not an object, missing
//! field, non-string field, empty field, NUL character, other control
//! character (anything but `\n`, `\t`, `\r`), too long (more than `max_len`
//! bytes of text). The report counts each problem with the line numbers of
//! its first examples, and gives the length distribution of the text field.
//! The same per-line check decides which records training loads (see
//! `data.rs`), so "validates clean" and "trains without skipping" agree.

use std::collections::BTreeMap;
use std::fmt;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::error::TrainError;

/// What to check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidateOptions {
    /// Name of the text field.
    pub field: String,
    /// Records with more bytes of text than this are too long (0: no limit).
    pub max_len: usize,
    /// Line numbers kept as examples per problem.
    pub examples: usize,
}

impl Default for ValidateOptions {
    fn default() -> Self {
        ValidateOptions { field: "text".into(), max_len: 0, examples: 5 }
    }
}

impl ValidateOptions {
    /// The `rekindle data validate` command line that checks `path` with
    /// these options (`--field` and `--max-len` where they are not the
    /// defaults), each word quoted for a POSIX shell where it needs it.
    pub fn command_line(&self, path: &Path) -> String {
        let path = path.to_string_lossy();
        // A relative path that starts with `-` would read as an option.
        let path = if path.starts_with('-') { format!("./{path}") } else { path.into_owned() };
        let mut words = vec!["rekindle data validate".to_string(), shell_word(&path)];
        if self.field != ValidateOptions::default().field {
            words.push(format!("--field {}", shell_word(&self.field)));
        }
        if self.max_len > 0 {
            words.push(format!("--max-len {}", self.max_len));
        }
        words.join(" ")
    }
}

/// `word` as one word of a POSIX shell command line: as it is when every
/// character is plain, else in single quotes.
fn shell_word(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_@%+=:,./-".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        return word.to_string();
    }
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// One kind of invalid line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Problem {
    InvalidUtf8,
    BlankLine,
    JsonSyntax,
    NotAnObject,
    MissingField,
    NonStringField,
    EmptyField,
    NulCharacter,
    ControlCharacter,
    TooLong,
}

impl Problem {
    /// The snake_case name used in JSON and summaries.
    pub fn name(self) -> &'static str {
        match self {
            Problem::InvalidUtf8 => "invalid_utf8",
            Problem::BlankLine => "blank_line",
            Problem::JsonSyntax => "json_syntax",
            Problem::NotAnObject => "not_an_object",
            Problem::MissingField => "missing_field",
            Problem::NonStringField => "non_string_field",
            Problem::EmptyField => "empty_field",
            Problem::NulCharacter => "nul_character",
            Problem::ControlCharacter => "control_character",
            Problem::TooLong => "too_long",
        }
    }

    /// A short human description.
    pub fn describe(self) -> &'static str {
        match self {
            Problem::InvalidUtf8 => "not valid UTF-8",
            Problem::BlankLine => "blank line",
            Problem::JsonSyntax => "not valid JSON",
            Problem::NotAnObject => "JSON value is not an object",
            Problem::MissingField => "text field missing",
            Problem::NonStringField => "text field is not a string",
            Problem::EmptyField => "text field is empty",
            Problem::NulCharacter => "text contains a NUL character",
            Problem::ControlCharacter => "text contains a control character",
            Problem::TooLong => "text longer than the maximum",
        }
    }
}

/// How often one problem occurred, and where first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProblemCount {
    pub problem: Problem,
    pub count: u64,
    /// 1-based line numbers of the first occurrences.
    pub first_lines: Vec<u64>,
}

/// Distribution of text lengths in bytes (nearest-rank percentiles).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LengthStats {
    /// Records measured: every line whose field is a string.
    pub count: u64,
    pub min: usize,
    pub median: usize,
    pub p95: usize,
    pub p99: usize,
    pub max: usize,
}

impl LengthStats {
    fn of(mut lengths: Vec<usize>) -> Option<Self> {
        if lengths.is_empty() {
            return None;
        }
        lengths.sort_unstable();
        let rank = |p: f64| lengths[((p * lengths.len() as f64).ceil() as usize).clamp(1, lengths.len()) - 1];
        Some(LengthStats {
            count: lengths.len() as u64,
            min: lengths[0],
            median: rank(0.5),
            p95: rank(0.95),
            p99: rank(0.99),
            max: lengths[lengths.len() - 1],
        })
    }
}

/// The result of validating one file.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ValidationReport {
    pub path: PathBuf,
    pub field: String,
    /// The length limit checked, if any.
    pub max_len: Option<usize>,
    pub lines: u64,
    pub valid: u64,
    pub invalid: u64,
    /// Problems found, in the order of the checks.
    pub problems: Vec<ProblemCount>,
    /// Lengths of the text field; `None` if no line has a string field.
    pub lengths: Option<LengthStats>,
}

impl ValidationReport {
    /// Whether every line is valid.
    pub fn is_clean(&self) -> bool {
        self.invalid == 0
    }

    /// Counts per problem on one line, e.g. `2 json_syntax, 1 too_long`.
    pub fn summary(&self) -> String {
        if self.problems.is_empty() {
            return "no problems".into();
        }
        let parts: Vec<String> = self.problems.iter().map(|p| format!("{} {}", p.count, p.problem.name())).collect();
        parts.join(", ")
    }
}

impl fmt::Display for ValidationReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} lines, {} valid, {} invalid (field `{}`",
            self.path.display(),
            self.lines,
            self.valid,
            self.invalid,
            self.field
        )?;
        match self.max_len {
            Some(n) => writeln!(f, ", at most {n} bytes)")?,
            None => writeln!(f, ", no length limit)")?,
        }
        for p in &self.problems {
            let lines: Vec<String> = p.first_lines.iter().map(u64::to_string).collect();
            let more = if p.count > p.first_lines.len() as u64 { ", ..." } else { "" };
            writeln!(
                f,
                "  {:<18} {:>8}  {} (line {}{more})",
                p.problem.name(),
                p.count,
                p.problem.describe(),
                lines.join(", ")
            )?;
        }
        match &self.lengths {
            Some(l) => writeln!(
                f,
                "lengths in bytes over {} records: min {}, median {}, p95 {}, p99 {}, max {}",
                l.count, l.min, l.median, l.p95, l.p99, l.max
            ),
            None => writeln!(f, "no record has a string `{}` field", self.field),
        }
    }
}

/// The outcome of checking one line.
enum LineCheck {
    /// A usable record: its text.
    Valid(String),
    /// An unusable line; `len` is the text's length when the field is a
    /// string, and `record` the parsed object (for truncation).
    Invalid { problem: Problem, len: Option<usize>, record: Option<serde_json::Value> },
}

fn check_line(line: &[u8], opts: &ValidateOptions) -> LineCheck {
    let invalid = |problem| LineCheck::Invalid { problem, len: None, record: None };
    let Ok(text) = std::str::from_utf8(line) else { return invalid(Problem::InvalidUtf8) };
    if text.trim().is_empty() {
        return invalid(Problem::BlankLine);
    }
    let Ok(value) = serde_json::from_str::<serde_json::Value>(text) else { return invalid(Problem::JsonSyntax) };
    let Some(object) = value.as_object() else { return invalid(Problem::NotAnObject) };
    let field = match object.get(&opts.field) {
        None => return invalid(Problem::MissingField),
        Some(serde_json::Value::String(s)) => s,
        Some(_) => return invalid(Problem::NonStringField),
    };
    let len = Some(field.len());
    let problem = if field.is_empty() {
        Some(Problem::EmptyField)
    } else if field.contains('\0') {
        Some(Problem::NulCharacter)
    } else if field.chars().any(|c| c.is_control() && !matches!(c, '\n' | '\t' | '\r')) {
        Some(Problem::ControlCharacter)
    } else if opts.max_len > 0 && field.len() > opts.max_len {
        Some(Problem::TooLong)
    } else {
        None
    };
    match problem {
        None => LineCheck::Valid(field.clone()),
        Some(problem) => LineCheck::Invalid { problem, len, record: Some(value) },
    }
}

/// Reads lines (split on `\n`, a trailing `\r` removed), calling `visit`
/// with the 1-based line number, the raw bytes and the check's outcome.
fn for_each_line(
    path: &Path,
    opts: &ValidateOptions,
    mut visit: impl FnMut(u64, &[u8], LineCheck) -> Result<(), TrainError>,
) -> Result<(), TrainError> {
    let file = File::open(path).map_err(|e| TrainError::io(path, e))?;
    let mut reader = BufReader::new(file);
    let mut buf = Vec::new();
    let mut number = 0;
    loop {
        buf.clear();
        let n = reader.read_until(b'\n', &mut buf).map_err(|e| TrainError::io(path, e))?;
        if n == 0 {
            return Ok(());
        }
        number += 1;
        let mut line = buf.as_slice();
        line = line.strip_suffix(b"\n").unwrap_or(line);
        line = line.strip_suffix(b"\r").unwrap_or(line);
        let check = check_line(line, opts);
        visit(number, line, check)?;
    }
}

/// Validates `path`, also returning the valid records (line number, text)
/// when `keep` is set; shared by [`validate_file`] and data loading.
pub(crate) fn scan_file(
    path: &Path,
    opts: &ValidateOptions,
    keep: bool,
) -> Result<(ValidationReport, Vec<(u64, String)>), TrainError> {
    let mut problems: BTreeMap<Problem, ProblemCount> = BTreeMap::new();
    let mut lengths = Vec::new();
    let mut records = Vec::new();
    let (mut lines, mut valid) = (0u64, 0u64);
    for_each_line(path, opts, |number, _, check| {
        lines += 1;
        match check {
            LineCheck::Valid(text) => {
                valid += 1;
                lengths.push(text.len());
                if keep {
                    records.push((number, text));
                }
            }
            LineCheck::Invalid { problem, len, .. } => {
                lengths.extend(len);
                let entry =
                    problems.entry(problem).or_insert(ProblemCount { problem, count: 0, first_lines: Vec::new() });
                entry.count += 1;
                if entry.first_lines.len() < opts.examples {
                    entry.first_lines.push(number);
                }
            }
        }
        Ok(())
    })?;
    let report = ValidationReport {
        path: path.to_path_buf(),
        field: opts.field.clone(),
        max_len: (opts.max_len > 0).then_some(opts.max_len),
        lines,
        valid,
        invalid: lines - valid,
        problems: problems.into_values().collect(),
        lengths: LengthStats::of(lengths),
    };
    Ok((report, records))
}

/// Checks every line of the JSONL file `path`.
pub fn validate_file(path: &Path, opts: &ValidateOptions) -> Result<ValidationReport, TrainError> {
    Ok(scan_file(path, opts, false)?.0)
}

/// What [`write_clean`] does with invalid lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CleanMode {
    /// Drop every invalid line.
    Drop,
    /// Cut over-long records to `max_len` bytes (at a character boundary);
    /// drop every other invalid line.
    Truncate,
}

/// What [`write_clean`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CleanSummary {
    /// Lines written unchanged.
    pub kept: u64,
    /// Over-long records written truncated.
    pub truncated: u64,
    /// Lines left out.
    pub dropped: u64,
}

/// Writes the valid lines of `input` (byte for byte) to `output`, handling
/// invalid ones per `mode`. The file appears complete or not at all: it is
/// written to a temporary file beside `output` and renamed. A truncated
/// record is re-serialised, so its keys may come out in another order.
/// `output` must be a regular file or nothing (a link, a directory or a
/// device there is refused and left as it is).
pub fn write_clean(
    input: &Path,
    output: &Path,
    opts: &ValidateOptions,
    mode: CleanMode,
) -> Result<CleanSummary, TrainError> {
    crate::confine::replaceable_file(output).map_err(|e| TrainError::io(output, e))?;
    let dir = match output.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let tmp = tempfile::NamedTempFile::new_in(dir).map_err(|e| TrainError::io(dir, e))?;
    let mut writer = BufWriter::new(tmp);
    let mut summary = CleanSummary { kept: 0, truncated: 0, dropped: 0 };
    for_each_line(input, opts, |_, raw, check| {
        let line: Option<Vec<u8>> = match check {
            LineCheck::Valid(_) => {
                summary.kept += 1;
                Some(raw.to_vec())
            }
            LineCheck::Invalid { problem: Problem::TooLong, record: Some(mut record), .. }
                if mode == CleanMode::Truncate =>
            {
                if let Some(serde_json::Value::String(text)) = record.get_mut(&opts.field) {
                    let mut end = opts.max_len;
                    while !text.is_char_boundary(end) {
                        end -= 1;
                    }
                    text.truncate(end);
                }
                summary.truncated += 1;
                Some(serde_json::to_vec(&record).expect("a JSON value serialises"))
            }
            LineCheck::Invalid { .. } => {
                summary.dropped += 1;
                None
            }
        };
        if let Some(line) = line {
            writer.write_all(&line).and_then(|_| writer.write_all(b"\n")).map_err(|e| TrainError::io(output, e))?;
        }
        Ok(())
    })?;
    let tmp = writer.into_inner().map_err(|e| TrainError::io(output, e.into_error()))?;
    tmp.as_file().sync_all().map_err(|e| TrainError::io(output, e))?;
    tmp.persist(output).map_err(|e| TrainError::io(output, e.error))?;
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_line_carries_the_options_that_differ_from_the_defaults() {
        let path = Path::new("data/corpus.jsonl");
        assert_eq!(ValidateOptions::default().command_line(path), "rekindle data validate data/corpus.jsonl");
        let opts = ValidateOptions { field: "body".into(), max_len: 4096, ..ValidateOptions::default() };
        assert_eq!(opts.command_line(path), "rekindle data validate data/corpus.jsonl --field body --max-len 4096");
        let odd = ValidateOptions { field: "the text".into(), ..ValidateOptions::default() };
        assert_eq!(
            odd.command_line(Path::new("-my corpus's.jsonl")),
            r"rekindle data validate './-my corpus'\''s.jsonl' --field 'the text'"
        );
    }

    /// One line per problem, plus valid ones, in a known order.
    fn crafted(dir: &Path) -> PathBuf {
        let path = dir.join("crafted.jsonl");
        let mut bytes: Vec<u8> = Vec::new();
        let mut line = |b: &[u8]| {
            bytes.extend_from_slice(b);
            bytes.push(b'\n');
        };
        line(br#"{"text": "hello world"}"#); // 1 valid
        line(b"{\"text\": \"bad \xff byte\"}"); // 2 invalid utf-8
        line(b"   "); // 3 blank
        line(br#"{"text": "unterminated"#); // 4 json syntax
        line(br#"["text", "array"]"#); // 5 not an object
        line(br#"{"body": "other field"}"#); // 6 missing field
        line(br#"{"text": 42}"#); // 7 non-string
        line(br#"{"text": ""}"#); // 8 empty
        line(br#"{"text": "nul \u0000 here"}"#); // 9 NUL
        line(br#"{"text": "bell \u0007 here"}"#); // 10 control
        line(br#"{"text": "tabs\tand\nnewlines are fine"}"#); // 11 valid
        line("{\"text\": \"xééééééééééééééé long\", \"id\": 1}".as_bytes()); // 12 too long (36 bytes)
        line(br#"{"text": "ok\r\n"}"#); // 13 valid
        line(br#"{"text": "also bad json",}"#); // 14 json syntax
        bytes.extend_from_slice(b"{\"text\": \"last, no newline\"}"); // 15 valid
        std::fs::write(&path, bytes).unwrap();
        path
    }

    fn opts() -> ValidateOptions {
        ValidateOptions { field: "text".into(), max_len: 26, examples: 5 }
    }

    #[test]
    fn reports_every_kind_of_bad_line_with_line_numbers() {
        let dir = tempfile::tempdir().unwrap();
        let report = validate_file(&crafted(dir.path()), &opts()).unwrap();
        assert_eq!((report.lines, report.valid, report.invalid), (15, 4, 11));
        let found: Vec<(Problem, u64, Vec<u64>)> =
            report.problems.iter().map(|p| (p.problem, p.count, p.first_lines.clone())).collect();
        assert_eq!(
            found,
            vec![
                (Problem::InvalidUtf8, 1, vec![2]),
                (Problem::BlankLine, 1, vec![3]),
                (Problem::JsonSyntax, 2, vec![4, 14]),
                (Problem::NotAnObject, 1, vec![5]),
                (Problem::MissingField, 1, vec![6]),
                (Problem::NonStringField, 1, vec![7]),
                (Problem::EmptyField, 1, vec![8]),
                (Problem::NulCharacter, 1, vec![9]),
                (Problem::ControlCharacter, 1, vec![10]),
                (Problem::TooLong, 1, vec![12]),
            ]
        );
        let lengths = report.lengths.clone().unwrap();
        // Strings measured: lines 1, 8-13 and 15.
        assert_eq!(lengths.count, 8);
        assert_eq!((lengths.min, lengths.max), (0, 36));
        assert!(!report.is_clean());
        assert!(report.summary().starts_with("1 invalid_utf8, 1 blank_line, 2 json_syntax"));

        let text = report.to_string();
        assert!(text.contains("15 lines, 4 valid, 11 invalid"), "{text}");
        assert!(text.contains("json_syntax") && text.contains("line 4, 14"), "{text}");
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["problems"][9]["problem"], "too_long");
        assert_eq!(json["lengths"]["max"], 36);
    }

    #[test]
    fn keeps_only_the_first_examples() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("many.jsonl");
        std::fs::write(&path, "x\n".repeat(9)).unwrap();
        let report = validate_file(&path, &ValidateOptions { examples: 3, ..ValidateOptions::default() }).unwrap();
        assert_eq!(report.problems[0].count, 9);
        assert_eq!(report.problems[0].first_lines, vec![1, 2, 3]);
        assert!(report.to_string().contains("line 1, 2, 3, ..."));
    }

    #[test]
    fn percentiles_use_nearest_rank() {
        let stats = LengthStats::of((1..=100).collect()).unwrap();
        assert_eq!((stats.min, stats.median, stats.p95, stats.p99, stats.max), (1, 50, 95, 99, 100));
        assert_eq!(LengthStats::of(vec![7]).unwrap().p99, 7);
        assert!(LengthStats::of(vec![]).is_none());
    }

    #[test]
    fn clean_copy_drops_or_truncates_and_then_validates_clean() {
        let dir = tempfile::tempdir().unwrap();
        let input = crafted(dir.path());
        let dropped = dir.path().join("dropped.jsonl");
        let s = write_clean(&input, &dropped, &opts(), CleanMode::Drop).unwrap();
        assert_eq!(s, CleanSummary { kept: 4, truncated: 0, dropped: 11 });
        let report = validate_file(&dropped, &opts()).unwrap();
        assert!(report.is_clean() && report.valid == 4, "{report}");
        let first = std::fs::read_to_string(&dropped).unwrap();
        assert!(first.starts_with("{\"text\": \"hello world\"}\n"), "valid lines are copied verbatim");

        let truncated = dir.path().join("truncated.jsonl");
        let s = write_clean(&input, &truncated, &opts(), CleanMode::Truncate).unwrap();
        assert_eq!(s, CleanSummary { kept: 4, truncated: 1, dropped: 10 });
        let report = validate_file(&truncated, &opts()).unwrap();
        assert!(report.is_clean() && report.valid == 5, "{report}");
        let cut = std::fs::read_to_string(&truncated).unwrap();
        // 26 bytes would split an 'é' (2 bytes each): the cut backs off to 25.
        assert!(cut.contains(&format!("\"text\":\"x{}\"", "é".repeat(12))), "{cut}");
    }

    #[test]
    fn a_missing_file_is_an_io_error_naming_it() {
        let err = validate_file(Path::new("/nonexistent/x.jsonl"), &ValidateOptions::default()).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/x.jsonl"), "{err}");
    }

    /// Property tests: `rekindle data validate` and `--clean` over arbitrary
    /// and mutated JSONL (the crafted file above, one line per problem):
    /// a report or a named error, never a panic; a truncated record is cut
    /// at a character boundary whatever `max_len` is.
    mod fuzz {
        use super::*;
        use crate::fuzz;
        use proptest::prelude::*;

        fn check(bytes: &[u8], max_len: usize) -> Result<(), TestCaseError> {
            let tmp = tempfile::tempdir().unwrap();
            let input = tmp.path().join("in.jsonl");
            std::fs::write(&input, bytes).unwrap();
            let opts = ValidateOptions { max_len, ..ValidateOptions::default() };
            if let Ok(report) = validate_file(&input, &opts) {
                let _ = (report.summary(), report.is_clean());
                prop_assert_eq!(report.valid + report.invalid, report.lines);
            }
            for mode in [CleanMode::Drop, CleanMode::Truncate] {
                let output = tmp.path().join("out.jsonl");
                if write_clean(&input, &output, &opts, mode).is_ok() {
                    let cleaned = validate_file(&output, &opts).map_err(|e| TestCaseError::fail(e.to_string()))?;
                    prop_assert!(cleaned.is_clean(), "{mode:?} wrote invalid lines: {}", cleaned.summary());
                }
            }
            Ok(())
        }

        proptest! {
            #![proptest_config(fuzz::config())]

            #[test]
            fn arbitrary_bytes_are_validated_or_refused(bytes in fuzz::bytes(256), max_len in 0usize..16) {
                check(&bytes, max_len)?;
            }

            #[test]
            fn mutated_jsonl_is_validated_or_refused(
                bytes in fuzz::mutated({
                    let tmp = tempfile::tempdir().unwrap();
                    std::fs::read(crafted(tmp.path())).unwrap()
                }),
                max_len in 0usize..16,
            ) {
                check(&bytes, max_len)?;
            }
        }
    }
}
