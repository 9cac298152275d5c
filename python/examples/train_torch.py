"""A PyTorch training script under `rekindle exec`: the five rekindle lines
end in a `rekindle` comment. Documented in docs/exec.md; the tests run it
with real torch (tests/it/torch_exec.rs): stopped with SIGTERM and resumed,
it ends with model, optimizer and RNG state equal (torch.equal) to an
uninterrupted run's.

    rekindle exec --run-dir runs/torch -- python3 python/examples/train_torch.py
    sbatch --gres=gpu:1 slurm/orchestrator.slurm --exec --run-dir runs/torch -- python3 python/examples/train_torch.py

Reproducible as shipped: every random draw is seeded, the model's initial
weights included (torch.manual_seed before the model is built). On the CPU,
runs are bit-identical across processes with the same thread count
(OMP_NUM_THREADS=1 in the tests); on a GPU also set
torch.use_deterministic_algorithms(True) (docs/exec.md).

Test switches: --steps, --every (checkpoint interval), --out FILE (the
final state, for comparing runs), --step-seconds (slow steps, to be stopped
mid-run).
"""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import rekindle_client as rk  # noqa: E402  # rekindle

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=10_000)
p.add_argument("--every", type=int, default=500)
p.add_argument("--out")
p.add_argument("--step-seconds", type=float, default=0.0)
args = p.parse_args()

torch.manual_seed(0)  # before the model is built: its initial weights are random draws too
device = "cuda" if torch.cuda.is_available() else "cpu"
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
gen = torch.Generator().manual_seed(1)  # the data's own stream, saved in every checkpoint
start = 0

if rk.resume_path():  # rekindle
    state = torch.load(os.path.join(rk.resume_path(), "state.pt"), map_location=device)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    gen.set_state(state["rng"])
    start = state["step"]
print("starting at step %d" % start, file=sys.stderr, flush=True)


def state_dict(step):
    return {"model": model.state_dict(), "opt": opt.state_dict(), "rng": gen.get_state(), "step": step}


def save(directory, step):
    torch.save(state_dict(step), os.path.join(directory, "state.pt"))


for step in range(start + 1, args.steps + 1):
    x = torch.randn(32, 64, generator=gen).to(device)
    y = x.sum(dim=1, keepdim=True)
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    rk.log_metrics(step, loss=loss.item(), lr=3e-4)
    time.sleep(args.step_seconds)
    if step % args.every == 0 or rk.should_stop(step):  # rekindle
        rk.checkpoint(step, lambda d: save(d, step))  # rekindle
    if rk.should_stop(step):  # rekindle
        print("stopped at step %d" % step, file=sys.stderr, flush=True)
        break
else:
    if args.out:
        torch.save(state_dict(args.steps), args.out)
    print("finished at step %d" % args.steps, file=sys.stderr, flush=True)
