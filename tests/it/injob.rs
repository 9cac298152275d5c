//! The batch shell's in-job restarts (`slurm/orchestrator.slurm`,
//! docs/recovery.md "The batch shell's decisions"), without rekindle: the
//! decisions themselves, tabled on the script's own functions, and then on
//! the local SLURM cluster with a stand-in for rekindle
//! (`tests/it/injob/fake-rekindle.sh` as `REKINDLE_BIN`) that asks for a
//! restart, crashes or exits as each job's scenario says. What each job did
//! is read from `scontrol show job` (state, exit code, `Restarts`: 0 for
//! in-job restarts), the job's output (the shell's decisions) and the line
//! every task of every step logs (which step, where, how many tasks).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::cluster::{LocalCluster, repo};
use crate::support::requires;

/// Runs `calls` in bash after sourcing only the script's block of pure
/// decisions; returns stdout and stderr.
fn decisions(calls: &str) -> (String, String) {
    let script = repo().join("slurm/orchestrator.slurm");
    let text = std::fs::read_to_string(&script).expect("read slurm/orchestrator.slurm");
    let start = text.find("\n# --- in-job decisions").expect("the script marks its block of decisions");
    let end = text.find("\n# --- end of in-job decisions ---").expect("the script marks the block's end");
    let block = &text[start..end];
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!("set -euo pipefail\nsay() {{ echo \"rekindle: $*\" >&2; }}\n{block}\n{calls}"))
        .output()
        .expect("run bash");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "bash failed on\n{calls}\n{stderr}");
    (stdout.into_owned(), stderr.into_owned())
}

fn decide(call: &str) -> String {
    decisions(call).0.trim_end().to_string()
}

#[test]
fn after_a_step_the_shell_restarts_requeues_or_exits_as_the_table_says() {
    // after_step RC REQUESTED RESTARTS MAX HEALTHY ENDING
    let table: &[(&str, &str)] = &[
        // rekindle asked for a restart: its exit code does not matter.
        ("after_step 137 1 0 3 2 ''", "restart rekindle asked for it"),
        ("after_step 1 1 2 3 1 ''", "restart rekindle asked for it"),
        (
            "after_step 1 1 3 3 2 ''",
            "requeue rekindle asked for an in-job restart, but 3 of REKINDLE_INJOB_MAX=3 are done",
        ),
        (
            "after_step 1 1 0 0 2 ''",
            "requeue rekindle asked for an in-job restart, but 0 of REKINDLE_INJOB_MAX=0 are done",
        ),
        (
            "after_step 1 1 0 3 0 ''",
            "requeue rekindle asked for an in-job restart, but no healthy node is left in the job",
        ),
        (
            "after_step 1 1 0 3 2 'the job is COMPLETING'",
            "requeue rekindle asked for an in-job restart, but the job is COMPLETING",
        ),
        // No request: rekindle's own exit codes end the job as they always did.
        ("after_step 0 0 0 3 2 ''", "exit 0 rekindle's own exit code"),
        ("after_step 1 0 0 3 2 ''", "exit 1 rekindle's own exit code"),
        ("after_step 2 0 0 3 2 ''", "exit 2 rekindle's own exit code"),
        ("after_step 75 0 0 3 2 ''", "exit 75 rekindle's own exit code"),
        ("after_step 78 0 0 3 2 ''", "exit 78 rekindle's own exit code"),
        ("after_step 75 0 0 3 2 'the batch shell got SIGTERM'", "exit 75 rekindle's own exit code"),
        // Anything else is a crash rekindle did not explain.
        (
            "after_step 137 0 0 3 1 ''",
            "restart the step ended with 137, a crash rekindle did not explain (a task killed by a signal, a node failure srun reported)",
        ),
        (
            "after_step 137 0 3 3 1 ''",
            "exit 137 the step ended with 137 (a crash rekindle did not explain) and 3 of REKINDLE_INJOB_MAX=3 in-job restarts are done",
        ),
        (
            "after_step 9 0 0 3 0 ''",
            "exit 9 the step ended with 9 (a crash rekindle did not explain) and no healthy node is left in the job",
        ),
        (
            "after_step 143 0 0 3 2 'the batch shell got SIGTERM (the job is being stopped)'",
            "exit 143 the step ended with 143 while the batch shell got SIGTERM (the job is being stopped)",
        ),
    ];
    for (call, want) in table {
        assert_eq!(decide(call), *want, "{call}");
    }
}

#[test]
fn the_world_keeps_its_size_while_spares_last_then_shrinks_to_the_nodes_left() {
    // first_world TASKS NTASKS_PER_NODE ALLOCATED SPARES -> PER_NODE NODES TASKS
    let first: &[(&str, &str)] = &[
        ("first_world 1 '' 1 0", "1 1 1"),
        ("first_world 2 '' 2 0", "1 2 2"),
        // -N3 --ntasks-per-node=1 with one spare: 2 ranks on 2 nodes.
        ("first_world 3 1 3 1", "1 2 2"),
        // -N3 -n3 with one spare: the same.
        ("first_world 3 '' 3 1", "1 2 2"),
        // -N4 --ntasks-per-node=2 with one spare: 6 ranks on 3 nodes.
        ("first_world 8 2 4 1", "2 3 6"),
        // -N2 -n3: 2 per node, 3 tasks on 2 nodes.
        ("first_world 3 '' 2 0", "2 2 3"),
        // -N1 -n2 --overcommit: both on the one node.
        ("first_world 2 '' 1 0", "2 1 2"),
        // -N3 without -n: one task, the other nodes wait.
        ("first_world 1 '' 3 0", "1 1 1"),
    ];
    for (call, want) in first {
        assert_eq!(decide(call), *want, "{call}");
    }
    let (out, err) = decisions("first_world 2 1 2 2 || echo refused");
    assert_eq!(out.trim(), "refused");
    assert!(err.contains("REKINDLE_SPARE_NODES=2 leaves none of the job's 2 node(s)"), "{err}");

    // next_world PER_NODE FIRST_NODES FIRST_TASKS HEALTHY -> NODES TASKS
    let next: &[(&str, &str)] = &[
        ("next_world 1 2 2 2", "2 2"), // the spare took over
        ("next_world 1 2 2 3", "2 2"), // never more than the first step
        ("next_world 1 2 2 1", "1 1"), // no spare: one rank on the node left
        ("next_world 2 3 6 2", "2 4"),
        ("next_world 2 2 3 1", "1 2"),
    ];
    for (call, want) in next {
        assert_eq!(decide(call), *want, "{call}");
    }

    // healthy_nodes "ALLOC" "EXCLUDED" "BAD"
    assert_eq!(decide("healthy_nodes 'n1 n2 n3' 'n2' ''"), "n1 n3");
    assert_eq!(decide("healthy_nodes 'n1 n2 n3' 'n2' 'n3'"), "n1");
    assert_eq!(decide("healthy_nodes 'n1 n10' 'n1' ''"), "n10", "n1 is not a prefix match");
    assert_eq!(decide("healthy_nodes 'n1' 'n1' ''"), "");
}

#[test]
fn the_restart_request_is_read_as_key_value_lines() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("request");
    std::fs::write(
        &file,
        "# written by rank 0\n\naction=restart\nreason = rank_lost\nexclude=n2, n3,,bad name\nfuture_key=x\nstep=40\r\n",
    )
    .unwrap();
    let f = file.display();
    let (out, err) = decisions(&format!(
        "for k in action reason exclude step written_by; do echo \"$k=[$(request_value {f} $k)]\"; done\n\
         node_names \"$(request_value {f} exclude)\""
    ));
    assert_eq!(
        out,
        "action=[restart]\nreason=[rank_lost]\nexclude=[n2, n3,,bad name]\nstep=[40]\nwritten_by=[]\nn2\nn3\n"
    );
    assert!(err.contains("ignoring 'bad name' in the restart request's exclude: not a node name"), "{err}");
}

/// One job of the cluster test: its scenario, sbatch options and environment.
struct Job {
    name: &'static str,
    scenario: &'static str,
    sbatch: &'static [&'static str],
    env: &'static [(&'static str, &'static str)],
}

const JOBS: &[Job] = &[
    Job {
        name: "spare",
        scenario: "exclude-rank1",
        sbatch: &["-N3", "--ntasks-per-node=1"],
        env: &[("REKINDLE_SPARE_NODES", "1")],
    },
    Job { name: "nospare", scenario: "exclude-rank1", sbatch: &["-N2", "-n2"], env: &[] },
    Job { name: "crash", scenario: "crash", sbatch: &["-N1", "-n1"], env: &[("REKINDLE_INJOB_MAX", "2")] },
    Job { name: "exit-0", scenario: "exit-0", sbatch: &["-N1", "-n1"], env: &[] },
    Job { name: "exit-75", scenario: "exit-75", sbatch: &["-N1", "-n1"], env: &[] },
    Job { name: "exit-78", scenario: "exit-78", sbatch: &["-N1", "-n1"], env: &[] },
    Job { name: "nohealthy", scenario: "exclude-self", sbatch: &["-N1", "-n1"], env: &[] },
    Job { name: "max0", scenario: "exclude-rank1", sbatch: &["-N2", "-n2"], env: &[("REKINDLE_INJOB_MAX", "0")] },
    Job { name: "stopped", scenario: "hang", sbatch: &["-N1", "-n1"], env: &[] },
];

/// One task's line in the fake's log.
#[derive(Debug, Clone)]
struct Task {
    step: String,
    restart: u32,
    rank: u32,
    size: u32,
    node: String,
    max: String,
    request: String,
    /// REKINDLE_INJOB_EXCLUDED as the task saw it.
    excluded: String,
    /// Unix seconds the task started.
    time: f64,
}

/// When the fake wrote its restart request (Unix seconds), if it did.
fn request_time(log: &Path) -> Option<f64> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines().find_map(|l| l.strip_prefix("request time=")).map(|t| t.parse().expect("a time"))
}

fn tasks(log: &Path) -> Vec<Task> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter(|line| line.starts_with("task "))
        .map(|line| {
            let field = |key: &str| {
                line.split(' ')
                    .find_map(|w| w.strip_prefix(&format!("{key}=")))
                    .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
                    .to_string()
            };
            Task {
                step: field("step"),
                restart: field("restart").parse().unwrap(),
                rank: field("rank").parse().unwrap(),
                size: field("size").parse().unwrap(),
                node: field("node"),
                max: field("max"),
                request: field("request"),
                excluded: field("excluded"),
                time: field("time").parse().unwrap(),
            }
        })
        .collect()
}

fn step_tasks<'a>(all: &'a [Task], restart: u32, step: &str) -> Vec<&'a Task> {
    all.iter().filter(|t| t.restart == restart && t.step == step).collect()
}

fn nodes_of(tasks: &[&Task]) -> BTreeSet<String> {
    tasks.iter().map(|t| t.node.clone()).collect()
}

struct Submitted {
    job: String,
    dir: PathBuf,
}

impl Submitted {
    fn log(&self) -> PathBuf {
        self.dir.join("fake.log")
    }
    fn output(&self) -> String {
        std::fs::read_to_string(self.dir.join(format!("slurm-{}.out", self.job))).unwrap_or_default()
    }
}

/// `scontrol show job -o JOB` as key=value pairs.
fn job_fields(cluster: &LocalCluster, job: &str) -> std::collections::BTreeMap<String, String> {
    let out = cluster.command("scontrol").args(["show", "job", "-o", job]).output().expect("run scontrol");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|w| w.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
        .collect()
}

const TERMINAL: [&str; 6] = ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"];

/// Waits until the job has ended; its final `scontrol show job` fields. A
/// terminal state is final here: the batch shell requeues with `scontrol
/// requeue` while it still runs, which makes the job PENDING at once
/// (../shared/FACTS.md), so a job to be requeued never shows a terminal
/// state first, and slurmctld moves no ended job by itself (no epilog
/// requeues on this cluster; NODE_FAIL requeues need a node lost, and no
/// job here loses one).
fn wait_final(cluster: &LocalCluster, job: &str, deadline: Instant) -> std::collections::BTreeMap<String, String> {
    loop {
        let fields = job_fields(cluster, job);
        let state = fields.get("JobState").cloned().unwrap_or_default();
        if TERMINAL.contains(&state.as_str()) {
            return fields;
        }
        assert!(Instant::now() < deadline, "job {job} did not end in time: {fields:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn the_batch_shell_restarts_in_the_job_falls_back_to_the_queue_or_exits_on_a_real_cluster() {
    if requires::slurm().is_none() {
        return;
    }
    let cluster = LocalCluster::up();
    let work = tempfile::tempdir().expect("temp dir");
    let fake = repo().join("tests/it/injob/fake-rekindle.sh");
    let mut submitted = std::collections::BTreeMap::new();
    for job in JOBS {
        let dir = work.path().join(job.name);
        std::fs::create_dir_all(&dir).unwrap();
        let mut sbatch = cluster.command("sbatch");
        // The submit directory holds the job's restart request.
        sbatch
            .current_dir(&dir)
            .args(["--parsable", "-J", &format!("injob-{}", job.name), "-D"])
            .arg(&dir)
            .arg("-o")
            .arg(dir.join("slurm-%j.out"))
            .args(job.sbatch)
            .arg(repo().join("slurm/orchestrator.slurm"))
            .args([job.scenario])
            .env("REKINDLE_BIN", &fake)
            .env("FAKE_LOG", dir.join("fake.log"))
            .env_remove("REKINDLE_INJOB_MAX")
            .env_remove("REKINDLE_SPARE_NODES")
            .envs(job.env.iter().copied());
        let out = sbatch.output().expect("run sbatch");
        let id = String::from_utf8_lossy(&out.stdout).trim().split(';').next().unwrap_or("").to_string();
        assert!(
            out.status.success() && id.parse::<u64>().is_ok(),
            "sbatch of {} failed: {}",
            job.name,
            String::from_utf8_lossy(&out.stderr)
        );
        submitted.insert(job.name, Submitted { job: id, dir });
    }

    // The stopped job: once its step runs, a stop for the batch shell only
    // (as preemption sends it); the shell forwards it, the step dies of it,
    // and that must not count as a crash to restart.
    let stopped = &submitted["stopped"];
    let t0 = Instant::now();
    while tasks(&stopped.log()).is_empty() {
        assert!(t0.elapsed() < Duration::from_secs(180), "the stopped job's step never started");
        std::thread::sleep(Duration::from_millis(300));
    }
    let out = cluster.command("scancel").args(["-s", "TERM", "--batch", &stopped.job]).output().unwrap();
    assert!(out.status.success(), "scancel: {}", String::from_utf8_lossy(&out.stderr));

    let deadline = Instant::now() + Duration::from_secs(400);
    let mut finals = std::collections::BTreeMap::new();
    for (name, s) in &submitted {
        finals.insert(*name, wait_final(&cluster, &s.job, deadline));
    }
    let field = |name: &str, key: &str| finals[name].get(key).cloned().unwrap_or_default();
    let context = |name: &str| {
        let s = &submitted[name];
        format!(
            "\njob {name} ({}): {:?}\noutput:\n{}\ntasks:\n{}",
            s.job,
            finals[name],
            s.output(),
            std::fs::read_to_string(s.log()).unwrap_or_default()
        )
    };
    let ended = |name: &str, state: &str, exit: &str, restarts: &str| {
        assert_eq!(
            (field(name, "JobState").as_str(), field(name, "ExitCode").as_str(), field(name, "Restarts").as_str()),
            (state, exit, restarts),
            "{}",
            context(name)
        );
    };

    // Every step got the contract's variables; the request is gone at the end.
    for (name, s) in &submitted {
        let request = s.dir.join(format!(".rekindle-injob-{}", s.job));
        for t in tasks(&s.log()) {
            assert_eq!(t.request, request.display().to_string(), "{}", context(name));
            let want_max =
                JOBS.iter().find(|j| j.name == *name).unwrap().env.iter().find(|(k, _)| *k == "REKINDLE_INJOB_MAX");
            assert_eq!(t.max, want_max.map_or("3", |(_, v)| *v), "{}", context(name));
        }
        assert!(!request.exists(), "the request file outlived the job{}", context(name));
    }

    // A spare: the lost node's rank moves to it, same world size, no requeue,
    // and the shell ended the hung step itself (the fake sleeps 300 s).
    let all = tasks(&submitted["spare"].log());
    let (first, second) = (step_tasks(&all, 0, "0"), step_tasks(&all, 0, "1"));
    let lost = first.iter().find(|t| t.rank == 1).map(|t| t.node.clone()).unwrap_or_default();
    assert!(
        first.len() == 2 && first.iter().all(|t| t.size == 2) && nodes_of(&first).len() == 2,
        "{}",
        context("spare")
    );
    assert!(
        first.iter().all(|t| t.excluded.is_empty()) && second.iter().all(|t| t.excluded == lost),
        "REKINDLE_INJOB_EXCLUDED: empty, then {lost}{}",
        context("spare")
    );
    assert!(
        second.len() == 2
            && second.iter().all(|t| t.size == 2)
            && nodes_of(&second).len() == 2
            && !nodes_of(&second).contains(&lost),
        "the second step must run 2 tasks on the 2 nodes other than {lost}{}",
        context("spare")
    );
    ended("spare", "COMPLETED", "0:0", "0");
    // The hung step is ended REQUEST_WAIT (3 s) after the request, srun 2 s
    // after its SIGTERM at most; the next step's tasks start at once.
    let requested = request_time(&submitted["spare"].log()).expect("the fake logged its request");
    let restarted = second.iter().map(|t| t.time).fold(f64::INFINITY, f64::min) - requested;
    eprintln!("injob: spare: the next step's tasks started {restarted:.1} s after the restart request");
    assert!(
        (0.0..15.0).contains(&restarted),
        "the next step started {restarted:.1} s after the request{}",
        context("spare")
    );
    let output = submitted["spare"].output();
    for want in [
        "holds 1 of its 3 nodes in reserve: 2 task(s) on 2 node(s)",
        "ending srun",
        &format!(
            "rekindle asks for an in-job restart: reason rank_lost, exclude '{lost}', resume from step 40, written by 1@{lost}"
        ),
        &format!("in-job restart 1/3: rekindle asked for it; excluded '{lost}'"),
        "next step 2 task(s) on 2 node(s)",
        &format!("--nodes=2 --ntasks=2 --exclude={lost} "),
    ] {
        assert!(output.contains(want), "no {want:?} in the output{}", context("spare"));
    }

    // No spare: the run goes on at one rank on the node left.
    let all = tasks(&submitted["nospare"].log());
    let first = step_tasks(&all, 0, "0");
    let lost = first.iter().find(|t| t.rank == 1).map(|t| t.node.clone()).unwrap_or_default();
    let second = step_tasks(&all, 0, "1");
    assert!(
        second.len() == 1 && second[0].size == 1 && second[0].node != lost,
        "the second step must run 1 task off {lost}{}",
        context("nospare")
    );
    ended("nospare", "COMPLETED", "0:0", "0");

    // An unexplained crash restarts in the job up to the bound, then the job
    // ends with the crash's code.
    let all = tasks(&submitted["crash"].log());
    let steps: Vec<&str> = all.iter().map(|t| t.step.as_str()).collect();
    assert_eq!(steps, ["0", "1", "2"], "{}", context("crash"));
    ended("crash", "FAILED", "137:0", "0");
    assert!(submitted["crash"].output().contains("exit 137: the step ended with 137 (a crash rekindle did not explain) and 2 of REKINDLE_INJOB_MAX=2 in-job restarts are done"), "{}", context("crash"));

    // rekindle's own exit codes end the job as before: one step each.
    for (name, state, exit) in
        [("exit-0", "COMPLETED", "0:0"), ("exit-75", "FAILED", "75:0"), ("exit-78", "FAILED", "78:0")]
    {
        assert_eq!(tasks(&submitted[name].log()).len(), 1, "{}", context(name));
        ended(name, state, exit, "0");
    }

    // A request with nowhere to go: the job is requeued (Restarts=1), and
    // its next run finishes.
    for (name, why) in
        [("nohealthy", "no healthy node is left in the job"), ("max0", "0 of REKINDLE_INJOB_MAX=0 are done")]
    {
        let all = tasks(&submitted[name].log());
        assert!(
            !step_tasks(&all, 0, "0").is_empty()
                && step_tasks(&all, 0, "1").is_empty()
                && !step_tasks(&all, 1, "0").is_empty(),
            "one step, a requeue, one step{}",
            context(name)
        );
        ended(name, "COMPLETED", "0:0", "1");
        let output = submitted[name].output();
        assert!(
            output.contains(&format!(
                "no in-job restart: rekindle asked for an in-job restart, but {why}; requeueing the job"
            )),
            "{}",
            context(name)
        );
        // The request's requeue_exclude (the node that asked) became the
        // requeued job's ExcNodeList, and its next run stayed off it. (Not
        // judged by the shell's line saying so: SLURM ends the requeued
        // run's batch shell, and its last lines may not reach the output.)
        let asked = step_tasks(&all, 0, "0").iter().map(|t| t.node.clone()).collect::<BTreeSet<_>>();
        let excluded = job_fields(&cluster, &submitted[name].job).get("ExcNodeList").cloned().unwrap_or_default();
        assert!(asked.contains(&excluded), "ExcNodeList={excluded}, first run on {asked:?}{}", context(name));
        assert!(!nodes_of(&step_tasks(&all, 1, "0")).contains(&excluded), "{}", context(name));
    }

    // A stop signal to the batch shell: the step's death is not a crash.
    assert_eq!(tasks(&stopped.log()).len(), 1, "{}", context("stopped"));
    ended("stopped", "FAILED", "143:0", "0");
    let output = stopped.output();
    assert!(output.contains("batch shell got SIGTERM"), "{}", context("stopped"));
    assert!(
        output.contains("exit 143: the step ended with 143 while the batch shell got SIGTERM"),
        "{}",
        context("stopped")
    );
}
