"""``partq verify``: check the crc32c (and decoding) of every stored record (S24).

Reads short snapshots of the store, like ``inspect``; never binds, never changes anything.
"""
from __future__ import annotations

import click

from partq.config import QueueConfig
from partq.errors import CorruptRecord, CorruptStore
from partq.storage import decode_record
from partq.tools.common import App, UserError, pass_app
from partq.tools.inspect_cmds import READ_BATCH, load_config, log_partitions
from partq.tools.output import Output, output_options, partition_label


def _records(store, qid: int, p: int, start: int):
    pos = start
    while True:
        with store.read() as r:
            batch = r.records(qid, p, pos, READ_BATCH)
        if not batch:
            return
        yield from batch
        pos = batch[-1][0] + 1


@click.command()
@click.argument("queue", required=False)
@output_options
@pass_app
def verify(app: App, queue: str | None, out: Output) -> None:
    """Check every stored record of QUEUE (default: every queue) against its checksum.

    Every log is checked: the partitions and the parent queue's log, which the report calls
    partition "parent"; the parent queue's log is partition 4294967295 (partq.PARENT) in --json.
    Exit status 1 when a record is corrupt; the report names queue, partition, seq and reason.
    """
    corrupt: list[dict] = []
    checked: dict[str, int] = {}
    with app.store() as store:
        with store.read() as r:
            configs = ([load_config(r, queue)] if queue is not None
                       else sorted((QueueConfig.from_dict(c) for c in r.queues().values()),
                                   key=lambda c: c.name))
            work = []
            for config in configs:
                for p in log_partitions(r, config):
                    first = r.first_seq(config.qid, p)
                    span = 0 if first is None else r.head(config.qid, p) - first
                    work.append((config, p, first, span))
                    try:
                        r.ack_state(config.qid, p)
                    except CorruptStore as exc:
                        corrupt.append({"queue": config.name, "partition": p, "seq": None,
                                        "reason": f"ack state: {exc}"})
        with out.progress(sum(w[3] for w in work), "verifying") as bar:
            for config, p, first, span in work:
                checked.setdefault(config.name, 0)
                if first is None:
                    continue
                done = 0
                for seq, raw in _records(store, config.qid, p, first):
                    checked[config.name] += 1
                    try:
                        decode_record(raw, config.name, p, seq)
                    except CorruptRecord as exc:
                        corrupt.append({"queue": config.name, "partition": p, "seq": seq,
                                        "reason": exc.reason})
                    if seq - first + 1 - done >= 1000:
                        bar.update(seq - first + 1 - done)
                        done = seq - first + 1
                bar.update(max(span - done, 0))
    total = sum(checked.values())
    if out.json:
        out.doc({"checked": total, "queues": checked, "corrupt": corrupt, "ok": not corrupt})
    else:
        if corrupt:
            out.table(["QUEUE", "PARTITION", "SEQ", "REASON"],
                      [[c["queue"], partition_label(c["partition"]), c["seq"], c["reason"]]
                       for c in corrupt])
        out.echo(f"checked {total} record{'s' if total != 1 else ''} in {len(checked)} "
                 f"queue{'s' if len(checked) != 1 else ''}: "
                 + (f"{len(corrupt)} corrupt" if corrupt else "all intact"))
    if corrupt:
        where = ", ".join(f"{c['queue']} partition {partition_label(c['partition'])} seq {c['seq']}"
                          for c in corrupt[:3]) + (" ..." if len(corrupt) > 3 else "")
        raise UserError(f"{len(corrupt)} corrupt record{'s' if len(corrupt) != 1 else ''} ({where}); "
                        f"restore the store from a DR-standby or backup, or consume past them "
                        f"with bind(skip_corrupt=True) and copy the rest out with `partq copy-out "
                        f"--skip-corrupt`")
