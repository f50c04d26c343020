"""``partq copy-out``: copy a queue's unacked messages to another queue or to a file.

The copy itself (resumable, exactly once across re-runs) is ``partq.tools.copyout``.
"""
from __future__ import annotations

import contextlib
import signal
import threading

import click

from partq.tools.common import App, UserError, check_partition, pass_app, require
from partq.tools.copyout import FORMATS, FileSink, QueueSink, copy, plan
from partq.tools.inspect_cmds import load_config, partitions_of
from partq.tools.output import Output, output_options


@click.command("copy-out")
@click.argument("queue")
@click.option("--to-queue", "to_queue", metavar="DEST", help="Copy into queue DEST of this store.")
@click.option("--to-file", "to_file", metavar="PATH", type=click.Path(dir_okay=False),
              help="Copy into file PATH (continued, not overwritten, by a re-run).")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="jsonl", show_default=True,
              help="File format: JSON Lines (payload base64) or a stream of msgpack maps.")
@click.option("--partition", "-p", type=int, help="Only this partition [default: all].")
@click.option("--from-seq", type=int, help="First sequence to copy [default: the oldest].")
@click.option("--to-seq", type=int, help="Last sequence to copy [default: the newest now].")
@click.option("--batch", type=int, default=1000, show_default=True,
              help="Messages per commit (queue) or per fsync (file).")
@click.option("--skip-corrupt", is_flag=True,
              help="Copy past records that fail their checksum (listed in the report).")
@output_options
@pass_app
def copy_out(app: App, queue: str, to_queue: str | None, to_file: str | None, fmt: str,
             partition: int | None, from_seq: int | None, to_seq: int | None, batch: int,
             skip_corrupt: bool, out: Output) -> None:
    """Copy the unacked messages of QUEUE to --to-queue DEST or --to-file PATH.

    Acked messages are not copied and nothing is consumed. Interrupted (Ctrl-C, SIGKILL, a
    crash), run the same command again: it continues where the copy stopped, without
    duplicating or missing a message. Records in a file carry queue, partition, seq, key,
    publish_time_ns, headers (bytes as {"$base64": ...}) and the payload (payload_b64 in JSON
    Lines, raw bytes in msgpack).
    """
    if (to_queue is None) == (to_file is None):
        raise click.UsageError("pass exactly one of --to-queue DEST and --to-file PATH")
    require(batch >= 1, "--batch must be at least 1")
    require(from_seq is None or from_seq >= 0, "--from-seq must be 0 or more")
    require(to_seq is None or to_seq >= (from_seq or 0), "--to-seq must not be below --from-seq")
    require(to_queue != queue, "--to-queue must name another queue than the source")
    range_tag = ""       # an explicit range is a copy of its own (its own checkpoints)
    if from_seq is not None or to_seq is not None:
        range_tag = f":{from_seq or 0}-{'' if to_seq is None else to_seq}"
    with contextlib.ExitStack() as stack:
        broker = stack.enter_context(app.broker()) if to_queue is not None else None
        store = stack.enter_context(app.store())
        with store.read() as r:
            config = load_config(r, queue)
        count = partitions_of(config)
        check_partition(partition, count, queue)
        parts = [partition] if partition is not None else list(range(count))
        if to_queue is not None:
            sink = QueueSink(broker, queue, to_queue, range_tag)
        else:
            sink = FileSink(to_file, fmt, queue)
        stack.callback(sink.close)
        reports = plan(store, config, parts, from_seq or 0, to_seq, sink)
        total = sum(max(rep.end - rep.start + 1, 0) for rep in reports)
        stop = stack.enter_context(_stop_on_signals())
        with out.progress(total, f"copying {queue}") as bar:
            copy(store, config, reports, sink, batch, skip_corrupt, bar.update, stop.is_set)
    copied = sum(rep.copied for rep in reports)
    doc = {"queue": queue, **sink.describe(), "copied": copied,
           "complete": not stop.is_set(), "partitions": [rep.as_dict() for rep in reports]}
    if out.json:
        out.doc(doc)
    else:
        where = f"queue {to_queue!r}" if to_queue else f"{to_file} ({fmt})"
        resumed = [rep.partition for rep in reports if rep.resumed]
        out.echo(f"copied {copied} message{'s' if copied != 1 else ''} of queue {queue!r} to "
                 f"{where}" + (f"; continued an earlier copy of partition(s) "
                               f"{', '.join(map(str, resumed))}" if resumed else ""))
        out.table(["PARTITION", "FROM SEQ", "TO SEQ", "COPIED", "ACKED (SKIPPED)", "CORRUPT (SKIPPED)"],
                  [[rep.partition, rep.start if rep.end >= rep.start else None,
                    rep.end if rep.end >= rep.start else None, rep.copied, rep.skipped_acked,
                    ",".join(map(str, rep.skipped_corrupt)) or 0] for rep in reports],
                  indent="  ")
    if stop.is_set():
        raise UserError(f"copy-out interrupted after {copied} messages; run the same command "
                        f"again to continue")


@contextlib.contextmanager
def _stop_on_signals():
    """SIGINT/SIGTERM set a flag the copy checks between batches (handlers only set flags)."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = {}

    def handler(signum, frame):
        stop.set()
    for sig in (signal.SIGINT, signal.SIGTERM):
        previous[sig] = signal.signal(sig, handler)
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
