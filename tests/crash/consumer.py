"""Crash-test consumer: the delivery owner. Receives, acks, holds, nacks until it is killed.

    python consumer.py DATA_DIR LOG --seed S [--queue q] [--flows 1|2] [--churn P] [--prefix c]
                       [--lifecycle] [--ordering partition|key]

Opens the broker, then binds its flows (named PREFIX0, PREFIX1: a restarted consumer gets its
partitions back, rule `named-flows`), retrying while another consumer process holds those names (a standby
consumer process waits here until the other dies). Consumer processes with other prefixes
consume at the same time (rule `peer-flows`): one of them owns delivery and serves the others' flows. Every
``delivered`` and ``acked`` line carries ``t0``, the time before the call (``concurrent_checks``
orders events of concurrent processes by these intervals). Logs ``bound`` once it owns delivery, every
delivery before doing anything with it, and ``acked`` after ack_many returned (or, for some
batches, after the ``ack_many_async`` result of the previous loop returned). With two flows
and ``--churn`` it unbinds and rebinds the second flow now and then, so partitions are handed
off between flows while messages are in flight; held messages are acked later through the flow
that received them: acks of those whose partition moved meanwhile are fenced (rule `fencing`, FlowFenced),
and the others are acked.

Now and then the rest of a batch is nacked: per partition its first message (a nack gives back
the later messages of its partition), or with ``--ordering key`` (the queue's ``ordering``, rule
`key-ordering`) per key its first message and every unkeyed one (a nack gives back only the later
messages of its key). ``delivered`` lines name their flow (``flow``); after a nack returned it
logs ``gave_back`` (id, flow, partition, ``seqs``: what the nack returned), and ``unbound`` (flow)
after it unbound a flow or a receive found it unbound (``key_checks``).

``delivered`` lines also carry ``w0``, the wall clock before the receive (expiry is checked
against it). ``--lifecycle`` (``lifecycle``): in each batch, per partition, the first message of
a poison key is nacked (now and then with a small delay; logged ``nacked`` with its
delivery_count before the call, ``nack_failed`` when it raised), and the later messages of that
partition (``--ordering key``: of that key) in the batch are left alone (the nack gave them
back); messages of a reject key before
it are rejected (``rejected`` before the call, ``rejected_done`` once it returned,
``reject_failed``); the others are processed as above.
"""
from __future__ import annotations

import argparse
import random
import sys
import time

import lifecycle
from wlog import Log, delivered_event

import partq


def bind_all(broker, names, queue):
    """Bind every flow, or none. Another consumer process of the harness binds the same names:
    its flows are served to this process too (rule `peer-flows`), so a name it holds is refused here until
    it dies; this process then waits, as a standby consumer process, and takes over. A bind
    whose commit found another process had taken the queue's delivery over while this one was
    stopped raises ``FlowClosed`` ("bind again"): so it does."""
    while True:
        flows = []
        try:
            for n in names:
                flows.append(broker.bind(queue, name=n))
            return flows
        except (partq.DeliveryLocked, partq.InvalidConfig, partq.FlowClosed):
            for flow in flows:
                flow.unbind()
            time.sleep(0.02)   # not a test's wait: a process standing by for its names


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("log")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--queue", default="q")
    ap.add_argument("--flows", type=int, default=1)
    ap.add_argument("--churn", type=float, default=0.0)
    ap.add_argument("--prefix", default="c")
    ap.add_argument("--lifecycle", action="store_true")
    ap.add_argument("--ordering", choices=("partition", "key"), default="partition")
    args = ap.parse_args(argv)
    keyed = args.ordering == "key"
    rng = random.Random(args.seed)
    log = Log(args.log)
    broker = partq.Broker.open(args.data)
    log.write({"op": "opened"})
    names = [f"{args.prefix}{i}" for i in range(args.flows)]
    flows = bind_all(broker, names, args.queue)
    log.write({"op": "bound", "flows": names})
    held: list = []
    away = 0                                  # loops until the churned flow binds again

    in_flight: list = []                      # (flow, Pending, msgs) of acks not waited for yet

    def logged(msgs, t0):
        log.write(*({"op": "acked", "id": delivered_event(m)["id"], "t0": t0} for m in msgs))

    def together(m):
        """What a nack of ``m`` gives back with it: the later messages of this group."""
        if not keyed:
            return m.partition
        return (m.partition, m.key) if m.key is not None else (m.partition, None, m.seq)

    def nack(flow, name, m, delay=None):
        """Nack ``m``; once it returned, log what it gave back (raises what nack raises)."""
        back = flow.nack(m, delay=delay)
        log.write({"op": "gave_back", "id": delivered_event(m)["id"], "flow": name,
                   "partition": m.partition, "seqs": list(back)})

    def unfenced(msgs, exc):
        fenced = {(m.partition, m.seq) for m in exc.messages}
        return [m for m in msgs if (m.partition, m.seq) not in fenced]

    def ack(flow, msgs):
        if not msgs:
            return
        t0 = time.monotonic()
        try:
            if rng.random() < 0.3:            # ack_many_async: logged once its result() returns
                # (and, for the checker's per-key order rule, as sent before it is sent)
                log.write(*({"op": "ack_sent", "id": delivered_event(m)["id"]} for m in msgs))
                in_flight.append((flow, flow.ack_many_async(msgs), msgs, t0))
                return
            flow.ack_many(msgs)
        except (partq.FlowFenced, partq.FlowClosed) as exc:
            # its partition moved (or the flow left): nothing of the batch was acked
            if isinstance(exc, partq.FlowFenced):
                ack(flow, unfenced(msgs, exc))
            return
        logged(msgs, t0)

    def nack_or_reject(flow, name, msgs):
        """The lifecycle's part of a batch: nack poison messages, reject those of reject keys;
        return the messages left to process as usual."""
        first_poison: dict = {}
        for m in msgs:
            if lifecycle.fate(m.key) == lifecycle.POISON:
                g = together(m)
                first_poison[g] = min(m.seq, first_poison.get(g, m.seq))
        rest = []
        for m in msgs:
            stop = first_poison.get(together(m))
            fate = lifecycle.fate(m.key)
            if stop is not None and m.seq > stop:
                continue                  # given back by the poison message's nack
            mid = delivered_event(m)["id"]
            if fate == lifecycle.REJECT:
                log.write({"op": "rejected", "id": mid, "delivery_count": m.delivery_count})
                try:
                    flow.reject(m)
                except (partq.FlowFenced, partq.FlowClosed) as exc:
                    log.write({"op": "reject_failed", "id": mid, "error": type(exc).__name__})
                    continue
                log.write({"op": "rejected_done", "id": mid})
            elif fate != lifecycle.POISON:
                rest.append(m)
        for m in msgs:
            if first_poison.get(together(m)) != m.seq:
                continue
            delay = round(rng.uniform(*lifecycle.NACK_DELAY_RANGE), 3) \
                if rng.random() < lifecycle.NACK_DELAY_SHARE else None
            mid = delivered_event(m)["id"]
            log.write({"op": "nacked", "id": mid, "delivery_count": m.delivery_count,
                       "delay": delay})
            try:
                nack(flow, name, m, delay=delay)
            except (partq.FlowFenced, partq.FlowClosed) as exc:
                log.write({"op": "nack_failed", "id": mid, "error": type(exc).__name__})
        return rest

    while True:
        for flow, pending, msgs, t0 in in_flight:   # the last loop's acks committed meanwhile
            try:
                pending.result()
            except partq.FlowFenced as exc:
                ack(flow, unfenced(msgs, exc))
                continue
            except partq.FlowClosed:
                # this process lost the queue's delivery while stopped: nothing of the batch
                # was acked (as for ack_many's FlowClosed); the next receive binds again
                continue
            logged(msgs, t0)
        in_flight.clear()
        for i, flow in enumerate(flows):
            if flow is None:
                continue
            t0, w0 = time.monotonic(), time.time()
            try:
                msgs = flow.receive(rng.randint(1, 64), timeout=0.05)
            except partq.FlowClosed as exc:
                # unbound by the owner (this process was silent past consumer_timeout, e.g.
                # SIGSTOPped), or this process ran delivery and lost it while it was stopped
                # (rule `owner-takeover`): bind again under the same name
                log.write({"op": "unbound", "flow": names[i], "reason": str(exc)[:400]})
                flows[i] = bind_all(broker, [names[i]], args.queue)[0]
                continue
            if not msgs:
                continue
            log.write(*({**delivered_event(m), "t0": t0, "w0": w0, "flow": names[i]}
                        for m in msgs))
            if args.lifecycle:
                msgs = nack_or_reject(flow, names[i], msgs)
                if not msgs:
                    continue
            r = rng.random()
            if r < 0.7:
                ack(flow, msgs)
            elif r < 0.85:
                held += [(flow, m) for m in msgs]
            else:
                k = rng.randrange(len(msgs))
                ack(flow, msgs[:k])
                first = {}
                for m in msgs[k:]:
                    first.setdefault(together(m), m)
                for m in first.values():
                    try:
                        nack(flow, names[i], m)    # it and every later unacked one of its group
                    except (partq.FlowFenced, partq.FlowClosed):
                        pass            # its partition moved meanwhile: nothing to give back
        if held and rng.random() < 0.3:
            for flow in {f for f, _ in held}:
                ack(flow, [m for f, m in held if f is flow])
            held = []
        if args.flows > 1:
            if flows[-1] is not None and rng.random() < args.churn:
                flows[-1].unbind()
                log.write({"op": "unbound", "flow": names[-1]})
                flows[-1] = None
                away = rng.randint(1, 20)
            elif flows[-1] is None:
                away -= 1
                if away <= 0:
                    try:
                        flows[-1] = broker.bind(args.queue, name=names[-1])
                    except partq.FlowClosed:
                        away = 1        # its delivery was taken over while it was stopped
                                        # in the bind: "bind again"


if __name__ == "__main__":
    sys.exit(main())
