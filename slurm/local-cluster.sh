#!/usr/bin/env bash
# A real SLURM cluster on this one machine, for the drills and for trying
# rekindle by hand: three nodes for the usual partitions, nine more for wide
# worlds.
#
#   slurm/local-cluster.sh up       install the packages if missing, start munged,
#                                   slurmctld and twelve slurmd (n1, n2, n3 and
#                                   w1 … w9); wait until every node is idle.
#                                   Idempotent.
#   slurm/local-cluster.sh down     cancel this cluster's jobs, stop the daemons
#                                   this script started (by their pid files only)
#   slurm/local-cluster.sh status   which daemons run, sinfo, squeue
#   slurm/local-cluster.sh env      the shell line pointing SLURM clients here:
#                                   eval "$(slurm/local-cluster.sh env)"; sinfo
#   slurm/local-cluster.sh reconfigure [VARIANT]
#                                   rewrite slurm.conf as VARIANT and have the
#                                   running daemons reread it (scontrol
#                                   reconfigure; jobs keep running). Variants:
#                                   no-preempt-user-signal (SlurmctldParameters
#                                   without preempt_send_user_signal); none:
#                                   the usual config. `up` restores it too.
#
# Debian/Ubuntu packages slurmctld slurmd slurm-client munge (SLURM 22.05) and
# openmpi-bin libopenmpi-dev (OpenMPI 4.1 with PMIx, for data-parallel steps),
# run as root without systemd. Everything lives in one private folder
# (REKINDLE_SLURM_DIR, default /tmp/rekindle-slurm-<hash of this checkout>):
# slurm.conf, a private munge key and socket, state, spool, logs, pid files.
# Nothing system-wide is started or changed apart from installing packages, so
# several checkouts can each run their own cluster side by side.
#
# The cluster (see write_conf below):
#   nodes n1, n2, n3 (1 CPU each, so a second job on a node needs preemption;
#     the third lets a two-node run hold a spare: REKINDLE_SPARE_NODES=1
#     sbatch -N3 --ntasks-per-node=1, orchestrator.slurm)
#   partition low  (default, PriorityTier=1, PreemptMode=REQUEUE, GraceTime)
#   partition high (PriorityTier=10, PreemptMode=OFF): a `high` job on a node
#     running a `low` job preempts it: SIGTERM at once, SIGKILL after GraceTime,
#     then SLURM requeues the low job.
#   nodes w1 … w9 (2 CPUs each, the machine's) in partition wide only: a world
#     of 16 ranks on 8 nodes with one spare (REKINDLE_SPARE_NODES=1 sbatch -p
#     wide -N9 --ntasks-per-node=2), the dp-nodeloss-wide drill. slurmd is
#     light (a few MB each); the ranks share the machine's cores, so such a
#     job needs OMPI_MCA_mpi_yield_when_idle=1 (OpenMPI under srun does not
#     know it is oversubscribed and would spin in every collective).
#   AuthInfo cred_expire=10: a requeued job may run again after ~20 s, not 120 s.
#   TmpFS=<folder>/tmp/<node>: a multi-node MPI step (`srun -N2 -n2 --mpi=pmix`)
#     runs on this one machine (PMIx makes a directory per node in TmpFS).
#   SlurmdTimeout=10, MessageTimeout=5: a node whose slurmd dies is marked down
#     (and its --requeue jobs requeued) within ~20 s; ReturnToService=2 lets it
#     come back as soon as its slurmd registers again.
#   SlurmctldParameters=preempt_send_user_signal: a preempted job gets its
#     --signal when preemption begins (the variant no-preempt-user-signal
#     leaves it out: SLURM then sends SIGTERM).
#
# Knobs (environment):
#   REKINDLE_SLURM_DIR        the private folder
#   REKINDLE_SLURM_PORT       first of 13 TCP ports: slurmctld, then one slurmd per
#                             node (default derived from the folder, 10000-32399:
#                             below the kernel's ephemeral ports)
#   REKINDLE_SLURM_GRACE      GraceTime of partition low, seconds (default 20)
#   REKINDLE_SLURM_KILLWAIT   KillWait, seconds (default 20)
set -euo pipefail

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo_root=$(cd "$script_dir/.." && pwd)
hash=$(printf '%s' "$repo_root" | cksum | cut -d' ' -f1)
DIR=${REKINDLE_SLURM_DIR:-${TMPDIR:-/tmp}/rekindle-slurm-$(printf '%08x' "$hash")}
# Below the kernel's ephemeral ports (32768 and up by default): a port
# there can be held by any outgoing connection or `bind(0)` at the moment a
# slurmd starts (a CI run failed so: "Unable to bind listen port").
PORT=${REKINDLE_SLURM_PORT:-$((10000 + (hash % 1400) * 16))}
read -r EPHEMERAL_LOW _ < /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || EPHEMERAL_LOW=32768
if (( PORT + 13 > EPHEMERAL_LOW )); then
    echo "local-cluster: warning: ports $PORT-$((PORT + 12)) reach the ephemeral range ($EPHEMERAL_LOW and up): a slurmd may find its port taken; set REKINDLE_SLURM_PORT lower" >&2
fi
GRACE=${REKINDLE_SLURM_GRACE:-20}
KILLWAIT=${REKINDLE_SLURM_KILLWAIT:-20}
CONF=$DIR/slurm.conf
MUNGE_SOCKET=$DIR/munge/munge.socket
NODES=(n1 n2 n3)
WIDE_NODES=(w1 w2 w3 w4 w5 w6 w7 w8 w9)
ALL_NODES=("${NODES[@]}" "${WIDE_NODES[@]}")

log() { printf 'local-cluster: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# The pid in a pid file, if that process is alive.
live_pid() {
    local f=$1 pid
    [[ -s $f ]] || return 1
    pid=$(<"$f")
    [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null && printf '%s\n' "$pid"
}

install_packages() {
    local missing=()
    command -v munged >/dev/null || missing+=(munge)
    command -v slurmctld >/dev/null || missing+=(slurmctld)
    command -v slurmd >/dev/null || missing+=(slurmd)
    command -v sbatch >/dev/null || missing+=(slurm-client)
    # Data-parallel steps (`srun --mpi=pmix`): slurmd loads its PMIx plugin
    # when it starts, so OpenMPI and PMIx must be there before it does.
    command -v mpirun >/dev/null || missing+=(openmpi-bin libopenmpi-dev)
    ((${#missing[@]} == 0)) && return 0
    [[ $(id -u) == 0 ]] || die "missing ${missing[*]}: run as root (or apt-get install -y ${missing[*]})"
    command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get to install them"
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # The packages' init scripts try to start system daemons; keep them from it
    # when there is no policy yet (containers usually have one).
    apt-get install -y "${missing[@]}" >/dev/null 2>&1 || {
        apt-get update >/dev/null && apt-get install -y "${missing[@]}" >/dev/null
    } || die "apt-get install ${missing[*]} failed"
}

# One NodeName line per node: all on this host, each slurmd on its own port.
# The usual nodes have 1 CPU (a second job on one needs preemption), the wide
# ones the machine's 2 (two ranks a node).
node_lines() {
    local i cpus
    for i in "${!ALL_NODES[@]}"; do
        cpus=1
        ((i >= ${#NODES[@]})) && cpus=2
        echo "NodeName=${ALL_NODES[i]} NodeHostname=$1 NodeAddr=127.0.0.1 Port=$((PORT + 1 + i)) CPUs=$cpus RealMemory=1000 State=UNKNOWN"
    done
}
nodes_csv() { local IFS=,; echo "$*"; }

# Writes slurm.conf: the usual config, or the variant named in $1.
# Returns 0 when the file changed, 1 when it was already so.
write_conf() {
    local variant=${1:-} host ctld_params=preempt_send_user_signal
    case $variant in
    "") ;;
    no-preempt-user-signal) ctld_params= ;;
    *) die "unknown config variant '$variant' (known: no-preempt-user-signal)" ;;
    esac
    host=$(hostname -s)
    mkdir -p "$DIR"/{state,log,run,munge}
    for n in "${ALL_NODES[@]}"; do mkdir -p "$DIR/spool/$n" "$DIR/tmp/$n"; done
    cat >"$CONF.tmp" <<EOF
# Written by slurm/local-cluster.sh; rewritten on every \`up\`.
# Variant: ${variant:-none}
ClusterName=rekindle-local
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET,cred_expire=10
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
# One TmpFS per node: PMIx creates its step directory there on every node, and
# two nodes of one machine sharing /tmp collide ("File exists").
TmpFS=$DIR/tmp/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MailProg=/bin/true
SlurmdTimeout=10
MessageTimeout=5
SlurmctldTimeout=30
InactiveLimit=0
KillWait=$KILLWAIT
MinJobAge=600
ReturnToService=2
SchedulerParameters=sched_interval=2,bf_interval=2
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
${ctld_params:+SlurmctldParameters=$ctld_params}
$(node_lines "$host")
PartitionName=low Nodes=$(nodes_csv "${NODES[@]}") Default=YES PriorityTier=1 PreemptMode=REQUEUE GraceTime=$GRACE MaxTime=INFINITE State=UP
PartitionName=high Nodes=$(nodes_csv "${NODES[@]}") PriorityTier=10 PreemptMode=OFF MaxTime=INFINITE State=UP
PartitionName=wide Nodes=$(nodes_csv "${WIDE_NODES[@]}") PriorityTier=1 PreemptMode=OFF MaxTime=INFINITE State=UP
EOF
    if cmp -s "$CONF.tmp" "$CONF"; then
        rm -f "$CONF.tmp"
        return 1
    fi
    mv "$CONF.tmp" "$CONF"
}

# The SlurmctldParameters the running controller uses.
ctld_params() { clients scontrol show config 2>/dev/null | sed -n 's/^SlurmctldParameters *= *//p'; }

# Has the running daemons reread slurm.conf; waits until the controller
# shows the SlurmctldParameters written there.
reread_conf() {
    local want
    want=$(sed -n 's/^SlurmctldParameters=//p' "$CONF")
    clients scontrol reconfigure || die "scontrol reconfigure failed: see $DIR/log/slurmctld.log"
    for _ in $(seq 100); do
        [[ $(ctld_params) == "${want:-(null)}" ]] && return 0
        sleep 0.1
    done
    die "the controller still shows SlurmctldParameters=$(ctld_params), not ${want:-(null)}"
}

start_munged() {
    if live_pid "$DIR/munge/munged.pid" >/dev/null; then return 0; fi
    if [[ ! -s $DIR/munge/munge.key ]]; then
        if command -v mungekey >/dev/null; then
            mungekey -c -f -k "$DIR/munge/munge.key" >/dev/null
        else
            dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
        fi
    fi
    chmod 700 "$DIR/munge"
    chmod 600 "$DIR/munge/munge.key"
    munged --force --socket="$MUNGE_SOCKET" --key-file="$DIR/munge/munge.key" \
        --pid-file="$DIR/munge/munged.pid" --log-file="$DIR/munge/munged.log" \
        --seed-file="$DIR/munge/munged.seed" || die "munged did not start: see $DIR/munge/munged.log"
    for _ in $(seq 50); do
        munge -n -S "$MUNGE_SOCKET" 2>/dev/null | unmunge -S "$MUNGE_SOCKET" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    die "munged does not answer on $MUNGE_SOCKET"
}

start_slurmctld() {
    if live_pid "$DIR/run/slurmctld.pid" >/dev/null; then return 0; fi
    # -c: a fresh controller forgets the jobs of an earlier cluster.
    slurmctld -c -f "$CONF" || die "slurmctld did not start: see $DIR/log/slurmctld.log"
}

start_slurmd() {
    local n=$1
    if live_pid "$DIR/run/slurmd-$n.pid" >/dev/null; then return 0; fi
    slurmd -N "$n" -f "$CONF" || die "slurmd -N $n did not start: see $DIR/log/slurmd-$n.log"
}

clients() { SLURM_CONF=$CONF "$@"; }

wait_idle() {
    local deadline=$((SECONDS + ${1:-60})) out
    while ((SECONDS < deadline)); do
        # A node in two partitions is listed once for each.
        out=$(clients sinfo -h -N -o '%N %t' 2>/dev/null | sort -u || true)
        if [[ $(grep -cE '^[nw][0-9]+ idle$' <<<"$out") == "${#ALL_NODES[@]}" ]]; then return 0; fi
        # A node that was down and came back may need a nudge.
        for n in "${ALL_NODES[@]}"; do
            if grep -qE "^$n (down|drain|drng|fail)" <<<"$out"; then
                clients scontrol update nodename="$n" state=resume >/dev/null 2>&1 || true
            fi
        done
        sleep 0.5
    done
    log "nodes did not become idle within ${1:-60}s:"
    clients sinfo -N >&2 || true
    return 1
}

cmd_up() {
    install_packages
    # A controller still running a variant (a drill interrupted) gets the
    # usual config back.
    if write_conf && live_pid "$DIR/run/slurmctld.pid" >/dev/null; then
        log "slurm.conf changed: the running daemons reread it"
        reread_conf
    fi
    start_munged
    start_slurmctld
    for n in "${ALL_NODES[@]}"; do start_slurmd "$n"; done
    wait_idle 90 || die "see the logs in $DIR/log"
    log "up: nodes ${ALL_NODES[*]} idle; partitions low (default) and high (${NODES[*]}), wide (${WIDE_NODES[*]}); folder $DIR"
    log "use it from a shell with: eval \"\$($0 env)\""
}

# Stops the process in a pid file (only if alive), waiting for it to go.
stop_pidfile() {
    local f=$1 name=$2 pid
    pid=$(live_pid "$f") || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do
        kill -0 "$pid" 2>/dev/null || { rm -f "$f"; log "stopped $name (pid $pid)"; return 0; }
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$f"
    log "killed $name (pid $pid)"
}

cmd_down() {
    [[ -d $DIR ]] || { log "nothing to stop ($DIR does not exist)"; return 0; }
    # Jobs of this cluster keep running under their slurmstepd after slurmd
    # stops, so end them first (they are ours: this cluster is private).
    if live_pid "$DIR/run/slurmctld.pid" >/dev/null; then
        local jobs
        jobs=$(clients squeue -h -o %A 2>/dev/null || true)
        if [[ -n $jobs ]]; then
            log "cancelling jobs: $(tr '\n' ' ' <<<"$jobs")"
            clients scancel $jobs 2>/dev/null || true
            local deadline=$((SECONDS + KILLWAIT + 10))
            while ((SECONDS < deadline)) && [[ -n $(clients squeue -h -t R,CG -o %A 2>/dev/null || true) ]]; do
                sleep 0.5
            done
        fi
    fi
    for n in "${ALL_NODES[@]}"; do stop_pidfile "$DIR/run/slurmd-$n.pid" "slurmd $n"; done
    stop_pidfile "$DIR/run/slurmctld.pid" slurmctld
    stop_pidfile "$DIR/munge/munged.pid" munged
}

cmd_status() {
    local rc=0 f name pid n pidfiles=("$DIR/munge/munged.pid" "$DIR/run/slurmctld.pid")
    for n in "${ALL_NODES[@]}"; do pidfiles+=("$DIR/run/slurmd-$n.pid"); done
    for f in "${pidfiles[@]}"; do
        name=$(basename "$f" .pid)
        if pid=$(live_pid "$f"); then echo "$name: running (pid $pid)"; else echo "$name: stopped"; rc=1; fi
    done
    echo "folder: $DIR"
    if [[ $rc == 0 ]]; then
        clients sinfo -N -o '%N %P %t' || rc=1
        clients squeue -o '%A %P %j %T %R %N' || rc=1
    fi
    return $rc
}

cmd_reconfigure() {
    live_pid "$DIR/run/slurmctld.pid" >/dev/null || die "the cluster is not up (slurm/local-cluster.sh up)"
    write_conf "${1:-}" || true
    reread_conf
    log "reconfigured: ${1:-the usual config}; SlurmctldParameters=$(ctld_params)"
}

case ${1:-} in
up) cmd_up ;;
reconfigure) cmd_reconfigure "${2:-}" ;;
down) cmd_down ;;
status) cmd_status ;;
env) printf 'export SLURM_CONF=%q\n' "$CONF" ;;
dir) printf '%s\n' "$DIR" ;;
*)
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
