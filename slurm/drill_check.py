#!/usr/bin/env python3
"""Judges one drill of slurm/drill.sh from what it left behind.

Reads the run's events.jsonl, the job's final state (as drill.sh saw it with
scontrol), the bare repository the attempts published to, and the reference
run; prints one PASS/FAIL line and a one-line JSON summary on stdout, writes
the summary to --out, and exits 0 on PASS, 1 on FAIL. Standard library only.
"""

import argparse
import json
import math
import os
import subprocess
import sys


# Drills that end the first attempt with a graceful stop (a checkpoint of the
# current step); those after which rekindle requeues the job itself; those
# whose signal reaches only the batch shell, which forwards it to the step.
GRACEFUL = ("term", "term-batch", "term-full", "usr1", "warn", "warn-batch", "timelimit", "preempt",
            "preempt-nosignal", "cancel", "dp", "dp-preempt", "own", "dp-straggler")
REQUEUED_BY_REKINDLE = ("term", "term-batch", "term-full", "usr1", "warn", "warn-batch", "timelimit",
                        "preempt-nosignal", "dp", "own", "dp-straggler")
FORWARDED = ("term-batch", "term-full", "warn-batch", "timelimit")
# The hold rekindle puts on a job requeued after its first transient crash
# (src/attempt/crash.rs, FIRST_HOLD).
FIRST_CRASH_HOLD_SECONDS = 60
# A node lost under a run with the node-local tier: the batch shell restarts
# the run inside the job (docs/recovery.md). With a spare node the world keeps
# its two ranks; without one it goes on at one.
# dp-nodeloss-wide is dp-nodeloss-injob at 16 ranks, two a node, on eight
# nodes and a spare: the same bounds at eight times the world.
INJOB = ("dp-nodeloss-injob", "dp-nodeloss-injob-nospare", "dp-rankkill-injob", "dp-nodeloss-wide")
# Of them, those holding a spare node (the world keeps all its ranks).
INJOB_SPARE = ("dp-nodeloss-injob", "dp-rankkill-injob", "dp-nodeloss-wide")
# The bounds of docs/drills.md for them: steps lost at most two local
# intervals (the interval, plus one local save in flight when the node died:
# 10 steps at every 5) plus the steps trained in LOCAL_COMMIT_SECONDS, the
# longest a local copy of the drills' state may take from its step to the
# world's commit (every node writes, then agrees: 0.05-0.2 s here, 0.6 s
# once under load); a constant of the drills, never measured from the run
# being judged, and every commit is checked against it too. Training again
# at most INJOB_RETRAIN_SECONDS after the kill.
INJOB_LOST_INTERVALS = 2
LOCAL_COMMIT_SECONDS = 1.0
INJOB_RETRAIN_SECONDS = 30.0
# What "every sample of the epoch once" compares between a run that changed
# its world size and one that did not (state.json's `train`): where the data
# stands and what was consumed. Not `counters.clipped`: whether a step's
# gradient norm crossed the clip threshold depends on the float summation
# order, which another world size changes (docs/distributed.md).
SAMPLE_KEYS = ("step", "epoch", "cursor", "counters.samples", "counters.batches", "counters.tokens",
               "optimizer_step")


def read_events(run_dir):
    events = []
    try:
        with open(os.path.join(run_dir, "events.jsonl"), encoding="utf-8") as f:
            for line in f:
                try:
                    events.append(json.loads(line))
                except ValueError:
                    pass  # a torn last line of a killed attempt
    except OSError:
        pass
    return events


def split_attempts(events):
    """One entry per attempt: its start event and what followed. An attempt
    whose node failed its health check has no `start`: its first
    `node_unhealthy` starts it (the ranks of one attempt that fail together,
    with the same `launch`, are one attempt)."""
    attempts = []
    for ev in events:
        name = ev.get("event")
        unhealthy_again = (name == "node_unhealthy" and attempts
                           and attempts[-1]["start"].get("event") == "node_unhealthy"
                           and attempts[-1]["start"].get("launch") == ev.get("launch"))
        if name == "start" or (name == "node_unhealthy" and not unhealthy_again):
            attempts.append({"start": ev, "events": []})
        elif attempts:
            attempts[-1]["events"].append(ev)
    return attempts


def excluded_checks(att, node, exc_node_list):
    """(name, ok, detail) pairs: the attempt's `nodes_excluded` added `node`
    to the requeued job's exclusions, and scontrol showed it there."""
    x = first(att, "nodes_excluded") or {}
    shown = [n for n in (exc_node_list or "").split(",") if n]
    return [
        (f"rekindle excluded {node} from the requeued job",
         x.get("added") == [node] and x.get("how") == "requeue" and node in (x.get("excluded") or [])
         and not x.get("error"), f"nodes_excluded {json.dumps(x)}"),
        (f"scontrol show job lists {node} in ExcNodeList", node in shown, f"ExcNodeList={exc_node_list!r}"),
    ]


def badnode_checks(attempts, extra):
    """(name, ok, detail) pairs of the badnode drill: the attempt on the bad
    node ended at its health check, untrained; the job was requeued without
    it, trained elsewhere, and `rekindle status` says why."""
    bad = extra.get("bad_node")
    att0 = attempts[0] if attempts else {"start": {}, "events": []}
    u = att0["start"]
    out = [("the first attempt ended at the health check of the bad node, untrained",
            u.get("event") == "node_unhealthy" and u.get("node") == bad and u.get("check") == "site command"
            and f"{bad} fails its site check" in (u.get("detail") or "")
            and first(att0["events"], "checkpoint_saved") is None,
            f"first attempt's first event: {json.dumps({k: u.get(k) for k in ('event', 'node', 'check', 'detail')})}")]
    req = first(att0["events"], "requeue") or {}
    out.append(("rekindle requeued the job after the failed check",
                req.get("decision") == "requeue" and req.get("answer") in ("requeued", "already_pending"),
                json.dumps(req)))
    out.extend(excluded_checks(att0["events"], bad, extra.get("exc_node_list")))
    later = [att["start"].get("node") for att in attempts[1:]]
    out.append(("every later attempt trained on another node", bool(later) and bad not in later,
                f"later attempts on {later}"))
    status = extra.get("status") or ""
    out.append(("rekindle status says why the node was left",
                f"unhealthy {bad} failed `site command`" in status and f"excluded  {bad} (" in status,
                status.strip().replace("\n", " | ")[-300:]))
    return out


def straggler_checks(attempts, extra):
    """(name, ok, detail) pairs of the dp-straggler drill: one `straggler`
    event, naming rank 1 and the node it ran on, blamed; the requeue left
    that node behind and no later attempt ran there."""
    att0 = attempts[0] if attempts else {"start": {}, "events": []}
    slow = extra.get("slow_node")
    ranks = att0["start"].get("rank_nodes") or []
    found = [e for att in attempts for e in att["events"] if e.get("event") == "straggler"]
    s = found[0] if found else {}
    out = [("one straggler event, naming rank 1 and its node, blamed",
            len(found) == 1 and s.get("rank") == 1 and s.get("rank_node") == slow and len(ranks) == 2
            and ranks[1] == slow and s.get("blamed") is True and s.get("world_size") == 2
            and (s.get("step_seconds") or 0) > (s.get("factor") or 1.5) * (s.get("median_seconds") or 1),
            f"{len(found)} straggler event(s): {json.dumps(s)}; first attempt's rank nodes {ranks}")]
    out.extend(excluded_checks(att0["events"], slow, extra.get("exc_node_list")))
    later = [n for att in attempts[1:] for n in (att["start"].get("rank_nodes") or [])]
    out.append(("no later attempt ran on the straggler's node", bool(later) and slow not in later,
                f"later rank nodes {later}, straggler's node {slow}"))
    return out


def preempt_nosignal_checks(attempts, extra):
    """(name, ok, detail) pairs of the preempt-nosignal drill: preemption
    without preempt_send_user_signal. The job asks for --signal=USR1@120, so
    what rekindle recorded tells what SLURM did: the first attempt's stop
    event names SIGTERM (USR1 would mean the parameter was still on, or that
    rekindle stopped on the job's own signal), no attempt recorded a stop on
    SIGUSR1, and the requeue decision saw the job being preempted
    (PreemptTime set). The job's --signal is the drill's own setting, not
    evidence: it is reported, never judged."""
    params = extra.get("slurmctld_parameters") or {}
    stops = [first(att["events"], "stop") for att in attempts]
    stop0 = stops[0] if stops else None
    req = (stop0 or {}).get("requeue") or {}
    usr1 = [i for i, s in enumerate(stops) if s and s.get("reason") == "SIGUSR1"]
    return [
        ("the controller ran the drill without preempt_send_user_signal",
         "during" in params and "preempt_send_user_signal" not in params["during"],
         f"SlurmctldParameters during the drill: {params.get('during')!r}"),
        ("rekindle's first stop was on SIGTERM as preemption began, and none on the job's --signal (USR1)",
         stop0 is not None and stop0.get("reason") == "SIGTERM" and not usr1,
         f"first attempt's stop: {json.dumps({k: (stop0 or {}).get(k) for k in ('reason', 'step')})}; "
         f"attempts that stopped on SIGUSR1: {usr1}; job --signal={extra.get('job_signal')}"),
        ("rekindle requeued the job inside GraceTime (PreemptTime set)",
         "being preempted" in (req.get("reason") or ""), json.dumps(req)),
        ("the cluster's config was restored", params.get("after") == params.get("before"),
         f"SlurmctldParameters before {params.get('before')!r}, after {params.get('after')!r}"),
    ]


def noprogress_checks(attempts, state, exit_code, restarts, extra):
    """(name, ok, detail) pairs of the noprogress drill: the configured number
    of attempts trained and crashed before a checkpoint, then the progress
    guard ended the job with exit 79 instead of another restart."""
    most = extra.get("max_attempts_without_progress")
    errors = [first(att["events"], "error") or {} for att in attempts]
    out = [("the job ended FAILED with the progress guard's exit code 79",
            state == "FAILED" and exit_code == "79:0", f"JobState={state} ExitCode={exit_code}"),
           (f"exactly max_attempts_without_progress = {most} attempts trained, each ending in a transient crash",
            most is not None and len(attempts) == most and all(e.get("class") == "transient" for e in errors),
            f"{len(attempts)} attempts; errors {[e.get('class') for e in errors]}"),
           ("no checkpoint was committed", not any(e.get("event") == "checkpoint_saved"
                                                    for att in attempts for e in att["events"]), "")]
    last = attempts[-1]["events"][-1] if attempts and attempts[-1]["events"] else {}
    message = last.get("error") or ""
    out.append(("the attempt after them did not train: its error names the attempts and is not requeued",
                last.get("event") == "error" and f"{most} attempts of job " in message
                and "in a row committed no newer checkpoint" in message
                and message.count("error: ") >= (most or 1)
                and (last.get("requeue") or {}).get("decision") == "skip",
                f"last event {json.dumps({k: last.get(k) for k in ('event', 'error', 'requeue')})[:400]}"))
    out.append(("never requeued (restarted in the job, stopped by the guard, not by max_restarts)",
                restarts == 0, f"Restarts={restarts}"))
    return out


def first(events, name):
    return next((e for e in events if e.get("event") == name), None)


# The bound on the steps a lost node costs (docs/drills.md, "What a lost node
# costs"): one interval, plus the steps trained while saves were in flight.
# Those are bounded by time: a save that falls due while the previous one is
# still being written waits for that one, and the save lost with the node
# was in flight at most as long as a save may take. How long a save may take
# is a constant of the drills, SAVE_SECONDS, never measured from the run
# being judged (a product that got slower would otherwise widen its own
# bound): the drills' state is a few hundred KiB, which this machine saves in
# 0.05-0.25 s (docs/drills.md). So: the resumed save and the lost one took at
# most SAVE_SECONDS each, and SLACK_SECONDS more of steps cover the step in
# progress and the scheduling noise of a loaded machine. Every recorded save
# is also checked to have taken at most SAVE_SECONDS. Times become steps at
# the killed attempt's own pace (metrics.jsonl, a line per step).
SAVE_SECONDS = 1.0
SLACK_SECONDS = 1.0
# The pace is the faster of the whole attempt's and that of its last seconds.
PACE_WINDOW_SECONDS = 3.0


def read_jsonl(path):
    """Every JSON object of a JSON-lines file ([] if unreadable; torn lines skipped)."""
    records = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    records.append(json.loads(line))
                except ValueError:
                    pass
    except OSError:
        pass
    return records


def attempt_metrics(metrics, attempts, i):
    """The metrics lines attempt i wrote: those timed between its start and the next attempt's."""
    if i >= len(attempts):
        return []
    lo = iso_to_unix(attempts[i]["start"]["time"])
    hi = iso_to_unix(attempts[i + 1]["start"]["time"]) if i + 1 < len(attempts) else float("inf")
    return [m for m in metrics if "step" in m and "time" in m and lo <= iso_to_unix(m["time"]) < hi]


def pace(metrics):
    """Steps per second of one attempt's metrics lines: the faster of the whole
    attempt's and its last PACE_WINDOW_SECONDS' (None with fewer than 2 lines)."""
    timed = sorted((iso_to_unix(m["time"]), m["step"]) for m in metrics)
    rates = []
    for lines in (timed, [x for x in timed if timed and x[0] >= timed[-1][0] - PACE_WINDOW_SECONDS]):
        if len(lines) >= 2 and lines[-1][0] > lines[0][0]:
            rates.append((lines[-1][1] - lines[0][1]) / (lines[-1][0] - lines[0][0]))
    return max(rates) if rates else None


def steps_in(rate, seconds):
    """The steps trained in `seconds` at `rate` steps/s, rounded up (after
    rounding away the float noise of a pace read from millisecond times)."""
    return math.ceil(round(rate * seconds, 3))


def node_loss_checks(attempts, resumed_from, lost, killed_metrics, every):
    """The checks of the steps a lost node cost: (name, ok, detail) each.

    The killed attempt is attempts[0], resumed_from and lost are the next
    attempt's `resume` (step, steps_lost), killed_metrics the killed attempt's
    metrics lines."""
    if lost is None or resumed_from is None:
        return [("steps lost within the bound", False, f"no resume event (from {resumed_from}, lost {lost})")]
    att0 = attempts[0]["events"] if attempts else []
    in_flight = [e for e in att0 if e.get("event") == "checkpoint_started" and e.get("step", -1) > resumed_from]
    if not in_flight:
        return [("steps lost at most one checkpoint interval (no save in flight)", 0 <= lost <= every,
                 f"{lost} <= {every}")]
    s = in_flight[0]
    last = resumed_from + lost
    due, snap = s.get("due_step", s["step"]), s["step"]
    saved = [e for att in attempts for e in att["events"]
             if e.get("event") == "checkpoint_saved" and e.get("kind") == "periodic"
             and e.get("persist_seconds") is not None]
    slowest = max((e["persist_seconds"] for e in saved), default=None)
    rate = pace(killed_metrics)
    out = [
        ("at most one save in flight when the node died", len(in_flight) == 1,
         f"started but not committed: {[e.get('step') for e in in_flight]}"),
        ("the lost save fell due within one interval of the resumed checkpoint", 0 < due - resumed_from <= every,
         f"resumed from {resumed_from}, lost save due at {due}, snapshotted at {snap}, interval {every}"),
        (f"every recorded periodic save persisted within {SAVE_SECONDS:g} s",
         slowest is not None and slowest <= SAVE_SECONDS,
         f"the slowest of {len(saved)} recorded saves took {slowest} s"),
    ]
    if rate is None:
        out.append(("steps lost within the bound", False,
                    f"cannot bound them: no pace from {len(killed_metrics)} metrics lines"))
        return out
    seconds = 2 * SAVE_SECONDS + SLACK_SECONDS
    bound = every + steps_in(rate, seconds)
    out.append((
        "steps lost at most one interval + the steps trained while saves were in flight",
        0 <= lost <= bound,
        f"{lost} lost <= {bound} = {every} (interval) + {rate:.1f} steps/s x (2 x {SAVE_SECONDS:g} s, the resumed "
        f"save and the lost one at most, + {SLACK_SECONDS:g} s slack); {lost} = {due - resumed_from} before the "
        f"lost save fell due + {snap - due} while the previous save was still being written + {last - snap} "
        f"while the save of step {snap} was"))
    return out


def in_job_attempts(attempts):
    """How many attempts started inside the same allocation as the one before
    (the batch shell's in-job restarts: `start` with in_job_restart > 0)."""
    return sum(1 for att in attempts if (att["start"].get("in_job_restart") or 0) > 0)


def hang_injob_checks(attempts, resumes, extra):
    """The checks of the hang-injob drill: (name, ok, detail) each. The hung
    attempt asked the batch shell for a new step without its node (no
    requeue), and the next attempt ran on the other node of the same
    allocation from the checkpoint the stop named."""
    out = []
    att0 = attempts[0]["events"] if attempts else []
    stop = first(att0, "stop") or {}
    newest = max((e.get("step") for e in att0 if e.get("event") == "checkpoint_saved"), default=None)
    req = stop.get("requeue") or {}
    out.append(("the hung attempt stopped at its newest checkpoint and asked for an in-job restart, not a requeue",
                stop.get("reason") == "hang: step" and stop.get("step") == newest and newest is not None
                and req.get("decision") == "skip" and "in-job restart 1 of" in (req.get("reason") or ""),
                f"stop {json.dumps({k: stop.get(k) for k in ('reason', 'step', 'requeue')})}, newest checkpoint {newest}"))
    hung_node = attempts[0]["start"].get("node") if attempts else None
    excluded = first(att0, "nodes_excluded") or {}
    out.append(("the hung node is left out of the next step",
                excluded.get("how") == "in_job" and excluded.get("added") == [hung_node] and hung_node is not None,
                f"nodes_excluded {json.dumps(excluded)}, hung on {hung_node}"))
    s1 = attempts[1]["start"] if len(attempts) > 1 else {}
    out.append(("the next attempt is in-job restart 1, on the other node",
                s1.get("in_job_restart") == 1 and s1.get("node") not in (None, hung_node),
                f"start: in_job_restart {s1.get('in_job_restart')}, node {s1.get('node')}, hung on {hung_node}"))
    res = resumes[0] if resumes else {}
    at = extra.get("fail_after_step")
    out.append(("it resumed from the checkpoint the stop named, losing exactly the steps since it",
                res.get("from_step") is not None and res.get("from_step") == stop.get("step") and at is not None
                and res.get("steps_lost") == at - res["from_step"],
                f"stop at {stop.get('step')}, attempt 0 hung after step {at}; resume: {res}"))
    return out


def rank_lost_check(att0, killed_node, lost_ranks=(1,)):
    """(name, ok, detail): rank 0 found the ranks on the killed node
    (`lost_ranks`: rank 1 in a world of one rank a node) silent for at least
    the timeout and less than three times it, each once, and no other rank."""
    found = [e for e in att0 if e.get("event") == "rank_lost"]
    want = sorted(lost_ranks)
    names = "rank 1" if want == [1] else f"ranks {', '.join(map(str, want))}"
    ok = bool(found) and sorted(e.get("rank") for e in found) == want and all(
        e.get("rank_node") == killed_node and e.get("noticed_by") == 0
        and e.get("silent_seconds", 0) >= e.get("timeout_seconds", 1)
        and e.get("silent_seconds", 1e9) < 3 * e.get("timeout_seconds", 0) for e in found)
    detail = "; ".join(f"rank_lost {json.dumps(e)}" for e in found) or "no rank_lost event"
    return (f"rank 0 found {names} lost on the killed node within the timeout", ok,
            f"{detail}, killed node {killed_node}")


def injob_checks(attempts, metrics, extra, restarts, spare, job_output):
    """The checks of an in-job drill (dp-nodeloss-injob[-nospare], dp-rankkill-injob): (name, ok,
    detail) each. attempts from split_attempts, metrics the run's
    metrics.jsonl lines, extra drill.sh's facts (killed_node, kill_time,
    local_every), restarts SLURM's Restarts, spare whether a spare node was
    held, job_output the job's output file's text."""
    out = []
    killed = extra.get("killed_node")
    # The first world: `world` ranks, `per_node` a node (two ranks on two
    # nodes unless the drill says), and the rank whose node was killed.
    world, per_node, lost_rank = extra.get("world", 2), extra.get("per_node", 1), extra.get("lost_rank", 1)
    nodes = world // per_node
    out.append(("never requeued: SLURM's Restarts=0", restarts == 0, f"Restarts={restarts}"))
    att0 = attempts[0] if attempts else {"start": {}, "events": []}
    att1 = attempts[1] if len(attempts) > 1 else None
    s0 = att0["start"]
    ranks0 = s0.get("rank_nodes") or []
    on_killed = [r for r, n in enumerate(ranks0) if n == killed]
    out.append((f"attempt 0 trained over {world} ranks on {nodes} nodes, rank {lost_rank} on the killed node",
                s0.get("world_size") == world and len(ranks0) == world and len(set(ranks0)) == nodes
                and ranks0[lost_rank:lost_rank + 1] == [killed] and len(on_killed) == per_node,
                f"world_size {s0.get('world_size')}, rank_nodes {ranks0}, killed {killed}"))
    out.append(rank_lost_check(att0["events"], killed, on_killed or [lost_rank]))
    out.append(("no checkpoint of the current step after the loss (the world cannot agree on one)",
                not any(e.get("event") == "checkpoint_saved" and e.get("kind") == "stop" for e in att0["events"]), ""))
    if att1 is None:
        out.append(("the run went on in the job", False, f"{len(attempts)} attempt(s)"))
        return out
    s1 = att1["start"]
    out.append(("the next attempt is in-job restart 1 of the same allocation", s1.get("in_job_restart") == 1,
                f"start: in_job_restart {s1.get('in_job_restart')}"))
    # A world of one records no world_size or rank_nodes: its node is the start's.
    size1 = s1.get("world_size") or 1
    ranks1 = s1.get("rank_nodes") or ([s1["node"]] if size1 == 1 and s1.get("node") else [])
    want, want_nodes = (world, nodes) if spare else (world - per_node, nodes - 1)
    out.append((f"it went on over {want} rank(s) on {want_nodes} node(s) other than the killed one",
                size1 == want and len(set(ranks1)) == want_nodes and killed not in ranks1,
                f"world_size {size1}, rank_nodes {ranks1}, killed {killed}"))
    resume = first(att1["events"], "resume") or {}
    # The tier's promise is the newest state either tier holds: the local
    # copy, unless the durable checkpoint taken at the same moment is as new
    # (a loss right after a durable save: resuming from it loses less).
    # The local tier must have committed at least one copy either way.
    committed0 = [e.get("step") for e in att0["events"]
                  if e.get("event") == "local_checkpoint" and e.get("outcome") == "committed"]
    newest0 = max(committed0, default=None)
    durable_newer = (resume.get("tier") == "durable" and newest0 is not None and resume.get("step") is not None
                     and resume["step"] >= newest0)
    out.append(("resumed from the node-local tier (or a durable checkpoint at least as new as its newest copy)",
                resume.get("tier") == "local" or durable_newer,
                f"resume: {json.dumps({k: resume.get(k) for k in ('step', 'tier', 'source_node', 'fallback_reason')})}"
                f", newest committed local copy {newest0}"))
    rec = first(att1["events"], "recovery") or {}
    out.append(("a recovery event: in-job, from the tier it resumed from",
                rec.get("in_job") is True and rec.get("tier") == resume.get("tier") and rec.get("tier") is not None,
                f"recovery: {json.dumps(rec)}"))
    # Steps lost, by every record that counts them: the last step the killed
    # attempt logged (metrics.jsonl, a line per step; lines not yet written
    # when the step was aborted are missing) against the step the next one
    # resumed from, and rekindle's own counts (`resume`, `recovery`). The
    # largest must be within the bound, and none may be missing.
    m0, m1 = attempt_metrics(metrics, attempts, 0), attempt_metrics(metrics, attempts, 1)
    last = max((m["step"] for m in m0), default=None)
    every = extra.get("local_every")
    bound = INJOB_LOST_INTERVALS * every if every else None
    counts = {"metrics": last - resume["step"] if last is not None and resume.get("step") is not None else None,
              "resume": resume.get("steps_lost"), "recovery": rec.get("steps_lost")}
    lost = max(counts.values()) if None not in counts.values() else None
    # The newest copy the world committed before the fault is the one used.
    committed = [e.get("step") for e in att0["events"]
                 if e.get("event") == "local_checkpoint" and e.get("outcome") == "committed"]
    newest = max(committed, default=None)
    out.append(("resumed from the newest local checkpoint committed before the fault",
                newest is not None and resume.get("step") is not None and resume["step"] >= newest,
                f"resumed from {resume.get('step')}, newest committed local checkpoint {newest}"))
    # A local save is committed some time after its step (every node writes,
    # then agrees): the steps trained meanwhile are lost with it too, at most
    # LOCAL_COMMIT_SECONDS of them at the killed attempt's pace. Each commit's
    # latency, from its step's metrics line, is held to the same constant.
    step_time = {m["step"]: iso_to_unix(m["time"]) for m in m0 if m.get("time")}
    latencies = [iso_to_unix(e["time"]) - step_time[e["step"]] for e in att0["events"]
                 if e.get("event") == "local_checkpoint" and e.get("outcome") == "committed"
                 and e.get("step") in step_time and e.get("time")]
    slowest = max(latencies, default=None)
    out.append((f"every local copy committed within {LOCAL_COMMIT_SECONDS:g} s of its step",
                slowest is not None and slowest <= LOCAL_COMMIT_SECONDS,
                f"the slowest of {len(latencies)} local commits came {slowest} s after its step's metrics line"))
    rate = pace(m0)
    if bound is not None and rate is not None:
        bound += steps_in(rate, LOCAL_COMMIT_SECONDS)
    out.append(("steps lost at most two local intervals + the steps trained while a local save commits",
                lost is not None and bound is not None and rate is not None and 0 <= min(counts.values())
                and lost <= bound,
                f"{lost} lost (metrics: last step logged {last}, resumed from {resume.get('step')}: "
                f"{counts['metrics']}; resume event {counts['resume']}; recovery event {counts['recovery']}) "
                f"<= {bound} = {INJOB_LOST_INTERVALS} x local every {every} + {rate or 0:.1f} steps/s x "
                f"{LOCAL_COMMIT_SECONDS:g} s (the longest a local commit may take)"))
    # Training again: the kill to the first step the next attempt trained.
    kill = extra.get("kill_time")
    again = min((iso_to_unix(m["time"]) for m in m1), default=None)
    seconds = round(again - kill, 1) if again is not None and kill is not None else None
    out.append((f"trained again within {INJOB_RETRAIN_SECONDS:g} s of the kill",
                seconds is not None and 0 <= seconds <= INJOB_RETRAIN_SECONDS,
                f"first step of attempt 1 {seconds} s after the kill (recovery_seconds "
                f"{rec.get('recovery_seconds')})"))
    out.append(("the batch shell logged the in-job restart", "in-job restart 1/" in (job_output or ""),
                "an `in-job restart 1/M` line in the job output"))
    return out


def train_state(step_dir):
    """state.json's `train` of a checkpoint ({} if unreadable)."""
    try:
        with open(os.path.join(step_dir, "state.json"), encoding="utf-8") as f:
            return json.load(f).get("train") or {}
    except (OSError, ValueError):
        return {}


def sample_position(train):
    """SAMPLE_KEYS of a `train` state, dotted keys looked up in nested objects."""
    out = {}
    for key in SAMPLE_KEYS:
        value = train
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        out[key] = value
    return out


def commits(bare, branch):
    try:
        out = subprocess.run(
            ["git", "--git-dir", bare, "log", "--format=%s", branch],
            capture_output=True, text=True, check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return []
    return [line for line in out.splitlines() if line]


def same_bytes(a, b):
    try:
        with open(a, "rb") as fa, open(b, "rb") as fb:
            return fa.read() == fb.read()
    except OSError:
        return False


def tensors(path):
    """A safetensors file's tensors: name -> (dtype, shape, bytes); {} if unreadable."""
    try:
        with open(path, "rb") as f:
            data = f.read()
        n = int.from_bytes(data[:8], "little")
        header = json.loads(data[8:8 + n])
    except (OSError, ValueError):
        return {}
    body = data[8 + n:]
    return {name: (t["dtype"], t["shape"], body[t["data_offsets"][0]:t["data_offsets"][1]])
            for name, t in header.items() if name != "__metadata__"}


def optimizer_state(step_dir):
    """The optimizer state of a checkpoint, name -> (dtype, shape, bytes): from
    optimizer.safetensors, or, for a sharded optimizer, each moment's pieces
    joined in rank order from optimizer.rank-<r>-of-<n>.safetensors, with its
    parameter's shape (docs/checkpoint-format.md, Optimizer state in parts)."""
    whole = os.path.join(step_dir, "optimizer.safetensors")
    if os.path.exists(whole):
        return tensors(whole)
    parts = sorted(f for f in os.listdir(step_dir) if f.startswith("optimizer.rank-")) if os.path.isdir(step_dir) else []
    if not parts:
        return {}
    pieces = [tensors(os.path.join(step_dir, f)) for f in parts]
    state = {}
    for param, (_, shape, _) in tensors(os.path.join(step_dir, "model.safetensors")).items():
        for name in (f"exp_avg.{param}", f"exp_avg_sq.{param}"):
            held = [p[name] for p in pieces if name in p]
            state[name] = (held[0][0] if held else None, shape, b"".join(t[2] for t in held))
    return state


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--drill", required=True)
    p.add_argument("--run", required=True, help="run directory")
    p.add_argument("--job", required=True, help="job id")
    p.add_argument("--state", default="", help="final JobState")
    p.add_argument("--restarts", type=int, default=-1)
    p.add_argument("--exit-code", default="")
    p.add_argument("--repo", required=True, help="bare repository published to")
    p.add_argument("--branch", default="main")
    p.add_argument("--reference", default="", help="run directory of the uninterrupted reference run")
    p.add_argument("--max-steps", type=int, required=True)
    p.add_argument("--every", type=int, required=True, help="checkpoint.every_steps")
    p.add_argument("--grace", type=float, required=True, help="seconds from signal to SIGKILL")
    p.add_argument("--action-time", type=float, default=None, help="unix time the drill acted")
    p.add_argument("--seconds", type=float, required=True, help="drill wall time")
    p.add_argument("--verify-rc", type=int, default=None, help="exit code of `rekindle verify`")
    p.add_argument("--extra", default="{}", help="JSON object of drill-specific facts")
    p.add_argument("--note", action="append", default=[], help="a failure drill.sh saw itself")
    p.add_argument("--job-output", default="", help="the job's output file (orchestrator.slurm's lines)")
    p.add_argument("--out", default="")
    a = p.parse_args()
    extra = json.loads(a.extra)

    events = read_events(a.run)
    attempts = split_attempts(events)
    nodes = [att["start"].get("node") for att in attempts]
    stops, resumes = [], []
    for i, att in enumerate(attempts):
        stop = first(att["events"], "stop")
        if stop:
            req = stop.get("requeue") or {}
            stops.append({
                "attempt": i,
                "node": stop.get("node"),
                "signal": stop.get("reason"),
                "step": stop.get("step"),
                "seconds_to_durable_checkpoint": stop.get("seconds_to_durable_checkpoint"),
                "seconds_left": stop.get("seconds_left"),
                "requeue": {k: req.get(k) for k in ("decision", "answer", "reason", "error") if req.get(k)},
                "published": bool((stop.get("publish") or {}).get("pushed")),
            })
        res = first(att["events"], "resume")
        if res:
            resumes.append({
                "attempt": i,
                "node": res.get("this_node"),
                "from_step": res.get("step"),
                "previous_node": res.get("previous_node"),
                "steps_lost": res.get("steps_lost"),
                "seconds_since_checkpoint": res.get("seconds_since_checkpoint"),
            })
    finish = next((e for e in events if e.get("event") == "finish"), None)
    saved = [(i, e.get("step")) for i, att in enumerate(attempts)
             for e in att["events"] if e.get("event") == "checkpoint_saved"]

    log = commits(a.repo, a.branch)
    checks = []

    def check(name, ok, detail=""):
        checks.append({"check": name, "ok": bool(ok), "detail": detail})

    for note in a.note:
        check("drill", False, note)

    graceful = [s for s in stops if s["signal"]]
    lost_bound = None  # the node-loss drills' check of the steps lost, as judged
    job_output = None
    if a.job_output:
        try:
            with open(a.job_output, encoding="utf-8", errors="replace") as f:
                job_output = f.read()
        except OSError:
            pass
    killed = extra.get("killed_attempts", 0)
    # Attempts that end without publishing: hung (the watchdog exits) or crashed (exit 1).
    unpublished = extra.get("unpublished_attempts", 0)
    expected_commits = len(attempts) - killed - unpublished
    check("publish: one commit per attempt that exited",
          len(log) == expected_commits and (expected_commits > 0 or a.drill == "noprogress"),
          f"{len(log)} commits for {len(attempts)} attempts ({killed} killed, {unpublished} ending unpublished)")

    if a.drill not in ("cancel", "noprogress"):
        check("finished", finish is not None and finish.get("step") == a.max_steps,
              f"finish event at step {finish.get('step') if finish else None} of {a.max_steps}")
        check("job COMPLETED", a.state == "COMPLETED" and a.exit_code in ("0:0", ""),
              f"JobState={a.state} ExitCode={a.exit_code}")
        check("resumed at least once", len(attempts) >= 2, f"{len(attempts)} attempts")
        # An in-job restart is an attempt without a requeue.
        in_job = in_job_attempts(attempts)
        check("SLURM restart count matches", a.restarts == len(attempts) - 1 - in_job,
              f"Restarts={a.restarts}, attempts={len(attempts)}, of them in-job restarts {in_job}")
        step_name = f"step-{a.max_steps:010d}"
        if a.reference and a.drill == "dp-nodeloss-injob-nospare":
            # At another world size the float sums differ, so not the bytes:
            # the data (docs/distributed.md: every sample of the epoch once).
            ours, theirs = (sample_position(train_state(os.path.join(d, "checkpoints", step_name)))
                            for d in (a.run, a.reference))
            check("every sample of the epoch once: the data position and counts equal two ranks never stopped",
                  ours == theirs and ours.get("step") == a.max_steps, f"{step_name}: {ours} vs {theirs}")
        elif a.reference:
            ours, theirs = (os.path.join(d, "checkpoints", step_name) for d in (a.run, a.reference))
            model = same_bytes(os.path.join(ours, "model.safetensors"), os.path.join(theirs, "model.safetensors"))
            # A sharded optimizer's state is in one part per rank: compared as joined.
            state = optimizer_state(ours)
            same = model and bool(state) and state == optimizer_state(theirs)
            parts = sum(f.startswith("optimizer.rank-") for f in os.listdir(ours)) if os.path.isdir(ours) else 0
            check("model and optimizer byte-identical to the uninterrupted run", same,
                  step_name + (f" (optimizer in {parts} parts, joined)" if parts else ""))
        # Every resume starts exactly where the previous attempt's newest durable checkpoint is.
        for r in resumes:
            prev_saved = [s for i, s in saved if i == r["attempt"] - 1]
            newest = max(prev_saved) if prev_saved else None
            # (>=: a killed attempt may have finished a background save it had no time to record)
            ok = r["from_step"] is not None and newest is not None and r["from_step"] >= newest
            check(f"attempt {r['attempt']} resumed from the newest checkpoint", ok,
                  f"resumed from {r['from_step']}, newest recorded by attempt {r['attempt'] - 1}: {newest}")

    if a.drill in GRACEFUL:
        s = graceful[0] if graceful else None
        want = "SIGUSR1" if a.drill == "usr1" else "SIGTERM"
        check(f"stopped on {want} with a checkpoint of the current step", s is not None and s["signal"] == want,
              f"first stop: {s}")
        if s:
            t = s["seconds_to_durable_checkpoint"]
            check("checkpoint durable within the grace period", t is not None and t < a.grace,
                  f"{t} s < {a.grace} s")
    if a.drill in GRACEFUL and a.drill != "cancel":
        for s in graceful:
            nxt = next((r for r in resumes if r["attempt"] == s["attempt"] + 1), None)
            check(f"attempt {s['attempt'] + 1} resumed from exactly the stopped step with 0 steps lost",
                  nxt is not None and nxt["from_step"] == s["step"] and nxt["steps_lost"] == 0,
                  f"stopped at {s['step']}, resumed: {nxt}")
    if a.drill in REQUEUED_BY_REKINDLE and graceful:
        req = graceful[0]["requeue"]
        check("rekindle requeued the job itself", req.get("decision") == "requeue"
              and req.get("answer") in ("requeued", "already_pending"), json.dumps(req))
    if a.drill in ("preempt", "preempt-nosignal", "nodeloss", "dp-preempt"):
        check("resumed on the other node", len(nodes) >= 2 and nodes[1] != nodes[0], f"nodes {nodes}")
    att0 = attempts[0]["events"] if attempts else []
    if a.drill == "preempt-nosignal":
        for name, ok, detail in preempt_nosignal_checks(attempts, extra):
            check(name, ok, detail)
    requeued = extra.get("requeued") or {}
    if a.drill in ("hang", "crash"):
        check("SLURM showed the job requeued: PENDING with Restarts=1",
              requeued.get("state") == "PENDING" and requeued.get("restarts") == 1,
              f"scontrol after the requeue: {json.dumps(requeued)}")
        res = resumes[0] if resumes else {}
        at = extra.get("fail_after_step")
        check("attempt 1 lost exactly the steps since the checkpoint it resumed from",
              at is not None and res.get("from_step") is not None and res.get("steps_lost") == at - res["from_step"],
              f"attempt 0 failed after step {at}; resume: {res}")
    if a.drill == "hang-injob":
        for name, ok, detail in hang_injob_checks(attempts, resumes, extra):
            check(name, ok, detail)
    if a.drill in ("hang", "hang-injob"):
        hang = first(att0, "hang") or {}
        limit = extra.get("limit_seconds")
        at = extra.get("fail_after_step")
        check("the watchdog caught the hung step within its limit",
              hang.get("activity") == "step" and hang.get("thread") == "training"
              and at is not None and hang.get("step") == at + 1 and hang.get("limit_seconds") == limit
              and limit <= (hang.get("stuck_seconds") or 0) <= limit + 10,
              f"hang {json.dumps(hang)}, step {at + 1 if at is not None else None} made to hang, limit {limit} s")
    if a.drill == "hang":
        stop = first(att0, "stop") or {}
        newest = max((e.get("step") for e in att0 if e.get("event") == "checkpoint_saved"), default=None)
        req = stop.get("requeue") or {}
        check("the hung attempt stopped at its newest checkpoint and requeued the job",
              stop.get("reason") == "hang: step" and stop.get("step") == newest and newest is not None
              and req.get("decision") == "requeue" and req.get("answer") in ("requeued", "already_pending"),
              f"stop {json.dumps({k: stop.get(k) for k in ('reason', 'step', 'requeue')})}, newest checkpoint {newest}")
        check("no checkpoint of the hung step (the training thread was the stuck one)",
              all(e.get("kind") == "periodic" for e in att0 if e.get("event") == "checkpoint_saved"), "")
        res = resumes[0] if resumes else {}
        check("attempt 1 resumed from the checkpoint the hung attempt's stop named",
              res.get("from_step") is not None and res.get("from_step") == stop.get("step"),
              f"stop at {stop.get('step')}, resume: {res}")
    if a.drill == "crash":
        err = first(att0, "error") or {}
        req = err.get("requeue") or {}
        at = extra.get("fail_after_step")
        check("the failed step was a transient crash, requeued and held back",
              err.get("class") == "transient" and err.get("step") == at and req.get("decision") == "requeue"
              and req.get("answer") in ("requeued", "already_pending")
              and err.get("hold_seconds") == FIRST_CRASH_HOLD_SECONDS and not err.get("hold_error"),
              f"error {json.dumps({k: err.get(k) for k in ('step', 'class', 'requeue', 'hold_seconds', 'hold_error')})}")
        crashed = iso_to_unix(err["time"]) if err.get("time") else None
        start = requeued.get("start_unix")
        check("SLURM holds the requeued job: Reason BeginTime, StartTime the hold after the crash",
              crashed is not None and start is not None and requeued.get("reason") == "BeginTime"
              and start >= crashed + FIRST_CRASH_HOLD_SECONDS - 2,
              f"StartTime {requeued.get('start_time')} = crash + "
              f"{round(start - crashed, 1) if start is not None and crashed is not None else None} s, "
              f"Reason {requeued.get('reason')}, hold {FIRST_CRASH_HOLD_SECONDS} s")
        again = iso_to_unix(attempts[1]["start"]["time"]) if len(attempts) > 1 else None
        check("attempt 1 started no earlier than the hold",
              again is not None and start is not None and crashed is not None and again >= start - 1
              and again >= crashed + FIRST_CRASH_HOLD_SECONDS - 2,
              f"attempt 1 started {round(again - crashed, 1) if again is not None and crashed is not None else None}"
              f" s after the crash (StartTime {requeued.get('start_time')})")
    if a.drill == "nodeloss":
        check("first attempt was killed (no stop event)", first(att0, "stop") is None, "")
    if a.drill == "badnode":
        for name, ok, detail in badnode_checks(attempts, extra):
            check(name, ok, detail)
    if a.drill == "dp-straggler":
        for name, ok, detail in straggler_checks(attempts, extra):
            check(name, ok, detail)
    if a.drill == "noprogress":
        for name, ok, detail in noprogress_checks(attempts, a.state, a.exit_code, a.restarts, extra):
            check(name, ok, detail)
    if a.drill == "dp-nodeloss":
        check(*rank_lost_check(att0, extra.get("killed_node")))
        for name, ok, detail in excluded_checks(att0, extra.get("killed_node"), extra.get("exc_node_list")):
            check(name, ok, detail)
        later = [n for att in attempts[1:] for n in (att["start"].get("rank_nodes") or [])]
        check("no later attempt ran on the lost node", bool(later) and extra.get("killed_node") not in later,
              f"later rank nodes {later}, lost {extra.get('killed_node')}")
        check("no checkpoint of the current step after the loss (the world cannot agree on one)",
              not any(e.get("event") == "checkpoint_saved" and e.get("kind") == "stop" for e in att0), "")
    if a.drill in ("nodeloss", "dp-nodeloss"):
        res = resumes[0] if resumes else {}
        killed_metrics = attempt_metrics(read_jsonl(os.path.join(a.run, "metrics.jsonl")), attempts, 0)
        for name, ok, detail in node_loss_checks(attempts, res.get("from_step"), res.get("steps_lost"),
                                                 killed_metrics, a.every):
            check(name, ok, detail)
            if name.startswith("steps lost"):
                lost_bound = f"{name}: {detail}"
    if a.drill == "nodeloss":
        # The next attempt ran on the other node: it took the lock over only
        # once the killed attempt's heartbeat was stale (docs/slurm.md).
        att1 = attempts[1]["events"] if len(attempts) > 1 else []
        take = first(att1, "lock_takeover") or {}
        stale = extra.get("stale_after")
        check("the lock was taken over from the killed node once its heartbeat was stale",
              take.get("previous_host") == extra.get("killed_node") and stale is not None
              and (take.get("heartbeat_age_seconds") or 0) >= stale,
              f"lock_takeover {json.dumps(take)}, stale after {stale} s")
    if a.drill in INJOB:
        metrics = read_jsonl(os.path.join(a.run, "metrics.jsonl"))
        for name, ok, detail in injob_checks(attempts, metrics, extra, a.restarts, a.drill in INJOB_SPARE,
                                             job_output):
            check(name, ok, detail)
            if name.startswith("steps lost"):
                lost_bound = f"{name}: {detail}"
    if a.drill in ("nodeloss", "dp-nodeloss", "dp-nodeloss-injob", "dp-nodeloss-injob-nospare", "dp-nodeloss-wide"):
        check("node back in service", extra.get("node_back") is True, extra.get("node_state", ""))
    if a.drill in ("dp", "dp-preempt", "dp-nodeloss", "dp-straggler"):
        nodes_per_attempt = 1 if a.drill == "dp-preempt" else 2
        for i, att in enumerate(attempts):
            start = att["start"]
            ranks = start.get("rank_nodes") or []
            check(f"attempt {i} trained over two ranks on {nodes_per_attempt} node(s)",
                  start.get("world_size") == 2 and len(set(ranks)) == nodes_per_attempt,
                  f"world_size {start.get('world_size')}, rank_nodes {ranks}")
    if a.drill == "cancel":
        check("job CANCELLED", a.state == "CANCELLED", f"JobState={a.state}")
        check("not requeued", len(attempts) == 1 and a.restarts == 0,
              f"{len(attempts)} attempts, Restarts={a.restarts}")
        req = graceful[0]["requeue"] if graceful else {}
        check("rekindle decided not to requeue", req.get("decision") == "skip", json.dumps(req))
    launches = forwards = None
    if a.job_output:
        if job_output is not None:
            launches = job_output.count(": srun ")
            forwards = job_output.count("batch shell got SIG")
        check("every attempt ran rekindle as a job step (srun)", launches is not None and launches >= len(attempts),
              f"{launches} srun launches in {a.job_output} for {len(attempts)} attempts")
        if a.drill in FORWARDED:
            check("the batch shell forwarded the signal to the step", bool(forwards),
                  f"{forwards} forwarding lines in {a.job_output}")
    if a.verify_rc is not None and a.drill != "noprogress":  # no checkpoint to verify there
        check("rekindle verify", a.verify_rc == 0, f"exit {a.verify_rc}")

    failed = [c for c in checks if not c["ok"]]
    result = "FAIL" if failed or not checks else "PASS"
    first_stop = graceful[0] if graceful else None
    since_action = None
    if a.action_time is not None:
        for i, att in enumerate(attempts):
            for e in att["events"]:
                if e.get("event") == "checkpoint_saved" and e.get("kind") == "stop":
                    since_action = round(iso_to_unix(e["time"]) - a.action_time, 3)
                    break
            if since_action is not None:
                break
    summary = {
        "drill": a.drill,
        "result": result,
        "job_id": a.job,
        "attempts": len(attempts),
        "nodes": nodes,
        "final_state": a.state,
        "exit_code": a.exit_code,
        "restarts": a.restarts,
        "max_steps": a.max_steps,
        "steps_lost": sum(r["steps_lost"] or 0 for r in resumes),
        "signal_to_durable_checkpoint_s": first_stop["seconds_to_durable_checkpoint"] if first_stop else None,
        "action_to_durable_checkpoint_s": since_action,
        "stops": stops,
        "resumes": resumes,
        "publish": {"commits": len(log), "expected": expected_commits, "messages": log[::-1]},
        "identical_to_reference": next((c["ok"] for c in checks if c["check"].startswith("model and optimizer")), None),
        "seconds": round(a.seconds, 1),
        "step_launches": launches,
        "batch_shell_forwards": forwards,
        "steps_lost_bound": lost_bound,
        "extra": extra,
        "failed_checks": failed,
        "checks": len(checks),
    }
    line = f"{result} {a.drill}: {len(attempts)} attempt(s) on {' -> '.join(map(str, nodes)) or '?'}"
    line += f", {summary['steps_lost']} step(s) lost"
    if first_stop and first_stop["seconds_to_durable_checkpoint"] is not None:
        line += f", checkpoint durable {first_stop['seconds_to_durable_checkpoint']:.3f} s after {first_stop['signal']}"
    line += f", {len(log)} commit(s), {a.seconds:.1f} s"
    if failed:
        line += " -- failed: " + "; ".join(f"{c['check']} ({c['detail']})" for c in failed)
    print(line)
    print(json.dumps(summary, sort_keys=False))
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2)
            f.write("\n")
    return 0 if result == "PASS" else 1


def iso_to_unix(text):
    from datetime import datetime
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


if __name__ == "__main__":
    sys.exit(main())
