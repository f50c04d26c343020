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
                   redelivered
``acked``          after ack/ack_many returned: id
``scale_begin``    by a scaler before ``scale(q, to)``: from, to, t
``scale_end``      after it returned: to, t
=================  ==========================================================================

``t`` is ``time.monotonic()``, one clock for every process of the host (CLOCK_MONOTONIC).

Ordering: the logs are given (``check``) in the order their processes *owned delivery*. Only one
process at a time runs delivery for a queue (a file lock, released by the kernel when its holder
dies), so concatenating delivery events in that order is their real order. ``load_dir`` sorts
logs by their first ``bound`` event to get it.

The counts (``check`` returns them as a dict; ``VIOLATIONS`` must all be 0):

* ``lost``: publish returned, never delivered, and not excused by a scale-down (below).
* ``unexpected``: delivered, never attempted.
* ``delivered_after_ack``: a delivery of an id after an ``acked`` line for it.
* ``unmarked_redeliveries``: a delivery of an id already delivered (and not acked: those are
  ``delivered_after_ack``) without ``redelivered=True``. Duplicates are allowed only this way.
* ``order_violations`` (S3), per key and partition (a key maps to one partition until a scaling
  changes the count, and no order is promised across that change). For each (key, partition):
  (a) the *first* deliveries of its messages come in increasing seq order (seq order is publish
  order, checked by ``publish_order_violations``), and (b) a delivery whose seq is lower than
  the highest seq delivered before for that key and partition is marked redelivered.
  Each delivery breaking (a) or (b) counts once.
* ``partition_order_violations``: the same two rules per partition (keys and unkeyed alike).
* ``publish_order_violations``: per partition, publish A returned (its ``published`` line)
  before publish B was attempted, yet seq(A) > seq(B). Linearizability of each partition's log.
* ``position_mismatches``: a delivery at another (partition, seq) than its publish returned,
  or two ids at one (partition, seq).
* ``garbled``: a delivered payload that did not parse, or whose key differs from the key the
  publisher used (message key, payload key and attempt key must agree).
* ``acked_never_delivered``: an ``acked`` line for an id no ``delivered`` line names.

Allowed and counted: ``recovered`` (unknown outcome, found delivered), ``unknown_not_found``
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

VIOLATIONS = ("lost", "unexpected", "delivered_after_ack", "unmarked_redeliveries",
              "order_violations", "partition_order_violations", "publish_order_violations",
              "position_mismatches", "garbled", "acked_never_delivered")
EXAMPLES_PER_KIND = 5


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


class _Report:
    def __init__(self) -> None:
        self.counts: dict[str, int] = defaultdict(int)
        self.examples: dict[str, list] = defaultdict(list)

    def add(self, kind: str, example) -> None:
        self.counts[kind] += 1
        if len(self.examples[kind]) < EXAMPLES_PER_KIND:
            self.examples[kind].append(example)


def check(logs: Sequence[Iterable[dict]], final_drain: bool = True) -> dict:
    """Check the logs (in delivery-ownership order, see the module doc); return the report:
    every count of ``VIOLATIONS`` and of the allowed kinds, ``examples`` of each violation,
    and ``ok`` (all violations 0)."""
    rep = _Report()
    attempts: dict[str, dict] = {}          # id -> attempt event
    published: dict[str, dict] = {}         # id -> published event
    scales: list[dict] = []                 # {"to", "begin", "end"} in begin order
    stream: list[dict] = []                 # delivered and acked events, in real order

    for events in logs:
        for e in events:
            op = e.get("op")
            if op == "attempt":
                attempts[e["id"]] = e
            elif op == "published":
                published[e["id"]] = e
            elif op == "scale_begin":
                scales.append({"from": e.get("from"), "to": e["to"], "begin": e["t"], "end": None})
            elif op == "scale_end":
                for s in reversed(scales):
                    if s["to"] == e["to"] and s["end"] is None:
                        s["end"] = e["t"]
                        break
            elif op in ("delivered", "acked"):
                stream.append(e)
    for i, s in enumerate(scales):
        if s["end"] is None:   # the scaler died: finished by some later open, before the next scale
            s["end"] = scales[i + 1]["begin"] if i + 1 < len(scales) else math.inf

    # ---------------------------------------------------------------- deliveries in order
    positions: dict[tuple[int, int], str] = {}
    delivered_ids: set[str] = set()
    acked_ids: set[str] = set()
    first_max: dict[tuple, int] = {}        # (key, p) / p -> highest seq of a *first* delivery
    seen_max: dict[tuple, int] = {}         # (key, p) / p -> highest seq delivered so far
    redeliveries = 0
    n_delivered = 0
    for e in stream:
        if e["op"] == "acked":
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
        for kind, stream_key in (("order_violations", ("key", e.get("key"), p)),
                                 ("partition_order_violations", ("p", p))):
            if kind == "order_violations" and e.get("key") is None:
                continue
            bad = None
            if not again:
                if seq < first_max.get(stream_key, -1):
                    bad = "first delivery out of seq order"
                first_max[stream_key] = max(seq, first_max.get(stream_key, -1))
            if not marked and seq < seen_max.get(stream_key, -1):
                bad = bad or "went back in seq without redelivered"
            seen_max[stream_key] = max(seq, seen_max.get(stream_key, -1))
            if bad:
                rep.add(kind, {"why": bad, "delivered": e, "highest_before": seen_max[stream_key]})
        delivered_ids.add(mid)

    # ---------------------------------------------------------------- publish side
    dropped = recovered = unknown_not_found = 0
    if final_drain:
        for mid, pub in published.items():
            if mid in delivered_ids:
                continue
            t_attempt = attempts.get(mid, pub).get("t", pub.get("t", 0.0))
            if any(s["to"] <= pub["partition"] and s["to"] < (s["from"] or math.inf)
                   and t_attempt < s["end"] for s in scales):
                dropped += 1
            else:
                rep.add("lost", pub)
    for mid in attempts:
        if mid not in published:
            if mid in delivered_ids:
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
        unknown=sum(1 for m in attempts if m not in published),
        recovered=recovered, unknown_not_found=unknown_not_found,
        dropped_by_scale_down=dropped, deliveries=n_delivered, delivered=len(delivered_ids),
        redeliveries=redeliveries, acked=len(acked_ids),
        never_acked_in_logs=sum(1 for m in delivered_ids if m not in acked_ids),
        scales=len(scales), final_drain=final_drain,
    )
    report["ok"] = all(report[k] == 0 for k in VIOLATIONS)
    report["examples"] = {k: v for k, v in rep.examples.items() if v}
    return report


def summary(report: dict) -> str:
    """One line of the counts, then the examples of every violation (for assertion messages)."""
    counts = {k: v for k, v in report.items() if k != "examples"}
    lines = [json.dumps(counts, sort_keys=True)]
    for kind, examples in report.get("examples", {}).items():
        for ex in examples:
            lines.append(f"  {kind}: {json.dumps(ex, sort_keys=True, default=str)}")
    return "\n".join(lines)
