"""Consumers in every process of the host (rules `peer-flows`, `owner-takeover`,
`serve`, `liveness` and `fencing`): flows bound in processes that do not own a
queue's delivery, served by the owner's control socket and reading the store themselves. Real
processes, killed with SIGKILL and stopped with SIGSTOP; tests wait on conditions read from the
consumers' logs and the queue's status, never on sleeps."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict

import pytest
from helpers import wait_until

import partq

HERE = os.path.dirname(os.path.abspath(__file__))
KEYS = [f"key-{i}" for i in range(40)]


class Consumer:
    def __init__(self, data: str, tmp, name: str, hold: int = 0, queue: str = "q",
                 rebind: bool = False) -> None:
        self.name = name
        self.log = str(tmp / f"{name}.jsonl")
        args = [sys.executable, os.path.join(HERE, "consumer_proc.py"), data, queue, name,
                self.log]
        if hold:
            args += ["--hold", str(hold)]
        if rebind:
            args.append("--rebind")
        self.err = open(tmp / f"{name}.err", "wb")
        self.proc = subprocess.Popen(args, stderr=self.err)

    def events(self, op: str | None = None) -> list[dict]:
        try:
            with open(self.log, "rb") as f:
                lines = f.read().split(b"\n")
        except FileNotFoundError:
            return []
        out = []
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue      # a torn last line of a killed process
            if op is None or event["op"] == op:
                out.append(event)
        return out

    def partitions(self) -> list[int] | None:
        parts = self.events("parts")
        return parts[-1]["partitions"] if parts else None

    def acked(self) -> set[tuple[int, int]]:
        return {(e["partition"], e["seq"]) for e in self.events("acked")}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.err.close()

    def tail(self) -> str:
        if self.proc.poll() is None:          # alive but stuck: add its threads' stacks
            self.proc.send_signal(signal.SIGUSR1)
            time.sleep(0.5)                   # not a wait for a condition: faulthandler writes
        with open(self.err.name, "rb") as f:
            return f.read()[-8000:].decode(errors="replace")

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise AssertionError(f"consumer {self.name} exited with {self.proc.returncode}:\n"
                                 f"{self.tail()}")


@pytest.fixture
def consumers(tmp_path):
    started: list[Consumer] = []
    data = str(tmp_path / "data")

    def start(name: str, **kw) -> Consumer:
        c = Consumer(data, tmp_path, name, **kw)
        started.append(c)
        return c
    yield data, start
    for c in started:
        c.stop()


def create(data: str, **options) -> None:
    with partq.Broker.open(data) as broker:
        broker.create_queue("q", **{"partitions": 6, "rebalance_delay": 0.5,
                                    "max_handoff_time": 0.5, **options})


def publish(data: str, n: int, start: int = 0) -> dict[str, str]:
    """n keyed messages with payloads m<i>; returns payload -> key."""
    items = [(b"m%d" % i, KEYS[i % len(KEYS)]) for i in range(start, start + n)]
    with partq.Broker.open(data) as broker:
        broker.publish_many("q", items)
    return {p.decode(): k for p, k in items}


def status(data: str) -> partq.QueueStatus:
    with partq.Broker.open(data) as broker:
        return broker.queue_status("q")


def all_delivered(cs: list[Consumer]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = defaultdict(list)
    for c in cs:
        for e in c.events("delivered"):
            out[e["payload"]].append({**e, "by": c.name})
    return out


def not_acked(cs: list[Consumer], published: dict[str, str],
              killed: Consumer | None = None) -> list[str]:
    """Published messages no consumer logged as acked (and, for a killed consumer that may have
    acked without logging it, not delivered to it)."""
    acked = set().union(*(c.acked() for c in cs))
    delivered = all_delivered(cs)
    return [p for p in published
            if p not in delivered
            or ((delivered[p][0]["partition"], delivered[p][0]["seq"]) not in acked
                and not (killed and any(e["by"] == killed.name for e in delivered[p])))]


def check_deliveries(cs: list[Consumer], published: dict[str, str],
                     killed: Consumer | None = None) -> None:
    """Every published message delivered, and acked by some consumer (a killed one may have
    acked without logging it: those must have been delivered to it); a message delivered more
    than once is marked redelivered after its first delivery; per key, each consumer's first
    deliveries come in publish order (per-key order within each consumer's life)."""
    unacked = not_acked(cs, published, killed)
    assert not unacked, unacked[:10]
    delivered = all_delivered(cs)
    for payload, events in delivered.items():
        events.sort(key=lambda e: e["t"])
        assert all(e["redelivered"] for e in events[1:]), (payload, events)
    for c in cs:
        last: dict[str, int] = {}
        for e in c.events("delivered"):
            if e["redelivered"]:
                continue
            assert e["seq"] > last.get(e["key"], -1), (c.name, e)
            last[e["key"]] = e["seq"]


def split(start, first: tuple[str, dict], second: tuple[str, dict]) -> tuple[Consumer, Consumer]:
    """Start consumer ``first`` (name, options), which runs delivery and holds all 6 partitions,
    then ``second``; return both once they split 3/3."""
    a = start(first[0], **first[1])
    wait_until(lambda: a.partitions() == list(range(6)), timeout=60,
               what=f"{a.name} holds all", procs=[a])
    b = start(second[0], **second[1])
    wait_until(lambda: b.partitions() and len(b.partitions()) == 3, timeout=60,
               what="a 3/3 split", procs=[a, b])
    return a, b


def hold_three(data: str, holder: Consumer, other: Consumer) -> tuple[dict[str, str], list]:
    """Publish 60 messages; once ``holder`` (started with hold=3) holds 3 unacked and acked the
    rest of what it got, return what was published and the positions it holds. Stopping it then
    stops it while it writes nothing: a process stopped inside a commit holds LMDB's write lock,
    and every other process's writes wait for it (see docs/behaviour.md)."""
    published = publish(data, 60)
    wait_until(lambda: holder.events("holding") and len(holder.events("delivered")) - 3
               == len(holder.events("acked")), timeout=60,
               what=f"{holder.name} holds 3 and acked the rest", procs=[holder, other])
    return published, [(e["partition"], e["seq"]) for e in holder.events("delivered")][:3]


def test_three_processes_split_six_partitions_two_each(consumers):
    data, start = consumers
    create(data)
    cs = [start(n) for n in ("a", "b", "c")]
    wait_until(lambda: all(c.partitions() is not None and len(c.partitions()) == 2 for c in cs),
               timeout=60, what="a 2/2/2 split", procs=cs)
    assert sorted(p for c in cs for p in c.partitions()) == list(range(6))
    published = publish(data, 600)
    wait_until(lambda: not not_acked(cs, published), timeout=60,
               what="every message acked", procs=cs)
    check_deliveries(cs, published)
    st = status(data)
    assert st.depth == 0
    clients = {f.name: f.client for f in st.flows}
    pids = {c.name: c.proc.pid for c in cs}
    for name, pid in pids.items():
        assert clients[name].startswith(f"pid {pid} on "), (name, clients)
    owner = int(st.delivery_owner.split()[1])
    followers = [f for f in st.flows if not f.client.startswith(f"pid {owner} ")]
    assert len(followers) == 2 and all(f.heartbeat_age is not None for f in followers)


def test_flows_whose_partitions_do_not_move_are_never_fenced(consumers):
    """Two consumer processes split 8 partitions with a short rebalance delay and handoff time
    (0.2 s each); once the split is Ready with two active flows, they consume what is published
    then: no ack is fenced and no partition moves, since nobody joined or left (a FlowFenced
    was once reported in this trial; not reproduced since)."""
    data, start = consumers
    create(data, partitions=8, rebalance_delay=0.2, max_handoff_time=0.2)
    a = start("a")
    wait_until(lambda: a.partitions() == list(range(8)), timeout=60, what="a holds all",
               procs=[a])
    b = start("b")

    def ready() -> bool:
        st = status(data)
        return (st.rebalance_status == "Ready" and sum(f.active for f in st.flows) == 2
                and len(a.partitions() or ()) == 4 and len(b.partitions() or ()) == 4)
    wait_until(ready, timeout=60, what="a Ready 4/4 split", procs=[a, b])
    split_parts = (a.partitions(), b.partitions())
    published = publish(data, 2000)
    wait_until(lambda: not not_acked([a, b], published), timeout=120,
               what="every message acked", procs=[a, b])
    assert a.events("fenced") == [] and b.events("fenced") == []
    assert (a.partitions(), b.partitions()) == split_parts
    check_deliveries([a, b], published)


@pytest.mark.parametrize("victim", ["owner", "follower"])
def test_a_killed_consumer_loses_nothing(consumers, victim):
    """SIGKILL of the delivery owner or of another consumer process while messages flow: the
    others (one of them taking delivery over) get every message, redeliveries marked."""
    data, start = consumers
    create(data, consumer_timeout=2.0)
    cs = [start(n, hold=5) for n in ("a", "b", "c")]
    wait_until(lambda: all(c.partitions() and len(c.partitions()) == 2 for c in cs),
               timeout=60, what="a 2/2/2 split", procs=cs)
    owner_pid = int(status(data).delivery_owner.split()[1])
    if victim == "owner":
        dead = next(c for c in cs if c.proc.pid == owner_pid)
    else:
        dead = next(c for c in cs if c.proc.pid != owner_pid)
    published = publish(data, 300)
    wait_until(lambda: dead.events("holding"), timeout=60, what="the victim holds messages",
               procs=cs)
    dead.proc.kill()
    dead.proc.wait()
    published.update(publish(data, 300, start=300))
    live = [c for c in cs if c is not dead]
    for c in live:
        open(c.log + ".go", "w").close()
    wait_until(lambda: not not_acked(cs, published, dead), timeout=90,
               what="every message acked", procs=live)
    assert status(data).depth == 0
    check_deliveries(cs, published, killed=dead)
    redelivered = [e for c in live for e in c.events("delivered") if e["redelivered"]]
    assert redelivered, "what the victim held was not redelivered"
    st = status(data)
    assert int(st.delivery_owner.split()[1]) in {c.proc.pid for c in live}
    assert sorted(p for f in st.flows if f.bound for p in f.partitions) == list(range(6))


def test_a_consumer_back_within_the_delay_keeps_its_partitions(consumers):
    """A consumer whose process stops past consumer_timeout is unbound (its partitions are
    Unbound); resumed within the rebalance delay it reconnects presenting its partition set
    and gets exactly those back: no handoff, no other partition moves (rules
    `bind-hint` and `liveness`)."""
    data, start = consumers
    create(data, rebalance_delay=8.0, consumer_timeout=1.0)
    first = start("a")
    wait_until(lambda: first.partitions() == list(range(6)), timeout=60, what="a holds all",
               procs=[first])
    second = start("b")
    wait_until(lambda: second.partitions() and len(second.partitions()) == 3, timeout=60,
               what="a 3/3 split", procs=[first, second])
    def held() -> dict[str, list[int]]:
        st = status(data)
        return {f.name: f.partitions for f in st.flows if f.bound} \
            if st.rebalance_status == "Ready" else {}
    before = wait_until(lambda: (lambda h: h if len(h) == 2 and all(len(p) == 3 for p in h.values())
                                 else None)(held()),
                        timeout=60, what="a settled 3/3 split", procs=[first, second])
    owner_pid = int(status(data).delivery_owner.split()[1])
    stopped = second if second.proc.pid != owner_pid else first
    other = first if stopped is second else second
    stopped.proc.send_signal(signal.SIGSTOP)
    wait_until(lambda: any(f.name == stopped.name and not f.bound for f in status(data).flows),
               timeout=30, what="the stopped consumer unbound after consumer_timeout")
    assert status(data).rebalance_status == "Holddown"
    stopped.proc.send_signal(signal.SIGCONT)
    wait_until(lambda: any(f.name == stopped.name and f.bound for f in status(data).flows),
               timeout=30, what="the consumer bound again", procs=[first, second])
    assert held() == before
    wait_until(lambda: stopped.partitions() == before[stopped.name], timeout=30,
               what="the returning consumer sees its partitions", procs=[first, second])
    assert other.partitions() == before[other.name]
    published = publish(data, 120)
    wait_until(lambda: not not_acked([first, second], published), timeout=60,
               what="every message acked", procs=[first, second])
    check_deliveries([first, second], published)


def test_a_consumer_stopped_past_the_delay_is_fenced(consumers):
    """Stopped past consumer_timeout and the rebalance delay, a consumer loses its partitions;
    after SIGCONT its ack of a held message is fenced (rule `fencing`), and the message goes to the new
    owner, marked redelivered; the returning consumer is a new member (rule `stale-hint`)."""
    data, start = consumers
    create(data, rebalance_delay=1.0, consumer_timeout=1.0, max_handoff_time=0.2)
    keeper, sleeper = split(start, ("keeper", {}), ("sleeper", {"hold": 3}))
    published, held = hold_three(data, sleeper, keeper)
    sleeper.proc.send_signal(signal.SIGSTOP)
    wait_until(lambda: keeper.partitions() == list(range(6)), timeout=60,
               what="keeper took sleeper's partitions", procs=[keeper])
    got_again = lambda: {(e["partition"], e["seq"]) for e in keeper.events("delivered")
                         if e["redelivered"]}
    wait_until(lambda: set(held) <= got_again(), timeout=60,
               what="sleeper's held messages redelivered to keeper", procs=[keeper])
    open(sleeper.log + ".go", "w").close()
    sleeper.proc.send_signal(signal.SIGCONT)
    wait_until(lambda: sleeper.events("fenced"), timeout=60, what="sleeper's late ack fenced",
               procs=[keeper, sleeper])
    fenced = {tuple(m) for e in sleeper.events("fenced") for m in e["messages"]}
    assert set(held) <= fenced
    assert not set(held) & sleeper.acked()
    assert set(held) <= keeper.acked()
    wait_until(lambda: sleeper.partitions() and len(sleeper.partitions()) == 3, timeout=60,
               what="sleeper rebalanced in as a new member", procs=[keeper, sleeper])
    wait_until(lambda: not not_acked([keeper, sleeper], published), timeout=60,
               what="every message acked", procs=[keeper, sleeper])
    assert status(data).depth == 0
    check_deliveries([keeper, sleeper], published)


def test_a_stopped_delivery_owner_is_taken_over_and_steps_down_when_it_runs_again(consumers):
    """The process that runs the queue's delivery is stopped (SIGSTOP) while it holds messages:
    once its lease (consumer_timeout) ran out another process takes delivery over, and gets the
    stopped one's partitions and held messages, marked redelivered (rule `owner-takeover`).
    After SIGCONT the old owner writes nothing more for the queue: its ack of what it held is
    refused (FlowClosed: its flow was closed), and it binds again as a consumer of the new
    owner. Nothing is lost."""
    data, start = consumers
    create(data, rebalance_delay=0.5, consumer_timeout=1.0, max_handoff_time=0.2)
    old, new = split(start, ("old", {"hold": 3, "rebind": True}), ("new", {"rebind": True}))
    assert status(data).delivery_owner.startswith(f"pid {old.proc.pid} ")
    published, held_list = hold_three(data, old, new)
    held = set(held_list)
    old.proc.send_signal(signal.SIGSTOP)
    wait_until(lambda: new.partitions() == list(range(6)), timeout=60,
               what="new took delivery and every partition over", procs=[new])
    assert status(data).delivery_owner.startswith(f"pid {new.proc.pid} ")
    published.update(publish(data, 30, start=60))
    redelivered = lambda: {(e["partition"], e["seq"]) for e in new.events("delivered")
                           if e["redelivered"]}
    wait_until(lambda: held <= redelivered() and held <= new.acked(), timeout=60,
               what="old's held messages redelivered to new and acked", procs=[new])
    open(old.log + ".go", "w").close()
    old.proc.send_signal(signal.SIGCONT)
    wait_until(lambda: old.events("closed"), timeout=60, what="old's flow closed",
               procs=[old, new])
    assert "took delivery over" in old.events("closed")[0]["reason"]
    assert not held & old.acked()
    wait_until(lambda: old.partitions() and len(old.partitions()) == 3, timeout=60,
               what="old bound again, served by new", procs=[old, new])
    assert status(data).delivery_owner.startswith(f"pid {new.proc.pid} ")
    wait_until(lambda: not not_acked([old, new], published), timeout=60,
               what="every message acked", procs=[old, new])
    assert status(data).depth == 0
    check_deliveries([old, new], published)
