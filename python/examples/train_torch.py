"""A PyTorch training script under `rekindle exec`: the five rekindle lines
end in a `rekindle` comment. Documented in docs/exec.md; CI checks that it
compiles (torch is too heavy to install there), the numpy twin
(train_numpy.py) is what the tests run.

    rekindle exec --run-dir runs/torch -- python3 python/examples/train_torch.py
    sbatch --gres=gpu:1 slurm/orchestrator.slurm --exec --run-dir runs/torch -- python3 python/examples/train_torch.py
"""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import rekindle_client as rk  # noqa: E402  # rekindle

STEPS = 10_000
device = "cuda" if torch.cuda.is_available() else "cpu"
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
gen = torch.Generator().manual_seed(0)
start = 0

if rk.resume_path():  # rekindle
    state = torch.load(os.path.join(rk.resume_path(), "state.pt"), map_location=device)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    gen.set_state(state["rng"])
    start = state["step"]


def save(directory, step):
    state = {"model": model.state_dict(), "opt": opt.state_dict(), "rng": gen.get_state(), "step": step}
    torch.save(state, os.path.join(directory, "state.pt"))


for step in range(start + 1, STEPS + 1):
    x = torch.randn(32, 64, generator=gen).to(device)
    y = x.sum(dim=1, keepdim=True)
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    rk.log_metrics(step, loss=loss.item(), lr=3e-4)
    if step % 500 == 0 or rk.should_stop():  # rekindle
        rk.checkpoint(step, lambda d: save(d, step))  # rekindle
    if rk.should_stop():  # rekindle
        break
