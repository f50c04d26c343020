"""The TLS options of the Spark source through ``partq serve``, checked on the driver before
any task runs (no Spark needed for these)."""
from __future__ import annotations

import pytest

import partq
from partq.spark.options import where

TOKEN = "a-spark-test-token-of-32-bytes!!"


def test_tls_options_need_an_address_and_both_halves_of_a_client_certificate(tmp_path):
    with pytest.raises(partq.InvalidConfig, match="tlsKeyFile go with option address"):
        where({"queue": "q", "path": str(tmp_path), "tls": "true"})
    with pytest.raises(partq.InvalidConfig, match="both tlsCertFile and tlsKeyFile"):
        where({"queue": "q", "address": "127.0.0.1:1", "token": TOKEN, "tls": "true",
               "tlsCertFile": str(tmp_path / "c.pem")})
    with pytest.raises(partq.InvalidConfig, match="need tls true"):
        where({"queue": "q", "address": "127.0.0.1:1", "token": TOKEN, "tls": "false",
               "tlsCaFile": str(tmp_path / "ca.pem")})


def test_a_missing_ca_file_is_one_clear_error_on_the_driver(tmp_path):
    with pytest.raises(partq.InvalidConfig, match="cannot be used.*tlsCaFile"):
        where({"queue": "q", "address": "127.0.0.1:1", "token": TOKEN,
               "tlsCaFile": str(tmp_path / "missing.pem")})


def test_tls_true_alone_trusts_the_system_authorities():
    found = where({"queue": "q", "address": "127.0.0.1:1", "token": TOKEN, "tls": "true"})
    assert found.tls and found.ssl_context() is not None
    assert where({"queue": "q", "address": "127.0.0.1:1", "token": TOKEN}).ssl_context() is None

