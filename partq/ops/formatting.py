"""How partq writes values down, for people and for JSON: a partition's label, an error on one
line, bytes and sets in JSON. Shared by the library's messages and copy-out files and by the
``partq`` command's output, so both spell a value the same way.
"""
from __future__ import annotations

import base64
import binascii

from partq.storage.encoding import PARENT


def partition_label(partition: int) -> str:
    """A partition as people read it: its number, or ``parent`` for the parent queue's log
    (``partq.PARENT``, 4294967295, which ``--json`` output and files keep as the integer)."""
    return "parent" if partition == PARENT else str(partition)


def one_line(message: str) -> str:
    """``message`` with every run of whitespace (newlines included) as one space."""
    return " ".join(str(message).split())


def jsonable(value):
    """``json.dumps`` default: bytes (in headers, which msgpack allows) become
    ``{"$base64": "..."}``; sets become sorted lists. Returns the JSON-ready value; raises
    ``TypeError`` for anything else, as ``json.dumps`` expects."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$base64": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def held_text(p) -> str | None:
    """What holds a partition's messages back (a ``PartitionStatus``; rule `key-ordering`), as
    "2 keys, 5 messages (handoff, delay)"; None when nothing is held."""
    if not (p.held_keys or p.held_messages or p.held_for):
        return None
    if not (p.held_keys or p.held_messages):    # ordering="partition": the whole partition
        return ", ".join(p.held_for)
    text = f"{p.held_keys} key{'s' if p.held_keys != 1 else ''}, {p.held_messages} " \
           f"message{'s' if p.held_messages != 1 else ''}"
    return text + (f" ({', '.join(p.held_for)})" if p.held_for else "")


def decode_json_bytes(value):
    """Undo ``partq.ops.formatting.jsonable`` on JSON values: ``{"$base64": "..."}`` is bytes again."""
    if isinstance(value, dict):
        if set(value) == {"$base64"} and isinstance(value["$base64"], str):
            try:
                return base64.b64decode(value["$base64"], validate=True)
            except (binascii.Error, ValueError):
                return value
        return {k: decode_json_bytes(v) for k, v in value.items()}
    if isinstance(value, list):
        return [decode_json_bytes(v) for v in value]
    return value
