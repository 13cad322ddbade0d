"""Seed study: offloading calculations to computational storage devices. The study's
operators (count, stats, modsum, stddev, normalize, gram, digits, entropy) on a sensor log,
run near the data by Locus (`locus fs compute`) and side by side by the plain ways: pulled
to the host (Python with pandas/numpy; Rust with OpenDAL and the same operator code),
Spark SQL over s3a, and DuckDB on a tmpfs copy (the floor).

Run it with `bench/run seed-csd [--quick] [--full] [--profile lan|cloud|none]`, which
installs what it needs first. This script sets up the stage, runs every path, checks that
their results agree, writes the results and tears everything down (also when it fails):

  * MinIO in a network namespace behind a shaped link (bench/netstage.py; profile lan by
    default: 1 Gbit/s, 1 ms each way);
  * per dataset (a size in 1, 10 or 100 files), a CSV `ts,sensor,c0..c7` generated on
    tmpfs (DuckDB's copy) and uploaded to MinIO under csd/<dataset>/;
  * Locus (`locus local start --workers N`, N = 1 then 2) with the bucket mounted at
    /locuslake; each operator cold (`locus fs free` first) and warm, `--reps` times.

Internal subcommands (one long-lived process each, timing inside; JSON on stdout):
  seed_csd.py host-py --endpoint E --bucket B --datasets a,b --reps N --k K --m M
  seed_csd.py spark   --endpoint E --bucket B --datasets a,b --reps N --k K --m M
  seed_csd.py duckdb  --dir D --dataset a --reps N --k K --m M
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

import csd_report as report  # noqa: E402
import netstage  # noqa: E402
from linecount_report import parse_json_line  # noqa: E402
from seed_linecount import code_version, machine_facts, parse_size  # noqa: E402

GiB, MiB = 1 << 30, 1 << 20
BUCKET, PREFIX = "lake", "csd"
LOCUS_MOUNT = "/locuslake"
OPS, ROWS, COLS = report.OPS, report.ROWS, report.COLS
HEADER = "ts,sensor," + ",".join(COLS)


def log(msg: str):
    print(f"[seed-csd {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- data


def gen_chunk(seed: int, rows: int) -> bytes:
    """`rows` records of the sensor log (no header): a timestamp, a sensor id (s000-s255),
    8 channels ~ N(50, 10) with 4 decimals."""
    import numpy as np

    rng = np.random.default_rng(seed)
    ts = 1_700_000_000 + seed * 10_000_000 + np.arange(rows)
    sensor = rng.integers(0, 256, rows)
    vals = rng.normal(50.0, 10.0, (rows, 8))
    fmt = "%d,s%03d," + ",".join(["%.4f"] * 8)
    lines = [fmt % (t, s, *v) for t, s, v in zip(ts.tolist(), sensor.tolist(), vals.tolist())]
    return ("\n".join(lines) + "\n").encode()


class Chunks:
    """A pool of distinct chunks (generated once), cycled to make files of any size."""

    def __init__(self, n: int, rows: int = 100_000):
        t = time.monotonic()
        self.chunks = [gen_chunk(i, rows) for i in range(n)]
        log(f"generated {n} chunks of {len(self.chunks[0]) / MiB:.1f} MiB in {time.monotonic() - t:.1f} s")

    def write(self, path: Path, size: int, start: int) -> tuple[int, int]:
        """A file of about `size` bytes (header included; whole records), its chunks taken
        from `start` on. Returns (bytes, rows)."""
        head = (HEADER + "\n").encode()
        n, rows, i = len(head), 0, start
        with open(path, "wb") as f:
            f.write(head)
            while n < size:
                c = self.chunks[i % len(self.chunks)]
                i += 1
                if n + len(c) > size:
                    c = c[: c.rfind(b"\n", 0, size - n) + 1]
                    if not c:
                        break
                f.write(c)
                n += len(c)
                rows += c.count(b"\n")
        return n, rows


# --------------------------------------------------------------------------- the operators, plainly


def numpy_ops(df, op: str, k: float, m: float) -> dict:
    """One operator (or all) over a DataFrame, with pandas/numpy's plain definitions, as
    flat results (csd_report.op_keys)."""
    import numpy as np

    if op == "all":
        out = {}
        for o in OPS:
            out.update(numpy_ops(df, o, k, m))
        return out
    if op == "count":
        return {"rows": len(df)}
    if op in ("digits", "entropy"):
        vc = df["sensor"].value_counts()
        vc = vc[vc > 0]
        if op == "digits":
            return {f"digit.{d}": int(sum(str(v).count(str(d)) * int(n) for v, n in vc.items())) for d in range(10)}
        p = vc.to_numpy() / len(df)
        return {"entropy.bits": float(-(p * np.log2(p)).sum()), "entropy.distinct": len(vc)}
    a = df[COLS].to_numpy()
    f: dict = {}
    if op == "stats":
        for name, v in (("sum", a.sum(0)), ("mean", a.mean(0)), ("min", a.min(0)), ("max", a.max(0))):
            for j, c in enumerate(COLS):
                f[f"{c}.{name}"] = float(v[j])
    elif op == "modsum":
        v = np.mod(a * k, m).sum(0)
        f = {f"{c}.modsum": float(v[j]) for j, c in enumerate(COLS)}
    elif op == "stddev":
        sp, ss = a.std(0), a.std(0, ddof=1)
        for j, c in enumerate(COLS):
            f[f"{c}.std_pop"], f[f"{c}.std_samp"] = float(sp[j]), float(ss[j])
    elif op == "normalize":
        z = ((a - a.mean(0)) / a.std(0)).sum(0)
        lo, hi = a.min(0), a.max(0)
        mm = ((a - lo) / (hi - lo)).sum(0)
        for j, c in enumerate(COLS):
            f[f"{c}.zscore_sum"], f[f"{c}.minmax_sum"] = float(z[j]), float(mm[j])
    elif op == "gram":
        g = a.T @ a
        f = {f"gram.{i}.{j}": float(g[i, j]) for i in range(8) for j in range(i, 8)}
        f["gram.det"] = float(np.linalg.det(g))
    else:
        raise ValueError(op)
    return f


def sql_parts(op: str, k: float, m: float) -> list[str]:
    """The SQL (DuckDB and Spark alike) of one operator over table `t`: single-pass
    aggregates where the operator is one; normalize's plain definition takes two passes
    (statistics, then the sums of normalized values); entropy groups by sensor. For
    `all`: one query with every single-pass aggregate, plus normalize and entropy."""
    if op == "all":
        aggs = [a for o in ("count", "stats", "modsum", "stddev", "gram", "digits") for a in _aggs(o, k, m)]
        return [f"SELECT {', '.join(aggs)} FROM t"] + sql_parts("normalize", k, m) + sql_parts("entropy", k, m)
    if op == "normalize":
        stats = ", ".join(f"avg({c}) m{j}, stddev_pop({c}) s{j}, min({c}) l{j}, max({c}) h{j}" for j, c in enumerate(COLS))
        sums = ", ".join(f"sum(({c} - m{j}) / s{j}) AS {c}__zscore_sum, sum(({c} - l{j}) / (h{j} - l{j})) AS {c}__minmax_sum"
                         for j, c in enumerate(COLS))
        return [f"WITH a AS (SELECT {stats} FROM t) SELECT {sums} FROM t CROSS JOIN a"]
    if op == "entropy":
        return ["SELECT -sum(p * log2(p)) AS entropy__bits, count(*) AS entropy__distinct FROM "
                "(SELECT CAST(count(*) AS DOUBLE) / sum(count(*)) OVER () AS p FROM t GROUP BY sensor) AS g"]
    return [f"SELECT {', '.join(_aggs(op, k, m))} FROM t"]


def scans(op: str) -> int:
    """How many times sql_parts(op) reads the data: normalize's plain definition twice,
    `all` four times (the aggregates, normalize's two passes, entropy)."""
    return {"normalize": 2, "all": 4}.get(op, 1)


def _aggs(op: str, k: float, m: float) -> list[str]:
    if op == "count":
        return ["count(*) AS rows"]
    if op == "stats":
        return [f"{fn}({c}) AS {c}__{name}" for c in COLS
                for fn, name in (("sum", "sum"), ("avg", "mean"), ("min", "min"), ("max", "max"))]
    if op == "modsum":
        # Python's modulo (the sign of m), as numpy.mod and locus-compute take it.
        return [f"sum(CASE WHEN ({c} * {k!r}) % {m!r} < 0 THEN ({c} * {k!r}) % {m!r} + {m!r} "
                f"ELSE ({c} * {k!r}) % {m!r} END) AS {c}__modsum" for c in COLS]
    if op == "stddev":
        return [f"stddev_pop({c}) AS {c}__std_pop, stddev_samp({c}) AS {c}__std_samp" for c in COLS]
    if op == "gram":
        return [f"sum(c{i} * c{j}) AS gram__{i}__{j}" for i in range(8) for j in range(i, 8)]
    if op == "digits":
        return [f"sum(length(sensor) - length(replace(sensor, '{d}', ''))) AS digit__{d}" for d in range(10)]
    raise ValueError(op)


def sql_flat(row: dict) -> dict:
    """A result row of sql_parts' queries as flat results (the determinant added)."""
    f = {k.replace("__", "."): (float(v) if isinstance(v, float) else (int(v) if v is not None else None))
         for k, v in row.items()}
    if "gram.0.0" in f:
        import numpy as np

        g = np.zeros((8, 8))
        for i in range(8):
            for j in range(i, 8):
                g[i, j] = g[j, i] = f[f"gram.{i}.{j}"]
        f["gram.det"] = float(np.linalg.det(g))
    return f


# --------------------------------------------------------------------------- engine processes


def s3_client(endpoint: str):
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="minioadmin", aws_secret_access_key="minioadmin",
                        region_name="us-east-1", config=Config(max_pool_connections=8))


def host_py(a):
    """The study's "Python on the host": each object pulled with boto3 and parsed with
    pandas, then the operator with numpy. One row per operator (pull + parse + compute),
    timed in this process."""
    import io

    import pandas as pd

    s3 = s3_client(a.endpoint)
    dtypes = {"ts": "int64", "sensor": "category", **{c: "float64" for c in COLS}}
    out = {"runs": []}
    for ds in a.datasets.split(","):
        prefix = f"{PREFIX}/{ds}/"
        keys = sorted((o["Key"], o["Size"]) for page in s3.get_paginator("list_objects_v2").paginate(
            Bucket=a.bucket, Prefix=prefix) for o in page.get("Contents", []))
        for op in a.ops.split(","):
            secs, res = [], None
            for _ in range(a.reps):
                t = time.monotonic()
                frames = []
                for key, _size in keys:
                    body = s3.get_object(Bucket=a.bucket, Key=key)["Body"].read()
                    frames.append(pd.read_csv(io.BytesIO(body), dtype=dtypes))
                    del body
                df = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
                if len(frames) > 1:
                    df["sensor"] = df["sensor"].astype("category")
                del frames
                res = numpy_ops(df, op, a.k, a.m)
                secs.append(time.monotonic() - t)
                del df
            out["runs"].append({"dataset": ds, "op": op, "seconds": secs, "link_bytes": [sum(s for _, s in keys)] * a.reps,
                                "results": res})
            log(f"  host-py {ds} {op}: {min(secs):.2f} s")
    print(json.dumps(out))


def timed_sql(a, one_row):
    """For each operator of `a.ops`: its SQL (`sql_parts`) run `a.reps` times through
    `one_row` (a query to its one result row as a dict). Yields (op, seconds per run, the
    last run's flat results)."""
    for op in a.ops.split(","):
        secs, res = [], {}
        for _ in range(a.reps):
            t = time.monotonic()
            res = {}
            for q in sql_parts(op, a.k, a.m):
                res.update(sql_flat(one_row(q)))
            secs.append(time.monotonic() - t)
        yield op, secs, res


# Spark's s3a settings. Each task reads its split through ranged GETs of at most 64 MiB
# (the random read policy, set for the line reader's opens too) instead of one GET from
# the split's start to the end of the object: toxiproxy, which puts the `lan` profile's
# delay on the link, buffers without bound what a reader slower than the link has not
# taken yet, and a 5 GiB object read to its end by a CPU-bound task grew it past 20 GiB.
SPARK_S3A = {
    "spark.driver.memory": "2g",
    "spark.hadoop.fs.s3a.input.stream.type": "classic",
    "spark.hadoop.fs.s3a.experimental.input.fadvise": "random",
    "spark.hadoop.mapreduce.job.input.file.option.fs.option.openfile.read.policy": "random",
    "spark.hadoop.fs.s3a.readahead.range": "64M",
}


def spark_engine(a):
    """Spark SQL over s3a: one application, a view per dataset, each operator's SQL."""
    from sparkutil import spark_session

    jars = os.environ["SPARK_S3A_JARS"]
    t = time.monotonic()
    spark = spark_session(a.endpoint, "minioadmin", "minioadmin", jars, app="locus-seed-csd",
                          extra=SPARK_S3A, class_archive_dir=a.class_archive_dir or None)
    out = {"startup": time.monotonic() - t, "runs": []}
    schema = "ts BIGINT, sensor STRING, " + ", ".join(f"{c} DOUBLE" for c in COLS)
    try:
        for ds in a.datasets.split(","):
            spark.read.schema(schema).option("header", True).csv(f"s3a://{a.bucket}/{PREFIX}/{ds}/") \
                .createOrReplaceTempView("t")
            for op, secs, res in timed_sql(a, lambda q: spark.sql(q).collect()[0].asDict()):
                out["runs"].append({"dataset": ds, "op": op, "seconds": secs, "passes": scans(op), "results": res})
                log(f"  spark {ds} {op}: {min(secs):.2f} s")
    finally:
        spark.stop()
    print(json.dumps(out))


def duckdb_engine(a):
    """DuckDB over the tmpfs copy: each operator's SQL over read_csv of the files."""
    import duckdb

    con = duckdb.connect()
    cols = "{" + ", ".join([f"'ts': 'BIGINT'", "'sensor': 'VARCHAR'"] + [f"'{c}': 'DOUBLE'" for c in COLS]) + "}"
    con.execute(f"CREATE VIEW t AS SELECT * FROM read_csv('{a.dir}/*.csv', header = true, columns = {cols})")
    out = {"runs": [], "version": duckdb.__version__}
    def row(q: str) -> dict:
        cur = con.execute(q)
        return dict(zip([d[0] for d in cur.description], cur.fetchone()))

    for op, secs, res in timed_sql(a, row):
        out["runs"].append({"dataset": a.dataset, "op": op, "seconds": secs, "results": res})
    print(json.dumps(out))


# --------------------------------------------------------------------------- the stage


class Stage:
    """Everything one harness run starts, torn down in reverse order by close()."""

    def __init__(self, a, prefix: str = "locus-csd-"):
        self.a = a
        self.work = Path(tempfile.mkdtemp(prefix=prefix, dir=a.work_dir or None))
        self.shm = Path(tempfile.mkdtemp(prefix=prefix, dir="/dev/shm"))
        self.cleanups: list = [("tmpfs copies", lambda: shutil.rmtree(self.shm, ignore_errors=True))]
        self.locus_env = None

    def close(self):
        while self.cleanups:
            name, fn = self.cleanups.pop()
            try:
                fn()
            except BaseException as e:  # keep tearing down
                print(f"teardown of {name} failed: {e}", file=sys.stderr)
        shutil.rmtree(self.work, ignore_errors=True)

    def start_minio(self):
        state = self.work / "net.json"
        self.cleanups.append(("netstage", lambda: netstage.down(state)))
        st = netstage.up(self.a.profile, self.a.minio, self.work / "net", state)
        self.endpoint = st["endpoint"]
        self.upload_endpoint = st.get("direct_endpoint", st["endpoint"])
        self.s3 = s3_client(self.upload_endpoint)
        self.s3.create_bucket(Bucket=BUCKET)
        log(f"MinIO ({self.a.profile}) at {self.endpoint}")

    def start_locus(self, workers: int, quota: str):
        rpc, web = netstage.free_port(), netstage.free_port()
        data = self.work / f"locus-{workers}w"
        env = dict(os.environ, LOCUS_MASTER=f"127.0.0.1:{rpc}",
                   LOCUS_SECURITY__TOKEN_FILE=str(data / "client.token"))
        self.locus_env = env
        logf = open(self.work / f"locus-{workers}w.log", "wb")
        p = subprocess.Popen([self.a.locus_bin, "local", "start", "--data-dir", str(data), "--master", f"127.0.0.1:{rpc}",
                              "--workers", str(workers), "--mem-quota", quota, "--no-gateway",
                              "--block-size", self.a.block_size],
                             env=dict(env, LOCUS_MASTER__WEB_ADDRESS=f"127.0.0.1:{web}",
                                      LOCUS_WORKER__DATA_ADDRESS="127.0.0.1:0"),
                             stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

        def stop():
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            logf.close()
            shm = "/dev/shm/locus" + "".join(c if c.isalnum() else "_" for c in str(data))
            shutil.rmtree(shm, ignore_errors=True)

        self.cleanups.append((f"locus ({workers}w)", stop))
        for _ in range(150):
            if p.poll() is not None or self.locus("report", check=False).returncode == 0:
                break
            time.sleep(0.2)
        if p.poll() is not None or self.locus("report", check=False).returncode != 0:
            raise SystemExit(f"locus did not start: {(self.work / f'locus-{workers}w.log').read_text()[-2000:]}")
        self.locus("fs", "mount", LOCUS_MOUNT, f"s3://{BUCKET}", "--option", f"endpoint={self.endpoint}",
                   "--option", "access_key_id=minioadmin", "--option", "secret_access_key=minioadmin",
                   "--sync-interval", "1h")
        log(f"Locus: {workers} worker(s), {LOCUS_MOUNT} -> s3://{BUCKET}")
        return self.cleanups.pop()[1]  # the caller stops it when its worker count is done

    def locus(self, *args, check=True) -> subprocess.CompletedProcess:
        r = subprocess.run([self.a.locus_bin, *args], env=self.locus_env, capture_output=True, text=True)
        if check and r.returncode != 0:
            raise SystemExit(f"locus {' '.join(args)} failed: {r.stderr.strip()}")
        return r

    def engine(self, *args, env=None) -> dict:
        r = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, env=env)
        if r.returncode != 0:
            raise SystemExit(f"{args[0]} failed:\n{r.stderr[-4000:]}")
        return parse_json_line(r.stdout)


def locus_sql(stage, a, raw: dict, ds: dict, path: str, w: int, ops: list[str], reps: int, k: float, m: float):
    """`locus sql` over the dataset's files, warm: each operator's SQL (`sql_parts`, as
    DuckDB and Spark run it), its scans and partial aggregates on the workers."""
    url = f"'locus://{path}/*.csv'"
    run = lambda q: timed_stats([a.locus_bin, "sql", "--format", "json", "--stats", q.replace(" FROM t", f" FROM {url}")],
                                stage.locus_env)
    run("SELECT count(*) FROM t")  # the cache is warm: this reads any block the operators left out
    for op in ops:
        secs, link, scanned, res = [], [], 0, {}
        for _ in range(reps):
            t = time.monotonic()
            res, ret, scanned = {}, 0, 0
            for q in sql_parts(op, k, m):
                row, st = run(q)
                res.update(sql_flat(row))
                ret, scanned = ret + st["bytes_returned"], scanned + st["bytes_scanned"]
            secs.append(time.monotonic() - t)
            link.append(ret)
        raw["runs"].append({"dataset": ds["name"], "path": "locus-sql", "workers": w, "op": op, "seconds": secs,
                            "link_bytes": link, "scanned": scanned, "passes": scans(op), "results": res})
    log(f"  locus sql {w}w {ds['name']}: all {raw['runs'][-1]['seconds']}")


def timed_stats(cmd: list[str], env: dict) -> tuple[dict, dict]:
    """A `locus sql --format json --stats` run: its one result row and its stats line."""
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:5])} ... failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
    lines = [l for l in r.stdout.splitlines() if l.strip()]
    return (json.loads(lines[0]) if lines else {}), json.loads(r.stderr.strip().splitlines()[-1])


def op_args(op: str, k: float, m: float) -> list[str]:
    """The flags of `locus fs compute OP` (and compute-host) for one row: columns for the
    numeric operators, the sensor column for digits and entropy."""
    args = []
    if op in ("stats", "modsum", "stddev", "normalize", "gram", "all"):
        args += ["--columns", "c0..c7"]
    if op == "modsum" or op == "all":
        args += ["--k", repr(k), "--m", repr(m)]
    if op in ("digits", "entropy", "all"):
        args += ["--text-column", "sensor"]
    return args


def timed(cmd: list[str], env: dict) -> tuple[float, dict]:
    t = time.monotonic()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    secs = time.monotonic() - t
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
    return secs, json.loads(r.stdout)


# --------------------------------------------------------------------------- the run


def layouts(a) -> list[tuple[int, int]]:
    """(size, files) of every dataset."""
    if a.quick:
        sizes, files = [64 * MiB], [1, 10]
    else:
        sizes = [1 * GiB, 5 * GiB] + ([10 * GiB] if a.full else [])
        files = [1, 10, 100]
    if a.sizes:
        sizes = [parse_size(s) for s in a.sizes.split(",")]
    if a.files:
        files = [int(f) for f in a.files.split(",")]
    return [(s, f) for s in sizes for f in files]


def ds_name(size: int, files: int) -> str:
    return f"{report.human_size(size).replace(' ', '')}-{files}"


def check_all(raw: dict, ds: dict) -> list[dict]:
    """Every path's results of each operator on `ds` against the reference; recorded in
    raw["checks"]. Returns the disagreements."""
    bad = []
    for op in ROWS:
        res = {}
        for r in raw["runs"]:
            if r["dataset"] == ds["name"] and r["op"] == op and r.get("results") is not None:
                res[f"{r['path']} {r['workers']}w" if r["workers"] else r["path"]] = r["results"]
        mism = report.compare(op, res, ds["rows"])
        raw["checks"].append({"dataset": ds["name"], "op": op, "paths": sorted(res), "mismatches": mism})
        bad += [dict(m, dataset=ds["name"]) for m in mism]
    return bad


def run(a) -> dict:
    lay = layouts(a)
    reps = a.reps or (1 if a.quick else 3)
    ops = a.ops.split(",") if a.ops else ROWS
    paths = a.paths.split(",") if a.paths else list(report.PATHS)
    workers = [int(w) for w in a.workers.split(",")]
    if "locus-sql" in paths and a.quick and not a.paths:
        # The quick study (CI) measures the operators; SQL is measured by the full runs.
        log("locus-sql left out: --quick measures the operators only (name it in --paths to run it)")
        paths.remove("locus-sql")
    elif "locus-sql" in paths and "without SQL" in subprocess.run([a.locus_bin, "sql", "SELECT 1"], capture_output=True,
                                                                    text=True, timeout=60).stderr:
        log("locus-sql left out: this locus was built without SQL (cargo build --no-default-features)")
        paths.remove("locus-sql")
    k, m = 3.0, 7.0
    raw = {"profile": a.profile, "quick": a.quick, "reps": reps, "block_size": parse_size(a.block_size), "compute_parallelism": a.compute_parallelism, "workers": workers, "k": k, "m": m, "ops": ops,
           "paths": paths, "datasets": [], "runs": [], "plain_read": [], "checks": [],
           "machine": machine_facts(a.profile), "code": code_version()}
    stage = Stage(a)
    t0 = time.monotonic()
    biggest = max(s for s, _ in lay)
    quota = f"{biggest * 1.25 / GiB + 0.5:.1f}GiB"
    try:
        stage.start_minio()
        chunk_bytes = len(gen_chunk(0, 1000)) * 100  # about 100k rows
        pool = Chunks(max(1, min(8, -(-biggest // chunk_bytes))))
        from boto3.s3.transfer import TransferConfig

        tc = TransferConfig(multipart_chunksize=64 * MiB, max_concurrency=4)
        # 1. Each dataset: generated on tmpfs, uploaded, DuckDB on the copy, the copy removed.
        for size, files in lay:
            name = ds_name(size, files)
            d = stage.shm / name
            d.mkdir()
            t = time.monotonic()
            nbytes = nrows = 0
            for i in range(files):
                b, r = pool.write(d / f"part-{i:04}.csv", size // files, start=i * 7)
                nbytes, nrows = nbytes + b, nrows + r
                stage.s3.upload_file(str(d / f"part-{i:04}.csv"), BUCKET, f"{PREFIX}/{name}/part-{i:04}.csv", Config=tc)
            raw["datasets"].append({"name": name, "size": size, "files": files, "bytes": nbytes, "rows": nrows})
            log(f"{name}: {nbytes:,} bytes, {nrows:,} rows, written and uploaded in {time.monotonic() - t:.1f} s")
            if "duckdb" in paths:
                out = stage.engine("duckdb", "--dir", str(d), "--dataset", name, "--reps", str(reps), "--ops",
                                   ",".join(ops), "--k", repr(k), "--m", repr(m))
                for r in out["runs"]:
                    raw["runs"].append(dict(r, path="duckdb", workers=0, link_bytes=[0] * len(r["seconds"])))
                raw["duckdb_version"] = out["version"]
                log(f"  duckdb: all {out['runs'][-1]['seconds']}")
            shutil.rmtree(d)
        names = [d["name"] for d in raw["datasets"]]
        host_env = dict(os.environ)
        # 2. Host pulls: the plain read, Rust, Python; then Spark (one application).
        bench = [a.locus_bin, "bench", "compute-host", "--endpoint", stage.endpoint, "--bucket", BUCKET,
                 "--block-size", a.block_size]
        for ds in raw["datasets"]:
            pr = []
            for _ in range(reps):
                secs, out = timed(bench + ["--prefix", f"{PREFIX}/{ds['name']}", "--read-only"], host_env)
                if out["bytes_read"] != ds["bytes"]:
                    raise SystemExit(f"plain read of {ds['name']}: {out['bytes_read']} bytes, the objects have {ds['bytes']}")
                pr.append(secs)
            raw["plain_read"].append({"dataset": ds["name"], "seconds": pr, "bytes": ds["bytes"]})
            log(f"{ds['name']}: plain read {min(pr):.2f} s")
            if "host-rust" in paths:
                for op in ops:
                    secs, link, res = [], [], None
                    for _ in range(reps):
                        s, out = timed(bench + [op, "--prefix", f"{PREFIX}/{ds['name']}", *op_args(op, k, m)], host_env)
                        secs.append(s)
                        link.append(out["bytes_read"])
                        res = report.flatten(out)
                    raw["runs"].append({"dataset": ds["name"], "path": "host-rust", "workers": 0, "op": op,
                                        "seconds": secs, "link_bytes": link, "scanned": out["bytes_scanned"],
                                        "blocks": out["blocks"], "results": res})
                log(f"  host-rust: all {secs}")
        common = ["--endpoint", stage.endpoint, "--bucket", BUCKET, "--datasets", ",".join(names), "--reps", str(reps),
                  "--ops", ",".join(ops), "--k", repr(k), "--m", repr(m)]
        if "host-py" in paths:
            out = stage.engine("host-py", *common)
            for r in out["runs"]:
                raw["runs"].append(dict(r, path="host-py", workers=0))
        if "spark" in paths:
            cds = ["--class-archive-dir", str(a.tools / "cds")] if a.spark_cds else []
            out = stage.engine("spark", *common, *cds)
            raw["spark_startup"] = out["startup"]
            sizes = {d["name"]: d["bytes"] for d in raw["datasets"]}
            for r in out["runs"]:
                # s3a reads the objects once per pass over them.
                raw["runs"].append(dict(r, path="spark", workers=0,
                                        link_bytes=[sizes[r["dataset"]] * r["passes"]] * len(r["seconds"])))
        # 3. Locus: each worker count on a fresh cluster; each operator cold, then warm.
        for w in workers:
            if not any(p.startswith("locus") for p in paths):
                break
            stop = stage.start_locus(w, quota)
            try:
                for ds in raw["datasets"]:
                    path = f"{LOCUS_MOUNT}/{PREFIX}/{ds['name']}"
                    first = f"{path}/part-0000.csv"
                    acc = {p: {op: {"seconds": [], "link_bytes": [], "results": None} for op in ops}
                           for p in ("locus-cold", "locus-warm")}
                    for _ in range(reps):
                        for op in ops:
                            stage.locus("fs", "free", "-R", LOCUS_MOUNT)
                            st = json.loads(stage.locus("fs", "stat", "--json", first).stdout)
                            if st["cached_fraction"] != 0:
                                raise SystemExit(f"locus fs free left {st['cached_fraction']:.0%} of {first} cached")
                            for p in ("locus-cold", "locus-warm"):
                                par = ["--parallelism", str(a.compute_parallelism)] if a.compute_parallelism else []
                                s, out = timed([a.locus_bin, "fs", "compute", op, path, *op_args(op, k, m), "--json", *par],
                                               stage.locus_env)
                                e = acc[p][op]
                                e["seconds"].append(s)
                                e["link_bytes"].append(out["bytes_returned"])
                                e["scanned"], e["blocks"] = out["bytes_scanned"], out["blocks"]
                                e["results"] = report.flatten(out)
                                if out["bytes_scanned"] != ds["bytes"]:
                                    raise SystemExit(f"{p} {op} on {ds['name']}: scanned {out['bytes_scanned']} bytes, "
                                                     f"the objects have {ds['bytes']}")
                    for p, byop in acc.items():
                        for op, e in byop.items():
                            raw["runs"].append({"dataset": ds["name"], "path": p, "workers": w, "op": op, **e})
                    if "locus-sql" in paths:
                        locus_sql(stage, a, raw, ds, path, w, ops, reps, k, m)
                    log(f"  locus {w}w {ds['name']}: all cold {acc['locus-cold'][ops[-1]]['seconds']}, "
                        f"warm {acc['locus-warm'][ops[-1]]['seconds']}")
            finally:
                stop()
        # 4. Every path's results must agree.
        bad = [b for ds in raw["datasets"] for b in check_all(raw, ds)]
        raw["agree"] = not bad
    finally:
        stage.close()
    raw["wall_seconds"] = time.monotonic() - t0
    return raw


def engine_main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=["host-py", "spark", "duckdb"])
    ap.add_argument("--endpoint", default="")
    ap.add_argument("--bucket", default=BUCKET)
    ap.add_argument("--datasets", default="")
    ap.add_argument("--dataset", default="")
    ap.add_argument("--dir", default="")
    ap.add_argument("--ops", default=",".join(ROWS))
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--k", type=float, default=3.0)
    ap.add_argument("--m", type=float, default=7.0)
    ap.add_argument("--class-archive-dir", default="")
    a = ap.parse_args()
    {"host-py": host_py, "spark": spark_engine, "duckdb": duckdb_engine}[a.cmd](a)


def main():
    if len(sys.argv) > 1 and sys.argv[1] in ("host-py", "spark", "duckdb"):
        engine_main()
        return
    tools = Path(os.environ.get("LOCUS_TOOLS_DIR", Path.home() / ".cache/locus-tools"))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="64 MiB in 1 and 10 files, 1 run each (a few minutes; CI)")
    ap.add_argument("--full", action="store_true", help="add 10 GiB")
    ap.add_argument("--profile", default="lan", choices=list(netstage.PROFILES))
    ap.add_argument("--workers", default="1,2", help="Locus worker counts, one fresh cluster each (default 1,2)")
    ap.add_argument("--sizes", default="", help="comma-separated total sizes (e.g. 1GiB,5GiB), overrides the defaults")
    ap.add_argument("--files", default="", help="comma-separated file counts (default 1,10,100; quick 1,10)")
    ap.add_argument("--reps", type=int, default=0, help="runs per figure (default 3, quick 1)")
    ap.add_argument("--ops", default="", help="comma-separated rows (default: " + ",".join(ROWS) + ")")
    ap.add_argument("--paths", default="", help="comma-separated subset of: " + ", ".join(report.PATHS))
    ap.add_argument("--block-size", default="",
                    help="Locus's block size, and the Rust host pull's range (default 64MiB; quick 16MiB, so that "
                    "its small files still span several blocks and both workers)")
    ap.add_argument("--spark-cds", action=argparse.BooleanOptionalAction, default=True,
                    help="the Spark driver JVM uses a class-data archive (as seed-linecount)")
    ap.add_argument("--compute-parallelism", type=int, default=0,
                    help="blocks `locus fs compute` runs at once (default 0: the client's own, 4 per worker, at least 8)")
    ap.add_argument("--locus-bin", required=True)
    ap.add_argument("--minio", default=str(tools / "bin" / "minio"))
    ap.add_argument("--work-dir", default="", help="scratch directory (MinIO's data lives here)")
    ap.add_argument("--out-dir", default=str(HERE / "results"))
    ap.add_argument("--stem", default="", help="file name stem (default seed-csd[-quick]-PROFILE)")
    a = ap.parse_args()
    a.tools = tools
    a.block_size = a.block_size or ("16MiB" if a.quick else "64MiB")
    unknown = [p for p in (a.paths.split(",") if a.paths else []) if p not in report.PATHS]
    unknown += [o for o in (a.ops.split(",") if a.ops else []) if o not in ROWS]
    if unknown:
        raise SystemExit(f"unknown path(s) or operator(s): {', '.join(unknown)}")
    if "spark" in (a.paths or "spark") and not os.environ.get("SPARK_S3A_JARS"):
        raise SystemExit("SPARK_S3A_JARS is not set: run through bench/run, which installs the s3a jars")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    raw = run(a)
    stem = a.stem or f"seed-csd{'-quick' if a.quick else ''}-{a.profile}"
    out = report.write_all(raw, Path(a.out_dir), stem)
    print(out["md"].read_text())
    log(f"done in {raw['wall_seconds']:.0f} s: {out['md']}, {out['png']}, {out['json']}")
    bad = [mm for c in raw["checks"] for mm in c["mismatches"]]
    if bad:
        for b in bad[:20]:
            print(f"DISAGREE {b}", file=sys.stderr)
        raise SystemExit(f"seed-csd: {len(bad)} result(s) disagree across paths (see above and {out['json']})")


if __name__ == "__main__":
    main()
