"""Handles of writes a caller chose not to wait for (``Broker.publish_async``,
``Flow.ack_many_async``)."""
from __future__ import annotations

from typing import Protocol


class WriteHandle(Protocol):
    """A write as the layer that queued it hands it back: the storage layer's pending commit,
    or a request answered by ``partq serve`` once its write is durable there."""

    def done(self) -> bool:
        """Whether ``result()`` would return (or raise) without waiting."""

    def result(self) -> object:
        """Wait until the write is durable and return its value, or raise what it raised."""


def add_done_callback(handle: object, fn) -> bool:
    """Have ``fn()`` called once ``handle`` is done, by whichever thread finishes it (it must be
    quick); False when the handle cannot call back (wait on it another way)."""
    if handle is None:
        fn()
        return True
    add = getattr(handle, "add_done_callback", None)
    if add is None:
        return False
    return add(fn) is not False


class Pending:
    """A write queued for the group commit. ``result()`` waits until it is durable and returns
    its value (the ``PublishResult`` of ``publish_async``; None for ``ack_many_async``) or
    raises what its commit raised; ``done()`` tells without waiting. Until ``result()`` returns,
    a crash may undo the write, as if it had not been made."""

    __slots__ = ("_fut", "_value")

    def __init__(self, fut: WriteHandle | None, value: object = None) -> None:
        self._fut = fut        # the storage layer's pending write; None when nothing was written
        self._value = value    # the result when nothing was written

    def done(self) -> bool:
        return self._fut is None or self._fut.done()

    def result(self):
        return self._value if self._fut is None else self._fut.result()

    def add_done_callback(self, fn) -> bool:
        """``add_done_callback(self's write, fn)``: False when that write cannot call back."""
        return add_done_callback(self._fut, fn)
