"""The JSON-lines log every crash-test worker writes (read by ``checker``).

``Log.write(*events)`` appends the events as lines in one ``write()`` and fsyncs before it
returns: the worker does nothing that depends on an event (calling publish after its
``attempt``, acking after ``delivered``) until the event is on disk. A SIGKILL inside the
write can tear only the last line, which ``checker.read_log`` drops.
"""
from __future__ import annotations

import json
import os
import time


class Log:
    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, *events: dict) -> None:
        if not events:
            return
        t = time.monotonic()
        data = "".join(json.dumps({**e, "t": e.get("t", t)}, separators=(",", ":")) + "\n"
                       for e in events).encode()
        while data:
            n = os.write(self._fd, data)
            data = data[n:]
        os.fsync(self._fd)

    def close(self) -> None:
        os.close(self._fd)


def make_payload(mid: str, key: str | None, pad: int = 0) -> bytes:
    """A payload that names its id and key (the checker matches deliveries by them)."""
    return json.dumps({"id": mid, "key": key, "pad": "x" * pad}).encode()


def delivered_event(msg) -> dict:
    """The ``delivered`` event of a received message; ``id`` is None when the payload is not
    one of ours (the checker counts it as garbled). ``delivery_count`` is partq's (rule
    `delivery-count`), ``pt`` its publish time (wall clock, seconds: expiry is checked
    against it)."""
    try:
        body = json.loads(msg.payload)
        mid, pkey = body["id"], body["key"]
    except (ValueError, KeyError, TypeError):
        mid, pkey = None, None
    return {"op": "delivered", "id": mid, "key": msg.key, "pkey": pkey, "partition": msg.partition,
            "seq": msg.seq, "redelivered": msg.redelivered, "delivery_count": msg.delivery_count,
            "pt": msg.publish_time_ns / 1e9}
