"""A remote flow's inbox (partq/remote/inbox.py) against a flat list of (frame n, message): what
``take`` hands out, what ``drop`` forgets and which partitions it holds, whatever mix of whole
frames and slices the receives cut."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from partq.message import Message
from partq.remote.inbox import Inbox, deliveries

FIELDS = [0, 5, "k", b"p", None, 7, False, 2]


def _msg(partition: int, seq: int) -> Message:
    return Message("q", partition, seq, None, b"", None, 0, False, 1)


steps = st.lists(st.one_of(
    st.tuples(st.just("add"), st.lists(st.integers(0, 3), max_size=6)),   # partitions
    st.tuples(st.just("take"), st.integers(1, 9)),
    st.tuples(st.just("drop"), st.integers(0, 3)),
    st.tuples(st.just("clear"), st.none())), max_size=40)


@settings(max_examples=300, deadline=None)
@given(steps)
def test_the_inbox_hands_out_what_a_flat_list_would(script):
    inbox, model, n, seq = Inbox(), [], 0, 0
    for verb, arg in script:
        if verb == "add":
            n += 1
            msgs = []
            for p in arg:
                seq += 1
                msgs.append(_msg(p, seq))
            inbox.add(n, msgs)
            model += [(n, m) for m in msgs]
        elif verb == "take":
            got = inbox.take(arg)
            assert got == [m for _, m in model[:arg]]
            model = model[arg:]
        elif verb == "drop":        # as a nack's answer does: a partition, up to a frame
            inbox.drop(lambda fn, m, p=arg, upto=n - 1: m.partition == p and fn <= upto)
            model = [(fn, m) for fn, m in model if not (m.partition == arg and fn <= n - 1)]
        else:
            inbox.clear()
            model = []
        assert bool(inbox) == bool(model)
        assert inbox.partitions() == {m.partition for _, m in model}
    assert inbox.take(1000) == [m for _, m in model]


def test_deliveries_build_messages_of_eight_fields_and_fill_in_a_missing_count():
    assert deliveries("q", [FIELDS]) == [Message("q", *FIELDS)]
    assert deliveries("q", [FIELDS[:7], FIELDS]) == [Message("q", *FIELDS[:7], 1),
                                                     Message("q", *FIELDS)]


@pytest.mark.parametrize("fields", [["not", "a", "message"], FIELDS + [1]])
def test_deliveries_refuse_a_message_of_another_shape(fields):
    with pytest.raises(ValueError, match="fields"):
        deliveries("q", [FIELDS, fields])
