"""The lifecycle checks (``lifecycle_checks``) must be able to fail too: a clean lifecycle
history passes, and each case breaks one rule and expects exactly that count (the histories are
``test_checker``'s, with the lifecycle's events)."""
from __future__ import annotations

from checker import check
from test_checker import History, Timed, only

LIFE = {"max_redelivery": 3}
WALL = 1000.0       # the wall clock runs this far ahead of the monotonic one in these logs


class Life(History):
    """Lifecycle events: refusals, nacks, rejects, the dead message queue, process deaths."""

    def refused(self, mid, key="k"):
        self.attempt(mid, key)
        self.pub.append(self._ev(op="refused", id=mid))
        return self

    def nacked(self, mid, dc, delay=None):
        self.cons[-1].append(self._ev(op="nacked", id=mid, delivery_count=dc, delay=delay))
        return self

    def rejected(self, mid, dc, done=True):
        self.cons[-1].append(self._ev(op="rejected", id=mid, delivery_count=dc))
        if done:
            self.cons[-1].append(self._ev(op="rejected_done", id=mid))
        return self

    def poison(self, mid, p, seq, times=4, key="poison-0"):
        """Delivered and nacked ``times`` times, counts 1, 2, ..."""
        for n in range(1, times + 1):
            self.deliver(mid, p, seq, redelivered=n > 1, key=key, delivery_count=n)
            self.nacked(mid, n)
        return self

    def died(self, lo, hi):
        self.pub.append({"op": "died", "proc": "con-0-0001", "role": "con", "lo": lo, "hi": hi,
                         "t": hi})
        return self

    def dead(self, mid, reason, dc, origin, dq, key="k", died=None):
        """A dead copy found by the drain (``died``: when it died, monotonic; default now)."""
        e = self._ev(op="dead", id=mid, key=key, pkey=key, dead_reason=reason,
                     origin_queue="q", origin_partition=origin[0], origin_seq=origin[1],
                     delivery_count=dc, dq_partition=dq[0], dq_seq=dq[1])
        e.update(wall=e["t"] + WALL, died_wall=(e["t"] if died is None else died) + WALL)
        self.cons[-1].append(e)
        return self

    def check(self, **kw):
        kw.setdefault("lifecycle", LIFE)
        return check(self.logs(), **kw)


def life() -> Life:
    """A clean lifecycle history: a message acked; a poison one nacked four times and dead; a
    rejected one; one with a TTL that expired undelivered; one refused by the quota."""
    h = Life()
    h.publish("a", 0, 0, key="k").publish("p", 1, 0, key="poison-0")
    h.publish("r", 0, 1, key="reject-0").publish("x", 0, 2, key="k", ttl=0.5)
    h.refused("f")
    h.deliver("a", 0, 0, delivery_count=1).ack("a")
    h.poison("p", 1, 0)
    h.deliver("r", 0, 1, key="reject-0", delivery_count=1).rejected("r", 1)
    h.restart_consumer()       # the drain
    h.dead("p", "max_redelivery", 4, (1, 0), (0, 0), key="poison-0")
    h.dead("r", "rejected", 1, (0, 1), (0, 1), key="reject-0")
    h.dead("x", "expired", 0, (0, 2), (0, 2))
    return h


def test_lifecycle_clean_history_passes():
    r = life().check()
    only(r)
    assert (r["refused"], r["dead"], r["certainly_dead"], r["nacked"], r["rejected"]) == \
        (1, 3, 3, 4, 1)
    assert r["dead_by_reason"] == {"max_redelivery": 1, "expired": 1, "rejected": 1}
    assert r["unknown"] == 0 and r["lost"] == 0 and r["dead_too_early_checked"] is True


def test_refused_but_delivered():
    h = life().deliver("f", 0, 3, delivery_count=1).ack("f")
    only(h.check(), "refused_but_delivered")
    h = life().dead("f", "expired", 0, (0, 3), (0, 3))
    only(h.check(), "refused_but_delivered")


def test_acked_and_dead():
    h = life()
    h.cons[1].append(h._ev(op="acked", id="r"))      # the reject's message acked after all
    r = h.check()
    only(r, "acked_and_dead")
    assert r["acked_and_dead"] == 1


def test_dead_lost_rejected_poison_and_expired():
    for gone in ("p", "r", "x"):
        h = life()
        h.cons[-1] = [e for e in h.cons[-1] if not (e["op"] == "dead" and e["id"] == gone)]
        r = h.check()
        only(r, "dead_lost")
        assert r["dead_lost"] == 1 and r["examples"]["dead_lost"][0]["id"] == gone
        assert r["lost"] == 0
    # not certain: a reject ignored (the message came back and was acked), a poison message
    # nacked at a count below the limit, a TTL message in a partition a scale-down deleted
    h = Life().publish("r", 0, 0, key="reject-0").publish("p", 1, 0, key="poison-0")
    h.publish("x", 3, 0, ttl=0.5).scale(4, 2)
    h.deliver("r", 0, 0, key="reject-0", delivery_count=1).rejected("r", 1)
    h.poison("p", 1, 0, times=3)
    h.restart_consumer().deliver("r", 0, 0, True, key="reject-0", delivery_count=2).ack("r")
    h.deliver("p", 1, 0, True, key="poison-0", delivery_count=4).ack("p")
    r = h.check()
    only(r)
    assert r["certainly_dead"] == 1 and r["dropped_by_scale_down"] == 1
    # a TTL message never delivered and not dead is dead_lost, not lost; without a TTL, lost
    h = Life().publish("x", 0, 0, ttl=0.5).publish("y", 0, 1)
    r = h.check()
    only(r, "dead_lost", "lost")
    assert (r["dead_lost"], r["lost"]) == (1, 1)
    # and without a final drain nothing is known
    only(h.check(final_drain=False))


def test_dead_duplicated():
    h = life().dead("r", "rejected", 1, (0, 1), (0, 7), key="reject-0")
    r = h.check()
    only(r, "dead_duplicated")
    assert r["dead_duplicated"] == 1
    # the same copy seen twice (the same place in the dead message queue) is one copy
    only(life().dead("r", "rejected", 1, (0, 1), (0, 1), key="reject-0").check())


def test_delivery_count_down():
    h = Life().publish("a", 0, 0)
    h.deliver("a", 0, 0, delivery_count=1).deliver("a", 0, 0, True, delivery_count=2)
    h.restart_consumer().deliver("a", 0, 0, redelivered=True, delivery_count=1).ack("a")
    r = h.check()
    only(r, "delivery_count_down")
    assert r["delivery_count_down"] == 1
    # the dead copy's count below a delivery's; one below is allowed for an expired message
    h = life()
    h.cons[-1] = [{**e, "delivery_count": 3} if e.get("id") == "p" and e["op"] == "dead" else e
                  for e in h.cons[-1]]
    r = h.check()
    only(r, "delivery_count_down")
    assert r["examples"]["delivery_count_down"][0]["dead"]["id"] == "p"
    h = Life().publish("x", 0, 0, ttl=0.5).deliver("x", 0, 0, delivery_count=1)
    h.restart_consumer().dead("x", "expired", 0, (0, 0), (0, 0))
    only(h.check())


def test_concurrent_delivery_count_down_only_when_surely_later():
    h = Timed()
    h.t = 0.0
    h.publish("a", 0, 0)
    h.deliver_at(0, "a", 0, 0, 10, 12)
    h.deliver_at(1, "a", 0, 0, 11, 13, redelivered=True)   # overlaps: either came first
    h.cons[0][-1]["delivery_count"], h.cons[1][-1]["delivery_count"] = 2, 1
    h.ack_at(1, "a", 14, 15)
    only(check(h.logs(), concurrent=True))
    h.cons[1][-2].update(t0=12.5)                        # began after the first returned
    r = check(h.logs(), concurrent=True)
    only(r, "delivery_count_down")


def test_dead_too_early():
    def history(deliveries, crashes=()):
        h = Life().publish("p", 1, 0, key="poison-0").poison("p", 1, 0, times=deliveries)
        for lo, hi in crashes:
            h.died(lo, hi)
        h.restart_consumer().dead("p", "max_redelivery", 4, (1, 0), (0, 0), key="poison-0")
        return h
    only(history(3).check())                  # one too high: allowed
    r = history(2).check()
    only(r, "dead_too_early")
    assert r["examples"]["dead_too_early"][0]["logged_deliveries"] == 2
    only(history(2, crashes=[(3.0, 3.5), (5.0, 5.2)]).check())  # two crashes: two allowed
    only(history(2, crashes=[(-9.0, -8.0), (5.0, 5.2)]).check(), "dead_too_early")  # before it
    only(history(2).check(concurrent=True))   # not checked with concurrent consumers


def test_delivery_count_jumped():
    def history(crash=None):
        h = Life().publish("a", 0, 0).deliver("a", 0, 0, delivery_count=1)
        if crash:
            h.died(h.t + 0.2, h.t + 0.4)
        return h.deliver("a", 0, 0, redelivered=True, delivery_count=3).ack("a")
    r = history().check()
    only(r, "delivery_count_jumped")
    assert r["examples"]["delivery_count_jumped"][0]["previous_count"] == 1
    only(history(crash=True).check())         # a crash between: one more allowed
    only(history().check(concurrent=True))    # not checked with concurrent consumers
    # the first delivery may be one above 1 per crash since the attempt, and no more
    h = Life().publish("a", 0, 0).deliver("a", 0, 0, redelivered=True, delivery_count=2).ack("a")
    only(h.check(), "delivery_count_jumped")
    h = Life().publish("a", 0, 0).died(2.5, 2.6)
    only(h.deliver("a", 0, 0, redelivered=True, delivery_count=2).ack("a").check())


def test_delivered_past_limit():
    h = Life().publish("a", 0, 0)
    for n in range(1, 6):
        h.deliver("a", 0, 0, redelivered=n > 1, delivery_count=n)
    h.ack("a")
    r = h.check()
    only(r, "delivered_past_limit")
    assert r["delivered_past_limit"] == 1
    only(h.check(lifecycle=None))             # no max_redelivery: any count


def test_expired_delivered():
    def history(w0):
        h = Life().publish("x", 0, 0, ttl=0.5)
        return h.deliver("x", 0, 0, delivery_count=1, pt=WALL + 1.5, w0=w0).ack("x")
    only(history(WALL + 1.9).check())         # the receive began before the expiry
    r = history(WALL + 2.1).check()
    only(r, "expired_delivered")
    only(history(WALL + 2.1).check(concurrent=True))   # a peer may receive what came earlier


def test_dead_copies_follow_the_order_free_rules():
    only(life().dead("ghost", "expired", 0, (0, 9), (1, 0)).check(), "unexpected")
    only(life().dead("a2", "expired", 0, (0, 9), (1, 0)).attempt("a2", key="j").check(),
         "garbled")
    h = life()
    h.cons[-1] = [{**e, "origin_seq": 5} if e.get("id") == "x" else e for e in h.cons[-1]]
    only(h.check(), "position_mismatches")


def delayed(delay: float, gave_back: tuple = (0,)) -> Life:
    """"d" delivered, nacked with ``delay`` (its nack giving back ``gave_back`` of partition 2),
    delivered again two ticks (seconds) after the ``nacked`` line, acked."""
    h = life()
    h.publish("d", 2, 0, key="d")
    h.deliver("d", 2, 0, key="d", delivery_count=1).nacked("d", 1, delay=delay)
    h.gave_back("d", 2, gave_back)
    h.deliver("d", 2, 0, key="d", redelivered=True, delivery_count=2).ack("d")
    return h


def test_a_delivery_before_a_nacks_delay_ended_is_counted():
    only(delayed(1.5).check())                          # again after the delay: fine
    r = delayed(5.0).check()                            # 3 s early
    only(r, "delivered_during_delay")
    assert r["delivered_during_delay"] == 1
    only(delayed(5.0, gave_back=()).check())            # the nack took nothing back: no delay
