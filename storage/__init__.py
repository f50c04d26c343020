"""partq's storage engine: one LMDB environment per directory, one append-only log per partition.

No broker policy lives here: this package stores and reads bytes, ack state and opaque blobs.
"""
from partq.storage.encoding import FORMAT_VERSION, AckState, Record, decode_record, encode_record
from partq.storage.store import Store
from partq.storage.txn import Reader
from partq.storage.writer import Writer

__all__ = ["FORMAT_VERSION", "AckState", "Record", "Reader", "Store", "Writer", "decode_record",
           "encode_record"]
