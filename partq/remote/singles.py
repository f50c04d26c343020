"""``partq.connect``'s single publishes on their way out: ``publish_async`` calls made while
the client's sending thread writes wait here, per queue, and leave together as ``publish_each``
frames, each answered message by message (``EachAnswer``) and committed in one of the
server's commits."""
from __future__ import annotations

from collections.abc import Callable
from operator import itemgetter

from partq.errors import InvalidMessage
from partq.remote.answers import EachAnswer
from partq.remote.endpoint import RemotePending
from partq.wire.frames import encode_frame


class Singles:
    """Unsent single publishes: per queue, their items ``[payload, key, headers]`` and their
    pendings. Not thread-safe: the client holds its lock around every call."""

    def __init__(self) -> None:
        self._groups: dict[str, tuple[list[list], list[RemotePending]]] = {}

    def add(self, queue: str, item: list, pending: RemotePending) -> None:
        group = self._groups.get(queue)
        if group is None:
            group = self._groups[queue] = ([], [])
        group[0].append(item)
        group[1].append(pending)

    def frames(self, new_req: Callable[[], int],
               max_frame: int) -> tuple[list[bytes], dict[int, EachAnswer]]:
        """Every unsent publish, taken: one ``publish_each`` frame per queue (split to stay far
        below ``max_frame``), each under a request id from ``new_req()``, and the answer each
        request id waits for. A frame msgpack cannot encode (what the client's checks let
        through) fails its own publishes, not the thread that sends them."""
        groups, self._groups = self._groups, {}
        frames: list[bytes] = []
        answers: dict[int, EachAnswer] = {}
        for queue, (items, pendings) in groups.items():
            for start, end in frame_spans(items, max_frame // 4):
                answer, req = EachAnswer(pendings[start:end]), new_req()
                try:
                    frames.append(encode_frame({"op": "publish_each", "req": req,
                                                "queue": queue, "items": items[start:end]}))
                except (TypeError, ValueError, OverflowError) as exc:
                    answer.resolve(None, InvalidMessage(f"the message cannot be sent: {exc}"))
                    continue
                answers[req] = answer
        return frames, answers


def frame_spans(items: list[list], budget: int) -> list[tuple[int, int]]:
    """``(start, end)`` of each frame's share of ``items``: about ``budget`` bytes each (a
    message counts its payload and 64 bytes), at least one message."""
    if sum(map(len, map(itemgetter(0), items))) + 64 * len(items) < budget:
        return [(0, len(items))]        # the common case, without a loop in Python
    spans, start = [], 0
    while start < len(items):
        size, end = 0, start
        while end < len(items) and (end == start or size < budget):
            size += len(items[end][0]) + 64
            end += 1
        spans.append((start, end))
        start = end
    return spans
