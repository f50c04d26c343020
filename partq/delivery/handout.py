"""What one receive decides besides the messages it hands out, and the one write that makes it
durable before they are handed out: per partition the delivered mark, delivery counts that
grew, corrupt records skipped, and messages that are dead instead of delivered (rule
`redelivery-limit`, `expiry`: expired, or delivered ``1 + max_redelivery`` times already)."""
from __future__ import annotations

from collections.abc import Callable

from partq.config import QueueConfig
from partq.delivery.dead_letter import DeadMessage, dead_op


class Handout:
    __slots__ = ("now", "now_ns", "max_ttl_ns", "max_deliveries", "marks", "counts", "unsettled",
                 "dead", "skipped", "wake")

    def __init__(self, config: QueueConfig, now: float, now_ns: int) -> None:
        self.now = now                  # clock.now(): nack delays
        self.now_ns = now_ns            # clock.wall_ns(): expiry
        self.max_ttl_ns = int(config.max_ttl * 1e9)
        self.max_deliveries = config.max_redelivery + 1 if config.max_redelivery else 0
        self.marks: dict[int, tuple[int, int]] = {}      # partition -> (old, new) delivered mark
        self.counts: dict[int, list[tuple[int, int]]] = {}   # partition -> (seq, failures)
        self.unsettled: set[int] = set()
        self.dead: list[DeadMessage] = []
        self.skipped: dict[int, list[int]] = {}         # partition -> corrupt seqs acked
        self.wake: float | None = None                  # a delayed partition's end of wait

    def count(self, p: int, seq: int, failures: int) -> None:
        self.counts.setdefault(p, []).append((seq, failures))

    def unsettle(self, p: int) -> None:
        self.unsettled.add(p)

    def dead_letter(self, p: int, seq: int, fields: list, reason: str, deliveries: int) -> None:
        self.dead.append(DeadMessage(p, seq, fields[1], fields[2], fields[3], reason, deliveries))

    def wake_at(self, when: float) -> None:
        if self.wake is None or when < self.wake:
            self.wake = when

    def empty(self) -> bool:
        return not (self.marks or self.counts or self.unsettled or self.dead or self.skipped)

    def ops(self, queue: str, qid: int, seen: dict[int, int],
            holds: Callable | None = None) -> list[Callable]:
        """The writes, in one commit: ``Writer.hand_out`` per partition (noting in
        ``seen[partition]`` a stored mark above the one this process had: another process
        delivered those messages since, so this one's copies are redeliveries), the skipped
        corrupt records' acks, and the dead messages (``dead_op``; ``holds(w, partition)``
        fences them for a flow of another process)."""
        marks, counts = self.marks, self.counts
        ops: list[Callable] = []

        def hand_out(w, p: int) -> None:
            old, new = marks.get(p, (None, -1))
            before = w.hand_out(qid, p, new, counts.get(p, []))
            if old is not None and before > old:
                seen[p] = before
        for p in set(marks) | set(counts) | self.unsettled:
            ops.append(lambda w, p=p: hand_out(w, p))
        for p, seqs in self.skipped.items():
            ops.append(lambda w, p=p, s=seqs: w.ack(qid, p, s))
        if self.dead:
            ops.append(dead_op(queue, qid, self.dead, self.now_ns, holds))
        return ops
