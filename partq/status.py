"""What ``Broker.queue_status`` reports: plain dataclasses, so tools can print or JSON them.
``partq.status_report`` builds them."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Blocked:
    """The message a stuck partition waits on (``partq.delivery.blocked``): the lowest unacked
    one that came back unacked at least once or waits out a nack's delay. Kill or ack it by its
    position (``Broker.kill_message``, ``partq message kill``) when nobody can process it."""
    partition: int
    seq: int
    key: str | None
    delivery_count: int         # the count its current or next delivery carries
    next_retry: float | None    # wall time (s) a nack's delay ends (None: no delay pending)
    # when it was published, wall ns (None: its record is damaged): it has blocked its
    # partition (or its key) at most since then
    publish_time_ns: int | None
    behind: int = 0             # unacked messages after it in its partition


@dataclass(frozen=True)
class PartitionStatus:
    partition: int              # PARENT (0xFFFFFFFF) for the parent queue of an exclusive queue
    status: str                 # Unassigned | Ready | Paused | Unbound (rule `partition-status`)
    flow: str | None            # flow id holding the partition
    flow_name: str | None
    depth: int                  # messages published and not yet acked
    unacked: int                # delivered and not yet acked (0 when read from another process)
    next_seq: int               # the sequence the next publish gets
    ack_floor: int              # every seq below it is acked
    error: str | None = None    # set when delivery stopped on a corrupt record
    # ordering="key" (rule `key-ordering`): keys held back now by a nack, its delay or an
    # online scaling's cut-over, and the messages they hold back (the delivery owner's own
    # flows; 0 for flows of other processes)
    held_keys: int = 0
    held_messages: int = 0
    # why they are held now: "delay" (a nack's delay), "handoff" (ordering="key": the keys the
    # old flow of a handoff still holds; the partition shows its new flow, Ready), "cut-over"
    # (an online scaling's)
    held_for: list[str] = field(default_factory=list)
    blocked: Blocked | None = None      # the message it is stuck on (None: not stuck)
    # when its oldest unacked message was published, wall ns (None: nothing unacked)
    oldest_unacked_ns: int | None = None


@dataclass(frozen=True)
class FlowStatus:
    flow: str
    name: str | None
    bound: bool
    active: bool
    partitions: list[int]
    client: str | None = None           # "pid P on HOST" of the process the flow lives in
    connected_at: float | None = None   # wall time its process connected (another process)
    heartbeat_age: float | None = None  # seconds since its process was last heard from


@dataclass(frozen=True)
class QueueStatus:
    name: str
    partition_count: int        # the operating count: 0 while the queue is exclusive
    rebalance_status: str       # Ready | Holddown | Rebalancing (rule `rebalance-status`)
    scaling_status: str         # Ready | ScalingUp | ScalingDown (rule `scaling`)
    ingress_enabled: bool
    egress_enabled: bool
    depth: int
    partitions: list[PartitionStatus] = field(default_factory=list)
    flows: list[FlowStatus] = field(default_factory=list)
    delivery_owner: str | None = None   # "pid N on HOST" when a process runs delivery
    # seconds since that process last renewed its delivery lease (rule `owner-takeover`: past
    # the queue's consumer_timeout another process may take delivery over)
    delivery_owner_beat_age: float | None = None
    access_type: str = "non-exclusive"  # "exclusive": non-partitioned, the parent queue delivers
    parent_depth: int = 0       # unacked messages in the parent queue's log (on a partitioned
                                # queue: left behind by a change of access type; copy them out)
    discarded: int = 0          # publishes discarded while ingress was off (rule `ingress-egress`; durable)
    procedure: dict | None = None   # a scaling procedure in progress or interrupted
                                    # (``partq.scaling.Procedure.as_dict``)
    warnings: list[str] = field(default_factory=list)   # what an operator must know now
    # the message lifecycle (durable counts since the queue was created): dead messages by
    # reason, and those discarded for want of a dead message queue (rules `redelivery-limit`,
    # `dead-messages`, `expiry`); publishes the quota refused or discarded (rule `quota`);
    # partitions waiting out a nack's delay now, in the delivery owner (rule `retry-delay`)
    dead: dict = field(default_factory=dict)
    quota_refused: int = 0
    quota_discarded: int = 0
    delayed: int = 0
    cutover: dict | None = None     # an online scaling still draining (rule `online-scaling`): per
                                    # old partition its cut-over seq, messages to ack, messages held
                                    # (``partq.delivery.holds.hold_report``)
    stuck_partitions: int = 0       # partitions with a ``blocked`` message now
    # when its oldest unacked message was published, wall ns (None: nothing unacked); its age
    # is now minus that (``partq stats``, the metric partq_oldest_unacked_age_seconds)
    oldest_unacked_ns: int | None = None

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)
