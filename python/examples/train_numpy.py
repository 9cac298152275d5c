"""A real (small) training program under `rekindle exec`, numpy only.

Linear regression trained with Adam on batches drawn from a seeded numpy
Generator. A checkpoint holds the weights, both Adam moments and the
generator's state (np.save and JSON, through rekindle_client.checkpoint), so
a run stopped and resumed any number of times ends with weights
byte-identical to an uninterrupted run's.

    rekindle exec --run-dir runs/np -- python3 python/examples/train_numpy.py --steps 200 --out w.npy

Test switches: --step-seconds (slow steps, to be stopped mid-run),
--ignore-stop (ignore SIGTERM and the stop file), --crash-at STEP (exit 3
with a traceback-like line on stderr), --die-mid-save STEP (start a
checkpoint of STEP, write half of it, die).
"""

import argparse
import json
import os
import signal
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import rekindle_client as rk  # noqa: E402

DIM = 8
LR, BETA1, BETA2, EPS = 0.05, 0.9, 0.999, 1e-8


def fresh():
    return {
        "w": np.zeros(DIM),
        "m": np.zeros(DIM),
        "v": np.zeros(DIM),
        "rng": np.random.Generator(np.random.PCG64(1234)),
        "step": 0,
    }


def save(state, directory, half=False):
    np.save(os.path.join(directory, "w.npy"), state["w"])
    np.save(os.path.join(directory, "m.npy"), state["m"])
    if half:
        return
    np.save(os.path.join(directory, "v.npy"), state["v"])
    with open(os.path.join(directory, "rng.json"), "w") as f:
        json.dump(state["rng"].bit_generator.state, f)


def load(directory):
    rng = np.random.Generator(np.random.PCG64())
    with open(os.path.join(directory, "rng.json")) as f:
        rng.bit_generator.state = json.load(f)
    return {
        "w": np.load(os.path.join(directory, "w.npy")),
        "m": np.load(os.path.join(directory, "m.npy")),
        "v": np.load(os.path.join(directory, "v.npy")),
        "rng": rng,
        "step": rk.resume_step(),
    }


def train_step(state, true_w):
    rng = state["rng"]
    x = rng.standard_normal((32, DIM))
    y = x @ true_w + 0.1 * rng.standard_normal(32)
    err = x @ state["w"] - y
    loss = float(np.mean(err**2))
    grad = 2.0 * x.T @ err / len(y)
    t = state["step"] + 1
    state["m"] = BETA1 * state["m"] + (1 - BETA1) * grad
    state["v"] = BETA2 * state["v"] + (1 - BETA2) * grad**2
    m_hat = state["m"] / (1 - BETA1**t)
    v_hat = state["v"] / (1 - BETA2**t)
    state["w"] = state["w"] - LR * m_hat / (np.sqrt(v_hat) + EPS)
    state["step"] = t
    return loss


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--out", required=True)
    p.add_argument("--step-seconds", type=float, default=0.0)
    p.add_argument("--ignore-stop", action="store_true")
    p.add_argument("--crash-at", type=int)
    p.add_argument("--die-mid-save", type=int)
    args = p.parse_args()
    if args.ignore_stop:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    true_w = np.random.Generator(np.random.PCG64(7)).standard_normal(DIM)
    state = load(rk.resume_path()) if rk.resume_path() else fresh()
    print("starting at step %d" % state["step"], file=sys.stderr, flush=True)
    while state["step"] < args.steps:
        loss = train_step(state, true_w)
        step = state["step"]
        rk.log_metrics(step, loss=loss, lr=LR)
        if args.step_seconds:
            time.sleep(args.step_seconds)
        if args.crash_at == step:
            print("RuntimeError: simulated crash at step %d" % step, file=sys.stderr, flush=True)
            sys.exit(3)
        if args.die_mid_save == step:
            staged = os.path.join(os.environ["REKINDLE_CHECKPOINT_DIR"], "step-%d-half" % step)
            os.mkdir(staged)
            save(state, staged, half=True)
            print("dying in the middle of a save at step %d" % step, file=sys.stderr, flush=True)
            os._exit(9)
        stopping = rk.should_stop() and not args.ignore_stop
        if step % args.every == 0 or stopping:
            rk.checkpoint(step, lambda d: save(state, d))
        if stopping:
            print("stopped at step %d" % step, file=sys.stderr, flush=True)
            return 0
    np.save(args.out, state["w"])
    print("finished at step %d" % state["step"], file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
