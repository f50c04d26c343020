"""A full map is a clear typed error (StorageFull) and damages nothing: the batch that found the
map full leaves nothing behind, consume and ack still work at the limit, and a larger
max_map_size lets the map grow, followed by another process that opened it at the old size.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from helpers import drain

import partq

MiB = 1 << 20


# ============================================================================ full map
FOLLOWER = """
    import json, sys, partq
    b = partq.Broker.open(sys.argv[1], map_size=1 << 20, max_map_size=64 << 20)
    print(json.dumps("ready"), flush=True)
    for line in sys.stdin:
        cmd = line.strip()
        try:
            if cmd == "depth":
                out = b.queue_status("q").depth
            elif cmd == "publish":
                out = b.publish("q", b"from-follower", key="f").seq
            elif cmd == "drain":
                flow = b.bind("q", name="follower")
                out = []
                while True:
                    msgs = flow.receive(1000, timeout=0.2)
                    if not msgs:
                        break
                    out += [m.payload[:9].decode() for m in msgs]
                    flow.ack_many(msgs)
                flow.unbind()
        except Exception as exc:
            out = f"{type(exc).__name__}: {exc}"
        print(json.dumps(out), flush=True)
"""


def test_full_map(tmp_path):
    data = tmp_path / "data"
    b = partq.Broker.open(data, map_size=MiB, max_map_size=2 * MiB, clock=partq.ManualClock())
    b.create_queue("q", partitions=3, rebalance_delay=0.0)
    n, failed = 0, None
    while failed is None:
        batch = [(b"M%07d-" % (n + i) + b"y" * 1000, f"k{n + i}") for i in range(50)]
        heads = [p.next_seq for p in b.queue_status("q").partitions]
        try:
            b.publish_many("q", batch)
            n += 50
        except partq.StorageFull as exc:
            failed = exc
    assert "max_map_size" in str(failed)
    # the failed batch left nothing behind
    assert [p.next_seq for p in b.queue_status("q").partitions] == heads
    assert b.queue_status("q").depth == n
    follower = subprocess.Popen([sys.executable, "-c", textwrap.dedent(FOLLOWER), str(data)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        def ask(cmd):
            follower.stdin.write(cmd + "\n")
            follower.stdin.flush()
            return json.loads(follower.stdout.readline())
        assert json.loads(follower.stdout.readline()) == "ready"
        assert ask("depth") == n
        # consume and ack still work at the limit
        flow = b.bind("q", name="c")
        got = drain(flow)
        assert [m.payload[:9] for m in sorted(got, key=lambda m: m.payload)] == \
            [b"M%07d-" % i for i in range(n)]
        assert b.queue_status("q").depth == 0
        b.close()
        # reopened with a larger limit, publishing works and the map grows past the old limit
        b = partq.Broker.open(data, map_size=MiB, max_map_size=64 * MiB, clock=partq.ManualClock())
        k = 4000
        for j in range(0, k, 50):
            b.publish_many("q", [(b"N%07d-" % (j + i) + b"z" * 1000, f"k{j + i}") for i in range(50)])
        assert os.path.getsize(data / "data.mdb") > 2 * MiB
        # the other process, opened at the old size, follows the resize
        assert ask("depth") == k
        assert isinstance(ask("publish"), int)
        drained = ask("drain")
        assert isinstance(drained, list), drained
        assert sorted(drained) == sorted([f"N{i:07d}-" for i in range(k)] + ["from-foll"])
        assert b.queue_status("q").depth == 0
    finally:
        follower.stdin.close()
        follower.wait(timeout=30)
        b.close()
