"""What a store holds, queue by queue, and how much of its file it uses: the rows ``partq queue
list`` and ``partq stats`` print, as plain dicts ready for JSON.

A queue whose status cannot be read (a damaged ack state, say) still gets its row, from its
configuration, with the error: one damaged queue never hides the others.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from partq.config import QueueConfig
from partq.errors import PartqError
from partq.ops.formatting import one_line

if TYPE_CHECKING:
    from partq.broker import Broker
    from partq.storage import Store


def queue_row(broker: Broker, config: QueueConfig) -> dict:
    """One queue's row: ``name``, ``access_type``, ``partitions`` (the operating count: 0 for
    an exclusive queue), ``scaling_status``, ``ingress_enabled``, ``egress_enabled``, then from
    its status ``depth``, ``discarded``, ``parent_depth``, ``rebalance_status``, ``flows``,
    ``active_flows``, ``delivery_owner``, ``dead`` (dead messages, every reason, moved to the
    dead message queue or discarded), ``quota_refused``, ``quota_discarded``,
    ``stuck_partitions`` (partitions stuck on a message that came back unacked),
    ``oldest_unacked_publish_time_ns`` (when the oldest unacked message was published, wall ns;
    None when nothing is unacked: its age is now minus that), ``error`` (None) and
    ``warnings``.
    When the status cannot be read, those are None, ``error`` says why and there is no
    ``warnings``."""
    row = {"name": config.name, "access_type": config.access_type,
           "partitions": config.operating_partitions,
           "scaling_status": config.scaling_status,
           "ingress_enabled": config.ingress_enabled,
           "egress_enabled": config.egress_enabled}
    try:
        st = broker.queue_status(config.name)
    except PartqError as exc:   # e.g. damaged ack state: report the other queues anyway
        row.update(depth=None, discarded=None, parent_depth=None, rebalance_status=None,
                   flows=None, active_flows=None, delivery_owner=None, dead=None,
                   quota_refused=None, quota_discarded=None, stuck_partitions=None,
                   oldest_unacked_publish_time_ns=None, error=one_line(str(exc)))
    else:
        row.update(partitions=st.partition_count, depth=st.depth, discarded=st.discarded,
                   parent_depth=st.parent_depth, rebalance_status=st.rebalance_status,
                   # flows bound now: those of a process that left are not consumers
                   flows=sum(1 for f in st.flows if f.bound),
                   active_flows=sum(1 for f in st.flows if f.bound and f.active),
                   delivery_owner=st.delivery_owner, dead=dead_total(st.dead),
                   quota_refused=st.quota_refused, quota_discarded=st.quota_discarded,
                   stuck_partitions=st.stuck_partitions,
                   oldest_unacked_publish_time_ns=st.oldest_unacked_ns,
                   error=None, warnings=st.warnings)
    return row


def dead_total(dead: dict) -> int:
    """The dead messages of a ``QueueStatus.dead``: every reason's count (``discarded`` counts
    some of them again: those that had no dead message queue to go to)."""
    return sum(n for reason, n in dead.items() if reason != "discarded")


def queue_rows(broker: Broker, queue: str | None = None) -> list[dict]:
    """The ``queue_row`` of ``queue`` (``QueueNotFound`` if there is none), or of every queue,
    sorted by name."""
    configs = [broker.queue_config(queue)] if queue else broker.queues()
    return [queue_row(broker, config) for config in sorted(configs, key=lambda c: c.name)]


def store_usage(store: Store) -> dict:
    """The store's sizes in bytes: ``file_size`` (data.mdb on disk), ``map_size``,
    ``used_bytes`` (the file's high-water mark: LMDB reuses freed pages, the file never
    shrinks), ``live_bytes`` (what the data needs now), and the reader slots, ``readers`` in
    use of ``max_readers``; ``disk_full`` while publishes are refused for want of disk;
    ``writer_stopped_pid``: a process stopped holding the write lock (every writer waits)."""
    usage = store.usage()
    return {"file_size": usage["file_size"], "map_size": usage["map_size"],
            "used_bytes": usage["high_water"], "live_bytes": usage["live"],
            "readers": usage["readers"], "max_readers": usage["max_readers"],
            "disk_full": usage["disk_full"], "writer_stopped_pid": usage["writer_stopped_pid"]}


def stats(broker: Broker, queue: str | None = None) -> dict:
    """``{"queues": queue_rows(broker, queue), "store": store_usage(broker.store)}``: what
    ``partq stats`` reports."""
    queues = queue_rows(broker, queue)
    return {"queues": queues, "store": store_usage(broker.store)}
