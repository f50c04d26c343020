"""Arguments without a bound, or of a type the library did not expect, get a typed error that
says what fits (they raised ``struct.error``, ``OverflowError`` or ``UnicodeEncodeError``, or
ran until memory ran out); a receive timeout too long to wait is waited for ever, in practice
(ten years). The flows are local ones and ones of ``partq.connect`` over a real socket."""
from __future__ import annotations

import math
import threading

import pytest
from helpers import run_child

import partq
from partq.remote.server import Server


@pytest.fixture
def broker(tmp_path):
    with partq.Broker.open(tmp_path / "data") as b:
        b.create_queue("q", partitions=1)
        yield b


@pytest.fixture(params=["local", "remote"])
def bind(request, broker):
    """``bind()``: a flow of queue q, bound in this process or through ``partq serve``."""
    if request.param == "local":
        yield lambda: broker.bind("q")
        return
    server = Server(broker, "127.0.0.1:0")
    try:
        with partq.connect(server.address) as client:
            yield lambda: client.bind("q")
    finally:
        server.close()


@pytest.mark.parametrize("timeout", [1e300, math.inf])
def test_a_receive_timeout_too_long_to_wait_waits_until_a_message_comes(broker, bind, timeout):
    flow = bind()
    got: list = []
    receiver = threading.Thread(target=lambda: got.append(flow.receive(1, timeout=timeout)))
    receiver.start()
    broker.publish("q", b"late")
    receiver.join(60)
    assert not receiver.is_alive(), "the receive did not return the message published"
    assert [m.payload for m in got[0]] == [b"late"]
    for bad in (math.nan, -1):         # no number of seconds: refused
        with pytest.raises(partq.InvalidConfig, match="timeout must be a number of seconds >= 0"):
            flow.receive(1, timeout=bad)


@pytest.mark.parametrize("partition, seq", [(1 << 40, 0), (0, 1 << 64)])
def test_ack_through_past_what_storage_holds_is_refused(bind, partition, seq):
    flow = bind()
    with pytest.raises(partq.InvalidAck, match="an integer from 0 to"):
        flow.ack_through(partition, seq).result(30)


@pytest.mark.parametrize("verb", ["kill_message", "ack_message"])
@pytest.mark.parametrize("partition, seq", [(1 << 40, 0), (0, 1 << 64)])
def test_a_position_past_what_storage_holds_is_refused(broker, verb, partition, seq):
    broker.publish("q", b"m")
    with pytest.raises(partq.InvalidConfig, match="must be an integer from 0 to"):
        getattr(broker, verb)("q", partition, seq)
    assert broker.queue_status("q").depth == 1


def test_a_checkpoint_name_without_a_utf8_form_is_refused(broker):
    """A lone surrogate (what ``os.fsdecode`` makes of a byte that is not UTF-8) cannot be
    stored as a name."""
    with pytest.raises(partq.InvalidConfig, match="bytes of UTF-8"):
        broker.publish_many("q", [b"m"], checkpoint=("\udcff", 1))
    with pytest.raises(partq.InvalidConfig, match="bytes of UTF-8"):
        broker.checkpoint("q", "\udcff")
    assert broker.queue_status("q").depth == 0
    broker.publish_many("q", [b"m"], checkpoint=("caf\u00e9", 1))
    assert broker.checkpoint("q", "caf\u00e9") == 1


def test_a_rebalance_plan_for_millions_of_consumers_is_refused(tmp_path):
    """It once worked the rebalancer out for each of them: it ran for hours and took
    gigabytes. A child process, so that the test ends either way."""
    done = run_child("""
        import sys, partq
        with partq.Broker.open(sys.argv[1]) as broker:
            broker.create_queue("q", partitions=4)
            for kw in ({"consumers": 10**7}, {"add": [f"c{i}" for i in range(20_000)]}):
                try:
                    broker.rebalance_plan("q", **kw)
                except partq.InvalidConfig as exc:
                    print(exc)
            print(len(broker.rebalance_plan("q", consumers=6)["after"]))
    """, tmp_path / "data", timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "the consumer count must be an integer from 0 to 10000, not 10000000" in lines[0]
    assert "a plan is for at most 10000 consumers and 0 are bound" in lines[1]
    assert lines[2] == "6"


@pytest.mark.parametrize("timeout", [math.nan, -1, 0, math.inf, 1e300])
def test_a_client_timeout_that_is_no_number_of_seconds_is_refused(broker, timeout):
    """It raised ValueError or OverflowError from the socket (NaN, 1e300)."""
    server = Server(broker, "127.0.0.1:0")
    try:
        with pytest.raises(partq.InvalidConfig, match="timeout must be a number of seconds"):
            partq.connect(server.address, timeout=timeout)
        with partq.connect(server.address, timeout=30) as client:
            assert client.queue_status("q").depth == 0
    finally:
        server.close()
