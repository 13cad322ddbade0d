"""Checks the output of a quick computational-storage study (`bench/run seed-csd --quick`).

scripts/test runs the quick study, then this module with CSD_QUICK_DIR set to its output
directory. Without it (a plain `pytest bench/tests`), these tests are skipped."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import csd_report as rep  # noqa: E402

OUT = os.environ.get("CSD_QUICK_DIR")
pytestmark = pytest.mark.skipif(not OUT, reason="CSD_QUICK_DIR is not set (no quick seed-csd run)")

MiB = 1 << 20


def _doc():
    [js] = list(Path(OUT).glob("seed-csd-quick-*.json"))
    return js, json.loads(js.read_text())


def test_table_and_chart_were_produced():
    js, raw = _doc()
    md = js.with_suffix(".md").read_text()
    png = js.with_suffix(".png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert f"Profile `{raw['profile']}`" in md
    lines = md.splitlines()
    for row in ("| count |", "| entropy |", "| all operators |", "| total (sum of the 8) |"):
        assert sum(ln.startswith(row) for ln in lines) == len(raw["datasets"]), row
    for label in ("Locus cold (1w)", "Locus warm (2w)", "host Python", "host Rust", "Spark SQL s3a", "DuckDB tmpfs"):
        assert label in md, label
    assert "SQL itself is **not measured**" in md
    assert raw["quick"] and raw["reps"] == 1 and raw["workers"] == [1, 2] and raw["block_size"] == 16 * MiB
    assert "16 MiB blocks" in md
    assert [(d["size"], d["files"]) for d in raw["datasets"]] == [(64 * MiB, 1), (64 * MiB, 10)]


def test_every_path_ran_every_row_and_agrees():
    _, raw = _doc()
    got = sorted((r["dataset"], r["path"], r["workers"], r["op"]) for r in raw["runs"])
    want = sorted((d["name"], p, w, op) for d in raw["datasets"] for op in rep.ROWS
                  for p, w in [("locus-cold", 1), ("locus-warm", 1), ("locus-cold", 2), ("locus-warm", 2),
                               ("host-py", 0), ("host-rust", 0), ("spark", 0), ("duckdb", 0)])
    assert got == want
    assert raw["agree"] is True
    assert len(raw["checks"]) == len(raw["datasets"]) * len(rep.ROWS)
    for c in raw["checks"]:
        assert len(c["paths"]) == 8 and c["mismatches"] == [], c
    for r in raw["runs"]:
        assert set(r["results"]) == set(rep.op_keys(r["op"])), (r["path"], r["op"])
        assert len(r["seconds"]) == 1 and r["seconds"][0] > 0


def test_locus_scans_everything_and_returns_little():
    _, raw = _doc()
    size = {d["name"]: d["bytes"] for d in raw["datasets"]}
    rows = {d["name"]: d["rows"] for d in raw["datasets"]}
    for r in raw["runs"]:
        if r["path"].startswith("locus"):
            assert r["scanned"] == size[r["dataset"]], r
            # The 1-file dataset spans several blocks: the edges were joined (and agreed).
            assert r["blocks"] >= 4 if r["dataset"].endswith("-1") else r["blocks"] == 10, r
            # Partials only: far under 0.1% of the bytes scanned, for every row.
            assert 0 < r["link_bytes"][0] <= rep.GOAL_RETURNED * size[r["dataset"]], r
        elif r["path"] in ("host-py", "host-rust"):
            assert r["link_bytes"][0] == size[r["dataset"]], r
        if r["op"] == "count":
            assert r["results"]["rows"] == rows[r["dataset"]], r
    assert {p["dataset"] for p in raw["plain_read"]} == set(size)


def test_warm_is_faster_than_cold():
    """Over the eight operator rows (one run each is noisy on a loaded machine): a warm run
    is the same scan without the fill from MinIO."""
    _, raw = _doc()
    s = rep.summarize(raw)
    for d in raw["datasets"]:
        for w in raw["workers"]:
            cold = s[(d["name"], "locus-cold", w, "total")]["median"]
            warm = s[(d["name"], "locus-warm", w, "total")]["median"]
            assert warm < cold, f"{d['name']} {w}w: warm {warm:.2f} s, cold {cold:.2f} s"


def test_the_link_was_shaped():
    """Under lan (1 Gbit/s) the plain read of the objects cannot beat the link's rate."""
    _, raw = _doc()
    if raw["profile"] != "lan":
        pytest.skip(f"profile {raw['profile']}: no shaping")
    for p in raw["plain_read"]:
        assert min(p["seconds"]) >= 0.9 * p["bytes"] * 8 / 1e9, p


def test_spark_reads_the_objects_once_per_pass():
    _, raw = _doc()
    size = {d["name"]: d["bytes"] for d in raw["datasets"]}
    for r in raw["runs"]:
        if r["path"] == "spark":
            assert r["link_bytes"][0] == size[r["dataset"]] * {"normalize": 2, "all": 4}.get(r["op"], 1), r
