"""What happens to a message whose handler raised: a retry after a backoff (a nack with that
delay: the message's key, or its partition under ``ordering="partition"``, waits; the others go
on), or, once the message ran ``retries + 1`` times, a reject to the queue's dead message queue
with the exception's type and message in its headers.

The count is the message's ``delivery_count``, which the store keeps: it holds across a restart
of the worker, and a crash may make it one too high, never too low (so a crash costs at most a
retry, and never makes a poison message run for ever).
"""
from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field

from partq.errors import PartqError
from partq.flow import Flow
from partq.message import Message
from partq.worker.options import HandlerOptions, backoff_delay

log = logging.getLogger("partq.worker")

MAX_ERROR_TEXT = 1000       # characters of an exception's message kept in the headers


@dataclass
class Outcome:
    back: list[int] | None = None   # seqs a nack gave back (None: no nack took effect)
    retried: int = 0
    dead: int = 0
    event: str | None = None        # for the --json lines
    fields: dict = field(default_factory=dict)


def error_headers(error: BaseException) -> dict:
    """The headers a dead message gets: ``exception_type`` (``module.Class``) and
    ``exception_message`` (its text, at most ``MAX_ERROR_TEXT`` characters)."""
    cls = type(error)
    module = cls.__module__
    name = cls.__qualname__ if module in ("builtins", None) else f"{module}.{cls.__qualname__}"
    text = str(error)
    if len(text) > MAX_ERROR_TEXT:
        text = text[:MAX_ERROR_TEXT - 3] + "..."
    return {"exception_type": name, "exception_message": text}


class FailurePolicy:
    def __init__(self, options: HandlerOptions, flow: Flow, rng: random.Random) -> None:
        self.options, self.flow, self.rng = options, flow, rng

    def settle(self, msg: Message, error: Exception) -> Outcome:
        """Nack ``msg`` for a retry, or reject it; log which."""
        opts = self.options
        headers = error_headers(error)
        where = (f"queue {opts.queue!r} partition {msg.partition} seq {msg.seq} key "
                 f"{msg.key!r}")
        try:
            if msg.delivery_count <= opts.retries:
                delay = backoff_delay(opts.backoff, msg.delivery_count, self.rng)
                back = self.flow.nack(msg, delay)
                log.info("%s: handler raised %s: %s; retry %d of %d in %.2f s", where,
                         headers["exception_type"], headers["exception_message"],
                         msg.delivery_count, opts.retries, delay)
                return Outcome(back, retried=1, event="retry", fields={
                    "attempt": msg.delivery_count, "delay": round(delay, 3), **headers})
            self.flow.reject(msg, headers=headers)
        except PartqError as exc:
            log.warning("%s: handler raised %s; the message could not be given back (%s): it "
                        "comes again", where, headers["exception_type"], exc)
            return Outcome(event="lost", fields={"error": str(exc)})
        log.warning("%s: handler raised %s: %s; out of retries after %d run(s): moved to the "
                    "dead message queue", where, headers["exception_type"],
                    headers["exception_message"], msg.delivery_count)
        return Outcome(dead=1, event="dead", fields={"attempts": msg.delivery_count, **headers})
