"""``partq console``: the web console of a directory (``partq.console``), until SIGTERM or
Ctrl-C. ``partq serve --console-listen`` serves the same console from the serving process."""
from __future__ import annotations

import contextlib
import signal
import sys
import threading

import click

from partq.tools.common import App, Seconds, pass_app, read_only_option
from partq.tools.listening import configure_logging, log_options, tls_context
from partq.tools.output import Output, output_options

DEFAULT_LISTEN = "127.0.0.1:7180"


@click.command()
@click.option("--listen", metavar="HOST:PORT", default=DEFAULT_LISTEN, show_default=True,
              help="Serve the console on this TCP address (an empty HOST is 127.0.0.1; port 0 "
                   "picks a free one). Other hosts are served only with --token-file and TLS.")
@click.option("--token-file", type=click.Path(dir_okay=False),
              help="A file whose first line is the token the page must send (it asks for it).")
@click.option("--tls-cert", type=click.Path(dir_okay=False), help="PEM certificate for HTTPS.")
@click.option("--tls-key", type=click.Path(dir_okay=False), help="PEM private key for HTTPS.")
@click.option("--allow-actions", is_flag=True,
              help="Let the page change things: requeue, kill or ack messages, pause ingress or "
                   "egress, scale (each asks for confirmation and is logged). Off: it only "
                   "reads.")
@click.option("--max-connections", type=click.IntRange(1, 10_000), default=32, show_default=True,
              help="Connections served at once; a new one cuts off the oldest.")
@click.option("--timeout", type=Seconds(0.1), default=10.0, show_default=True,
              help="Seconds a connection has for its whole request and answer.")
@log_options
@read_only_option
@output_options
@pass_app
def console(app: App, listen: str, token_file: str | None, tls_cert: str | None,
            tls_key: str | None, allow_actions: bool, max_connections: int, timeout: float,
            log_level: str, log_format: str, out: Output) -> None:
    """Serve a web console of --data DIR on --listen until SIGTERM or Ctrl-C: every queue with
    its depth, bytes, rates (a chart of the last minutes) and dead messages; a queue's
    partitions, flows, what blocks a partition and the rebalance dry-run; its messages.

    Open the address it prints in a browser; the page updates itself. It only reads unless
    --allow-actions. Without --token-file only loopback peers are served; other hosts need the
    token and TLS (--tls-cert, --tls-key), and every action is logged on stderr.
    """
    configure_logging(log_level, log_format)
    from partq.console import ConsoleServer
    from partq.wire.handshake import read_token
    token = read_token(token_file=token_file) if token_file else None
    context = tls_context(tls_cert, tls_key)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())     # handlers only set flags
    opened = app.broker() if allow_actions else app.reading()
    with opened as broker, contextlib.closing(ConsoleServer(
            broker, listen, token=token, ssl_context=context, allow_actions=allow_actions,
            max_connections=max_connections, timeout=timeout)) as server:
        if out.json:
            out.doc({"console": server.url, "address": server.address,
                     "actions": allow_actions, "token": token is not None,
                     "tls": context is not None})
        else:
            out.echo(f"console of {app.path} on {server.url}"
                     + (" (actions allowed)" if allow_actions else "")
                     + "; stop with Ctrl-C or SIGTERM")
        sys.stdout.flush()
        while not stop.wait(0.5):
            pass
