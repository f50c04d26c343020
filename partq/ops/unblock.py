"""What an operator's ``partq message kill|ack`` frees (``Broker.kill_message``,
``Broker.ack_message``): read from the store before and after the write, so the command can say
which message went (its key, how often it was delivered, whether a nack's delay was pending)
and whether its partition flows on, and from which seq."""
from __future__ import annotations

import time
from dataclasses import dataclass

from partq.delivery.blocked import blocking
from partq.ops.browse import load_config
from partq.storage.encoding import PARENT, record_fields


@dataclass(frozen=True)
class Position:
    """An unacked message as it stands before a kill or ack."""
    key: str | None
    delivery_count: int         # deliveries that came back unacked (the dead header's count)
    retry_pending: bool         # a nack's delay was pending on it


@dataclass(frozen=True)
class After:
    """Its partition after the kill or ack."""
    next_seq: int | None        # the oldest unacked message now (None: nothing waits)
    stuck_on: int | None        # the seq it is still stuck on (None: not stuck)


def before(store, queue: str, partition: int, seq: int) -> Position | None:
    """The unacked message at a position (None: acked already, no such message, or a damaged
    record's position, whose key is unknown; the broker says what is wrong)."""
    if not (0 <= partition <= PARENT and 0 <= seq < 2 ** 64):
        return None             # no such position: the broker's kill or ack says why
    now_ns = time.time_ns()
    with store.read() as r:
        config = load_config(r, queue)
        if not r.has_partition(config.qid, partition) or seq >= r.head(config.qid, partition):
            return None
        ack = r.ack_state(config.qid, partition)
        if ack.is_acked(seq):
            return None
        got = r.records(config.qid, partition, seq, 1)
        fields = record_fields(got[0][1]) if got and got[0][0] == seq else None
        until = ack.retry_at_ns(seq)
        return Position(None if fields is None else fields[1], ack.failed(seq),
                        until is not None and until > now_ns)


def after(store, queue: str, partition: int) -> After:
    """Where ``partition`` of ``queue`` stands now."""
    with store.read() as r:
        config = load_config(r, queue)
        ack = r.ack_state(config.qid, partition)
        head = r.head(config.qid, partition)
        stuck = blocking(r, config.qid, partition, ack, head, time.time_ns())
    return After(ack.floor if ack.floor < head else None, None if stuck is None else stuck.seq)
