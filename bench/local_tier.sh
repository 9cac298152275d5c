#!/usr/bin/env bash
# The cost of the node-local checkpoint tier ([recovery] local,
# docs/recovery.md) to training: the same `rekindle run` with the tier off
# and on, interleaved A/B so machine noise hits both alike, on one process.
#
#   [REKINDLE_BIN=path] bench/local_tier.sh [ROUNDS=3] [STEPS=3000] [EVERY=auto|N] [DIR=bench/.scratch]
#
# EVERY: `auto` (the default frequency: as often as costs 1 % of the time,
# at least every 5 s) or a step count (recovery.local_every_steps).
# Prints per round the steps/s of both and, from the `local_checkpoint`
# events, the copies committed and the training thread's stall per copy;
# then the median throughput ratio (on / off) and the median stall.
# The model: configs/tiny.toml widened to ~17 MB of state (mlp 1024 ->
# [1024, 1024] -> 10), so a copy is a real write, not a few kilobytes.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
STEPS=${2:-3000}
EVERY=${3:-auto}
DIR=${4:-bench/.scratch}
mkdir -p "$DIR"
BIN=${REKINDLE_BIN:-}
if [ -z "$BIN" ]; then
    cargo build --release --quiet
    BIN=target/release/rekindle
fi
MODEL=(--set model.input_dim=1024 --set "model.hidden=[1024,1024]" --set "run.max_steps=$STEPS"
    --set checkpoint.interval=\"1h\" --set checkpoint.every_steps=0 --set train.log_every=100)
if [ "$EVERY" = auto ]; then
    LOCAL=(--set recovery.local=true --set recovery.local_interval=\"auto\")
else
    LOCAL=(--set recovery.local=true --set "recovery.local_every_steps=$EVERY" --set recovery.local_interval=\"1h\")
fi
one() { # run-dir, extra args...
    local run=$1
    shift
    rm -rf "$run"
    "$BIN" -q run --config configs/tiny.toml --run-dir "$run" "${MODEL[@]}" "$@" >/dev/null
}
lines=()
for round in $(seq "$ROUNDS"); do
    one "$DIR/local-off" 
    one "$DIR/local-on" "${LOCAL[@]}" --set "recovery.local_dir=\"$DIR/node-local\""
    line=$(python3 - "$DIR/local-off" "$DIR/local-on" "$round" <<'PY'
import json, sys
def rate(run):
    s = json.load(open(run + "/summary.json"))
    return s["steps_this_attempt"] / s["wall_seconds_this_attempt"]
off, on, rnd = rate(sys.argv[1]), rate(sys.argv[2]), sys.argv[3]
saves = [json.loads(l) for l in open(sys.argv[2] + "/events.jsonl") if '"local_checkpoint"' in l]
committed = [s for s in saves if s.get("outcome") == "committed"]
stalls = sorted(s["stall_seconds"] for s in committed) or [float("nan")]
print(json.dumps({"round": int(rnd), "steps_per_s_off": round(off, 1), "steps_per_s_on": round(on, 1),
                  "ratio": round(on / off, 4), "copies": len(committed),
                  "bytes_per_copy": committed[0]["bytes"] if committed else 0,
                  "median_stall_s": stalls[len(stalls) // 2],
                  "median_write_s": sorted(s["write_seconds"] for s in committed)[len(committed) // 2] if committed else None}))
PY
    )
    echo "$line"
    lines+=("$line")
done
python3 - "${lines[@]}" <<'PY'
import json, statistics, sys
rows = [json.loads(a) for a in sys.argv[1:]]
print(json.dumps({"median_ratio": statistics.median(r["ratio"] for r in rows),
                  "median_stall_s": statistics.median(r["median_stall_s"] for r in rows),
                  "copies_per_run": [r["copies"] for r in rows]}))
PY
