"""The library logs and the application decides: with no logging configured, a program that
uses partq prints none of partq's warnings; the ``partq`` command shows them as plain lines;
and a process that only asks the delivery owner for a status is no news in the owner's log."""
from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

from helpers import wait_until

import partq


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120)


def test_a_program_that_configures_no_logging_gets_none_of_partqs_warnings(tmp_path):
    # a replication listener without a token warns that it is in protected mode
    proc = run(f"""
        import partq
        with partq.Broker.open({str(tmp_path / 'd')!r}, replication_listen="127.0.0.1:0"):
            pass
        print("done")
    """)
    assert proc.returncode == 0 and proc.stdout == "done\n"
    assert proc.stderr == ""


def test_the_command_shows_the_librarys_warnings_as_plain_lines():
    proc = run("""
        import logging
        from partq.tools.cli import show_warnings
        show_warnings()
        logging.getLogger("partq.delivery").info("not shown")
        logging.getLogger("partq.delivery").warning("shown")
    """)
    assert proc.stderr == "shown\n"


def test_a_status_from_another_process_is_no_news_in_the_owners_log(tmp_path, caplog):
    data = tmp_path / "data"
    with partq.Broker.open(data) as owner:
        owner.create_queue("q", partitions=2)
        owner.bind("q", name="here")                 # this process owns the queue's delivery
        with caplog.at_level(logging.INFO, logger="partq.delivery"):
            for _ in range(3):
                proc = run(f"""
                    import partq
                    with partq.Broker.open({str(data)!r}) as b:
                        print(len(b.queue_status("q").flows))
                """)
                assert proc.returncode == 0 and proc.stdout == "1\n", proc.stderr
            # a process with a flow that leaves is still news
            proc = run(f"""
                import partq
                with partq.Broker.open({str(data)!r}) as b:
                    b.bind("q", name="there")
            """)
            assert proc.returncode == 0, proc.stderr
            wait_until(lambda: any("disconnected" in r.getMessage() for r in caplog.records),
                       30, "the leaving peer logged")
        lines = [r.getMessage() for r in caplog.records if "disconnected" in r.getMessage()]
        assert len(lines) == 1, lines
