"""Verifying a store (rule `checksums`): the pages of data.mdb as LMDB lays them out (the free
list that every commit reads included), the keys of the log, the crc32c (and decoding) of every
stored record, and the ack state of every log. Reads short snapshots of the store, like
``partq.ops.browse`` (the walk of the pages holds one read transaction, which delays no writer:
see ``partq.storage.page_check``); never binds, never changes anything, and works while other
processes publish and consume.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from partq.config import QueueConfig
from partq.errors import CorruptRecord, CorruptStore
from partq.ops.browse import READ_BATCH, load_config, log_partitions
from partq.storage import decode_record
from partq.storage.log_check import check_log
from partq.storage.page_check import check_pages

PROGRESS_EVERY = 1000     # records between two progress calls


@dataclass
class VerifyReport:
    """What ``verify`` found. ``damaged_pages`` lists one dict per damaged page of data.mdb:
    ``tree`` (``"free list"``: LMDB's list of reusable pages; ``"main"``, or a database's
    name), ``page`` (None for the tree as a whole) and ``reason``. ``corrupt`` lists one dict
    per damaged record, chunk key or ack state: ``queue`` (None for a log key of no queue),
    ``partition`` (``partq.PARENT`` for the parent queue's log), ``seq`` (None for a damaged
    ack state or chunk key), ``reason``, and ``key`` (hex) for a chunk key.
    ``records_checked`` is False when damaged pages made reading the records unsafe (LMDB may
    end the process on such a page): only the pages were checked."""
    checked: int = 0                                        # records checked, in every queue
    queues: dict[str, int] = field(default_factory=dict)    # records checked, by queue
    corrupt: list[dict] = field(default_factory=list)
    damaged_pages: list[dict] = field(default_factory=list)
    records_checked: bool = True

    @property
    def ok(self) -> bool:
        """True when nothing is damaged."""
        return not self.corrupt and not self.damaged_pages

    def as_dict(self) -> dict:
        """The report as ``partq verify --json`` prints it."""
        return {"checked": self.checked, "queues": self.queues, "corrupt": self.corrupt,
                "damaged_pages": self.damaged_pages, "records_checked": self.records_checked,
                "ok": self.ok}


def verify(store, queue: str | None = None,
           progress: Callable[[int, int], None] | None = None) -> VerifyReport:
    """Check the pages of the store's data.mdb, then, unless a damaged page makes reading
    unsafe, the log's keys and every stored record of ``queue`` (None: every queue) against
    its checksum, and every log's ack state: its partitions and its parent queue's log.
    Returns the ``VerifyReport`` (``QueueNotFound`` if ``queue`` does not exist).
    ``progress(n, total)`` is called with 0 and the number of records to check once it is
    known, then with each step's count."""
    report = VerifyReport()
    faults = check_pages(store)
    report.damaged_pages = [f.as_dict() for f in faults]
    if not all(f.readable for f in faults):
        report.records_checked = False
        return report
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
                    report.corrupt.append({"queue": config.name, "partition": p, "seq": None,
                                           "reason": f"ack state: {exc}"})
    names = {c.qid: c.name for c in configs}
    for fault in check_log(store, configs[0].qid if queue is not None else None):
        report.corrupt.append({"queue": names.get(fault.qid), "partition": fault.partition,
                               "seq": None, "key": fault.key.hex(),
                               "reason": f"chunk key: {fault.reason}"})
    total = sum(w[3] for w in work)
    advance = (lambda n: progress(n, total)) if progress is not None else (lambda n: None)
    advance(0)
    for config, p, first, span in work:
        report.queues.setdefault(config.name, 0)
        if first is None:
            continue
        done = 0
        for seq, raw in _records(store, config.qid, p, first):
            report.queues[config.name] += 1
            try:
                decode_record(raw, config.name, p, seq)
            except CorruptRecord as exc:
                report.corrupt.append({"queue": config.name, "partition": p, "seq": seq,
                                       "reason": exc.reason})
            if seq - first + 1 - done >= PROGRESS_EVERY:
                advance(seq - first + 1 - done)
                done = seq - first + 1
        advance(max(span - done, 0))
    report.checked = sum(report.queues.values())
    return report


def _records(store, qid: int, p: int, start: int) -> Iterator[tuple[int, bytes]]:
    pos = start
    while True:
        with store.read() as r:
            batch = r.records(qid, p, pos, READ_BATCH)
        if not batch:
            return
        yield from batch
        pos = batch[-1][0] + 1
