"""bench/key_ordering.py --quick runs and prints its JSON lines (shape only: no timing is
asserted), and what it counts that ordering rules fix (not the clock) holds: B never gets a key A
still holds (B a flow of this process or of another), B gets nothing of the moving partition
before A acked under "partition", the nacked key is never delivered during its delay, and the
nacked message comes back first."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import bench_env, check_bench_lines

REPO = Path(__file__).resolve().parents[2]
HANDOFF = "handoff_first_message_seconds_key"
OTHER = "handoff_first_message_seconds_key_other_process"
NACK = "consume_other_keys_during_nack_delay_key"


@pytest.mark.timeout(120)
def test_key_ordering_bench_quick_prints_json_lines(tmp_path):
    env = bench_env(REPO, tmp_path)
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "key_ordering.py"), "--quick"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the peers (the "partition" sides) are not lines of their own; the partition side of the
    # nack line consumes 0 msgs/s, so its ratio is null (method.ratios skips a peer of 0)
    lines = check_bench_lines(proc.stdout.splitlines(),
                              {"load_average_at_start", HANDOFF, OTHER, NACK},
                              positive=False, peers_in_run=False, ratio_from="measured")
    assert next(iter(lines)) == "load_average_at_start" and lines["load_average_at_start"]["quick"]

    handoff = lines[HANDOFF]
    assert handoff["peer"] == "handoff_first_message_seconds_partition"
    assert handoff["unit"] == "s" and handoff["better"] == "lower"
    assert handoff["value"] > 0 and handoff["peer_value"] > 0 and handoff["pairs"] == 1
    assert handoff["received_keys_old_flow_still_held"] == {"key": [0], "partition": [0]}
    assert handoff["peer_received_before_old_flow_acked"] == 0
    assert all(n >= 1 for side in ("key", "partition")
               for n in handoff["old_flow_held_keys_rounds"][side])

    other = lines[OTHER]        # B a flow of another process: the same rules hold
    assert other["peer"] == "handoff_first_message_seconds_partition_other_process"
    assert other["value"] > 0 and other["peer_value"] > 0
    assert other["received_keys_old_flow_still_held"] == {"key": [0], "partition": [0]}
    assert other["peer_received_before_old_flow_acked"] == 0

    nack = lines[NACK]
    assert nack["peer"] == "consume_other_keys_during_nack_delay_partition"
    assert nack["unit"] == "msgs/s" and nack["better"] == "higher"
    assert nack["nacked_key_delivered_during_delay"] == {"key": [0], "partition": [0]}
    assert nack["nacked_message_came_back_first"] == {"key": [True], "partition": [True]}
    if nack["peer_value"] == 0:
        assert nack["ratio"] is None and nack["zero_peer_pairs"] == 1 and "ratio" in nack["note"]
    assert list(tmp_path.iterdir()) == [], "the bench left scratch directories behind"
