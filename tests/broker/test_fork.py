"""A Broker used across ``fork()`` gets a clear typed error and damages nothing: every verb in
the child is UsedAcrossFork saying what to do, and the parent is unharmed.

Anything that could take the interpreter down runs in a child process. A bug these tests find is
a strict xfail whose reason names the file, function and cause until it is fixed; the ones found
so far are fixed and their tests stay as regressions.
"""
from __future__ import annotations

import json
import os

import pytest
from helpers import drain, run_child

import partq

# ============================================================================ fork
FORK_OPS = {
    "publish": lambda b, flow, msgs: b.publish("q", b"x", key="a"),
    "publish_many": lambda b, flow, msgs: b.publish_many("q", [(b"x", "a")]),
    "receive": lambda b, flow, msgs: flow.receive(10),
    "ack_many": lambda b, flow, msgs: flow.ack_many(msgs),
    "bind": lambda b, flow, msgs: b.bind("q", name="other"),
    "queue_status": lambda b, flow, msgs: b.queue_status("q"),
    "queues": lambda b, flow, msgs: b.queues(),
    "tick": lambda b, flow, msgs: b.tick(),
}


def in_forked_child(fn) -> dict:
    """Run ``fn()`` in a forked child; return what it returned (JSON) or its exception."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(r)
        try:
            out = {"result": fn()}
        except BaseException as exc:
            out = {"error": type(exc).__name__, "message": str(exc)}
        os.write(w, json.dumps(out, default=repr).encode())
        os._exit(0)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return json.loads(b"".join(chunks))


@pytest.fixture
def forked_setup(tmp_path):
    data = tmp_path / "data"
    b = partq.Broker.open(data, clock=partq.ManualClock())   # no ticker thread: see the report
    b.create_queue("q", partitions=2, rebalance_delay=0.0)
    b.publish("q", b"before-fork", key="a")
    flow = b.bind("q", name="c")
    msgs = flow.receive(10)
    yield data, b, flow, msgs
    b.close()


@pytest.mark.parametrize("op", sorted(FORK_OPS))
def test_broker_used_across_fork(forked_setup, op):
    data, b, flow, msgs = forked_setup
    out = in_forked_child(lambda: FORK_OPS[op](b, flow, msgs) and None)
    assert out.get("error") == "UsedAcrossFork", out
    assert "fork" in out["message"] and str(data) in out["message"]
    assert "open" in out["message"].lower()           # it says what to do
    # the parent is unharmed
    flow.ack_many(msgs)
    b.publish("q", b"after-fork", key="a")
    assert [m.payload for m in drain(flow)] == [b"after-fork"]


def test_closing_an_inherited_broker_in_a_child_keeps_the_parents_delivery_lock(forked_setup):
    data, b, flow, msgs = forked_setup
    in_forked_child(lambda: b.close())
    res = run_child("""
        import sys, partq
        with partq.Broker.open(sys.argv[1]) as b:
            b.bind("q", name="intruder")      # served by whoever owns delivery, rule `peer-flows`
            print(b.queue_status("q").delivery_owner)
    """, data)
    assert res.stdout.startswith(f"pid {os.getpid()} "), res.stdout + res.stderr[-2000:]


def test_opening_the_broker_again_in_the_child(forked_setup):
    """Either it works, or it is refused with UsedAcrossFork: never a misleading error (it used
    to be CorruptStore "already open in this process")."""
    data, b, flow, msgs = forked_setup

    def child():
        with partq.Broker.open(data, clock=partq.ManualClock()) as again:
            return again.publish("q", b"from-child", key="a").seq
    out = in_forked_child(child)
    assert "result" in out or out["error"] == "UsedAcrossFork", out
    flow.ack_many(msgs)
    assert [m.payload for m in drain(flow)] == ([b"from-child"] if "result" in out else [])
