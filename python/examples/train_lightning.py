"""PyTorch Lightning under `rekindle exec`, with rekindle's callback
(docs/exec.md, "Trainers"): a small regression model on the CPU.

    rekindle exec --run-dir runs/pl -- python3 python/examples/train_lightning.py
    rekindle exec --run-dir runs/pl -- torchrun --standalone --nproc-per-node 2 python/examples/train_lightning.py
    sbatch slurm/orchestrator.slurm --exec --run-dir runs/pl -- python3 python/examples/train_lightning.py

The two rekindle lines are the callback and `ckpt_path`. Stopped
(SIGTERM, `scancel -s TERM`) and resumed, it ends with weights equal
(torch.equal) to an uninterrupted run's.

Test switches: --steps, --every (every_n_steps), --out FILE (the final
weights), --step-seconds (slow steps, to be stopped mid-run). One epoch is 20
batches; the loader saves its place, so a stop mid-epoch resumes exactly.
"""

import argparse
import os
import sys
import time

import lightning as L
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import rekindle as rk  # noqa: E402
import rekindle.lightning as rkl  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=200)
p.add_argument("--every", type=int, default=50)
p.add_argument("--out")
p.add_argument("--step-seconds", type=float, default=0.0)
args = p.parse_args()


class Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        time.sleep(args.step_seconds)
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class ResumableLoader(torch.utils.data.DataLoader):
    """A DataLoader whose position in the epoch Lightning saves and restores
    (its `state_dict`/`load_state_dict`), so a checkpoint taken mid-epoch (a
    stop's) resumes at the next batch instead of the epoch's first: without
    it Lightning warns that the resume "can cause unreliable results"."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self._yielded, self._skip = 0, 0

    def __iter__(self):
        skip, self._skip = self._skip, 0
        self._yielded = skip
        for i, batch in enumerate(super().__iter__()):
            if i >= skip:
                self._yielded += 1
                yield batch

    def state_dict(self):
        return {"batches": self._yielded}

    def load_state_dict(self, state):
        self._skip = state["batches"]


g = torch.Generator().manual_seed(0)
x = torch.randn(8 * 20, 16, generator=g)
data = ResumableLoader(torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=8)
L.seed_everything(0, verbose=False)
model = Regression()
# Under torchrun, one process a rank: Lightning's DDP over gloo.
ranks = int(os.environ.get("WORLD_SIZE", "1"))
trainer = L.Trainer(
    max_steps=args.steps, accelerator="cpu", devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
    num_nodes=max(1, ranks // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))),
    strategy="ddp" if ranks > 1 else "auto", logger=False, enable_checkpointing=False,
    enable_progress_bar=False, enable_model_summary=False, callbacks=[rkl.RekindleCallback(every_n_steps=args.every)],
)
print("starting at step %d" % (rk.resume_step() or 0), file=sys.stderr, flush=True)
trainer.fit(model, data, ckpt_path=rkl.resume_checkpoint())
if rk.should_stop(trainer.global_step):
    print("stopped at step %d" % trainer.global_step, file=sys.stderr, flush=True)
elif args.out and trainer.is_global_zero:
    torch.save(model.state_dict(), args.out)
