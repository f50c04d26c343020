"""``partq message kill|ack``: an operator unblocks a partition held by a message nobody can
process, by queue, partition and seq (``Broker.kill_message``, ``Broker.ack_message``);
``partq dead requeue``: send a dead message queue's messages back (``partq.ops.requeue``)."""
from __future__ import annotations

import contextlib
import threading

import click

from partq.errors import IngressDisabled, QueueFull, QueueNotFound
from partq.ops import requeue as requeue_ops
from partq.ops import unblock
from partq.ops.formatting import partition_label
from partq.storage.encoding import PARENT
from partq.tools import store_ops
from partq.tools.common import App, UserError, confirm, pass_app, require, stop_on_signals
from partq.tools.output import Output, output_options, printable, truncate


class PartitionParam(click.ParamType):
    """A partition number, or ``parent`` for the parent queue's log (4294967295 too)."""

    name = "partition"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        if str(value).strip().lower() == "parent":
            return PARENT
        try:
            return int(value)
        except ValueError:
            self.fail(f"{value!r} is not a partition number or parent", param, ctx)


def _unacked(app: App, broker, queue: str, partition: int, seq: int) -> str | None:
    """The message at a position as a confirmation names it, or None when there is nothing to
    confirm: it is acked already, or there is no such message (the broker then says so, and
    raises ``PartitionNotFound`` or ``QueueNotFound`` here already where it can)."""
    where = _where(queue, partition, seq)
    source = broker if app.address else broker.store
    for row in store_ops.browse(app, source, queue, partition=partition, from_seq=seq, to_seq=seq,
                            limit=1):
        if row["acked"]:
            return None
        if row.get("corrupt"):
            return f"{where} (a damaged record)"
        key = "" if row["key"] is None else f"key {truncate(printable(row['key']), 32)}, "
        return f"{where} ({key}{row['size']} bytes)"
    return None


def _where_dead(broker, queue: str) -> str | None:
    """The dead message queue a message killed in ``queue`` goes to now (None: discarded)."""
    name = broker.queue_config(queue).dead_message_queue
    if not name:
        return None
    try:
        return name if broker.queue_config(name).ingress_enabled else None
    except QueueNotFound:
        return None


@click.group()
def message() -> None:
    """Kill or ack one message by its position: unblock a partition held by a message nobody
    can process."""


def position_command(name: str):
    """A ``message`` command on QUEUE PARTITION SEQ (the position `partq consume` and `partq
    inspect` show), with --yes and --json: it gets ``app, queue, partition, seq, yes, out``."""
    def decorate(func):
        func = pass_app(func)
        func = output_options(func)
        func = click.option("--yes", "-y", is_flag=True,
                            help="Do not ask for confirmation.")(func)
        func = click.argument("seq", type=int)(func)
        func = click.argument("partition", type=PartitionParam())(func)
        func = click.argument("queue")(func)
        # a negative PARTITION or SEQ reaches the command (one "Error:" line), not click's
        # "no such option"
        return message.command(name, context_settings={"ignore_unknown_options": True})(func)
    return decorate


def _ask(app: App, broker, yes: bool, verb: str, queue: str, partition: int, seq: int,
         consequence: str) -> None:
    """Check the position and confirm ``verb`` on the message there, unless ``yes`` or there is
    nothing to confirm (acked already, or no such message: the broker says so)."""
    require(partition >= 0, f"PARTITION must be a partition number (0 or more) or parent, not "
                            f"{partition}")
    require(seq >= 0, f"SEQ must be 0 or more, not {seq}")
    shown = None if yes else _unacked(app, broker, queue, partition, seq)
    if shown is not None:
        confirm(yes, f"{verb.capitalize()} {shown}? {consequence}",
                f"pass --yes to {verb} message {seq} of partition {partition_label(partition)}")


def _where(queue: str, partition: int, seq: int) -> str:
    return f"message {seq} of partition {partition_label(partition)} of queue {queue!r}"


@position_command("kill")
def kill(app: App, queue: str, partition: int, seq: int, yes: bool, out: Output) -> None:
    """Make message SEQ of PARTITION of QUEUE dead, as a consumer's reject would: it moves to
    the queue's dead message queue with dead_reason "rejected" (discarded and counted without
    one), and the partition flows on.

    PARTITION is a number, or parent for the log of an exclusive queue (as `partq consume` and
    `partq inspect` show positions). Whoever delivers the partition, in this process or
    another, sees it before its next delivery, and a nack's delay pending on the message ends
    at once: the partition goes on without waiting it out. It says what it freed: the
    message's key and deliveries, and the seq the partition delivers next.
    A message acked already is left as it is.
    """
    with app.broker(network=True) as broker:
        dead_queue = _where_dead(broker, queue)
        _ask(app, broker, yes, "kill", queue, partition, seq,
             f"It is moved to dead message queue {dead_queue!r}." if dead_queue else
             "It is discarded (counted): the queue has no dead message queue to take it.")
        was = store_ops.position(app, broker, queue, partition, seq)
        killed = broker.kill_message(queue, partition, seq)
        now = store_ops.after(app, broker, queue, partition) if killed else None
    outcome = "already_acked" if not killed else "moved" if dead_queue else "discarded"
    if out.json:
        out.doc({"queue": queue, "partition": partition, "seq": seq, "killed": killed,
                 "outcome": outcome, "dead_message_queue": dead_queue if killed else None})
        return
    where = _where(queue, partition, seq)
    if outcome == "moved":
        out.echo(_freed(f"killed {where}", was, f"moved to dead message queue {dead_queue!r}",
                        partition, now))
    elif outcome == "discarded":
        out.echo(_freed(f"killed {where}", was,
                        f"discarded, counted (no dead message queue to take it; set one with "
                        f"`partq queue update {queue} --dead-message-queue NAME`)", partition,
                        now))
    else:
        out.echo(f"{where} was acked already; nothing changed")


def _freed(done: str, was: unblock.Position | None, outcome: str | None, partition: int,
           now: unblock.After | None) -> str:
    """What a kill or ack freed, as "killed message 0 of partition 0 of queue 'jobs' (key k,
    delivered 5 times): moved to dead message queue 'dmq'; partition 0 unblocked: next is seq
    1"."""
    text = done
    if was is not None:
        key = "no key" if was.key is None else f"key {truncate(printable(was.key), 32)}"
        n = was.delivery_count
        text += f" ({key}, delivered {n} time{'s' if n != 1 else ''}"
        text += ", its retry delay ended)" if was.retry_pending else ")"
    if outcome:
        text += f": {outcome}"
    if now is None:
        return text
    label = partition_label(partition)
    if now.stuck_on is not None:
        return text + f"; partition {label} is still stuck, on seq {now.stuck_on}"
    nxt = "nothing waits" if now.next_seq is None else f"next is seq {now.next_seq}"
    return text + f"; partition {label} unblocked: {nxt}"


@position_command("ack")
def ack(app: App, queue: str, partition: int, seq: int, yes: bool, out: Output) -> None:
    """Acknowledge message SEQ of PARTITION of QUEUE: it is gone from the queue, never
    delivered again, and the partition flows on.

    PARTITION is a number, or parent for the log of an exclusive queue. Whoever delivers the
    partition, in this process or another, sees it before its next delivery, and a nack's
    delay pending on the message ends at once. It says what it freed, as kill does. To keep the
    message, kill it instead: `partq message kill` moves it to the dead message queue.
    """
    with app.broker(network=True) as broker:
        _ask(app, broker, yes, "ack", queue, partition, seq, "It is gone for good.")
        was = store_ops.position(app, broker, queue, partition, seq)
        acked = broker.ack_message(queue, partition, seq)
        now = store_ops.after(app, broker, queue, partition) if acked else None
    if out.json:
        out.doc({"queue": queue, "partition": partition, "seq": seq, "acked": acked,
                 "outcome": "acked" if acked else "already_acked"})
        return
    where = _where(queue, partition, seq)
    out.echo(_freed(f"acked {where}", was, None, partition, now) if acked
             else f"{where} was acked already; nothing changed")


@click.group()
def dead() -> None:
    """Send the messages of a dead message queue back to be processed again."""


@dead.command("requeue")
@click.argument("dead_queue", metavar="DMQ")
@click.option("--to", "to_queue", metavar="QUEUE",
              help="Publish them all to QUEUE [default: each to its origin queue, the queue it "
                   "died in].")
@click.option("--key", "-k", "keys", multiple=True,
              help="Only messages with this key; repeat for more.")
@click.option("--reason", "reasons", multiple=True, type=click.Choice(requeue_ops.REASONS),
              help="Only messages that died for this reason; repeat for more.")
@click.option("--limit", "-n", type=int, default=0, show_default=True,
              help="Requeue at most this many messages (0: all); run again for more.")
@click.option("--batch", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Messages per commit.")
@click.option("--ignore-interrupted", is_flag=True,
              help="Start although a requeue of DMQ with other options stopped in the middle of "
                   "a batch (that batch may then be requeued twice).")
@output_options
@pass_app
def requeue(app: App, dead_queue: str, to_queue: str | None, keys: tuple[str, ...],
            reasons: tuple[str, ...], limit: int, batch: int, ignore_interrupted: bool,
            out: Output) -> None:
    """Send the messages of dead message queue DMQ back to the queues they died in, or to
    --to QUEUE, and ack them in DMQ.

    Each goes with its key, payload and own headers (without the dead_reason, origin_* and
    delivery_count headers it got as it died), appended to its queue as a new publish: its
    delivery count starts again. Messages --key and --reason pass over, and those whose origin
    queue does not exist (or that name none), stay in DMQ untouched.

    Interrupted (Ctrl-C, SIGKILL, a crash, a full queue), run the same command again: it
    continues without requeuing a message twice; run it again later to requeue what died
    since. Do not consume DMQ meanwhile: a message handled there and requeued is processed
    twice.

    \b
    Examples:
      partq dead requeue orders.dead
      partq dead requeue orders.dead --reason expired --to orders.retry
    """
    requeue_ops.check_requeue(dead_queue, to_queue, list(keys), list(reasons), limit, batch)
    try:
        with app.broker(network=True) as broker, \
                out.progress_callback(f"requeuing {dead_queue}") as progress, \
                _signals(app) as stop:
            report = store_ops.requeue(app, broker, dead_queue, progress, stop.is_set,
                                   to_queue=to_queue, keys=list(keys), reasons=list(reasons),
                                   limit=limit, batch=batch,
                                   ignore_interrupted=ignore_interrupted)
            interrupted = stop.is_set()
    except (IngressDisabled, QueueFull) as exc:
        raise UserError(f"{exc}; the messages requeued before it stay requeued: run the same "
                        f"command again to continue") from None
    if out.json:
        out.doc(report.as_dict())
    else:
        _print_report(out, report)
    if interrupted:
        raise UserError(f"requeue interrupted after {report.requeued} messages; run the same "
                        f"command again to continue")


def _signals(app: App):
    """``stop_on_signals()``; through ``partq serve`` the server runs the requeue whole, so
    Ctrl-C ends the command at once (KeyboardInterrupt) rather than waiting for the end."""
    return contextlib.nullcontext(threading.Event()) if app.address else stop_on_signals()


def _print_report(out: Output, report: requeue_ops.RequeueReport) -> None:
    n = report.requeued
    out.echo(f"requeued {n} message{'s' if n != 1 else ''} of {report.queue!r}"
             + (f" to {report.to_queue!r}" if report.to_queue else "")
             + (f"; {report.already_requeued} requeued by an interrupted earlier run, acked now"
                if report.already_requeued else ""))
    if report.destinations:
        out.table(["QUEUE", "REQUEUED"], sorted(report.destinations.items()), indent="  ")
    left = []
    if report.left_unmatched:
        left.append(f"{report.left_unmatched} not matching --key/--reason")
    if report.left_no_origin:
        left.append(f"{report.left_no_origin} without an origin queue (pass --to QUEUE)")
    for name, count in sorted(report.left_origin_missing.items()):
        left.append(f"{count} whose origin queue {name!r} does not exist (pass --to QUEUE)")
    corrupt = sum(len(p.skipped_corrupt) for p in report.partitions)
    if corrupt:
        left.append(f"{corrupt} damaged (see `partq verify {report.queue}`)")
    if left:
        out.echo(f"left in {report.queue!r}: " + "; ".join(left))
    if not report.complete and report.limit:
        out.echo(f"stopped at --limit {report.limit}; run again to requeue more")

