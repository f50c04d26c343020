"""The poison view: an operator finds the message a partition is stuck on (its seq, key,
delivery count, next retry and age) from `queue show`, `inspect --json`, `consume --json` and
`stats`, without guessing it from the ack floor; messages a nack gave back only to keep order
are said to be "held behind", not redelivered."""
from __future__ import annotations

import json
import time

import pytest
from tools_helpers import json_lines, ok


@pytest.fixture
def jobs(run):
    ok(run("queue", "create", "dmq"))
    ok(run("queue", "create", "jobs", "--rebalance-delay", "0", "--dead-message-queue", "dmq",
           "--redelivery-delay", "60"))
    return "jobs"


def _stuck(broker, queue: str) -> list:
    """Publish a poison message and two more of its key to ``queue``, deliver the poison one
    twice (nacked, the second time with a 60 s delay) and return the publish results."""
    results = broker.publish_many(queue, [(b"poison", "k"), (b"good-1", "k"), (b"good-2", "k")])
    with broker.bind(queue) as flow:
        (m,) = flow.receive(1, timeout=5)
        flow.nack(m, delay=0)
        (m,) = flow.receive(1, timeout=5)
        assert (m.payload, m.delivery_count) == (b"poison", 2)
        flow.nack(m)                     # the queue's rule: 60 s * 2, capped at 64 s
    return results


def test_queue_show_names_the_message_a_partition_is_stuck_on(run, broker, jobs):
    poison, *_ = _stuck(broker, jobs)
    before = time.time()
    status = json.loads(ok(run("queue", "show", jobs, "--json")).stdout)["status"]
    blocked = status["partitions"][0]["blocked"]
    assert (blocked["partition"], blocked["seq"], blocked["key"], blocked["delivery_count"],
            blocked["behind"]) == (poison.partition, poison.seq, "k", 3, 2)
    assert before + 50 < blocked["next_retry"] < before + 70
    assert before - 60 < blocked["publish_time_ns"] / 1e9 <= before
    assert status["stuck_partitions"] == 1
    assert status["oldest_unacked_ns"] == blocked["publish_time_ns"]
    text = ok(run("queue", "show", jobs)).stdout
    assert "BLOCKED: 1 partition stuck" in text
    row = next(line for line in text.splitlines() if line.strip().startswith("0    0  k"))
    assert " 3 " in row and "in 6" in row, text     # count 3, retried in ~64 s (the max)
    assert f"partq message kill {jobs} 0 0" in text
    assert "0 keys, 0 messages" not in text           # the old HELD text of a whole partition


def test_a_queue_with_nothing_stuck_shows_no_blocked_section(run, broker, jobs):
    broker.publish(jobs, b"fine")
    text = ok(run("queue", "show", jobs)).stdout
    assert "BLOCKED" not in text
    status = json.loads(ok(run("queue", "show", jobs, "--json")).stdout)["status"]
    assert status["stuck_partitions"] == 0 and status["partitions"][0]["blocked"] is None


def test_stats_counts_stuck_partitions_and_the_oldest_unacked_age(run, broker, jobs):
    _stuck(broker, jobs)
    rows = {q["name"]: q for q in json.loads(ok(run("stats", "--json")).stdout)["queues"]}
    assert rows[jobs]["stuck_partitions"] == 1
    assert rows[jobs]["oldest_unacked_publish_time_ns"] <= time.time_ns()
    assert (rows["dmq"]["stuck_partitions"], rows["dmq"]["oldest_unacked_publish_time_ns"]) == \
        (0, None)
    table = ok(run("stats")).stdout.splitlines()
    header = next(i for i, line in enumerate(table) if line.startswith("QUEUE"))
    line = next(line for line in table[header + 1:] if line.startswith(jobs))
    end = table[header].index("STUCK") + len("STUCK")     # numbers are right-aligned
    assert line[:end].split()[-1] == "1" and "OLDEST" in table[header]


def test_inspect_json_carries_the_lifecycle_of_each_message(run, broker, jobs):
    poison, good, _ = _stuck(broker, jobs)
    rows = {r["seq"]: r for r in json_lines(ok(run("inspect", jobs, "--json")).stdout)}
    assert (rows[poison.seq]["delivery_count"], rows[poison.seq]["redelivered"]) == (3, True)
    assert rows[poison.seq]["next_retry"] > time.time() + 30
    assert rows[poison.seq]["dead_reason"] is None
    # given back only to keep order: not counted, no delay of its own
    assert (rows[good.seq]["delivery_count"], rows[good.seq]["redelivered"],
            rows[good.seq]["next_retry"]) == (1, False, None)
    ok(run("message", "kill", jobs, poison.partition, poison.seq, "--yes"))
    (dead,) = json_lines(ok(run("inspect", "dmq", "--json")).stdout)
    assert (dead["dead_reason"], dead["delivery_count"], dead["redelivered"]) == \
        ("rejected", 1, False)


def _nack_first_of_two(broker, queue: str, payloads: tuple[bytes, bytes]) -> None:
    """Publish two messages of one key, receive both and nack the first: the second comes
    back with it, marked redelivered but not counted."""
    broker.publish_many(queue, [(payloads[0], "k"), (payloads[1], "k")])
    with broker.bind(queue) as flow:
        msgs = flow.receive(2, timeout=5)
        assert [m.payload for m in msgs] == list(payloads)
        flow.nack(msgs[0])
        again = flow.receive(2, timeout=5)
        assert [(m.redelivered, m.delivery_count) for m in again] == [(True, 2), (True, 1)]
        flow.nack(again[0])       # once more, so that they are this test's deliveries again
        broker.update_queue(queue, max_redelivery=2)


def test_consume_says_held_behind_for_a_message_a_nack_gave_back_uncounted(run, broker, jobs):
    ok(run("queue", "update", jobs, "--redelivery-delay", "0"))
    _nack_first_of_two(broker, jobs, (b"first", b"second"))
    text = ok(run("consume", jobs, "--ack", "--max", "2", "--timeout", "5")).stdout.splitlines()
    assert "redelivered" in text[0] and "delivery_count=3" in text[0]
    assert "held behind" in text[1] and "redelivered" not in text[1], text


def test_consume_json_carries_the_lifecycle(run, broker, jobs):
    ok(run("queue", "update", jobs, "--redelivery-delay", "0"))
    _nack_first_of_two(broker, jobs, (b"third", b"fourth"))
    rows = json_lines(ok(run("consume", jobs, "--nack", "--max", "2", "--timeout", "5",
                             "--json")).stdout)
    assert [(r["payload"], r["delivery_count"], r["held_behind"]) for r in rows] == \
        [("third", 3, False), ("fourth", 1, True)]
    # third had its 1 + max_redelivery deliveries: the nack makes it dead
    assert (rows[0]["dead_reason"], rows[0]["next_retry"]) == ("max_redelivery", None)
    ok(run("queue", "update", jobs, "--redelivery-delay", "30"))
    rows = json_lines(ok(run("consume", jobs, "--nack", "--max", "1", "--timeout", "5",
                             "--json")).stdout)
    assert rows[0]["payload"] == "fourth" and rows[0]["dead_reason"] is None
    assert time.time() + 20 < rows[0]["next_retry"] < time.time() + 40
    rows = json_lines(ok(run("consume", jobs, "--reject", "--timeout", "0.5", "--json")).stdout)
    assert rows == []                 # fourth waits out its delay
    (left,) = json_lines(ok(run("inspect", jobs, "--json")).stdout)[-1:]
    assert left["payload"] == "fourth" and left["next_retry"] > time.time() + 20


def test_a_dead_message_queue_that_does_not_exist_is_warned_about(run):
    """`--dead-message-queue jobs.dead` while jobs.dead does not exist: dead messages would be
    discarded; create and update say so, in text and in --json warnings."""
    result = ok(run("queue", "create", "jobs", "--dead-message-queue", "jobs.dead"))
    assert "Warning: dead message queue 'jobs.dead' does not exist" in result.stderr
    assert "partq queue create jobs.dead" in result.stderr
    doc = json.loads(ok(run("queue", "update", "jobs", "--dead-message-queue", "nope",
                            "--json")).stdout)
    assert doc["warnings"] and "'nope' does not exist" in doc["warnings"][0]
    ok(run("queue", "create", "jobs.dead"))
    doc = json.loads(ok(run("queue", "update", "jobs", "--dead-message-queue", "jobs.dead",
                            "--json")).stdout)
    assert "warnings" not in doc
    ok(run("queue", "update", "jobs.dead", "--ingress", "off"))
    result = ok(run("queue", "update", "jobs", "--dead-message-queue", "jobs.dead"))
    assert "has its ingress off" in result.stderr
