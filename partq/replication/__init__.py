"""DR-standby replication over TCP (S27, seed 001's DR steps): the primary (``primary``), the
standby (``standby``), what both report (``status``); frames are ``partq.wire``'s."""
from partq.errors import ReplicationTimeout
from partq.replication.primary import ReplicationServer, SyncGate
from partq.replication.standby import StandbyFollower, install_snapshot
from partq.replication.status import ReplicationStatus, StandbyLink, stored_slots_status
from partq.wire import MAX_FRAME, FrameError, parse_address, recv_frame, send_frame

__all__ = ["MAX_FRAME", "FrameError", "ReplicationServer", "ReplicationStatus", "ReplicationTimeout",
           "StandbyFollower", "StandbyLink", "SyncGate", "install_snapshot", "parse_address",
           "recv_frame", "send_frame", "stored_slots_status"]
