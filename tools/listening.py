"""What the commands that listen share (``partq serve``, ``partq console``): their log lines
on stderr, and a TLS server context from a certificate and key."""
from __future__ import annotations

import json
import logging
import ssl
import sys

import click

from partq.tools.common import UserError

LOG_FORMATS = ("text", "json")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {"time": round(record.created, 3), "level": record.levelname.lower(),
               "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc)


def configure_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(
        "%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("partq")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def tls_context(cert: str | None, key: str | None) -> ssl.SSLContext | None:
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise click.UsageError("pass both --tls-cert and --tls-key, or neither")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise UserError(f"cannot load the TLS certificate {cert} and key {key}: {exc}") from None
    return context


def log_options(command):
    """``--log-level`` and ``--log-format``, as every long-running command has them."""
    command = click.option("--log-format", type=click.Choice(LOG_FORMATS), default="text",
                           show_default=True,
                           help="Log lines as text or as one JSON object each (on stderr).")(command)
    return click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]),
                        default="info", show_default=True,
                        help="Least severe log lines written.")(command)
