//! Bad nodes (#29) through the real binary: `rekindle doctor --json` shows
//! the node checks every attempt makes, with GPU health counters from an
//! injected inventory and what could not be checked; a `rekindle run` on a
//! node that fails its check records `node_unhealthy` and trains nothing;
//! and attempts that make no progress stop with exit 79.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::cli::{RunCmd, events, events_named, exe};
use crate::support::scontrol::FakeScontrol;

const TIMEOUT: Duration = Duration::from_secs(120);
const EXIT_NO_PROGRESS: i32 = 79;

fn inventory(dir: &Path, devices: Value) -> std::path::PathBuf {
    let path = dir.join("inventory.json");
    std::fs::write(&path, json!({ "devices": devices }).to_string()).unwrap();
    path
}

fn doctor_json(dir: &Path, inventory: &Path, command: &str) -> (i32, Value) {
    let config = dir.join("doctor.toml");
    std::fs::write(
        &config,
        format!("[run]\ndir = {:?}\n[health]\ncommand = {command:?}\n", dir.join("runs/r").display().to_string()),
    )
    .unwrap();
    let out = std::process::Command::new(exe())
        .args(["doctor", "--json", "--config"])
        .arg(&config)
        .arg("--inventory")
        .arg(inventory)
        .env_remove("SLURM_JOB_ID")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let list = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    (out.status.code().unwrap_or(-1), list)
}

fn check<'a>(list: &'a Value, name: &str) -> &'a Value {
    list["checks"].as_array().unwrap().iter().find(|c| c["name"] == name).unwrap_or_else(|| panic!("{name}: {list}"))
}

#[test]
fn doctor_json_shows_the_node_checks_with_gpu_health_and_what_it_could_not_check() {
    let tmp = tempfile::tempdir().unwrap();
    let sick = inventory(
        tmp.path(),
        json!([{"vendor": "nvidia", "name": "H100", "memory_total_mib": 81559, "ecc_uncorrected": 3,
                "throttle_reasons": ["hw_thermal_slowdown"]}]),
    );
    let (code, list) = doctor_json(tmp.path(), &sick, "echo 'IB port down'; exit 2");
    assert_eq!(code, 1, "{list}");
    let gpu = check(&list, "gpu health");
    assert_eq!(gpu["status"], "fail", "{gpu}");
    assert!(gpu["detail"].as_str().unwrap().contains("nvidia 0: 3 uncorrected ECC error(s)"), "{gpu}");
    assert!(gpu["detail"].as_str().unwrap().contains("not checked: nvidia 0: retired pages, remapped rows"), "{gpu}");
    let site = check(&list, "site command");
    assert_eq!(site["status"], "fail", "{site}");
    let said = site["detail"].as_str().unwrap();
    assert!(said.contains("exited 2 after") && said.ends_with("output: IB port down"), "{site}");
    for name in ["devices", "device memory", "run directory", "clock skew", "free disk", "checkpoint round-trip"] {
        assert_eq!(check(&list, name)["status"], "ok", "{name}: {list}");
    }

    // A device whose driver reports no counters: said, not passed.
    let quiet = inventory(tmp.path(), json!([{"vendor": "nvidia", "name": "H100", "memory_total_mib": 81559}]));
    let (code, list) = doctor_json(tmp.path(), &quiet, "true");
    assert_eq!(code, 0, "{list}");
    let gpu = check(&list, "gpu health");
    assert_eq!(gpu["status"], "skip", "{gpu}");
    assert!(gpu["detail"].as_str().unwrap().contains("not reported by the driver, so not checked"), "{gpu}");
    assert_eq!(check(&list, "site command")["status"], "ok");
}

#[test]
fn a_node_that_fails_its_check_trains_nothing_and_says_why() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let exited = RunCmd::new(&run)
        .set("run.max_steps=20")
        .set("health.command=\"echo bad HCA on $REKINDLE_NODE; exit 3\"")
        .run(TIMEOUT);
    exited.assert_code(1);
    assert!(exited.stderr.contains("failed its health check `site command`"), "{}", exited.tail());
    let names: Vec<String> = events(&run).iter().map(|e| e["event"].as_str().unwrap().to_string()).collect();
    assert_eq!(names[0], "node_unhealthy", "{names:?}");
    assert!(!names.contains(&"start".to_string()), "nothing started: {names:?}");
    let unhealthy = &events_named(&run, "node_unhealthy")[0];
    assert_eq!(unhealthy["check"], "site command");
    assert!(unhealthy["detail"].as_str().unwrap().contains("output: bad HCA on"), "{unhealthy}");
    assert_eq!(unhealthy["checks"]["required_failed"], true);
    assert!(!run.join("metrics.jsonl").exists(), "no step trained");

    // The run directory holds no config.toml yet: it is still inspectable,
    // and says which check failed, where, and that nothing trained.
    let inspect = |args: &[&std::ffi::OsStr]| {
        let out = std::process::Command::new(exe()).args(args).output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
    };
    let (code, text) = inspect(&["status".as_ref(), run.as_os_str()]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("trained   nothing: every attempt ended at its node check"), "{text}");
    assert!(text.contains("`site command`"), "{text}");
    let other = tmp.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    let (code, text) = inspect(&["status".as_ref(), run.as_os_str(), other.as_os_str()]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("nothing trained: every attempt failed its node check"), "{text}");
    assert!(!text.contains("restore it"), "no config.toml ever existed to restore: {text}");
    let (code, text) = inspect(&["report".as_ref(), run.as_os_str()]);
    assert_eq!(code, Some(0), "{text}");

    // A sick GPU of the injected inventory fails the same way.
    let sick = inventory(
        tmp.path(),
        json!([{"vendor": "nvidia", "name": "A100", "memory_total_mib": 40000, "retired_pages_pending": true}]),
    );
    let run2 = tmp.path().join("run2");
    RunCmd::new(&run2)
        .set("run.max_steps=20")
        .set("gpu.backend=\"auto\"")
        .env("REKINDLE_GPU_INVENTORY", &sick)
        .run(TIMEOUT)
        .assert_code(1);
    let unhealthy = &events_named(&run2, "node_unhealthy")[0];
    assert_eq!(unhealthy["check"], "gpu health", "{unhealthy}");
}

/// Attempts of one SLURM job that commit nothing stop its requeue loop with
/// exit 79, naming them; the same run submitted again (a new job) or with a
/// changed config trains (here: checks its node) again.
#[test]
fn attempts_of_a_job_without_progress_stop_with_exit_79_naming_them() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let fake = FakeScontrol::running_job(tmp.path());
    let attempt = |job: &str, restart: u32, max: u32| {
        RunCmd::new(&run)
            .set("run.max_steps=20")
            .set(&format!("run.max_attempts_without_progress={max}"))
            .set("health.command=\"exit 1\"")
            .env("PATH", fake.path())
            .env("SLURM_JOB_ID", job)
            .env("SLURM_RESTART_COUNT", restart.to_string())
            .run(TIMEOUT)
    };
    // Each failed node check asks for a requeue (the fake accepts it).
    attempt("77", 0, 2).assert_code(1);
    attempt("77", 1, 2).assert_code(1);
    let third = attempt("77", 2, 2);
    third.assert_code(EXIT_NO_PROGRESS);
    assert!(third.stderr.contains("2 attempts of job 77 in a row committed no newer checkpoint"), "{}", third.tail());
    assert!(third.stderr.contains("submit the job again"), "{}", third.tail());
    let last = events(&run).pop().unwrap();
    assert_eq!(last["event"], "error", "{last}");
    assert!(last["error"].as_str().unwrap().contains("node_unhealthy on"), "{last}");
    assert_eq!(events_named(&run, "node_unhealthy").len(), 2, "the third attempt checked nothing more");

    // Submitted again: job 78 is a person's start and checks its node.
    attempt("78", 0, 2).assert_code(1);
    assert_eq!(events_named(&run, "node_unhealthy").len(), 3);
    // Job 77 requeued again with a changed config counts afresh.
    attempt("77", 3, 3).assert_code(1);
    assert_eq!(events_named(&run, "node_unhealthy").len(), 4);
}

/// #41: a node-wide check that fails on every rank of a node (here the
/// site command, as a hung mount would) makes one rank of the node ask
/// slurmctld, not each: four local ranks, one caller, the others only
/// record their failure.
#[test]
fn a_node_wide_failure_asks_slurmctld_from_one_rank_of_the_node() {
    let tmp = tempfile::tempdir().unwrap();
    let fake = FakeScontrol::running_job(tmp.path());
    for local in 0..4 {
        let run = tmp.path().join(format!("run-{local}"));
        let exited = RunCmd::new(&run)
            .set("run.max_steps=20")
            .set("health.command=\"exit 1\"")
            .env("PATH", fake.path())
            .env("SLURM_JOB_ID", "77")
            .env("SLURM_LOCALID", local.to_string())
            .run(TIMEOUT);
        exited.assert_code(1);
        assert_eq!(events_named(&run, "node_unhealthy").len(), 1, "rank {local} records its failure");
        if local > 0 {
            assert!(exited.stderr.contains("the node's first rank (SLURM_LOCALID 0) asks SLURM"), "{}", exited.tail());
            assert!(events_named(&run, "requeue").is_empty(), "rank {local} asked nothing");
        }
    }
    let calls = fake.calls();
    assert!(!calls.is_empty(), "the node's first rank asked SLURM");
    assert!(calls.iter().any(|c| c.starts_with("requeue 77")), "{calls:?}");
    assert!(calls.len() <= 5, "one rank's calls, not four ranks': {calls:?}");
}

/// #41: in a job step, the node-wide checks run once a node: its first rank
/// (`SLURM_LOCALID` 0) makes them and leaves the verdict on node-local
/// storage, and its other ranks take it. Four ranks of one node started at
/// once (the first last), their site command counting its runs: one run,
/// all four train after a pass; after a failure all four fail it, each
/// recording its `node_unhealthy`, and only the first asks slurmctld.
#[test]
fn the_node_wide_checks_run_once_a_node_and_every_rank_takes_the_verdict() {
    let tmp = tempfile::tempdir().unwrap();
    let fake = FakeScontrol::running_job(tmp.path());
    // A job id of this test's own: the verdict is per launch and node.
    let job = format!("{}", 900_000 + std::process::id());
    for (phase, exit) in [("pass", 0), ("fail", 1)] {
        let counter = tmp.path().join(format!("site-runs-{phase}"));
        let command = format!("echo run >> {}; exit {exit}", counter.display());
        let rank = |local: u32| {
            RunCmd::new(&tmp.path().join(format!("{phase}-{local}")))
                .set("run.max_steps=20")
                .set(&format!("health.command={}", toml_string(&command)))
                .env("PATH", fake.path())
                .env("SLURM_JOB_ID", &job)
                .env("SLURM_STEP_ID", if exit == 0 { "0" } else { "1" })
                .env("SLURM_LOCALID", local.to_string())
                .env("SLURMD_NODENAME", "n-verdict")
        };
        let others: Vec<_> = (1..4).map(|local| rank(local).spawn()).collect();
        std::thread::sleep(Duration::from_millis(300));
        let first = rank(0).run(TIMEOUT);
        let others: Vec<_> = others.into_iter().map(|o| o.wait(TIMEOUT)).collect();
        let runs = std::fs::read_to_string(&counter).unwrap_or_default().lines().count();
        assert_eq!(runs, 1, "the site command ran once on the node ({phase})");
        for (local, exited) in std::iter::once(&first).chain(&others).enumerate() {
            let run = tmp.path().join(format!("{phase}-{local}"));
            if exit == 0 {
                exited.assert_code(0);
                assert!(events_named(&run, "node_unhealthy").is_empty(), "rank {local}: {}", exited.tail());
                continue;
            }
            exited.assert_code(1);
            let failed = events_named(&run, "node_unhealthy");
            assert_eq!(failed.len(), 1, "rank {local} records its failure: {}", exited.tail());
            assert_eq!(failed[0]["check"], "site command", "rank {local}");
            if local > 0 {
                assert!(events_named(&run, "requeue").is_empty(), "rank {local} asked nothing");
            }
        }
    }
    let calls = fake.calls();
    assert!(calls.iter().any(|c| c.starts_with(&format!("requeue {job}"))), "{calls:?}");
    assert!(calls.len() <= 5, "one rank's calls, not four ranks': {calls:?}");
}

/// Outside SLURM a person starts each attempt: five failed starts and a
/// sixth still runs (warned, with the history), and clean finishes never
/// count.
#[test]
fn outside_slurm_the_guard_warns_but_never_refuses_and_a_finish_is_progress() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let failing = || RunCmd::new(&run).set("run.max_steps=20").set("health.command=\"exit 1\"").run(TIMEOUT);
    for _ in 0..5 {
        failing().assert_code(1);
    }
    let sixth = failing();
    sixth.assert_code(1);
    assert!(sixth.stderr.contains("training anyway"), "{}", sixth.tail());
    assert_eq!(events_named(&run, "node_unhealthy").len(), 6, "every start checked its node");
    // The corrected command trains.
    RunCmd::new(&run).set("run.max_steps=20").run(TIMEOUT).assert_code(0);

    // `rekindle exec -- true` six times: each a clean finish, never 79.
    let finished = tmp.path().join("finished");
    for _ in 0..6 {
        RunCmd::exec(&finished, &["true"]).run(TIMEOUT).assert_code(0);
    }
}

/// Issue #40: the site command inherited rekindle's whole environment and
/// its command line and output went unredacted into `node_unhealthy`.
#[test]
fn the_site_command_sees_no_secret_and_records_none() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let seen = tmp.path().join("env.txt");
    // The YAML value is made by the shell: the command line holds no
    // `SECRET` of it (a line of its own only in the output).
    let command = format!(
        "env > {}; echo \"Authorization: Bearer tok1SECRET\"; printf 'password:\\n  %s\\n' yaml2$(printf SECR)ET; \
         echo token=\"$HF_TOKEN\"; exit 3 # --api-key cmd3SECRET",
        seen.display()
    );
    let exited = RunCmd::exec(&run, &["true"])
        .set(&format!("health.command={}", toml_string(&command)))
        .env("HF_TOKEN", "hf_env4SECRET")
        .env("AWS_SECRET_ACCESS_KEY", "aws5SECRET")
        .env("SLURM_JOB_NAME", "train")
        .run(TIMEOUT);
    exited.assert_code(1);
    let env = std::fs::read_to_string(&seen).unwrap();
    assert!(!env.contains("SECRET") && !env.contains("HF_TOKEN") && !env.contains("AWS_"), "{env}");
    assert!(env.contains("PATH=") && env.contains("SLURM_JOB_NAME=train"), "what a check needs: {env}");
    let unhealthy = &events_named(&run, "node_unhealthy")[0];
    let detail = unhealthy["detail"].as_str().unwrap();
    assert!(detail.contains("exited 3") && detail.contains("output: Authorization: Bearer ***"), "{unhealthy}");
    let recorded = std::fs::read_to_string(run.join("events.jsonl")).unwrap();
    assert!(!recorded.contains("SECRET"), "{recorded}");
    assert!(!exited.stderr.contains("SECRET"), "{}", exited.tail());

    // `[health] inherit_env = true`: the whole environment, as asked.
    RunCmd::exec(&tmp.path().join("run2"), &["true"])
        .set(&format!("health.command={}", toml_string(&format!("env > {}", seen.display()))))
        .set("health.inherit_env=true")
        .env("HF_TOKEN", "hf_env4SECRET")
        .run(TIMEOUT)
        .assert_code(0);
    assert!(std::fs::read_to_string(&seen).unwrap().contains("HF_TOKEN=hf_env4SECRET"));
}

/// Issue #40: a SIGTERM during the site command waited for its whole
/// timeout, then blamed the node; a `setsid` child outlived rekindle.
#[test]
fn a_stop_during_the_site_command_ends_it_at_once_with_its_setsid_children() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let pids = tmp.path().join("pids");
    let command = format!(
        "setsid sleep 300 & echo $! >> {0}; sleep 300 & echo $! >> {0}; echo $$ >> {0}; sleep 300",
        pids.display()
    );
    let mut running = RunCmd::exec(&run, &["true"])
        .set(&format!("health.command={}", toml_string(&command)))
        .set("health.timeout=\"10m\"")
        .spawn();
    running.wait_until("the site command's pids", TIMEOUT, |_| {
        std::fs::read_to_string(&pids).is_ok_and(|p| p.lines().count() == 3)
    });
    running.signal(nix::sys::signal::Signal::SIGTERM);
    let sent = std::time::Instant::now();
    let exited = running.wait(TIMEOUT);
    let took = exited.at - sent;
    assert!(took < Duration::from_secs(10), "rekindle exited {took:?} after the SIGTERM");
    assert!(exited.code().is_some_and(|c| c == 1 || c == 75), "{}", exited.tail());
    for pid in std::fs::read_to_string(&pids).unwrap().lines() {
        let pid = nix::unistd::Pid::from_raw(pid.parse().unwrap());
        let t0 = std::time::Instant::now();
        while nix::sys::signal::kill(pid, None).is_ok() && !crate::exec::is_zombie(pid) {
            assert!(t0.elapsed() < Duration::from_secs(5), "{pid} outlived the stop");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    assert!(events_named(&run, "node_unhealthy").is_empty(), "a stop blames no node");
}

#[test]
fn a_site_command_timeout_past_ten_minutes_is_a_config_error() {
    let tmp = tempfile::tempdir().unwrap();
    let exited = RunCmd::exec(&tmp.path().join("run"), &["true"]).set("health.timeout=\"2h\"").run(TIMEOUT);
    exited.assert_code(78);
    assert!(
        exited.stderr.contains("health.timeout") && exited.stderr.contains("must be at most 10m"),
        "{}",
        exited.tail()
    );
}

/// `s` as a TOML basic string (for `--set key=VALUE`).
fn toml_string(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

/// Issue #40: `std::env::vars()` panics on a variable that is not UTF-8,
/// and the node check (and SLURM's environment) read it that way: a site
/// whose environment held one crashed every start with exit 101.
#[test]
fn issue_40_a_non_utf8_environment_variable_is_no_panic_in_the_node_check() {
    use std::os::unix::ffi::OsStrExt;
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let odd = std::ffi::OsStr::from_bytes(b"caf\xe9");
    let exited = RunCmd::exec(&run, &["true"])
        .set(&format!("health.command={}", toml_string("exit 0")))
        .env("REKINDLE_TEST_LATIN1", odd)
        .run(TIMEOUT);
    exited.assert_code(0);
    assert!(!exited.stderr.contains("panicked"), "{}", exited.tail());
}
