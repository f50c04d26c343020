"""Output for every command: ``--json`` (one shared decorator), aligned tables, safe payloads.

The rule of ``--json`` (docs/cli.md says it to users): a command prints exactly one JSON object
on stdout, or, when it streams (``inspect``, ``consume``, ``scale``, ``standby``), JSON Lines: one
object per line per item, and nothing else. Keys are the library's names (``max_delivered_
unacked_per_flow``, not ``--max-unacked``); ``partitions`` is always the operating partition
count (0 for an exclusive queue), and a queue's config adds ``configured_partitions``, the count
it has once non-exclusive. Errors stay one "Error: ..." line on stderr. Human output goes to
stdout as aligned columns; progress bars and warnings go to stderr, so stdout stays clean for
pipes.
"""
from __future__ import annotations

import base64
import binascii
import contextlib
import functools
import json
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime

import click

from partq.ops.formatting import jsonable

PAYLOAD_MODES = ("auto", "text", "hex", "base64")


def dumps(doc) -> str:
    return json.dumps(doc, default=jsonable)


def config_doc(config) -> dict:
    """A queue's ``QueueConfig`` as ``--json`` prints it: its fields, with ``partitions`` the
    operating count (0 while the queue is exclusive) and ``configured_partitions`` the count it
    keeps for when it is non-exclusive."""
    return {**config.to_dict(), "partitions": config.operating_partitions,
            "configured_partitions": config.partitions}


class Output:
    """What a command prints, in human or JSON form. Given to commands by ``output_options``."""

    def __init__(self, as_json: bool, err: bool = False) -> None:
        self.json = as_json
        self.err = err          # report on stderr: stdout carries a command's data

    def to_stderr(self) -> Output:
        """The same output on stderr (for a command that writes its data to stdout)."""
        return Output(self.json, err=True)

    # machine --------------------------------------------------------------
    def doc(self, doc) -> None:
        """The command's one JSON document (or one JSON Lines record)."""
        click.echo(dumps(doc), err=self.err)

    line = doc  # a JSON Lines record: same text, one per call

    # human ----------------------------------------------------------------
    def echo(self, text: str = "") -> None:
        if not self.json:
            click.echo(text, err=self.err)

    def table(self, headers: Sequence[str], rows: Iterable[Sequence], indent: str = "") -> None:
        if not self.json:
            for line in format_table(headers, rows):
                click.echo(indent + line, err=self.err)

    @staticmethod
    def warn(text: str) -> None:
        click.echo(f"Warning: {text}", err=True)

    # progress -------------------------------------------------------------
    @property
    def show_progress(self) -> bool:
        """Progress bars only for a person watching a terminal, never with ``--json``."""
        return not self.json and _isatty(sys.stderr)

    def progress(self, length: int, label: str):
        """A click progress bar on stderr (hidden with --json or when stderr is not a terminal)."""
        return click.progressbar(length=max(int(length), 0), label=label,
                                 file=sys.stderr,
                                 hidden=not self.show_progress, show_pos=True)

    @contextlib.contextmanager
    def progress_callback(self, label: str) -> Iterator[Callable[[int, int], None]]:
        """A ``progress(n, total)`` for the library (``partq.ops.copy_out``, ``partq.ops.verify``): the
        bar of ``progress`` opens at the first call, with ``total``, and advances by each
        ``n``; it is closed when the block ends."""
        bars: list = []

        def advance(n: int, total: int) -> None:
            if not bars:
                bars.append(self.progress(total, label).__enter__())
                if not n:
                    return      # the opening call: the bar shows itself when entered
            bars[0].update(n)
        try:
            yield advance
        finally:
            if bars:
                bars[0].__exit__(None, None, None)


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def output_options(func):
    """The shared output options of every command (``--json``); passes ``out: Output``."""
    @click.option("--json", "as_json", is_flag=True,
                  help="Machine output: one JSON object; a command that streams prints one "
                       "per line (JSON Lines).")
    @functools.wraps(func)
    def wrapper(*args, as_json: bool, **kwargs):
        return func(*args, out=Output(as_json), **kwargs)
    return wrapper


def format_table(headers: Sequence[str], rows: Iterable[Sequence]) -> list[str]:
    """Aligned columns; numeric columns are right-aligned. ``None`` shows as ``-``."""
    raw_rows = [[_cell(v) for v in row] for row in rows]
    headers = [str(h) for h in headers]
    widths = [len(h) for h in headers]
    for row in raw_rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    numeric = [any(row[i] != "-" for row in raw_rows) and all(_is_number(row[i]) for row in raw_rows)
               for i in range(len(headers))]

    def fmt(cells):
        out = []
        for i, cell in enumerate(cells):
            last = i == len(cells) - 1
            if numeric[i]:
                out.append(cell.rjust(widths[i]))
            else:
                out.append(cell if last else cell.ljust(widths[i]))
        return "  ".join(out).rstrip()
    return [fmt(headers)] + [fmt(row) for row in raw_rows]


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _is_number(cell: str) -> bool:
    if cell == "-":
        return True
    try:
        float(cell)
    except ValueError:
        return False
    return True


def on_off(value: bool) -> str:
    return "on" if value else "off"


def iso_time(ns: int | None) -> str | None:
    """Nanoseconds since the epoch as ISO 8601 UTC with milliseconds."""
    if ns is None:
        return None
    try:
        t = datetime.fromtimestamp(ns / 1e9, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return str(ns)
    return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def human_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def printable(text: str) -> str:
    """Text safe for a terminal: control characters (ESC, newlines, ...) shown as escapes."""
    if text.isprintable():
        return text
    out = []
    for ch in text:
        if ch.isprintable():
            out.append(ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        else:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000
                       else f"\\U{code:08x}")
    return "".join(out)


def truncate(text: str, width: int) -> str:
    """At most ``width`` characters (0: no limit), marking a cut with "…"."""
    if width <= 0 or len(text) <= width:
        return text
    return text[: max(width - 1, 0)] + "…"


def _readable_text(payload: bytes) -> str | None:
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if all(ch.isprintable() or ch in "\t\n\r" for ch in text):
        return text
    return None


def encode_payload(payload: bytes, mode: str, machine: bool) -> tuple[str, str]:
    """``(encoding, text)`` of a payload for display. ``auto``: UTF-8 text when it decodes and is
    printable, else hex for people and base64 for machines."""
    if mode == "auto":
        text = _readable_text(payload)
        if text is not None:
            return "text", text
        mode = "base64" if machine else "hex"
    if mode == "text":
        return "text", payload.decode("utf-8", errors="backslashreplace")
    if mode == "hex":
        return "hex", binascii.hexlify(payload).decode("ascii")
    return "base64", base64.b64encode(payload).decode("ascii")
