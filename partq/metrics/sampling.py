"""Successive snapshots of a broker, of a directory or of a ``partq serve`` over the wire, and the
rates between two of them: what ``partq top`` shows.

Rates come from the store's own counts, so they are right whichever process publishes or
consumes: a partition's publish rate is how far its next sequence moved, its ack rate how far
``next_seq - depth`` (messages acked, or removed by scaling) moved, per second between the two
snapshots. A flow's rate is the ack rate of the partitions it holds now.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from partq.errors import PartqError
from partq.status import FlowStatus, PartitionStatus, QueueStatus


@dataclass(frozen=True)
class Snapshot:
    at: float                                   # time.monotonic() when taken
    source: str                                 # the directory or HOST:PORT
    queues: list[QueueStatus]
    errors: dict[str, str] = field(default_factory=dict)    # queue -> why it could not be read
    replication: dict | None = None             # ``ReplicationStatus.as_dict()``
    store: dict | None = None                   # ``Store.usage()`` (directories only)


@dataclass(frozen=True)
class Rates:
    """Messages per second between two snapshots (0 for the first one)."""
    published: dict[str, float]                 # queue -> rate
    acked: dict[str, float]
    partition_published: dict[tuple[str, int], float]
    partition_acked: dict[tuple[str, int], float]
    flow_acked: dict[tuple[str, str], float]    # (queue, flow id) -> rate


def snapshot_broker(broker, queues: list[str] | None = None) -> Snapshot:
    """A snapshot of ``broker`` (any process on the directory; read-only brokers too)."""
    names = queues or sorted(c.name for c in broker.queues())
    statuses, errors = [], {}
    for name in names:
        try:
            statuses.append(broker.queue_status(name))
        except PartqError as exc:
            errors[name] = str(exc)
    try:
        replication = broker.replication_status().as_dict()
    except PartqError as exc:
        replication = {"error": str(exc)}
    return Snapshot(time.monotonic(), broker.path, statuses, errors, replication,
                    broker.store.usage())


def snapshot_client(client, queues: list[str] | None = None) -> Snapshot:
    """A snapshot through ``partq.connect``'s client (``partq serve``'s "queues", "status"
    and "replication" requests)."""
    names = queues or sorted(client.call({"op": "queues"})["queues"])
    statuses, errors = [], {}
    for name in names:
        try:
            statuses.append(client.queue_status(name))
        except PartqError as exc:
            errors[name] = str(exc)
    replication = client.call({"op": "replication"})["replication"]
    return Snapshot(time.monotonic(), client.address, statuses, errors, replication)


def rates(before: Snapshot | None, now: Snapshot) -> Rates:
    """The rates between ``before`` and ``now`` (all 0 when ``before`` is None)."""
    pub: dict[tuple[str, int], float] = {}
    ack: dict[tuple[str, int], float] = {}
    earlier = {} if before is None else {
        (q.name, p.partition): p for q in before.queues for p in q.partitions}
    dt = 0.0 if before is None else max(now.at - before.at, 1e-9)
    for q in now.queues:
        for p in q.partitions:
            old = earlier.get((q.name, p.partition))
            if old is None or not dt:
                pub[q.name, p.partition] = ack[q.name, p.partition] = 0.0
                continue
            pub[q.name, p.partition] = max(0, p.next_seq - old.next_seq) / dt
            ack[q.name, p.partition] = max(0, _gone(p) - _gone(old)) / dt
    flows: dict[tuple[str, str], float] = {}
    for q in now.queues:
        for f in q.flows:
            flows[q.name, f.flow] = sum(ack.get((q.name, p), 0.0) for p in f.partitions)
    return Rates(
        published={q.name: sum(v for (n, _), v in pub.items() if n == q.name) for q in now.queues},
        acked={q.name: sum(v for (n, _), v in ack.items() if n == q.name) for q in now.queues},
        partition_published=pub, partition_acked=ack, flow_acked=flows)


def _gone(p: PartitionStatus) -> int:
    """Messages of the partition no longer in its backlog (acked, or removed by scaling)."""
    return p.next_seq - p.depth


def as_doc(snap: Snapshot, r: Rates) -> dict:
    """One snapshot and its rates as a JSON-ready dict (``partq top --json``)."""
    return {
        "source": snap.source,
        "queues": [{**q.as_dict(), "dead_total": dead_total(q),
                    "published_per_s": r.published.get(q.name, 0.0),
                    "acked_per_s": r.acked.get(q.name, 0.0)} for q in snap.queues],
        "partition_rates": [{"queue": q, "partition": p, "published_per_s": v,
                             "acked_per_s": r.partition_acked.get((q, p), 0.0)}
                            for (q, p), v in sorted(r.partition_published.items())],
        "flow_rates": [{"queue": q, "flow": f, "acked_per_s": v}
                       for (q, f), v in sorted(r.flow_acked.items())],
        "errors": snap.errors, "replication": snap.replication, "store": snap.store}


def dead_total(q: QueueStatus) -> int:
    """Dead messages of the queue, every reason ("discarded" counts some of them again: those
    that had no dead message queue to go to)."""
    return sum(n for reason, n in q.dead.items() if reason != "discarded")


def flow_unacked(q: QueueStatus, f: FlowStatus) -> int:
    """What ``f`` holds unacked, from the partitions it holds (as the delivery owner says)."""
    return sum(p.unacked for p in q.partitions if p.flow == f.flow)

