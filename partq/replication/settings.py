"""What ``Broker.open`` (and ``promote``) asks of replication before any of its machinery loads:
the check of ``sync_timeout``, the bound on the change log a primary keeps, and the marks in a
directory's meta that make it play a part (a DR-standby; a promoted store still to tell its old
primary that it is superseded). A process that opens a plain primary without replication
options loads no listener, follower, TLS or handshake code.
"""
from __future__ import annotations

import math

from partq.errors import InvalidConfig

STANDBY_ROLE = b"standby"         # meta ``role`` of a directory that is a DR-standby
FENCE_TARGET = b"fence_primary"   # local meta of a promoted store: the old primary's address
FENCE_ERROR = b"fence_error"      # local meta: why the last attempt to tell it failed
DEFAULT_MAX_SLOT_KEEP = 1 << 30   # bytes of change log kept for the slowest standby


def check_sync_timeout(value) -> float:
    """``sync_timeout`` as seconds: a finite number > 0 (NaN would block forever)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or value <= 0:
        raise InvalidConfig(f"sync_timeout must be a finite number of seconds > 0, not {value!r}")
    return float(value)


def slot_keep(max_slot_keep: int | None, max_map_size: int) -> int:
    """Bytes of change log kept for the slowest standby: ``max_slot_keep`` (None: 1 GiB), never
    more than a quarter of ``max_map_size``."""
    keep = DEFAULT_MAX_SLOT_KEEP if max_slot_keep is None else max_slot_keep
    return min(keep, max(max_map_size // 4, 1 << 20))


def is_standby(r) -> bool:
    """The directory read by ``r`` is a DR-standby."""
    return r.meta(b"role") == STANDBY_ROLE


def fence_state(r) -> tuple[str | None, str | None]:
    """(the old primary still to be told, or None; why the last attempt failed, or None)."""
    target, error = r.meta(FENCE_TARGET), r.meta(FENCE_ERROR)
    return (None if target is None else target.decode(errors="replace"),
            None if target is None or error is None else error.decode(errors="replace"))
