"""What a process of the same user may send the delivery owner over its control socket (rules
`peer-flows` and `liveness`): every field of every request is checked where it arrives, a bad
one is answered with a typed error frame (the request does nothing), and a connection that
closes unbinds every flow it bound. The case from the review: a client binds with the flow name
``{"a": 1}`` and closes; the owner's unbind died on the name, the ghost flow kept a partition
from every later consumer until the owner restarted.

The owner is a Broker of this process (it serves the socket from its own threads); the bad
client speaks the control protocol over the real Unix socket; the legitimate consumer is
another process."""
from __future__ import annotations

import json
import os
import socket

import pytest
from helpers import run_child

import partq
from partq.delivery.peers.owner_channel import socket_path
from partq.wire.error_frames import error_from_frame
from partq.wire.frames import recv_frame, send_frame

VERSION = 1         # the control protocol's

BIND_LEGIT = """
    import json, sys, time
    import partq
    with partq.Broker.open(sys.argv[1]) as broker:
        flow = broker.bind("q", name="legit")
        deadline = time.monotonic() + 30
        while sorted(flow.partitions) != [0, 1] and time.monotonic() < deadline:
            flow.receive(1, timeout=0.1)        # waits for a change of its partitions
        print(json.dumps(sorted(flow.partitions)))
"""


class Raw:
    """A control-socket client that sends whatever it is given."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(30)
        self.sock.connect(path)

    def send(self, frame) -> None:
        send_frame(self.sock, frame)

    def answer(self, req=None) -> dict:
        """The next frame that is not a push about a flow (its partitions, its closing)."""
        while True:
            frame = recv_frame(self.sock)
            if frame.get("op") not in ("event", "closed"):
                assert frame.get("req") == req, frame
                return frame

    def hello(self) -> None:
        self.send({"op": "hello", "v": VERSION, "pid": os.getpid(), "host": "test"})
        assert self.answer()["op"] == "welcome"

    def closed_by_owner(self) -> bool:
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def owner(tmp_path):
    """A broker that runs the delivery of "q" (2 partitions) with no flow of its own."""
    broker = partq.Broker.open(tmp_path / "data")
    broker.create_queue("q", partitions=2, rebalance_delay=0.0, max_handoff_time=0.0)
    broker.bind("q", name="keeper").unbind()
    yield broker
    broker.close()


def control_path(broker) -> str:
    return socket_path(str(broker.path), broker.queue_config("q").qid)


def refused(raw: Raw, frame: dict, error: type[partq.PartqError], req=None) -> str:
    raw.send(frame)
    answer = raw.answer(req)
    assert answer["op"] == "error", answer
    exc = error_from_frame(answer)
    assert type(exc) is error, (answer, exc)
    return str(exc)


def bound_names(broker) -> list:
    return [f.name for f in broker.queue_status("q").flows if f.bound]


BAD_BINDS = [
    ({"name": {"a": 1}}, "flow name must be a str"),
    ({"name": "x" * 257}, "1 to 256 printable"),
    ({"name": "a\nb"}, "1 to 256 printable"),
    ({"name": ""}, "1 to 256 printable"),
    ({"hint": "01"}, "hint"),
    ({"hint": [2 ** 40]}, "hint"),
    ({"hint": [-1]}, "hint"),
    ({"hint": [True]}, "hint"),
    ({"hint": [0.5]}, "hint"),
    ({"hint": list(range(70_000))}, "hint"),
    ({"skip_corrupt": "yes"}, "skip_corrupt"),
]


def test_a_bind_with_a_bad_field_is_answered_and_binds_nothing(owner):
    raw = Raw(control_path(owner))
    try:
        raw.hello()
        for req, (fields, says) in enumerate(BAD_BINDS, start=1):
            frame = {"op": "bind", "req": req, "name": "ok", "hint": None, "skip_corrupt": False,
                     **fields}
            assert says in refused(raw, frame, partq.InvalidConfig, req), fields
        assert bound_names(owner) == []
        raw.send({"op": "view", "req": 99})          # the connection still serves
        assert raw.answer(99)["op"] == "view"
    finally:
        raw.close()


def test_other_requests_with_bad_fields_are_answered_with_a_typed_error(owner):
    raw = Raw(control_path(owner))
    try:
        raw.hello()
        raw.send({"op": "bind", "req": 1, "name": "raw", "hint": None, "skip_corrupt": False})
        flow = raw.answer(1)["flow"]
        bad = [
            ({"op": "bind", "req": "one", "name": "x"}, None),
            ({"op": "bind", "req": 2 ** 64 - 1, "name": "x"}, None),
            ({"op": "bind", "req": -1, "name": "x"}, None),
            ({"op": "unbind", "req": 2, "flow": {"a": 1}}, 2),
            ({"op": "unbind", "req": 3, "flow": "f" * 1000}, 3),
            ({"op": "view", "req": [4]}, None),
            ({"op": "outstanding", "flow": flow, "counts": "x"}, None),
            ({"op": "outstanding", "flow": flow, "counts": [[0]]}, None),
            ({"op": "outstanding", "flow": flow, "counts": [[0, "n"]]}, None),
            ({"op": "outstanding", "flow": flow, "counts": [[2 ** 40, 1]]}, None),
            ({"op": "outstanding", "flow": flow, "counts": [], "paused": [None]}, None),
            ({"op": "outstanding", "flow": flow, "counts": [], "held": [[0]]}, None),
            ({"op": "outstanding", "flow": flow, "counts": [], "held": [[0, 1, 1, "delay"]]},
             None),
            ({"op": "outstanding", "flow": 7, "counts": []}, None),
        ]
        for frame, req in bad:
            refused(raw, frame, partq.ProtocolMismatch, req)
        assert bound_names(owner) == ["raw"]
        raw.send({"op": "unbind", "req": 5, "flow": flow})
        assert raw.answer(5)["op"] == "ok"
        assert bound_names(owner) == []
    finally:
        raw.close()


def test_a_bad_hello_or_an_unknown_request_is_answered_then_the_connection_ends(owner):
    for first in ({"op": "hello", "v": VERSION, "pid": {"a": 1}, "host": "h"},
                  {"op": "hello", "v": VERSION, "pid": 1, "host": "h" * 1000},
                  {"op": "hello", "v": [1], "pid": 1, "host": "h"},
                  {"op": ["x"]}):
        raw = Raw(control_path(owner))
        try:
            refused(raw, first, partq.ProtocolMismatch)
            assert raw.closed_by_owner(), first
        finally:
            raw.close()


def test_a_client_that_bound_with_a_bad_name_and_closed_leaves_no_ghost(owner, tmp_path):
    raw = Raw(control_path(owner))
    raw.hello()
    raw.send({"op": "bind", "req": 1, "name": {"a": 1}, "hint": [1], "skip_corrupt": False})
    try:
        raw.answer(1)
    except partq.FrameError:
        pass                    # the connection ended under the request: answered or not,
    raw.close()                 # what matters is what the owner keeps
    child = run_child(BIND_LEGIT, owner.path)
    assert child.returncode == 0, child.stderr
    assert json.loads(child.stdout) == [0, 1], child.stderr
    assert bound_names(owner) == []


BIND_WITH_HINT = """
    import sys
    import partq
    with partq.Broker.open(sys.argv[1]) as broker:
        try:
            broker.bind("q", hint=[int(sys.argv[2])])
        except partq.InvalidConfig as exc:
            print("InvalidConfig:", exc)
"""


@pytest.mark.parametrize("partition", [-1, 2 ** 70])
def test_a_hint_no_queue_can_have_is_refused_alike_in_every_process(owner, partition):
    with pytest.raises(partq.InvalidConfig, match="hint must be a list"):
        owner.bind("q", hint=[partition])                   # bound in the owner's process
    child = run_child(BIND_WITH_HINT, owner.path, partition)    # bound through its socket
    assert child.returncode == 0 and child.stdout.startswith("InvalidConfig: hint must be"), \
        child.stdout + child.stderr
    assert bound_names(owner) == []
