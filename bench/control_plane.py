#!/usr/bin/env python3
"""What rekindle's control plane costs the shared filesystem and slurmctld,
per event of an attempt, for N `rekindle exec` tasks on M = N / PER_NODE
simulated nodes (docs/scale.md, "Per event").

    bench/control_plane.py [--bin PATH] [--tasks 8,64,512] [--per-node 8]
                           [--timeout 10s] [--steady 20] [--saves 2]
                           [--part-bytes 65536] [--dir DIR] [--json FILE]
                           [--paths] [--keep]

Prints docs/scale.md's table (markdown) on stdout, each row's JSON on
stderr as it is measured. Needs a release build to be quick
(`cargo build --release --features mpi`); a world of 512 processes under
strace on a small machine needs a long `--timeout` (docs/scale.md).

Each task is a real `rekindle exec` process with the environment `srun`
gives a task of a job step (SLURM_PROCID, SLURM_LOCALID, SLURMD_NODENAME
n1..nM, ...), supervising a small shell program; `scontrol`, `sinfo`,
`squeue`, `sacct` and `srun` are stand-ins on PATH that log every call (each
is one RPC to slurmctld on a cluster). Everything runs under one
`strace -f`, and every system call a rekindle process (the supervisors and
the `rekindle seal` commands the programs run) makes on a path under the
run directory, the shared filesystem of a cluster, is counted: metadata
operations (opens, lookups, listings, creates, renames, removals, locks),
syncs, and bytes read and written. The programs' own writes (their
checkpoint parts) are theirs, not counted.

Three launches of the same job step a row:

  1. start -> steady state -> SAVES world checkpoints -> end. "start" is a
     task's supervisor until its program starts; "per second" is the
     steady state (liveness, waits) per second, all tasks together; "save"
     every rank's `rekindle seal` of its part plus what the supervisors do
     beyond the steady rate while the world checkpoint is sealed; "seal" of
     it, rank 0's seal command alone (it waits for every part and commits);
     "end" a supervisor after its program exits.
  2. restart: the job requeued (SLURM_RESTART_COUNT=1): the start again,
     now with the checkpoints and the first launch's records to read.
  3. loss, in a run directory of its own: the world saves, runs steady,
     and its last node's tasks are SIGKILLed (a node lost: supervisors and
     programs at once; the last task in a world of one node); "loss" is
     what the survivors do from the kill until they exit, less the steady
     rate until the loss is found, and "detected" the seconds from the
     kill to the first `rank_lost` record (the timeout plus the beats to
     carry it).

Each rank's save waits at a gate (a FIFO) until the bench opens it; rank 0
seals last, once every other part is in, so that the world's seal never
waits on this machine's CPUs for hundreds of seal processes to start.
"Readers" (`checkpoint_file_readers`) counts the processes that opened a
data file of a committed checkpoint during an event: those that load or
verify it; one that grows with the world is N² opens.

strace slows every system call it sees, so anything paced by the clock
(waits, looks) is if anything over-counted. Requires strace and python3.
"""
import argparse
import collections
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

SLURM_TOOLS = ("scontrol", "sinfo", "squeue", "sacct", "srun", "sbatch")

# System calls by what they cost a metadata server.
NAMED = {
    # syscall: kind
    "open": "open", "openat": "open", "openat2": "open", "creat": "open",
    "stat": "lookup", "lstat": "lookup", "newfstatat": "lookup", "statx": "lookup",
    "access": "lookup", "faccessat": "lookup", "faccessat2": "lookup",
    "readlink": "lookup", "readlinkat": "lookup", "statfs": "lookup",
    "rename": "change", "renameat": "change", "renameat2": "change",
    "unlink": "change", "unlinkat": "change", "mkdir": "change", "mkdirat": "change",
    "rmdir": "change", "link": "change", "linkat": "change", "symlink": "change",
    "symlinkat": "change", "chmod": "change", "fchmodat": "change", "utimensat": "change",
    "truncate": "change",
}
FD = {
    "getdents64": "listing", "getdents": "listing",
    "fstat": "lookup", "fstatfs": "lookup",
    "flock": "lock", "fcntl": None,  # fcntl counted only for locks (below)
    "fchmod": "change", "ftruncate": "change", "fallocate": "change",
    "fsync": "sync", "fdatasync": "sync", "syncfs": "sync",
    "read": "read", "pread64": "read", "readv": "read", "preadv": "read",
    "write": "write", "pwrite64": "write", "writev": "write", "pwritev": "write",
    "copy_file_range": "write",
}
# The basename of the rekindle binary measured (set from --bin).
REKINDLE = ["rekindle"]
METADATA = ("open", "lookup", "listing", "change", "lock")
TRACED = sorted(set(NAMED) | set(FD) | {"execve", "clone", "clone3", "fork", "vfork"})

LINE = re.compile(r"^(\d+)\s+(\d+\.\d+)\s+(.*)$")
CALL = re.compile(r"^(\w+)\((.*)\)\s+=\s+(-?\d+|\?)(.*)$")
FDPATH = re.compile(r"^-?\d+<([^>]*)>")
DIRFD = re.compile(r"^(?:AT_FDCWD|-?\d+)(?:<([^>]*)>)?,\s*\"((?:[^\"\\]|\\.)*)\"")
FIRST_STRING = re.compile(r"^\"((?:[^\"\\]|\\.)*)\"")
STRINGS = re.compile(r"\"((?:[^\"\\]|\\.)*)\"")


def seconds(text):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)?", text)
    if not m:
        raise argparse.ArgumentTypeError(f"`{text}` is not a duration (e.g. 10s, 500ms, 1m)")
    value, unit = float(m.group(1)), m.group(2) or "s"
    return value * {"ms": 0.001, "s": 1, "m": 60}[unit]


# ---------------------------------------------------------------- the trace


class Op:
    __slots__ = ("pid", "time", "kind", "nbytes", "path")

    def __init__(self, pid, t, kind, nbytes, path):
        self.pid, self.time, self.kind, self.nbytes, self.path = pid, t, kind, nbytes, path


def paths_of(name, args, cwd):
    """The absolute paths a call names."""
    if name in FD:
        m = FDPATH.match(args)
        return [m.group(1)] if m else []
    out = []
    if name.endswith("at") or name.endswith("at2") or name in ("renameat", "renameat2", "linkat"):
        # dirfd, path[, dirfd, path]
        rest = args
        while True:
            m = DIRFD.search(rest)
            if not m:
                break
            base, path = m.group(1), m.group(2)
            if path.startswith("/"):
                out.append(path)
            elif base:
                out.append(os.path.join(base, path) if path else base)
            rest = rest[m.end():]
        if out:
            return out
    for s in STRINGS.findall(args):
        out.append(s if s.startswith("/") else os.path.join(cwd, s))
    return out


def parse_trace(path, shared, cwd):
    """The rekindle processes' operations on `shared`; the launch time of every
    program (pid -> its first execve of something not rekindle) and exits."""
    prog = {}  # pid -> basename of what it runs
    parent = {}  # process -> the process that forked it
    tgid = {}  # thread -> its process
    unfinished = {}
    ops = []
    execs = []  # (time, pid, prog, argv text)
    exits = {}  # pid -> time
    shared = shared.rstrip("/") + "/"
    with open(path, errors="replace") as f:
        for raw in f:
            m = LINE.match(raw)
            if not m:
                continue
            pid, t, rest = int(m.group(1)), float(m.group(2)), m.group(3)
            if rest.startswith("+++ exited") or rest.startswith("+++ killed"):
                exits[tgid.get(pid, pid)] = t
                continue
            if rest.endswith("<unfinished ...>"):
                unfinished[pid] = (t, rest[: -len("<unfinished ...>")].rstrip())
                continue
            if rest.startswith("<... "):
                start = unfinished.pop(pid, None)
                tail = rest.split("resumed>", 1)[1] if "resumed>" in rest else ""
                if start is None:
                    continue
                t, rest = start[0], start[1] + tail
            c = CALL.match(rest)
            if not c:
                continue
            name, args, ret = c.group(1), c.group(2), c.group(3)
            if name in ("clone", "clone3", "fork", "vfork"):
                if ret not in ("?",) and int(ret) > 0:
                    child = int(ret)
                    prog[child] = prog.get(pid, "?")
                    if "CLONE_THREAD" in args:
                        tgid[child] = tgid.get(pid, pid)
                    else:
                        parent[child] = tgid.get(pid, pid)
                continue
            if name == "execve":
                if ret == "0":
                    s = FIRST_STRING.match(args)
                    exe = os.path.basename(s.group(1)) if s else "?"
                    prog[pid] = exe
                    execs.append((t, tgid.get(pid, pid), exe, args))
                continue
            if ret == "?" or int(ret) < 0:
                continue
            if prog.get(pid) != REKINDLE[0]:
                continue
            kind = NAMED.get(name) or FD.get(name)
            if name == "fcntl":
                kind = "lock" if ("F_SETLK" in args or "F_OFD_SETLK" in args) else None
            if kind is None:
                continue
            on = [p for p in paths_of(name, args, cwd) if p == shared[:-1] or p.startswith(shared)]
            if not on:
                continue
            nbytes = int(ret) if kind in ("read", "write") else 0
            ops.append(Op(tgid.get(pid, pid), t, kind, nbytes, on[0][len(shared):]))
    return ops, execs, exits, parent


def top_paths(ops, count=12):
    """The paths most operated on (numbers and names of a rank folded), for
    --paths: where the operations of an event go."""
    c = collections.Counter()
    by = collections.defaultdict(set)
    for op in ops:
        if op.kind in METADATA:
            key = re.sub(r"\d+", "N", op.path) + " " + op.kind
            c[key] += 1
            by[key].add(op.pid)
    return [(key, n, len(by[key])) for key, n in c.most_common(count)]


def tally(ops):
    c = collections.Counter()
    for op in ops:
        if op.kind in METADATA:
            c["metadata"] += 1
        c[op.kind] += 1
        if op.kind == "read":
            c["bytes_read"] += op.nbytes
        if op.kind == "write":
            c["bytes_written"] += op.nbytes
    return c


# ---------------------------------------------------------------- a launch

# A task's program. The gates are FIFOs the bench holds open: reading one
# blocks until the bench closes its end. Save i: the ranks but 0 seal their parts
# at gate save<i>-others; rank 0 seals (and commits the world's checkpoint)
# at gate save<i>-rank0, which the bench opens once every other part is
# sealed, so that the world's seal never waits on this machine's CPUs for
# hundreds of `rekindle seal` processes starting under strace.
PROGRAM = r"""
set -e
mark() { echo "$EPOCHREALTIME" > "$MARKS/$1-$RANK"; }
if [ -n "$REKINDLE_RESUME_FROM" ]; then mark resumed; exit 0; fi
# Every gate opened before `started`: a FIFO opened once its writer is gone
# would block forever, a FIFO already open reads its end.
declare -A gate
for g in "$GATES"/*; do exec {fd}<"$g"; gate[${g##*/}]=$fd; done
mark started
role=others; [ "$RANK" = 0 ] && role=rank0
for i in $(seq 1 "$SAVES"); do
    cat <&"${gate[save$i-$role]}" > /dev/null
    d="$REKINDLE_CHECKPOINT_DIR/s$i-$RANK"; mkdir -p "$d"
    head -c "$PART_BYTES" /dev/zero > "$d/part-$RANK.bin"
    "$REKINDLE_BIN" -q seal "$d" --step "$i" --rank "$RANK" --world-size "$WORLD_SIZE"
    mark "sealed$i"
done
mark saved
cat <&"${gate[end]}" > /dev/null
mark ending
"""

FAKE_TOOL = """#!/bin/sh
echo "$EPOCHREALTIME $(basename "$0") $*" >> '{log}'
case "$(basename "$0") $1" in
  "scontrol show") echo "JobId=77 JobName=bench JobState=RUNNING Reason=None Requeue=1 Restarts=0 BatchFlag=1 NodeList=n[1-{nodes}]" ;;
esac
exit 0
"""


def fake_tools(root, nodes):
    bin_dir = os.path.join(root, "fake-bin")
    os.makedirs(bin_dir, exist_ok=True)
    log = os.path.join(root, "slurmctld-calls")
    for tool in SLURM_TOOLS:
        p = os.path.join(bin_dir, tool)
        with open(p, "w") as f:
            f.write("#!/bin/bash\n" + FAKE_TOOL.split("\n", 1)[1].format(log=log, nodes=nodes))
        os.chmod(p, 0o755)
    return bin_dir, log


def slurmctld_calls(log):
    try:
        with open(log) as f:
            return [(float(l.split(" ", 1)[0]), l.split(" ", 1)[1].strip()) for l in f if l.strip()]
    except FileNotFoundError:
        return []


def launcher(spec_path):
    """Runs inside strace: starts every task, forwards the go signals, waits."""
    spec = json.load(open(spec_path))
    procs = []
    for env in spec["envs"]:
        with open(env["TASK_LOG"], "wb") as log:
            procs.append(subprocess.Popen(spec["argv"], env=env, stdin=subprocess.DEVNULL,
                                          stdout=subprocess.DEVNULL, stderr=log, start_new_session=True))
    with open(spec["pids"], "w") as f:
        json.dump([p.pid for p in procs], f)
    codes = [p.wait() for p in procs]
    with open(spec["codes"], "w") as f:
        json.dump(codes, f)


# Every launch of this bench, for `row` to end them all when one fails.
LAUNCHES = []


class Launch:
    def __init__(self, root, name, args, n, restart):
        self.root, self.name, self.n = root, name, n
        self.dir = os.path.join(root, name)
        os.makedirs(self.dir)
        self.marks = os.path.join(self.dir, "marks")
        os.makedirs(self.marks)
        self.gates = os.path.join(self.dir, "gates")
        os.makedirs(self.gates)
        names = [f"save{i}-{role}" for i in range(1, args.saves + 1) for role in ("others", "rank0")] + ["end"]
        for name in names:
            os.mkfifo(os.path.join(self.gates, name))
        self.saves = args.saves
        per = args.per_node
        nodes = -(-n // per)
        path = args.fake_bin + ":" + os.environ.get("PATH", "")
        base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM") and k != "FAILPOINTS"}
        envs = []
        for r in range(n):
            e = dict(base)
            e.update({
                "PATH": path,
                "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0",
                "SLURM_STEP_NUM_TASKS": str(n), "SLURM_NTASKS": str(n),
                "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r % per), "SLURM_NODEID": str(r // per),
                "SLURM_STEP_NUM_NODES": str(nodes), "SLURM_NNODES": str(nodes),
                "SLURM_STEP_NODELIST": f"n[1-{nodes}]" if nodes > 1 else "n1",
                "SLURM_JOB_NODELIST": f"n[1-{nodes}]" if nodes > 1 else "n1",
                "SLURM_STEP_TASKS_PER_NODE": f"{per}(x{nodes})",
                "SLURM_RESTART_COUNT": str(restart),
                "SLURMD_NODENAME": f"n{r // per + 1}",
                "MARKS": self.marks, "GATES": self.gates,
                "SAVES": str(args.saves), "PART_BYTES": str(args.part_bytes),
                "TASK_LOG": os.path.join(self.dir, f"task-{r}.log"),
            })
            envs.append(e)
        argv = [args.bin, "-q", "exec", "--run-dir", args.run,
                "--set", f"distributed.timeout={args.timeout_text}", "--", "bash", "-c", PROGRAM]
        self.spec = os.path.join(self.dir, "spec.json")
        self.pids_file = os.path.join(self.dir, "pids.json")
        self.codes_file = os.path.join(self.dir, "codes.json")
        with open(self.spec, "w") as f:
            json.dump({"envs": envs, "argv": argv, "pids": self.pids_file, "codes": self.codes_file}, f)
        self.trace = os.path.join(self.dir, "trace")
        self.started_at = time.time()
        self.proc = subprocess.Popen(
            ["strace", "-f", "-q", "-ttt", "-y", "-s", "256", "-o", self.trace,
             "-e", "trace=" + ",".join(TRACED), "-e", "signal=none",
             sys.executable, os.path.abspath(__file__), "--launcher", self.spec],
            cwd=args.run_parent)
        # The go fifos: held open for writing so that the programs' `cat`
        # blocks until they are closed.
        self.held = {name: os.open(os.path.join(self.gates, name), os.O_RDWR) for name in names}
        LAUNCHES.append(self)

    def marks_of(self, what):
        out = {}
        for name in os.listdir(self.marks):
            kind, rank = name.rsplit("-", 1)
            if kind == what:
                with open(os.path.join(self.marks, name)) as f:
                    out[int(rank)] = float(f.read().strip() or 0)
        return out

    def wait_marks(self, what, count, limit):
        deadline = time.time() + limit
        while time.time() < deadline:
            if sum(1 for name in os.listdir(self.marks) if name.rsplit("-", 1)[0] == what) >= count:
                return time.time()
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise SystemExit(f"{self.name}: only {len(self.marks_of(what))} of {count} programs reached `{what}` "
                         f"in {limit:.0f} s; the tasks' stderr is in {self.dir}/task-*.log")

    def open_gate(self, name):
        os.close(self.held.pop(name))
        return time.time()

    def save_all(self, limit):
        """Every save: the parts, then rank 0's seal. Returns the times: the
        first gate opened, and per save when rank 0's gate opened."""
        began, seals = time.time(), []
        for i in range(1, self.saves + 1):
            self.open_gate(f"save{i}-others")
            self.wait_marks(f"sealed{i}", self.n - 1, limit)
            seals.append(self.open_gate(f"save{i}-rank0"))
            self.wait_marks(f"sealed{i}", self.n, limit)
        return began, seals

    def pids(self):
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                with open(self.pids_file) as f:
                    return json.load(f)
            except (FileNotFoundError, json.JSONDecodeError):
                time.sleep(0.05)
        raise SystemExit(f"{self.name}: the launcher wrote no pids")

    def kill_all(self):
        """Every task, its program and strace: SIGKILL."""
        try:
            with open(self.pids_file) as f:
                pids = json.load(f)
        except (OSError, ValueError):
            pids = []
        for pid in [p for task in pids for p in descendants(task)] + [self.proc.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for fd in self.held.values():
            os.close(fd)
        self.held = {}

    def finish(self, limit):
        try:
            self.proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise SystemExit(f"{self.name}: the tasks did not end within {limit:.0f} s; see {self.dir}/task-*.log")
        for fd in self.held.values():
            os.close(fd)
        self.held = {}
        with open(self.codes_file) as f:
            return json.load(f)


def supervisors(execs, parent):
    """pid of every supervisor (`rekindle ... exec`) and its program's start."""
    sup = {}
    for t, pid, exe, argv in execs:
        if exe == REKINDLE[0] and '"exec"' in argv:
            sup[pid] = {"start": t, "program": None}
    for t, pid, exe, argv in execs:
        if exe == "bash" and parent.get(pid) in sup:
            s = sup[parent[pid]]
            if s["program"] is None:
                s["program"] = t
    return sup


def seal_ranks(execs):
    """pid -> rank of every `rekindle seal` command."""
    out = {}
    for t, pid, exe, argv in execs:
        if exe == REKINDLE[0] and '"seal"' in argv:
            m = re.search(r'"--rank", "(\d+)"', argv)
            out[pid] = int(m.group(1)) if m else -1
    return out


def row(args, n):
    root = tempfile.mkdtemp(prefix=f"rekindle-bench-control-{n}-", dir=args.dir)
    try:
        return measure(args, n, root)
    except BaseException:
        # Nothing of a failed row may run on into the next (or after the
        # bench): hundreds of waiting tasks would skew every later count.
        for launch in LAUNCHES:
            launch.kill_all()
        raise
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"kept {root}", file=sys.stderr)


class Event:
    """One event's operations (net of the steady rate where it overlaps the
    steady state), its slurmctld calls, how long it took."""

    def __init__(self, ops, calls, seconds, per=1, minus=None, over=0.0):
        self.ops = ops
        counted = tally(ops)
        if minus:
            counted = {k: max(0.0, v - minus.get(k, 0) * over) for k, v in counted.items()}
        self.counts = {k: v / per for k, v in counted.items()}
        self.calls = calls / per
        self.seconds = seconds

    def record(self, paths):
        out = {"ops": self.counts, "slurmctld": self.calls, "seconds": self.seconds,
               "checkpoint_file_readers": checkpoint_file_readers(self.ops)}
        if paths:
            out["paths"] = top_paths(self.ops)
        return out


COMMITTED_FILE = re.compile(r"checkpoints/step-\d+/(?!MANIFEST\.json$)(?!\.$)[^/]+$")


def checkpoint_file_readers(ops):
    """How many processes opened a file of a committed checkpoint (its
    manifest and the directory aside): the ranks that load or verify it.
    An event where this grows with the world reads every rank's part from
    every rank (or node): N² for the filesystem."""
    return len({o.pid for o in ops if o.kind == "open" and COMMITTED_FILE.match(o.path)})


def calls_between(calls, a, b):
    return sum(1 for t, _ in calls if a <= t < b)



def measure(args, n, root):
    nodes = -(-n // args.per_node)
    args.fake_bin, calls_log = fake_tools(root, nodes)
    args.run_parent = root
    args.run = os.path.join(root, "run")
    limit = max(120 + n * 0.5, args.timeout + 60)
    events = {}

    # 1. start, steady state, saves, end.
    first = Launch(root, "first", args, n, 0)
    first.wait_marks("started", n, limit)
    time.sleep(args.steady)
    save_from, _ = first.save_all(limit)
    first.wait_marks("saved", n, limit)
    saved_at = time.time()
    time.sleep(1)
    end_at = first.open_gate("end")
    codes = first.finish(limit)
    if any(codes):
        raise SystemExit(f"first launch: exit codes {dict(collections.Counter(codes))}; see {first.dir}/task-*.log")
    ops, execs, exits, parent = parse_trace(first.trace, args.run, root)
    sup = supervisors(execs, parent)
    seals = seal_ranks(execs)
    calls = slurmctld_calls(calls_log)
    launched = min(s["start"] for s in sup.values())
    programs = max(s["program"] or float("inf") for s in sup.values())
    mine = [o for o in ops if o.pid in sup]
    events["start"] = Event([o for o in mine if o.time < (sup[o.pid]["program"] or float("inf"))],
                            calls_between(calls, 0, programs), programs - launched)
    steady_from = programs + 2
    steady = Event([o for o in mine if steady_from <= o.time < save_from],
                   calls_between(calls, steady_from, save_from), save_from - steady_from)
    window = save_from - steady_from
    rate = {k: v / window for k, v in steady.counts.items()}
    events["per second"] = Event(steady.ops, steady.calls, 1.0, per=window)
    save_ops = [o for o in ops if o.pid in seals] + [o for o in mine if save_from <= o.time < saved_at]
    events["save"] = Event(save_ops, calls_between(calls, save_from, saved_at), (saved_at - save_from) / args.saves,
                           per=args.saves, minus=rate, over=saved_at - save_from)
    events["seal"] = Event([o for o in ops if seals.get(o.pid) == 0], 0, None, per=args.saves)
    child_end = {pid: max((exits.get(c, 0) for c, p in parent.items() if p == pid), default=0) for pid in sup}
    ended = max(exits.get(pid, end_at) for pid in sup)
    events["end"] = Event([o for o in mine if o.time >= max(end_at, child_end[o.pid])],
                          calls_between(calls, end_at, float("inf")), ended - end_at)

    # 2. restart: the job requeued; the start again, with a checkpoint and
    # the first launch's records.
    mark = time.time()
    second = Launch(root, "restart", args, n, 1)
    codes = second.finish(limit)
    if any(codes):
        raise SystemExit(f"restart: exit codes {dict(collections.Counter(codes))}; see {second.dir}/task-*.log")
    resumed = len(second.marks_of("resumed"))
    if resumed != n:
        raise SystemExit(f"restart: {resumed} of {n} programs were given a checkpoint; see {second.dir}/task-*.log")
    ops, execs, exits, parent = parse_trace(second.trace, args.run, root)
    sup = supervisors(execs, parent)
    launched = min(s["start"] for s in sup.values())
    programs = max(s["program"] or float("inf") for s in sup.values())
    events["restart"] = Event([o for o in ops if o.pid in sup and o.time < (sup[o.pid]["program"] or float("inf"))],
                              calls_between(slurmctld_calls(calls_log), mark, programs), programs - launched)

    # 3. a node lost in the steady state, after a checkpoint.
    events["loss"], detected, outcome = loss(args, n, root, calls_log, limit)
    return {
        "tasks": n,
        "nodes": nodes,
        "timeout_seconds": args.timeout,
        # rank_watch::beat_interval: a tenth of the timeout, 0.1 s to 5 s.
        "beat_seconds": min(5.0, max(0.1, args.timeout / 10)),
        "events": {k: e.record(args.paths) for k, e in events.items()},
        "detected_seconds": detected,
        "loss": outcome,
    }


def descendants(pid):
    """pid and every process under it (a node lost takes them all)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except (FileNotFoundError, ProcessLookupError):
            pass
    return out


def first_record(run, name):
    """The time of the first record `name` in the run's events.jsonl."""
    with open(os.path.join(run, "events.jsonl")) as f:
        for line in f:
            try:
                e = json.loads(line)
            except json.JSONDecodeError:
                continue
            if e.get("event") == name and "time" in e:
                return datetime.datetime.fromisoformat(e["time"].replace("Z", "+00:00")).timestamp()
    return None


def loss(args, n, root, calls_log, limit):
    """A run directory of its own: the world saves, runs steady, and then the
    last node's tasks (the last task's, in a world of one node) are SIGKILLed
    with their programs. What the survivors do from the kill to their exit,
    less the steady rate until the loss is found (the watch goes on until
    then); the seconds until the first `rank_lost` record."""
    args.run = os.path.join(root, "run-loss")
    launch = Launch(root, "loss", args, n, 0)
    launch.wait_marks("started", n, limit)
    launch.save_all(limit)
    launch.wait_marks("saved", n, limit)
    steady_from = time.time() + 1
    time.sleep(1 + max(3.0, args.steady / 2))
    pids = launch.pids()
    last = (n - 1) // args.per_node
    victims = [r for r in range(n) if (r // args.per_node == last if last > 0 else r == n - 1)]
    doomed = [p for r in victims for p in descendants(pids[r])]
    killed_at = time.time()
    for pid in doomed:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    codes = launch.finish(limit + 3 * args.timeout)
    ended = time.time()
    ops, execs, exits, parent = parse_trace(launch.trace, args.run, root)
    sup = supervisors(execs, parent)
    survivors = {pid for pid in sup if pid not in {pids[r] for r in victims}}
    mine = [o for o in ops if o.pid in survivors]
    steady = tally([o for o in mine if steady_from <= o.time < killed_at])
    rate = {k: v / (killed_at - steady_from) for k, v in steady.items()}
    found = first_record(args.run, "rank_lost")
    detected = None if found is None else found - killed_at
    calls = slurmctld_calls(calls_log)
    event = Event([o for o in mine if o.time >= killed_at], calls_between(calls, killed_at, float("inf")),
                  ended - killed_at, minus=rate, over=detected or 0.0)
    outcome = {"killed": len(victims),
               "survivors_exit_codes": dict(collections.Counter(c for r, c in enumerate(codes) if r not in victims))}
    return event, detected, outcome


EVENTS = ("start", "per second", "save", "seal", "end", "restart", "loss")


def table(rows):
    """docs/scale.md's table: a line per event and world size."""
    out = ["| event | tasks | nodes | metadata ops | per task | per node | syncs | bytes read | bytes written "
           "| slurmctld calls | readers | seconds |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for ev in EVENTS:
        for r in rows:
            e = r["events"][ev]
            c = e["ops"]
            md = c.get("metadata", 0)
            secs = e["seconds"]
            out.append(f"| {ev} | {r['tasks']} | {r['nodes']} | {md:,.0f} | {md / r['tasks']:.1f} "
                       f"| {md / r['nodes']:.1f} | {c.get('sync', 0):,.0f} | {c.get('bytes_read', 0):,.0f} "
                       f"| {c.get('bytes_written', 0):,.0f} | {e['slurmctld']:.0f} | {e['checkpoint_file_readers']} "
                       f"| {'' if secs is None else f'{secs:.2f}'} |")
    out.append("")
    out.append("| tasks | nodes | timeout (s) | beat (s) | metadata ops a beat, per node | loss detected (s) "
               "| detected past the timeout (beats) | survivors' exit codes |")
    out.append("|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        d, timeout, beat = r["detected_seconds"], r["timeout_seconds"], r["beat_seconds"]
        per_beat = r["events"]["per second"]["ops"].get("metadata", 0) * beat / r["nodes"]
        past = "never" if d is None else f"{(d - timeout) / beat:.1f}"
        codes = ", ".join(f"{n} × {c}" for c, n in sorted(r["loss"]["survivors_exit_codes"].items()))
        out.append(f"| {r['tasks']} | {r['nodes']} | {timeout:g} | {beat:g} | {per_beat:.1f} "
                   f"| {'never' if d is None else f'{d:.2f}'} | {past} | {codes} |")
    return "\n".join(out)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--launcher":
        launcher(sys.argv[2])
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", default=os.environ.get("REKINDLE_BIN", "target/release/rekindle"),
                   help="the rekindle binary (default: $REKINDLE_BIN, else target/release/rekindle)")
    p.add_argument("--tasks", default="8,64,512", help="world sizes, a row each (default 8,64,512)")
    p.add_argument("--per-node", type=int, default=8, help="tasks a simulated node (default 8)")
    p.add_argument("--timeout", default="10s", help="[distributed] timeout (default 10s)")
    p.add_argument("--steady", type=float, default=20.0, help="seconds of steady state counted (default 20)")
    p.add_argument("--saves", type=int, default=2, help="world checkpoints saved in the first launch (default 2)")
    p.add_argument("--part-bytes", type=int, default=64 << 10, help="bytes of a rank's part (default 64 KiB)")
    p.add_argument("--dir", default=None, help="where the run directories go (default: the temporary directory)")
    p.add_argument("--json", default=None, help="also write the rows to this file")
    p.add_argument("--paths", action="store_true", help="name the paths most operated on, per event")
    p.add_argument("--keep", action="store_true", help="keep the run directories and traces")
    args = p.parse_args()
    if not shutil.which("strace"):
        sys.exit("bench/control_plane.py needs strace (Debian: apt-get install strace)")
    if not os.access(args.bin, os.X_OK):
        sys.exit(f"no rekindle binary at {args.bin}: build one (cargo build --release) or pass --bin")
    args.bin = os.path.abspath(args.bin)
    REKINDLE[0] = os.path.basename(args.bin)
    args.timeout_text = args.timeout
    args.timeout = seconds(args.timeout)
    rows = []
    for n in [int(x) for x in args.tasks.split(",")]:
        if n < 2:
            sys.exit("--tasks: every world needs at least 2 tasks")
        r = row(args, n)
        rows.append(r)
        print(json.dumps(r), file=sys.stderr, flush=True)
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
