"""``partq init``, ``partq stats`` and ``partq demo``: the store as a whole."""
from __future__ import annotations

import os
import time

import click

from partq.tools import store_ops
from partq.tools.common import App, UserError, pass_app, read_only_option
from partq.tools.output import Output, human_size, on_off, output_options
from partq.tools.queue_cmds import queue_notes

DEMO_MARK = ".partq-demo"


@click.command()
@output_options
@pass_app
def init(app: App, out: Output) -> None:
    """Create the store in --data DIR (reports whether it was already there)."""
    with app.broker(create=True) as broker:
        report = broker.open_report
    doc = {"path": app.path, **report}
    if out.json:
        out.doc(doc)
        return
    if report["created"]:
        out.echo(f"created a partq store in {app.path}")
    else:
        out.echo(f"{app.path} already holds a partq store")
    if report["stale_readers_cleared"]:
        out.echo(f"cleared {report['stale_readers_cleared']} stale reader slot(s) left by "
                 f"processes that died")


@click.command()
@click.argument("queue", required=False)
@read_only_option
@output_options
@pass_app
def stats(app: App, queue: str | None, out: Output) -> None:
    """Per-queue depth, discards, dead messages, quota refusals, statuses and flows, and the
    store's sizes.

    DISCARDED counts the publishes the queue discarded: while its ingress was off, or over its
    --max-depth or --max-bytes with --reject-msg-to-sender off (--json: discarded and
    quota_discarded); DEAD its dead messages (expired, delivered --max-redelivery times, or
    rejected: moved to its dead message queue, or discarded without one); QUOTA REFUSED the
    publishes its --max-depth or --max-bytes refused; STUCK the partitions stuck on a message
    that came back unacked (`partq queue show QUEUE` names it); OLDEST the age of the oldest
    unacked message (--json: stuck_partitions, and oldest_unacked_publish_time_ns, when it was
    published: null when nothing is unacked).

    PARTITIONS is the operating count: 0 for an exclusive (non-partitioned) queue. Sizes: the
    file on disk; its high-water mark (used_bytes: the most of it ever in use; the file never
    shrinks, freed pages are reused); the live data the store needs now (live_bytes); the map
    (address space, not disk).
    """
    with app.reading(network=True) as broker:
        doc = store_ops.stats(app, broker, queue)
        notes = [] if out.json else queue_notes(app, broker, doc["queues"])
    queues = doc["queues"]
    usage = {"path": doc["path"], **doc["store"]}
    if out.json:
        out.doc({"store": usage, "queues": queues})
        return
    where = usage["path"] + (f" (through partq serve at {app.address})" if app.address else "")
    out.echo(f"store {where}: file {human_size(usage['file_size'])} (high-water mark "
             f"{human_size(usage['used_bytes'])}, live data {human_size(usage['live_bytes'])}), "
             f"map {human_size(usage['map_size'])}, readers "
             + (f"{usage['readers']}/{usage['max_readers']}" if usage["readers"] is not None
                else "unknown (read without lock.mdb)"))
    if usage["writer_stopped_pid"]:
        out.echo(f"WARNING: pid {usage['writer_stopped_pid']} is stopped while it holds the "
                 f"store's write lock: every publish and ack waits for it; resume it (kill "
                 f"-CONT {usage['writer_stopped_pid']}) or end it")
    if usage["disk_full"]:
        out.echo("WARNING: the disk is full: publishes fail, acks still run; free space on it")
    if not queues:
        out.echo("no queues")
        return
    out.echo()
    out.table(["QUEUE", "PARTITIONS", "DEPTH", "ACCESS", "DISCARDED", "DEAD", "QUOTA REFUSED",
               "STUCK", "OLDEST", "REBALANCE", "SCALING", "FLOWS", "ACTIVE", "INGRESS", "EGRESS"],
              [[q["name"], q["partitions"], q["depth"], q["access_type"], _discarded(q),
                q["dead"], q["quota_refused"], q["stuck_partitions"],
                _age(q["oldest_unacked_publish_time_ns"]),
                q["rebalance_status"] or "unknown", q["scaling_status"], q["flows"],
                q["active_flows"], on_off(q["ingress_enabled"]), on_off(q["egress_enabled"])]
               for q in queues])
    for q in queues:
        if q["error"]:
            out.warn(q["error"])
    for note in notes:
        out.warn(note)


def _age(since_ns: int | None) -> str | None:
    """The age of a message published at wall time ``since_ns``, as "12s"."""
    return None if since_ns is None else f"{max(0, time.time_ns() - since_ns) / 1e9:.0f}s"


def _discarded(row: dict) -> int | None:
    """Publishes a queue discarded, while its ingress was off and over its quota."""
    if row["discarded"] is None:
        return None
    return row["discarded"] + (row["quota_discarded"] or 0)


@click.command()
@click.option("--data", "demo_data", metavar="DIR",
              help="Directory for the demo store [default: --data if given, else demo-data].")
@click.option("--force", is_flag=True, help="Replace DIR even if it holds something else.")
@output_options
@click.pass_context
def demo(ctx: click.Context, demo_data: str | None, force: bool, out: Output) -> None:
    """Run a short story (7 partitions, 4 consumers, a graceful handoff) in a fresh store.

    The demo deletes and recreates its directory, so it refuses a non-empty directory that an
    earlier demo did not create, unless --force is given.
    """
    from partq import demo as demo_module
    root = ctx.find_root()
    if demo_data is None:
        given = root.get_parameter_source("data") != click.core.ParameterSource.DEFAULT
        demo_data = root.params["data"] if given else "demo-data"
    path = os.path.abspath(demo_data)
    if os.path.exists(path) and not force:
        if not os.path.isdir(path):
            raise UserError(f"{path} is a file; pass --data with a directory for the demo")
        if os.listdir(path) and not os.path.exists(os.path.join(path, DEMO_MARK)):
            raise UserError(f"{path} is not empty and was not made by `partq demo`, which deletes "
                            f"its directory; pass another --data, or --force to replace it")
    if out.json:
        import contextlib
        import io
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            demo_module.run(path)
        _mark(path)
        out.doc({"path": path, "output": buf.getvalue().splitlines()})
        return
    demo_module.run(path)
    _mark(path)


def _mark(path: str) -> None:
    with open(os.path.join(path, DEMO_MARK), "w") as f:
        f.write("made by `partq demo`; the next demo run replaces this directory\n")
