"""What every command shares: the store it works on, user errors, confirmations.

Errors: a command raises ``UserError`` (or lets a ``partq.PartqError`` / ``OSError`` through);
``cli.PartqGroup`` turns each into exactly one "Error: ..." line on stderr and exit status 1.
"""
from __future__ import annotations

import contextlib
import errno
import math
import os
import re
import signal
import sys
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

import click

from partq.clock import MAX_SECONDS
from partq.errors import InvalidConfig, InvalidMessage, PartqError, describe_os_error
from partq.ops.formatting import one_line
from partq.ops.write_access import READ_ONLY_ENV, read_only_reason
from partq.tools.queue_settings import SETTINGS

if TYPE_CHECKING:
    from partq.broker import Broker
    from partq.remote.client import Client
    from partq.storage import Store

STORE_FILE = "data.mdb"


class UserError(click.ClickException):
    """One line, exit status 1. The message says what to do."""

    exit_code = 1

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))


class BadOptionValue(UserError):
    """An option's value the library refused (``--partitions -3``): a usage error, exit status
    2, as for a value click's own checks refuse (``--max -1``): one rule for bad numbers."""

    exit_code = 2


def bad_option_value(condition: bool, message: str) -> None:
    """``require`` for an option's value on its own ("--x must ..."): exit status 2."""
    if not condition:
        raise BadOptionValue(message)


class Seconds(click.ParamType):
    """A number of seconds (every float option takes one): from ``low`` to ``high``, else a
    usage error naming the option. Click's FloatRange lets NaN through every bound, and a NaN
    timeout never runs out (``consume --timeout nan`` waited for ever); infinity, and a wait
    past ten years, would overflow the waits."""

    name = "seconds"

    def __init__(self, low: float = 0.0, high: float = MAX_SECONDS) -> None:
        self.low, self.high = low, high

    def convert(self, value, param, ctx) -> float:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            seconds = math.nan
        if self.low <= seconds <= self.high:       # (False for NaN)
            return seconds
        option = param.opts[0] if param is not None and param.opts else "the value"
        raise BadOptionValue(f"{option} must be a number of seconds from {self.low:g} to "
                             f"{self.high:g}, not {value}")


def translate(exc: BaseException) -> UserError | None:
    """The one place library and OS errors become CLI errors (None: not ours, let it through).
    A queue setting named in an ``InvalidConfig`` or ``InvalidMessage`` is given as the option
    that sets it (``max_delivered_unacked_per_flow`` becomes ``--max-unacked``); an
    ``InvalidConfig`` about one option's value ("--x must be ...") exits 2, as usage errors do."""
    if isinstance(exc, (InvalidConfig, InvalidMessage)):
        message = option_names(str(exc))
        if isinstance(exc, InvalidConfig) and re.match(r"--[\w-]+ must ", message):
            return BadOptionValue(message)
        return UserError(message)
    if isinstance(exc, PartqError):
        return UserError(str(exc))
    if isinstance(exc, OSError) and exc.errno != errno.EPIPE:
        # a full disk or a refusing device (/dev/full) while printing: name the act
        doing = "cannot write" if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EIO) else None
        return UserError(describe_os_error(exc, doing))
    return None     # (the storage layer turns every lmdb exception into a PartqError)


def _field_patterns() -> list[tuple[re.Pattern, str]]:
    pairs = [(field, opt.split("/")[0]) for opt, field, _, _ in SETTINGS]
    pairs.append(("partitions", "--partitions"))
    out = []
    for field, opt in sorted(pairs, key=lambda p: -len(p[0])):
        # a one-word field ("partitions") only where it starts the sentence about it
        where = rf"(?<![\w-]){field}(?![\w-])" if "_" in field else rf"^{field}(?= must\b)"
        out.append((re.compile(where), opt))
    return out


_PATTERNS: list[tuple[re.Pattern, str]] = []


def option_names(message: str) -> str:
    """``message`` with the queue settings it names (config field names) written as the
    command-line options that set them."""
    if not _PATTERNS:
        _PATTERNS.extend(_field_patterns())
    for pattern, opt in _PATTERNS:
        message = pattern.sub(opt, message)
    return message


class App:
    """The ``--data`` directory a command works on. Commands open it only as deeply as needed:
    ``store()`` for snapshots (inspect, verify), ``reading()`` for status (queue list|show,
    stats), ``broker()`` for queue operations. Only ``consume`` binds a flow (served by the
    queue's delivery owner when another process runs it).

    ``store()`` and ``reading()`` open the directory read-only (``partq.ops.read_only``: no LMDB
    reader lock, every read checked) when ``read_only`` is set (``--read-only``) or this user
    may not write it."""

    def __init__(self, data: str = "partq-data", read_only: bool = False) -> None:
        self.data = data
        self.read_only = read_only
        self.address: str | None = None         # --address: through partq serve instead
        self.token_file: str | None = None
        self.tls_ca: str | None = None

    @property
    def path(self) -> str:
        return os.path.abspath(self.data)

    @property
    def where(self) -> str:
        """What the command works on, as it tells the user: the directory, or the server."""
        return f"partq serve at {self.address}" if self.address else self.path

    @contextlib.contextmanager
    def client(self) -> Iterator[Client]:
        """A ``partq.connect`` client of ``--address``, with ``--token-file`` and ``--tls-ca``:
        it has the Broker's verbs the commands use (``partq.remote.client_admin``)."""
        assert self.address is not None
        import ssl

        from partq.remote.client import connect
        context = ssl.create_default_context(cafile=self.tls_ca) if self.tls_ca else None
        client = connect(self.address, token_file=self.token_file, ssl=context)
        try:
            yield client
        finally:
            client.close()

    def _local_only(self, network: bool) -> None:
        """Refuse, in one line, a command that works on the directory only (``network``
        False) run with ``--address``; and --token-file or --tls-ca without --address."""
        if self.address is None:
            if self.token_file or self.tls_ca:
                raise click.UsageError("--token-file and --tls-ca apply to --address")
            return
        if not network:
            ctx = click.get_current_context(silent=True)
            command = ctx.command_path if ctx is not None else "this command"
            raise UserError(f"`{command}` works on a store directory (--data DIR), not over "
                            f"--address: run it on the host of the store")

    def _require_store(self) -> None:
        # Store.open(create=False) refuses a missing directory but would create a store in an
        # existing empty one; a command other than init must not do that.
        path = self.data
        if os.path.isdir(path) and not os.path.exists(os.path.join(path, STORE_FILE)):
            raise UserError(f"{path} holds no partq store; create one with `partq --data {path} "
                            f"init`, or pass --data (or PARTQ_DATA) pointing at a store")

    @contextlib.contextmanager
    def broker(self, create: bool = False, network: bool = False,
               **options) -> Iterator[Broker]:
        """The Broker of a command that writes (or binds): refused at once, with the reason,
        where this user may not write the directory. ``options`` go to ``Broker.open``. With
        ``--address``, the ``client()`` for a command that works over the network
        (``network``), else refused in one line."""
        self._local_only(network)
        if self.address is not None:
            with self.client() as client:
                yield client        # type: ignore[misc]    # Broker's verbs (client_admin)
            return
        if not create:
            self._require_store()
        reason = read_only_reason(self.data)
        if reason is not None:
            fix = (f"unset {READ_ONLY_ENV} to run it" if reason.startswith("$") else
                   f"run it as a user who may write {self.path} (queue list, queue show, stats, "
                   f"inspect and verify only read, and work without)")
            raise UserError(f"{reason}, and this command writes to the store; {fix}")
        from partq.broker import Broker
        broker = Broker.open(self.data, create=create, **options)
        try:
            yield broker
        finally:
            broker.close()

    def read_only_reason(self) -> str | None:
        """Why reads must not write the directory (None: they may)."""
        if self.read_only:
            return "--read-only"
        return read_only_reason(self.data)

    @contextlib.contextmanager
    def store(self) -> Iterator[Store]:
        """The directory's storage only: read snapshots, no broker threads, no scaling repair
        (read-only, without a reader lock, when ``read_only_reason`` says so). Not over
        ``--address`` (refused in one line)."""
        self._local_only(False)
        self._require_store()
        reason = self.read_only_reason()
        if reason is not None:
            from partq.ops.read_only import open_store_read_only
            _say_read_only(self.data, reason)
            store = open_store_read_only(self.data, reason)
        else:
            from partq.storage.store import Store
            store = Store.open(self.data, create=False)
        try:
            yield store
        finally:
            store.close()

    @contextlib.contextmanager
    def reading(self, network: bool = False) -> Iterator[Broker]:
        """A Broker for reading configs and statuses: ``broker()``, or a read-only one when
        ``read_only_reason`` says so; over ``--address`` as ``broker()``."""
        self._local_only(network)
        if self.address is not None:
            with self.broker(network=network) as client:
                yield client
            return
        reason = self.read_only_reason()
        if reason is None:
            with self.broker() as broker:
                yield broker
            return
        from partq.ops.read_only import open_read_only
        self._require_store()
        _say_read_only(self.data, reason)
        broker = open_read_only(self.data, reason)
        try:
            yield broker
        finally:
            broker.close()


pass_app = click.make_pass_decorator(App)

READ_ONLY_HELP = ("Read without writing to the store directory, as a user who may not write it "
                  "does anyway (also from $" + READ_ONLY_ENV + "=1): no LMDB reader lock, so a "
                  "writer in another process may reuse pages this reads; each read is checked "
                  "and retried, or the command stops with an error, never showing a torn read.")


def _say_read_only(path: str, reason: str) -> None:
    if reason != "--read-only":
        click.echo(f"Warning: reading {os.path.abspath(path)} read-only ({reason}): without a "
                   f"reader lock, see --read-only in the help", err=True)


def read_only_option(func):
    """``--read-only`` for the commands that only read (sets ``App.read_only``)."""
    def set_read_only(ctx: click.Context, param, value: bool) -> None:
        if value:
            ctx.ensure_object(App).read_only = True
    return click.option("--read-only", is_flag=True, expose_value=False, envvar=READ_ONLY_ENV,
                        callback=set_read_only, help=READ_ONLY_HELP)(func)

def interactive() -> bool:
    """A person can answer a question: stdin is a terminal."""
    try:
        return sys.stdin.isatty()
    except (AttributeError, ValueError):
        return False


def confirm(yes: bool, question: str, flag_hint: str) -> None:
    """Ask before a destructive action. Without a terminal to ask on (a script, a pipe), refuse
    with ``flag_hint`` rather than guess."""
    if yes:
        return
    if not interactive():
        raise UserError(f"not confirmed (no terminal to ask on); {flag_hint}")
    try:
        answer = click.confirm(question, default=False, err=True)
    except click.Abort:
        raise UserError(f"not confirmed; {flag_hint}") from None
    if not answer:
        raise UserError("cancelled; nothing was changed")


def require(condition: bool, message: str) -> None:
    if not condition:
        raise UserError(message)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[threading.Event]:
    """SIGINT, SIGTERM and SIGHUP (a closed terminal) set a flag that long work checks between
    its steps, so it stops where it can resume (handlers only set flags). Outside the main
    thread, where Python cannot set handlers, the flag is never set."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in STOP_SIGNALS}
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
