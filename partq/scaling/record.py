"""The record a scaling procedure keeps in the store while it runs (queue meta "procedure"):
which queue, from and to which count, the step it is at, who runs it, and whether ingress was on
before its step 1. A procedure that dies leaves it behind: ``queue_status`` reports it, a
re-run resumes it, ``abort`` undoes it.
"""
from __future__ import annotations

import dataclasses
import os
import socket
import time
from dataclasses import dataclass

import msgpack

from partq.config import QueueConfig

STEPS = {
    1: ("disable-ingress", "Disable ingress"),
    2: ("drain", "Wait for every partition to drain"),
    3: ("standby", "Wait for the DR-standby to have every message acknowledged"),
    4: ("change-count", "Change the partition count"),
    5: ("rebalance", "Wait for the partitions to be rebalanced"),
    6: ("standby-follow", "Wait for the DR-standby to follow the new partition count"),
    7: ("enable-ingress", "Enable ingress"),
}
PROCEDURE = b"procedure"      # the queue meta value recording a procedure in progress


@dataclass(frozen=True)
class Procedure:
    """A scaling procedure recorded in the store. ``state`` (derived when read): "running"
    while its process lives, "interrupted" once it is gone."""
    queue: str
    from_partitions: int
    to_partitions: int
    step: int
    ingress_before: bool
    pid: int
    host: str
    started_ns: int
    state: str = "running"
    online: bool = False        # rule `online-scaling`: ingress stays on; steps 1-3 and 7 are skipped

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def describe(self) -> str:
        """One sentence for a warning, with what to do."""
        who = f"pid {self.pid} on {self.host} since {iso(self.started_ns)}"
        name = STEPS.get(self.step, ("?", "?"))[0]
        text = (f"scaling of queue {self.queue!r} from {self.from_partitions} to "
                f"{self.to_partitions} partitions is {self.state.upper()} at step {self.step} "
                f"({name}; {who})")
        if self.state == "running":
            return text
        ingress = ("ingress was never turned off (online)" if self.online else
                   "ingress is OFF: publishes are refused or discarded" if self.step < 7 or
                   not self.ingress_before else "ingress may still be off")
        online = "" if self.online else " --offline"
        return (f"{text}; {ingress}; finish it with `partq scale {self.queue} --partitions "
                f"{self.to_partitions}{online}`, or undo it with `partq scale {self.queue} "
                f"--abort`")


def procedure_of(broker, queue: str) -> Procedure | None:
    """The scaling procedure recorded for ``queue``, or None."""
    qid = broker.queue_config(queue).qid
    with broker.store.read() as r:
        return read_procedure(r, queue, qid)


def read_procedure(reader, queue: str, qid: int) -> Procedure | None:
    """The scaling procedure recorded for queue ``queue`` (id ``qid``) in a read snapshot."""
    raw = reader.queue_meta(qid, PROCEDURE)
    return None if raw is None else _decode(queue, raw)


def _decode(queue: str, raw: bytes) -> Procedure:
    d = msgpack.unpackb(raw, raw=False)
    proc = Procedure(queue=queue, **d)
    alive = proc.host != socket.gethostname() or _alive(proc.pid)
    return dataclasses.replace(proc, state="running" if alive else "interrupted")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def write_record(broker, config: QueueConfig, proc: Procedure | None) -> None:
    value = None
    if proc is not None:
        d = proc.as_dict()
        for k in ("queue", "state"):
            del d[k]
        value = msgpack.packb(d)
    qid = config.qid
    broker.store.write(lambda w: w.put_queue_meta(qid, PROCEDURE, value))


def iso(ns: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ns / 1e9))


