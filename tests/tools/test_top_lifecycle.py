"""``partq top`` shows the message lifecycle (rules `dead-messages`, `retry-delay`, `quota`): its
--json has each queue's dead messages by reason, their total, delayed partitions and the quota's
refusals and discards, after real dead-lettering on a directory; the live view has them in a
table of the queues that have any, readable in 80 columns."""
from __future__ import annotations

import dataclasses
import json

import pytest
from tools_helpers import ok

import partq
from partq.metrics.sampling import Snapshot, rates
from partq.status import PartitionStatus, QueueStatus


def test_top_json_shows_dead_messages_delays_and_quota_refusals(run, data):
    clock = partq.ManualClock(1000.0)
    with partq.Broker.open(data, clock=clock) as broker:
        broker.create_queue("dmq", partitions=1)
        broker.create_queue("jobs", partitions=1, max_redelivery=1, dead_message_queue="dmq",
                            rebalance_delay=0)
        broker.create_queue("capped", partitions=1, max_depth=1)
        flow = broker.bind("jobs")
        broker.publish("jobs", b"poison")
        for _ in range(2):
            flow.nack(flow.receive(1)[0], delay=0)
        assert flow.receive(1) == []                   # dead: max_redelivery
        broker.publish("jobs", b"bad")
        flow.reject(flow.receive(1)[0])
        broker.publish("jobs", b"short", ttl=1)
        clock.advance(2)
        assert flow.receive(1) == []                   # dead: expired
        broker.publish("jobs", b"later")
        flow.nack(flow.receive(1)[0], delay=60)        # its partition waits: delayed
        broker.publish("capped", b"a")
        with pytest.raises(partq.QueueFull):
            broker.publish_many("capped", [b"b", b"c"])

        out = ok(run("top", "--json", "--count", "1", "jobs", "capped", "dmq")).stdout
        (doc,) = [json.loads(line) for line in out.splitlines()]
        queues = {q["name"]: q for q in doc["queues"]}
        jobs = queues["jobs"]
        assert jobs["dead"] == {"max_redelivery": 1, "expired": 1, "rejected": 1, "discarded": 0}
        assert jobs["dead_total"] == 3
        assert jobs["delayed"] == 1
        assert (jobs["quota_refused"], jobs["quota_discarded"]) == (0, 0)
        assert queues["capped"]["quota_refused"] == 2 and queues["capped"]["dead_total"] == 0
        assert queues["dmq"]["depth"] == 3 and queues["dmq"]["dead_total"] == 0


def _status(name: str, **lifecycle) -> QueueStatus:
    return dataclasses.replace(QueueStatus(
        name, 1, "Rebalancing", "ScalingDown", True, True, 3,
        [PartitionStatus(0, "Ready", None, None, 3, 0, 10, 7)]), **lifecycle)


def _text(snap: Snapshot, width: int = 80) -> str:
    from rich.console import Console

    from partq.tools.top_view import render
    console = Console(record=True, width=width, color_system=None)
    console.print(render(snap, rates(snap, snap), 1.0, 16))
    return console.export_text()


def test_the_live_view_lists_the_queues_with_dead_messages_delays_or_refusals_in_80_columns():
    dead = {"max_redelivery": 12, "expired": 3, "rejected": 1, "discarded": 2}
    snap = Snapshot(1.0, "d", [
        _status("orders-eu", dead=dead, delayed=1, quota_refused=1234),
        _status("calm", dead=dict.fromkeys(dead, 0)),
        _status("full", quota_discarded=5)])
    text = _text(snap)
    lines = text.splitlines()
    assert all(len(line.rstrip()) <= 80 for line in lines), text
    head = next(i for i, line in enumerate(lines) if line.split()[:3] == ["QUEUE", "DEAD",
                                                                          "REDELIV"])
    assert lines[head - 1].startswith("dead messages, nack delays, quotas"), text
    assert lines[head].split() == ["QUEUE", "DEAD", "REDELIV", "EXPIRED", "REJECTED", "NO", "DMQ",
                                   "DELAYED", "REFUSED", "DISCARDED"], text
    assert lines[head + 1].split() == ["orders-eu", "16", "12", "3", "1", "2", "1", "1,234",
                                       "0"], text
    assert lines[head + 2].split() == ["full", "0", "0", "0", "0", "0", "0", "0", "5"], text
    assert not lines[head + 3].startswith("calm"), text      # nothing to show for it
    assert "NO DMQ: dead, discarded (no dead message queue)" in lines[head + 3], text

    quiet = _text(Snapshot(1.0, "d", [_status("calm")]))
    assert "dead messages" not in quiet and "NO DMQ" not in quiet, quiet
