"""The log lines an operator follows (issue 20), checked with caplog: one line per rebalance
decision naming what moves and why, handoff start and end (acked, timed out, source left),
holddowns, binds and unbinds, scaling steps, the report of an open, and replication links and
lag alarms."""
from __future__ import annotations

import logging

from helpers import wait_until

import partq
from partq.replication import link_watch


def lines(caplog, logger: str = "partq") -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith(logger)]


def one(caplog, *fragments: str) -> str:
    found = [m for m in lines(caplog) if all(f in m for f in fragments)]
    assert len(found) == 1, (fragments, lines(caplog))
    return found[0]


def test_rebalance_decisions_and_handoffs_are_logged(data_dir, clock, caplog):
    caplog.set_level(logging.INFO, logger="partq")
    with partq.Broker.open(data_dir, clock=clock) as broker:
        broker.create_queue("orders", partitions=4, rebalance_delay=5.0, max_handoff_time=3.0)
        results = broker.publish_many("orders", [(b"m", f"k{i}") for i in range(40)])
        in_2 = sum(1 for r in results if r.partition == 2)
        a = broker.bind("orders", name="a")
        held = a.receive(100, timeout=0)
        one(caplog, "queue 'orders': rebalance after flow a bound", "0 -> a", "3 -> a")
        one(caplog, "flow a bound to queue 'orders': partitions [0, 1, 2, 3]")

        broker.bind("orders", name="c")
        one(caplog, "queue 'orders': flow c bound: holding down for 5 s")
        clock.advance(5.0)
        broker.tick()
        one(caplog, "rebalance after the rebalance delay of 5 s ended", "2 a -> c (handoff)",
            "3 a -> c (handoff)")
        one(caplog, "handoff of partition 2 from a to c started", f"{in_2} unacked")

        a.ack_many([m for m in held if m.partition != 2])
        one(caplog, "handoff of partition 3 from a to c ended", "acked")
        clock.advance(3.0)
        broker.tick()
        timed_out = one(caplog, "handoff of partition 2 from a to c ended after 3.000 s",
                        "timed out", f"{in_2} unacked message(s) redelivered to c")
        assert [r.levelname for r in caplog.records if r.getMessage() == timed_out] == ["WARNING"]
        one(caplog, "queue 'orders': balanced: a holds 2, c holds 2")

        a.unbind()       # c is alone: a holddown, then a's partitions move without a handoff
        one(caplog, "flow a unbound from queue 'orders'")
        one(caplog, "queue 'orders': flow a left: holding down")
        clock.advance(5.0)
        broker.tick()
        one(caplog, "rebalance after the rebalance delay of 5 s ended", "0 a -> c", "1 a -> c")


def test_a_consumer_that_comes_back_keeps_its_partitions_and_nothing_moves(data_dir, clock,
                                                                            caplog):
    caplog.set_level(logging.INFO, logger="partq")
    with partq.Broker.open(data_dir, clock=clock) as broker:
        broker.create_queue("q", partitions=2, rebalance_delay=5.0)
        broker.bind("q", name="a")
        b = broker.bind("q", name="b")
        clock.advance(5.0)
        broker.tick()
        b.unbind()
        caplog.clear()
        broker.bind("q", name="b")                   # within the delay (rule `named-flows`)
        one(caplog, "flow b came back within the rebalance delay and keeps partition(s) 1")
        clock.advance(5.0)
        broker.tick()
        assert not [m for m in lines(caplog) if "rebalance after" in m]


def test_a_handoff_whose_source_leaves_is_logged(data_dir, clock, caplog):
    caplog.set_level(logging.INFO, logger="partq")
    with partq.Broker.open(data_dir, clock=clock) as broker:
        broker.create_queue("q", partitions=2, rebalance_delay=1.0, max_handoff_time=30.0)
        broker.publish_many("q", [(b"m", "k1"), (b"m", "k2"), (b"m", "k3"), (b"m", "k4")])
        a = broker.bind("q", name="a")
        assert a.receive(10, timeout=0)
        broker.bind("q", name="b")
        broker.bind("q", name="spare")
        clock.advance(1.0)
        broker.tick()
        # a standby exists: its partitions move at once (rule `rebalance-triggers`)
        a.unbind()
        one(caplog, "handoff of partition 1 from a to b ended", "its source left",
            "redelivered to b")


def test_scaling_steps_and_the_open_report_are_logged(data_dir, clock, caplog):
    caplog.set_level(logging.INFO, logger="partq")
    with partq.Broker.open(data_dir, clock=clock) as broker:
        broker.create_queue("q", partitions=2)
        broker.publish_many("q", [(b"m", f"k{i}") for i in range(10)])
        flow = broker.bind("q")
        assert len(flow.receive(3, timeout=0)) == 3
        broker.scale("q", 3)
    one(caplog, "queue 'q' scaling: ScalingUp 2 -> 3")
    one(caplog, "queue 'q' scaling: created partition 2")
    one(caplog, "queue 'q' scaling: Ready with 3 partitions")
    assert "created a new partq store in" in lines(caplog)[0]
    caplog.clear()
    with partq.Broker.open(data_dir, clock=clock):
        pass
    report = one(caplog, "opened", "1 queue(s), 10 message(s) unacked")
    # the delivered mark runs ahead of real deliveries: an upper bound, at least what went out
    assert int(report.split("up to ")[1].split()[0]) >= 3


def test_replication_links_and_lag_alarms_are_logged(tmp_path, caplog, monkeypatch):
    """Each step waits for what the next one needs, not for time: the standby must have
    confirmed the primary's head before it goes (a standby closed while it still loads its
    snapshot has confirmed nothing, and a lag of nothing confirmed is not measured: under
    load no alarm came), and the primary must have seen it go before the publish whose lag
    raises the alarm (or the alarm may come first and say the link is up)."""
    monkeypatch.setattr(link_watch, "WATCH_INTERVAL", 0.02)
    monkeypatch.setattr(link_watch, "LAG_ALARM_SECONDS", 0.05)
    caplog.set_level(logging.INFO, logger="partq")

    def confirmed_head() -> bool:
        st = primary.replication_status()
        return bool(st.standbys) and 0 <= st.standbys[0].acked_lsn == st.head_lsn

    with partq.Broker.open(tmp_path / "primary", replication_listen="127.0.0.1:0") as primary:
        primary.create_queue("q", partitions=1)
        standby = partq.Broker.open(tmp_path / "standby", standby_of=primary.replication_address)
        try:
            wait_until(lambda: [m for m in lines(caplog, "partq.replication")
                                if "replication link to standby" in m and "is up" in m],
                       30, "the primary's line for the standby's link")
            wait_until(lambda: [m for m in lines(caplog, "partq.replication")
                                if f"replication link to primary {primary.replication_address} "
                                   f"is up" in m], 30, "the standby's line for its link")
            wait_until(confirmed_head, 30, "the standby to confirm the primary's head")
        finally:
            standby.close()
        wait_until(lambda: [m for m in lines(caplog, "partq.replication")
                            if "replication link to standby" in m and "is down" in m],
                   30, "the link's down line")
        primary.publish("q", b"not on the standby")     # nobody confirms it: the lag grows
        alarm = wait_until(lambda: [r for r in caplog.records
                                    if "replication lag alarm: standby" in r.getMessage()
                                    and "not connected" in r.getMessage()],
                           30, "a lag alarm")
        assert alarm[0].levelname == "WARNING"
        with partq.Broker.open(tmp_path / "standby", standby_of=primary.replication_address):
            wait_until(lambda: [m for m in lines(caplog, "partq.replication")
                                if "replication lag of standby" in m and "is back to" in m],
                       30, "the end of the alarm")
