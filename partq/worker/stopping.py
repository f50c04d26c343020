"""``Worker.run``'s signals: the first SIGINT or SIGTERM asks for a stop, a second one forces it.
The handlers only set flags (a signal handler must not wait or take locks); the worker's main
loop checks them."""
from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def wait_for_signal(force: Callable[[], None]) -> Iterator[threading.Event]:
    """An event set by the first SIGINT or SIGTERM; a second one calls ``force``. The previous
    handlers come back at the end. Outside the main thread no handler is installed (Python
    delivers signals to the main thread only) and the event is never set by a signal."""
    signalled = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield signalled
        return

    def on_signal(signum, frame) -> None:
        if signalled.is_set():
            force()
        signalled.set()

    previous = {s: signal.signal(s, on_signal) for s in SIGNALS}
    try:
        yield signalled
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
