"""The delivery state a queue's owner persists (one codec), and the view of it that status shows.

The owner writes the blob with every change of assignment, in the same commit (S17): the pure
core's state, the delivery mode it belongs to, and the statuses it computed. Any process reads it
back: a new owner restores the core from it, and ``queue_status`` shows it from a process that
does not run delivery.

    blob = msgpack {"mode": "partitioned" | "exclusive", "core": Rebalancer.to_dict(),
                    "rebalance_status": str, "partition_status": [str per slot]}
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import msgpack

from partq.errors import CorruptStore
from partq.rebalancer import Rebalancer
from partq.states import PartitionState, RebalanceState


@dataclass(frozen=True)
class StoredState:
    mode: str
    core: dict
    rebalance_status: str
    partition_status: list[str]


def encode_state(mode: str, core: Rebalancer) -> bytes:
    return msgpack.packb({
        "mode": mode,
        "core": core.to_dict(),
        "rebalance_status": core.status,
        "partition_status": [core.partition_status(p) for p in range(core.n)],
    }, use_bin_type=True)


def decode_state(blob: bytes | None, what: str) -> StoredState | None:
    """The stored state, or None when there is none. Raises ``CorruptStore`` when damaged."""
    if blob is None:
        return None
    try:
        d = msgpack.unpackb(blob, raw=False)
        return StoredState(d.get("mode", "partitioned"), d["core"], d["rebalance_status"],
                           list(d["partition_status"]))
    except Exception:
        raise CorruptStore(f"the delivery state of {what} is damaged; restore from a DR-standby "
                           f"or backup") from None


@dataclass(frozen=True)
class SlotView:
    partition: int              # the storage partition (PARENT for an exclusive queue)
    status: str
    flow: str | None
    flow_name: str | None
    unacked: int
    error: str | None


@dataclass(frozen=True)
class FlowView:
    flow_id: str
    name: str | None
    bound: bool
    active: bool                # holds partitions (a standby does not)
    partitions: list[int]       # storage partitions, sorted


@dataclass(frozen=True)
class DeliveryView:
    """Statuses, owners and flows of one queue's delivery, live or as last stored."""
    mode: str
    rebalance_status: str
    slots: list[SlotView]
    flows: list[FlowView]


def view_of(core: Rebalancer, index: list[int], rebalance_status: str,
            statuses: list[str] | None, bound: bool,
            live: Callable[[int], tuple[int, str | None]] = lambda sp: (0, None),
            mode: str = "partitioned") -> DeliveryView:
    """The view of ``core`` delivering the storage partitions ``index`` (slot order).
    ``statuses``: the stored statuses to show instead of the core's; ``bound``: whether flows
    shown bound are (False from a process that only read the stored state); ``live(sp)``: the
    unacked count and delivery error of a storage partition."""
    slots = []
    for slot, sp in enumerate(index):
        owner = core.owner[slot] if slot < core.n else None
        info = core.flows.get(owner) if owner else None
        if statuses and slot < len(statuses):
            status = statuses[slot]
        else:
            status = core.partition_status(slot) if slot < core.n else PartitionState.UNASSIGNED
        unacked, error = live(sp)
        slots.append(SlotView(sp, status, owner, info.name if info else None, unacked, error))
    flows = [FlowView(f.flow_id, f.name, f.bound and bound, bool(f.partitions),
                      sorted(index[s] for s in f.partitions if s < len(index)))
             for f in sorted(core.flows.values(), key=lambda f: f.order)]
    return DeliveryView(mode, rebalance_status, slots, flows)


def stored_view(state: StoredState | None, mode: str, index: list[int],
                owner_running: bool) -> DeliveryView:
    """The view a process that does not run delivery shows: the owner's last stored state. When
    no process runs delivery the stored statuses are stale: the core's own (its flows are
    ghosts: Unbound) are shown instead, and rebalancing is Ready."""
    if state is not None and state.mode != mode:
        state = None     # the owner has not applied an access-type change yet
    core = (Rebalancer.restored(state.core, 0, 0, 0) if state is not None
            else Rebalancer(len(index), 0, 0))
    live = state is not None and owner_running
    return view_of(core, index, state.rebalance_status if live else RebalanceState.READY,
                   state.partition_status if live else None, bound=False, mode=mode)
