"""`locus sql` with the real binary (issue 24): SQL over Locus files by URL (CSV with a
header, JSON lines, Parquet; globs), results as a table, CSV or JSON, checked against a
plain Python computation; bad SQL gets a one-line error and exit 2."""

from __future__ import annotations

import csv
import io
import json
import random
import statistics

import pytest

from conftest import assert_one_line_error


def sensor_csv(rows: int, seed: int) -> bytes:
    rnd = random.Random(seed)
    out = ["ts,sensor,c0,c1"]
    for i in range(rows):
        out.append(f"{1_700_000_000 + i},s{rnd.randint(0, 4)},{rnd.gauss(50, 10):.4f},{rnd.randint(0, 99)}")
    return ("\n".join(out) + "\n").encode()


@pytest.fixture
def logs(cluster_factory, tmp_path):
    c = cluster_factory(args=["--block-size", "1MiB"])
    d = tmp_path
    datas = [sensor_csv(20_000, s) for s in range(3)]
    for i, data in enumerate(datas):
        p = d / f"part-{i}.csv"
        p.write_bytes(data)
        c.ok("fs", "put", str(p), f"/sql/logs/part-{i}.csv")
    rows = [r for data in datas for r in csv.DictReader(io.StringIO(data.decode()))]
    return c, rows


def sql(c, query: str, fmt: str = "json") -> bytes:
    return c.ok("sql", query, "--format", fmt, timeout=300)


def test_group_by_over_a_glob_matches_python(logs):
    c, rows = logs
    out = sql(c, "SELECT sensor, count(*) AS n, avg(c0) AS mean, stddev_pop(c0) AS sd "
                 "FROM 'locus:///sql/logs/*.csv' GROUP BY sensor ORDER BY sensor")
    got = [json.loads(x) for x in out.splitlines()]
    by = {}
    for r in rows:
        by.setdefault(r["sensor"], []).append(float(r["c0"]))
    assert [g["sensor"] for g in got] == sorted(by)
    for g in got:
        xs = by[g["sensor"]]
        assert g["n"] == len(xs)
        assert g["mean"] == pytest.approx(statistics.fmean(xs), rel=1e-9)
        assert g["sd"] == pytest.approx(statistics.pstdev(xs), rel=1e-9)


def test_where_limit_and_csv_output(logs):
    c, rows = logs
    out = sql(c, "SELECT ts, c1 FROM 'locus:///sql/logs/part-0.csv' WHERE c1 >= 98 ORDER BY ts LIMIT 5", "csv")
    got = list(csv.reader(io.StringIO(out.decode())))
    want = [[r["ts"], r["c1"]] for r in rows[:20_000] if int(r["c1"]) >= 98][:5]
    assert got[0] == ["ts", "c1"] and got[1:] == want
    table = sql(c, "SELECT count(*) AS n FROM 'locus:///sql/logs/*.csv'", "table").decode()
    assert "| n " in table and f"| {len(rows)} " in table


def test_json_lines_and_parquet(logs, tmp_path):
    c, _ = logs
    lines = [{"k": i % 3, "v": i} for i in range(100)]
    p = tmp_path / "t.json"
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    c.ok("fs", "put", str(p), "/sql/t.json")
    out = sql(c, "SELECT k, sum(v) AS s FROM 'locus:///sql/t.json' GROUP BY k ORDER BY k")
    assert [json.loads(x) for x in out.splitlines()] == [
        {"k": k, "s": sum(x["v"] for x in lines if x["k"] == k)} for k in range(3)]
    import pyarrow as pa  # installed by scripts/test (scripts/install-spark): never skipped
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"a": list(range(1000)), "b": [str(i) for i in range(1000)]}), tmp_path / "t.parquet")
    c.ok("fs", "put", str(tmp_path / "t.parquet"), "/sql/t.parquet")
    out = sql(c, "SELECT max(a) AS m, count(DISTINCT b) AS d FROM 'locus:///sql/t.parquet'")
    assert json.loads(out) == {"m": 999, "d": 1000}


def test_bad_sql_is_one_line_exit_2(logs):
    c, _ = logs
    assert_one_line_error(c.run("sql", "SELEKT 1"), 2)
    assert_one_line_error(c.run("sql", "SELECT nope FROM 'locus:///sql/logs/part-0.csv'"), 2)
    assert_one_line_error(c.run("sql", "SELECT 1", "--format", "xml"), 2)
    r = c.run("sql", "SELECT * FROM 'locus:///sql/missing.csv'")
    assert r.returncode != 0 and len(r.stderr.decode().strip().splitlines()) == 1


def test_scans_run_on_the_workers_and_return_partials(logs):
    """The scans and partial aggregates run on the worker (`locus report` counts them
    there); what comes back to the caller is a sliver of what was scanned."""
    c, rows = logs
    size = sum(c.stat(f"/sql/logs/part-{i}.csv")["length"] for i in range(3))
    before = c.report()["compute"]
    r = c.run("sql", "SELECT sensor, sum(c0) AS s, max(c1) AS hi FROM 'locus:///sql/logs/*.csv' "
                     "WHERE c1 > 10 GROUP BY sensor ORDER BY sensor", "--format", "csv", "--stats",
              timeout=300, check=True)
    got = list(csv.DictReader(io.StringIO(r.stdout.decode())))
    want = {}
    for x in rows:
        if int(x["c1"]) > 10:
            s, hi = want.get(x["sensor"], (0.0, -1))
            want[x["sensor"]] = (s + float(x["c0"]), max(hi, int(x["c1"])))
    assert [g["sensor"] for g in got] == sorted(want)
    for g in got:
        assert float(g["s"]) == pytest.approx(want[g["sensor"]][0], rel=1e-9)
        assert int(g["hi"]) == want[g["sensor"]][1]
    stats = json.loads(r.stderr.decode().strip().splitlines()[-1])
    assert stats["bytes_scanned"] >= size, stats
    assert 0 < stats["bytes_returned"] < stats["bytes_scanned"] // 100, stats
    # The workers' own counters (reported with their heartbeats) have the scan.
    import time
    deadline = time.monotonic() + 10
    while True:
        after = c.report()["compute"]
        if after["bytes_scanned"] - before["bytes_scanned"] >= size or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert after["bytes_scanned"] - before["bytes_scanned"] >= size, (before, after)
    assert after["bytes_returned"] > before["bytes_returned"]
