"""partq's storage engine: one LMDB environment per directory, one append-only log per partition.

No broker policy lives here: this package stores and reads bytes, ack state and opaque blobs.
The names below load on first use (``partq.storage.errors`` or ``.checksum`` alone loads
neither LMDB nor msgpack).
"""
import importlib
from typing import TYPE_CHECKING

_LAZY = {"FORMAT_VERSION": "encoding", "AckState": "encoding", "Record": "encoding",
         "decode_record": "encoding", "encode_record": "encoding", "Store": "store",
         "Reader": "txn", "Writer": "writer"}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'partq.storage' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"partq.storage.{_LAZY[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*(n for n in globals() if n.startswith("__")), *__all__})


if TYPE_CHECKING:
    from partq.storage.encoding import FORMAT_VERSION as FORMAT_VERSION
    from partq.storage.encoding import AckState as AckState
    from partq.storage.encoding import Record as Record
    from partq.storage.encoding import decode_record as decode_record
    from partq.storage.encoding import encode_record as encode_record
    from partq.storage.store import Store as Store
    from partq.storage.txn import Reader as Reader
    from partq.storage.writer import Writer as Writer
