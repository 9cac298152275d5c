//! What publishing may copy, decided without a disk: the artefacts always
//! published, the `[publish] include` patterns matched path component by
//! path component, the walk's decision for each entry of the run directory
//! ([`Selection::decide`]), and the allow-list of types and sizes ([`admit`]).
//!
//! Only regular files really inside the run directory are published: the
//! walk never follows a symbolic link (to a file or to a directory), never
//! enters the checkpoints (`checkpoints/`, and `[checkpoint] dir` when it
//! lies inside the run directory), and refuses, with the reason, each of
//! those a pattern could have reached. The reads that follow check again on
//! the open file (`files.rs`).

use std::path::Path;

use glob::Pattern;

use crate::config::check_include_pattern;
use crate::telemetry::RefusedFile;

/// The run-directory files published whenever they are there (besides the
/// newest checkpoint's `MANIFEST.json`).
pub const ARTEFACTS: [&str; 5] = ["config.toml", "metrics.jsonl", "events.jsonl", "summary.json", "gpu_stats.jsonl"];

/// The kinds of file publishing may copy: small text artefacts and figures.
/// An allow-list, not a deny-list of weight formats: a file of any other
/// type (weights under any name, archives, binaries, pickles) is never pushed.
pub const PUBLISHABLE_EXTENSIONS: [&str; 13] =
    ["json", "jsonl", "toml", "yaml", "yml", "txt", "md", "csv", "tsv", "log", "html", "svg", "png"];

/// Why anything of the checkpoints is refused.
pub const CHECKPOINT_REASON: &str = "checkpoint contents are never published (only the newest MANIFEST.json is)";

/// Why a symbolic link is refused.
pub const SYMLINK_REASON: &str =
    "a symbolic link: publishing never follows links (only regular files inside the run directory are published)";

/// The checkpoints directory inside every run directory.
const CHECKPOINTS_DIR: &str = "checkpoints";

/// One `/`-separated component of an include pattern.
#[derive(Debug)]
enum Component {
    /// `**`: any number of components, none included.
    AnyDepth,
    /// A glob within one component (`*.txt`, `step-?`, `a[bc]`).
    Name(Pattern),
}

/// An include pattern (or an artefact's name), compiled.
#[derive(Debug)]
struct Include(Vec<Component>);

impl Include {
    /// `pattern`, when [`check_include_pattern`] allows it; `.` and empty
    /// components (`./a`, `a//b`) are dropped.
    fn compile(pattern: &str) -> Result<Include, String> {
        check_include_pattern(pattern)?;
        pattern
            .split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .map(|c| match c {
                "**" => Ok(Component::AnyDepth),
                _ => Pattern::new(c).map(Component::Name).map_err(|e| e.to_string()),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Include)
    }

    /// The file `name` in the run directory itself, matched literally.
    fn literal(name: &str) -> Include {
        let pattern = Pattern::new(&Pattern::escape(name)).expect("an escaped name is a valid pattern");
        Include(vec![Component::Name(pattern)])
    }
}

/// Whether `path` (components relative to the run directory) matches `pattern`.
fn matches(pattern: &[Component], path: &[&str]) -> bool {
    match pattern.split_first() {
        None => path.is_empty(),
        Some((Component::AnyDepth, rest)) => matches(rest, path) || (!path.is_empty() && matches(pattern, &path[1..])),
        Some((Component::Name(p), rest)) => {
            path.first().is_some_and(|name| p.matches(name)) && matches(rest, &path[1..])
        }
    }
}

/// Whether `pattern` could match something strictly under the directory `dir`.
fn reaches(pattern: &[Component], dir: &[&str]) -> bool {
    match (pattern.split_first(), dir.split_first()) {
        (None, _) => false,
        (Some((Component::AnyDepth, _)), _) => true,
        (Some(_), None) => true,
        (Some((Component::Name(p), rest)), Some((name, below))) => p.matches(name) && reaches(rest, below),
    }
}

/// What an entry of the run directory is, as listed (links not followed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    File,
    Dir,
    Symlink,
    /// A FIFO, a socket or a device, in words (`"a FIFO"`).
    Other(&'static str),
}

/// What the walk does with an entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Nothing to publish there: no pattern matches it or anything under it.
    Skip,
    /// A directory a pattern reaches into.
    Descend,
    /// A regular file a pattern matches: read it (and [`admit`] it).
    Take,
    /// A pattern reaches it, but it is never published: why.
    Refuse(String),
}

/// The run-directory entries one publish considers: the [`ARTEFACTS`] and the
/// `[publish] include` patterns, never the checkpoints.
#[derive(Debug)]
pub struct Selection {
    includes: Vec<Include>,
    /// Directories (components relative to the run directory) never entered.
    excluded: Vec<Vec<String>>,
}

impl Selection {
    /// The artefacts and the patterns of `include`; `checkpoint_dir`: the
    /// components of `[checkpoint] dir` relative to the run directory, when
    /// it lies inside (`checkpoints/` is always excluded). Patterns
    /// that are not valid (which config validation reports before a run
    /// starts) are left out, each returned as refused with the reason.
    pub fn new(include: &[String], checkpoint_dir: Option<Vec<String>>) -> (Selection, Vec<RefusedFile>) {
        let mut includes: Vec<Include> = ARTEFACTS.iter().map(|name| Include::literal(name)).collect();
        let mut invalid = Vec::new();
        for pattern in include {
            match Include::compile(pattern) {
                Ok(compiled) => includes.push(compiled),
                Err(why) => invalid.push(RefusedFile {
                    file: pattern.clone(),
                    reason: format!("[publish] include pattern not used: {why}"),
                }),
            }
        }
        let mut excluded = vec![vec![CHECKPOINTS_DIR.to_string()]];
        excluded.extend(checkpoint_dir);
        (Selection { includes, excluded }, invalid)
    }

    /// What to do with the entry at `rel` (components relative to the run
    /// directory) of kind `kind`.
    pub fn decide(&self, rel: &[&str], kind: EntryKind) -> Decision {
        let matched = self.includes.iter().any(|i| matches(&i.0, rel));
        let reached = self.includes.iter().any(|i| reaches(&i.0, rel));
        if !matched && !reached {
            return Decision::Skip;
        }
        if self.excluded.iter().any(|dir| rel.len() >= dir.len() && rel.iter().zip(dir).all(|(a, b)| a == b)) {
            return Decision::Refuse(CHECKPOINT_REASON.into());
        }
        match kind {
            EntryKind::Symlink => Decision::Refuse(SYMLINK_REASON.into()),
            EntryKind::Dir if reached => Decision::Descend,
            EntryKind::File if matched => Decision::Take,
            EntryKind::Other(what) if matched => {
                Decision::Refuse(format!("{what}, not a regular file: only regular files are published"))
            }
            _ => Decision::Skip,
        }
    }
}

/// Whether the run-directory file `rel` (of `size` bytes) may be published,
/// or why not: its type must be on [`PUBLISHABLE_EXTENSIONS`], its size
/// within `max_bytes`, and it must not be under `checkpoints/`.
pub fn admit(rel: &str, size: u64, max_bytes: u64) -> Result<(), String> {
    if rel.starts_with("checkpoints/") {
        return Err(CHECKPOINT_REASON.into());
    }
    let ext = Path::new(rel).extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    match ext {
        Some(ext) if PUBLISHABLE_EXTENSIONS.contains(&ext.as_str()) => {}
        _ => {
            return Err(format!(
                "not a publishable type (allowed: .{}); weights and other binary files are never published",
                PUBLISHABLE_EXTENSIONS.join(", .")
            ));
        }
    }
    if size > max_bytes {
        return Err(format!(
            "{size} bytes is over [publish] max_file_mib = {} MiB; raise it or leave the file out of [publish] include",
            max_bytes >> 20
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn selection(include: &[&str]) -> Selection {
        let include: Vec<String> = include.iter().map(|p| p.to_string()).collect();
        let (selection, invalid) = Selection::new(&include, None);
        assert!(invalid.is_empty(), "{invalid:?}");
        selection
    }

    fn decide(s: &Selection, rel: &str, kind: EntryKind) -> Decision {
        s.decide(&rel.split('/').collect::<Vec<_>>(), kind)
    }

    fn refused(d: Decision) -> String {
        match d {
            Decision::Refuse(why) => why,
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn the_artefacts_are_always_selected_and_nothing_else_by_default() {
        let s = selection(&[]);
        for name in ARTEFACTS {
            assert_eq!(decide(&s, name, EntryKind::File), Decision::Take, "{name}");
        }
        for other in ["notes.md", "samples", "rekindle.lock", ".rekindle", "config.toml.bak", "Config.toml"] {
            assert_eq!(decide(&s, other, EntryKind::File), Decision::Skip, "{other}");
            assert_eq!(decide(&s, other, EntryKind::Dir), Decision::Skip, "{other}");
        }
        assert_eq!(decide(&s, "samples/metrics.jsonl", EntryKind::File), Decision::Skip, "artefacts are top-level");
    }

    #[test]
    fn patterns_match_component_by_component() {
        let s = selection(&["samples/*.txt", "plots/**/*.svg", "./eval.csv", "logs/**"]);
        assert_eq!(decide(&s, "samples", EntryKind::Dir), Decision::Descend);
        assert_eq!(decide(&s, "samples/a.txt", EntryKind::File), Decision::Take);
        assert_eq!(decide(&s, "samples/.hidden.txt", EntryKind::File), Decision::Take);
        assert_eq!(decide(&s, "samples/a.json", EntryKind::File), Decision::Skip);
        assert_eq!(decide(&s, "samples/deep", EntryKind::Dir), Decision::Skip, "`*` stays in its component");
        assert_eq!(decide(&s, "samples/deep/a.txt", EntryKind::File), Decision::Skip);
        assert_eq!(decide(&s, "plots", EntryKind::Dir), Decision::Descend);
        assert_eq!(decide(&s, "plots/loss.svg", EntryKind::File), Decision::Take, "`**` may be empty");
        assert_eq!(decide(&s, "plots/a/b/loss.svg", EntryKind::File), Decision::Take);
        assert_eq!(decide(&s, "plots/a/b", EntryKind::Dir), Decision::Descend);
        assert_eq!(decide(&s, "eval.csv", EntryKind::File), Decision::Take, "`./` is dropped");
        assert_eq!(decide(&s, "logs/x/y.log", EntryKind::File), Decision::Take, "a trailing `**` takes all");
        assert_eq!(decide(&s, "other", EntryKind::Dir), Decision::Skip, "no pattern reaches into it");
        assert_eq!(decide(&s, "samples/a.txt", EntryKind::Dir), Decision::Skip, "a directory is not a file");
    }

    #[test]
    fn symlinks_are_refused_wherever_a_pattern_reaches() {
        let s = selection(&["*.txt", "samples/*", "ck/**"]);
        for link in ["passwd.txt", "samples/key.txt", "samples/model.json", "ck", "events.jsonl"] {
            assert!(refused(decide(&s, link, EntryKind::Symlink)).contains("never follows links"), "{link}");
        }
        assert_eq!(decide(&s, "latest", EntryKind::Symlink), Decision::Skip, "no pattern reaches it");
        let everything = selection(&["**"]);
        assert!(refused(decide(&everything, "a/b/link", EntryKind::Symlink)).contains("symbolic link"));
    }

    #[test]
    fn the_checkpoints_are_never_entered_whatever_the_pattern() {
        let s = selection(&["**/*.json", "checkpoints/step-*/MANIFEST.json"]);
        assert_eq!(refused(decide(&s, "checkpoints", EntryKind::Dir)), CHECKPOINT_REASON);
        assert_eq!(
            refused(decide(&s, "checkpoints/step-0000000001/MANIFEST.json", EntryKind::File)),
            CHECKPOINT_REASON
        );
        assert_eq!(refused(decide(&s, "checkpoints", EntryKind::Symlink)), CHECKPOINT_REASON);
        assert_eq!(decide(&s, "checkpoints.json", EntryKind::File), Decision::Take, "only the directory");
        assert_eq!(decide(&s, "sub/checkpoints", EntryKind::Dir), Decision::Descend, "only at the top");
        assert_eq!(decide(&selection(&["*.txt"]), "checkpoints", EntryKind::Dir), Decision::Skip);

        // `[checkpoint] dir` inside the run directory: excluded the same way.
        let (s, _) = Selection::new(&["**".to_string()], Some(vec!["store".into(), "ckpt".into()]));
        assert_eq!(decide(&s, "store", EntryKind::Dir), Decision::Descend);
        assert_eq!(refused(decide(&s, "store/ckpt", EntryKind::Dir)), CHECKPOINT_REASON);
        assert_eq!(refused(decide(&s, "store/ckpt/w.json", EntryKind::File)), CHECKPOINT_REASON);
        assert_eq!(decide(&s, "store/ckpt2/w.json", EntryKind::File), Decision::Take);
    }

    #[test]
    fn special_files_are_refused_and_invalid_patterns_reported() {
        let s = selection(&["samples/*"]);
        let why = refused(decide(&s, "samples/pipe.txt", EntryKind::Other("a FIFO")));
        assert_eq!(why, "a FIFO, not a regular file: only regular files are published");
        assert_eq!(decide(&s, "elsewhere.txt", EntryKind::Other("a socket")), Decision::Skip);

        let include = vec!["../x/*".to_string(), "ok.txt".into(), "/etc/*".into()];
        let (s, invalid) = Selection::new(&include, None);
        assert_eq!(invalid.iter().map(|r| r.file.as_str()).collect::<Vec<_>>(), ["../x/*", "/etc/*"]);
        assert!(invalid[0].reason.contains("leaves the run directory"), "{:?}", invalid[0]);
        assert_eq!(decide(&s, "ok.txt", EntryKind::File), Decision::Take, "the valid ones still apply");
    }

    #[test]
    fn only_allowed_types_under_the_size_cap_are_published() {
        const MIB: u64 = 1 << 20;
        for ok in ["metrics.jsonl", "samples/a.txt", "plots/loss.svg", "plots/LOSS.PNG", "notes.md", "eval.csv"] {
            assert_eq!(admit(ok, 10, MIB), Ok(()), "{ok}");
        }
        for weights in ["model.safetensors", "x/y.pt", "w.bin", "opt.ckpt", "a.npz", "m.gguf", "w.pkl", "w.h5"] {
            let why = admit(weights, 10, MIB).unwrap_err();
            assert!(why.contains("not a publishable type"), "{weights}: {why}");
        }
        for unknown in ["Makefile", "archive.tar.gz", "core", "data.parquet", "run.jsonl.bak"] {
            assert!(admit(unknown, 10, MIB).is_err(), "a file of unknown type is never pushed: {unknown}");
        }
        let why = admit("checkpoints/step-1/state.json", 10, MIB).unwrap_err();
        assert!(why.contains("checkpoint contents"), "{why}");
        assert_eq!(admit("metrics.jsonl", MIB, MIB), Ok(()), "the cap itself is allowed");
        let why = admit("metrics.jsonl", MIB + 1, MIB).unwrap_err();
        assert!(why.contains("over [publish] max_file_mib = 1 MiB"), "{why}");
    }
}
