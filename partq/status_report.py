"""How ``Broker.queue_status`` is put together: from the store and from the delivery view
(live in the process that runs delivery, as last stored elsewhere)."""
from __future__ import annotations

import dataclasses

from partq.config import QueueConfig
from partq.delivery.blocked import blocking, oldest_unacked_ns
from partq.delivery.dead_letter import dead_counts
from partq.delivery.holds import hold_report, read_cutover
from partq.delivery.layout import delivery_layout
from partq.delivery.lock import beat_age, lock_path
from partq.delivery.peers.owner_channel import silent_owner_warning
from partq.delivery.saved_state import (
    DeliveryView,
    SlotView,
    decode_state,
    ghosts_forgotten,
    stored_view,
)
from partq.publish.publisher import discarded_count
from partq.publish.quota import quota_counts
from partq.scaling.record import read_procedure
from partq.states import PartitionState
from partq.status import PartitionStatus, QueueStatus
from partq.storage.encoding import PARENT


def with_owner_warning(st: QueueStatus, store_path: str, qid: int,
                       not_answered: bool) -> QueueStatus:
    """``st``, warning when a process holds the queue's delivery lock but ``not_answered`` (no
    live view came from it): a stopped owner stalls every consumer of other processes."""
    owner = st.delivery_owner
    if owner is None:
        return st
    st = dataclasses.replace(st, delivery_owner_beat_age=beat_age(lock_path(store_path, qid)))
    if not not_answered:
        return st
    warning = silent_owner_warning(store_path, qid, owner)
    return st if warning is None else dataclasses.replace(st, warnings=[*st.warnings, warning])


def build_queue_status(r, config: QueueConfig, view: DeliveryView | None,
                       owner: str | None, now_ns: int,
                       silent_for: float | None = None) -> QueueStatus:
    """The status of ``config``'s queue in read snapshot ``r``. ``view``: the live delivery
    view when this process runs the queue's delivery; ``owner``: the text of the process that
    holds its delivery lock, if any; ``now_ns``: wall time, to tell a nack's delay pending
    from one over (``blocked``); ``silent_for``: seconds since the last delivery owner beat its
    lock when none runs now (its flows are not shown past ``ghosts_forgotten``). An exclusive
    queue shows one partition, ``PARENT``."""
    mode, index = delivery_layout(config)
    if view is None or view.mode != mode:
        state = decode_state(r.state(config.qid), f"queue {config.name!r}")
        forgotten = owner is None and ghosts_forgotten(silent_for, config.consumer_timeout,
                                                       config.rebalance_delay)
        view = stored_view(state, mode, index, owner is not None, forgotten)
    # the owner may not have applied a new partition count yet: show the stored count, and
    # partitions it does not deliver yet as Unassigned
    shown = {slot.partition: slot for slot in view.slots}
    parts = []
    for sp in index:
        slot = shown.get(sp) or SlotView(sp, PartitionState.UNASSIGNED, None, None, 0, None)
        ack = r.ack_state(config.qid, slot.partition)
        head = r.head(config.qid, slot.partition)
        parts.append(PartitionStatus(
            partition=slot.partition, status=slot.status, flow=slot.flow,
            flow_name=slot.flow_name, depth=ack.backlog(head), unacked=slot.unacked,
            next_seq=head, ack_floor=ack.floor, error=slot.error, held_keys=slot.held_keys,
            held_messages=slot.held_messages, held_for=list(slot.held_for),
            blocked=blocking(r, config.qid, slot.partition, ack, head, now_ns),
            oldest_unacked_ns=oldest_unacked_ns(r, config.qid, slot.partition, ack, head)))
    oldest = [p.oldest_unacked_ns for p in parts if p.oldest_unacked_ns is not None]
    parent_depth = (r.ack_state(config.qid, PARENT).backlog(r.head(config.qid, PARENT))
                    if r.has_partition(config.qid, PARENT) else 0)
    procedure = read_procedure(r, config.name, config.qid)
    quotas = quota_counts(r, config.qid)
    cutover = read_cutover(r, config.qid)
    return QueueStatus(
        name=config.name, partition_count=config.operating_partitions,
        rebalance_status=view.rebalance_status, scaling_status=config.scaling_status,
        ingress_enabled=config.ingress_enabled, egress_enabled=config.egress_enabled,
        depth=sum(p.depth for p in parts), partitions=parts,
        flows=list(view.flows),
        delivery_owner=owner, access_type=config.access_type, parent_depth=parent_depth,
        discarded=discarded_count(r, config.qid),
        dead=dead_counts(r, config.qid),
        quota_refused=quotas["refused"], quota_discarded=quotas["discarded"],
        delayed=view.delayed,
        stuck_partitions=sum(1 for p in parts if p.blocked is not None),
        oldest_unacked_ns=min(oldest) if oldest else None,
        procedure=procedure.as_dict() if procedure else None,
        warnings=[procedure.describe()] if procedure and procedure.state != "running" else [],
        cutover=hold_report(r, config.qid, cutover, index) if cutover is not None else None)
