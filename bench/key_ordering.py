#!/usr/bin/env python3
"""What ``ordering="key"`` (rule `key-ordering`, docs/behaviour.md "Order per key") buys a
consumer, beside ``ordering="partition"`` in the same run: two measurements, each in interleaved
pairs (bench/method.py: key, partition, key, partition, ... after one dropped warm-up round),
each slice in a fresh directory, partq's default durability ("sync") and clock (SystemClock,
real time, with its ticker).

1. Handoff under load. A queue of 2 partitions (``rebalance_delay`` 0.2 s,
   ``max_handoff_time`` 5 s, the side's ``ordering``) prefilled with 2,000 keyed 256-byte
   messages over 64 keys published round-robin (32 keys in each partition; untimed). Consumer A
   (a flow of this process) binds, gets both partitions, and receives batches of 16 until it
   holds messages of the partition that will move to B (the donor's highest-numbered); it holds
   them unacked (a slow consumer). Then consumer B binds; A acks everything it holds 1.0 s after
   B's bind, in a thread, while B polls ``receive(100, timeout=0.01)`` and acks what it gets.
   Reported: seconds from B's bind to B's first message (lower is better). Under "partition" B
   waits for A's acks (~1 s); under "key" B gets the keys A does not hold once the rebalance
   delay passed (~0.2 s). Beside it, per side: the messages B received before A acked, the keys
   of the moving partition A held, and how many messages B got of a key A still held (must be 0).
   The same again with B a flow of another process (a second Broker on the directory, served
   through the control socket): ``handoff_first_message_seconds_key_other_process`` beside
   ``..._partition_other_process``.
2. Consuming during a nack's delay. A queue of 1 partition prefilled with 20,000 keyed 256-byte
   messages over 50 keys (round-robin; untimed). One flow receives(100) + ack_many; in its first
   batch, the first message (the first of its key) is nacked with ``delay=2.0`` and the rest of
   the batch acked (what the nack gave back excepted). Then for the 2 s of the delay, the flow
   goes on with receive(100) + ack_many. Reported: msgs/s of the other keys acked during the
   delay, over the time they took: the 2 s window, or less if the other keys' backlog ran dry
   inside it (then ``other_keys_ran_dry_after_s`` says when; the rate over the whole window is
   ``per_window``). Under "partition" the whole partition waits out the delay (0 msgs/s: the
   ratio of a pair with a peer of 0 is skipped by method.ratios, so the ratio is null with a
   note); under "key" only the nacked key waits. Beside it: the nacked key's messages delivered
   during the delay (must be 0), whether the nacked message came back first after it and when
   (seconds after the nack; the flow polls receive(1, timeout=0.05) for it: a single receive
   waiting through the end of a nack's delay was seen not to wake then, whichever ordering).

Prints JSON lines (bench/method.py): ``load_average_at_start``,
``handoff_first_message_seconds_key`` beside ``handoff_first_message_seconds_partition``, and
``consume_other_keys_during_nack_delay_key`` beside
``consume_other_keys_during_nack_delay_partition``, each with the median ratio of the pairs and
its min-max. These are timings: nothing is asserted on them.

Usage: ``python bench/key_ordering.py [--quick] [--pairs N]``. ``--quick``: a smoke run of a
few seconds (1 pair, no warm-up, fewer messages, A holds for 0.5 s, the nack delays 0.5 s).
"""
from __future__ import annotations

import argparse
import sys
import threading
import time
from dataclasses import dataclass
from functools import partial
from statistics import median

from method import DEFAULT_PAIRS, emit, header, interleave, line, log
from workloads import PAYLOAD, scratch_dir

import partq

SCRIPT = "key_ordering"
SIDES = ("key", "partition")
HANDOFF_KEYS = [f"customer-{i}" for i in range(64)]
NACK_KEYS = [f"customer-{i}" for i in range(50)]
PUBLISH_BATCH = 1000
A_BATCH = 16                      # A receives this many at a time until it holds the moving partition
B_POLL = 0.01                     # B's receive timeout
GIVE_UP = 15.0                    # a slice that takes longer than this has failed


@dataclass(frozen=True)
class Params:
    handoff_messages: int
    rebalance_delay: float
    max_handoff_time: float
    hold: float                   # A acks this long after B's bind
    nack_messages: int
    nack_delay: float


FULL = Params(handoff_messages=2000, rebalance_delay=0.2, max_handoff_time=5.0, hold=1.0,
              nack_messages=20_000, nack_delay=2.0)
QUICK = Params(handoff_messages=1000, rebalance_delay=0.2, max_handoff_time=5.0, hold=0.5,
               nack_messages=2000, nack_delay=0.5)


def fill(b: partq.Broker, n: int, keys: list[str]) -> None:
    for start in range(0, n, PUBLISH_BATCH):
        b.publish_many("q", [(PAYLOAD, keys[i % len(keys)])
                             for i in range(start, min(start + PUBLISH_BATCH, n))])


# ---------------------------------------------------------------------------- 1. handoff
def handoff_slice(ordering: str, p: Params, details: list[dict], peer: bool = False) -> float:
    """Seconds from B's bind to B's first message; the slice's other figures go to ``details``.
    ``peer``: B is a flow of another Broker on the directory (a flow of another process, served
    by A's broker through the control socket)."""
    with scratch_dir() as d, partq.Broker.open(d) as b:
        other = partq.Broker.open(d) if peer else None
        try:
            return _handoff(b, other, ordering, p, details)
        finally:
            if other is not None:
                other.close()


def _handoff(b: partq.Broker, other: partq.Broker | None, ordering: str, p: Params,
             details: list[dict]) -> float:
    b.create_queue("q", partitions=2, rebalance_delay=p.rebalance_delay,
                   max_handoff_time=p.max_handoff_time, ordering=ordering)
    fill(b, p.handoff_messages, HANDOFF_KEYS)
    a = b.bind("q", name="A")
    if a.partitions != {0, 1}:
        raise RuntimeError(f"A, the first flow, holds {sorted(a.partitions)}, not both")
    moving = max(a.partitions)          # the donor's highest-numbered partition moves
    held: list[partq.Message] = []
    for _ in range(20):
        held += a.receive(A_BATCH, timeout=1.0)
        if any(m.partition == moving for m in held):
            break
    held_keys = {m.key for m in held if m.partition == moving}
    if not held_keys:
        raise RuntimeError(f"A holds nothing of partition {moving} after {len(held)} messages")
    partition_keys = {k for k in HANDOFF_KEYS if partq.key_partition(k, 2) == moving}

    acking = threading.Event()          # set just before A's ack_many starts
    ack_error: list[BaseException] = []

    def slow_consumer(bound_at: float) -> None:
        time.sleep(max(0.0, bound_at + p.hold - time.perf_counter()))
        acking.set()
        try:
            a.ack_many(held)
        except BaseException as exc:    # raised by the slice below
            ack_error.append(exc)

    bound_at = time.perf_counter()
    consumer_b = (other or b).bind("q", name="B")
    acker = threading.Thread(target=slow_consumer, args=(bound_at,))
    acker.start()
    first: float | None = None
    before_ack = early_held = 0
    try:
        while first is None or acker.is_alive():
            if time.perf_counter() - bound_at > GIVE_UP:
                raise RuntimeError(f"B got no message within {GIVE_UP} s of its bind")
            got = consumer_b.receive(100, timeout=B_POLL)
            if not got:
                continue
            returned = time.perf_counter()
            if first is None:
                first = returned - bound_at
            if not acking.is_set():     # handed out while A still held all it received
                before_ack += len(got)
                early_held += sum(m.key in held_keys for m in got)
            consumer_b.ack_many(got)
    finally:
        acker.join()
    if ack_error:
        raise ack_error[0]
    if consumer_b.partitions != {moving}:
        raise RuntimeError(f"B holds {sorted(consumer_b.partitions)}, not [{moving}]")
    details.append({"before_ack": before_ack, "held_keys": len(held_keys),
                    "held_messages": sum(m.partition == moving for m in held),
                    "partition_keys": len(partition_keys), "early_held": early_held})
    log(SCRIPT, f"handoff {ordering}: first message after {first:.3f} s; B got {before_ack} "
                f"before A acked; A held {len(held_keys)} of {len(partition_keys)} keys of "
                f"partition {moving}; B got {early_held} of those keys early")
    return first


# ---------------------------------------------------------------------------- 2. nack delay
def nack_slice(ordering: str, p: Params, details: list[dict]) -> float:
    """Msgs/s of the other keys acked while the nack's delay runs."""
    with scratch_dir() as d, partq.Broker.open(d) as b:
        b.create_queue("q", partitions=1, ordering=ordering)
        fill(b, p.nack_messages, NACK_KEYS)
        flow = b.bind("q", name="consumer")
        batch = flow.receive(100, timeout=1.0)
        if not batch:
            raise RuntimeError("the flow received nothing")
        nacked = batch[0]
        others_total = sum(NACK_KEYS[i % len(NACK_KEYS)] != nacked.key
                           for i in range(p.nack_messages))
        start = time.perf_counter()
        deadline = start + p.nack_delay     # the broker's delay ends no earlier than this
        back = set(flow.nack(nacked, delay=p.nack_delay))
        rest = [m for m in batch[1:] if m.seq not in back]
        flow.ack_many(rest)
        others_left = others_total - sum(m.key != nacked.key for m in rest)
        acked = nacked_key_early = 0
        dry_at: float | None = None
        while (now := time.perf_counter()) < deadline:
            got = flow.receive(100, timeout=min(0.05, deadline - now))
            if not got:
                continue
            flow.ack_many(got)
            done = time.perf_counter()
            if done > deadline:
                break
            acked += sum(m.key != nacked.key for m in got)
            nacked_key_early += sum(m.key == nacked.key for m in got)
            if acked >= others_left:
                dry_at = done - start
                break
        span = dry_at if dry_at is not None else p.nack_delay
        after: list[partq.Message] = []
        while not after and time.perf_counter() < deadline + 5.0:
            after = flow.receive(1, timeout=0.05)    # polled: see the docstring
        back_after = time.perf_counter() - start
        came_back = bool(after) and after[0].seq == nacked.seq and after[0].redelivered
        details.append({"acked": acked, "dry_at": None if dry_at is None else round(dry_at, 3),
                        "per_window": round(acked / p.nack_delay, 1),
                        "nacked_key_early": nacked_key_early, "came_back_first": came_back,
                        "back_after": round(back_after, 3) if after else None,
                        "given_back": len(back)})
        log(SCRIPT, f"nack {ordering}: {acked} of {others_left} other-key messages acked during "
                    f"the {p.nack_delay} s delay" + (f", ran dry after {dry_at:.3f} s" if dry_at
                                                     else "") +
                    f"; nacked key delivered early: {nacked_key_early}; nack gave back "
                    f"{len(back)}; came back first: {came_back}, after {back_after:.3f} s")
        return acked / span


# ---------------------------------------------------------------------------- main
def rounds_of(details: dict[str, list[dict]], samples: dict, side: str) -> list[dict]:
    """The details of the reported rounds (the warm-up's dropped) of a side that was measured."""
    got = samples[side]
    return [] if isinstance(got, str) else details[side][len(details[side]) - len(got):]


def med(values: list) -> float | None:
    return median(values) if values else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    parser.add_argument("--pairs", type=int, default=None,
                        help=f"rounds after the warm-up (default {DEFAULT_PAIRS}, or 1 with --quick)")
    args = parser.parse_args(argv)
    p = QUICK if args.quick else FULL
    pairs = max(1, args.pairs if args.pairs is not None else (1 if args.quick else DEFAULT_PAIRS))
    warm = not args.quick
    emit(header(SCRIPT, pairs, quick=args.quick))

    # 1. handoff
    hd: dict[str, list[dict]] = {side: [] for side in SIDES}
    hs = interleave([(side, partial(handoff_slice, side, p, hd[side])) for side in SIDES],
                    pairs=pairs, warm=warm, script=SCRIPT)
    hr = {side: rounds_of(hd, hs, side) for side in SIDES}

    def per_side(rounds: dict[str, list[dict]], field: str) -> dict[str, list]:
        return {side: [r[field] for r in rounds[side]] for side in SIDES}

    before = per_side(hr, "before_ack")
    emit(line("handoff_first_message_seconds_key", "s", hs["key"],
              "handoff_first_message_seconds_partition", hs["partition"], digits=3,
              better="lower",
              received_before_old_flow_acked=med(before["key"]),
              peer_received_before_old_flow_acked=med(before["partition"]),
              received_before_old_flow_acked_rounds=before,
              old_flow_held_keys_rounds=per_side(hr, "held_keys"),
              old_flow_held_messages_rounds=per_side(hr, "held_messages"),
              keys_in_moving_partition=len({k for k in HANDOFF_KEYS
                                            if partq.key_partition(k, 2) == 1}),
              received_keys_old_flow_still_held=per_side(hr, "early_held"),
              messages=p.handoff_messages, keys=len(HANDOFF_KEYS),
              rebalance_delay=p.rebalance_delay, max_handoff_time=p.max_handoff_time,
              old_flow_acks_after_s=p.hold,
              note=f"2 partitions; A holds a batch of the moving partition unacked for "
                   f"{p.hold} s after B binds; seconds from B's bind to its first message"))

    # 1b. handoff into a flow of another process
    pd: dict[str, list[dict]] = {side: [] for side in SIDES}
    ps = interleave([(side, partial(handoff_slice, side, p, pd[side], True)) for side in SIDES],
                    pairs=pairs, warm=warm, script=SCRIPT)
    pr = {side: rounds_of(pd, ps, side) for side in SIDES}
    before = per_side(pr, "before_ack")
    emit(line("handoff_first_message_seconds_key_other_process", "s", ps["key"],
              "handoff_first_message_seconds_partition_other_process", ps["partition"],
              digits=3, better="lower",
              received_before_old_flow_acked=med(before["key"]),
              peer_received_before_old_flow_acked=med(before["partition"]),
              received_before_old_flow_acked_rounds=before,
              old_flow_held_keys_rounds=per_side(pr, "held_keys"),
              received_keys_old_flow_still_held=per_side(pr, "early_held"),
              messages=p.handoff_messages, keys=len(HANDOFF_KEYS),
              rebalance_delay=p.rebalance_delay, max_handoff_time=p.max_handoff_time,
              old_flow_acks_after_s=p.hold,
              note="as the line above, B bound through a second Broker on the directory (a "
                   "flow of another process: it reads what A holds from the store)"))

    # 2. nack delay
    nd: dict[str, list[dict]] = {side: [] for side in SIDES}
    ns = interleave([(side, partial(nack_slice, side, p, nd[side])) for side in SIDES],
                    pairs=pairs, warm=warm, script=SCRIPT)
    nr = {side: rounds_of(nd, ns, side) for side in SIDES}
    peer = ns["partition"]
    zero_peers = 0 if isinstance(peer, str) else sum(1 for v in peer if not v)
    note = (f"1 partition, {p.nack_messages} msgs over {len(NACK_KEYS)} keys; one key's first "
            f"message nacked with delay={p.nack_delay} s; msgs/s of the other keys during the delay")
    if zero_peers:
        note += (f"; the partition side consumed 0 msgs in {zero_peers} of {len(peer)} pairs: "
                 f"method.ratios skips those pairs" + (", so the ratio is null"
                                                       if zero_peers == len(peer) else ""))
    emit(line("consume_other_keys_during_nack_delay_key", "msgs/s", ns["key"],
              "consume_other_keys_during_nack_delay_partition", peer, better="higher",
              zero_peer_pairs=zero_peers,
              acked_during_delay_rounds=per_side(nr, "acked"),
              per_window_rounds=per_side(nr, "per_window"),
              other_keys_ran_dry_after_s_rounds=per_side(nr, "dry_at"),
              nacked_key_delivered_during_delay=per_side(nr, "nacked_key_early"),
              nacked_message_came_back_first=per_side(nr, "came_back_first"),
              nacked_message_back_after_s=per_side(nr, "back_after"),
              given_back_by_nack=per_side(nr, "given_back"),
              messages=p.nack_messages, keys=len(NACK_KEYS), nack_delay=p.nack_delay,
              note=note))
    return 0


if __name__ == "__main__":
    sys.exit(main())
