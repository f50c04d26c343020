"""kombu's QoS with partq's acks: what a consumer holds lives in partq, not in this object.

A message a channel delivered is a message its partq flow received and has not acked: kill the
process and partq redelivers it (marked redelivered) to the next consumer, at once, with no
visibility timeout to wait out or to expire under a long task. ``ack`` is a partq ack, ``reject``
a partq reject (to the queue's dead message queue when it has one, else dropped), a reject with
``requeue`` and every restore (``basic_recover``, a channel closing with messages unacked) a partq
nack: the message comes back marked redelivered, its delivery count one higher. The map from
delivery tags to partq messages below only names what partq holds; losing it loses nothing.

Acks do not wait for their commit (``Flow.ack_many_async``): concurrent acks share commits, and a
crash before the commit brings the message back, as a crash before the ack would. ``settle()``
waits for every ack made so far (a channel closing calls it).
"""
from __future__ import annotations

import logging
import threading

from kombu.transport import virtual

from partq.errors import PartqError

log = logging.getLogger("partq.kombu")


class QoS(virtual.QoS):
    """Prefetch as kombu's virtual transports count it; acks, rejects and restores as partq's."""

    def __init__(self, channel, prefetch_count: int = 0) -> None:
        super().__init__(channel, prefetch_count)
        self._lock = threading.Lock()
        self._held: dict[str, tuple] = {}      # delivery tag -> (flow, partq Message)
        self._acks: list = []                  # acks whose commit was not seen done yet

    # ------------------------------------------------------------------ what is held
    def hold(self, delivery_tag: str, flow, msg) -> None:
        """Remember that ``delivery_tag`` is ``msg`` of ``flow`` (the channel's ``_get`` calls it)."""
        with self._lock:
            self._held[delivery_tag] = (flow, msg)

    def _take(self, delivery_tag: str) -> tuple | None:
        with self._lock:
            return self._held.pop(delivery_tag, None)

    def held_by(self, flow) -> int:
        """How many unacked messages of ``flow`` this channel holds."""
        with self._lock:
            return sum(1 for f, _ in self._held.values() if f is flow)

    def positions(self, queue: str) -> set[tuple[int, int]]:
        """``(partition, seq)`` of the messages of partq queue ``queue`` held here."""
        with self._lock:
            return {(m.partition, m.seq) for _, m in self._held.values() if m.queue == queue}

    # ------------------------------------------------------------------ kombu's verbs
    def ack(self, delivery_tag: str) -> None:
        held = self._take(delivery_tag)
        if held is not None:
            flow, msg = held
            try:
                pending = flow.ack_many_async([msg])
            except PartqError as exc:     # fenced: its partition moved, it is redelivered there
                log.warning("ack of %s/%s seq %s did nothing: %s", msg.queue, msg.partition,
                            msg.seq, exc)
            else:
                with self._lock:
                    self._acks = [p for p in self._acks if not p.done()]
                    self._acks.append(pending)
        super().ack(delivery_tag)
        self._wake()

    def _wake(self) -> None:
        """Room was freed: the connection's event loop, if it runs one, drains again."""
        wake = getattr(self.channel.connection, "wake", None)
        if wake is not None:
            wake()

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        held = self._take(delivery_tag)
        if held is not None:
            flow, msg = held
            try:
                if requeue:
                    flow.nack(msg, delay=0)
                else:
                    flow.reject(msg)
            except PartqError as exc:
                log.warning("%s of %s/%s seq %s did nothing: %s", "nack" if requeue else "reject",
                            msg.queue, msg.partition, msg.seq, exc)
        self._quick_ack(delivery_tag)
        self._wake()

    def restore_unacked(self) -> list:
        """Nack every message delivered here and not acked: partq redelivers them."""
        self._flush()
        errors = []
        with self._lock:
            held, self._held = self._held, {}
        for tag, (flow, msg) in held.items():
            try:
                flow.nack(msg, delay=0)
            except PartqError as exc:    # the flow is gone: partq redelivers it anyway
                log.debug("restoring %s/%s seq %s: %s", msg.queue, msg.partition, msg.seq, exc)
            except BaseException as exc:
                errors.append((exc, self._delivered.get(tag)))
        self._delivered.clear()
        return errors

    def settle(self) -> None:
        """Wait until every ack made so far is committed (errors are logged: an ack that failed
        leaves its message to be redelivered)."""
        with self._lock:
            acks, self._acks = self._acks, []
        for pending in acks:
            try:
                pending.result()
            except PartqError as exc:
                log.warning("an ack was not committed (its message comes back): %s", exc)
