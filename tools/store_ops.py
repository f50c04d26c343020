"""The store-level operations of the commands that also work through ``partq serve``
(``--address``): browse, stats, what a change of access type stranded, a position before and
after a kill, and a dead requeue. Each runs here on the directory (a
``Broker`` or ``Store``) or, given the ``partq.connect`` client ``App.broker()`` yields then, on
the server, which runs the same function on its broker (``partq.remote.client_admin``): the
same answers, and the same errors.

Nothing here imports the client: a command run on a directory loads none of it."""
from __future__ import annotations

from collections.abc import Iterator

from partq.tools.common import App


def stranded(app: App, broker, queue: str, parent_depth: int | None):
    """``partq.ops.copy_out.stranded_state``."""
    if app.address is not None:
        return broker.stranded_state(queue, parent_depth)
    from partq.ops.copy_out import stranded_state
    return stranded_state(broker, queue, parent_depth)


def stats(app: App, broker, queue: str | None) -> dict:
    """``partq.ops.stats.stats``, with ``path`` the store's directory (on the server's host
    over ``--address``)."""
    if app.address is not None:
        return broker.stats(queue)
    from partq.ops.stats import stats as store_stats
    return {**store_stats(broker, queue), "path": app.path}


def browse(app: App, source, queue: str, **selection) -> Iterator[dict]:
    """``partq.ops.browse.browse``; ``source`` is the directory's ``Store``, or the client."""
    if app.address is not None:
        return source.browse(queue, **selection)
    from partq.ops.browse import browse as browse_store
    return browse_store(source, queue, **selection)


def requeue(app: App, broker, dead_queue: str, progress, stop, **options):
    """``partq.ops.requeue.requeue``; through ``partq serve`` it runs there whole (no
    progress; a stop ends the connection, not the server's run, which the same command run
    again continues after)."""
    if app.address is not None:
        return broker.requeue(dead_queue, **options)
    from partq.ops import requeue as requeue_ops
    return requeue_ops.requeue(broker, dead_queue, progress=progress, stop=stop, **options)


def position(app: App, broker, queue: str, partition: int, seq: int):
    """``partq.ops.unblock.before``."""
    if app.address is not None:
        return broker.position(queue, partition, seq)
    from partq.ops import unblock
    return unblock.before(broker.store, queue, partition, seq)


def after(app: App, broker, queue: str, partition: int):
    """``partq.ops.unblock.after``."""
    if app.address is not None:
        return broker.after(queue, partition)
    from partq.ops import unblock
    return unblock.after(broker.store, queue, partition)
