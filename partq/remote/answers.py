"""What ``partq.connect`` sends for a publish and reads from the server's answers: batch items as
triples, publish results built without NamedTuple's argument handling (a quarter of a
publishing client's CPU went to it), and the answer to coalesced single publishes."""
from __future__ import annotations

from collections.abc import Iterable

from partq.errors import InvalidMessage, ProtocolMismatch, ServerUnavailable
from partq.message import PublishResult
from partq.publish.encode import check_batch, check_types, item_fields
from partq.remote.endpoint import RemotePending
from partq.wire.error_frames import error_from_frame


class EachAnswer:
    """The answer to a coalesced ``publish_each``: one result (or error) per publish."""

    __slots__ = ("pendings",)

    def __init__(self, pendings: list[RemotePending]) -> None:
        self.pendings = pendings

    def resolve(self, frame: dict | None, error: BaseException | None = None) -> None:
        """Resolve each publish with its result or error; a malformed answer resolves the ones
        it leaves open with ``ProtocolMismatch``."""
        if error is None and frame is not None and frame.get("op") == "error":
            error = error_from_frame(frame)
        if error is not None or frame is None:
            for p in self.pendings:
                p.resolve(None, error or ServerUnavailable("no answer from the server"))
            return
        new = tuple.__new__
        try:
            for p, result in zip(self.pendings, frame["results"], strict=True):
                if isinstance(result, dict):
                    p.resolve(None, error_from_frame(result))
                else:
                    part, seq, discarded = result
                    p.set(new(PublishResult, (part, seq, bool(discarded))))
        except Exception as exc:  # the first answer stands: this reaches the unanswered ones
            for p in self.pendings:
                p.resolve(None, ProtocolMismatch(f"malformed answer from the server: {exc!r}"))


def result_of(frame: dict):
    return frame["result"]


def results_of(frame: dict) -> list[PublishResult]:
    """The results of a publish's answer."""
    new = tuple.__new__
    return [new(PublishResult, (p, s, bool(d))) for p, s, d in frame["results"]]


def items_of(items: Iterable) -> list:
    """Batch items (payload, (payload, key) or (payload, key, headers)) as sent: each a
    triple (msgpack sends a tuple as the list the server reads), or a batch of pairs as it
    is. ``InvalidMessage`` for what is not a batch, an item of a wrong shape, or headers that
    are not storable (the server could not read a frame with a map keyed by an int: it would
    end the connection), as ``Broker.publish_many`` says it."""
    check_batch(items)
    items = items if type(items) is list else list(items)
    if set(map(type, items)) == {tuple} and set(map(len, items)) == {2}:
        return items            # (payload, key) pairs, the common batch: sent as they are
    out = [item if type(item) is tuple and len(item) == 3 else item_fields(item)
           for item in items]
    if any(headers is not None for _, _, headers in out):    # rare: each checked, in order
        check_each(out)
    return out


def check_each(items: list) -> None:
    """``check_types`` of each item ``items_of`` gave (a triple or a pair), in order."""
    for item in items:
        check_types(*item_fields(item))


def unsendable(items: list) -> InvalidMessage | None:
    """Why a batch ``items_of`` gave cannot be sent (msgpack refused it), as the error an
    embedded publish raises; None when no message is to blame."""
    try:
        check_each(items)
    except InvalidMessage as exc:
        return exc
    return None
