"""Messages from text: what ``partq publish`` reads (arguments, or lines of standard input), in
batches, and what publishing them did.

Two forms of input:

* ``text``: each argument, or each line of input without its line feed, is one payload (the
  line's bytes as they are: UTF-8 or not, a carriage return kept); every message gets the
  same key and headers.
* ``jsonl``: each argument or non-blank line is a JSON object ``{"payload": "text"}`` or
  ``{"payload_b64": "..."}``, optionally with ``"key"`` (a string or null) and ``"headers"`` (an
  object; ``{"$base64": "..."}`` is bytes, as ``partq inspect --json`` writes them). A key or
  header given for every message is the default; the object's own win.

``publish_batches`` publishes them ``batch`` per commit (a batch is stored whole or not at all)
and returns a ``PublishReport``; an error names the input line it comes from and says how many
messages were published before it. A ``ttl`` (seconds) applies to every message: one not
delivered by then expires (it goes to the queue's dead message queue, never delivered).
"""
from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from partq.config import MAX_TTL
from partq.errors import (
    IngressDisabled,
    InvalidConfig,
    InvalidMessage,
    PartqError,
    QueueFull,
    StorageFull,
)
from partq.ops.formatting import decode_json_bytes
from partq.publish.encode import encode_item

if TYPE_CHECKING:
    from partq.broker import Broker

INPUT_FORMATS = ("text", "jsonl")
JSON_KEYS = frozenset({"payload", "payload_b64", "key", "headers"})

Item = tuple[bytes, str | None, dict | None]


@dataclass
class PartitionRange:
    """Messages one publish run placed in one partition: how many, first and last seq."""
    partition: int
    count: int
    first_seq: int
    last_seq: int

    def as_dict(self) -> dict:
        return {"partition": self.partition, "count": self.count, "first_seq": self.first_seq,
                "last_seq": self.last_seq}


@dataclass
class PublishReport:
    """What ``publish_batches`` did. ``discarded`` counts messages the queue dropped because
    its ingress is off (and it discards rather than rejects); ``complete`` is False when
    ``stop()`` ended it between batches."""
    queue: str
    published: int = 0
    discarded: int = 0
    complete: bool = True
    partitions: dict[int, PartitionRange] = field(default_factory=dict)

    def as_dict(self) -> dict:
        """The report as ``partq publish --json`` prints it."""
        return {"queue": self.queue, "published": self.published, "discarded": self.discarded,
                "complete": self.complete,
                "partitions": [r.as_dict() for _, r in sorted(self.partitions.items())]}


def parse_header(text: str) -> tuple[str, str]:
    """``NAME=VALUE`` as a header (the value a string; it may hold "=")."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise InvalidConfig(f"a header is NAME=VALUE, not {text!r}")
    return name, value


def text_items(lines: Iterable[bytes], key: str | None, headers: dict | None,
               unit: str = "line") -> Iterator[tuple[str, Item]]:
    """``(where, item)`` of text input: each line (or argument: ``unit``) a payload, without
    its line feed; ``where`` is "line N"."""
    for n, line in enumerate(lines, 1):
        yield f"{unit} {n}", (line[:-1] if line.endswith(b"\n") else line, key, headers)


def json_items(lines: Iterable[bytes], key: str | None, headers: dict | None,
               unit: str = "line") -> Iterator[tuple[str, Item]]:
    """``(where, item)`` of JSON Lines input (blank lines skipped)."""
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise InvalidMessage(f"{unit} {n}: not JSON ({exc})") from None
        yield f"{unit} {n}", json_item(obj, key, headers, f"{unit} {n}")


def json_item(obj, key: str | None, headers: dict | None, where: str) -> Item:
    """One JSON object as a message (see the module's docstring)."""
    if not isinstance(obj, dict):
        raise InvalidMessage(f"{where}: a message is a JSON object, not {type(obj).__name__}")
    unknown = set(obj) - JSON_KEYS
    if unknown:
        hint = ("; a copy-out export? load it with `partq copy-in`"
                if {"queue_id", "seq"} <= set(obj) else "")
        raise InvalidMessage(f"{where}: unknown field(s) {', '.join(sorted(unknown))}; a message "
                             f"has payload or payload_b64, and key and headers{hint}")
    if ("payload" in obj) == ("payload_b64" in obj):
        raise InvalidMessage(f"{where}: give exactly one of payload (text) and payload_b64")
    if "payload" in obj:
        if not isinstance(obj["payload"], str):
            raise InvalidMessage(f"{where}: payload must be a string (use payload_b64 for bytes)")
        payload = obj["payload"].encode("utf-8", "surrogatepass")
    else:
        try:
            payload = base64.b64decode(obj["payload_b64"], validate=True)
        except (binascii.Error, TypeError, ValueError):
            raise InvalidMessage(f"{where}: payload_b64 is not base64") from None
    own_key = obj.get("key", key)
    if own_key is not None and not isinstance(own_key, str):
        raise InvalidMessage(f"{where}: key must be a string or null")
    own = obj.get("headers")
    if own is not None and not isinstance(own, dict):
        raise InvalidMessage(f"{where}: headers must be an object or null")
    merged = {**(headers or {}), **(decode_json_bytes(own) or {})} or None
    return payload, own_key, merged


def check_ttl(ttl: float | None) -> None:
    """Raise ``InvalidConfig`` unless ``ttl`` is None or seconds from 0 (none) to ``MAX_TTL``."""
    if ttl is not None and not 0 <= ttl <= MAX_TTL:
        raise InvalidConfig(f"--ttl must be a number of seconds from 0 to {MAX_TTL:g} (0: none), "
                            f"not {ttl:g}")


def publish_batches(broker: Broker, queue: str, items: Iterable[tuple[str, Item]], batch: int,
                    stop: Callable[[], bool] | None = None,
                    ttl: float | None = None) -> PublishReport:
    """Publish ``(where, item)`` pairs ``batch`` per commit, each message with ``ttl`` seconds to
    live (None or 0: none); return the ``PublishReport``. Each message is checked against the
    queue's limits as it is read, so a bad one is named by its ``where``; an error says how
    many messages the batches before it published (a quota's refusal, ``QueueFull``, comes as
    a ``PartqError`` saying so)."""
    if type(batch) is not int or batch < 1:
        raise InvalidConfig("--batch must be at least 1")
    check_ttl(ttl)
    config = broker.queue_config(queue)                  # QueueNotFound before reading input
    report = PublishReport(queue)
    pending: list[Item] = []
    first = ""
    try:
        for where, item in items:
            try:
                encode_item(config, item, 0)
            except InvalidMessage as exc:
                raise InvalidMessage(f"{where}: {exc}") from None
            if not pending:
                first = where
            pending.append(item)
            if len(pending) >= batch:
                _publish(broker, report, pending, ttl)
                pending = []
                if stop is not None and stop():
                    report.complete = False
                    return report
        if pending:
            _publish(broker, report, pending, ttl)
    except (InvalidMessage, InvalidConfig, IngressDisabled, StorageFull, QueueFull) as exc:
        done = report.published + report.discarded
        since = f", none from {first} on" if pending else ""
        # QueueFull is built from its fields, not a message: the sentence goes in a PartqError
        error = PartqError if isinstance(exc, QueueFull) else type(exc)
        raise error(f"{exc}; {done} message{'s' if done != 1 else ''} before it "
                    f"{'were' if done != 1 else 'was'} published{since}") from None
    return report


def _publish(broker: Broker, report: PublishReport, items: list[Item],
             ttl: float | None) -> None:
    for res in broker.publish_many(report.queue, items, ttl=ttl):
        if res.discarded:
            report.discarded += 1
            continue
        report.published += 1
        rng = report.partitions.get(res.partition)
        if rng is None:
            report.partitions[res.partition] = PartitionRange(res.partition, 1, res.seq, res.seq)
        else:
            rng.count += 1
            rng.last_seq = max(rng.last_seq, res.seq)
            rng.first_seq = min(rng.first_seq, res.seq)
