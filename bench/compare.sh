#!/usr/bin/env bash
# Durable checkpoint saves, rekindle beside the Python tools users know, on the
# same bytes and filesystem, interleaved A/B so machine noise hits both alike.
#
#   [REKINDLE_BIN=path] bench/compare.sh [SIZE_BYTES=1073741824] [ROUNDS=3] [DIR=bench/.scratch]
#
# The peers run in the project's virtualenv, .venv (`make deps` installs
# torch, safetensors and numpy there). Prints each round and the median ratios.
set -euo pipefail
cd "$(dirname "$0")/.."
BYTES=${1:-1073741824}
ROUNDS=${2:-3}
DIR=${3:-bench/.scratch}
mkdir -p "$DIR"
PY=.venv/bin/python
if ! "$PY" -c "import torch, safetensors, numpy" 2>/dev/null; then
    echo "bench/compare.sh: $PY cannot import torch, safetensors and numpy: run \`make deps\` first" >&2
    exit 2
fi
# REKINDLE_BIN: a rekindle already built (e.g. with --features mpi); else
# the release build of this checkout.
BIN=${REKINDLE_BIN:-}
if [ -z "$BIN" ]; then
    cargo build --release --quiet
    BIN=target/release/rekindle
fi
results=()
for round in $(seq "$ROUNDS"); do
    r=$("$BIN" -q bench checkpoint --bytes "$BYTES" --dir "$DIR" --repeat 1 --json)
    p=$("$PY" bench/peers.py --bytes "$BYTES" --dir "$DIR")
    line=$(python3 - "$r" "$p" <<'PY'
import json, sys
r, p = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(json.dumps({"rekindle_save": r["sync_save_seconds"], "dd_fsync": r["dd_fsync_seconds"]["median"] if r["dd_fsync_seconds"] else None, **p}))
PY
)
    echo "round $round: $line"
    results+=("$line")
done
python3 - "${results[@]}" <<'PY'
import json, statistics, sys
rows = [json.loads(a) for a in sys.argv[1:]]
med = lambda k: statistics.median(r[k] for r in rows if r.get(k) is not None)
rk = med("rekindle_save")
print(f"median seconds: rekindle save+sha256 {rk:.3f}, dd conv=fsync {med('dd_fsync'):.3f}, "
      f"safetensors+fsync {med('safetensors_save_fsync'):.3f}, safetensors+fsync+sha256 {med('safetensors_save_fsync_sha256'):.3f}, "
      f"torch.save+fsync {med('torch_save_fsync'):.3f}, torch.save+fsync+sha256 {med('torch_save_fsync_sha256'):.3f}")
print(f"ratios (>1 means rekindle is faster): vs dd {med('dd_fsync')/rk:.2f}, "
      f"vs safetensors+sha256 {med('safetensors_save_fsync_sha256')/rk:.2f} (without hashing {med('safetensors_save_fsync')/rk:.2f}), "
      f"vs torch.save+sha256 {med('torch_save_fsync_sha256')/rk:.2f} (without hashing {med('torch_save_fsync')/rk:.2f})")
PY
