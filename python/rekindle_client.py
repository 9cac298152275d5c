"""The program's side of `rekindle exec` (contract version 1, docs/exec.md).

Standard library only: copy this file next to your training script, or put
`python/` on PYTHONPATH. Under `rekindle exec`:

    import rekindle_client as rk

    state = load(rk.resume_path()) if rk.resume_path() else fresh()
    for step in range(state.step + 1, total + 1):
        train_one_step(state)
        rk.step(step)                                       # progress, for rekindle's watchdog
        if step % 100 == 0 or rk.should_stop(step):
            rk.checkpoint(step, lambda d: save(state, d))   # d: a fresh directory
        if rk.should_stop(step):
            break                                           # rekindle exits 75 and requeues

In a distributed program (torchrun, or one task per rank: RANK and
WORLD_SIZE set) every rank calls checkpoint() at the same steps, also one
with nothing to save; rank 0 commits one checkpoint for the whole world once
every rank's part is in. With torch.distributed initialized, should_stop()
agrees across ranks, so every rank stops at the same step: given the step,
about once a second one all-reduce of two integers over a CPU (gloo) group;
the steps in between cost a counter.

Importing this module under `rekindle exec` makes SIGTERM set the stop flag
instead of ending the program (only when no handler of your own is installed
for it), so a step or a save in progress completes. Outside `rekindle exec`
every function works and does nothing rekindle-specific: resume_path() is
None, should_stop() False, checkpoint() calls save_fn on a temporary
directory and returns None, log_metrics() does nothing.
"""

import datetime
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

#: The contract version this helper speaks.
PROTOCOL = 1

_stop_signalled = False


class RekindleError(RuntimeError):
    """`rekindle seal` refused or failed: nothing was sealed."""


def _env(name):
    value = os.environ.get(name)
    return value if value else None


def under_rekindle():
    """True when the program runs under `rekindle exec`.

    Raises RekindleError when rekindle speaks a protocol this helper does not.
    """
    version = _env("REKINDLE_EXEC_PROTOCOL")
    if version is None:
        return False
    if version != str(PROTOCOL):
        raise RekindleError(
            "rekindle exec speaks protocol %s, this rekindle_client.py speaks %d: "
            "use the rekindle_client.py of the same rekindle (python/ in its repository)" % (version, PROTOCOL)
        )
    return True


def resume_path():
    """The directory of the newest checkpoint that verifies, or None (a fresh start).

    It holds exactly the files your save_fn wrote for that step.
    """
    return _env("REKINDLE_RESUME_FROM")


def resume_step():
    """The step of resume_path() (from its MANIFEST.json), or None."""
    path = resume_path()
    if path is None:
        return None
    with open(os.path.join(path, "MANIFEST.json"), "rb") as f:
        return int(json.load(f)["step"])


def _on_stop_signal(signum, frame):
    global _stop_signalled
    _stop_signalled = True


def install_stop_handler(signals=(signal.SIGTERM,)):
    """Makes these signals set the stop flag instead of ending the program.

    Called on import under `rekindle exec` for SIGTERM (the signal rekindle
    forwards), unless a handler of your own is installed for it.
    """
    for sig in signals:
        signal.signal(sig, _on_stop_signal)


#: Seconds between two looks at the stop file (a metadata operation on the
#: run directory's shared storage): SIGTERM, which rekindle forwards, is seen
#: at once; the file is for programs whose own handler keeps the signal.
STOP_FILE_SECONDS = 1.0

_stop_file_seen = False
_stop_file_looked = None


def stop_requested():
    """True once this process was asked to stop (SIGTERM, or the stop file); no collective.

    The stop file is looked at no more than once every STOP_FILE_SECONDS.
    """
    global _stop_file_seen, _stop_file_looked
    if _stop_signalled or _stop_file_seen:
        return True
    stop_file = _env("REKINDLE_STOP_FILE")
    if stop_file is None:
        return False
    now = time.monotonic()
    if _stop_file_looked is not None and now - _stop_file_looked < STOP_FILE_SECONDS:
        return False
    _stop_file_looked = now
    _stop_file_seen = os.path.exists(stop_file)
    return _stop_file_seen


#: Seconds between two agreements of should_stop(step) in a distributed program.
AGREE_SECONDS = 1.0
#: At most this many steps between two agreements, however fast the steps.
_MAX_STRIDE = 100_000

_agreed_stop = False
# The agreement's own process group (gloo: the flag never touches a device
# stream); None until the first agreement, the default group when that is gloo.
_agree_group = None
_agree_group_made = False
# should_stop(step): the step last asked about, steps since the last
# agreement, the step count that agrees next (the first step agrees), and
# when the last agreement was.
_asked_step = None
_steps = 0
_next_agreement = 1
_agreed_at = None


def should_stop(step=None):
    """True once rekindle asked the program to stop: checkpoint now and exit.

    With torch.distributed initialized (world size > 1) the answer is agreed
    by every rank, so call it at the same points on every rank (as any
    collective): the stop reaches the ranks at different moments; agreed,
    they all stop at the same step instead of one leaving the others waiting
    in the next all-reduce. An agreement is one all-reduce (MAX) of two
    integers over a gloo group (a CPU collective: no device synchronisation).

    Pass the step (`should_stop(step)`) and it costs nothing on most steps:
    the ranks agree about every AGREE_SECONDS (rank 0 measures how many
    steps that is, and every rank learns it with the agreement's result, so
    all agree at the same step); on the steps in between, and on every call
    after the first for one step, it answers from a counter (no collective,
    no file), with the same answer for every call of a step. A stop is then
    seen up to about AGREE_SECONDS (and one step) after it came. Without a
    step every call is an agreement. Once True it stays True without
    further collectives.
    """
    global _agreed_stop, _asked_step, _steps
    if step is not None:
        _report(step, "step")
    if _agreed_stop:
        return True
    dist = _torch_distributed()
    if dist is None:
        return stop_requested()
    if step is None:
        return _agree(dist, every_call=True)
    if step == _asked_step:
        return False
    _asked_step = step
    _steps += 1
    if _steps < _next_agreement:
        return False
    return _agree(dist, every_call=False)


def _agree(dist, every_call):
    """One agreement of should_stop(): the stop, and the steps until the next one."""
    global _agreed_stop, _agree_group, _agree_group_made, _steps, _next_agreement, _agreed_at
    torch = sys.modules["torch"]
    if not _agree_group_made:
        # Every rank reaches its first agreement at the same call: creating
        # the group (itself collective) there is safe.
        if "gloo" not in str(dist.get_backend()):
            _agree_group = dist.new_group(backend="gloo")
        _agree_group_made = True
    now = time.monotonic()
    stride = 0
    if dist.get_rank() == 0 and not every_call and _agreed_at is not None:
        per_second = _steps / max(now - _agreed_at, 1e-9)
        stride = max(1, min(int(per_second * AGREE_SECONDS), _MAX_STRIDE))
    # [stop, steps until the next agreement]: only rank 0 proposes a stride,
    # so MAX gives every rank rank 0's.
    flag = torch.tensor([1 if stop_requested() else 0, stride], dtype=torch.int64)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=_agree_group)
    _released(flag)
    stop, stride = (int(v) for v in flag.tolist())
    _agreed_stop = stop > 0
    _steps, _next_agreement, _agreed_at = 0, max(1, stride), now
    return _agreed_stop


def _released(tensor, timeout=1.0):
    """Waits (GIL released) until the collective's worker thread let go of `tensor`.

    gloo's worker drops its reference to a collective's tensors after the
    caller was told the collective is done. Dropping it needs the GIL; if
    that happens while the interpreter is finalizing (the program's last
    should_stop() right before it exits), the worker thread is ended inside
    a destructor and the process aborts ("terminate called without an
    active exception", SIGABRT) after the program has finished.
    """
    use_count = getattr(tensor, "_use_count", None)
    if use_count is None:
        return
    deadline = time.monotonic() + timeout
    while use_count() > 1 and time.monotonic() < deadline:
        time.sleep(0.0002)


def _torch_distributed():
    """torch.distributed when the program initialized it with several ranks, else None.

    Never imports torch: a program that did not is not distributed by torch.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return None
    try:
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            return dist
    except (RuntimeError, ValueError):
        pass
    return None


#: Seconds between two progress reports of one rank while its activity stays the same.
PROGRESS_SECONDS = 1.0

# The progress socket (None: not looked up yet; False: none), the last
# report sent (activity, step) and when.
_progress_socket = None
_progress_sent = None
_progress_at = None


def step(step):
    """Tells rekindle that this rank completed `step`; call it once a step, on every rank.

    rekindle's watchdog (`[watchdog] step`, docs/exec.md) calls a rank whose
    step has not moved for that long hung: it ends the program and the job
    resumes from the newest checkpoint, in the job where the batch shell
    offers it. should_stop(step) and checkpoint() report too, so a loop that
    calls should_stop(step) every step needs no step() call.

    Costs a clock read; at most once every PROGRESS_SECONDS (and when a save
    begins or ends) one datagram to the supervising rekindle on this node:
    no file, no collective. A rank that never reports is never called hung.
    """
    _report(step, "step")


def eval_batch(step, batch):
    """Tells rekindle this rank evaluated `batch` batches of an evaluation after `step`.

    An evaluation between two steps is watched by `[watchdog] eval`: the
    time without a new batch, not the evaluation's whole length. Call it
    every batch of a long evaluation (the Hugging Face and Lightning
    callbacks do); the next step() or should_stop(step) ends it. Costs what
    step() costs.
    """
    _report(step, "eval", batch)


def _report(step, activity, batch=0):
    """Sends {rank, step, activity, batch} to REKINDLE_PROGRESS when due; never raises."""
    global _progress_socket, _progress_sent, _progress_at
    if _progress_socket is False:
        return
    now = time.monotonic()
    sent = (activity, int(step), int(batch))
    if _progress_sent is not None and _progress_sent[0] == activity:
        if sent == _progress_sent or now - _progress_at < PROGRESS_SECONDS:
            return
    if _progress_socket is None:
        path = _env("REKINDLE_PROGRESS")
        if path is None:
            _progress_socket = False
            return
        try:
            _progress_socket = (socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM), path)
            _progress_socket[0].setblocking(False)
        except OSError:
            _progress_socket = False
            return
    ranks = world()
    message = {"rank": ranks[0] if ranks else 0, "step": int(step), "activity": activity}
    if activity == "eval":
        message["batch"] = int(batch)
    try:
        _progress_socket[0].sendto(json.dumps(message).encode("ascii"), _progress_socket[1])
    except OSError:
        # The supervisor's queue is full or it is gone: the next report says it.
        return
    _progress_sent, _progress_at = sent, now


def world():
    """(rank, world size) of a distributed program from RANK and WORLD_SIZE, or None.

    torchrun sets them for each rank; so does `rekindle exec` for a job of
    several SLURM tasks (when not already set).
    """
    try:
        rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        return None
    return (rank, size) if size > 1 and 0 <= rank < size else None


def deadline():
    """Unix time (float) by which the program must have sealed its last checkpoint, or None.

    After a stop, the stop file's deadline (then the process group is
    killed); before one, the job's end time when SLURM gives one.
    """
    stop_file = _env("REKINDLE_STOP_FILE")
    if stop_file is not None:
        try:
            with open(stop_file, "rb") as f:
                return float(json.load(f)["deadline"])
        except (OSError, ValueError, KeyError):
            pass
    value = _env("REKINDLE_DEADLINE")
    return float(value) if value is not None else None


def checkpoint(step, save_fn):
    """Saves a checkpoint of `step` through `save_fn(directory)` and seals it.

    save_fn writes any files (torch.save, safetensors, np.save, ...) into the
    fresh directory it is given; flat, no subdirectories, no symlinks. Then
    `rekindle seal` fsyncs and hashes every file and commits the directory
    atomically: it becomes the checkpoint resume_path() returns next time.
    Returns the sealed checkpoint's directory. Raises RekindleError when the
    seal is refused (e.g. a step not newer than the last one); save_fn's own
    exceptions propagate, and in both cases nothing is sealed.

    In a distributed program (world() is not None) every rank must call it
    for the same steps: what save_fn writes is this rank's part (it may write
    nothing, e.g. every rank but 0 when only rank 0 saves the model; names
    must differ between ranks, e.g. `rng-{rank}.pt`). A rank other than 0
    returns once its part is sealed; rank 0 returns once every rank's part is
    in and the world's checkpoint is committed (or raises: then none is).
    """
    if not under_rekindle():
        scratch = tempfile.mkdtemp(prefix="rekindle-unsealed-")
        try:
            save_fn(scratch)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return None
    staging = os.environ["REKINDLE_CHECKPOINT_DIR"]
    staged = tempfile.mkdtemp(prefix="step-%d-" % step, dir=staging)
    # A save has [watchdog] save's limit, not a step's.
    _report(step, "save")
    try:
        return _save_and_seal(staged, step, save_fn)
    finally:
        _report(step, "step")


def _save_and_seal(staged, step, save_fn):
    """checkpoint()'s save and seal, between its progress reports."""
    save_fn(staged)
    binary = _env("REKINDLE_BIN") or "rekindle"
    argv = [binary, "-q", "seal", staged, "--step", str(int(step))]
    ranks = world()
    if ranks is not None:
        argv += ["--rank", str(ranks[0]), "--world-size", str(ranks[1])]
    seal = _start_seal(argv)
    stdout, stderr = seal.communicate()
    if seal.returncode < 0:
        raise RekindleError("rekindle seal was killed by signal %d" % -seal.returncode)
    if seal.returncode != 0:
        raise RekindleError(stderr.decode("utf-8", "replace").strip() or "rekindle seal failed")
    return stdout.decode("utf-8", "replace").strip()


#: The signals a seal ignores (the stop signals rekindle forwards, and SLURM's).
_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2}


def _start_seal(argv):
    """Starts `rekindle seal` with the stop signals blocked.

    The stop rekindle forwards to the program's process group reaches a seal
    in flight too; the seal ignores it, but only once it runs, and loading
    the binary takes milliseconds. Blocked here, the signals stay blocked
    through fork and exec until the seal ignores them (which discards one
    already pending), so none can kill it on its way up. Only this thread
    blocks them, and only while the process is created: the program's own
    stop handler still runs, and should_stop() also reads the stop file.
    """
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def log_metrics(step, **values):
    """Appends a metrics.jsonl line for `step`, which `rekindle report` plots.

    rekindle exec follows the file: every number of the line also becomes a
    TensorBoard scalar of the same name at `step` (docs/telemetry.md).

    Keys of the metrics schema (docs/run-directory.md): loss (a step line
    needs it), lr, grad_norm, samples, tokens, samples_per_s, tokens_per_s,
    epoch, elapsed_s; val_loss goes on a line of its own. Other keys are
    kept in the line and not plotted. Lines past the checkpoint resumed from
    are dropped by rekindle when the program resumes, so log every step you
    train (again).
    """
    run_dir = _env("REKINDLE_RUN_DIR")
    if run_dir is None:
        return
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    lines = []
    val_loss = values.pop("val_loss", None)
    if values:
        line = {"step": int(step), "time": now}
        line.update({k: _number(v) for k, v in values.items()})
        lines.append(line)
    if val_loss is not None:
        lines.append({"step": int(step), "val_loss": _number(val_loss), "time": now})
    data = "".join(json.dumps(line, allow_nan=False, sort_keys=True) + "\n" for line in lines)
    fd = os.open(os.path.join(run_dir, "metrics.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data.encode("utf-8"))
    finally:
        os.close(fd)


def _number(value):
    """A JSON number, None for a non-finite one (the records write null)."""
    if isinstance(value, bool) or value is None:
        return value
    try:
        value = float(value) if not isinstance(value, int) else value
    except (TypeError, ValueError):
        return value
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    return value


if under_rekindle() and signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
    install_stop_handler()
