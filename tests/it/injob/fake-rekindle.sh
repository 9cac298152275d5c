#!/usr/bin/env bash
# A stand-in for rekindle that slurm/orchestrator.slurm launches as its job
# steps (REKINDLE_BIN), for tests/it/injob.rs: it does what a scenario says
# to the batch shell's in-job restart contract (docs/recovery.md) and logs
# every task it ran as, so the test can tell which steps ran where.
#
#   fake-rekindle.sh run --config SCENARIO [ignored...]
#
# Each task appends one line to $FAKE_LOG:
#   task step=K restart=R rank=P size=N node=NODE nodes=LIST max=M request=FILE excluded=LIST time=UNIX
# (K: REKINDLE_INJOB_RESTARTS, R: SLURM_RESTART_COUNT), and one line
#   request time=UNIX
# when it has written a restart request; then it acts:
#   exclude-rank1   in the job's first step, rank 1 writes a restart request
#                   excluding its own node (atomically, with a comment and an
#                   unknown key), then every task hangs: the batch shell must
#                   end the step itself; later steps exit 0
#   exclude-self    rank 0 writes a request excluding its own node and hangs,
#                   in the job's first run; after a requeue it exits 0
#   crash           every step SIGKILLs itself (an unexplained crash)
#   exit-N          exits N at once
#   hang            sleeps until killed (a signal it does not trap ends it)
set -u
[[ ${1:-} == run && ${2:-} == --config && -n ${3:-} ]] || { echo "usage: $0 run --config SCENARIO" >&2; exit 2; }
scenario=$3
k=${REKINDLE_INJOB_RESTARTS:-unset}
restart=${SLURM_RESTART_COUNT:-0}
rank=${SLURM_PROCID:-0}
node=${SLURMD_NODENAME:-$(hostname)}
echo "task step=$k restart=$restart rank=$rank size=${SLURM_STEP_NUM_TASKS:-1} node=$node" \
    "nodes=${SLURM_STEP_NODELIST:-} max=${REKINDLE_INJOB_MAX:-unset} request=${REKINDLE_INJOB_REQUEST:-unset}" \
    "excluded=${REKINDLE_INJOB_EXCLUDED-unset}" "time=$(date +%s.%N)" >>"$FAKE_LOG"

# Writes the restart request excluding $1 (from the next step, and from the
# job should the shell requeue it instead), as rekindle does: a temporary
# file renamed over the final name.
request() {
    local tmp=$REKINDLE_INJOB_REQUEST.tmp.$$
    cat >"$tmp" <<EOF
# written by tests/it/injob/fake-rekindle.sh
action=restart
reason=rank_lost
exclude=$1
step=40
requeue_exclude=$1
unknown_key=ignored
written_by=$rank@$node
EOF
    mv "$tmp" "$REKINDLE_INJOB_REQUEST"
    echo "request time=$(date +%s.%N)" >>"$FAKE_LOG"
}

case $scenario in
exclude-rank1)
    [[ $k == 0 && $restart == 0 ]] || exit 0
    ((rank == 1)) && request "$node"
    exec sleep 300
    ;;
exclude-self)
    ((restart == 0)) || exit 0
    ((rank == 0)) && request "$node"
    exec sleep 300
    ;;
crash) kill -KILL $$ ;;
exit-*) exit "${scenario#exit-}" ;;
hang) exec sleep 300 ;;
*) echo "unknown scenario $scenario" >&2; exit 2 ;;
esac
