"""Hostile and careless clients, all at once, against one ``partq serve`` in a process of its
own, while legitimate clients publish and consume: the legitimate ones see no error, nothing
they published is lost, and the server is still there. ``bench/hostile.py`` runs the same mix
and reports the server's memory and the legitimate publisher's worst latency beside a run
without attackers (figures belong in a benchmark, not in a test)."""
from __future__ import annotations

import threading

from helpers import wait_until
from hostile import TOKEN, Attacks, Legit, start_serve
from tools_helpers import PARTQ_SCRIPT

import partq


class Progress:
    """What a timed-out wait prints: how far each attack and the legitimate clients got."""
    name = "progress"

    def __init__(self, attacks: Attacks, legit: Legit) -> None:
        self.attacks, self.legit = attacks, legit

    def check_alive(self) -> None:
        pass

    def tail(self) -> str:
        return (f"attacks seen {self.attacks.seen}; legit published {self.legit.published}, "
                f"consumed {self.legit.consumed}, errors {self.legit.errors}")


def test_legitimate_clients_are_served_through_every_attack(tmp_path):
    data = tmp_path / "data"
    with partq.Broker.open(data) as broker:
        broker.create_queue("q", partitions=4, rebalance_delay=0.2, max_handoff_time=0.5)
        broker.create_queue("other", partitions=8)
        broker.create_queue("backlog", partitions=1)
        broker.publish_many("backlog", [(b"b" * 100_000, None) for _ in range(300)])
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o600)
    proc, address = start_serve(PARTQ_SCRIPT, str(data), str(token_file))
    try:
        stop = threading.Event()
        attacks, legit = Attacks(address, stop), Legit(address, stop)
        attacks.start()
        legit.start()
        wait_until(lambda: legit.errors or attacks.all_seen() and legit.published >= 1000
                   and legit.consumed >= 300, 240,
                   "every attack under way and the legitimate clients getting through",
                   procs=[Progress(attacks, legit)])
        legit.join()
        attacks.join()
        assert legit.errors == [], legit.errors
        assert proc.poll() is None, "partq serve ended"
        with partq.connect(address, token=TOKEN) as client:
            depth = client.queue_status("q").depth
            assert depth <= legit.published - legit.consumed
            flow = client.bind("q", name="legit-consumer")
            rest = []
            for _ in range(1000):
                msgs = flow.receive(1000, timeout=1.0)
                if not msgs:
                    break
                rest += msgs
                flow.ack_many(msgs)
        payloads = {m.payload for m in rest}
        assert len(payloads) == len(rest) or any(m.redelivered for m in rest)
        assert legit.consumed + len(payloads) >= legit.published
    finally:
        proc.terminate()
        proc.wait(timeout=60)
