"""``partq worker MODULE:ATTR``: run the handlers of a ``partq.Worker`` defined in a module of
yours, as ``celery -A`` and ``dramatiq MODULE`` do, until SIGTERM or Ctrl-C."""
from __future__ import annotations

import importlib
import logging
import os
import sys
import threading

import click

from partq.tools.common import App, Seconds, pass_app
from partq.tools.listening import configure_logging, log_options
from partq.tools.output import Output, output_options

log = logging.getLogger("partq.worker")


def load_worker(spec: str):
    """The ``partq.Worker`` named by ``MODULE:ATTR`` (``MODULE`` alone: its attribute
    ``worker``), imported with the current directory on ``sys.path``, as a script would be."""
    from partq.worker import Worker
    module_name, _, attr = spec.partition(":")
    if not module_name:
        raise click.UsageError(f"name the worker as MODULE:ATTR (say, tasks:worker), not {spec!r}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise click.ClickException(f"no module {module_name!r} here (run partq worker from "
                                       f"the folder that holds it, or set PYTHONPATH)") from None
        raise
    worker = getattr(module, attr or "worker", None)
    if not isinstance(worker, Worker):
        raise click.ClickException(f"{module_name}:{attr or 'worker'} is "
                                   f"{type(worker).__name__}, not a partq.Worker")
    return worker


@click.command("worker")
@click.argument("spec", metavar="MODULE:ATTR")
@click.option("--concurrency", "-c", type=click.IntRange(1, 4096), default=None,
              help="Handlers run at once, per queue [default: each handler's own, 8 unless "
                   "it says].")
@click.option("--address", metavar="HOST:PORT",
              help="Work through partq serve at this address instead of on --data DIR.")
@click.option("--token-file", type=click.Path(dir_okay=False),
              help="A file whose first line is the token of partq serve (with --address).")
@click.option("--metrics-listen", metavar="HOST:PORT",
              help="Serve Prometheus metrics (the worker's, and the store's on a directory) at "
                   "http://HOST:PORT/metrics.")
@click.option("--stop-timeout", type=Seconds(), default=30.0, show_default=True,
              help="Seconds running handlers get to finish after SIGTERM or Ctrl-C.")
@log_options
@output_options
@pass_app
def worker(app: App, spec: str, concurrency: int | None, address: str | None,
           token_file: str | None, metrics_listen: str | None, stop_timeout: float,
           log_level: str, log_format: str, out: Output) -> None:
    """Run the handlers of the partq.Worker MODULE:ATTR (say, tasks:worker) until SIGTERM or
    Ctrl-C.

    The module is imported from the current directory. A Worker made without a directory
    (partq.Worker()) works on --data DIR, or, with --address, through partq serve. Each
    handler gets its queue's messages, at most --concurrency at once and never two of one key
    (ordering "key") or of one partition (ordering "partition"); a handler that raises is
    retried with backoff, then its message goes to the queue's dead message queue
    (<queue>.dead unless the queue names one). SIGTERM or Ctrl-C stops receiving, lets
    running handlers finish within --stop-timeout, acks them and exits 0; a second signal
    stops at once (exit 1; the unacked messages come back, marked redelivered).

    With --json, stdout gets one JSON object per thing done: started, handled, retry, dead,
    slow, stopped.
    """
    configure_logging(log_level, log_format)
    w = load_worker(spec)
    if address is not None:
        if w.path is not None:
            raise click.UsageError(f"{spec} works on the directory {w.path}; --address is for "
                                   f"a Worker made without one")
        w.address = address
    elif w.path is None and w.address is None:
        w.path = app.path
    if token_file is not None:
        from partq.wire.handshake import read_token
        w.token = read_token(token_file=token_file)
    if metrics_listen is not None:
        w.metrics_listen = metrics_listen
    if concurrency is not None:
        w.set_concurrency(concurrency)
    if out.json:
        lock = threading.Lock()

        def emit(event: dict) -> None:
            with lock:
                out.line(event)
                sys.stdout.flush()
        w.on_event = emit
    clean = w.run(timeout=stop_timeout)
    if not clean:
        raise click.ClickException("the worker stopped before its handlers finished; their "
                                   "messages come back to their queues, marked redelivered")
