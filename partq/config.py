"""Queue configuration: what ``create_queue`` accepts, validated once, stored as a dict."""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass

from partq.clock import MAX_SECONDS
from partq.errors import InvalidConfig
from partq.states import AccessType, Partitioner, ScalingState

PARTITIONERS = tuple(p.value for p in Partitioner)
ACCESS_TYPES = tuple(a.value for a in AccessType)
SCALING_STATES = tuple(s.value for s in ScalingState)
ORDERINGS = ("partition", "key")
MAX_PARTITIONS = 1 << 16
DEFAULT_CONSUMER_TIMEOUT = 10.0
# A TTL must keep publish time + TTL inside the unsigned 64-bit nanosecond range a record holds
# (until the year 2554); a century is far below that and far above any use.
MAX_TTL = 100 * 365 * 86400.0
# ASCII only, and \Z, not $: "$" also matches before a trailing newline ("orders\n")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._\-/]{0,199}\Z")


@dataclass(frozen=True)
class QueueConfig:
    """Settings of one queue. Defaults follow the Solace broker where it has one."""

    name: str
    partitions: int = 1
    rebalance_delay: float = 5.0
    max_handoff_time: float = 3.0
    max_delivered_unacked_per_flow: int = 10_000
    partitioner: str = Partitioner.RANDOM
    sticky_batch_size: int = 16_384
    adaptive: bool = True
    partition_availability_timeout: float = 0.0
    max_message_size: int = 10 << 20
    max_key_size: int = 1024
    ingress_enabled: bool = True
    egress_enabled: bool = True
    reject_msg_to_sender: bool = True
    reject_msg_to_sender_when_shutdown: bool = False
    # "non-exclusive": a partitioned queue. "exclusive": a non-partitioned queue (its operating
    # partition count is 0, as Solace says): messages go to the parent queue's own log and one
    # flow at a time receives them, the others standing by. ``partitions`` is kept and is the
    # count again once access is non-exclusive.
    access_type: str = AccessType.NON_EXCLUSIVE
    # Rule `liveness`: a flow of another process (or host) that sends nothing, heartbeats included, for
    # this long is unbound. 10 s: Solace's keepalive notices a dead client in about 9 s (3 x 3 s);
    # Kafka's 45 s session timeout leaves partitions idle four times longer. Heartbeats go every
    # quarter of it, so a busy host must stall for the whole timeout to lose its flows.
    consumer_timeout: float = DEFAULT_CONSUMER_TIMEOUT
    # The message lifecycle (rules `delivery-count` to `max-poll-interval`): when a message that cannot be
    # processed stops coming back, and where it goes.
    max_redelivery: int = 0               # deliveries after the first; 0: redeliver forever
    dead_message_queue: str = ""          # queue of this directory that receives dead messages
    # seconds before the first redelivery after a nack without a delay of its own: small, so a
    # consumer's retry comes soon, and growing, so a handler that always fails does not spin
    # (0.1, 0.2, 0.4 ... 64 s: 6 runs in the first 3 s instead of thousands)
    redelivery_delay: float = 0.1
    redelivery_delay_multiplier: float = 2.0
    redelivery_delay_max: float = 64.0
    max_ttl: float = 0.0                  # every message expires this long after its publish
    max_depth: int = 0                    # quota: messages published and not acked (0: none)
    max_bytes: int = 0                    # quota: bytes of the queue's stored log (0: none)
    # A flow holding unacked messages that has not called receive, ack or nack for this long is
    # unbound (a hung handler); 0 disables. Kafka's name and default.
    max_poll_interval: float = 300.0
    # "partition": a partition delivers in sequence order (the Solace rule). "key": every
    # message of one key in publish order, and what holds one key back holds no other (rule
    # `key-ordering`).
    ordering: str = "partition"
    # Maintained by the broker, not set by users:
    qid: int = 0
    scaling_status: str = ScalingState.READY     # rule `scaling`
    scaling_from: int = 0             # partition count before the scaling in progress
    scaling_to: int = 0               # partition count the scaling in progress ends at
    scaling_online: bool = False      # the scaling in progress keeps per-key order (rule `online-scaling`)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise InvalidConfig(f"queue name {self.name!r} must be 1 to 200 ASCII characters: "
                                f"letters A-Z a-z, digits 0-9 and . _ - /, starting with a "
                                f"letter or digit")
        _check_int("partitions", self.partitions, 1, MAX_PARTITIONS)
        _check_int("max_delivered_unacked_per_flow", self.max_delivered_unacked_per_flow, 1, 1 << 31)
        _check_int("sticky_batch_size", self.sticky_batch_size, 1, 1 << 31)
        _check_int("max_message_size", self.max_message_size, 1, 1 << 30)
        _check_int("max_key_size", self.max_key_size, 1, 1 << 16)
        if isinstance(self.consumer_timeout, bool) or not isinstance(self.consumer_timeout, (int, float)) \
                or not math.isfinite(self.consumer_timeout) or not 0.1 <= self.consumer_timeout <= 3600:
            raise InvalidConfig(f"consumer_timeout must be a number of seconds from 0.1 to 3600, "
                                f"not {self.consumer_timeout!r}")
        for f in ("rebalance_delay", "max_handoff_time", "partition_availability_timeout",
                  "redelivery_delay", "redelivery_delay_max", "max_poll_interval"):
            _check_seconds(f, getattr(self, f), MAX_SECONDS)
        _check_seconds("max_ttl", self.max_ttl, MAX_TTL)
        _check_int("max_redelivery", self.max_redelivery, 0, 1 << 31)
        _check_int("max_depth", self.max_depth, 0, 1 << 62)
        _check_int("max_bytes", self.max_bytes, 0, 1 << 62)
        m = self.redelivery_delay_multiplier
        if isinstance(m, bool) or not isinstance(m, (int, float)) or not math.isfinite(m) \
                or not 1 <= m <= 100:
            raise InvalidConfig(f"redelivery_delay_multiplier must be a number from 1 to 100, "
                                f"not {m!r}")
        dmq = self.dead_message_queue
        if not isinstance(dmq, str) or (dmq and not _NAME.match(dmq)):
            raise InvalidConfig(f"dead_message_queue must be a queue name (1 to 200 ASCII "
                                f"letters, digits and . _ - /) or empty, not {dmq!r}")
        if dmq == self.name:
            raise InvalidConfig(f"queue {self.name!r} cannot be its own dead message queue")
        if self.ordering not in ORDERINGS:
            raise InvalidConfig(f"ordering must be one of {ORDERINGS}, not {self.ordering!r}")
        if self.access_type not in ACCESS_TYPES:
            raise InvalidConfig(f"access_type must be one of {ACCESS_TYPES}, not {self.access_type!r}")
        if self.partitioner not in PARTITIONERS:
            raise InvalidConfig(f"partitioner must be one of {PARTITIONERS}, not {self.partitioner!r}")
        if self.scaling_status not in SCALING_STATES:
            raise InvalidConfig(f"scaling_status must be one of {SCALING_STATES}")
        # the members are their strings: stored, printed and compared as the plain words
        object.__setattr__(self, "access_type", AccessType(self.access_type))
        object.__setattr__(self, "partitioner", Partitioner(self.partitioner))
        object.__setattr__(self, "scaling_status", ScalingState(self.scaling_status))

    @property
    def partitioned(self) -> bool:
        """Whether messages go to partitions (non-exclusive) or to the parent queue (exclusive)."""
        return self.access_type == AccessType.NON_EXCLUSIVE

    @property
    def operating_partitions(self) -> int:
        """Solace's operating partition count: 0 while the queue is exclusive."""
        return self.partitions if self.partitioned else 0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> QueueConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})

    def updated(self, **changes) -> QueueConfig:
        """A copy with user-settable fields changed (the partition count changes by scaling)."""
        refused = set(changes) - USER_SETTABLE
        if refused:
            hint = "; use scale to change the partition count" if "partitions" in refused else ""
            raise InvalidConfig(f"cannot update {', '.join(sorted(refused))}{hint}; settable: "
                                f"{', '.join(sorted(USER_SETTABLE))}")
        return dataclasses.replace(self, **changes)


USER_SETTABLE = frozenset(f.name for f in dataclasses.fields(QueueConfig)) - {
    "name", "partitions", "qid", "scaling_status", "scaling_from", "scaling_to", "scaling_online"}


def _check_seconds(field: str, value, high: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 <= value <= high:
        raise InvalidConfig(f"{field} must be a number of seconds from 0 to {high:g}, not {value!r}")


def redelivery_wait(config: QueueConfig, failures: int) -> float:
    """Seconds before the ``failures``-th redelivery after a nack (rule `retry-delay`):
    ``min(redelivery_delay * multiplier**(failures - 1), redelivery_delay_max)``; 0 at once."""
    if config.redelivery_delay <= 0 or failures < 1:
        return 0.0
    exponent = min(failures - 1, 1000)
    try:
        delay = config.redelivery_delay * config.redelivery_delay_multiplier ** exponent
    except OverflowError:
        delay = math.inf
    return min(delay, config.redelivery_delay_max)


def _check_int(field: str, value, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidConfig(f"{field} must be an integer from {low} to {high}, not {value!r}")
