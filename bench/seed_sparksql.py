"""Seed study 004: Spark SQL on a multi-host cluster, and whether its reads are local.
TPC-H (tpchgen-cli, Parquet) in MinIO behind a shaped link (bench/netstage.py), read by a
Spark standalone cluster on simulated hosts (bench/cluster.py: each host its own network
and mount namespace with a Locus worker and a Spark worker; the master host runs the Locus
master, the Spark master and the driver). Every query runs `--runs` times in a row (the
study ran four), in one application per path:

  direct   Spark s3a straight on MinIO;
  locus    Spark on locus:// (the Hadoop connector; a first run fills the cache);
  gateway  Spark s3a through the Locus S3 gateway (on the master host);
  alluxio  Spark on alluxio:// (Alluxio 2.9.6 on the same hosts: its master on the
           master host, a worker with a MEM tier on each host, short-circuit on; started
           for this path only, its root the same bucket);
  local    the floor: Spark on a Parquet copy on each host's tmpfs (file://).

Reported per query and run: the time; for the Locus paths the bytes each host read by
source, from the workers' attribution (`locus report --by-host` before and after), and
the share short-circuit (for Alluxio, its cluster metrics: bytes read local, remote and
from the UFS); for every path Spark's task locality levels (its event log). Results agree
across paths (row counts and a checksum of each result). A chart (PNG) goes with the table.

Run it with `bench/run seed-sparksql [--quick] [--sf N] [--hosts 2|3] [--runs 4]`. --quick
(CI): 2 hosts, scale factor 0.01, queries 1, 3 and 6, 2 runs, and a check that the warm
locus:// runs read short-circuit. Writes seed-sparksql[-quick]-PROFILE.{md,json} under
bench/results (or --out-dir). Needs root (namespaces).

Internal subcommand (the driver of one path, in its own process; JSON lines on stdout):
  seed_sparksql.py driver ARGS_JSON
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import netstage  # noqa: E402
from cluster import SimCluster  # noqa: E402
from seed_linecount import code_version, machine_facts, parse_size  # noqa: E402
from tpch import QUERIES, TABLES  # noqa: E402

BUCKET, MOUNT = "tpch", "/tpch"
PATHS = ["direct", "locus", "gateway", "alluxio", "local"]
ALLUXIO_VERSION = "2.9.6"
GW_KEY = "locusadmin"


def log(msg: str):
    print(f"[seed-sparksql {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- the driver


def driver(args: dict):
    """One application: register the tables of `base`, run each query `runs` times,
    print a JSON line per run; between runs, the Locus attribution snapshot (`snap`)."""
    from pyspark.sql import SparkSession

    b = (SparkSession.builder.master(args["master"]).appName(f"seed-sparksql-{args['path']}")
         .config("spark.driver.host", args["ip"]).config("spark.driver.bindAddress", args["ip"])
         .config("spark.driver.extraClassPath", args["classpath"])
         .config("spark.executor.extraClassPath", args["classpath"])
         .config("spark.executor.memory", args["executor_memory"]).config("spark.executor.cores", "1")
         .config("spark.cores.max", str(args["hosts"])).config("spark.ui.enabled", "false")
         .config("spark.eventLog.enabled", "true").config("spark.eventLog.dir", args["event_dir"])
         .config("spark.eventLog.compress", "false")
         # Every executor registered before the first query, or its tasks would all
         # start on whichever came first.
         .config("spark.scheduler.minRegisteredResourcesRatio", "1.0")
         .config("spark.scheduler.maxRegisteredResourcesWaitingTime", "120s")
         .config("spark.sql.shuffle.partitions", str(2 * args["hosts"]))
         # One partition per Locus block (the block size), as HDFS splits by its blocks.
         .config("spark.sql.files.maxPartitionBytes", args["split"])
         .config("spark.sql.files.openCostInBytes", args["split"]))
    for k, v in args["conf"].items():
        b = b.config(k, v)
    s = b.getOrCreate()
    try:
        s.sparkContext.setLogLevel("WARN")
        for t in TABLES:
            s.read.parquet(f"{args['base']}/{t}").createOrReplaceTempView(t)
        for q in args["queries"]:
            for r in range(args["runs"]):
                s.sparkContext.setJobGroup(f"q{q}-r{r}", f"TPC-H Q{q} run {r + 1}")
                before = snapshot(args)
                t0 = time.perf_counter()
                rows = s.sql(QUERIES[q]).collect()
                secs = time.perf_counter() - t0
                after = snapshot(args, settle=True)
                print(json.dumps({"q": q, "run": r, "seconds": secs, "rows": len(rows), "checksum": checksum(rows),
                                  "reads": delta(before, after)}), flush=True)
    finally:
        s.stop()


def checksum(rows) -> float:
    """A checksum of a result that survives engines' float noise: the sum of its numbers
    rounded to 2 places, and the lengths of its strings."""
    total = 0.0
    for r in rows:
        for v in r:
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                total += round(float(v), 2)
            elif v is not None and not hasattr(v, "year"):
                total += len(str(v))
    return round(total, 1)


def snapshot(args: dict, settle: bool = False) -> dict:
    """Client reads by host, from the master (after the workers' next heartbeats when
    `settle`); for Alluxio, its cluster's read metrics under "(alluxio)"; {} for paths that
    go through neither."""
    if args.get("alluxio_metrics"):
        if settle:
            time.sleep(5)  # the clients' and workers' metrics heartbeats (1 s), and the master's sum
        return {"(alluxio)": alluxio_reads(args["alluxio_metrics"])}
    if not args.get("locus_bin"):
        return {}
    if settle:
        time.sleep(args["heartbeat_s"] * 2.5)
    r = subprocess.run([args["locus_bin"], "report", "--by-host", "--json"], capture_output=True, text=True)
    if r.returncode != 0:
        return {}
    return {h["host"]: h["bytes_by_source"] for h in json.loads(r.stdout)}


ALLUXIO_READS = {"short_circuit": "Cluster.BytesReadLocal", "worker": "Cluster.BytesReadRemote",
                 "ufs": "Cluster.BytesReadUfsAll"}


def alluxio_reads(web: str) -> dict:
    """Alluxio's cluster-wide read counters (its master's /metrics/json): bytes clients read
    short-circuit, bytes workers served over the network, bytes workers read from the UFS."""
    import urllib.request

    with urllib.request.urlopen(f"{web}/metrics/json/", timeout=10) as r:
        m = json.loads(r.read())
    flat: dict[str, float] = {}
    for group in m.values():
        if isinstance(group, dict):
            for k, v in group.items():
                if isinstance(v, dict):
                    flat[k] = v.get("value", v.get("count", 0)) or 0
    return {src: int(flat.get(name, 0)) for src, name in ALLUXIO_READS.items()}


def delta(before: dict, after: dict) -> dict:
    out = {}
    for host, by in after.items():
        d = {k: v - before.get(host, {}).get(k, 0) for k, v in by.items()}
        if any(d.values()):
            out[host] = d
    return out


# --------------------------------------------------------------------------- event logs


def task_locality(event_dir: Path) -> dict:
    """Per job group (query and run): Spark's count of tasks by locality level and their
    input bytes, from the application's event log."""
    groups: dict[int, str] = {}
    out: dict[str, dict] = {}
    # Spark 4 writes a directory per application (eventlog_v2_*, rolled files in it).
    for f in sorted(p for p in event_dir.rglob("*") if p.is_file()):
        for line in f.read_text(errors="replace").splitlines():
            try:
                e = json.loads(line)
            except ValueError:
                continue
            ev = e.get("Event")
            if ev == "SparkListenerJobStart":
                g = (e.get("Properties") or {}).get("spark.jobGroup.id")
                for sid in e.get("Stage IDs", []):
                    if g:
                        groups[sid] = g
            elif ev == "SparkListenerTaskEnd":
                g = groups.get(e.get("Stage ID"))
                if not g:
                    continue
                info = e.get("Task Info", {})
                m = out.setdefault(g, {"tasks": {}, "input_bytes": 0})
                loc = info.get("Locality", "?")
                m["tasks"][loc] = m["tasks"].get(loc, 0) + 1
                im = (e.get("Task Metrics") or {}).get("Input Metrics") or {}
                m["input_bytes"] += im.get("Bytes Read", 0)
    return out


# --------------------------------------------------------------------------- the run


def wait_port(addr: str, timeout: float = 60):
    import socket

    host, port = addr.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((host, int(port)), timeout=1):
            return
        time.sleep(0.2)
    raise SystemExit(f"seed-sparksql: nothing answers at {addr} after {timeout}s")


def tpchgen(python: str) -> str:
    exe = Path(python).parent / "tpchgen-cli"
    if not exe.exists():
        exe = Path(shutil.which("tpchgen-cli") or "")
    if not exe.is_file():
        subprocess.run([python, "-m", "pip", "install", "-q", "tpchgen-cli>=3"], check=True)
        exe = Path(python).parent / "tpchgen-cli"
        if not exe.exists():
            exe = Path(shutil.which("tpchgen-cli") or "")
    if not exe.is_file():
        raise SystemExit("seed-sparksql: tpchgen-cli is not installed (pip install tpchgen-cli)")
    return str(exe)


def run(a) -> dict:
    work = Path(tempfile.mkdtemp(prefix="locus-sparksql-", dir=a.work_dir or None))
    cleanups = []
    try:
        data = work / "tpch"
        parts = 2 * a.hosts
        log(f"TPC-H SF {a.sf} as Parquet, {parts} files per table")
        subprocess.run([tpchgen(a.python), "parquet", "-s", str(a.sf), "--parts", str(parts), "-o", str(data)],
                       check=True, capture_output=True)
        total = sum(f.stat().st_size for f in data.rglob("*.parquet"))
        sim = SimCluster(a.hosts, work / "sim", a.locus_bin, spark=True, mem=a.mem, block_size=a.block_size,
                         python=a.python, env={"LOCUS_WORKER__HEARTBEAT_INTERVAL": "500ms"},
                         executor_memory=a.executor_memory)
        cleanups.append(sim.stop)
        sim.start()
        log(f"{a.hosts} simulated hosts up: {[sim.ip(k) for k in range(1, a.hosts + 1)]}")
        state = work / "net.json"
        cleanups.append(lambda: netstage.down(state))
        st = netstage.up(a.profile, a.minio, work / "net", state, listen_host=sim.ip(0))
        endpoint = st["endpoint"]
        import boto3
        from botocore.config import Config

        s3 = boto3.client("s3", endpoint_url=st.get("direct_endpoint", endpoint), aws_access_key_id="minioadmin",
                          aws_secret_access_key="minioadmin", region_name="us-east-1",
                          config=Config(s3={"addressing_style": "path"}))
        s3.create_bucket(Bucket=BUCKET)
        for f in sorted(data.rglob("*.parquet")):
            s3.upload_file(str(f), BUCKET, str(f.relative_to(data)))
        log(f"{total / 1e6:.1f} MB uploaded to MinIO ({a.profile}) at {endpoint}")
        creds = work / "s3.options"
        creds.write_text("access_key_id=minioadmin\nsecret_access_key=minioadmin\n")
        creds.chmod(0o600)
        sim.locus_cmd(0, "fs", "mount", MOUNT, f"s3://{BUCKET}", "--option", f"endpoint={endpoint}",
                      "--option-file", str(creds), "--sync-interval", "1h")
        gw = f"{sim.ip(0)}:{netstage.free_port()}"
        if "gateway" in a.paths:
            sim.spawn(0, "gateway", [a.locus_bin, "--master", sim.master, "--token-file", str(sim.token_file),
                                     "gateway", "--address", gw], sim.client_env(0))
            wait_port(gw)
        if "local" in a.paths:
            # The floor's copies: each host's own on its tmpfs; the master host's (which
            # the driver lists) at the same path.
            host_copy = sim.dir / "host" / "tpch"
            for k in range(0, a.hosts + 1):
                sim.run(k, ["cp", "-r", str(data), str(host_copy)], env=dict(os.environ)).check_returncode()
        s3a_jars = os.environ.get("SPARK_S3A_JARS", "")
        classpath = ",".join(p for p in [a.hadoop_jar, s3a_jars] if p).replace(",", ":")
        s3a = lambda ep, key, secret: {  # noqa: E731
            "spark.hadoop.fs.s3a.endpoint": ep, "spark.hadoop.fs.s3a.path.style.access": "true",
            "spark.hadoop.fs.s3a.connection.ssl.enabled": "false", "spark.hadoop.fs.s3a.access.key": key,
            "spark.hadoop.fs.s3a.secret.key": secret, "spark.hadoop.fs.s3a.endpoint.region": "us-east-1",
            "spark.hadoop.fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"}
        bases = {
            "direct": (f"s3a://{BUCKET}", s3a(endpoint, "minioadmin", "minioadmin")),
            "locus": (f"locus://{MOUNT}", {"spark.hadoop.fs.locus.native.library": a.hadoop_lib,
                                            "spark.hadoop.fs.locus.master": sim.master,
                                            "spark.hadoop.fs.locus.token.file": str(sim.token_file)}),
            "gateway": (f"s3a://{BUCKET}", s3a(f"http://{gw}", GW_KEY, GW_KEY)),
            "local": (f"file://{sim.dir / 'host' / 'tpch'}", {}),
        }
        if "alluxio" in a.paths:
            r = subprocess.run([str(HERE / "alluxio" / "alluxio-up.sh"), a.alluxio_dir, "--resolve-only"],
                               capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit(f"seed-sparksql: Alluxio's jars did not resolve: {r.stderr[-3000:]}")
        results: dict = {"runs": [], "locality": {}}
        for path in a.paths:
            base, conf = bases.get(path, ("", {}))
            cp, metrics = classpath, ""
            if path == "alluxio":
                t = time.monotonic()
                al = sim.start_alluxio(Path(a.alluxio_dir), f"s3://{BUCKET}/", {
                    "s3a.accessKeyId": "minioadmin", "s3a.secretKey": "minioadmin",
                    "alluxio.underfs.s3.endpoint": endpoint, "alluxio.underfs.s3.endpoint.region": "us-east-1",
                    "alluxio.underfs.s3.disable.dns.buckets": "true", "alluxio.underfs.s3.inherit.acl": "false"},
                    a.mem, a.block_size)
                cleanups.append(sim.stop_alluxio)
                log(f"Alluxio {ALLUXIO_VERSION} up in {time.monotonic() - t:.0f} s: {al['url']}")
                base, cp, metrics = al["url"], f"{classpath}:{al['jar']}", al["metrics"]
                conf = {"spark.hadoop.fs.alluxio.impl": "alluxio.hadoop.FileSystem",
                        "spark.driver.extraJavaOptions": f"{al['java_options']} -Dalluxio.user.hostname={sim.ip(0)}",
                        "spark.executor.extraJavaOptions": al["java_options"]}
            events = work / "events" / path
            events.mkdir(parents=True)
            args = {"path": path, "master": sim.st["spark"], "ip": sim.ip(0), "classpath": cp,
                    "executor_memory": a.executor_memory, "hosts": a.hosts, "event_dir": f"file://{events}",
                    "split": str(parse_size(a.block_size)), "conf": conf, "base": base, "queries": a.queries, "runs": a.runs,
                    "locus_bin": a.locus_bin if path in ("locus", "gateway") else "", "heartbeat_s": 0.5,
                    "alluxio_metrics": metrics}
            log(f"{path}: {len(a.queries)} queries x {a.runs} runs")
            env = sim.client_env(0, {"SPARK_LOCAL_IP": sim.ip(0), "PYSPARK_PYTHON": a.python})
            p = subprocess.run([a.python, __file__, "driver", json.dumps(args)], capture_output=True, text=True,
                               env=env, timeout=a.timeout)
            if p.returncode != 0:
                raise SystemExit(f"the {path} driver failed:\n{p.stderr[-5000:]}\n{sim.log_tail(20)}")
            for line in p.stdout.splitlines():
                if line.startswith("{"):
                    results["runs"].append(dict(json.loads(line), path=path))
            results["locality"][path] = task_locality(events)
            if path == "alluxio":
                sim.stop_alluxio()
        return {"sf": a.sf, "hosts": a.hosts, "bytes": total, "queries": a.queries, "runs": a.runs,
                "paths": a.paths, "results": results, "block_size": a.block_size,
                "machine": machine_facts(a.profile), "code": code_version(),
                "host_ips": [sim.ip(k) for k in range(1, a.hosts + 1)]}
    finally:
        for fn in reversed(cleanups):
            with contextlib.suppress(BaseException):
                fn()
        shutil.rmtree(work, ignore_errors=True)


# --------------------------------------------------------------------------- the report


def median(v: list[float]) -> float:
    s = sorted(v)
    return s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2


def summarize(raw: dict) -> dict:
    """Per query: each path's times by run, the warm short-circuit share of the Locus
    paths, the checks that results agree, and the goals."""
    runs = raw["results"]["runs"]
    by = {(r["path"], r["q"], r["run"]): r for r in runs}
    hosts = set(raw["host_ips"])
    rows, agree = [], True
    for q in raw["queries"]:
        row = {"q": q}
        sums = {r["checksum"] for r in runs if r["q"] == q}
        counts = {r["rows"] for r in runs if r["q"] == q}
        row["agree"] = len(sums) == 1 and len(counts) == 1
        agree &= row["agree"]
        for p in raw["paths"]:
            row[p] = [by[(p, q, i)]["seconds"] for i in range(raw["runs"]) if (p, q, i) in by]
        # The share of bytes read short-circuit (the layer's own counts), of the warm runs
        # together and of each run, and the share of Spark's tasks that ran node- or
        # process-local (its event log).
        reads = lambda p, i: by[(p, q, i)]["reads"] if (p, q, i) in by else None  # noqa: E731
        row["warm_sc_share"] = _share(_sc_bytes("locus", reads("locus", i), hosts) for i in range(1, raw["runs"]))
        row["alluxio_warm_sc_share"] = _share(_sc_bytes("alluxio", reads("alluxio", i), hosts)
                                              for i in range(1, raw["runs"]))
        row["sc_by_run"], row["local_tasks_by_run"] = {}, {}
        for p in ("locus", "alluxio"):
            if p not in raw["paths"]:
                continue
            row["sc_by_run"][p] = [_share([_sc_bytes(p, reads(p, i), hosts)]) for i in range(raw["runs"])]
            loc = raw["results"]["locality"].get(p, {})
            row["local_tasks_by_run"][p] = [_local_share(loc.get(f"q{q}-r{i}")) for i in range(raw["runs"])]
        rows.append(row)
    first = lambda p: sum(r[p][0] for r in rows if r.get(p))  # noqa: E731
    warm = lambda p: sum(median(r[p][1:]) for r in rows if len(r.get(p, [])) > 1)  # noqa: E731
    goals = []
    if "locus" in raw["paths"] and "direct" in raw["paths"]:
        goals.append(("first run, locus:// / direct s3a", first("locus") / first("direct"), "<= 1.05"))
    shares = [r["warm_sc_share"] for r in rows if r["warm_sc_share"] is not None]
    if shares:
        goals.append(("warm bytes short-circuit on locus:// (least of the queries)", min(shares), ">= 0.95"))
    if "local" in raw["paths"] and "locus" in raw["paths"] and raw["runs"] > 1:
        goals.append(("warm locus:// / local copies (floor)", warm("locus") / warm("local"), "<= 1.15"))
    if "local" in raw["paths"] and "direct" in raw["paths"] and "locus" in raw["paths"] and raw["runs"] > 1:
        # The speed-up the floor allows, less the 1.15 the floor goal grants.
        allowed = warm("direct") / warm("local") / 1.15
        goals.append(("warm direct / locus:// (speed-up)", warm("direct") / warm("locus"), f">= {allowed:.3f}"))
    if "alluxio" in raw["paths"] and "locus" in raw["paths"]:
        both = [r for r in rows if r.get("alluxio") and r.get("locus")]
        goals.append(("first run, locus:// / alluxio:// (slowest query)",
                      max(r["locus"][0] / r["alluxio"][0] for r in both), "< 1"))
        if raw["runs"] > 1:
            goals.append(("warm, locus:// / alluxio:// (slowest query)",
                          max(median(r["locus"][1:]) / median(r["alluxio"][1:]) for r in both), "< 1"))
    return {"rows": rows, "agree": agree, "goals": [(n, v, b, met(v, b)) for n, v, b in goals]}


def _sc_bytes(path: str, reads: dict | None, hosts: set) -> tuple[int, int]:
    """(bytes read short-circuit, bytes read) of one run: Locus's attribution on the
    simulated hosts, or Alluxio's cluster metrics (short-circuit and from workers)."""
    if reads is None:
        return 0, 0
    if path == "alluxio":
        d = reads.get("(alluxio)", {})
        return d.get("short_circuit", 0), d.get("short_circuit", 0) + d.get("worker", 0)
    rows = [d for h, d in reads.items() if h in hosts]
    return sum(d.get("short_circuit", 0) for d in rows), sum(sum(d.values()) for d in rows)


def _share(pairs) -> float | None:
    sc = tot = 0
    for a, b in pairs:
        sc, tot = sc + a, tot + b
    return sc / tot if tot else None


def _local_share(group: dict | None) -> float | None:
    if not group or not group["tasks"]:
        return None
    t = group["tasks"]
    return (t.get("NODE_LOCAL", 0) + t.get("PROCESS_LOCAL", 0)) / sum(t.values())


def met(v: float, bound: str) -> bool:
    op, x = bound.split()
    return {"<=": v <= float(x), ">=": v >= float(x), "<": v < float(x)}[op]


def render(raw: dict, s: dict) -> str:
    m = raw["machine"]
    lines = [f"# seed-sparksql: TPC-H SF {raw['sf']} on {raw['hosts']} simulated hosts",
             "", f"Machine: {m['cores']} cores, {m['memory_gib']} GiB, {m['cpu']}; {m['profile_desc']}; code {raw['code']}.",
             f"Data: {raw['bytes'] / 1e6:.1f} MB of Parquet in MinIO; Locus block size {raw['block_size']}; "
             f"each query {raw['runs']} times in a row per path"
             + ("; Alluxio 2.9.6 on the same hosts (a worker per host, MEM tier, short-circuit on)."
                if "alluxio" in raw["paths"] else ". Alluxio 2.9.6: not in this run."),
             "", "| query | " + " | ".join(f"{p} (s, runs 1..{raw['runs']})" for p in raw["paths"])
             + " | warm short-circuit, locus:// | warm short-circuit, Alluxio | results agree |",
             "|---|" + "---:|" * len(raw["paths"]) + "---:|---:|---|"]
    pct = lambda v: "-" if v is None else f"{v * 100:.1f}%"  # noqa: E731
    for r in s["rows"]:
        lines.append(f"| Q{r['q']} | " + " | ".join(" / ".join(f"{t:.2f}" for t in r[p]) for p in raw["paths"])
                     + f" | {pct(r['warm_sc_share'])} | {pct(r.get('alluxio_warm_sc_share'))}"
                     + f" | {'yes' if r['agree'] else 'NO'} |")
    lines += ["", "| goal | measured | bound | |", "|---|---:|---|---|"]
    for name, v, bound, ok in s["goals"]:
        lines.append(f"| {name} | {v:.3f} | {bound} | {'met' if ok else '**miss**'} |")
    caching = [p for p in ("locus", "alluxio") if p in raw["paths"]]
    if caching:
        lines += ["", "Per run (1.." + str(raw["runs"]) + "): the bytes read short-circuit (Locus's attribution; "
                  "Alluxio's cluster metrics) and Spark's tasks that ran node- or process-local (its event log).",
                  "", "| query | " + " | ".join(f"{p}: short-circuit bytes | {p}: local tasks" for p in caching) + " |",
                  "|---|" + "---:|---:|" * len(caching)]
        runs = lambda v: " / ".join("-" if x is None else f"{x * 100:.0f}" for x in v)  # noqa: E731
        for r in s["rows"]:
            lines.append(f"| Q{r['q']} | " + " | ".join(
                f"{runs(r['sc_by_run'].get(p, []))} | {runs(r['local_tasks_by_run'].get(p, []))}" for p in caching) + " |")
    loc = raw["results"]["locality"]
    lines += ["", "Spark task locality (all runs): " + "; ".join(
        f"{p}: " + ", ".join(f"{k} {v}" for k, v in sorted(_sum_tasks(loc.get(p, {})).items()))
        for p in raw["paths"])]
    return "\n".join(lines) + "\n"


def chart(raw: dict, s: dict, png: Path):
    """Two panels of bars, one group per query and a bar per path: the first run's time,
    and the median of the warm runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, paths = s["rows"], raw["paths"]
    panels = [("first run", lambda r, p: r[p][0])]
    if raw["runs"] > 1:
        panels.append((f"warm (median of runs 2..{raw['runs']})", lambda r, p: median(r[p][1:])))
    fig, axes = plt.subplots(len(panels), 1, figsize=(max(8, 0.55 * len(rows) * len(paths) / 2.5), 3.2 * len(panels)),
                             squeeze=False)
    w = 0.8 / len(paths)
    for ax, (title, val) in zip(axes[:, 0], panels):
        for i, p in enumerate(paths):
            xs = [j + (i - (len(paths) - 1) / 2) * w for j in range(len(rows))]
            ax.bar(xs, [val(r, p) if r.get(p) else 0 for r in rows], w, label=p)
        ax.set_xticks(range(len(rows)), [f"Q{r['q']}" for r in rows])
        ax.set_ylabel("seconds")
        ax.set_title(f"TPC-H SF {raw['sf']}, {raw['hosts']} simulated hosts: {title}")
        ax.legend(ncol=len(paths), fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    plt.close(fig)


def _sum_tasks(groups: dict) -> dict:
    out: dict[str, int] = {}
    for g in groups.values():
        for k, v in g["tasks"].items():
            out[k] = out.get(k, 0) + v
    return out


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "driver":
        driver(json.loads(sys.argv[2]))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 hosts, SF 0.01, Q1/Q3/Q6, 2 runs (CI)")
    ap.add_argument("--sf", type=float, default=1.0, help="TPC-H scale factor (default 1)")
    ap.add_argument("--hosts", type=int, default=2, help="simulated hosts (default 2)")
    ap.add_argument("--runs", type=int, default=4, help="runs of each query in a row (default 4, as the study)")
    ap.add_argument("--queries", default="all", help="comma-separated query numbers (default all 22)")
    ap.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated, of {','.join(PATHS)}")
    ap.add_argument("--profile", default="lan", choices=list(netstage.PROFILES), help="the MinIO link (default lan)")
    ap.add_argument("--mem", default="2GiB", help="each worker's MEM tier (default 2GiB)")
    ap.add_argument("--block-size", default="64MiB", help="Locus block size, and Spark's split size (default 64MiB)")
    ap.add_argument("--executor-memory", default="1g", help="each executor's heap (default 1g)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds one path's application may take")
    ap.add_argument("--out-dir", default=str(HERE / "results"), help="where the results go")
    ap.add_argument("--work-dir", default="", help="scratch directory (default a new one under /tmp)")
    ap.add_argument("--locus-bin", required=True)
    ap.add_argument("--hadoop-jar", required=True)
    ap.add_argument("--hadoop-lib", required=True)
    ap.add_argument("--minio", default=str(Path(os.environ.get("LOCUS_TOOLS_DIR", Path.home() / ".cache/locus-tools"))
                                           / "bin" / "minio"))
    ap.add_argument("--alluxio-dir", default=str(Path(os.environ.get("LOCUS_TOOLS_DIR", Path.home() / ".cache/locus-tools"))
                                                 / f"alluxio-{ALLUXIO_VERSION}"),
                    help="where Alluxio's jars are resolved (bench/alluxio/alluxio-up.sh DIR --resolve-only)")
    ap.add_argument("--python", default=sys.executable)
    a = ap.parse_args()
    if a.quick:
        a.sf, a.hosts, a.runs, a.queries, a.block_size = 0.01, 2, 2, "1,3,6", "4MiB"
        a.mem, a.executor_memory = "512MiB", "512m"
    a.queries = list(QUERIES) if a.queries == "all" else [int(q) for q in a.queries.split(",")]
    a.paths = [p for p in a.paths.split(",") if p]
    for p in a.paths:
        if p not in PATHS:
            raise SystemExit(f"seed-sparksql: unknown path {p!r} (known: {', '.join(PATHS)})")
    raw = run(a)
    s = summarize(raw)
    raw["summary"] = s
    name = f"seed-sparksql{'-quick' if a.quick else ''}-{a.profile}"
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(raw, indent=1))
    (out / f"{name}.md").write_text(render(raw, s))
    with contextlib.suppress(ImportError):
        chart(raw, s, out / f"{name}.png")
    print(render(raw, s))
    if not s["agree"]:
        raise SystemExit("seed-sparksql: the paths' results differ (see the table)")


if __name__ == "__main__":
    main()
