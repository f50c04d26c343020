"""``partq dead requeue``: a dead message queue's messages back to their queues (or --to one),
by key and by reason, exactly once across re-runs: after --limit, after an error between a
publish and its acks, and after SIGKILL at every commit."""
from __future__ import annotations

import base64
import collections
import json
import os
import subprocess

import pytest
from tools_helpers import json_lines, ok, option_error, usage_error, user_error

import partq
from partq.delivery.lock import LOCK_DIR, OwnerLock

DEAD_KEYS = {"dead_reason", "origin_queue", "origin_partition", "origin_seq", "delivery_count"}


@pytest.fixture
def queues(run):
    ok(run("queue", "create", "dmq", "-p", "2"))
    for name in ("orders", "billing"):
        ok(run("queue", "create", name, "-p", "2", "--rebalance-delay", "0",
               "--dead-message-queue", "dmq"))


def _bury(broker, items) -> list[tuple[bytes, str | None, dict]]:
    """Dead messages as the dead-letter step writes them, published straight into dmq:
    ``items`` are ``(payload, key, reason, origin, own headers)``; returns what each should be
    once requeued: ``(payload, key, own headers)``."""
    batch, expected = [], []
    for i, (payload, key, reason, origin, own) in enumerate(items):
        headers = {**own, "dead_reason": reason, "origin_partition": 0, "origin_seq": i,
                   "delivery_count": 3}
        if origin is not None:
            headers["origin_queue"] = origin
        batch.append((payload, key, headers))
        expected.append((payload, key, own))
    broker.publish_many("dmq", batch)
    return expected


def _mixed(broker, n: int = 12) -> list:
    """``n`` dead messages: keys k0..k2, reasons rejected/expired/max_redelivery, half from
    orders, half from billing, some with headers of their own."""
    reasons = ("rejected", "expired", "max_redelivery")
    return _bury(broker, [(b"m%02d" % i, f"k{i % 3}", reasons[i % 3],
                           "orders" if i % 2 else "billing", {"mine": i} if i % 4 else {})
                          for i in range(n)])


def _messages(run, queue: str, acked: bool = False) -> list[tuple[bytes, str | None, dict]]:
    """The unacked messages of ``queue`` (every stored one with ``acked``):
    ``(payload, key, headers)``."""
    rows = json_lines(ok(run("inspect", queue, "--limit", "0", "--payload", "base64",
                             "--json")).stdout)
    return [(base64.b64decode(r["payload"]), r["key"], r["headers"] or {}) for r in rows
            if acked or not r["acked"]]


def _requeue(run, *args) -> dict:
    return json.loads(ok(run("dead", "requeue", "dmq", *args, "--json")).stdout)


def _counter(messages) -> collections.Counter:
    return collections.Counter((p, k, json.dumps(h, sort_keys=True)) for p, k, h in messages)


# ---------------------------------------------------------------------- requeue
def test_requeue_sends_real_dead_messages_back_to_their_queues(run, broker, queues):
    ok(run("publish", "orders", "o1", "o2", "--key", "a", "-H", "mine=1"))
    ok(run("publish", "billing", "b1", "--key", "b"))
    ok(run("consume", "orders", "--reject", "--max", "2", "--timeout", "5"))
    (b1,) = broker.publish_many("billing", [(b"b2", None)])
    assert broker.kill_message("billing", b1.partition, b1.seq)
    ok(run("consume", "billing", "--reject", "--max", "1", "--timeout", "5"))
    assert len(_messages(run, "dmq")) == 4
    assert _messages(run, "orders") == _messages(run, "billing") == []
    doc = _requeue(run)
    assert (doc["requeued"], doc["already_requeued"], doc["complete"]) == (4, 0, True)
    assert doc["destinations"] == {"orders": 2, "billing": 2}
    assert sorted(_messages(run, "orders")) == [(b"o1", "a", {"mine": "1"}),
                                                (b"o2", "a", {"mine": "1"})]
    assert sorted(_messages(run, "billing"), key=lambda m: m[0]) == [(b"b1", "b", {}),
                                                                     (b"b2", None, {})]
    assert _messages(run, "dmq") == []
    # the requeued messages are new publishes: delivered afresh, counted from 1
    rows = json_lines(ok(run("consume", "orders", "--ack", "--timeout", "1", "--json")).stdout)
    assert [(r["delivery_count"], r["redelivered"]) for r in rows] == [(1, False), (1, False)]
    again = _requeue(run)
    assert (again["requeued"], again["already_requeued"]) == (0, 0)         # idempotent
    text = ok(run("dead", "requeue", "dmq")).stdout
    assert text.startswith("requeued 0 messages of 'dmq'")


def test_requeue_by_key_and_by_reason_leaves_the_others_untouched(run, broker, queues):
    expected = _mixed(broker)
    before = _messages(run, "dmq")
    seqs = [r["seq"] for r in json_lines(ok(run("inspect", "dmq", "--limit", "0",
                                                "--json")).stdout)]
    by_key = _requeue(run, "--key", "k1")
    assert (by_key["requeued"], by_key["left_unmatched"]) == (4, 8)
    assert by_key["keys"] == ["k1"] and by_key["reasons"] == []
    left = _messages(run, "dmq")
    assert left == [m for m in before if m[1] != "k1"]           # same order, untouched
    remaining = [r["seq"] for r in json_lines(ok(run("inspect", "dmq", "--limit", "0",
                                                     "--json")).stdout) if not r["acked"]]
    assert set(remaining) < set(seqs)
    # key k1 died expired: of the two reasons, only max_redelivery (key k2) is left
    by_reason = _requeue(run, "--reason", "expired", "--reason", "max_redelivery")
    assert by_reason["requeued"] == 4 and by_reason["left_unmatched"] == 4
    assert all(h["dead_reason"] == "rejected" for _, _, h in _messages(run, "dmq"))
    assert _requeue(run, "--reason", "expired")["requeued"] == 0
    rest = _requeue(run)
    assert rest["requeued"] == 4 and rest["left_unmatched"] == 0
    assert _messages(run, "dmq") == []
    back = _messages(run, "orders") + _messages(run, "billing")
    assert _counter(back) == _counter(expected)
    for i, (payload, _, _) in enumerate(expected):
        origin = "orders" if i % 2 else "billing"
        assert payload in {p for p, _, _ in _messages(run, origin)}
    assert not any(DEAD_KEYS & set(h) for _, _, h in back)


def test_requeue_to_another_queue(run, broker, queues):
    expected = _mixed(broker, 6)
    ok(run("queue", "create", "retry"))
    doc = _requeue(run, "--to", "retry", "--reason", "rejected")
    assert doc["to_queue"] == "retry" and doc["destinations"] == {"retry": 2}
    assert _requeue(run, "--to", "retry")["requeued"] == 4
    assert _counter(_messages(run, "retry")) == _counter(expected)
    assert _messages(run, "orders") == _messages(run, "billing") == _messages(run, "dmq") == []


def test_messages_with_nowhere_to_go_stay(run, broker, queues):
    _bury(broker, [(b"lost", None, "rejected", None, {}), (b"gone", "g", "expired", "deleted", {}),
                   (b"ok", None, "rejected", "orders", {})])
    doc = _requeue(run)
    assert doc["requeued"] == 1 and doc["left_no_origin"] == 1
    assert doc["left_origin_missing"] == {"deleted": 1}
    text = ok(run("dead", "requeue", "dmq")).stdout
    assert "1 without an origin queue (pass --to QUEUE)" in text
    assert "1 whose origin queue 'deleted' does not exist" in text
    ok(run("queue", "create", "deleted"))
    assert _requeue(run)["destinations"] == {"deleted": 1}
    ok(run("queue", "create", "spare"))
    assert _requeue(run, "--to", "spare")["requeued"] == 1
    assert _messages(run, "dmq") == []


def test_requeue_with_a_limit_resumes_without_loss_or_duplicates(run, broker, queues):
    expected = _mixed(broker, 11)
    text = ok(run("dead", "requeue", "dmq", "--limit", "1")).stdout
    assert text.startswith("requeued 1 message of 'dmq'") and "stopped at --limit 1" in text
    runs = []
    while True:
        doc = _requeue(run, "--limit", "3", "--batch", "2")
        runs.append(doc["requeued"])
        if doc["complete"]:
            break
        assert doc["requeued"] == 3 and len(runs) < 10
    assert sum(runs) == 10 and runs[:3] == [3, 3, 3]
    assert _counter(_messages(run, "orders") + _messages(run, "billing")) == _counter(expected)
    assert _messages(run, "dmq") == []


def test_an_error_between_publish_and_ack_is_finished_by_the_same_command(run, broker, queues,
                                                                          monkeypatch):
    """The acks of a published batch fail: the same requeue run again acks what it published,
    without publishing it again; a requeue with other options is refused meanwhile."""
    expected = _mixed(broker, 10)
    real = partq.Broker.ack_message
    failures = [1]

    def ack_message(self, queue, partition, seq):
        if failures[0]:
            failures[0] -= 1
            raise partq.StorageFull("injected: the disk is full")
        return real(self, queue, partition, seq)
    monkeypatch.setattr(partq.Broker, "ack_message", ack_message)
    user_error(run("dead", "requeue", "dmq", "--batch", "4"), "injected")
    published = len(_messages(run, "orders") + _messages(run, "billing"))
    assert 0 < published <= 4 and len(_messages(run, "dmq")) >= 10 - 3
    user_error(run("dead", "requeue", "dmq", "--reason", "expired"),
               "an earlier requeue of 'dmq' with other options stopped in the middle",
               "run it again first (`partq dead requeue dmq`)", "--ignore-interrupted")
    doc = _requeue(run, "--batch", "4")
    assert published + doc["requeued"] == 10
    assert doc["already_requeued"] >= 1      # published, its ack failed: acked now, not again
    assert _counter(_messages(run, "orders") + _messages(run, "billing")) == _counter(expected)
    assert _requeue(run, "--reason", "expired")["requeued"] == 0      # no longer refused


def test_ignore_interrupted_goes_on(run, broker, queues, monkeypatch):
    _mixed(broker, 4)

    def ack_message(self, queue, partition, seq):
        raise partq.StorageFull("injected")
    monkeypatch.setattr(partq.Broker, "ack_message", ack_message)
    user_error(run("dead", "requeue", "dmq", "--key", "k0"), "injected")
    monkeypatch.undo()
    user_error(run("dead", "requeue", "dmq"), "`partq dead requeue dmq --key k0`")
    doc = _requeue(run, "--ignore-interrupted")
    assert doc["requeued"] + doc["already_requeued"] == 4


def test_requeue_killed_at_every_commit_loses_and_duplicates_nothing(partq_script, data, run,
                                                                     broker, queues):
    """SIGKILL at the 1st, 2nd, ... commit of successive runs (each continues the last), after
    the commit and before it: in the end every dead message is back once and dmq is empty."""
    expected = _mixed(broker, 7)
    env = {k: v for k, v in os.environ.items() if k != "PARTQ_CRASH_AT"}
    killed = 0
    for point in ("after_commit_before_return", "before_commit"):
        if point == "before_commit":
            expected += _mixed(broker, 7)
        for n in range(1, 60):
            proc = subprocess.run([partq_script, "--data", data, "dead", "requeue", "dmq",
                                   "--batch", "2"], capture_output=True, text=True, timeout=120,
                                  env={**env, "PARTQ_CRASH_AT": f"{point}:{n}"})
            if proc.returncode == 0:
                break
            assert proc.returncode == -9, proc.stderr
            killed += 1
        else:
            pytest.fail(f"{point}: the requeue never finished")
    assert killed >= 10
    assert _messages(run, "dmq") == []
    assert _counter(_messages(run, "orders") + _messages(run, "billing")) == _counter(expected)


def test_two_requeues_of_one_queue_never_run_at_once(run, data, broker, queues):
    _mixed(broker, 2)
    qid = broker.queue_config("dmq").qid
    os.makedirs(os.path.join(data, LOCK_DIR), exist_ok=True)
    lock = OwnerLock(os.path.join(data, LOCK_DIR, f"requeue-{qid}.lock"))
    try:
        user_error(run("dead", "requeue", "dmq"), "another requeue of 'dmq' is running",
                   f"pid {os.getpid()}")
    finally:
        lock.release()
    assert _requeue(run)["requeued"] == 2


def test_requeue_json_shape_and_progress(run, broker, queues, monkeypatch):
    _mixed(broker, 3)
    doc = _requeue(run, "--key", "k0", "--key", "k1")
    assert set(doc) == {"queue", "to_queue", "keys", "reasons", "limit", "requeued",
                        "already_requeued", "destinations", "left_unmatched", "left_no_origin",
                        "left_origin_missing", "complete", "partitions"}
    assert doc["queue"] == "dmq" and doc["keys"] == ["k0", "k1"] and doc["requeued"] == 2
    assert all(set(p) == {"partition", "from_seq", "to_seq", "requeued", "skipped_acked",
                          "skipped_corrupt"} for p in doc["partitions"])
    from partq.tools import output
    monkeypatch.setattr(output, "_isatty", lambda stream: True)
    result = ok(run("dead", "requeue", "dmq"))
    assert "requeuing dmq" in result.stderr and "requeuing" not in result.stdout


@pytest.mark.parametrize("args,fragments", [
    (["nope"], ["no queue named 'nope'"]),
    (["dmq", "--to", "nope"], ["no queue named 'nope'"]),
])
def test_requeue_bad_input_is_one_line(run, queues, args, fragments):
    user_error(run("dead", "requeue", *args), *fragments)


@pytest.mark.parametrize("args,fragments", [
    (["dmq", "--to", "dmq"], ["--to must name another queue than the dead message queue"]),
    (["dmq", "--limit", "-1"], ["--limit must be 0 (no limit) or more"]),
])
def test_requeue_bad_option_values_exit_2(run, queues, args, fragments):
    option_error(run("dead", "requeue", *args), *fragments)


def test_requeue_refuses_what_would_lose_messages(run, broker, queues):
    _mixed(broker, 2)
    ok(run("queue", "update", "dmq", "--ingress", "off"))
    user_error(run("dead", "requeue", "dmq"), "dead message queue 'dmq' has ingress disabled")
    ok(run("queue", "update", "dmq", "--ingress", "on"))
    ok(run("queue", "create", "closed", "--ingress", "off"))
    user_error(run("dead", "requeue", "dmq", "--to", "closed"), "queue 'closed' has ingress "
                                                                "disabled", "--ingress on")
    ok(run("queue", "update", "orders", "--ingress", "off"))
    user_error(run("dead", "requeue", "dmq"), "'orders' has ingress disabled",
               "run the same command again to continue")
    ok(run("queue", "update", "orders", "--ingress", "on"))
    doc = _requeue(run)
    assert doc["complete"] and _messages(run, "dmq") == []
    usage_error(run("dead", "requeue", "dmq", "--reason", "tired"))
