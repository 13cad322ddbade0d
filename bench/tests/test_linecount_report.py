"""Unit tests for the line-count study's parsing and reporting (bench/linecount_report.py),
and for the text generator of bench/seed_linecount.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import linecount_report as rep  # noqa: E402

MiB = 1 << 20


def raw_doc(locus_next=0.05, locus_first=2.2, direct_first=2.25, alluxio_next=0.5, floor=0.05):
    size = 256 * MiB
    runs = []
    table = {
        "direct-s3a": [7.0, 3.3, 3.2, 3.4],
        "direct-boto3": [direct_first, 2.25, 2.3, 2.2],
        "locus-s3a": [7.2, 0.9, 1.0, 1.1],
        "locus-fs": [6.9, 0.85, 0.8, 0.9],
        "locus-native": [locus_first, locus_next, locus_next, locus_next],
        "alluxio-fs": [8.0, 1.2, 1.0, 1.4],
        "alluxio-s3a": [9.0, 2.0, 2.1, 1.9],
        "alluxio-java": [3.0, alluxio_next, alluxio_next, alluxio_next],
        "spark-tmpfs": [6.5, 0.8, 0.85, 0.75],
    }
    for mode in rep.MODES:
        for p, secs in table.items():
            runs.append({"size": size, "path": p, "mode": mode, "seconds": secs, "lines": 100})
    return {"profile": "lan", "reps": 3, "sizes": [size], "quick": True, "workers": 1,
            "machine": {"cores": 2, "memory_gib": 24, "kernel": "6.x", "profile_desc": "tbf"},
            "runs": runs, "floor": [{"size": size, "seconds": [floor, floor * 1.2, floor * 0.9, floor], "lines": 100}]}


def test_parse_json_line_skips_logs():
    out = "WARN something\n{not json}\n{\"lines\": 3, \"seconds\": [1.5]}\n\n"
    assert rep.parse_json_line(out) == {"lines": 3, "seconds": [1.5]}
    with pytest.raises(ValueError):
        rep.parse_json_line("no result here\n")


def test_human_size():
    assert rep.human_size(256 * MiB) == "256 MiB"
    assert rep.human_size(5 << 30) == "5 GiB"
    assert rep.human_size(1000) == "1000 B"


def test_summarize_first_and_next():
    s = rep.summarize(raw_doc())
    d = s[(256 * MiB, "direct-s3a", "new-app")]
    assert d["first"] == 7.0
    assert d["next_mean"] == pytest.approx((3.3 + 3.2 + 3.4) / 3)
    assert d["next_median"] == 3.3
    assert s[(256 * MiB, "floor", "")]["median"] == pytest.approx(0.05)
    with pytest.raises(ValueError):
        rep.summarize({"runs": [{"size": 1, "path": "x", "mode": "new-app", "seconds": [], "lines": 0}]})


def test_ratios_pair_locus_with_direct_and_alluxio():
    raw = raw_doc()
    rows = rep.ratios(rep.summarize(raw), raw)
    native = next(r for r in rows if r["path"] == "locus-native" and r["mode"] == "same-app")
    assert native["direct"] == "direct-boto3"
    assert native["repeat_speedup"] == pytest.approx(2.25 / 0.05)
    assert native["first_vs_direct"] == pytest.approx(2.2 / 2.25)
    assert native["next_vs_floor"] == pytest.approx(1.0)
    assert native["alluxio"]["alluxio-java"]["next"] == pytest.approx(0.05 / 0.5)
    s3a = next(r for r in rows if r["path"] == "locus-s3a" and r["mode"] == "new-app")
    assert set(s3a["alluxio"]) == {"alluxio-s3a"}
    conn = next(r for r in rows if r["path"] == "locus-fs" and r["mode"] == "new-app")
    assert conn["direct"] == "direct-s3a"
    assert set(conn["alluxio"]) == {"alluxio-fs"}
    assert conn["alluxio"]["alluxio-fs"]["next"] == pytest.approx(0.85 / 1.2)


def test_spark_floor_bounds_the_spark_paths():
    raw = raw_doc()
    rows = rep.ratios(rep.summarize(raw), raw)
    s3a = next(r for r in rows if r["path"] == "locus-s3a" and r["mode"] == "new-app")
    assert s3a["spark_floor"]["next"] == pytest.approx(0.8)
    assert s3a["spark_floor"]["direct_speedup"] == pytest.approx(3.3 / 0.8)
    assert s3a["spark_floor"]["locus_vs_floor"] == pytest.approx(1.0 / 0.8)
    # Only Spark paths are compared with Spark's floor; it sets no goal of its own.
    assert not any("spark_floor" in r for r in rows if r["path"] == "locus-native")
    assert not any("Spark's own floor" in g["goal"] for g in rep.goals(rep.summarize(raw), raw))
    md = rep.markdown(raw)
    assert "| 256 MiB | new-app | Spark s3a -> Locus S3 gateway | 0.80 | 4.13x | 1.25 |" in md
    assert "| 256 MiB | new-app | Spark locus:// (Locus connector) | 0.80 | 4.13x | 1.06 |" in md
    raw["runs"] = [r for r in raw["runs"] if r["path"] != "spark-tmpfs"]
    assert "Spark floor next mean" not in rep.markdown(raw)
    # Quick mode leaves the floor out; a full run measures every path.
    assert rep.default_paths(quick=True) == [p for p in rep.PATHS if p != rep.SPARK_FLOOR]
    assert rep.default_paths(quick=False) == list(rep.PATHS)


def test_goals_pass_and_miss():
    raw = raw_doc()
    gs = rep.goals(rep.summarize(raw), raw)
    by = {(g["goal"], g["mode"]): g for g in gs}
    assert by[("repeat accesses, Locus native / wc -l on tmpfs", "new-app")]["ok"] is True
    # Spark s3a: 3.3 / 1.0 is short of 8x.
    assert by[(f"repeat accesses, direct / Locus ({rep.PATHS['locus-s3a'][0]})", "new-app")]["ok"] is False
    # A slow first access misses; a native client slower than Alluxio's misses.
    raw = raw_doc(locus_first=2.5, locus_next=0.6, alluxio_next=0.5)
    gs = rep.goals(rep.summarize(raw), raw)
    by = {(g["goal"], g["mode"]): g for g in gs}
    assert by[(f"first access, Locus / direct ({rep.PATHS['locus-native'][0]})", "same-app")]["ok"] is False
    assert by[("repeat accesses, Locus / Alluxio, native client", "same-app")]["ok"] is False
    assert by[("repeat accesses, Locus native / wc -l on tmpfs", "same-app")]["ok"] is False


def test_goals_equal_to_alluxio_is_a_miss():
    raw = raw_doc(locus_next=0.5, alluxio_next=0.5)
    gs = rep.goals(rep.summarize(raw), raw)
    g = next(g for g in gs if g["goal"] == "repeat accesses, Locus / Alluxio, native client")
    assert g["value"] == pytest.approx(1.0) and g["ok"] is False


def test_markdown_has_every_path_the_floor_and_the_goals():
    md = rep.markdown(raw_doc())
    for label, _, _ in rep.PATHS.values():
        assert label in md
    assert "`wc -l` of a tmpfs copy (floor)" in md
    assert "profile `lan`" in md and "2 cores" in md
    assert "class-data archive" not in md
    assert "driver JVMs share a class-data archive (CDS)" in rep.markdown(dict(raw_doc(), spark_cds=True))
    assert "| Locus native client (locus fs wc) | same-app | 0.98 | 45.00x | 1.00 |" in md
    assert "goal figures met" in md


def test_missing_path_gives_na_not_a_crash():
    raw = raw_doc()
    raw["runs"] = [r for r in raw["runs"] if r["path"] != "direct-boto3"]
    md = rep.markdown(raw)
    gs = rep.goals(rep.summarize(raw), raw)
    assert any(g["ok"] is None for g in gs)
    assert "n/a" in md


def test_write_all_makes_table_chart_and_json(tmp_path):
    out = rep.write_all(raw_doc(), tmp_path, "study")
    assert out["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out["png"].stat().st_size > 10_000
    assert "![time per access](study.png)" in out["md"].read_text()
    import json

    assert json.loads(out["json"].read_text())["reps"] == 3


def test_generator_counts_its_lines(tmp_path):
    import seed_linecount

    p = tmp_path / "t.txt"
    n = seed_linecount.generate(p, 5 * MiB + 123)
    data = p.read_bytes()
    assert len(data) <= 5 * MiB + 123 and len(data) > 5 * MiB - 1000
    assert data.endswith(b"\n")
    assert data.count(b"\n") == n


def test_parse_size():
    import seed_linecount

    assert seed_linecount.parse_size("256MiB") == 256 * MiB
    assert seed_linecount.parse_size("1GiB") == 1 << 30
    assert seed_linecount.parse_size("1.5G") == 3 << 29


def test_merge_joins_sizes_and_refuses_mismatches(tmp_path):
    small, big = raw_doc(), raw_doc()
    for r in big["runs"] + big["floor"]:
        r["size"] = 1024 * MiB
    big["sizes"] = [1024 * MiB]
    small["wall_seconds"], big["wall_seconds"] = 100.0, 400.0
    big["code"] = "abc1234"
    m = rep.merge([big, small])
    assert m["sizes"] == [256 * MiB, 1024 * MiB]
    assert len(m["runs"]) == len(small["runs"]) * 2 and len(m["floor"]) == 2
    assert m["wall_seconds"] == 500.0
    md = rep.markdown(m)
    assert "#### 256 MiB" in md and "#### 1 GiB" in md and "one harness run of 400 s (code: abc1234)." in md
    assert "one harness run of 100 s." in md, "no code named when the run did not record one"
    with pytest.raises(ValueError, match="more than one run"):
        rep.merge([small, small])
    other = dict(big, reps=10)
    with pytest.raises(ValueError, match="different reps"):
        rep.merge([small, other])


# A stand-in for one Spark application of seed_linecount.py's `spark --wait-go` protocol:
# it says it is ready, waits for its turn, then reports when its turn came and when the
# previous application (by the marker file) had finished.
FAKE_APP = r"""
import json, os, sys, time
n, marker = int(sys.argv[1]), sys.argv[2]
print("some log line", flush=True)
print(json.dumps({"ready": True, "startup": 0.5}), flush=True)
sys.stdin.readline()
went = time.time()
prev_done = os.path.getmtime(marker) if os.path.exists(marker) else 0.0
print(json.dumps({"lines": 7, "seconds": [0.1 * (i + 1) for i in range(n)], "startup": 0.5,
                  "went": went, "prev_done": prev_done}), flush=True)
time.sleep(0.2)
open(marker, "w").close()
"""


def _stage(tmp_path, monkeypatch):
    import argparse

    import seed_linecount

    st = seed_linecount.Stage(argparse.Namespace(work_dir=str(tmp_path)))
    marker = tmp_path / "done"
    monkeypatch.setattr(st, "spark_cmd", lambda path, key, n: [sys.executable, "-c", FAKE_APP, str(n), str(marker)])
    monkeypatch.setattr(st, "empty_caches", lambda key: None)
    return st


def test_spark_batch_starts_together_and_runs_one_after_the_other(tmp_path, monkeypatch):
    st = _stage(tmp_path, monkeypatch)
    outs = st.spark_batch("direct-s3a", "k", [4, 1, 1, 1])
    assert [len(o["seconds"]) for o in outs] == [4, 1, 1, 1]
    for prev, cur in zip(outs, outs[1:]):
        # Each went after the previous one had finished (and exited).
        assert cur["prev_done"] > 0 and cur["went"] >= cur["prev_done"] >= prev["went"]
    st.close()


def test_run_pair_opens_the_new_app_series_with_the_same_app_first_access(tmp_path, monkeypatch):
    st = _stage(tmp_path, monkeypatch)
    same, new = st.run_pair("locus-s3a", "k", 3, 7)
    assert (same["mode"], new["mode"]) == ("same-app", "new-app")
    assert same["seconds"] == pytest.approx([0.1, 0.2, 0.3, 0.4])
    assert new["seconds"] == pytest.approx([0.1, 0.1, 0.1, 0.1]) and new["first_shared"]
    assert len(new["app_startup"]) == 4 and st.dirty == {"locus"}
    with pytest.raises(SystemExit, match="counted 7 lines, the file has 8"):
        st.run_pair("locus-s3a", "k", 1, 8)
    st.close()


def test_spark_batch_reports_an_application_that_fails_to_start(tmp_path, monkeypatch):
    st = _stage(tmp_path, monkeypatch)
    monkeypatch.setattr(st, "spark_cmd", lambda path, key, n: [sys.executable, "-c", "import sys; sys.exit('no JVM')"])
    with pytest.raises(SystemExit, match="failed to start:(.|\n)*no JVM"):
        st.spark_batch("direct-s3a", "k", [2, 1])
    st.close()
