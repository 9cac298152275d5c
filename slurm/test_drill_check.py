#!/usr/bin/env python3
"""Unit checks of slurm/drill_check.py on made-up records: the bound on the
steps a lost node costs passes what the drills record and fails a doctored
log (a save in flight far longer than saves take). Standard library only;
run by tests/it/drills.rs, or by hand:

    python3 -m unittest discover -s slurm -p 'test_*.py'
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest
from datetime import datetime, timedelta, timezone

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import drill_check  # noqa: E402

T0 = datetime(2026, 11, 25, 12, 0, 0, tzinfo=timezone.utc)
RATE = 100.0  # steps per second of the made-up attempts
EVERY = 100


def at(seconds):
    return (T0 + timedelta(seconds=seconds)).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def killed_run(last, in_flight_from=300, persist=0.05):
    """events and metrics of a nodeloss run: attempt 0 trains at RATE, saves
    steps 100 and 200 (each taking `persist` s), starts the save of
    `in_flight_from` and dies after step `last`; attempt 1 resumes from 200
    and finishes at 1000."""
    ev = [{"event": "start", "time": at(0), "node": "n1"}]
    metrics = []
    for step in range(1, last + 1):
        t = step / RATE
        metrics.append({"step": step, "time": at(t)})
        if step in (100, 200):
            ev.append({"event": "checkpoint_started", "step": step, "due_step": step, "time": at(t)})
            ev.append({"event": "checkpoint_saved", "step": step, "kind": "periodic", "persist_seconds": persist,
                       "time": at(t + persist)})
        if step == in_flight_from:
            ev.append({"event": "checkpoint_started", "step": step, "due_step": step, "time": at(t)})
    restart = last / RATE + 30
    ev.append({"event": "start", "time": at(restart), "node": "n2"})
    ev.append({"event": "resume", "time": at(restart + 0.1), "step": 200, "steps_lost": last - 200})
    for step in range(201, 1001):
        metrics.append({"step": step, "time": at(restart + (step - 200) / RATE)})
    return ev, metrics


def checks_of(events, metrics):
    attempts = drill_check.split_attempts(events)
    resume = next(e for e in events if e["event"] == "resume")
    killed = drill_check.attempt_metrics(metrics, attempts, 0)
    return {name: (ok, detail) for name, ok, detail in
            drill_check.node_loss_checks(attempts, resume["step"], resume["steps_lost"], killed, EVERY)}


BOUND = "steps lost at most one interval + the steps trained while saves were in flight"


class NodeLossBound(unittest.TestCase):
    def test_a_node_lost_while_a_save_is_in_flight_passes(self):
        # Died 40 steps (0.4 s) into the save of step 300: 140 lost.
        checks = checks_of(*killed_run(340))
        self.assertTrue(all(ok for ok, _ in checks.values()), checks)
        # 100 + ceil(100 steps/s x (2 x 1 s + 1 s)) = 400: the bound is the
        # drills' constants, not the saves this run happened to record.
        self.assertIn("140 lost <= 400", checks[BOUND][1])

    def test_a_save_in_flight_far_longer_than_saves_take_fails(self):
        # Doctored: the save of step 300 was still in flight 6 s later (a
        # stalled persister): 700 lost. `last >= snap`, the old check, held.
        checks = checks_of(*killed_run(900))
        ok, detail = checks[BOUND]
        self.assertFalse(ok, detail)
        self.assertIn("700 lost <= 400", detail)

    def test_slower_saves_do_not_widen_the_bound_they_fail(self):
        # A product whose saves got slow (2 s each) once widened its own
        # bound (to 800 steps here); now the bound stays 400 and the slow
        # saves fail on their own.
        checks = checks_of(*killed_run(900, persist=2.0))
        self.assertFalse(checks[BOUND][0], checks[BOUND])
        self.assertIn("700 lost <= 400", checks[BOUND][1])
        slow = "every recorded periodic save persisted within 1 s"
        self.assertFalse(checks[slow][0], checks[slow])
        self.assertTrue(checks_of(*killed_run(340, persist=0.9))[slow][0])

    def test_the_bound_just_above_and_below(self):
        # 400 allowed: 200 + 400 = 600 is the last step that passes.
        self.assertTrue(checks_of(*killed_run(600))[BOUND][0])
        self.assertFalse(checks_of(*killed_run(601))[BOUND][0])

    def test_no_save_in_flight_means_at_most_one_interval(self):
        ev, metrics = killed_run(290, in_flight_from=None)
        checks = checks_of(ev, metrics)
        self.assertEqual(list(checks), ["steps lost at most one checkpoint interval (no save in flight)"])
        self.assertTrue(checks["steps lost at most one checkpoint interval (no save in flight)"][0])

    def test_without_metrics_nothing_is_bounded_and_the_check_fails(self):
        ev, _ = killed_run(340)
        self.assertFalse(checks_of(ev, [])["steps lost within the bound"][0])

    def test_the_whole_judgement_fails_a_doctored_run_directory(self):
        # drill_check.py as drill.sh runs it, on a run directory whose
        # records were doctored as above.
        with tempfile.TemporaryDirectory() as tmp:
            run = os.path.join(tmp, "run")
            os.makedirs(run)
            results = {}
            for last in (340, 900):
                ev, metrics = killed_run(last)
                for name, records in (("events.jsonl", ev), ("metrics.jsonl", metrics)):
                    with open(os.path.join(run, name), "w", encoding="utf-8") as f:
                        f.writelines(json.dumps(r) + "\n" for r in records)
                out = os.path.join(tmp, f"summary-{last}.json")
                subprocess.run(
                    [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "drill_check.py"),
                     "--drill", "nodeloss", "--run", run, "--job", "1", "--repo", os.path.join(tmp, "none.git"),
                     "--max-steps", "1000", "--every", str(EVERY), "--grace", "20", "--seconds", "1",
                     "--out", out],
                    capture_output=True, text=True, check=False)
                with open(out, encoding="utf-8") as f:
                    results[last] = [c["check"] for c in json.load(f)["failed_checks"]]
            self.assertNotIn(BOUND, results[340])
            self.assertIn(BOUND, results[900])


KILL = 2.03  # seconds after T0 the made-up node was killed
KILLED = "n2"


def injob_run(last=203, resumed_from=200, restart_after=8.0, spare=True, tier="local", in_job=1,
              silent=4.0, rank_nodes1=None, counted=None, commit_latency=0.0, newest_local=None):
    """events and metrics of an in-job drill: attempt 0 trains two ranks on
    n1 and n2 at RATE up to step `last`, n2 is killed at KILL s, rank 0 finds
    rank 1 silent `silent` s later; attempt 1 (in-job restart `in_job`)
    starts, resumes from `resumed_from` of `tier` and trains its first step
    `restart_after` s after the kill, over two ranks on n1 and n3 (one on n1
    without a spare: a world of one records neither world_size nor
    rank_nodes). rekindle's events count `counted` steps lost (default: as
    the metrics say). Attempt 0 committed a local checkpoint every 5 steps up
    to `newest_local` (default: `resumed_from`), each `commit_latency` s after
    its step."""
    ev = [{"event": "start", "time": at(0), "node": "n1", "world_size": 2, "rank_nodes": ["n1", KILLED]}]
    for step in range(5, (resumed_from if newest_local is None else newest_local) + 1, 5):
        ev.append({"event": "local_checkpoint", "time": at(step / RATE + commit_latency), "step": step,
                   "outcome": "committed", "holders": ["n1", KILLED]})
    metrics = [{"step": step, "time": at(step / RATE)} for step in range(1, last + 1)]
    ev.append({"event": "rank_lost", "time": at(KILL + silent), "rank": 1, "rank_node": KILLED, "noticed_by": 0,
               "silent_seconds": silent, "timeout_seconds": 3.0})
    begin = KILL + restart_after - 2
    ranks = rank_nodes1 or (["n1", "n3"] if spare else ["n1"])
    start = {"event": "start", "time": at(begin), "node": ranks[0], "in_job_restart": in_job}
    if len(ranks) > 1:
        start.update(world_size=len(ranks), rank_nodes=ranks)
    ev.append(start)
    lost = last - resumed_from if counted is None else counted
    ev.append({"event": "resume", "time": at(begin + 1), "step": resumed_from, "tier": tier, "steps_lost": lost})
    for i, step in enumerate(range(resumed_from + 1, 1001)):
        metrics.append({"step": step, "time": at(KILL + restart_after + i / RATE)})
    ev.append({"event": "recovery", "time": at(KILL + restart_after), "step": resumed_from + 1, "tier": tier,
               "recovery_seconds": restart_after, "steps_lost": lost, "in_job": True})
    return ev, metrics


def injob_checks_of(events, metrics, restarts=0, spare=True, output="rekindle: in-job restart 1/3: ..."):
    extra = {"killed_node": KILLED, "kill_time": drill_check.iso_to_unix(at(KILL)), "local_every": 5}
    return {name: (ok, detail) for name, ok, detail in
            drill_check.injob_checks(drill_check.split_attempts(events), metrics, extra, restarts, spare, output)}


LOST = "steps lost at most two local intervals + the steps trained while a local save commits"
SLOW_COMMIT = "every local copy committed within 1 s of its step"
NEWEST = "resumed from the newest local checkpoint committed before the fault"
AGAIN = "trained again within 30 s of the kill"


class InJob(unittest.TestCase):
    def failed(self, checks):
        return [name for name, (ok, _) in checks.items() if not ok]

    def test_a_spare_taking_over_from_the_local_tier_passes(self):
        checks = injob_checks_of(*injob_run())
        self.assertEqual(self.failed(checks), [], checks)
        # 2 x 5 + ceil(100 steps/s x 1 s) = 110.
        self.assertIn("3 lost (metrics: last step logged 203, resumed from 200: 3; resume event 3; "
                      "recovery event 3) <= 110", checks[LOST][1])

    def test_without_a_spare_one_rank_goes_on(self):
        self.assertEqual(self.failed(injob_checks_of(*injob_run(spare=False), spare=False)), [])
        # Two ranks where only one node was left cannot be.
        self.assertIn("it went on over 1 rank(s) on 1 node(s) other than the killed one",
                      self.failed(injob_checks_of(*injob_run(spare=True), spare=False)))

    def test_the_steps_lost_bound_just_above_and_below(self):
        self.assertNotIn(LOST, self.failed(injob_checks_of(*injob_run(last=310))))
        self.assertIn(LOST, self.failed(injob_checks_of(*injob_run(last=311))))
        # Resumed from the durable checkpoint of step 100 while local copies up to 200 were
        # committed: 115 lost, and not from the local tier.
        failed = self.failed(injob_checks_of(*injob_run(last=215, resumed_from=100, tier="durable",
                                                        newest_local=200)))
        self.assertIn(LOST, failed)
        self.assertIn("resumed from the node-local tier (or a durable checkpoint at least as new as its newest copy)",
                      failed)

    def test_slow_local_commits_fail_and_do_not_widen_the_bound(self):
        # Commits 0.2 s after their step pass; a regression to 5 s (a stalled
        # local write) fails on its own, and the bound stays 110 steps where
        # it once grew with the slowest commit (to 510 here).
        self.assertNotIn(SLOW_COMMIT, self.failed(injob_checks_of(*injob_run(commit_latency=0.2))))
        checks = injob_checks_of(*injob_run(last=700, commit_latency=5.0))
        self.assertIn(SLOW_COMMIT, self.failed(checks))
        self.assertIn(LOST, self.failed(checks))
        self.assertIn("<= 110 = 2 x local every 5 + 100.0 steps/s x 1 s", checks[LOST][1])

    def test_a_durable_checkpoint_newer_than_every_local_copy_is_the_right_resume(self):
        # Lost right after the durable save of step 200, the local copy of 200 not yet committed.
        tier = "resumed from the node-local tier (or a durable checkpoint at least as new as its newest copy)"
        failed = self.failed(injob_checks_of(*injob_run(resumed_from=200, tier="durable", newest_local=195)))
        self.assertNotIn(tier, failed)
        self.assertNotIn("a recovery event: in-job, from the tier it resumed from", failed)
        # An older durable one while a newer local copy was committed: wrong.
        failed = self.failed(injob_checks_of(*injob_run(resumed_from=195, tier="durable", newest_local=200)))
        self.assertIn(tier, failed)

    def test_a_resume_from_an_older_local_copy_than_the_newest_committed_fails(self):
        self.assertIn(NEWEST, self.failed(injob_checks_of(*injob_run(resumed_from=195, newest_local=200))))
        self.assertNotIn(NEWEST, self.failed(injob_checks_of(*injob_run(resumed_from=200, newest_local=200))))

    def test_the_largest_count_of_steps_lost_is_bounded(self):
        # Metrics lines of the last steps lost with the aborted step: rekindle's
        # own count is the larger one, and it is what the bound judges.
        self.assertNotIn(LOST, self.failed(injob_checks_of(*injob_run(last=203, counted=110))))
        checks = injob_checks_of(*injob_run(last=203, counted=111))
        self.assertIn(LOST, self.failed(checks))
        self.assertIn("111 lost (metrics: last step logged 203, resumed from 200: 3; resume event 111", checks[LOST][1])

    def test_training_again_later_than_30_s_fails(self):
        self.assertNotIn(AGAIN, self.failed(injob_checks_of(*injob_run(restart_after=29.5))))
        self.assertIn(AGAIN, self.failed(injob_checks_of(*injob_run(restart_after=30.5))))

    def test_a_requeue_fails(self):
        # SLURM requeued it (Restarts=1) and the next attempt is not an in-job restart.
        failed = self.failed(injob_checks_of(*injob_run(in_job=0), restarts=1))
        self.assertIn("never requeued: SLURM's Restarts=0", failed)
        self.assertIn("the next attempt is in-job restart 1 of the same allocation", failed)

    def test_the_killed_node_in_the_next_world_fails(self):
        failed = self.failed(injob_checks_of(*injob_run(rank_nodes1=["n1", KILLED])))
        self.assertIn("it went on over 2 rank(s) on 2 node(s) other than the killed one", failed)

    def test_a_loss_noticed_after_three_timeouts_fails(self):
        failed = self.failed(injob_checks_of(*injob_run(silent=9.5)))
        self.assertIn("rank 0 found rank 1 lost on the killed node within the timeout", failed)

    def test_no_second_attempt_fails_and_says_so(self):
        ev, metrics = injob_run()
        first_attempt = ev[:[e["event"] for e in ev].index("start", 1)]
        checks = injob_checks_of(first_attempt, metrics[:203])
        self.assertEqual(self.failed(checks), ["the run went on in the job"])

    def test_the_batch_shell_must_have_logged_the_restart(self):
        self.assertIn("the batch shell logged the in-job restart",
                      self.failed(injob_checks_of(*injob_run(), output="rekindle: job 1 restart 0 ...")))


WIDE_NODES = [f"w{i}" for i in range(1, 10)]


def wide_run(lost=(14, 15), next_nodes=None, next_size=16):
    """An in-job run of dp-nodeloss-wide: 16 ranks, two a node, on w1-w8; w8
    (ranks 14 and 15) killed; ranks `lost` found lost; attempt 1 over
    `next_size` ranks on `next_nodes` (default: w1-w7 and the spare w9).
    Otherwise injob_run's."""
    ev, metrics = injob_run()
    first = [n for n in WIDE_NODES[:8] for _ in range(2)]
    nodes1 = next_nodes or [n for n in WIDE_NODES[:7] + WIDE_NODES[8:] for _ in range(2)]
    out, starts = [], 0
    for e in ev:
        e = dict(e)
        if e["event"] == "start":
            starts += 1
            if starts == 1:
                e.update(node="w1", world_size=16, rank_nodes=first)
            else:
                e.update(node="w1", world_size=next_size, rank_nodes=nodes1[:next_size])
        if e["event"] == "rank_lost":
            for rank in lost:
                out.append(dict(e, rank=rank, rank_node="w8"))
            continue
        out.append(e)
    return out, metrics


def wide_checks_of(events, metrics):
    extra = {"killed_node": "w8", "kill_time": drill_check.iso_to_unix(at(KILL)), "local_every": 5,
             "lost_rank": 15, "world": 16, "per_node": 2}
    return {name: (ok, detail) for name, ok, detail in
            drill_check.injob_checks(drill_check.split_attempts(events), metrics, extra, 0, True,
                                     "rekindle: in-job restart 1/3: ...")}


class Wide(unittest.TestCase):
    """dp-nodeloss-wide: the in-job judge at 16 ranks, two a node."""
    FIRST = "attempt 0 trained over 16 ranks on 8 nodes, rank 15 on the killed node"
    LOST = "rank 0 found ranks 14, 15 lost on the killed node within the timeout"
    NEXT = "it went on over 16 rank(s) on 8 node(s) other than the killed one"

    def failed(self, checks):
        return [name for name, (ok, _) in checks.items() if not ok]

    def test_both_ranks_of_the_lost_node_found_and_16_ranks_again_passes(self):
        checks = wide_checks_of(*wide_run())
        self.assertEqual(self.failed(checks), [], checks)
        self.assertIn(self.FIRST, checks)

    def test_a_rank_of_the_lost_node_not_found_or_another_rank_blamed_fails(self):
        self.assertIn(self.LOST, self.failed(wide_checks_of(*wide_run(lost=(15,)))))
        self.assertIn(self.LOST, self.failed(wide_checks_of(*wide_run(lost=(13, 14, 15)))))

    def test_a_smaller_world_or_the_lost_node_in_the_next_one_fails(self):
        self.assertIn(self.NEXT, self.failed(wide_checks_of(*wide_run(next_size=14))))
        back = [n for n in WIDE_NODES[:8] for _ in range(2)]
        self.assertIn(self.NEXT, self.failed(wide_checks_of(*wide_run(next_nodes=back))))


class EverySampleOnce(unittest.TestCase):
    TRAIN = {"step": 1000, "epoch": 8, "cursor": {"epoch": 8, "position": 1120}, "optimizer_step": 1000,
             "counters": {"samples": 16000, "batches": 1000, "tokens": 0, "clipped": 53}}

    def test_the_same_position_passes_whatever_the_clipping(self):
        other = json.loads(json.dumps(self.TRAIN))
        other["counters"]["clipped"] = 54  # another summation order
        self.assertEqual(drill_check.sample_position(self.TRAIN), drill_check.sample_position(other))

    def test_a_sample_seen_twice_or_skipped_differs(self):
        for key, value in (("cursor", {"epoch": 8, "position": 1136}), ("counters", {"samples": 16016,
                                                                                     "batches": 1000, "tokens": 0})):
            other = dict(self.TRAIN, **{key: value})
            self.assertNotEqual(drill_check.sample_position(self.TRAIN), drill_check.sample_position(other), key)


if __name__ == "__main__":
    unittest.main()


def badnode_events(check_node="n1", exclusion_added=("n1",), later_node="n2"):
    """A badnode run: n1 fails its site check, the job is requeued with n1
    excluded and trains on `later_node`."""
    return [
        {"event": "node_unhealthy", "node": check_node, "attempt": 0, "check": "site command", "launch": "5.0",
         "detail": "`test` exited 1 after 0.0s; output: drill: n1 fails its site check"},
        {"event": "requeue", "node": check_node, "attempt": 0, "decision": "requeue", "answer": "requeued"},
        {"event": "nodes_excluded", "node": check_node, "attempt": 0, "cause": "node_unhealthy: site command",
         "blamed": ["n1"], "added": list(exclusion_added), "excluded": list(exclusion_added), "how": "requeue"},
        {"event": "start", "node": later_node, "attempt": 1},
        {"event": "finish", "node": later_node, "attempt": 1, "step": 1000},
    ]


STATUS = "unhealthy n1 failed `site command`: ...\nexcluded  n1 (node_unhealthy: site command; from the requeued job)\n"


class BadNode(unittest.TestCase):
    def failed(self, events, exc="n1", status=STATUS):
        extra = {"bad_node": "n1", "exc_node_list": exc, "status": status}
        return [name for name, ok, _ in drill_check.badnode_checks(drill_check.split_attempts(events), extra)
                if not ok]

    def test_the_drills_records_pass(self):
        self.assertEqual(self.failed(badnode_events()), [])
        self.assertEqual(len(drill_check.split_attempts(badnode_events())), 2, "the unhealthy attempt counts")

    def test_ranks_of_one_attempt_failing_together_are_one_attempt(self):
        events = badnode_events()
        events.insert(1, dict(events[0], node="n3"))
        self.assertEqual(len(drill_check.split_attempts(events)), 2)

    def test_no_exclusion_or_training_on_the_bad_node_fails(self):
        self.assertIn("rekindle excluded n1 from the requeued job", self.failed(badnode_events(exclusion_added=())))
        self.assertIn("scontrol show job lists n1 in ExcNodeList", self.failed(badnode_events(), exc="n9"))
        self.assertIn("every later attempt trained on another node", self.failed(badnode_events(later_node="n1")))
        self.assertIn("rekindle status says why the node was left", self.failed(badnode_events(), status="state x"))


def straggler_events(rank=1, rank_node="n2", blamed=True, twice=False, added=("n2",), later=("n1", "n3")):
    """A dp-straggler run: rank 1 on n2 reported (blamed), the stop's requeue
    excludes n2, the next attempt runs on `later`."""
    s = {"event": "straggler", "node": "n1", "rank": rank, "rank_node": rank_node, "step": 12,
         "step_seconds": 0.055, "median_seconds": 0.004, "factor": 1.5, "steps": 10, "blamed": blamed,
         "world_size": 2}
    return [
        {"event": "start", "node": "n1", "attempt": 0, "rank_nodes": ["n1", "n2"], "world_size": 2},
        s, *([dict(s, step=30)] if twice else []),
        {"event": "requeue", "node": "n1", "attempt": 0, "decision": "requeue", "answer": "requeued"},
        {"event": "nodes_excluded", "node": "n1", "attempt": 0, "cause": "stop: SIGTERM", "blamed": ["n2"],
         "added": list(added), "excluded": list(added), "how": "requeue"},
        {"event": "start", "node": later[0], "attempt": 1, "rank_nodes": list(later), "world_size": 2},
    ]


class Straggler(unittest.TestCase):
    def failed(self, events, exc="n2"):
        extra = {"slow_node": "n2", "exc_node_list": exc}
        return [name for name, ok, _ in drill_check.straggler_checks(drill_check.split_attempts(events), extra)
                if not ok]

    def test_the_drills_records_pass(self):
        self.assertEqual(self.failed(straggler_events()), [])

    def test_a_wrong_rank_node_a_second_report_or_no_blame_fails(self):
        one = "one straggler event, naming rank 1 and its node, blamed"
        self.assertIn(one, self.failed(straggler_events(rank=0)))
        self.assertIn(one, self.failed(straggler_events(rank_node="n1")))
        self.assertIn(one, self.failed(straggler_events(twice=True)))
        self.assertIn(one, self.failed(straggler_events(blamed=False)))

    def test_no_exclusion_or_a_later_attempt_on_the_node_fails(self):
        self.assertIn("rekindle excluded n2 from the requeued job", self.failed(straggler_events(added=())))
        self.assertIn("scontrol show job lists n2 in ExcNodeList", self.failed(straggler_events(), exc=""))
        self.assertIn("no later attempt ran on the straggler's node",
                      self.failed(straggler_events(later=("n1", "n2"))))


def noprogress_events(attempts=2, guard=True, klass="transient"):
    ev = []
    for i in range(attempts):
        ev.append({"event": "start", "node": "n1", "attempt": 0, "in_job_restart": i})
        ev.append({"event": "error", "node": "n1", "error": "step 6 failed", "class": klass})
    if guard:
        ev.append({"event": "error", "node": "n1", "requeue": {"decision": "skip", "reason": "no progress"},
                   "error": "2 attempts of job 5 in a row committed no newer checkpoint ([run] "
                            "max_attempts_without_progress = 2): ...; the attempts were on n1 (job 5, restart 0): "
                            "error: step 6 failed; on n1 (job 5, restart 0): error: step 6 failed."})
    return ev


class NoProgress(unittest.TestCase):
    def failed(self, events, state="FAILED", exit_code="79:0", restarts=0):
        extra = {"max_attempts_without_progress": 2}
        return [name for name, ok, _ in
                drill_check.noprogress_checks(drill_check.split_attempts(events), state, exit_code, restarts, extra)
                if not ok]

    def test_the_drills_records_pass(self):
        self.assertEqual(self.failed(noprogress_events()), [])

    def test_another_exit_or_more_attempts_or_a_requeue_fails(self):
        self.assertTrue(self.failed(noprogress_events(), exit_code="1:0"))
        self.assertTrue(self.failed(noprogress_events(attempts=3)))
        self.assertTrue(self.failed(noprogress_events(guard=False)))
        self.assertTrue(self.failed(noprogress_events(), restarts=2))
        self.assertTrue(self.failed(noprogress_events(klass="deterministic")))


def preempted_run(reason="SIGTERM", preempted=True, later_reason=None):
    """events of a preempt-nosignal run: attempt 0 stops on `reason` with a
    requeue that saw the job being preempted (or not), attempt 1 resumes
    (and stops on `later_reason`, when given) and finishes."""
    why = ("training not finished; job RUNNING but being preempted since 2026-11-25T12:00:03: ..." if preempted
           else "training not finished; job RUNNING")
    ev = [{"event": "start", "node": "n1"},
          {"event": "stop", "node": "n1", "reason": reason, "step": 230,
           "requeue": {"decision": "requeue", "answer": "requeued", "reason": why}},
          {"event": "start", "node": "n2"},
          {"event": "resume", "step": 230, "steps_lost": 0}]
    if later_reason:
        ev.append({"event": "stop", "node": "n2", "reason": later_reason, "step": 400})
    ev.append({"event": "finish", "step": 1000})
    return ev


NOSIGNAL_EXTRA = {"job_signal": "USR1@120",
                  "slurmctld_parameters": {"before": "enable_configless,preempt_send_user_signal",
                                           "during": "enable_configless",
                                           "after": "enable_configless,preempt_send_user_signal"}}
ON_SIGTERM = "rekindle's first stop was on SIGTERM as preemption began, and none on the job's --signal (USR1)"


class PreemptNoSignal(unittest.TestCase):
    def failed(self, events, extra=None):
        return [name for name, ok, _ in
                drill_check.preempt_nosignal_checks(drill_check.split_attempts(events),
                                                    NOSIGNAL_EXTRA if extra is None else extra)
                if not ok]

    def test_the_drills_records_pass(self):
        self.assertEqual(self.failed(preempted_run()), [])

    def test_a_stop_on_the_jobs_usr1_fails_whatever_the_drill_says_it_asked_for(self):
        # What the product recorded is judged: a stop on SIGUSR1 (SLURM sent
        # the job's --signal, or rekindle took it) fails, at the first stop
        # or a later one.
        self.assertEqual(self.failed(preempted_run(reason="SIGUSR1")), [ON_SIGTERM])
        self.assertEqual(self.failed(preempted_run(later_reason="SIGUSR1")), [ON_SIGTERM])
        self.assertEqual(self.failed(preempted_run(reason="stop_at_step")), [ON_SIGTERM])
        # The drill's own note of --signal is no evidence either way.
        extra = {k: v for k, v in NOSIGNAL_EXTRA.items() if k != "job_signal"}
        self.assertEqual(self.failed(preempted_run(), extra), [])
        self.assertEqual(self.failed(preempted_run(reason="SIGUSR1"), extra), [ON_SIGTERM])

    def test_no_stop_or_a_requeue_outside_the_grace_time_fails(self):
        no_stop = [e for e in preempted_run() if e["event"] != "stop"]
        self.assertIn(ON_SIGTERM, self.failed(no_stop))
        self.assertEqual(self.failed(preempted_run(preempted=False)),
                         ["rekindle requeued the job inside GraceTime (PreemptTime set)"])

    def test_a_controller_left_with_the_parameter_fails(self):
        params = dict(NOSIGNAL_EXTRA["slurmctld_parameters"], during="enable_configless,preempt_send_user_signal")
        self.assertEqual(self.failed(preempted_run(), dict(NOSIGNAL_EXTRA, slurmctld_parameters=params)),
                         ["the controller ran the drill without preempt_send_user_signal"])
