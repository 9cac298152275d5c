//! The site's own check (`[health] command`): `sh -c COMMAND` in a process
//! group of its own, ended (the whole group) after `[health] timeout`, its
//! output (stdout and stderr together) kept to the last
//! [`OUTPUT_LIMIT`] bytes so that a chatty script cannot flood the records.

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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
    /// It could not be started.
    NotStarted(String),
}

/// What the site command did.
#[derive(Debug, Clone, PartialEq)]
pub struct CommandRun {
    pub end: CommandEnd,
    /// The tail of its output, trimmed.
    pub output: String,
    pub seconds: f64,
}

impl CommandRun {
    /// Exit 0: the node is healthy by the site's measure.
    pub fn healthy(&self) -> bool {
        self.end == CommandEnd::Exited(0)
    }

    /// One line for the checklist: how it ended, and what it said.
    pub fn describe(&self, command: &str, timeout: Duration) -> String {
        let how = match &self.end {
            CommandEnd::Exited(code) => format!("exited {code}"),
            CommandEnd::Signalled(signal) => format!("was killed by signal {signal}"),
            CommandEnd::TimedOut => {
                format!(
                    "did not finish within [health] timeout = {} and was killed",
                    humantime::format_duration(timeout)
                )
            }
            CommandEnd::NotStarted(why) => format!("could not be started: {why}"),
        };
        let said = if self.output.is_empty() { "no output".to_string() } else { format!("output: {}", self.output) };
        format!("`{command}` {how} after {:.1}s; {said}", self.seconds)
    }
}

/// Runs `command` with `sh -c`, with `env` added to the environment.
pub fn run_site_command(command: &str, timeout: Duration, env: &[(&str, String)]) -> CommandRun {
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
    let mut child = match Command::new("sh")
        .arg("-c")
        .arg(command)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .spawn()
    {
        Ok(child) => child,
        Err(e) => return done(CommandEnd::NotStarted(e.to_string()), String::new()),
    };
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
            Ok(None) if started.elapsed() >= timeout => {
                // The whole group: a script's own children go with it.
                let pgid = nix::unistd::Pid::from_raw(child.id() as i32);
                let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
                let _ = child.wait();
                break CommandEnd::TimedOut;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => break CommandEnd::NotStarted(e.to_string()),
        }
    };
    done(end, tail(&mut sink))
}

/// The last [`OUTPUT_LIMIT`] bytes written to `file`, as one trimmed line.
fn tail(file: &mut std::fs::File) -> String {
    let len = file.seek(SeekFrom::End(0)).unwrap_or(0);
    let from = len.saturating_sub(OUTPUT_LIMIT);
    let mut bytes = Vec::new();
    if file.seek(SeekFrom::Start(from)).is_ok() {
        let _ = file.take(OUTPUT_LIMIT).read_to_end(&mut bytes);
    }
    let text = String::from_utf8_lossy(&bytes);
    let joined = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(" | ");
    if from > 0 { format!("…{joined}") } else { joined }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn exit_zero_is_healthy_and_its_output_is_kept() {
        let run = run_site_command("echo fine; echo also >&2", 5 * SECOND, &[]);
        assert!(run.healthy(), "{run:?}");
        assert_eq!(run.output, "fine | also");
    }

    #[test]
    fn a_non_zero_exit_is_unhealthy_and_says_what_the_command_said() {
        let run =
            run_site_command("echo \"ECC on $REKINDLE_NODE\"; exit 3", 5 * SECOND, &[("REKINDLE_NODE", "n1".into())]);
        assert_eq!(run.end, CommandEnd::Exited(3));
        let line = run.describe("check", 5 * SECOND);
        assert!(line.starts_with("`check` exited 3 after"), "{line}");
        assert!(line.ends_with("output: ECC on n1"), "{line}");
    }

    #[test]
    fn a_command_past_its_timeout_is_killed_with_its_children() {
        let started = Instant::now();
        let run = run_site_command("sleep 30 & sleep 30; echo never", Duration::from_millis(300), &[]);
        assert_eq!(run.end, CommandEnd::TimedOut);
        assert!(started.elapsed() < 10 * SECOND, "{:?}", started.elapsed());
        assert!(run.describe("c", Duration::from_millis(300)).contains("did not finish within"), "{run:?}");
    }

    #[test]
    fn only_the_tail_of_a_flood_of_output_is_kept() {
        let run = run_site_command("yes line | head -n 100000; echo last", 10 * SECOND, &[]);
        assert!(run.healthy());
        assert!(run.output.starts_with('…') && run.output.ends_with("last"), "{}", &run.output[..40]);
        assert!(run.output.len() < 2 * OUTPUT_LIMIT as usize);
    }
}
