"""Transactions (rule `transactions`): acks, nacks and rejects of received messages and
publishes, in one commit or none, on the three places a flow can be bound (``endpoint_kinds``:
this process's delivery, a peer flow of a second Broker, ``partq.connect`` through a real
``partq serve``)."""
from __future__ import annotations

import pytest
from endpoint_kinds import KINDS, Endpoints
from helpers import wait_until
from test_endpoint_contract import keys_of, take

import partq
from partq.ops.browse import browse

PARTITIONS = 3


@pytest.fixture(params=KINDS)
def kind(request, tmp_path):
    endpoints = Endpoints(request.param, tmp_path)
    yield endpoints
    endpoints.close()


def queues(kind: Endpoints, **config) -> None:
    kind.broker.create_queue("q", partitions=PARTITIONS, rebalance_delay=0.0, **config)
    kind.broker.create_queue("out", partitions=2)


def stored(kind: Endpoints, queue: str) -> list[dict]:
    """The unacked messages of ``queue``, read without consuming."""
    return [m for m in browse(kind.broker.store, queue, limit=0) if not m["acked"]]


def outputs(kind: Endpoints) -> list[bytes]:
    return sorted(m["payload"] for m in stored(kind, "out"))


def test_acks_and_publishes_commit_together_and_nothing_shows_before(kind):
    queues(kind)
    flow = kind.bind("q", name="a")
    kind.broker.publish_many("q", [(b"m%d" % i, f"k{i}") for i in range(6)])
    got = take(flow, 6)
    with kind.binder().transaction() as tx:
        for m in got:
            tx.publish("out", m.payload.upper(), key=m.key)
            tx.ack(m)
        tx.publish_many("out", [(b"extra", "e")])
        # buffered only: no consumer, status or browse sees any of it yet
        assert outputs(kind) == [] and kind.broker.queue_status("q").depth == 6
    assert tx.state == "committed"
    assert outputs(kind) == sorted([m.payload.upper() for m in got] + [b"extra"])
    wait_until(lambda: kind.broker.queue_status("q").depth == 0, timeout=30, what="acks")
    assert flow.unacked == 0


def test_an_exception_in_the_block_aborts_it_and_the_messages_stay_with_their_flow(kind):
    queues(kind)
    flow = kind.bind("q", name="a")
    kind.broker.publish_many("q", [(b"m%d" % i, f"k{i}") for i in range(3)])
    got = take(flow, 3)
    with pytest.raises(RuntimeError), kind.binder().transaction() as tx:
        tx.publish("out", b"x")
        tx.ack(got[0])
        raise RuntimeError("the handler failed")
    assert tx.state == "aborted" and outputs(kind) == []
    with pytest.raises(partq.InvalidConfig):
        tx.ack(got[1])                          # an ended transaction takes nothing more
    with kind.binder().transaction() as tx:     # still in flight: a new transaction takes them
        tx.publish("out", b"y")
        for m in got:
            tx.ack(m)
    assert outputs(kind) == [b"y"]
    wait_until(lambda: kind.broker.queue_status("q").depth == 0, timeout=30, what="acks")


def test_a_message_is_consumed_by_one_transaction_only(kind):
    queues(kind)
    flow = kind.bind("q", name="a")
    kind.broker.publish("q", b"once", key="k")
    [m] = take(flow, 1)
    with kind.binder().transaction() as tx:
        tx.ack(m)
        tx.publish("out", b"1")
    with pytest.raises(partq.FlowFenced), kind.binder().transaction() as tx:
        tx.ack(m)                               # acked already: its output exists
        tx.publish("out", b"2")
    with pytest.raises(partq.InvalidAck), kind.binder().transaction() as tx:
        tx.ack(m)
        tx.nack(m)                              # once per transaction
    assert outputs(kind) == [b"1"]


def test_a_quota_refusal_aborts_everything_with_queue_full(kind):
    kind.broker.create_queue("q", partitions=PARTITIONS, rebalance_delay=0.0)
    kind.broker.create_queue("out", partitions=1, max_depth=2, reject_msg_to_sender=False)
    flow = kind.bind("q", name="a")
    kind.broker.publish_many("q", [(b"m%d" % i, f"k{i}") for i in range(3)])
    got = take(flow, 3)
    with pytest.raises(partq.QueueFull), kind.binder().transaction() as tx:
        for m in got:                           # 3 > max_depth 2: refused whole, although the
            tx.publish("out", m.payload)        # queue would discard a plain publish
            tx.ack(m)
    assert outputs(kind) == [] and kind.broker.queue_status("q").depth == 3
    assert kind.broker.queue_status("out").quota_refused == 3
    with kind.binder().transaction() as tx:     # two fit; the third is acked alone
        for m in got:
            tx.ack(m)
        tx.publish_many("out", [b"a", b"b"])
    assert outputs(kind) == [b"a", b"b"]


def test_nack_and_reject_in_a_transaction(kind):
    kind.broker.create_queue("dmq", partitions=1)
    queues(kind, dead_message_queue="dmq")
    flow = kind.bind("q", name="a")
    key = keys_of(0, 1)[0]
    kind.broker.publish_many("q", [(b"a", key), (b"b", key)])
    a, b = take(flow, 2)
    with kind.binder().transaction() as tx:
        tx.reject(a)
        tx.nack(b, delay=0)
        tx.publish("out", b"seen")
    [dead] = stored(kind, "dmq")
    assert dead["payload"] == b"a" and dead["headers"]["dead_reason"] == "rejected"
    [again] = take(flow, 1)
    assert (again.payload, again.redelivered, again.delivery_count) == (b"b", True, 2)
    with kind.binder().transaction() as tx:
        tx.ack(again)
    assert outputs(kind) == [b"seen"]


def test_a_transaction_whose_flow_lost_a_partition_to_a_handoff_commits_nothing(kind):
    queues(kind, max_handoff_time=0.3)
    one = kind.bind("q", name="one")
    kind.broker.publish_many("q", [(b"m%d" % i, f"k{i}") for i in range(30)])
    got = take(one, 30)
    two = kind.bind("q", name="two")            # a rebalance hands partitions of one to two;
    wait_until(lambda: two.partitions, timeout=30, what="the handoff to time out")
    moved = [m for m in got if m.partition in two.partitions]
    assert moved
    with pytest.raises(partq.FlowFenced), kind.binder().transaction() as tx:
        for m in got:                           # one never acks: the handoff times out
            tx.publish("out", m.payload)
            tx.ack(m)
    assert outputs(kind) == []                  # nothing of it: not the kept partitions either
    again = take(two, len(moved))
    assert all(m.redelivered for m in again)
    with kind.binder().transaction() as tx:
        for m in again:
            tx.publish("out", m.payload)
            tx.ack(m)
    kept = [m for m in got if m.partition not in two.partitions]
    with kind.binder().transaction() as tx:
        for m in kept:
            tx.publish("out", m.payload)
            tx.ack(m)
    assert outputs(kind) == sorted(m.payload for m in got)      # each exactly once


def test_an_asyncio_client_commits_with_async_with(tmp_path):
    import asyncio
    kind = Endpoints("remote", tmp_path)
    try:
        queues(kind)
        kind.broker.publish_many("q", [(b"m%d" % i, f"k{i}") for i in range(4)])
        client = partq.aio.AsyncClient(kind.binder())

        async def main() -> None:
            flow = await client.bind("q", name="a")
            got: list = []
            while len(got) < 4:
                got += await flow.receive(4 - len(got), timeout=1)
            async with client.transaction() as tx:
                for m in got:
                    tx.publish("out", m.payload)
                    tx.ack(m)
            assert tx.state == "committed"
        asyncio.run(main())
        assert outputs(kind) == [b"m0", b"m1", b"m2", b"m3"]
    finally:
        kind.close()


def test_a_transaction_sent_again_under_its_id_is_answered_committed_once(tmp_path):
    kind = Endpoints("remote", tmp_path)
    try:
        queues(kind)
        client = kind.binder()
        flow = kind.bind("q", name="a")
        kind.broker.publish("q", b"m", key="k")
        [m] = take(flow, 1)
        tx = client.transaction()
        tx.ack(m)
        tx.publish("out", b"result")
        tx.commit()
        again = client.transaction()        # its answer was lost: the same request again
        again.txn_id = tx.txn_id
        again.publish("out", b"result")
        again.commit()
        assert again.state == "committed" and outputs(kind) == [b"result"]
    finally:
        kind.close()
