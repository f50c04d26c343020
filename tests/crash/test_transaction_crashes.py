"""Exactly once across crashes (rule `transactions`): a consume-transform-publish pipeline
(``txn_pipeline.py``: each batch's outputs and acks in one transaction) is SIGKILLed at random
moments and at crash points inside the commit (``PARTQ_CRASH_AT``: before_commit,
in_transaction, after_commit_before_return), bound in the process that owns delivery, as a
peer flow of another process, and through ``partq serve`` (the server killed too, at random
and at those crash points, while the pipeline retries its transaction under its id). After a
last run that drains the input, every input message is in the output exactly once.

Rounds are few and short (the file runs in well under a minute)."""
from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
from collections import Counter

import pytest
from tools_helpers import PARTQ_SCRIPT

import partq
from partq.ops.browse import browse

HERE = os.path.dirname(os.path.abspath(__file__))
N = 1000
TOKEN = "a-transaction-crash-token-32-byte"
POINTS = ("before_commit", "in_transaction", "after_commit_before_return")


def setup_queues(data: str) -> None:
    with partq.Broker.open(data) as broker:
        broker.create_queue("in", partitions=3, rebalance_delay=0.0)
        broker.create_queue("out", partitions=2)
        broker.publish_many("in", [(b"%d" % i, f"k{i % 17}") for i in range(N)])


def exactly_once(data: str) -> None:
    with partq.Broker.open(data) as broker:
        assert broker.queue_status("in").depth == 0
        got = Counter(m["payload"] for m in browse(broker.store, "out", limit=0))
    assert got == Counter(b"o-%d" % i for i in range(N)), \
        f"missing {len(set(b'o-%d' % i for i in range(N)) - set(got))}, " \
        f"twice {[p for p, n in got.items() if n > 1][:5]}"


def pipeline(args: list[str], crash: str | None = None) -> subprocess.Popen:
    env = dict(os.environ, PARTQ_CRASH_AT=crash or "")
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "txn_pipeline.py"), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "bound\n", proc.communicate()
    return proc


def killed_after(proc: subprocess.Popen, seconds: float) -> None:
    """Let ``proc`` run for ``seconds`` (or to its end), then SIGKILL it."""
    try:
        proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
    proc.communicate(timeout=30)


def finished(proc: subprocess.Popen) -> None:
    out, err = proc.communicate(timeout=60)
    assert proc.returncode in (0, -9), err        # -9: its crash point


def rounds(args: list[str], rng: random.Random) -> None:
    """Random kills, then a crash point of each kind, then a run that drains."""
    for _ in range(3):
        killed_after(pipeline([*args, "5"]), rng.uniform(0.05, 0.4))
    for point in POINTS:
        finished(pipeline([*args, "1"], f"{point}:{rng.randint(2, 6)}"))
    finished(pipeline([*args, "1.5"]))


@pytest.mark.parametrize("where", ["owner", "peer"])
def test_a_pipeline_killed_anywhere_outputs_each_input_once(tmp_path, where):
    data = str(tmp_path / "data")
    setup_queues(data)
    rng = random.Random(45)
    owner = partq.Broker.open(data) if where == "peer" else None
    try:
        if owner is not None:
            assert owner.dispatcher.take_over("in")     # the pipeline's flows are peer flows
        rounds(["dir", data], rng)
    finally:
        if owner is not None:
            owner.close()
    exactly_once(data)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(data: str, token_file: str, port: int, crash: str | None = None) -> subprocess.Popen:
    env = dict(os.environ, PARTQ_CRASH_AT=crash or "")
    proc = subprocess.Popen([PARTQ_SCRIPT, "--data", data, "serve", "--listen",
                             f"127.0.0.1:{port}", "--token-file", token_file, "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line and json.loads(line)["listen"], proc.communicate(timeout=30)
    return proc


def test_through_serve_with_the_server_killed_too_each_input_is_output_once(tmp_path):
    data = str(tmp_path / "data")
    setup_queues(data)
    token_file = str(tmp_path / "token")
    with open(token_file, "w") as f:
        f.write(TOKEN + "\n")
    rng = random.Random(4545)
    port = free_port()
    args = ["serve", f"127.0.0.1:{port}", TOKEN]
    server = serve(data, token_file, port)
    try:
        killed_after(pipeline([*args, "5"]), rng.uniform(0.05, 0.4))    # the pipeline dies
        for point in (None, *POINTS):   # the server dies, at random or inside a commit; the
            server.kill()               # pipeline sends its transaction again under its id
            server.communicate(timeout=30)
            server = serve(data, token_file, port, f"{point}:{rng.randint(2, 6)}" if point
                           else None)
            worker = pipeline([*args, "2"])
            if point is None:
                killed_after(server, rng.uniform(0.05, 0.4))
                server = serve(data, token_file, port)
            else:
                killed_after(server, 3.0)           # it passes its crash point (or is killed)
                server = serve(data, token_file, port)
            finished(worker)
        finished(pipeline([*args, "1.5"]))
    finally:
        server.kill()
        server.communicate(timeout=30)
    exactly_once(data)
