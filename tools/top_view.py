"""What ``partq top`` draws: rich tables of queues, partitions, flows, replication and the store,
from a ``partq.metrics.sampling.Snapshot`` and the rates since the one before. Dead messages,
nack delays and quotas get a table of their own, of the queues that have any (the queues table
fills 80 columns already)."""
from __future__ import annotations

import time

from rich.console import Group
from rich.table import Table
from rich.text import Text

from partq.metrics.sampling import Rates, Snapshot, dead_total, flow_unacked
from partq.ops.formatting import held_text
from partq.storage.encoding import PARENT
from partq.tools.output import human_size, printable


def _t(value) -> Text:
    """A name from the store or a peer, shown as text (never read as rich markup)."""
    return Text(printable(str(value)))


def _rate(v: float) -> str:
    return f"{v:,.0f}" if v >= 10 or v == 0 else f"{v:.1f}"


def _part(p: int) -> str:
    return "parent" if p == PARENT else str(p)


def _table(title: str, *columns: str) -> Table:
    table = Table(title=title, title_justify="left", title_style="bold", expand=False,
                  pad_edge=False, box=None, header_style="bold cyan")
    for i, name in enumerate(columns):
        table.add_column(name, justify="left" if i == 0 or name in ("STATUS", "FLOW", "PROCESS",
                                                                     "QUEUE", "REBALANCE",
                                                                     "SCALING", "STANDBY")
                         else "right", no_wrap=True)
    return table


def render(snap: Snapshot, r: Rates, interval: float, max_partitions: int) -> Group:
    parts: list = [Text.assemble(
        ("partq top", "bold"), f"  {snap.source}  ",
        (time.strftime("%H:%M:%S"), "dim"), f"  every {interval:g} s  ", ("q quits", "dim"))]
    parts.append(_queues(snap, r))
    lifecycle = _lifecycle(snap)
    if lifecycle is not None:
        parts.append(lifecycle)
    for name, error in sorted(snap.errors.items()):
        parts.append(Text(printable(f"queue {name}: {error}"), style="red"))
    for q in snap.queues:        # a stopped delivery owner, an interrupted scaling
        for warning in q.warnings:
            parts.append(Text(printable(f"queue {q.name}: {warning}"), style="yellow"))
    parts.append(_partitions(snap, r, max_partitions))
    parts.append(_flows(snap, r))
    parts.append(_replication(snap))
    if snap.store is not None:
        s = snap.store
        parts.append(Text(f"store: live {human_size(s['live'])}, high-water "
                          f"{human_size(s['high_water'])}, file {human_size(s['file_size'])}, map "
                          f"{human_size(s['map_size'])}"))
    return Group(*parts)


def _queues(snap: Snapshot, r: Rates) -> Table:
    t = _table("queues", "QUEUE", "DEPTH", "IN/s", "OUT/s", "PARTS", "REBALANCE", "SCALING",
               "FLOWS", "INGRESS", "EGRESS")
    for q in snap.queues:
        active = sum(1 for f in q.flows if f.bound and f.active)
        t.add_row(q.name, f"{q.depth:,}", _rate(r.published.get(q.name, 0.0)),
                  _rate(r.acked.get(q.name, 0.0)), str(q.partition_count), q.rebalance_status,
                  q.scaling_status, f"{active}/{len(q.flows)}",
                  "on" if q.ingress_enabled else "off", "on" if q.egress_enabled else "off")
    if not snap.queues and not snap.errors:
        t.add_row("(no queues)")
    return t


LIFECYCLE_NOTE = "NO DMQ: dead, discarded (no dead message queue); REFUSED, DISCARDED: by quota"


def _lifecycle(snap: Snapshot) -> Group | None:
    """Dead messages by reason, delayed partitions and the quota's refusals and discards, of
    the queues where any is not 0 (None when no queue has any)."""
    t = _table("dead messages, nack delays, quotas", "QUEUE", "DEAD", "REDELIV", "EXPIRED",
               "REJECTED", "NO DMQ", "DELAYED", "REFUSED", "DISCARDED")
    shown = 0
    for q in snap.queues:
        dead = dead_total(q)
        if not (dead or q.delayed or q.quota_refused or q.quota_discarded):
            continue
        t.add_row(q.name, f"{dead:,}", *(f"{q.dead.get(k, 0):,}" for k in (
            "max_redelivery", "expired", "rejected", "discarded")),
            f"{q.delayed:,}", f"{q.quota_refused:,}", f"{q.quota_discarded:,}")
        shown += 1
    return Group(t, Text(LIFECYCLE_NOTE, style="dim")) if shown else None


def _partitions(snap: Snapshot, r: Rates, most: int) -> Table:
    t = _table("partitions", "QUEUE", "P", "DEPTH", "IN/s", "OUT/s", "UNACKED", "STATUS", "FLOW",
               "HELD")
    for q in snap.queues:
        shown = sorted(q.partitions, key=lambda p: (-p.depth, p.partition))[:most]
        for p in sorted(shown, key=lambda p: p.partition):
            t.add_row(q.name, _part(p.partition), f"{p.depth:,}",
                      _rate(r.partition_published.get((q.name, p.partition), 0.0)),
                      _rate(r.partition_acked.get((q.name, p.partition), 0.0)), f"{p.unacked:,}",
                      p.status, _t(p.flow_name or p.flow or "-"), held_text(p) or "-")
        if len(q.partitions) > most:
            t.add_row(q.name, "...", f"{len(q.partitions) - most} more")
    return t


def _flows(snap: Snapshot, r: Rates) -> Table:
    t = _table("flows", "QUEUE", "FLOW", "PROCESS", "STATUS", "PARTITIONS", "UNACKED", "ACK/s")
    for q in snap.queues:
        for f in q.flows:
            status = "unbound" if not f.bound else "active" if f.active else "standby"
            t.add_row(q.name, _t(f.name or f.flow), _t(f.client or "-"), status,
                      ",".join(_part(p) for p in f.partitions) or "-", f"{flow_unacked(q, f):,}",
                      _rate(r.flow_acked.get((q.name, f.flow), 0.0)))
    return t


def _replication(snap: Snapshot) -> Table | Text:
    st = snap.replication
    if not st or "role" not in st:
        return Text(printable(f"replication: {(st or {}).get('error', 'unknown')}"))
    if st["role"] == "standby":
        return Text(printable(f"replication: DR-standby of {st.get('primary') or '?'}, "
                    f"{'connected' if st['connected'] else 'not connected'}, lag "
                    f"{st['lag_messages']:,} messages / {st['lag_seconds']:.1f} s"))
    t = _table(f"replication: primary ({st.get('mode') or 'no listener'})", "STANDBY",
               "CONNECTED", "LAG MSGS", "LAG S", "ADDRESS")
    for link in st.get("standbys", []):
        t.add_row(_t(link["standby_id"]), "yes" if link["connected"] else "no",
                  f"{link['lag_messages']:,}", f"{link['lag_seconds']:.1f}",
                  _t(link.get("address") or "-"))
    if not st.get("standbys"):
        t.add_row("(none)")
    return t
