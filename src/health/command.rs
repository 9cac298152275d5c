//! The site's own check (`[health] command`): `sh -c COMMAND` in a process
//! group of its own, with the environment a site check needs
//! ([`site_env`]: not the user's secrets, unless `[health] inherit_env`),
//! ended after `[health] timeout` or at once on a stop, its output (stdout
//! and stderr together) kept to the last [`OUTPUT_LIMIT`] bytes so that a
//! chatty script cannot flood the records, and redacted (the command line
//! too) before anything records it.
//!
//! When it ends, for any reason, nothing it started runs on: its process
//! group is killed, and so is every process descended from it, found by
//! walking /proc's parent links. A `setsid` child leaves the group, and
//! when its parent dies it would leave the tree too (adopted by init):
//! rekindle is a child subreaper (`PR_SET_CHILD_SUBREAPER`) while the
//! command runs, so such orphans are adopted by rekindle instead, found
//! among its new children (those whose environment holds this check's
//! mark, [`MARK_VAR`]: a process that clears its environment is missed),
//! killed and reaped.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill, killpg};
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::Pid;

use crate::telemetry::Redactor;

/// The most output kept (its tail).
pub const OUTPUT_LIMIT: u64 = 2048;

/// How the site command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommandEnd {
    /// It exited with this code.
    Exited(i32),
    /// A signal ended it.
    Signalled(i32),
    /// It ran past the timeout and was killed.
    TimedOut,
    /// A stop (SIGTERM…) came while it ran: it was killed, and says nothing
    /// about the node.
    Stopped,
    /// It could not be started.
    NotStarted(String),
}

/// What the site command did.
#[derive(Debug, Clone, PartialEq)]
pub struct CommandRun {
    pub end: CommandEnd,
    /// The tail of its output, redacted, its lines trimmed and joined by ` | `.
    pub output: String,
    pub seconds: f64,
}

impl CommandRun {
    /// Exit 0: the node is healthy by the site's measure.
    pub fn healthy(&self) -> bool {
        self.end == CommandEnd::Exited(0)
    }

    /// One line for the checklist: how it ended, and what it said
    /// (`command` is shown redacted).
    pub fn describe(&self, command: &str, timeout: Duration, redactor: &Redactor) -> String {
        let how = match &self.end {
            CommandEnd::Exited(code) => format!("exited {code}"),
            CommandEnd::Signalled(signal) => format!("was killed by signal {signal}"),
            CommandEnd::TimedOut => {
                format!(
                    "did not finish within [health] timeout = {} and was killed",
                    humantime::format_duration(timeout)
                )
            }
            CommandEnd::Stopped => "was ended by a stop".to_string(),
            CommandEnd::NotStarted(why) => format!("could not be started: {why}"),
        };
        let said = if self.output.is_empty() { "no output".to_string() } else { format!("output: {}", self.output) };
        format!("`{}` {how} after {:.1}s; {said}", redactor.text(command), self.seconds)
    }
}

/// Variables a site check gets from rekindle's environment by default, by
/// name; and by prefix, [`INHERITED_PREFIXES`].
pub const INHERITED: [&str; 19] = [
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LANGUAGE",
    "TZ",
    "TERM",
    "TMPDIR",
    "HOSTNAME",
    "LD_LIBRARY_PATH",
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
    "CUDA_DEVICE_ORDER",
    "MODULEPATH",
];

/// Prefixes of the variables a site check gets by default.
pub const INHERITED_PREFIXES: [&str; 3] = ["SLURM_", "LC_", "REKINDLE_"];

/// The environment a site check runs with, from rekindle's `vars`: all of
/// them when `inherit_all` (`[health] inherit_env`), else those named in
/// [`INHERITED`] or with a prefix of [`INHERITED_PREFIXES`] whose name is
/// not a secret one (`redactor`) — so `HF_TOKEN`, `*_KEY`, `AWS_*`,
/// `WANDB_API_KEY` stay out.
pub fn site_env(
    vars: impl IntoIterator<Item = (String, String)>,
    inherit_all: bool,
    redactor: &Redactor,
) -> BTreeMap<String, String> {
    vars.into_iter()
        .filter(|(name, _)| {
            inherit_all
                || ((INHERITED.contains(&name.as_str()) || INHERITED_PREFIXES.iter().any(|p| name.starts_with(p)))
                    && !redactor.is_secret_name(name))
        })
        .collect()
}

/// How the site command runs (besides the command).
pub struct SiteRun<'a> {
    pub timeout: Duration,
    /// Its whole environment ([`site_env`], and what rekindle adds).
    pub env: &'a BTreeMap<String, String>,
    /// Asked every few milliseconds while it runs: `true` (a stop) ends it.
    pub stopped: &'a dyn Fn() -> bool,
    /// Applied to its output before it is kept.
    pub redactor: &'a Redactor,
}

/// How often the command is looked at while it runs.
const POLL: Duration = Duration::from_millis(20);

/// Runs `command` with `sh -c` (module header).
pub fn run_site_command(command: &str, how: &SiteRun<'_>) -> CommandRun {
    let started = Instant::now();
    let done = |end, output| CommandRun { end, output, seconds: started.elapsed().as_secs_f64() };
    let mut sink = match tempfile::tempfile() {
        Ok(file) => file,
        Err(e) => return done(CommandEnd::NotStarted(format!("no temporary file for its output: {e}")), String::new()),
    };
    let (out, err) = match (sink.try_clone(), sink.try_clone()) {
        (Ok(out), Ok(err)) => (out, err),
        (Err(e), _) | (_, Err(e)) => return done(CommandEnd::NotStarted(e.to_string()), String::new()),
    };
    // One at a time in a process: being a subreaper is the process's state.
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
    let adopter = Subreaper::start();
    let mut child = match Command::new("sh")
        .arg("-c")
        .arg(command)
        .env_clear()
        .envs(how.env)
        .env(MARK_VAR, &adopter.mark)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .spawn()
    {
        Ok(child) => child,
        Err(e) => return done(CommandEnd::NotStarted(e.to_string()), String::new()),
    };
    let leader = Pid::from_raw(child.id() as i32);
    let end = loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                use std::os::unix::process::ExitStatusExt;
                break match (status.code(), status.signal()) {
                    (Some(code), _) => CommandEnd::Exited(code),
                    (None, Some(signal)) => CommandEnd::Signalled(signal),
                    (None, None) => CommandEnd::Exited(-1),
                };
            }
            Ok(None) if (how.stopped)() => break CommandEnd::Stopped,
            Ok(None) if started.elapsed() >= how.timeout => break CommandEnd::TimedOut,
            Ok(None) => std::thread::sleep(POLL),
            Err(e) => break CommandEnd::NotStarted(e.to_string()),
        }
    };
    // Whatever it started goes with it (its children, `setsid` ones too).
    let running = matches!(end, CommandEnd::Stopped | CommandEnd::TimedOut);
    adopter.kill_all(leader, running);
    // Reaped in `kill_all` already, or now (it was killed).
    let _ = child.wait();
    done(end, tail(&mut sink, how.redactor))
}

/// Held while a site command runs.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// A variable set for the command (its descendants inherit it), whose
/// value marks an orphan rekindle adopted as the command's (module header)
/// and not another child of rekindle's.
const MARK_VAR: &str = "REKINDLE_HEALTH_CHECK";

/// rekindle as a child subreaper while the command runs (module header):
/// remembers its children from before and marks the command's environment,
/// to tell the command's orphans it adopts from anything else.
struct Subreaper {
    before: BTreeSet<i32>,
    mark: String,
    armed: bool,
}

impl Subreaper {
    fn start() -> Subreaper {
        let me = std::process::id();
        let before = children_of(&parents(), me as i32);
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
        let mark = format!("{me}-{nanos}");
        let armed = nix::sys::prctl::set_child_subreaper(true).is_ok();
        Subreaper { before, mark, armed }
    }

    /// Whether `pid` runs with this check's mark in its environment.
    fn marked(&self, pid: i32) -> bool {
        let wanted = format!("{MARK_VAR}={}", self.mark);
        std::fs::read(format!("/proc/{pid}/environ"))
            .is_ok_and(|env| env.split(|&b| b == 0).any(|var| var == wanted.as_bytes()))
    }

    /// Kills `leader`'s group and every process descended from it (while
    /// it is not reaped: `running`) or adopted since [`Self::start`], until
    /// none is left, and reaps them (the leader too: its `Child` then finds
    /// it gone).
    fn kill_all(&self, leader: Pid, running: bool) {
        let me = std::process::id() as i32;
        // Its group, at once: the group outlives a leader that exited
        // while any member runs.
        let _ = killpg(leader, Signal::SIGKILL);
        // Only while it is unreaped can its pid not name another process.
        let mut leader = running.then_some(leader.as_raw());
        // A few rounds: a process may fork between a look and its kill.
        for _ in 0..50 {
            let parents = parents();
            let mut roots: BTreeSet<i32> =
                children_of(&parents, me).difference(&self.before).copied().filter(|pid| self.marked(*pid)).collect();
            roots.extend(leader);
            let tree = descendants(&parents, &roots);
            if tree.is_empty() {
                break;
            }
            for pid in &tree {
                let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
            }
            // Our children among them (the leader, the adopted) are reaped
            // once dead; the others are reaped by their parents, or adopted
            // by us as those die, and found in the next round.
            for pid in &roots {
                if let Ok(status) = waitpid(Pid::from_raw(*pid), Some(WaitPidFlag::WNOHANG))
                    && status != nix::sys::wait::WaitStatus::StillAlive
                    && leader == Some(*pid)
                {
                    leader = None;
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Subreaper {
    fn drop(&mut self) {
        if self.armed {
            let _ = nix::sys::prctl::set_child_subreaper(false);
        }
    }
}

/// Every process's parent, from /proc (a process that vanished while read
/// is left out).
fn parents() -> BTreeMap<i32, i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return BTreeMap::new() };
    dir.filter_map(|entry| {
        let pid: i32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // `pid (comm) state ppid …`: comm may hold spaces and parentheses.
        let ppid = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()?;
        Some((pid, ppid))
    })
    .collect()
}

fn children_of(parents: &BTreeMap<i32, i32>, parent: i32) -> BTreeSet<i32> {
    parents.iter().filter(|(_, p)| **p == parent).map(|(c, _)| *c).collect()
}

/// `roots` that still run and every process below them.
fn descendants(parents: &BTreeMap<i32, i32>, roots: &BTreeSet<i32>) -> BTreeSet<i32> {
    let mut found: BTreeSet<i32> = roots.iter().copied().filter(|p| parents.contains_key(p)).collect();
    let mut frontier: Vec<i32> = found.iter().copied().collect();
    while let Some(pid) = frontier.pop() {
        for child in children_of(parents, pid) {
            if found.insert(child) {
                frontier.push(child);
            }
        }
    }
    found
}

/// The last [`OUTPUT_LIMIT`] bytes written to `file`, redacted (whole, so
/// that a YAML value below its key is seen), as one line.
fn tail(file: &mut std::fs::File, redactor: &Redactor) -> String {
    let len = file.seek(SeekFrom::End(0)).unwrap_or(0);
    let from = len.saturating_sub(OUTPUT_LIMIT);
    let mut bytes = Vec::new();
    if file.seek(SeekFrom::Start(from)).is_ok() {
        let _ = file.take(OUTPUT_LIMIT).read_to_end(&mut bytes);
    }
    let text = redactor.text(&String::from_utf8_lossy(&bytes));
    let joined = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(" | ");
    if from > 0 { format!("…{joined}") } else { joined }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    fn redactor() -> Redactor {
        Redactor::new(&crate::config::Config::default().telemetry.secret_words)
    }

    /// Runs `command` with PATH and `vars`, never stopped.
    fn run(command: &str, timeout: Duration, vars: &[(&str, &str)]) -> CommandRun {
        run_stopped(command, timeout, vars, &|| false)
    }

    fn run_stopped(command: &str, timeout: Duration, vars: &[(&str, &str)], stopped: &dyn Fn() -> bool) -> CommandRun {
        let mut env: BTreeMap<String, String> =
            std::env::var("PATH").map(|p| ("PATH".to_string(), p)).into_iter().collect();
        env.extend(vars.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        run_site_command(command, &SiteRun { timeout, env: &env, stopped, redactor: &redactor() })
    }

    fn alive(pid: i32) -> bool {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // Gone, or a zombie waiting for its parent.
        !stat.is_empty() && !stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
    }

    #[test]
    fn exit_zero_is_healthy_and_its_output_is_kept() {
        let run = run("echo fine; echo also >&2", 5 * SECOND, &[]);
        assert!(run.healthy(), "{run:?}");
        assert_eq!(run.output, "fine | also");
    }

    #[test]
    fn a_non_zero_exit_is_unhealthy_and_says_what_the_command_said() {
        let run = run("echo \"ECC on $REKINDLE_NODE\"; exit 3", 5 * SECOND, &[("REKINDLE_NODE", "n1")]);
        assert_eq!(run.end, CommandEnd::Exited(3));
        let line = run.describe("check", 5 * SECOND, &redactor());
        assert!(line.starts_with("`check` exited 3 after"), "{line}");
        assert!(line.ends_with("output: ECC on n1"), "{line}");
    }

    #[test]
    fn a_command_past_its_timeout_is_killed_with_its_children() {
        let started = Instant::now();
        let run = run("sleep 30 & sleep 30; echo never", Duration::from_millis(300), &[]);
        assert_eq!(run.end, CommandEnd::TimedOut);
        assert!(started.elapsed() < 10 * SECOND, "{:?}", started.elapsed());
        assert!(
            run.describe("c", Duration::from_millis(300), &redactor()).contains("did not finish within"),
            "{run:?}"
        );
    }

    #[test]
    fn only_the_tail_of_a_flood_of_output_is_kept() {
        let run = run("yes line | head -n 100000; echo last", 10 * SECOND, &[]);
        assert!(run.healthy());
        assert!(run.output.starts_with('…') && run.output.ends_with("last"), "{}", &run.output[..40]);
        assert!(run.output.len() < 2 * OUTPUT_LIMIT as usize);
    }

    #[test]
    fn its_output_and_command_line_are_redacted() {
        // The YAML value comes from the environment: not in the command line.
        let command =
            "echo HF_TOKEN=hf_x1 https://u:pw2@h/; printf 'password:\\n  %s\\n' \"$V\"; exit 1 # --token cmd4";
        let run = run(command, 5 * SECOND, &[("V", "yaml3")]);
        let line = run.describe(command, 5 * SECOND, &redactor());
        for secret in ["hf_x1", "pw2", "yaml3", "cmd4"] {
            assert!(!line.contains(secret), "{secret} in {line}");
        }
        assert!(line.ends_with("output: HF_TOKEN=*** https://***@h/ | password: | ***"), "{line}");
    }

    #[test]
    fn a_stop_ends_it_at_once_with_its_setsid_children_and_blames_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let pids = dir.path().join("pids");
        let command = format!(
            "setsid sleep 300 & echo $! >> {0}; sleep 300 & echo $! >> {0}; echo $$ >> {0}; wait",
            pids.display()
        );
        let started = Instant::now();
        let stopped = || std::fs::read_to_string(&pids).is_ok_and(|p| p.lines().count() == 3);
        let run = run_stopped(&command, 300 * SECOND, &[], &stopped);
        assert_eq!(run.end, CommandEnd::Stopped);
        assert!(!run.healthy());
        assert!(started.elapsed() < 10 * SECOND, "{:?}", started.elapsed());
        assert!(run.describe("c", SECOND, &redactor()).contains("was ended by a stop"), "{run:?}");
        let pids: Vec<i32> = std::fs::read_to_string(&pids).unwrap().lines().map(|l| l.parse().unwrap()).collect();
        for pid in pids {
            assert!(!alive(pid), "{pid} outlived the stop");
        }
    }

    #[test]
    fn the_site_environment_keeps_what_a_check_needs_and_no_secret() {
        let vars = [
            "PATH",
            "HOME",
            "USER",
            "LANG",
            "LC_ALL",
            "SLURM_JOB_ID",
            "CUDA_VISIBLE_DEVICES",
            "REKINDLE_NODE",
            "HF_TOKEN",
            "WANDB_API_KEY",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_REGION",
            "DB_PASSWORD",
            "SLURM_AUTH_KEY",
            "MY_VAR",
            "PYTHONPATH",
        ]
        .map(|k| (k.to_string(), "v".to_string()));
        let kept: Vec<String> = site_env(vars.clone(), false, &redactor()).into_keys().collect();
        assert_eq!(
            kept,
            ["CUDA_VISIBLE_DEVICES", "HOME", "LANG", "LC_ALL", "PATH", "REKINDLE_NODE", "SLURM_JOB_ID", "USER"]
        );
        assert_eq!(site_env(vars, true, &redactor()).len(), 16, "inherit_env: everything");
    }
}
