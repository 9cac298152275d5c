//! Runs where people already look (issue #32), checked with the real
//! tools: TensorBoard's own reader (`EventAccumulator`, pip `tensorboard`)
//! over the event files of a run that was stopped, SIGKILLed and resumed,
//! and of an `exec` program's `log_metrics`; `rekindle status runs/*` over
//! a mix of runs and directories that are not; the Prometheus textfile
//! through `promtool check metrics` and a scrape of the real node_exporter.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use prost::Message;
use serde_json::Value;

use crate::support::cli::{RunCmd, checkpoint_steps, exe, last_event};
use crate::support::listing;
use crate::support::requires;
use rekindle::telemetry::tensorboard::{
    Event, FILE_VERSION, Summary, SummaryValue, What, event_files, frame, read_records,
};

const TIMEOUT: Duration = Duration::from_secs(180);

/// Every scalar tag of a TensorBoard directory as TensorBoard's own reader
/// sees it: `(step, value)` in the order it holds them.
fn tensorboard_scalars(dir: &Path) -> BTreeMap<String, Vec<(u64, f32)>> {
    const READ: &str = "
import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1], size_guidance={'scalars': 0})
acc.Reload()
print(json.dumps({t: [[e.step, e.value] for e in acc.Scalars(t)] for t in acc.Tags()['scalars']}))
";
    let out = Command::new("python3").args(["-c", READ]).arg(dir).output().expect("python3 runs");
    assert!(out.status.success(), "TensorBoard's reader failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let parsed: BTreeMap<String, Vec<(u64, f64)>> =
        serde_json::from_slice(&out.stdout).expect("the reader prints JSON");
    parsed.into_iter().map(|(tag, points)| (tag, points.into_iter().map(|(s, v)| (s, v as f32)).collect())).collect()
}

/// The `(step, loss)` of every training line of metrics.jsonl, as the
/// float32 TensorBoard stores.
fn metrics_losses(run: &Path) -> Vec<(u64, f32)> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter_map(|v| Some((v["step"].as_u64()?, v.get("loss")?.as_f64()? as f32)))
        .collect()
}

/// The newest step with a `loss` in the event files, read with rekindle's
/// own record reader (while the run writes them).
fn newest_loss_step(dir: &Path) -> Option<u64> {
    let mut newest = None;
    for path in event_files(dir).ok()? {
        let file = std::fs::File::open(path).ok()?;
        let _ = read_records(file, |_, payload| {
            if let Ok(e) = Event::decode(payload)
                && e.scalars().any(|(t, _)| t == "loss")
            {
                newest = newest.max(Some(e.step as u64));
            }
        });
    }
    newest
}

fn assert_each_step_once_equal_to_metrics(scalars: &BTreeMap<String, Vec<(u64, f32)>>, run: &Path, steps: u64) {
    let loss = &scalars["loss"];
    let expected = metrics_losses(run);
    assert_eq!(expected.iter().map(|(s, _)| *s).collect::<Vec<_>>(), (1..=steps).collect::<Vec<_>>());
    let got: Vec<u64> = loss.iter().map(|(s, _)| *s).collect();
    assert_eq!(got, (1..=steps).collect::<Vec<_>>(), "every step's loss once, in order");
    assert_eq!(loss, &expected, "TensorBoard's losses are metrics.jsonl's");
}

#[test]
fn a_run_stopped_killed_and_resumed_is_one_curve_in_tensorboard_each_step_once() {
    let Some(()) = requires::tensorboard() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let tb = run.join("tensorboard");
    let cmd =
        || RunCmd::new(&run).set("run.max_steps=4000").set("checkpoint.every_steps=1000").set("train.eval_every=250");
    // Attempt 1: stopped at step 100 with its checkpoint (exit 75).
    cmd().arg("--stop-at-step").arg("100").run(TIMEOUT).assert_code(75);
    // Attempt 2: SIGKILLed once TensorBoard holds steps well past the newest
    // checkpoint, so that the resume must drop them.
    let mut second = cmd().spawn();
    second.wait_until("TensorBoard steps past the newest checkpoint", TIMEOUT, |_| {
        let newest = checkpoint_steps(&run).last().copied().unwrap_or(0);
        newest >= 1000 && newest_loss_step(&tb).is_some_and(|s| s > newest + 200)
    });
    second.signal(Signal::SIGKILL);
    drop(second);
    let orphaned = newest_loss_step(&tb).unwrap();
    // A record torn mid-write, as a kill can leave one: not fatal to the reader.
    let newest_file = event_files(&tb).unwrap().pop().unwrap();
    let record = frame(&Event { wall_time: 1.0, step: orphaned as i64 + 1, what: None }.encode_to_vec());
    std::fs::OpenOptions::new().append(true).open(&newest_file).unwrap().write_all(&record[..7]).unwrap();
    let before = tensorboard_scalars(&tb);
    assert_eq!(before["loss"].last().map(|(s, _)| *s), Some(orphaned), "the killed attempt's steps are readable");

    // Attempt 3 resumes from the newest checkpoint and finishes.
    cmd().run(TIMEOUT).assert_code(0);
    let resume = last_event(&run, "resume");
    let resumed_from = resume["step"].as_u64().unwrap();
    assert!(orphaned > resumed_from, "steps {}..={orphaned} were trained twice", resumed_from + 1);
    let scalars = tensorboard_scalars(&tb);
    assert_each_step_once_equal_to_metrics(&scalars, &run, 4000);
    let validations: Vec<(u64, f32)> = std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter_map(|v| Some((v["step"].as_u64()?, v.get("val_loss")?.as_f64()? as f32)))
        .collect();
    assert_eq!(validations.iter().map(|(s, _)| *s).collect::<Vec<_>>(), (1..=16).map(|k| k * 250).collect::<Vec<_>>());
    assert_eq!(scalars["val_loss"], validations, "each validation once, at its step, equal to metrics.jsonl");
    assert_eq!(scalars["rekindle/stop"], vec![(100, 1.0)], "a marker at the stop");
    let lost = resume["steps_lost"].as_u64().unwrap() as f32;
    assert!(lost > 0.0, "{resume}");
    assert_eq!(scalars["rekindle/resume"], vec![(100, 0.0), (resumed_from, lost)], "a marker at each resume");
    // Each recorded save's time at its step (a kill between a commit and its
    // `checkpoint_saved` leaves that save without a time anywhere).
    let persisted: Vec<u64> = scalars["checkpoint/persist_seconds"].iter().map(|(s, _)| *s).collect();
    let mut saved: Vec<u64> = crate::support::cli::events_named(&run, "checkpoint_saved")
        .iter()
        .filter(|e| e["persist_seconds"].is_number())
        .filter_map(|e| e["step"].as_u64())
        .collect();
    saved.dedup();
    assert_eq!(persisted, saved, "each checkpoint's time, at its step");
    assert!(persisted.starts_with(&[100, 1000]) && persisted.ends_with(&[4000]), "{persisted:?}");
    assert!(scalars.contains_key("checkpoint/stall_seconds") && scalars.contains_key("lr"), "{:?}", scalars.keys());
    assert!(scalars.contains_key("grad_norm") && scalars.contains_key("samples_per_s"), "{:?}", scalars.keys());
}

/// A framed event holding one `loss` value.
fn loss_record(step: u64, value: f32) -> Vec<u8> {
    let value = vec![SummaryValue { tag: "loss".into(), simple_value: Some(value) }];
    frame(&Event { wall_time: 1.0, step: step as i64, what: Some(What::Summary(Summary { value })) }.encode_to_vec())
}

/// The steps of every `loss` in `files`, in reading order.
fn loss_steps_in(files: &[PathBuf]) -> Vec<u64> {
    let mut steps = Vec::new();
    for path in files {
        read_records(std::fs::File::open(path).unwrap(), |_, payload| {
            let e = Event::decode(payload).unwrap();
            steps.extend(e.scalars().filter(|(t, _)| *t == "loss").map(|_| e.step as u64));
        })
        .unwrap();
    }
    steps
}

/// Issue #40: `[telemetry] tensorboard` shared by many runs (a common
/// habit). A resume trims only the event files this run created (its record
/// `tensorboard.files` names them); another run's valid file (named exactly
/// as rekindle names its own), a large `big.tfevents.bin` and
/// `my-tfevents-notes.txt` stay byte for byte, with their modes.
#[test]
fn a_resume_in_a_shared_tensorboard_directory_trims_only_the_runs_own_files() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let shared = tmp.path().join("tb-logs");
    std::fs::create_dir(&shared).unwrap();
    let mut theirs =
        frame(&Event { wall_time: 1.0, step: 0, what: Some(What::FileVersion(FILE_VERSION.into())) }.encode_to_vec());
    for step in 1..=400 {
        theirs.extend(loss_record(step, 7.0));
    }
    std::fs::write(shared.join("events.out.tfevents.1700000000.othernode.4242.0"), &theirs).unwrap();
    let big = std::fs::File::create(shared.join("big.tfevents.bin")).unwrap();
    big.set_len(64 << 20).unwrap(); // sparse: its size is what a careless trim truncated
    std::fs::write(shared.join("my-tfevents-notes.txt"), b"notes of a person").unwrap();
    for entry in std::fs::read_dir(&shared).unwrap() {
        std::fs::set_permissions(entry.unwrap().path(), std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let before = listing(&shared);

    let run = tmp.path().join("run");
    let tb = format!("telemetry.tensorboard=\"{}\"", shared.display());
    let cmd = || RunCmd::new(&run).set(&tb).set("run.max_steps=300").set("checkpoint.every_steps=100");
    cmd().arg("--stop-at-step").arg("150").run(TIMEOUT).assert_code(75);
    // The run's own files: those that were not there before.
    let own_files = || -> Vec<PathBuf> {
        let theirs = |p: &PathBuf| before.contains_key(p.strip_prefix(&shared).unwrap());
        event_files(&shared).unwrap().into_iter().filter(|p| !theirs(p)).collect()
    };
    let own = own_files();
    assert_eq!(own.len(), 1, "{own:?}");
    // A killed attempt's steps past the checkpoint at 150, and a torn tail:
    // the resume cuts them from the run's own file, as before.
    let mut f = std::fs::OpenOptions::new().append(true).open(&own[0]).unwrap();
    f.write_all(&loss_record(151, 12345.0)).unwrap();
    f.write_all(&loss_record(152, 12345.0)[..9]).unwrap();
    drop(f);

    cmd().run(TIMEOUT).assert_code(0);
    let own = own_files();
    let after = listing(&shared);
    let others: BTreeMap<_, _> = after.iter().filter(|(p, _)| !own.contains(&shared.join(p))).collect();
    assert_eq!(others, before.iter().collect::<BTreeMap<_, _>>(), "another's files changed");
    assert_eq!(own.len(), 2);
    assert_eq!(loss_steps_in(&own), (1..=300).collect::<Vec<_>>(), "the run's own files: each step once");
    let recorded: Vec<PathBuf> =
        std::fs::read_to_string(run.join("tensorboard.files")).unwrap().lines().map(|n| shared.join(n)).collect();
    assert_eq!(recorded, own, "tensorboard.files names the run's own files");
}

/// Issue #40: `<run>/tensorboard` as a symbolic link to a directory
/// elsewhere, and a Prometheus textfile path where another exporter's file
/// is: neither is written through nor replaced; training goes on.
#[test]
fn a_linked_tensorboard_directory_and_a_foreign_textfile_are_left_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let outside = tmp.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("events.out.tfevents.1700000000.n1.1.0"), b"not rekindle's").unwrap();
    std::fs::write(outside.join("node.prom"), b"node_up 1\n").unwrap();
    let before = listing(&outside);
    let run = tmp.path().join("run");
    RunCmd::new(&run).set("run.max_steps=10").run(TIMEOUT).assert_code(0);
    std::fs::remove_dir_all(run.join("tensorboard")).unwrap();
    std::os::unix::fs::symlink(&outside, run.join("tensorboard")).unwrap();
    let prom = format!("telemetry.prometheus_textfile=\"{}\"", outside.join("node.prom").display());
    let exited = RunCmd::new(&run).set("run.max_steps=20").arg("--allow-config-change").set(&prom).run(TIMEOUT);
    exited.assert_code(0);
    assert_eq!(listing(&outside), before, "something outside the run changed");
    assert!(std::fs::symlink_metadata(run.join("tensorboard")).unwrap().file_type().is_symlink());
    assert!(exited.stderr.contains("is a symbolic link"), "the warning says why:\n{}", exited.stderr);
    assert!(exited.stderr.contains("another program's file"), "the warning says why:\n{}", exited.stderr);
}

#[test]
fn an_exec_programs_log_metrics_reach_tensorboard_across_a_stop_and_resume() {
    let Some(()) = requires::python() else { return };
    let Some(()) = requires::tensorboard() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let program = concat!(env!("CARGO_MANIFEST_DIR"), "/python/examples/train_numpy.py");
    let out = tmp.path().join("w.npy").to_string_lossy().into_owned();
    let exec = |extra: &[&str]| {
        let mut command = vec!["python3", program, "--steps", "60", "--every", "5", "--out", out.as_str()];
        command.extend_from_slice(extra);
        RunCmd::exec(&run, &command)
    };
    let mut first = exec(&["--step-seconds", "0.05"]).spawn();
    first.wait_for_step(12, TIMEOUT);
    first.signal(Signal::SIGTERM);
    first.wait(TIMEOUT).assert_code(75);
    let stopped_at = last_event(&run, "stop")["step"].as_u64().unwrap();
    exec(&[]).run(TIMEOUT).assert_code(0);
    let scalars = tensorboard_scalars(&run.join("tensorboard"));
    assert_each_step_once_equal_to_metrics(&scalars, &run, 60);
    assert_eq!(scalars["lr"].len(), 60, "every key the program logs is a scalar");
    assert_eq!(scalars["rekindle/stop"], vec![(stopped_at, 1.0)]);
    assert_eq!(scalars["rekindle/resume"].iter().map(|(s, _)| *s).collect::<Vec<_>>(), vec![stopped_at]);
}

/// `rekindle ARGS` → (exit code, stdout, stderr).
fn rekindle(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(exe()).args(args).stdin(Stdio::null()).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn status_over_many_directories_gives_each_its_line() {
    let tmp = tempfile::tempdir().unwrap();
    let runs = tmp.path().join("runs");
    let dir = |name: &str| runs.join(name);
    RunCmd::new(&dir("finished")).set("run.max_steps=30").run(TIMEOUT).assert_code(0);
    RunCmd::new(&dir("stopped")).set("run.max_steps=300").arg("--stop-at-step").arg("20").run(TIMEOUT).assert_code(75);
    // Another process holds the lock: a program under `rekindle exec`.
    let mut running = RunCmd::exec(&dir("running"), &["sleep", "120"]).spawn();
    running.wait_for_event("child_start", TIMEOUT);
    std::fs::create_dir_all(dir("damaged")).unwrap();
    std::fs::write(dir("damaged").join("config.toml"), "[run]\nmax_steps = \"many\"\n").unwrap();
    std::fs::write(dir("damaged").join("events.jsonl"), "{\"event\":\"start\"}\n").unwrap();
    std::fs::create_dir_all(dir("photos")).unwrap();
    std::fs::write(dir("photos").join("cat.jpg"), "jpeg").unwrap();
    let all: Vec<String> = ["damaged", "finished", "photos", "running", "stopped"]
        .iter()
        .map(|n| dir(n).to_string_lossy().into_owned())
        .collect();
    let mut args = vec!["status"];
    args.extend(all.iter().map(String::as_str));

    let (code, text, stderr) = rekindle(&args);
    assert_eq!(code, Some(0), "{stderr}");
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("RUN") && lines[0].contains("LAST STOP"), "{text}");
    let line_of = |name: &str| *lines.iter().find(|l| l.starts_with(&dir(name).to_string_lossy().to_string())).unwrap();
    let words = |name: &str| line_of(name).split_whitespace().map(str::to_string).collect::<Vec<_>>();
    assert_eq!(words("finished")[2..5], ["finished", "30/30", "100.0%"], "{text}");
    assert_eq!(words("stopped")[2..5], ["stopped", "20/300", "6.7%"], "{text}");
    assert!(line_of("stopped").contains("stop_at_step"), "{text}");
    assert_eq!(words("running")[2], "running", "{text}");
    assert_eq!(words("damaged")[2], "damaged", "{text}");
    assert!(
        line_of("damaged").contains("config.toml does not load: ") && line_of("damaged").contains("run.max_steps"),
        "{text}"
    );
    assert_eq!(words("photos")[2], "foreign", "{text}");
    assert!(line_of("photos").contains("not a rekindle run directory"), "{text}");
    assert_eq!(*lines.last().unwrap(), "5 runs: 1 running, 1 stopped, 1 finished, 1 damaged, 1 foreign", "{text}");

    let mut json_args = args.clone();
    json_args.push("--json");
    let (code, json, _) = rekindle(&json_args);
    assert_eq!(code, Some(0));
    let rows: Vec<Value> = serde_json::from_str(&json).expect("--json parses");
    let states: Vec<&str> = rows.iter().map(|r| r["state"].as_str().unwrap()).collect();
    assert_eq!(states, ["damaged", "finished", "foreign", "running", "stopped"]);
    assert_eq!(rows[1]["checkpoint_step"], 30);
    assert_eq!(rows[3]["node"].as_str(), Some(rekindle::slurm::hostname().as_str()));

    let mut filtered = args.clone();
    filtered.extend(["--state", "running,stopped", "--sort", "state"]);
    let (_, text, _) = rekindle(&filtered);
    let shown: Vec<&str> = text.lines().skip(1).map(|l| l.split_whitespace().nth(2).unwrap_or("")).collect();
    assert_eq!(shown[..2], ["running", "stopped"], "{text}");
    assert!(text.ends_with("2 runs (of 5 directories): 1 running, 1 stopped\n"), "{text}");

    let mut watch = args.clone();
    watch.extend(["--watch", "--interval", "200ms", "--count", "2"]);
    let started = Instant::now();
    let (code, text, _) = rekindle(&watch);
    assert_eq!(code, Some(0));
    assert_eq!(text.matches("every 200ms: rekindle status").count(), 2, "{text}");
    assert_eq!(text.matches("5 runs: ").count(), 2, "{text}");
    assert!(started.elapsed() >= Duration::from_millis(200), "it waited between the refreshes");

    // One directory keeps its screen.
    let (code, text, _) = rekindle(&["status", &all[3]]);
    assert_eq!(code, Some(0));
    assert!(text.contains("state     running") && text.contains("held by   pid"), "{text}");
    drop(running);
}

/// A TCP port nothing listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `GET http://127.0.0.1:PORT/metrics`, its body once it answers (at most 30 s).
fn scrape(port: u16) -> String {
    let t0 = Instant::now();
    loop {
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
            let mut text = String::new();
            if s.read_to_string(&mut text).is_ok() && text.starts_with("HTTP/1.0 200") {
                return text;
            }
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "node_exporter did not answer on port {port}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Kills a child when dropped.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_prometheus_textfile_passes_promtool_and_node_exporter_serves_it() {
    let Some(()) = requires::prometheus() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let textfiles = tmp.path().join("textfile");
    std::fs::create_dir(&textfiles).unwrap();
    let run = tmp.path().join("run");
    let setting = format!("telemetry.prometheus_textfile=\"{}/rekindle-{{run}}.prom\"", textfiles.display());
    RunCmd::new(&run)
        .set("run.max_steps=300")
        .set(&setting)
        .arg("--stop-at-step")
        .arg("40")
        .run(TIMEOUT)
        .assert_code(75);
    let file: PathBuf = textfiles.join("rekindle-tiny.prom");
    let text = std::fs::read_to_string(&file).unwrap();
    assert_eq!(std::fs::read_dir(&textfiles).unwrap().count(), 1, "only the .prom file: no temporary one left");

    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    promtool.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let checked = promtool.wait_with_output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&checked.stdout), String::from_utf8_lossy(&checked.stderr));
    assert!(checked.status.success(), "promtool check metrics:\n{said}\n{text}");
    assert!(said.trim().is_empty(), "promtool found problems:\n{said}");

    let port = free_port();
    let _exporter = Killed(
        Command::new("prometheus-node-exporter")
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .args(["--collector.disable-defaults", "--collector.textfile"])
            .arg(format!("--collector.textfile.directory={}", textfiles.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let scraped = scrape(port);
    let has = |line: &str| scraped.lines().any(|l| l == line);
    assert!(has("node_textfile_scrape_error 0"), "{scraped}");
    for line in [
        "rekindle_step{run=\"tiny\"} 40",
        "rekindle_last_checkpoint_step{run=\"tiny\"} 40",
        "rekindle_running{run=\"tiny\"} 0",
        "rekindle_state{run=\"tiny\",state=\"stopped\"} 1",
        "rekindle_last_stop{reason=\"stop_at_step\",run=\"tiny\"} 1",
        "rekindle_attempts{run=\"tiny\"} 1",
    ] {
        assert!(has(line), "node_exporter serves {line:?}:\n{scraped}");
    }
    assert!(has("rekindle_world_size{run=\"tiny\"} 1"), "{scraped}");
    assert!(has("rekindle_max_steps{run=\"tiny\"} 300"), "{scraped}");
    // The timed ones: present, a number, and in range.
    let value = |name: &str| -> f64 {
        let prefix = format!("{name}{{run=\"tiny\"}} ");
        let line = scraped.lines().find(|l| l.starts_with(&prefix)).unwrap_or_else(|| panic!("no {name}:\n{scraped}"));
        line[prefix.len()..].parse().unwrap_or_else(|e| panic!("{line}: {e}"))
    };
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    let saved = value("rekindle_last_checkpoint_timestamp_seconds");
    assert!(saved <= now && now - saved < TIMEOUT.as_secs_f64(), "checkpoint at {saved}, now {now}");
    let since = value("rekindle_seconds_since_last_checkpoint");
    assert!((0.0..TIMEOUT.as_secs_f64()).contains(&since), "{since}");
    assert!(value("rekindle_steps_per_second") > 0.0, "{scraped}");
    let (stall, persist) = (value("rekindle_checkpoint_stall_seconds"), value("rekindle_checkpoint_persist_seconds"));
    assert!(stall >= 0.0 && persist > 0.0 && stall < 60.0 && persist < 60.0, "stall {stall}, persist {persist}");
}
