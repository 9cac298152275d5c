//! The node-local checkpoint tier (`[recovery] local`, docs/recovery.md),
//! driven for real: ranks under `mpirun`, each told its node by
//! `SLURMD_NODENAME` (so two "nodes" on this machine keep two local roots,
//! `<tmp>/local/<node>`), killed with SIGKILL between durable checkpoints
//! and started again as a restart inside a job would start them.
//!
//! - A node lost and a spare in its place: the new world resumes from the
//!   newest local checkpoint (newer than the durable one), copied from the
//!   surviving node to the spare, and ends byte-identical to a world never
//!   stopped.
//! - A damaged copy (caught by SHA-256): the other node's copy is used.
//! - No node holds a copy: the durable tier, and the `resume` event says why
//!   (naming the lost nodes that held the newest one).
//! - One process alone keeps a local tier too, and resumes from it, without
//!   reading the durable checkpoint the local one supersedes.
//! - No room for a copy: `local_checkpoint` skipped, training goes on; a
//!   write that fails (failpoint `local::write`): failed, the next commits.
//! - A node whose local directory cannot be made (a leader, a follower, a
//!   spare that should take the copy): the tier is off for the attempt,
//!   recorded once; the resume falls back to the durable tier, saying why.
//! - Issue #40: the local root is the user's alone (`rekindle-local-<uid>`,
//!   made 0700). A copy owned by another user, a `step-…` that is a link, a
//!   copy whose `WORLD.json` names another run or is a FIFO, and a root
//!   owned by another user are never resumed from (nor followed, nor
//!   blocked on): the durable tier is used and a failed `local_checkpoint`
//!   says which rank, node and directory, and why.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use support::requires;
use support::runs::{EXIT_DONE, Training, assert_same_checkpoint, events_named, last_logged_step};

const MAX_STEPS: u64 = 200;

/// The tiny mlp with durable checkpoints every 50 steps and a local one
/// every 5, kept under `<local>/<node>`.
fn training(local: &Path) -> Training {
    Training::tiny_mlp(MAX_STEPS)
        .set("checkpoint.every_steps=50")
        .set("checkpoint.interval=\"1h\"")
        .set("train.log_every=1")
        // The killed leader ran "on" another node name than this host's, so
        // its lock is taken over by age, not by a pid check.
        .set("lock.stale_after=\"2s\"")
        .set("recovery.local=true")
        .set("recovery.local_every_steps=5")
        .set(&format!("recovery.local_dir=\"{}/{{node}}\"", local.display()))
}

/// `cmd` with one rank per entry of `nodes`, each told that node.
fn on_nodes(cmd: &Command, nodes: &[&str]) -> Command {
    let mut mpi = crate::distributed::mpirun_with_env(cmd);
    for (r, node) in nodes.iter().enumerate() {
        if r > 0 {
            mpi.arg(":");
        }
        mpi.args(["-n", "1", "-x", &format!("SLURMD_NODENAME={node}")]);
        mpi.arg(cmd.get_program()).args(cmd.get_args());
    }
    mpi
}

/// `cmd` as one process on `nodes[0]`, or as one rank per node.
fn launch(mut cmd: Command, nodes: &[&str]) -> Command {
    if nodes.len() == 1 {
        cmd.env("SLURMD_NODENAME", nodes[0]);
        return cmd;
    }
    on_nodes(&cmd, nodes)
}

/// Runs `cmd` on `nodes` (one process alone when `nodes` has one entry) to
/// its end; asserts exit 0.
fn run_to_end(cmd: Command, nodes: &[&str]) {
    let out = launch(cmd, nodes).output().expect("start the run");
    assert_eq!(
        out.status.code(),
        Some(EXIT_DONE),
        "{:?}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The newest committed local checkpoint's step.
fn newest_local(run_dir: &Path) -> Option<u64> {
    events_named(run_dir, "local_checkpoint")
        .iter()
        .filter(|e| e["outcome"] == "committed")
        .filter_map(|e| e["step"].as_u64())
        .max()
}

fn newest_durable(run_dir: &Path) -> Option<u64> {
    events_named(run_dir, "checkpoint_saved").iter().filter_map(|e| e["step"].as_u64()).max()
}

/// Starts the run (its steps slowed by a failpoint, so it can be caught
/// between checkpoints), waits until a local checkpoint newer than every
/// durable one is committed, and SIGKILLs every process of it. Returns that
/// local checkpoint's step. Every node must hold its copy committed (it
/// writes `WORLD.json` when it hears rank 0's commit, in step with the
/// world, not when rank 0 records it), or the test would not know which
/// copies a restart finds.
fn kill_between_checkpoints(cmd: Command, nodes: &[&str], run_dir: &Path, local_base: &Path) -> u64 {
    use std::os::unix::process::CommandExt;
    let mut child = launch(cmd, nodes)
        .env("FAILPOINTS", "train::step=sleep(15)")
        .process_group(0)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the run");
    let t0 = Instant::now();
    loop {
        if let Some(local) = newest_local(run_dir)
            && local >= 60
            && newest_durable(run_dir).is_none_or(|d| local > d)
            && nodes.iter().all(|node| committed_on(local_base, node, local))
        {
            // OpenMPI starts ranks outside mpirun's process group: each
            // rank is killed by the pid its heartbeat names (in its node's
            // file, src/attempt/rank_watch.rs).
            let pids: Vec<i64> = std::fs::read_dir(run_dir.join("ranks"))
                .into_iter()
                .flatten()
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("node-"))
                .filter_map(|e| serde_json::from_slice::<Value>(&std::fs::read(e.path()).ok()?).ok())
                .flat_map(|node| node["beats"].as_array().cloned().unwrap_or_default())
                .filter_map(|b| b["pid"].as_i64())
                .collect();
            // (One process has no heartbeat: mpirun's process group holds it.)
            assert!(nodes.len() == 1 || pids.len() == nodes.len(), "every rank's beat names its pid: {pids:?}");
            for pid in pids {
                let _ =
                    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGKILL);
            }
            let pgid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
            let _ = child.wait();
            // The lock of a holder "on another node" is taken over once its
            // heartbeat is older than lock.stale_after (2 s): outside a
            // SLURM job a younger one is refused, not waited for. The sleep
            // is that scenario (the killed holder's heartbeat going stale).
            std::thread::sleep(Duration::from_millis(2500));
            return newest_local(run_dir).expect("checked above");
        }
        assert!(child.try_wait().unwrap().is_none(), "the run ended before it could be killed between checkpoints");
        assert!(t0.elapsed() < Duration::from_secs(120), "no local checkpoint past step 60 in 2 minutes");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// This user's folder in node `node`'s local directory under `local`.
fn user_dir(local: &Path, node: &str) -> PathBuf {
    use rekindle::checkpoint::private::{private_dir_name, user};
    local.join(node).join(private_dir_name(user()))
}

/// The local root of the run in `run` on node `node`.
fn run_root(local: &Path, node: &str, run: &Path) -> PathBuf {
    user_dir(local, node).join(rekindle::checkpoint::local::run_key(&std::path::absolute(run).unwrap()))
}

/// Whether `node`'s local root under `local` holds a committed copy of `step`.
fn committed_on(local: &Path, node: &str, step: u64) -> bool {
    let root = user_dir(local, node);
    let runs = std::fs::read_dir(root).into_iter().flatten().flatten();
    runs.into_iter().any(|run| run.path().join(rekindle::checkpoint::step_dir_name(step)).join("WORLD.json").is_file())
}

fn resume_event(run_dir: &Path) -> Value {
    events_named(run_dir, "resume").pop().expect("a resume event")
}

/// The last resume's `fallback_reason`, and the event, once it is checked
/// to come from the durable checkpoint of step `durable`.
fn durable_fallback(run_dir: &Path, durable: u64) -> (String, Value) {
    let resume = resume_event(run_dir);
    assert_eq!((resume["step"].as_u64(), resume["tier"].as_str()), (Some(durable), Some("durable")), "{resume}");
    (resume["fallback_reason"].as_str().unwrap_or_default().to_string(), resume)
}

/// The reference: the same training on `nodes` never stopped.
fn reference(tmp: &Path, nodes: &[&str]) -> PathBuf {
    let dir = tmp.join("reference");
    run_to_end(training(&tmp.join("reference-local")).command(&dir, &[]), nodes);
    dir
}

fn local_copy(local: &Path, node: &str, step: u64) -> PathBuf {
    let root = user_dir(local, node);
    let run = std::fs::read_dir(&root).expect("a run folder").next().expect("one run").expect("entry").path();
    run.join(rekindle::checkpoint::step_dir_name(step))
}

#[test]
fn a_spare_node_takes_a_lost_nodes_place_from_the_local_tier_bit_exact() {
    let Some(()) = requires::mpi() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let reference = reference(tmp.path(), &["a", "b"]);
    let (run, local) = (tmp.path().join("run"), tmp.path().join("local"));
    let killed_at = kill_between_checkpoints(training(&local).command(&run, &[]), &["a", "b"], &run, &local);
    let before = last_logged_step(&run).unwrap();
    let committed = events_named(&run, "local_checkpoint");
    let last = committed.iter().rfind(|e| e["outcome"] == "committed").unwrap();
    assert_eq!(last["holders"], serde_json::json!(["a", "b"]), "every node holds a copy: {last}");
    assert!(local_copy(&local, "b", killed_at).join("WORLD.json").is_file());
    // Node b is gone: the new world runs on a and on the spare c.
    std::fs::remove_dir_all(local.join("b")).unwrap();
    run_to_end(training(&local).command(&run, &[]), &["a", "c"]);
    let resume = resume_event(&run);
    assert_eq!((resume["step"].as_u64(), resume["tier"].as_str()), (Some(killed_at), Some("local")), "{resume}");
    assert_eq!(resume["source_node"], "a", "{resume}");
    // The spare loaded the copy a sent it (else it could not have trained
    // in step, and the end would differ), and writes copies of its own now.
    let last_commit = events_named(&run, "local_checkpoint").pop().unwrap();
    assert_eq!(last_commit["holders"], serde_json::json!(["a", "c"]), "{last_commit}");
    let recovery = events_named(&run, "recovery").pop().expect("a recovery event");
    assert_eq!((recovery["fault"].as_str(), recovery["tier"].as_str()), (Some("killed"), Some("local")), "{recovery}");
    // Exactly the steps trained after the newest copy the world committed
    // are lost (the test chose when to kill, so how many that is measures
    // the test, not the product: the bound on it is judged from the
    // configuration by the in-job drills, slurm/drill_check.py).
    assert_eq!(recovery["steps_lost"].as_u64(), Some(before - killed_at), "{recovery}");
    // What the product did before the kill, bounded by the configuration
    // (`local_every_steps = 5`): every copy the killed world committed fell
    // due on the cadence (a late one records the step it was due at, and
    // starts after it), and the newest of them is the copy resumed from.
    let killed_world: Vec<(u64, u64)> = events_named(&run, "local_checkpoint")
        .iter()
        .filter(|e| e["outcome"] == "committed" && e["holders"] == serde_json::json!(["a", "b"]))
        .filter_map(|e| Some((e["step"].as_u64()?, e["due_step"].as_u64().or(e["step"].as_u64())?)))
        .collect();
    assert!(
        killed_world.iter().all(|(step, due)| due % 5 == 0 && due <= step && *step <= killed_at),
        "local copies off the configured cadence: {killed_world:?}"
    );
    assert_eq!(killed_world.last().map(|(step, _)| *step), Some(killed_at), "{killed_world:?}");
    assert_same_checkpoint(&run, &reference, MAX_STEPS);
}

#[test]
fn a_damaged_copy_is_caught_by_its_sha256_and_the_other_nodes_copy_is_used() {
    let Some(()) = requires::mpi() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let reference = reference(tmp.path(), &["a", "b"]);
    let (run, local) = (tmp.path().join("run"), tmp.path().join("local"));
    let killed_at = kill_between_checkpoints(training(&local).command(&run, &[]), &["a", "b"], &run, &local);
    let model = local_copy(&local, "a", killed_at).join("model.safetensors");
    let mut bytes = std::fs::read(&model).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    std::fs::write(&model, bytes).unwrap();
    run_to_end(training(&local).command(&run, &[]), &["a", "b"]);
    let resume = resume_event(&run);
    assert_eq!((resume["step"].as_u64(), resume["tier"].as_str()), (Some(killed_at), Some("local")), "{resume}");
    assert_eq!(resume["source_node"], "b", "a's copy does not verify, b's does: {resume}");
    assert_same_checkpoint(&run, &reference, MAX_STEPS);
}

#[test]
fn without_a_copy_on_any_node_the_durable_tier_is_used_and_the_resume_says_why() {
    let Some(()) = requires::mpi() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let reference = reference(tmp.path(), &["a", "b"]);
    let (run, local) = (tmp.path().join("run"), tmp.path().join("local"));
    kill_between_checkpoints(training(&local).command(&run, &[]), &["a", "b"], &run, &local);
    let durable = newest_durable(&run).expect("a durable checkpoint at step 50");
    // Both nodes lost: the new world runs on two spares.
    run_to_end(training(&local).command(&run, &[]), &["c", "d"]);
    let (reason, resume) = durable_fallback(&run, durable);
    assert!(reason.contains("no node holds"), "{resume}");
    assert!(reason.contains("every node that held the newest local checkpoint (step "), "{resume}");
    assert!(reason.contains(": a, b) is gone from this world"), "the lost nodes are named: {resume}");
    assert_same_checkpoint(&run, &reference, MAX_STEPS);
}

#[test]
fn one_process_resumes_from_its_own_local_tier_bit_exact() {
    let tmp = tempfile::tempdir().unwrap();
    let reference = reference(tmp.path(), &["solo"]);
    let (run, local) = (tmp.path().join("run"), tmp.path().join("local"));
    let killed_at = kill_between_checkpoints(training(&local).command(&run, &[]), &["solo"], &run, &local);
    run_to_end(training(&local).command(&run, &[]), &["solo"]);
    let resume = resume_event(&run);
    assert_eq!((resume["step"].as_u64(), resume["tier"].as_str()), (Some(killed_at), Some("local")), "{resume}");
    assert_same_checkpoint(&run, &reference, MAX_STEPS);
}

#[test]
fn a_node_without_room_skips_its_local_checkpoints_and_training_goes_on() {
    let tmp = tempfile::tempdir().unwrap();
    let (run, local) = (tmp.path().join("run"), tmp.path().join("local"));
    let training = training(&local).set("recovery.local_max_share=1e-15");
    run_to_end(training.command(&run, &[]), &["solo"]);
    let saves = events_named(&run, "local_checkpoint");
    assert!(!saves.is_empty() && saves.iter().all(|e| e["outcome"] == "skipped"), "{saves:?}");
    assert!(saves[0]["reason"].as_str().is_some_and(|r| r.contains("local_max_share")), "{}", saves[0]);
    assert_eq!(events_named(&run, "finish").len(), 1);
}

/// A run under (pretend) SLURM job 77 whose step fails after 25 passed (a
/// device error: transient), under a batch shell that offers in-job restarts.
fn crashing_under_a_shell(
    dir: &Path,
    fake: &support::scontrol::FakeScontrol,
    request: &Path,
    restarts: u32,
) -> support::cli::RunCmd {
    support::cli::RunCmd::new(dir)
        .set("run.max_steps=1000")
        .set("checkpoint.every_steps=10")
        .env("PATH", fake.path())
        .env("SLURM_JOB_ID", "77")
        .env("SLURMD_NODENAME", "n1")
        .env("FAILPOINTS", "train::step_error=25*off->return")
        .env("REKINDLE_INJOB_REQUEST", request)
        .env("REKINDLE_INJOB_RESTARTS", restarts.to_string())
        .env("REKINDLE_INJOB_MAX", "2")
}

#[test]
fn a_transient_crash_under_a_shell_that_offers_it_asks_for_an_in_job_restart_not_a_requeue() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, request) = (tmp.path().join("run"), tmp.path().join("request"));
    let fake = support::scontrol::FakeScontrol::running_job(tmp.path());
    crashing_under_a_shell(&dir, &fake, &request, 0).run(Duration::from_secs(120)).assert_code(1);
    let text = std::fs::read_to_string(&request).expect("a request for the batch shell");
    let asked = rekindle::slurm::injob::RestartRequest::parse(&text).expect("a restart request");
    assert_eq!((asked.reason.as_str(), asked.exclude.len()), ("crash: transient", 0), "{text}");
    assert_eq!(asked.written_by, "0@n1");
    // A job of one node restarts in the job on it (nothing excluded from the
    // step), but should the shell requeue instead, the crash's node is left
    // behind: the request carries the plan, made by reading the job only.
    assert_eq!(asked.requeue_exclude, ["n1"], "{text}");
    let calls = fake.calls();
    assert!(calls.iter().all(|c| c.starts_with("show job")), "no scontrol requeue, no hold: {calls:?}");
    let read_before = calls.len();
    let error = events_named(&dir, "error").pop().unwrap();
    assert_eq!(error["requeue"]["decision"], "skip", "{error}");
    assert!(error["requeue"]["reason"].as_str().unwrap().contains("in-job restart 1 of 2"), "{error}");
    // The shell's bound spent: requeued with a hold, as without a shell.
    std::fs::remove_file(&request).unwrap();
    crashing_under_a_shell(&dir, &fake, &request, 2).run(Duration::from_secs(120)).assert_code(1);
    assert!(!request.exists(), "no request once the bound is spent");
    // The step failed after others passed (a device error): its node is
    // left behind by the requeued job.
    assert_eq!(
        fake.calls()[read_before..],
        [
            "show job -o 77",
            "requeue 77",
            "update JobId=77 StartTime=now+60",
            "show job -o 77",
            "update JobId=77 ExcNodeList=n1"
        ]
    );
}

/// `training` run on `nodes` whose local directory on node `unwritable`
/// cannot be made (a regular file where its parent directory should be:
/// tests run as root, so a mode would not stop the write).
fn with_unwritable_node(local: &Path, unwritable: &str) {
    std::fs::create_dir_all(local).unwrap();
    std::fs::write(local.join(unwritable), b"a file, not a directory").unwrap();
}

/// The one `local_checkpoint` event of an attempt whose tier was off (the
/// last one): `failed`, naming `rank` on `node`, the directory it could not
/// make and the OS error; the run finished on its durable checkpoints.
fn assert_tier_off(run: &Path, local: &Path, rank: usize, node: &str) {
    let events = support::runs::events(run);
    let last_start = events.iter().rposition(|e| e["event"] == "start").expect("a start event");
    let saves: Vec<&Value> = events[last_start..].iter().filter(|e| e["event"] == "local_checkpoint").collect();
    assert_eq!(saves.len(), 1, "one event, no save started: {saves:?}");
    assert_eq!(saves[0]["outcome"], "failed", "{}", saves[0]);
    let reason = saves[0]["reason"].as_str().unwrap_or_default();
    let dir = user_dir(local, node).display().to_string();
    for part in [format!("rank {rank} on {node}").as_str(), &dir, "Not a directory", "local_dir"] {
        assert!(reason.contains(part), "the reason names {part}: {reason}");
    }
    assert_eq!(events_named(run, "finish").len(), 1);
    assert_eq!(newest_durable(run), Some(MAX_STEPS), "the durable tier went on");
}

#[test]
fn a_follower_node_whose_local_directory_is_unwritable_turns_the_tier_off_and_training_goes_on() {
    let Some(()) = requires::mpi() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (run, local) = (tmp.path().join("run"), tmp.path().join("local"));
    with_unwritable_node(&local, "b");
    run_to_end(training(&local).command(&run, &[]), &["a", "b"]);
    assert_tier_off(&run, &local, 1, "b");
}

#[test]
fn a_leader_whose_local_directory_is_unwritable_turns_the_tier_off_and_training_goes_on() {
    let tmp = tempfile::tempdir().unwrap();
    let (run, local) = (tmp.path().join("run"), tmp.path().join("local"));
    with_unwritable_node(&local, "solo");
    run_to_end(training(&local).command(&run, &[]), &["solo"]);
    assert_tier_off(&run, &local, 0, "solo");
}

#[test]
fn a_local_write_that_fails_is_recorded_and_the_next_save_commits() {
    let tmp = tempfile::tempdir().unwrap();
    let (run, local) = (tmp.path().join("run"), tmp.path().join("local"));
    let mut cmd = training(&local).command(&run, &[]);
    cmd.env("FAILPOINTS", "local::write=2*return(EIO)->off");
    run_to_end(cmd, &["solo"]);
    let saves = events_named(&run, "local_checkpoint");
    let outcomes: Vec<&str> = saves.iter().take(3).map(|e| e["outcome"].as_str().unwrap_or_default()).collect();
    assert_eq!(outcomes, ["failed", "failed", "committed"], "{saves:?}");
    assert_eq!(saves[0]["reason"], "rank 0 on solo: failpoint local::write: EIO", "{}", saves[0]);
    assert_eq!(events_named(&run, "finish").len(), 1);
}

#[test]
fn a_new_node_that_cannot_take_the_local_copy_falls_back_to_the_durable_tier_and_says_why() {
    let Some(()) = requires::mpi() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (run, local) = (tmp.path().join("run"), tmp.path().join("local"));
    kill_between_checkpoints(training(&local).command(&run, &[]), &["a", "b"], &run, &local);
    let durable = newest_durable(&run).expect("a durable checkpoint at step 50");
    // Node b is gone; the spare c that takes its place cannot write locally.
    with_unwritable_node(&local, "c");
    run_to_end(training(&local).command(&run, &[]), &["a", "c"]);
    let (reason, resume) = durable_fallback(&run, durable);
    assert!(reason.contains("could not be copied to every node: rank 1 on c"), "{resume}");
    assert!(reason.contains("Not a directory"), "{resume}");
    assert_tier_off(&run, &local, 1, "c");
}

#[test]
fn a_resume_from_the_local_tier_never_reads_the_durable_checkpoint_it_supersedes() {
    let tmp = tempfile::tempdir().unwrap();
    let (run, local) = (tmp.path().join("run"), tmp.path().join("local"));
    let killed_at = kill_between_checkpoints(training(&local).command(&run, &[]), &["solo"], &run, &local);
    let durable = newest_durable(&run).expect("a durable checkpoint at step 50");
    // Its tensors damaged, its manifest and sizes intact: only reading its
    // contents (and hashing them) can tell.
    let model = support::runs::step_dir(&run, durable).join("model.safetensors");
    let mut bytes = std::fs::read(&model).unwrap();
    bytes[100] ^= 0x01;
    std::fs::write(&model, bytes).unwrap();
    run_to_end(training(&local).command(&run, &[]), &["solo"]);
    let resume = resume_event(&run);
    assert_eq!((resume["step"].as_u64(), resume["tier"].as_str()), (Some(killed_at), Some("local")), "{resume}");
    let read = [events_named(&run, "checkpoint_rejected"), events_named(&run, "checkpoint_quarantined")].concat();
    assert!(read.is_empty(), "the durable checkpoint was read and verified: {read:?}");
}

/// Runs `cmd` on `nodes` to its end within two minutes (killed, and the
/// test failed, if it hangs); asserts exit 0.
fn run_to_end_within(cmd: Command, nodes: &[&str]) {
    use std::os::unix::process::CommandExt;
    let mut child = launch(cmd, nodes)
        .process_group(0)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the run");
    let t0 = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if t0.elapsed() > Duration::from_secs(120) {
            let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::SIGKILL);
            let _ = child.wait();
            panic!("the run hung for two minutes");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(EXIT_DONE), "{status:?}\nstderr:\n{stderr}");
}

/// Gives `path` and everything under it to `uid`, as if that user had made them.
fn chown_tree(path: &Path, uid: u32) {
    std::os::unix::fs::lchown(path, Some(uid), None).unwrap();
    if std::fs::symlink_metadata(path).unwrap().is_dir() {
        for entry in std::fs::read_dir(path).unwrap() {
            chown_tree(&entry.unwrap().path(), uid);
        }
    }
}

/// The reasons of the failed `local_checkpoint` events of the last attempt.
fn failed_local_reasons(run: &Path) -> Vec<String> {
    let events = support::runs::events(run);
    let last_start = events.iter().rposition(|e| e["event"] == "start").expect("a start event");
    events[last_start..]
        .iter()
        .filter(|e| e["event"] == "local_checkpoint" && e["outcome"] == "failed")
        .map(|e| e["reason"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// Asserts that one failed `local_checkpoint` of the last attempt names
/// every one of `parts`.
fn assert_refused(run: &Path, parts: &[&str]) {
    let reasons = failed_local_reasons(run);
    assert!(
        reasons.iter().any(|r| parts.iter().all(|p| r.contains(p))),
        "no failed local_checkpoint names {parts:?}: {reasons:#?}"
    );
}

/// Removes every copy of node `node` but the one of `step` (the tier keeps
/// two): then only that one could be resumed from.
fn keep_only(local: &Path, node: &str, step: u64) -> PathBuf {
    let copy = local_copy(local, node, step);
    for entry in std::fs::read_dir(copy.parent().unwrap()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("step-") && path != copy {
            std::fs::remove_dir_all(&path).unwrap();
        }
    }
    copy
}

/// Another user's uid (tests run as root, which may give files away).
const OTHER_UID: u32 = 12345;

#[test]
fn issue_40_a_copy_owned_by_another_user_is_never_resumed_and_the_refusal_says_why() {
    let tmp = tempfile::tempdir().unwrap();
    let (run, local) = (tmp.path().join("run"), tmp.path().join("local"));
    let killed_at = kill_between_checkpoints(training(&local).command(&run, &[]), &["solo"], &run, &local);
    let durable = newest_durable(&run).expect("a durable checkpoint at step 50");
    // Made private: the user's folder and the run's, 0700.
    for dir in [user_dir(&local, "solo"), run_root(&local, "solo", &run)] {
        let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&dir).unwrap().permissions());
        assert_eq!(mode & 0o7777, 0o700, "{}", dir.display());
    }
    // A whole, valid copy of this run, but another user's.
    let copy = keep_only(&local, "solo", killed_at);
    chown_tree(&copy, OTHER_UID);
    let before = support::snapshot(&copy);
    run_to_end_within(training(&local).command(&run, &[]), &["solo"]);
    let (reason, resume) = durable_fallback(&run, durable);
    assert!(!reason.is_empty(), "{resume}");
    let copy_shown = copy.display().to_string();
    assert_refused(&run, &["rank 0 on solo", &copy_shown, &format!("owned by uid {OTHER_UID}")]);
    let aside = copy.with_file_name(format!("refused-{}", copy.file_name().unwrap().to_string_lossy()));
    assert_eq!(support::snapshot(&aside), before, "another user's copy is moved aside, not written over nor removed");
}

#[test]
fn issue_40_a_local_root_owned_by_another_user_turns_the_tier_off_and_the_durable_tier_is_used() {
    let tmp = tempfile::tempdir().unwrap();
    let (run, local) = (tmp.path().join("run"), tmp.path().join("local"));
    kill_between_checkpoints(training(&local).command(&run, &[]), &["solo"], &run, &local);
    let durable = newest_durable(&run).expect("a durable checkpoint at step 50");
    // As if another user had made this user's folder first, with copies in it.
    let folder = user_dir(&local, "solo");
    chown_tree(&folder, OTHER_UID);
    run_to_end_within(training(&local).command(&run, &[]), &["solo"]);
    durable_fallback(&run, durable);
    let folder_shown = folder.display().to_string();
    assert_refused(&run, &["rank 0 on solo", &folder_shown, &format!("owned by uid {OTHER_UID}"), "tier is off"]);
    assert_eq!(newest_durable(&run), Some(MAX_STEPS), "the durable tier went on");
}

#[test]
fn issue_40_a_step_that_is_a_symlink_is_never_followed() {
    let tmp = tempfile::tempdir().unwrap();
    let (run, local) = (tmp.path().join("run"), tmp.path().join("local"));
    let killed_at = kill_between_checkpoints(training(&local).command(&run, &[]), &["solo"], &run, &local);
    let durable = newest_durable(&run).expect("a durable checkpoint at step 50");
    // The copy moved elsewhere, and a link to it in its place.
    let copy = keep_only(&local, "solo", killed_at);
    let elsewhere = tmp.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let target = elsewhere.join(copy.file_name().unwrap());
    std::fs::rename(&copy, &target).unwrap();
    std::os::unix::fs::symlink(&target, &copy).unwrap();
    let before = support::listing(&elsewhere);
    run_to_end_within(training(&local).command(&run, &[]), &["solo"]);
    durable_fallback(&run, durable);
    assert_refused(&run, &["rank 0 on solo", &copy.display().to_string(), "symbolic link"]);
    assert_eq!(support::listing(&elsewhere), before, "nothing is written through the link");
}

#[test]
fn issue_40_a_copy_whose_world_record_names_another_run_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let (first, local) = (tmp.path().join("first"), tmp.path().join("local"));
    let killed_at = kill_between_checkpoints(training(&local).command(&first, &[]), &["solo"], &first, &local);
    // A whole copy of the first run, put where the second run's copies are.
    let second = tmp.path().join("second");
    let root = run_root(&local, "solo", &second);
    std::fs::create_dir(&root).unwrap();
    std::fs::set_permissions(&root, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let copy = root.join(rekindle::checkpoint::step_dir_name(killed_at));
    let source = run_root(&local, "solo", &first).join(rekindle::checkpoint::step_dir_name(killed_at));
    let status = Command::new("cp").arg("-a").arg(source).arg(&copy).status().unwrap();
    assert!(status.success());
    run_to_end_within(training(&local).command(&second, &[]), &["solo"]);
    assert!(events_named(&second, "resume").is_empty(), "a fresh start, not a resume");
    let first_shown = std::path::absolute(&first).unwrap().display().to_string();
    assert_refused(&second, &["rank 0 on solo", &format!("names the run {first_shown}, not this one")]);
}

#[test]
fn issue_40_a_fifo_at_world_json_does_not_hang_the_run_and_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let (run, local) = (tmp.path().join("run"), tmp.path().join("local"));
    let killed_at = kill_between_checkpoints(training(&local).command(&run, &[]), &["solo"], &run, &local);
    let durable = newest_durable(&run).expect("a durable checkpoint at step 50");
    let world = keep_only(&local, "solo", killed_at).join("WORLD.json");
    std::fs::remove_file(&world).unwrap();
    nix::unistd::mkfifo(&world, nix::sys::stat::Mode::S_IRWXU).unwrap();
    run_to_end_within(training(&local).command(&run, &[]), &["solo"]);
    durable_fallback(&run, durable);
    assert_refused(&run, &["rank 0 on solo", &world.display().to_string(), "a FIFO"]);
}

/// `cmd` run under umask 002 (as docs/run-directory.md suggests for labs).
fn under_umask_002(mut cmd: Command) -> Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: umask is async-signal-safe and touches no memory.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o002));
            Ok(())
        });
    }
    cmd
}

#[test]
fn issue_40_copies_written_under_umask_002_are_private_and_still_resumed_from() {
    let tmp = tempfile::tempdir().unwrap();
    let (run, local) = (tmp.path().join("run"), tmp.path().join("local"));
    let cmd = under_umask_002(training(&local).command(&run, &[]));
    let killed_at = kill_between_checkpoints(cmd, &["solo"], &run, &local);
    let model = local_copy(&local, "solo", killed_at).join("model.safetensors");
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&model).unwrap().permissions());
    assert_eq!(mode & 0o022, 0, "made writable by the user alone: {mode:o}");
    run_to_end(under_umask_002(training(&local).command(&run, &[])), &["solo"]);
    let resume = resume_event(&run);
    assert_eq!((resume["step"].as_u64(), resume["tier"].as_str()), (Some(killed_at), Some("local")), "{resume}");
    assert!(failed_local_reasons(&run).is_empty(), "nothing of its own is refused");
}

#[test]
fn issue_40_a_follower_nodes_foreign_copy_is_refused_recorded_by_rank_0_and_the_other_nodes_copy_used() {
    let Some(()) = requires::mpi() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (run, local) = (tmp.path().join("run"), tmp.path().join("local"));
    let killed_at = kill_between_checkpoints(training(&local).command(&run, &[]), &["a", "b"], &run, &local);
    let copy = local_copy(&local, "b", killed_at);
    chown_tree(&copy, OTHER_UID);
    let before = support::snapshot(&copy);
    run_to_end(training(&local).command(&run, &[]), &["a", "b"]);
    let resume = resume_event(&run);
    assert_eq!((resume["step"].as_u64(), resume["tier"].as_str()), (Some(killed_at), Some("local")), "{resume}");
    assert_eq!(resume["source_node"], "a", "b's copy is refused, a's is used: {resume}");
    assert_refused(&run, &["rank 1 on b", &copy.display().to_string(), &format!("owned by uid {OTHER_UID}")]);
    let aside = copy.with_file_name(format!("refused-{}", copy.file_name().unwrap().to_string_lossy()));
    assert_eq!(support::snapshot(&aside), before, "moved aside on b, not written over nor removed");
}
