"""rekindle's client for programs under `rekindle exec` (docs/exec.md).

`import rekindle as rk`: the functions of `rekindle_client` (the same code,
which also works as one file copied next to a script), and the callbacks
for Hugging Face's Trainer (`rekindle.hf`) and PyTorch Lightning
(`rekindle.lightning`), imported only when used.
"""

from rekindle_client import (
    AGREE_SECONDS,
    PROGRESS_SECONDS,
    PROTOCOL,
    STOP_FILE_SECONDS,
    RekindleError,
    checkpoint,
    deadline,
    eval_batch,
    install_stop_handler,
    log_metrics,
    resume_path,
    resume_step,
    should_stop,
    step,
    stop_requested,
    under_rekindle,
    world,
)

__all__ = [
    "AGREE_SECONDS",
    "PROGRESS_SECONDS",
    "PROTOCOL",
    "STOP_FILE_SECONDS",
    "RekindleError",
    "checkpoint",
    "deadline",
    "eval_batch",
    "install_stop_handler",
    "log_metrics",
    "resume_path",
    "resume_step",
    "should_stop",
    "step",
    "stop_requested",
    "under_rekindle",
    "world",
]
