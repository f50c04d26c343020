"""``partq serve``: run delivery and publishing of a directory for other processes and hosts."""
from __future__ import annotations

import logging
import signal
import sys
import threading
import time

import click

from partq.remote.server import Server
from partq.tools.common import App, Seconds, pass_app
from partq.tools.listening import configure_logging, log_options, tls_context
from partq.tools.output import Output, output_options
from partq.wire.handshake import read_token
from partq.wire.listener import Limits


@click.command()
@click.option("--listen", metavar="HOST:PORT",
              help="Serve clients of other hosts on this TCP address (nothing listens without "
                   "it; without --token-file only loopback clients are let in).")
@click.option("--token-file", type=click.Path(dir_okay=False),
              help="A file whose first line is the shared token clients must prove.")
@click.option("--tls-cert", type=click.Path(dir_okay=False), help="PEM certificate for TLS.")
@click.option("--tls-key", type=click.Path(dir_okay=False), help="PEM private key for TLS.")
@click.option("--max-connections", type=click.IntRange(1, 100_000), default=256,
              show_default=True, help="Connections served at once; more are refused.")
@click.option("--idle-timeout", type=Seconds(0.1), default=60.0, show_default=True,
              help="Seconds a connection may send nothing (a client with flows beats more "
                   "often: its queues' consumer timeout applies).")
@click.option("--max-frame", type=click.IntRange(1024), default=16 << 20, show_default=True,
              help="Largest frame, in bytes, a client may send.")
@click.option("--metrics-listen", metavar="HOST:PORT",
              help="Serve Prometheus metrics over HTTP on this address (GET /metrics; an empty "
                   "HOST is 127.0.0.1; see docs/operations.md).")
@click.option("--console-listen", metavar="HOST:PORT",
              help="Serve the web console on this address too (`partq console`; --token-file "
                   "and --tls-* apply to it as to --listen: other hosts need both).")
@click.option("--console-allow-actions", is_flag=True,
              help="Let the console change things (requeue, kill, ack, pause, scale), each "
                   "confirmed and logged.")
@click.option("--replication-listen", metavar="HOST:PORT",
              help="Serve DR-standbys on this TCP address (`partq standby --primary`); "
                   "without --replication-token-file only loopback standbys are let in.")
@click.option("--replication-mode", type=click.Choice(["async", "sync"]), default="async",
              show_default=True,
              help="sync: a publish returns once a DR-standby has it (the first commit waits "
                   "for a standby to connect).")
@click.option("--replication-token-file", type=click.Path(dir_okay=False),
              help="A file whose first line is the token standbys and this primary prove to "
                   "each other.")
@click.option("--replication-tls-cert", type=click.Path(dir_okay=False),
              help="PEM certificate for TLS to standbys.")
@click.option("--replication-tls-key", type=click.Path(dir_okay=False),
              help="PEM private key of --replication-tls-cert.")
@log_options
@output_options
@pass_app
def serve(app: App, listen: str | None, token_file: str | None, tls_cert: str | None,
          tls_key: str | None, max_connections: int, idle_timeout: float, max_frame: int,
          metrics_listen: str | None, console_listen: str | None,
          console_allow_actions: bool, replication_listen: str | None, replication_mode: str,
          replication_token_file: str | None, replication_tls_cert: str | None,
          replication_tls_key: str | None, log_level: str, log_format: str,
          out: Output) -> None:
    """Run delivery (and, with --listen, publishing) of every queue in --data DIR until
    SIGTERM or Ctrl-C.

    Consumers in other processes of this host follow it over its Unix sockets; clients on other
    hosts reach it with partq.connect("HOST:PORT", token=...). It logs one line per connection,
    bind, disconnect and rebalance on stderr.

    With --replication-listen it is also a DR primary: standbys started with `partq standby
    --primary HOST:PORT` (same token, and --tls/--tls-ca when TLS is on) follow it.
    """
    configure_logging(log_level, log_format)
    token = read_token(token_file=token_file) if token_file else None
    context = tls_context(tls_cert, tls_key)
    if listen is None and console_listen is None and (token or context):
        raise click.UsageError("--token-file and --tls-* apply to --listen and --console-listen")
    if console_allow_actions and console_listen is None:
        raise click.UsageError("--console-allow-actions applies to --console-listen")
    replication: dict = {}
    if replication_listen is not None:
        replication = {"replication_listen": replication_listen,
                       "replication_mode": replication_mode,
                       "replication_token_file": replication_token_file,
                       "replication_ssl": tls_context(replication_tls_cert, replication_tls_key)}
    elif replication_token_file or replication_tls_cert or replication_tls_key:
        raise click.UsageError("--replication-token-file and --replication-tls-* apply to "
                               "--replication-listen")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())     # handlers only set flags
    limits = Limits(max_frame=max_frame, idle_timeout=idle_timeout,
                    max_connections=max_connections)
    with app.broker(create=True, **replication) as broker:
        server = None
        if listen is not None:
            server = Server(broker, listen, token=token, ssl_context=context, limits=limits)
        else:
            for config in broker.queues():
                broker.dispatcher.take_over(config.name)
        metrics = None
        if metrics_listen is not None:
            from partq.metrics import MetricsServer
            listener = server.listener if server is not None else None
            try:
                metrics = MetricsServer(broker, metrics_listen, connections=None if listener is None
                                        else lambda: {"serve": listener.connections()})
            except BaseException:
                if server is not None:
                    server.close()
                raise
        console = None
        if console_listen is not None:
            from partq.console import ConsoleServer
            try:
                console = ConsoleServer(broker, console_listen, token=token, ssl_context=context,
                                        allow_actions=console_allow_actions)
            except BaseException:
                for other in (metrics, server):
                    if other is not None:
                        other.close()
                raise
        started = {"serving": app.path, "listen": server.address if server else None,
                   "tls": context is not None, "token": token is not None,
                   "metrics": metrics.address if metrics else None,
                   "console": console.url if console else None,
                   "replication": broker.replication_address if replication else None,
                   "queues": [c.name for c in broker.queues()]}
        if out.json:
            out.doc(started)
        else:
            out.echo(f"serving {app.path}" + (f" on {server.address}" if server else "")
                     + (" with TLS" if context else "")
                     + (f", metrics on http://{metrics.address}/metrics" if metrics else "")
                     + (f", console on {console.url}" if console else "")
                     + (f", DR-standbys on {broker.replication_address}" if replication else "")
                     + "; stop with Ctrl-C or SIGTERM")
        sys.stdout.flush()
        while not stop.wait(0.5):
            pass
        if console is not None:
            console.close()
        if metrics is not None:
            metrics.close()
        if server is not None:
            server.close()
    logging.getLogger("partq.server").info("stopped at %s", time.strftime("%H:%M:%S"))
