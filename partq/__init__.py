"""partq: an embedded, durable, partitioned-queue broker on LMDB.

    import partq
    with partq.Broker.open("data/") as broker:
        broker.create_queue("orders", partitions=4)
        broker.publish("orders", b"payload", key="customer-42")
        flow = broker.bind("orders", name="svc-a")
        for msg in flow.receive(max_messages=100, timeout=1.0):
            flow.ack(msg)

The names below load on first use, so that ``import partq.storage`` (the storage engine, which
stands alone) does not load the broker.
"""
import logging as _logging
from typing import TYPE_CHECKING

from partq.errors import __all__ as _error_names

# a library logs; the application decides where it goes (without this, Python's last-resort
# handler would print partq's warnings on stderr of every program that imports it)
_logging.getLogger("partq").addHandler(_logging.NullHandler())

__version__ = "0.1.0"

_LAZY = {
    "Broker": "partq.broker", "Flow": "partq.flow", "ManualClock": "partq.clock",
    "SystemClock": "partq.clock", "QueueConfig": "partq.config",
    "key_partition": "partq.core.key_hash", "FlowChangeUpdate": "partq.message",
    "Message": "partq.message", "PublishResult": "partq.message", "Pending": "partq.pending",
    "FlowStatus": "partq.status", "PartitionStatus": "partq.status",
    "QueueStatus": "partq.status", "PARENT": "partq.storage.encoding",
    "connect": "partq.remote.client", "Client": "partq.remote.client",
    **dict.fromkeys(_error_names, "partq.errors"),
    "Worker": "partq.worker",
}

# submodules reached as attributes, as the README does: ``partq.aio.connect(...)``
_SUBMODULES = {"aio"}

__all__ = sorted([*_LAZY, *_SUBMODULES])


def __getattr__(name: str):
    import importlib  # (already loaded by Python's start-up: no cost, and no global name)
    if name in _SUBMODULES:
        value = importlib.import_module(f"partq.{name}")
    elif name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    else:
        raise AttributeError(f"module 'partq' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The public names (and the module's dunders), not the helpers of the lazy loading."""
    return sorted({*(n for n in globals() if n.startswith("__")), *__all__})


if TYPE_CHECKING:
    from partq import aio as aio

    # redundant aliases mark these as re-exports of the lazy names above
    from partq.broker import Broker as Broker
    from partq.clock import ManualClock as ManualClock
    from partq.clock import SystemClock as SystemClock
    from partq.config import QueueConfig as QueueConfig
    from partq.core.key_hash import key_partition as key_partition
    from partq.errors import *  # noqa: F403  (the typed errors are part of the public API)
    from partq.flow import Flow as Flow
    from partq.message import FlowChangeUpdate as FlowChangeUpdate
    from partq.message import Message as Message
    from partq.message import PublishResult as PublishResult
    from partq.pending import Pending as Pending
    from partq.remote.client import Client as Client
    from partq.remote.client import connect as connect
    from partq.status import FlowStatus as FlowStatus
    from partq.status import PartitionStatus as PartitionStatus
    from partq.status import QueueStatus as QueueStatus
    from partq.storage.encoding import PARENT as PARENT
    from partq.worker import Worker as Worker

del TYPE_CHECKING
