"""`make demo`: the story Solace's partitioned-queue documents tell, on an embedded directory, in real
time, in a few seconds.

7 partitions, keyed messages, three consumers balanced 3/2/2, a fourth joins: after the
rebalance delay one partition is handed off gracefully (paused while its old consumer acks what
it holds, then resumed on the new one) and the queue settles at 2/2/2/1.
"""
from __future__ import annotations

import argparse
import shutil
import time

from partq.broker import Broker

QUEUE = "orders"


def _show(broker: Broker, flows: dict, title: str) -> None:
    st = broker.queue_status(QUEUE)
    print(f"\n== {title}")
    print(f"   rebalance status: {st.rebalance_status}; depth {st.depth}")
    for name, flow in flows.items():
        print(f"   {name:<10} partitions {sorted(flow.partitions)}")
    print("   partitions: " + "  ".join(f"{p.partition}:{p.status}" for p in st.partitions))


def _wait_status(broker: Broker, want: str, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while broker.queue_status(QUEUE).rebalance_status != want and time.monotonic() < end:
        time.sleep(0.05)


def run(data: str, fresh: bool = True) -> None:
    if fresh:
        shutil.rmtree(data, ignore_errors=True)
    with Broker.open(data) as broker:
        broker.create_queue(QUEUE, partitions=7, rebalance_delay=1.0, max_handoff_time=2.0)
        keys = [f"customer-{i}" for i in range(20)]
        results = broker.publish_many(QUEUE, [(f"invoice {n} of {k}".encode(), k)
                                              for n in range(1, 6) for k in keys])
        print(f"published {len(results)} keyed messages into {data}/ (queue {QUEUE!r}, 7 partitions)")
        print(f"   key customer-0 -> partition {results[0].partition} (crc32c(key) % 7)")

        flows = {f"consumer-{i}": broker.bind(QUEUE, name=f"consumer-{i}") for i in (1, 2, 3)}
        _show(broker, flows, "three consumers bound; the first took every partition, the rest wait")
        _wait_status(broker, "Ready")
        _show(broker, flows, "after the rebalance delay (1 s): balanced")

        # consumer-1 holds messages of the partition that will move (its highest) unacked,
        # like B1/B2 in Solace's handoff example, and acks the rest.
        c1 = flows["consumer-1"]
        moving = max(c1.partitions)
        got = c1.receive(max_messages=100, timeout=1.0)
        held = [m for m in got if m.partition == moving]
        c1.ack_many([m for m in got if m.partition != moving])
        print(f"\nconsumer-1 holds {len(held)} messages of partition {moving} unacked")
        flows["consumer-4"] = broker.bind(QUEUE, name="consumer-4")
        _show(broker, flows, "consumer-4 binds: Holddown")
        _wait_status(broker, "Rebalancing")
        _show(broker, flows, "delay over: the moving partition is Paused until consumer-1 acks")
        time.sleep(0.3)
        c1.ack_many(held)
        print("consumer-1 acked what it held")
        _wait_status(broker, "Ready")
        _show(broker, flows, "handoff done: 2/2/2/1")

        total = 0
        for flow in flows.values():
            while msgs := flow.receive(max_messages=100, timeout=0.2):
                flow.ack_many(msgs)
                total += len(msgs)
        _show(broker, flows, f"every consumer drained its partitions ({total} messages acked)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", default="demo-data", help="directory for the demo store")
    args = parser.parse_args()
    run(args.data)


if __name__ == "__main__":
    main()
