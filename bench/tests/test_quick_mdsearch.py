"""Checks the output of a quick metadata-search study (`bench/run seed-mdsearch --quick`).

scripts/test runs the quick study, then this module with MDSEARCH_QUICK_DIR set to its
output directory. Without it (a plain `pytest bench/tests`), these tests are skipped."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

OUT = os.environ.get("MDSEARCH_QUICK_DIR")
pytestmark = pytest.mark.skipif(not OUT, reason="MDSEARCH_QUICK_DIR is not set (no quick seed-mdsearch run)")


def _doc():
    js = Path(OUT) / "seed-mdsearch-quick.json"
    return js, json.loads(js.read_text())


def test_every_query_ran_and_engines_agree():
    _, raw = _doc()
    [sc] = raw["scales"]
    assert sc["objects"] == 100_000
    names = [q["name"] for q in sc["queries"]]
    assert len(names) >= 8
    for n in names:
        assert len(sc["locus"][n]["seconds"]) == raw["reps"]
        assert sc["agree"][n], n
    # From one match to a full first page.
    sizes = [len(sc["locus"][n]["keys"]) for n in names]
    assert min(sizes) == 1 and max(sizes) == 1000
    assert sc["import"]["objects_per_s"] > 0 and sc["index_bytes"] > 0 and sc["rss_after_queries"] > 0


def test_live_probes_were_all_found_under_load():
    _, raw = _doc()
    lv = raw["scales"][0]["live"]
    assert lv["puts"] > 0 and lv["probes"] > 0
    assert lv["not_found"] == 0 and len(lv["lag_seconds"]) == lv["probes"]


def test_every_page_size_has_its_floor():
    _, raw = _doc()
    [sc] = raw["scales"]
    for n, v in sc["locus"].items():
        fl = sc["floor_list"][str(len(v["keys"]))]
        assert fl["keys"] == max(len(v["keys"]), 1), n
        assert len(fl["seconds"]) == raw["reps"]


def test_the_import_has_its_floor():
    # The floor indexed every object of the manifest (the generator's keys are unique).
    _, raw = _doc()
    [sc] = raw["scales"]
    fl = sc["import_floor"]
    assert fl["objects"] == sc["objects"]
    assert fl["seconds"] > 0 and fl["objects_per_s"] == pytest.approx(fl["objects"] / fl["seconds"])


def test_table_and_chart_were_produced():
    js, raw = _doc()
    md = js.with_suffix(".md").read_text()
    png = js.with_suffix(".png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert "## 100,000 objects" in md and "## Goals" in md
    for q in raw["scales"][0]["queries"]:
        assert f"| {q['name']}" in md
