"""The delivery state a queue's owner persists (one codec), and the view of it that status shows.

The owner writes the blob with every change of assignment, in the same commit (rule `named-flows`): the pure
core's state, the delivery mode it belongs to, and the statuses it computed. Any process reads it
back: a new owner restores the core from it, and ``queue_status`` shows it from a process that
does not run delivery.

    blob = msgpack {"mode": "partitioned" | "exclusive", "core": Rebalancer.to_dict(),
                    "rebalance_status": str, "partition_status": [str per slot]}
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, replace

import msgpack

from partq.core.rebalancer import Rebalancer
from partq.errors import CorruptStore
from partq.states import PartitionState, RebalanceState
from partq.status import FlowStatus


@dataclass(frozen=True)
class StoredState:
    mode: str
    core: dict
    rebalance_status: str
    partition_status: list[str]
    # wall time the holddown of flows that had all left ends, written by a clean close
    holddown_until_ns: int | None = None


def encode_state(mode: str, core: Rebalancer, holddown_until_ns: int | None = None) -> bytes:
    doc: dict = {
        "mode": mode,
        "core": core.to_dict(),
        "rebalance_status": core.status,
        "partition_status": [core.partition_status(p) for p in range(core.n)],
    }
    if holddown_until_ns is not None:
        doc["holddown_until_ns"] = holddown_until_ns
    return msgpack.packb(doc, use_bin_type=True)


def decode_state(blob: bytes | None, what: str) -> StoredState | None:
    """The stored state, or None when there is none. Raises ``CorruptStore`` when damaged."""
    if blob is None:
        return None
    try:
        d = msgpack.unpackb(blob, raw=False)
        return StoredState(d.get("mode", "partitioned"), d["core"], d["rebalance_status"],
                           list(d["partition_status"]), d.get("holddown_until_ns"))
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
    held_keys: int = 0          # ordering="key": keys held back now (rule `key-ordering`)
    held_messages: int = 0      # ... and the messages they hold back
    held_for: list[str] = dataclasses.field(default_factory=list)   # why (``held_view``)
    inflight_keys: list[str] = dataclasses.field(default_factory=list)  # a sample, and
    inflight_key_count: int = -1                      # how many in all (-1: not known here)


@dataclass(frozen=True)
class DeliveryView:
    """Statuses, owners and flows of one queue's delivery, live or as last stored."""
    mode: str
    rebalance_status: str
    slots: list[SlotView]
    flows: list[FlowStatus]
    delayed: int = 0        # partitions of the owner waiting out a nack's delay now


def view_to_doc(view: DeliveryView, clients: dict[str, dict]) -> dict:
    """The view as a msgpack-able document, with what the control server knows of the flows
    of other processes (``clients``: flow id -> client, since, heartbeat_age)."""
    doc = dataclasses.asdict(view)
    for flow in doc["flows"]:
        info = clients.get(flow["flow"])
        if info is not None:
            flow.update(client=info["client"], connected_at=info["since"],
                        heartbeat_age=info["heartbeat_age"])
    return doc


def doc_to_view(doc: dict) -> DeliveryView:
    return DeliveryView(doc["mode"], doc["rebalance_status"],
                        [SlotView(**slot) for slot in doc["slots"]],
                        [FlowStatus(**flow) for flow in doc["flows"]], int(doc.get("delayed", 0)))


def view_of(core: Rebalancer, index: list[int], rebalance_status: str,
            statuses: list[str] | None, bound: bool,
            live: Callable[[int], tuple[int, str | None]] = lambda sp: (0, None),
            mode: str = "partitioned",
            client: Callable[[str], str | None] = lambda fid: None) -> DeliveryView:
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
    flows = [FlowStatus(f.flow_id, f.name, f.bound and bound, bool(f.partitions),
                        sorted(index[s] for s in f.partitions if s < len(index)),
                        client(f.flow_id))
             for f in sorted(core.flows.values(), key=lambda f: f.order)]
    return DeliveryView(mode, rebalance_status, slots, flows)


def stored_view(state: StoredState | None, mode: str, index: list[int],
                owner_running: bool, forgotten: bool = False) -> DeliveryView:
    """The view a process that does not run delivery shows: the owner's last stored state. When
    no process runs delivery the stored statuses are stale: the core's own (its flows are
    ghosts: Unbound) are shown instead, and rebalancing is Ready. ``forgotten``: no process
    has run delivery for longer than its flows could come back in (``ghosts_forgotten``): its
    unnamed flows are not shown and their partitions are Unassigned; named flows stay, since a
    consumer that binds under the same name gets its partitions back (rule `named-flows`)."""
    if state is not None and state.mode != mode:
        state = None     # the owner has not applied an access-type change yet
    if state is None:
        return view_of(Rebalancer(len(index), 0, 0), index, RebalanceState.READY, None,
                       bound=False, mode=mode)
    core = Rebalancer.restored(state.core, 0, 0, 0)
    if not owner_running:
        view = view_of(core, index, RebalanceState.READY, None, bound=False, mode=mode)
        return _named_only(view) if forgotten else view
    return view_of(core, index, state.rebalance_status, state.partition_status, bound=False,
                   mode=mode)


def _named_only(view: DeliveryView) -> DeliveryView:
    """``view`` without its unnamed flows, their partitions Unassigned."""
    gone = {f.flow for f in view.flows if f.name is None}
    slots = [replace(s, status=PartitionState.UNASSIGNED, flow=None, flow_name=None)
             if s.flow in gone else s for s in view.slots]
    return replace(view, slots=slots,
                               flows=[f for f in view.flows if f.flow not in gone])


def ghosts_forgotten(silent_for: float | None, consumer_timeout: float,
                     rebalance_delay: float) -> bool:
    """Whether the flows of a queue's last delivery owner, which has not beaten its lock for
    ``silent_for`` seconds (None: no owner ever ran), are past coming back: it closed or died
    longer ago than ``consumer_timeout`` and the rebalance delay both."""
    return silent_for is not None and silent_for > max(consumer_timeout, rebalance_delay)


class Assignment:
    """The owner's persisted assignment as a process delivering some of its flows reads it:
    who holds each slot under which epoch, which slots are paused for a handoff and to which
    flow each handoff goes."""

    def __init__(self, config, blob: bytes | None) -> None:
        from partq.delivery.layout import delivery_layout
        self.config = config
        mode, self.index = delivery_layout(config)
        state = decode_state(blob, f"queue {config.name!r}")
        self.owner: list[str | None] = [None] * len(self.index)
        self.epoch = [0] * len(self.index)
        self.paused: set[int] = set()
        self.handed_to: dict[int, str] = {}     # slot -> the target of its handoff
        self.bound: set[str] = set()
        if state is None or state.mode != mode:
            return
        core = state.core
        for fid, _name, _order, bound, parts in core["flows"]:
            if bound:
                self.bound.add(fid)
            for slot in parts:
                if slot < len(self.owner):
                    self.owner[slot] = fid
        epochs = core.get("epochs", [])
        for slot in range(min(len(epochs), len(self.epoch))):
            self.epoch[slot] = epochs[slot]
        self.handed_to = {h[0]: h[2] for h in core["handoffs"]}
        self.paused = set(self.handed_to)

    def held_by(self, flow_id: str) -> list[tuple[int, int, int]]:
        """(slot, storage partition, epoch) of every slot ``flow_id`` holds while bound."""
        if flow_id not in self.bound:
            return []
        return [(slot, self.index[slot], self.epoch[slot])
                for slot, owner in enumerate(self.owner) if owner == flow_id]

    def handed_off_to(self, flow_id: str) -> list[tuple[int, int, int]]:
        """(slot, storage partition, epoch) of every slot whose handoff goes to ``flow_id``
        (bound): under ``ordering="key"`` it takes from them before the handoffs end."""
        if flow_id not in self.bound:
            return []
        return [(slot, self.index[slot], self.epoch[slot])
                for slot, target in sorted(self.handed_to.items())
                if target == flow_id and slot < len(self.index)]

    def holds(self, flow_id: str, sp: int, epoch: int, early: bool = False) -> bool:
        """Whether ``flow_id`` holds ``sp`` under ``epoch`` (rule `fencing`). ``early``: it
        took from ``sp`` as the target of its handoff under ``epoch`` (the source's), which
        holds while the handoff goes on and once it ended with the flow owning ``sp`` (the
        next epoch: no other flow held it in between)."""
        if flow_id not in self.bound:
            return False
        try:
            slot = self.index.index(sp)
        except ValueError:
            return False
        if early and self.handed_to.get(slot) == flow_id:
            return self.epoch[slot] == epoch
        return self.owner[slot] == flow_id and self.epoch[slot] == epoch + early
