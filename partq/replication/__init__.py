"""DR-standby replication over TCP (rules `replication` and `listener-security`).

The rooms: ``role`` (what a process plays: follow, serve, promote), ``protocol`` (options,
frame bounds and checks), ``primary`` (the listener's side), ``standby`` (the follower),
``gate`` (sync mode's wait for a standby), ``slots`` (what the primary keeps per standby, and
its bound), ``snapshot`` (one in flight, streamed into the standby's own directory),
``timeline`` (histories, so a standby never follows a primary whose commits are not its own),
``supersede`` (an old primary accepting, only from its promoted standby, that it must refuse
writes), ``fencer`` (the promoted store telling it), ``status`` (what both report). Frames
and the handshake are ``partq.wire``'s (import them from ``partq.wire.frames``); the listener
is ``partq.wire.listener``'s.
"""
from partq.errors import ReplicationRefused, ReplicationTimeout
from partq.replication.fencer import wait_told
from partq.replication.primary import ReplicationServer
from partq.replication.protocol import (
    MAX_FRAME,
    ReplicationOptions,
    check_sync_timeout,
    replication_options,
)
from partq.replication.slots import SlotKeeper, drop_slot, list_slots, stored_status
from partq.replication.snapshot import install_snapshot
from partq.replication.standby import StandbyFollower, followed, promote_store
from partq.replication.status import ReplicationStatus, StandbyLink
from partq.replication.supersede import clear_superseded
from partq.replication.sync_gate import SyncGate

__all__ = ["MAX_FRAME", "ReplicationOptions", "ReplicationRefused", "ReplicationServer",
           "ReplicationStatus", "ReplicationTimeout", "SlotKeeper", "StandbyFollower",
           "StandbyLink", "SyncGate", "check_sync_timeout", "clear_superseded", "drop_slot",
           "followed", "install_snapshot", "list_slots", "promote_store", "replication_options",
           "stored_status", "wait_told"]
