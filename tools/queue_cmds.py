"""``partq queue create|list|show|update|delete``: thin wrappers over the Broker's queue API."""
from __future__ import annotations

import time

import click

from partq.errors import DeliveryLocked, QueueNotFound
from partq.ops.copy_out import Stranded
from partq.ops.formatting import held_text, partition_label
from partq.ops.stats import dead_total, queue_rows
from partq.tools import store_ops
from partq.tools.common import App, UserError, confirm, pass_app, read_only_option
from partq.tools.output import Output, config_doc, on_off, output_options, printable, truncate
from partq.tools.queue_settings import setting_options

# the fields of a ``partq.ops.stats.queue_row`` that ``queue list --json`` reports, in its order
LIST_FIELDS = ("name", "access_type", "partitions", "ingress_enabled", "egress_enabled",
               "scaling_status", "depth", "discarded", "parent_depth", "rebalance_status", "flows",
               "delivery_owner", "error", "warnings")



@click.group()
def queue() -> None:
    """Create, list, show, update and delete queues."""


@queue.command("create")
@click.argument("name")
@click.option("--partitions", "-p", type=int, default=1, show_default=True,
              help="Number of partitions (1 to 65536).")
@setting_options
@click.option("--exist-ok", is_flag=True,
              help="Succeed when queue NAME exists already; its settings stay as they are and "
                   "are printed (--json: \"created\": false).")
@output_options
@pass_app
def create(app: App, name: str, partitions: int, settings: dict, exist_ok: bool,
           out: Output) -> None:
    """Create queue NAME.

    NAME is 1 to 200 ASCII letters, digits and . _ - /, starting with a letter or digit.
    """
    with app.broker(network=True) as broker:
        before = {c.qid for c in broker.queues()} if exist_ok else set()
        config = broker.create_queue(name, partitions=partitions, exist_ok=exist_ok, **settings)
        warnings = _dead_queue_warnings(broker, config)
    created = config.qid not in before
    for warning in warnings:
        out.warn(warning)
    if out.json:
        # "warnings" only when there are: the document stays as it was otherwise
        out.doc({**config_doc(config), "created": created,
                 **({"warnings": warnings} if warnings else {})})
        return
    what = "created" if created else "queue exists already:"
    if not config.partitioned:
        out.echo(f"{what} queue {name!r}, exclusive: not partitioned, one consumer at a time")
    else:
        out.echo(f"{what} queue {name!r} with {config.partitions} partition"
                 f"{'s' if config.partitions != 1 else ''}")


@queue.command("list")
@read_only_option
@output_options
@pass_app
def list_queues(app: App, out: Output) -> None:
    """List queues with their access types, partition counts, depths and statuses.

    PARTITIONS is the operating count: 0 for an exclusive (non-partitioned) queue."""
    with app.reading(network=True) as broker:
        rows = [{k: row[k] for k in LIST_FIELDS if k in row} for row in queue_rows(broker)]
        notes = [] if out.json else queue_notes(app, broker, rows)
    if out.json:
        out.doc({"queues": rows})
        return
    if not rows:
        out.echo("no queues; create one with `partq queue create NAME --partitions N`")
        return
    out.table(["NAME", "PARTITIONS", "DEPTH", "ACCESS", "INGRESS", "EGRESS", "REBALANCE",
               "SCALING", "FLOWS", "DELIVERY OWNER"],
              [[r["name"], r["partitions"], r["depth"], r["access_type"],
                on_off(r["ingress_enabled"]),
                on_off(r["egress_enabled"]), r["rebalance_status"] or "unknown",
                r["scaling_status"], r["flows"], r["delivery_owner"]] for r in rows])
    for r in rows:
        if r["error"]:
            out.warn(r["error"])
    for note in notes:
        out.warn(note)


def queue_notes(app: App, broker, rows: list[dict]) -> list[str]:
    """The warnings to print after a table of queue rows (``partq.ops.stats.queue_row``): each
    queue's status warnings, then what a change of access type stranded in its parent queue."""
    notes = []
    for row in rows:
        notes += row.get("warnings", [])
        left = store_ops.stranded(app, broker, row["name"], row["parent_depth"])
        if left is not None:
            notes.append(stranded(left))
    return notes


def stranded(left: Stranded) -> str:
    """What to say about the messages a change to non-exclusive left in a queue's parent queue:
    move them into the partitions, or (a copy into the queue itself covers them already) only
    remove them from the parent queue."""
    name, count = left.queue, left.count
    text = (f"parent queue: {count} message{'s' if count != 1 else ''} left by a change of access "
            f"type; not delivered; ")
    if left.copied:
        return text + (f"already copied into its partitions; remove them from the parent "
                       f"queue with `partq copy-out {name} --parent --to-queue {name} "
                       f"--move`")
    return text + (f"move them into the partitions with `partq copy-out {name} --parent "
                   f"--to-queue {name} --move`")


@queue.command("show")
@click.argument("name")
@read_only_option
@output_options
@pass_app
def show(app: App, name: str, out: Output) -> None:
    """Show the configuration, statuses, partitions and flows of queue NAME.

    Its lifecycle counts, since the queue was created: dead messages by reason (expired,
    delivered --max-redelivery times, rejected), those of them discarded for want of a dead
    message queue, publishes its quota refused or discarded, and the partitions waiting out a
    nack's redelivery delay now. HELD says why a partition's messages wait now (a nack's
    delay, a handoff's draining keys, an online scaling's cut-over; under --ordering key how
    many keys and messages).

    BLOCKED lists the partitions stuck on a message that came back unacked (a poison message):
    its seq, key, delivery count, when it is retried and how long ago it was published. `partq
    message kill` (to the dead message queue) or `partq message ack` clears it at once.

    An exclusive (non-partitioned) queue has one log, its parent queue's, shown as partition
    "parent"; the parent queue's log is partition 4294967295 (partq.PARENT) in --json.
    """
    with app.reading(network=True) as broker:
        config = broker.queue_config(name)
        st = broker.queue_status(name)
        left = store_ops.stranded(app, broker, name, st.parent_depth)
    note = None if left is None else stranded(left)
    for warning in st.warnings:
        out.warn(warning)
    if out.json:
        out.doc({"config": config_doc(config), "status": st.as_dict()})
        return
    out.echo(f"queue {name}")
    out.table(["SETTING", "VALUE"], [[k, _show_value(v)] for k, v in config_doc(config).items()
                                     if k != "name"], indent="  ")
    out.echo()
    out.echo(f"  access {st.access_type}  partitions {st.partition_count}  depth {st.depth}"
             f"  rebalance {st.rebalance_status}  scaling {st.scaling_status}"
             f"  ingress {on_off(st.ingress_enabled)}  egress {on_off(st.egress_enabled)}")
    if st.access_type == "exclusive":
        out.echo("  exclusive: not partitioned; its parent queue (partition \"parent\") delivers "
                 "to one flow at a time, the others stand by")
    elif note:
        out.echo(f"  {note}")
    if st.procedure is not None and st.procedure["state"] == "running":
        p = st.procedure
        out.echo(f"  scaling procedure to {p['to_partitions']} partitions running at step "
                 f"{p['step']} (pid {p['pid']} on {p['host']})")
    if st.cutover is not None:
        c = st.cutover
        out.echo(f"  online scaling {c['from_partitions']} -> {c['to_partitions']} draining: a "
                 f"moved key's new messages wait until its old partition is acked to the cut-over")
        out.table(["OLD PARTITION", "CUT-OVER SEQ", "TO ACK", "HELD" if c["held_exact"]
                   else "HELD (at least)"],
                  [[o["partition"], o["cut_seq"], o["remaining"], o["held"]]
                   for o in c["old_partitions"]], indent="    ")
    beat = "" if st.delivery_owner_beat_age is None else \
        f" (lease renewed {st.delivery_owner_beat_age:.1f} s ago)"
    out.echo(f"  delivery owner: {st.delivery_owner or 'none (no process runs delivery)'}{beat}")
    _show_lifecycle(out, st)
    _show_blocked(out, name, st)
    out.echo()
    errors = any(p.error for p in st.partitions)
    held = any(held_text(p) for p in st.partitions)
    out.table(["PARTITION", "STATUS", "FLOW", "DEPTH", "UNACKED", "NEXT SEQ", "ACK FLOOR"]
              + (["HELD"] if held else []) + (["ERROR"] if errors else []),
              [[partition_label(p.partition), p.status, p.flow_name or p.flow, p.depth,
                p.unacked, p.next_seq, p.ack_floor] + ([held_text(p)] if held else [])
               + ([p.error] if errors else []) for p in st.partitions], indent="  ")
    out.echo()
    if st.flows:
        now = time.time()
        out.table(["FLOW", "NAME", "BOUND", "ACTIVE", "PROCESS", "CONNECTED", "LAST HEARD",
                   "PARTITIONS"],
                  [[f.flow, f.name, f.bound, f.active, f.client,
                    None if f.connected_at is None else f"{now - f.connected_at:.0f}s ago",
                    None if f.heartbeat_age is None else f"{f.heartbeat_age:.1f}s ago",
                    ",".join(partition_label(p) for p in f.partitions) or None]
                   for f in st.flows], indent="  ")
    else:
        out.echo("  no flows")


def _show_lifecycle(out: Output, st) -> None:
    """The lifecycle block of ``queue show``: dead messages, quota refusals, delayed
    partitions."""
    dead = st.dead
    reasons = ", ".join(f"{reason} {n}" for reason, n in dead.items() if reason != "discarded")
    out.echo(f"  dead messages {dead_total(dead)} ({reasons}), of them discarded "
             f"{dead.get('discarded', 0)} (no dead message queue to go to)")
    out.echo(f"  quota refused {st.quota_refused}, quota discarded {st.quota_discarded}; "
             f"partitions waiting out a nack's delay {st.delayed}")


def _show_blocked(out: Output, name: str, st) -> None:
    """The poison view of ``queue show``: per stuck partition the message it waits on
    (``PartitionStatus.blocked``), and how to clear it."""
    blocked = [p.blocked for p in st.partitions if p.blocked is not None]
    if not blocked:
        return
    out.echo()
    n = len(blocked)
    out.echo(f"  BLOCKED: {n} partition{'s' if n != 1 else ''} stuck on a message that came back "
             f"unacked (under ordering \"key\" only its key waits)")
    now = time.time()
    out.table(["PARTITION", "SEQ", "KEY", "DELIVERY COUNT", "NEXT RETRY", "STUCK FOR",
               "BEHIND IT"],
              [[partition_label(b.partition), b.seq,
                None if b.key is None else truncate(printable(b.key), 32), b.delivery_count,
                "now" if b.next_retry is None else f"in {max(0.0, b.next_retry - now):.1f}s",
                None if b.publish_time_ns is None
                else f"{max(0.0, now - b.publish_time_ns / 1e9):.1f}s", b.behind]
               for b in blocked], indent="    ")
    first = blocked[0]
    out.echo(f"    clear one nobody can process: `partq message kill {name} "
             f"{partition_label(first.partition)} {first.seq}` (to the dead message queue) or "
             f"`partq message ack {name} {partition_label(first.partition)} {first.seq}`")


def _dead_queue_warnings(broker, config) -> list[str]:
    """What to say when the dead message queue ``config`` names cannot take dead messages now
    (it does not exist, or its ingress is off): they would be discarded, counted."""
    name = config.dead_message_queue
    if not name:
        return []
    try:
        target = broker.queue_config(name)
    except QueueNotFound:
        return [f"dead message queue {name!r} does not exist: until it does, dead messages of "
                f"queue {config.name!r} are discarded (counted); create it with `partq queue "
                f"create {name}`"]
    if not target.ingress_enabled:
        return [f"dead message queue {name!r} has its ingress off: until it is on, dead "
                f"messages of queue {config.name!r} are discarded (counted)"]
    return []


def _show_value(v) -> str:
    if isinstance(v, bool):
        return on_off(v)
    return str(v)


@queue.command("update")
@click.argument("name")
@setting_options
@click.option("--partitions", type=int, hidden=True,
              help="Refused: the partition count changes with `partq scale`.")
@click.option("--yes", "-y", is_flag=True,
              help="Do not ask for confirmation (asked only for a change of access type).")
@output_options
@pass_app
def update(app: App, name: str, settings: dict, partitions: int | None, yes: bool,
           out: Output) -> None:
    """Change settings of queue NAME (use `partq scale` to change the partition count).

    A change of --access-type unbinds every flow and asks for confirmation first (--yes to
    skip): to exclusive, the messages in the partitions are deleted; to non-exclusive, messages
    left in the parent queue are no longer delivered (move them into the partitions with
    `partq copy-out NAME --parent --to-queue NAME --move`).
    """
    if partitions is not None:
        raise click.UsageError(f"the partition count changes with `partq scale {name} "
                               f"--partitions {partitions}` (the seven-step scaling procedure), "
                               f"not with update")
    if not settings:
        raise click.UsageError("nothing to update; pass at least one setting, e.g. --ingress off")
    with app.broker(network=True) as broker:
        current = broker.queue_config(name)
        before = current.to_dict()
        access = settings.get("access_type", current.access_type)
        if access != current.access_type:
            st = broker.queue_status(name)
            confirm(yes, _access_question(name, access, st),
                    f"pass --yes to change queue {name!r} to {access}")
        updated = broker.update_queue(name, **settings)
        after = updated.to_dict()
        note = None
        if access != current.access_type and access == "non-exclusive":
            left = store_ops.stranded(app, broker, name, broker.queue_status(name).parent_depth)
            note = None if left is None else stranded(left)
        warnings = _dead_queue_warnings(broker, updated) if "dead_message_queue" in settings \
            else []
    changed = {k: [before[k], after[k]] for k in settings if before[k] != after[k]}
    for warning in warnings:
        out.warn(warning)
    if out.json:
        out.doc({"queue": name, "changed": changed, "config": config_doc(updated),
                 **({"warnings": warnings} if warnings else {})})
        return
    if not changed:
        out.echo(f"queue {name!r}: nothing changed")
        return
    out.echo(f"updated queue {name!r}")
    out.table(["SETTING", "BEFORE", "AFTER"],
              [[k, _show_value(a), _show_value(b)] for k, (a, b) in changed.items()], indent="  ")
    if note:
        out.echo(f"  {note}")


def _access_question(name: str, access: str, st) -> str:
    """The confirmation of a change of access type: what it unbinds and deletes or strands."""
    bound = len(st.flows) if st.delivery_owner else 0
    flows = (f"its {bound} flow{'s' if bound != 1 else ''} (delivered by {st.delivery_owner}) "
             f"{'are' if bound != 1 else 'is'} unbound" if bound else "no flow is bound now")
    if access == "exclusive":
        what = (f"the {st.depth} unacked message{'s' if st.depth != 1 else ''} in its "
                f"{st.partition_count} partition{'s' if st.partition_count != 1 else ''} are "
                f"deleted")
    else:
        what = (f"the {st.parent_depth} message{'s' if st.parent_depth != 1 else ''} in its "
                f"parent queue stay there, no longer delivered (move them into the partitions "
                f"with `partq copy-out {name} --parent --to-queue {name} --move`)")
    return f"Change queue {name!r} to {access}? {flows}, and {what}."


@queue.command("delete")
@click.argument("name")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@output_options
@pass_app
def delete(app: App, name: str, yes: bool, out: Output) -> None:
    """Delete queue NAME and every message in it.

    Refused while another process runs the queue's delivery (a service that bound a consumer
    to it, or `partq serve`): the error names that process; stop it first.
    """
    with app.broker(network=True) as broker:
        config = broker.queue_config(name)
        if not yes:
            st = broker.queue_status(name)
            # the parent queue's log goes too (an exclusive queue's depth is already its own)
            depth = st.depth + (st.parent_depth if st.access_type == "non-exclusive" else 0)
            confirm(yes, f"Delete queue {name!r} and its {depth} unacked messages?",
                    f"pass --yes to delete queue {name!r}")
        try:
            broker.delete_queue(name)
        except DeliveryLocked:
            owner = broker.queue_status(name).delivery_owner or "another process"
            raise UserError(
                f"queue {name!r} cannot be deleted while {owner} runs its delivery (a process "
                f"that bound a consumer to it, or `partq serve`); stop that process, or close "
                f"its Broker, then run `partq queue delete {name}` again") from None
    if out.json:
        out.doc({"queue": name, "deleted": True, "partitions": config.operating_partitions})
    else:
        out.echo(f"deleted queue {name!r}")
