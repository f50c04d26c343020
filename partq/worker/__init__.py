"""The worker: run handlers over queues (``partq.Worker``, ``partq worker MODULE:ATTR``).

* ``worker``    ``Worker``: registration, start, stop, run, status
* ``options``   a handler's options and the backoff rule
* ``scheduler`` per-key (or per-partition) order under concurrency, bounded receive-ahead
* ``runner``    one handler's threads: receive ahead, run, ack in batches
* ``retry``     a failed message: retry after a backoff, or dead with the exception's headers
* ``loop``      the one event loop of ``async def`` handlers
* ``stopping``  SIGINT and SIGTERM under ``Worker.run``
* ``stats``     what each handler did, and ``metrics`` for Prometheus

The worker is a client of partq's public API (a ``Broker`` or a ``partq.connect`` client, their
flows); it reaches into no delivery or storage internals.
"""
from partq.worker.worker import Worker

__all__ = ["Worker"]
