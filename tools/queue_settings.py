"""The queue settings as command-line options: one list for ``queue create`` and ``queue
update`` (so the two never drift apart), and the names errors use for them."""
from __future__ import annotations

import functools
from typing import ClassVar

import click

from partq.config import ACCESS_TYPES, ORDERINGS, PARTITIONERS, USER_SETTABLE


class OnOff(click.ParamType):
    """on/off (also true/false, yes/no, 1/0) -> bool."""

    name = "on|off"
    _values: ClassVar[dict[str, bool]] = {
        "on": True, "off": False, "true": True, "false": False, "yes": True, "no": False,
        "1": True, "0": False}

    def convert(self, value, param, ctx):
        if isinstance(value, bool):
            return value
        try:
            return self._values[str(value).strip().lower()]
        except KeyError:
            self.fail(f"{value!r} is not one of on, off", param, ctx)


ON_OFF = OnOff()

# (option, QueueConfig field, click type, help). One list for create and update, so the two never
# drift apart; tests check it covers every user-settable field.
SETTINGS = [
    ("--rebalance-delay", "rebalance_delay", click.FLOAT,
     "Seconds to wait after a consumer binds or leaves before partitions move to other "
     "consumers (a consumer back within it keeps its partitions)."),
    ("--max-handoff-time", "max_handoff_time", click.FLOAT,
     "Seconds a partition moving to another consumer waits for the old consumer's acks."),
    ("--max-unacked", "max_delivered_unacked_per_flow", click.INT,
     "Messages a consumer may hold delivered and unacked."),
    ("--partitioner", "partitioner", click.Choice(PARTITIONERS),
     "How messages without a key pick a partition (keyed ones go by the key's hash)."),
    ("--sticky-batch-size", "sticky_batch_size", click.INT,
     "Bytes the sticky partitioner sends to one partition before switching."),
    ("--adaptive/--no-adaptive", "adaptive", None,
     "Sticky: prefer partitions with smaller backlogs."),
    ("--availability-timeout", "partition_availability_timeout", click.FLOAT,
     "Sticky: skip a partition whose consumer accepted nothing for this many seconds (0: never)."),
    ("--max-message-size", "max_message_size", click.INT, "Largest payload in bytes."),
    ("--max-key-size", "max_key_size", click.INT, "Longest key in bytes."),
    ("--ingress", "ingress_enabled", ON_OFF,
     "Accept publishes; while off, publishes are discarded (counted) or rejected, see "
     "--reject-when-shutdown."),
    ("--egress", "egress_enabled", ON_OFF, "Deliver to consumers; while off, messages wait."),
    ("--consumer-timeout", "consumer_timeout", click.FLOAT,
     "Seconds a consumer of another process or host may stay silent before it is unbound."),
    ("--reject-msg-to-sender", "reject_msg_to_sender", ON_OFF,
     "Reject publishes the queue refuses instead of discarding them; while ingress is off only "
     "with --reject-when-shutdown on too."),
    ("--reject-when-shutdown", "reject_msg_to_sender_when_shutdown", ON_OFF,
     "Reject (not discard) publishes while ingress is off; needs --reject-msg-to-sender on."),
    ("--max-redelivery", "max_redelivery", click.INT,
     "Deliveries after the first before a message is dead (moved to the dead message queue, or "
     "discarded and counted without one); 0: redeliver forever."),
    ("--dead-message-queue", "dead_message_queue", click.STRING,
     "Queue of this directory that receives dead messages ('' for none); a warning says when "
     "it does not exist (dead messages are then discarded, counted)."),
    ("--redelivery-delay", "redelivery_delay", click.FLOAT,
     "Seconds before a nacked message comes back (0: at once); grows with each redelivery."),
    ("--redelivery-delay-multiplier", "redelivery_delay_multiplier", click.FLOAT,
     "Factor the redelivery delay grows by with each redelivery (>= 1)."),
    ("--redelivery-delay-max", "redelivery_delay_max", click.FLOAT,
     "Longest redelivery delay in seconds."),
    ("--max-ttl", "max_ttl", click.FLOAT,
     "Seconds after its publish every message expires at the latest (0: never); an expired "
     "message is dead."),
    ("--max-depth", "max_depth", click.INT,
     "Quota: messages published and not acked (0: none); past it publishes are refused or "
     "discarded, see --reject-msg-to-sender."),
    ("--max-bytes", "max_bytes", click.INT,
     "Quota: bytes of the queue's stored messages (0: none)."),
    ("--max-poll-interval", "max_poll_interval", click.FLOAT,
     "Seconds a consumer holding unacked messages may go without receiving, acking or nacking "
     "before it is unbound and its messages redelivered (0: never)."),
    ("--ordering", "ordering", click.Choice(ORDERINGS),
     "partition: each partition in sequence order; key: each key in publish order, and a "
     "nack, its delay or a held key holds back only that key."),
    ("--access-type", "access_type", click.Choice(ACCESS_TYPES),
     "non-exclusive: partitioned; exclusive: not partitioned, one consumer at a time (its "
     "partition count is then 0). A change unbinds every consumer."),
]
assert {field for _, field, _, _ in SETTINGS} == set(USER_SETTABLE), "SETTINGS out of date"


def setting_options(func):
    """Every user-settable queue option; passes ``settings``: the fields given, by config name."""
    for opt, field, ptype, help_text in reversed(SETTINGS):
        kwargs: dict = {"default": None, "help": help_text}
        if ptype is not None:
            kwargs["type"] = ptype
        func = click.option(opt, field, **kwargs)(func)

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        settings = {field: kwargs.pop(field) for _, field, _, _ in SETTINGS}
        return func(*args, settings={k: v for k, v in settings.items() if v is not None}, **kwargs)
    return wrapper
