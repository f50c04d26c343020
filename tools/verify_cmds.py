"""``partq verify``: check the crc32c (and decoding) of every stored record, with
``partq.ops.verify``; never binds, never changes anything.
"""
from __future__ import annotations

import click

from partq.ops.formatting import partition_label
from partq.ops.verify import verify as verify_store
from partq.tools.common import App, UserError, pass_app, read_only_option
from partq.tools.output import Output, output_options


@click.command()
@click.argument("queue", required=False)
@read_only_option
@output_options
@pass_app
def verify(app: App, queue: str | None, out: Output) -> None:
    """Check every stored record of QUEUE (default: every queue) against its checksum.

    Every log is checked: the partitions and the parent queue's log, which the report calls
    partition "parent"; the parent queue's log is partition 4294967295 (partq.PARENT) in --json.
    Exit status 1 when a record is corrupt; the report names queue, partition, seq and reason.
    """
    with app.store() as store, out.progress_callback("verifying") as progress:
        report = verify_store(store, queue, progress)
    corrupt = report.corrupt
    if out.json:
        out.doc(report.as_dict())
    else:
        if corrupt:
            out.table(["QUEUE", "PARTITION", "SEQ", "REASON"],
                      [[c["queue"], partition_label(c["partition"]), c["seq"], c["reason"]]
                       for c in corrupt])
        total, queues = report.checked, len(report.queues)
        out.echo(f"checked {total} record{'s' if total != 1 else ''} in {queues} "
                 f"queue{'s' if queues != 1 else ''}: "
                 + (f"{len(corrupt)} corrupt" if corrupt else "all intact"))
    if corrupt:
        where = ", ".join(f"{c['queue']} partition {partition_label(c['partition'])} seq {c['seq']}"
                          for c in corrupt[:3]) + (" ..." if len(corrupt) > 3 else "")
        raise UserError(f"{len(corrupt)} corrupt record{'s' if len(corrupt) != 1 else ''} ({where}); "
                        f"restore the store from a DR-standby or backup, or consume past them "
                        f"with bind(skip_corrupt=True) and copy the rest out with `partq copy-out "
                        f"--skip-corrupt`")
