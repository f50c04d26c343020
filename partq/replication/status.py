"""What replication reports: the link of each standby and the lag, from memory (the process
that serves or follows) or from the store (any other process: ``slots.stored_status``)."""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from partq.storage.encoding import unpack_u64
from partq.storage.group_commit import SUPERSEDED
from partq.storage.writer import decode_change


@dataclass(frozen=True)
class StandbyLink:
    standby_id: str
    connected: bool
    acked_lsn: int                      # -1 while bootstrapping (snapshot not yet confirmed)
    lag_changes: int
    lag_messages: int
    lag_seconds: float
    address: str | None = None          # where its connection comes from


@dataclass(frozen=True)
class ReplicationStatus:
    role: str                           # "primary" | "standby"
    mode: str | None                    # primary: "async" | "sync"
    connected: bool                     # standby: linked to its primary; primary: any standby
    head_lsn: int                       # primary's newest LSN (as last heard, on a standby)
    applied_lsn: int                    # standby: applied; primary: lowest acked by standbys
    lag_messages: int
    lag_seconds: float
    standbys: list[StandbyLink] = dataclasses.field(default_factory=list)
    primary: str | None = None
    token: bool | None = None           # the link is authenticated by a token (None: unknown)
    tls: bool | None = None
    last_error: str | None = None       # standby: why its last link ended (or was refused)
    superseded: bool = False            # primary: a standby of it was promoted; it refuses writes
    fence_pending: str | None = None    # promoted primary: the old primary not told yet
    fence_error: str | None = None      # why the last attempt to tell it failed

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def u64(raw: bytes | None) -> int:
    return 0 if raw is None else unpack_u64(raw)


def stored_messages(r) -> int:
    """Messages stored and not acked, over every queue (what a new standby still lacks)."""
    total = 0
    for config in r.queues().values():
        qid = config["qid"]
        for p in r.partitions(qid):
            total += r.ack_state(qid, p).backlog(r.head(qid, p))
    return total


def lag(r, acked: int, head: int, msgs_total: int) -> tuple[int, float]:
    """Messages and seconds between the standby's acked LSN and the primary's head."""
    if acked >= head:
        return 0, 0.0
    entries = r.changes_after(acked, 1, 0)
    if not entries:
        return 0, 0.0
    _, first_time, first_msgs, changes = decode_change(entries[0])
    appended = sum(len(c[4]) for c in changes if c[0] == "append")
    lag_msgs = msgs_total - (first_msgs - appended)
    return lag_msgs, max(0.0, (time.time_ns() - first_time) / 1e9)


def primary_status(r, links: list[StandbyLink], mode: str | None) -> ReplicationStatus:
    head = u64(r.meta(b"lsn"))
    worst = max(links, key=lambda link: link.lag_changes, default=None)
    return ReplicationStatus(
        role="primary", mode=mode, connected=any(link.connected for link in links),
        head_lsn=head, applied_lsn=min((link.acked_lsn for link in links), default=head),
        lag_messages=worst.lag_messages if worst else 0,
        lag_seconds=worst.lag_seconds if worst else 0.0, standbys=links,
        superseded=r.meta(SUPERSEDED) is not None)
