"""Numbers the command line cannot use are refused before the command starts, in one line that
names the option (exit status 2), by the installed ``partq`` script in processes of its own: a
NaN or infinite number of seconds (``consume --timeout nan`` never ended, ``serve --idle-timeout
nan`` served, ``top --interval nan`` refreshed without a pause), a consumer count whose plan
would take hours and gigabytes, a partition storage cannot hold (a traceback of
``struct.error``)."""
from __future__ import annotations

import pytest
from tools_helpers import ok, run_script, script_user_error

# every option that takes seconds (tools.common.Seconds), with what else its command needs
SECONDS_OPTIONS = {
    "consume --timeout": ["consume", "q", "--timeout"],
    "top --interval": ["top", "--count", "1", "--json", "--interval"],
    "serve --idle-timeout": ["serve", "--listen", "127.0.0.1:0", "--idle-timeout"],
    "scale --drain-timeout": ["scale", "q", "-p", "2", "--drain-timeout"],
    "scale --rebalance-timeout": ["scale", "q", "-p", "2", "--rebalance-timeout"],
    "scale --standby-timeout": ["scale", "q", "-p", "2", "--standby-timeout"],
}


@pytest.fixture
def queue(run):
    ok(run("queue", "create", "q", "--partitions", "1"))
    ok(run("publish", "q", "a"))
    return "q"


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("option", sorted(SECONDS_OPTIONS))
def test_seconds_that_are_not_a_number_are_refused(partq_script, data, run, queue, option, value):
    args = SECONDS_OPTIONS[option]
    proc = run_script(partq_script, data, *args, value)
    script_user_error(proc, f"{args[-1]} must be a number of seconds from", f"not {value}",
                      status=2)
    assert proc.stdout == ""
    assert '"partition_count": 1' in ok(run("queue", "show", "q", "--json")).stdout


def test_a_dry_run_for_a_hundred_million_consumers_is_refused(partq_script, data, queue):
    proc = run_script(partq_script, data, "rebalance", "q", "--dry-run", "--consumers",
                      "100000000")
    assert proc.returncode == 2, proc.stderr
    assert "'--consumers': 100000000 is not in the range 0<=x<=10000" in proc.stderr


@pytest.mark.parametrize("verb", ["kill", "ack"])
@pytest.mark.parametrize("position", [("1099511627776", "0"), ("0", "18446744073709551616")])
def test_a_message_position_storage_cannot_hold_is_refused(partq_script, data, queue, verb,
                                                           position):
    proc = run_script(partq_script, data, "message", verb, "q", *position, "--yes")
    script_user_error(proc, "must be an integer from 0 to")
