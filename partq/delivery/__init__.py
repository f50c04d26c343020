"""Delivery in the process that owns a queue's delivery: the dispatcher (lock, timers, write
submissions, wake-ups), one runtime per queue (cursors, in-flight messages, flow states, the
shell around the pure rebalancer), the persisted state codec, and the delivery lock.

The names below load on first use (``partq.lazy``): importing one module of this room does
not import the others."""
from typing import TYPE_CHECKING

from partq.lazy import lazy_names

_NAMES = {"Dispatcher": "dispatcher", "FlowState": "flow_state", "ack_parent_log": "layout",
          "delivery_layout": "layout", "describe_mode": "layout",
          "LocalEndpoint": "local_endpoint", "DeliveryLock": "lock", "queue_holder": "lock",
          "QueueDelivery": "queue_delivery"}

__all__ = sorted(_NAMES)
__getattr__, __dir__ = lazy_names(__name__, _NAMES)

if TYPE_CHECKING:
    from partq.delivery.dispatcher import Dispatcher as Dispatcher
    from partq.delivery.flow_state import FlowState as FlowState
    from partq.delivery.layout import ack_parent_log as ack_parent_log
    from partq.delivery.layout import delivery_layout as delivery_layout
    from partq.delivery.layout import describe_mode as describe_mode
    from partq.delivery.local_endpoint import LocalEndpoint as LocalEndpoint
    from partq.delivery.lock import DeliveryLock as DeliveryLock
    from partq.delivery.lock import queue_holder as queue_holder
    from partq.delivery.queue_delivery import QueueDelivery as QueueDelivery
