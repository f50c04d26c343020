"""The delivering process's part in handoffs under ``ordering="key"`` in which a flow of another
process takes part (rule `key-ordering`; how the target knows what the source holds:
``peers.peer_handoff``). A mixin of ``QueueDelivery``, which provides the state declared here.

* A source here, a target of another process: the partition is settled when the handoff starts
  (``settle_for_remote_target``), so that the target can read from the store what the source
  holds.
* A source of another process, a target here: the target takes from a cursor started again from
  the settled state (``take_from_store``), remembered per slot with its target until the handoff
  ends. When it ends with the target owning the partition the cursor goes on (its refresh only
  takes the source's last acks in: ``Cursor.draining``); when it ends any other way (the target
  left, a scaling dropped the handoff) what the target held is counted and the partition is the
  source's process's again (``drop_from_store``)."""
from __future__ import annotations

from collections.abc import Callable

from partq.core.rebalancer import Rebalancer
from partq.delivery.cursor import Cursor
from partq.delivery.flow_state import FlowState
from partq.delivery.key_handoff import Hold
from partq.delivery.peers.peer_handoff import early_from_store


class RemoteHandoffs:
    qid: int
    core: Rebalancer
    parts: list[Cursor]
    flows: dict[str, FlowState]
    store_early: dict[int, str]         # slot -> the target here taking from it from the store

    def _settle_ops(self, ps: Cursor) -> list:
        raise NotImplementedError

    def _forget_inflight(self, ps: Cursor) -> None:
        raise NotImplementedError

    def settle_for_remote_target(self, slot: int) -> list:
        """Under "key", a handoff of a partition this process delivers to a flow of another
        process: settle it now (the writes), so that the target can read from the store what
        the source holds and take from the partition before the handoff ends."""
        h = self.core.handoffs.get(slot)
        target = self.flows.get(h.target) if h is not None else None
        ps = self.parts[slot]
        if target is None or target.remote is None or ps.keyed is None or ps.remote_held \
                or ps.stale:
            return []
        return self._settle_ops(ps)

    def take_from_store(self, slot: int, reader, gate: Hold | None,
                        target: str) -> tuple[Cursor, Hold] | None:
        """The cursor of ``slot`` (``remote_held``: its handoff's source is a flow of another
        process) for ``target`` to take from, and its hold; None until the source's process
        settled the partition."""
        found = early_from_store(self.parts[slot], reader, self.qid, gate)
        if found is not None:
            self.parts[slot] = found[0]
            self.store_early[slot] = target
        return found

    def drop_from_store(self, ps: Cursor) -> list:
        """The target that took from ``ps`` from the store does no more (it left, or the handoff
        ended without giving it the partition): what it held counts as lost and the mark is
        made exact for the source's process, which delivers the partition on (the writes)."""
        ops = self._settle_ops(ps)
        self._forget_inflight(ps)
        ps.draining = None
        if ps.keyed is not None:
            ps.keyed.clear()
        return ops

    def sweep_from_store(self) -> list[Callable]:
        """After the core's actions: forget the takes from the store whose handoffs ended,
        dropping those whose target did not get the partition (the writes)."""
        ops: list[Callable] = []
        for slot, target in list(self.store_early.items()):
            ps = self.parts[slot] if slot < len(self.parts) else None
            h = self.core.handoffs.get(slot)
            if ps is not None and ps.draining is not None and h is not None \
                    and h.target == target:
                continue                            # still under way
            del self.store_early[slot]
            if ps is None or ps.draining is None or (slot < self.core.n
                                                     and self.core.owner[slot] == target):
                continue                            # ended: the target goes on with it
            ops += self.drop_from_store(ps)
        return ops
