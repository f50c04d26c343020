"""The administration of a ``partq serve`` host by its clients: the queue verbs of ``Broker``
(``partq.connect``'s ``Client`` has them too) and the reads the command line makes with
``--address`` (``partq queue show``, ``inspect``, ``stats``, ``message kill|ack``, ``dead
requeue``, ``copy-out --to-queue``), run by the server on its broker, so their guarantees hold there:

    create_queue {queue, partitions, exist_ok, options} -> config {config}
    update_queue {queue, changes}            -> config {config}
    delete_queue {queue}                     -> ok
    queue_config {queue}                     -> config {config}
    queue_configs {}                         -> configs {configs: [config, ...]}
    scale {queue, partitions, online, wait}  -> config {config, steps: [step, ...]}
    kill_message {queue, partition, seq}     -> done {result}   (False: acked already)
    ack_message {queue, partition, seq}      -> done {result}
    stats {queue}                            -> stats {stats, path}  (``partq.ops.stats.stats``)
    browse {queue, partition, parent, from_seq, to_seq, key, limit, resume}
                                             -> rows {rows, more}   (``partq.ops.browse``)
    stranded {queue, parent_depth}           -> stranded {stranded: [count, copied] or nil}
    position {queue, partition, seq}         -> position {before: [key, count, pending] or nil}
    after {queue, partition}                 -> position {after: [next_seq, stuck_on]}
    requeue {queue, to, keys, reasons, limit, batch, ignore_interrupted} -> requeued {report}
    copy_out {queue, to_queue, partition, parent, move, from_seq, to_seq, batch, skip_corrupt}
                                             -> copied {report}   (``partq.ops.copy_out``)

A config travels as ``QueueConfig.to_dict()``. ``browse`` answers at most ``BROWSE_ROWS`` rows
(or about ``BROWSE_BYTES`` of payloads) at a time; ``more`` is the position ``[partition,
seq]`` the next request resumes at (nil: done). Every change is logged (logger
``partq.server``) with the client that made it. The fields are checked at the edge
(``partq.remote.requests``); the values, by the library, in its own words.
"""
from __future__ import annotations

import logging

from partq.ops import unblock
from partq.ops.browse import browse, check_browse, load_config, log_partitions, select_logs
from partq.ops.copy_out import copy_out, stranded_state
from partq.ops.requeue import requeue
from partq.ops.stats import stats
from partq.storage.encoding import PARENT

log = logging.getLogger("partq.server")

BROWSE_ROWS = 1000
BROWSE_BYTES = 4 << 20

ADMIN_OPS = frozenset({"create_queue", "update_queue", "delete_queue", "queue_config",
                       "queue_configs", "ensure_dead_queue", "scale", "kill_message",
                       "ack_message", "stats", "browse", "stranded", "position", "after",
                       "requeue", "copy_out"})


def admin_request(broker, frame: dict, who: str) -> dict:
    """The answer to ``frame``, a checked admin request of the client ``who`` (without its
    ``req``); raises the ``PartqError`` that refused it."""
    op, queue = frame["op"], frame.get("queue") or ""     # (nil only for stats: every queue)
    if op == "create_queue":
        config = broker.create_queue(queue, partitions=frame["partitions"],
                                     exist_ok=bool(frame.get("exist_ok")), **frame["options"])
        log.info("client %s created queue %r (%d partitions%s)", who, queue, config.partitions,
                 "".join(f", {k}={v!r}" for k, v in sorted(frame["options"].items())))
        return {"op": "config", "config": config.to_dict()}
    if op == "update_queue":
        config = broker.update_queue(queue, **frame["changes"])
        log.info("client %s updated queue %r: %s", who, queue,
                 ", ".join(f"{k}={v!r}" for k, v in sorted(frame["changes"].items())))
        return {"op": "config", "config": config.to_dict()}
    if op == "delete_queue":
        broker.delete_queue(queue)
        log.info("client %s deleted queue %r", who, queue)
        return {"op": "ok"}
    if op == "queue_config":
        return {"op": "config", "config": broker.queue_config(queue).to_dict()}
    if op == "ensure_dead_queue":       # partq.Worker through partq serve
        dead, done = broker.ensure_dead_message_queue(queue)
        if done:
            log.info("client %s: %s", who, "; ".join(done))
        return {"op": "ok", "dead_message_queue": dead, "done": done}
    if op == "queue_configs":
        return {"op": "configs", "configs": [c.to_dict() for c in broker.queues()]}
    if op == "scale":
        return _scale(broker, frame, who)
    if op in ("kill_message", "ack_message"):
        verb = broker.kill_message if op == "kill_message" else broker.ack_message
        done = verb(queue, frame["partition"], frame["seq"])
        log.info("client %s %s message %d of partition %d of queue %r%s", who,
                 "killed" if op == "kill_message" else "acked", frame["seq"], frame["partition"],
                 queue, "" if done else " (acked already: nothing changed)")
        return {"op": "done", "result": done}
    if op == "stats":
        return {"op": "stats", "stats": stats(broker, queue or None), "path": broker.path}
    if op == "browse":
        return _browse(broker.store, frame)
    if op == "stranded":
        left = stranded_state(broker, queue, frame.get("parent_depth"))
        return {"op": "stranded", "stranded": None if left is None else [left.count, left.copied]}
    if op == "position":
        was = unblock.before(broker.store, queue, frame["partition"], frame["seq"])
        return {"op": "position", "before": None if was is None else
                [was.key, was.delivery_count, was.retry_pending]}
    if op == "after":
        now = unblock.after(broker.store, queue, frame["partition"])
        return {"op": "position", "after": [now.next_seq, now.stuck_on]}
    if op == "copy_out":
        return _copy_out(broker, frame, who)
    return _requeue(broker, frame, who)


def _copy_out(broker, frame: dict, who: str) -> dict:
    report = copy_out(broker, broker.store, frame["queue"], to_queue=frame["to_queue"],
                      partition=frame.get("partition"), parent=bool(frame.get("parent")),
                      move=bool(frame.get("move")), from_seq=frame.get("from_seq"),
                      to_seq=frame.get("to_seq"), batch=frame["batch"],
                      skip_corrupt=bool(frame.get("skip_corrupt")))
    log.info("client %s copied %d message(s) of queue %r to queue %r%s", who, report.copied,
             frame["queue"], frame["to_queue"],
             f", removed {report.removed_from_parent} from its parent queue"
             if report.removed_from_parent is not None else "")
    return {"op": "copied", "report": report.as_dict()}


def _scale(broker, frame: dict, who: str) -> dict:
    steps: list[str] = []
    queue, partitions = frame["queue"], frame["partitions"]
    log.info("client %s scales queue %r to %d partitions%s", who, queue, partitions,
             " online" if frame.get("online") else "")
    config = broker.scale(queue, partitions, progress=steps.append,
                          online=bool(frame.get("online")),
                          wait=True if frame.get("wait") is None else frame["wait"])
    log.info("client %s scaled queue %r to %d partitions", who, queue, config.partitions)
    return {"op": "config", "config": config.to_dict(), "steps": steps}


def _requeue(broker, frame: dict, who: str) -> dict:
    report = requeue(broker, frame["queue"], to_queue=frame.get("to"), keys=frame["keys"],
                     reasons=frame["reasons"], limit=frame["limit"], batch=frame["batch"],
                     ignore_interrupted=bool(frame.get("ignore_interrupted")))
    log.info("client %s requeued %d message(s) of dead message queue %r%s", who,
             report.requeued, frame["queue"],
             f" to {frame['to']!r}" if frame.get("to") else "")
    return {"op": "requeued", "report": report.as_dict()}


def _browse(store, frame: dict) -> dict:
    """Up to ``BROWSE_ROWS`` rows of a browse, from ``resume`` on, and where the next part
    starts. The logs are walked in increasing order (``PARENT`` is the largest), so a
    position says which logs are done."""
    queue, partition, parent = frame["queue"], frame.get("partition"), bool(frame.get("parent"))
    from_seq, to_seq, key, limit = frame["from_seq"], frame.get("to_seq"), frame.get("key"), \
        frame["limit"]
    check_browse(partition, parent, from_seq, to_seq, limit)
    with store.read() as r:
        logs = select_logs(log_partitions(r, load_config(r, queue)), queue, partition, parent)
    resume = frame.get("resume") or [0, 0]
    rows: list[dict] = []
    size = 0
    for p in logs:
        if p < resume[0]:
            continue
        start = max(from_seq, resume[1]) if p == resume[0] else from_seq
        if to_seq is not None and start > to_seq:
            continue
        want = 0 if limit == 0 else limit - len(rows)
        for row in browse(store, queue, None if p == PARENT else p, p == PARENT, start, to_seq,
                          key, want):
            if len(rows) >= BROWSE_ROWS or size >= BROWSE_BYTES:
                return {"op": "rows", "rows": rows, "more": [p, row["seq"]]}
            rows.append(row)
            size += row["size"] + 64
        if limit and len(rows) >= limit:
            break
    return {"op": "rows", "rows": rows, "more": None}
