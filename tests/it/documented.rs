//! Documented behaviour that no other test drove through the real binary
//! (issue #34): `rekindle doctor`'s exit 1 on a failed required check;
//! `rekindle gpus --inventory FILE` (devices, plan, `--json`, a bad
//! inventory); `rekindle data validate`'s exit codes and `--out`; `rekindle
//! exec` ending the program's own children (the SIGTERM to the whole group,
//! the deadline's SIGKILL, the group kill when the program exits); and the
//! Python client's `deadline()` before and after a stop.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};

use crate::support::cli::{RunCmd, last_event};
use crate::support::requires;
use crate::support::runs::{EXIT_DONE, outcome, rekindle, tiny_config};

/// Longest wait for a child to reach a point or to exit (debug build on a
/// shared machine: generous, it only bounds a hang).
const TIMEOUT: Duration = Duration::from_secs(120);

/// `rekindle ARGS…` to its end: (exit code, stdout, stderr).
fn rekindle_out(args: &[&str]) -> (i32, String, String) {
    outcome(&rekindle().args(args).output().expect("start rekindle"))
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 temporary path")
}

// ---------------------------------------------------------------------------
// `rekindle doctor` (docs/placement.md, "rekindle doctor"; `doctor --help`:
// "Exit 1 if a required check fails").

/// configs/tiny.toml with `[checkpoint] dir = checkpoint_dir` and `gpu` as the
/// body of its `[gpu]` section, written into `dir`.
fn doctor_config(dir: &Path, checkpoint_dir: &Path, gpu: &str) -> PathBuf {
    let tiny = std::fs::read_to_string(tiny_config()).unwrap();
    let (before_gpu, _) = tiny.split_once("[gpu]").expect("tiny.toml has a [gpu] section");
    let with_dir =
        before_gpu.replacen("[checkpoint]\n", &format!("[checkpoint]\ndir = {}\n", toml_string(checkpoint_dir)), 1);
    let path = dir.join("doctor.toml");
    std::fs::write(&path, format!("{with_dir}[gpu]\n{gpu}\n")).unwrap();
    path
}

fn toml_string(p: &Path) -> String {
    serde_json::to_string(path_str(p)).unwrap()
}

/// An inventory of GPUs, as `--inventory` reads it (docs/placement.md).
fn inventory(dir: &Path, name: &str, devices: Value) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, serde_json::to_vec(&json!({ "devices": devices })).unwrap()).unwrap();
    path
}

/// The `.rekindle-doctor-*` directories left in `dir`.
fn doctor_leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".rekindle-doctor-"))
        .collect()
}

#[test]
fn doctor_exits_0_when_ready_and_leaves_nothing_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let none = inventory(tmp.path(), "none.json", json!([]));
    let config = doctor_config(tmp.path(), &tmp.path().join("store/checkpoints"), "backend = \"cpu\"");
    let (code, stdout, stderr) =
        rekindle_out(&["doctor", "--config", path_str(&config), "--inventory", path_str(&none)]);
    assert_eq!(code, EXIT_DONE, "{stdout}{stderr}");
    assert!(
        stdout.contains("[ ok ] checkpoint round-trip: wrote, fsynced, renamed, verified and reloaded"),
        "{stdout}"
    );
    assert!(stdout.trim_end().ends_with(": ready"), "{stdout}");
    // The round-trip ran beside the checkpoint directory, in a temporary
    // directory it removed; the checkpoint directory itself is not created.
    assert_eq!(doctor_leftovers(tmp.path()), Vec::<String>::new());
    assert!(!tmp.path().join("store").exists(), "doctor created the checkpoint directory");
}

#[test]
fn doctor_exits_1_when_the_checkpoint_directory_cannot_be_created() {
    // Tests run as root, for whom no mode bits make a directory unwritable:
    // the checkpoint directory's parent is a regular file instead.
    let tmp = tempfile::tempdir().unwrap();
    let blocker = tmp.path().join("a-file");
    std::fs::write(&blocker, "").unwrap();
    let none = inventory(tmp.path(), "none.json", json!([]));
    let config = doctor_config(tmp.path(), &blocker.join("checkpoints"), "backend = \"cpu\"");
    let args = ["doctor", "--config", path_str(&config), "--inventory", path_str(&none)];
    let (code, stdout, stderr) = rekindle_out(&args);
    assert_eq!(code, 1, "a failed required check exits 1:\n{stdout}{stderr}");
    let line = stdout.lines().find(|l| l.contains("checkpoint round-trip")).unwrap_or_else(|| panic!("{stdout}"));
    assert!(line.starts_with("[FAIL] checkpoint round-trip (required): cannot create a directory in"), "{line}");
    assert!(line.contains(path_str(&blocker)), "names the place: {line}");
    // Skipped: publishing, and with backend = "cpu" the device checks and no site command.
    assert!(stdout.trim_end().ends_with("1 failed, 5 skipped: a required check failed"), "{stdout}");

    // The same verdict as JSON, with the same exit code.
    let mut json_args = args.to_vec();
    json_args.push("--json");
    let (code, stdout, stderr) = rekindle_out(&json_args);
    assert_eq!(code, 1, "{stdout}{stderr}");
    let list: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(list["required_failed"], true, "{list}");
    let checks = list["checks"].as_array().unwrap();
    let failed: Vec<&Value> = checks.iter().filter(|c| c["status"] == "fail").collect();
    assert_eq!(failed.len(), 1, "{list}");
    assert_eq!((&failed[0]["name"], &failed[0]["required"]), (&json!("checkpoint round-trip"), &json!(true)));
    assert!(blocker.is_file(), "the blocking file is untouched");
}

/// A config with a typo is the config check's failure, not an error
/// without a checklist (it exited 78 with nothing else): every problem is
/// named, the rest of the checklist runs, and the exit is 1 as documented.
/// `--set` checks the config `run --set …` would use.
#[test]
fn doctor_prints_the_checklist_for_a_config_that_does_not_load_and_takes_set() {
    let tmp = tempfile::tempdir().unwrap();
    let none = inventory(tmp.path(), "none.json", json!([]));
    let typo = tmp.path().join("typo.toml");
    std::fs::write(&typo, "[run]\nmax_step = 10\n[checkpoint]\nkeeep = 2\n").unwrap();
    let (code, stdout, stderr) = rekindle_out(&["doctor", "--config", path_str(&typo), "--inventory", path_str(&none)]);
    assert_eq!(code, 1, "{stdout}{stderr}");
    let line = stdout.lines().find(|l| l.contains("] config")).unwrap_or_else(|| panic!("{stdout}"));
    assert!(line.starts_with("[FAIL] config (required): cannot be used:"), "{line}");
    assert!(line.contains("max_step") && line.contains("keeep"), "every problem is named: {line}");
    assert!(stdout.contains("] matmul cpu"), "the rest of the checklist ran: {stdout}");

    let config = doctor_config(tmp.path(), &tmp.path().join("checkpoints"), "backend = \"cpu\"");
    let args = ["doctor", "--config", path_str(&config), "--inventory", path_str(&none)];
    let (code, stdout, stderr) =
        rekindle_out(&[&args[..], &["--set", "gpu.backend=\"auto\"", "--set", "gpu.require=true"]].concat());
    assert_eq!(code, 1, "the override asks for a GPU the inventory lacks:\n{stdout}{stderr}");
    assert!(stdout.contains("[FAIL] gpus (required)"), "{stdout}");
    let (code, stdout, stderr) = rekindle_out(&[&args[..], &["--set", "run.max_stepz=3"]].concat());
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(stdout.contains("[FAIL] config (required): cannot be used:") && stdout.contains("max_stepz"), "{stdout}");
}

#[test]
fn doctor_exits_1_when_gpus_are_required_and_the_inventory_has_none() {
    let tmp = tempfile::tempdir().unwrap();
    let none = inventory(tmp.path(), "none.json", json!([]));
    let config = doctor_config(tmp.path(), &tmp.path().join("checkpoints"), "backend = \"auto\"\nrequire = true");
    let (code, stdout, stderr) =
        rekindle_out(&["doctor", "--config", path_str(&config), "--inventory", path_str(&none)]);
    assert_eq!(code, 1, "{stdout}{stderr}");
    let line = stdout.lines().find(|l| l.contains("] gpus")).unwrap_or_else(|| panic!("{stdout}"));
    assert!(line.starts_with("[FAIL] gpus (required): no GPU visible to this job (0 probed)"), "{line}");
    assert!(line.contains("[gpu] require = true"), "{line}");
    // A warning is not a failure: without `require` the same machine is ready.
    let config = doctor_config(tmp.path(), &tmp.path().join("checkpoints"), "backend = \"auto\"");
    let (code, stdout, stderr) =
        rekindle_out(&["doctor", "--config", path_str(&config), "--inventory", path_str(&none)]);
    assert_eq!(code, EXIT_DONE, "{stdout}{stderr}");
    assert!(stdout.contains("[warn] gpus: no GPU visible") && stdout.contains("training runs on the CPU"), "{stdout}");
}

// ---------------------------------------------------------------------------
// `rekindle gpus --inventory FILE` (docs/placement.md, "Inventories" and
// "The placement plan").

fn h100(free_mib: u64) -> Value {
    json!({"vendor": "nvidia", "name": "H100", "memory_total_mib": 81559, "memory_free_mib": free_mib})
}

#[test]
fn gpus_with_an_inventory_lists_its_devices_and_the_plan_for_them() {
    let tmp = tempfile::tempdir().unwrap();
    // Three H100s (the third mostly taken) and an AMD GPU. The default
    // config's effective batch (32) does not split over 3 replicas: the plan
    // uses the two with the most free memory and names the third idle.
    let mut third = h100(20_000);
    third["uuid"] = "GPU-3333".into();
    third["driver_version"] = "550.54".into();
    let mi300 = json!({"vendor": "amd", "name": "MI300X", "memory_total_mib": 196_592});
    let inv = inventory(tmp.path(), "node.json", json!([h100(80_000), h100(80_000), third, mi300]));

    let (code, text, stderr) = rekindle_out(&["gpus", "--inventory", path_str(&inv)]);
    assert_eq!(code, EXIT_DONE, "{stderr}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], format!("GPUs (inventory {}): 4 visible", inv.display()), "{text}");
    assert_eq!(lines[1], "  nvidia 0  H100  79.6 GiB total, 78.1 GiB free", "{text}");
    assert_eq!(lines[2], "  nvidia 1  H100  79.6 GiB total, 78.1 GiB free", "{text}");
    assert_eq!(lines[3], "  nvidia 2  H100  79.6 GiB total, 19.5 GiB free, driver 550.54  [GPU-3333]", "{text}");
    // `memory_free_mib` defaults to the total; `index` to the position among that vendor's devices.
    assert_eq!(lines[4], "  amd 0  MI300X  192.0 GiB total, 192.0 GiB free", "{text}");
    assert_eq!(
        lines[5],
        "plan: cuda: 2 replica(s) × 1 device(s), micro-batch 16 × 1 accumulation step(s) = effective batch 32",
        "{text}"
    );
    assert_eq!(lines[6], "  devices per replica: [0] [1]", "{text}");
    assert!(lines[7].starts_with("  why: data parallel over 2 devices"), "{text}");
    assert!(lines[7].contains("1 idle device(s) (2)") && lines[7].contains("does not split evenly"), "{text}");
    assert!(text.contains("both NVIDIA and AMD GPUs are visible: planning for the 3 NVIDIA one(s)"), "{text}");
    if !cfg!(feature = "cuda") {
        assert!(text.contains("this build has no CUDA backend"), "the plan says this build trains on the CPU:\n{text}");
    }

    let (code, stdout, stderr) = rekindle_out(&["gpus", "--inventory", path_str(&inv), "--json"]);
    assert_eq!(code, EXIT_DONE, "{stderr}");
    let report: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    let devices = report["devices"].as_array().unwrap();
    let summary: Vec<(&str, u64, u64)> = devices
        .iter()
        .map(|d| (d["vendor"].as_str().unwrap(), d["index"].as_u64().unwrap(), d["memory_free_mib"].as_u64().unwrap()))
        .collect();
    assert_eq!(summary, [("nvidia", 0, 80_000), ("nvidia", 1, 80_000), ("nvidia", 2, 20_000), ("amd", 0, 196_592)]);
    assert_eq!(devices[2]["uuid"], "GPU-3333");
    let plan = &report["plan"];
    assert_eq!(
        (
            &plan["device_kind"],
            &plan["replicas"],
            &plan["devices_per_replica"],
            &plan["micro_batch"],
            &plan["grad_accum"]
        ),
        (&json!("cuda"), &json!(2), &json!(1), &json!(16), &json!(1)),
        "{report}"
    );
    assert_eq!(report["assignment"], json!([[0], [1]]), "{report}");
    assert!(report["plan_error"].is_null(), "{report}");
    assert_eq!(report["source"], format!("inventory {}", inv.display()));

    // The plan follows the config: configs/tiny.toml trains on the CPU.
    let (code, text, stderr) =
        rekindle_out(&["gpus", "--inventory", path_str(&inv), "--config", path_str(&tiny_config())]);
    assert_eq!(code, EXIT_DONE, "{stderr}");
    assert!(text.contains("\nplan: cpu: 1 replica(s)"), "{text}");
    assert!(text.contains("[gpu] backend = \"cpu\": the 4 visible GPU(s) are not used"), "{text}");
}

#[test]
fn gpus_with_a_bad_inventory_names_the_file_and_the_json_path() {
    let tmp = tempfile::tempdir().unwrap();
    let mut bad = h100(1000);
    bad["memory_total_mib"] = "80G".into();
    let inv = inventory(tmp.path(), "node.json", json!([h100(1000), bad]));
    let (code, stdout, stderr) = rekindle_out(&["gpus", "--inventory", path_str(&inv)]);
    assert_eq!(code, 1, "{stdout}{stderr}");
    let expected = format!(
        "GPU inventory {}: `devices[1].memory_total_mib` must be a whole number at least 0, found the string \"80G\"",
        inv.display()
    );
    assert!(stderr.contains(&expected), "{stderr}");
    assert!(stdout.is_empty(), "no report for a bad inventory: {stdout}");
}

// ---------------------------------------------------------------------------
// `rekindle data validate` (`data validate --help`: "Exit 0 when clean, 1 when
// any line is invalid"; `--out`: "a cleaned copy here (valid lines byte for
// byte)"; `--truncate`: "cut over-long records to --max-len instead of
// dropping them").

/// Valid lines, with spacing, key order and escapes a re-serialisation would change.
const VALID: [&str; 3] = [
    r#"{"text": "hey",   "id": 1}"#,
    r#"{"id":2,"text":"caf\u00e9 \"quoted\""}"#,
    r#"{"text":"a record much longer than twenty bytes"}"#,
];

#[test]
fn data_validate_exits_0_on_a_clean_file_and_1_with_the_bad_lines_and_out_keeps_the_valid_ones_byte_for_byte() {
    let tmp = tempfile::tempdir().unwrap();
    let clean = tmp.path().join("clean.jsonl");
    std::fs::write(&clean, VALID.map(|l| format!("{l}\n")).concat()).unwrap();
    let (code, stdout, stderr) = rekindle_out(&["data", "validate", path_str(&clean)]);
    assert_eq!(code, EXIT_DONE, "{stdout}{stderr}");
    assert!(stdout.contains("3 lines, 3 valid, 0 invalid"), "{stdout}");

    // Lines 2, 4, 6 and 7 are bad, each in its own way.
    let dirty = tmp.path().join("dirty.jsonl");
    let lines = [VALID[0], r#"{"text": ""}"#, VALID[1], "not json", VALID[2], r#"{"body": "x"}"#, "", r#"{"text": 7}"#];
    std::fs::write(&dirty, lines.map(|l| format!("{l}\n")).concat()).unwrap();
    let (code, stdout, stderr) = rekindle_out(&["data", "validate", path_str(&dirty), "--json"]);
    assert_eq!(code, 1, "{stdout}{stderr}");
    let report: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!((&report["lines"], &report["valid"], &report["invalid"]), (&json!(8), &json!(3), &json!(5)));
    let problems: Vec<(&str, Vec<u64>)> = report["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let lines = p["first_lines"].as_array().unwrap().iter().map(|n| n.as_u64().unwrap()).collect();
            (p["problem"].as_str().unwrap(), lines)
        })
        .collect();
    assert_eq!(
        problems,
        [
            ("blank_line", vec![7]),
            ("json_syntax", vec![4]),
            ("missing_field", vec![6]),
            ("non_string_field", vec![8]),
            ("empty_field", vec![2])
        ],
        "{report}"
    );

    // --out: the report is still of the input (exit 1), the copy holds
    // exactly the valid lines, unchanged, and validates clean.
    let out = tmp.path().join("out.jsonl");
    let (code, _, stderr) = rekindle_out(&["data", "validate", path_str(&dirty), "--out", path_str(&out)]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains(&format!("wrote {}: 3 lines kept, 0 truncated, 5 dropped", out.display())), "{stderr}");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), VALID.map(|l| format!("{l}\n")).concat());
    let (code, stdout, stderr) = rekindle_out(&["data", "validate", path_str(&out)]);
    assert_eq!(code, EXIT_DONE, "the cleaned copy validates clean: {stdout}{stderr}");

    // --max-len makes the longer records invalid; --truncate cuts them
    // instead of dropping them (4 bytes fall inside the `é` of "café").
    let cut = tmp.path().join("cut.jsonl");
    let args = ["data", "validate", path_str(&clean), "--max-len", "4", "--out", path_str(&cut), "--truncate"];
    let (code, stdout, stderr) = rekindle_out(&args);
    assert_eq!(code, 1, "an over-long record is an invalid line: {stdout}{stderr}");
    assert!(stdout.contains("too_long") && stdout.contains("(line 2, 3)"), "{stdout}");
    assert!(stderr.contains("1 lines kept, 2 truncated, 0 dropped"), "{stderr}");
    let written: Vec<Value> =
        std::fs::read_to_string(&cut).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let texts: Vec<&str> = written.iter().map(|r| r["text"].as_str().unwrap()).collect();
    assert_eq!(texts, ["hey", "caf", "a re"], "cut to at most 4 bytes, at a character boundary");
    assert_eq!(written[1]["id"], 2, "the other fields stay");

    // --truncate without --out is a usage error, and nothing is written.
    let (code, _, stderr) = rekindle_out(&["data", "validate", path_str(&clean), "--truncate"]);
    assert_eq!(code, 2, "{stderr}");
}

// ---------------------------------------------------------------------------
// `rekindle exec` and the program's own children (docs/exec.md, "Stopping"):
// the program runs in its own process group; the stop's SIGTERM goes to the
// whole group, the deadline's SIGKILL too, and whatever is left of the group
// when the program exits is killed.

/// A shell program that starts two background workers (`worker` is the
/// command each runs), writes their pids to `$REKINDLE_RUN_DIR/workers`
/// (atomically: the file appears complete), then runs `then`.
fn with_two_workers(prologue: &str, worker: &str, then: &str) -> String {
    format!(
        r#"{prologue}
        {worker} >/dev/null 2>&1 </dev/null & a=$!
        {worker} >/dev/null 2>&1 </dev/null & b=$!
        echo "$a $b" > "$REKINDLE_RUN_DIR/workers.tmp" && mv "$REKINDLE_RUN_DIR/workers.tmp" "$REKINDLE_RUN_DIR/workers"
        {then}"#
    )
}

/// The worker pids the program wrote, once it has.
fn workers(run: &Path) -> Option<Vec<Pid>> {
    let text = std::fs::read_to_string(run.join("workers")).ok()?;
    Some(text.split_whitespace().map(|p| Pid::from_raw(p.parse().expect("a pid"))).collect())
}

/// Whether `pid` is a live process (a zombie, dead and waiting for its new
/// parent to reap it, is not).
fn alive(pid: Pid) -> bool {
    kill(pid, None).is_ok() && !crate::exec::is_zombie(pid)
}

/// Waits (at most [`TIMEOUT`]) until none of `pids` is alive: a SIGKILL is
/// sent before rekindle exits, but the kernel finishes a process after.
fn assert_all_gone(pids: &[Pid], what: &str) {
    let t0 = Instant::now();
    while let Some(pid) = pids.iter().find(|p| alive(**p)) {
        if t0.elapsed() > TIMEOUT {
            for p in pids {
                let _ = kill(*p, Signal::SIGKILL);
            }
            panic!("worker {pid} outlived rekindle {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn exec_forwards_the_stop_to_the_programs_children_not_only_to_the_program() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    // The program traps SIGTERM and lives on; its workers keep SIGTERM's
    // default action (a trapped signal is reset in a child), so only a
    // SIGTERM sent to each of them ends them. Once both are gone the
    // program says so, and exits 0.
    let script = with_two_workers(
        r#"trap 'echo "program got TERM" >&2' TERM"#,
        "sleep 1000",
        r#"while kill -0 $a 2>/dev/null || kill -0 $b 2>/dev/null; do wait; done
        echo "both workers gone, the program still running" >&2"#,
    );
    // Workers that outlived the SIGTERM would meet the deadline's SIGKILL
    // (25 s on) with the program, which then could not say they were gone.
    let mut running =
        RunCmd::exec(&run, &["sh", "-c", &script]).set("signals.grace=30s").set("signals.safety_margin=5s").spawn();
    running.wait_until("the workers' pids", TIMEOUT, |_| workers(&run).is_some());
    let pids = workers(&run).unwrap();
    assert!(pids.iter().all(|p| alive(*p)), "the workers run: {pids:?}");
    running.signal(Signal::SIGTERM);
    let exited = running.wait(TIMEOUT);
    assert!(exited.stderr.contains("program got TERM"), "{}", exited.tail());
    assert!(exited.stderr.contains("both workers gone, the program still running"), "{}", exited.tail());
    // A stop with no checkpoint to continue from.
    exited.assert_code(1);
    let child_exit = last_event(&run, "child_exit");
    assert_eq!(
        (&child_exit["exit_code"], &child_exit["killed_at_deadline"]),
        (&json!(0), &json!(false)),
        "{child_exit}"
    );
    assert_all_gone(&pids, "after the stop");
}

#[test]
fn exec_kills_children_that_ignore_the_stop_at_the_deadline() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    // The program and its workers ignore SIGTERM (an ignored signal stays
    // ignored across fork and exec): only the deadline's SIGKILL to the
    // group ends them.
    let script = with_two_workers("trap '' TERM", "sleep 1000", "wait");
    let mut running =
        RunCmd::exec(&run, &["sh", "-c", &script]).set("signals.grace=3s").set("signals.safety_margin=1s").spawn();
    let start = running.wait_for_event("child_start", TIMEOUT);
    running.wait_until("the workers' pids", TIMEOUT, |_| workers(&run).is_some());
    let pids = workers(&run).unwrap();
    assert!(pids.iter().all(|p| alive(*p)), "the workers run: {pids:?}");
    running.signal(Signal::SIGTERM);
    let exited = running.wait(TIMEOUT);
    exited.assert_code(1);
    let child_exit = last_event(&run, "child_exit");
    assert_eq!(
        (&child_exit["killed_at_deadline"], &child_exit["signal"]),
        (&json!(true), &json!("SIGKILL")),
        "{child_exit}"
    );
    let program = Pid::from_raw(start["pid"].as_i64().unwrap() as i32);
    assert_all_gone(&[program], "at the deadline");
    assert_all_gone(&pids, "at the deadline");
}

#[test]
fn exec_kills_what_is_left_of_the_group_when_the_program_exits() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    // The program exits 0 at once, leaving its workers running.
    let script = with_two_workers("", "sleep 1000", "exit 0");
    let exited = RunCmd::exec(&run, &["sh", "-c", &script]).run(TIMEOUT);
    exited.assert_code(EXIT_DONE);
    assert_eq!(last_event(&run, "child_exit")["verdict"], "finished");
    let pids = workers(&run).expect("the program wrote its workers' pids");
    assert_eq!(pids.len(), 2);
    assert_all_gone(&pids, "after the program exited");
}

// ---------------------------------------------------------------------------
// The Python client's `deadline()` (docs/exec.md: "Unix time by which the
// program must have sealed its last checkpoint (the stop file's `deadline`;
// before a stop, the job's end time), or `None`").

/// Records `deadline()` and `should_stop()` as JSON lines in `$DEADLINE_OUT`:
/// once at the start, then (with `wait`) once a stop was requested.
const DEADLINE_PROGRAM: &str = r#"
import json, os, sys, time
import rekindle_client as rk
def record(at):
    line = json.dumps({"at": at, "deadline": rk.deadline(), "should_stop": rk.should_stop()})
    with open(os.environ["DEADLINE_OUT"], "a") as f:
        f.write(line + "\n")
record("start")
if sys.argv[1] == "wait":
    while not rk.should_stop():
        time.sleep(0.01)
    record("stopped")
"#;

/// `rekindle exec -- python3 -c DEADLINE_PROGRAM MODE`, recording into `out`.
fn deadline_program(run: &Path, out: &Path, mode: &str) -> RunCmd {
    let python = concat!(env!("CARGO_MANIFEST_DIR"), "/python");
    RunCmd::exec(run, &["python3", "-c", DEADLINE_PROGRAM, mode]).env("PYTHONPATH", python).env("DEADLINE_OUT", out)
}

fn records(out: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(out).unwrap_or_default();
    text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect()
}

fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

#[test]
fn python_deadline_is_none_before_a_stop_outside_slurm_and_the_stop_files_deadline_after() {
    let Some(()) = requires::python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let out = tmp.path().join("deadline.jsonl");
    // A REKINDLE_DEADLINE rekindle did not set is not the program's: removed.
    let mut running = deadline_program(&run, &out, "wait")
        .set("signals.grace=40s")
        .set("signals.safety_margin=10s")
        .env("REKINDLE_DEADLINE", "12345")
        .spawn();
    running.wait_until("the program's first record", TIMEOUT, |_| !records(&out).is_empty());
    let sent = running.signal(Signal::SIGTERM);
    let exited = running.wait(TIMEOUT);
    let after = SystemTime::now();
    exited.assert_code(1);
    let records = records(&out);
    assert_eq!(records[0], json!({"at": "start", "deadline": null, "should_stop": false}), "{records:?}");
    let stopped = &records[1];
    assert_eq!((&stopped["at"], &stopped["should_stop"]), (&json!("stopped"), &json!(true)), "{records:?}");
    let deadline = stopped["deadline"].as_f64().unwrap_or_else(|| panic!("no deadline after the stop: {stopped}"));
    // The stop file's deadline: grace minus safety margin (30 s) after the
    // signal arrived (the file has millisecond resolution).
    let stop_file: Value = serde_json::from_slice(&std::fs::read(run.join("stop-requested.json")).unwrap()).unwrap();
    assert_eq!(stop_file["deadline"].as_f64(), Some(deadline), "{stop_file}");
    assert_eq!(stop_file["signal"], "SIGTERM", "{stop_file}");
    let (earliest, latest) = (unix_seconds(sent) + 30.0 - 0.01, unix_seconds(after) + 30.0);
    assert!(
        (earliest..=latest).contains(&deadline),
        "deadline {deadline} not 30 s after the signal: {earliest}..{latest}"
    );
    assert!(last_event(&run, "child_start")["deadline"].is_null());
}

#[test]
fn python_deadline_before_a_stop_is_the_jobs_end_time() {
    let Some(()) = requires::python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let out = tmp.path().join("deadline.jsonl");
    let end = unix_seconds(SystemTime::now()).floor() as i64 + 3600;
    deadline_program(&run, &out, "once").env("SLURM_JOB_END_TIME", end.to_string()).run(TIMEOUT).assert_code(EXIT_DONE);
    assert_eq!(records(&out), [json!({"at": "start", "deadline": end as f64, "should_stop": false})]);
    assert_eq!(last_event(&run, "child_start")["deadline"], end, "the job's end time is the program's deadline");
}
