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
        # 100 + ceil(100 steps/s x (0.05 + 2 x 0.05 + 1) s) = 215
        self.assertIn("140 lost <= 215", checks[BOUND][1])

    def test_a_save_in_flight_far_longer_than_saves_take_fails(self):
        # Doctored: the save of step 300 was still in flight 6 s later (a
        # stalled persister): 700 lost. `last >= snap`, the old check, held.
        checks = checks_of(*killed_run(900))
        ok, detail = checks[BOUND]
        self.assertFalse(ok, detail)
        self.assertIn("700 lost <= 215", detail)

    def test_slower_recorded_saves_allow_proportionally_more(self):
        # Saves that take 2 s each: 600 steps into the lost one is within
        # 100 + ceil(100 x (2 + 2 x 2 + 1)) = 800.
        checks = checks_of(*killed_run(900, persist=2.0))
        self.assertTrue(checks[BOUND][0], checks[BOUND])

    def test_the_bound_just_above_and_below(self):
        # 215 allowed: 200 + 215 = 415 is the last step that passes.
        self.assertTrue(checks_of(*killed_run(415))[BOUND][0])
        self.assertFalse(checks_of(*killed_run(416))[BOUND][0])

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


if __name__ == "__main__":
    unittest.main()
