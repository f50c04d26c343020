"""A total-queue checker in the spirit of Jepsen's, fed by the JSON-lines logs of real processes.

Every worker process writes one log (``wlog.Log``: one line per event, fsynced before the worker
does anything that depends on it). The events:

=================  ==========================================================================
op                 written
=================  ==========================================================================
``attempt``        by a publisher *before* it calls publish/publish_many: id, key, t
``published``      *after* publish returned: id, partition, seq, t. An attempt without a
                   published line is an *unknown outcome* (the process died in between).
``bound``          by a consumer once its flow(s) are bound: t (orders consumer processes)
``delivered``      for every message a receive returned: id (from the payload), key (the
                   message's key), pkey (the key embedded in the payload), partition, seq,
                   redelivered, flow (the flow's name; the drain's lines have none)
``ack_sent``       before ack_many_async is called: id (its ``acked`` line comes later)
``acked``          after ack/ack_many returned: id
``gave_back``      after a nack returned: id, flow, partition, seqs (what the nack gave back)
``unbound``        after the consumer unbound a flow, or a receive found it unbound: flow
``scale_begin``    by a scaler before ``scale(q, to)``: from, to, online, t
``scale_end``      after it returned: to, t
``scale_skipped``  an online scaling not begun (its predecessor still draining): ignored
=================  ==========================================================================

The message lifecycle's events and counts (``delivery_count`` is checked in every round):
``lifecycle_checks``.

``t`` is ``time.monotonic()``, one clock for every process of the host (CLOCK_MONOTONIC).

Ordering: the logs are given (``check``) in the order their processes *owned delivery*. Only one
process at a time runs delivery for a queue (a file lock, released by the kernel when its holder
dies), so concatenating delivery events in that order is their real order. ``load_dir`` sorts
logs by their first ``bound`` event to get it.

The counts (``check`` returns them as a dict; ``VIOLATIONS`` must all be 0):

* ``lost``: publish returned, never delivered, and not excused by a scale-down (below), nor
  found in the dead message queue (a message with a TTL there is ``dead_lost`` instead).
* ``unexpected``: delivered, never attempted.
* ``delivered_after_ack``: a delivery of an id after an ``acked`` line for it.
* ``unmarked_redeliveries``: a delivery of an id already delivered (and not acked: those are
  ``delivered_after_ack``) without ``redelivered=True``. Duplicates are allowed only this way.
* ``order_violations`` (rules `partition-order`, `key-ordering`), per key and partition (a key
  maps to one partition until a scaling changes the count, and no order is promised across that
  change). For each (key, partition):
  (a) the *first* deliveries of its messages come in increasing seq order (seq order is publish
  order, checked by ``publish_order_violations``), and (b) a delivery whose seq is lower than
  the highest seq delivered before for that key and partition is marked redelivered.
  Each delivery breaking (a) or (b) counts once.
* ``partition_order_violations``: the same two rules per partition (keys and unkeyed alike).
  Not checked in key rounds (``ordering="key"``): there keys overtake each other inside a
  partition, unkeyed messages have no order, and a nack gives back only its key.
* ``key_order_violations`` (``key_checks``; rule `online-scaling`, checked when every scaling
  was online; rule `key-ordering`, checked in every key round): a message of key k delivered
  while an earlier message of k (its publish returned before this one was attempted) in
  *another* partition is not acked yet, or (key rounds) in *its* partition is neither acked nor
  held by the flow it goes to; not owed to a message in a partition a scale-down deleted, nor
  to a dead one.
  "Acked" here is the ``acked`` line, or for an async ack its ``ack_sent`` line (its commit
  time is not logged), or for a message a killed owner delivered and nobody delivered again
  the death of that owner (its ack committed, its line was never written); so the rule is
  checked slightly loosely for those.
* ``publish_order_violations``: per partition, publish A returned (its ``published`` line)
  before publish B was attempted, yet seq(A) > seq(B). Linearizability of each partition's log.
* ``position_mismatches``: a delivery at another (partition, seq) than its publish returned,
  or two ids at one (partition, seq).
* ``garbled``: a delivered payload that did not parse, or whose key differs from the key the
  publisher used (message key, payload key and attempt key must agree).
* ``acked_never_delivered``: an ``acked`` line for an id no ``delivered`` line names.
* ``refused_but_delivered`` .. ``expired_delivered``: ``lifecycle_checks``.

Allowed and counted: ``recovered`` (unknown outcome, found delivered or dead), ``unknown_not_found``
(unknown outcome, never delivered), ``dropped_by_scale_down`` (publish returned, never
delivered, in a partition a scale-down to ``to <= partition`` deleted, attempted before that
scale-down ended), ``redeliveries``.

``lost`` is only meaningful after a final drain: a clean consumer process that received until
the queue was empty and acked everything (the harness checks the queue's depth is then 0).
"""
from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial

from key_checks import Holds, KeyOrder, dropped_by
from lifecycle_checks import LIFECYCLE_OPS, LIFECYCLE_VIOLATIONS, check_lifecycle

VIOLATIONS = ("lost", "unexpected", "delivered_after_ack", "unmarked_redeliveries",
              "order_violations", "partition_order_violations", "key_order_violations",
              "publish_order_violations",
              "position_mismatches", "garbled", "acked_never_delivered", *LIFECYCLE_VIOLATIONS)
EXAMPLES_PER_KIND = 5
STREAM_OPS = frozenset({"delivered", "acked", "ack_sent", "gave_back", "unbound"})
ORDERINGS = ("partition", "key")


def read_log(path: str | os.PathLike) -> list[dict]:
    """The events of one log file. A torn *last* line (the writer was killed inside write())
    is dropped; a bad line anywhere else is an error of the harness, not of partq."""
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    events = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            events.append(json.loads(line))
        except ValueError:
            if i >= len(lines) - 2 and not any(x.strip() for x in lines[i + 1:]):
                break  # torn tail
            raise ValueError(f"{path}: line {i + 1} is not JSON: {line[:80]!r}") from None
    return events


def load_dir(path: str | os.PathLike) -> list[list[dict]]:
    """Every ``*.jsonl`` log under ``path``: logs that never bound a flow first (publishers,
    scalers), then the others ordered by their first ``bound`` event."""
    logs = [read_log(os.path.join(path, name)) for name in sorted(os.listdir(path))
            if name.endswith(".jsonl")]

    def bound_at(events):
        return next((e["t"] for e in events if e.get("op") == "bound"), -math.inf)
    return sorted(logs, key=bound_at)


class Report:
    def __init__(self) -> None:
        self.counts: dict[str, int] = defaultdict(int)
        self.examples: dict[str, list] = defaultdict(list)

    def add(self, kind: str, example) -> None:
        self.counts[kind] += 1
        if len(self.examples[kind]) < EXAMPLES_PER_KIND:
            self.examples[kind].append(example)


@dataclass
class Parsed:
    """The logs, read: publishes, scalings, and the delivery-side events in log order."""
    attempts: dict[str, dict] = field(default_factory=dict)     # id -> attempt event
    published: dict[str, dict] = field(default_factory=dict)    # id -> published event
    scales: list[dict] = field(default_factory=list)            # {"to", "begin", "end", ...}
    stream: list[dict] = field(default_factory=list)   # STREAM_OPS' events, "owner" marks
    refused: set[str] = field(default_factory=set)     # ids whose publish raised QueueFull
    dead_ids: set[str] = field(default_factory=set)    # ids found in the dead message queue
    life: list[dict] = field(default_factory=list)     # lifecycle events (``LIFECYCLE_OPS``)


@dataclass
class Deliveries:
    """What the delivery-side checks found, for the publish-side checks and the figures."""
    delivered: set[str]
    acked: set[str]
    deliveries: int
    redeliveries: int
    key_order_checked: bool


def parse(logs: Sequence[Iterable[dict]]) -> Parsed:
    h = Parsed()
    for i, events in enumerate(logs):
        h.stream.append({"op": "owner", "log": i})
        for e in events:
            op = e.get("op")
            if op == "attempt":
                h.attempts[e["id"]] = e
            elif op == "published":
                h.published[e["id"]] = e
            elif op == "scale_begin":
                h.scales.append({"from": e.get("from"), "to": e["to"], "begin": e["t"],
                                 "end": None, "online": bool(e.get("online"))})
            elif op == "scale_end":
                for s in reversed(h.scales):
                    if s["to"] == e["to"] and s["end"] is None:
                        s["end"] = e["t"]
                        break
            elif op in STREAM_OPS:
                h.stream.append(e)
            elif op == "refused":
                h.refused.add(e["id"])
            elif op in LIFECYCLE_OPS:
                h.life.append({**e, "log": i})
                if op == "dead" and e.get("id") is not None:
                    h.dead_ids.add(e["id"])
    for i, s in enumerate(h.scales):
        if s["end"] is None:   # the scaler died: finished by some later open, before the next scale
            s["end"] = h.scales[i + 1]["begin"] if i + 1 < len(h.scales) else math.inf
    return h


def check(logs: Sequence[Iterable[dict]], final_drain: bool = True,
          concurrent: bool = False, lifecycle: dict | None = None,
          ordering: str = "partition") -> dict:
    """Check the logs; return the report: every count of ``VIOLATIONS`` and of the allowed
    kinds, ``examples`` of each violation, and ``ok`` (all violations 0). The logs are in
    delivery-ownership order (see the module doc), unless ``concurrent``: consumer processes
    delivered at the same time (``concurrent_checks``). ``lifecycle``: the queue's lifecycle
    settings in a lifecycle round (``{"max_redelivery": N}``), else None. ``ordering``: the
    queue's (``"key"``: a key round, see ``key_checks``)."""
    if ordering not in ORDERINGS:
        raise ValueError(f"ordering must be one of {ORDERINGS}, not {ordering!r}")
    rep = Report()
    h = parse(logs)
    key_round = ordering == "key"
    if concurrent:
        from concurrent_checks import check_deliveries
        d = check_deliveries(h, rep, key_round)
    else:
        d = sequential_deliveries(h, rep, key_round)
    attempts, published, scales = h.attempts, h.published, h.scales
    delivered_ids, acked_ids, dead_ids = d.delivered, d.acked, h.dead_ids
    life = check_lifecycle(h, rep, d, lifecycle, concurrent, final_drain)

    # ---------------------------------------------------------------- publish side
    dropped = recovered = unknown_not_found = 0
    if final_drain:
        for mid, pub in published.items():
            if mid in delivered_ids or mid in dead_ids:
                continue
            t_attempt = attempts.get(mid, pub).get("t", pub.get("t", 0.0))
            if dropped_by(scales, pub["partition"], t_attempt):
                dropped += 1
            elif "ttl" not in attempts.get(mid, {}):  # (with a TTL it must be dead: ``dead_lost``)
                rep.add("lost", pub)
    for mid in attempts:
        if mid not in published and mid not in h.refused:
            if mid in delivered_ids or mid in dead_ids:
                recovered += 1
            else:
                unknown_not_found += 1

    by_partition: dict[int, list[tuple[int, float, float, str]]] = defaultdict(list)
    for mid, pub in published.items():
        att = attempts.get(mid)
        if att is not None and "t" in att and "t" in pub:
            by_partition[pub["partition"]].append((pub["seq"], att["t"], pub["t"], mid))
    for p, rows in by_partition.items():
        rows.sort(reverse=True)                 # highest seq first
        earliest_return, who = math.inf, None   # among publishes with a higher seq
        for seq, t_att, t_pub, mid in rows:
            if earliest_return < t_att:
                rep.add("publish_order_violations",
                        {"partition": p, "id": mid, "seq": seq, "returned_earlier_with_higher_seq": who})
            if t_pub < earliest_return:
                earliest_return, who = t_pub, mid

    report = {k: rep.counts.get(k, 0) for k in VIOLATIONS}
    report.update(
        attempted=len(attempts), published=len(published),
        unknown=sum(1 for m in attempts if m not in published and m not in h.refused),
        recovered=recovered, unknown_not_found=unknown_not_found,
        dropped_by_scale_down=dropped, deliveries=d.deliveries, delivered=len(delivered_ids),
        redeliveries=d.redeliveries, acked=len(acked_ids),
        never_acked_in_logs=sum(1 for m in delivered_ids if m not in acked_ids),
        scales=len(scales), final_drain=final_drain, key_order_checked=d.key_order_checked,
        partition_order_checked=not key_round, ordering=ordering, concurrent=concurrent, **life,
    )
    report["ok"] = all(report[k] == 0 for k in VIOLATIONS)
    report["examples"] = {k: v for k, v in rep.examples.items() if v}
    return report


def sequential_deliveries(h: Parsed, rep: Report, key_round: bool = False) -> Deliveries:
    """The delivery-side checks when one process at a time delivered, logs in that order."""
    attempts, published, scales, stream = h.attempts, h.published, h.scales, h.stream
    # ---------------------------------------------------------------- deliveries in order
    positions: dict[tuple[int, int], str] = {}
    delivered_ids: set[str] = set()
    acked_ids: set[str] = set()
    order = OrderCheck(partition_order=not key_round)
    redeliveries = 0
    n_delivered = 0
    cross = all(s["online"] for s in scales)
    key_order = KeyOrder(attempts, published, scales, stream, h.dead_ids, cross=cross,
                         same=key_round) if cross or key_round else None
    holds = Holds()
    log = -1
    for e in stream:
        if e["op"] == "owner":
            log = e["log"]
            if key_order is not None:
                key_order.owner_changed(e["log"])
            continue
        if e["op"] in ("gave_back", "unbound"):
            holds.see(log, e)
            continue
        if e["op"] == "ack_sent":
            if key_order is not None:
                key_order.acked(e["id"])
            continue
        if e["op"] == "acked":
            if key_order is not None:
                key_order.acked(e["id"])
            if e["id"] not in delivered_ids:
                rep.add("acked_never_delivered", e)
            acked_ids.add(e["id"])
            continue
        n_delivered += 1
        mid, p, seq, marked = e.get("id"), e["partition"], e["seq"], bool(e.get("redelivered"))
        if mid is None:
            rep.add("garbled", e)
            continue
        att = attempts.get(mid)
        if att is None:
            rep.add("unexpected", e)
        elif not (e.get("key") == e.get("pkey") == att.get("key")):
            rep.add("garbled", {"delivered": e, "attempt_key": att.get("key")})
        pub = published.get(mid)
        if pub is not None and (pub["partition"], pub["seq"]) != (p, seq):
            rep.add("position_mismatches", {"delivered": e, "published": pub})
        other = positions.setdefault((p, seq), mid)
        if other != mid:
            rep.add("position_mismatches", {"delivered": e, "already_at_position": other})
        again = mid in delivered_ids
        if mid in acked_ids:
            rep.add("delivered_after_ack", e)
        elif again and not marked:
            rep.add("unmarked_redeliveries", e)
        if again:
            redeliveries += 1
        order.see(rep, e, (), again, "first delivery out of seq order")
        if key_order is not None and e.get("key") is not None and att is not None:
            blocking = key_order.blocking(mid, e["key"], p, att.get("t"),
                                          partial(holds.holds, log, e.get("flow")))
            if blocking is not None:
                rep.add("key_order_violations", {"delivered": e, "earlier_unacked": blocking})
        holds.see(log, e)
        delivered_ids.add(mid)
    return Deliveries(delivered_ids, acked_ids, n_delivered, redeliveries, key_order is not None)


class OrderCheck:
    """Delivery order per stream (a key within its partition, and, unless not
    ``partition_order`` (a key round), a partition): a first delivery never comes below an
    earlier first delivery's sequence, and a delivery that goes back in sequence carries the
    redelivered mark."""

    def __init__(self, partition_order: bool = True) -> None:
        self.partition_order = partition_order
        self.first_max: dict[tuple, int] = {}   # stream -> highest seq of a *first* delivery
        self.seen_max: dict[tuple, int] = {}    # stream -> highest seq delivered so far

    def see(self, rep: Report, e: dict, scope: tuple, again: bool, first_why: str) -> None:
        """Check delivery ``e`` (``again``: its message was delivered before in ``scope``)."""
        p, seq, marked = e["partition"], e["seq"], bool(e.get("redelivered"))
        streams = [("order_violations", (*scope, "key", e["key"], p))] \
            if e.get("key") is not None else []
        if self.partition_order:
            streams.append(("partition_order_violations", (*scope, "p", p)))
        for kind, stream in streams:
            bad = None
            if not again:
                if seq < self.first_max.get(stream, -1):
                    bad = first_why
                self.first_max[stream] = max(seq, self.first_max.get(stream, -1))
            if not marked and seq < self.seen_max.get(stream, -1):
                bad = bad or "went back in seq without redelivered"
            self.seen_max[stream] = max(seq, self.seen_max.get(stream, -1))
            if bad:
                rep.add(kind, {"why": bad, "delivered": e, "highest_before": self.seen_max[stream]})


def summary(report: dict) -> str:
    """One line of the counts, then the examples of every violation (for assertion messages)."""
    counts = {k: v for k, v in report.items() if k != "examples"}
    lines = [json.dumps(counts, sort_keys=True)]
    for kind, examples in report.get("examples", {}).items():
        for ex in examples:
            lines.append(f"  {kind}: {json.dumps(ex, sort_keys=True, default=str)}")
    return "\n".join(lines)
