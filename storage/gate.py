"""The gate every transaction of one process passes: shared for transactions, exclusive for
what py-lmdb allows only with none active (growing the map, reopening the environment)."""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class TxnGate:
    """Shared/exclusive gate: every transaction holds it shared; a map resize holds it exclusive
    (py-lmdb's set_mapsize requires that no transaction of this process is active), and so does
    reopening a store opened read-only for writing, which may also go on while threads that
    hold it shared wait ``parked`` (promising not to use their transactions again)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._active = 0
        self._exclusive = False
        self._held: dict[int, int] = {}      # thread -> shared holds
        self._parked = 0                     # shared holds of threads waiting in parked()

    def enter(self) -> None:
        me = threading.get_ident()
        with self._cond:
            while self._exclusive:
                self._cond.wait()
            self._active += 1
            self._held[me] = self._held.get(me, 0) + 1

    def leave(self) -> None:
        me = threading.get_ident()
        with self._cond:
            self._active -= 1
            if self._held.get(me, 0) > 1:
                self._held[me] -= 1
            else:
                self._held.pop(me, None)
            if self._active == self._parked:
                self._cond.notify_all()

    @contextmanager
    def parked(self) -> Iterator[None]:
        """While the calling thread waits in here, its own shared holds do not keep
        ``exclusive(over_parked=True)`` waiting."""
        with self._cond:
            mine = self._held.get(threading.get_ident(), 0)
            self._parked += mine
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._parked -= mine

    @contextmanager
    def exclusive(self, over_parked: bool = False) -> Iterator[None]:
        with self._cond:
            while self._exclusive:
                self._cond.wait()
            self._exclusive = True
            while self._active > (self._parked if over_parked else 0):
                self._cond.wait()
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()
