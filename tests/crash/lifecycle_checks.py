"""The checker's part for the message lifecycle (rules `delivery-count`, `redelivery-limit`,
`dead-messages`, `expiry`, `quota`), run by ``checker.check`` on every round.

The events it reads, besides ``checker``'s (``lifecycle`` says what the workers do):

==================  ========================================================================
op                  written
==================  ========================================================================
``attempt``         may carry ``ttl`` (seconds) and ``wall`` (wall clock before the call)
``refused``         by a publisher after publish raised ``QueueFull``: id (nothing stored)
``delivered``       carries ``delivery_count``, ``pt`` (its publish time, wall clock) and
                    ``w0`` (the wall clock before the receive)
``nacked``          by a consumer *before* it nacks a poison message: id, delivery_count
``nack_failed``     the nack raised (FlowFenced, FlowClosed)
``rejected``        *before* it rejects a message: id, delivery_count
``rejected_done``   *after* reject returned (durable: the message is dead)
``reject_failed``   the reject raised
``dead``            by the drain, per message of the dead message queue: id, key, dead_reason,
                    origin_partition, origin_seq, delivery_count, dq_partition, dq_seq,
                    died_wall (when it died, wall clock), wall (with ``t``: the clocks then)
``died``            by the harness (``harness.jsonl``): a consumer or scaler process died
                    between ``lo`` and ``hi`` (monotonic)
==================  ========================================================================

The counts (all in ``checker.VIOLATIONS``), each certain, never a guess:

* ``refused_but_delivered``: an id whose publish raised ``QueueFull`` delivered, or found in the
  dead message queue (a refused publish stores nothing).
* ``acked_and_dead``: an id with an ``acked`` line (the ack returned) that is also in the dead
  message queue.
* ``dead_lost`` (after a final drain): a message that must have died, neither in the dead
  message queue, nor acked (an ``acked`` line), nor in a partition a scale-down deleted:
  (a) a ``rejected_done`` one not delivered again after its ``rejected`` line (a reject of a
  message no longer in flight to the flow is ignored: it comes back); (b) a poison one whose own
  nack was called (``nacked``) on a delivery with ``delivery_count >= 1 + max_redelivery``: that
  failure is counted whatever happens next (the nack, or the unbind, move or crash that took the
  message first), so its next handout kills it; (c) a published one with a TTL that no
  ``delivered`` line names: the drain emptied the queue, so it expired (or died otherwise). A
  message without a TTL in that state is ``lost``.
* ``dead_duplicated``: an id at two places of the dead message queue.
* ``delivery_count_down``: a delivery whose ``delivery_count`` is lower than an earlier
  delivery's of the same id, where the order is certain (the log order when one process at a
  time delivered; with concurrent consumer processes, the earlier one returned before the later
  one began: ``concurrent_checks``); or a dead copy whose ``delivery_count`` header is lower than
  a delivery's count (one lower is allowed for an expired message: a message given back only
  because an earlier one of its partition was nacked keeps its count).
* ``dead_too_early`` (lifecycle rounds where one process at a time delivered): a message dead
  for ``max_redelivery`` with fewer logged deliveries than ``1 + max_redelivery - a``, where
  ``a`` allows for deliveries the logs cannot show and counts one too high: each crash of a
  consumer (or scaler) process between the message's attempt and its death may have counted one
  (a delivery whose ``delivered`` line the kill prevented, or a message under the leased mark
  never handed out); ``a`` is the number of those crashes, at least 1. With concurrent consumer
  processes a handoff that times out counts by the mark too, with no crash: not checked there.
* ``delivery_count_jumped`` (lifecycle rounds where one process at a time delivered): a delivery
  whose count is more than ``1 + c`` above the id's previous logged delivery's (0 before the
  first), ``c`` the crashes (as above) from that delivery's receive (or the attempt) to this
  one's: a count grows by one per failed delivery, and each crash may add one more.
* ``delivered_past_limit`` (lifecycle rounds): a delivery with ``delivery_count`` above
  ``1 + max_redelivery`` (partq kills instead of handing out at that count).
* ``delivered_during_delay`` (lifecycle rounds): a nack with a delay ``d`` (its ``nacked``
  line at ``t``) that returned the message among what it gave back (its ``gave_back`` line),
  followed by a delivery of that message whose receive began after the nack returned and ended
  before ``t + d``: the delay ends no sooner than that, whatever happened meanwhile (a crash, a
  restart, the partition moving to another process: the delay is durable). Times are the
  host's monotonic clock, the same in every process.
* ``expired_delivered`` (lifecycle rounds where one process at a time delivered): a delivery of a
  message whose expiry (``pt + ttl``) had passed when its receive began (``w0``): the owner's
  receive decides at the call, on the same wall clock. (A flow of another process may receive
  what the owner sent it earlier: not checked there.)

Dead copies are also held to the order-free rules: an id never attempted is ``unexpected``, a
payload that does not parse ``garbled`` (as is a key that differs from the attempt's), an origin
other than the position its publish returned ``position_mismatches``.
"""
from __future__ import annotations

import math
from collections import defaultdict

LIFECYCLE_VIOLATIONS = ("refused_but_delivered", "acked_and_dead", "dead_lost", "dead_duplicated",
                        "delivery_count_down", "delivery_count_jumped", "dead_too_early",
                        "delivered_past_limit", "delivered_during_delay",
                        "expired_delivered")
LIFECYCLE_OPS = frozenset({"nacked", "nack_failed", "rejected", "rejected_done", "reject_failed",
                           "dead", "died"})
DEAD_REASONS = ("max_redelivery", "expired", "rejected")
DEATH_SLACK = 1.0       # seconds after a dead copy's publish time still counted as its death
EXPIRY_SLACK = 0.01     # seconds: float rounding of the logged times


def _start(e: dict) -> float:
    return e.get("t0", e["t"])


def check_lifecycle(h, rep, d, lifecycle: dict | None, concurrent: bool,
                    final_drain: bool) -> dict:
    """Add the lifecycle's violations to ``rep``; return its figures for the report. ``h`` is
    ``checker.Parsed``, ``d`` the ``checker.Deliveries`` of the delivery-side checks."""
    deliveries: dict[str, list[dict]] = defaultdict(list)
    for e in h.stream:
        if e["op"] == "delivered" and e.get("id") is not None:
            deliveries[e["id"]].append(e)
    dead = _dead_copies(h, rep)
    _counts_go_up(rep, deliveries, dead, concurrent)
    for mid in sorted(h.refused):
        if mid in deliveries or mid in dead:
            rep.add("refused_but_delivered", {"id": mid, "delivered": mid in deliveries,
                                              "dead": mid in dead})
    for mid in sorted(d.acked & set(dead)):
        rep.add("acked_and_dead", {"id": mid, "dead": dead[mid][0]})
    checked_early, certain = False, 0
    if lifecycle is not None:
        limit = 1 + lifecycle["max_redelivery"]
        _delays_kept(h, rep, deliveries)
        for ds in deliveries.values():
            for e in ds:
                if e.get("delivery_count", 0) > limit:
                    rep.add("delivered_past_limit", e)
        if not concurrent:
            _expiry(h, rep, deliveries)
            crashes = [(e["lo"], e["hi"]) for e in h.life if e["op"] == "died"]
            _jumps(h, rep, deliveries, crashes)
            if final_drain:
                checked_early = True
                _too_early(h, rep, deliveries, dead, limit, crashes)
        if final_drain:
            certain = _dead_lost(h, rep, d, deliveries, dead, limit)
    by_reason = {r: 0 for r in DEAD_REASONS}
    for copies in dead.values():
        reason = copies[0].get("dead_reason")
        by_reason[reason] = by_reason.get(reason, 0) + 1
    return {"refused": len(h.refused), "dead": len(dead), "dead_by_reason": by_reason,
            "nacked": sum(1 for e in h.life if e["op"] == "nacked"),
            "rejected": sum(1 for e in h.life if e["op"] == "rejected_done"),
            "lifecycle": lifecycle is not None, "dead_too_early_checked": checked_early,
            "certainly_dead": certain}


def _dead_copies(h, rep) -> dict[str, list[dict]]:
    """id -> its copies in the dead message queue (one per place); the order-free rules."""
    dead: dict[str, dict[tuple, dict]] = defaultdict(dict)
    for e in h.life:
        if e["op"] != "dead":
            continue
        mid = e.get("id")
        if mid is None:
            rep.add("garbled", {"dead": e})
            continue
        att = h.attempts.get(mid)
        if att is None:
            rep.add("unexpected", {"dead": e})
        elif not (e.get("key") == e.get("pkey") == att.get("key")):
            rep.add("garbled", {"dead": e, "attempt_key": att.get("key")})
        pub = h.published.get(mid)
        if pub is not None and (pub["partition"], pub["seq"]) != \
                (e.get("origin_partition"), e.get("origin_seq")):
            rep.add("position_mismatches", {"dead": e, "published": pub})
        dead[mid].setdefault((e.get("dq_partition"), e.get("dq_seq")), e)
    out = {mid: list(copies.values()) for mid, copies in dead.items()}
    for mid, copies in sorted(out.items()):
        if len(copies) > 1:
            rep.add("dead_duplicated", {"id": mid, "copies": copies})
    return out


def _counts_go_up(rep, deliveries: dict[str, list[dict]], dead: dict[str, list[dict]],
                  concurrent: bool) -> None:
    for mid, ds in deliveries.items():
        counted = [e for e in ds if "delivery_count" in e]
        if concurrent:
            for e in counted:
                before = [a for a in counted if a["t"] < _start(e)
                          and a["delivery_count"] > e["delivery_count"]]
                if before:
                    rep.add("delivery_count_down", {"delivered": e, "earlier": before[0]})
        else:
            high = None
            for e in counted:
                if high is not None and e["delivery_count"] < high["delivery_count"]:
                    rep.add("delivery_count_down", {"delivered": e, "earlier": high})
                if high is None or e["delivery_count"] > high["delivery_count"]:
                    high = e
        for copy in dead.get(mid, ()):
            top = max(counted, key=lambda a: a["delivery_count"], default=None)
            slack = 1 if copy.get("dead_reason") == "expired" else 0
            if top is not None and isinstance(copy.get("delivery_count"), int) and \
                    copy["delivery_count"] + slack < top["delivery_count"]:
                rep.add("delivery_count_down", {"dead": copy, "earlier": top})


def _expiry(h, rep, deliveries: dict[str, list[dict]]) -> None:
    for mid, ds in deliveries.items():
        ttl = h.attempts.get(mid, {}).get("ttl")
        if not ttl:
            continue
        for e in ds:
            if "pt" in e and "w0" in e and e["w0"] > e["pt"] + ttl + EXPIRY_SLACK:
                rep.add("expired_delivered", {"delivered": e, "ttl": ttl,
                                              "late_by": round(e["w0"] - e["pt"] - ttl, 3)})


def _delays_kept(h, rep, deliveries: dict[str, list[dict]]) -> None:
    events: list[tuple[int, float, dict]] = [(e["log"], e["t"], e) for e in h.life
                                             if e["op"] == "nacked"]
    log = -1
    for e in h.stream:       # stream events carry no log number: an "owner" line starts each
        if e["op"] == "owner":
            log = e["log"]
        elif e["op"] == "gave_back":
            events.append((log, e["t"], e))
    nacked: dict[tuple[int, str], dict] = {}    # (log, id) -> its last ``nacked`` line
    for log, _, e in sorted(events, key=lambda x: (x[0], x[1])):
        mid = e.get("id")
        if e["op"] == "nacked":
            nacked[log, mid] = e
            continue
        n = nacked.pop((log, mid), None)
        if n is None or not n.get("delay"):
            continue
        ds = deliveries.get(mid, ())
        if not ds or (ds[0].get("partition"), ds[0].get("seq")) not in \
                ((e.get("partition"), s) for s in e.get("seqs", ())):
            continue                # the nack did not take the message back: no delay
        ends = n["t"] + n["delay"] - EXPIRY_SLACK
        for x in deliveries.get(mid, ()):
            if _start(x) > e["t"] and x["t"] < ends:
                rep.add("delivered_during_delay", {"delivered": x, "nacked": n,
                                                   "early_by": round(ends - x["t"], 3)})


def _crashes(crashes: list[tuple[float, float]], start: float, end: float) -> int:
    return sum(1 for lo, hi in crashes if hi >= start and lo <= end)


def _jumps(h, rep, deliveries: dict[str, list[dict]], crashes: list) -> None:
    for mid, ds in deliveries.items():
        att = h.attempts.get(mid)
        if att is None:
            continue
        since, count = att["t"], 0
        for e in ds:
            if "delivery_count" not in e:
                continue
            allowed = 1 + _crashes(crashes, since, e["t"])
            if e["delivery_count"] - count > allowed:
                rep.add("delivery_count_jumped", {"delivered": e, "previous_count": count,
                                                  "crashes_allowed_for": allowed - 1})
            since, count = _start(e), max(count, e["delivery_count"])


def _too_early(h, rep, deliveries: dict[str, list[dict]], dead: dict[str, list[dict]],
               limit: int, crashes: list) -> None:
    for mid, copies in dead.items():
        copy = copies[0]
        att = h.attempts.get(mid)
        if copy.get("dead_reason") != "max_redelivery" or att is None:
            continue
        died = copy["died_wall"] - (copy["wall"] - copy["t"]) + DEATH_SLACK \
            if "died_wall" in copy and "wall" in copy else math.inf
        allowed = max(1, _crashes(crashes, att["t"], died))
        logged = len(deliveries.get(mid, ()))
        if logged + allowed < limit:
            rep.add("dead_too_early", {"id": mid, "logged_deliveries": logged,
                                       "crashes_allowed_for": allowed, "dead": copy})


def _dead_lost(h, rep, d, deliveries: dict[str, list[dict]], dead: dict[str, list[dict]],
               limit: int) -> int:
    """Count ``dead_lost``; return how many messages had to be dead."""
    from checker import dropped_by
    must: dict[str, str] = {}
    rejected_at: dict[tuple, float] = {}      # (log, id) -> its last ``rejected`` line's t
    for e in h.life:
        mid = e["id"] if e["op"] in ("rejected", "rejected_done", "nacked") else None
        if e["op"] == "rejected":
            rejected_at[e["log"], mid] = e["t"]
        if mid is None or mid in must or e["op"] == "rejected":
            continue
        if e["op"] == "rejected_done":
            t = rejected_at.get((e["log"], mid), e["t"])
            if not any(_start(x) > t for x in deliveries.get(mid, ())):
                must[mid] = "rejected"
        elif e.get("delivery_count", 0) >= limit:
            must[mid] = f"nacked at delivery_count {e['delivery_count']}"
    for mid, att in h.attempts.items():
        if att.get("ttl") and mid in h.published and mid not in deliveries:
            must.setdefault(mid, "a TTL, never delivered")
    for mid, why in sorted(must.items()):
        if mid in dead or mid in d.acked:
            continue
        pub, att = h.published.get(mid), h.attempts.get(mid, {})
        where = pub or next(iter(deliveries.get(mid, ())), None)
        if where is not None and dropped_by(h.scales, where["partition"],
                                            att.get("t", where.get("t", 0.0))):
            continue
        rep.add("dead_lost", {"id": mid, "why": why, "published": pub})
    return len(must)
