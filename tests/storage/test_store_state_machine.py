"""A hypothesis state machine over one store: append, ack (any subset, including already-acked
and out-of-order seqs), ack of a whole prefix, and close/reopen, checked against a dict model.

Invariants after every step, per partition:
* the head is the number of records ever appended;
* the ack floor is the first unacked seq, and ``above`` the acked seqs past it;
* exactly the seqs floor..head-1 are stored (the acked prefix is truncated, rule `truncation`; acked seqs
  above the floor stay until the gap closes), and every unacked one decodes to what was appended.
"""
from __future__ import annotations

import shutil
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from partq.storage import Store, decode_record, encode_record

PARTITIONS = 3
partitions = st.integers(min_value=0, max_value=PARTITIONS - 1)


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.path = tempfile.mkdtemp(prefix="partq-sm-")
        self.store = None
        self.qid = 0
        self.appended: dict[int, list[tuple]] = {p: [] for p in range(PARTITIONS)}
        self.acked: dict[int, set[int]] = {p: set() for p in range(PARTITIONS)}
        # (first, last) of each append: one chunk each (appends here stay under the chunk limits)
        self.chunks: dict[int, list[tuple[int, int]]] = {p: [] for p in range(PARTITIONS)}
        self.counter = 0

    @initialize(durability=st.sampled_from(["sync", "async"]))
    def open_store(self, durability):
        self.durability = durability
        self.store = Store.open(self.path, durability=durability, map_size=256 << 10)

        def op(w):
            qid = w.allocate_qid()
            w.put_queue("q", {"name": "q", "qid": qid, "partitions": PARTITIONS})
            for p in range(PARTITIONS):
                w.init_partition(qid, p)
            return qid
        self.qid = self.store.write(op)

    def teardown(self) -> None:
        if self.store is not None:
            self.store.close()
        shutil.rmtree(self.path, ignore_errors=True)

    # ------------------------------------------------------------------ model helpers
    def floor(self, p: int) -> int:
        f = 0
        while f in self.acked[p]:
            f += 1
        return f

    def stored_from(self, p: int) -> int:
        """The first seq still stored: a chunk goes once every record in it is below the floor."""
        floor = self.floor(p)
        return next((first for first, last in self.chunks[p] if last >= floor),
                    len(self.appended[p]))

    def unacked(self, p: int) -> list[int]:
        return [s for s in range(len(self.appended[p])) if s not in self.acked[p]]

    # ------------------------------------------------------------------ rules
    @rule(p=partitions, n=st.integers(min_value=1, max_value=6),
          key=st.none() | st.text(max_size=8), size=st.integers(min_value=0, max_value=3000))
    def append(self, p, n, key, size):
        fields = []
        for _ in range(n):
            self.counter += 1
            payload = (b"%d|" % self.counter) * (size // 8 + 1)
            fields.append((self.counter, key, {"n": self.counter}, payload[:max(size, 4)]))
        records = [encode_record(*f) for f in fields]
        first = self.store.write(lambda w: w.append(self.qid, p, records))
        assert first == len(self.appended[p])
        self.appended[p].extend(fields)
        self.chunks[p].append((first, first + n - 1))

    @precondition(lambda self: any(self.appended.values()))
    @rule(p=partitions, data=st.data())
    def ack_some(self, p, data):
        published = range(len(self.appended[p]))
        seqs = data.draw(st.lists(st.sampled_from(published), max_size=8) if published
                         else st.just([]), label="seqs")
        state = self.store.write(lambda w: w.ack(self.qid, p, seqs))
        self.acked[p].update(seqs)
        assert state.floor == self.floor(p)

    @precondition(lambda self: any(self.appended.values()))
    @rule(p=partitions, data=st.data())
    def ack_prefix(self, p, data):
        unacked = self.unacked(p)
        if not unacked:
            return
        upto = data.draw(st.integers(min_value=1, max_value=len(unacked)), label="upto")
        seqs = unacked[:upto]
        state = self.store.write(lambda w: w.ack(self.qid, p, reversed(seqs)))
        self.acked[p].update(seqs)
        assert state.floor == self.floor(p) and state.floor > seqs[0]

    @rule()
    def reopen(self):
        self.store.close()
        self.store = Store.open(self.path, durability=self.durability, map_size=256 << 10)
        assert not self.store.report.created

    # ------------------------------------------------------------------ invariants
    @invariant()
    def log_matches_model(self):
        if self.store is None:
            return
        with self.store.read() as r:
            for p in range(PARTITIONS):
                head = len(self.appended[p])
                floor = self.floor(p)
                assert r.head(self.qid, p) == head
                state = r.ack_state(self.qid, p)
                assert state.floor == floor
                assert state.above == {s for s in self.acked[p] if s > floor}
                kept = self.stored_from(p)
                stored = r.records(self.qid, p, 0, head + 10)
                assert [seq for seq, _ in stored] == list(range(kept, head))
                assert r.stored_count(self.qid, p) == head - kept
                assert r.first_seq(self.qid, p) == (kept if kept < head else None)
                if floor < head:      # reading from any seq starts there
                    assert [s for s, _ in r.records(self.qid, p, floor, 3)] == \
                        list(range(floor, min(floor + 3, head)))
                for seq, raw in stored:
                    if seq not in self.acked[p]:
                        rec = decode_record(raw, "q", p, seq)
                        assert (rec.publish_time_ns, rec.key, rec.headers, rec.payload) == \
                            self.appended[p][seq]


TestStoreMachine = StoreMachine.TestCase
TestStoreMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None,
                                     suppress_health_check=[HealthCheck.too_slow])
