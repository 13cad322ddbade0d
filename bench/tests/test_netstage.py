"""netstage picks a namespace name no other stage holds, and never deletes one it did not create."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import netstage  # noqa: E402

needs_root = pytest.mark.skipif(os.geteuid() != 0 or subprocess.run(["ip", "netns", "list"], capture_output=True).returncode != 0,
                                reason="network namespaces need root and iproute2")


@needs_root
def test_a_taken_name_is_skipped_and_left_alone(tmp_path):
    seed = 37  # -> locus-ufs57
    taken = "locus-ufs57"
    subprocess.run(["ip", "netns", "add", taken], check=True)
    try:
        assert netstage.free_stage_number(seed) == 58
        # A `down` of a stage whose `up` failed before creating its namespace records no
        # namespace, so the one another stage holds survives.
        state = tmp_path / "st.json"
        state.write_text(json.dumps({"profile": "lan", "pids": []}))
        netstage.down(state)
        assert Path(f"/run/netns/{taken}").exists()
        assert not state.exists()
    finally:
        subprocess.run(["ip", "netns", "del", taken], check=True)


def test_numbers_wrap_within_range():
    n = netstage.free_stage_number(199)
    assert 20 <= n <= 219
