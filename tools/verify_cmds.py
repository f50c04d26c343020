"""``partq verify``: check the pages of data.mdb, the log's keys and the crc32c (and decoding)
of every stored record, with ``partq.ops.verify``; never binds, never changes anything.
"""
from __future__ import annotations

import click

from partq.ops.formatting import partition_label
from partq.ops.verify import VerifyReport
from partq.ops.verify import verify as verify_store
from partq.tools.common import App, UserError, pass_app, read_only_option
from partq.tools.output import Output, output_options

SHOWN = 3           # damages the error line names before "..."


@click.command()
@click.argument("queue", required=False)
@read_only_option
@output_options
@pass_app
def verify(app: App, queue: str | None, out: Output) -> None:
    """Check the store's pages and every stored record of QUEUE (default: every queue).

    The pages of data.mdb are walked as LMDB lays them out: LMDB's free list (which every
    publish and ack reads), the main database and every database in it. Then the keys of the
    logs, and every record against its checksum: the partitions and the parent queue's log,
    which the report calls partition "parent"; the parent queue's log is partition 4294967295
    (partq.PARENT) in --json. Exit status 1 when anything is damaged; the report names the
    damaged pages (tree, page, reason) and records (queue, partition, seq or chunk key, reason),
    and the error line says what to do.
    """
    with app.store() as store, out.progress_callback("verifying") as progress:
        report = verify_store(store, queue, progress)
    if out.json:
        out.doc(report.as_dict())
    else:
        _show(report, out)
    if not report.ok:
        raise UserError(_what_to_do(report))


def _show(report: VerifyReport, out: Output) -> None:
    if report.damaged_pages:
        out.table(["TREE", "PAGE", "REASON"],
                  [[d["tree"], "-" if d["page"] is None else d["page"], d["reason"]]
                   for d in report.damaged_pages])
    if report.corrupt:
        out.table(["QUEUE", "PARTITION", "SEQ", "REASON"],
                  [[c["queue"] or "-", "-" if c["partition"] is None
                    else partition_label(c["partition"]), "-" if c["seq"] is None else c["seq"],
                    c["reason"] if "key" not in c else f"{c['reason']} (key {c['key']})"]
                   for c in report.corrupt])
    pages = len(report.damaged_pages)
    if pages:
        out.echo(f"{pages} damaged page{'s' if pages != 1 else ''} in data.mdb")
    if not report.records_checked:
        out.echo("records not read: LMDB could fail or end the process on the damaged pages")
        return
    total, queues, corrupt = report.checked, len(report.queues), len(report.corrupt)
    out.echo(f"checked {total} record{'s' if total != 1 else ''} in {queues} "
             f"queue{'s' if queues != 1 else ''}: "
             + (f"{corrupt} corrupt" if corrupt else "all intact"))


def _what_to_do(report: VerifyReport) -> str:
    """The error line: what is damaged, and what to do about it."""
    parts = []
    pages = report.damaged_pages
    if pages:
        where = ", ".join(("LMDB's free list" if d["tree"] == "free list" else
                           f"database {d['tree']!r}") + ("" if d["page"] is None
                                                          else f" page {d['page']}")
                          for d in pages[:SHOWN]) + (" ..." if len(pages) > SHOWN else "")
        parts.append(
            f"data.mdb has {len(pages)} damaged page{'s' if len(pages) != 1 else ''} ({where}): "
            f"a publish or ack may fail on it, or overwrite data in use; stop writing to this "
            f"store, copy out what can be read (`partq copy-out QUEUE --to-file FILE "
            f"--skip-corrupt` for each queue) and restore the store from a DR-standby (`partq "
            f"dr promote` on it) or a backup")
    corrupt = report.corrupt
    if corrupt:
        where = ", ".join(f"{c['queue'] or '-'} partition "
                          f"{'-' if c['partition'] is None else partition_label(c['partition'])} "
                          + (f"seq {c['seq']}" if "key" not in c else f"chunk key {c['key']}")
                          for c in corrupt[:SHOWN]) + (" ..." if len(corrupt) > SHOWN else "")
        parts.append(
            f"{len(corrupt)} corrupt record{'s' if len(corrupt) != 1 else ''} ({where}); restore "
            f"the store from a DR-standby or backup, or consume past them with "
            f"bind(skip_corrupt=True) and copy the rest out with `partq copy-out --skip-corrupt`")
    return "; and ".join(parts)
