#!/usr/bin/env bash
# Resilience drills against a real SLURM: each submits a small training run
# through slurm/orchestrator.slurm, does to it what a cluster does (a signal,
# preemption, a time limit, a dead node, a cancel), waits, and judges the
# outcome.
#
#   slurm/drill.sh [DRILL...]           (all by default)
#   make drill                        the same on the local three-node cluster
#
# Every drill submits `sbatch slurm/orchestrator.slurm ...` as a user would
# (rekindle runs as a job step) and stops it the way users and clusters do:
#
#   term        plain `scancel -s TERM JOB` (reaches the job step): the current
#               step is saved within the grace period, rekindle requeues the
#               job, it resumes from exactly that step and finishes.
#   term-batch  `scancel -s TERM --batch JOB` (reaches only the batch shell,
#               which forwards it to the step): as term.
#   term-full   `scancel -s TERM --full JOB` (reaches the batch shell, which
#               forwards it, and the step; srun, in a process group of its own,
#               is spared): as term.
#   usr1        `scancel -s USR1 JOB`: as term, stopped by SIGUSR1.
#   warn        --time=1 --signal=TERM@50: the time-limit warning to the step;
#               rekindle checkpoints and requeues, the job resumes, finishes.
#   warn-batch  --time=1 --signal=B:TERM@50: the same warning to the batch
#               shell, forwarded. (`timelimit` is another name for it.)
#   preempt     a job in the high partition pinned to the training job's node:
#               checkpoint within GraceTime, the job is requeued, resumes on the
#               other node, finishes.
#   preempt-nosignal
#               preemption as in preempt on a cluster without
#               preempt_send_user_signal: the local cluster is reconfigured
#               for the drill (slurm/local-cluster.sh reconfigure
#               no-preempt-user-signal) and back afterwards. The job asks for
#               --signal=USR1@120, so the signal rekindle records in its stop
#               event tells what SLURM did: SIGTERM as preemption begins (USR1
#               would mean the parameter was still on; the judge reads the
#               stop, not the drill's own note of --signal); then as preempt.
#               Needs the local cluster.
#   nodeloss    SIGKILL to the node's slurmd and to the job's processes: the
#               node is marked down, SLURM requeues the job onto the other node,
#               it resumes from the last periodic checkpoint (at most one
#               checkpoint interval lost). The node is brought back afterwards.
#               Needs the local cluster (slurm/local-cluster.sh).
#   cancel      plain scancel: rekindle saves, does not requeue; the job ends
#               CANCELLED.
#   hang        the first attempt's training step hangs (a failpoint of the
#               binary, FAILPOINTS set by a wrapper in the first attempt only)
#               under `[watchdog] step = "5s"`, submitted with
#               REKINDLE_INJOB_MAX=0 (else it would restart in the job): the
#               watchdog records the hang,
#               requeues the job with scontrol, exits; SLURM shows the job
#               PENDING with Restarts=1; the next attempt resumes from the
#               newest checkpoint and finishes.
#   dp-rankkill-injob
#               as dp-nodeloss-injob (the spare, the local tier every 5 steps,
#               [distributed] timeout = "3s"), but only rank 1's rekindle is
#               SIGKILLed: its node stays up. rank 0 finds it silent and asks
#               for a new step without its node (it cannot tell a dead process
#               from a dead node within the timeout); the spare takes over
#               from the local tier, never requeued, byte-identical. Needs the
#               local cluster (it finds the rank's process on its node).
#   hang-injob  as hang, in a job of two nodes holding one as a spare
#               (REKINDLE_SPARE_NODES=1 sbatch -N2 --ntasks-per-node=1), with
#               the batch shell's in-job restart on: the hung attempt asks for
#               a new step without its node; the run goes on on the other
#               node in the same job (Restarts=0) from the checkpoint the
#               stop named, and finishes byte-identical. Needs a failpoints
#               build and two nodes.
#   crash       the first attempt's training step fails (a failpoint: an
#               error after it trained others, so transient); submitted with
#               REKINDLE_INJOB_MAX=0 (else it would restart in the job):
#               rekindle requeues the job and holds it back (scontrol update
#               StartTime=now+60); SLURM shows it PENDING, Restarts=1, with
#               that StartTime; the next attempt starts no earlier, resumes
#               from the newest checkpoint and finishes.
#               hang and crash need a binary with failpoints compiled in
#               (`cargo test --no-run` builds one; `make drill` does).
#   own         a program of your own (examples/own_model.rs: a conv model
#               registered next to the built-ins) submitted the same way with
#               REKINDLE_BIN pointing at it and configs/own_model.toml, then
#               plain `scancel -s TERM JOB`: as term, and byte-identical to
#               that program's uninterrupted run.
#   exec        a numpy training program (python/examples/train_numpy.py, through
#               python/rekindle_client.py) under `sbatch slurm/orchestrator.slurm
#               --exec ... -- python3 ...`, then plain `scancel -s TERM JOB`: the
#               program seals a checkpoint, the job is requeued, resumes from
#               REKINDLE_RESUME_FROM and finishes; its final weights are
#               byte-identical to the same program's uninterrupted run under
#               `rekindle exec` without SLURM. Needs python3 with numpy on the
#               nodes. Judged by this script (not drill_check.py).
#   exec-ddp    two DDP ranks of PyTorch (python/examples/train_ddp.py, gloo on
#               the CPU) as the users' literal `sbatch -N2 -n2
#               slurm/orchestrator.slurm --exec ... -- python train_ddp.py`:
#               one rekindle and one rank per task, on two nodes; then plain
#               `scancel -s TERM JOB`: both ranks stop at one step with one
#               world checkpoint, the job is requeued, resumes and finishes
#               with model, optimizer and generators torch.equal to two ranks
#               never stopped. Needs torch in the project's .venv (make deps)
#               on every node. Judged by this script.
#   exec-torchrun
#               the same two ranks as `sbatch -N2 --ntasks-per-node=1
#               slurm/orchestrator.slurm --exec ... -- torchrun
#               --nproc-per-node 1 train_ddp.py`: one rekindle and one
#               torchrun per node (its rendezvous from rekindle's PET_*
#               variables), stopped by preemption (a high-priority job of
#               30 s on the first node): as exec-ddp. Judged by this script.
#   exec-nodeloss
#               exec-ddp's job (two tasks on two nodes, one DDP rank each);
#               the node of task 1 loses its slurmd and its processes
#               (SIGKILL). Task 0's rekindle finds task 1 silent within
#               `[distributed] timeout` (10 s here), ends its own program,
#               records `rank_lost` and requeues the job with the lost node
#               excluded (REKINDLE_INJOB_MAX=0: the requeue path); the job
#               resumes on the two other nodes from the last world checkpoint
#               and finishes as exec-ddp. The node is brought back
#               afterwards. Needs the local cluster. Judged by this script.
#   exec-nodeloss-injob
#               exec-nodeloss on the default path: `REKINDLE_SPARE_NODES=1
#               sbatch -N3 --ntasks-per-node=1 ... --exec -- python
#               train_ddp.py` (two tasks, a spare node), the batch shell's
#               in-job restarts on, `[distributed] timeout` 5 s; task 1's node
#               is lost. Task 0 records `rank_lost` and asks for an in-job
#               restart without the lost node; the next step runs on the node
#               left and the spare, resumes from the last world checkpoint and
#               finishes torch.equal to two ranks never stopped, the job never
#               requeued (Restarts=0). The node is brought back afterwards.
#               Needs the local cluster. Judged by this script.
#   exec-trainer
#               a Hugging Face Trainer with rekindle's callback
#               (python/examples/train_hf.py, a tiny GPT-2 built from its
#               config) as `sbatch slurm/orchestrator.slurm --exec ... --
#               python train_hf.py`, stopped by a plain `scancel -s TERM JOB`:
#               the callback saves the current step, the job is requeued,
#               resumes through `resume_from_checkpoint` and finishes with
#               weights torch.equal to an uninterrupted run. Needs
#               transformers in the project's .venv (make deps). Judged by
#               this script.
#   dp          `sbatch -N2 -n2 slurm/orchestrator.slurm ...`: one data-parallel
#               run over two ranks on two nodes (srun --mpi=pmix; needs a
#               rekindle built with --features mpi), then plain
#               `scancel -s TERM JOB`: both ranks stop at one step, one
#               checkpoint, the job is requeued, resumes over two ranks and
#               finishes byte-identical to two ranks never stopped (mpirun).
#   dp-preempt  two ranks on one node (`sbatch -N1 -n2 --overcommit`: the local
#               nodes have one CPU each) with a sharded optimizer
#               (`distributed.shard_optimizer=true`: each rank writes its own
#               part of every checkpoint) preempted as in preempt: both ranks
#               checkpoint the same step within GraceTime, SLURM requeues the
#               job, it resumes over two ranks on the other node, identical to
#               two (unsharded) ranks never stopped, the optimizer's parts
#               joined.
#   dp-nodeloss two ranks on two nodes; the node of rank 1 loses its slurmd and
#               its processes (SIGKILL). Rank 0 finds rank 1 silent within
#               `[distributed] timeout` (10 s here), records `rank_lost`, and
#               the job is requeued: submitted with REKINDLE_INJOB_MAX=0, so
#               no in-job restart (the requeue path stays drilled) with the
#               lost node excluded (`nodes_excluded`; `scontrol show job`
#               shows it in ExcNodeList); the lost node is brought back once
#               the job is requeued, and the run resumes from the last
#               periodic checkpoint over two ranks on the two other nodes,
#               byte-identical to two ranks never stopped. Needs the local
#               cluster.
#   dp-nodeloss-injob
#               two ranks on two of three nodes, the third held as a spare
#               (REKINDLE_SPARE_NODES=1 sbatch -N3 --ntasks-per-node=1: SLURM
#               shrinks `-N3 -n2` to two nodes), the node-local checkpoint
#               tier every 5 steps, `[distributed] timeout = "3s"`; rank 1's
#               node is lost as in dp-nodeloss. rekindle asks the batch shell
#               for an in-job restart; the job is never requeued (Restarts=0),
#               goes on over two ranks on the two nodes left from the local
#               tier (or a durable checkpoint at least as new), loses at most
#               two local intervals plus the steps trained in 1 s (every local
#               commit within 1 s of its step: constants of the judge,
#               slurm/drill_check.py), trains again within 30 s of the kill
#               and finishes byte-identical to two ranks never stopped.
#               Needs the local cluster.
#   dp-nodeloss-wide
#               dp-nodeloss-injob at eight times the world: 16 ranks, two a
#               node, on eight nodes of the partition `wide` with a ninth held
#               as a spare (REKINDLE_SPARE_NODES=1 sbatch -p wide -N9
#               --ntasks-per-node=2); the node of rank 15 (ranks 14 and 15)
#               is lost. Judged by the same bounds as dp-nodeloss-injob (steps
#               lost, training again within 30 s of the kill), over 16 ranks
#               on the eight nodes left, byte-identical to 16 ranks never
#               stopped (mpirun -n 16). Its own length: DRILL_WIDE_STEPS.
#               Needs the local cluster's wide partition (nine nodes of two
#               CPUs). Its job runs with OMPI_MCA_mpi_yield_when_idle=1,
#               OMPI_MCA_btl=self,tcp and OMPI_MCA_btl_tcp_if_include=lo: its
#               nodes share one host and its cores.
#   dp-nodeloss-injob-nospare
#               the same with two ranks on two nodes (`-N2 -n2`, no spare):
#               the run goes on in the job at one rank and, at the end, has
#               seen every sample of the epoch once (data cursor, counters
#               and step equal to two ranks never stopped). Needs the local
#               cluster.
#   badnode     a site health check (`[health] command`) that fails on n1 only;
#               n2 and n3 are kept busy by a short job while the training job
#               is submitted (no -w: that would forbid the exclusion), so it
#               starts on n1, the only idle node. Its attempt records
#               `node_unhealthy` and ends without training; rekindle
#               requeues the job and sets ExcNodeList=n1 (`scontrol show job`
#               shows it); the job trains and finishes on another node,
#               byte-identical to the uninterrupted run, and `rekindle
#               status` says why n1 was left. Needs the local cluster.
#   dp-straggler two ranks on two nodes, rank 1's own work in every step made
#               50 ms slower (a failpoint, first attempt only) under `[health]
#               straggler_steps = 10, straggler_blame = true`: rank 0 records
#               one `straggler` event naming rank 1 and its node; after plain
#               `scancel -s TERM` the requeued job has that node in ExcNodeList,
#               runs on the two other nodes and finishes byte-identical to two
#               ranks never stopped. Needs the local cluster (three nodes).
#   noprogress  every attempt's sixth step fails (a failpoint: transient, before
#               any checkpoint) under `[run] max_attempts_without_progress =
#               2`: the batch shell restarts it in the job, and the attempt
#               after the second does not train: the `error` names both
#               attempts, the job ends FAILED with ExitCode 79, not after
#               max_restarts or REKINDLE_INJOB_MAX. Needs a failpoints build.
#
# Each drill prints one PASS/FAIL line and a one-line JSON summary (attempts,
# node of each attempt, steps lost, seconds from signal to durable checkpoint,
# publish result: see docs/drills.md). For every drill but cancel the final
# model and optimizer files must be byte-identical to an uninterrupted run of
# the same config, run here without SLURM. Every attempt
# publishes to a bare git repository of its own drill, and the drill counts
# the commits that arrived. Exit status 0 when every drill passed.
#
# Knobs (environment):
#   SLURM_CONF            which cluster (for the local one:
#                         eval "$(slurm/local-cluster.sh env)")
#   REKINDLE_BIN          the binary (default target/release/rekindle, else
#                         target/debug/rekindle, else rekindle on PATH); it is
#                         exported to the jobs, so it must be on shared storage
#   DRILL_DIR             where runs, job output and results go; must be on
#                         storage every node sees (default target/drills)
#   DRILL_PARTITION       partition of the training job (default: the cluster's default)
#   DRILL_HIGH_PARTITION  partition that preempts it (default high)
#   DRILL_SBATCH_OPTS     extra sbatch options for every drill job (e.g. --account=...)
#   DRILL_HIGH_OPTS       extra sbatch options of the preempting job (e.g. --exclusive)
#   DRILL_GRACE           seconds between the first signal and SIGKILL that
#                         rekindle may assume (default 20; at most the
#                         partition's GraceTime and the cluster's KillWait)
#   DRILL_SECONDS         training length of one uninterrupted run (default 12);
#                         DRILL_STEPS sets max_steps directly instead
#   DRILL_EVERY_STEPS     checkpoint.every_steps (default 100)
#   DRILL_CONFIG          the config trained (default configs/tiny.toml, an mlp)
#   DRILL_HIDDEN          its model.hidden (default [64,64])
#   DRILL_TIMEOUT         seconds one drill may take before it FAILs (default 300)
#   DRILL_OWN_BIN         the program of the `own` drill (default
#                         target/debug/examples/own_model of this checkout;
#                         `cargo build --examples` builds it)
#   DRILL_EXEC_STEPS      steps of the exec drill's program (default 400, at
#                         DRILL_EXEC_STEP_SECONDS each, default 0.03)
#   DRILL_VENV            the virtual environment with torch of the exec-ddp
#                         drill (default .venv of this checkout: make deps)
#   DRILL_WIDE_PARTITION  partition of the dp-nodeloss-wide drill (default wide:
#                         at least nine nodes of two CPUs)
#   DRILL_WIDE_STEPS      max_steps of the dp-nodeloss-wide drill and its
#                         16-rank reference (default 600)
#   DRILL_DDP_STEPS       steps of its program (default 240, at
#                         DRILL_DDP_STEP_SECONDS each, default 0.05)
#   DRILL_LOCAL_CLUSTER   folder of the local cluster, for nodeloss and
#                         preempt-nosignal (default: ask slurm/local-cluster.sh
#                         when SLURM_CONF is its config)
#
# REKINDLE_INJOB_MAX and REKINDLE_SPARE_NODES (orchestrator.slurm's in-job
# restart knobs) are the drills' to set: they are removed from the
# environment, so every other drill runs with the defaults users get.
set -uo pipefail
unset REKINDLE_INJOB_MAX REKINDLE_SPARE_NODES

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo_root=$(cd "$script_dir/.." && pwd)
ALL=(term term-batch term-full usr1 warn warn-batch preempt preempt-nosignal nodeloss cancel hang crash dp dp-preempt
    dp-nodeloss dp-nodeloss-injob dp-nodeloss-injob-nospare dp-rankkill-injob dp-nodeloss-wide hang-injob own exec
    exec-ddp exec-torchrun exec-nodeloss exec-nodeloss-injob exec-trainer badnode noprogress dp-straggler)

log() { printf '%s drill: %s\n' "$(date +%T)" "$*" >&2; }
die() { log "error: $*"; exit 2; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

drills=()
for d in "$@"; do
    [[ $d == timelimit ]] && d=warn-batch # its name before the job-step launch
    [[ " ${ALL[*]} " == *" $d "* ]] || die "unknown drill '$d' (known: ${ALL[*]}; timelimit = warn-batch)"
    [[ " ${drills[*]} " == *" $d "* ]] || drills+=("$d")
done
((${#drills[@]})) || drills=("${ALL[@]}")

for tool in sbatch scontrol scancel squeue sinfo git python3; do
    command -v "$tool" >/dev/null || die "$tool not found (for a local cluster: slurm/local-cluster.sh up)"
done

BIN=${REKINDLE_BIN:-}
if [[ -z $BIN ]]; then
    for c in "$repo_root/target/release/rekindle" "$repo_root/target/debug/rekindle" "$(command -v rekindle || true)"; do
        [[ -n $c && -x $c ]] && { BIN=$c; break; }
    done
fi
[[ -n $BIN && -x $BIN ]] || die "no rekindle binary: build it (cargo build) or set REKINDLE_BIN"
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
export REKINDLE_BIN=$BIN

CONFIG=${DRILL_CONFIG:-$repo_root/configs/tiny.toml}
[[ -f $CONFIG ]] || die "no config $CONFIG (DRILL_CONFIG)"
CONFIG=$(cd "$(dirname "$CONFIG")" && pwd)/$(basename "$CONFIG") # submit() runs sbatch from the drill's folder
LOW=${DRILL_PARTITION:-}
HIGH=${DRILL_HIGH_PARTITION:-high}
GRACE=${DRILL_GRACE:-20}
EVERY=${DRILL_EVERY_STEPS:-100}
HIDDEN=${DRILL_HIDDEN:-[64,64]}
TIMEOUT=${DRILL_TIMEOUT:-300}
read -r -a EXTRA_OPTS <<<"${DRILL_SBATCH_OPTS:-}"
read -r -a HIGH_OPTS <<<"${DRILL_HIGH_OPTS:-}"
WORK=${DRILL_DIR:-$repo_root/target/drills}/$(date +%Y%m%d-%H%M%S)-$$
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)

CLUSTER_DIR=${DRILL_LOCAL_CLUSTER:-}
if [[ -z $CLUSTER_DIR ]]; then
    local_conf=$("$script_dir/local-cluster.sh" dir 2>/dev/null)/slurm.conf
    [[ ${SLURM_CONF:-} == "$local_conf" ]] && CLUSTER_DIR=$(dirname "$local_conf")
fi

# Runs a command outside any SLURM job (the reference run must not requeue anything).
without_slurm() { env $(compgen -e | grep '^SLURM_' | grep -v '^SLURM_CONF$' | sed 's/^/-u /') "$@"; }

# --- the training config: calibrated so one uninterrupted run takes DRILL_SECONDS ---
STEPS=${DRILL_STEPS:-}
if [[ -z $STEPS ]]; then
    cal=$WORK/calibrate
    without_slurm "$BIN" run --config "$CONFIG" --run-dir "$cal" --set run.max_steps=300 \
        --set "model.hidden=$HIDDEN" --set checkpoint.every_steps=0 >"$cal.log" 2>&1 ||
        die "calibration run failed: $(tail -n 5 "$cal.log")"
    STEPS=$(python3 - "$cal/summary.json" "${DRILL_SECONDS:-12}" "$EVERY" <<'EOF'
import json, math, sys
s = json.load(open(sys.argv[1]))
rate = s["steps_this_attempt"] / max(s["wall_seconds_this_attempt"], 1e-3)
every = int(sys.argv[3])
print(max(10 * every, math.ceil(rate * float(sys.argv[2]) / every) * every))
EOF
    ) || die "calibration: cannot read $cal/summary.json"
    log "calibrated: max_steps=$STEPS (about ${DRILL_SECONDS:-12} s uninterrupted with $(basename "$BIN"))"
fi
TRAIN=(--set "run.max_steps=$STEPS" --set "model.hidden=$HIDDEN" --set "checkpoint.every_steps=$EVERY"
    --set train.log_every=1)

# Runs "$@" in the background and writes its exit status to the file $1 when
# it ends. Not `wait PID`: on a machine whose pid_max is small (32768 here)
# the drills fork enough to wrap the pids around, and bash forgets a
# background child's exit status once a new child gets its pid ("wait: pid N
# is not a child of this shell"), so a reference that finished long ago
# would count as failed.
in_background() {
    local rc_file=$1
    shift
    rm -f "$rc_file"
    { "$@"; echo $? >"$rc_file"; } &
}
# Waits for what in_background started; succeeds when it exited 0.
ended_ok() {
    while [[ ! -s $1 ]]; do sleep 0.2; done
    [[ $(<"$1") == 0 ]]
}

# The uninterrupted reference run, in the background while the first drills
# run (ref_pid, and the other ref_*_pid below: the file of its exit status).
REF=$WORK/reference
ref_pid=
needs_reference() { local d; for d in "${drills[@]}"; do [[ $d != cancel && $d != exec* ]] && return 0; done; return 1; }
if needs_reference; then
    ref_pid=$REF.rc
    in_background "$ref_pid" without_slurm "$BIN" run --config "$CONFIG" --run-dir "$REF" "${TRAIN[@]}" >"$REF.log" 2>&1
fi
# The data-parallel drill compares with two ranks never stopped (mpirun).
REF_DP=$WORK/reference-dp
ref_dp_pid=
if [[ " ${drills[*]} " == *" dp"* ]]; then
    ref_dp_pid=$REF_DP.rc
    in_background "$ref_dp_pid" without_slurm env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
        mpirun -n 2 --bind-to none --oversubscribe "$BIN" run --config "$CONFIG" --run-dir "$REF_DP" "${TRAIN[@]}" \
        >"$REF_DP.log" 2>&1
fi
# The wide drill compares with 16 ranks never stopped, at its own length
# (16 ranks share this machine's cores: every step is slower).
REF_WIDE=$WORK/reference-wide
WIDE_RANKS=16
WIDE_PER_NODE=2
WIDE_STEPS=${DRILL_WIDE_STEPS:-600}
WIDE_PARTITION=${DRILL_WIDE_PARTITION:-wide}
ref_wide_pid=
if [[ " ${drills[*]} " == *" dp-nodeloss-wide "* ]]; then
    ref_wide_pid=$REF_WIDE.rc
    in_background "$ref_wide_pid" without_slurm env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
        mpirun -n "$WIDE_RANKS" --bind-to none --oversubscribe "$BIN" run --config "$CONFIG" --run-dir "$REF_WIDE" \
        "${TRAIN[@]}" --set "run.max_steps=$WIDE_STEPS" >"$REF_WIDE.log" 2>&1
fi
# The `own` drill: a program of its own, its config, its own reference run.
OWN_BIN=${DRILL_OWN_BIN:-$repo_root/target/debug/examples/own_model}
OWN_CONFIG=$repo_root/configs/own_model.toml
OWN_STEPS=${DRILL_OWN_STEPS:-600}
OWN_TRAIN=(--set "run.max_steps=$OWN_STEPS" --set "checkpoint.every_steps=$EVERY" --set train.log_every=1)
REF_OWN=$WORK/reference-own
ref_own_pid=
if [[ " ${drills[*]} " == *" own "* ]]; then
    [[ -x $OWN_BIN ]] || die "the own drill needs $OWN_BIN: run cargo build --examples, or set DRILL_OWN_BIN"
    OWN_BIN=$(cd "$(dirname "$OWN_BIN")" && pwd)/$(basename "$OWN_BIN")
    ref_own_pid=$REF_OWN.rc
    in_background "$ref_own_pid" without_slurm "$OWN_BIN" run --config "$OWN_CONFIG" --run-dir "$REF_OWN" \
        "${OWN_TRAIN[@]}" >"$REF_OWN.log" 2>&1
fi
# The `exec` drill: a numpy program under `rekindle exec`; its reference is
# the same program's uninterrupted run under `rekindle exec`, without SLURM.
EXEC_PROGRAM=$repo_root/python/examples/train_numpy.py
EXEC_STEPS=${DRILL_EXEC_STEPS:-400}
EXEC_ARGS=(--steps "$EXEC_STEPS" --every 20)
REF_EXEC=$WORK/reference-exec
ref_exec_pid=
if [[ " ${drills[*]} " == *" exec "* ]]; then
    python3 -c 'import numpy' 2>/dev/null || die "the exec drill needs python3 with numpy (pip install numpy)"
    mkdir -p "$REF_EXEC"
    ref_exec_pid=$REF_EXEC.rc
    in_background "$ref_exec_pid" without_slurm "$BIN" exec --run-dir "$REF_EXEC/run" -- python3 "$EXEC_PROGRAM" \
        "${EXEC_ARGS[@]}" --out "$REF_EXEC/w.npy" >"$REF_EXEC.log" 2>&1
fi
# The `exec-ddp` drill: two DDP ranks of PyTorch from the project's virtual
# environment (make deps); its reference is two ranks under torchrun
# --standalone under `rekindle exec`, without SLURM. One CPU thread per
# process (OMP_NUM_THREADS, exported to the jobs): torch on the CPU is
# bit-identical from process to process at the same thread count.
VENV=${DRILL_VENV:-$repo_root/.venv}
DDP_PROGRAM=$repo_root/python/examples/train_ddp.py
DDP_ARGS=(--steps "${DRILL_DDP_STEPS:-240}" --every 40)
REF_DDP=$WORK/reference-exec-ddp
ref_ddp_pid=
if [[ " ${drills[*]} " =~ \ exec-(ddp|torchrun|nodeloss|nodeloss-injob)\  ]]; then
    "$VENV/bin/python" -c 'import torch' 2>/dev/null ||
        die "the exec-ddp drill needs torch in $VENV (make deps makes it; DRILL_VENV points elsewhere)"
    export OMP_NUM_THREADS=1
    mkdir -p "$REF_DDP"
    ref_ddp_pid=$REF_DDP.rc
    in_background "$ref_ddp_pid" without_slurm "$BIN" exec --run-dir "$REF_DDP/run" -- "$VENV/bin/torchrun" \
        --standalone --nproc-per-node 2 "$DDP_PROGRAM" "${DDP_ARGS[@]}" --out "$REF_DDP/out" >"$REF_DDP.log" 2>&1
fi
# The `exec-trainer` drill: a Hugging Face Trainer; its reference runs
# uninterrupted under `rekindle exec`, without SLURM.
HF_PROGRAM=$repo_root/python/examples/train_hf.py
HF_ARGS=(--steps "${DRILL_HF_STEPS:-160}" --every 40)
REF_HF=$WORK/reference-exec-trainer
ref_hf_pid=
if [[ " ${drills[*]} " == *" exec-trainer "* ]]; then
    "$VENV/bin/python" -c 'import transformers, rekindle.hf' 2>/dev/null ||
        die "the exec-trainer drill needs transformers and the client package in $VENV (make deps makes them)"
    export OMP_NUM_THREADS=1
    mkdir -p "$REF_HF"
    ref_hf_pid=$REF_HF.rc
    in_background "$ref_hf_pid" without_slurm "$BIN" exec --run-dir "$REF_HF/run" -- "$VENV/bin/python" \
        "$HF_PROGRAM" "${HF_ARGS[@]}" --out "$REF_HF/final.pt" >"$REF_HF.log" 2>&1
fi
# The hang, crash, noprogress and dp-straggler drills inject their failure with a failpoint of the
# binary (FAILPOINTS), which only a build with failpoints compiled in honours:
# one step of a run whose first step is made to fail tells.
FAILPOINTS_WORK=
if [[ " ${drills[*]} " == *" hang "* || " ${drills[*]} " == *" crash "* || " ${drills[*]} " == *" noprogress "* || " ${drills[*]} " == *" dp-straggler "* ]]; then
    without_slurm env FAILPOINTS='train::step_error=return' "$BIN" run --config "$CONFIG" --run-dir "$WORK/failpoints" \
        --set run.max_steps=20 --set checkpoint.every_steps=0 >"$WORK/failpoints.log" 2>&1
    grep -q 'failpoint train::step_error' "$WORK/failpoints.log" && FAILPOINTS_WORK=1
fi

reference_ready() {
    if [[ $name == own ]]; then
        if [[ -n $ref_own_pid ]]; then
            ended_ok "$ref_own_pid" || { log "the own-model reference failed: $(tail -n 5 "$REF_OWN.log")"; ref_own_pid=; return 1; }
            ref_own_pid=
        fi
        [[ -f $REF_OWN/checkpoints/step-$(printf '%010d' "$OWN_STEPS")/model.safetensors ]]
        return
    fi
    if [[ $name == dp-nodeloss-wide ]]; then
        if [[ -n $ref_wide_pid ]]; then
            ended_ok "$ref_wide_pid" || { log "the 16-rank reference failed: $(tail -n 5 "$REF_WIDE.log")"; ref_wide_pid=; return 1; }
            ref_wide_pid=
        fi
        [[ -f $REF_WIDE/checkpoints/step-$(printf '%010d' "$WIDE_STEPS")/model.safetensors ]]
        return
    fi
    if [[ $name == dp || $name == dp-* ]]; then
        if [[ -n $ref_dp_pid ]]; then
            ended_ok "$ref_dp_pid" || { log "the 2-rank reference failed: $(tail -n 5 "$REF_DP.log")"; ref_dp_pid=; return 1; }
            ref_dp_pid=
        fi
        [[ -f $REF_DP/checkpoints/step-$(printf '%010d' "$STEPS")/model.safetensors ]]
        return
    fi
    if [[ -n $ref_pid ]]; then
        ended_ok "$ref_pid" || { log "the reference run failed: $(tail -n 5 "$REF.log")"; ref_pid=; return 1; }
        ref_pid=
    fi
    [[ -f $REF/checkpoints/step-$(printf '%010d' "$STEPS")/model.safetensors ]]
}

# --- helpers around one job ---
job_field() { scontrol show job -o "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n1; }
TERMINAL='^(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE|PREEMPTED)$'

count_events() {
    local n
    n=$(grep -c "\"event\":\"$2\"" "$1/events.jsonl" 2>/dev/null)
    echo "${n:-0}"
}

# Waits until `cond` (a command) succeeds; FAILs the drill on timeout.
wait_until() {
    local what=$1 limit=$2
    shift 2
    local t0=$SECONDS
    while ! "$@"; do
        if ((SECONDS - t0 > limit)); then
            note "timed out after ${limit}s waiting for $what"
            return 1
        fi
        sleep 0.2
    done
}

has_checkpoints() { (($(count_events "$1" checkpoint_saved) >= $2)); }
job_running() { [[ $(job_field "$1" JobState) == RUNNING ]]; }
finished_training() { (($(count_events "$1" finish) > 0)); }
# The job ended, and stayed ended for 3 s (a requeue passes through
# transient states).
job_final() {
    local s
    s=$(job_field "$1" JobState)
    [[ $s =~ $TERMINAL ]] || return 1
    sleep 3
    [[ $(job_field "$1" JobState) == "$s" ]]
}
attempts_started() { (($(count_events "$1" start) >= $2)); }

NOTES=()
# Extra `rekindle run` arguments of the next submission.
RUN_EXTRA=()
# nodeloss: the lock's stale timeout (seconds).
NODELOSS_STALE=45
note() {
    NOTES+=("$*")
    log "$name: $*"
}

# Sets up the drill's folder and publish repository; submits the training job.
# Usage: submit NAME [sbatch options...]
submit() {
    name=$1
    shift
    wd=$WORK/$name
    run=$wd/run
    mkdir -p "$wd"
    git init -q --bare -b main "$wd/results.git"
    git clone -q "$wd/results.git" "$wd/clone" 2>/dev/null
    # From the drill's folder: the job's submit directory, where the batch
    # shell keeps its in-job restart request.
    job=$(cd "$wd" && sbatch --parsable -J "rekindle-drill-$name" -o "$wd/slurm-%j.out" -D "$wd" \
        ${LOW:+-p "$LOW"} "${EXTRA_OPTS[@]}" "$@" "$script_dir/orchestrator.slurm" "$CONFIG" \
        --run-dir "$run" "${TRAIN[@]}" \
        --set "signals.grace=\"${GRACE}s\"" --set 'signals.safety_margin="5s"' \
        --set publish.enabled=true --set "publish.repo=\"$wd/clone\"" --set 'publish.retry_initial="1s"' \
        "${RUN_EXTRA[@]}")
    job=${job%%;*}
    [[ $job =~ ^[0-9]+$ ]] || { note "sbatch failed: $job"; return 1; }
    log "$name: submitted job $job"
}

# The uninterrupted run a drill's result must equal.
reference_of() {
    case $1 in
    dp-nodeloss-wide) echo "$REF_WIDE" ;;
    dp | dp-*) echo "$REF_DP" ;;
    own) echo "$REF_OWN" ;;
    *) echo "$REF" ;;
    esac
}

# The max_steps drill $1 trains.
steps_of() {
    case $1 in
    own) echo "$OWN_STEPS" ;;
    dp-nodeloss-wide) echo "$WIDE_STEPS" ;;
    *) echo "$STEPS" ;;
    esac
}

# Judges the drill. Usage: judge [drill_check.py options...]
judge() {
    local state restarts exit_code verify_rc notes=()
    state=$(job_field "$job" JobState)
    restarts=$(job_field "$job" Restarts)
    exit_code=$(job_field "$job" ExitCode)
    if [[ $name != cancel ]]; then
        reference_ready || note "no reference run to compare with (see $REF.log)"
    fi
    "$BIN" verify "$run" >"$wd/verify.log" 2>&1
    verify_rc=$?
    for n in "${NOTES[@]}"; do notes+=(--note "$n"); done
    python3 "$script_dir/drill_check.py" --drill "$name" --run "$run" --job "$job" \
        --state "$state" --restarts "${restarts:--1}" --exit-code "$exit_code" \
        --repo "$wd/results.git" --reference "$(reference_of "$name")" \
        --max-steps "$(steps_of "$name")" --every "$EVERY" \
        --grace "$GRACE" --seconds "$(elapsed "$t_start")" --verify-rc "$verify_rc" \
        --job-output "$wd/slurm-$job.out" \
        --out "$wd/summary.json" "${notes[@]}" "$@"
}

cleanup_jobs() {
    local j
    for j in "$@"; do
        [[ -n $j ]] || continue
        [[ $(job_field "$j" JobState) =~ $TERMINAL ]] || scancel "$j" 2>/dev/null || true
    done
}

# N checkpoints in the run $1, or the job ended without them (a config
# error): nothing more to wait for. Usage: checkpoints_or_ended RUN N
checkpoints_or_ended() { has_checkpoints "$1" "$2" || [[ $(job_field "$job" JobState) =~ $TERMINAL ]]; }

# Waits until the job's training has written two checkpoints and is still
# going, so the drill acts mid-training. Usage: under_way [SECONDS to sleep first]
under_way() {
    wait_until "2 checkpoints" 120 checkpoints_or_ended "$run" 2 || return 1
    if ! has_checkpoints "$run" 2; then
        note "the job ended ($(job_field "$job" JobState), ExitCode $(job_field "$job" ExitCode)) before 2 checkpoints: see $wd/slurm-$job.out"
        return 1
    fi
    [[ -z ${1:-} ]] || sleep "$1"
    if finished_training "$run"; then
        note "training finished before the drill acted: raise DRILL_SECONDS"
        return 1
    fi
    return 0
}

# --- the drills ---
# Stops the job mid-training with `scancel ARGS JOB`, as a user would.
scancel_drill() {
    submit "$name" || return 1
    under_way || return 1
    action=$(now)
    log "$name: scancel $* $job"
    scancel "$@" "$job"
    wait_until "the job to finish" "$TIMEOUT" job_final "$job"
}
drill_term() { scancel_drill -s TERM; }
drill_term-batch() { scancel_drill -s TERM --batch; }
drill_term-full() { scancel_drill -s TERM --full; }
drill_usr1() { scancel_drill -s USR1; }

# A job in the high partition pinned to the training job's node preempts it.
# Usage: preempt_drill [sbatch options of the training job...]
preempt_drill() {
    submit "$name" "$@" || return 1
    under_way || return 1
    local node
    node=$(job_field "$job" NodeList)
    action=$(now)
    high=$(sbatch --parsable -J rekindle-drill-high -p "$HIGH" -w "$node" -o /dev/null "${EXTRA_OPTS[@]}" \
        "${HIGH_OPTS[@]}" --wrap 'sleep 600')
    high=${high%%;*}
    log "$name: high-priority job $high on $node"
    wait_until "the job to resume" "$TIMEOUT" attempts_started "$run" 2 || return 1
    wait_until "the job to finish" "$TIMEOUT" job_final "$job"
}
drill_preempt() { preempt_drill; }

# The SlurmctldParameters the controller runs with.
ctld_params() { scontrol show config 2>/dev/null | sed -n 's/^SlurmctldParameters *= *//p'; }

# Preemption without preempt_send_user_signal: the local cluster runs the
# drill reconfigured without it (slurm/local-cluster.sh reconfigure) and gets
# its usual config back right after (and on exit, if interrupted). The job
# asks for --signal=USR1@120: with the parameter SLURM would send that when
# preemption begins, without it SIGTERM; drill_check.py wants SIGTERM.
CLUSTER_RECONFIGURED=
restore_cluster_conf() {
    [[ -n $CLUSTER_RECONFIGURED ]] || return 0
    "$script_dir/local-cluster.sh" reconfigure >>"$WORK/reconfigure.log" 2>&1 && CLUSTER_RECONFIGURED=
}
drill_preempt-nosignal() {
    if [[ -z $CLUSTER_DIR ]]; then
        echo "SKIP preempt-nosignal: needs the local cluster (it reconfigures slurmctld); see docs/drills.md"
        echo '{"drill":"preempt-nosignal","result":"SKIP"}'
        return 3
    fi
    local before during after rc
    before=$(ctld_params)
    CLUSTER_RECONFIGURED=1
    if ! "$script_dir/local-cluster.sh" reconfigure no-preempt-user-signal >>"$WORK/reconfigure.log" 2>&1; then
        note "cannot reconfigure the cluster: $(tail -n 3 "$WORK/reconfigure.log")"
        restore_cluster_conf
        return 1
    fi
    during=$(ctld_params)
    log "preempt-nosignal: SlurmctldParameters=$during (was $before)"
    preempt_drill --signal=USR1@120
    rc=$?
    restore_cluster_conf || note "could not restore the cluster's config: $(tail -n 3 "$WORK/reconfigure.log")"
    after=$(ctld_params)
    EXTRA_JSON=$(printf '{"job_signal":"USR1@120","slurmctld_parameters":{"before":"%s","during":"%s","after":"%s"}}' \
        "$before" "$during" "$after")
    return $rc
}
# With a sharded optimizer (ZeRO-1): each rank writes its own part of every
# checkpoint, also of the one at preemption; drill_check.py joins the parts
# to compare with the unsharded reference.
drill_dp-preempt() {
    RUN_EXTRA=(--set distributed.shard_optimizer=true)
    preempt_drill -N1 -n2 --overcommit
    local rc=$?
    RUN_EXTRA=()
    return $rc
}

# SLURM checks time limits (and sends --signal warnings) on a 30 s tick of the
# controller. A probe job learns when the tick falls (its warning is due at
# once, so it comes at the first tick), so the drill's job can start a few
# seconds before a tick and get its warning mid-training. The probe starts in
# the background before the first drill.
TICK_FILE=$WORK/tick
probe_pid=
start_probe() {
    probe_pid=$WORK/probe.rc
    in_background "$probe_pid" probe
}
probe() {
    (
        p=$(sbatch --parsable -J rekindle-drill-probe -o /dev/null ${LOW:+-p "$LOW"} "${EXTRA_OPTS[@]}" \
            --time=1 --signal=B:USR1@59 --wrap "trap 'date +%s.%N > $TICK_FILE.tmp; mv $TICK_FILE.tmp $TICK_FILE; exit 0' USR1; while :; do sleep 0.2; done")
        p=${p%%;*}
        echo "$p" >"$WORK/probe-job"
        t0=$SECONDS
        while [[ ! -s $TICK_FILE ]] && ((SECONDS - t0 < 120)); do sleep 0.2; done
        scancel "$p" 2>/dev/null
    )
}

# The time-limit warning: --time=1 with --signal=SPEC@50, submitted a few
# seconds before a controller tick so the warning comes mid-training.
# Usage: warning_drill SIGNAL_SPEC
warning_drill() {
    local tick lead=4 next
    [[ -n $probe_pid ]] && { ended_ok "$probe_pid"; probe_pid=; }
    tick=$(cat "$TICK_FILE" 2>/dev/null)
    if [[ -n $tick ]]; then
        next=$(awk -v t="$tick" -v n="$(now)" -v l="$lead" 'BEGIN { while (t - l < n + 0.5) t += 30; printf "%.3f", t }')
        log "$name: controller tick seen at $(date -d "@${tick%.*}" +%T); submitting ${lead}s before the one at $(date -d "@${next%.*}" +%T)"
        sleep "$(awk -v t="$next" -v n="$(now)" -v l="$lead" 'BEGIN { printf "%.3f", t - l - n }')"
    else
        log "$name: the probe saw no time-limit tick; submitting anyway"
    fi
    submit "$name" --time=1 "--signal=$1@50" || return 1
    wait_until "the job to resume" "$TIMEOUT" attempts_started "$run" 2 || return 1
    wait_until "the job to finish" "$TIMEOUT" job_final "$job"
}
drill_warn() { warning_drill TERM; }
drill_warn-batch() { warning_drill B:TERM; }

# The stepd processes of $job on this machine that belong to our cluster (on
# node $1 only, when given), and all their descendants.
job_pids() {
    local pid args roots=() node_log="$CLUSTER_DIR/log/slurmd-${1:-}"
    while read -r pid args; do
        [[ $args == "slurmstepd: [$job."* ]] || continue
        # Only ours: the stepd keeps its node's log file (in the cluster folder) open.
        ls -l "/proc/$pid/fd" 2>/dev/null | grep -qF "$node_log" && roots+=("$pid")
    done < <(ps -eo pid=,args=)
    ((${#roots[@]})) || return 0
    ps -eo pid=,ppid= | awk -v roots="${roots[*]}" '
        BEGIN { n = split(roots, r, " "); for (i = 1; i <= n; i++) keep[r[i]] = 1 }
        { parent[$1] = $2; pids[NR] = $1 }
        END {
            changed = 1
            while (changed) { changed = 0; for (i in pids) { p = pids[i]; if (!(p in keep) && (parent[p] in keep)) { keep[p] = 1; changed = 1 } } }
            for (p in keep) print p
        }'
}

drill_nodeloss() {
    if [[ -z $CLUSTER_DIR ]]; then
        name=nodeloss
        echo "SKIP nodeloss: needs the local cluster (it kills a slurmd); see docs/drills.md for a production variant"
        echo '{"drill":"nodeloss","result":"SKIP"}'
        return 3
    fi
    # The next attempt runs on the other node, so it may take the killed
    # attempt's lock only once its heartbeat is stale (docs/slurm.md): a
    # timeout longer than SLURM takes to requeue makes it actually wait.
    RUN_EXTRA=(--set "lock.stale_after=\"${NODELOSS_STALE}s\"")
    submit nodeloss || return 1
    RUN_EXTRA=()
    under_way 0.$((RANDOM % 10)) || return 1 # land anywhere inside a checkpoint interval
    local node pids slurmd_pid
    node=$(job_field "$job" NodeList)
    slurmd_pid=$(cat "$CLUSTER_DIR/run/slurmd-$node.pid" 2>/dev/null)
    pids=$(job_pids | tr '\n' ' ')
    [[ -n $slurmd_pid && -n $pids ]] || { note "cannot find slurmd of $node or the job's processes"; return 1; }
    action=$(now)
    log "nodeloss: SIGKILL to slurmd $node (pid $slurmd_pid) and the job's processes ($pids)"
    kill -KILL "$slurmd_pid" $pids
    wait_until "the job to resume on another node" "$TIMEOUT" attempts_started "$run" 2 || return 1
    log "nodeloss: resumed; bringing $node back"
    if "$script_dir/local-cluster.sh" up >"$wd/node-back.log" 2>&1; then
        EXTRA_JSON=$(printf '{"killed_attempts":1,"node_back":true,"node_state":"%s","killed_node":"%s","stale_after":%s}' \
            "$(sinfo -h -n "$node" -o %t | head -n1)" "$node" "$NODELOSS_STALE")
    else
        EXTRA_JSON=$(printf '{"killed_attempts":1,"node_back":false,"node_state":"%s","killed_node":"%s","stale_after":%s}' \
            "$(sinfo -h -n "$node" -o %t | head -n1)" "$node" "$NODELOSS_STALE")
    fi
    wait_until "the job to finish" "$TIMEOUT" job_final "$job"
}

drill_cancel() {
    submit cancel || return 1
    under_way || return 1
    action=$(now)
    log "cancel: scancel $job"
    scancel "$job"
    wait_until "the job to end" "$TIMEOUT" job_final "$job" || return 1
    # rekindle records its requeue decision, with the controller's answer
    # when it asked, in its stop event: once that is written any requeue it
    # asked for has been made, so the job still being ended then is the
    # proof (not a fixed wait for a requeue that might come later).
    wait_until "rekindle's stop event (its requeue decision)" 60 has_event "$run" stop || return 1
    job_final "$job" || note "the job left its final state after rekindle's stop event: $(job_field "$job" JobState)"
}

# A wrapper around the binary that sets FAILPOINTS=$2 in the first attempt
# only (SLURM_RESTART_COUNT and REKINDLE_INJOB_RESTARTS unset or 0), so the
# requeued attempt, or the next step of an in-job restart, runs clean;
# prints its path. Usage: first_attempt_failpoints DRILL SPEC
first_attempt_failpoints() {
    local w=$WORK/$1/rekindle-failing-first
    mkdir -p "$WORK/$1"
    cat >"$w" <<EOF
#!/bin/sh
# drill $1: the first attempt runs with FAILPOINTS='$2'
if [ "\${SLURM_RESTART_COUNT:-0}" = 0 ] && [ "\${REKINDLE_INJOB_RESTARTS:-0}" = 0 ]; then export FAILPOINTS='$2'; fi
exec '$BIN' "\$@"
EOF
    chmod +x "$w"
    echo "$w"
}

job_requeued_pending() {
    local r
    r=$(job_field "$job" Restarts)
    ((${r:-0} >= 1)) && [[ $(job_field "$job" JobState) == PENDING ]]
}
has_event() { (($(count_events "$1" "$2") >= 1)); }

# The job as SLURM shows it once it is pending again after a requeue, as JSON
# for drill_check.py (--extra), merged with the JSON object $1.
# Usage: requeued_view JSON [EVENT recorded after the requeue, to wait for first]
requeued_view() {
    wait_until "the job to be requeued (PENDING, Restarts >= 1)" 120 job_requeued_pending || return 1
    # The crash drill's hold follows the requeue; its error event is recorded after it.
    [[ -z ${2:-} ]] || wait_until "the $2 event" 30 has_event "$run" "$2" || return 1
    local line
    line=$(scontrol show job -o "$job")
    log "$name: requeued: $(tr ' ' '\n' <<<"$line" | grep -E '^(JobState|Reason|Restarts|StartTime)=' | tr '\n' ' ')"
    python3 - "$line" "$1" <<'PY'
import json, subprocess, sys
fields = dict(tok.split("=", 1) for tok in sys.argv[1].split() if "=" in tok)
start = fields.get("StartTime", "")
try:
    start_unix = int(subprocess.run(["date", "-d", start, "+%s"], capture_output=True, text=True, check=True).stdout)
except (subprocess.CalledProcessError, ValueError):
    start_unix = None
extra = json.loads(sys.argv[2])
extra["requeued"] = {"state": fields.get("JobState"), "reason": fields.get("Reason"),
                     "restarts": int(fields.get("Restarts", -1)), "start_time": start, "start_unix": start_unix}
print(json.dumps(extra))
PY
}

# The watchdog on the real cluster: the first attempt's step N+1 hangs
# (train::step sleeps ten minutes) under `[watchdog] step = "5s"`.
HANG_LIMIT=5
drill_hang() {
    local at=$((2 * EVERY + EVERY / 2))
    [[ -n $FAILPOINTS_WORK ]] || { note "$BIN ignores FAILPOINTS (no failpoints compiled in): build it with cargo test --no-run (make drill does); see $WORK/failpoints.log"; return 1; }
    local -x REKINDLE_BIN
    REKINDLE_BIN=$(first_attempt_failpoints hang "train::step=$at*off->sleep(600000)")
    # No in-job restart: this drill keeps the requeue drilled (a hang under
    # a batch shell that offers one restarts in the job, without its node).
    local -x REKINDLE_INJOB_MAX=0
    RUN_EXTRA=(--set "watchdog.step=\"${HANG_LIMIT}s\"")
    submit hang
    local rc=$?
    RUN_EXTRA=()
    ((rc == 0)) || return 1
    # The hung attempt is ended by the watchdog before it can publish.
    EXTRA_JSON=$(requeued_view "{\"fail_after_step\":$at,\"limit_seconds\":$HANG_LIMIT,\"unpublished_attempts\":1}") ||
        { note "the job was not seen PENDING with Restarts >= 1 within 120 s"; return 1; }
    wait_until "the job to resume" "$TIMEOUT" attempts_started "$run" 2 || return 1
    wait_until "the job to finish" "$TIMEOUT" job_final "$job"
}

# The watchdog under the batch shell's in-job restart: the first step's
# step N+1 hangs on one node of a job of two (one rank, the other node held
# as a spare); the next step runs on the other node, never requeued.
drill_hang-injob() {
    local at=$((2 * EVERY + EVERY / 2))
    [[ -n $FAILPOINTS_WORK ]] || { note "$BIN ignores FAILPOINTS (no failpoints compiled in): build it with cargo test --no-run (make drill does); see $WORK/failpoints.log"; return 1; }
    local -x REKINDLE_BIN REKINDLE_SPARE_NODES=1
    REKINDLE_BIN=$(first_attempt_failpoints hang-injob "train::step=$at*off->sleep(600000)")
    RUN_EXTRA=(--set "watchdog.step=\"${HANG_LIMIT}s\"")
    submit hang-injob -N2 --ntasks-per-node=1
    local rc=$?
    RUN_EXTRA=()
    ((rc == 0)) || return 1
    EXTRA_JSON="{\"fail_after_step\":$at,\"limit_seconds\":$HANG_LIMIT,\"unpublished_attempts\":1}"
    wait_until "the run to go on in the job" "$TIMEOUT" attempts_started "$run" 2 || return 1
    wait_until "the job to finish" "$TIMEOUT" job_final "$job"
}

# A transient crash on the real cluster: the first attempt's step N+1 fails
# (train::step_error) after N passed.
drill_crash() {
    local at=$((2 * EVERY + EVERY / 2))
    [[ -n $FAILPOINTS_WORK ]] || { note "$BIN ignores FAILPOINTS (no failpoints compiled in): build it with cargo test --no-run (make drill does); see $WORK/failpoints.log"; return 1; }
    local -x REKINDLE_BIN
    REKINDLE_BIN=$(first_attempt_failpoints crash "train::step_error=$at*off->return")
    # No in-job restart: this drill keeps the requeue with a hold drilled (a
    # transient crash under a batch shell that offers one restarts in the job).
    local -x REKINDLE_INJOB_MAX=0
    submit crash || return 1
    # A crashed attempt exits 1 without publishing.
    EXTRA_JSON=$(requeued_view "{\"fail_after_step\":$at,\"unpublished_attempts\":1}" error) ||
        { note "the job was not seen PENDING with Restarts >= 1, and its error event, within 120 s"; return 1; }
    wait_until "the job to resume" "$TIMEOUT" attempts_started "$run" 2 || return 1
    wait_until "the job to finish" "$TIMEOUT" job_final "$job"
}

# A program of your own (a registered model), stopped by a plain scancel -s TERM.
drill_own() {
    local CONFIG=$OWN_CONFIG
    local -a TRAIN=("${OWN_TRAIN[@]}")
    local -x REKINDLE_BIN=$OWN_BIN
    scancel_drill -s TERM
}

# A numpy program under `rekindle exec`, stopped by a plain scancel -s TERM;
# judged here (exec_drill): byte-identical final weights.
drill_exec() {
    wd=$WORK/exec
    EXEC_SBATCH=()
    EXEC_CMD=(python3 "$EXEC_PROGRAM" "${EXEC_ARGS[@]}" --step-seconds "${DRILL_EXEC_STEP_SECONDS:-0.03}"
        --out "$wd/w.npy")
    EXEC_SAME=(cmp -s "$wd/w.npy" "$REF_EXEC/w.npy")
    exec_drill exec ref_exec_pid "$REF_EXEC.log" byte_identical
}

# Two DDP ranks of PyTorch (python/examples/train_ddp.py, gloo) as two tasks
# on two nodes, the users' literal `sbatch -N2 -n2 slurm/orchestrator.slurm
# --exec ... -- python train_ddp.py`, stopped by a plain scancel -s TERM;
# judged here (exec_drill): the final model, optimizer and generators
# torch.equal to two ranks never stopped (torchrun --standalone under
# rekindle exec, without SLURM).
drill_exec-ddp() {
    wd=$WORK/exec-ddp
    EXEC_SBATCH=(-N2 -n2)
    EXEC_CMD=("$VENV/bin/python" "$DDP_PROGRAM" "${DDP_ARGS[@]}" --step-seconds "${DRILL_DDP_STEP_SECONDS:-0.05}"
        --out "$wd/out")
    EXEC_SAME=("$VENV/bin/python" "$script_dir/torch_equal.py" "$wd/out" "$REF_DDP/out")
    exec_drill exec-ddp ref_ddp_pid "$REF_DDP.log" torch_equal
}

# The same two ranks as one task per node, each running torchrun (its
# rendezvous from rekindle's PET_* variables), stopped by preemption: a
# high-priority job of 30 s on the first node; judged as exec-ddp.
drill_exec-torchrun() {
    wd=$WORK/exec-torchrun
    EXEC_SBATCH=(-N2 --ntasks-per-node=1)
    EXEC_CMD=("$VENV/bin/torchrun" --nproc-per-node 1 "$DDP_PROGRAM" "${DDP_ARGS[@]}"
        --step-seconds "${DRILL_DDP_STEP_SECONDS:-0.05}" --out "$wd/out")
    EXEC_SAME=("$VENV/bin/python" "$script_dir/torch_equal.py" "$wd/out" "$REF_DDP/out")
    EXEC_STOP=exec_stop_preempt
    exec_drill exec-torchrun ref_ddp_pid "$REF_DDP.log" torch_equal
    local rc=$?
    EXEC_STOP=exec_stop_term
    return $rc
}

# Two DDP ranks as in exec-ddp; task 1's node is lost (kill_rank_node: the
# start event names each task's node); judged as exec-ddp, the loss's stop
# counting as the stop.
drill_exec-nodeloss() {
    if [[ -z $CLUSTER_DIR ]]; then
        echo "SKIP exec-nodeloss: needs the local cluster (it kills a slurmd); see docs/drills.md"
        echo '{"drill":"exec-nodeloss","result":"SKIP"}'
        return 3
    fi
    wd=$WORK/exec-nodeloss
    EXEC_SBATCH=(-N2 -n2)
    EXEC_CMD=("$VENV/bin/python" "$DDP_PROGRAM" "${DDP_ARGS[@]}" --step-seconds "${DRILL_DDP_STEP_SECONDS:-0.05}"
        --out "$wd/out")
    EXEC_SAME=("$VENV/bin/python" "$script_dir/torch_equal.py" "$wd/out" "$REF_DDP/out")
    EXEC_STOP=exec_stop_nodeloss
    EXEC_RUN_EXTRA=(--set 'distributed.timeout="10s"')
    # No in-job restart: one node left could hold only one rank.
    local -x REKINDLE_INJOB_MAX=0
    local lost_node=
    exec_drill exec-nodeloss ref_ddp_pid "$REF_DDP.log" torch_equal
    local rc=$?
    EXEC_STOP=exec_stop_term
    EXEC_RUN_EXTRA=()
    # Back in any case: the drills after this one need every node.
    [[ -z $lost_node ]] || node_back "$lost_node" || log "exec-nodeloss: could not bring $lost_node back"
    return "$rc"
}

# A Hugging Face Trainer with rekindle's callback under `sbatch
# slurm/orchestrator.slurm --exec`, stopped by a plain scancel -s TERM;
# judged here (exec_drill): the final weights torch.equal to an
# uninterrupted run's.
drill_exec-trainer() {
    wd=$WORK/exec-trainer
    EXEC_SBATCH=()
    EXEC_CMD=("$VENV/bin/python" "$HF_PROGRAM" "${HF_ARGS[@]}" --step-seconds "${DRILL_HF_STEP_SECONDS:-0.1}"
        --out "$wd/final.pt")
    EXEC_SAME=("$VENV/bin/python" "$script_dir/torch_equal.py" "$wd/final.pt" "$REF_HF/final.pt")
    exec_drill exec-trainer ref_hf_pid "$REF_HF.log" torch_equal
}

# exec-nodeloss on the default path: a spare node, the batch shell's in-job
# restarts on (the users' default); judged as exec-nodeloss, with the job
# never requeued and the next step an in-job restart without the lost node.
drill_exec-nodeloss-injob() {
    if [[ -z $CLUSTER_DIR ]]; then
        echo "SKIP exec-nodeloss-injob: needs the local cluster (it kills a slurmd); see docs/drills.md"
        echo '{"drill":"exec-nodeloss-injob","result":"SKIP"}'
        return 3
    fi
    wd=$WORK/exec-nodeloss-injob
    local -x REKINDLE_SPARE_NODES=1
    EXEC_SBATCH=(-N3 --ntasks-per-node=1)
    EXEC_CMD=("$VENV/bin/python" "$DDP_PROGRAM" "${DDP_ARGS[@]}" --step-seconds "${DRILL_DDP_STEP_SECONDS:-0.05}"
        --out "$wd/out")
    EXEC_SAME=("$VENV/bin/python" "$script_dir/torch_equal.py" "$wd/out" "$REF_DDP/out")
    EXEC_STOP=exec_stop_nodeloss
    EXEC_RUN_EXTRA=(--set 'distributed.timeout="5s"')
    EXEC_IN_JOB=1
    local lost_node=
    exec_drill exec-nodeloss-injob ref_ddp_pid "$REF_DDP.log" torch_equal
    local rc=$?
    EXEC_STOP=exec_stop_term
    EXEC_RUN_EXTRA=()
    EXEC_IN_JOB=
    [[ -z $lost_node ]] || node_back "$lost_node" || log "exec-nodeloss-injob: could not bring $lost_node back"
    return "$rc"
}

# Whether the run in $1 went on in the job after losing node $2: the second
# attempt's `start` is in-job restart 1 and a `nodes_excluded` event (how
# `in_job`) names the node.
in_job_recorded() {
    python3 - "$1" "$2" <<'PY'
import json, sys
events = []
with open(sys.argv[1] + "/events.jsonl", encoding="utf-8", errors="replace") as f:
    for line in f:
        try:
            events.append(json.loads(line))
        except ValueError:
            pass  # a line torn by the lost node
starts = [e for e in events if e.get("event") == "start"]
restarted = len(starts) >= 2 and starts[1].get("in_job_restart") == 1
excluded = any(e.get("event") == "nodes_excluded" and e.get("how") == "in_job" and sys.argv[2] in (e.get("added") or [])
               for e in events)
sys.exit(0 if restarted and excluded else 1)
PY
}

# How exec_drill stops its job: a plain scancel -s TERM, preemption by a
# high-priority job of 30 s on the job's first node, or the loss of task 1's
# node; EXEC_RUN_EXTRA: more `rekindle exec` options.
EXEC_STOP=exec_stop_term
EXEC_RUN_EXTRA=()
# Set: the job goes on in the job after its fault (never requeued).
EXEC_IN_JOB=
exec_stop_nodeloss() { kill_rank_node; }

# Whether the run in $1 recorded task 1 lost on node $2 (`rank_lost`) and a
# program ended for it (`child_exit` with verdict `rank_lost`).
loss_recorded() {
    python3 - "$1" "$2" <<'PY'
import json, sys
events = []
with open(sys.argv[1] + "/events.jsonl", encoding="utf-8", errors="replace") as f:
    for line in f:
        try:
            events.append(json.loads(line))
        except ValueError:
            pass  # a line torn by the lost node
lost = any(e.get("event") == "rank_lost" and e.get("rank") == 1 and e.get("rank_node") == sys.argv[2] for e in events)
ended = any(e.get("event") == "child_exit" and e.get("verdict") == "rank_lost" for e in events)
sys.exit(0 if lost and ended else 1)
PY
}
exec_stop_term() {
    log "$name: scancel -s TERM $job"
    scancel -s TERM "$job"
}
exec_stop_preempt() {
    local node
    node=$(scontrol show hostnames "$(job_field "$job" NodeList)" | head -n1)
    high=$(sbatch --parsable -J rekindle-drill-high -p "$HIGH" -w "$node" -o /dev/null "${EXTRA_OPTS[@]}" \
        "${HIGH_OPTS[@]}" --wrap 'sleep 30')
    high=${high%%;*}
    log "$name: high-priority job $high on $node (30 s): preempts job $job"
}

# A program under `sbatch ${EXEC_SBATCH[@]} slurm/orchestrator.slurm --exec
# ... -- ${EXEC_CMD[@]}`, stopped by $EXEC_STOP; judged here: the
# job ends COMPLETED after at least one requeue, the run has a `stop`, a
# `resume` and a `finish`, every checkpoint verifies, and EXEC_SAME (the
# final state against the uninterrupted reference's) succeeds.
# Usage: exec_drill NAME REFERENCE_RC_VARIABLE REFERENCE_LOG SAME_KEY
exec_drill() {
    local drill=$1 ref_log=$3 key=$4
    local -n ref_rc=$2
    run=$wd/run
    mkdir -p "$wd"
    job=$(sbatch --parsable -J "rekindle-drill-$drill" -o "$wd/slurm-%j.out" -D "$wd" ${LOW:+-p "$LOW"} \
        "${EXTRA_OPTS[@]}" "${EXEC_SBATCH[@]}" "$script_dir/orchestrator.slurm" --exec --run-dir "$run" \
        --set "signals.grace=\"${GRACE}s\"" --set 'signals.safety_margin="5s"' "${EXEC_RUN_EXTRA[@]}" -- "${EXEC_CMD[@]}")
    job=${job%%;*}
    [[ $job =~ ^[0-9]+$ ]] || { note "sbatch failed: $job"; return 1; }
    log "$drill: submitted job $job"
    local ok=1 state restarts stops resumes finishes attempts same=false verify_rc
    under_way || ok=0
    if ((ok)); then
        action=$(now)
        "$EXEC_STOP"
        wait_until "the job to resume" "$TIMEOUT" attempts_started "$run" 2 || ok=0
    fi
    ((ok)) && { wait_until "the job to finish" "$TIMEOUT" job_final "$job" || ok=0; }
    cleanup_jobs "$job" "$high"
    if [[ -n $ref_rc ]]; then
        # A failed reference fails the drill: there is nothing to be equal to
        # (a later drill sharing it finds its output missing, which
        # torch_equal.py and cmp refuse).
        ended_ok "$ref_rc" || { ok=0; note "the $drill reference failed: $(tail -n 5 "$ref_log")"; }
        ref_rc=
    fi
    state=$(job_field "$job" JobState)
    restarts=$(job_field "$job" Restarts)
    stops=$(count_events "$run" stop)
    resumes=$(count_events "$run" resume)
    finishes=$(count_events "$run" finish)
    attempts=$(count_events "$run" start)
    "${EXEC_SAME[@]}" >"$wd/same.log" 2>&1 && same=true
    "$BIN" verify "$run" >"$wd/verify.log" 2>&1
    verify_rc=$?
    # Each check counts, and a failed one is named in the summary, as
    # drill_check.py's are: tests/it/drills.rs believes a PASS only with the
    # checks behind it.
    local checks=0 failed=()
    exec_check() { # exec_check OK MESSAGE
        checks=$((checks + 1))
        (($1)) || { ok=0; failed+=("$2"); note "$2"; }
    }
    exec_check "$([[ $state == COMPLETED ]] && echo 1 || echo 0)" "job state $state, expected COMPLETED"
    if [[ -n $EXEC_IN_JOB ]]; then
        exec_check "$((${restarts:-1} == 0))" "Restarts=${restarts:-?}: the job was requeued, not restarted in the job"
        exec_check "$(in_job_recorded "$run" "$lost_node" && echo 1 || echo 0)" \
            "no in-job restart 1 without $lost_node (the second start's in_job_restart, a nodes_excluded of how in_job)"
    else
        exec_check "$((${restarts:-0} >= 1))" "Restarts=${restarts:-?}: the job was never requeued"
    fi
    exec_check "$((stops >= 1 && resumes >= 1 && finishes == 1))" \
        "events: $stops stop, $resumes resume, $finishes finish (expected >=1, >=1, 1)"
    exec_check "$([[ $same == true ]] && echo 1 || echo 0)" \
        "the final state differs from the uninterrupted run's: $(tail -n 2 "$wd/same.log" | tr '\n' ' ')"
    if [[ $drill == exec-nodeloss* ]]; then
        exec_check "$(loss_recorded "$run" "$lost_node" && echo 1 || echo 0)" \
            "no rank_lost naming task 1 on $lost_node with a child_exit of verdict rank_lost: the heartbeat watch did not end the world"
    fi
    exec_check "$((verify_rc == 0))" "rekindle verify failed: $(tail -n 3 "$wd/verify.log" | tr '\n' ' ')"
    local result=PASS
    ((ok)) || result=FAIL
    echo "$result $drill: job $job $state, restarts ${restarts:-?}, $stops stop / $resumes resume / $finishes finish, $key $same (${NOTES[*]:-})"
    local failed_json
    failed_json=$(python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "${failed[@]}")
    printf '{"drill":"%s","result":"%s","job":"%s","state":"%s","restarts":%s,"attempts":%s,"stops":%s,"resumes":%s,"finishes":%s,"%s":%s,"identical_to_reference":%s,"checks":%s,"failed_checks":%s,"seconds":%s}\n' \
        "$drill" "$result" "$job" "$state" "${restarts:-null}" "$attempts" "$stops" "$resumes" "$finishes" "$key" "$same" \
        "$same" "$checks" "$failed_json" "$(elapsed "$t_start")"
    ((ok)) && return 3
    return 4
}

# One run over two ranks on the two nodes, stopped by a plain scancel -s TERM.
drill_dp() {
    submit dp -N2 -n2 || return 1
    under_way || return 1
    action=$(now)
    log "dp: scancel -s TERM $job (two ranks on $(job_field "$job" NodeList))"
    scancel -s TERM "$job"
    wait_until "the job to finish" "$TIMEOUT" job_final "$job"
}

# The node rank $2 ran on in the first attempt of the run in $1 (its start event).
rank_node() {
    python3 - "$1" "$2" <<'PY'
import json, sys
with open(sys.argv[1] + "/events.jsonl", encoding="utf-8") as f:
    for line in f:
        ev = json.loads(line)
        if ev.get("event") == "start":
            print((ev.get("rank_nodes") or [""] * 8)[int(sys.argv[2])])
            break
PY
}

job_requeued() { (($(job_field "$job" Restarts) >= 1)); }

# Brings the lost node $1 back (slurm/local-cluster.sh up) as after a
# reboot, with nothing of the killed steps left in its spool or its /tmp: the
# PMIx socket and directories of a SIGKILLed stepd would make a later step of
# the same job id (after a requeue) fail to create them again.
node_back() {
    rm -rf "$CLUSTER_DIR/spool/$1/stepd.slurm.pmix.$job."* "$CLUSTER_DIR/spool/$1/pmix.$job."* \
        "$CLUSTER_DIR/tmp/$1/spmix_appdir_"*"_$job."*
    "$script_dir/local-cluster.sh" up >"$wd/node-back.log" 2>&1
}

# SIGKILL to the slurmd of rank LOST_RANK's node (rank 1 unless a drill sets
# it) and to the job's processes there; sets `action` (the time of the kill)
# and `lost_node`. Not the batch host: the batch shell must survive to
# restart the run.
LOST_RANK=1
kill_rank_node() {
    local slurmd_pid pids batch_host
    lost_node=$(rank_node "$run" "$LOST_RANK")
    batch_host=$(job_field "$job" BatchHost)
    slurmd_pid=$(cat "$CLUSTER_DIR/run/slurmd-$lost_node.pid" 2>/dev/null)
    pids=$(job_pids "$lost_node" | tr '\n' ' ')
    [[ -n $lost_node && -n $slurmd_pid && -n $pids ]] ||
        { note "cannot find rank $LOST_RANK's node ($lost_node), its slurmd or its processes"; return 1; }
    [[ $lost_node != "$batch_host" ]] || { note "rank $LOST_RANK runs on the batch host $batch_host"; return 1; }
    action=$(now)
    log "$name: SIGKILL to slurmd $lost_node (pid $slurmd_pid) and rank $LOST_RANK's processes there ($pids)"
    kill -KILL "$slurmd_pid" $pids
}

# Two ranks on two nodes; the node of rank 1 is lost.
drill_dp-nodeloss() {
    if [[ -z $CLUSTER_DIR ]]; then
        echo "SKIP dp-nodeloss: needs the local cluster (it kills a slurmd); see docs/drills.md"
        echo '{"drill":"dp-nodeloss","result":"SKIP"}'
        return 3
    fi
    RUN_EXTRA=(--set 'distributed.timeout="10s"')
    # No in-job restart: this drill keeps the requeue path drilled
    # (dp-nodeloss-injob drills the other).
    local -x REKINDLE_INJOB_MAX=0
    submit dp-nodeloss -N2 -n2 || return 1
    RUN_EXTRA=()
    under_way 0.$((RANDOM % 10)) || return 1
    local lost_node back=false
    kill_rank_node || return 1
    wait_until "the job to be requeued" "$TIMEOUT" job_requeued || return 1
    # rekindle excludes the lost node right after its requeue: read the
    # job's exclusions once its record says so.
    wait_until "the nodes_excluded event" 30 has_event "$run" nodes_excluded || return 1
    local excluded
    excluded=$(scontrol show hostnames "$(job_field "$job" ExcNodeList)" 2>/dev/null | paste -sd, -)
    log "dp-nodeloss: requeued with ExcNodeList=$excluded; bringing $lost_node back"
    node_back "$lost_node" && back=true
    # The attempt that lost a rank ends like a hung one: records, requeue and
    # MPI_Abort, no publish (the next attempt publishes): counted as killed.
    EXTRA_JSON=$(printf '{"killed_attempts":1,"node_back":%s,"node_state":"%s","killed_node":"%s","lost_rank":1,"exc_node_list":"%s"}' \
        "$back" "$(sinfo -h -n "$lost_node" -o %t | head -n1)" "$lost_node" "$excluded")
    wait_until "the job to resume" "$TIMEOUT" attempts_started "$run" 2 || return 1
    wait_until "the job to finish" "$TIMEOUT" job_final "$job"
}

# The node-local checkpoint tier's interval in the in-job drills (steps), and
# the per-node folder that stands for each node's local storage (the local
# cluster's nodes share one filesystem; `{node}` is the node's name).
INJOB_LOCAL_EVERY=5
# The first world of an in-job drill (ranks, ranks a node) and extra `rekindle
# run` arguments; the wide drill sets its own.
INJOB_WORLD=2
INJOB_PER_NODE=1
INJOB_EXTRA=()

# Rank 1's node is lost (kill_rank_node), or its process alone
# (kill_rank1_process), under a run with the node-local tier; the batch shell
# restarts the run in the job. Usage: injob_drill KILL [sbatch options...]
injob_drill() {
    local kill=$1
    shift
    if [[ -z $CLUSTER_DIR ]]; then
        echo "SKIP $name: needs the local cluster (it kills a slurmd); see docs/drills.md"
        echo "{\"drill\":\"$name\",\"result\":\"SKIP\"}"
        return 3
    fi
    RUN_EXTRA=(--set 'distributed.timeout="3s"' --set recovery.local=true
        --set "recovery.local_every_steps=$INJOB_LOCAL_EVERY"
        --set "recovery.local_dir=\"$CLUSTER_DIR/tmp/{node}/local\"" "${INJOB_EXTRA[@]}")
    submit "$name" "$@" || return 1
    RUN_EXTRA=()
    under_way 0.$((RANDOM % 10)) || return 1
    local lost_node rank1_pid back=false ok=0
    "$kill" || return 1
    wait_until "the run to go on in the job" "$TIMEOUT" attempts_started "$run" 2 &&
        log "$name: a new step started; waiting for the job to finish" &&
        wait_until "the job to finish" "$TIMEOUT" job_final "$job" && ok=1
    # Back in any case: the drills after this one need every node.
    if [[ $kill == kill_rank_node ]]; then node_back "$lost_node" && back=true; else back=true; fi
    # The attempt that lost a rank ends like dp-nodeloss's (records, the
    # restart request, MPI_Abort) and does not publish: counted as killed.
    EXTRA_JSON=$(printf '{"killed_attempts":1,"node_back":%s,"node_state":"%s","killed_node":"%s","lost_rank":%s,"world":%s,"per_node":%s,"local_every":%s,"kill_time":%s}' \
        "$back" "$(sinfo -h -n "$lost_node" -o %t | head -n1)" "$lost_node" "$LOST_RANK" "$INJOB_WORLD" \
        "$INJOB_PER_NODE" "$INJOB_LOCAL_EVERY" "$action")
    ((ok))
}
# SIGKILL to rank 1's rekindle alone (its node stays up): rank 0 finds it
# silent within the timeout, as it would a lost node (it cannot tell the two
# apart), and the batch shell restarts the run in the job on the spare.
kill_rank1_process() {
    local pid args
    lost_node=$(rank_node "$run" 1)
    for pid in $(job_pids "$lost_node"); do
        args=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || continue
        [[ $args == *" run "* && $args != slurmstepd* ]] && rank1_pid=$pid
    done
    [[ -n $lost_node && -n ${rank1_pid:-} ]] || { note "cannot find rank 1's rekindle on $lost_node"; return 1; }
    action=$(now)
    log "$name: SIGKILL to rank 1's rekindle on $lost_node (pid $rank1_pid); the node stays up"
    kill -KILL "$rank1_pid"
}

drill_dp-rankkill-injob() {
    local -x REKINDLE_SPARE_NODES=1
    injob_drill kill_rank1_process -N3 --ntasks-per-node=1
}

drill_dp-nodeloss-injob() {
    local -x REKINDLE_SPARE_NODES=1
    injob_drill kill_rank_node -N3 --ntasks-per-node=1
}
drill_dp-nodeloss-injob-nospare() { injob_drill kill_rank_node -N2 -n2; }

# dp-nodeloss-injob at 16 ranks on eight nodes and a spare of the wide
# partition; the last node (ranks 14 and 15) is lost.
drill_dp-nodeloss-wide() {
    local nodes=$((WIDE_RANKS / WIDE_PER_NODE + 1)) have
    have=$(sinfo -h -p "$WIDE_PARTITION" -o %D 2>/dev/null | head -n1)
    if [[ -z $CLUSTER_DIR || ${have:-0} -lt $nodes ]]; then
        echo "SKIP $name: needs the local cluster's partition $WIDE_PARTITION of $nodes nodes (it has ${have:-none}; slurm/local-cluster.sh up makes it); see docs/drills.md"
        echo "{\"drill\":\"$name\",\"result\":\"SKIP\"}"
        return 3
    fi
    # 16 ranks share this machine's two cores: OpenMPI under srun does not
    # know it is oversubscribed, and its ranks would spin in every collective.
    # Two ranks of a simulated node are on one host, as are all the others:
    # OpenMPI's shared memory between them looks for its segment in the
    # node's own TmpFS and fails (segfaults at MPI_Init), so TCP only, over
    # the loopback: 16 ranks connecting at once through this VM's eth0
    # sometimes failed to connect ("Operation now in progress") and crashed.
    local -x REKINDLE_SPARE_NODES=1 OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=lo
    local LOW=$WIDE_PARTITION LOST_RANK=$((WIDE_RANKS - 1)) INJOB_WORLD=$WIDE_RANKS INJOB_PER_NODE=$WIDE_PER_NODE
    local INJOB_EXTRA=(--set "run.max_steps=$WIDE_STEPS")
    injob_drill kill_rank_node -N"$nodes" --ntasks-per-node="$WIDE_PER_NODE"
}

# A site health check that fails on n1 only, and a training job that starts
# there because n1 is the only idle node when it is submitted (n2 and n3 run
# a short job): the attempt on n1 ends untrained, the job is requeued with
# n1 excluded and trains elsewhere.
BAD_NODE=n1
drill_badnode() {
    if [[ -z $CLUSTER_DIR ]]; then
        echo "SKIP badnode: needs the local cluster (it fills its other nodes); see docs/drills.md"
        echo '{"drill":"badnode","result":"SKIP"}'
        return 3
    fi
    local others n part
    # The other nodes of the partition the job runs in (the default one, `*`
    # in sinfo, unless DRILL_PARTITION names it): not every node the cluster
    # has (the local cluster's `wide` nodes are in no other partition).
    part=${LOW:-$(sinfo -h -o %P | sed -n 's/\*$//p' | head -n1)}
    others=$(sinfo -h -N ${part:+-p "$part"} -o %N | sort -u | grep -vx "$BAD_NODE" | paste -sd, -)
    n=$(tr ',' '\n' <<<"$others" | grep -c .)
    high=$(sbatch --parsable -J rekindle-drill-busy -w "$others" -N "$n" -o /dev/null ${LOW:+-p "$LOW"} \
        "${EXTRA_OPTS[@]}" --wrap 'sleep 15')
    high=${high%%;*}
    log "badnode: job $high keeps $others busy for 15 s"
    busy_running() { [[ $(job_field "$high" JobState) == RUNNING ]]; }
    wait_until "the busy job to run" 60 busy_running || return 1
    RUN_EXTRA=(--set "health.command=\"test \$REKINDLE_NODE != $BAD_NODE || { echo drill: $BAD_NODE fails its site check; exit 1; }\"")
    submit badnode || return 1
    RUN_EXTRA=()
    action=$(now)
    wait_until "the node_unhealthy event" 120 has_event "$run" node_unhealthy || return 1
    wait_until "the nodes_excluded event" 30 has_event "$run" nodes_excluded || return 1
    local excluded first_node
    excluded=$(scontrol show hostnames "$(job_field "$job" ExcNodeList)" 2>/dev/null | paste -sd, -)
    log "badnode: requeued; ExcNodeList=$excluded"
    wait_until "the job to train on another node" "$TIMEOUT" attempts_started "$run" 1 || return 1
    wait_until "the job to finish" "$TIMEOUT" job_final "$job" || return 1
    "$BIN" status "$run" >"$wd/status.txt" 2>&1
    EXTRA_JSON=$(python3 - "$BAD_NODE" "$excluded" "$wd/status.txt" <<'PY'
import json, sys
status = open(sys.argv[3], encoding="utf-8", errors="replace").read()
print(json.dumps({"bad_node": sys.argv[1], "exc_node_list": sys.argv[2], "status": status,
                  "unpublished_attempts": 1}))
PY
    )
}

# Attempts that crash transiently before any checkpoint, restarted in the
# job by the batch shell, until the progress guard stops them.
NOPROGRESS_MAX=2
drill_noprogress() {
    [[ -n $FAILPOINTS_WORK ]] || { note "$BIN ignores FAILPOINTS (no failpoints compiled in): build it with cargo test --no-run (make drill does); see $WORK/failpoints.log"; return 1; }
    local -x FAILPOINTS='train::step_error=5*off->return'
    RUN_EXTRA=(--set "run.max_attempts_without_progress=$NOPROGRESS_MAX" --set run.max_crash_requeues=10)
    submit noprogress || return 1
    RUN_EXTRA=()
    action=$(now)
    wait_until "the job to end" "$TIMEOUT" job_final "$job" || return 1
    EXTRA_JSON=$(printf '{"max_attempts_without_progress":%s,"unpublished_attempts":%s}' "$NOPROGRESS_MAX" "$NOPROGRESS_MAX")
}

# Two ranks, rank 1 slowed in its own work (first attempt only), its
# straggler's node blamed: reported once, then left behind by the requeue.
drill_dp-straggler() {
    if [[ -z $CLUSTER_DIR ]]; then
        echo "SKIP dp-straggler: needs the local cluster (a third node to move to); see docs/drills.md"
        echo '{"drill":"dp-straggler","result":"SKIP"}'
        return 3
    fi
    [[ -n $FAILPOINTS_WORK ]] || { note "$BIN ignores FAILPOINTS (no failpoints compiled in): build it with cargo test --no-run (make drill does); see $WORK/failpoints.log"; return 1; }
    local -x REKINDLE_BIN
    local w=$WORK/dp-straggler/rekindle-slow-rank-1
    mkdir -p "$WORK/dp-straggler"
    cat >"$w" <<EOF
#!/bin/sh
# drill dp-straggler: rank 1 of the first attempt is 50 ms slower in its own work every step
if [ "\${SLURM_RESTART_COUNT:-0}" = 0 ] && [ "\${SLURM_PROCID:-0}" = 1 ]; then export FAILPOINTS='train::compute=sleep(50)'; fi
exec '$BIN' "\$@"
EOF
    chmod +x "$w"
    REKINDLE_BIN=$w
    RUN_EXTRA=(--set health.straggler_steps=10 --set health.straggler_blame=true)
    submit dp-straggler -N2 -n2 || return 1
    RUN_EXTRA=()
    wait_until "the straggler event" 120 has_event "$run" straggler || return 1
    local slow
    slow=$(rank_node "$run" 1)
    action=$(now)
    log "dp-straggler: rank 1 on $slow reported; scancel -s TERM $job"
    scancel -s TERM "$job"
    wait_until "the nodes_excluded event" 60 has_event "$run" nodes_excluded || return 1
    local excluded
    excluded=$(scontrol show hostnames "$(job_field "$job" ExcNodeList)" 2>/dev/null | paste -sd, -)
    log "dp-straggler: requeued; ExcNodeList=$excluded"
    wait_until "the job to finish" "$TIMEOUT" job_final "$job" || return 1
    EXTRA_JSON=$(printf '{"slow_node":"%s","exc_node_list":"%s"}' "$slow" "$excluded")
}

# Interrupted (Ctrl-C, a CI timeout): leave no drill job behind.
on_exit() {
    local p
    p=$(cat "$WORK/probe-job" 2>/dev/null)
    cleanup_jobs "${job:-}" "${high:-}" "$p"
    restore_cluster_conf
}
trap on_exit EXIT
trap 'exit 130' INT TERM

# Every drill starts on a settled local cluster: each node idle, none left
# down, drained or completing by the drill before (a node whose killed steps
# took too long to end is drained by slurmctld, "Kill task failed"; a node a
# drill brought back may still be registering). A drill placed on what is
# left would judge the leftovers, not rekindle: the dp-nodeloss drill once
# found one node of three unusable and rightly excluded nothing. What was
# found is logged; `local-cluster.sh up` waits for idle and resumes nodes.
settle_cluster() {
    [[ -n $CLUSTER_DIR ]] || return 0
    local busy
    # A node in two partitions is listed once for each; sinfo's own error,
    # if any, is logged as what was found.
    busy=$(sinfo -h -N -o '%N %t' 2>&1 | sort -u | grep -vE '^[^ ]+ idle$' | paste -sd, -)
    [[ -n $busy ]] || return 0
    log "before $1: node(s) not idle: $busy $(sinfo -h -R -o '(%n: %E)' 2>/dev/null | paste -sd' ' -)"
    if ! "$script_dir/local-cluster.sh" up >"$WORK/settle-$1.log" 2>&1; then
        log "before $1: the cluster did not settle (see $WORK/settle-$1.log): $(sinfo -h -N -o '%N=%t' | paste -sd' ' -)"
    fi
}

log "drills: ${drills[*]}; binary $BIN; work folder $WORK"
[[ " ${drills[*]} " == *" warn"* ]] && start_probe
failed=0
for d in "${drills[@]}"; do
    settle_cluster "$d"
    name=$d job= high= action= EXTRA_JSON='{}' NOTES=() run= wd=
    t_start=$(now)
    "drill_$d"
    rc=$?
    if ((rc == 3)); then continue; fi # judged itself: passed (or skipped)
    if ((rc == 4)); then failed=1; continue; fi # judged itself: failed
    cleanup_jobs "$job" "$high"
    if [[ -z $job ]]; then
        echo "FAIL $d: no job was submitted (${NOTES[*]:-})"
        echo "{\"drill\":\"$d\",\"result\":\"FAIL\",\"error\":\"no job submitted\"}"
        failed=1
        continue
    fi
    judge ${action:+--action-time "$action"} --extra "$EXTRA_JSON" || failed=1
done
[[ -n $ref_pid ]] && ended_ok "$ref_pid"
[[ -n $ref_dp_pid ]] && ended_ok "$ref_dp_pid"
[[ -n $ref_wide_pid ]] && ended_ok "$ref_wide_pid"
[[ -n $ref_own_pid ]] && ended_ok "$ref_own_pid"
[[ -n $ref_exec_pid ]] && ended_ok "$ref_exec_pid"
[[ -n $ref_ddp_pid ]] && ended_ok "$ref_ddp_pid"
[[ -n $ref_hf_pid ]] && ended_ok "$ref_hf_pid"
log "work folder: $WORK"
exit $failed
