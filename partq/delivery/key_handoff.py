"""Handoffs under ``ordering="key"`` (rule `key-ordering`): the partition goes to its new flow at
once, and only the keys its old flow still holds unacked ("draining" keys) wait.

Under ``"partition"`` a handoff pauses its partition until the old flow (the source) acked what
it holds, or ``max_handoff_time`` passed. Under ``"key"`` the rebalancer's handoff runs as
before (its source stays the partition's owner until the handoff ends, so the source's acks
still count), but the new flow (the target) takes from the partition meanwhile, passing over
(into the cursor's pending, ``key_order``) every message of a draining key: the keys of the
messages in flight to the source. A draining key stops draining once the source acked, nacked or
rejected its messages of it; its passed-over messages then go to the target, in order. When the
handoff ends the target owns the partition with what it received kept in flight; what the
source still held (it timed out or left) comes back to the target, marked redelivered and
counted, before any later message of its key (``give_back``) instead of the partition being
read again from its ack floor.

This module covers a source and a target that are both flows of the process that runs the
queue's delivery (every ``partq serve`` client, every flow of a service that embeds the broker)
with the partition delivered here. Where a flow of another process takes part, what the source
holds is read from the store instead (``peers.peer_handoff``; this process's part in such
handoffs: ``remote_handoffs``). A source message of this process whose key this runtime does
not know (handed out before the queue went to ``"key"``) makes its handoff wait as under
``"partition"``.
"""
from __future__ import annotations

from collections.abc import Callable

DRAINING = -1           # what the hold returns for a draining key (any value but None holds)

Hold = Callable[[int, "str | None"], "int | None"]


def early_slots(core, flows: dict, parts: list, flow_id: str) -> list[tuple[int, str]]:
    """``(slot, source)`` of the handoffs into ``flow_id`` it may take from before they end."""
    out = []
    for slot, h in core.handoffs.items():
        if h.target != flow_id or slot >= len(parts):
            continue
        ps, source, target = parts[slot], flows.get(h.source), flows.get(flow_id)
        if ps.keyed is None or ps.keyed.leaving or source is None or target is None \
                or target.remote is not None:
            continue
        if ps.stale or ps.remote_held != (source.remote is not None):
            continue        # (a source of another process: ``peers.peer_handoff``)
        out.append((slot, h.source))
    return sorted(out)


def draining_hold(ps, source: str, gate: Hold | None) -> Hold | None:
    """The hold for the target's take from ``ps``: a message of a key in flight to ``source``
    waits, and so does what ``gate`` holds (an online scaling's cut-over). None when a message
    in flight to the source has a key this runtime does not know: the partition waits."""
    keys: set[str] = set()
    known = ps.keyed.keys
    for seq, fid in ps.inflight.items():
        if fid == source:
            if seq not in known:
                return None
            key = known[seq]
            if key is not None:
                keys.add(key)
    return holding(keys, gate)


def holding(keys: set[str], gate: Hold | None, seqs=()) -> Hold:
    """The hold of a take that passes over every message of ``keys`` (and the messages
    ``seqs``), and what ``gate`` holds (an online scaling's cut-over)."""
    def hold(seq: int, key: str | None) -> int | None:
        if seq in seqs or (key is not None and key in keys):
            return DRAINING
        return gate(seq, key) if gate is not None else None
    return hold


def target_holds(core, ps, slot: int, flow_id: str, seq: int) -> bool:
    """Whether ``flow_id`` is the target of ``slot``'s handoff and received ``seq`` from it:
    its ack (nack, reject) is taken although the source still owns the partition."""
    h = core.handoffs.get(slot)
    return h is not None and h.target == flow_id and ps.inflight.get(seq) == flow_id


def keeps_inflight(ps, owner: str | None) -> bool:
    """Whether a move of ``ps`` to ``owner`` keeps what is in flight (``give_back``) instead of
    reading the partition again from its ack floor: the new owner took from it during a
    handoff under ``"key"`` (reading again would deliver twice what it holds, and mark as
    redelivered what it passed over)."""
    return ps.keyed is not None and owner is not None and ps.keyed.early == owner


def give_back(ps, owner: str, flows: dict) -> None:
    """The partition moved to ``owner``, which keeps what it has in flight: every other flow's
    messages in flight come back (already counted lost by the move), each before any later
    message of its key, marked redelivered."""
    back = sorted(s for s, f in ps.inflight.items() if f != owner)
    for seq in back:
        flow = flows.get(ps.inflight.pop(seq))
        if flow is not None:
            flow.inflight -= 1
    ps.keyed.take_back(back)
    ps.keyed.early = None
