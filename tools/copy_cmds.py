"""``partq copy-out``: copy a queue's unacked messages to another queue or to a file;
``partq copy-in``: load such a file back into a queue.

The copies themselves (resumable, exactly once across re-runs) are ``partq.ops.copy_out`` and
``partq.ops.copy_in``. With ``--parent`` copy-out copies the parent queue's log: the operator's way to
recover the messages a change from exclusive to non-exclusive left there, undelivered,
typically into the same, now partitioned, queue (``partq copy-out Q --parent --to-queue Q``;
``--move`` also removes each copied batch from the parent log once its copy is durable).
"""
from __future__ import annotations

import contextlib

import click

from partq.errors import QueueNotFound
from partq.ops import copy_in as copyin
from partq.ops import copy_out as copyout
from partq.ops.copy_targets import FORMATS
from partq.ops.formatting import partition_label
from partq.tools.common import App, UserError, pass_app, stop_on_signals
from partq.tools.output import Output, output_options


@click.command("copy-out")
@click.argument("queue")
@click.option("--to-queue", "to_queue", metavar="DEST", help="Copy into queue DEST of this store.")
@click.option("--to-file", "to_file", metavar="PATH", type=click.Path(dir_okay=False, allow_dash=True),
              help="Copy into file PATH, or - for standard output. A re-run continues a file "
                   "an earlier copy of this queue wrote; any other existing file is refused.")
@click.option("--overwrite", is_flag=True,
              help="Replace an existing --to-file PATH instead of continuing it.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="jsonl", show_default=True,
              help="File format: JSON Lines (payload base64) or a stream of msgpack maps.")
@click.option("--partition", "-p", type=int, help="Only this partition [default: all logs].")
@click.option("--parent", is_flag=True,
              help="Only the parent queue's log (messages an exclusive queue holds, or a change "
                   "to non-exclusive left undelivered); with it --to-queue may be QUEUE itself.")
@click.option("--move", is_flag=True,
              help="With --parent on a partitioned queue: remove each message from the parent "
                   "log once its copy is durable (a re-run finishes what an interrupted one "
                   "left), so stranded messages leave the parent queue.")
@click.option("--from-seq", type=int, help="First sequence to copy [default: the oldest].")
@click.option("--to-seq", type=int, help="Last sequence to copy [default: the newest now].")
@click.option("--batch", type=int, default=1000, show_default=True,
              help="Messages per commit (queue) or per fsync (file).")
@click.option("--skip-corrupt", is_flag=True,
              help="Copy past records that fail their checksum (listed in the report).")
@output_options
@pass_app
def copy_out(app: App, queue: str, to_queue: str | None, to_file: str | None, fmt: str,
             overwrite: bool, partition: int | None, parent: bool, move: bool,
             from_seq: int | None, to_seq: int | None, batch: int, skip_corrupt: bool,
             out: Output) -> None:
    """Copy the unacked messages of QUEUE to --to-queue DEST or --to-file PATH.

    Acked messages are not copied and nothing is consumed. Interrupted (Ctrl-C, SIGKILL, a
    crash), run the same command again: it continues where the copy stopped, without
    duplicating or missing a message. Records in a file carry queue, partition, seq, key,
    publish_time_ns, headers (bytes as {"$base64": ...}) and the payload (payload_b64 in JSON
    Lines, raw bytes in msgpack).

    Without --partition or --parent every log is copied: the partitions, then the parent queue's
    log. The parent queue's log is partition 4294967295 (partq.PARENT) in --json and in files;
    the report calls it "parent". `partq copy-out Q --parent --to-queue Q` re-publishes what a
    change to non-exclusive left in the parent queue into Q's partitions (by key, as any
    publish); run again, it copies nothing twice.
    """
    if parent and partition is not None:
        raise click.UsageError("pass either --parent or --partition, not both")
    if (to_queue is None) == (to_file is None):
        raise click.UsageError("pass exactly one of --to-queue DEST and --to-file PATH")
    copyout.check_copy(queue, to_queue=to_queue, to_file=to_file, fmt=fmt, overwrite=overwrite,
                       partition=partition, parent=parent, move=move, from_seq=from_seq,
                       to_seq=to_seq, batch=batch)
    if to_file == "-":
        out = out.to_stderr()    # standard output carries the messages
    if app.address is not None:
        if to_file is not None:
            raise UserError("over --address copy-out copies into a queue of the server "
                            "(--to-queue); a file is written on the store's host: run it there "
                            "with --data DIR, or read the messages with `partq inspect --json`")
        with app.broker(network=True) as client:
            report = client.copy_out(queue, to_queue=to_queue, partition=partition,
                                     parent=parent, move=move, from_seq=from_seq, to_seq=to_seq,
                                     batch=batch, skip_corrupt=skip_corrupt)
    else:
        report = _copy_here(app, out, queue, to_queue, to_file, fmt, overwrite, partition,
                            parent, move, from_seq, to_seq, batch, skip_corrupt)
    _print_copy(out, report, queue, to_queue, to_file, fmt, move)


def _copy_here(app: App, out: Output, queue: str, to_queue, to_file, fmt, overwrite, partition,
               parent, move, from_seq, to_seq, batch, skip_corrupt) -> copyout.CopyReport:
    with contextlib.ExitStack() as stack:
        broker = stack.enter_context(app.broker()) if to_queue is not None or move else None
        store = stack.enter_context(app.store())
        progress = stack.enter_context(out.progress_callback(f"copying {queue}"))
        stop = stack.enter_context(stop_on_signals())
        report = copyout.copy_out(broker, store, queue, to_queue=to_queue, to_file=to_file,
                                  fmt=fmt, overwrite=overwrite, partition=partition,
                                  parent=parent, move=move, from_seq=from_seq, to_seq=to_seq,
                                  batch=batch, skip_corrupt=skip_corrupt, progress=progress,
                                  stop=stop.is_set)
    return report


def _print_copy(out: Output, report: copyout.CopyReport, queue: str, to_queue, to_file, fmt,
                move: bool) -> None:
    if out.json:
        out.doc(report.as_dict())
    else:
        copied = report.copied
        where = f"queue {to_queue!r}" if to_queue else f"{to_file} ({fmt})"
        resumed = [partition_label(rep.partition) for rep in report.partitions if rep.resumed]
        out.echo(f"copied {copied} message{'s' if copied != 1 else ''} of queue {queue!r} to "
                 f"{where}" + (f"; continued an earlier copy of partition(s) "
                               f"{', '.join(resumed)}" if resumed else ""))
        if move:
            moved = report.removed_from_parent
            out.echo(f"removed {moved} message{'s' if moved != 1 else ''} from the "
                     f"parent queue of {queue!r}")
        out.table(["PARTITION", "FROM SEQ", "TO SEQ", "COPIED", "ACKED (SKIPPED)", "CORRUPT (SKIPPED)"],
                  [[partition_label(rep.partition), rep.start if rep.end >= rep.start else None,
                    rep.end if rep.end >= rep.start else None, rep.copied, rep.skipped_acked,
                    ",".join(map(str, rep.skipped_corrupt)) or 0] for rep in report.partitions],
                  indent="  ")
    if not report.complete:
        raise UserError(f"copy-out interrupted after {report.copied} messages; run the same "
                        f"command again to continue")


@click.command("copy-in")
@click.argument("queue")
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--format", "fmt", type=click.Choice(copyin.INPUT_FORMATS), default="auto",
              show_default=True,
              help="The export's format; auto: by the file name (.jsonl, .msgpack), else by its "
                   "first byte.")
@click.option("--batch", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Messages per commit.")
@click.option("--create", is_flag=True,
              help="Create QUEUE first if it does not exist (with --partitions; its other "
                   "settings the defaults, changed later with `partq queue update`).")
@click.option("--partitions", "-p", type=click.IntRange(1), default=1, show_default=True,
              help="With --create: the new queue's partition count.")
@output_options
@pass_app
def copy_in(app: App, queue: str, file: str, fmt: str, batch: int, create: bool,
            partitions: int, out: Output) -> None:
    """Publish the messages of FILE, an export `partq copy-out --to-file` wrote, into QUEUE.

    FILE - is standard input. Key, headers and payload are as exported; the publish time is
    now. Interrupted, or run again (on the same export, or on one a later copy-out continued),
    it publishes nothing twice: each commit stores how far it got in QUEUE, per partition of
    the export. An export is known by its first record, not by its file name. A torn last
    record (a copy-out still running) is left out and reported: run again once the copy-out
    is complete.
    """
    with contextlib.ExitStack() as stack:
        broker = stack.enter_context(app.broker())
        if create:
            broker.create_queue(queue, partitions=partitions, exist_ok=True)
        else:
            try:
                broker.queue_config(queue)
            except QueueNotFound as exc:
                raise UserError(f"{exc}; or pass --create (and --partitions N) to make it "
                                f"as the copy-in starts") from None
        progress = stack.enter_context(out.progress_callback(f"loading {queue}"))
        stop = stack.enter_context(stop_on_signals())
        report = copyin.copy_in(broker, queue, file, fmt=fmt, batch=batch, progress=progress,
                                stop=stop.is_set)
    if report.torn_bytes:
        out.warn(f"{file} ends in a torn record ({report.torn_bytes} bytes, left out): a "
                 f"copy-out still writing it, or killed; run copy-in again once it is complete")
    if out.json:
        out.doc(report.as_dict())
    else:
        skipped = (f"; {report.skipped} copied in before, skipped" if report.skipped else "")
        source = (f" (an export of queue {report.source_queue!r})"
                  if report.source_queue is not None else "")
        out.echo(f"published {report.published} message{'s' if report.published != 1 else ''} "
                 f"of {file}{source} to queue {queue!r}{skipped}")
        if report.sources:
            out.table(["PARTITION", "FIRST SEQ", "LAST SEQ", "PUBLISHED", "SKIPPED"],
                      [[partition_label(s.partition), s.first_seq, s.last_seq, s.published,
                        s.skipped] for s in report.sources], indent="  ")
    if not report.complete:
        raise UserError(f"copy-in interrupted after {report.published} messages; run the same "
                        f"command again to continue")


