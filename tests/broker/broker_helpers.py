"""Helpers shared by the broker tests (on sys.path through pytest's ``pythonpath``)."""
from __future__ import annotations

DELAY = 5.0
HANDOFF = 3.0


def drain(flow, max_rounds: int = 100, ack: bool = True, batch: int = 1000) -> list:
    """Receive (and ack) until nothing more comes; return everything received."""
    out = []
    for _ in range(max_rounds):
        got = flow.receive(batch)
        if not got:
            break
        out += got
        if ack:
            flow.ack_many(got)
    return out
