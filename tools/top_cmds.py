"""``partq top``: a live view of a directory, or of a ``partq serve`` over ``--address``."""
from __future__ import annotations

import contextlib
import os
import select
import signal
import ssl
import sys
import termios
import threading
import time
import tty
from collections.abc import Callable, Iterator

import click

from partq.metrics.sampling import Snapshot, as_doc, rates, snapshot_broker, snapshot_client
from partq.tools.common import App, Seconds, pass_app, read_only_option
from partq.tools.output import Output, output_options


class Keys:
    """Single key presses from a terminal on stdin (cbreak mode while open), or none at all
    when stdin is not a terminal: then ``wait`` only waits."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.fd: int | None = None
        self._saved: list | None = None
        try:
            if sys.stdin.isatty():
                self.fd = sys.stdin.fileno()
        except (AttributeError, ValueError, OSError):
            self.fd = None

    def __enter__(self) -> Keys:
        if self.fd is not None:
            self._saved = termios.tcgetattr(self.fd)
            tty.setcbreak(self.fd)
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None and self._saved is not None:
            termios.tcsetattr(self.fd, termios.TCSADRAIN, self._saved)

    def wait(self, seconds: float) -> bool:
        """Wait ``seconds``; True when the user asked to quit (q, or a signal) meanwhile."""
        deadline = time.monotonic() + seconds
        while not self.stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if self.fd is None:
                self.stop.wait(left)
                continue
            ready, _, _ = select.select([self.fd], [], [], min(left, 0.25))
            if ready and os.read(self.fd, 1) in (b"q", b"Q"):
                return True
        return True


@contextlib.contextmanager
def _source(app: App, address: str | None, token_file: str | None, tls_ca: str | None,
            queues: list[str]) -> Iterator[Callable[[], Snapshot]]:
    if address is None:
        if token_file or tls_ca:
            raise click.UsageError("--token-file and --tls-ca apply to --address")
        with app.reading() as broker:
            yield lambda: snapshot_broker(broker, queues or None)
        return
    import partq
    context = ssl.create_default_context(cafile=tls_ca) if tls_ca else None
    client = partq.connect(address, token_file=token_file, ssl=context)
    try:
        yield lambda: snapshot_client(client, queues or None)
    finally:
        client.close()


@click.command()
@click.argument("queues", nargs=-1)
@click.option("--interval", type=Seconds(0.1), default=1.0, show_default=True,
              help="Seconds between refreshes; rates are per second between two of them.")
@click.option("--count", type=click.IntRange(1), default=None,
              help="Stop after this many refreshes (default: until q, Ctrl-C or SIGTERM).")
@click.option("--address", metavar="HOST:PORT",
              help="Watch a `partq serve` on another host instead of --data DIR.")
@click.option("--token-file", type=click.Path(dir_okay=False),
              help="With --address: a file whose first line is the server's token.")
@click.option("--tls-ca", type=click.Path(dir_okay=False),
              help="With --address: speak TLS, trusting this CA file (PEM).")
@click.option("--max-partitions", type=click.IntRange(1), default=16, show_default=True,
              help="Partitions shown per queue (the deepest).")
@read_only_option
@output_options
@pass_app
def top(app: App, queues: tuple[str, ...], interval: float, count: int | None,
        address: str | None, token_file: str | None, tls_ca: str | None, max_partitions: int,
        out: Output) -> None:
    """A live view of QUEUES (default: every queue), refreshed every second: queues, partitions
    (depth, status, owning flow), flows (process, unacked, ack rate) and replication, with
    publish and ack rates between refreshes; dead messages by reason, partitions waiting out a
    nack's delay and publishes the quota refused or discarded, of the queues that have any.
    Press q to quit.

    It only reads: it runs in any process beside the broker's, as any user who may read the
    directory (--read-only), or against `partq serve --listen` with --address. With --json it
    prints one JSON object per refresh (JSON Lines) instead.
    """
    stop = threading.Event()
    for sig in (signal.SIGTERM,):
        signal.signal(sig, lambda *_: stop.set())     # handlers only set flags
    with _source(app, address or app.address, token_file or app.token_file, tls_ca or app.tls_ca,
                 list(queues)) as take:
        if out.json:
            _print_json(take, out, interval, count, stop)
        else:
            _live(take, interval, count, max_partitions, stop)


def _print_json(take, out: Output, interval: float, count: int | None,
                stop: threading.Event) -> None:
    before, n = None, 0
    while not stop.is_set():
        snap = take()
        out.line(as_doc(snap, rates(before, snap)))
        sys.stdout.flush()
        before, n = snap, n + 1
        if count is not None and n >= count:
            return
        stop.wait(interval)


def _live(take, interval: float, count: int | None, max_partitions: int,
          stop: threading.Event) -> None:
    from rich.console import Console
    from rich.live import Live

    from partq.tools.top_view import render
    console = Console()
    before, n = None, 0
    try:
        with Keys(stop) as keys, Live(console=console, screen=console.is_terminal,
                                      auto_refresh=False, redirect_stdout=False) as live:
            while True:
                snap = take()
                live.update(render(snap, rates(before, snap), interval, max_partitions),
                            refresh=True)
                before, n = snap, n + 1
                if (count is not None and n >= count) or keys.wait(interval):
                    return
    except KeyboardInterrupt:
        return
