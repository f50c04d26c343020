"""partq: an embedded, durable, partitioned-queue broker on LMDB.

    import partq
    with partq.Broker.open("data/") as broker:
        broker.create_queue("orders", partitions=4)
        broker.publish("orders", b"payload", key="customer-42")
        flow = broker.bind("orders", name="svc-a")
        for msg in flow.receive(max_messages=100, timeout=1.0):
            flow.ack(msg)
"""
from partq import errors as _errors
from partq.errors import *  # noqa: F401,F403  (the typed errors are part of the public API)
from partq.broker import Broker
from partq.clock import ManualClock, SystemClock
from partq.config import QueueConfig
from partq.delivery import InvalidAck
from partq.flow import Flow
from partq.hashing import key_partition
from partq.message import FlowChangeUpdate, Message, PublishResult
from partq.pending import Pending
from partq.status import FlowStatus, PartitionStatus, QueueStatus
from partq.storage.encoding import PARENT

__version__ = "0.1.0"

__all__ = ["Broker", "Flow", "FlowChangeUpdate", "FlowStatus", "InvalidAck", "ManualClock",
           "Message", "PARENT", "PartitionStatus", "Pending", "PublishResult", "QueueConfig", "QueueStatus",
           "SystemClock", "key_partition", *_errors.__all__]
