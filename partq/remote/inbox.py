"""The messages ``partq serve`` pushed to a client's flow and the flow has not handed out yet,
kept as the deliver frames they came in (``Inbox``): a receive takes a frame's list whole, or
a slice of it, instead of moving message by message; each frame keeps its number ``n``, which
a nack's answer names (the copies pushed before the nack took effect are dropped)."""
from __future__ import annotations

from collections import deque
from collections.abc import Callable
from itertools import repeat
from operator import add

from partq.message import Message

_new = tuple.__new__


def deliveries(queue: str, fields: list[list]) -> list[Message]:
    """The Messages of a deliver frame's ``messages`` (each the fields after the queue's name),
    built without NamedTuple's argument handling. A server that sends no delivery count (seven
    fields) gets 1. ``ValueError`` for a message of any other number of fields."""
    sizes = set(map(len, fields))
    if sizes == {8}:                        # the common case, in C
        return list(map(_new, repeat(Message), map(add, repeat((queue,)), map(tuple, fields))))
    if not sizes <= {7, 8}:
        raise ValueError(f"a delivered message of {min(sizes - {7, 8})} fields, not 8")
    return [_new(Message, (queue, *f) if len(f) == 8 else (queue, *f, 1)) for f in fields]


class Inbox:
    """Pushed messages in the order they came, by deliver frame. Not thread-safe: its flow's
    lock guards it."""

    __slots__ = ("_frames", "_head")

    def __init__(self) -> None:
        self._frames: deque[tuple[int, list[Message]]] = deque()
        self._head = 0          # messages of the first frame already taken

    def __bool__(self) -> bool:
        return bool(self._frames)

    def add(self, n: int, msgs: list[Message]) -> None:
        """The messages of deliver frame ``n`` (a list the inbox keeps)."""
        if msgs:
            self._frames.append((n, msgs))

    def take(self, most: int) -> list[Message]:
        """Up to ``most`` messages, the oldest first."""
        frames = self._frames
        out: list[Message] = []
        while frames and most > 0:
            msgs = frames[0][1]
            head = self._head
            if head == 0 and len(msgs) <= most:     # a whole frame: no copy
                frames.popleft()
                if out:
                    out += msgs
                else:
                    out = msgs
                most -= len(msgs)
                continue
            piece = msgs[head:head + most]
            out += piece
            most -= len(piece)
            if head + len(piece) >= len(msgs):
                frames.popleft()
                self._head = 0
            else:
                self._head = head + len(piece)
        return out

    def drop(self, gone: Callable[[int, Message], bool]) -> None:
        """Forget every message ``m`` of frame ``n`` for which ``gone(n, m)``."""
        kept: deque[tuple[int, list[Message]]] = deque()
        head = self._head
        for n, msgs in self._frames:
            rest = [m for m in msgs[head:] if not gone(n, m)]
            head = 0
            if rest:
                kept.append((n, rest))
        self._frames, self._head = kept, 0

    def partitions(self) -> set[int]:
        """The partitions of the messages held."""
        head, out = self._head, set[int]()
        for _, msgs in self._frames:
            out.update(m[1] for m in msgs[head:])
            head = 0
        return out

    def clear(self) -> None:
        self._frames.clear()
        self._head = 0
