"""``partq init``, ``partq stats`` and ``partq demo``: the store as a whole."""
from __future__ import annotations

import os

import click

from partq.errors import PartqError
from partq.tools.common import App, UserError, one_line, pass_app
from partq.tools.output import Output, human_size, on_off, output_options
from partq.tools.queue_cmds import stranded

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
@output_options
@pass_app
def stats(app: App, queue: str | None, out: Output) -> None:
    """Per-queue depth, discards, statuses and flows, and the store's file and map size.

    PARTITIONS is the operating count: 0 for an exclusive (non-partitioned) queue."""
    queues, notes = [], []
    with app.broker() as broker:
        configs = [broker.queue_config(queue)] if queue else broker.queues()
        for config in sorted(configs, key=lambda c: c.name):
            row = {"name": config.name, "access_type": config.access_type,
                   "partitions": config.operating_partitions,
                   "scaling_status": config.scaling_status,
                   "ingress_enabled": config.ingress_enabled,
                   "egress_enabled": config.egress_enabled}
            try:
                st = broker.queue_status(config.name)
            except PartqError as exc:   # e.g. damaged ack state: report the other queues anyway
                row.update(depth=None, discarded=None, parent_depth=None, rebalance_status=None, flows=None,
                           active_flows=None, delivery_owner=None, error=one_line(str(exc)))
            else:
                row.update(partitions=st.partition_count, depth=st.depth, discarded=st.discarded,
                           parent_depth=st.parent_depth, rebalance_status=st.rebalance_status,
                           flows=len(st.flows), active_flows=sum(1 for f in st.flows if f.active),
                           delivery_owner=st.delivery_owner, error=None,
                           warnings=st.warnings)
                notes += st.warnings
                if st.parent_depth and config.partitioned and not out.json:
                    notes.append(stranded(app, broker, config, st.parent_depth))
            queues.append(row)
    with app.store() as store:
        info = store.env.info()
        stat = store.env.stat()
    file_size = os.path.getsize(os.path.join(app.path, "data.mdb"))
    store_doc = {"path": app.path, "file_size": file_size, "map_size": info["map_size"],
                 "used_bytes": (info["last_pgno"] + 1) * stat["psize"],
                 "readers": info["num_readers"], "max_readers": info["max_readers"]}
    if out.json:
        out.doc({"store": store_doc, "queues": queues})
        return
    out.echo(f"store {app.path}: file {human_size(file_size)}, used "
             f"{human_size(store_doc['used_bytes'])}, map {human_size(info['map_size'])}, readers {info['num_readers']}/"
             f"{info['max_readers']}")
    if not queues:
        out.echo("no queues")
        return
    out.echo()
    out.table(["QUEUE", "PARTITIONS", "DEPTH", "ACCESS", "DISCARDED", "REBALANCE", "SCALING",
               "FLOWS", "ACTIVE", "INGRESS", "EGRESS"],
              [[q["name"], q["partitions"], q["depth"], q["access_type"], q["discarded"],
                q["rebalance_status"] or "unknown", q["scaling_status"], q["flows"],
                q["active_flows"], on_off(q["ingress_enabled"]), on_off(q["egress_enabled"])]
               for q in queues])
    for q in queues:
        if q["error"]:
            out.warn(q["error"])
    for note in notes:
        out.warn(note)


@click.command()
@click.option("--data", "demo_data", metavar="DIR",
              help="Directory for the demo store [default: --data if given, else demo-data].")
@click.option("--force", is_flag=True, help="Replace DIR even if it holds something else.")
@output_options
@click.pass_context
def demo(ctx: click.Context, demo_data: str | None, force: bool, out: Output) -> None:
    """Run the seeds' story (7 partitions, 4 consumers, a graceful handoff) in a fresh store.

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
