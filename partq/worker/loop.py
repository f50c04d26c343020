"""The worker's one event loop, in a thread of its own, for ``async def`` handlers: a handler
thread hands it a coroutine and waits for its end, so at most ``concurrency`` coroutines of a
handler run at once, all on this loop."""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable


class EventLoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="partq-worker-loop",
                                        daemon=True)
        self._thread.start()

    def call(self, fn: Callable, *args) -> object:
        """Run ``fn(*args)`` (a coroutine function) on the loop; return its result or raise
        what it raised."""
        return asyncio.run_coroutine_threadsafe(fn(*args), self.loop).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5.0)
