"""The owner's queue status shows what a flow of another process holds unacked, from its first
receive on (not only once it acked something), and whatever process asks."""
from __future__ import annotations

import subprocess
import sys
import textwrap

from helpers import wait_until

import partq


def test_status_counts_what_a_peer_process_holds_unacked(tmp_path):
    data = tmp_path / "data"
    done = tmp_path / "received"
    with partq.Broker.open(data) as owner:
        owner.create_queue("q", partitions=2, rebalance_delay=0.2)
        owner.publish_many("q", [(b"m%d" % i, f"k{i}") for i in range(20)])
        owner.bind("q", name="here")                        # this process owns delivery
        peer = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
            import pathlib, sys, time
            import partq
            with partq.Broker.open({str(data)!r}) as b:
                flow = b.bind("q", name="there")
                got = []
                while len(got) < 5:
                    got += flow.receive(5 - len(got), timeout=1.0)
                pathlib.Path({str(done)!r}).write_text(str(sorted(flow.partitions)))
                sys.stdin.read()                            # hold them until told to go
        """)], stdin=subprocess.PIPE, text=True)
        try:
            wait_until(lambda: done.exists() or peer.poll() is not None, 60,
                       "the peer to receive five messages")
            assert peer.poll() is None, "the peer process ended"
            (held,) = eval(done.read_text())

            def shown():
                st = owner.queue_status("q")
                return {p.partition: p.unacked for p in st.partitions}.get(held) == 5
            wait_until(shown, 30, "the owner's status to show the peer's five unacked")
        finally:
            peer.communicate("", timeout=60)
