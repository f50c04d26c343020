"""``partq scale``: the seven steps of the scaling procedure, scaling down (highest partitions and their
messages go), up, with live consumers in another process, and a drain timeout that re-enables ingress."""
from __future__ import annotations

import threading

import pytest
from helpers import wait_until
from tools_helpers import json_lines, ok, run_script, user_error

import partq


def _publish_keyed(broker, queue: str, n: int) -> dict:
    items = [(b"msg-%05d" % i, f"key-{i}") for i in range(n)]
    results = broker.publish_many(queue, items)
    return {(r.partition, r.seq): item for item, r in zip(items, results, strict=True)}


def _stored(run, queue: str) -> dict:
    rows = json_lines(ok(run("inspect", queue, "--limit", "0", "--json")).stdout)
    return {(r["partition"], r["seq"]): (r["payload"].encode(), r["key"]) for r in rows}


def test_scale_down_deletes_the_highest_partitions_and_their_messages(run, broker):
    ok(run("queue", "create", "orders", "-p", "4"))
    published = _publish_keyed(broker, "orders", 200)
    assert {p for p, _ in published} == {0, 1, 2, 3}
    result = ok(run("scale", "orders", "--partitions", "2", "--offline", "--allow-discard",
                    "--no-drain", "--yes"))
    text = result.stdout
    for step in range(1, 8):
        assert f"[{step}/7]" in text
    assert text.index("deleted partition 3") < text.index("deleted partition 2")  # highest first
    assert "ScalingDown 4 -> 2" in text and "scaled from 4 to 2 partitions" in text
    # messages of the removed partitions are gone; the others are intact, seqs and all
    assert _stored(run, "orders") == {k: v for k, v in published.items() if k[0] < 2}
    st = broker.queue_status("orders")
    assert (st.partition_count, st.scaling_status, st.rebalance_status) == (2, "Ready", "Ready")
    assert st.ingress_enabled and [p.partition for p in st.partitions] == [0, 1]
    assert broker.queue_status("orders").discarded == 0
    ok(run("verify", "orders"))
    # the new count is the key mapping now
    res = broker.publish("orders", b"after", key="key-7")
    assert res.partition == partq.key_partition("key-7", 2)


def test_scale_json_is_one_object_per_step(run, broker):
    ok(run("queue", "create", "orders", "-p", "3", "--reject-when-shutdown", "on"))
    published = _publish_keyed(broker, "orders", 30)
    steps = json_lines(ok(run("scale", "orders", "-p", "1", "--offline", "--no-drain", "--yes",
                              "--json")).stdout)
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5, 6, 7]
    assert [s["name"] for s in steps] == ["disable-ingress", "drain", "standby", "change-count",
                                          "rebalance", "standby-follow", "enable-ingress"]
    assert [s["status"] for s in steps] == ["done", "skipped", "skipped", "done", "done",
                                            "skipped", "done"]
    assert all(isinstance(s["seconds"], float) and s["seconds"] >= 0 for s in steps)
    assert steps[0]["publishes"] == "rejected"
    assert steps[1]["depth"] == 30
    assert steps[1]["deleted_at_step_4"] == sum(1 for p, _ in published if p >= 1)
    change = steps[3]
    assert change["from"] == 3 and change["to"] == 1
    progress = [s["step"] for s in change["steps"]]
    assert len(progress) == 4 and progress[0] == "ScalingDown 3 -> 1"
    assert progress[1].startswith("deleted partition 2") and progress[2].startswith("deleted partition 1")
    assert progress[3] == "Ready with 1 partitions"
    assert "no DR-standby attached" in steps[2]["notes"][0]
    assert broker.queue_status("orders").partition_count == 1


def test_scale_up_an_empty_queue(run, broker):
    ok(run("queue", "create", "orders", "-p", "2"))
    text = ok(run("scale", "orders", "-p", "5", "--offline", "--allow-discard", "--yes")).stdout
    assert "ScalingUp 2 -> 5" in text and "created partition 4" in text
    st = broker.queue_status("orders")
    assert (st.partition_count, st.scaling_status, st.rebalance_status) == (5, "Ready", "Ready")
    results = broker.publish_many("orders", [(b"x", f"k{i}") for i in range(100)])
    assert {r.partition for r in results} == {0, 1, 2, 3, 4}


def test_scale_to_the_same_count_changes_nothing(run, broker):
    ok(run("queue", "create", "orders", "-p", "2"))
    assert "nothing to do" in ok(run("scale", "orders", "-p", "2")).stdout
    assert broker.queue_config("orders").ingress_enabled


@pytest.mark.parametrize("as_json", [False, True])
def test_drain_timeout_reenables_ingress_and_exits_1(run, broker, as_json):
    ok(run("queue", "create", "orders", "-p", "4"))
    published = _publish_keyed(broker, "orders", 40)
    args = ["scale", "orders", "-p", "2", "--offline", "--allow-discard", "--drain-timeout", "0.3",
            "--yes"]
    result = run(*args, *(["--json"] if as_json else []))
    user_error(result, "step 2 (drain) timed out", "40 messages left", "ingress is enabled again")
    if as_json:
        steps = json_lines(result.stdout)
        assert [(s["step"], s["status"]) for s in steps] == [(1, "done"), (2, "timeout")]
        assert "timed out" in steps[1]["error"]
    else:
        assert "[2/7] timeout in" in result.stdout and "[3/7]" not in result.stdout
    config = broker.queue_config("orders")
    assert config.ingress_enabled and config.partitions == 4 and config.scaling_status == "Ready"
    assert _stored(run, "orders") == published
    assert not broker.publish("orders", b"accepted again").discarded


def _consume(flows, stop: threading.Event, errors: list) -> None:
    try:
        while not stop.is_set():
            for flow in flows:
                msgs = flow.receive(max_messages=100, timeout=0.02)
                if msgs:
                    flow.ack_many(msgs)
    except Exception as exc:          # pragma: no cover - reported by the test
        errors.append(exc)


def test_scale_with_live_consumers_in_another_process(partq_script, data, run):
    """The test process runs delivery (two consumers acking); the scale runs in a real separate
    process: it waits for the drain, scales, waits until the owner rebalanced, enables ingress."""
    with partq.Broker.open(data) as owner:
        owner.create_queue("orders", partitions=4, rebalance_delay=0, max_handoff_time=0.5)
        flows = [owner.bind("orders", name="c1"), owner.bind("orders", name="c2")]
        owner.publish_many("orders", [(b"m%d" % i, f"k{i}") for i in range(400)])
        stop, errors = threading.Event(), []
        consumer = threading.Thread(target=_consume, args=(flows, stop, errors), daemon=True)
        consumer.start()
        try:
            proc = run_script(partq_script, data, "scale", "orders", "-p", "2", "--offline",
                              "--allow-discard", "--yes", "--json",
                              "--drain-timeout", "30", "--rebalance-timeout", "30")
            assert proc.returncode == 0, proc.stderr
            steps = json_lines(proc.stdout)
            assert [(s["step"], s["status"]) for s in steps] == [
                (1, "done"), (2, "done"), (3, "skipped"), (4, "done"), (5, "done"),
                (6, "skipped"), (7, "done")]
            assert "hold all 2 partitions" in steps[4]["why"]
            assert steps[4]["delivery_owner"]
            st = owner.queue_status("orders")
            assert (st.partition_count, st.rebalance_status, st.scaling_status) == (2, "Ready", "Ready")
            assert all(p.status == "Ready" and p.flow_name in ("c1", "c2") for p in st.partitions)
            assert sorted(len(f.partitions) for f in flows) == [1, 1]
            assert st.ingress_enabled and st.depth == 0
            # and up again, from this process's runner (a Broker other than the owner)
            steps = json_lines(ok(run("scale", "orders", "-p", "6", "--offline", "--allow-discard",
                                      "--yes", "--json",
                                      "--rebalance-timeout", "30")).stdout)
            assert steps[4]["status"] == "done" and "hold all 6 partitions" in steps[4]["why"]
            st = owner.queue_status("orders")
            assert all(p.status == "Ready" and p.flow_name for p in st.partitions)
            assert sorted(len(f.partitions) for f in flows) == [3, 3]
            owner.publish_many("orders", [(b"n%d" % i, f"k{i}") for i in range(120)])
            for _ in range(200):
                if owner.queue_status("orders").depth == 0:
                    break
                stop.wait(0.02)
            assert owner.queue_status("orders").depth == 0
        finally:
            stop.set()
            consumer.join(timeout=10)
        assert not errors
        for flow in flows:
            flow.unbind()


@pytest.mark.parametrize("target", [1, 4])
def test_consumers_after_scaling_while_no_consumer_runs(run, data, target):
    ok(run("queue", "create", "orders", "-p", "2", "--rebalance-delay", "0"))
    with partq.Broker.open(data) as b:
        b.bind("orders", name="svc").unbind()         # the queue had a consumer once
    ok(run("scale", "orders", "-p", target, "--yes"))
    with partq.Broker.open(data) as b:
        b.publish_many("orders", [(b"x%d" % i, f"k{i}") for i in range(40)])
        flow = b.bind("orders", name="svc")
        got = []
        while msgs := flow.receive(max_messages=100, timeout=0.3):
            got += msgs
            flow.ack_many(msgs)
        assert len(got) == 40


def test_scale_is_online_by_default_and_loses_no_publish(run, broker):
    """Issue found by trying it: the offline procedure discarded 21 publishes of a 100 msg/s
    publisher and raised nothing. Online (now the default) keeps ingress on."""
    ok(run("queue", "create", "orders", "-p", "2"))
    stop, results = threading.Event(), []

    def publish() -> None:
        i = 0
        while not stop.is_set() and i < 20_000:
            results.append(broker.publish("orders", b"m%d" % i, key=f"k{i}"))
            i += 1
            stop.wait(0.002)
    publisher = threading.Thread(target=publish, daemon=True)
    publisher.start()
    try:
        wait_until(lambda: len(results) >= 20, 10, "the publisher to start")
        text = ok(run("scale", "orders", "-p", "6")).stdout    # a scale-up online: no question
        n = len(results)
        wait_until(lambda: len(results) >= n + 20, 10, "publishes after the scaling")
    finally:
        stop.set()
        publisher.join(timeout=10)
    # only the steps that do something, unnumbered: the offline ones are not listed
    assert "Disable ingress" not in text and "[4/7]" not in text, text
    assert "Change the partition count" in text and "scaled from 2 to 6" in text
    assert not any(r.discarded for r in results)
    assert broker.queue_status("orders").discarded == 0
    assert broker.queue_config("orders").ingress_enabled


def test_offline_refuses_a_queue_that_would_discard_unless_allowed(run, broker):
    ok(run("queue", "create", "orders", "-p", "2"))
    user_error(run("scale", "orders", "-p", "3", "--offline", "--yes"),
               "DISCARDS publishes", "--reject-when-shutdown on", "--allow-discard")
    assert broker.queue_config("orders").partitions == 2
    ok(run("queue", "update", "orders", "--reject-when-shutdown", "on"))
    ok(run("scale", "orders", "-p", "3", "--offline", "--yes"))        # rejects: allowed
    assert broker.queue_config("orders").partitions == 3
    user_error(run("scale", "orders", "-p", "2", "--no-drain", "--yes"), "--offline only")


def test_an_online_scale_down_deletes_nothing_and_says_so(run, broker):
    ok(run("queue", "create", "orders", "-p", "4", "--rebalance-delay", "0"))
    published = _publish_keyed(broker, "orders", 40)
    flow = broker.bind("orders")
    stop, errors, acked = threading.Event(), [], []

    def consume() -> None:
        try:
            while not stop.is_set():
                msgs = flow.receive(100, timeout=0.05)
                if msgs:
                    flow.ack_many(msgs)
                    acked.extend((m.partition, m.seq) for m in msgs)
        except Exception as exc:          # pragma: no cover - reported by the test
            errors.append(exc)
    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    try:
        text = ok(run("scale", "orders", "-p", "2", "--yes")).stdout
    finally:
        stop.set()
        consumer.join(timeout=10)
    assert not errors
    assert "deleted" not in text and "scaled from 4 to 2" in text
    assert sorted(acked) == sorted(published)        # every message of 2 and 3 delivered too


def test_only_a_scale_that_stops_or_removes_something_asks_first(run):
    """Without a terminal, an online scale-up runs at once (README's example, in a script);
    a scale-down, the offline procedure and a resume still want --yes."""
    ok(run("queue", "create", "orders", "-p", "2"))
    ok(run("scale", "orders", "-p", "4"))
    for args in (["-p", "2"], ["-p", "6", "--offline", "--allow-discard"]):
        refused = run("scale", "orders", *args)
        assert refused.exit_code == 1 and "pass --yes" in refused.output, refused.output
