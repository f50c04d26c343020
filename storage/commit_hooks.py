"""What a ``Store`` offers the code that follows its commits (delivery, replication, metrics):
hooks run in the committing thread after each commit, the change log's guard, the gate that holds
the callers of replicated commits, and the counters of group commit. Each hands its part to the
store's group-commit writer (``partq.storage.group_commit``)."""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from partq.storage.group_commit import ChangeLogGuard, GroupCommitWriter


class CommitHooks:
    """The commit-following part of ``Store`` (a base class of it)."""

    _writer: GroupCommitWriter

    def on_commit(self, fn: Callable[[int], None]) -> None:
        """Call ``fn(appended)`` after every commit of this process, in the thread that made it
        (the writer thread, or a caller's: ``GroupCommitWriter.write_now``), with the number of
        records it appended. It must be quick and must not write."""
        self._writer.add_listener(fn)

    def remove_commit_hook(self, fn: Callable[[int], None]) -> None:
        self._writer.remove_listener(fn)

    def on_commit_changes(self, fn: Callable[[int, frozenset[int]], None]) -> None:
        """Call ``fn(version, qids)`` after every commit of this process, in the thread that
        made it: the store version the commit made (``Store.version()`` reads it until the next
        commit of any process: a reader can tell its own commits from other processes') and
        the qids of the queues it appended records to. It must be quick and must not write."""
        self._writer.add_change_listener(fn)

    def remove_commit_changes_hook(self, fn: Callable[[int, frozenset[int]], None]) -> None:
        self._writer.remove_change_listener(fn)

    def on_commit_stats(self, fn: Callable[[float, int, int], None]) -> None:
        """Call ``fn(seconds, operations, appended)`` in the committing thread after every commit of
        this process (its duration, fsync included; operations and records it carried)."""
        self._writer.add_stats_listener(fn)

    def remove_commit_stats_hook(self, fn: Callable[[float, int, int], None]) -> None:
        self._writer.remove_stats_listener(fn)

    def guard_change_log(self, guard: ChangeLogGuard) -> None:
        """Check ``guard.over`` in every commit of this process that wrote the change log, and
        when it says so run ``guard.trim`` in a transaction of its own right after that commit,
        before the next: a bound on the log that holds at every commit, however busy the
        process (the latest guard wins)."""
        self._writer.change_log_guard = guard

    def remove_change_log_guard(self, guard: ChangeLogGuard) -> None:
        """Remove ``guard`` if it is the guard (another's, set later, stays)."""
        if self._writer.change_log_guard is guard:
            self._writer.change_log_guard = None

    def set_sync_gate(self, gate) -> None:
        """Hold the callers of commits that wrote replicated changes in ``gate`` (its
        ``hold(lsn, pendings, results)`` resolves them later) instead of resolving them at
        once; None resolves at once again."""
        self._writer.sync_gate = gate

    def commit_counts(self) -> tuple[int, int]:
        """(commits, operations) this process's group commit has made since open: operations
        per commit is what group commit saves."""
        return self._writer.commits, self._writer.ops

    @property
    def last_lsn(self) -> int:
        """LSN of the newest commit of this process that wrote the change log (0: none yet)."""
        return self._writer.last_lsn
