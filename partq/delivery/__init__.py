"""Delivery in the process that owns a queue's delivery: the dispatcher (lock, timers, write
submissions, wake-ups), one runtime per queue (cursors, in-flight messages, flow states, the
shell around the pure rebalancer), the persisted state codec, and the delivery lock."""
from partq.delivery.dispatcher import Dispatcher
from partq.delivery.flow_state import FlowState
from partq.delivery.layout import ack_parent_log, delivery_layout, describe_mode
from partq.delivery.local_endpoint import LocalEndpoint
from partq.delivery.lock import DeliveryLock, queue_holder
from partq.delivery.queue_delivery import QueueDelivery

__all__ = ["DeliveryLock", "Dispatcher", "FlowState", "LocalEndpoint",
           "QueueDelivery", "ack_parent_log", "delivery_layout", "describe_mode", "queue_holder"]
