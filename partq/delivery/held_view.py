"""What holds a partition's messages back now, as ``queue_status`` shows it (rule
`key-ordering`): per partition the keys and messages held, and why.

Reasons (``SlotView.held_for``):
* ``"delay"``: a nack's delay: the partition waits (``ordering="partition"``), or under "key" the
  nacked message's key waits;
* ``"handoff"``: under "key", a handoff whose new flow takes from the partition already: the
  partition shows that flow, Ready, and the keys its old flow still holds unacked (the draining
  keys) are held until acked or ``max_handoff_time``. (Under "partition" a handoff shows as the
  partition's status, Paused.)
* ``"cut-over"``: an online scaling's cut-over: a moved key's messages wait until its old
  partition drained.

Under "key" a partition also carries the keys in flight on it (``inflight_keys``, at most
``KEY_SAMPLE`` of them, and ``inflight_key_count``): the keys a handoff of it would hold, which
the rebalance dry-run names. A partition a flow of another process holds shows what that flow
last reported held on it (it reports with its acks, receives and nacks: ``peer_holds``), and
its keys in flight as not known (count -1). A handoff into a flow of another process shows that
flow, Ready, once it reported what it holds back there (it takes from the partition already:
``handed_to_remote``); a handoff from one into a flow of this process shows the new flow, Ready,
as between two flows of this process.
"""
from __future__ import annotations

import dataclasses

from partq.delivery.key_handoff import early_slots
from partq.delivery.saved_state import SlotView
from partq.states import PartitionState

KEY_SAMPLE = 20


def held_slot(view: SlotView, ps, slot: int, core, flows: dict, parts: list,
              now: float) -> SlotView:
    """``view`` (a slot of ``QueueDelivery.view``) with what holds messages back on cursor
    ``ps`` (``slot`` in ``core``) now, and the keys in flight on it."""
    reasons, keys, unkeyed, messages = _holds(ps, now)
    keyed = ps.keyed
    if keyed is not None:
        h = core.handoffs.get(slot)
        if h is not None and (slot, h.source) in early_slots(core, flows, parts, h.target):
            if ps.draining is not None:     # the source is a flow of another process
                keys |= {k for k in ps.draining.values() if k is not None}
            else:
                keys |= {k for s, f in ps.inflight.items()
                         if f == h.source and (k := keyed.keys.get(s)) is not None}
            reasons.append("handoff")
            target = flows.get(h.target)
            view = dataclasses.replace(view, status=PartitionState.READY, flow=h.target,
                                       flow_name=target.name if target is not None else None)
    if ps.held_by is not None:
        reasons.append("cut-over")
    if keyed is None:
        return dataclasses.replace(view, held_for=reasons)
    inflight = sorted({k for s in ps.inflight if (k := keyed.keys.get(s)) is not None})
    return dataclasses.replace(view, held_keys=len(keys) + unkeyed, held_messages=messages,
                               held_for=reasons, inflight_keys=inflight[:KEY_SAMPLE],
                               inflight_key_count=len(inflight))


def _holds(ps, now: float) -> tuple[list[str], set[str], int, int]:
    """What cursor ``ps`` itself holds back (a nack's delay, messages passed over): (reasons,
    keys held, unkeyed messages held, messages held). A cut-over (``ps.held_by``) is the
    callers' to add, after a handoff, so that ``held_for`` keeps its order."""
    reasons: list[str] = []
    keys: set[str] = set()
    unkeyed = messages = 0
    if ps.wait_until > now:
        reasons.append("delay")
    if ps.keyed is not None:
        for key, _suspect, not_before in ps.keyed.pending.values():
            if key is not None:
                keys.add(key)
            else:
                unkeyed += 1
            if not_before > now and "delay" not in reasons:
                reasons.append("delay")
        messages = len(ps.keyed.pending)
    return reasons, keys, unkeyed, messages


def handed_to_remote(view: SlotView, slot: int, core, flows: dict) -> SlotView | None:
    """``view`` of a partition under "key" whose handoff goes to a flow of another process that
    takes from it already (it reported what it holds back on it): that flow, Ready, with its
    report and ``"handoff"``; None otherwise."""
    h = core.handoffs.get(slot)
    target = flows.get(h.target) if h is not None else None
    if target is None or target.remote is None or slot not in target.reported_held:
        return None
    shown = reported_slot(dataclasses.replace(view, status=PartitionState.READY, flow=h.target,
                                              flow_name=target.name),
                          target.reported_held[slot])
    return dataclasses.replace(shown, held_for=["handoff", *(r for r in shown.held_for
                                                             if r != "handoff")])


def peer_holds(ps, now: float) -> list | None:
    """What a flow of another process reports of its cursor ``ps`` (``[held_keys,
    held_messages, held_for]``), for the owner's status to show (``reported_slot``); None
    when nothing is held."""
    reasons, keys, unkeyed, messages = _holds(ps, now)
    if ps.held_by is not None:
        reasons.append("cut-over")
    if not reasons and not messages:
        return None
    return [len(keys) + unkeyed, messages, reasons]


def reported_slot(view: SlotView, reported: list | None) -> SlotView:
    """``view`` of a partition a flow of another process holds, with what that flow last
    reported of it (``peer_holds``); unchanged when it reported nothing held. Its keys in
    flight stay not known here (count -1), and the rebalance dry-run says so."""
    if reported is None:
        return view
    try:
        keys, messages, reasons = reported[:3]
        return dataclasses.replace(view, held_keys=int(keys), held_messages=int(messages),
                                   held_for=[str(r) for r in reasons])
    except (TypeError, ValueError):
        return view             # a malformed report shows nothing rather than failing status
