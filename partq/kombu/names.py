"""How kombu's names become partq queue names, and how an exchange binding is stored.

A kombu queue is a partq queue of the same name when that name is a partq name (``celery``,
``default``, ``reports.daily``); any other (``celery@host.celery.pidbox``: partq names take
letters, digits and ``. _ - /`` only) is ``kombu.q.<base64 of its name>``. The prefix ``kombu.``
is kept for names this module makes: a kombu queue whose own name starts with it is encoded too.

A queue declared with ``max_priority`` has a partq queue per priority step besides its own:
``kombu.p<step>.<partq name>`` for the steps above 0 (``PRIORITY_STEPS``); step 0 is the queue
itself, so a queue without priorities is one partq queue.

An exchange binding is a partq queue that holds no message, named for what it binds:
``kombu.bind.<type>.<base64 of the exchange>.<base64 of routing key, pattern, queue>``. Being a
queue, it is durable, seen by every process of the directory and through ``partq serve``, and
listed by ``partq queue list``; ``queue_delete`` removes it with the queue.
"""
from __future__ import annotations

import base64
import hashlib
import json
import re

PREFIX = "kombu."
BINDING_PREFIX = "kombu.bind."
PRIORITY_STEPS = (0, 3, 6, 9)         # AMQP's order: a higher number is delivered first
MAX_NAME = 200
_PARTQ_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._\-/]{0,199}\Z")


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def _unb64(text: str) -> str:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()


def queue_name(kombu_queue: str) -> str:
    """The partq queue that holds the messages of ``kombu_queue`` (its step-0 queue)."""
    if _PARTQ_NAME.match(kombu_queue) and not kombu_queue.startswith(PREFIX):
        return kombu_queue
    encoded = f"{PREFIX}q.{_b64(kombu_queue)}"
    if len(encoded) > MAX_NAME:           # a name this long cannot be decoded back: none needs to be
        encoded = f"{PREFIX}h.{hashlib.sha256(kombu_queue.encode()).hexdigest()}"
    return encoded


def priority_step(priority: int) -> int:
    """The step a message of ``priority`` (0..9, clamped by the channel) goes to."""
    return max(s for s in PRIORITY_STEPS if s <= priority)


def step_queue(base: str, step: int) -> str:
    """The partq queue of priority ``step`` of the partq queue ``base``."""
    return base if step == 0 else f"{PREFIX}p{step}.{base}"[:MAX_NAME]


def binding_name(exchange_type: str, exchange: str, routing_key: str, pattern: str,
                 queue: str) -> str:
    """The partq queue that records one binding; ``ValueError`` when it is too long for a name."""
    member = json.dumps([routing_key or "", pattern or "", queue or ""], separators=(",", ":"))
    name = f"{BINDING_PREFIX}{exchange_type}.{_b64(exchange)}.{_b64(member)}"
    if len(name) > MAX_NAME:
        raise ValueError(f"the binding of queue {queue!r} to exchange {exchange!r} with routing key "
                         f"{routing_key!r} is too long to record ({len(name)} characters of "
                         f"{MAX_NAME}): use shorter names")
    return name


def parse_binding(name: str) -> tuple[str, str, tuple[str, str, str]] | None:
    """``(exchange type, exchange, (routing_key, pattern, queue))`` of a binding queue's name,
    or None for any other queue."""
    if not name.startswith(BINDING_PREFIX):
        return None
    try:
        exchange_type, exchange, member = name[len(BINDING_PREFIX):].split(".")
        routing_key, pattern, queue = json.loads(_unb64(member))
        return exchange_type, _unb64(exchange), (routing_key, pattern, queue)
    except (ValueError, TypeError):
        return None
