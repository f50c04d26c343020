"""Per-key order in the crash checker, counted as ``key_order_violations``: rule `online-scaling`
(rounds whose scalings were all online) and rule `key-ordering` (*key rounds*: the queue has
``ordering="key"``; ``checker.check(..., ordering="key")``).

A message m of key k is owed order to every *earlier* message e of k: one whose publish returned
(its ``published`` line) before m's was attempted, that is not dead (found in the dead message
queue: its death is not in the logs, and a dead message's key flows on) and not in a partition a
scale-down deleted (``dropped_by``). A delivery of m breaks the order when such an e is

* in *another* partition (the key moved with an online scaling; checked when every scaling was
  online, in every round) and not acked: the cut-over holds a moved key until its old partition
  is acked up to the cut-over, so no flow ever holds both;
* in the *same* partition (key rounds only, whatever the scalings: a partition is one log, and
  under ``"key"`` each key's messages of it go out in seq order, redeliveries included) and
  neither acked nor *held by the flow m goes to*: delivered to that flow earlier in the same
  process's life and not given back since. (A flow may hold unacked messages of many keys, and
  several of one key; no other flow may get a later one of that key meanwhile.)

"Acked": when one process at a time delivered, the ``acked`` line, an async ack's ``ack_sent``
line, or the unlogged ack of a killed owner (``KeyOrder``); with concurrent consumer processes,
an ack call of e that began before the delivery of m returned (``concurrent_key_order``).

"Held by the flow" (``Holds``): ``delivered`` lines name their flow (``flow``; without it, the
process's one flow); a flow no longer holds the seqs a nack returned (``gave_back``, logged after
the nack returned), nor anything once it was unbound (``unbound``: by the consumer, or found
closed by a receive). Other give-backs (a handoff that timed out, a refused ack) are not logged:
the check keeps those messages held, which can only miss a violation, never invent one.
"""
from __future__ import annotations

import math
from collections import defaultdict

from key_order_index import first_in_other_partitions, index_rows


def dropped_by(scales: list[dict], partition: int, t_attempt: float) -> bool:
    """Whether a scale-down deleted ``partition`` after a publish attempted at ``t_attempt``."""
    return any(s["to"] <= partition and s["to"] < (s["from"] or math.inf) and t_attempt < s["end"]
               for s in scales)


Rows = dict[str, list[tuple[float, int, int, str]]]


def earlier_by_key(attempts: dict, published: dict, scales: list[dict],
                   dead: set[str] = frozenset()) -> Rows:
    """Per key, its published messages owed order, as ``(t_published, partition, seq, id)`` in
    the order their publishes returned."""
    by_key: Rows = defaultdict(list)
    for mid, pub in published.items():
        att = attempts.get(mid)
        if att is None or att.get("key") is None or "t" not in pub or mid in dead:
            continue        # (a dead message's death is not in the logs: no order is owed)
        if dropped_by(scales, pub["partition"], att.get("t", pub["t"])):
            continue        # may be deleted unacked: no order is owed to it
        by_key[att["key"]].append((pub["t"], pub["partition"], pub["seq"], mid))
    for rows in by_key.values():
        rows.sort()
    return by_key


class Holds:
    """What each flow of each process's life (log) holds, as its log shows (see the module doc)."""

    def __init__(self) -> None:
        self._held: dict[tuple[int, str | None], set[tuple[int, int]]] = defaultdict(set)

    def see(self, log: int, e: dict) -> None:
        op = e["op"]
        if op == "delivered" and e.get("id") is not None:
            self._held[log, e.get("flow")].add((e["partition"], e["seq"]))
        elif op == "gave_back":
            held = self._held.get((log, e.get("flow")))
            if held:
                held.difference_update((e["partition"], s) for s in e.get("seqs", ()))
        elif op == "unbound":
            self._held.pop((log, e.get("flow")), None)

    def holds(self, log: int, flow: str | None, partition: int, seq: int) -> bool:
        held = self._held.get((log, flow))
        return held is not None and (partition, seq) in held


class KeyOrder:
    """Per-key order when one process at a time delivered: per key, its published messages in
    the order their publishes returned, and which are acked so far in the stream. ``cross``:
    check earlier messages in other partitions (every scaling was online); ``same``: in the
    same partition (a key round)."""

    def __init__(self, attempts: dict, published: dict, scales: list[dict],
                 stream: list[dict], dead: set[str] = frozenset(), *, cross: bool = True,
                 same: bool = False) -> None:
        self.cross, self.same = cross, same
        self.done: set[str] = set()
        self.by_key = earlier_by_key(attempts, published, scales, dead)
        self.start: dict[str, int] = defaultdict(int)
        # A process killed after an ack committed and before its ``acked`` line leaves an ack
        # the logs do not show: a message delivered by an earlier owner, never acked in the
        # logs and never delivered again was acked before the next owner began.
        last_log: dict[str, int] = {}
        logged_acks: set[str] = set()
        log = -1
        for e in stream:
            if e["op"] == "owner":
                log = e["log"]
            elif e["op"] == "delivered" and e.get("id") is not None:
                last_log[e["id"]] = log
            elif e["op"] == "acked":
                logged_acks.add(e["id"])
        self.unlogged: dict[int, list[str]] = defaultdict(list)
        for mid, log in last_log.items():
            if mid not in logged_acks:
                self.unlogged[log].append(mid)

    def owner_changed(self, log: int) -> None:
        self.done.update(self.unlogged.get(log - 1, ()))

    def acked(self, mid: str) -> None:
        self.done.add(mid)

    def blocking(self, mid: str, key: str, partition: int, t_attempt: float | None,
                 held=None) -> str | None:
        """An earlier message of ``key`` not acked yet that the delivery of ``mid`` (in
        ``partition``) had to wait for, or None. ``held(partition, seq)``: whether the flow it
        went to holds that message (same-partition messages only)."""
        if t_attempt is None:
            return None
        rows, i = self.by_key.get(key, []), self.start[key]
        while i < len(rows) and rows[i][3] in self.done:
            i += 1
        self.start[key] = i
        for t_pub, p, seq, other in rows[i:]:
            if t_pub >= t_attempt:
                break
            if other in self.done or other == mid:
                continue
            if p != partition:
                if self.cross:
                    return other
            elif self.same and not (held is not None and held(p, seq)):
                return other
        return None


def concurrent_key_order(h, rep, deliveries: dict[str, list[dict]],
                         ack_begun: dict[str, float], cross: bool, same: bool) -> None:
    """The same rules with concurrent consumer processes (``concurrent_checks``), where only
    what is certain counts: e was not acked when m went out if e's first ack call began after
    the delivery of m returned (e acked at all in the logs). ``cross``: once per message, its
    first delivery against earlier messages in other partitions; ``same``: every delivery
    against earlier messages of its partition its flow did not hold."""
    index = index_rows(earlier_by_key(h.attempts, h.published, h.scales, h.dead_ids), ack_begun)
    if cross:
        for mid, ds in deliveries.items():
            att = h.attempts.get(mid)
            if att is None or att.get("key") is None or "t" not in att:
                continue
            returned = min(d["t"] for d in ds)
            row = first_in_other_partitions(index.get(att["key"], {}), ds[0]["partition"],
                                            att["t"], returned)
            if row is not None:
                rep.add("key_order_violations", {"delivered": ds[0], "earlier_unacked": row[3]})
    if not same:
        return
    holds = Holds()
    log = -1
    for e in h.stream:
        if e["op"] == "owner":
            log = e["log"]
            continue
        if e["op"] == "delivered" and e.get("id") is not None:
            att = h.attempts.get(e["id"])
            rows = index.get(att["key"], {}).get(e["partition"]) \
                if att is not None and att.get("key") is not None and "t" in att else None
            for _, p, seq, earlier in rows.candidates(att["t"], e["t"]) if rows else ():
                if earlier != e["id"] and not holds.holds(log, e.get("flow"), p, seq):
                    rep.add("key_order_violations", {"delivered": e, "earlier_unacked": earlier})
                    break
        holds.see(log, e)
