"""The values partq hands back: published positions, delivered messages, flow changes."""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


class PublishResult(NamedTuple):
    """Where a publish landed: the partition (rules `key-hash` and `unkeyed-partitioner`) and its sequence
    in that partition's log. A publish discarded because the queue's ingress is disabled (rule
    `ingress-egress`) has ``discarded=True`` and partition and seq -1. (A NamedTuple: a bulk publish
    builds one per message.)"""
    partition: int
    seq: int
    discarded: bool = False


class Message(NamedTuple):
    """A delivered message. ``redelivered`` is True when the message may have been handed to a
    consumer before (after a nack, a handoff that timed out, a consumer loss or a broker
    restart). Like JMSRedelivered it can be a false positive after a restart, never a false
    negative: a message that was delivered before is always marked. (A NamedTuple: receive
    builds one per message, three times cheaper than a frozen dataclass.)

    ``delivery_count`` is 1 on the first delivery and grows by one each time the message came
    back because it was not acked (its own nack, a consumer lost while holding it, a handoff
    that timed out, a crash); messages that come back only because an earlier one of their
    partition was nacked keep their count (rule `delivery-count`). After a crash it may be one too
    high, never too low."""
    queue: str
    partition: int
    seq: int
    key: str | None
    payload: bytes
    headers: dict | None
    publish_time_ns: int
    redelivered: bool
    delivery_count: int = 1


@dataclass(frozen=True, slots=True)
class FlowChangeUpdate:
    """The flow became active (it holds partitions) or inactive (it holds none, a standby)."""
    active: bool
    partitions: frozenset[int]
