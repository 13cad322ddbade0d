"""Seed study: metadata search at scale (Zenko's `?search=`, with Spark SQL and DuckDB over
the same metadata as Parquet). Run it with `bench/run seed-mdsearch [--quick]`.

For each scale (1M and 10M objects; --quick: 100k) this script:
  * generates an inventory of that many objects (keys with realistic prefixes, sizes,
    dates, content types, 2-5 user-metadata fields, 0-3 tags) as one Parquet file: the
    metadata and tags as maps (which Locus imports) and as plain columns (which Spark and
    DuckDB query);
  * starts Locus (`locus local start`, 1 worker, the S3 gateway) and imports the file
    with `locus fs index import` (objects/s);
  * runs a fixed query set, from one match to about 10% of the objects, through the
    gateway (`GET /bench?list-type=2&search=...`, boto3, timed from the client: the first
    page of up to 1,000 keys), `--reps` times each: p50 and p99;
  * runs the same queries as SQL (`... ORDER BY key LIMIT 1000`) in Spark (local[2], one
    session, the Parquet as a view) and DuckDB over the same Parquet, and checks that
    every engine returns the same first page;
  * measures liveness: puts through the gateway at a fixed rate (500/s), each followed at
    once by a search for it; the lag is from the put's acknowledgement to the first search
    that finds it;
  * reports the index size on disk and the RSS of the Locus process.

Writes seed-mdsearch[-quick].{md,png,json} under bench/results (or --out-dir).

Internal subcommand (one long-lived process; JSON on stdout):
  seed_mdsearch.py spark --parquet P --queries Q.json --reps N
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime as dt
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

from seed_linecount import code_version, machine_facts  # noqa: E402

BUCKET = "bench"
GW_KEY, GW_SECRET = "locusadmin", "locusadmin"
YEAR0 = int(dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc).timestamp() * 1000)
YEAR_MS = 365 * 86_400_000
META = ["owner", "team", "project", "classification", "source"]
TAGS = ["env", "retention", "project"]


def log(msg: str):
    print(f"[seed-mdsearch {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- data

def generate(n: int, parquet: Path, seed: int = 3) -> tuple[str, str]:
    """`n` objects as one Parquet file, built column-wise: key, size, last_modified, etag,
    content_type, the user metadata and tags as maps (`metadata`, `tags`: what Locus
    imports) and as plain columns (`meta_NAME`, `tag_NAME`: what Spark and DuckDB query).
    Returns the key and the ETag of the object in the middle (the one-match queries')."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    chunk = 1_000_000
    writer = None
    sample = ("", "")

    def pad(a, w):
        return pc.utf8_lpad(pc.cast(pa.array(a), pa.string()), w, "0")

    def cat(*parts):
        return pc.binary_join_element_wise(*parts, "")

    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        i = np.arange(start, start + m, dtype=np.int64)
        kind = rng.choice(5, m, p=[0.30, 0.25, 0.25, 0.10, 0.10])
        mtime = YEAR0 + rng.integers(0, YEAR_MS, m)
        date = pc.strftime(pa.array(mtime, pa.timestamp("ms", tz="UTC")), "%Y-%m-%d")
        size = np.minimum(rng.lognormal(11, 2.5, m).astype(np.int64), 5 << 30)
        png = rng.random(m) < 0.4
        team = rng.integers(0, 100, m)
        ii8 = pad(i, 8)
        ext = pa.array(np.where(png, "png", "jpg"))
        keys = [
            cat("logs/", date, "/host-", pad(rng.integers(0, 500, m), 4), "/part-", ii8, ".gz"),
            cat("images/user-", pad(rng.integers(0, 10_000, m), 5), "/IMG_", ii8, ".", ext),
            cat("data/warehouse/table_", pc.cast(pa.array(i % 40), pa.string()), "/year=",
                pc.utf8_slice_codeunits(date, 0, 4), "/month=", pc.utf8_slice_codeunits(date, 5, 7), "/part-", ii8,
                ".parquet"),
            cat("backups/db", pc.cast(pa.array(i % 7), pa.string()), "/", date, "/dump-", ii8, ".sql.gz"),
            cat("docs/team-", pad(team, 2), "/", ii8, ".pdf"),
        ]
        key = pc.choose(pa.array(kind), *keys)
        ct = pc.choose(pa.array(kind), pa.array(["application/gzip"] * m),
                       pa.array(np.where(png, "image/png", "image/jpeg")),
                       pa.array(["application/vnd.apache.parquet"] * m), pa.array(["application/gzip"] * m),
                       pa.array(["application/pdf"] * m))
        etag = cat(pad((i * 2654435761) & 0xFFFFFFFF, 10), pad(i, 22))
        meta_vals = [
            cat("user-", pad(rng.integers(0, 10_000, m), 5)),
            cat("team-", pc.cast(pa.array(team), pa.string())),
            cat("p", pad(rng.integers(0, 1000, m), 3)),
            pc.take(pa.array(["public", "internal", "confidential", "secret"]),
                    pa.array(rng.choice(4, m, p=[0.5, 0.3, 0.15, 0.05]))),
            pc.take(pa.array(["ingest-a", "ingest-b", "ingest-c"]), pa.array(rng.integers(0, 3, m))),
        ]
        tag_vals = [
            pc.take(pa.array(["prod", "dev", "test"]), pa.array(rng.choice(3, m, p=[0.6, 0.3, 0.1]))),
            pc.take(pa.array(["30d", "90d", "1y", "7y"]), pa.array(rng.integers(0, 4, m))),
            cat("p", pad(rng.integers(0, 1000, m), 3)),
        ]
        nmeta = rng.integers(2, 6, m)
        ntags = rng.integers(0, 4, m)

        def as_map(names, vals, count):
            # Row r holds the first count[r] fields.
            grid = np.stack([np.asarray(v.to_numpy(zero_copy_only=False), dtype=object) for v in vals], axis=1)
            mask = np.arange(len(names))[None, :] < count[:, None]
            offsets = np.concatenate([[0], np.cumsum(count)]).astype(np.int32)
            ks = np.broadcast_to(np.array(names, dtype=object), grid.shape)[mask]
            return pa.MapArray.from_arrays(pa.array(offsets), pa.array(ks, pa.string()), pa.array(grid[mask], pa.string()))

        cols = {"key": key, "size": pa.array(size), "last_modified": pa.array(mtime, pa.timestamp("ms", tz="UTC")),
                "etag": etag, "content_type": ct,
                "metadata": as_map(META, meta_vals, nmeta), "tags": as_map(TAGS, tag_vals, ntags)}
        for j, x in enumerate(META):
            cols[f"meta_{x}"] = pc.if_else(pa.array(nmeta > j), meta_vals[j], pa.nulls(m, pa.string()))
        for j, x in enumerate(TAGS):
            cols[f"tag_{x}"] = pc.if_else(pa.array(ntags > j), tag_vals[j], pa.nulls(m, pa.string()))
        t = pa.table(cols)
        if start <= n // 2 < start + m:
            r = n // 2 - start
            sample = (key[r].as_py(), etag[r].as_py())
        if writer is None:
            writer = pq.ParquetWriter(parquet, t.schema)
        writer.write_table(t)
    writer.close()
    return sample


def to_jsonl(parquet: Path, out: Path):
    """The inventory as JSON lines (for a Locus built without SQL, which reads no Parquet)."""
    import pyarrow.parquet as pq

    with open(out, "w") as f:
        for b in pq.ParquetFile(parquet).iter_batches(50_000, columns=["key", "size", "last_modified", "etag",
                                                                        "content_type", "metadata", "tags"]):
            for r in b.to_pylist():
                r["last_modified"] = int(r["last_modified"].timestamp() * 1000)
                r["metadata"], r["tags"] = dict(r["metadata"]), dict(r["tags"])
                f.write(json.dumps(r) + "\n")


def queries(key: str, etag: str) -> list[dict]:
    """The fixed query set: Zenko clause, SQL predicate, and whether it is selective
    (<= 1,000 matches at 10M objects)."""
    day = lambda d: f"2025-{d}"  # noqa: E731
    return [
        {"name": "key =", "selective": True, "search": f'key = "{key}"', "sql": f"key = '{key}'"},
        {"name": "etag =", "selective": True, "search": f"etag = {etag}", "sql": f"etag = '{etag}'"},
        {"name": "meta owner =", "selective": True,
         "search": "x-amz-meta-owner = user-01234", "sql": "meta_owner = 'user-01234'"},
        {"name": "tag AND size >", "selective": True,
         "search": "tags.project = p042 AND content-length > 1000000",
         "sql": "tag_project = 'p042' AND size > 1000000"},
        {"name": "modified 30 min", "selective": True,
         "search": f"last-modified >= {day('06-15T12:00:00Z')} AND last-modified < {day('06-15T12:30:00Z')}",
         "sql": f"last_modified >= TIMESTAMP '{day('06-15 12:00:00')}' AND last_modified < TIMESTAMP '{day('06-15 12:30:00')}'"},
        {"name": "key regex, prefix", "selective": True,
         "search": 'key LIKE "^logs/2025-03-1[0-2]/host-000[0-4]/"',
         "sql": "regexp_matches(key, '^logs/2025-03-1[0-2]/host-000[0-4]/')"},
        {"name": "(meta OR meta) AND meta", "selective": True,
         "search": "(x-amz-meta-owner = user-00077 OR x-amz-meta-owner = user-00078) AND x-amz-meta-team != team-1",
         "sql": "(meta_owner = 'user-00077' OR meta_owner = 'user-00078') AND (meta_team IS NULL OR meta_team <> 'team-1')"},
        {"name": "content-type = (10%)", "selective": False,
         "search": "content-type = image/png", "sql": "content_type = 'image/png'"},
        {"name": "meta AND tag (~0.1%)", "selective": False,
         "search": "x-amz-meta-classification = secret AND tags.env = test AND tags.retention = 7y",
         "sql": "meta_classification = 'secret' AND tag_env = 'test' AND tag_retention = '7y'"},
        {"name": "size > (1%)", "selective": False,
         "search": "content-length > 700000000", "sql": "size > 700000000"},
    ]


# --------------------------------------------------------------------------- engines

def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def spark_engine(a):
    from pyspark.sql import SparkSession

    t = time.monotonic()
    spark = (SparkSession.builder.master("local[2]").appName("locus-seed-mdsearch")
             .config("spark.driver.memory", "4g").config("spark.ui.enabled", "false")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    out = {"startup": time.monotonic() - t, "queries": {}}
    try:
        spark.read.parquet(a.parquet).createOrReplaceTempView("objects")
        sql_regex = lambda s: s.replace("regexp_matches(key, ", "key RLIKE (")  # noqa: E731
        for q in json.loads(Path(a.queries).read_text()):
            sql = f"SELECT key FROM objects WHERE {sql_regex(q['sql'])} ORDER BY key LIMIT 1000"
            secs, keys = [], []
            for _ in range(a.reps):
                t = time.monotonic()
                keys = [r[0] for r in spark.sql(sql).collect()]
                secs.append(time.monotonic() - t)
            out["queries"][q["name"]] = {"seconds": secs, "keys": keys}
            log(f"  spark {q['name']}: {statistics.median(secs) * 1000:.0f} ms")
    finally:
        spark.stop()
    print(json.dumps(out))


def duckdb_run(parquet: Path, qs: list[dict], reps: int) -> dict:
    import duckdb

    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    con.execute(f"CREATE VIEW objects AS SELECT * FROM read_parquet('{parquet}')")
    out = {}
    for q in qs:
        sql = f"SELECT key FROM objects WHERE {q['sql']} ORDER BY key LIMIT 1000"
        secs, keys = [], []
        for _ in range(reps):
            t = time.monotonic()
            keys = [r[0] for r in con.execute(sql).fetchall()]
            secs.append(time.monotonic() - t)
        out[q["name"]] = {"seconds": secs, "keys": keys}
        log(f"  duckdb {q['name']}: {statistics.median(secs) * 1000:.1f} ms")
    return out


class Searcher:
    """boto3 on the gateway, `?search=` added before signing."""

    def __init__(self, endpoint: str):
        import boto3
        from botocore.config import Config

        self.s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=GW_KEY,
                               aws_secret_access_key=GW_SECRET, region_name="us-east-1",
                               config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2},
                                             max_pool_connections=32))
        self.local = threading.local()
        self.s3.meta.events.register("before-sign.s3.ListObjectsV2", self._add)

    def _add(self, request, **_):
        c = getattr(self.local, "clause", None)
        if c is not None:
            request.url += ("&" if "?" in request.url else "?") + "search=" + urllib.parse.quote(c, safe="")

    def first_page(self, clause: str) -> list[str]:
        self.local.clause = clause
        try:
            r = self.s3.list_objects_v2(Bucket=BUCKET, MaxKeys=1000)
        finally:
            self.local.clause = None
        return [o["Key"] for o in r.get("Contents", [])]


# --------------------------------------------------------------------------- stage

def children_cpu() -> float:
    """User and system CPU time of this process's finished children (the CLI runs)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# tantivy's segment files, by extension.
SEGMENT_FILES = ("store", "term", "idx", "pos", "fast", "fieldnorm", "del")


class Locus:
    def __init__(self, a, work: Path):
        self.a = a
        work.mkdir(parents=True, exist_ok=True)
        self.data = work / "locus"
        rpc, web, gw = free_port(), free_port(), free_port()
        self.env = dict(os.environ, LOCUS_MASTER=f"127.0.0.1:{rpc}",
                        LOCUS_SECURITY__TOKEN_FILE=str(self.data / "client.token"))
        self.log = open(work / "locus.log", "wb")
        self.endpoint = f"http://127.0.0.1:{gw}"
        self.p = subprocess.Popen(
            [a.locus_bin, "local", "start", "--data-dir", str(self.data), "--master", f"127.0.0.1:{rpc}",
             "--workers", "1", "--mem-quota", "256MiB"],
            env=dict(self.env, LOCUS_MASTER__WEB_ADDRESS=f"127.0.0.1:{web}",
                     LOCUS_WORKER__DATA_ADDRESS="127.0.0.1:0", LOCUS_GATEWAY__ADDRESS=f"127.0.0.1:{gw}",
                     LOCUS_GATEWAY__ACCESS_KEY_ID=GW_KEY, LOCUS_GATEWAY__SECRET_ACCESS_KEY=GW_SECRET),
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        for _ in range(150):
            if self.p.poll() is not None or self.cli("report", check=False).returncode == 0:
                break
            time.sleep(0.2)
        if self.p.poll() is not None:
            raise SystemExit(f"locus did not start: {(work / 'locus.log').read_text()[-2000:]}")

    def cli(self, *args, check=True) -> subprocess.CompletedProcess:
        r = subprocess.run([self.a.locus_bin, *map(str, args)], env=self.env, capture_output=True, text=True)
        if check and r.returncode != 0:
            raise SystemExit(f"locus {' '.join(map(str, args))} failed: {r.stderr.strip()}")
        return r

    def rss(self) -> int:
        return self.rss_parts().get("VmRSS", 0)

    def rss_parts(self) -> dict:
        """VmRSS and its parts (RssAnon: the heap; RssFile: mapped files, here the
        index's pages that searches read, which the kernel may drop), in bytes."""
        out = {}
        for line in Path(f"/proc/{self.p.pid}/status").read_text().splitlines():
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                out[k] = int(v.split()[0]) * 1024
        return out

    def mapped_by_kind(self) -> dict:
        """The resident bytes of the process's file mappings by the file's extension
        (tantivy's segment files: `term` dictionaries, `idx` postings, `fast` columns,
        `store` documents), from /proc/PID/smaps."""
        out, kind = {}, None
        for line in Path(f"/proc/{self.p.pid}/smaps").read_text().splitlines():
            f = line.split()
            if f and not f[0].endswith(":"):  # a mapping's header: range perms offset dev inode [path]
                path = f[5] if len(f) > 5 and f[5].startswith("/") and f[4] != "0" else None
                ext = Path(path).suffix.lstrip(".") if path else None
                kind = None if path is None else ext if ext in SEGMENT_FILES else "other"
            elif kind and f[0] == "Rss:":
                out[kind] = out.get(kind, 0) + int(f[1]) * 1024
        return {k: v for k, v in sorted(out.items(), key=lambda kv: -kv[1]) if v}

    def cpu_seconds(self) -> float:
        """User and system CPU time of the Locus process so far."""
        f = Path(f"/proc/{self.p.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

    def thread_cpu(self) -> dict:
        """CPU seconds of the Locus process's live threads of two kinds: tantivy's merge
        threads, and the tokio workers (requests, and the import's document building on
        blocking threads). Tantivy's indexing threads end with each segment, so the caller
        takes their time as the process's total less these two."""
        out = {"merge": 0.0, "tokio": 0.0}
        tick = os.sysconf("SC_CLK_TCK")
        for t in Path(f"/proc/{self.p.pid}/task").iterdir():
            try:
                comm = (t / "comm").read_text().strip()
                f = (t / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            kind = "merge" if comm.startswith("merge_thread") else "tokio" if comm.startswith("tokio-rt") else None
            if kind:
                out[kind] += (int(f[11]) + int(f[12])) / tick
        return out

    def index_bytes(self) -> int:
        return sum(f.stat().st_size for f in (self.data / "master").rglob("*") if f.is_file())

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        try:
            self.p.wait(60)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        self.log.close()
        shm = "/dev/shm/locus" + "".join(c if c.isalnum() else "_" for c in str(self.data))
        shutil.rmtree(shm, ignore_errors=True)


def put_load(endpoint: str, rate: int, seconds: float, work: Path, procs: int = 25) -> list:
    """A background load of `rate * seconds` PUTs at about `rate`/s in all: `procs` curl
    processes, each serial and rate-limited, signing with SigV4 itself (curl's
    `--aws-sigv4`), so the load costs the client little CPU and leaves the cores to Locus.
    curl's pacing loses a few percent, so each process is offered one put/s more; what
    counts is the rate achieved, which the report gives."""
    body = work / "load-body"
    body.write_bytes(b"x" * 100)
    n = int(rate * seconds / procs)
    out = []
    for p in range(procs):
        cfg = work / f"load-{p}.curl"
        lines = ['aws-sigv4 = "aws:amz:us-east-1:s3"', f'user = "{GW_KEY}:{GW_SECRET}"', "silent",
                 # (curl 7.88 signs no payload hash itself; S3 requires the header)
                 'header = "x-amz-content-sha256: UNSIGNED-PAYLOAD"',
                 f"rate = {-(-rate // procs) + 1}/s", 'write-out = "%{http_code}\\n"']
        for i in range(n):
            lines += [f'upload-file = "{body}"', f'url = "{endpoint}/{BUCKET}/load/{p:02d}/{i:06d}"',
                      "output = /dev/null"]
        cfg.write_text("\n".join(lines) + "\n")
        codes = open(work / f"load-{p}.codes", "w+")
        out.append((subprocess.Popen(["curl", "--config", str(cfg)], stdout=codes, stderr=subprocess.DEVNULL), codes))
    return out


def liveness(s: Searcher, loc: "Locus", rate: int, seconds: float, work: Path) -> dict:
    """Under a background load of `rate` puts/s, probes: a put (boto3), then searches for
    it at once until found; the lag is from the put's acknowledgement to that search.
    Also the CPU time Locus, the load's processes and the probing client took: on two
    cores, what they took together says whether the machine could give more."""
    import resource

    lags, errors = [], 0
    cpu0 = (loc.cpu_seconds(), resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(resource.RUSAGE_SELF))
    t0 = time.monotonic()
    load = put_load(loc.endpoint, rate, seconds, work)
    ended = []  # when each load process ended
    for p, _ in load:
        threading.Thread(target=lambda p=p: (p.wait(), ended.append(time.monotonic())), daemon=True).start()
    time.sleep(1)
    i = 0
    while time.monotonic() - t0 < seconds:
        key = f"live/{i:06d}"
        s.s3.put_object(Bucket=BUCKET, Key=key, Body=b"x", Metadata={"seq": f"s{i}"})
        acked = time.monotonic()
        for _ in range(400):
            if s.first_page(f"x-amz-meta-seq = s{i}") == [key]:
                lags.append(time.monotonic() - acked)
                break
            time.sleep(0.002)
        else:
            errors += 1
        i += 1
        time.sleep(0.05)
    ok = 0
    for p, codes in load:
        p.wait()
        codes.seek(0)
        ok += sum(1 for c in codes.read().split() if c == "200")
        codes.close()
    wall = max(ended) - t0
    ch, me = resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(resource.RUSAGE_SELF)
    cpu = {"locus": loc.cpu_seconds() - cpu0[0],
           "load_clients": ch.ru_utime + ch.ru_stime - cpu0[1].ru_utime - cpu0[1].ru_stime,
           "probe_client": me.ru_utime + me.ru_stime - cpu0[2].ru_utime - cpu0[2].ru_stime}
    return {"puts": ok, "rate_target": rate, "rate_achieved": ok / wall, "probes": i, "lag_seconds": lags,
            "not_found": errors, "wall_seconds": time.monotonic() - t0, "cpu_seconds": cpu}


def listing_floor(s: Searcher, sizes: list[int], reps: int) -> dict:
    """The floor of a page of each size: a plain listing (no search) of as many keys
    through the same gateway and client, boto3's XML parsing included."""
    out = {}
    for k in sorted(set(sizes)):
        secs, n_keys = [], 0
        for _ in range(reps):
            t = time.monotonic()
            n_keys = len(s.s3.list_objects_v2(Bucket=BUCKET, Prefix="load/", MaxKeys=max(k, 1)).get("Contents", []))
            secs.append(time.monotonic() - t)
        out[str(k)] = {"seconds": secs, "keys": n_keys}
    return out


def import_floor(a, src: Path) -> dict:
    """The import's floor, with Locus stopped: `locus bench index-floor`, the same manifest
    parsed the same way into the same search index in one process, no master and no RPC.
    Timed from here, process start included (as the import is)."""
    t = time.monotonic()
    r = subprocess.run([a.locus_bin, "bench", "index-floor", str(src), "--under", f"/{BUCKET}"],
                       capture_output=True, text=True)
    secs = time.monotonic() - t
    if r.returncode != 0:
        raise SystemExit(f"locus bench index-floor failed:\n{r.stderr[-4000:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    res = {"seconds": secs, "objects": out["objects"], "objects_per_s": out["objects"] / secs}
    log(f"import floor (no Locus around the index): {res['objects_per_s']:,.0f} objects/s ({secs:.1f} s)")
    return res


# --------------------------------------------------------------------------- run

def run_scale(a, n: int, work: Path) -> dict:
    res = {"objects": n}
    parquet = work / f"objects-{n}.parquet"
    t = time.monotonic()
    key, etag = generate(n, parquet)
    log(f"{n:,} objects generated in {time.monotonic() - t:.0f} s")
    qs = queries(key, etag)
    (work / "queries.json").write_text(json.dumps(qs))
    src = parquet
    if a.import_format == "jsonl":
        src = work / f"objects-{n}.jsonl"
        to_jsonl(parquet, src)
    loc = Locus(a, work / f"run-{n}")
    try:
        s = Searcher(loc.endpoint)
        s.s3.create_bucket(Bucket=BUCKET)
        t, c0, ch0 = time.monotonic(), loc.cpu_seconds(), children_cpu()
        threads0 = loc.thread_cpu()
        loc.cli("fs", "index", "import", src, "--under", f"/{BUCKET}")
        secs = time.monotonic() - t
        cpu = {"locus": loc.cpu_seconds() - c0, "cli": children_cpu() - ch0}
        for k, v in loc.thread_cpu().items():
            cpu[f"locus_{k}"] = v - threads0.get(k, 0.0)
        res["import"] = {"seconds": secs, "objects_per_s": n / secs, "cpu_seconds": cpu, "format": a.import_format}
        log(f"import: {n / secs:,.0f} objects/s ({secs:.1f} s); CPU: Locus {cpu['locus']:.1f} s, CLI {cpu['cli']:.1f} s")
        res["index_bytes"] = loc.index_bytes()
        res["rss_after_import"] = loc.rss()
        res["rss_after_import_mapped"] = loc.mapped_by_kind()
        res["locus"] = {}
        for q in qs:
            secs, keys = [], []
            s.first_page(q["search"])  # warm-up
            for _ in range(a.reps):
                t = time.monotonic()
                keys = s.first_page(q["search"])
                secs.append(time.monotonic() - t)
            res["locus"][q["name"]] = {"seconds": secs, "keys": keys}
            log(f"  locus {q['name']}: p50 {pct(secs, 50) * 1000:.1f} ms, p99 {pct(secs, 99) * 1000:.1f} ms, "
                f"{len(keys)} keys")
        res["rss_after_queries_parts"] = parts = loc.rss_parts()
        res["rss_after_queries"] = parts.get("VmRSS", 0)
        res["rss_after_queries_mapped"] = loc.mapped_by_kind()
        if not a.no_live:
            res["live"] = lv = liveness(s, loc, a.live_rate, a.live_seconds, work)
            lg = lv["lag_seconds"]
            log(f"live: {lv['puts']} puts at {lv['rate_achieved']:.0f}/s; {len(lg)} probes, lag p99 "
                f"{pct(lg, 99) * 1000:.1f} ms, {lv['not_found']} not found")
            # The floor of each page: a plain listing of as many keys (the load's).
            res["floor_list"] = listing_floor(s, [len(v["keys"]) for v in res["locus"].values()], a.reps)
            for k, v in res["floor_list"].items():
                log(f"floor: a plain listing of {v['keys']} keys p50 {pct(v['seconds'], 50) * 1000:.1f} ms")
        res["rss_end"] = loc.rss()
    finally:
        loc.stop()
    res["import_floor"] = import_floor(a, src)
    res["duckdb"] = duckdb_run(parquet, qs, a.reps)
    if "spark" in a.paths:
        r = subprocess.run([sys.executable, __file__, "spark", "--parquet", str(parquet), "--queries",
                            str(work / "queries.json"), "--reps", str(a.spark_reps)], capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"spark failed:\n{r.stderr[-4000:]}")
        res["spark"] = json.loads(r.stdout.strip().splitlines()[-1])["queries"]
    res["agree"] = {q["name"]: all(res[e][q["name"]]["keys"] == res["duckdb"][q["name"]]["keys"]
                                   for e in ("locus", "spark") if e in res) for q in qs}
    res["queries"] = qs
    parquet.unlink(missing_ok=True)
    src.unlink(missing_ok=True)
    res["import"]["format"] = a.import_format
    return res


FORMATS = {"jsonl": "JSON lines", "parquet": "Parquet"}


def rss_split(sc: dict) -> str:
    """The parts of the RSS after the queries, when the run recorded them."""
    p = sc.get("rss_after_queries_parts") or {}
    if "RssAnon" not in p:
        return ""
    kinds = sc.get("rss_after_queries_mapped") or {}
    by = ", ".join(f"{k} {v / 2**20:,.0f}" for k, v in list(kinds.items())[:5] if v >= 2**20)
    return (f" (heap {p['RssAnon'] / 2**20:,.0f} MiB, mapped index files {p.get('RssFile', 0) / 2**20:,.0f} MiB"
            f"{f' ({by} by kind)' if by else ''}, shared memory {p.get('RssShmem', 0) / 2**20:,.0f} MiB)")


def import_cpu(sc: dict) -> str:
    """The import's CPU split, per object, as a sentence (empty for runs before it was kept)."""
    c = sc["import"].get("cpu_seconds")
    if not c:
        return ""
    us = lambda v: f"{v / sc['objects'] * 1e6:.1f}"  # noqa: E731
    indexing = c["locus"] - c.get("locus_merge", 0) - c.get("locus_tokio", 0)
    return (f" CPU per object during the import: Locus {us(c['locus'])} µs (requests and documents "
            f"{us(c.get('locus_tokio', 0))}, tantivy's indexing {us(indexing)}, its merges "
            f"{us(c.get('locus_merge', 0))}), the CLI reading the manifest {us(c['cli'])} µs; 100,000 objects/s on "
            f"2 cores allows 20 µs in all.")


def import_floor_line(sc: dict) -> str:
    """The import's floor, as a sentence (empty for runs before it was measured)."""
    fl = sc.get("import_floor")
    if not fl:
        return ""
    return (f" The import's floor, the same manifest parsed and indexed into the same index in one process with no "
            f"master around it (`locus bench index-floor`, same run, Locus stopped): {fl['objects_per_s']:,.0f} "
            f"objects/s ({fl['seconds']:.1f} s); Locus's import runs at "
            f"{sc['import']['objects_per_s'] / fl['objects_per_s']:.2f}× its speed.")


def report(raw: dict, out_dir: Path, stem: str) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{stem}.json").write_text(json.dumps(raw, indent=1))
    ms = lambda x: f"{x * 1000:.1f}"  # noqa: E731
    L = ["# Metadata search at scale", "",
         f"2 cores, 24 GiB; code {raw['code']}; {raw['reps']} runs per Locus and DuckDB figure, "
         f"{raw['spark_reps']} per Spark figure. Locus: `locus local start` (1 worker, gateway), timed from a boto3 "
         "client (`list_objects_v2` with `?search=`, the first page of up to 1,000 keys). Spark (local[2]) and "
         "DuckDB: `SELECT key FROM objects WHERE ... ORDER BY key LIMIT 1000` over the same metadata as Parquet "
         "(metadata and tags as plain columns), one long-lived session each.", ""]
    goals = []
    for sc in raw["scales"]:
        n = sc["objects"]
        L += [f"## {n:,} objects", "",
              f"Import (`locus fs index import`, {FORMATS[sc['import'].get('format', 'jsonl')]}): "
              f"{sc['import']['objects_per_s']:,.0f} objects/s "
              f"({sc['import']['seconds']:.1f} s). Master index on disk: {sc['index_bytes'] / 2**20:,.0f} MiB. "
              f"RSS of the Locus process (master, worker and gateway): {sc['rss_after_queries'] / 2**20:,.0f} MiB "
              f"after the queries{rss_split(sc)}, {sc.get('rss_end', 0) / 2**20:,.0f} MiB at the end.{import_cpu(sc)}"
              f"{import_floor_line(sc)}", "",
              "The floor of each query is a plain listing (no search) of as many keys as its page holds, through the "
              "same gateway and client, in the same run: what any answer of that size costs before any search.", "",
              "| query | matches (page) | Locus p50 ms | Locus p99 ms | floor p50 ms | Locus / floor | DuckDB p50 ms | Spark p50 ms | Spark / Locus | DuckDB / Locus | same keys |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for q in sc["queries"]:
            lo = sc["locus"][q["name"]]["seconds"]
            du = sc["duckdb"][q["name"]]["seconds"]
            sp = sc.get("spark", {}).get(q["name"], {}).get("seconds")
            p50, p99, d50 = pct(lo, 50), pct(lo, 99), statistics.median(du)
            s50 = statistics.median(sp) if sp else None
            nk = len(sc["locus"][q["name"]]["keys"])
            fl = sc.get("floor_list", {}).get(str(nk))
            f50 = pct(fl["seconds"], 50) if fl else None
            L.append(f"| {q['name']}{' (selective)' if q['selective'] else ''} | {nk} | "
                     f"{ms(p50)} | {ms(p99)} | {ms(f50) if f50 else '—'} | {f'{p50 / f50:.2f}×' if f50 else '—'} | "
                     f"{ms(d50)} | {ms(s50) if s50 else '—'} | "
                     f"{f'{s50 / p50:.0f}×' if s50 else '—'} | {d50 / p50:.1f}× | {'yes' if sc['agree'][q['name']] else '**no**'} |")
            if q["selective"]:
                goals.append((n, f"{q['name']}: p50 (ms)", p50 * 1000, 5, "<=", f"{f50 * 1000:.1f} ms" if f50 else ""))
                f99 = pct(fl["seconds"], 99) if fl else None
                goals.append((n, f"{q['name']}: p99 (ms)", p99 * 1000, 50, "<=", f"p99 {f99 * 1000:.1f} ms" if f99 else ""))
                goals.append((n, f"{q['name']}: DuckDB / Locus", d50 / p50, 1, ">"))
                if s50:
                    goals.append((n, f"{q['name']}: Spark / Locus", s50 / p50, 20, ">=",
                                  f"Spark / floor {s50 / f50:.1f}" if f50 else ""))
            elif q["name"].startswith("content-type"):
                goals.append((n, "10% match: first page p50 (ms)", p50 * 1000, 50, "<=",
                              f"{f50 * 1000:.1f} ms" if f50 else ""))
        fl = sc.get("import_floor")
        goals.append((n, "import objects/s", sc["import"]["objects_per_s"], 100_000, ">=",
                      f"{fl['objects_per_s']:,.0f}/s (Locus {sc['import']['objects_per_s'] / fl['objects_per_s']:.2f}×)"
                      if fl else ""))
        goals.append((n, "RSS (MiB)", max(sc["rss_after_queries"], sc.get("rss_end", 0)) / 2**20, 1024, "<="))
        if "live" in sc:
            lv = sc["live"]
            L += ["", f"Live: a background load of {lv['puts']:,} puts at {lv['rate_achieved']:.0f}/s (target "
                      f"{lv['rate_target']}; 25 curl processes, SigV4), and meanwhile {lv['probes']} probes: a put "
                      f"(boto3), then a search for it at once, repeated until it is found. Lag from the put's "
                      f"acknowledgement: p50 {ms(pct(lv['lag_seconds'], 50))} ms, p99 "
                      f"{ms(pct(lv['lag_seconds'], 99))} ms; not found within 1 s: {lv['not_found']}."]
            if "cpu_seconds" in lv:
                c, w = lv["cpu_seconds"], lv["wall_seconds"]
                L[-1] += (f" CPU meanwhile, in cores (of 2): Locus {c['locus'] / w:.2f}, the load's curl processes "
                          f"{c['load_clients'] / w:.2f}, the probing client {c['probe_client'] / w:.2f}; together "
                          f"{sum(c.values()) / w:.2f}.")
            goals.append((n, "live puts/s under which the lag is measured", lv["rate_achieved"], lv["rate_target"],
                          ">="))
            goals.append((n, "live lag p99 (ms)", pct(lv["lag_seconds"], 99) * 1000, 1000, "<="))
        L.append("")
    L += ["## Goals", "", "Not loosened: each figure with pass or miss (goals are set at 10M objects; smaller scales "
          "are shown against the same bounds). A latency's floor is the plain listing of as many keys (above); "
          "beside a Spark ratio, Spark's time over that floor: the ratio a search that cost nothing beyond its "
          "answer would reach.", "",
          "| objects | goal | figure | target | | floor |", "|---:|---|---:|---|---|---:|"]
    ok = 0
    for n, name, v, target, op, *note in goals:
        good = {"<=": v <= target, ">=": v >= target, ">": v > target}[op]
        ok += good
        L.append(f"| {n:,} | {name} | {v:,.1f} | {op} {target:,} | {'pass' if good else '**miss**'} | "
                 f"{note[0] if note else ''} |")
    L += ["", f"{ok} of {len(goals)} goal figures met."]
    md = out_dir / f"{stem}.md"
    md.write_text("\n".join(L) + "\n")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        sc = raw["scales"][-1]
        names = [q["name"] for q in sc["queries"]]
        fig, ax = plt.subplots(figsize=(10, 4.5))
        w = 0.27
        for j, (eng, lab) in enumerate([("locus", "Locus p50"), ("duckdb", "DuckDB"), ("spark", "Spark")]):
            if eng not in sc:
                continue
            vals = [statistics.median(sc[eng][nm]["seconds"]) * 1000 for nm in names]
            ax.bar([i + (j - 1) * w for i in range(len(names))], vals, w, label=lab)
        ax.set_yscale("log")
        ax.set_ylabel("ms (log)")
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
        ax.set_title(f"Metadata search, {sc['objects']:,} objects: first page of up to 1,000 keys")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out_dir / f"{stem}.png", dpi=110)
    except ImportError:
        pass
    return md


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "spark":
        ap = argparse.ArgumentParser()
        ap.add_argument("cmd")
        ap.add_argument("--parquet", required=True)
        ap.add_argument("--queries", required=True)
        ap.add_argument("--reps", type=int, default=5)
        spark_engine(ap.parse_args())
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="100k objects, no Spark, a short live run (CI)")
    ap.add_argument("--objects", default="", help="comma-separated scales (default 1000000,10000000)")
    ap.add_argument("--reps", type=int, default=0, help="runs per Locus and DuckDB query (default 100; quick 20)")
    ap.add_argument("--spark-reps", type=int, default=5)
    ap.add_argument("--paths", default="", help="engines besides Locus: duckdb,spark (default both; quick duckdb)")
    ap.add_argument("--import-format", choices=["parquet", "jsonl"], default="",
                    help="what Locus imports (default parquet; quick jsonl: the quick build has no SQL, so no Parquet)")
    ap.add_argument("--live-rate", type=int, default=500)
    ap.add_argument("--live-seconds", type=float, default=0)
    ap.add_argument("--no-live", action="store_true")
    ap.add_argument("--locus-bin", required=True)
    ap.add_argument("--work-dir", default="")
    ap.add_argument("--out-dir", default=str(HERE / "results"))
    ap.add_argument("--stem", default="")
    a = ap.parse_args()
    a.reps = a.reps or (20 if a.quick else 100)
    a.paths = a.paths or ("duckdb" if a.quick else "duckdb,spark")
    a.live_seconds = a.live_seconds or (4 if a.quick else 20)
    a.import_format = a.import_format or ("jsonl" if a.quick else "parquet")
    scales = [int(x) for x in a.objects.split(",")] if a.objects else ([100_000] if a.quick else [1_000_000, 10_000_000])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(tempfile.mkdtemp(prefix="locus-mdsearch-", dir=a.work_dir or None))
    t0 = time.monotonic()
    raw = {"code": code_version(), "machine": machine_facts("none"), "reps": a.reps, "spark_reps": a.spark_reps,
           "scales": []}
    try:
        for n in scales:
            raw["scales"].append(run_scale(a, n, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    raw["wall_seconds"] = time.monotonic() - t0
    stem = a.stem or f"seed-mdsearch{'-quick' if a.quick else ''}"
    md = report(raw, Path(a.out_dir), stem)
    print(md.read_text())
    log(f"done in {raw['wall_seconds']:.0f} s: {md}")
    bad = [f"{sc['objects']} {k}" for sc in raw["scales"] for k, v in sc["agree"].items() if not v]
    if bad:
        raise SystemExit(f"seed-mdsearch: engines disagree on {', '.join(bad)}")


if __name__ == "__main__":
    main()
