"""``partq inspect``: browse a queue's messages without consuming them (``partq.ops.browse``).

It never binds a flow, so it changes no delivery state and works while other processes publish,
consume or own delivery. A record that fails its checksum is shown as corrupt with the reason.

A queue's logs are its partitions and, once it has been exclusive (non-partitioned), its parent
queue's log: storage partition ``partq.PARENT`` (4294967295). People see that log as partition
``parent``; ``--json`` keeps the integer.
"""
from __future__ import annotations

import shutil

import click

from partq.ops.browse import check_browse
from partq.ops.formatting import partition_label
from partq.storage.encoding import PARENT
from partq.tools import store_ops
from partq.tools.common import App, pass_app, read_only_option, require
from partq.tools.output import (
    PAYLOAD_MODES,
    Output,
    encode_payload,
    format_table,
    iso_time,
    output_options,
    printable,
    truncate,
)

HEADERS = ["PARTITION", "SEQ", "KEY", "PUBLISHED", "SIZE", "ACKED", "PAYLOAD"]


@click.command()
@click.argument("queue")
@click.option("--partition", "-p", type=int, help="Only this partition [default: all logs].")
@click.option("--parent", is_flag=True,
              help="Only the parent queue's log: the messages of an exclusive queue, or those a "
                   "change to non-exclusive left behind.")
@click.option("--from-seq", type=int, default=0, show_default=True, help="First sequence to show.")
@click.option("--to-seq", type=int, help="Last sequence to show [default: the newest].")
@click.option("--key", "-k", help="Only messages with this key.")
@click.option("--limit", "-n", type=int, default=100, show_default=True,
              help="At most this many messages (0: no limit), in partition order.")
@click.option("--payload", "payload_mode", type=click.Choice(PAYLOAD_MODES), default="auto",
              show_default=True,
              help="auto: UTF-8 text when printable, else hex (base64 with --json).")
@click.option("--width", type=int, default=None,
              help="Truncate payloads to this many characters (0: never) [default: fit the "
                   "terminal; never with --json].")
@read_only_option
@output_options
@pass_app
def inspect(app: App, queue: str, partition: int | None, parent: bool, from_seq: int,
            to_seq: int | None, key: str | None, limit: int, payload_mode: str,
            width: int | None, out: Output) -> None:
    """Browse the messages of QUEUE without consuming them (acked ones still stored included).

    Without --partition or --parent every log is shown: the partitions, then the parent queue's
    log, shown as partition "parent"; the parent queue's log is partition 4294967295
    (partq.PARENT) in --json.

    --json also says where each message stands: delivery_count (the count its current or next
    delivery carries; null once acked), redelivered (it came back unacked at least once),
    next_retry (wall time in seconds a nack's delay ends; null when none is pending) and
    dead_reason (in a dead message queue: why it died; null elsewhere).
    """
    if parent and partition is not None:
        raise click.UsageError("pass either --parent or --partition, not both")
    check_browse(partition, parent, from_seq, to_seq, limit)
    require(width is None or width >= 0, "--width must be 0 (no truncation) or more")
    rows = []
    with app.broker(network=True) if app.address else app.store() as source:
        for row in store_ops.browse(app, source, queue, partition=partition, parent=parent,
                                from_seq=from_seq, to_seq=to_seq, key=key, limit=limit):
            row = _shown(row, payload_mode, out.json)
            if out.json:
                out.line(row)
            else:
                rows.append(row)
    if out.json:
        return
    if not rows:
        out.echo(f"no messages in queue {queue!r} match"
                 + (f" (partition {partition_label(PARENT if parent or partition is None else partition)})"
                    if partition is not None or parent else ""))
        return
    _print_rows(out, rows, width)
    shown = len(rows)
    more = ""
    if limit and shown >= limit:
        more = " (limit reached; raise --limit or narrow with --from-seq)"
    out.echo(f"{shown} message{'s' if shown != 1 else ''}{more}")


def _shown(row: dict, payload_mode: str, machine: bool) -> dict:
    """A browsed row as inspect shows it: the publish time in ISO 8601 and the payload as
    text, hex or base64 (``payload_encoding``)."""
    if row.get("corrupt"):
        return row
    encoding, text = encode_payload(row["payload"], payload_mode, machine)
    return {"queue": row["queue"], "partition": row["partition"], "seq": row["seq"],
            "key": row["key"], "publish_time_ns": row["publish_time_ns"],
            "publish_time": iso_time(row["publish_time_ns"]), "size": row["size"],
            "acked": row["acked"], "headers": row["headers"],
            "delivery_count": row["delivery_count"], "redelivered": row["redelivered"],
            "next_retry": row["next_retry"], "dead_reason": row["dead_reason"],
            "payload_encoding": encoding, "payload": text}


def _print_rows(out: Output, rows: list[dict], width: int | None) -> None:
    def key_cell(row):
        return None if row.get("key") is None else truncate(printable(row["key"]), 32)

    cells = [[partition_label(r["partition"]), r["seq"], key_cell(r), r.get("publish_time"),
              r["size"], r["acked"]] for r in rows]
    if width is None:
        used = max(len(line) for line in format_table(HEADERS[:-1], cells))
        width = max(24, shutil.get_terminal_size((120, 24)).columns - used - 2)
    for row, cell in zip(rows, cells, strict=True):
        if row.get("corrupt"):
            shown = f"CORRUPT: {row['error']}"
        else:
            shown = printable(row["payload"])
            if row["payload_encoding"] != "text":
                shown = f"{row['payload_encoding']}:{shown}"
            if row["headers"]:
                shown = f"{shown}  headers={printable(repr(row['headers']))}"
        cell.append(truncate(shown, width))
    out.table(HEADERS, cells)
