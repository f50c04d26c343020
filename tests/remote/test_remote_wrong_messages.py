"""A wrong message published through ``partq.connect`` gets the typed error an embedded
publish gets, in the same words, and the client goes on working: the checks that need no queue
are made at the call (a payload that was not bytes once stopped the client's sending thread,
and every later request of the client waited for an answer that never came; headers keyed by
an int made the server end the connection); the queue's limits are checked by the server and
refuse only their own message. Real sockets on 127.0.0.1."""
from __future__ import annotations

import asyncio

import pytest

import partq
import partq.aio
from partq.remote.server import Server
from partq.wire.listener import Limits

WRONG_AT_THE_CALL = {
    "payload int": (5, None, None),
    "payload None": (None, None, None),
    "payload str": ("text", None, None),
    "key bytes": (b"x", b"k", None),
    "key int": (b"x", 7, None),
    "headers not a dict": (b"x", None, [1]),
    "headers not storable": (b"x", None, {"a": object()}),
    "headers with a non-str key": (b"x", None, {1: "a"}),
}


WRONG_BATCHES = {
    "not a batch: bytes": b"abc",
    "not a batch: str": "abc",
    "not a batch: int": 5,
    "an empty tuple": [(b"a", "k"), ()],
    "a 4-tuple": [(b"a", "k", None, None)],
    "payload int": [(b"a", "k"), (5, "k")],
    "payload msgpack cannot send, among pairs": [(b"a", "k"), (object(), "k")],
    "key int, pairs in a tuple": ((b"a", "k"), (b"b", 7)),
    "key int": [(b"a", 7)],
    "headers not storable": [(b"a", "k", {"a": object()})],
    "headers with a non-str key": [(b"a", "k", {1: "a"})],
    "payload int before bad headers": [(5, "k"), (b"a", "k", {1: "a"})],
    "payload over max_message_size": [(b"x" * 101, "k")],
}


@pytest.fixture
def served(tmp_path):
    with partq.Broker.open(tmp_path / "data") as broker:
        broker.create_queue("q", partitions=2, max_message_size=100, max_key_size=10)
        server = Server(broker, "127.0.0.1:0")
        try:
            with partq.connect(server.address) as client:
                yield broker, client
        finally:
            server.close()


@pytest.fixture
def client(served):
    return served[1]


@pytest.mark.parametrize("case", sorted(WRONG_BATCHES))
def test_a_wrong_batch_raises_what_an_embedded_publish_raises(served, case):
    """The same type and the same words (a header msgpack cannot pack was a TypeError, a
    batch that is an int one too, and a str batch was taken as one message per character)."""
    broker, client = served
    with pytest.raises(partq.InvalidMessage) as embedded:
        broker.publish_many("q", WRONG_BATCHES[case])
    with pytest.raises(partq.InvalidMessage) as remote:
        client.publish_many("q", WRONG_BATCHES[case])
    assert str(remote.value) == str(embedded.value)
    assert client.publish_many("q", [(b"after", "k")])[0].seq == 0
    assert client.queue_status("q").depth == 1


@pytest.mark.parametrize("case", sorted(WRONG_AT_THE_CALL))
@pytest.mark.parametrize("call", ["publish", "publish_async"])
def test_a_wrong_message_raises_at_the_call_and_the_client_goes_on(client, case, call):
    payload, key, headers = WRONG_AT_THE_CALL[case]
    with pytest.raises(partq.InvalidMessage):
        getattr(client, call)("q", payload, key, headers)
    assert client.publish_async("q", b"after", key="k").result(30).seq == 0
    assert client.queue_status("q").depth == 1        # nothing of the wrong one stored


def test_over_the_queues_limits_only_that_message_is_refused(client):
    pending = [client.publish_async("q", b"a", key="k"),
               client.publish_async("q", b"x" * 101, key="k"),
               client.publish_async("q", b"b", key="k" * 11),
               client.publish_async("q", b"c", key="k")]
    assert pending[0].result(30).seq == 0
    with pytest.raises(partq.InvalidMessage, match="max_message_size=100"):
        pending[1].result(30)
    with pytest.raises(partq.InvalidMessage, match="max_key_size=10"):
        pending[2].result(30)
    assert pending[3].result(30).seq == 1
    assert client.queue_status("q").depth == 2


def test_a_header_msgpack_cannot_pack_fails_its_publish_not_the_client(client):
    """An integer over 64 bits passes the header type checks; the frame that carries it
    cannot be encoded, in the thread that sends: that publish fails, the others go."""
    bad = client.publish_async("q", b"x", "k", {"n": 1 << 64})
    with pytest.raises(partq.InvalidMessage):
        bad.result(30)
    assert client.publish_async("q", b"after", key="k").result(30).seq == 0
    assert client.queue_status("q").depth == 1


@pytest.mark.parametrize("call", ["publish", "publish_async", "publish_many"])
def test_a_message_over_the_servers_frame_limit_raises_at_the_call(tmp_path, call):
    """The server would end the connection that sent it, and the publish would fail as if its
    fate were unknown: the client refuses it instead (a message of a third of the limit, which
    the client measures too, still goes)."""
    with partq.Broker.open(tmp_path / "data") as broker:
        broker.create_queue("q", partitions=1)
        server = Server(broker, "127.0.0.1:0", limits=Limits(max_frame=64 << 10))
        try:
            with partq.connect(server.address) as client:
                with pytest.raises(partq.InvalidMessage, match="frames of at most 65536"):
                    if call == "publish_many":
                        client.publish_many("q", [(b"x" * (64 << 10), "k")])
                    else:
                        getattr(client, call)("q", b"x" * (64 << 10), "k")
                assert client.publish_async("q", b"y" * (20 << 10), "k").result(30).seq == 0
        finally:
            server.close()


@pytest.mark.parametrize("verb", ["bind", "queue_status", "publish_many", "publish_async"])
def test_a_queue_named_by_something_else_than_a_str_is_invalid_config(client, verb):
    """The server took ``str()`` of it: a queue named 5 was looked for as "5"."""
    call = {"bind": lambda: client.bind(5), "queue_status": lambda: client.queue_status(5),
            "publish_many": lambda: client.publish_many(5, [b"x"]),
            "publish_async": lambda: client.publish_async(5, b"x").result(30)}[verb]
    with pytest.raises(partq.InvalidConfig, match="queue must be a queue name"):
        call()
    assert client.queue_status("q").depth == 0


def test_the_asyncio_client_raises_what_the_embedded_broker_raises(served):
    """``partq.aio`` takes a batch or a list of messages apart in the event loop's thread:
    a str batch was taken as one message per character, an int one was a TypeError."""
    broker, client = served

    async def main() -> list[str]:
        said = []
        async with await partq.aio.connect(client.address) as aclient:
            for batch in ("abc", 5):
                with pytest.raises(partq.InvalidMessage) as raised:
                    await aclient.publish_many("q", batch)
                said.append(str(raised.value))
            with pytest.raises(partq.InvalidMessage):
                await aclient.publish("q", 5)
            flow = await aclient.bind("q")
            for wrong in (None, [1, 2]):
                with pytest.raises(partq.InvalidAck):
                    await flow.ack_many(wrong)
            await aclient.publish("q", b"after", "k")
        return said

    said = asyncio.run(main())
    for batch, words in zip(("abc", 5), said, strict=True):
        with pytest.raises(partq.InvalidMessage) as embedded:
            broker.publish_many("q", batch)
        assert words == str(embedded.value)
    assert broker.queue_status("q").depth == 1
