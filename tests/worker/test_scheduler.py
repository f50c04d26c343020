"""The KeyScheduler alone: which received message may run, per key or per partition."""
from __future__ import annotations

from partq.message import Message
from partq.worker.scheduler import KeyScheduler


def msg(partition: int, seq: int, key: str | None) -> Message:
    return Message("q", partition, seq, key, b"", None, 0, False, 1)


def take_all(s: KeyScheduler) -> list:
    out = []
    while entries := s.take(0, limit=2):
        out += entries
    return out


def seqs(entries) -> list[int]:
    return [e.msg.seq for e in entries]


def test_key_ordering_runs_keys_of_one_partition_at_once_and_one_key_at_a_time():
    s = KeyScheduler("key")
    s.add([msg(0, 0, "a"), msg(0, 1, "b"), msg(0, 2, "a"), msg(0, 3, "c"), msg(0, 4, "b")])
    first = take_all(s)
    assert seqs(first) == [0, 1, 3]             # a, b, c; a's and b's next wait
    s.done([first[0]])                           # a's first acked: a's next runs
    assert seqs(take_all(s)) == [2]
    s.done([first[1]])
    assert seqs(take_all(s)) == [4]
    assert s.buffered() == 3                     # a:2, b:4 out, c:3 out


def test_unkeyed_messages_of_a_key_queue_run_freely():
    s = KeyScheduler("key")
    s.add([msg(0, i, None) for i in range(5)])
    assert seqs(take_all(s)) == [0, 1, 2, 3, 4]


def test_partition_ordering_runs_one_message_of_a_partition_at_a_time():
    s = KeyScheduler("partition")
    s.add([msg(0, 0, "a"), msg(0, 1, "b"), msg(1, 0, "a")])
    got = take_all(s)
    assert [(e.msg.partition, e.msg.seq) for e in got] == [(0, 0), (1, 0)]
    s.done([got[0]])
    assert [(e.msg.partition, e.msg.seq) for e in take_all(s)] == [(0, 1)]


def test_a_nack_drops_the_copies_it_gave_back_that_were_received_before_it():
    s = KeyScheduler("key")
    s.add([msg(0, 0, "a"), msg(0, 1, "a"), msg(0, 2, "a")])
    (head,) = take_all(s)
    since = s.epoch()
    s.add([msg(0, 1, "a")])                      # a copy received after the nack: kept
    assert s.given_back(head, 0, [0, 1, 2], since) == 2
    (nxt,) = take_all(s)
    assert nxt.msg.seq == 1 and nxt.epoch >= since
    assert s.buffered() == 1


def test_close_hands_out_nothing_more_and_counts_what_never_started():
    s = KeyScheduler("key")
    s.add([msg(0, 0, "a"), msg(0, 1, "a"), msg(0, 2, "b")])
    s.take(0)                                    # a:0 runs; b:2 ready, a:1 waits
    assert s.close() == 2
    assert s.take(0) == []
    assert s.wait_for_room(1, 0) == 0


def test_drop_waiting_keeps_only_the_messages_handed_out():
    s = KeyScheduler("key")
    s.add([msg(0, 0, "a"), msg(0, 1, "a"), msg(0, 2, "b"), msg(0, 3, "c")])
    (a0,) = s.take(0)                            # a:0 runs; b:2 and c:3 ready, a:1 waits
    assert s.drop_waiting() == 3
    assert s.take(0) == [] and s.buffered() == 1
    s.done([a0])
    assert s.buffered() == 0
    s.add([msg(0, 1, "a")])                      # received again: handed out at once
    assert seqs(s.take(0)) == [1]
