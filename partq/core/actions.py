"""What the rebalancer core (``rebalancer.py``) emits, its actions, which the broker's shell
carries out in order, and what it keeps per flow and per handoff."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Pause:
    """Stop delivering partition ``p`` to its flow; new and undelivered messages stay."""
    p: int


@dataclass(frozen=True, slots=True)
class Assign:
    """Partition ``p`` now belongs to ``flow`` (None: to nobody, e.g. removed by scaling)."""
    p: int
    flow: str | None


@dataclass(frozen=True, slots=True)
class Redeliver:
    """Deliver ``p`` again from its ack floor: unacked messages go out again, in order, marked
    redelivered (the previous owner is gone or timed out)."""
    p: int


@dataclass(frozen=True, slots=True)
class Resume:
    """Delivery of ``p`` to its (new) owner may proceed."""
    p: int


@dataclass(frozen=True, slots=True)
class FlowActive:
    """FlowChangeUpdate: ``flow`` became active (holds partitions) or inactive (holds none)."""
    flow: str
    active: bool


Action = Pause | Assign | Redeliver | Resume | FlowActive


@dataclass(slots=True)
class FlowInfo:
    flow_id: str
    name: str | None
    order: int
    bound: bool = True
    partitions: set[int] = field(default_factory=set)


@dataclass(slots=True)
class Handoff:
    source: str
    target: str
    deadline: float
