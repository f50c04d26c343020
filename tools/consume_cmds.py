"""``partq consume``: receive a queue's messages as one more consumer and print them, acking,
nacking or rejecting them, or leaving them unacked: for debugging (a dead message queue setup
too), and for draining a queue by hand.

It binds a flow (``Broker.bind``): where another process runs the queue's delivery, that
process serves the flow; where none does, this one runs it until it ends.
"""
from __future__ import annotations

import sys
import time

import click

from partq.config import redelivery_wait
from partq.errors import PartqError
from partq.ops.formatting import partition_label
from partq.tools.common import App, Seconds, pass_app, require, stop_on_signals
from partq.tools.output import (
    PAYLOAD_MODES,
    Output,
    encode_payload,
    iso_time,
    output_options,
    printable,
    truncate,
)

POLL = 0.5          # seconds of one receive, between checks for a signal


@click.command()
@click.argument("queue")
@click.option("--name", "-n", help="The consumer's name: one that binds again under it within "
                                   "the queue's rebalance delay gets its partitions back. "
                                   "Without one, it leaves when it ends: its partitions go to "
                                   "the other consumers at once.")
@click.option("--max", "max_messages", type=click.IntRange(min=0), default=0, show_default=True,
              help="Stop after this many messages (0: no limit).")
@click.option("--timeout", type=Seconds(), default=None,
              help="Stop once no message came for this many seconds [default: wait until "
                   "Ctrl-C or SIGTERM].")
@click.option("--ack/--no-ack", default=False, show_default=True,
              help="Acknowledge each message once it is printed (it is then gone from the "
                   "queue); without it, messages are delivered again, marked redelivered, when "
                   "this consumer leaves.")
@click.option("--nack", is_flag=True,
              help="Nack each message once it is printed: it comes back after the queue's "
                   "redelivery delay, its delivery count one higher, until --max-redelivery "
                   "makes it dead (without that setting it comes back forever: bound the run "
                   "with --max or --timeout).")
@click.option("--reject", is_flag=True,
              help="Reject each message once it is printed: it is dead at once, moved to the "
                   "queue's dead message queue (discarded and counted without one).")
@click.option("--payload", "payload_mode", type=click.Choice(PAYLOAD_MODES), default="auto",
              show_default=True,
              help="auto: UTF-8 text when printable, else hex (base64 with --json).")
@click.option("--width", type=int, default=0, show_default=True,
              help="Truncate payloads to this many characters (0: never).")
@output_options
@pass_app
def consume(app: App, queue: str, name: str | None, max_messages: int, timeout: float | None,
            ack: bool, nack: bool, reject: bool, payload_mode: str, width: int,
            out: Output) -> None:
    """Receive messages of QUEUE as one more consumer and print them, one per line.

    The consumer joins the queue's others: it gets partitions as any consumer does, moved
    from the others after the queue's rebalance delay (an exclusive queue delivers to one
    consumer at a time, so it may wait as a standby). Where another process runs the queue's
    delivery (a service, `partq serve`), that process serves it. Ctrl-C or SIGTERM ends it
    cleanly; a summary goes to stderr. To look without consuming, use `partq inspect`.

    Each message shows its delivery count (1 on its first delivery), "redelivered" when it
    came back unacked before, and "held behind" when it came back only because an earlier
    message of its partition was nacked (it is not counted). --nack and --reject try out a
    queue's --max-redelivery and --dead-message-queue settings; with --json, next_retry (wall
    time in seconds) says when a nacked message comes back and dead_reason why one died.
    """
    if ack + nack + reject > 1:
        raise click.UsageError("pass at most one of --ack, --nack and --reject")
    require(width >= 0, "--width must be 0 (no truncation) or more")
    action = "ack" if ack else "nack" if nack else "reject" if reject else None
    received = 0
    with app.broker(network=True) as broker, stop_on_signals() as stop:
        flow = broker.bind(queue, name=name)
        try:
            idle_since = time.monotonic()
            told_standby = False
            while not stop.is_set() and (not max_messages or received < max_messages):
                left = max_messages - received if max_messages else 100
                wait = POLL if timeout is None else min(POLL, max(timeout - (
                    time.monotonic() - idle_since), 0))
                msgs = flow.receive(max_messages=min(left, 100), timeout=wait)
                if not msgs:
                    if not flow.active and not told_standby and not out.json:
                        out.warn(f"no partitions of queue {queue!r} assigned to this consumer "
                                 f"yet (other consumers hold them until the rebalance delay "
                                 f"ends, or the queue is exclusive and another consumer is "
                                 f"active); waiting")
                        told_standby = True
                    if timeout is not None and time.monotonic() - idle_since >= timeout:
                        break
                    continue
                fates = _fates(broker, queue, msgs, action)
                for msg in msgs:
                    _print(out, msg, payload_mode, width, action, fates.get(msg.partition))
                sys.stdout.flush()
                if ack:
                    flow.ack_many(msgs)
                for msg in msgs if nack or reject else ():
                    # a nack gives back the later messages of its partition too: nacks of
                    # those are ignored, and they come again with their counts unchanged
                    (flow.nack if nack else flow.reject)(msg)
                received += len(msgs)
                idle_since = time.monotonic()
        finally:
            # bound without a name, it leaves as the broker closes: its partitions go to the
            # other consumers at once; with one, it unbinds, and is waited for
            try:
                if name is not None:
                    flow.unbind()
            except PartqError:
                pass      # already unbound (the queue was deleted or changed): it said why
    if not out.json:
        what = {"ack": "acked", "nack": "nacked: they come back, counted, until they are dead",
                "reject": "rejected: dead, moved to the queue's dead message queue"}.get(
            action or "", "not acked: they are delivered again, marked redelivered")
        click.echo(f"received {received} message{'s' if received != 1 else ''} from queue "
                   f"{queue!r} ({what})", err=True)


def _fates(broker, queue: str, msgs, action: str | None) -> dict[int, tuple]:
    """What this consumer's nack or reject does to each partition's first message of a
    batch: partition -> ``(next_retry, dead_reason)``. A reject makes it dead ("rejected"); a
    nack delays it by the queue's redelivery delay rule (``next_retry``, wall time in s; the
    later messages of its partition wait behind it), or makes it dead ("max_redelivery") when
    it had its last delivery."""
    if action not in ("nack", "reject"):
        return {}
    config = broker.queue_config(queue)
    fates: dict[int, tuple] = {}
    for msg in msgs:
        if msg.partition in fates:
            continue
        if action == "reject":
            fates[msg.partition] = (None, "rejected")
        elif config.max_redelivery and msg.delivery_count > config.max_redelivery:
            fates[msg.partition] = (None, "max_redelivery")
        else:
            wait = redelivery_wait(config, msg.delivery_count)
            fates[msg.partition] = (time.time() + wait if wait > 0 else None, None)
    return fates


def _print(out: Output, msg, payload_mode: str, width: int, action: str | None,
           fate: tuple | None) -> None:
    encoding, text = encode_payload(msg.payload, payload_mode, out.json)
    next_retry, dead_reason = fate if fate is not None else (None, None)
    # given back only to keep order behind another message's nack: marked redelivered, not
    # counted (its delivery count is still 1)
    held_behind = msg.redelivered and msg.delivery_count == 1
    if out.json:
        out.line({"queue": msg.queue, "partition": msg.partition, "seq": msg.seq, "key": msg.key,
                  "publish_time_ns": msg.publish_time_ns,
                  "publish_time": iso_time(msg.publish_time_ns), "size": len(msg.payload),
                  "headers": msg.headers, "redelivered": msg.redelivered,
                  "delivery_count": msg.delivery_count, "held_behind": held_behind,
                  "next_retry": next_retry, "dead_reason": dead_reason, "acked": action == "ack",
                  "action": action, "payload_encoding": encoding, "payload": text})
        return
    shown = printable(text) if encoding == "text" else f"{encoding}:{text}"
    parts = [f"{partition_label(msg.partition)}:{msg.seq}"]
    if msg.key is not None:
        parts.append(f"key={truncate(printable(msg.key), 32)}")
    if held_behind:
        parts.append("held behind")
    elif msg.redelivered:
        parts.append("redelivered")
    parts.append(f"delivery_count={msg.delivery_count}")
    if msg.headers:
        parts.append(f"headers={printable(repr(msg.headers))}")
    parts.append(truncate(shown, width))
    out.echo("  ".join(parts))
