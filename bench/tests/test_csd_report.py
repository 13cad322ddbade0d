"""The computational-storage study's harness without a cluster: the flat results, the
agreement checks, the SQL against numpy's plain definitions (DuckDB in this process),
the summary, goals and table."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import csd_report as rep  # noqa: E402
import seed_csd as csd  # noqa: E402


def locus_doc(rows=10) -> dict:
    """The shape `locus fs compute all --json` prints (locus-compute's Results)."""
    cols = rep.COLS
    return {
        "files": 1, "blocks": 1, "bytes_scanned": 1000, "rows": rows, "bytes_returned": 500,
        "count": {"lines": rows + 1, "rows": rows},
        "stats": {c: {"count": rows, "sum": 10.0 + i, "mean": 1.0, "min": 0.5, "max": 2.0} for i, c in enumerate(cols)},
        "modsum": {"k": 3.0, "m": 7.0, "sums": {c: 3.5 for c in cols}},
        "stddev": {c: {"population": 0.1, "sample": 0.11} for c in cols},
        "normalize": {c: {"zscore_sum": 1e-12, "minmax_sum": 4.0} for c in cols},
        "gram": {"columns": cols, "matrix": [[float(i * 8 + j) for j in range(8)] for i in range(8)], "determinant": 2.0},
        "digits": {"column": "sensor", "counts": {str(d): d for d in range(10)}},
        "entropy": {"column": "sensor", "bits": 7.9, "distinct": 256},
    }


def test_flatten_has_every_key_of_every_operator():
    f = rep.flatten(locus_doc())
    assert set(f) == set(rep.op_keys("all"))
    assert f["gram.2.5"] == 21.0 and f["c3.sum"] == 13.0 and f["digit.7"] == 7 and f["rows"] == 10


def test_compare_catches_a_sum_off_by_more_than_1e_9_and_a_missing_key():
    ref = rep.flatten(locus_doc())
    ok = dict(ref, **{"c0.sum": ref["c0.sum"] * (1 + 5e-10)})
    off = dict(ref, **{"c0.sum": ref["c0.sum"] * (1 + 5e-9)})
    assert rep.compare("stats", {"host-py": ref, "locus-warm 1w": ok}, 10) == []
    bad = rep.compare("stats", {"host-py": ref, "locus-warm 1w": off}, 10)
    assert [(b["key"], b["path"], b["reference"]) for b in bad] == [("c0.sum", "locus-warm 1w", "host-py")]
    gone = dict(ref)
    del gone["digit.3"]
    assert [b["key"] for b in rep.compare("digits", {"duckdb": ref, "spark": gone}, 10)] == ["digit.3"]
    # Counts are exact; the z-score sums (about 0) absolute.
    assert rep.compare("count", {"host-py": {"rows": 10}, "spark": {"rows": 11}}, 10)
    assert not rep.compare("normalize", {"host-py": ref, "spark": dict(ref, **{"c1.zscore_sum": 5e-6})}, 10)


def _sample_csv(rows=3000) -> bytes:
    return (csd.HEADER + "\n").encode() + csd.gen_chunk(7, rows)


def test_sql_and_numpy_agree_on_every_operator(tmp_path):
    duckdb = pytest.importorskip("duckdb")
    pd = pytest.importorskip("pandas")
    data = _sample_csv()
    (tmp_path / "part-0000.csv").write_bytes(data)
    df = pd.read_csv(io.BytesIO(data), dtype={"sensor": "category"})
    con = duckdb.connect()
    con.execute(f"CREATE VIEW t AS SELECT * FROM read_csv('{tmp_path}/*.csv', header = true)")
    for op in rep.ROWS:
        want = csd.numpy_ops(df, op, 3.0, 7.0)
        got = {}
        for q in csd.sql_parts(op, 3.0, 7.0):
            cur = con.execute(q)
            got.update(csd.sql_flat(dict(zip([d[0] for d in cur.description], cur.fetchone()))))
        assert set(want) == set(rep.op_keys(op)), op
        assert rep.compare(op, {"host-py": want, "duckdb": got}, len(df)) == [], op
    assert want["rows"] == 3000 and want["entropy.distinct"] <= 256
    # The data has negative products rarely; modsum follows Python's modulo on them too.
    assert csd.sql_parts("modsum", 3.0, 7.0)[0].count("CASE") == 8


def test_generated_files_are_whole_records_with_a_header(tmp_path):
    pool = csd.Chunks(2, rows=500)
    n, rows = pool.write(tmp_path / "a.csv", 50_000, start=1)
    data = (tmp_path / "a.csv").read_bytes()
    assert len(data) == n <= 50_000 and data.endswith(b"\n")
    lines = data.splitlines()
    assert lines[0].decode() == csd.HEADER and len(lines) - 1 == rows > 400
    assert all(len(ln.split(b",")) == 10 for ln in lines[1:])


def test_op_args_give_columns_and_the_text_column_where_needed():
    assert csd.op_args("count", 3, 7) == []
    assert csd.op_args("digits", 3, 7) == ["--text-column", "sensor"]
    assert csd.op_args("all", 3.0, 7.0) == ["--columns", "c0..c7", "--k", "3.0", "--m", "7.0", "--text-column", "sensor"]


def _raw(warm_all=0.5, spark_all=20.0, duck_all=0.4, cold_all=1.0, plain=1.0, returned=500, size=rep.GiB):
    runs = []
    for op in rep.ROWS:
        big = op == "all"
        runs += [
            {"dataset": "d", "path": "locus-warm", "workers": 1, "op": op, "seconds": [warm_all if big else 0.1] * 3,
             "link_bytes": [returned] * 3, "scanned": 1_000_000},
            {"dataset": "d", "path": "locus-cold", "workers": 1, "op": op, "seconds": [cold_all if big else 0.9] * 3,
             "link_bytes": [returned] * 3, "scanned": 1_000_000},
            {"dataset": "d", "path": "duckdb", "workers": 0, "op": op, "seconds": [duck_all if big else 0.1] * 3},
            {"dataset": "d", "path": "spark", "workers": 0, "op": op, "seconds": [spark_all if big else 3.0] * 3},
        ]
    return {"profile": "lan", "reps": 3, "workers": [1], "k": 3.0, "m": 7.0, "quick": False,
            "datasets": [{"name": "d", "size": size, "files": 1, "bytes": 1_000_000, "rows": 100}],
            "runs": runs, "plain_read": [{"dataset": "d", "seconds": [plain] * 3, "bytes": 1_000_000}], "checks": []}


def _goal(raw, goal, op="all"):
    return [g for g in rep.goals(raw) if g["goal"] == goal and g["op"].split(" ")[0] == op]


def test_goals_pass_and_miss_at_their_bounds():
    raw = _raw()
    [g] = _goal(raw, "warm-all-1g")
    assert g["ok"] and g["value"] == 0.5
    assert not _goal(_raw(warm_all=5.01), "warm-all-1g")[0]["ok"]
    assert _goal(raw, "vs-duckdb")[0]["value"] == pytest.approx(1.25) and _goal(raw, "vs-duckdb")[0]["ok"]
    assert not _goal(_raw(duck_all=0.3), "vs-duckdb")[0]["ok"]
    assert _goal(raw, "vs-spark")[0]["value"] == 40 and _goal(raw, "vs-spark")[0]["ok"]
    assert not _goal(_raw(spark_all=9.9), "vs-spark")[0]["ok"]
    assert _goal(raw, "cold-vs-read")[0]["ok"] and not _goal(_raw(cold_all=1.11), "cold-vs-read")[0]["ok"]
    assert all(g["ok"] for g in _goal(raw, "returned"))
    assert not any(g["ok"] for g in _goal(_raw(returned=1001), "returned"))
    # Without a 1 GiB dataset the 5 s goal is not judged.
    [g] = _goal(_raw(size=128 << 20), "warm-all-1g")
    assert g["ok"] is None and "no 1 GiB" in g["note"]


def test_summary_total_is_the_sum_of_the_eight_operators():
    s = rep.summarize(_raw())
    assert s[("d", "locus-warm", 1, "total")]["median"] == pytest.approx(0.8)
    assert s[("d", "spark", 0, "total")]["median"] == pytest.approx(24.0)


def test_markdown_and_chart(tmp_path):
    raw = _raw()
    raw["checks"] = [{"dataset": "d", "op": "all", "paths": [], "mismatches": []}]
    md = rep.markdown(raw)
    assert "| all operators |" in md and "| total (sum of the 8) |" in md
    assert "SQL itself is **not measured**" in md and "All agree." in md
    assert "Locus warm (1w)" in md and "DuckDB tmpfs" in md
    out = rep.write_all(raw, tmp_path, "x")
    assert out["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(out["json"].read_text())["profile"] == "lan"


def test_a_disagreeing_path_is_recorded_and_named():
    ref = rep.flatten(locus_doc())
    runs = [{"dataset": "d", "path": "host-py", "workers": 0, "op": "stats", "results": ref},
            {"dataset": "d", "path": "locus-warm", "workers": 2, "op": "stats",
             "results": dict(ref, **{"c5.mean": ref["c5.mean"] * 1.001})},
            {"dataset": "d", "path": "spark", "workers": 0, "op": "stats", "results": ref}]
    raw = {"runs": runs, "checks": []}
    bad = csd.check_all(raw, {"name": "d", "rows": 10})
    assert [(b["path"], b["key"], b["dataset"]) for b in bad] == [("locus-warm 2w", "c5.mean", "d")]
    [c] = [c for c in raw["checks"] if c["op"] == "stats"]
    assert c["paths"] == ["host-py", "locus-warm 2w", "spark"] and len(c["mismatches"]) == 1
