"""The checker itself must be able to fail: hand-made logs, each breaking one rule.

Every case builds a clean history, breaks exactly one thing, and expects exactly that count to
be non-zero (and ``ok`` False); the clean history and the allowed anomalies (recovered unknown
outcomes, marked redeliveries, scale-down drops) must pass.
"""
from __future__ import annotations

import json
import os

import pytest
from checker import VIOLATIONS, check, load_dir, read_log


class History:
    """Builds logs: one publisher log and consumer logs in ownership order, with a clock."""

    def __init__(self) -> None:
        self.t = 0.0
        self.pub: list[dict] = []
        self.cons: list[list[dict]] = [[]]

    def _ev(self, **e) -> dict:
        self.t += 1.0
        e.setdefault("t", self.t)
        return e

    def attempt(self, mid, key="k", **extra):
        self.pub.append(self._ev(op="attempt", id=mid, key=key, **extra))
        return self

    def published(self, mid, p, seq):
        self.pub.append(self._ev(op="published", id=mid, partition=p, seq=seq))
        return self

    def publish(self, mid, p, seq, key="k", **extra):
        return self.attempt(mid, key, **extra).published(mid, p, seq)

    def restart_consumer(self):
        self.cons.append([self._ev(op="bound")])
        return self

    def deliver(self, mid, p, seq, redelivered=False, key="k", pkey=None, **extra):
        self.cons[-1].append(self._ev(op="delivered", id=mid, key=key,
                                      pkey=key if pkey is None else pkey,
                                      partition=p, seq=seq, redelivered=redelivered, **extra))
        return self

    def ack(self, mid):
        self.cons[-1].append(self._ev(op="acked", id=mid))
        return self

    def ack_sent(self, mid):
        self.cons[-1].append(self._ev(op="ack_sent", id=mid))
        return self

    def gave_back(self, mid, p, seqs, flow=None):
        """A nack of ``mid`` returned ``seqs`` (of partition ``p``): the consumer's line."""
        self.cons[-1].append(self._ev(op="gave_back", id=mid, flow=flow, partition=p,
                                      seqs=list(seqs)))
        return self

    def unbound(self, flow=None):
        self.cons[-1].append(self._ev(op="unbound", flow=flow))
        return self

    def scale(self, frm, to, end=True, online=False):
        self.pub.append(self._ev(op="scale_begin", to=to, online=online, **{"from": frm}))
        if end:
            self.pub.append(self._ev(op="scale_end", to=to))
        return self

    def logs(self):
        return [self.pub] + self.cons

    def check(self, **kw):
        return check(self.logs(), **kw)


def clean() -> History:
    h = History()
    for i in range(4):
        h.publish(f"m{i}", 0, i)
    h.publish("x0", 1, 0, key="other")
    for i in range(4):
        h.deliver(f"m{i}", 0, i)
    h.deliver("x0", 1, 0, key="other")
    for i in range(4):
        h.ack(f"m{i}")
    h.ack("x0")
    return h


def only(report, *kinds):
    bad = {k: report[k] for k in VIOLATIONS if report[k]}
    assert set(bad) == set(kinds), report
    assert report["ok"] is (not kinds)


def test_clean_history_passes():
    r = clean().check()
    only(r)
    assert (r["published"], r["delivered"], r["acked"], r["redeliveries"]) == (5, 5, 5, 0)


def test_lost_message():
    h = clean().publish("m4", 0, 4)
    only(h.check(), "lost")
    assert h.check()["lost"] == 1


def test_lost_is_not_counted_without_a_final_drain():
    h = clean().publish("m4", 0, 4)
    only(h.check(final_drain=False))


def test_unknown_outcome_recovered_and_not_found_are_allowed_and_counted():
    h = clean().attempt("u1").attempt("u2")
    h.deliver("u1", 0, 4).ack("u1")
    r = h.check()
    only(r)
    assert (r["unknown"], r["recovered"], r["unknown_not_found"]) == (2, 1, 1)


def test_unexpected_delivery():
    h = clean().deliver("ghost", 0, 9).ack("ghost")
    only(h.check(), "unexpected")


def test_delivered_again_after_ack():
    h = clean().restart_consumer().deliver("m3", 0, 3, redelivered=True)
    r = h.check()
    only(r, "delivered_after_ack")
    assert r["delivered_after_ack"] == 1


def test_duplicate_allowed_only_when_marked_redelivered():
    h = History().publish("a", 0, 0).publish("b", 0, 1)
    h.deliver("a", 0, 0).deliver("b", 0, 1)
    h.restart_consumer().deliver("a", 0, 0, redelivered=True).deliver("b", 0, 1, redelivered=True)
    h.ack("a").ack("b")
    r = h.check()
    only(r)
    assert r["redeliveries"] == 2

    h = History().publish("a", 0, 0)
    h.deliver("a", 0, 0).restart_consumer().deliver("a", 0, 0).ack("a")
    only(h.check(), "unmarked_redeliveries")


def test_marked_first_delivery_is_a_permitted_false_positive():
    h = History().publish("a", 0, 0).deliver("a", 0, 0, redelivered=True).ack("a")
    only(h.check())


def test_first_deliveries_out_of_seq_order():
    h = History().publish("a", 0, 0).publish("b", 0, 1)
    # b before a, both first deliveries: even marked redelivered this breaks rule (a)
    h.deliver("b", 0, 1).deliver("a", 0, 0, redelivered=True).ack("a").ack("b")
    r = h.check()
    only(r, "order_violations", "partition_order_violations")
    assert r["examples"]["order_violations"][0]["why"] == "first delivery out of seq order"


def test_going_back_without_redelivered_flag():
    h = History().publish("a", 0, 0).publish("b", 0, 1)
    h.deliver("a", 0, 0).deliver("b", 0, 1)
    # a again (unacked, so a duplicate) after b without the flag: both rules fire
    h.deliver("a", 0, 0).ack("a").ack("b")
    r = h.check()
    only(r, "unmarked_redeliveries", "order_violations", "partition_order_violations")


def test_order_is_per_key_within_a_partition():
    """Two keys in one partition: per-key order holds, partition order does not."""
    h = History().publish("a", 0, 0, key="k1").publish("b", 0, 1, key="k2")
    h.deliver("b", 0, 1, key="k2").deliver("a", 0, 0, key="k1").ack("a").ack("b")
    only(h.check(), "partition_order_violations")


def test_order_of_unkeyed_messages_counts_per_partition_only():
    h = History().publish("a", 0, 0, key=None).publish("b", 0, 1, key=None)
    h.deliver("b", 0, 1, key=None).deliver("a", 0, 0, key=None).ack("a").ack("b")
    only(h.check(), "partition_order_violations")


def test_redelivered_replay_in_order_is_fine():
    h = History()
    for i in range(3):
        h.publish(f"m{i}", 0, i)
    for i in range(3):
        h.deliver(f"m{i}", 0, i)
    h.ack("m0")
    h.restart_consumer()
    for i in (1, 2):
        h.deliver(f"m{i}", 0, i, redelivered=True)
    h.publish("m3", 0, 3).deliver("m3", 0, 3)
    for i in (1, 2, 3):
        h.ack(f"m{i}")
    only(h.check())


def test_publish_order_linearizability():
    h = History().publish("a", 0, 5).publish("b", 0, 4)   # b attempted after a returned
    h.deliver("b", 0, 4).deliver("a", 0, 5).ack("a").ack("b")
    only(h.check(), "publish_order_violations")


def test_concurrent_publishes_may_take_either_order():
    h = History().attempt("a").attempt("b").published("b", 0, 0).published("a", 0, 1)
    h.deliver("b", 0, 0).deliver("a", 0, 1).ack("a").ack("b")
    only(h.check())


def test_position_mismatch():
    h = clean()
    h.cons[-1] = [e if e.get("id") != "x0" or e["op"] != "delivered" else {**e, "seq": 7}
                  for e in h.cons[-1]]
    only(h.check(), "position_mismatches")


def test_two_ids_at_one_position():
    h = History().attempt("a").attempt("b")
    h.deliver("a", 0, 0).deliver("b", 0, 0).ack("a").ack("b")
    only(h.check(), "position_mismatches")


def test_garbled_payload_and_wrong_key():
    h = clean()
    h.cons[-1].append({"op": "delivered", "id": None, "key": None, "pkey": None,
                       "partition": 0, "seq": 99, "redelivered": False, "t": 999.0})
    only(h.check(), "garbled")
    h = History().publish("a", 0, 0, key="k1").deliver("a", 0, 0, key="k2", pkey="k1").ack("a")
    only(h.check(), "garbled")


def test_ack_of_something_never_delivered():
    only(clean().ack("nobody").check(), "acked_never_delivered")


def test_scale_down_drops_are_excused_only_in_removed_partitions_and_in_time():
    h = History().publish("a", 3, 0).publish("b", 1, 0)
    h.scale(4, 2)
    h.deliver("b", 1, 0).ack("b")
    r = h.check()
    only(r)
    assert r["dropped_by_scale_down"] == 1
    # published after the scale-down ended: a real loss
    h.publish("c", 3, 1)
    only(h.check(), "lost")
    # a scale-up excuses nothing
    h = History().publish("a", 3, 0).scale(4, 6)
    only(h.check(), "lost")
    # a scaler that died: the drop window lasts until the next scaling begins
    h = History().scale(4, 2, end=False).publish("a", 3, 0).scale(2, 4).publish("b", 3, 1)
    r = h.check()
    only(r, "lost")
    assert r["dropped_by_scale_down"] == 1 and r["examples"]["lost"][0]["id"] == "b"


def test_key_order_across_an_online_scaling():
    """Rule `online-scaling`: a key's message from its new partition before its old partition's earlier
    message is acked is a violation when every scaling was online; not checked otherwise."""
    def history(online, ack_old, sent_only=False):
        h = History().publish("a0", 1, 0).scale(4, 6, online=online).publish("a1", 4, 0)
        h.deliver("a0", 1, 0)
        if ack_old:
            (h.ack_sent if sent_only else h.ack)("a0")
        h.deliver("a1", 4, 0).ack("a1")
        if not ack_old:
            h.ack("a0")
        return h
    r = history(online=True, ack_old=False).check()
    only(r, "key_order_violations")
    assert r["examples"]["key_order_violations"][0]["earlier_unacked"] == "a0"
    only(history(online=True, ack_old=True).check())
    only(history(online=True, ack_old=True, sent_only=True).check())    # an async ack, sent
    r = history(online=False, ack_old=False).check()
    only(r)
    assert r["key_order_checked"] is False
    # an owner killed after its ack of a0 committed, before logging it: the next owner never
    # sees a0 again, so a0 was acked before it began
    h = History().publish("a0", 1, 0).scale(4, 6, online=True).publish("a1", 4, 0)
    h.deliver("a0", 1, 0).restart_consumer().deliver("a1", 4, 0).ack("a1")
    only(h.check())
    # ... but within one owner's life a missing ack line is a violation
    h = History().publish("a0", 1, 0).scale(4, 6, online=True).publish("a1", 4, 0)
    h.deliver("a0", 1, 0).deliver("a1", 4, 0).ack("a1").restart_consumer()
    only(h.check(), "key_order_violations")
    # a publish attempted before the earlier one returned owes it nothing
    h = History().attempt("a0").attempt("a1").published("a0", 1, 0).published("a1", 4, 0)
    h.scale(4, 6, online=True).deliver("a1", 4, 0).deliver("a0", 1, 0).ack("a0").ack("a1")
    only(h.check())
    # the earlier message sat in a partition an online scale-down deleted: nothing is owed
    h = History().publish("a0", 5, 0).scale(6, 4, online=True).publish("a1", 1, 0)
    h.deliver("a1", 1, 0).ack("a1")
    r = h.check()
    only(r)
    assert r["dropped_by_scale_down"] == 1


# ------------------------------------------------------------------ key rounds
KEY = {"ordering": "key"}


def test_key_round_keys_overtake_each_other_inside_a_partition():
    """Under ordering="key" another key (or an unkeyed message) may go past a held one, and a
    nack gives back only its key: no partition order is checked, nothing is flagged."""
    h = History().publish("a0", 0, 0, key="k1").publish("x", 0, 1, key="k2")
    h.publish("u", 0, 2, key=None).publish("a1", 0, 3, key="k1")
    h.deliver("x", 0, 1, key="k2").deliver("u", 0, 2, key=None)    # a0 held back meanwhile
    h.deliver("a0", 0, 0, key="k1").deliver("a1", 0, 3, key="k1")
    h.gave_back("a0", 0, [0, 3])                                     # x stays with the flow
    h.deliver("a0", 0, 0, redelivered=True, key="k1").deliver("a1", 0, 3, redelivered=True,
                                                               key="k1")
    for m in ("a0", "a1", "x", "u"):
        h.ack(m)
    r = h.check(**KEY)
    only(r)
    assert r["key_order_checked"] is True and r["partition_order_checked"] is False
    assert r["ordering"] == "key" and r["redeliveries"] == 2
    # the same logs under ordering="partition" break the partition's order
    only(h.check(), "partition_order_violations")


def test_key_round_a_key_out_of_order_is_a_violation():
    """A message of key k delivered while an earlier one of k in its partition is neither acked
    nor held by the flow it goes to: after a nack gave it back, to another flow, after its flow
    was unbound, never delivered at all."""
    def history(case, violation):
        h = History().publish("a0", 0, 0).publish("a1", 0, 1)
        h.deliver("a0", 0, 0, flow="c0")
        if case == "nack":
            h.gave_back("a0", 0, [0], flow="c0")
            if not violation:
                h.deliver("a0", 0, 0, redelivered=True, flow="c0")
            h.deliver("a1", 0, 1, flow="c0")
            if violation:
                h.deliver("a0", 0, 0, redelivered=True, flow="c0")
        elif case == "other flow":
            if not violation:
                h.ack("a0")
            h.deliver("a1", 0, 1, flow="c1")
        elif case == "unbound":
            h.unbound("c0")
            if not violation:
                h.deliver("a0", 0, 0, redelivered=True, flow="c1")
            h.deliver("a1", 0, 1, flow="c1")
            if violation:
                h.deliver("a0", 0, 0, redelivered=True, flow="c1")
        return h.ack("a1").ack("a0")

    for case in ("nack", "other flow", "unbound"):
        r = history(case, violation=True).check(**KEY)
        only(r, "key_order_violations")
        assert r["key_order_violations"] == 1, case
        assert r["examples"]["key_order_violations"][0]["earlier_unacked"] == "a0", case
        only(history(case, violation=False).check(**KEY))
        # not checked under ordering="partition" (its rules see nothing wrong in these logs)
        only(history(case, violation=True).check())
    # the earlier message not delivered yet: its key's first deliveries out of order too
    h = History().publish("a0", 0, 0).publish("a1", 0, 1)
    h.deliver("a1", 0, 1).deliver("a0", 0, 0).ack("a0").ack("a1")
    only(h.check(**KEY), "key_order_violations", "order_violations")


def test_key_round_what_is_owed_and_what_is_not():
    # held by the flow: several unacked messages of one key, acked in any order
    h = History().publish("a0", 0, 0).publish("a1", 0, 1).publish("a2", 0, 2)
    h.deliver("a0", 0, 0).deliver("a1", 0, 1).ack("a1").deliver("a2", 0, 2).ack("a2").ack("a0")
    only(h.check(**KEY))
    # a killed owner acked a0 and did not log it: the next owner owes it nothing
    h = History().publish("a0", 0, 0).publish("a1", 0, 1)
    h.deliver("a0", 0, 0).restart_consumer().deliver("a1", 0, 1).ack("a1")
    only(h.check(**KEY))
    # ... but the next owner gets a0 again after a1: it was not acked, and a1 overtook it
    h = History().publish("a0", 0, 0).publish("a1", 0, 1)
    h.deliver("a0", 0, 0).restart_consumer().deliver("a1", 0, 1)
    h.deliver("a0", 0, 0, redelivered=True).ack("a1").ack("a0")
    only(h.check(**KEY), "key_order_violations")
    # a publish attempted before the earlier one returned owes it nothing (seq order is checked
    # by order_violations)
    h = History().attempt("a0").attempt("a1").published("a0", 0, 0).published("a1", 0, 1)
    h.deliver("a0", 0, 0, flow="c0").deliver("a1", 0, 1, flow="c1").ack("a0").ack("a1")
    only(h.check(**KEY))
    # after an offline scaling, a key's messages in other partitions are owed nothing, but
    # within a partition the key's order still holds
    h = History().publish("a0", 1, 0).scale(4, 6).publish("a1", 4, 0)
    h.deliver("a1", 4, 0).deliver("a0", 1, 0).ack("a0").ack("a1")
    r = h.check(**KEY)
    only(r)
    assert r["key_order_checked"] is True
    h = History().publish("a0", 1, 0).scale(4, 6).publish("a1", 1, 1)
    h.deliver("a0", 1, 0, flow="c0").deliver("a1", 1, 1, flow="c1").ack("a0").ack("a1")
    only(h.check(**KEY), "key_order_violations")
    # an online scaling: another partition's earlier message must be acked, held or not
    h = History().publish("a0", 1, 0).scale(4, 6, online=True).publish("a1", 4, 0)
    h.deliver("a0", 1, 0).deliver("a1", 4, 0).ack("a1").ack("a0")
    only(h.check(**KEY), "key_order_violations")


def test_key_round_other_checks_still_run():
    h = History().publish("a", 0, 0, key=None).deliver("a", 0, 0, key=None)
    h.restart_consumer().deliver("a", 0, 0, key=None).ack("a")
    only(h.check(**KEY), "unmarked_redeliveries")
    only(clean().publish("m4", 0, 4).check(**KEY), "lost")
    h = clean().restart_consumer().deliver("m3", 0, 3, redelivered=True)
    only(h.check(**KEY), "delivered_after_ack")
    with pytest.raises(ValueError, match="ordering"):
        clean().check(ordering="keys")


def test_logs_on_disk_torn_tail_and_ownership_order(tmp_path):
    h = History().publish("a", 0, 0).publish("b", 0, 1)
    h.restart_consumer().deliver("a", 0, 0).deliver("b", 0, 1)
    h.restart_consumer().deliver("a", 0, 0, redelivered=True).ack("a").deliver("b", 0, 1,
                                                                           redelivered=True).ack("b")
    files = {"pub-0.jsonl": h.pub, "con-2.jsonl": h.cons[1], "con-1.jsonl": h.cons[2]}
    for name, events in files.items():   # file names deliberately in the wrong order
        with open(tmp_path / name, "w") as f:
            f.writelines(json.dumps(e) + "\n" for e in events)
    with open(tmp_path / "con-2.jsonl", "a") as f:
        f.write('{"op":"delivered","id":"a","par')         # killed inside write()
    only(check(load_dir(tmp_path)))
    # the same logs in the wrong ownership order: the old consumer's deliveries come after
    # the acks, and the checker sees it
    wrong = [read_log(tmp_path / n) for n in ("pub-0.jsonl", "con-1.jsonl", "con-2.jsonl")]
    assert not check(wrong)["ok"]


def test_a_bad_line_in_the_middle_is_a_harness_error(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"op":"bound","t":1}\nnot json\n{"op":"bound","t":2}\n')
    with pytest.raises(ValueError, match="line 2"):
        read_log(path)


def test_wlog_round_trip(tmp_path):
    from wlog import Log, make_payload
    log = Log(os.fspath(tmp_path / "w.jsonl"))
    log.write({"op": "attempt", "id": "a", "key": None}, {"op": "published", "id": "a",
                                                          "partition": 0, "seq": 0})
    log.close()
    events = read_log(tmp_path / "w.jsonl")
    assert [e["op"] for e in events] == ["attempt", "published"] and all("t" in e for e in events)
    assert json.loads(make_payload("a", "k", 3)) == {"id": "a", "key": "k", "pad": "xxx"}


# ------------------------------------------------------------------ concurrent consumers
class Timed(History):
    """Consumer events with intervals: ``t0`` before the call, ``t`` after it returned."""

    def deliver_at(self, log, mid, p, seq, t0, t, redelivered=False, key="k"):
        while len(self.cons) <= log:
            self.cons.append([])
        self.cons[log].append({"op": "delivered", "id": mid, "key": key, "pkey": key,
                               "partition": p, "seq": seq, "redelivered": redelivered,
                               "t0": t0, "t": t})
        return self

    def ack_at(self, log, mid, t0, t):
        self.cons[log].append({"op": "acked", "id": mid, "t0": t0, "t": t})
        return self


def timed() -> Timed:
    h = Timed()
    h.t = 0.0
    h.publish("a", 0, 0).publish("b", 1, 0, key="j")   # t 1..4
    return h


def test_concurrent_clean_history_passes():
    h = timed().deliver_at(0, "a", 0, 0, 10, 11).deliver_at(1, "b", 1, 0, 10.5, 11.5, key="j")
    h.ack_at(0, "a", 12, 13).ack_at(1, "b", 12, 13)
    r = h.check(concurrent=True)
    only(r)
    assert r["concurrent"] is True and r["delivered"] == 2


def test_concurrent_redelivery_must_be_marked_only_when_surely_later():
    # overlapping intervals: either may have come first, nothing to say
    h = timed().deliver_at(0, "a", 0, 0, 10, 12).deliver_at(1, "a", 0, 0, 11, 13)
    h.ack_at(1, "a", 14, 15).deliver_at(1, "b", 1, 0, 16, 17, key="j").ack_at(1, "b", 18, 19)
    only(h.check(concurrent=True))
    # the second began after the first returned, unmarked: a violation
    h = timed().deliver_at(0, "a", 0, 0, 10, 11).deliver_at(1, "a", 0, 0, 12, 13)
    h.ack_at(1, "a", 14, 15).deliver_at(1, "b", 1, 0, 16, 17, key="j").ack_at(1, "b", 18, 19)
    only(h.check(concurrent=True), "unmarked_redeliveries")


def test_concurrent_delivery_after_an_ack_returned():
    h = timed().deliver_at(0, "a", 0, 0, 10, 11).ack_at(0, "a", 12, 13)
    h.deliver_at(1, "a", 0, 0, 14, 15, redelivered=True)
    h.deliver_at(1, "b", 1, 0, 16, 17, key="j").ack_at(1, "b", 18, 19)
    only(h.check(concurrent=True), "delivered_after_ack")
    # begun before the ack returned: it may have been read before the commit
    h = timed().deliver_at(0, "a", 0, 0, 10, 11).ack_at(0, "a", 12, 14)
    h.deliver_at(1, "a", 0, 0, 13, 15, redelivered=True)
    h.deliver_at(1, "b", 1, 0, 16, 17, key="j").ack_at(1, "b", 18, 19)
    only(h.check(concurrent=True))


def test_concurrent_order_within_one_process_life():
    h = timed().publish("a1", 0, 1)
    h.deliver_at(0, "a1", 0, 1, 10, 11).deliver_at(0, "a", 0, 0, 12, 13)
    h.ack_at(0, "a", 14, 15).ack_at(0, "a1", 14, 15)
    h.deliver_at(0, "b", 1, 0, 16, 17, key="j").ack_at(0, "b", 18, 19)
    r = h.check(concurrent=True)
    assert r["order_violations"] and r["partition_order_violations"], r
    # the same two deliveries in two processes: no order between lives is claimed
    h = timed().publish("a1", 0, 1)
    h.deliver_at(0, "a1", 0, 1, 10, 11).deliver_at(1, "a", 0, 0, 12, 13)
    h.ack_at(1, "a", 14, 15).ack_at(0, "a1", 14, 15)
    h.deliver_at(1, "b", 1, 0, 16, 17, key="j").ack_at(1, "b", 18, 19)
    only(h.check(concurrent=True))


def test_concurrent_key_order_across_an_online_scaling():
    h = Timed()
    h.t = 0.0
    h.publish("a0", 1, 0).scale(4, 6, online=True).publish("a1", 4, 0)
    h.deliver_at(0, "a0", 1, 0, 10, 11).deliver_at(1, "a1", 4, 0, 12, 13)
    h.ack_at(0, "a0", 14, 15).ack_at(1, "a1", 16, 17)
    only(h.check(concurrent=True), "key_order_violations")
    h = Timed()
    h.t = 0.0
    h.publish("a0", 1, 0).scale(4, 6, online=True).publish("a1", 4, 0)
    h.deliver_at(0, "a0", 1, 0, 10, 11).ack_at(0, "a0", 12, 13)
    h.deliver_at(1, "a1", 4, 0, 12.5, 14).ack_at(1, "a1", 16, 17)   # overlaps the ack: fine
    only(h.check(concurrent=True))


def test_concurrent_order_is_checked_per_consumer_process():
    """Concurrent consumers: each process's first deliveries keep sequence order; two
    processes delivering the same partition interleaved (a move) is not a violation."""
    h = History().publish("a", 0, 0).publish("b", 0, 1).publish("c", 0, 2)
    h.deliver("a", 0, 0).deliver("c", 0, 2).deliver("b", 0, 1)
    for m in "abc":
        h.ack(m)
    r = h.check(concurrent=True)
    only(r, "order_violations", "partition_order_violations")
    assert r["examples"]["order_violations"][0]["why"] == \
        "first delivery in this process out of seq order"
    h = History().publish("a", 0, 0).publish("b", 0, 1)
    h.deliver("a", 0, 0).deliver("b", 0, 1)
    h.restart_consumer().deliver("a", 0, 0, redelivered=True).ack("a").ack("b")
    only(h.check(concurrent=True))



def test_concurrent_key_round():
    """Concurrent consumer processes in a key round: a delivery of a1 that returned before any
    ack of a0 began, to a flow that did not hold a0, is a violation; keys overtaking each other
    in a partition are not."""
    def history():
        h = Timed()
        h.t = 0.0
        return h.publish("a0", 0, 0).publish("a1", 0, 1).publish("x", 0, 2, key="j")
    h = history().deliver_at(1, "x", 0, 2, 10, 11, key="j").deliver_at(0, "a0", 0, 0, 10, 11)
    h.deliver_at(1, "a1", 0, 1, 12, 13).ack_at(0, "a0", 14, 15).ack_at(1, "a1", 16, 17)
    h.ack_at(1, "x", 16, 17)
    r = h.check(concurrent=True, **KEY)
    only(r, "key_order_violations")
    assert r["key_order_violations"] == 1
    # a0's ack began before a1's delivery returned: it may have committed first
    h = history().deliver_at(1, "x", 0, 2, 10, 11, key="j").deliver_at(0, "a0", 0, 0, 10, 11)
    h.ack_at(0, "a0", 12, 14).deliver_at(1, "a1", 0, 1, 12.5, 13).ack_at(1, "a1", 16, 17)
    h.ack_at(1, "x", 16, 17)
    only(h.check(concurrent=True, **KEY))
    # one process holds both: fine, and x (another key) went first
    h = history().deliver_at(0, "x", 0, 2, 8, 9, key="j").deliver_at(0, "a0", 0, 0, 10, 11)
    h.deliver_at(0, "a1", 0, 1, 12, 13).ack_at(0, "a1", 14, 15).ack_at(0, "a0", 16, 17)
    h.ack_at(0, "x", 16, 17)
    r = h.check(concurrent=True, **KEY)
    only(r)
    assert r["partition_order_checked"] is False
    only(h.check(concurrent=True), "partition_order_violations")
