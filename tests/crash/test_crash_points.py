"""The crash-point sweep (rule `crash-recovery`): every crash point, N = 1..12 (fewer where the workload
passes the point fewer times, ``PASSES``) and N spread over the rest of the
workload (``FURTHER``), a worker killed by ``PARTQ_CRASH_AT=point:N``, then a fresh
process reopens, drains, and the checker runs on both logs.

For each case: the worker died by SIGKILL exactly when the workload passes the point at least N
times (a calibration run counts the passes) and otherwise finished normally; the store opens
(fast) with any interrupted scaling finished; the queue drains to depth 0; and the checker finds
nothing lost, nothing acked delivered again, per-key order kept, redeliveries marked.

The cases run in ``sweep_runner`` (a fork server, 2 at a time by default, ``PARTQ_CRASH_JOBS``
to change) once per module; each test reads its case's result.

A crash in the middle of a scale-up used to leave delivery state the next owner never
reconciled (the drain's ``opened`` line records ``state_n``, the partition count of the stored
delivery state, which made that visible); see ``test_crash_regressions``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from partq.storage.crashpoints import POINTS

HERE = os.path.dirname(os.path.abspath(__file__))
# Beyond N=12, spread over the rest of the workload (about 190 commits, 30-65 passes of the
# other points when this was written; an N the workload does not reach must finish normally).
FURTHER = {
    "before_commit": range(14, 200, 9), "after_commit_before_return": range(14, 200, 9),
    "mid_batch": (14, 18, 24, 28, 32), "at_ack": (14, 18, 25, 30, 35, 40, 45),
    "during_truncation": (14, 18, 25, 35, 45, 55, 65),
    "during_handoff": (14, 18, 24, 30, 36, 42, 46), "during_scaling": (14, 17, 20, 21, 22),
}
# A point the workload passes fewer than 12 times: after_cutover, once per online scale-up and
# twice per online scale-down (four scalings).
# in_transaction: this workload makes no transactions (test_transaction_crashes sweeps it).
PASSES = {p: 12 for p in POINTS} | {"after_cutover": 6, "in_transaction": 0}
CASES = [(p, n) for p in POINTS for n in range(1, PASSES[p] + 1)] + \
        [(p, n) for p in POINTS for n in FURTHER.get(p, ())]
@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    base = tmp_path_factory.mktemp("sweep")
    cases = [{"id": "calibration", "point": None, "n": 0}] + \
            [{"id": f"{p}-{n}", "point": p, "n": n} for p, n in CASES]
    jobs = os.environ.get("PARTQ_CRASH_JOBS", "2")
    proc = subprocess.run([sys.executable, os.path.join(HERE, "sweep_runner.py"), str(base), jobs],
                          input=json.dumps(cases), capture_output=True, text=True, cwd=HERE,
                          timeout=900, env={k: v for k, v in os.environ.items()
                                            if k != "PARTQ_CRASH_AT"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = {r["id"]: r for r in map(json.loads, proc.stdout.splitlines())}
    calibration = results.pop("calibration")
    assert calibration["worker_rc"] == 0 and calibration["report"]["ok"], calibration
    return calibration["passes"], results


def test_the_workload_passes_every_point_often_enough(sweep):
    passes, _ = sweep
    assert {p: passes.get(p, 0) >= PASSES[p] for p in POINTS} == {p: True for p in POINTS}, passes


@pytest.mark.parametrize("point,n", CASES, ids=[f"{p}-{n}" for p, n in CASES])
def test_crash_point(sweep, point, n):
    passes, results = sweep
    r = results[f"{point}-{n}"]
    where = f"{point}:{n} in {r['dir']}"
    reached = n <= passes[point]
    assert r["worker_rc"] == (-9 if reached else 0), \
        f"{where}: worker exited {r['worker_rc']} (passes {passes[point]})\n{r.get('worker_err', '')}"
    opened = r["opened"]
    assert opened is not None, f"{where}: the store did not open\n{r.get('drain_err', '')}"
    if opened.get("no_queue"):
        assert point == "before_commit" and n == 1, f"{where}: the queue is gone"
    else:
        assert opened["scaling_status"] == "Ready", f"{where}: open left the scaling unfinished"
    assert opened["seconds"] < 5.0, f"{where}: opening took {opened['seconds']} s"
    assert r["drain_rc"] == 0, f"{where}: the drain failed\n{r.get('drain_err', '')}"
    assert r["report"]["ok"], f"{where}:\n{r['summary']}"
