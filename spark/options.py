"""The options of the "partq" Spark data source, checked once on the driver for each direction.

Spark passes options case-insensitively (a ``CaseInsensitiveDict``); the names below are the
documented spellings. Every direction refuses options it does not know, so a typo fails the
query instead of being ignored. The full table is in docs/spark.md.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from partq.errors import InvalidConfig

COMMON = ("path", "queue", "address", "token", "tokenFile", "tls", "tlsCaFile", "tlsCertFile",
          "tlsKeyFile")
WRITE = ("keyColumn", "payloadColumn", "batchSize", "partitions")
READ = ("parent", "splitRows")
STREAM = ("consumer", "maxMessagesPerTrigger", "failOnDataLoss", "splitRows")


@dataclass(frozen=True)
class Where:
    """Where the queue is: a directory on this host (``path``), or ``partq serve`` at
    ``address`` (rule `spark-remote`) with its token. Plain values: pickled to every task."""
    queue: str
    path: str | None = None
    address: str | None = None
    token: bytes | None = None
    tls: bool = False                 # TLS to partq serve (an SSLContext is made in each task:
    tls_ca_file: str | None = None    # contexts do not pickle); the CA to trust (default: the
    tls_cert_file: str | None = None  # system's), and a client certificate if the server asks
    tls_key_file: str | None = None

    def describe(self) -> str:
        return f"partq serve at {self.address}" if self.address else str(self.path)

    def ssl_context(self):
        """The client TLS context of this address, or None without TLS."""
        if not self.tls:
            return None
        import ssl
        try:
            context = ssl.create_default_context(cafile=self.tls_ca_file)
            if self.tls_cert_file:
                context.load_cert_chain(self.tls_cert_file, self.tls_key_file)
        except (OSError, ssl.SSLError) as exc:
            raise InvalidConfig(f"the TLS options of the partq data source cannot be used: "
                                f"{exc}; check tlsCaFile, tlsCertFile and tlsKeyFile") from None
        return context


def check_known(options, known: tuple[str, ...], direction: str) -> None:
    names = (*COMMON, *known)
    lowered = {n.lower() for n in names}
    unknown = sorted(k for k in options if k.lower() not in lowered)
    if unknown:
        raise InvalidConfig(f"unknown option(s) {', '.join(unknown)} for {direction} with the partq "
                            f"data source; known: {', '.join(names)}")


def where(options) -> Where:
    """The common options: ``queue`` and either ``path`` or ``address`` (with ``token`` or
    ``tokenFile``)."""
    queue, path, address = options.get("queue"), options.get("path"), options.get("address")
    if not queue:
        raise InvalidConfig("option queue is missing: .option('queue', 'name-of-queue')")
    if path and address:
        raise InvalidConfig("pass either option path (a directory on this host) or address "
                            "(partq serve), not both")
    tls_files = {name: options.get(name) for name in ("tlsCaFile", "tlsCertFile", "tlsKeyFile")}
    if address:
        from partq.wire.handshake import read_token
        token = read_token(options.get("token"), options.get("tokenFile"))
        tls = bool_option(options, "tls", any(tls_files.values()))
        if not tls and any(tls_files.values()):
            raise InvalidConfig("options tlsCaFile, tlsCertFile and tlsKeyFile need tls true")
        if bool(tls_files["tlsCertFile"]) != bool(tls_files["tlsKeyFile"]):
            raise InvalidConfig("pass both tlsCertFile and tlsKeyFile, or neither")
        found = Where(queue=queue, address=address, token=token, tls=tls,
                      tls_ca_file=tls_files["tlsCaFile"], tls_cert_file=tls_files["tlsCertFile"],
                      tls_key_file=tls_files["tlsKeyFile"])
        found.ssl_context()        # a wrong file fails here, on the driver, with one line
        return found
    if options.get("token") or options.get("tokenFile"):
        raise InvalidConfig("option token goes with option address (partq serve); a directory "
                            "given by path needs none")
    if options.get("tls") or any(tls_files.values()):
        raise InvalidConfig("options tls, tlsCaFile, tlsCertFile and tlsKeyFile go with option "
                            "address (partq serve); a directory given by path needs none")
    if not path:
        raise InvalidConfig("option path is missing: .option('path', '/dir/of/partq/store'), or "
                            ".option('address', 'HOST:PORT') to go through partq serve")
    return Where(queue=queue, path=os.path.abspath(path))


def int_option(options, name: str, default: int | None) -> int | None:
    raw = options.get(name)
    if raw is None:
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        value = 0
    if value < 1:
        raise InvalidConfig(f"option {name} must be a positive integer, not {raw!r}")
    return value


def bool_option(options, name: str, default: bool) -> bool:
    raw = options.get(name)
    if raw is None:
        return default
    text = str(raw).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise InvalidConfig(f"option {name} must be true or false, not {raw!r}")
