#!/usr/bin/env python3
"""The Python safetensors peer alone (numpy, no torch), for machines where
torch cannot be installed (the PyPI torch wheel imports only with its CUDA
libraries, ~5 GB): seconds for safetensors.numpy.save_file + fsync, then the
same + hashlib.sha256 of the file, on rekindle's synthetic state layout.

    python3 bench/safetensors_peer.py BYTES DIR
"""
import hashlib, json, os, sys, time
import numpy as np
from safetensors.numpy import save_file
nbytes, d = int(sys.argv[1]), sys.argv[2]
rows = max(1, nbytes // 3 // 8 // (4096 * 4))
rng = np.random.default_rng(0)
t = {f"{p}blocks.{l}.mlp.weight": rng.random((rows, 4096), dtype=np.float32) for l in range(8) for p in ("", "exp_avg.", "exp_avg_sq.")}
path = os.path.join(d, "peer.safetensors")
def fsync(p):
    fd = os.open(p, os.O_RDONLY); os.fsync(fd); os.close(fd)
out = {}
t0 = time.perf_counter(); save_file(t, path); fsync(path); out["safetensors_save_fsync"] = time.perf_counter() - t0; os.remove(path)
t0 = time.perf_counter(); save_file(t, path); fsync(path)
h = hashlib.sha256()
with open(path, "rb") as f:
    for c in iter(lambda: f.read(8 << 20), b""): h.update(c)
out["safetensors_save_fsync_sha256"] = time.perf_counter() - t0; os.remove(path)
print(json.dumps(out))
