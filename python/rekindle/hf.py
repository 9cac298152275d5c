"""Hugging Face `Trainer` under `rekindle exec`: one callback, one argument.

    import rekindle as rk
    from rekindle.hf import RekindleCallback

    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[RekindleCallback()])
    trainer.train(resume_from_checkpoint=rk.resume_path())

What it does:

- rekindle's stop (SIGTERM, preemption, `scancel -s TERM`) becomes a save of
  the current step and the end of `train()`: every rank agrees on the step
  (`rk.should_stop(step)`, about one tiny collective a second);
- every checkpoint the Trainer saves (its `save_steps`, and the stop's) is
  sealed by rekindle: its files are copied into a fresh staging directory
  and `rekindle seal` hashes, fsyncs and commits them, so the newest one that
  verifies is what `rk.resume_path()` returns at the next start, and the
  Trainer resumes from it (model, optimizer, scheduler, RNG, data position);
- the Trainer's logged `loss`, `learning_rate`, `grad_norm` and `eval_loss`
  go into `metrics.jsonl` (rank 0), which `rekindle report` plots.

In a world of several ranks each rank seals its own part: rank 0 the
Trainer's files, every other rank its `rng_state_<rank>.pth`. The copy is
the price of sealing files the Trainer wrote elsewhere: put `output_dir` on
node-local storage and the durable write is rekindle's alone.
"""

import os
import re
import shutil

from transformers import TrainerCallback

import rekindle_client as rk

_RANK_FILE = re.compile(r"rng_state_(\d+)\.pth$")


class RekindleCallback(TrainerCallback):
    """Stops at rekindle's stop with a checkpoint of the current step, and seals every save."""

    def __init__(self, log_metrics=True):
        self.log_metrics = log_metrics
        self._sealed = None

    def on_step_end(self, args, state, control, **kwargs):
        if rk.should_stop(state.global_step):
            control.should_save = True
            control.should_training_stop = True
        return control

    def on_evaluate(self, args, state, control, **kwargs):
        self._eval_batches = 0
        return control

    def on_prediction_step(self, args, state, control, **kwargs):
        # An evaluation is watched by [watchdog] eval batch by batch, not
        # by the step limit over its whole length (docs/exec.md).
        self._eval_batches = getattr(self, "_eval_batches", 0) + 1
        rk.eval_batch(state.global_step, self._eval_batches)
        return control

    def on_save(self, args, state, control, **kwargs):
        step = state.global_step
        if step == self._sealed:
            return control
        source = os.path.join(args.output_dir, "checkpoint-%d" % step)
        rk.checkpoint(step, lambda staged: _copy_part(source, staged))
        self._sealed = step
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not self.log_metrics or not logs or not state.is_world_process_zero:
            return control
        values = {}
        for ours, theirs in (("loss", "loss"), ("lr", "learning_rate"), ("grad_norm", "grad_norm"),
                             ("epoch", "epoch"), ("val_loss", "eval_loss")):
            if isinstance(logs.get(theirs), (int, float)):
                values[ours] = logs[theirs]
        if "loss" in values or "val_loss" in values:
            rk.log_metrics(state.global_step, **values)
        return control


def _copy_part(source, staged):
    """Copies this rank's part of the Trainer's checkpoint `source` into `staged`."""
    ranks = rk.world()
    rank = ranks[0] if ranks else 0
    for name in sorted(os.listdir(source)):
        path = os.path.join(source, name)
        if not os.path.isfile(path) or os.path.islink(path):
            raise rk.RekindleError(
                "%s is not a regular file: rekindle seals flat checkpoints (save without nested folders)" % path
            )
        match = _RANK_FILE.match(name)
        mine = int(match.group(1)) == rank if match else rank == 0
        if mine:
            shutil.copyfile(path, os.path.join(staged, name))
