"""Per-call cost of rekindle_client.should_stop() in a distributed program.

Run under torchrun, e.g. (docs/performance.md has the figures):

    OMP_NUM_THREADS=1 .venv/bin/torchrun --standalone --nproc-per-node 2 bench/should_stop.py --calls 20000

Every rank makes the same calls; rank 0 prints one JSON line with the mean
microseconds per call of:
  every_call   should_stop() without a step: an agreement (all-reduce) per call;
  per_step     should_stop(step), no stop pending: an agreement about every
               AGREE_SECONDS, a counter in between;
  agreements   how many agreements per_step made;
  stopped      should_stop(step) once a stop was agreed (it stays True).
"""

import argparse
import json
import os
import sys
import time

import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import rekindle_client as rk  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--calls", type=int, default=20_000)
args = p.parse_args()
dist.init_process_group("gloo")


def timed(fn):
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) / args.calls * 1e6


every_call = timed(lambda: [rk.should_stop() for _ in range(args.calls)])
before = rk._agreed_at
agreements = [0]


def per_step():
    for step in range(args.calls):
        at = rk._agreed_at
        rk.should_stop(step)
        agreements[0] += rk._agreed_at is not at


per_step_us = timed(per_step)
rk._stop_signalled = True  # a stop arrives on every rank; the next agreement sees it
step = args.calls
while not rk.should_stop(step):
    step += 1
stopped = timed(lambda: [rk.should_stop(step) for _ in range(args.calls)])
if dist.get_rank() == 0:
    print(json.dumps({"ranks": dist.get_world_size(), "calls": args.calls, "every_call_us": round(every_call, 2),
                      "per_step_us": round(per_step_us, 3), "agreements": agreements[0],
                      "stopped_us": round(stopped, 3)}))
dist.destroy_process_group()
