"""Careless input at the edges of the network code: a token file others may read, and the like.
Each gets one clear line (a warning or an error that says what to do)."""
from __future__ import annotations

import logging

import pytest

import partq
from partq.wire.handshake import read_token

TOKEN = "a-test-token-of-32-bytes-or-so!!"


@pytest.mark.parametrize("mode, warned", [(0o600, False), (0o400, False), (0o640, True),
                                          (0o644, True)])
def test_a_token_file_others_may_read_is_warned_of(tmp_path, caplog, mode, warned):
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(mode)
    with caplog.at_level(logging.WARNING, logger="partq.listener"):
        assert read_token(token_file=str(path)) == TOKEN.encode()
    lines = [r.getMessage() for r in caplog.records if "may be read by other users" in r.getMessage()]
    assert bool(lines) == warned
    if warned:
        assert f"chmod 600 {path}" in lines[0]


def test_a_short_token_is_refused_with_how_to_make_one(tmp_path):
    with pytest.raises(partq.InvalidConfig, match="openssl rand"):
        read_token(token="short")
