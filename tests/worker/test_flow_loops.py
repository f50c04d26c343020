"""The synchronous Flow's loops: ``for msg in flow`` (as on the async one), and ``Flow.run``,
which goes on after a failing handler (the message nacked) instead of raising."""
from __future__ import annotations

import threading

import partq


def test_for_msg_in_flow_receives_until_the_flow_is_unbound(tmp_path):
    with partq.Broker.open(tmp_path) as b:
        b.create_queue("q", partitions=1)
        b.publish_many("q", [(b"%d" % i, None) for i in range(5)])
        flow = b.bind("q")
        got = []
        for msg in flow:
            got.append(msg.payload)
            flow.ack(msg)
            if len(got) == 5:
                flow.unbind()
        assert got == [b"0", b"1", b"2", b"3", b"4"]


def test_a_nack_in_the_loop_skips_the_copies_it_gave_back_and_they_come_again_in_order(tmp_path):
    with partq.Broker.open(tmp_path) as b:
        b.create_queue("q", partitions=1, redelivery_delay=0)
        b.publish_many("q", [(b"%d" % i, None) for i in range(3)])
        flow = b.bind("q")
        seen, failed = [], False
        for msg in flow:
            seen.append((msg.payload, msg.redelivered))
            if msg.payload == b"0" and not failed:
                failed = True
                flow.nack(msg)              # gives back 0, 1 and 2
                continue
            flow.ack(msg)
            if msg.payload == b"2":
                break
        assert seen == [(b"0", False), (b"0", True), (b"1", True), (b"2", True)]


def test_run_goes_on_after_a_failing_handler(tmp_path):
    with partq.Broker.open(tmp_path) as b:
        b.create_queue("q", partitions=1, redelivery_delay=0)
        b.publish_many("q", [(b"ok", None), (b"bad", None), (b"ok2", None)])
        flow, stop, calls = b.bind("q"), threading.Event(), []

        def handler(msg):
            calls.append(msg.payload)
            if msg.payload == b"bad" and calls.count(b"bad") == 1:
                raise ValueError("first time")
            if msg.payload == b"ok2":
                stop.set()
        flow.run(handler, stop=stop)
        assert calls == [b"ok", b"bad", b"bad", b"ok2"]
        assert b.queue_status("q").depth == 0
