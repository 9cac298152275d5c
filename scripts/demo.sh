#!/bin/sh
# The first five minutes with rekindle (`make demo`): train the built-in GPT
# on Shakespeare's sonnets, stop it with a real SIGTERM once it is past half
# way (as SLURM does before a preemption or the time limit), run the same
# command again to resume, then look at what it left: checkpoints, verify,
# status, report. It ends by saying what happened, from what the run wrote,
# and what to try next.
#
#   scripts/demo.sh [--bin PATH] [--config FILE] [--run-dir DIR] [--steps N] [--set KEY=VALUE]...
#
#   --bin PATH       the rekindle binary (default target/release/rekindle)
#   --config FILE    the run's config (default configs/demo.toml)
#   --run-dir DIR    its run directory, emptied first (default runs/demo)
#   --steps N        run.max_steps (default: the config's)
#   --set KEY=VALUE  any other key of the config, as `rekindle run --set` takes it
#
# Exit 0 when every command did what it should, 1 (with why) when one did
# not, 2 for a bad argument. Needs a POSIX shell, coreutils, grep, sed, awk.
set -u

bin=target/release/rekindle
config=configs/demo.toml
run_dir=runs/demo
steps=
sets=
# Each --set is kept as one line of $sets (a value may hold spaces, no newline).
nl='
'
while [ $# -gt 0 ]; do
    case $1 in
    -h | --help)
        sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    --bin | --config | --run-dir | --steps | --set)
        [ $# -ge 2 ] || { echo "demo: $1 needs a value (see --help)" >&2; exit 2; }
        case $1 in
        --bin) bin=$2 ;;
        --config) config=$2 ;;
        --run-dir) run_dir=$2 ;;
        --steps) steps=$2 ;;
        --set) sets=$sets$2$nl ;;
        esac
        shift 2
        ;;
    *)
        echo "demo: unknown argument $1 (see --help)" >&2
        exit 2
        ;;
    esac
done

die() {
    echo "demo: FAILED: $*" >&2
    exit 1
}
say() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
[ -t 1 ] || say() { printf '\n==> %s\n' "$*"; }

# The value of a top-level key of `rekindle status --json` (pretty-printed,
# two spaces of indent), read from stdin.
status_field() { sed -n "s/^  \"$1\": \([^,]*\),\{0,1\}\$/\1/p"; }
# A field of the last event of kind $1 in events.jsonl (one compact object a
# line, docs/run-directory.md): its first `"$2":` value.
event_field() {
    grep "\"event\":\"$1\"" "$run_dir/events.jsonl" | tail -n 1 | grep -o "\"$2\":[^,}]*" | head -n 1 | cut -d: -f2- |
        tr -d '"'
}
# The first and last values of "$1" (loss or val_loss) in metrics.jsonl
# (one compact object a line), with their steps.
metric_ends() {
    grep "\"$1\":" "$run_dir/metrics.jsonl" | awk 'NR == 1 { print } { last = $0 } END { if (NR > 1) print last }' |
        awk -v key="\"$1\":" '
        function field(k, at, rest) {
            at = index($0, k)
            rest = substr($0, at + length(k))
            sub(/[,}].*/, "", rest)
            return rest
        }
        { printf "%s%.2f at step %s", (NR > 1 ? ", " : ""), field(key), field("\"step\":") }'
}

[ -x "$bin" ] || die "no rekindle binary at $bin (build one: cargo build --release)"
[ -f "$config" ] || die "no config at $config"
# Only a directory rekindle made (it holds the `.rekindle` marker) is emptied.
if [ -e "$run_dir" ]; then
    [ -e "$run_dir/.rekindle" ] || die "$run_dir exists and is not a rekindle run directory: not emptying it"
    rm -rf "$run_dir"
fi
set -- run --config "$config" --run-dir "$run_dir"
[ -z "$steps" ] || set -- "$@" --set "run.max_steps=$steps"
old_ifs=$IFS
IFS=$nl
set -f # `model.hidden=[64,64]` is a value, not a pattern of file names
for kv in $sets; do set -- "$@" --set "$kv"; done
set +f
IFS=$old_ifs

say "1/4  Training: $bin $*"
echo "     (in the background; it gets SIGTERM once it is past half way)"
"$bin" "$@" &
pid=$!
# Ctrl-C here reaches only this script (a background job ignores it): pass
# it on as the SIGTERM it would be, so the run checkpoints before it ends.
trap 'kill -TERM $pid 2>/dev/null; wait $pid; exit 130' INT TERM

started=$(date +%s)
while :; do
    if ! kill -0 "$pid" 2>/dev/null; then
        wait "$pid"
        die "the run ended (exit $?) before it was half way: there was nothing to stop"
    fi
    json=$("$bin" status --json "$run_dir" 2>/dev/null) || json=
    step=$(printf '%s\n' "$json" | status_field step)
    max=$(printf '%s\n' "$json" | status_field max_steps)
    # Both are numbers once a step is logged (`step` is null before).
    case $step$max in *[!0-9]* | '') ;; *) [ "$step" -lt $(((max + 1) / 2)) ] || break ;; esac
    if [ $(($(date +%s) - started)) -gt 1800 ]; then
        kill -KILL "$pid"
        die "the run did not get half way in 30 minutes"
    fi
    sleep 0.5
done
echo
echo "==> kill -TERM $pid   (step $step of $max)"
kill -TERM "$pid"
wait "$pid"
rc=$?
trap - INT TERM
[ $rc -eq 75 ] || die "the stopped run exited $rc, not 75 (stopped with a durable checkpoint)"
stop_step=$(event_field stop step)
stop_signal=$(event_field signal signal)
stop_after=$(event_field stop seconds_to_durable_checkpoint | awk '{ printf "%.2f", $1 }')
save_ms=$(grep '"kind":"stop"' "$run_dir/events.jsonl" | grep '"event":"checkpoint_saved"' | tail -n 1 |
    grep -o '"persist_seconds":[^,}]*' | cut -d: -f2 | awk '{ printf "%.0f", $1 * 1000 }')
if [ -z "$stop_step" ] || [ -z "$stop_after" ] || [ -z "$save_ms" ]; then
    die "no stop with a durable checkpoint in $run_dir/events.jsonl"
fi
echo "     exit $rc: stopped with a durable checkpoint of step $stop_step"

say "2/4  Resuming: the same command again"
"$bin" "$@"
rc=$?
[ $rc -eq 0 ] || die "the resumed run exited $rc, not 0 (finished)"
resume_step=$(event_field resume step)
steps_lost=$(event_field resume steps_lost)
final_step=$(event_field finish step)
[ "$resume_step" = "$stop_step" ] ||
    die "the resumed run started from step ${resume_step:-none}, not from the stop checkpoint's step $stop_step"

say "3/4  What the run left: $bin checkpoints / verify / status $run_dir"
"$bin" checkpoints "$run_dir" || die "rekindle checkpoints exited $?"
echo
"$bin" verify "$run_dir" || die "rekindle verify exited $? (a checkpoint does not match its manifest)"
echo
"$bin" status "$run_dir" || die "rekindle status exited $?"

say "4/4  The report: $bin report $run_dir"
"$bin" report "$run_dir" || die "rekindle report exited $?"

loss=$(metric_ends loss)
val=$(metric_ends val_loss)
cat <<EOF

==> What just happened
  - rekindle trained $config: loss ${loss}${val:+;
    validation loss $val}.
  - Then $stop_signal (kill -TERM: what SLURM sends before a preemption or the time limit).
    rekindle wrote a checkpoint of the last step it completed, step $stop_step, in $save_ms ms
    (durable $stop_after s after the signal) and exited 75: stopped, run the same command again.
  - The same command resumed from the checkpoint of step $resume_step ($steps_lost steps lost) and
    finished at step $final_step (exit 0).
  - rekindle verify: every file of every checkpoint kept matches its SHA-256 manifest.
  - The run on one page (loss, checkpoints, the stop and the resume): open $run_dir/report.html

==> Try next
  - Stop one yourself: $bin run --config $config --run-dir runs/mine,
    press Ctrl-C while it trains, then run the same command again.
  - On a SLURM cluster: sbatch slurm/orchestrator.slurm $config   (docs/slurm.md)
  - Your own training program (PyTorch, JAX, a script):
      rekindle exec --run-dir runs/mine -- python train.py   (docs/exec.md)
  - Your own text: [data] kind = "text", path = "your.txt" in a copy of $config
    (docs/workloads.md; every key: configs/example.toml). Bit-exact resume: docs/determinism.md.
EOF
