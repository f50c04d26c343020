"""What an operator may change through the console, only when it was started with
``--allow-actions``: each action is a command-line verb too (named in its log line), runs the
library call that verb runs, and is logged (logger ``partq.console``) with who asked, what, and
what came of it.

- ``requeue``: send a dead message queue's messages back (``partq dead requeue DMQ [--key K]
  [--reason R] [--limit N]``);
- ``kill`` / ``ack``: kill or ack one message by its position, the one that blocks a partition or
  a dead message (``partq message kill|ack QUEUE PARTITION SEQ``);
- ``ingress`` / ``egress``: turn a queue's ingress or egress on or off (``partq queue update
  QUEUE --ingress on|off``);
- ``scale``: change the partition count, online, without waiting for a scale-down to drain
  (``partq scale QUEUE --partitions N``).

An action's arguments come as a JSON object; a wrong one raises ``InvalidConfig``.
"""
from __future__ import annotations

import logging
import shlex
from collections.abc import Callable
from typing import TYPE_CHECKING

from partq import scaling
from partq.errors import InvalidConfig
from partq.ops import requeue as requeue_ops

if TYPE_CHECKING:
    from partq.broker import Broker

log = logging.getLogger("partq.console")


def _text(body: dict, name: str, required: bool = True) -> str | None:
    value = body.get(name)
    if value is None or value == "":
        if required:
            raise InvalidConfig(f"the action needs {name!r}")
        return None
    if not isinstance(value, str):
        raise InvalidConfig(f"{name!r} must be a string, not {value!r}")
    return value


def _int(body: dict, name: str, default: int | None = None) -> int:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidConfig(f"{name!r} must be an integer, not {value!r}")
    return value


def _flag(body: dict, name: str) -> bool:
    value = body.get(name)
    if not isinstance(value, bool):
        raise InvalidConfig(f"{name!r} must be true or false, not {value!r}")
    return value


def requeue(broker: Broker, body: dict) -> tuple[str, dict]:
    queue = _text(body, "queue")
    assert queue is not None
    key, reason = _text(body, "key", False), _text(body, "reason", False)
    limit = _int(body, "limit", 0)
    report = requeue_ops.requeue(broker, queue, keys=[key] if key else [],
                                 reasons=[reason] if reason else [], limit=limit)
    words = ["partq dead requeue", shlex.quote(queue)]
    words += [f"--key {shlex.quote(key)}"] if key else []
    words += [f"--reason {reason}"] if reason else []
    words += [f"--limit {limit}"] if limit else []
    return " ".join(words), report.as_dict()


def _position(verb: str, call: Callable[[Broker, str, int, int], bool]):
    def act(broker: Broker, body: dict) -> tuple[str, dict]:
        queue = _text(body, "queue")
        assert queue is not None
        partition, seq = _int(body, "partition"), _int(body, "seq")
        done = call(broker, queue, partition, seq)
        return (f"partq message {verb} {shlex.quote(queue)} {partition} {seq}",
                {"queue": queue, "partition": partition, "seq": seq,
                 "outcome": verb + "ed" if done else "already_acked"})
    return act


def _switch(what: str):
    def act(broker: Broker, body: dict) -> tuple[str, dict]:
        queue = _text(body, "queue")
        assert queue is not None
        enabled = _flag(body, "enabled")
        config = broker.update_queue(queue, **{f"{what}_enabled": enabled})
        return (f"partq queue update {shlex.quote(queue)} --{what} {'on' if enabled else 'off'}",
                {"queue": queue, "ingress_enabled": config.ingress_enabled,
                 "egress_enabled": config.egress_enabled})
    return act


def scale(broker: Broker, body: dict) -> tuple[str, dict]:
    queue = _text(body, "queue")
    assert queue is not None
    partitions = _int(body, "partitions")
    scaling.check_scalable(broker.queue_config(queue))
    config = broker.scale(queue, partitions, online=True, wait=False)
    return (f"partq scale {shlex.quote(queue)} --partitions {partitions}",
            {"queue": queue, "partitions": config.partitions,
             "scaling_status": config.scaling_status})


ACTIONS: dict[str, Callable[[Broker, dict], tuple[str, dict]]] = {
    "requeue": requeue,
    "kill": _position("kill", lambda b, q, p, s: b.kill_message(q, p, s)),
    "ack": _position("ack", lambda b, q, p, s: b.ack_message(q, p, s)),
    "ingress": _switch("ingress"),
    "egress": _switch("egress"),
    "scale": scale,
}


def run(broker: Broker, name: str, body: dict, peer: str) -> dict:
    """Run action ``name`` with ``body`` for ``peer``; log it and return its result (with
    ``command``: the command line that does the same). Raises what the library raises."""
    act = ACTIONS.get(name)
    if act is None:
        raise InvalidConfig(f"no action {name!r}; the actions are {', '.join(sorted(ACTIONS))}")
    try:
        command, result = act(broker, body)
    except Exception as exc:
        log.warning("console action %s by %s refused: %s", name, peer, exc)
        raise
    log.warning("console action by %s: %s -> %s", peer, command, result)
    return {"action": name, "command": command, "result": result}
