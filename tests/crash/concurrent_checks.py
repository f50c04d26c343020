"""The delivery-side checks when several consumer processes delivered at the same time (rule
`peer-flows`: flows of every process, coordinated by the delivery owner).

Logs of concurrent processes cannot be concatenated into one real order. Every consumer event
carries an interval instead: ``t0`` (monotonic time before the call: receive, ack) and ``t``
(after it returned, when it was logged), on the one CLOCK_MONOTONIC of the host. An event A
*happened before* B when A's call returned before B's began: ``A.t < B.t0``. Each rule below is
checked only where the order is certain, so it never reports a violation that did not happen:

* ``delivered_after_ack``: a delivery that began after an ack of the same id returned;
* ``unmarked_redeliveries``: a delivery without ``redelivered`` that began after an earlier
  delivery of the same id returned;
* ``order_violations`` / ``partition_order_violations``: the per-(key, partition) and
  per-partition rules of ``checker``, within each process's life (one log); the per-partition
  one not in key rounds;
* ``key_order_violations`` (``key_checks``: rule `online-scaling`, when every scaling was
  online; rule `key-ordering`, in key rounds): a delivery of key k that returned before the
  first ack call (``ack_sent`` or ``acked``'s ``t0``) of an earlier message of k began, that
  message being acked at all in the logs; in another partition, or (key rounds) in its own
  partition and not held by the flow the delivery went to.

The order-free rules (``unexpected``, ``garbled``, ``position_mismatches``,
``acked_never_delivered``) are the same as in ``checker``.
"""
from __future__ import annotations

import math
from collections import defaultdict

from checker import Deliveries, OrderCheck, Parsed, Report
from key_checks import concurrent_key_order


def _start(e: dict) -> float:
    return e.get("t0", e["t"])


def check_deliveries(h: Parsed, rep: Report, key_round: bool = False) -> Deliveries:
    deliveries: dict[str, list[dict]] = defaultdict(list)
    ack_done: dict[str, float] = {}          # id -> earliest return of an ack
    ack_begun: dict[str, float] = {}         # id -> earliest start of an ack call
    positions: dict[tuple[int, int], str] = {}
    n_delivered = 0
    order = OrderCheck(partition_order=not key_round)
    log = -1
    for e in h.stream:
        op = e["op"]
        if op == "owner":
            log = e["log"]
            continue
        if op in ("gave_back", "unbound"):
            continue                        # (``key_checks``)
        if op in ("acked", "ack_sent"):
            mid = e["id"]
            ack_begun[mid] = min(ack_begun.get(mid, math.inf), _start(e))
            if op == "acked":
                ack_done[mid] = min(ack_done.get(mid, math.inf), e["t"])
            continue
        n_delivered += 1
        mid, p, seq = e.get("id"), e["partition"], e["seq"]
        if mid is None:
            rep.add("garbled", e)
            continue
        att = h.attempts.get(mid)
        if att is None:
            rep.add("unexpected", e)
        elif not (e.get("key") == e.get("pkey") == att.get("key")):
            rep.add("garbled", {"delivered": e, "attempt_key": att.get("key")})
        pub = h.published.get(mid)
        if pub is not None and (pub["partition"], pub["seq"]) != (p, seq):
            rep.add("position_mismatches", {"delivered": e, "published": pub})
        other = positions.setdefault((p, seq), mid)
        if other != mid:
            rep.add("position_mismatches", {"delivered": e, "already_at_position": other})
        again_here = any(d["log"] == log for d in deliveries[mid])
        order.see(rep, e, (log,), again_here, "first delivery in this process out of seq order")
        deliveries[mid].append({**e, "log": log})

    acked = set(ack_done)
    for mid in acked:
        if mid not in deliveries:
            rep.add("acked_never_delivered", {"id": mid})
    redeliveries = 0
    for mid, ds in deliveries.items():
        redeliveries += len(ds) - 1
        done = ack_done.get(mid, math.inf)
        first_return = min(d["t"] for d in ds)
        for d in ds:
            if _start(d) > done:
                rep.add("delivered_after_ack", d)
            elif not d.get("redelivered") and _start(d) > first_return:
                rep.add("unmarked_redeliveries", d)
    cross = all(s["online"] for s in h.scales)
    if cross or key_round:
        concurrent_key_order(h, rep, deliveries, ack_begun, cross, key_round)
    return Deliveries(set(deliveries), acked, n_delivered, redeliveries, cross or key_round)
