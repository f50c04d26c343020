"""The consumer side of ``partq.dramatiq``: what a dramatiq worker's consumer thread iterates.

A ``PartqConsumer`` binds one partq flow to a queue and hands its messages to dramatiq as
``PartqMessageProxy`` objects; the worker's threads give them back through ``ack`` (done),
``nack`` (dead: a partq reject, to the queue's dead message queue) and ``requeue`` (not run:
a partq nack). A message that the Retries middleware re-enqueued with a delay while it ran is
nacked with that delay instead of acked: it comes back in its place, no copy made.

Per key (``partq_key``) the consumer hands out one message at a time: partq delivers a key's
messages to one flow, in order, and ``KeyGate`` holds a key's later messages back until the one
handed out is settled, so the threads of a worker never run two messages of one key at once.

Thread-safety: ``__next__`` runs in the consumer thread; ``ack``, ``nack`` and ``requeue`` may
be called from any thread (dramatiq's worker threads call them).
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable

from dramatiq.broker import Consumer, MessageProxy
from dramatiq.common import current_millis
from dramatiq.errors import ConnectionClosed, DecodeError
from dramatiq.message import Message

from partq.errors import FlowClosed, FlowFenced, PartqError, QueueNotFound, ServerUnavailable
from partq.message import Message as PartqMessage

log = logging.getLogger("partq.dramatiq")

SHORT_WAIT = 0.01   # seconds a receive waits while the worker has work in hand


class KeyGate:
    """Which received messages may be handed out now: at most one per key (unkeyed ones at
    once), the others held in arrival order until ``settle`` frees their key. Not thread-safe:
    the consumer holds its lock around every call."""

    def __init__(self) -> None:
        self._claimed: set[str] = set()       # keys with a message handed out (or ready to be)
        self._held: dict[str, deque[PartqMessage]] = {}
        self.held_count = 0

    def admit(self, msg: PartqMessage) -> bool:
        """True when ``msg`` may be handed out now; otherwise it is held behind its key."""
        key = msg.key
        if key is None:
            return True
        if key in self._claimed:
            self._held.setdefault(key, deque()).append(msg)
            self.held_count += 1
            return False
        self._claimed.add(key)
        return True

    def held(self, msg: PartqMessage) -> list[PartqMessage]:
        """The messages held behind ``msg``'s key now."""
        return [] if msg.key is None else list(self._held.get(msg.key, ()))

    def settle(self, msg: PartqMessage, given_back: Iterable[PartqMessage] = ()) -> PartqMessage | None:
        """``msg`` (handed out) is done. ``given_back``: held messages that partq took back with
        it (a nack gives back the later messages of its key the flow holds): they are dropped;
        the same messages delivered again meanwhile are other objects, and stay. Returns the
        next message of its key to hand out, if one is held."""
        key = msg.key
        if key is None:
            return None
        queue = self._held.get(key)
        back = {id(m) for m in given_back}
        if queue and back:
            kept = deque(m for m in queue if id(m) not in back)
            self.held_count -= len(queue) - len(kept)
            queue = self._held[key] = kept
        if queue:
            self.held_count -= 1
            nxt = queue.popleft()
            if not queue:
                del self._held[key]
            return nxt
        self._held.pop(key, None)
        self._claimed.discard(key)
        return None

    def clear(self) -> None:
        self._claimed.clear()
        self._held.clear()
        self.held_count = 0


class PartqMessageProxy(MessageProxy):
    """A dramatiq message a ``PartqConsumer`` handed out, with the partq message it came in."""

    def __init__(self, message: Message, delivered: PartqMessage, consumer: PartqConsumer) -> None:
        super().__init__(message)
        self.delivered = delivered
        self.consumer = consumer
        self.retry_delay: int | None = None     # ms: nack with this delay instead of acking


def decoded(delivered: PartqMessage) -> Message:
    """The dramatiq message in ``delivered``; its ``retries`` option counts the deliveries that
    failed (partq's delivery count: a retry is a nack, which keeps the payload as published)."""
    message = Message.decode(delivered.payload)
    if delivered.delivery_count > 1:
        options = dict(message.options)
        options["retries"] = options.get("retries", 0) + delivered.delivery_count - 1
        message = message.copy(options=options)
    return message


class PartqConsumer(Consumer):
    """Iterates over one dramatiq queue (a partq queue) through one flow. ``bind`` makes the
    flow (again after it was closed); ``delayed`` marks a delay queue (``NAME.DQ``), whose
    messages are nacked with the time left to their eta until it has come, so partq keeps them
    durably meanwhile and the worker holds only due ones. ``on_dead(queue, exception)`` is told
    of each message dead-lettered here."""

    def __init__(self, queue_name: str, bind: Callable, prefetch: int, timeout_ms: int,
                 delayed: bool, on_dead: Callable[[str, BaseException | None], None]) -> None:
        self.queue_name = queue_name
        self.prefetch = max(1, prefetch)
        self.timeout = timeout_ms / 1000
        self.delayed = delayed
        self._bind = bind
        self._on_dead = on_dead
        self._flow = bind()
        self._lock = threading.Condition()
        # held while a receive runs and while a nack runs: a nack's given-back messages are then
        # exactly the ones held when it is made (none are in a receive half done)
        self._receiving = threading.Lock()
        self._gate = KeyGate()
        self._ready: deque[PartqMessage] = deque()
        # (partition, seq) -> the proxy handed out for it and not settled (a message nacked
        # may be delivered and handed out again before its nack's bookkeeping ends)
        self._out: dict[tuple[int, int], PartqMessageProxy] = {}
        self._closed = False

    # ------------------------------------------------------------------ receiving
    def __next__(self) -> MessageProxy | None:
        deadline = time.monotonic() + self.timeout
        while True:
            with self._lock:
                while self._ready:
                    proxy = self._hand_out(self._ready.popleft())
                    if proxy is not None:
                        return proxy
                in_hand = len(self._out) + len(self._ready)
                room = min(self.prefetch - in_hand, 2 * self.prefetch - in_hand - self._gate.held_count)
                held = self._gate.held_count
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if room <= 0:
                with self._lock:
                    if not self._ready:
                        self._lock.wait(left)
                continue
            # a receive wakes for what concerns its queue (a publish, credit back): while the
            # worker has work in hand it waits at most SHORT_WAIT, so a nack (which must not
            # overlap a receive) waits no longer than that
            busy = held or self._out
            with self._receiving:
                self._take(self._receive(room, min(left, SHORT_WAIT) if busy else left))

    def _receive(self, room: int, wait: float) -> list[PartqMessage]:
        try:
            return self._flow.receive(room, timeout=wait)
        except FlowClosed as exc:
            log.warning("the flow of dramatiq queue %r was closed (%s); binding again",
                        self.queue_name, exc)
            with self._lock:
                self._gate.clear()
                self._ready.clear()
                self._out.clear()
            self._flow = self._bind()
            return []
        except ServerUnavailable as exc:
            raise ConnectionClosed(exc) from None

    def _take(self, msgs: list[PartqMessage]) -> None:
        now = current_millis()
        for msg in msgs:
            if self.delayed and self._not_due(msg, now):
                continue
            with self._lock:
                if self._gate.admit(msg):
                    self._ready.append(msg)

    def _not_due(self, msg: PartqMessage, now: int) -> bool:
        """A delayed message whose eta is still ahead goes back to partq until then."""
        try:
            eta = Message.decode(msg.payload).options.get("eta")
        except DecodeError:
            return False      # _hand_out dead-letters it
        if not isinstance(eta, (int, float)) or eta <= now:
            return False
        self._flow.nack(msg, delay=(eta - now) / 1000)
        return True

    def _hand_out(self, msg: PartqMessage) -> PartqMessageProxy | None:
        """Under the lock: the proxy for ``msg``, or None when it cannot be decoded (then it is
        dead-lettered, its key released)."""
        try:
            message = decoded(msg)
        except DecodeError as exc:
            log.error("dramatiq queue %r: message at partition %d seq %d cannot be decoded (%s); "
                      "it goes to the dead message queue", self.queue_name, msg.partition, msg.seq, exc)
            self._flow.reject(msg)
            nxt = self._gate.settle(msg)
            if nxt is not None:
                self._ready.appendleft(nxt)
            return None
        proxy = self._out[(msg.partition, msg.seq)] = PartqMessageProxy(message, msg, self)
        return proxy

    # ------------------------------------------------------------------ settling
    def ack(self, message: MessageProxy) -> None:
        if isinstance(message, PartqMessageProxy) and message.consumer is not self:
            return message.consumer.ack(message)     # handed out by the consumer this replaced
        msg = self._delivered(message)
        if msg is None:
            return
        assert isinstance(message, PartqMessageProxy)
        retry_delay = message.retry_delay
        if retry_delay is not None:
            self._settle(message, lambda: self._flow.nack(msg, delay=retry_delay / 1000), True)
        else:
            self._settle(message, lambda: self._flow.ack(msg))

    def nack(self, message: MessageProxy) -> None:
        if isinstance(message, PartqMessageProxy) and message.consumer is not self:
            return message.consumer.nack(message)
        msg = self._delivered(message)
        if msg is None:
            return
        assert isinstance(message, PartqMessageProxy)
        self._settle(message, lambda: self._flow.reject(msg))
        self._on_dead(message.queue_name, getattr(message, "_exception", None))

    def requeue(self, messages: Iterable[MessageProxy]) -> None:
        for message in messages:
            msg = self._delivered(message)
            if msg is not None:
                assert isinstance(message, PartqMessageProxy)
                delay = self._left(message)
                self._settle(message, lambda msg=msg, delay=delay: self._flow.nack(msg, delay=delay),
                             True)

    def _left(self, message: MessageProxy) -> float:
        """Seconds until a delayed message's eta (0 for others)."""
        eta = message.options.get("eta") if self.delayed else None
        return max(0.0, (eta - current_millis()) / 1000) if isinstance(eta, (int, float)) else 0.0

    def _delivered(self, message) -> PartqMessage | None:
        """The partq message behind a proxy this consumer handed out and has not settled."""
        if not isinstance(message, PartqMessageProxy) or message.consumer is not self:
            return None
        msg = message.delivered
        with self._lock:
            return msg if self._out.get((msg.partition, msg.seq)) is message else None

    def holds(self, message) -> bool:
        """True while ``message`` is one this consumer handed out and has not settled."""
        return self._delivered(message) is not None

    def _settle(self, message: PartqMessageProxy, op: Callable, gives_back: bool = False) -> None:
        """Run ``op`` (the ack, nack or reject of ``message``) and release its key. A nack
        (``gives_back``) returns the seqs partq took back with it."""
        msg = message.delivered
        given_back: list[PartqMessage] = []
        try:
            if gives_back:
                with self._receiving:
                    with self._lock:
                        behind = self._gate.held(msg)
                    seqs = set(op())
                given_back = [m for m in behind if m.partition == msg.partition and m.seq in seqs]
            else:
                op()
        except ServerUnavailable as exc:
            raise ConnectionClosed(exc) from None
        except (FlowFenced, FlowClosed, QueueNotFound) as exc:
            # the partition moved (or the queue was flushed): partq gives the message to the
            # flow that holds it now, marked redelivered
            log.warning("dramatiq queue %r: settling partition %d seq %d: %s", self.queue_name,
                        msg.partition, msg.seq, exc)
        except PartqError:
            log.exception("dramatiq queue %r: settling partition %d seq %d failed",
                          self.queue_name, msg.partition, msg.seq)
        finally:
            with self._lock:
                if self._out.get((msg.partition, msg.seq)) is message:
                    del self._out[(msg.partition, msg.seq)]
                nxt = self._gate.settle(msg, given_back)
                if nxt is not None:
                    self._ready.append(nxt)
                self._lock.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Unbind: what this consumer still holds goes back to partq, marked redelivered."""
        if self._closed:
            return
        self._closed = True
        try:
            self._flow.unbind()
        except PartqError as exc:
            log.debug("dramatiq queue %r: unbind: %s", self.queue_name, exc)
