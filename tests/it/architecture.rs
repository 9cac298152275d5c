//! The import rules of docs/architecture.md, checked on the source: a
//! module that imports what it must not fails here with the file and the
//! line, so the layers cannot rot one convenient `use` at a time.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// `(module, modules it must never import, why)`.
const RULES: &[(&str, &[&str], &str)] = &[
    ("run", &["exec", "cli"], "the two drivers share only `attempt`"),
    ("exec", &["run", "cli", "train"], "the two drivers share only `attempt`; exec trains nothing itself"),
    ("attempt", &["run", "exec", "cli", "report"], "what both drivers share imports neither"),
    ("rundir", &["attempt", "run", "exec", "cli", "report", "train"], "the report and status read it alone"),
    ("checkpoint", &["attempt", "run", "exec", "rundir", "cli", "report"], "the checkpointer knows no attempt"),
    ("report", &["attempt", "run", "exec", "cli"], "the report reads the run directory, never a driver"),
    ("train", &["attempt", "run", "exec", "rundir", "cli", "report"], "training knows no lifecycle"),
    ("telemetry", &["attempt", "run", "exec", "rundir", "cli", "report", "train"], "records are plain types"),
    ("config", &["attempt", "run", "exec", "rundir", "cli", "report", "checkpoint"], "the config is read first"),
    ("slurm", &["attempt", "run", "exec", "rundir", "cli"], "SLURM's facts and decisions are pure"),
    ("gpu", &["attempt", "run", "exec", "rundir", "cli"], "detection and placement only decide"),
    ("publish", &["attempt", "run", "exec", "rundir", "cli"], "publishing is handed what to publish"),
    ("distributed", &["attempt", "run", "exec", "rundir", "cli"], "collectives know no lifecycle"),
    (
        "health",
        &["attempt", "run", "exec", "rundir", "cli", "report"],
        "node checks and blame decide; the attempt acts",
    ),
    ("bench", &["run", "exec", "cli"], "benchmarks measure parts, not the drivers"),
];

/// The top-level module a source file belongs to (`src/run/start.rs` → `run`).
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel.components().next().unwrap().as_os_str().to_string_lossy().to_string();
    first.trim_end_matches(".rs").to_string()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every source file of the application (`src/`) and of the library crates
/// beside it (`crates/<name>/src/`), by the name the tables below use: its
/// path under `src/` (`rundir/status.rs`), or under its crate's `src/` after
/// the crate's folder name (`checkpoint/store.rs`, `confine/lib.rs`).
fn sources() -> Vec<(String, PathBuf)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut roots = vec![(String::new(), root.join("src"))];
    for entry in std::fs::read_dir(root.join("crates")).unwrap() {
        let dir = entry.unwrap().path();
        roots.push((format!("{}/", dir.file_name().unwrap().to_string_lossy()), dir.join("src")));
    }
    let mut out = Vec::new();
    for (prefix, src) in roots {
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        for file in files {
            let rel = file.strip_prefix(&src).unwrap().to_string_lossy().to_string();
            out.push((format!("{prefix}{rel}"), file));
        }
    }
    out.sort();
    out
}

/// The file of a table's name ([`sources`]).
fn source(name: &str) -> PathBuf {
    sources().into_iter().find(|(n, _)| n == name).map(|(_, p)| p).unwrap_or_else(|| panic!("no source file {name}"))
}

/// The code of a line: what comes before a `//` comment.
fn code(line: &str) -> &str {
    line.split("//").next().unwrap_or("")
}

/// The top-level modules a line of code names through `crate::`, also in
/// groups, nested ones included (`use crate::{a, b::{c, d}}` names `a` and
/// `b`); comments are not code.
fn crate_modules(line: &str) -> Vec<String> {
    let ident = |s: &str| -> String { s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect() };
    let code = code(line);
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        let Some(group) = rest.strip_prefix('{') else {
            found.push(ident(rest));
            continue;
        };
        // The items of the group at its own depth: the first name of each.
        let (mut depth, mut start) = (0usize, 0usize);
        for (at, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    found.push(ident(group[start..at].trim()));
                    break;
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    found.push(ident(group[start..at].trim()));
                    start = at + 1;
                }
                _ => {}
            }
        }
    }
    found.retain(|name| !name.is_empty());
    found
}

/// The modules a file's text names through `crate::`, with the line of each.
/// A `use crate::{` group may span lines: each group (of code, comments
/// dropped) is joined until its braces balance.
fn text_imports(text: &str) -> Vec<(String, usize)> {
    let mut found = Vec::new();
    let mut pending: Option<(String, usize)> = None;
    for (n, line) in text.lines().enumerate() {
        let (joined, at) = match pending.take() {
            Some((mut acc, at)) => {
                acc.push_str(code(line).trim());
                (acc, at)
            }
            None => (code(line).to_string(), n + 1),
        };
        let open = |s: &str| s.matches('{').count() > s.matches('}').count();
        if joined.find("crate::{").is_some_and(|i| open(&joined[i..])) {
            pending = Some((joined, at));
            continue;
        }
        found.extend(crate_modules(&joined).into_iter().map(|m| (m, at)));
    }
    found
}

/// Every `crate::` import of every file under `src/`, by importing module:
/// `(imported module, file, line number)`.
fn imports() -> BTreeMap<String, Vec<(String, PathBuf, usize)>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut by_module: BTreeMap<String, Vec<(String, PathBuf, usize)>> = BTreeMap::new();
    for file in files {
        let module = module_of(&src, &file);
        let text = std::fs::read_to_string(&file).unwrap();
        for (imported, line) in text_imports(&text) {
            by_module.entry(module.clone()).or_default().push((imported, file.clone(), line));
        }
    }
    by_module
}

#[test]
fn modules_import_only_what_docs_architecture_allows() {
    let imports = imports();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    for module in RULES.iter().map(|r| r.0) {
        let exists = src.join(module).is_dir() || src.join(format!("{module}.rs")).is_file();
        assert!(exists, "a rule for `{module}`, which is gone: update RULES and docs/architecture.md");
    }
    let mut broken = Vec::new();
    for (module, forbidden, why) in RULES {
        for (imported, file, line) in imports.get(*module).into_iter().flatten() {
            if forbidden.contains(&imported.as_str()) {
                broken.push(format!("{}:{line}: `{module}` imports `{imported}` ({why})", file.display()));
            }
        }
    }
    assert!(broken.is_empty(), "imports against docs/architecture.md:\n{}", broken.join("\n"));
}

#[test]
fn the_checker_sees_imports_in_every_form() {
    assert_eq!(crate_modules("use crate::run::ending::Ending;"), ["run"]);
    assert_eq!(crate_modules("use crate::{exec, rundir::status};"), ["exec", "rundir"]);
    assert_eq!(crate_modules("use crate::{exec::{A, B}, run::C};"), ["exec", "run"]);
    assert_eq!(crate_modules("use crate::{attempt::ending::{self, X}, rundir};"), ["attempt", "rundir"]);
    assert_eq!(crate_modules("    let x = crate::attempt::records::context(&s); // crate::cli"), ["attempt"]);
    assert!(crate_modules("// use crate::run;").is_empty());
    // rustfmt's layout of a long group, with a comment that names a group.
    let text = "use crate::{\n    // crate::{cli} is not code\n    exec::{A, B},\n    run::C,\n};\nuse crate::units;\n";
    assert_eq!(text_imports(text), [("exec".to_string(), 1), ("run".to_string(), 1), ("units".to_string(), 6)]);
    // And the real tree: the drivers import what they share.
    let imports = imports();
    assert!(imports["run"].iter().any(|(m, _, _)| m == "attempt"));
    assert!(imports["exec"].iter().any(|(m, _, _)| m == "attempt"));
}

/// The raw path APIs of `std::fs` (open, create, read, write, rename,
/// remove, list, make a directory), per source file, outside its tests:
/// where each file may reach the filesystem by path, and why that is safe
/// there. Anything that reads from a run directory or a node-local root,
/// or writes into one, goes through `crate::confine` (bounded, no-follow,
/// non-blocking readers; claimed directories; `replaceable_file`) or the
/// local tier's `checkpoint::private` (docs/run-directory.md, "Trust
/// boundaries"). A new call site fails here until it is justified: a file
/// not listed, or more calls than its count, is a new door in the boundary;
/// fewer calls than its count, a count to lower so the ratchet stays tight.
const RAW_PATH_CALLS: &[(&str, usize, &str)] = &[
    ("attempt/rank_watch.rs", 2, "making <run>/ranks (and its fallback local folder) before both are held as handles"),
    ("bench/checkpoint.rs", 6, "the benchmark's scratch files in a directory the person names"),
    ("bench/train.rs", 1, "the benchmark's scratch run directory"),
    ("checkpoint/layout.rs", 1, "listing the claimed checkpoint directory"),
    ("checkpoint/private.rs", 4, "the node-local root's own checks and making"),
    ("cli/inspect.rs", 1, "the checkpoints of a path the person names, read-only"),
    ("confine/lib.rs", 6, "the bounded, no-follow openers and claimed directories themselves"),
    ("confine/dir.rs", 1, "making a directory a person named (TensorBoard) before it is opened as a handle"),
    ("gpu/inventory.rs", 1, "a GPU inventory file the person names"),
    ("health/command.rs", 3, "the site command's own scratch"),
    ("health/storage.rs", 1, "the storage probe's temporary sibling of the checkpoint directory"),
    ("rundir/lock/liveness.rs", 2, "the lock's heartbeat, rekindle's own file"),
    ("rundir/sweep.rs", 1, "listing a directory the person names"),
    ("telemetry/release_fixture.rs", 1, "the repository's testdata fixtures"),
    ("train/data.rs", 1, "the training data the config names"),
    ("train/validate.rs", 1, "the data file `data validate` is given"),
];

/// The raw path API calls of one line of code.
fn raw_path_calls(line: &str) -> usize {
    const CALLS: &[&str] = &[
        "fs::read(",
        "fs::read_to_string(",
        "File::open(",
        "OpenOptions::new(",
        "File::create(",
        "fs::write(",
        "fs::remove_file(",
        "fs::remove_dir_all(",
        "fs::rename(",
        "fs::read_dir(",
        "fs::copy(",
        "fs::hard_link(",
        "fs::create_dir_all(",
        "fs::create_dir(",
        "DirBuilder::new(",
    ];
    let code = code(line);
    CALLS.iter().map(|c| code.matches(c).count()).sum()
}

/// Per source file (its name in [`sources`]), its raw path API calls before its
/// tests (`#[cfg(test)]`, which by convention end a file; test-only files
/// are left out).
fn raw_path_counts() -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for (rel, file) in sources() {
        let name = file.file_name().unwrap().to_string_lossy().to_string();
        if name == "tests.rs" || name.ends_with("_tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        // Up to the unit tests' `mod`, as the handle-only check reads: a
        // `#[cfg(test)]` helper in the middle of a file does not hide the
        // code after it.
        let n: usize = code_before_tests(&text).into_iter().map(|(_, l)| raw_path_calls(l)).sum();
        if n > 0 {
            counts.insert(rel, n);
        }
    }
    counts
}

#[test]
fn raw_path_apis_are_used_only_where_the_boundary_table_says_why() {
    let counts = raw_path_counts();
    let allowed: BTreeMap<&str, usize> = RAW_PATH_CALLS.iter().map(|(f, n, _)| (*f, *n)).collect();
    let mut wrong = Vec::new();
    for (file, n) in &counts {
        match allowed.get(file.as_str()) {
            None => wrong.push(format!(
                "{file}: {n} raw path call(s) in a file not in RAW_PATH_CALLS: open run-directory files \
                 through crate::confine (docs/run-directory.md, Trust boundaries), or add the file with why \
                 raw paths are safe there"
            )),
            Some(max) if n > max => wrong.push(format!(
                "{file}: {n} raw path calls, {max} allowed: a new one opens a door in the boundary; use \
                 crate::confine, or raise the count with why"
            )),
            Some(max) if n < max => {
                wrong.push(format!("{file}: {n} raw path calls, {max} allowed: lower its count in RAW_PATH_CALLS"))
            }
            Some(_) => {}
        }
    }
    for (file, _, _) in RAW_PATH_CALLS {
        if !counts.contains_key(*file) {
            wrong.push(format!("{file} has no raw path call (or is gone): remove it from RAW_PATH_CALLS"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_raw_path_checker_counts_calls_in_code_not_in_comments() {
    assert_eq!(raw_path_calls("let x = std::fs::read(&p)?; let y = fs::read_to_string(q);"), 2);
    assert_eq!(raw_path_calls("    // std::fs::read(&p) is not code"), 0);
    assert_eq!(raw_path_calls("let f = std::fs::OpenOptions::new().write(true).open(p)?;"), 1);
    assert_eq!(raw_path_calls("crate::confine::read_bounded(&p, LIMIT)"), 0);
}

/// Modules that reach the filesystem only through a directory handle
/// (`crate::confine::Dir`: opened once, everything below it resolved with
/// `openat2` RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS): in their code (before
/// their `mod tests`) any path API is refused outright, not counted — no
/// `std::fs` path call, no `File::open`/`create`/`options`, no
/// `OpenOptions`, no `Path::exists`, no path-taking `confine` opener. The
/// one door is `Dir::open` of a directory already claimed (docs/run-directory.md,
/// "Trust boundaries"). A new reader or writer in these modules takes the
/// handle it is given.
const HANDLE_ONLY: &[&str] = &[
    "checkpoint/encode.rs",
    "checkpoint/files.rs",
    "checkpoint/hashed_io.rs",
    "checkpoint/quarantine.rs",
    "checkpoint/store.rs",
    "checkpoint/verify.rs",
    "checkpoint/world.rs",
    "checkpoint/write_mode.rs",
    "confine/atomic.rs",
    "exec/child.rs",
    "gpu/monitor.rs",
    "publish/files.rs",
    "publish/worktree.rs",
    "rundir/lock/mod.rs",
    "telemetry/events.rs",
    "telemetry/prometheus.rs",
    "telemetry/tensorboard/files.rs",
];

/// What a handle-only module may not name: every way to open, make, list,
/// rename, remove or look up a file by path. (`Path::is_dir`/`is_file` read
/// the same as the handle's `Kind` and `Metadata` checks and are not told
/// apart here; they only look, and what they look at is never opened.)
const PATH_APIS: &[&str] = &[
    "fs::read",
    "fs::write(",
    "fs::remove",
    "fs::rename(",
    "fs::copy(",
    "fs::hard_link(",
    "fs::create_dir",
    "fs::metadata(",
    "fs::symlink_metadata(",
    "fs::canonicalize(",
    "fs::set_permissions(",
    "fs::read_link(",
    "fs::symlink(",
    "fs::DirBuilder",
    "File::open(",
    "File::create(",
    "File::options(",
    "File::create_new(",
    "OpenOptions",
    ".exists()",
    ".try_exists(",
    "statvfs(",
    "tempfile_in(",
    "tempdir_in(",
    "confine::open_regular(",
    "confine::open_append(",
    "confine::read_bounded",
    "confine::read_named_bounded(",
    "confine::own_dir(",
    "fcntl::open(",
    "fcntl::openat(",
    "libc::open",
];

/// The path APIs a line of code names.
fn path_apis(line: &str) -> Vec<&'static str> {
    let code = code(line);
    PATH_APIS.iter().copied().filter(|api| code.contains(api)).collect()
}

/// The code of a source file before its unit tests: up to the
/// `#[cfg(test)]` that opens a `mod` (a `#[cfg(test)]` helper function in
/// the middle of a file does not end its code).
fn code_before_tests(text: &str) -> Vec<(usize, &str)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if line.trim_start().starts_with("#[cfg(test)]")
            && lines[i + 1..].iter().find(|l| !l.trim().is_empty()).is_some_and(|l| {
                let l = l.trim_start();
                let l = ["pub(crate) ", "pub(super) ", "pub "].iter().find_map(|p| l.strip_prefix(p)).unwrap_or(l);
                // `mod tests;` names a file of its own: the code goes on.
                l.starts_with("mod ") && !l.trim_end().ends_with(';')
            })
        {
            break;
        }
        out.push((i + 1, *line));
    }
    out
}

#[test]
fn handle_only_modules_open_nothing_by_path() {
    let mut wrong = Vec::new();
    for file in HANDLE_ONLY {
        let text = std::fs::read_to_string(source(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        for (n, line) in code_before_tests(&text) {
            for api in path_apis(line) {
                wrong.push(format!(
                    "{file}:{n}: `{api}` in a handle-only module: reach files through the crate::confine::Dir \
                     this module is given (docs/run-directory.md, Trust boundaries), never by path"
                ));
            }
        }
        assert!(!RAW_PATH_CALLS.iter().any(|(f, _, _)| f == file), "{file} is handle-only: no RAW_PATH_CALLS row");
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_handle_only_checker_sees_path_apis_and_test_helpers_do_not_end_the_code() {
    assert_eq!(path_apis("let f = std::fs::File::open(&p)?;"), ["File::open("]);
    assert_eq!(path_apis("if staging.exists() && std::fs::remove_dir_all(&s).is_ok() {"), ["fs::remove", ".exists()"]);
    assert_eq!(path_apis("let m = fs::symlink_metadata(&p)?;"), ["fs::symlink_metadata("]);
    assert_eq!(path_apis("crate::confine::read_bounded(&p, LIMIT)"), ["confine::read_bounded"]);
    assert!(path_apis("root.rename(&from, &to)?; root.exists(&name); dir.read_bounded(\"f\", 10)").is_empty());
    assert!(path_apis("    // std::fs::read(&p) is not code").is_empty());
    let text = "fn a() {}\n#[cfg(test)]\npub fn helper() {}\nfn b() { std::fs::read(p); }\n#[cfg(test)]\nmod tests {\n fn t() { std::fs::read(p); }\n}\n";
    let code: Vec<usize> = code_before_tests(text).into_iter().map(|(n, _)| n).collect();
    assert_eq!(code, [1, 2, 3, 4], "a #[cfg(test)] helper does not end the code; `mod tests` does");
    let text = "fn a() {}\n#[cfg(test)]\npub(super) mod tests {\n}\n";
    assert_eq!(code_before_tests(text).len(), 1, "nor does a `pub(super) mod tests`");
    let text = "fn a() {}\n#[cfg(test)]\npub(crate) mod tests_support {\n}\n";
    assert_eq!(code_before_tests(text).len(), 1, "nor does a `pub(crate) mod`");
}

/// The steps of an attempt's opening (attempt/opening.rs), which the
/// drivers reach only through its stages: `(call, what the driver uses instead)`.
const OPENING_STEPS: &[(&str, &str)] = &[
    ("rundir::claim(", "opening::claim"),
    ("refuse_other_command(", "opening::claim"),
    ("RunLock::acquire(", "Claimed::hold"),
    ("rundir::prepare(", "Claimed::hold"),
    ("CheckpointStore::open(", "Held::store, opened by Claimed::hold"),
    ("EventLog::open(dir.path(EVENTS_FILE)", "Held::open_records"),
    ("takeover_event(", "Held::open_records"),
    ("early_stop(", "Held::settle or opening::stopped"),
    ("exports::start(", "Held::begin"),
];

/// `rekindle seal` is a command of its own, not an attempt: it commits a
/// checkpoint under the lock the attempt's `exec` holds, or takes it itself.
const OPENING_EXEMPT: &[&str] = &["exec/seal.rs"];

#[test]
fn both_drivers_open_an_attempt_through_one_skeleton() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src.join("run"), &mut files);
    rust_files(&src.join("exec"), &mut files);
    let mut broken = Vec::new();
    let mut uses = BTreeMap::<&str, usize>::new();
    for file in &files {
        let rel = file.strip_prefix(&src).unwrap().to_string_lossy().to_string();
        let text = std::fs::read_to_string(file).unwrap();
        let body = text.split("#[cfg(test)]").next().unwrap_or("");
        for (n, line) in body.lines().enumerate() {
            let code = code(line);
            for stage in ["opening::claim(", ".hold(", ".open_records(", ".settle(", ".begin("] {
                if code.contains(stage) {
                    *uses.entry(if rel.starts_with("run/") { "run" } else { "exec" }).or_default() += 1;
                }
            }
            if OPENING_EXEMPT.contains(&rel.as_str()) {
                continue;
            }
            for (call, instead) in OPENING_STEPS {
                if code.contains(call) {
                    broken.push(format!("src/{rel}:{}: `{call}…` is a step of the opening: use {instead}", n + 1));
                }
            }
        }
    }
    assert!(broken.is_empty(), "a driver opens its attempt by hand (attempt/opening.rs):\n{}", broken.join("\n"));
    // Each driver goes through the five stages (claim, hold, records, settle, begin).
    for driver in ["run", "exec"] {
        assert!(uses.get(driver).copied().unwrap_or(0) >= 5, "`{driver}` does not open through the skeleton: {uses:?}");
    }
}
