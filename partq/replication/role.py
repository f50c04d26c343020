"""A directory's replication role in one process: a DR-standby following its primary, a primary
serving standbys, or a primary that serves none (and still keeps ``max_slot_keep``).

``Broker`` holds one and asks it whether writes are allowed, for the replication status, and
to promote; the role owns the threads of whichever side it plays. It loads the side it plays
when it starts to play it: a primary that serves no standby (every `partq` command, a service
without ``replication_listen``) loads no listener, follower, TLS or handshake code.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

from partq.errors import InvalidConfig
from partq.replication.link_watch import LinkWatch
from partq.replication.settings import STANDBY_ROLE, fence_state, is_standby, slot_keep
from partq.replication.slots import SlotKeeper, stored_status
from partq.replication.status import ReplicationStatus

if TYPE_CHECKING:
    from partq.replication.fencer import Fencer
    from partq.replication.primary import ReplicationServer
    from partq.replication.protocol import ReplicationOptions
    from partq.replication.standby import StandbyFollower
    from partq.storage import Store

log = logging.getLogger("partq.broker")


def replication_options(token: str | bytes | None, token_file: str | None, ssl_context,
                        max_slot_keep: int | None) -> ReplicationOptions | None:
    """``Broker.open``'s replication options checked and gathered, or None when none is given
    (the defaults, loaded only if a side is played)."""
    if token is None and token_file is None and ssl_context is None and max_slot_keep is None:
        return None
    from partq.replication.protocol import replication_options as gather
    return gather(token, token_file, ssl_context, max_slot_keep)


def _or_defaults(options: ReplicationOptions | None) -> ReplicationOptions:
    from partq.replication.protocol import ReplicationOptions
    return options if options is not None else ReplicationOptions()


class ReplicationRole:
    """What this process does for replication; ``standby`` while the directory is one."""

    def __init__(self, store: Store) -> None:
        self.store = store
        with store.read() as r:
            self.standby = is_standby(r)
        self.server: ReplicationServer | None = None     # on a primary that listens
        self.follower: StandbyFollower | None = None     # on a standby that follows
        self.link_watch: LinkWatch | None = None         # logs links and lag alarms
        self.fencer: Fencer | None = None        # a promoted store telling its old primary

    def follow(self, primary: str, options: ReplicationOptions | None, has_queues: bool) -> None:
        """Follow ``primary`` as its DR-standby (making a new directory one)."""
        from partq.replication.standby import FOLLOWED, StandbyFollower
        if not self.standby:
            if has_queues:
                raise InvalidConfig(f"{self.store.path} already holds queues; a DR-standby must "
                                    f"start from a new directory")
            self.store.write(lambda w: w.put_local_meta(b"role", STANDBY_ROLE))
            self.standby = True
        with self.store.read() as r:
            followed = r.meta(FOLLOWED)
        if followed != primary.encode():     # what a promotion tells it is superseded
            self.store.write(lambda w: w.put_local_meta(FOLLOWED, primary.encode()))
        self.follower = StandbyFollower(self.store, primary, _or_defaults(options))
        self._watch()

    def serve(self, listen: str | None, mode: str, sync_timeout: float,
              options: ReplicationOptions | None) -> None:
        """As a primary: serve standbys on ``listen``, or (None) only keep the change log's
        bound for the slots other processes serve."""
        if listen:
            self._serve(listen, mode, sync_timeout, _or_defaults(options))
        else:
            keep = None if options is None else options.max_slot_keep
            SlotKeeper(self.store, slot_keep(keep, self.store.max_map_size))
        self._fence(options)

    def _serve(self, listen: str, mode: str, sync_timeout: float,
               options: ReplicationOptions) -> None:
        from partq.replication.primary import ReplicationServer
        self.server = ReplicationServer(self.store, listen, mode, sync_timeout, options)
        self._watch()

    def promote(self, listen: str | None, mode: str, sync_timeout: float,
                options: ReplicationOptions | None) -> None:
        """Stop following and become a primary on a new timeline (serving ``listen``)."""
        if not self.standby:
            raise InvalidConfig(f"{self.store.path} is not a DR-standby; nothing to promote")
        follow_options = options
        if self.follower is not None:
            follow_options = self.follower.options
            self.follower.close()
            self.follower = None
        from partq.replication.standby import promote_store
        self.store.write(promote_store)
        self.standby = False
        if listen:
            self._serve(listen, mode, sync_timeout, _or_defaults(options))
        log.info("%s promoted: it is a primary now", self.store.path)
        self._fence(follow_options)

    def _fence(self, options: ReplicationOptions | None) -> None:
        """Tell the old primary it is superseded, if this store was promoted and has not yet
        (``fencer``), with ``options`` (token, TLS) to reach it."""
        with self.store.read() as r:
            pending = fence_state(r)[0] is not None
        if pending and self.fencer is None:
            from partq.replication.fencer import Fencer
            self.fencer = Fencer(self.store, _or_defaults(options))

    def status(self) -> ReplicationStatus:
        """Role, link state and lag (in messages and seconds); on a promoted store, the old
        primary it has not told yet."""
        if self.follower is not None:
            return self.follower.status()
        if self.server is not None:
            st = self.server.status()
        else:
            st = stored_status(self.store, "standby" if self.standby else "primary")
        if self.standby:
            return st
        with self.store.read() as r:
            pending, error = fence_state(r)
        return dataclasses.replace(st, fence_pending=pending, fence_error=error)

    @property
    def address(self) -> str | None:
        """The HOST:PORT the replication listener is bound to (None when not listening)."""
        return None if self.server is None else self.server.address

    def _watch(self) -> None:
        if self.link_watch is None:
            self.link_watch = LinkWatch(self.status)

    def close(self) -> None:
        if self.fencer is not None:
            self.fencer.close()
        if self.link_watch is not None:
            self.link_watch.close()
        if self.follower is not None:
            self.follower.close()
        if self.server is not None:
            self.server.close()
