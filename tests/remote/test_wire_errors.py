"""Errors that cross a socket arrive as themselves: every class of ``partq.errors`` survives
``to_frame`` -> msgpack -> ``error_from_frame`` with its fields; a corrupt record read by a flow
of ``partq.connect`` raises ``CorruptRecord`` in the client (queue, partition, seq) and the
connection goes on; a frame the client cannot read costs that connection only (it reconnects)."""
from __future__ import annotations

import importlib
import logging
import pkgutil
import socket
import threading

import click
import msgpack
import pytest
from helpers import drain, wait_until

import partq
from partq import errors
from partq.message import Message
from partq.remote.server import Server
from partq.wire.error_frames import error_from_frame
from partq.wire.frames import read_frame, send_frame
from partq.wire.handshake import server_handshake

TOKEN = "a-test-token-of-32-bytes-or-so!!"

# the classes whose constructor takes fields: a sample of each, and the fields to compare
SAMPLES = {
    "CorruptRecord": (lambda: errors.CorruptRecord("q", 1, 2, "crc32c mismatch"),
                      lambda e: (e.queue, e.partition, e.seq, e.reason)),
    "FlowFenced": (lambda: errors.FlowFenced("fenced", [Message("q", 1, 7, "k", b"p", None, 5, False),
                                                        Message("q", 2, 0, None, b"", None, 6, True)]),
                   lambda e: [(m.queue, m.partition, m.seq) for m in e.messages]),
    "ScalingStepFailed": (lambda: errors.ScalingStepFailed(3, "step 3 timed out; run it again"),
                          lambda e: e.step),
    "LockHeld": (lambda: errors.LockHeld("pid 7 on h since 2024-01-01T00:00:00Z"),
                 lambda e: e.holder),
    "QueueFull": (lambda: errors.QueueFull("orders", "max_bytes", 1 << 40, (1 << 40) - 3),
                  lambda e: (e.queue, e.limit, e.limit_value, e.now)),
}
ERROR_NAMES = sorted(n for n in errors.__all__ if isinstance(getattr(errors, n), type))


def through_the_wire(exc: errors.PartqError, **frame) -> errors.PartqError:
    wire = msgpack.packb({"op": "error", "req": 7, **exc.to_frame(), **frame}, use_bin_type=True)
    return error_from_frame(msgpack.unpackb(wire, raw=False))


@pytest.mark.parametrize("name", ERROR_NAMES)
def test_every_error_crosses_the_wire_as_itself(name):
    cls = getattr(errors, name)
    assert issubclass(cls, errors.PartqError)
    if name in SAMPLES:
        make, fields = SAMPLES[name]
        exc = make()
    else:      # a class with fields of its own must have a sample above
        assert cls.to_frame is errors.PartqError.to_frame, f"{name} has fields: add a sample"
        exc, fields = cls(f"a {name} happened; do this"), vars
    back = through_the_wire(exc, flow="f1")
    assert type(back) is cls
    assert str(back) == str(exc) and back.args == exc.args
    assert fields(back) == fields(exc)
    assert back.to_frame() == exc.to_frame()


def test_an_unknown_type_or_a_malformed_frame_gives_a_partq_error():
    unknown = error_from_frame({"op": "error", "error": "ErrorOfANewerPartq", "message": "m"})
    assert type(unknown) is errors.PartqError and "ErrorOfANewerPartq" in str(unknown)
    not_an_error = error_from_frame({"op": "error", "error": "Message", "message": "m"})
    assert type(not_an_error) is errors.PartqError          # partq.errors holds no such class
    bad = [None, 7, b"bytes", ["error"], {}, {"error": 5, "message": ["x"]},
           {"error": "CorruptRecord", "message": "m"},                      # fields missing
           {"error": "CorruptRecord", "message": "m", "queue": "q", "partition": "1", "seq": 2,
            "reason": "r"},                                                  # mistyped
           {"error": "CorruptRecord", "message": "m", "queue": "q", "partition": True, "seq": 2,
            "reason": "r"},
           {"error": "FlowFenced", "message": "m", "messages": [[1, 2]]},
           {"error": "FlowFenced", "message": "m", "messages": [["q", "1", 2]]},
           {"error": "FlowFenced", "message": "m", "messages": 3},
           {"error": "ScalingStepFailed", "message": "m", "step": None},
           {"error": "LockHeld", "message": "m"},
           {"error": "QueueFull", "message": "m", "queue": "q", "limit": "max_depth"},
           {"error": "QueueFull", "message": "m", "queue": "q", "limit": "max_depth",
            "limit_value": "10", "now": 10}]
    for frame in bad:
        got = error_from_frame(frame)
        assert type(got) is errors.PartqError, frame
        assert str(got)
    assert str(error_from_frame({"error": "LockHeld", "message": "held by x"})) == \
        "LockHeld: held by x"


def test_queue_full_crosses_the_wire_with_its_fields_and_words():
    exc = errors.QueueFull("orders", "max_depth", 1000, 1000)
    assert str(exc) == ("queue 'orders' is full: max_depth=1000 reached (1000 messages published "
                        "and not acked); ack messages, or raise the quota with `partq queue "
                        "update orders --max-depth N`")
    back = through_the_wire(exc, req=3)
    assert type(back) is partq.QueueFull and back.args == exc.args
    assert (back.queue, back.limit, back.limit_value, back.now) == ("orders", "max_depth", 1000, 1000)
    full = errors.QueueFull("q", "max_bytes", 4096, 4000)
    assert "max_bytes=4096" in str(full) and "4000 bytes" in str(full) and "--max-bytes N" in str(full)
    assert through_the_wire(full).to_frame() == full.to_frame()


def test_every_error_class_lives_in_partq_errors():
    import partq.spark
    import partq.storage
    import partq.tools
    for package in (partq, partq.storage, partq.tools, partq.spark):
        for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if not module.name.endswith("__main__"):
                importlib.import_module(module.name)
    seen, todo = set(), [Exception]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in seen:
                seen.add(sub)
                todo.append(sub)
    # the command line's UserError is click's way to print one line, not an error of the library
    ours = [c for c in seen if c.__module__.startswith("partq") and not c.__name__.startswith("_")
            and not issubclass(c, click.ClickException)]
    assert len(ours) >= len(ERROR_NAMES)
    for cls in ours:
        assert getattr(errors, cls.__name__, None) is cls, \
            f"{cls.__module__}.{cls.__name__} is not in partq.errors"
        assert issubclass(cls, errors.PartqError) and getattr(partq, cls.__name__) is cls
    assert len(partq.__all__) == len(set(partq.__all__))


# ----------------------------------------------------------------------- through partq serve
def keys_by_partition(n: int) -> dict[int, str]:
    found: dict[int, str] = {}
    i = 0
    while len(found) < n:
        found.setdefault(partq.key_partition(f"key{i}", n), f"key{i}")
        i += 1
    return found


@pytest.fixture
def corrupted(tmp_path):
    """A queue of 3 partitions, 5 messages each, with one byte of partition 1 seq 2 flipped
    (in every copy LMDB keeps of its page), served by ``partq serve`` on 127.0.0.1."""
    data = tmp_path / "data"
    keys = keys_by_partition(3)
    with partq.Broker.open(data) as b:
        b.create_queue("q", partitions=3, rebalance_delay=0.0)
        for p, key in keys.items():
            for j in range(5):
                b.publish("q", b"UNIQUE-%d-%d-PAYLOAD" % (p, j), key=key)
    needle = b"UNIQUE-1-2-PAYLOAD"
    with open(data / "data.mdb", "r+b") as f:
        raw = bytearray(f.read())
        at = raw.find(needle)
        assert at >= 0
        while at >= 0:
            raw[at + 9] ^= 0x5A
            at = raw.find(needle, at + 1)
        f.seek(0)
        f.write(raw)
    broker = partq.Broker.open(data)
    server = Server(broker, "127.0.0.1:0", token=TOKEN.encode())
    yield broker, server.address, keys
    server.close()
    broker.close()


def test_a_corrupt_record_reaches_a_remote_flow_as_corrupt_record(corrupted, caplog):
    broker, address, keys = corrupted
    caplog.set_level(logging.WARNING, logger="partq.client")
    with partq.connect(address, token=TOKEN) as client:
        flow = client.bind("q", name="strict")
        delivered: list[tuple[int, int]] = []
        raised: list[partq.CorruptRecord] = []

        def step() -> bool:
            try:
                msgs = flow.receive(100, timeout=0.1)
            except partq.CorruptRecord as exc:
                raised.append(exc)
                return False
            delivered.extend((m.partition, m.seq) for m in msgs)
            if msgs:
                flow.ack_many(msgs)
            return bool(raised) and len(delivered) == 12
        wait_until(step, timeout=30, what="every intact message and the corrupt record's error")
        assert len(raised) == 1
        err = raised[0]
        assert (err.queue, err.partition, err.seq) == ("q", 1, 2) and err.reason
        assert "skip_corrupt=True" in str(err)
        assert sorted(delivered) == sorted([(p, j) for p in (0, 2) for j in range(5)]
                                           + [(1, 0), (1, 1)])
        # the connection goes on: the same client publishes and its flow receives
        after = client.publish_async("q", b"after", key=keys[0]).result(timeout=10)
        assert (after.partition, after.seq) == (0, 5)
        got = drain(flow, timeout=0.5, at_least=1)
        assert [m.payload for m in got] == [b"after"]
        flow.unbind()
        skipping = client.bind("q", name="skipping", skip_corrupt=True)
        got = drain(skipping, timeout=0.5, at_least=2)
        assert sorted((m.partition, m.seq) for m in got) == [(1, 3), (1, 4)]
        assert all(m.payload == b"UNIQUE-1-%d-PAYLOAD" % m.seq for m in got)
    assert broker.queue_status("q").depth == 0
    assert not [r for r in caplog.records if r.name == "partq.client"], \
        "the error frame cost the connection"


class ScriptedServer:
    """A listener on 127.0.0.1 that speaks partq's real handshake and answers binds; a request
    ``go`` is answered, then followed by the frame ``push(connection number)`` gives. It notes
    the connections a client hung up."""

    def __init__(self, push) -> None:
        self.push = push
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.connections = 0
        self.hung_up: list[int] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn, self.connections),
                             daemon=True).start()

    def _serve(self, conn: socket.socket, number: int) -> None:
        with conn:
            server_handshake(conn, "serve", TOKEN.encode(), 10.0)
            stream = conn.makefile("rb")
            try:
                while True:
                    frame = read_frame(stream)
                    if frame.get("op") == "bind":
                        send_frame(conn, {"op": "bound", "req": frame["req"], "flow": "f1",
                                          "partitions": [0], "consumer_timeout": 10.0})
                    elif frame.get("op") == "go":
                        send_frame(conn, {"op": "ok", "req": frame["req"]})
                        send_frame(conn, self.push(number))
            except (errors.FrameError, OSError):
                self.hung_up.append(number)

    def close(self) -> None:
        self.sock.close()


def test_a_frame_the_client_cannot_read_costs_that_connection_only(caplog):
    caplog.set_level(logging.INFO, logger="partq.client")
    good = [0, 0, b"k", b"fine", None, 1, False]
    server = ScriptedServer(lambda number: {"op": "deliver", "flow": "f1", "n": 1, "messages":
                                            [["not", "a", "message"]] if number == 1 else [good]})
    try:
        with partq.connect(server.address, token=TOKEN) as client:
            flow = client.bind("q")
            client.call({"op": "go"})                         # then the unreadable delivery
            wait_until(lambda: 1 in server.hung_up, timeout=10,
                       what="the client closes the connection that sent the bad frame")
            wait_until(lambda: any("flow(s) bound again" in r.getMessage()
                                   for r in caplog.records), timeout=10,
                       what="the client reconnects and binds its flow again")
            client.call({"op": "go"})                         # then a good one
            got = flow.receive(10, timeout=10)
            assert [m.payload for m in got] == [b"fine"] and server.connections == 2
        warnings = [r.getMessage() for r in caplog.records
                    if r.name == "partq.client" and r.levelno == logging.WARNING]
        assert any("cannot read" in w for w in warnings), warnings
    finally:
        server.close()
