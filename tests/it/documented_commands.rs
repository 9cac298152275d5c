//! Every `rekindle …` command line that README.md and docs/*.md show, run as
//! shown (issue #33): a documented command that stops working, or a new one
//! that does not work, fails this test.
//!
//! The commands are read from the files when the test runs. A command is a
//! line of a shell code block (```` ```sh ````, ```` ```bash ````, ```` ```shell ````,
//! ```` ```console ```` or a bare ```` ``` ````) whose first word, after a `$ `
//! prompt and its block's own `NAME=value` lines are expanded, is `rekindle`,
//! `target/release/rekindle` or `target/debug/rekindle` (with or without
//! `./`); backslash continuations are joined and `# comments` dropped. Lines
//! that start with another program (`sbatch`, `mpirun`, `srun`, `make`) are
//! not commands of rekindle's and are not extracted.
//!
//! Each file's commands run in order, through `sh`, with the binary cargo built
//! for the tests, in a scratch directory of their own holding a copy of
//! `configs/` (so `--config configs/tiny.toml` works and `runs/` lands there).
//! Before a command runs:
//! - an absolute path in it (`/work/perf-bench`, `/tmp/lc1`,
//!   `/path/on/your/checkpoint/fs`) moves under the scratch directory's `root/`;
//! - the placeholders of [`PLACEHOLDERS`] (`my.toml`, `python train.py`…) are
//!   replaced by real files and programs;
//! - the [`OVERRIDES`] shrink what would take minutes in a debug build.
//!
//! [`NOT_RUN`] lists the commands that are not run, each with its reason. What
//! is left must exit with the code [`EXPECTED`] gives it (0 when it gives
//! none), from the table of `src/exit.rs` that README.md documents. Every
//! failure is reported at once, with its file and line. An entry of a table
//! that no documented command matches any more fails the test too, so that the
//! tables stay as short as the documentation needs.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use rekindle::exit::Outcome;

use crate::support::cli::exe;
use crate::support::run_as_user;

/// How long one documented command may take in a debug build.
const TIMEOUT: Duration = Duration::from_secs(120);

/// Commands not run: those of `file` whose text (block variables expanded)
/// contains `needle`.
struct NotRun {
    file: &'static str,
    needle: &'static str,
    why: &'static str,
}

const NOT_RUN: &[NotRun] = &[
    NotRun {
        file: "docs/performance.md",
        needle: "--cold",
        why: "drops the whole machine's page cache (as root), slowing every test running beside it",
    },
    NotRun {
        file: "docs/slurm.md",
        needle: "rekindle status runs/tiny",
        why: "shows the run that the SLURM job submitted just above it trained (needs SLURM)",
    },
    NotRun {
        file: "docs/telemetry.md",
        needle: "--watch",
        why: "refreshes until Ctrl-C; tests/it/telemetry.rs runs it with --count 2",
    },
    NotRun {
        file: "docs/performance.md",
        needle: "/work/benchdir/sig",
        why: "trains in the background until `kill -TERM $!` (max_steps 100000): a signal measurement, not a \
              command that ends",
    },
    NotRun {
        file: "docs/exec.md",
        needle: "torchrun --standalone",
        why: "two DDP ranks of PyTorch (from the project's .venv, not on PATH) for 2000 steps: \
              tests/it/torch_exec.rs runs this very program under `rekindle exec`, shortened",
    },
];

/// A word of the documentation that stands for something of the reader's own,
/// and what stands in for it here. `{line}` is the command's line.
struct Placeholder {
    word: &'static str,
    by: &'static str,
    why: &'static str,
}

const PLACEHOLDERS: &[Placeholder] = &[
    Placeholder {
        word: "my.toml",
        by: "my-L{line}.toml",
        why: "your config: a copy of configs/tiny.toml with a run of its own (`my-L{line}`), because each README \
              example with my.toml stands alone (one raising max_steps, then one stopping at step 100, in one run \
              directory, would be a refused config change)",
    },
    Placeholder { word: "corpus.jsonl", by: "configs/example-data.jsonl", why: "your data set: the example corpus" },
    Placeholder {
        word: "node.json",
        by: "inventory-2xH100.json",
        why: "the node you will request: docs/placement.md's example inventory, two H100s",
    },
    Placeholder {
        word: "python train.py",
        by: "true",
        why: "your training program (a PyTorch script, not in this repository): `true`, so that what runs is \
              rekindle's side of the command line; tests/it/exec.rs runs real programs",
    },
];

/// Option values replaced in the commands of `file` that contain `needle`:
/// `("--bytes", "1MiB")` replaces the word after `--bytes`; `("model.hidden=",
/// "[64,64]")` the value of that `--set`. Only what would take minutes in a
/// debug build on two slow cores, never what decides the exit code.
struct Override {
    file: &'static str,
    needle: &'static str,
    values: &'static [(&'static str, &'static str)],
    why: &'static str,
}

const OVERRIDES: &[Override] = &[
    Override {
        file: "README.md",
        needle: "bench checkpoint",
        values: &[("--bytes", "1MiB")],
        why: "1 GiB takes minutes to hash in a debug build",
    },
    Override {
        file: "docs/performance.md",
        needle: "bench checkpoint",
        values: &[("--bytes", "1MiB")],
        why: "256 MiB to 4 GiB, three times: minutes to hours in a debug build",
    },
    Override {
        file: "README.md",
        needle: "bench train",
        values: &[("--steps", "300")],
        why: "3000 steps twice: half a minute in a debug build",
    },
    Override {
        file: "docs/performance.md",
        needle: "bench train",
        values: &[("--steps", "40"), ("--every", "20"), ("model.hidden=", "[64,64]")],
        why: "3000 steps of a 1024x1024 MLP twice: over ten minutes in a debug build",
    },
    Override {
        file: "docs/performance.md",
        needle: "model.hidden=[16384,14336]",
        values: &[("model.hidden=", "[64,64]")],
        why: "252 M parameters: a 2.9 GB checkpoint and minutes in a debug build",
    },
    Override {
        file: "docs/distributed.md",
        needle: "model.hidden=[2048,2048]",
        values: &[("model.hidden=", "[64,64]")],
        why: "60 steps of a 2048x2048 MLP: seven seconds a step in a debug build",
    },
    Override {
        file: "docs/distributed.md",
        needle: "model.hidden=[512,512]",
        values: &[("model.hidden=", "[64,64]"), ("run.max_steps=", "30")],
        why: "300 steps of a 512x512 MLP at batch 256: three seconds a step in a debug build (50 s with 64x64)",
    },
    Override {
        file: "README.md",
        needle: "run.max_steps=5000",
        values: &[("run.max_steps=", "500")],
        why: "5000 steps: 11 s in a debug build",
    },
];

/// Commands whose documented exit code is not 0.
struct Expected {
    needle: &'static str,
    outcome: Outcome,
    why: &'static str,
}

const EXPECTED: &[Expected] = &[Expected {
    needle: "--stop-at-step",
    outcome: Outcome::StoppedWithCheckpoint,
    why: "`--stop-at-step N` checkpoints step N and exits 75 (README: \"checkpoint step 100, exit 75\")",
}];

/// A command line as a document shows it.
#[derive(Debug, PartialEq)]
struct Shown {
    /// 1-based line of its first line.
    line: usize,
    /// Continuations joined, prompt and comment dropped.
    text: String,
    /// `text` with its block's variables expanded.
    command: String,
}

/// The info strings of the fences whose lines are shell.
const SHELL_FENCES: &[&str] = &["", "sh", "bash", "shell", "console"];

/// The `rekindle` command lines of one Markdown document.
fn shown_commands(markdown: &str) -> Vec<Shown> {
    let lines: Vec<&str> = markdown.lines().collect();
    let mut shown = Vec::new();
    // Some(is_shell) inside a fence.
    let mut fence: Option<bool> = None;
    let mut vars = BTreeMap::new();
    let mut i = 0;
    while i < lines.len() {
        let first = i;
        let trimmed = lines[i].trim();
        i += 1;
        if let Some(info) = trimmed.strip_prefix("```") {
            fence = match fence {
                None => Some(SHELL_FENCES.contains(&info.split_whitespace().next().unwrap_or(""))),
                Some(_) => None,
            };
            vars.clear();
            continue;
        }
        if fence != Some(true) {
            continue;
        }
        let mut logical = trimmed.to_string();
        while logical.ends_with('\\') && i < lines.len() {
            logical.pop();
            logical = format!("{} {}", logical.trim_end(), lines[i].trim());
            i += 1;
        }
        let logical = logical.strip_prefix("$ ").unwrap_or(&logical);
        let text = strip_comment(logical);
        if let Some((name, value)) = assignment(&text) {
            vars.insert(name, value);
            continue;
        }
        let command = expand(&text, &vars);
        if command.split_whitespace().next().is_some_and(is_rekindle) {
            shown.push(Shown { line: first + 1, text, command });
        }
    }
    shown
}

fn is_rekindle(word: &str) -> bool {
    word == "rekindle" || ["target/release/rekindle", "target/debug/rekindle"].contains(&word.trim_start_matches("./"))
}

/// `line` without its shell comment (a `#` that starts a word outside quotes).
fn strip_comment(line: &str) -> String {
    let mut quote = None;
    let mut prev = ' ';
    for (at, c) in line.char_indices() {
        match (quote, c) {
            (None, '#') if prev.is_whitespace() => return line[..at].trim_end().to_string(),
            (None, '\'' | '"') => quote = Some(c),
            (Some(q), _) if c == q => quote = None,
            _ => {}
        }
        prev = c;
    }
    line.trim_end().to_string()
}

/// `NAME=value`, `NAME="value"` or `NAME='value'` alone on a line.
fn assignment(line: &str) -> Option<(String, String)> {
    let (name, value) = line.split_once('=')?;
    let is_name = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !is_name {
        return None;
    }
    for q in ['"', '\''] {
        if let Some(inner) = value.strip_prefix(q).and_then(|v| v.strip_suffix(q)) {
            return (!inner.contains(q)).then(|| (name.to_string(), inner.to_string()));
        }
    }
    (!value.contains(char::is_whitespace)).then(|| (name.to_string(), value.to_string()))
}

/// `$NAME` and `${NAME}` replaced by the block's values; other variables kept.
fn expand(text: &str, vars: &BTreeMap<String, String>) -> String {
    let mut out = text.to_string();
    // Longest names first, so that `$CC` is not read as `$C` and a `C`.
    let mut names: Vec<&String> = vars.keys().collect();
    names.sort_by_key(|n| std::cmp::Reverse(n.len()));
    for name in names {
        out = out.replace(&format!("${{{name}}}"), &vars[name]);
        let mut expanded = String::new();
        let mut rest = out.as_str();
        while let Some(at) = rest.find(&format!("${name}")) {
            let after = &rest[at + 1 + name.len()..];
            expanded.push_str(&rest[..at]);
            if after.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_') {
                expanded.push_str(&rest[at..at + 1 + name.len()]);
            } else {
                expanded.push_str(&vars[name]);
            }
            rest = after;
        }
        expanded.push_str(rest);
        out = expanded;
    }
    out
}

/// Moves every word that is an absolute path under `root/` (relative to the
/// scratch directory the commands run in).
fn confine_paths(command: &str) -> String {
    let mut out = String::new();
    let mut prev = ' ';
    for c in command.chars() {
        if c == '/' && prev.is_whitespace() {
            out.push_str("root");
        }
        out.push(c);
        prev = c;
    }
    out
}

/// `command` with every `word` that stands as whole words replaced by `by`;
/// `None` when there is none.
fn replace_word(command: &str, word: &str, by: &str) -> Option<String> {
    let mut out = String::new();
    let mut from = 0;
    while let Some(at) = command[from..].find(word).map(|at| at + from) {
        let end = at + word.len();
        let whole = command[..at].chars().last().is_none_or(char::is_whitespace)
            && command[end..].chars().next().is_none_or(char::is_whitespace);
        out.push_str(&command[from..at]);
        out.push_str(if whole { by } else { word });
        from = end;
    }
    out.push_str(&command[from..]);
    (out != command).then_some(out)
}

/// Replaces the value of `option` (`--bytes`, or `model.hidden=` of a
/// `--set`) in `command`; `None` when `command` has no such option.
fn override_value(command: &str, option: &str, value: &str) -> Option<String> {
    if option.starts_with("--") {
        let words: Vec<&str> = command.split(' ').collect();
        let at = words.iter().position(|w| *w == option)?;
        let target = words.iter().skip(at + 1).position(|w| !w.is_empty())? + at + 1;
        let mut words: Vec<String> = words.iter().map(|w| w.to_string()).collect();
        words[target] = value.to_string();
        return Some(words.join(" "));
    }
    let start = command.find(option)? + option.len();
    let len =
        command[start..].find(|c: char| c.is_whitespace() || c == '\'' || c == '"').unwrap_or(command.len() - start);
    Some(format!("{}{value}{}", &command[..start], &command[start + len..]))
}

/// What is left of a placeholder or of a shell construct that would not end.
fn leftover_placeholder(command: &str) -> Option<String> {
    let words: Vec<&str> = command.split_whitespace().collect();
    if command.contains(['<', '>', '…']) || words.contains(&"...") {
        return Some("a `<…>` or `...` placeholder".into());
    }
    if command.ends_with('&') {
        return Some("a command sent to the background".into());
    }
    let upper = words.iter().find(|w| {
        let w = w.trim_matches(|c: char| !c.is_ascii_alphanumeric());
        w.len() > 1 && w.chars().all(|c| c.is_ascii_uppercase() || c == '_')
    })?;
    Some(format!("the placeholder `{upper}`"))
}

/// The documents whose commands run: README.md and docs/*.md.
fn documents() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut docs: Vec<PathBuf> = fs::read_dir(root.join("docs"))
        .expect("list docs/")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    docs.insert(0, root.join("README.md"));
    docs
}

/// A fresh scratch directory for one document's commands.
fn scratch() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("scratch dir");
    let configs = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs");
    fs::create_dir(dir.path().join("configs")).unwrap();
    for entry in fs::read_dir(&configs).expect("list configs/") {
        let path = entry.expect("dir entry").path();
        if path.is_file() {
            fs::copy(&path, dir.path().join("configs").join(path.file_name().unwrap())).expect("copy a config");
        }
    }
    let gpu = r#"{"vendor": "nvidia", "name": "H100", "memory_total_mib": 81559, "memory_free_mib": 80000}"#;
    fs::write(dir.path().join("inventory-2xH100.json"), format!("{{\"devices\": [{gpu}, {gpu}]}}\n")).unwrap();
    dir
}

/// Writes `my-L{line}.toml`: configs/tiny.toml with a run of its own.
fn write_my_config(dir: &Path, line: usize) {
    let tiny = fs::read_to_string(dir.join("configs/tiny.toml")).unwrap();
    let mine = tiny.replacen("name = \"tiny\"", &format!("name = \"my-L{line}\""), 1);
    assert_ne!(mine, tiny, "configs/tiny.toml no longer sets `name = \"tiny\"`");
    fs::write(dir.join(format!("my-L{line}.toml")), mine).unwrap();
}

/// Runs `command` through `sh` in `dir`: (exit code, stderr), or why it has none.
fn run_in(dir: &Path, logs: &Path, n: usize, command: &str) -> (Option<i32>, String) {
    let (out, err) = (logs.join(format!("{n}.out")), logs.join(format!("{n}.err")));
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(command).current_dir(dir);
    let status = run_as_user(cmd, &out, &err, TIMEOUT);
    let stderr = fs::read_to_string(&err).unwrap_or_default();
    match status {
        Some(status) => (status.code(), stderr),
        None => (None, format!("{stderr}\n(killed after {TIMEOUT:?})")),
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].iter().map(|l| format!("      {l}\n")).collect()
}

fn describe(code: Option<i32>) -> String {
    match code {
        Some(c) => format!("{c} ({:?})", u8::try_from(c).map(Outcome::from_code).unwrap_or(Outcome::Failure)),
        None => "none (killed)".into(),
    }
}

/// What to do with one documented command.
enum Plan {
    NotRun(&'static str),
    /// Cannot run as it stands: why.
    Broken(String),
    Run {
        /// What `sh` runs, the binary still named as shown.
        command: String,
        /// Each substitution and override made, with its reason.
        notes: Vec<String>,
        expected: Outcome,
    },
}

/// The plan for `shown` of `file`; `used` collects the table entries applied.
fn plan(file: &str, shown: &Shown, used: &mut BTreeSet<String>) -> Plan {
    if let Some(n) = NOT_RUN.iter().find(|n| n.file == file && shown.command.contains(n.needle)) {
        used.insert(format!("NOT_RUN {}: {}", n.file, n.needle));
        return Plan::NotRun(n.why);
    }
    let line = shown.line.to_string();
    let mut command = confine_paths(&shown.command);
    let mut notes = Vec::new();
    for p in PLACEHOLDERS {
        if let Some(c) = replace_word(&command, p.word, &p.by.replace("{line}", &line)) {
            used.insert(format!("PLACEHOLDERS {}", p.word));
            notes.push(format!("{} stands for {}", p.word, p.why.replace("{line}", &line)));
            command = c;
        }
    }
    for o in OVERRIDES {
        if o.file != file || !command.contains(o.needle) {
            continue;
        }
        used.insert(format!("OVERRIDES {}: {}", o.file, o.needle));
        for (option, value) in o.values {
            match override_value(&command, option, value) {
                Some(c) => command = c,
                None => return Plan::Broken(format!("has no `{option}` for its override ({})", o.why)),
            }
        }
        notes.push(format!("overridden: {}", o.why));
    }
    if let Some(what) = leftover_placeholder(&command) {
        return Plan::Broken(format!(
            "still holds {what}: substitute it (PLACEHOLDERS) or say why it is not run (NOT_RUN)"
        ));
    }
    let mut expected = Outcome::Done;
    if let Some(e) = EXPECTED.iter().find(|e| command.contains(e.needle)) {
        used.insert(format!("EXPECTED {}", e.needle));
        notes.push(format!("expected {} ({:?}): {}", e.outcome.code(), e.outcome, e.why));
        expected = e.outcome;
    }
    Plan::Run { command, notes, expected }
}

/// Every entry of the tables, named as [`plan`] names the ones it applies.
fn table_entries() -> BTreeSet<String> {
    let not_run = NOT_RUN.iter().map(|n| format!("NOT_RUN {}: {}", n.file, n.needle));
    let placeholders = PLACEHOLDERS.iter().map(|p| format!("PLACEHOLDERS {}", p.word));
    let overrides = OVERRIDES.iter().map(|o| format!("OVERRIDES {}: {}", o.file, o.needle));
    let expected = EXPECTED.iter().map(|e| format!("EXPECTED {}", e.needle));
    not_run.chain(placeholders).chain(overrides).chain(expected).collect()
}

#[test]
fn every_documented_command_exits_as_documented() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let logs = tempfile::tempdir().expect("log dir");
    let mut failures = Vec::new();
    let mut used = BTreeSet::new();
    let (mut ran, mut not_run) = (0, 0);
    let t0 = Instant::now();
    for doc in documents() {
        let file = doc.strip_prefix(root).unwrap().display().to_string();
        let markdown = fs::read_to_string(&doc).unwrap_or_else(|e| panic!("{file}: {e}"));
        let dir = scratch();
        for shown in shown_commands(&markdown) {
            let place = format!("{file}:{}: {}", shown.line, shown.text);
            let (command, notes, expected) = match plan(&file, &shown, &mut used) {
                Plan::NotRun(why) => {
                    not_run += 1;
                    eprintln!("{place}\n    not run: {why}");
                    continue;
                }
                Plan::Broken(why) => {
                    failures.push(format!("{place}\n    {why}"));
                    continue;
                }
                Plan::Run { command, notes, expected } => (command, notes, expected),
            };
            if command.contains(&format!("my-L{}.toml", shown.line)) {
                write_my_config(dir.path(), shown.line);
            }
            let (program, args) = command.split_once(' ').unwrap_or((&command, ""));
            assert!(is_rekindle(program), "{place}: not a rekindle command after rewriting: {command}");
            let started = Instant::now();
            let (code, stderr) = run_in(dir.path(), logs.path(), ran, &format!("'{}' {args}", exe()));
            ran += 1;
            let notes: String = notes.iter().map(|n| format!("\n    {n}")).collect();
            let ran_as = format!("{place}\n    ran: rekindle {args}{notes}\n    exit {}", describe(code));
            eprintln!("{ran_as} in {:.1?}", started.elapsed());
            if code != Some(i32::from(expected.code())) {
                failures.push(format!(
                    "{ran_as}, expected {} ({expected:?})\n    stderr (end):\n{}",
                    expected.code(),
                    tail(&stderr, 15)
                ));
            }
        }
    }
    for entry in table_entries().difference(&used) {
        failures.push(format!("{entry}: no documented command matches it any more; remove the entry"));
    }
    eprintln!("{ran} documented commands run, {not_run} not run, in {:.1?}", t0.elapsed());
    // If extraction broke, commands would silently go missing.
    assert!(ran >= 20, "only {ran} documented commands ran: is the extraction broken?");
    assert!(
        failures.is_empty(),
        "{} documented command(s) do not work as documented:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

#[test]
fn extraction_takes_rekindle_lines_of_shell_blocks_only() {
    let markdown = "\
Text: `rekindle run --config inline.toml` is not a block.

```sh
make demo
rekindle run --config a.toml \\
  --set run.max_steps=5   # a comment, # and more
$ rekindle verify runs/a
target/release/rekindle bench interval --stall '5s # not a comment'
sbatch slurm/orchestrator.slurm configs/tiny.toml    # or: rekindle run ...
```

```python
rekindle = 1
```

```
C=\"-q run --config c.toml \\
   --set x=1\"
R=./target/debug/rekindle
rekindle $C --run-dir /tmp/c
$R status ${CC}
```
";
    let shown = shown_commands(markdown);
    let got: Vec<(usize, &str, &str)> = shown.iter().map(|s| (s.line, s.text.as_str(), s.command.as_str())).collect();
    assert_eq!(
        got,
        [
            (
                5,
                "rekindle run --config a.toml --set run.max_steps=5",
                "rekindle run --config a.toml --set run.max_steps=5"
            ),
            (7, "rekindle verify runs/a", "rekindle verify runs/a"),
            (
                8,
                "target/release/rekindle bench interval --stall '5s # not a comment'",
                "target/release/rekindle bench interval --stall '5s # not a comment'"
            ),
            (20, "rekindle $C --run-dir /tmp/c", "rekindle -q run --config c.toml --set x=1 --run-dir /tmp/c"),
            (21, "$R status ${CC}", "./target/debug/rekindle status ${CC}"),
        ]
    );
}

#[test]
fn rewriting_confines_paths_and_overrides_only_the_named_values() {
    assert_eq!(confine_paths("rekindle verify /work/x --dir=/y a/b"), "rekindle verify root/work/x --dir=/y a/b");
    let c = "rekindle bench checkpoint --bytes 4GiB   --dir d --set 'model.hidden=[1,2]' --set run.max_steps=9";
    let c = override_value(c, "--bytes", "1MiB").unwrap();
    let c = override_value(&c, "model.hidden=", "[64]").unwrap();
    assert_eq!(c, "rekindle bench checkpoint --bytes 1MiB   --dir d --set 'model.hidden=[64]' --set run.max_steps=9");
    assert_eq!(override_value(&c, "--steps", "3"), None);
    assert_eq!(
        replace_word("rekindle gpus --config my.toml", "my.toml", "a.toml").unwrap(),
        "rekindle gpus --config a.toml"
    );
    assert_eq!(replace_word("rekindle run --config army.toml", "my.toml", "a.toml"), None);
    assert_eq!(leftover_placeholder("rekindle seal DIR --step 3").as_deref(), Some("the placeholder `DIR`"));
    assert!(leftover_placeholder("rekindle run ... --set a=1").is_some());
    assert!(leftover_placeholder("rekindle status <job>").is_some());
    assert_eq!(leftover_placeholder("rekindle run --config configs/tiny.toml -q"), None);
}
