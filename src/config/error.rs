//! Config errors: a file that cannot be read, or a list of every problem
//! found in it, each tied to a key and a place (line and column, or the
//! `--set` override it came from).

use std::path::PathBuf;

use serde::Serialize;

/// Why a config could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file is missing or unreadable: names the file, the OS's
    /// reason and what to do.
    #[error("cannot read config file {}: {source}; {}", path.display(), read_hint(source))]
    Read {
        /// The path as given.
        path: PathBuf,
        source: std::io::Error,
    },
    /// The config was read but has problems: syntax, unknown keys, wrong
    /// types, or values outside what is allowed. Lists all of them.
    #[error("{}", render_problems(source_name, problems))]
    Invalid {
        /// The file name (or the name given to [`from_str`](super::from_str)).
        source_name: String,
        /// Every problem found, in file order, `--set` overrides last.
        problems: Vec<Problem>,
    },
}

impl ConfigError {
    /// The problems of an [`ConfigError::Invalid`] error; empty for a read error.
    pub fn problems(&self) -> &[Problem] {
        match self {
            ConfigError::Read { .. } => &[],
            ConfigError::Invalid { problems, .. } => problems,
        }
    }
}

/// What to do about a config file that cannot be read.
fn read_hint(source: &std::io::Error) -> &'static str {
    match source.kind() {
        std::io::ErrorKind::NotFound => {
            "check the path (a relative one is taken from the current directory); configs/example.toml shows every key"
        }
        std::io::ErrorKind::PermissionDenied => "check the file's permissions and those of its directories",
        std::io::ErrorKind::IsADirectory => "pass the TOML file, not a directory",
        std::io::ErrorKind::InvalidData => "a config is a UTF-8 TOML file of at most 16 MiB",
        _ => "check that the file exists and is a readable TOML file",
    }
}

/// One thing wrong with a config.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// Dotted key path (`checkpoint.keep`), the section name for a problem
    /// with a whole section, or empty for a syntax error or a malformed
    /// `--set`.
    pub key: String,
    /// 1-based line in the config file, when the problem has a place there.
    pub line: Option<usize>,
    /// 1-based column (in characters) in the config file.
    pub column: Option<usize>,
    /// The value came from a `--set` override rather than the file.
    pub from_set: bool,
    /// What is wrong and what is allowed.
    pub message: String,
}

impl Problem {
    /// A problem with no place yet; the loader fills in line and column.
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        Problem { key: key.into(), line: None, column: None, from_set: false, message: message.into() }
    }

    /// The problem as one line, prefixed by its place in `source_name`:
    /// `configs/x.toml:12:1: checkpoint.keep: must be at least 1`.
    pub fn render(&self, source_name: &str) -> String {
        let place = match (self.from_set, self.line, self.column) {
            (true, _, _) => "from --set".to_string(),
            (false, Some(line), Some(column)) => format!("{source_name}:{line}:{column}"),
            (false, Some(line), None) => format!("{source_name}:{line}"),
            (false, None, _) => source_name.to_string(),
        };
        if self.key.is_empty() {
            format!("{place}: {}", self.message)
        } else {
            format!("{place}: {}: {}", self.key, self.message)
        }
    }
}

fn render_problems(source_name: &str, problems: &[Problem]) -> String {
    let count = problems.len();
    let noun = if count == 1 { "problem" } else { "problems" };
    let mut lines = vec![format!("config file {source_name} has {count} {noun}:")];
    lines.extend(problems.iter().map(|p| format!("  {}", p.render(source_name))));
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_error_lists_each_problem_under_a_counted_header() {
        let mut located = Problem::new("checkpoint.keep", "must be at least 1 (got 0)");
        located.line = Some(12);
        located.column = Some(1);
        let mut set = Problem::new("run.max_steps", "must be at least 1 (got 0)");
        set.from_set = true;
        let err = ConfigError::Invalid { source_name: "configs/x.toml".into(), problems: vec![located, set] };
        assert_eq!(
            err.to_string(),
            "config file configs/x.toml has 2 problems:\n  \
             configs/x.toml:12:1: checkpoint.keep: must be at least 1 (got 0)\n  \
             from --set: run.max_steps: must be at least 1 (got 0)"
        );
    }

    #[test]
    fn single_problem_header_is_singular() {
        let err =
            ConfigError::Invalid { source_name: "a.toml".into(), problems: vec![Problem::new("", "syntax error")] };
        assert!(err.to_string().starts_with("config file a.toml has 1 problem:\n"));
    }

    #[test]
    fn read_error_names_the_path_the_os_reason_and_what_to_do() {
        let source = std::fs::read_to_string("configs/missing.toml").unwrap_err();
        let reason = source.to_string();
        let err = ConfigError::Read { path: "configs/missing.toml".into(), source };
        let message = err.to_string();
        assert!(message.starts_with("cannot read config file configs/missing.toml: "), "{message}");
        assert!(message.contains(&reason) && reason.contains("No such file or directory"), "{message}");
        assert!(message.contains("check the path"), "{message}");
        assert!(std::error::Error::source(&err).is_some());
    }
}
