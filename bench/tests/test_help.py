"""Every bench entry script answers --help on a machine with nothing installed or built:
no cargo, no Go, no locus binary (a --help that starts a 10-minute build is a bug)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# No cargo or go on PATH, and a LOCUS_BIN that does not exist: a script that tried to
# build or to run a binary would fail and exit non-zero.
ENV = {"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "LOCUS_BIN": "/nonexistent/locus",
       "HOME": os.environ.get("HOME", "/tmp"), "CARGO_TARGET_DIR": "/nonexistent/target"}


@pytest.mark.parametrize("args,expect", [
    (["bench/pipeline", "--help"], "--floor-persist-bucket"),
    (["bench/read", "--help"], "locus bench read --help"),
    (["bench/read", "--clients", "--help"], "--s3fs-python"),
    (["bench/gateway", "-h"], "locus bench gateway --help"),
    (["bench/run", "--help"], "seed-linecount"),
    (["bench/run", "seed-csd", "--help"], "usage"),
])
def test_help_builds_and_installs_nothing(args, expect):
    r = subprocess.run([str(ROOT / args[0]), *args[1:]], env=ENV, cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert expect in r.stdout
    assert "Compiling" not in r.stderr
