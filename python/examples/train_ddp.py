"""Distributed data-parallel PyTorch (DDP) under `rekindle exec`, on the CPU
(gloo) or GPUs (NCCL). docs/exec.md, "Distributed programs", gives every
launch; the tests run it with real torch (tests/it/torch_exec.rs):

    rekindle exec --run-dir runs/ddp -- torchrun --standalone --nproc-per-node 2 python/examples/train_ddp.py
    sbatch -N2 -n2 slurm/orchestrator.slurm --exec --run-dir runs/ddp -- python3 python/examples/train_ddp.py

Every rank takes part in each checkpoint (rekindle_client.checkpoint on
every rank, at the same steps): rank 0 saves the model and the optimizer
(identical on every rank under DDP), every rank its own data generator.
rekindle commits them as one checkpoint of the whole world, and
should_stop() agrees across ranks, so all stop at the same step. Stopped
and resumed with the same number of ranks, a run ends equal (torch.equal)
to an uninterrupted one; with another number of ranks the model and the
optimizer resume, and a rank with no saved generator starts a fresh stream.

Test switches: --steps, --every (checkpoint interval), --out DIR (each
rank's final state as rank-R.pt), --step-seconds (slow steps, to be stopped
mid-run), --die-mid-save RANK:STEP (that rank writes half of its part of
that step's checkpoint and dies), --rank0-only (only rank 0 writes, the
common `if rank == 0: torch.save(...)` pattern: the other ranks' parts are
empty and still take part in the commit; each step's data then comes from
a generator seeded by the step and the rank, so nothing else needs saving),
--dcp (the model and the optimizer through torch.distributed.checkpoint, as
FSDP programs save: every rank writes its own `__R_0.distcp` into its part,
rank 0 the `.metadata`; rekindle commits them as one directory, which
`dcp.load` reads back on every rank), --hang RANK:STEP:MARKER (that rank
stops making progress at the start of that step, as a deadlocked data
loader would, unless MARKER exists; it writes MARKER first, so the run that
resumes trains on: rekindle's watchdog ends the hung program).
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import rekindle_client as rk  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=2_000)
p.add_argument("--every", type=int, default=100)
p.add_argument("--out")
p.add_argument("--step-seconds", type=float, default=0.0)
p.add_argument("--die-mid-save", default="")
p.add_argument("--rank0-only", action="store_true")
p.add_argument("--dcp", action="store_true")
p.add_argument("--hang", default="")
args = p.parse_args()

cuda = torch.cuda.is_available()
# env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (torchrun, or rekindle exec from SLURM's variables)
dist.init_process_group("nccl" if cuda else "gloo")
rank, size = dist.get_rank(), dist.get_world_size()
device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
if cuda:
    torch.cuda.set_device(device)

torch.manual_seed(0)  # the same initial weights on every rank, reproducibly
net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)).to(device)
model = DistributedDataParallel(net, device_ids=[device.index] if cuda else None)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
gen = torch.Generator().manual_seed(1000 + rank)  # each rank its own slice of the data
start = 0


def dcp_state():
    """The model's and the optimizer's state as torch.distributed.checkpoint
    takes it (the same call serves FSDP's sharded state), and the step."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, opt_state = get_state_dict(model, opt)
    return {"model": model_state, "opt": opt_state, "step": torch.tensor(0)}


if rk.resume_path() and args.dcp:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    # Every rank reads the shards the world wrote, through .metadata.
    state = dcp_state()
    dcp.load(state, checkpoint_id=rk.resume_path())
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["opt"])
    start = int(state["step"])
elif rk.resume_path():
    # Written by rank 0, read by every rank.
    state = torch.load(os.path.join(rk.resume_path(), "model.pt"), map_location=device)
    net.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    start = state["step"]
if rk.resume_path():
    mine = os.path.join(rk.resume_path(), "rng-%d.pt" % rank)
    if os.path.exists(mine):  # absent after a resume with more ranks
        gen.set_state(torch.load(mine))
print("rank %d of %d starting at step %d" % (rank, size, start), file=sys.stderr, flush=True)


def save(directory, step):
    if args.dcp:
        import torch.distributed.checkpoint as dcp

        # A collective: each rank writes its shards into its own part.
        state = dcp_state()
        state["step"] = torch.tensor(step)
        dcp.save(state, checkpoint_id=directory)
    elif rank == 0:
        torch.save({"model": net.state_dict(), "opt": opt.state_dict(), "step": step}, os.path.join(directory, "model.pt"))
    if not args.rank0_only:
        torch.save(gen.get_state(), os.path.join(directory, "rng-%d.pt" % rank))


die_rank, _, die_step = args.die_mid_save.partition(":")
hang_rank, hang_step, hang_marker = (args.hang.split(":", 2) + ["", ""])[:3] if args.hang else ("", "", "")
stopped = False
for step in range(start + 1, args.steps + 1):
    if args.rank0_only:
        gen.manual_seed(1_000_000 * step + rank)  # the step's data, whatever ran before
    if hang_step and int(hang_rank) == rank and int(hang_step) == step and not os.path.exists(hang_marker):
        open(hang_marker, "w").close()
        print("rank %d hangs at step %d" % (rank, step), file=sys.stderr, flush=True)
        while True:  # SIGTERM only sets the client's stop flag: this rank stays stuck
            time.sleep(1)
    x = torch.randn(32, 64, generator=gen).to(device)
    y = x.sum(dim=1, keepdim=True)
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if rank == 0:
        rk.log_metrics(step, loss=loss.item(), lr=3e-4)
    time.sleep(args.step_seconds)
    if die_step and int(die_rank) == rank and int(die_step) == step:
        staged = os.path.join(os.environ["REKINDLE_CHECKPOINT_DIR"], "rank-%d-half" % rank)
        os.mkdir(staged)
        with open(os.path.join(staged, "rng-%d.pt" % rank), "wb") as f:
            f.write(b"half")
        print("rank %d dying in the middle of a save at step %d" % (rank, step), file=sys.stderr, flush=True)
        os._exit(9)
    if step % args.every == 0 or rk.should_stop(step):
        rk.checkpoint(step, lambda d: save(d, step))
    if rk.should_stop(step):
        print("rank %d stopped at step %d" % (rank, step), file=sys.stderr, flush=True)
        stopped = True
        break

if not stopped and args.out:
    os.makedirs(args.out, exist_ok=True)
    torch.save({"model": net.state_dict(), "opt": opt.state_dict(), "rng": gen.get_state()}, os.path.join(args.out, "rank-%d.pt" % rank))
if not stopped:
    print("rank %d finished at step %d" % (rank, args.steps), file=sys.stderr, flush=True)
dist.destroy_process_group()
