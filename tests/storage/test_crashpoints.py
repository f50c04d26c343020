"""The switch of the crash points (``partq.storage.crashpoints``) that the crash harness's fork
servers use: ``arm`` sets the points as ``PARTQ_CRASH_AT`` would at import and counts passes
afresh, ``passes`` reports the count. Each check runs in a child process, which the armed point
kills."""
from __future__ import annotations

import json
import signal

from helpers import run_child

ARM_THEN_PASS = """
    import json, sys
    from partq.storage import crashpoints
    out = {"at_import": [crashpoints.ENABLED, crashpoints.passes()]}
    crashpoints.arm("mid_batch:3,at_ack:2")
    crashpoints.hit("mid_batch")
    crashpoints.hit("mid_batch")
    crashpoints.hit("at_ack")
    out["armed"] = [crashpoints.ENABLED, crashpoints.passes()]
    try:
        crashpoints.arm("nowhere:1")
    except ValueError as exc:
        out["refused"] = str(exc)
    out["after_refusal"] = [crashpoints.ENABLED, crashpoints.passes()]
    crashpoints.arm("")
    for _ in range(5):                  # disarmed: counted, never fatal
        crashpoints.hit("at_ack")
    out["disarmed"] = [crashpoints.ENABLED, crashpoints.passes()]
    crashpoints.arm(sys.argv[1])
    print(json.dumps(out), flush=True)
    crashpoints.hit("at_ack")
    crashpoints.hit("at_ack")
    print("passed the armed point", flush=True)
"""


def test_arm_sets_the_points_and_counts_passes_afresh():
    res = run_child(ARM_THEN_PASS, "at_ack:2")
    assert res.returncode == -signal.SIGKILL, (res.returncode, res.stdout, res.stderr[-2000:])
    lines = res.stdout.splitlines()
    assert lines[1:] == [], "the armed point did not kill the process"
    out = json.loads(lines[0])
    assert out["at_import"] == [False, {}]
    assert out["armed"] == [True, {"mid_batch": 2, "at_ack": 1}]
    assert "nowhere:1" in out["refused"] and "before_commit" in out["refused"]
    assert out["after_refusal"] == out["armed"]          # a refused spec changes nothing
    assert out["disarmed"] == [False, {"at_ack": 5}]


def test_a_point_armed_past_the_passes_never_fires():
    res = run_child(ARM_THEN_PASS, "at_ack:3")
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.splitlines()[1:] == ["passed the armed point"]
