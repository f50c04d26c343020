"""``Client``'s queue verbs: those of ``Broker`` (``create_queue``, ``update_queue``,
``delete_queue``, ``queue_config``, ``queues``, ``scale``, ``kill_message``, ``ack_message``),
with the same arguments, results and errors, done by ``partq serve`` on its broker
(``partq.remote.admin_request``); and the reads ``partq --address HOST:PORT`` makes (``stats``,
``browse``, ``stranded_state``, ``position``, ``after``, ``requeue``, ``copy_out``).

    client = partq.connect("10.0.0.5:7020", token_file="token")
    client.create_queue("orders", partitions=8, exist_ok=True, max_redelivery=5)
    client.kill_message("orders", 3, 1041)      # to the dead message queue; False: acked already
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from partq.config import QueueConfig
from partq.errors import InvalidConfig
from partq.flow import U32, U64
from partq.ops.copy_out import CopyReport, Stranded
from partq.ops.requeue import RequeueReport
from partq.ops.unblock import After, Position
from partq.queue_admin import check_position

SCALE_WAIT = 24 * 3600.0     # seconds a scale waits for its answer (an online scale-down waits
                             # for the removed partitions to drain)


def _config(frame: dict) -> QueueConfig:
    return QueueConfig.from_dict(frame["config"])


class ClientAdmin:
    """The queue verbs of ``Client`` (it provides ``request`` and ``timeout``)."""

    timeout: float

    def request(self, frame: dict, convert=lambda frame: frame) -> Any:
        raise NotImplementedError

    def _ask(self, frame: dict, convert=lambda frame: frame, wait: float | None = None) -> Any:
        """``call``, with ``InvalidConfig`` for arguments no request can carry (an integer
        past 2**64, an object msgpack has no form for), and ``wait`` seconds for the answer
        (default: the client's timeout and a minute)."""
        try:
            pending = self.request(frame, convert)
        except (TypeError, ValueError, OverflowError) as exc:
            raise InvalidConfig(f"the arguments of {frame['op']} cannot be sent to partq "
                                f"serve: {exc}") from None
        return pending.result(self.timeout + 60 if wait is None else wait)

    # ------------------------------------------------------------------ Broker's verbs
    def create_queue(self, name: str, partitions: int = 1, exist_ok: bool = False,
                     **options) -> QueueConfig:
        """``Broker.create_queue`` on the server: ``QueueExists`` (or, with ``exist_ok``, the
        config as stored), ``InvalidConfig`` for a setting the library refuses."""
        return self._ask({"op": "create_queue", "queue": name, "partitions": partitions,
                          "exist_ok": exist_ok, "options": options}, _config)

    def update_queue(self, name: str, **changes) -> QueueConfig:
        """``Broker.update_queue`` on the server."""
        return self._ask({"op": "update_queue", "queue": name, "changes": changes}, _config)

    def delete_queue(self, name: str) -> None:
        """``Broker.delete_queue`` on the server: the queue's flows bound through it are
        unbound; refused (``DeliveryLocked``) while a process other than the server delivers
        the queue."""
        self._ask({"op": "delete_queue", "queue": name})

    def queue_config(self, name: str) -> QueueConfig:
        """``Broker.queue_config``; ``QueueNotFound`` names the queues there are."""
        return self._ask({"op": "queue_config", "queue": name}, _config)

    def ensure_dead_message_queue(self, name: str) -> tuple[str, list[str]]:
        """``Broker.ensure_dead_message_queue`` on the server (``partq.Worker`` through it)."""
        reply = self._ask({"op": "ensure_dead_queue", "queue": name})
        return reply["dead_message_queue"], list(reply["done"])

    def queues(self) -> list[QueueConfig]:
        """``Broker.queues``: the config of every queue of the server's directory."""
        return self._ask({"op": "queue_configs"},
                         lambda f: [QueueConfig.from_dict(c) for c in f["configs"]])

    def scale(self, name: str, partitions: int, progress=None, online: bool = False,
              wait: bool = True) -> QueueConfig:
        """``Broker.scale`` on the server; ``progress(step)`` is called with each step once
        the answer came. Waits for the answer up to a day (``wait=True`` online scale-down
        waits until the removed partitions drained)."""
        frame = self._ask({"op": "scale", "queue": name, "partitions": partitions,
                           "online": online, "wait": wait}, wait=SCALE_WAIT)
        for step in frame.get("steps") or ():
            if progress is not None:
                progress(step)
        return _config(frame)

    def kill_message(self, queue: str, partition: int, seq: int) -> bool:
        """``Broker.kill_message`` on the server: False when it was acked already."""
        check_position(partition, seq)
        return self._ask({"op": "kill_message", "queue": queue, "partition": partition,
                          "seq": seq}, lambda f: bool(f["result"]))

    def ack_message(self, queue: str, partition: int, seq: int) -> bool:
        """``Broker.ack_message`` on the server: False when it was acked already."""
        check_position(partition, seq)
        return self._ask({"op": "ack_message", "queue": queue, "partition": partition,
                          "seq": seq}, lambda f: bool(f["result"]))

    # ------------------------------------------------------------------ the command line's reads
    def stats(self, queue: str | None = None) -> dict:
        """``partq.ops.stats.stats`` of the server's broker, with ``path`` its directory."""
        frame = self._ask({"op": "stats", "queue": queue})
        return {**frame["stats"], "path": frame["path"]}

    def browse(self, queue: str, partition: int | None = None, parent: bool = False,
               from_seq: int = 0, to_seq: int | None = None, key: str | None = None,
               limit: int = 100) -> Iterator[dict]:
        """``partq.ops.browse.browse`` on the server, fetched a part at a time as the iterator
        is consumed (the first part, and its errors, at the call)."""
        base = {"op": "browse", "queue": queue, "partition": partition, "parent": parent,
                "from_seq": from_seq, "to_seq": to_seq, "key": key}
        frame = self._ask({**base, "limit": limit, "resume": None})
        return self._browse_rest(base, frame, limit)

    def _browse_rest(self, base: dict, frame: dict, limit: int) -> Iterator[dict]:
        shown = 0
        while True:
            yield from frame["rows"]
            shown += len(frame["rows"])
            if frame.get("more") is None or (limit and shown >= limit):
                return
            frame = self._ask({**base, "limit": limit - shown if limit else 0,
                               "resume": frame["more"]})

    def stranded_state(self, queue: str, parent_depth: int | None) -> Stranded | None:
        """``partq.ops.copy_out.stranded_state`` of the server's broker."""
        if not parent_depth:
            return None
        left = self._ask({"op": "stranded", "queue": queue,
                          "parent_depth": parent_depth})["stranded"]
        return None if left is None else Stranded(queue, left[0], bool(left[1]))

    def position(self, queue: str, partition: int, seq: int) -> Position | None:
        """``partq.ops.unblock.before`` on the server: the unacked message at a position."""
        if not (0 <= partition <= U32 and 0 <= seq <= U64):
            return None         # no such position: the kill or ack says why, as before() does
        was = self._ask({"op": "position", "queue": queue, "partition": partition,
                         "seq": seq})["before"]
        return None if was is None else Position(was[0], was[1], bool(was[2]))

    def after(self, queue: str, partition: int) -> After:
        """``partq.ops.unblock.after`` on the server: where a partition stands now."""
        now = self._ask({"op": "after", "queue": queue, "partition": partition})["after"]
        return After(now[0], now[1])

    def copy_out(self, queue: str, *, to_queue: str, partition: int | None = None,
                 parent: bool = False, move: bool = False, from_seq: int | None = None,
                 to_seq: int | None = None, batch: int = 1000,
                 skip_corrupt: bool = False) -> CopyReport:
        """``partq.ops.copy_out.copy_out`` into another queue of the server's directory (``partq
        copy-out --to-queue``), waited for up to a day."""
        frame = self._ask({"op": "copy_out", "queue": queue, "to_queue": to_queue,
                           "partition": partition, "parent": parent, "move": move,
                           "from_seq": from_seq, "to_seq": to_seq, "batch": batch,
                           "skip_corrupt": skip_corrupt}, wait=SCALE_WAIT)
        return CopyReport.from_dict(frame["report"])

    def requeue(self, queue: str, *, to_queue: str | None = None, keys: list[str] | None = None,
                reasons: list[str] | None = None, limit: int = 0, batch: int = 1000,
                ignore_interrupted: bool = False) -> RequeueReport:
        """``partq.ops.requeue.requeue`` of the server's broker (``partq dead requeue``),
        waited for up to a day."""
        frame = self._ask({"op": "requeue", "queue": queue, "to": to_queue,
                           "keys": list(keys or ()), "reasons": list(reasons or ()),
                           "limit": limit, "batch": batch,
                           "ignore_interrupted": ignore_interrupted}, wait=SCALE_WAIT)
        return RequeueReport.from_dict(frame["report"])
