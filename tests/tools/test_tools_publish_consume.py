"""``partq publish`` and ``partq consume``: messages in from arguments, standard input lines or
JSON Lines; messages out as one more consumer, acked or not; both in real processes too."""
from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import wait_until
from tools_helpers import json_lines, ok, run_script, user_error

import partq


@pytest.fixture
def q(run):
    ok(run("queue", "create", "q", "-p", "3", "--rebalance-delay", "0"))
    return "q"


def _all(broker, queue: str) -> list:
    """Every message of ``queue`` (received and acked by a flow of this process)."""
    flow = broker.bind(queue)
    msgs = []
    while got := flow.receive(max_messages=1000, timeout=0.3):
        msgs += got
    flow.ack_many(msgs)
    flow.unbind()
    return sorted(msgs, key=lambda m: (m.partition, m.seq))


# ---------------------------------------------------------------------- publish
def test_publish_arguments_with_key_and_headers(run, broker, q):
    result = ok(run("publish", q, "hello", "wörld", "--key", "k1", "-H", "a=1", "-H", "b=x=y"))
    assert "published 2 messages to queue 'q' in 1 partition" in result.stdout
    msgs = _all(broker, q)
    assert [m.payload for m in msgs] == [b"hello", "wörld".encode()]
    assert {m.key for m in msgs} == {"k1"} and len({m.partition for m in msgs}) == 1
    assert all(m.headers == {"a": "1", "b": "x=y"} for m in msgs)
    one = ok(run("publish", q, "solo"))
    assert "published 1 message to queue 'q': partition" in one.stdout


def test_publish_stdin_lines_in_batches_json(run, broker, q):
    lines = "".join(f"line {i}\n" for i in range(2500)) + "\n" + "last without newline"
    doc = json.loads(ok(run("publish", q, "--batch", "1000", "--json", input=lines)).stdout)
    assert doc["queue"] == q and doc["published"] == 2502 and doc["discarded"] == 0
    assert doc["complete"] is True
    assert sum(p["count"] for p in doc["partitions"]) == 2502
    assert all(p["last_seq"] - p["first_seq"] + 1 == p["count"] for p in doc["partitions"])
    payloads = [m.payload for m in _all(broker, q)]
    assert sorted(payloads) == sorted([b"line %d" % i for i in range(2500)] + [b"",
                                                                             b"last without newline"])


def test_publish_json_lines(run, broker, q):
    raw = bytes(range(256))
    lines = [json.dumps({"payload": "text", "key": "k", "headers": {"h": 1, "b": {"$base64": "AAE="}}}),
             "",
             json.dumps({"payload_b64": base64.b64encode(raw).decode()}),
             json.dumps({"payload": "own key", "key": None})]
    ok(run("publish", q, "--format", "jsonl", "--key", "default", "-H", "from=cli",
           input="\n".join(lines) + "\n"))
    by_payload = {m.payload: m for m in _all(broker, q)}
    assert by_payload[b"text"].key == "k"
    assert by_payload[b"text"].headers == {"from": "cli", "h": 1, "b": b"\x00\x01"}
    assert by_payload[raw].key == "default" and by_payload[raw].headers == {"from": "cli"}
    assert by_payload[b"own key"].key is None


@pytest.mark.parametrize("line,fragment", [
    ('{"payload": "x", "paylod": 1}', "unknown field(s) paylod"),
    ('{"key": "k"}', "exactly one of payload"),
    ('{"payload": 5}', "payload must be a string"),
    ('{"payload_b64": "***"}', "not base64"),
    ('{"payload": "x", "key": 7}', "key must be a string"),
    ('[1, 2]', "a message is a JSON object"),
    ('{"queue": "q", "queue_id": 1, "partition": 0, "seq": 0, "payload": "x"}', "partq copy-in"),
    ("not json", "not JSON"),
])
def test_publish_bad_json_lines_name_their_line(run, broker, q, line, fragment):
    good = json.dumps({"payload": "ok"})
    user_error(run("publish", q, "--format", "jsonl", "--batch", "1",
                   input=f"{good}\n{good}\n{line}\n{good}\n"), "line 3", fragment,
               "2 messages before it were published")
    assert len(_all(broker, q)) == 2


def test_publish_too_large_names_the_line_and_the_option(run, broker):
    ok(run("queue", "create", "small", "--max-message-size", "10"))
    line = user_error(run("publish", "small", "--batch", "2", input="ok\nok2\nok3\nmuch too long\n"),
                      "line 4", "--max-message-size=10", "2 messages before it were published",
                      "none from line 3 on")
    assert "max_message_size" not in line
    assert sorted(m.payload for m in _all(broker, "small")) == [b"ok", b"ok2"]


def test_publish_to_a_queue_that_discards_is_an_error(run, broker, q):
    ok(run("queue", "update", q, "--ingress", "off"))
    result = run("publish", q, "a", "b", "--json")
    user_error(result, "discarded 2 messages", "--ingress on")
    assert json.loads(result.stdout)["discarded"] == 2
    ok(run("queue", "update", q, "--reject-when-shutdown", "on"))
    user_error(run("publish", q, "a"), "ingress disabled")


# ---------------------------------------------------------------------- consume
def test_consume_prints_and_does_not_ack_by_default(run, broker, q):
    ok(run("publish", q, "a", "b", "c", "--key", "k"))
    result = ok(run("consume", q, "--max", "2", "--timeout", "5"))
    lines = result.stdout.splitlines()
    assert len(lines) == 2 and lines[0].endswith("  a") and lines[1].endswith("  b")
    assert "key=k" in lines[0] and ":0" in lines[0].split()[0]
    assert "received 2 messages" in result.stderr and "not acked" in result.stderr
    rows = json_lines(ok(run("consume", q, "--timeout", "0.5", "--json")).stdout)
    assert [r["payload"] for r in rows] == ["a", "b", "c"]
    assert [r["redelivered"] for r in rows][:2] == [True, True]  # c may be marked too
    assert all(r["acked"] is False and r["queue"] == q and r["key"] == "k" for r in rows)
    assert set(rows[0]) == {"queue", "partition", "seq", "key", "publish_time_ns", "publish_time",
                            "size", "headers", "redelivered", "delivery_count", "held_behind",
                            "next_retry", "dead_reason", "acked", "action", "payload_encoding",
                            "payload"}
    assert all(r["action"] is None for r in rows)
    assert broker.queue_status(q).depth == 3       # nothing acked


def test_consume_ack_drains(run, broker, q):
    ok(run("publish", q, *[f"m{i}" for i in range(20)]))
    rows = json_lines(ok(run("consume", q, "--ack", "--timeout", "0.5", "--json",
                             "--payload", "base64")).stdout)
    assert sorted(base64.b64decode(r["payload"]) for r in rows) == \
        sorted(b"m%d" % i for i in range(20))
    assert all(r["acked"] and r["payload_encoding"] == "base64" for r in rows)
    assert broker.queue_status(q).depth == 0
    started = time.monotonic()
    assert ok(run("consume", q, "--timeout", "0.3", "--ack")).stdout == ""
    assert time.monotonic() - started < 5


def test_consume_is_served_by_the_delivery_owner_of_another_process(partq_script, data, q):
    """A service owns delivery of the queue (here: this test process binds a flow); the
    `partq consume` process binds through it, and its acks count."""
    with partq.Broker.open(data) as owner:
        service = owner.bind(q, name="service")
        owner.publish_many(q, [(b"p%d" % i, f"k{i}") for i in range(30)])
        proc = run_script(partq_script, data, "consume", q, "--ack", "--json", "--timeout", "3",
                          "--name", "cli", timeout=120)
        assert proc.returncode == 0, proc.stderr
        got = [json.loads(line) for line in proc.stdout.splitlines()]
        # the service held every partition until the rebalance gave the CLI consumer its share
        assert got and {r["payload"] for r in got} <= {f"p{i}" for i in range(30)}
        rest = []
        while more := service.receive(max_messages=100, timeout=0.5):
            rest += more
        service.ack_many(rest)
        assert len(got) + len({(m.partition, m.seq) for m in rest}) >= 30
        assert owner.queue_status(q).depth == 0
        assert f"pid {os.getpid()}" in owner.queue_status(q).delivery_owner
        service.unbind()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_consume_named_runs_until_sigterm(partq_script, data, q, sig):
    """Without --max or --timeout it runs until a signal, bound under its --name; SIGTERM and
    SIGHUP (its terminal closed) end it cleanly, as Ctrl-C does."""
    proc = subprocess.Popen([partq_script, "--data", data, "consume", q, "--ack", "--name",
                             "debugger"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        with partq.Broker.open(data) as b:
            def bound_while_running() -> bool:
                if any(f.name == "debugger" and f.bound for f in b.queue_status(q).flows):
                    return True
                assert proc.poll() is None, proc.communicate()
                return False
            wait_until(bound_while_running, 30, "the consumer to bind", interval=0.05)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "received 0 messages" in err and "Traceback" not in err


def test_publish_and_consume_in_real_processes(partq_script, data, q):
    pub = subprocess.run([partq_script, "--data", data, "publish", q, "--key", "k"],
                         input="one\ntwo\nthree\n", capture_output=True, text=True, timeout=60)
    assert pub.returncode == 0, pub.stderr
    con = run_script(partq_script, data, "consume", q, "--max", "3", "--ack", "--timeout", "10")
    assert con.returncode == 0, con.stderr
    assert [line.split()[-1] for line in con.stdout.splitlines()] == ["one", "two", "three"]
    missing = run_script(partq_script, data, "publish", "nope", "x")
    assert missing.returncode == 1 and missing.stderr.startswith("Error: no queue named 'nope'")
    assert sys.executable  # the script runs under this interpreter's environment
