"""``partq inspect``: browse a queue's messages without consuming them.

It reads the partition logs from short read snapshots of the store and never binds a flow, so it
changes no delivery state and works while other processes publish, consume or own delivery. The
upper bound of each partition is its head when the command starts, so a busy publisher cannot
keep it running. A record that fails its checksum is shown as corrupt with the reason.

A queue's logs are its partitions and, once it has been exclusive (non-partitioned), its parent
queue's log: storage partition ``partq.PARENT`` (4294967295). People see that log as partition
``parent``; ``--json`` keeps the integer.
"""
from __future__ import annotations

import shutil

import click

from partq.config import QueueConfig
from partq.errors import CorruptRecord, QueueNotFound
from partq.storage import decode_record
from partq.storage.encoding import PARENT
from partq.tools.common import App, UserError, pass_app, require
from partq.tools.output import (PAYLOAD_MODES, Output, encode_payload, format_table, iso_time,
                                output_options, partition_label, printable, truncate)

READ_BATCH = 1000     # records per read snapshot
HEADERS = ["PARTITION", "SEQ", "KEY", "PUBLISHED", "SIZE", "ACKED", "PAYLOAD"]


def load_config(reader, queue: str) -> QueueConfig:
    raw = reader.queue(queue)
    if raw is None:
        raise QueueNotFound(f"no queue named {queue!r}; list the queues with `partq queue list`")
    return QueueConfig.from_dict(raw)


def log_partitions(reader, config: QueueConfig) -> list[int]:
    """The logs of a queue that may hold records, in the order commands walk them: the
    partitions that exist (a scaling in progress included; none while the queue is exclusive,
    and none that a scale-down or a change to exclusive dropped), then ``PARENT`` if the parent
    queue's log exists (the queue is, or once was, exclusive)."""
    count = max(config.partitions, config.scaling_from, config.scaling_to)
    logs = [p for p in range(count) if reader.has_partition(config.qid, p)]
    if reader.has_partition(config.qid, PARENT):
        logs.append(PARENT)
    return logs


def select_logs(logs: list[int], queue: str, partition: int | None, parent: bool) -> list[int]:
    """The logs ``--partition N`` / ``--parent`` pick out of ``logs`` (all of them with neither;
    the command refuses both at once, as a usage error, before it opens the store).
    ``--partition 4294967295`` (``partq.PARENT``, as ``--json`` prints it) means ``--parent``."""
    if parent or partition == PARENT:
        if PARENT not in logs:
            raise UserError(f"queue {queue!r} has no parent-queue log (it was never exclusive); "
                            f"leave out --parent to use its partitions")
        return [PARENT]
    if partition is None:
        return logs
    if partition not in logs:
        raise UserError(f"{describe_logs(logs, queue)}; there is no partition {partition}")
    return [partition]


def describe_logs(logs: list[int], queue: str) -> str:
    """"queue 'q' has partitions 0 to 3 and a parent-queue log (--parent)", as one clause."""
    numbered = [p for p in logs if p != PARENT]
    has_parent = PARENT in logs
    if not numbered:
        return (f"queue {queue!r} has no partitions"
                + (", only its parent-queue log (--parent)" if has_parent else ""))
    spans, start = [], numbered[0]
    for prev, cur in zip(numbered, numbered[1:] + [None]):
        if cur is None or cur != prev + 1:       # a span ends at prev
            spans.append(str(start) if start == prev else f"{start} to {prev}")
            start = cur
    text = (f"queue {queue!r} has partition{'s' if len(numbered) != 1 else ''} "
            f"{', '.join(spans)}")
    return text + (" and a parent-queue log (--parent)" if has_parent else "")


def scan(store, config: QueueConfig, partition: int, start: int, end: int, batch: int = READ_BATCH):
    """Yield ``(seq, raw, acked)`` for records of one partition with start <= seq <= end, each
    batch from its own short read snapshot. Records below the ack floor are not shown: they are
    truncated, or about to be with the rest of their chunk (acks meanwhile included)."""
    pos = start
    while pos <= end:
        with store.read() as r:
            ack = r.ack_state(config.qid, partition)
            pos = max(pos, ack.floor)
            if pos > end:
                return
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
@output_options
@pass_app
def inspect(app: App, queue: str, partition: int | None, parent: bool, from_seq: int,
            to_seq: int | None, key: str | None, limit: int, payload_mode: str,
            width: int | None, out: Output) -> None:
    """Browse the messages of QUEUE without consuming them (acked ones still stored included).

    Without --partition or --parent every log is shown: the partitions, then the parent queue's
    log, shown as partition "parent"; the parent queue's log is partition 4294967295
    (partq.PARENT) in --json.
    """
    if parent and partition is not None:
        raise click.UsageError("pass either --parent or --partition, not both")
    require(limit >= 0, "--limit must be 0 (no limit) or more")
    require(from_seq >= 0, "--from-seq must be 0 or more")
    require(to_seq is None or to_seq >= from_seq, "--to-seq must not be below --from-seq")
    require(width is None or width >= 0, "--width must be 0 (no truncation) or more")
    with app.store() as store:
        with store.read() as r:
            config = load_config(r, queue)
            parts = select_logs(log_partitions(r, config), queue, partition, parent)
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
                 + (f" (partition {partition_label(parts[0])})" if len(parts) == 1
                    and (partition is not None or parent) else ""))
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

    cells = [[partition_label(r["partition"]), r["seq"], key_cell(r), r.get("publish_time"),
              r["size"], r["acked"]] for r in rows]
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
