//! Loading a config: TOML text plus `--set section.key=value` overrides in,
//! a validated [`Config`] out, or every problem at once, each with its key
//! and its place (line and column in the file, or the override).
//!
//! serde's `deny_unknown_fields` stops at the first error, so the document is
//! first parsed with `toml_edit` (which keeps spans) and split into one entry
//! per key; each entry is deserialized on its own, in a document holding only
//! that key, and its errors are recorded against its span. Only the entries
//! that pass are merged into the [`Config`] that semantic validation sees, so
//! one bad key neither hides the others nor causes follow-on reports.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};

use toml_edit::{DocumentMut, Item, Table, Value};

use super::error::{ConfigError, Problem};
use super::keys::{section_keys, sections};
use super::kinds::{BuiltinKinds, ModelKinds};
use super::schema::{Config, ModelKind};
use super::validate::findings;

/// A validated config and the file it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedConfig {
    /// The config, deserialized and validated.
    pub config: Config,
    /// The config file (for [`from_str`], the `source_name` given).
    pub source: PathBuf,
    /// The keys (`section.key`) the text or an override gave a value; every
    /// other key holds its default.
    pub set_keys: BTreeSet<String>,
}

/// Reads the TOML file at `path`, applies `overrides` (`section.key=value`,
/// later ones win), deserializes and validates.
///
/// An override's value is read as a TOML value (`run.max_steps=50`,
/// `checkpoint.interval="30s"`, `model.hidden=[32, 32]`); a value that is not
/// valid TOML, or that only fits the key as a string, is taken as a bare
/// string (`model.kind=gpt`, `checkpoint.interval=30s`, `run.name=2024`).
/// `model.settings.KEY=value` sets one key of `[model.settings]`, typed as in
/// TOML only (quote a string that reads as a number: `model.settings.tag="2024"`).
///
/// `[model] kind` must be `mlp` or `gpt`; [`load_with`] accepts the kinds a
/// program registered as well.
pub fn load(path: &Path, overrides: &[String]) -> Result<LoadedConfig, ConfigError> {
    load_with(path, overrides, &BuiltinKinds)
}

/// [`load`] for a program that builds the model kinds `kinds` names, each
/// `[model.settings]` key checked against the settings type of its kind.
///
/// The file is read as [`crate::confine::read_named_bounded`] reads: a
/// regular file (a link to one is followed), never blocking on a FIFO, at
/// most [`MAX_CONFIG_BYTES`].
pub fn load_with(path: &Path, overrides: &[String], kinds: &dyn ModelKinds) -> Result<LoadedConfig, ConfigError> {
    let bytes = crate::confine::read_named_bounded(path, MAX_CONFIG_BYTES)
        .map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
    load_bytes(path, &bytes, overrides, kinds)
}

/// The largest config file read (configs are a few KiB; the TOML parser
/// holds several times a file's size).
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// The `config.toml` a run directory holds (rekindle's own copy), with no
/// overrides and any model kind: as [`load_with`], but a symbolic link in
/// its place is refused, not followed ([`crate::confine::read_bounded`]).
pub fn load_recorded(path: &Path) -> Result<LoadedConfig, ConfigError> {
    let bytes = crate::confine::read_bounded(path, MAX_CONFIG_BYTES)
        .map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
    load_bytes(path, &bytes, &[], &super::AnyKind)
}

fn load_bytes(
    path: &Path,
    bytes: &[u8],
    overrides: &[String],
    kinds: &dyn ModelKinds,
) -> Result<LoadedConfig, ConfigError> {
    let text = std::str::from_utf8(bytes).map_err(|e| ConfigError::Read {
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
    })?;
    let mut loaded = from_str_with(text, &path.display().to_string(), overrides, kinds)?;
    loaded.source = path.to_path_buf();
    Ok(loaded)
}

/// [`load`] on TOML text; `source_name` names it in messages.
pub fn from_str(text: &str, source_name: &str, overrides: &[String]) -> Result<LoadedConfig, ConfigError> {
    from_str_with(text, source_name, overrides, &BuiltinKinds)
}

/// [`load_with`] on TOML text; `source_name` names it in messages.
pub fn from_str_with(
    text: &str,
    source_name: &str,
    overrides: &[String],
    kinds: &dyn ModelKinds,
) -> Result<LoadedConfig, ConfigError> {
    let mut problems = Vec::new();
    let sets: Vec<Override> =
        overrides.iter().filter_map(|raw| Override::parse(raw).map_err(|p| problems.push(p)).ok()).collect();

    let doc = match toml_edit::Document::parse(text) {
        Ok(doc) => doc,
        Err(err) => {
            let place = err.span().map(|span| line_column(text, span.start));
            let mut problem = Problem::new("", format!("TOML syntax error: {}", err.message().trim()));
            (problem.line, problem.column) = (place.map(|p| p.0), place.map(|p| p.1));
            problems.insert(0, problem);
            return Err(invalid(source_name, problems));
        }
    };

    let mut places = Places::default();
    let mut entries = split_document(&doc, text, &mut places, &mut problems);
    for set in sets {
        if let Some(setting) = set.setting {
            // One key of `[model.settings]`, typed as in TOML (the registered
            // type decides what fits; there is no string fallback).
            places.keys.insert(format!("model.settings.{setting}"), Place::Set);
            places.sections.entry("model".to_string()).or_insert(Place::Set);
            let existing = entries.iter_mut().find(|e| e.section == "model" && e.key.as_deref() == Some("settings"));
            match existing.and_then(|e| e.item.as_table_like_mut()) {
                Some(table) => {
                    table.insert(&setting, set.value);
                }
                None => {
                    entries.retain(|e| !(e.section == "model" && e.key.as_deref() == Some("settings")));
                    let mut table = Table::new();
                    table.insert(&setting, set.value);
                    places.keys.entry("model.settings".to_string()).or_insert(Place::Set);
                    entries.push(Entry {
                        section: "model".to_string(),
                        key: Some("settings".to_string()),
                        item: Item::Table(table),
                        fallback: None,
                        place: Place::Set,
                    });
                }
            }
            continue;
        }
        entries.retain(|e| !(e.section == set.section && e.key.as_deref() == Some(&set.key)));
        let section_known = section_keys(&set.section).is_some();
        places.keys.insert(format!("{}.{}", set.section, set.key), Place::Set);
        if section_known {
            places.sections.entry(set.section.clone()).or_insert(Place::Set);
        }
        entries.push(Entry {
            section: set.section,
            key: Some(set.key),
            item: set.value,
            fallback: set.as_string,
            place: Place::Set,
        });
    }

    // Per-key checks: each entry alone, so all of them are reported.
    let mut failed: HashSet<String> = HashSet::new();
    let mut good = Vec::new();
    for mut entry in entries {
        match check_entry(&entry) {
            Ok(()) => good.push(entry),
            Err(message) => {
                let fallback_fits = entry.fallback.take().is_some_and(|fallback| {
                    entry.item = fallback;
                    check_entry(&entry).is_ok()
                });
                if fallback_fits {
                    good.push(entry);
                } else {
                    failed.insert(entry.path());
                    problems.push(entry.place.locate(Problem::new(entry.path(), message)));
                }
            }
        }
    }

    let config = match toml_edit::de::from_document::<Config>(merge(good)) {
        Ok(config) => config,
        Err(err) => {
            // Every entry deserialized alone, so this is not expected; report
            // rather than panic.
            problems.push(Problem::new("", humanize(err.message())));
            return Err(invalid(source_name, sorted(problems)));
        }
    };

    model_kind(&config, kinds, &places, &failed, &mut problems);

    for finding in findings(&config) {
        let section = finding.key.split('.').next().unwrap_or_default();
        let blocked = std::iter::once(finding.key)
            .chain(finding.depends_on.iter().copied())
            .any(|key| failed.contains(key) || failed.contains(key.split('.').next().unwrap_or_default()));
        if blocked {
            // A key it depends on was rejected and stood in by its default:
            // the finding would be about a value nobody wrote.
            continue;
        }
        let place =
            places.keys.get(finding.key).or_else(|| places.sections.get(section)).copied().unwrap_or(Place::Nowhere);
        problems.push(place.locate(Problem::new(finding.key, finding.message)));
    }

    if problems.is_empty() {
        Ok(LoadedConfig { config, source: PathBuf::from(source_name), set_keys: places.keys.into_keys().collect() })
    } else {
        Err(invalid(source_name, sorted(problems)))
    }
}

/// The fully resolved config as TOML: every section and every key with its
/// value, defaults included; keys whose value is unset (`None`) are left out,
/// as TOML has no null. [`from_str`] reads it back to an equal [`Config`].
///
/// # Panics
///
/// If an integer exceeds `i64::MAX` (TOML's integer range); no config read
/// from TOML can hold one.
pub fn to_toml(config: &Config) -> String {
    toml::to_string(config).expect("a Config read from TOML serializes back to TOML")
}

fn invalid(source_name: &str, problems: Vec<Problem>) -> ConfigError {
    ConfigError::Invalid { source_name: source_name.to_string(), problems }
}

/// File problems in file order, then unplaced ones, then `--set` ones in
/// command-line order.
fn sorted(mut problems: Vec<Problem>) -> Vec<Problem> {
    problems.sort_by_key(|p| match (p.from_set, p.line) {
        (false, Some(line)) => (0, line, p.column.unwrap_or(0)),
        (false, None) => (1, 0, 0),
        (true, _) => (2, 0, 0),
    });
    problems
}

/// `[model] kind` against the kinds this program builds, and
/// `[model.settings]` against the settings type of that kind: each key on
/// its own (so every unknown key and wrong type is reported, at its line),
/// then the table as a whole (missing keys of a type without defaults).
fn model_kind(
    config: &Config,
    kinds: &dyn ModelKinds,
    places: &Places,
    failed: &HashSet<String>,
    problems: &mut Vec<Problem>,
) {
    if kinds.accepts_any() || failed.contains("model") || failed.contains("model.kind") {
        return;
    }
    let place_of = |key: &str| places.keys.get(key).or_else(|| places.sections.get("model")).copied();
    let kind = &config.model.kind;
    let names = kinds.names();
    if !names.iter().any(|name| name == kind.name()) {
        let allowed: Vec<&str> = names.iter().map(String::as_str).collect();
        let given = kind.name();
        let mut message = not_allowed(format!("`{given}` is not allowed;"), given, &allowed);
        if nearest(given, &allowed).is_none() {
            message.push_str(
                "; a model of your own is built by a program that registers it (docs/workloads.md), not \
                 by the plain `rekindle` binary",
            );
        }
        problems.push(place_of("model.kind").unwrap_or(Place::Nowhere).locate(Problem::new("model.kind", message)));
        return;
    }
    let settings = &config.model.settings;
    let ModelKind::Registered(name) = kind else {
        if !settings.is_empty() && !failed.contains("model.settings") {
            let message = format!(
                "is for the settings of a registered model kind; `{}` takes its settings from [model] keys \
                 (see configs/example.toml): remove [model.settings]",
                kind.name()
            );
            problems.push(
                place_of("model.settings").unwrap_or(Place::Nowhere).locate(Problem::new("model.settings", message)),
            );
        }
        return;
    };
    let mut key_failed = false;
    for (key, value) in settings {
        let one = toml::Table::from_iter([(key.clone(), value.clone())]);
        match kinds.check_settings(name, &one) {
            // A key alone misses the others; the whole table is checked next.
            Err(message) if !message.trim_start().starts_with("missing field") => {
                key_failed = true;
                let path = format!("model.settings.{key}");
                let place = place_of(&path).or_else(|| place_of("model.settings")).unwrap_or(Place::Nowhere);
                problems.push(place.locate(Problem::new(path, humanize(&message))));
            }
            _ => {}
        }
    }
    if !key_failed && let Err(message) = kinds.check_settings(name, settings) {
        let place = place_of("model.settings").unwrap_or(Place::Nowhere);
        problems.push(place.locate(Problem::new("model.settings", humanize(&message))));
    }
}

/// Where a value came from.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Place {
    File { line: usize, column: usize },
    Set,
    Nowhere,
}

impl Place {
    fn of_span(text: &str, span: Option<std::ops::Range<usize>>) -> Place {
        match span {
            Some(span) => {
                let (line, column) = line_column(text, span.start);
                Place::File { line, column }
            }
            None => Place::Nowhere,
        }
    }

    fn locate(self, mut problem: Problem) -> Problem {
        match self {
            Place::File { line, column } => {
                problem.line = Some(line);
                problem.column = Some(column);
            }
            Place::Set => problem.from_set = true,
            Place::Nowhere => {}
        }
        problem
    }
}

/// Places of keys (`section.key`) and section headers, for semantic problems.
#[derive(Default)]
struct Places {
    keys: HashMap<String, Place>,
    sections: HashMap<String, Place>,
}

/// One top-level item (`section = value`) or one key of a section.
struct Entry {
    section: String,
    key: Option<String>,
    item: Item,
    /// For a `--set` value that parsed as a non-string: the raw text as a
    /// string, tried when the typed value does not fit.
    fallback: Option<Item>,
    place: Place,
}

impl Entry {
    fn path(&self) -> String {
        match &self.key {
            Some(key) => format!("{}.{key}", self.section),
            None => self.section.clone(),
        }
    }
}

/// A parsed `--set section.key=value`.
struct Override {
    section: String,
    key: String,
    /// For `model.settings.KEY`: `KEY`, set inside the `[model.settings]` table.
    setting: Option<String>,
    value: Item,
    as_string: Option<Item>,
}

impl Override {
    fn parse(raw: &str) -> Result<Override, Problem> {
        let malformed = |why: &str| {
            let mut problem =
                Problem::new("", format!("`{raw}`: {why}; write --set section.key=value, e.g. --set run.max_steps=50"));
            problem.from_set = true;
            problem
        };
        let (path, value) = raw.split_once('=').ok_or_else(|| malformed("no `=`"))?;
        let parts: Vec<&str> = path.trim().split('.').map(str::trim).collect();
        let must = "the key must be `section.key` (or `model.settings.key`)";
        let (section, key, setting) = match parts[..] {
            [section, key] => (section, key, None),
            ["model", "settings", setting] if !setting.is_empty() => ("model", "settings", Some(setting.to_string())),
            _ => return Err(malformed(must)),
        };
        if section.is_empty() || key.is_empty() {
            return Err(malformed(must));
        }
        let text = value.trim();
        let (value, as_string) = match text.parse::<Value>() {
            Ok(value) if value.is_str() => (value, None),
            Ok(value) => (value, Some(Item::Value(Value::from(text)))),
            Err(_) => (Value::from(text), None),
        };
        Ok(Override {
            section: section.to_string(),
            key: key.to_string(),
            setting,
            value: Item::Value(value),
            as_string,
        })
    }
}

/// Splits the parsed document into entries, records the places of keys and
/// sections, and reports unknown sections and keys.
fn split_document(
    doc: &toml_edit::Document<&str>,
    text: &str,
    places: &mut Places,
    problems: &mut Vec<Problem>,
) -> Vec<Entry> {
    let root = doc.as_table();
    let mut entries = Vec::new();
    for (section, item) in root.iter() {
        let key_span = root.key(section).and_then(|k| k.span());
        // A `[section]` header's span starts at its `[`; other items are
        // placed at their key.
        let header = match item.as_table() {
            Some(table) if !table.is_dotted() => Place::of_span(text, table.span().or(key_span)),
            None if item.is_array_of_tables() => {
                let first = item.as_array_of_tables().and_then(|tables| tables.get(0));
                Place::of_span(text, first.and_then(Table::span).or(key_span))
            }
            _ => Place::of_span(text, key_span.or(item.span())),
        };
        if item.is_array_of_tables() {
            let message = match section_keys(section) {
                Some(_) => {
                    format!("expected a table, found an array of tables; write `[{section}]`, not `[[{section}]]`")
                }
                None => unknown("section", section, sections()),
            };
            problems.push(header.locate(Problem::new(section, message)));
            continue;
        }
        let Some(table) = item.as_table_like() else {
            // `name = value` at the top level: unknown, or a section written
            // as a non-table; deserialization says which.
            entries.push(Entry {
                section: section.to_string(),
                key: None,
                item: item.clone(),
                fallback: None,
                place: header,
            });
            continue;
        };
        let Some(allowed) = section_keys(section) else {
            problems.push(header.locate(Problem::new(section, unknown("section", section, sections()))));
            continue;
        };
        places.sections.insert(section.to_string(), header);
        for (key, value) in table.iter() {
            let place = Place::of_span(text, table.key(key).and_then(|k| k.span()).or(value.span()));
            let path = format!("{section}.{key}");
            if !allowed.contains(&key) {
                problems.push(place.locate(Problem::new(path, unknown("key", key, allowed))));
                continue;
            }
            if let (true, Some(settings)) = (path == "model.settings", value.as_table_like()) {
                // A `[model.settings]` header is placed at its `[`.
                if let Some(header) = value.as_table().filter(|t| !t.is_dotted()) {
                    places.keys.insert(path.clone(), Place::of_span(text, header.span()));
                }
                for (inner, inner_value) in settings.iter() {
                    let span = settings.key(inner).and_then(|k| k.span()).or(inner_value.span());
                    places.keys.insert(format!("{path}.{inner}"), Place::of_span(text, span));
                }
            }
            places.keys.entry(path).or_insert(place);
            entries.push(Entry {
                section: section.to_string(),
                key: Some(key.to_string()),
                item: value.clone(),
                fallback: None,
                place,
            });
        }
    }
    entries
}

/// Deserializes a [`Config`] from a document holding only this entry.
fn check_entry(entry: &Entry) -> Result<(), String> {
    if section_keys(&entry.section).is_none() {
        return Err(unknown("section", &entry.section, sections()));
    }
    if let Some(key) = &entry.key {
        let allowed = section_keys(&entry.section).unwrap_or_default();
        if !allowed.contains(&key.as_str()) {
            return Err(unknown("key", key, allowed));
        }
    }
    let mut doc = DocumentMut::new();
    insert(doc.as_table_mut(), entry);
    match toml_edit::de::from_document::<Config>(doc) {
        Ok(_) => Ok(()),
        Err(err) => Err(humanize(err.message())),
    }
}

fn insert(root: &mut Table, entry: &Entry) {
    match &entry.key {
        Some(key) => {
            let section = root.entry(&entry.section).or_insert_with(|| Item::Table(Table::new()));
            if let Some(table) = section.as_table_like_mut() {
                table.insert(key, entry.item.clone());
            }
        }
        None => {
            root.insert(&entry.section, entry.item.clone());
        }
    }
}

/// One document from the entries that passed their checks.
fn merge(entries: Vec<Entry>) -> DocumentMut {
    let mut doc = DocumentMut::new();
    for entry in &entries {
        insert(doc.as_table_mut(), entry);
    }
    doc
}

/// "unknown key; did you mean `keep`? allowed: interval, every_steps, ..."
fn unknown(what: &str, name: &str, allowed: &[&str]) -> String {
    not_allowed(format!("unknown {what};"), name, allowed)
}

/// `head`, a suggestion when one is close, and the allowed names.
fn not_allowed(head: String, name: &str, allowed: &[&str]) -> String {
    let mut message = head;
    if let Some(near) = nearest(name, allowed) {
        message.push_str(&format!(" did you mean `{near}`?"));
    }
    message.push_str(&format!(" allowed: {}", allowed.join(", ")));
    message
}

/// The allowed name closest to `name`, if any is close enough to be a typo:
/// at most one edit (two for names over four characters, counting a swap of
/// neighbours as one), or a Jaro-Winkler similarity of 0.85.
fn nearest<'a>(name: &str, allowed: &[&'a str]) -> Option<&'a str> {
    let name = name.to_lowercase();
    let max_edits = if name.chars().count() > 4 { 2 } else { 1 };
    allowed
        .iter()
        .map(|&candidate| {
            let edits = strsim::osa_distance(&name, candidate);
            let similarity = strsim::jaro_winkler(&name, candidate);
            (edits, similarity, candidate)
        })
        .filter(|&(edits, similarity, _)| edits <= max_edits || similarity >= 0.85)
        .min_by(|a, b| a.0.cmp(&b.0).then(b.1.total_cmp(&a.1)))
        .map(|(_, _, candidate)| candidate)
}

/// Rewrites serde's messages in the config's terms (TOML types, allowed
/// values with a suggestion); anything else passes through.
fn humanize(message: &str) -> String {
    let message = message.trim();
    if let Some(rest) = message.strip_prefix("unknown variant ") {
        let names = backticked(rest);
        if let [given, allowed @ ..] = &names[..] {
            return not_allowed(format!("`{given}` is not allowed;"), given, allowed);
        }
    }
    if let Some(rest) = message.strip_prefix("unknown field ") {
        // Keys are checked against the schema before deserializing, so this
        // is a backstop.
        let names = backticked(rest);
        if let [given, allowed @ ..] = &names[..] {
            return unknown("key", given, allowed);
        }
    }
    if let Some(rest) = message.strip_prefix("missing field ") {
        let names = backticked(rest);
        if let [missing, ..] = &names[..] {
            return format!("the key `{missing}` is missing and has no default; add it");
        }
    }
    for prefix in ["invalid type: ", "invalid value: "] {
        if let Some((found, expected)) = message.strip_prefix(prefix).and_then(|rest| rest.rsplit_once(", expected ")) {
            return format!("expected {}, found {found}", expected_in_toml(expected));
        }
    }
    message.to_string()
}

/// The names between backticks in a serde message, in order.
fn backticked(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

fn expected_in_toml(expected: &str) -> String {
    match expected {
        "u8" | "u16" | "u32" => "a non-negative integer (32 bits at most)".into(),
        "u64" | "usize" => "a non-negative integer".into(),
        "i8" | "i16" | "i32" | "i64" | "isize" => "an integer".into(),
        "f32" | "f64" => "a number".into(),
        "a sequence" => "an array".into(),
        "path string" => "a path string".into(),
        other if other.starts_with("struct ") => "a table".into(),
        other => other.into(),
    }
}

/// 1-based line and column (in characters) of a byte offset.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = text.get(..offset).unwrap_or(text);
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let line = before.matches('\n').count() + 1;
    let column = before[line_start..].chars().count() + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::time::Duration;

    use super::*;
    use crate::config::{CheckpointInterval, DataKind, Limit, ModelKind, all_keys};

    fn load_text(text: &str, sets: &[&str]) -> Result<Config, Vec<Problem>> {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        from_str(text, "test.toml", &sets).map(|loaded| loaded.config).map_err(|err| err.problems().to_vec())
    }

    fn problems(text: &str, sets: &[&str]) -> Vec<Problem> {
        load_text(text, sets).expect_err("config should be rejected")
    }

    /// `(key, line, column)` of each problem.
    fn places(problems: &[Problem]) -> Vec<(String, Option<usize>, Option<usize>)> {
        problems.iter().map(|p| (p.key.clone(), p.line, p.column)).collect()
    }

    fn keys_of_toml(text: &str) -> BTreeSet<String> {
        let doc: DocumentMut = text.parse().expect("valid TOML");
        let mut keys = BTreeSet::new();
        for (section, item) in doc.iter() {
            for (key, _) in item.as_table_like().expect("a section").iter() {
                keys.insert(format!("{section}.{key}"));
            }
        }
        keys
    }

    #[test]
    fn empty_file_is_the_default_config() {
        assert_eq!(load_text("", &[]), Ok(Config::default()));
    }

    #[test]
    fn reports_every_problem_with_line_and_column() {
        let text = "\
[run]
max_steps = \"many\"
seeed = 3

[checkpoint]
keep = 0
  interval = \"soon\"

[optimiser]
lr = 1
";
        let found = problems(text, &[]);
        assert_eq!(
            places(&found),
            [
                ("run.max_steps".to_string(), Some(2), Some(1)),
                ("run.seeed".to_string(), Some(3), Some(1)),
                ("checkpoint.keep".to_string(), Some(6), Some(1)),
                ("checkpoint.interval".to_string(), Some(7), Some(3)),
                ("optimiser".to_string(), Some(9), Some(1)),
            ]
        );
        let err = from_str(text, "configs/x.toml", &[]).unwrap_err();
        let shown = err.to_string();
        assert!(shown.starts_with("config file configs/x.toml has 5 problems:\n"), "{shown}");
        assert!(shown.contains("\n  configs/x.toml:6:1: checkpoint.keep: must be at least 1 (got 0)"));
    }

    #[test]
    fn suggests_nearest_key_for_typo() {
        let found = problems("[checkpoint]\nkeeep = 2\n", &[]);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].key, "checkpoint.keeep");
        assert_eq!(
            found[0].message,
            "unknown key; did you mean `keep`? allowed: interval, mtbf, every_steps, keep, async, dir, \
             max_consecutive_failures, write_mode, write_block, write_queue_depth, shard_size"
        );
    }

    #[test]
    fn unknown_key_far_from_any_gets_no_suggestion() {
        let found = problems("[gpu]\nzzz = 1\n", &[]);
        assert_eq!(found[0].message, "unknown key; allowed: backend, headroom, require, monitor_interval");
    }

    #[test]
    fn suggestions_catch_swaps_and_skip_strangers() {
        assert_eq!(nearest("gtp", &["mlp", "gpt"]), Some("gpt"));
        assert_eq!(nearest("Kind", &["kind", "path"]), Some("kind"));
        assert_eq!(nearest("max_step", &["seed", "max_steps"]), Some("max_steps"));
        assert_eq!(nearest("intervall", &["interval", "keep"]), Some("interval"));
        assert_eq!(nearest("zzz", &["dir", "keep"]), None);
        assert_eq!(nearest("cnn", &["mlp", "gpt"]), None);
    }

    #[test]
    fn unknown_section_is_reported_once_with_suggestion() {
        let found = problems("[optimiser]\nlr = 1\nbeta1 = 0.5\n", &[]);
        assert_eq!(places(&found), [("optimiser".to_string(), Some(1), Some(1))]);
        assert!(found[0].message.starts_with("unknown section; did you mean `optimizer`? allowed: run, model,"));
    }

    #[test]
    fn bad_enum_value_lists_allowed_values() {
        let found = problems("[model]\nkind = \"gtp\"\n", &[]);
        assert_eq!(places(&found), [("model.kind".to_string(), Some(2), Some(1))]);
        assert_eq!(found[0].message, "`gtp` is not allowed; did you mean `gpt`? allowed: mlp, gpt");
        let found = problems("[gpu]\nbackend = \"metal\"\n", &[]);
        assert_eq!(found[0].message, "`metal` is not allowed; allowed: auto, cpu, cuda, rocm");
    }

    #[test]
    fn wrong_type_names_the_expected_toml_type() {
        let found = problems("[run]\nmax_steps = \"many\"\nseed = -1\n[model]\nhidden = 64\ndropout = \"x\"\n", &[]);
        let messages: Vec<&str> = found.iter().map(|p| p.message.as_str()).collect();
        assert_eq!(
            messages,
            [
                "expected a non-negative integer, found string \"many\"",
                "expected a non-negative integer, found integer `-1`",
                "expected an array, found integer `64`",
                "expected a number, found string \"x\"",
            ]
        );
    }

    #[test]
    fn bad_duration_is_reported_at_its_key() {
        let found = problems("[signals]\ngrace = \"2 fortnights\"\n", &[]);
        assert_eq!(places(&found), [("signals.grace".to_string(), Some(2), Some(1))]);
        assert!(found[0].message.contains("is not a duration"), "{}", found[0].message);
        assert!(found[0].message.contains("\"5m\""));
    }

    #[test]
    fn section_written_as_a_value_is_a_type_error() {
        let found = problems("run = 5\n", &[]);
        assert_eq!(places(&found), [("run".to_string(), Some(1), Some(1))]);
        assert_eq!(found[0].message, "expected a table, found integer `5`");
    }

    #[test]
    fn array_of_tables_section_says_to_use_a_table() {
        let found = problems("[run]\nseed = 1\n[[data]]\nkind = \"x\"\n", &[]);
        assert_eq!(places(&found), [("data".to_string(), Some(3), Some(1))]);
        assert_eq!(found[0].message, "expected a table, found an array of tables; write `[data]`, not `[[data]]`");
    }

    #[test]
    fn duration_given_as_a_number_asks_for_a_string() {
        let found = problems("[signals]\ngrace = 300\n", &[]);
        assert_eq!(
            found[0].message,
            "expected a duration string such as \"90s\", \"5m\" or \"1h 30m\", found integer `300`"
        );
        let found = problems("[checkpoint]\ninterval = 300\n", &[]);
        assert_eq!(found[0].message, "expected \"auto\" or a duration such as \"5m\", found integer `300`");
    }

    #[test]
    fn checkpoint_interval_is_auto_or_a_duration_and_mtbf_goes_with_auto() {
        let text = "[checkpoint]\ninterval = \"auto\"\nmtbf = \"6h\"\n";
        let config = from_str(text, "c.toml", &[]).unwrap().config;
        assert_eq!(config.checkpoint.interval, CheckpointInterval::Auto);
        assert_eq!(config.checkpoint.mtbf, Some(Duration::from_secs(6 * 3600)));
        assert_eq!(load_text(&to_toml(&config), &[]), Ok(config));
        let found = problems("[checkpoint]\ninterval = \"sometimes\"\n", &[]);
        assert_eq!(places(&found), [("checkpoint.interval".to_string(), Some(2), Some(1))]);
        assert!(found[0].message.contains("`sometimes` is neither \"auto\" nor a duration"), "{}", found[0].message);
        assert!(found[0].message.contains("write e.g. \"auto\", \"90s\" or \"5m\""), "{}", found[0].message);
        let found = problems("[checkpoint]\ninterval = \"5m\"\nmtbf = \"6h\"\n", &[]);
        assert_eq!(found[0].key, "checkpoint.mtbf");
        assert_eq!(found[0].message, "is only used with checkpoint.interval = \"auto\"; set that, or remove mtbf");
    }

    #[test]
    fn inline_tables_and_dotted_keys_are_checked_per_key() {
        let text = "model = { kind = \"gpt\", heads = \"4\" }\ndata.kindd = \"jsonl\"\n";
        let found = problems(text, &[]);
        assert_eq!(
            places(&found),
            [("model.heads".to_string(), Some(1), Some(25)), ("data.kindd".to_string(), Some(2), Some(6)),]
        );
    }

    #[test]
    fn semantic_problem_points_at_its_key() {
        let found = problems("[run]\nname = \"t\"\n\n[signals]\nsafety_margin = \"5m\"\n", &[]);
        // signals.grace is not in the file: the problem points at its section.
        assert_eq!(places(&found), [("signals.grace".to_string(), Some(4), Some(1))]);
        assert_eq!(found[0].message, "must be longer than signals.safety_margin = 5m (got 2m)");
    }

    #[test]
    fn semantic_problem_in_a_section_made_by_set_is_from_set() {
        let found = problems("", &["publish.enabled=true"]);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].key, "publish.repo");
        // The section exists only through --set, so that is where it points.
        assert!(found[0].from_set);
    }

    #[test]
    fn rejected_key_does_not_cause_follow_on_reports() {
        // heads = "3" is rejected; its default (4) must not then be reported
        // as not dividing width = 30.
        let found = problems("[model]\nkind = \"gpt\"\nwidth = 30\nheads = \"3\"\n", &[]);
        assert_eq!(places(&found), [("model.heads".to_string(), Some(4), Some(1))]);
    }

    #[test]
    fn set_override_replaces_value_with_toml_type() {
        let config = load_text(
            "[run]\nmax_steps = 10\n",
            &["run.max_steps=50", "checkpoint.interval=\"30s\"", "model.hidden=[8, 8]"],
        )
        .unwrap();
        assert_eq!(config.run.max_steps, 50);
        assert_eq!(config.checkpoint.interval, CheckpointInterval::Fixed(Duration::from_secs(30)));
        assert_eq!(config.model.hidden, [8, 8]);
    }

    #[test]
    fn set_override_accepts_a_bare_string() {
        let config = load_text(
            "",
            &["model.kind=gpt", "checkpoint.interval=90s", "run.name=2024", "data.kind = jsonl", "data.path=d.jsonl"],
        )
        .unwrap();
        assert_eq!(config.model.kind, ModelKind::Gpt);
        assert_eq!(config.checkpoint.interval, CheckpointInterval::Fixed(Duration::from_secs(90)));
        assert_eq!(config.run.name, "2024");
        assert_eq!(config.data.kind, DataKind::Jsonl);
    }

    #[test]
    fn micro_batch_is_auto_or_a_number() {
        use crate::config::MicroBatch;
        assert_eq!(load_text("", &[]).unwrap().train.micro_batch, None);
        let auto = load_text("[train]\nmicro_batch = \"auto\"\n", &[]).unwrap();
        assert_eq!(auto.train.micro_batch, Some(MicroBatch::Auto));
        let eight = load_text("[train]\nmicro_batch = 8\n", &[]).unwrap();
        assert_eq!(eight.train.micro_batch, Some(MicroBatch::Samples(8)));
        assert_eq!(load_text("", &["train.micro_batch=auto"]).unwrap().train.micro_batch, Some(MicroBatch::Auto));
        assert_eq!(load_from_toml(&to_toml(&eight)), eight);
        assert_eq!(load_from_toml(&to_toml(&auto)), auto);
        for (bad, says) in [
            ("\"big\"", "`big` is not allowed; expected \"auto\" or a whole number of samples"),
            ("1.5", "expected \"auto\" or a whole number of samples, found floating point `1.5`"),
            ("-2", "expected \"auto\" or a whole number of samples, found -2"),
        ] {
            let found = problems(&format!("[train]\nmicro_batch = {bad}\n"), &[]);
            assert_eq!(places(&found), [("train.micro_batch".to_string(), Some(2), Some(1))], "{bad}");
            assert_eq!(found[0].message, says, "{bad}");
        }
    }

    fn load_from_toml(text: &str) -> Config {
        load_text(text, &[]).unwrap()
    }

    #[test]
    fn watchdog_limits_are_auto_or_durations() {
        let config = load_text("[watchdog]\nstep = \"90s\"\n", &["watchdog.save=\"auto\""]).unwrap();
        assert_eq!(config.watchdog.step, Limit::Fixed(Duration::from_secs(90)));
        assert_eq!((config.watchdog.save, config.watchdog.eval), (Limit::Auto, Limit::Auto));
        let found = problems("[watchdog]\npublish = \"soon\"\n", &[]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].key, "watchdog.publish");
        assert!(found[0].message.contains("neither \"auto\" nor a duration"), "{}", found[0].message);
    }

    #[test]
    fn later_set_wins() {
        let config = load_text("", &["run.seed=1", "run.seed=2"]).unwrap();
        assert_eq!(config.run.seed, 2);
    }

    #[test]
    fn set_problems_say_from_set() {
        let found = problems(
            "[checkpoint]\nkeep = 0\n",
            &["checkpoint.keep=0", "run.max_step=5", "nosuch.key=1", "run.seed=x"],
        );
        let shown: Vec<String> = found.iter().map(|p| p.render("c.toml")).collect();
        assert_eq!(
            shown,
            [
                "from --set: run.max_step: unknown key; did you mean `max_steps`? allowed: name, dir, seed, max_steps, max_crash_requeues, \
                 max_attempts_without_progress",
                "from --set: nosuch.key: unknown section; allowed: run, model, data, train, optimizer, \
                 precision, checkpoint, signals, publish, gpu, watchdog, lock, distributed, recovery, health, telemetry",
                "from --set: run.seed: expected a non-negative integer, found string \"x\"",
                "from --set: checkpoint.keep: must be at least 1 (got 0)",
            ]
        );
    }

    #[test]
    fn malformed_set_is_reported() {
        let found = problems("", &["run.max_steps", "max_steps=3", "a.b.c=1"]);
        assert_eq!(found.len(), 3);
        assert!(found.iter().all(|p| p.from_set));
        assert!(found[0].message.contains("no `=`"), "{}", found[0].message);
        assert!(found[1].message.contains("section.key"), "{}", found[1].message);
    }

    #[test]
    fn syntax_error_has_line() {
        let found = problems("[run]\nseed = 1\nmax_steps = = 3\n", &[]);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].line, Some(3));
        assert!(found[0].column.is_some());
        assert!(found[0].message.starts_with("TOML syntax error: "), "{}", found[0].message);
        let shown = from_str("[run\n", "bad.toml", &[]).unwrap_err().to_string();
        assert!(shown.contains("bad.toml:1:"), "{shown}");
    }

    #[test]
    fn serde_messages_are_rewritten_in_config_terms() {
        assert_eq!(
            humanize("unknown field `kep`, expected one of `keep`, `dir`"),
            "unknown key; did you mean `keep`? allowed: keep, dir"
        );
        assert_eq!(
            humanize("invalid value: integer `-1`, expected u32"),
            "expected a non-negative integer (32 bits at most), found integer `-1`"
        );
        assert_eq!(humanize("something else\n"), "something else");
    }

    #[test]
    fn columns_count_characters_not_bytes() {
        assert_eq!(line_column("é = 1\nab", 8), (2, 2));
        assert_eq!(line_column("x", 0), (1, 1));
    }

    #[test]
    fn missing_file_error_names_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nope.toml");
        let err = load(&path, &[]).unwrap_err();
        assert!(matches!(err, ConfigError::Read { .. }));
        assert!(err.to_string().contains(&path.display().to_string()));
    }

    #[test]
    fn load_reads_the_file_and_records_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "[run]\nseed = 9\n").unwrap();
        let loaded = load(&path, &["run.max_steps=3".to_string()]).unwrap();
        assert_eq!(loaded.source, path);
        assert_eq!((loaded.config.run.seed, loaded.config.run.max_steps), (9, 3));
    }

    #[test]
    fn resolved_toml_round_trips() {
        let mut config = Config::default();
        assert_eq!(load_text(&to_toml(&config), &[]), Ok(config.clone()));
        config.model.kind = ModelKind::Gpt;
        config.data.kind = DataKind::Jsonl;
        config.data.path = Some("data/x.jsonl".into());
        config.optimizer.decay_steps = Some(500);
        config.optimizer.eps = 1.5e-9;
        config.checkpoint.interval = CheckpointInterval::Fixed(Duration::from_millis(90_500));
        config.publish.include = vec!["*.json".into()];
        assert_eq!(load_text(&to_toml(&config), &[]), Ok(config));
    }

    #[test]
    fn resolved_toml_lists_every_set_key() {
        let config = Config::default();
        let json = serde_json::to_value(&config).unwrap();
        let unset: BTreeSet<String> = all_keys()
            .into_iter()
            .filter(|key| {
                let (section, name) = key.split_once('.').unwrap();
                json[section][name].is_null()
            })
            .collect();
        let written = keys_of_toml(&to_toml(&config));
        let every: BTreeSet<String> = all_keys().into_iter().collect();
        assert_eq!(written, every.difference(&unset).cloned().collect());
    }

    #[test]
    fn example_toml_sets_every_key_of_the_schema() {
        let text = include_str!("../../configs/example.toml");
        let example = from_str(text, "configs/example.toml", &[]).unwrap().config;
        assert_eq!(example.model.kind, ModelKind::Gpt);
        assert_eq!(example.data.kind, DataKind::Jsonl);
        let documented = keys_of_toml(text);
        // Every key to_toml writes for the defaults, plus the optional keys
        // (unset by default, so not written) must appear in the example.
        let resolved = keys_of_toml(&to_toml(&Config::default()));
        let every: BTreeSet<String> = all_keys().into_iter().collect();
        assert!(resolved.is_subset(&every));
        assert_eq!(documented, every, "configs/example.toml and the schema differ");
        assert_eq!(keys_of_toml(&to_toml(&example)), every);
    }

    #[test]
    fn tiny_toml_loads() {
        let text = include_str!("../../configs/tiny.toml");
        let tiny = from_str(text, "configs/tiny.toml", &[]).unwrap().config;
        assert_eq!(tiny.run.name, "tiny");
        assert_eq!(tiny.model.kind, ModelKind::Mlp);
        assert_eq!(tiny.data.kind, DataKind::Synthetic);
        assert_eq!(tiny.checkpoint.every_steps, 50);
    }

    #[test]
    fn demo_toml_trains_the_gpt_on_the_shipped_text() {
        let text = include_str!("../../configs/demo.toml");
        let demo = from_str(text, "configs/demo.toml", &[]).unwrap().config;
        assert_eq!((demo.run.name.as_str(), &demo.model.kind), ("demo", &ModelKind::Gpt));
        assert_eq!(demo.data.kind, DataKind::Text);
        let path = demo.data.path.expect("a text file");
        // Relative to the working directory: `make demo` runs from the root.
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        assert!(root.join(&path).is_file(), "{} is missing", path.display());
    }

    #[test]
    fn data_kind_names_are_those_a_config_file_writes() {
        for kind in [DataKind::Synthetic, DataKind::Jsonl, DataKind::Text] {
            let mut config = Config::default();
            config.data.kind = kind;
            let written = to_toml(&config);
            assert!(written.contains(&format!("kind = \"{}\"", kind.name())), "{written}");
            let set = format!("data.kind={}", kind.name());
            assert_eq!(load_text("", &["model.kind=gpt", "data.path=d", &set]).unwrap().data.kind, kind);
        }
    }

    /// Property tests over arbitrary and mutated config files and
    /// overrides; see `crate::fuzz`. Every input loads or gives problems
    /// that name what is wrong, never a panic.
    mod fuzz {
        use proptest::prelude::*;

        use super::*;
        use crate::fuzz;

        fn example() -> Vec<u8> {
            std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/configs/example.toml")).unwrap()
        }

        fn check(bytes: &[u8], sets: &[String]) -> Result<(), TestCaseError> {
            match from_str(&String::from_utf8_lossy(bytes), "fuzz.toml", sets) {
                Ok(loaded) => {
                    let _ = to_toml(&loaded.config);
                }
                Err(err) => {
                    prop_assert!(!err.problems().is_empty(), "an error without a problem: {err}");
                    let _ = err.to_string();
                }
            }
            Ok(())
        }

        proptest! {
            #![proptest_config(fuzz::config())]

            #[test]
            fn arbitrary_text_loads_or_names_its_problems(bytes in fuzz::bytes(512)) {
                check(&bytes, &[])?;
            }

            #[test]
            fn mutated_example_config_loads_or_names_its_problems(bytes in fuzz::mutated(example())) {
                check(&bytes, &[])?;
            }

            #[test]
            fn arbitrary_overrides_apply_or_name_their_problems(
                sets in proptest::collection::vec(
                    prop_oneof![
                        "[a-z_.]{0,24}=[ -~]{0,24}",
                        "(run|model|train|checkpoint|signals|gpu)\\.[a-z_]{1,16}=(-?[0-9]{1,25}|\\[\\]|\"[a-z]*\"|true|1e400|\\{\\})",
                        "[ -~]{0,40}",
                    ],
                    0..4,
                ),
            ) {
                check(&example(), &sets)?;
            }
        }
    }

    mod round_trip {
        use proptest::prelude::*;

        use super::*;

        proptest! {
            #[test]
            fn any_loaded_config_round_trips(
                seed in 0u64..=i64::MAX as u64,
                lr in 1e-9f64..10.0,
                hidden in proptest::collection::vec(1usize..4096, 1..5),
                interval_ms in 1u64..10_000_000,
                name in "[a-z][a-z0-9_-]{0,20}",
                include in proptest::collection::vec(
                    "[ -~]{0,12}".prop_filter("a valid include pattern", |p| crate::config::check_include_pattern(p).is_ok()),
                    0..3,
                ),
            ) {
                let mut config = Config::default();
                config.run.seed = seed;
                config.run.name = name;
                config.optimizer.lr = lr;
                config.optimizer.min_lr = lr / 10.0;
                config.model.hidden = hidden;
                config.checkpoint.interval = CheckpointInterval::Fixed(Duration::from_millis(interval_ms));
                config.publish.include = include;
                prop_assert_eq!(load_text(&to_toml(&config), &[]), Ok(config));
            }
        }
    }
}
