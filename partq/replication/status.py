"""What replication reports: the link of each standby and the lag, from memory (the process
that serves or follows) or from the store (any other process)."""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import msgpack

from partq.storage.encoding import unpack_u64
from partq.storage.txn import decode_change


@dataclass(frozen=True)
class StandbyLink:
    standby_id: str
    connected: bool
    acked_lsn: int                      # -1 while bootstrapping (snapshot not yet confirmed)
    lag_changes: int
    lag_messages: int
    lag_seconds: float


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

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def u64(raw: bytes | None) -> int:
    return 0 if raw is None else unpack_u64(raw)


def read_slots(r) -> dict[str, int]:
    """The standbys' slots a primary keeps: standby id -> the LSN it has acked."""
    raw = r.meta(b"slots")
    return msgpack.unpackb(raw, raw=False) if raw else {}


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
        lag_seconds=worst.lag_seconds if worst else 0.0, standbys=links)


def stored_slots_status(store, role: str) -> ReplicationStatus:
    """Replication status as any process can read it from the store: the standbys' positions
    the serving primary last stored (every 0.5 s) against the change log. Used by `partq dr
    status` and the scaling procedure's DR wait, which run outside the primary process."""
    with store.read() as r:
        if role == "standby":
            applied = u64(r.meta(b"applied_lsn"))
            return ReplicationStatus(role=role, mode=None, connected=False, head_lsn=applied,
                                     applied_lsn=applied, lag_messages=0, lag_seconds=0.0)
        head, msgs = u64(r.meta(b"lsn")), u64(r.meta(b"msgs_total"))
        links = []
        for sid, acked in read_slots(r).items():
            lag_msgs, lag_s = lag(r, acked, head, msgs)
            links.append(StandbyLink(sid, False, acked, head - acked, lag_msgs, lag_s))
        return primary_status(r, links, None)
