"""Checks the output of a quick line-count study run (`bench/run seed-linecount --quick`).

scripts/test runs the quick study, then this module with LINECOUNT_QUICK_DIR set to its
output directory. Without it (a plain `pytest bench/tests`), these tests are skipped."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import linecount_report as rep  # noqa: E402

OUT = os.environ.get("LINECOUNT_QUICK_DIR")
pytestmark = pytest.mark.skipif(not OUT, reason="LINECOUNT_QUICK_DIR is not set (no quick study ran)")


QUICK_PATHS = rep.default_paths(quick=True)


def _doc():
    [js] = list(Path(OUT).glob("seed-linecount-quick-*.json"))
    return js, json.loads(js.read_text())


def test_table_and_chart_were_produced():
    js, raw = _doc()
    md = js.with_suffix(".md").read_text()
    png = js.with_suffix(".png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert f"profile `{raw['profile']}`" in md
    for p in QUICK_PATHS:
        assert rep.PATHS[p][0] in md, f"{p} missing from the table"
    assert raw["quick"] and raw["sizes"] == [256 << 20] and raw["reps"] == 3


def test_locus_second_access_is_faster_than_its_first():
    _, raw = _doc()
    s = rep.summarize(raw)
    for path in ("locus-native", "locus-s3a"):
        for mode in rep.MODES:
            r = s[(raw["sizes"][0], path, mode)]
            assert r["next_mean"] < r["first"], f"{path} {mode}: next {r['next_mean']:.2f} s, first {r['first']:.2f} s"


def test_every_access_counted_every_line():
    _, raw = _doc()
    lines = {f["size"]: f["lines"] for f in raw["floor"]}
    assert all(r["lines"] == lines[r["size"]] > 0 for r in raw["runs"])
    assert sorted((r["path"], r["mode"]) for r in raw["runs"]) == sorted((p, m) for p in QUICK_PATHS for m in rep.MODES)
