"""The vocabulary of statuses and settings, as ``StrEnum``s: each member *is* its string, so the
values stored on disk, printed and written in ``--json`` are the plain words of the seeds."""
from __future__ import annotations

from enum import StrEnum


class PartitionState(StrEnum):
    """S5: a partition's status."""
    UNASSIGNED = "Unassigned"
    READY = "Ready"
    PAUSED = "Paused"
    UNBOUND = "Unbound"


class RebalanceState(StrEnum):
    """S10: a queue's rebalancing status."""
    READY = "Ready"
    HOLDDOWN = "Holddown"
    REBALANCING = "Rebalancing"


class ScalingState(StrEnum):
    """S18: a queue's scaling status."""
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
    """S2: the partitioner of unkeyed messages."""
    RANDOM = "random"
    STICKY = "sticky"
