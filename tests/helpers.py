"""Helpers every test folder shares (on sys.path through pytest's ``pythonpath``): waiting on a
condition, and draining a flow. Tests synchronise on conditions, never on sleeps."""
from __future__ import annotations

import time


def wait_until(cond, timeout: float, what: str, interval: float = 0.02, procs=()):
    """Poll ``cond()`` until it returns something truthy and return that; fail naming ``what``
    after ``timeout`` seconds. Fails early, with its output, when one of ``procs`` (objects with
    ``check_alive()`` and ``name``/``tail()``) died."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        for p in procs:
            p.check_alive()
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}" +
                                 "".join(f"\n--- {p.name}:\n{p.tail()}" for p in procs))
        time.sleep(interval)


def drain(flow, ack: bool = True, batch: int = 1000, timeout: float = 0.0,
          max_rounds: int = 10_000) -> list:
    """Receive (and ack, unless ``ack=False``) until a receive waiting ``timeout`` seconds
    returns nothing; return everything received, in order."""
    out: list = []
    for _ in range(max_rounds):
        msgs = flow.receive(batch, timeout=timeout)
        if not msgs:
            break
        out += msgs
        if ack:
            flow.ack_many(msgs)
    return out
