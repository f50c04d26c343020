"""What every command shares: the store it works on, user errors, confirmations.

Errors: a command raises ``UserError`` (or lets a ``partq.PartqError`` / ``OSError`` through);
``cli.PartqGroup`` turns each into exactly one "Error: ..." line on stderr and exit status 1.
"""
from __future__ import annotations

import contextlib
import errno
import os
import sys
from collections.abc import Iterator

import click

from partq import Broker, PartqError
from partq.errors import describe_os_error
from partq.notation import one_line
from partq.storage import Store

STORE_FILE = "data.mdb"


class UserError(click.ClickException):
    """One line, exit status 1. The message says what to do."""

    exit_code = 1

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))


def translate(exc: BaseException) -> UserError | None:
    """The one place library and OS errors become CLI errors (None: not ours, let it through)."""
    if isinstance(exc, PartqError):
        return UserError(str(exc))
    if isinstance(exc, OSError) and exc.errno != errno.EPIPE:
        return UserError(describe_os_error(exc))
    try:
        import lmdb
    except ImportError:  # pragma: no cover
        return None
    if isinstance(exc, lmdb.Error):
        return UserError(f"LMDB: {exc}; run `partq verify` and restore from a backup if it fails")
    return None


class App:
    """The ``--data`` directory a command works on. Commands open it only as deeply as needed:
    ``store()`` for read-only snapshots (inspect, verify), ``broker()`` for queue operations.
    Neither binds a flow: a CLI process never takes a queue's delivery from its owner."""

    def __init__(self, data: str) -> None:
        self.data = data

    @property
    def path(self) -> str:
        return os.path.abspath(self.data)

    def _require_store(self) -> None:
        # Store.open(create=False) refuses a missing directory but would create a store in an
        # existing empty one; a command other than init must not do that.
        path = self.data
        if os.path.isdir(path) and not os.path.exists(os.path.join(path, STORE_FILE)):
            raise UserError(f"{path} holds no partq store; create one with `partq --data {path} "
                            f"init`, or pass --data (or PARTQ_DATA) pointing at a store")

    @contextlib.contextmanager
    def broker(self, create: bool = False) -> Iterator[Broker]:
        if not create:
            self._require_store()
        broker = Broker.open(self.data, create=create)
        try:
            yield broker
        finally:
            broker.close()

    @contextlib.contextmanager
    def store(self) -> Iterator[Store]:
        """The directory's storage only: read snapshots, no broker threads, no scaling repair."""
        self._require_store()
        store = Store.open(self.data, create=False)
        try:
            yield store
        finally:
            store.close()


pass_app = click.make_pass_decorator(App)

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
