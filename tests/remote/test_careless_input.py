"""Careless input at the edges of the network code: a token file others may read, and the like.
Each gets one clear line (a warning or an error that says what to do)."""
from __future__ import annotations

import logging

import pytest

import partq
from partq.wire.handshake import read_token

TOKEN = "a-test-token-of-32-bytes-or-so!!"


@pytest.mark.parametrize("mode, warned", [(0o600, False), (0o400, False), (0o640, True),
                                          (0o644, True)])
def test_a_token_file_others_may_read_is_warned_of(tmp_path, caplog, mode, warned):
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(mode)
    with caplog.at_level(logging.WARNING, logger="partq.listener"):
        assert read_token(token_file=str(path)) == TOKEN.encode()
    lines = [r.getMessage() for r in caplog.records if "may be read by other users" in r.getMessage()]
    assert bool(lines) == warned
    if warned:
        assert f"chmod 600 {path}" in lines[0]


def test_a_short_token_is_refused_with_how_to_make_one(tmp_path):
    with pytest.raises(partq.InvalidConfig, match="openssl rand"):
        read_token(token="short")


@pytest.mark.parametrize("name", ["svc\nINFO forged log line", "tab\there", "", "x" * 257])
def test_a_flow_name_with_control_characters_is_refused(tmp_path, name):
    with partq.Broker.open(tmp_path / "data") as broker:
        broker.create_queue("q", partitions=1)
        with pytest.raises(partq.InvalidConfig, match="printable characters"):
            broker.bind("q", name=name)


def test_a_client_hello_with_control_characters_is_escaped_in_the_log(tmp_path, caplog):
    import socket

    from helpers import wait_until

    from partq.remote.server import Server
    from partq.wire.handshake import client_handshake
    with partq.Broker.open(tmp_path / "data") as broker:
        server = Server(broker, "127.0.0.1:0", token=TOKEN.encode())
        try:
            with caplog.at_level(logging.INFO, logger="partq.server"):
                host, port = server.address.rsplit(":", 1)
                with socket.create_connection((host, int(port)), timeout=30) as sock:
                    client_handshake(sock, "serve", TOKEN.encode(), 30, pid="1\nINFO forged",
                                     host="h\rX")
                    wait_until(lambda: any("connected" in r.getMessage() for r in caplog.records),
                               30, "the connection logged")
            line = next(r.getMessage() for r in caplog.records if "connected" in r.getMessage())
            assert "\n" not in line and "\r" not in line
            assert "1\\nINFO forged" in line and "h\\rX" in line
        finally:
            server.close()


def test_ssl_true_means_the_default_context_and_nonsense_is_refused():
    import ssl

    from partq.remote.client import client_context
    assert isinstance(client_context(True), ssl.SSLContext)
    assert client_context(None) is None and client_context(False) is None
    with pytest.raises(partq.InvalidConfig, match="ssl must be"):
        client_context("yes")


@pytest.mark.parametrize("op, ids", [("ack", [["0", 1]]), ("ack", [[0, None]]), ("ack", [[True, 0]]),
                                     ("ack", [[0]]), ("ack", ["x"]), ("nack", [0]),
                                     ("reject", None)])
def test_an_ack_that_names_no_message_is_refused_and_the_session_goes_on(tmp_path, op, ids):
    """Acks name ``[partition, seq]`` pairs of integers; anything else is refused with
    ``InvalidAck`` saying so, and nothing changes: the flow keeps its message, and the
    connection its flow (it once was an exception out of the session's thread, or an ack taken
    for a string's int; then the end of the session)."""
    import socket

    from partq.remote.server import Server
    from partq.wire.frames import read_frame, send_frame
    from partq.wire.handshake import client_handshake
    with partq.Broker.open(tmp_path / "data") as broker:
        broker.create_queue("q", partitions=1)
        broker.publish("q", b"m")
        server = Server(broker, "127.0.0.1:0", token=TOKEN.encode())
        try:
            host, port = server.address.rsplit(":", 1)
            with socket.create_connection((host, int(port)), timeout=30) as sock:
                client_handshake(sock, "serve", TOKEN.encode(), 30)
                stream = sock.makefile("rb")

                def frame_where(cond) -> dict:
                    return next(f for f in iter(lambda: read_frame(stream), None) if cond(f))

                def answer(req: int) -> dict:
                    return frame_where(lambda f: f.get("req") == req)
                send_frame(sock, {"op": "bind", "req": 1, "queue": "q"})
                flow = answer(1)["flow"]
                frame_where(lambda f: f.get("op") == "deliver")       # the message is in flight
                request = {"op": op, "req": 2, "flow": flow}
                request.update({"ids": ids} if op == "ack" else {"id": ids})
                send_frame(sock, request)
                refused = answer(2)
                assert refused["error"] == "InvalidAck" and "[partition, seq]" in refused["message"]
                send_frame(sock, {"op": "status", "req": 3, "queue": "q"})
                status = answer(3)["status"]
            assert [f["flow"] for f in status["flows"]] == [flow]
            assert status["partitions"][0]["unacked"] == 1       # not acked, not given back
        finally:
            server.close()
