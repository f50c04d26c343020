"""``partq inspect``: browse a queue's messages without consuming them.

It reads the partition logs from short read snapshots of the store and never binds a flow, so it
changes no delivery state and works while other processes publish, consume or own delivery. The
upper bound of each partition is its head when the command starts, so a busy publisher cannot
keep it running. A record that fails its checksum is shown as corrupt with the reason.
"""
from __future__ import annotations

import shutil

import click

from partq.config import QueueConfig
from partq.errors import CorruptRecord, QueueNotFound
from partq.storage import decode_record
from partq.tools.common import App, check_partition, pass_app, require
from partq.tools.output import (PAYLOAD_MODES, Output, encode_payload, format_table, iso_time,
                                output_options, printable, truncate)

READ_BATCH = 1000     # records per read snapshot
HEADERS = ["PARTITION", "SEQ", "KEY", "PUBLISHED", "SIZE", "ACKED", "PAYLOAD"]


def load_config(reader, queue: str) -> QueueConfig:
    raw = reader.queue(queue)
    if raw is None:
        raise QueueNotFound(f"no queue named {queue!r}; list the queues with `partq queue list`")
    return QueueConfig.from_dict(raw)


def partitions_of(config: QueueConfig) -> int:
    """Partitions that may hold records, a scaling in progress included."""
    return max(config.partitions, config.scaling_from, config.scaling_to)


def scan(store, config: QueueConfig, partition: int, start: int, end: int, batch: int = READ_BATCH):
    """Yield ``(seq, raw, acked)`` for records of one partition with start <= seq <= end, each
    batch from its own short read snapshot (records acked and truncated meanwhile are skipped)."""
    pos = start
    while pos <= end:
        with store.read() as r:
            ack = r.ack_state(config.qid, partition)
            records = r.records(config.qid, partition, pos, min(batch, end - pos + 1))
        if not records:
            return
        for seq, raw in records:
            if seq > end:
                return
            yield seq, raw, ack.is_acked(seq)
        pos = records[-1][0] + 1


@click.command()
@click.argument("queue")
@click.option("--partition", "-p", type=int, help="Only this partition [default: all].")
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
@output_options
@pass_app
def inspect(app: App, queue: str, partition: int | None, from_seq: int, to_seq: int | None,
            key: str | None, limit: int, payload_mode: str, width: int | None, out: Output) -> None:
    """Browse the messages of QUEUE without consuming them (acked ones still stored included)."""
    require(limit >= 0, "--limit must be 0 (no limit) or more")
    require(from_seq >= 0, "--from-seq must be 0 or more")
    require(to_seq is None or to_seq >= from_seq, "--to-seq must not be below --from-seq")
    require(width is None or width >= 0, "--width must be 0 (no truncation) or more")
    with app.store() as store:
        with store.read() as r:
            config = load_config(r, queue)
            count = partitions_of(config)
            check_partition(partition, count, queue)
            parts = [partition] if partition is not None else list(range(count))
            heads = {p: r.head(config.qid, p) for p in parts}
        rows = []
        shown = 0
        for p in parts:
            if limit and shown >= limit:
                break
            end = heads[p] - 1 if to_seq is None else min(to_seq, heads[p] - 1)
            for seq, raw, acked in scan(store, config, p, from_seq, end):
                if limit and shown >= limit:
                    break
                row = _row(queue, p, seq, raw, acked, key, payload_mode, out.json)
                if row is None:
                    continue
                shown += 1
                if out.json:
                    out.line(row)
                else:
                    rows.append(row)
    if out.json:
        return
    if not rows:
        out.echo(f"no messages in queue {queue!r} match"
                 + (f" (partition {partition})" if partition is not None else ""))
        return
    _print_rows(out, rows, width)
    more = ""
    if limit and shown >= limit:
        more = " (limit reached; raise --limit or narrow with --from-seq)"
    out.echo(f"{shown} message{'s' if shown != 1 else ''}{more}")


def _row(queue, p, seq, raw, acked, key, payload_mode, machine) -> dict | None:
    try:
        rec = decode_record(raw, queue, p, seq)
    except CorruptRecord as exc:
        return {"queue": queue, "partition": p, "seq": seq, "corrupt": True, "error": exc.reason,
                "acked": acked, "size": len(raw)}
    if key is not None and rec.key != key:
        return None
    encoding, text = encode_payload(rec.payload, payload_mode, machine)
    return {"queue": queue, "partition": p, "seq": seq, "key": rec.key,
            "publish_time_ns": rec.publish_time_ns, "publish_time": iso_time(rec.publish_time_ns),
            "size": len(rec.payload), "acked": acked, "headers": rec.headers,
            "payload_encoding": encoding, "payload": text}


def _print_rows(out: Output, rows: list[dict], width: int | None) -> None:
    def key_cell(row):
        return None if row.get("key") is None else truncate(printable(row["key"]), 32)

    cells = [[r["partition"], r["seq"], key_cell(r), r.get("publish_time"), r["size"],
              r["acked"]] for r in rows]
    if width is None:
        used = max(len(line) for line in format_table(HEADERS[:-1], cells))
        width = max(24, shutil.get_terminal_size((120, 24)).columns - used - 2)
    for row, cell in zip(rows, cells):
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
