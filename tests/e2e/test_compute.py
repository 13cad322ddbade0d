"""Near-data compute with the real binary (issue 24): `locus fs compute` over CSV files
in MinIO and in Locus, checked against a plain numpy computation of the same
definitions on the same text; bad input gets a one-line error and an exit code."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from conftest import assert_one_line_error, put_object

COLS = [f"c{i}" for i in range(8)]


def sensor_csv(rows: int, seed: int) -> bytes:
    """The study's sensor log: timestamp, sensor id, 8 numeric channels."""
    rnd = random.Random(seed)
    lines = ["ts,sensor," + ",".join(COLS)]
    for i in range(rows):
        vals = ",".join(f"{rnd.gauss(50, 10):.4f}" for _ in COLS)
        lines.append(f"{1_700_000_000 + i},s{rnd.randint(0, 9)},{vals}")
    return ("\n".join(lines) + "\n").encode()


def table(data: bytes) -> np.ndarray:
    return np.array([[float(x) for x in ln.split(b",")[2:]] for ln in data.splitlines()[1:]])


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), abs(b), 1e-300)


def compute(c, *args) -> dict:
    return json.loads(c.ok("fs", "compute", *args, "--json", timeout=300))


@pytest.mark.parametrize("files", [1, 10])
def test_every_operator_matches_numpy_cold_and_warm(cluster_factory, minio, s3, bucket, files):
    c = cluster_factory(args=["--block-size", "1MiB"], workers=2)
    datas = [sensor_csv(6000 if files > 1 else 40_000, seed) for seed in range(files)]
    for i, d in enumerate(datas):
        put_object(s3, bucket, f"logs/part-{i:03}.csv", d)
    c.mount_s3("/s3", bucket, "", minio)
    a = np.vstack([table(d) for d in datas])
    raw = b"".join(datas)
    for run in ("cold", "warm"):
        out = compute(c, "all", "/s3/logs/*.csv", "--columns", "c0..c7", "--k", "3", "--m", "7")
        assert out["files"] == files and out["rows"] == len(a), run
        assert out["bytes_scanned"] == len(raw), run
        # Only partials come back: about 2 KiB a block for every operator on 8 columns
        # (0.003% of a 64 MiB block; these blocks are 1 MiB).
        assert out["bytes_returned"] <= 4096 * out["blocks"], out["bytes_returned"]
        assert out["count"] == {"lines": raw.count(b"\n"), "rows": len(a)}
        for j, name in enumerate(COLS):
            x = a[:, j]
            st = out["stats"][name]
            assert st["count"] == len(x)
            assert rel(st["sum"], x.sum()) <= 1e-9 and rel(st["mean"], x.mean()) <= 1e-9
            assert st["min"] == x.min() and st["max"] == x.max()
            assert rel(out["modsum"]["sums"][name], np.mod(x * 3, 7).sum()) <= 1e-9
            sd = out["stddev"][name]
            assert rel(sd["population"], x.std()) <= 1e-9 and rel(sd["sample"], x.std(ddof=1)) <= 1e-9
            mm = ((x - x.min()) / (x.max() - x.min())).sum()
            assert rel(out["normalize"][name]["minmax_sum"], mm) <= 1e-9
            assert abs(out["normalize"][name]["zscore_sum"]) < 1e-6 * len(x)
        g = a.T @ a
        got = np.array(out["gram"]["matrix"])
        assert np.all(np.abs(got - g) <= 1e-9 * np.abs(g))
        assert rel(out["gram"]["determinant"], np.linalg.det(g)) <= 1e-6
        counts = np.bincount(np.frombuffer(raw, dtype=np.uint8), minlength=256)
        assert out["digits"]["bytes"] == {str(d): int(counts[48 + d]) for d in range(10)}
        p = counts[counts > 0] / len(raw)
        assert rel(out["entropy"]["bits"], float(-(p * np.log2(p)).sum())) <= 1e-9
    # Warm: every block was cached by the cold run, on both workers.
    st = c.stat("/s3/logs/part-000.csv")
    assert all(b["locations"] for b in st["blocks"]), st


def test_a_column_s_text_digits_and_entropy(cluster):
    data = sensor_csv(3000, 42)
    cluster.ok("fs", "put", "-", "/s.csv", input=data)
    out = compute(cluster, "digits,entropy", "/s.csv", "--text-column", "sensor")
    col = [ln.split(b",")[1] for ln in data.splitlines()[1:]]
    assert out["digits"]["column"] == "sensor"
    want = {str(d): sum(v.count(str(d).encode()) for v in col) for d in range(10)}
    assert out["digits"]["counts"] == want
    _, n = np.unique(np.array(col), return_counts=True)
    p = n / n.sum()
    assert rel(out["entropy"]["bits"], float(-(p * np.log2(p)).sum())) <= 1e-12
    assert out["entropy"]["distinct"] == len(n)


def test_bad_input_gets_one_line_and_an_exit_code(cluster):
    cluster.ok("fs", "put", "-", "/bad.csv", input=b"a,b\n1,2\n3,oops\n")
    r = cluster.run("fs", "compute", "stats", "/bad.csv", "--columns", "b")
    line = assert_one_line_error(r, 2)
    assert 'is not a number: "oops"' in line, line
    line = assert_one_line_error(cluster.run("fs", "compute", "stats", "/bad.csv", "--columns", "nope"), 2)
    assert "no column 'nope'" in line, line
    line = assert_one_line_error(cluster.run("fs", "compute", "median", "/bad.csv"), 2)
    assert "unknown operator 'median'" in line, line
    assert_one_line_error(cluster.run("fs", "compute", "count", "/missing.csv"), 3)
    line = assert_one_line_error(cluster.run("fs", "compute", "count", "/bad.csv", "--delimiter", "ab"), 2)
    assert "--delimiter" in line, line
    # The worker is still there.
    assert compute(cluster, "count", "/bad.csv")["rows"] == 2


@pytest.mark.parametrize("method", ["zscore", "minmax"])
def test_normalize_out_writes_the_normalized_file(cluster_factory, method):
    """`normalize --out`: the file again, through the write pipeline, with the chosen
    columns normalized as numpy normalizes them; other fields (quoted ones too) kept."""
    c = cluster_factory(args=["--block-size", "1MiB"], workers=2)
    data = sensor_csv(30_000, 5).replace(b",s7,", b',"s,7",')  # a quoted field with a comma
    c.ok("fs", "put", "-", "/n/in.csv", input=data)
    r = c.run("fs", "compute", "normalize", "/n/in.csv", "--columns", "c0,c3", "--out", "/n/out.csv",
              "--method", method, "--json", timeout=300, check=True)
    assert "wrote /n/out.csv: 30000 record(s)" in r.stderr.decode()
    got = c.ok("fs", "cat", "/n/out.csv").decode().splitlines()
    src = data.decode().splitlines()
    assert got[0] == src[0] and len(got) == len(src)
    import csv as pycsv
    rows_in = list(pycsv.reader(src[1:]))
    rows_out = list(pycsv.reader(got[1:]))
    for j in (2, 5):  # c0, c3
        x = np.array([float(r[j]) for r in rows_in])
        want = (x - x.mean()) / x.std() if method == "zscore" else (x - x.min()) / (x.max() - x.min())
        y = np.array([float(r[j]) for r in rows_out])
        assert np.max(np.abs(y - want)) <= 1e-9, j
    for a, b in zip(rows_in, rows_out):
        assert [a[i] for i in (0, 1, 3, 4, 6, 7, 8, 9)] == [b[i] for i in (0, 1, 3, 4, 6, 7, 8, 9)]
    assert any(r[1] == "s,7" for r in rows_out)


def test_normalize_out_of_bad_data_leaves_no_file(cluster):
    cluster.ok("fs", "put", "-", "/nb.csv", input=b"a,b\n1,2\n3,4\n")
    cluster.ok("fs", "put", "-", "/nbad.csv", input=b"a,b\n1,2\n3,x\n")
    line = assert_one_line_error(
        cluster.run("fs", "compute", "normalize", "/nbad.csv", "--columns", "b", "--out", "/nbad.out"), 2)
    assert "not a number" in line, line
    assert_one_line_error(cluster.run("fs", "stat", "/nbad.out"), 3)
    line = assert_one_line_error(
        cluster.run("fs", "compute", "stats", "/nb.csv", "--columns", "b", "--out", "/x.out"), 2)
    assert "normalize" in line, line
    line = assert_one_line_error(
        cluster.run("fs", "compute", "normalize", "/nb.csv", "--columns", "b", "--out", "/x.out",
                    "--method", "median"), 2)
    assert "--method" in line, line
