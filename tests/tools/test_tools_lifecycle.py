"""The message lifecycle from the command line: publish --ttl, consume --nack and --reject, the
lifecycle counts of queue show and stats, and message kill|ack unblocking a partition (a consumer
in another process included)."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from helpers import wait_until
from tools_helpers import json_lines, ok, option_error, usage_error, user_error

import partq
from partq.tools import common


@pytest.fixture
def jobs(run):
    """Queue jobs (one partition, so its messages keep one order) with dead message queue dmq."""
    ok(run("queue", "create", "dmq", "-p", "2"))
    ok(run("queue", "create", "jobs", "--rebalance-delay", "0", "--dead-message-queue", "dmq"))
    return "jobs"


def _dead(run, queue: str = "dmq") -> list[dict]:
    """The unacked messages of ``queue`` as `partq inspect --json` shows them."""
    rows = json_lines(ok(run("inspect", queue, "--limit", "0", "--json")).stdout)
    return [r for r in rows if not r["acked"]]


# ---------------------------------------------------------------------- publish --ttl
def test_publish_ttl_then_consume_after_expiry_delivers_nothing(run, broker, jobs):
    doc = json.loads(ok(run("publish", jobs, "short", "--ttl", "0.2", "--json")).stdout)
    assert doc["published"] == 1
    ok(run("publish", jobs, "long", "--ttl", "3600"))
    (short,) = [r for r in _dead(run, jobs) if r["payload"] == "short"]
    expires_ns = short["publish_time_ns"] + 200_000_000
    wait_until(lambda: time.time_ns() > expires_ns, 10, "the TTL to pass on the wall clock")
    rows = json_lines(ok(run("consume", jobs, "--ack", "--timeout", "1", "--json")).stdout)
    assert [r["payload"] for r in rows] == ["long"]
    (dead,) = wait_until(lambda: _dead(run), 10, "the expired message in the dead message queue")
    assert dead["payload"] == "short"
    assert dead["headers"]["dead_reason"] == "expired"
    assert dead["headers"]["origin_queue"] == jobs and dead["headers"]["origin_seq"] == short["seq"]
    assert broker.queue_status(jobs).dead["expired"] == 1


@pytest.mark.parametrize("ttl", ["-1", "nan", "inf", "1e12"])
def test_publish_refuses_a_bad_ttl(run, jobs, ttl):
    option_error(run("publish", jobs, "x", "--ttl", ttl), "--ttl must be a number of seconds")
    assert _dead(run, jobs) == []


def test_publish_over_a_quota_says_what_was_published(run, broker, jobs):
    ok(run("queue", "update", jobs, "--max-depth", "3"))
    user_error(run("publish", jobs, "--batch", "2", input="a\nb\nc\nd\n"), "is full",
               "max_depth=3", "2 messages before it were published")
    ok(run("queue", "update", jobs, "--reject-msg-to-sender", "off"))
    result = run("publish", jobs, "e", "f", "--json")
    user_error(result, "discarded 2 messages", "quota")
    assert json.loads(result.stdout)["discarded"] == 2
    shown = json.loads(ok(run("queue", "show", jobs, "--json")).stdout)["status"]
    assert (shown["quota_refused"], shown["quota_discarded"]) == (2, 2)    # messages, c d and e f
    row = json.loads(ok(run("stats", jobs, "--json")).stdout)["queues"][0]
    assert row["quota_refused"] == 2 and row["dead"] == 0


# ---------------------------------------------------------------------- consume --reject, --nack
def test_consume_reject_moves_each_message_to_the_dead_message_queue(run, broker, jobs):
    ok(run("publish", jobs, "a", "b", "c", "--key", "k", "-H", "mine=1"))
    result = ok(run("consume", jobs, "--reject", "--max", "2", "--timeout", "5", "--json"))
    rows = json_lines(result.stdout)
    assert [(r["payload"], r["action"], r["acked"], r["delivery_count"]) for r in rows] == \
        [("a", "reject", False, 1), ("b", "reject", False, 1)]
    dead = _dead(run)
    assert sorted(r["payload"] for r in dead) == ["a", "b"]
    for r in dead:
        assert r["key"] == "k" and r["headers"]["mine"] == "1"
        assert r["headers"]["dead_reason"] == "rejected" and r["headers"]["delivery_count"] == 1
    assert [r["payload"] for r in _dead(run, jobs)] == ["c"]       # the rest flows on
    text = ok(run("consume", jobs, "--reject", "--timeout", "0.5"))
    assert "delivery_count=1" in text.stdout and "rejected" in text.stderr
    assert broker.queue_status(jobs).dead["rejected"] == 3


def test_consume_nack_with_max_redelivery_1_ends_them_after_2_deliveries(run, broker, jobs):
    ok(run("queue", "update", jobs, "--max-redelivery", "1"))
    ok(run("publish", jobs, "p1", "p2"))
    rows = json_lines(ok(run("consume", jobs, "--nack", "--timeout", "1", "--json")).stdout)
    assert all(r["action"] == "nack" for r in rows)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["payload"]] = max(counts.get(r["payload"], 0), r["delivery_count"])
        assert r["redelivered"] == (r["delivery_count"] > 1) or r["payload"] == "p2"
    assert counts == {"p1": 2, "p2": 2}           # delivered twice each, then dead
    dead = sorted(_dead(run), key=lambda r: r["payload"])
    assert [(r["payload"], r["headers"]["dead_reason"], r["headers"]["delivery_count"])
            for r in dead] == [("p1", "max_redelivery", 2), ("p2", "max_redelivery", 2)]
    assert broker.queue_status(jobs).depth == 0


def test_consume_shows_delivery_counts_as_they_grow(run, broker, jobs):
    ok(run("publish", jobs, "again"))
    first = ok(run("consume", jobs, "--max", "1", "--timeout", "5")).stdout
    assert "delivery_count=1" in first and "redelivered" not in first
    second = json_lines(ok(run("consume", jobs, "--max", "1", "--timeout", "5", "--json")).stdout)
    assert (second[0]["redelivered"], second[0]["delivery_count"]) == (True, 2)


@pytest.mark.parametrize("flags", [["--ack", "--nack"], ["--ack", "--reject"],
                                   ["--nack", "--reject"], ["--ack", "--nack", "--reject"]])
def test_consume_ack_nack_and_reject_exclude_each_other(run, jobs, flags):
    result = run("consume", jobs, *flags, "--timeout", "0")
    usage_error(result)
    assert result.stderr.splitlines()[-1] == "Error: pass at most one of --ack, --nack and --reject"


# ---------------------------------------------------------------------- queue show, stats
def test_queue_show_and_stats_count_dead_messages(run, broker, jobs):
    ok(run("queue", "update", jobs, "--max-redelivery", "2", "--redelivery-delay", "0.5"))
    ok(run("publish", jobs, "a", "b", "c"))
    ok(run("consume", jobs, "--reject", "--max", "2", "--timeout", "5"))
    broker.update_queue(jobs, dead_message_queue="")
    ok(run("consume", jobs, "--reject", "--max", "1", "--timeout", "5"))
    doc = json.loads(ok(run("queue", "show", jobs, "--json")).stdout)
    assert doc["config"]["max_redelivery"] == 2 and doc["config"]["redelivery_delay"] == 0.5
    status = doc["status"]
    assert status["dead"] == {"max_redelivery": 0, "expired": 0, "rejected": 3, "discarded": 1}
    assert {"quota_refused", "quota_discarded", "delayed"} <= set(status)
    text = ok(run("queue", "show", jobs)).stdout
    assert "dead messages 3 (max_redelivery 0, expired 0, rejected 3), of them discarded 1" in text
    assert "quota refused 0, quota discarded 0" in text and "nack's delay 0" in text
    assert re.search(r"\n  max_redelivery +2\n", text)
    rows = {q["name"]: q for q in json.loads(ok(run("stats", "--json")).stdout)["queues"]}
    assert (rows[jobs]["dead"], rows[jobs]["quota_refused"]) == (3, 0)
    assert rows["dmq"]["dead"] == 0
    stats = ok(run("stats")).stdout
    assert "DEAD" in stats and "QUOTA REFUSED" in stats


# ---------------------------------------------------------------------- message kill | ack
def _poison(broker, queue: str) -> list:
    """A poison message at the head of ``queue``'s one partition, then two good ones."""
    return broker.publish_many(queue, [(b"poison", "k"), (b"good-1", "k"), (b"good-2", "k")])


def test_message_kill_moves_the_head_and_the_partition_flows_on(run, broker, jobs):
    poison, *_ = _poison(broker, jobs)
    with broker.bind(jobs) as flow:
        (held,) = flow.receive(1, timeout=5)
        assert held.payload == b"poison"
        flow.nack(held)                           # it keeps coming back: the partition is stuck
        assert [m.payload for m in flow.receive(1, timeout=5)] == [b"poison"]
        doc = json.loads(ok(run("message", "kill", jobs, poison.partition, poison.seq, "--yes",
                                "--json")).stdout)
        assert doc == {"queue": jobs, "partition": poison.partition, "seq": poison.seq,
                       "killed": True, "outcome": "moved", "dead_message_queue": "dmq"}
        got = []
        wait_until(lambda: got.extend(m.payload for m in flow.receive(10, timeout=0.2))
                   or len(got) >= 2, 10, "the next messages")
        assert got == [b"good-1", b"good-2"]
    (dead,) = _dead(run)
    assert dead["payload"] == "poison" and dead["headers"]["dead_reason"] == "rejected"
    again = json.loads(ok(run("message", "kill", jobs, poison.partition, poison.seq, "--yes",
                              "--json")).stdout)
    assert (again["killed"], again["outcome"], again["dead_message_queue"]) == \
        (False, "already_acked", None)
    assert "was acked already; nothing changed" in ok(
        run("message", "kill", jobs, poison.partition, poison.seq, "--yes")).stdout


def test_message_kill_without_a_dead_message_queue_discards(run, broker):
    ok(run("queue", "create", "solo"))
    (res,) = broker.publish_many("solo", [b"x"])
    text = ok(run("message", "kill", "solo", res.partition, res.seq, "--yes")).stdout
    assert "discarded, counted" in text
    assert broker.queue_status("solo").dead == {"max_redelivery": 0, "expired": 0,
                                                "rejected": 1, "discarded": 1}


def test_message_ack_unblocks_a_partition_held_by_a_consumer_in_another_process(
        run, data, broker, jobs):
    """A service in another process keeps nacking a poison message at the head of the
    partition; `partq message ack` removes it, and the service gets the next messages."""
    poison, *_ = _poison(broker, jobs)
    code = textwrap.dedent("""
        import sys, partq
        with partq.Broker.open(sys.argv[1]) as b:
            flow = b.bind(sys.argv[2], name="service")
            while True:
                for m in flow.receive(10, timeout=0.2):
                    if m.payload == b"poison":
                        print("nacked", m.delivery_count, flush=True)
                        flow.nack(m)        # it and the rest of the batch come back
                        break
                    else:
                        print("got", m.payload.decode(), flush=True)
                        flow.ack(m)
                        if m.payload == b"good-2":
                            sys.exit(0)
    """)
    env = {k: v for k, v in os.environ.items() if k != "PARTQ_CRASH_AT"}
    proc = subprocess.Popen([sys.executable, "-c", code, data, jobs], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        lines: list[str] = []

        def nacked_twice() -> bool:
            lines.append(proc.stdout.readline().strip())
            assert proc.poll() is None or lines[-1], proc.stderr.read()
            return sum(line.startswith("nacked") for line in lines) >= 2
        wait_until(nacked_twice, 30, "the service to nack the poison message twice")
        assert f"pid {proc.pid}" in (broker.queue_status(jobs).delivery_owner or "")
        doc = json.loads(ok(run("message", "ack", jobs, poison.partition, poison.seq, "--yes",
                                "--json")).stdout)
        assert doc == {"queue": jobs, "partition": poison.partition, "seq": poison.seq,
                       "acked": True, "outcome": "acked"}
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err
    assert [line for line in (lines + out.splitlines()) if line.startswith("got")] == \
        ["got good-1", "got good-2"]
    assert broker.queue_status(jobs).depth == 0 and _dead(run) == []
    assert "was acked already" in ok(run("message", "ack", jobs, poison.partition, poison.seq,
                                         "--yes")).stdout


def test_message_commands_ask_on_a_terminal_and_refuse_without_one(run, broker, jobs,
                                                                   monkeypatch):
    poison, *_ = _poison(broker, jobs)
    where = [jobs, poison.partition, poison.seq]
    user_error(run("message", "kill", *where), "not confirmed (no terminal to ask on)", "--yes")
    monkeypatch.setattr(common, "interactive", lambda: True)
    answered_no = run("message", "ack", *where, input="n\n")
    assert answered_no.exit_code == 1
    assert "Ack message 0 of partition 0 of queue 'jobs' (key k, 6 bytes)?" in answered_no.stderr
    assert answered_no.stderr.splitlines()[-1] == "Error: cancelled; nothing was changed"
    asked = run("message", "kill", *where, input="y\n")
    assert "It is moved to dead message queue 'dmq'" in ok(asked).stderr
    assert "killed message 0 of partition 0" in asked.stdout
    # acked already: nothing to ask about
    assert "acked already" in ok(run("message", "kill", *where)).stdout


def test_message_positions_of_an_exclusive_queue_are_parent(run, broker):
    ok(run("queue", "create", "ex", "--access-type", "exclusive"))
    (res,) = broker.publish_many("ex", [b"x"])
    assert res.partition == partq.PARENT
    doc = json.loads(ok(run("message", "ack", "ex", "parent", res.seq, "--yes", "--json")).stdout)
    assert doc["acked"] is True and doc["partition"] == partq.PARENT
    assert broker.queue_status("ex").depth == 0


@pytest.mark.parametrize("args,fragments", [
    (["nope", "0", "0"], ["no queue named 'nope'"]),
    (["jobs", "7", "0"], ["queue 'jobs' has", "no partition 7"]),
    (["jobs", "0", "5"], ["has no seq 5"]),
    (["jobs", "0", "-1"], ["SEQ must be 0 or more, not -1"]),
    (["jobs", "-2", "0"], ["PARTITION must be a partition number (0 or more) or parent"]),
])
@pytest.mark.parametrize("command", ["kill", "ack"])
def test_message_bad_positions_are_one_line(run, jobs, command, args, fragments):
    user_error(run("message", command, *args, "--yes"), *fragments)
    user_error(run("message", command, *args), *fragments)     # before any question


def test_message_partition_must_be_a_number_or_parent(run, jobs):
    usage_error(run("message", "kill", jobs, "zero", "0", "--yes"))
    usage_error(run("message", "ack", jobs, "0", "first", "--yes"))


def test_stats_counts_the_publishes_a_quota_discarded(run, broker):
    """`queue show` said "quota discarded 2" while `stats` said DISCARDED 0."""
    ok(run("queue", "create", "small", "-p", "1", "--max-depth", "1",
           "--reject-msg-to-sender", "off"))
    for payload in ("kept", "dropped-1", "dropped-2"):
        broker.publish("small", payload.encode())
    assert broker.queue_status("small").quota_discarded == 2
    (row,) = json.loads(ok(run("stats", "small", "--json")).stdout)["queues"]
    assert (row["discarded"], row["quota_discarded"]) == (0, 2)
    table = ok(run("stats", "small")).stdout.splitlines()
    header = table.index(next(line for line in table if line.startswith("QUEUE")))
    columns, values = table[header].split(), table[header + 1].split()
    assert values[columns.index("DISCARDED")] == "2", table
