"""The vocabulary of statuses and settings, as ``StrEnum``s: each member *is* its string, so the
values stored on disk, printed and written in ``--json`` are the plain words of Solace's documents."""
from __future__ import annotations

from enum import StrEnum


class PartitionState(StrEnum):
    """A partition's status (rule `partition-status`)."""
    UNASSIGNED = "Unassigned"
    READY = "Ready"
    PAUSED = "Paused"
    UNBOUND = "Unbound"


class RebalanceState(StrEnum):
    """A queue's rebalancing status (rule `rebalance-status`)."""
    READY = "Ready"
    HOLDDOWN = "Holddown"
    REBALANCING = "Rebalancing"


class ScalingState(StrEnum):
    """A queue's scaling status (rule `scaling`)."""
    READY = "Ready"
    SCALING_UP = "ScalingUp"
    SCALING_DOWN = "ScalingDown"


class AccessType(StrEnum):
    """Partitioned ("non-exclusive") or not ("exclusive": one consumer at a time)."""
    NON_EXCLUSIVE = "non-exclusive"
    EXCLUSIVE = "exclusive"


class DeliveryMode(StrEnum):
    """How a queue's owner delivers: its partitions, or the parent queue's log."""
    PARTITIONED = "partitioned"
    EXCLUSIVE = "exclusive"


class Partitioner(StrEnum):
    """The partitioner of unkeyed messages (rule `unkeyed-partitioner`)."""
    RANDOM = "random"
    STICKY = "sticky"
