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

The names below load on first use (``partq.lazy``): importing one module of this room does
not import the others."""
from typing import TYPE_CHECKING

from partq.errors import ReplicationRefused as ReplicationRefused
from partq.errors import ReplicationTimeout as ReplicationTimeout
from partq.lazy import lazy_names

_NAMES = {"wait_told": "fencer", "ReplicationServer": "primary", "MAX_FRAME": "protocol",
          "ReplicationOptions": "protocol", "check_sync_timeout": "settings",
          "replication_options": "protocol", "SlotKeeper": "slots", "drop_slot": "slots",
          "list_slots": "slots", "stored_status": "slots", "install_snapshot": "snapshot",
          "StandbyFollower": "standby", "followed": "standby", "promote_store": "standby",
          "ReplicationStatus": "status", "StandbyLink": "status", "clear_superseded": "supersede",
          "SyncGate": "sync_gate"}

__all__ = sorted([*_NAMES, "ReplicationRefused", "ReplicationTimeout"])
__getattr__, __dir__ = lazy_names(__name__, _NAMES)

if TYPE_CHECKING:
    from partq.replication.fencer import wait_told as wait_told
    from partq.replication.primary import ReplicationServer as ReplicationServer
    from partq.replication.protocol import MAX_FRAME as MAX_FRAME
    from partq.replication.protocol import ReplicationOptions as ReplicationOptions
    from partq.replication.protocol import replication_options as replication_options
    from partq.replication.settings import check_sync_timeout as check_sync_timeout
    from partq.replication.slots import SlotKeeper as SlotKeeper
    from partq.replication.slots import drop_slot as drop_slot
    from partq.replication.slots import list_slots as list_slots
    from partq.replication.slots import stored_status as stored_status
    from partq.replication.snapshot import install_snapshot as install_snapshot
    from partq.replication.standby import StandbyFollower as StandbyFollower
    from partq.replication.standby import followed as followed
    from partq.replication.standby import promote_store as promote_store
    from partq.replication.status import ReplicationStatus as ReplicationStatus
    from partq.replication.status import StandbyLink as StandbyLink
    from partq.replication.supersede import clear_superseded as clear_superseded
    from partq.replication.sync_gate import SyncGate as SyncGate
