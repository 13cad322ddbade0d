"""Pipeline benchmark (seed study: data sharing between pipeline stages).

Four stages, each reading what the previous one wrote, through an S3 endpoint:
  1. generate     ~SIZE of CSV (Python with PyArrow), in 8 part files
  2. to_parquet   CSV -> Parquet (PyArrow datasets)
  3. transform    derived columns (Spark, local[2], s3a)
  4. aggregate    group-by totals (Spark)
run side by side through Locus (the S3 gateway, ASYNC_THROUGH writes, a MinIO mount
behind it), through Locus with the Spark stages on its Hadoop connector (locus://; the
PyArrow stages still through the gateway), directly against the same MinIO, and (unless --no-floor) on a tmpfs directory
with no storage service at all (PyArrow's local filesystem, Spark file://): the compute
floor, the time the stages' own CPU work takes on this machine. Two more floors take it
apart (--systems floor-persist,floor-fsspec): floor-persist is the floor while every output
is written to MinIO as it completes, with no Locus (what making the outputs durable costs
the same 2 cores), and floor-fsspec the floor with the PyArrow stages through PyArrow's
bridge to Python filesystems (what reaching any fsspec filesystem costs). RUNS times each (after
--warmup untimed runs),
interleaved, each after the machine settled (settle: no run pays for the clean-up of the
one before it). Prints per-stage and total medians, the min-max spread, the ratio
direct/Locus and the ratio direct/floor (the most any storage layer could gain over direct
here), and writes bench/results/pipeline.md and pipeline.json.

Driven by bench/pipeline, which starts MinIO and Locus; see there for the flags.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "e2e"))

STAGES = ["generate", "to_parquet", "transform", "aggregate"]
PARTS = 8


def s3fs(endpoint: str, key: str, secret: str):
    """PyArrow's filesystem for a system: S3 at `endpoint`, or the local filesystem when
    there is no endpoint (the floor: `base` is then a tmpfs directory)."""
    from pyarrow import fs

    if not endpoint:
        return fs.LocalFileSystem()
    scheme, host = endpoint.split("://", 1)
    return fs.S3FileSystem(access_key=key, secret_key=secret, endpoint_override=host, scheme=scheme,
                           region="us-east-1", allow_bucket_creation=True)


def generate(f, base: str, size: int):
    """CSV part files of about size/PARTS bytes each: id, ts, category, value, qty, note."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.csv as pcsv

    rows_per_part = max(1000, size // PARTS // 72)  # ~72 bytes per CSV row
    rng = np.random.default_rng(7)
    cats = np.array([f"cat{i:02d}" for i in range(40)])
    if f.type_name == "local":  # the floor: S3 has no directories to make
        f.create_dir(f"{base}/csv", recursive=True)
    for p in range(PARTS):
        with f.open_output_stream(f"{base}/csv/part-{p}.csv") as out:
            w = None
            done = 0
            while done < rows_per_part:
                n = min(500_000, rows_per_part - done)
                ids = np.arange(p * rows_per_part + done, p * rows_per_part + done + n, dtype=np.int64)
                t = pa.table({
                    "id": ids,
                    "ts": (1_700_000_000 + rng.integers(0, 30 * 86400, n)).astype(np.int64),
                    "category": cats[rng.integers(0, len(cats), n)],
                    "value": rng.random(n) * 1000,
                    "qty": rng.integers(1, 100, n),
                    "note": np.char.add("n", rng.integers(0, 1_000_000, n).astype(str)),
                })
                if w is None:
                    w = pcsv.CSVWriter(out, t.schema)
                w.write_table(t)
                done += n
            w.close()


def to_parquet(f, base: str):
    import pyarrow.dataset as ds

    src = ds.dataset(f"{base}/csv", filesystem=f, format="csv")
    ds.write_dataset(src, f"{base}/parquet", filesystem=f, format="parquet",
                     max_rows_per_file=4_000_000, max_rows_per_group=1_000_000, existing_data_behavior="overwrite_or_ignore")


class Uploader:
    """The floor with persistence (the `floor-persist` system): while the stages run on
    tmpfs, every output file is written to MinIO as soon as it is complete, the way Locus
    persists ASYNC_THROUGH writes, with no Locus: through OpenDAL (the library Locus's
    persists use, with their 16 MiB parts, 4 at once, unsigned payloads), 4 files at once
    (Locus's `persist_concurrency`). It measures what getting the pipeline's outputs into
    MinIO costs this 2-core machine (MinIO's CPU above all) while the stages run.

    A file is complete once nothing in this process holds it open (the PyArrow stages
    write here), it is not under a `_temporary` directory (Spark's committer renames
    finished files out of those) and its size and mtime held for one poll. Local-only
    files (Spark's `.crc` checksums) are skipped."""

    POLL = 0.2

    def __init__(self, root: str, op):
        from concurrent.futures import ThreadPoolExecutor

        self.root = Path(root)
        self.op = op  # an OpenDAL operator: the MinIO bucket (s3_operator), a directory in tests
        self.pool = ThreadPoolExecutor(4)
        self.last: dict[Path, tuple] = {}
        self.sent: set[Path] = set()
        self.futures = []
        self.stopping = threading.Event()
        self.poller = threading.Thread(target=self._poll, daemon=True)
        self.poller.start()

    def key(self, p: Path) -> str:
        return str(p.relative_to(self.root.parent))

    def _upload(self, p: Path) -> int:
        data = p.read_bytes()
        self.op.write(self.key(p), data, chunk=16 << 20, concurrent=4)
        return len(data)

    def _scan(self, final: bool):
        open_here = set()
        for fd in os.listdir("/proc/self/fd"):
            try:
                open_here.add(os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:
                pass
        for d, dirs, files in os.walk(self.root):
            dirs[:] = [x for x in dirs if x != "_temporary" and not x.startswith(".")]
            for name in files:
                p = Path(d) / name
                if name.startswith(".") or p in self.sent or str(p) in open_here:
                    continue
                try:
                    st = p.stat()
                except FileNotFoundError:
                    continue
                sig = (st.st_size, st.st_mtime_ns)
                if final or self.last.get(p) == sig:
                    self.sent.add(p)
                    self.futures.append(self.pool.submit(self._upload, p))
                else:
                    self.last[p] = sig

    def _poll(self):
        while not self.stopping.wait(self.POLL):
            self._scan(final=False)

    def finish(self) -> dict:
        """After the stages: send what is left, wait for every upload; the bytes and files sent."""
        self.stopping.set()
        self.poller.join()
        self._scan(final=True)
        n = sum(f.result() for f in self.futures)
        self.pool.shutdown()
        return {"persisted_bytes": n, "persists_done": len(self.futures), "persists_skipped": 0}

    def remove(self):
        self.op.remove_all(self.key(self.root) + "/")


def s3_operator(endpoint: str, bucket: str, key: str, secret: str):
    """OpenDAL's S3 operator on a MinIO bucket (the floor-persist system's uploads)."""
    import opendal  # tests/e2e/requirements.txt (and bench/pipeline) install it

    return opendal.Operator("s3", bucket=bucket, endpoint=endpoint, region="us-east-1", access_key_id=key,
                            secret_access_key=secret)


def pyarrow_fs(system: dict):
    """The PyArrow filesystem a system's PyArrow stages use: S3 (or the floor's local
    directory), or locus:// through the Python client (`locus_master`), as PyArrow takes
    any fsspec filesystem, with ASYNC_THROUGH writes like the gateway's."""
    if system.get("locus_master"):
        from locus.fsspec import LocusFileSystem
        from pyarrow.fs import FSSpecHandler, PyFileSystem

        return PyFileSystem(FSSpecHandler(LocusFileSystem(master=system["locus_master"],
                                                          write_type=system.get("write_type", "ASYNC_THROUGH"),
                                                          skip_instance_cache=True)))
    if system.get("fsspec_local"):  # the floor through PyArrow's bridge to any fsspec filesystem
        from fsspec.implementations.local import LocalFileSystem
        from pyarrow.fs import FSSpecHandler, PyFileSystem

        return PyFileSystem(FSSpecHandler(LocalFileSystem(auto_mkdir=True)))
    return s3fs(system["endpoint"], system["key"], system["secret"])


def run_pyarrow_stages(f, base, size) -> dict:
    out = {}
    t = time.monotonic()
    generate(f, base, size)
    out["generate"] = time.monotonic() - t
    t = time.monotonic()
    to_parquet(f, base)
    out["to_parquet"] = time.monotonic() - t
    return out


def run_spark_stages(endpoint, key, secret, base, prefix="") -> dict:
    """The Spark stages over `prefix + base`: s3a:// (or file:// with no endpoint) unless
    `prefix` names another file system (locus://MASTER/)."""
    from sparkutil import find_jars, spark_session

    tools = os.environ.get("LOCUS_TOOLS_DIR", str(Path.home() / ".cache/locus-tools"))
    jars = os.environ.get("SPARK_S3A_JARS") or find_jars(tools)
    if not jars:
        raise SystemExit("s3a jars missing: run scripts/install-spark python3 TOOLS_DIR first")
    extra = {"spark.sql.shuffle.partitions": "8", "spark.driver.memory": "4g"}
    if os.environ.get("LOCUS_PIPELINE_EVENT_LOG"):  # a directory: Spark's event logs, for a look at its tasks
        extra.update({"spark.eventLog.enabled": "true", "spark.eventLog.dir": os.environ["LOCUS_PIPELINE_EVENT_LOG"]})
    spark = spark_session(endpoint, key, secret, jars, app="locus-pipeline-bench", extra=extra,
                          class_archive_dir=Path(tools) / "cds" if os.environ.get("LOCUS_PIPELINE_CDS") else None)
    from pyspark import SparkContext
    from pyspark.sql import functions as F

    jvm = getattr(SparkContext._gateway, "proc", None)  # pyspark's Popen of the driver JVM
    out = {}
    try:
        s3a = (prefix or ("s3a://" if endpoint else "file://")) + base
        t = time.monotonic()
        df = spark.read.parquet(f"{s3a}/parquet")
        df = (df.withColumn("amount", F.col("value") * F.col("qty"))
              .withColumn("day", F.to_date(F.from_unixtime(F.col("ts"))))
              .withColumn("category", F.upper(F.col("category")))
              .drop("note"))
        df.write.mode("overwrite").parquet(f"{s3a}/transformed")
        out["transform"] = time.monotonic() - t
        t = time.monotonic()
        agg = (spark.read.parquet(f"{s3a}/transformed").groupBy("category", "day")
               .agg(F.sum("amount").alias("total"), F.avg("value").alias("avg_value"), F.count("*").alias("n")))
        agg.write.mode("overwrite").parquet(f"{s3a}/aggregated")
        rows = spark.read.parquet(f"{s3a}/aggregated").count()
        out["aggregate"] = time.monotonic() - t
        out["aggregate_rows"] = rows
    finally:
        spark.stop()
        # The JVM ends when its stdin closes. Waiting for it here puts its CPU time into this
        # process's children's, which the runner's own count (cpu_now) then includes.
        if jvm is not None:
            jvm.stdin.close()
            try:
                jvm.wait(timeout=120)
            except subprocess.TimeoutExpired:  # its CPU is lost then; the run goes on
                jvm.kill()
                jvm.wait()
    return out


def wait_persisted(locus_bin: str):
    """Untimed: wait until Locus has persisted everything (each run starts from the same state)."""
    while True:
        rep = json.loads(subprocess.run([locus_bin, "report", "--json"], capture_output=True, text=True,
                                        check=True).stdout)
        if rep["persist_backlog"]["queued_ops"] == 0:
            return
        time.sleep(0.5)


def machine_cpu() -> dict:
    """The whole machine's CPU time so far, in core-seconds (/proc/stat's first line): `busy`
    (user, nice, system, irq, softirq), `iowait`, and `steal` (time the hypervisor ran
    something else while this machine wanted a core)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    t = os.sysconf("SC_CLK_TCK")
    user, nice, system, _idle, iowait, irq, softirq, steal = v
    return {"busy": (user + nice + system + irq + softirq) / t, "iowait": iowait / t, "steal": steal / t}


def settle(locus_bin: str = "", drop_caches: bool = False, sync: bool = True, quiet: float = 0.15,
           window: float = 1.0, limit: float = 60.0) -> float:
    """Untimed, before every run: let the runs before it end their after-effects, so that no
    system pays for another's clean-up. Locus's queue is empty (its persists, and the UFS
    deletes of the last clean-up), the dirty pages are written back (MinIO keeps its data on
    disk), with `drop_caches` the clean page cache is dropped (root only: the run before
    leaves GiBs of MinIO's files cached, and the next run that needs the memory pays for
    reclaiming them), and the whole machine is idle (under `quiet` cores busy over `window`
    s: MinIO's own background deletes, the kernel's writeback), waited for at most `limit` s
    (after the steps before it). The seconds it all took."""
    t = time.monotonic()
    if locus_bin:
        wait_persisted(locus_bin)
    if sync:
        os.sync()
    if drop_caches:
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
    idle_from = time.monotonic()
    while time.monotonic() - idle_from < limit:
        c0 = machine_cpu()["busy"]
        time.sleep(window)
        if (machine_cpu()["busy"] - c0) / window < quiet:
            break
    return time.monotonic() - t


def metrics_text(url: str, headers: dict | None = None) -> str:
    """The Prometheus text at `url`."""
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as r:
        return r.read().decode()


def persist_counters(metrics_url: str) -> dict:
    """Locus's persist counters from its Prometheus text: bytes written to the UFS, and
    persists done and skipped (the file was gone by its turn)."""
    out = {"persisted_bytes": 0, "persists_done": 0, "persists_skipped": 0}
    if not metrics_url:
        return out
    # The web port needs the cluster's client token (bench/pipeline exports its file).
    headers = {}
    token_file = os.environ.get("LOCUS_SECURITY__TOKEN_FILE")
    if token_file and os.path.exists(token_file):
        headers["Authorization"] = "Bearer " + open(token_file).read().strip()
    for line in metrics_text(metrics_url, headers).splitlines():
        if line.startswith("locus_persisted_bytes_total "):
            out["persisted_bytes"] = int(float(line.split()[-1]))
        elif line.startswith('locus_persist_ops_total{kind="PERSIST",result="done"}'):
            out["persists_done"] = int(float(line.split()[-1]))
        elif line.startswith('locus_persist_ops_total{kind="PERSIST",result="skipped"}'):
            out["persists_skipped"] = int(float(line.split()[-1]))
    return out


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system, every thread) process `pid` has used; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_now(pids: dict) -> dict:
    """CPU seconds used so far: `stages` (this process and its waited-for children, the
    Spark stages' JVMs) and each named process of `pids` (MinIO, toxiproxy, Locus)."""
    t = os.times()
    return {"stages": t.user + t.system + t.children_user + t.children_system,
            **{n: process_cpu(p) for n, p in pids.items()}}


def minio_requests(endpoint: str) -> dict:
    """MinIO's S3 requests so far, by API (`minio_s3_requests_total`; netstage.py opens
    its MinIO's metrics); empty without an endpoint or when they cannot be read."""
    if not endpoint:
        return {}
    out: dict = {}
    try:
        text = metrics_text(f"{endpoint}/minio/v2/metrics/node")
    except OSError:
        return {}
    for line in text.splitlines():
        if line.startswith("minio_s3_requests_total{"):
            api = line.split('api="', 1)[1].split('"', 1)[0]
            out[api] = out.get(api, 0) + int(float(line.rsplit(" ", 1)[1]))
    return out


def mem_free() -> float:
    """MemFree from /proc/meminfo, in GiB."""
    with open("/proc/meminfo") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("MemFree:")) / (1 << 20)


class MemWatch:
    """The lowest free memory (mem_free) seen while it runs, sampled every `every` s: a run
    that ran the machine short of memory paid for reclaiming it."""

    def __init__(self, every: float = 0.5):
        self.lowest = mem_free()
        self.every = every
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self):
        while not self.stopping.wait(self.every):
            self.lowest = min(self.lowest, mem_free())

    def stop(self) -> float:
        self.stopping.set()
        self.thread.join()
        return min(self.lowest, mem_free())


def one_run(system: dict, base: str, size: int, locus_bin: str = "", metrics_url: str = "",
            cpu_pids: dict | None = None, minio_endpoint: str = "", drop_caches: bool = False) -> dict:
    is_locus = system["name"].startswith("locus")
    cpu_pids = cpu_pids or {}
    settled = settle(locus_bin, drop_caches)
    free_at_start = mem_free()
    watch = MemWatch()
    before = persist_counters(metrics_url) if is_locus else {}
    cpu0 = cpu_now(cpu_pids)
    mach0 = machine_cpu()
    req0 = minio_requests(minio_endpoint)
    # Paths through the Python client are absolute (`/lake/...`, as a local file
    # system's): PyArrow's dataset discovery wants listed paths under its base as given.
    pa_base = "/" + base if system.get("locus_master") else base
    up = Uploader(base, s3_operator(**system["persist_to"])) if system.get("persist_to") else None
    r = run_pyarrow_stages(pyarrow_fs(system), pa_base, size)
    # Spark in its own process: one SparkSession (and its s3a settings) per JVM.
    # The Hadoop connector takes its write type from the client config (LOCUS_CLIENT__WRITE_TYPE).
    env = {**os.environ, "LOCUS_CLIENT__WRITE_TYPE": system["write_type"]} if system.get("write_type") else None
    p = subprocess.run([sys.executable, __file__, "spark", system["endpoint"], system["key"], system["secret"], base,
                        system.get("spark_prefix", "")], capture_output=True, text=True, env=env,
                       timeout=1800)  # a JVM stuck at its exit fails the run, not hangs it
    if p.returncode != 0:
        raise SystemExit(f"spark stages failed on {system['name']}:\n{p.stderr[-4000:]}")
    r.update(json.loads(p.stdout.strip().splitlines()[-1]))
    r["total"] = sum(r[s] for s in STAGES)
    r["mem_free_lowest"] = round(watch.stop(), 2)
    # The CPU the timed stages cost each process (the persists' drain below not counted).
    r["cpu"] = {k: round(v - cpu0[k], 2) for k, v in cpu_now(cpu_pids).items()}
    # The whole machine's meanwhile: `other` is what no process above used (kernel threads:
    # reclaim, compaction, writeback; anything else running).
    mach = {k: round(v - mach0[k], 2) for k, v in machine_cpu().items()}
    r["machine"] = {**mach, "other": round(mach["busy"] - sum(r["cpu"].values()), 2)}
    # The S3 requests MinIO served meanwhile (the run's own; runs do not overlap).
    req1 = minio_requests(minio_endpoint)
    if req0 and req1:
        r["minio_requests"] = {k: v - req0.get(k, 0) for k, v in req1.items() if v - req0.get(k, 0)}
    # Untimed: let the persists land, then free the space for the next run (4 GiB or so
    # per run and system).
    if is_locus and locus_bin:
        t = time.monotonic()
        wait_persisted(locus_bin)
        r["persist_drain_after"] = time.monotonic() - t
    if is_locus and metrics_url:
        after = persist_counters(metrics_url)
        r.update({k: after[k] - before[k] for k in after})
    if up:
        t = time.monotonic()
        r.update(up.finish())
        r["persist_drain_after"] = time.monotonic() - t
        up.remove()
    pyarrow_fs(system).delete_dir(pa_base)
    r["settle_before"] = settled
    r["mem_free_at_start"] = round(free_at_start, 2)
    return r


def spread(v):
    return max(v) - min(v)


LOCUS_SYSTEMS = {"locus": "Locus", "locus-fs": "Locus, Spark on locus://",
                 "locus-py": "Locus, all on locus://", "locus-py-cache": "Locus, all on locus://, MUST_CACHE"}


FLOORS = {"floor": "floor", "floor-persist": "floor + persistence", "floor-fsspec": "floor through fsspec"}
FLOORS_WHAT = {
    "floor-persist": "the floor while every output file is written to MinIO as it is complete, with no Locus "
                     "(OpenDAL, as Locus's persists: 16 MiB parts, 4 at once, 4 files at once), so the outputs "
                     "end durable in MinIO as Locus's ASYNC_THROUGH writes do.",
    "floor-fsspec": "the floor with the PyArrow stages through PyArrow's bridge to Python filesystems "
                    "(`PyFileSystem(FSSpecHandler(...))`, fsspec's LocalFileSystem), the bridge every fsspec "
                    "filesystem, locus:// too, is reached through.",
}


def markdown_table(med: dict, spr: dict, size: int, runs: int, warmup: int, profile: str) -> list[str]:
    """The report's table and goal lines: per stage, direct, each Locus system and the
    floor (where measured), medians, spreads and ratios."""
    locus = [n for n in LOCUS_SYSTEMS if n in med]
    lines = [
        f"### Pipeline benchmark: {size / (1 << 30):.2f} GiB of CSV, 4 stages, {runs} runs each "
        f"(after {warmup} untimed warm-up run{'s' if warmup != 1 else ''} each), network profile `{profile}`",
        "",
        f"Machine: {os.cpu_count()} cores, {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / (1 << 30):.0f} GiB, "
        f"kernel {platform.release()}. Direct = every stage against MinIO; Locus = every stage through the "
        "Locus S3 gateway (ASYNC_THROUGH writes) over the same MinIO"
        + ("; Locus, Spark on locus:// = the PyArrow stages through the gateway, the Spark stages through "
           "Locus's Hadoop connector (ASYNC_THROUGH)" if "locus-fs" in med else "")
        + ("; Locus, all on locus:// = the PyArrow stages through Locus's Python client (fsspec, "
           "ASYNC_THROUGH) and the Spark stages through its Hadoop connector" if "locus-py" in med else "")
        + ("; Locus, all on locus://, MUST_CACHE = the same with MUST_CACHE writes (nothing persisted: the "
           "same work as the floor)" if "locus-py-cache" in med else "")
        + ("; floor = every stage on a tmpfs directory, no storage service (PyArrow's local filesystem, "
           "Spark file://)." if "floor" in med else "."),
        "",
    ]
    head = "| stage | direct median (s) | direct spread |"
    for n in locus:
        head += f" {LOCUS_SYSTEMS[n]} median (s) | spread | direct / {LOCUS_SYSTEMS[n]} |"
    floors = [n for n in FLOORS if n in med]
    for n in floors:
        head += f" {FLOORS[n]} median (s) | direct / {FLOORS[n]} |"
    lines += [head, "|---|" + "---:|" * (head.count("|") - 2)]
    for k in STAGES + ["total"]:
        d = med["direct"][k]
        row = f"| {k} | {d:.1f} | {spr['direct'][k]:.1f} |"
        for n in locus:
            row += f" {med[n][k]:.1f} | {spr[n][k]:.1f} | **{d / med[n][k]:.2f}×** |"
        for n in floors:
            row += f" {med[n][k]:.1f} | {d / med[n][k]:.2f}× |"
        lines.append(row)
    lines.append("")
    for n in locus:
        tl = med[n]["total"]
        lines.append(f"{LOCUS_SYSTEMS[n]} total spread: {spr[n]['total']:.1f} s ({100 * spr[n]['total'] / tl:.1f}% of "
                     "its median).")
    if "floor" in med:
        got = "; ".join(f"{LOCUS_SYSTEMS[n]} {med['direct']['total'] / med[n]['total']:.2f}x, spread "
                        f"{100 * spr[n]['total'] / med[n]['total']:.1f}%" for n in locus)
        lines += ["", f"Goal (under `lan`; this run: `{profile}`): direct / Locus >= 5x, with a spread of at most 5%. "
                  f"Measured: {got}. With no storage service at all the pipeline takes {med['floor']['total']:.1f} s "
                  f"here, so no storage layer can make it more than {med['direct']['total'] / med['floor']['total']:.2f}x "
                  "faster than direct on this machine: the stages' own CPU work bounds it."]
        d, fl = med["direct"]["total"], med["floor"]["total"]
        if d > fl:
            got = "; ".join(f"{LOCUS_SYSTEMS[n]} {100 * (d - med[n]['total']) / (d - fl):.0f}%" for n in locus)
            lines += ["", "Share of the attainable gain captured, (direct - Locus) / (direct - floor); goal for "
                      f"Locus, all on locus://: at least 80%. Measured: {got}."]
        for n in (n for n in floors if n != "floor"):
            f2 = med[n]["total"]
            lines += ["", f"{FLOORS[n]}: {FLOORS_WHAT[n]} It takes {f2:.1f} s, "
                      f"{f2 - fl:+.1f} s on the floor: the gain left to any storage layer that does this work "
                      f"is {100 * (d - f2) / (d - fl):.0f}% of the floor's."
                      + (" Share of that gain captured, (direct - Locus) / (direct - (" + FLOORS[n] + ")): "
                         + "; ".join(f"{LOCUS_SYSTEMS[m]} {100 * (d - med[m]['total']) / (d - f2):.0f}%" for m in locus)
                         + "." if d > f2 else "")]
    return lines


def median_table(runs: dict, key: str, title: str, fmt: str, first: str = "", total: bool = True) -> list[str]:
    """A report table of the per-run counts under `key` (a dict per run): per system, the
    median of each count over its timed runs and (with `total`) of their sum, as `fmt`;
    columns in name order, `first` first."""
    names = sorted({k for rs in runs.values() for r in rs for k in r.get(key, {})}, key=lambda k: (k != first, k))
    if not names:
        return []
    label = {**LOCUS_SYSTEMS, **FLOORS, "direct": "direct"}
    lines = ["", title, "", "| system | " + " | ".join(names) + (" | all |" if total else " |"),
             "|---|" + "---:|" * (len(names) + total)]
    for n, rs in runs.items():
        if not rs:
            continue
        med = [statistics.median(r.get(key, {}).get(k, 0) for r in rs) for k in names]
        all_ = statistics.median(sum(r.get(key, {}).values()) for r in rs)
        lines.append(f"| {label.get(n, n)} | " + " | ".join(format(v, fmt) for v in med)
                     + (f" | {all_:{fmt}} |" if total else " |"))
    return lines


def cpu_lines(runs: dict) -> list[str]:
    """The report's CPU table: per system, the median CPU seconds of each process over its
    timed runs' stages."""
    return median_table(runs, "cpu", "CPU seconds per run during the stages (medians; `stages` = the PyArrow "
                        "stages' process and the Spark stages' JVMs, their start and stop included; every "
                        f"process over the same span; the machine has {os.cpu_count()} cores):",
                        ".1f", first="stages")


def machine_lines(runs: dict) -> list[str]:
    """The report's table of the whole machine's CPU per run (medians; no sum: `other` is
    part of `busy`)."""
    return median_table(runs, "machine", "The whole machine's CPU seconds per run during the stages (medians; "
                         "`busy` = every process and the kernel, `other` = busy less the processes above: "
                         "kernel threads and anything else; `steal` = time the hypervisor kept a core from "
                         "this machine):", ".1f", first="busy", total=False)


def request_lines(runs: dict) -> list[str]:
    """The report's table of MinIO's requests during the stages: per system, the median
    count of each S3 API over its timed runs."""
    return median_table(runs, "minio_requests", "S3 requests MinIO served per run during the stages (medians; "
                        "a floor's are none, the uploader's are those of floor + persistence):", "g")


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "spark":
        endpoint, key, secret, base, prefix = sys.argv[2:7]
        print(json.dumps(run_spark_stages(endpoint, key, secret, base, prefix)))
        return
    ap = argparse.ArgumentParser(description="The pipeline benchmark's runner (bench/pipeline starts MinIO and "
                                 "Locus and passes the endpoints).")
    ap.add_argument("--size", type=int, default=2 << 30, help="bytes of CSV the generate stage writes (default 2 GiB)")
    ap.add_argument("--runs", type=int, default=3, help="timed runs per system, interleaved (default 3)")
    ap.add_argument("--locus-endpoint", required=True, help="Locus's S3 gateway URL")
    ap.add_argument("--locus-bucket", required=True, help="the gateway bucket (the Locus mount) to write under")
    ap.add_argument("--minio-endpoint", required=True, help="MinIO's URL (the direct system and the UFS)")
    ap.add_argument("--minio-bucket", required=True, help="the MinIO bucket the direct system writes to")
    ap.add_argument("--profile", default="none", help="the network profile's name, for the report (none, lan, cloud)")
    ap.add_argument("--locus-bin", default="", help="locus binary, to report the persist backlog at the end")
    ap.add_argument("--locus-master", default="", help="the master's host:port, for the Spark stages on locus:// "
                    "(the locus-fs system; LOCUS_HADOOP_JAR and LOCUS_HADOOP_LIB name the connector)")
    ap.add_argument("--locus-metrics", default="", help="Locus's /metrics URL, to count the bytes persisted per run")
    ap.add_argument("--out", default=str(HERE / "results" / "pipeline.md"),
                    help="the Markdown report; its .json sits beside it")
    ap.add_argument("--floor", action=argparse.BooleanOptionalAction, default=True,
                    help="also run the stages on a tmpfs directory (no storage service): the compute floor")
    ap.add_argument("--warmup", type=int, default=1,
                    help="untimed runs per system before the timed ones (default 1: the first run after "
                         "start-up, slower on every system here, is not counted)")
    ap.add_argument("--systems", default="direct,locus,locus-fs,locus-py,floor",
                    help="comma-separated subset of direct, locus, locus-fs, locus-py, locus-py-cache (locus-py "
                         "with MUST_CACHE writes), floor, floor-persist, "
                         "floor-fsspec to run (direct and one Locus system are needed for the ratio table; "
                         "locus-fs, locus-py and locus-py-cache need --locus-master; floor-persist writes to "
                         "--floor-persist-bucket on MinIO)")
    ap.add_argument("--floor-persist-bucket", default="floor-persist",
                    help="the MinIO bucket the floor-persist system writes its outputs to (bench/pipeline "
                         "makes `floor-persist`)")
    ap.add_argument("--cpu-pids", default="",
                    help="NAME=PID,...: processes whose CPU seconds during each run's stages the report "
                         "gives beside the stages' own (bench/pipeline names MinIO, toxiproxy and Locus)")
    ap.add_argument("--spark-cds", action=argparse.BooleanOptionalAction, default=True,
                    help="the Spark stages' driver JVMs share a class-data archive (JDK AppCDS, in "
                         "LOCUS_TOOLS_DIR/cds; the warm-up run writes it), on every system alike")
    ap.add_argument("--drop-caches", action=argparse.BooleanOptionalAction, default=os.geteuid() == 0,
                    help="before every run, drop the clean page cache (/proc/sys/vm/drop_caches; needs root; "
                         "default: on as root) so that every run starts with the same free memory")
    a = ap.parse_args()
    if a.drop_caches and os.geteuid() != 0:
        ap.error("--drop-caches needs root")
    try:
        cpu_pids = {n: int(p) for n, p in (kv.split("=", 1) for kv in a.cpu_pids.split(",") if kv)}
    except ValueError:
        ap.error(f"--cpu-pids: {a.cpu_pids!r} is not NAME=PID,...")
    if a.spark_cds:  # read by the Spark stages' processes (run_spark_stages)
        os.environ["LOCUS_PIPELINE_CDS"] = "1"
    systems = [
        {"name": "direct", "endpoint": a.minio_endpoint, "key": "minioadmin", "secret": "minioadmin",
         "bucket": a.minio_bucket},
        {"name": "locus", "endpoint": a.locus_endpoint, "key": "locusadmin", "secret": "locusadmin",
         "bucket": a.locus_bucket},
    ]
    if a.locus_master:
        systems.append({"name": "locus-fs", "endpoint": a.locus_endpoint, "key": "locusadmin",
                        "secret": "locusadmin", "bucket": a.locus_bucket,
                        "spark_prefix": f"locus://{a.locus_master}/"})
        systems.append({"name": "locus-py", "endpoint": a.locus_endpoint, "key": "locusadmin",
                        "secret": "locusadmin", "bucket": a.locus_bucket, "locus_master": a.locus_master,
                        "spark_prefix": f"locus://{a.locus_master}/"})
        systems.append({**systems[-1], "name": "locus-py-cache", "write_type": "MUST_CACHE"})
    floor_dir = Path(f"/dev/shm/locus-pipeline-floor-{os.getpid()}")
    if a.floor:
        systems.append({"name": "floor", "endpoint": "", "key": "", "secret": "", "bucket": str(floor_dir)})
        systems.append({"name": "floor-persist", "endpoint": "", "key": "", "secret": "",
                        "bucket": f"{floor_dir}/persist", "persist_to": {
                            "endpoint": a.minio_endpoint, "bucket": a.floor_persist_bucket, "key": "minioadmin",
                            "secret": "minioadmin"}})
        systems.append({"name": "floor-fsspec", "endpoint": "", "key": "", "secret": "",
                        "bucket": f"{floor_dir}/fsspec", "fsspec_local": True})
    keep = {n.strip() for n in a.systems.split(",") if n.strip()}
    unknown = keep - {s["name"] for s in systems}
    if unknown or not keep:
        ap.error(f"--systems: {', '.join(sorted(unknown)) or 'nothing'} is not among "
                 f"{', '.join(s['name'] for s in systems)} (floor needs --floor, locus-fs, locus-py and locus-py-cache "
                 "--locus-master)")
    systems = [s for s in systems if s["name"] in keep]
    runs = {s["name"]: [] for s in systems}
    try:
        for i in range(a.warmup):
            for s in systems:
                r = one_run(s, f"{s['bucket']}/warmup{i}", a.size, a.locus_bin, drop_caches=a.drop_caches)
                print(f"warm-up {i + 1}/{a.warmup} {s['name']:>6} (not counted): total {r['total']:.1f}s", flush=True)
        for i in range(a.runs):
            for s in systems if i % 2 == 0 else reversed(systems):
                r = one_run(s, f"{s['bucket']}/run{i}", a.size, a.locus_bin, a.locus_metrics, cpu_pids,
                           a.minio_endpoint, a.drop_caches)
                runs[s["name"]].append(r)
                print(f"run {i + 1}/{a.runs} {s['name']:>6}: "
                      + ", ".join(f"{k} {r[k]:.1f}s" for k in STAGES + ["total"])
                      + f" (settled {r['settle_before']:.1f}s before, {r['mem_free_at_start']:.1f} GiB free)",
                      flush=True)
    finally:
        shutil.rmtree(floor_dir, ignore_errors=True)
    med = {n: {k: statistics.median(r[k] for r in rs) for k in STAGES + ["total"]} for n, rs in runs.items()}
    spr = {n: {k: spread([r[k] for r in rs]) for k in STAGES + ["total"]} for n, rs in runs.items()}
    if "direct" not in med or not set(LOCUS_SYSTEMS) & set(med):
        print(json.dumps({"median": med, "spread": spr}, indent=1))
        return
    lines = markdown_table(med, spr, a.size, a.runs, a.warmup, a.profile)
    if a.spark_cds:
        lines += ["", "The Spark stages' driver JVMs share a class-data archive (CDS) on every system."]
    # What each persisting system wrote to MinIO: Locus's persists, and the floor-persist
    # uploader (which reports the same counters).
    names = {**LOCUS_SYSTEMS, "floor-persist": FLOORS["floor-persist"]}
    for n in (n for n in names if n in runs):
        lr = runs[n]
        lines += ["", f"After each {names[n]} run, the persist backlog drained in "
                  + ", ".join(f"{r.get('persist_drain_after', 0):.1f}" for r in lr)
                  + " s more (not counted above; each run starts with an empty backlog)."]
        if all("persisted_bytes" in r for r in lr):  # Locus's only with --locus-metrics
            lines += ["", f"Bytes persisted to MinIO per {names[n]} run: "
                      + ", ".join(f"{r['persisted_bytes'] / (1 << 30):.2f} GiB" for r in lr)
                      + f" (files persisted: {', '.join(str(r['persists_done']) for r in lr)}; persists skipped "
                      f"because the file was deleted or replaced first: "
                      f"{', '.join(str(r['persists_skipped']) for r in lr)})."]
    lines += ["", "Before every run, untimed, the machine settled (Locus's queue empty, dirty pages written back, "
              + ("the clean page cache dropped, " if a.drop_caches else "")
              + "every core idle: no system pays for another's clean-up), in s: "
              + "; ".join(f"{n} " + ", ".join(f"{r['settle_before']:.1f}" for r in rs) for n, rs in runs.items())
              + ". Free memory at each run's start, in GiB: "
              + "; ".join(f"{n} " + ", ".join(f"{r['mem_free_at_start']:.1f}" for r in rs) for n, rs in runs.items())
              + ". The lowest free memory during each run, in GiB: "
              + "; ".join(f"{n} " + ", ".join(f"{r['mem_free_lowest']:.1f}" for r in rs) for n, rs in runs.items())
              + "."]
    lines += cpu_lines(runs) + machine_lines(runs) + request_lines(runs)
    if a.locus_bin:
        rep = json.loads(subprocess.run([a.locus_bin, "report", "--json"], capture_output=True, text=True,
                                        check=True).stdout)
        lines += ["", f"Locus persist backlog when the last run ended: {rep['persist_backlog']}"]
    md = "\n".join(lines) + "\n"
    print(md)
    Path(a.out).write_text(md)
    Path(a.out).with_suffix(".json").write_text(json.dumps({"runs": runs, "median": med, "spread": spr,
                                                            "size": a.size, "profile": a.profile,
                                                            "drop_caches": a.drop_caches}, indent=1))


if __name__ == "__main__":
    main()
