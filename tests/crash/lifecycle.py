"""The message lifecycle in the crash harness's *lifecycle rounds* (rules `redelivery-limit`,
`dead-messages`, `retry-delay`, `expiry`, `quota`): what the workers do, shared by the harness,
the workers and ``lifecycle_checks``.

* The queue gets ``max_redelivery`` (``MAX_REDELIVERY``), a dead message queue ``DEAD_QUEUE``
  and a ``max_depth`` quota (the harness picks one per round).
* Publishers give some messages a short TTL (``ttl_for``) and log a publish refused with
  ``QueueFull`` as ``refused`` (nothing of it was stored).
* Consumers nack every message of a *poison* key (its count grows each time: it ends dead after
  ``1 + MAX_REDELIVERY`` deliveries), now and then with a small delay, and reject every message
  of a *reject* key (dead at once). Publishers pick such keys now and then (``pick_key``: a nack
  gives back the rest of the batch's partition too, so they are kept rare); ``fate(key)`` says
  which a key is.
"""
from __future__ import annotations

MAX_REDELIVERY = 3
DEAD_QUEUE = "dead"
POISON = "poison"
REJECT = "reject"
POISON_SHARE = 0.01       # share of messages with a poison key
REJECT_SHARE = 0.02       # share of messages with a reject key
TTL_SHARE = 0.15          # share of publish calls whose messages get a TTL
TTL_RANGE = (0.3, 3.0)    # seconds
NACK_DELAY_SHARE = 0.2    # share of poison nacks given a delay (else the queue's: at once)
NACK_DELAY_RANGE = (0.005, 0.08)
FULL_BACKOFF = (0.05, 0.3)  # seconds a publisher refused with QueueFull waits


def fate(key: str | None) -> str | None:
    """``POISON`` (nacked each time), ``REJECT`` (rejected) or None (processed as usual)."""
    if key is None:
        return None
    return POISON if key.startswith("poison-") else REJECT if key.startswith("reject-") else None


def pick_key(rng) -> str | None:
    """A poison or reject key for the next message (one draw of ``rng``, two when it is one),
    or None: the usual keys."""
    r = rng.random()
    if r < POISON_SHARE:
        return f"poison-{rng.randrange(2)}"
    if r < POISON_SHARE + REJECT_SHARE:
        return f"reject-{rng.randrange(2)}"
    return None


def ttl_for(rng) -> float | None:
    """A TTL for the next publish call (one draw of ``rng``, two when it gets one), or None."""
    if rng.random() >= TTL_SHARE:
        return None
    return round(rng.uniform(*TTL_RANGE), 3)


def queue_options(max_depth: int) -> dict:
    """The lifecycle settings of the round's queue ``q``."""
    return {"max_redelivery": MAX_REDELIVERY, "dead_message_queue": DEAD_QUEUE,
            "max_depth": max_depth}
