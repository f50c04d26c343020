"""The requests ``partq serve`` reads, checked at the edge: one table says, for every request,
the fields it takes and what each must be, and ``check_request`` holds a request to it before
the session acts on any of its fields.

A request that fails its check is answered with a typed error (``InvalidAck`` for the messages
an ack, nack or reject names, ``InvalidMessage`` for a publish's items, ``InvalidConfig`` for
the rest), which names the field and what it must be; the connection goes on, as for any
refused request. Only a frame that is no request at all (a bad checksum, not msgpack, not a
map) ends the connection (``partq.wire.frames.read_frame``).

The checks are of types and of the ranges storage can hold (a partition below 2**32, a
sequence below 2**64). What the library checks with its own words (a queue name's
characters, a flow name, a nack's delay, a payload's size) stays the library's, so a client of
``partq serve`` gets the error an embedded caller gets.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, NoReturn

from partq.errors import InvalidAck, InvalidConfig, InvalidMessage, PartqError
from partq.flow import U32, U64
from partq.storage.txn import check_queue_name


class Field(NamedTuple):
    ok: Callable[[object], bool]     # whether a value (None where the field is missing) fits
    what: str                        # what the field must be, for the error
    error: type[PartqError] = InvalidConfig
    own: Callable[[object], object] | None = None    # the library's check, raising in its words


def _int(v: object, high: int) -> bool:
    return type(v) is int and 0 <= v <= high       # (type: True is no partition)


def _pair(v: object) -> bool:
    return type(v) is list and len(v) == 2 and _int(v[0], U32) and _int(v[1], U64)


def _optional(field: Field) -> Field:
    return Field(lambda v: v is None or field.ok(v), field.what + " or nil", field.error)


def _list_of(ok: Callable[[object], bool], what: str,
             error: type[PartqError] = InvalidConfig) -> Field:
    return Field(lambda v: type(v) is list and all(map(ok, v)), what, error)


TEXT = Field(lambda v: type(v) is str, "a string")
QUEUE = Field(TEXT.ok, "a queue name (a string)", own=check_queue_name)
FLOW = Field(TEXT.ok, "the id of a flow bound on this connection (a string)")
FLAG = _optional(Field(lambda v: type(v) is bool, "true or false"))
NUMBER = _optional(Field(lambda v: type(v) in (int, float), "a number of seconds"))
PARTITIONS = _optional(_list_of(lambda v: _int(v, U32),
                                f"a list of partitions (integers from 0 to {U32})"))
PARTITION = Field(lambda v: _int(v, U32), f"a partition (an integer from 0 to {U32})")
SEQ = Field(lambda v: _int(v, U64), f"a sequence (an integer from 0 to {U64})")
COUNT = Field(lambda v: _int(v, U64), f"an integer from 0 to {U64}")
ID = Field(_pair, f"a message, as [partition, seq]: integers from 0 to {U32} and to {U64}",
           InvalidAck)
IDS = _list_of(_pair, "a list of messages, each [partition, seq]", InvalidAck)
ITEMS = _list_of(lambda v: type(v) is list, "a list of messages, each [payload, key, headers]",
                 InvalidMessage)
ATTEMPTS = _list_of(lambda v: type(v) is list and len(v) in (2, 3) and _int(v[0], U32)
                    and _int(v[1], U64) and (len(v) == 2 or v[2] is None or _int(v[2], U64)),
                    "a list of [task_partition, attempt, rows or nil]")

INTEGER = Field(lambda v: type(v) is int, "an integer")
SETTINGS = Field(lambda v: type(v) is dict and all(type(k) is str for k in v),
                 "a map of queue settings, by name")
TEXTS = _list_of(lambda v: type(v) is str, "a list of strings")


def _flow_row(v: object, n: int) -> bool:
    """[flow, partition, seq] (and a nack's delay, n = 4)."""
    return type(v) is list and len(v) == n and type(v[0]) is str and _int(v[1], U32) \
        and _int(v[2], U64) and (n == 3 or v[3] is None or type(v[3]) in (int, float))


def _publish_row(v: object) -> bool:
    """[queue, items, ttl]."""
    return type(v) is list and len(v) == 3 and type(v[0]) is str and type(v[1]) is list \
        and all(type(i) is list for i in v[1]) and (v[2] is None or type(v[2]) in (int, float))


# every request: its fields (a field not named is ignored: a newer client's extra)
REQUESTS: dict[str, dict[str, Field]] = {
    "beat": {},
    "publish": {"queue": QUEUE, "items": ITEMS, "ttl": NUMBER},
    "publish_each": {"queue": QUEUE, "items": ITEMS},
    "bind": {"queue": QUEUE, "name": _optional(Field(TEXT.ok, "a flow name (a string)")),
             "hint": PARTITIONS, "skip_corrupt": FLAG},
    "ack": {"flow": FLOW, "ids": IDS},
    "ack_through": {"flow": FLOW, "partition": PARTITION._replace(error=InvalidAck),
                    "seq": SEQ._replace(error=InvalidAck)},
    "nack": {"flow": FLOW, "id": ID, "delay": NUMBER},
    "reject": {"flow": FLOW, "id": ID,
               "headers": _optional(Field(lambda v: type(v) is dict and all(
                   type(k) is str for k in v), "headers (a map of strings to values)"))},
    "unbind": {"flow": FLOW, "leave": FLAG},
    "transaction": {"txn": Field(lambda v: type(v) is str and 0 < len(v) <= 200,
                                 "a transaction id (a string of 1 to 200 characters)"),
                    "acks": _list_of(lambda v: _flow_row(v, 3), "a list of [flow, partition, seq]",
                                     InvalidAck),
                    "nacks": _list_of(lambda v: _flow_row(v, 4),
                                      "a list of [flow, partition, seq, delay]", InvalidAck),
                    "rejects": _list_of(lambda v: _flow_row(v, 3),
                                        "a list of [flow, partition, seq]", InvalidAck),
                    "publishes": _list_of(_publish_row, "a list of [queue, items, ttl]",
                                          InvalidMessage)},
    "status": {"queue": QUEUE},
    "queues": {},
    "replication": {},
    # the Spark source (partq.jobs.staging.spark_request)
    "logs": {"queue": QUEUE, "known": PARTITIONS},
    "read": {"queue": QUEUE, "qid": Field(lambda v: _int(v, U32), "a queue id"),
             "partition": PARTITION, "start": SEQ, "end": SEQ},
    "stage": {"queue": QUEUE, "job": TEXT, "task_partition": PARTITION, "attempt": COUNT,
              "next_chunk": Field(lambda v: _int(v, 1 << 48), "a chunk number"),
              "payloads": _list_of(lambda v: isinstance(v, bytes), "a list of payloads (bytes)",
                                   InvalidMessage),
              "keys": _list_of(lambda v: v is None or type(v) is str,
                               "a list of keys (strings or nil)", InvalidMessage)},
    "commit_job": {"queue": QUEUE, "job": TEXT, "attempts": ATTEMPTS, "slice_rows": COUNT},
    "abort_job": {"job": TEXT},
    "resume_commits": {"slice_rows": COUNT},
    "ensure_queue": {"queue": QUEUE, "partitions": _optional(COUNT)},
    # administration, and the command line's reads (partq.remote.admin_request): the values
    # are the library's to check (a partition count, a setting, a position), in its words
    "create_queue": {"queue": QUEUE, "partitions": INTEGER, "exist_ok": FLAG,
                     "options": SETTINGS},
    "update_queue": {"queue": QUEUE, "changes": SETTINGS},
    "delete_queue": {"queue": QUEUE},
    "queue_config": {"queue": QUEUE},
    "queue_configs": {},
    "ensure_dead_queue": {"queue": QUEUE},
    "scale": {"queue": QUEUE, "partitions": INTEGER, "online": FLAG, "wait": FLAG},
    "kill_message": {"queue": QUEUE, "partition": INTEGER, "seq": INTEGER},
    "ack_message": {"queue": QUEUE, "partition": INTEGER, "seq": INTEGER},
    "stats": {"queue": _optional(QUEUE)},
    "browse": {"queue": QUEUE, "partition": _optional(INTEGER), "parent": FLAG,
               "from_seq": INTEGER, "to_seq": _optional(INTEGER),
               "key": _optional(TEXT), "limit": INTEGER,
               "resume": _optional(Field(_pair, "a position, as [partition, seq]"))},
    "stranded": {"queue": QUEUE, "parent_depth": _optional(INTEGER)},
    "position": {"queue": QUEUE, "partition": INTEGER, "seq": INTEGER},
    "after": {"queue": QUEUE, "partition": INTEGER},
    "copy_out": {"queue": QUEUE, "to_queue": QUEUE, "partition": _optional(INTEGER),
                 "parent": FLAG, "move": FLAG, "from_seq": _optional(INTEGER),
                 "to_seq": _optional(INTEGER), "batch": INTEGER, "skip_corrupt": FLAG},
    "requeue": {"queue": QUEUE, "to": _optional(QUEUE), "keys": TEXTS, "reasons": TEXTS,
                "limit": INTEGER, "batch": INTEGER, "ignore_interrupted": FLAG},
}

REQ = _optional(Field(lambda v: _int(v, U64), "a request id (an integer)"))
FIX = "; the client sent a request this partq serve cannot read: fix or upgrade it"


def check_request(frame: dict) -> str:
    """The request's ``op``, once every field the table names fits; else the field's error
    (the request changed nothing). The session answers it with an error frame and reads on."""
    op = frame.get("op")
    if not isinstance(op, str) or op not in REQUESTS:
        raise InvalidConfig(f"unknown request {op!r:.80} (this server takes "
                            f"{', '.join(sorted(REQUESTS))}){FIX}")
    fields = REQUESTS[op]
    if not REQ.ok(frame.get("req")):
        _refuse(op, "req", REQ, frame.get("req"))
    for name, field in fields.items():
        value = frame.get(name)
        if field.own is not None:
            field.own(value)
        if not field.ok(value):
            _refuse(op, name, field, value)
    if op == "stage" and len(frame["payloads"]) != len(frame["keys"]):
        raise InvalidMessage(f"request 'stage' needs as many keys as payloads, not "
                             f"{len(frame['keys'])} for {len(frame['payloads'])}{FIX}")
    return op


def _refuse(op: str, name: str, field: Field, value: object) -> NoReturn:
    raise field.error(f"request {op!r} needs {name!r} as {field.what}, not {value!r:.80}{FIX}")
