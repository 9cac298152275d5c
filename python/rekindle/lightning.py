"""PyTorch Lightning under `rekindle exec`: one callback, one argument.

    import rekindle.lightning as rkl

    trainer = L.Trainer(max_steps=1000, callbacks=[rkl.RekindleCallback(every_n_steps=100)])
    trainer.fit(model, data, ckpt_path=rkl.resume_checkpoint())

What it does:

- rekindle's stop (SIGTERM, preemption, `scancel -s TERM`) becomes a
  checkpoint of the current step and the end of `fit()`: every rank agrees
  on the step (`rekindle.should_stop(step)`, about one tiny collective a
  second), then `trainer.save_checkpoint` writes `last.ckpt` into
  rekindle's staging directory (rank 0 writes, every rank takes part) and
  `rekindle seal` commits it;
- every `every_n_steps` optimizer steps the same, as a periodic checkpoint;
- `resume_checkpoint()` is the sealed `last.ckpt` of the newest checkpoint
  that verifies, or None on a fresh start.

Lightning restores the model, optimizers, schedulers and loop counters from
it; a checkpoint taken in the middle of an epoch resumes that epoch
exactly only with a dataloader whose position is saved (Lightning's own
caveat): use `every_n_steps` at epoch boundaries, or a stateful sampler,
where bit-exact resumes matter.
"""

import os

from lightning.pytorch.callbacks import Callback

import rekindle_client as rk

#: The file each checkpoint holds.
CHECKPOINT_FILE = "last.ckpt"


def resume_checkpoint():
    """The `last.ckpt` of rekindle's newest checkpoint that verifies, or None."""
    path = rk.resume_path()
    return os.path.join(path, CHECKPOINT_FILE) if path else None


class RekindleCallback(Callback):
    """Checkpoints at rekindle's stop (and every `every_n_steps`), sealed by rekindle."""

    def __init__(self, every_n_steps=None, log_metrics=True):
        self.every_n_steps = every_n_steps
        self.log_metrics = log_metrics
        self._sealed = None

    def on_train_start(self, trainer, pl_module):
        # Lightning registers its own SIGTERM handler as fit() starts: it
        # ends fit() with an exception at the end of the batch the signal
        # came in, which may be after this callback's hook of that batch ran,
        # so the stop's checkpoint of the current step would be lost (and
        # the program's code after fit() never runs). Under rekindle the
        # stop is this callback's to take; Lightning restores the handlers it
        # replaced when fit() ends.
        if rk.under_rekindle():
            rk.install_stop_handler()

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        # A validation is watched by [watchdog] eval batch by batch, not by
        # the step limit over its whole length (docs/exec.md).
        rk.eval_batch(trainer.global_step, batch_idx + 1)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        stop = rk.should_stop(step)
        due = self.every_n_steps and step > 0 and step % self.every_n_steps == 0
        if (stop or due) and step != self._sealed:
            rk.checkpoint(step, lambda staged: trainer.save_checkpoint(os.path.join(staged, CHECKPOINT_FILE)))
            self._sealed = step
        if stop:
            trainer.should_stop = True
        if self.log_metrics and trainer.is_global_zero:
            loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
            if loss is not None and hasattr(loss, "item"):
                rk.log_metrics(step, loss=float(loss.item()))
