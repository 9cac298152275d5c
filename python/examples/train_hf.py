"""A Hugging Face `Trainer` under `rekindle exec`, with rekindle's callback
(docs/exec.md, "Trainers"). A tiny GPT-2 built from its config (nothing is
downloaded) learns random token sequences on the CPU:

    rekindle exec --run-dir runs/hf -- python3 python/examples/train_hf.py
    sbatch slurm/orchestrator.slurm --exec --run-dir runs/hf -- python3 python/examples/train_hf.py

The two rekindle lines are the callback and `resume_from_checkpoint`.
Stopped (SIGTERM, `scancel -s TERM`) and resumed, it ends with weights
equal (torch.equal) to an uninterrupted run's.

Test switches: --steps, --every (the Trainer's save_steps), --out FILE (the
final weights), --step-seconds (slow steps, to be stopped mid-run),
--output-dir (the Trainer's own checkpoints; default: a temporary folder).
"""

import argparse
import os
import sys
import tempfile
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import rekindle as rk  # noqa: E402
from rekindle.hf import RekindleCallback  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=200)
p.add_argument("--every", type=int, default=50)
p.add_argument("--out")
p.add_argument("--step-seconds", type=float, default=0.0)
p.add_argument("--output-dir")
args = p.parse_args()


class Tokens(torch.utils.data.Dataset):
    """Random sequences of 16 tokens, the same for a given index on every run."""

    def __len__(self):
        return 4096

    def __getitem__(self, i):
        ids = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


class Slow(TrainerCallback):
    def on_step_end(self, *a, **k):
        time.sleep(args.step_seconds)


torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=1, n_head=2))
output_dir = args.output_dir or tempfile.mkdtemp(prefix="hf-output-")
training = TrainingArguments(
    output_dir=output_dir, max_steps=args.steps, save_steps=args.every, per_device_train_batch_size=8,
    learning_rate=1e-3, logging_steps=1, report_to=[], use_cpu=True, seed=0, dataloader_num_workers=0,
    save_total_limit=2, disable_tqdm=True,
)
trainer = Trainer(model=model, args=training, train_dataset=Tokens(), callbacks=[RekindleCallback(), Slow()])
print("starting at step %d" % (rk.resume_step() or 0), file=sys.stderr, flush=True)
trainer.train(resume_from_checkpoint=rk.resume_path())
if rk.should_stop(trainer.state.global_step):
    print("stopped at step %d" % trainer.state.global_step, file=sys.stderr, flush=True)
elif args.out and trainer.is_world_process_zero():
    torch.save(model.state_dict(), args.out)
