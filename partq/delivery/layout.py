"""Where a queue's messages are delivered from: the partitions of a partitioned queue, or the
parent log of an exclusive one (one core slot), and acks of the parent log nothing delivers."""
from __future__ import annotations

from partq.config import QueueConfig
from partq.errors import InvalidAck
from partq.states import DeliveryMode, ScalingState
from partq.storage.encoding import PARENT


def delivery_layout(config: QueueConfig) -> tuple[DeliveryMode, list[int]]:
    """The delivery mode of a config and the storage partition of each core slot. While an
    online scale-down retires partitions, they are still delivered (publishes no longer go
    there) until they are drained and removed."""
    if config.partitioned:
        return DeliveryMode.PARTITIONED, list(range(delivered_partitions(config)))
    return DeliveryMode.EXCLUSIVE, [PARENT]


def delivered_partitions(config: QueueConfig) -> int:
    """How many partitions delivery serves: the count, or, while an online scale-down drains
    the partitions it removes, the count before it."""
    if config.scaling_status == ScalingState.SCALING_DOWN and config.scaling_online:
        return max(config.partitions, config.scaling_from)
    return config.partitions


def describe_mode(config: QueueConfig) -> str:
    if config.partitioned:
        return f"partitioned ({config.partitions} partition{'s' if config.partitions != 1 else ''})"
    return "non-partitioned (exclusive access)"


def ack_parent_log(w, qid: int, seqs) -> int:
    """Ack messages of the parent log of a partitioned queue, which nothing delivers: late acks
    of messages delivered while it was exclusive (copy-out then skips them), and
    ``Broker.ack_parent``. Seqs the log never had are ignored; returns how many were newly
    acked."""
    if not w.has_partition(qid, PARENT):
        return 0
    head, state = w.head(qid, PARENT), w.ack_state(qid, PARENT)
    new = sorted({s for s in seqs if s < head and not state.is_acked(s)})
    if new:
        w.ack(qid, PARENT, new)
    return len(new)


def check_delivered_from_parent(name: str, qid: int, partitioned_flow: bool, seqs: list[int],
                                reader) -> None:
    """Late acks of the parent log come from flows the change of access type unbound, and name
    only what was delivered (at or below the parent's durable delivered mark). A flow bound to
    the partitioned queue (``partitioned_flow``) never received from the parent log, so its
    acks of it are refused. Raises ``InvalidAck``: no flow can ack stranded messages nobody
    received."""
    if partitioned_flow:
        raise InvalidAck(f"{name}: a flow of the partitioned queue acked the parent queue's seq "
                         f"{seqs[0]}, which it was never given; stranded messages are copied "
                         f"out (`partq copy-out --parent`), not acked")
    mark = (reader.ack_state(qid, PARENT).delivered_mark
            if reader.has_partition(qid, PARENT) else -1)
    never = [s for s in seqs if s > mark]
    if never:
        raise InvalidAck(f"{name} parent queue seq {never[0]} was never delivered: its stranded "
                         f"messages are copied out (`partq copy-out --parent`), not acked by a "
                         f"flow")
