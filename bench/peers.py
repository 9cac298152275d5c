#!/usr/bin/env python3
"""Durable-save timings of the Python tools users would otherwise use, on the
same bytes and filesystem as `rekindle bench checkpoint`.

Prints one JSON object: seconds for
  torch_save_fsync_sha256   torch.save + fsync + hashlib.sha256 of the file
  torch_save_fsync          torch.save + fsync
  safetensors_save_fsync    safetensors.torch.save_file + fsync
  safetensors_save_fsync_sha256   the same + hashlib.sha256 of the file

The "+ sha256" figures are the peers that give what a rekindle save gives
(durable bytes and their hash); each second save of a kind reuses the warm
memory of the first, which favours the peers.
"""
import argparse
import hashlib
import json
import os
import time


def fsync_path(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(8 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def state(nbytes):
    import torch

    # The same layout as rekindle's synthetic state: a third parameters, two
    # thirds AdamW moments, rows of 4096 f32, eight layers.
    row = 4096 * 4
    per_layer_rows = max(1, nbytes // 3 // 8 // row)
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for layer in range(8):
        for prefix in ("", "exp_avg.", "exp_avg_sq."):
            tensors[f"{prefix}blocks.{layer}.mlp.weight"] = torch.rand(per_layer_rows, 4096, generator=g)
    return tensors


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bytes", type=int, required=True)
    ap.add_argument("--dir", required=True)
    args = ap.parse_args()
    import torch
    from safetensors.torch import save_file

    tensors = state(args.bytes)
    out = {}
    path = os.path.join(args.dir, "peer.pt")

    t0 = time.perf_counter()
    torch.save(tensors, path)
    fsync_path(path)
    out["torch_save_fsync"] = time.perf_counter() - t0
    os.remove(path)

    t0 = time.perf_counter()
    torch.save(tensors, path)
    fsync_path(path)
    sha256_file(path)
    out["torch_save_fsync_sha256"] = time.perf_counter() - t0
    os.remove(path)

    path = os.path.join(args.dir, "peer.safetensors")
    t0 = time.perf_counter()
    save_file(tensors, path)
    fsync_path(path)
    out["safetensors_save_fsync"] = time.perf_counter() - t0
    os.remove(path)

    t0 = time.perf_counter()
    save_file(tensors, path)
    fsync_path(path)
    sha256_file(path)
    out["safetensors_save_fsync_sha256"] = time.perf_counter() - t0
    os.remove(path)
    out["bytes"] = sum(t.numel() * t.element_size() for t in tensors.values())
    print(json.dumps(out))


if __name__ == "__main__":
    main()
