"""Every field of every request of ``partq serve`` is checked at the edge: a request with a field
of the wrong type or out of range is answered with a typed error frame under its ``req``, and
the connection goes on (a status request on it is answered next, its flow still bound). Such
requests used to end in a TypeError or ValueError out of the session's thread: an ERROR
traceback in the log and a connection closed without a word (or, for some, an answer "ok" to a
request that did nothing). Real sockets on 127.0.0.1; the frames are written by hand after the
handshake, as a careless or hostile client would."""
from __future__ import annotations

import logging

import pytest
from hostile import TOKEN, raw_session

import partq
from partq.remote.server import Server
from partq.wire.frames import read_frame, send_frame

FLOW = object()     # stands for the id of the flow the connection bound
JOB = "ab" * 16

# a request each (without its req), and the error it gets
WRONG = {
    "op a list": ({"op": ["x"]}, "InvalidConfig"),
    "op unknown": ({"op": "frobnicate"}, "InvalidConfig"),
    "req a string": ({"op": "status", "queue": "q", "req": "x"}, "InvalidConfig"),
    "publish items an int": ({"op": "publish", "queue": "q", "items": 5}, "InvalidMessage"),
    "publish_each item an int": ({"op": "publish_each", "queue": "q", "items": [5]},
                                 "InvalidMessage"),
    "bind hint an int": ({"op": "bind", "queue": "q", "hint": 5}, "InvalidConfig"),
    "bind name a map": ({"op": "bind", "queue": "q", "name": {"a": 1}}, "InvalidConfig"),
    "bind skip_corrupt a string": ({"op": "bind", "queue": "q", "skip_corrupt": "no"},
                                   "InvalidConfig"),
    "ack_through seq a string": ({"op": "ack_through", "flow": FLOW, "partition": 0,
                                  "seq": "x"}, "InvalidAck"),
    "ack_through partition past 2**32": ({"op": "ack_through", "flow": FLOW,
                                          "partition": 1 << 40, "seq": 0}, "InvalidAck"),
    "ack ids not pairs": ({"op": "ack", "flow": FLOW, "ids": [[0]]}, "InvalidAck"),
    "ack seq negative": ({"op": "ack", "flow": FLOW, "ids": [[0, -1]]}, "InvalidAck"),
    "nack id missing": ({"op": "nack", "flow": FLOW}, "InvalidAck"),
    "nack delay a string": ({"op": "nack", "flow": FLOW, "id": [0, 0], "delay": "5"},
                            "InvalidConfig"),
    "unbind flow a list": ({"op": "unbind", "flow": ["x"]}, "InvalidConfig"),
    "logs known a string": ({"op": "logs", "queue": "q", "known": "0"}, "InvalidConfig"),
    "read qid a string": ({"op": "read", "queue": "q", "qid": "1", "partition": 0, "start": 0,
                           "end": 1}, "InvalidConfig"),
    "stage keys fewer than payloads": ({"op": "stage", "queue": "q", "job": JOB,
                                        "task_partition": 0, "attempt": 0, "next_chunk": 0,
                                        "payloads": [b"a", b"b"], "keys": [None]},
                                       "InvalidMessage"),
    "commit_job attempts of strings": ({"op": "commit_job", "queue": "q", "job": JOB,
                                        "attempts": ["0"], "slice_rows": 10}, "InvalidConfig"),
}


@pytest.fixture
def served(tmp_path):
    with partq.Broker.open(tmp_path / "data") as broker:
        broker.create_queue("q", partitions=1)
        broker.publish("q", b"m")
        server = Server(broker, "127.0.0.1:0", token=TOKEN.encode())
        try:
            yield broker, server
        finally:
            server.close()


def ask(sock, stream, request: dict) -> dict:
    """Send ``request`` and return its answer (pushes of the connection's flow are skipped); a
    connection the server closed raises."""
    send_frame(sock, request)
    while True:
        frame = read_frame(stream)
        if "req" in frame and frame["req"] == request.get("req"):
            return frame


@pytest.mark.parametrize("case", sorted(WRONG))
def test_a_request_with_a_wrong_field_gets_its_typed_error_and_the_connection_goes_on(
        served, caplog, case):
    broker, server = served
    request, error = WRONG[case]
    with caplog.at_level(logging.INFO, logger="partq"), raw_session(server.address) as sock:
        sock.settimeout(30)
        stream = sock.makefile("rb")
        flow = ask(sock, stream, {"op": "bind", "req": 1, "queue": "q"})["flow"]
        request = {"req": 2, **{k: flow if v is FLOW else v for k, v in request.items()}}
        answer = ask(sock, stream, request)
        assert (answer["op"], answer["error"]) == ("error", error), answer
        assert answer["message"].endswith("cannot read: fix or upgrade it")
        status = ask(sock, stream, {"op": "status", "req": 3, "queue": "q"})
        assert status["op"] == "status"
        assert [f["flow"] for f in status["status"]["flows"]] == [flow]   # still bound
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_every_request_the_server_reads_is_in_the_table():
    """The table is the list of requests: the session's own and the Spark source's."""
    from partq.jobs.staging import SPARK_OPS
    from partq.remote.requests import REQUESTS
    own = {"beat", "publish", "publish_each", "bind", "ack", "ack_through", "nack", "reject",
           "unbind", "status", "queues", "replication", "config", "ensure_dead_queue"}
    assert set(REQUESTS) == own | SPARK_OPS
