"""Seed study: count the lines of a text file in a remote S3 store, directly and through
caches (a reproduction of the Alluxio-on-Ceph line-count study).

Run it with `bench/run seed-linecount [--quick] [--full] [--profile lan|cloud|none]`, which
installs what it needs first. This script sets up the stage, runs every path side by side,
writes the results and tears everything down (also when it fails):

  * MinIO in a network namespace behind a shaped link (bench/netstage.py; profile lan by
    default: 1 Gbit/s, 1 ms each way);
  * Locus (`locus local start`: a master, 1 or 3 workers, the S3 gateway) with the MinIO
    bucket mounted at /locuslake;
  * Alluxio 2.9.6 (master, worker, S3 proxy) with the same bucket as its root UFS;
  * a text file per size, generated on tmpfs (that copy is the `wc -l` floor) and uploaded.

Paths (bench/linecount_report.py names them): Spark s3a directly from MinIO, boto3 directly
from MinIO, Spark s3a through the Locus gateway, Spark locus:// through the Locus Hadoop
connector (crates/locus-hadoop), the Locus native client (`locus fs wc`),
Spark alluxio://, Spark s3a through the Alluxio S3 proxy, Alluxio's Java client, and Spark
counting the tmpfs copy through file:// (Spark's own floor; not in --quick). For each
path and size: caches emptied, then the first access and REPS more, both with a new
application per access and with all accesses in one application. Times are taken inside
the application. Every access's line count is checked against the generator's.

Internal subcommands (one client process per application):
  seed_linecount.py spark --endpoint E --key K --secret S --url U --n N [--extra-jar J]
  seed_linecount.py boto3 --endpoint E --bucket B --object KEY --n N
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
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

import linecount_report as report  # noqa: E402
import netstage  # noqa: E402

GiB, MiB = 1 << 30, 1 << 20
BUCKET, PREFIX = "lake", "linecount"
LOCUS_MOUNT = "/locuslake"
ALLUXIO_VERSION = "2.9.6"
ALLUXIO_MASTER = "alluxio://127.0.0.1:19998"
ALLUXIO_S3 = "http://127.0.0.1:39999/api/v1/s3"


def log(msg: str):
    print(f"[seed-linecount {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --------------------------------------------------------------------------- clients


def driver_jars(extra_jar: str) -> str:
    """The Spark driver's class path: the s3a jars, plus a path's extra jar if it has one."""
    return os.environ["SPARK_S3A_JARS"] + ("," + extra_jar if extra_jar else "")


def spark_client(a):
    """One Spark application: N line counts of URL, each timed."""
    from sparkutil import spark_session

    jars = driver_jars(a.extra_jar)
    extra = {"spark.driver.memory": "2g", "spark.hadoop.fs.s3a.input.stream.type": a.s3a_stream}
    if a.url.startswith("alluxio://"):
        extra["spark.hadoop.fs.alluxio.impl"] = "alluxio.hadoop.FileSystem"
    t = time.monotonic()
    spark = spark_session(a.endpoint, a.key, a.secret, jars, app="locus-seed-linecount", extra=extra,
                          class_archive_dir=a.class_archive_dir or None)
    startup = time.monotonic() - t
    secs, lines = [], None
    if a.wait_go:
        # Started ahead of its turn: say so, then wait (idle) until the harness says go.
        print(json.dumps({"ready": True, "startup": startup}), flush=True)
        sys.stdin.readline()
    try:
        for _ in range(a.n):
            t = time.monotonic()
            lines = spark.read.text(a.url).count()
            secs.append(time.monotonic() - t)
    finally:
        spark.stop()
    print(json.dumps({"lines": lines, "seconds": secs, "startup": startup}))


def boto3_client(a):
    """N line counts of one object with boto3's streaming GET (a native S3 client)."""
    import boto3
    from botocore.config import Config

    s3 = boto3.client("s3", endpoint_url=a.endpoint, aws_access_key_id="minioadmin",
                      aws_secret_access_key="minioadmin", region_name="us-east-1",
                      config=Config(max_pool_connections=4))
    secs, lines = [], 0
    for _ in range(a.n):
        t = time.monotonic()
        lines = 0
        body = s3.get_object(Bucket=a.bucket, Key=a.object)["Body"]
        for chunk in body.iter_chunks(4 * MiB):
            lines += chunk.count(b"\n")
        secs.append(time.monotonic() - t)
    print(json.dumps({"lines": lines, "seconds": secs}))


# --------------------------------------------------------------------------- the stage


def generate(path: Path, size: int) -> int:
    """A text file of at most `size` bytes of word lines (3-25 words of 2-10 letters),
    ending at a line end. Returns its line count."""
    import random

    rnd = random.Random(42)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rnd.choice(letters) for _ in range(rnd.randint(2, 10))) for _ in range(5000)]
    parts, n = [], 0
    while n < 4 * MiB:
        line = " ".join(rnd.choice(words) for _ in range(rnd.randint(3, 25))) + "\n"
        parts.append(line)
        n += len(line)
    chunk = "".join(parts).encode()
    full, rest = divmod(size, len(chunk))
    tail = chunk[: chunk.rfind(b"\n", 0, rest) + 1] if rest else b""
    with open(path, "wb") as f:
        for _ in range(full):
            f.write(chunk)
        f.write(tail)
    return full * chunk.count(b"\n") + tail.count(b"\n")


def alluxio_up(d: Path, ufs: str, endpoint: str, quota: str, cleanups: list, env: dict | None = None):
    """Alluxio 2.9.6's master, worker and S3 proxy in `d` (bench/alluxio/alluxio-up.sh: the
    root UFS `ufs` in the MinIO at `endpoint`, a MEM tier of `quota`), their teardown added
    to `cleanups`. Returns a client's class path and Java options; raises RuntimeError when
    they do not start."""
    env = dict(env or os.environ, S3_ENDPOINT=endpoint, S3_ACCESS_KEY="minioadmin", S3_SECRET_KEY="minioadmin")
    cleanups.append(("alluxio", lambda: subprocess.run([str(HERE / "alluxio" / "alluxio-down.sh"), str(d)],
                                                       capture_output=True)))
    r = subprocess.run([str(HERE / "alluxio" / "alluxio-up.sh"), str(d), ufs, quota], env=env,
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"alluxio-up.sh failed: {(r.stderr or r.stdout)[-3000:]}")
    return (d / "cp.txt").read_text().strip(), (d / "jopts-client.txt").read_text().split()


class Stage:
    """Everything one harness run starts, torn down in reverse order by close()."""

    def __init__(self, a):
        self.a = a
        self.work = Path(tempfile.mkdtemp(prefix="locus-linecount-", dir=a.work_dir or None))
        self.cleanups: list = []
        self.dirty: set[str] = set()
        self.copy: Path | None = None  # the tmpfs copy of the file being counted

    def close(self):
        t = time.monotonic()
        while self.cleanups:
            name, fn = self.cleanups.pop()
            t1 = time.monotonic()
            try:
                fn()
            except BaseException as e:  # keep tearing down
                print(f"teardown of {name} failed: {e}", file=sys.stderr)
            log(f"teardown of {name}: {time.monotonic() - t1:.1f} s")
        shutil.rmtree(self.work, ignore_errors=True)
        log(f"teardown: {time.monotonic() - t:.1f} s")

    # -- MinIO behind the shaped link
    def start_minio(self):
        state = self.work / "net.json"
        self.cleanups.append(("netstage", lambda: netstage.down(state)))
        st = netstage.up(self.a.profile, self.a.minio, self.work / "net", state)
        self.endpoint = st["endpoint"]
        self.upload_endpoint = st.get("direct_endpoint", st["endpoint"])
        import boto3

        self.s3 = boto3.client("s3", endpoint_url=self.upload_endpoint, aws_access_key_id="minioadmin",
                               aws_secret_access_key="minioadmin", region_name="us-east-1")
        self.s3.create_bucket(Bucket=BUCKET)
        log(f"MinIO ({self.a.profile}) at {self.endpoint}")

    # -- Locus
    def start_locus(self, quota: str):
        rpc, web, gw = netstage.free_port(), netstage.free_port(), netstage.free_port()
        self.locus_master = f"127.0.0.1:{rpc}"
        # The cluster's client token (local start writes it into its data dir): for the CLI
        # calls below and the Spark applications counting through locus:// (the connector
        # reads LOCUS_* variables), which inherit this process's environment.
        os.environ["LOCUS_SECURITY__TOKEN_FILE"] = str(self.work / "locus" / "client.token")
        self.locus_env = dict(os.environ, LOCUS_MASTER=self.locus_master)
        env = dict(self.locus_env, LOCUS_MASTER__WEB_ADDRESS=f"127.0.0.1:{web}",
                   LOCUS_WORKER__DATA_ADDRESS="127.0.0.1:0")
        logf = open(self.work / "locus.log", "wb")
        p = subprocess.Popen([self.a.locus_bin, "local", "start", "--data-dir", str(self.work / "locus"),
                              "--master", f"127.0.0.1:{rpc}", "--workers", str(self.a.workers), "--mem-quota", quota,
                              "--gateway-address", f"127.0.0.1:{gw}"],
                             env=env, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True)

        def stop():
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
            shm = "/dev/shm/locus" + "".join(c if c.isalnum() else "_" for c in str(self.work / "locus"))
            shutil.rmtree(shm, ignore_errors=True)

        self.cleanups.append(("locus", stop))
        for _ in range(150):
            if self.locus("report", check=False).returncode == 0:
                break
            if p.poll() is not None:
                break
            time.sleep(0.2)
        else:
            p.poll()
        if p.returncode is not None or self.locus("report", check=False).returncode != 0:
            raise SystemExit(f"locus did not start: {(self.work / 'locus.log').read_text()[-2000:]}")
        self.locus("fs", "mount", LOCUS_MOUNT, f"s3://{BUCKET}", "--option", f"endpoint={self.endpoint}",
                   "--option", "access_key_id=minioadmin", "--option", "secret_access_key=minioadmin",
                   "--sync-interval", "1h")
        self.gateway = f"http://127.0.0.1:{gw}"
        log(f"Locus: {self.a.workers} worker(s), gateway {self.gateway}, {LOCUS_MOUNT} -> s3://{BUCKET}")

    def locus(self, *args, check=True) -> subprocess.CompletedProcess:
        r = subprocess.run([self.a.locus_bin, *args], env=self.locus_env, capture_output=True, text=True)
        if check and r.returncode != 0:
            raise SystemExit(f"locus {' '.join(args)} failed: {r.stderr.strip()}")
        return r

    # -- Alluxio
    def start_alluxio(self, quota: str):
        d = Path(self.a.alluxio_dir)
        t = time.monotonic()
        try:
            self.alluxio_cp, self.alluxio_jopts = alluxio_up(d, f"s3://{BUCKET}/", self.endpoint, quota, self.cleanups)
        except RuntimeError as e:
            raise SystemExit(str(e)) from None
        self.alluxio_client_jar = str(d / "client" / f"alluxio-shaded-client-{ALLUXIO_VERSION}.jar")
        jdir = self.work / "java"
        jdir.mkdir()
        r = subprocess.run(["javac", "-cp", self.alluxio_cp, "-d", str(jdir), str(HERE / "alluxio" / "LineCount.java")],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"javac LineCount.java failed: {r.stderr[-2000:]}")
        self.alluxio_java = ["java", *self.alluxio_jopts, "-cp", f"{self.alluxio_cp}:{jdir}", "LineCount"]
        log(f"Alluxio {ALLUXIO_VERSION} up in {time.monotonic() - t:.0f} s (root UFS s3://{BUCKET}/)")

    def alluxio_tool(self, *args) -> dict:
        r = subprocess.run([*self.alluxio_java, *args], capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"LineCount {' '.join(args)} failed: {r.stderr[-3000:]}")
        return report.parse_json_line(r.stdout)

    # -- caches
    def empty_caches(self, key: str):
        if "locus" in self.dirty:
            self.locus("fs", "free", "-R", LOCUS_MOUNT)
            st = json.loads(self.locus("fs", "stat", "--json", f"{LOCUS_MOUNT}/{key}").stdout)
            if st["cached_fraction"] != 0:
                raise SystemExit(f"locus fs free left {st['cached_fraction']:.0%} of {key} cached")
        if "alluxio" in self.dirty:
            # Alluxio's Java client (the proxy's REST paths API answers nothing in 2.9.6).
            self.alluxio_tool("free", f"/{key}")
        self.dirty.clear()

    # -- one application
    def spark_target(self, path: str, key: str) -> tuple[str, str, str, str, str]:
        """A Spark path's s3a endpoint, key, secret, the URL it counts and its extra jar."""
        if path == "direct-s3a":
            ep, k, s, url, jar = self.endpoint, "minioadmin", "minioadmin", f"s3a://{BUCKET}/{key}", ""
        elif path == "locus-s3a":
            ep, k, s, url, jar = self.gateway, "locusadmin", "locusadmin", f"s3a://{LOCUS_MOUNT[1:]}/{key}", ""
        elif path == "locus-fs":  # the Locus connector (its library: LOCUS_HADOOP_LIB); s3a is unused
            ep, k, s = self.endpoint, "minioadmin", "minioadmin"
            url, jar = f"locus://{self.locus_master}{LOCUS_MOUNT}/{key}", self.a.hadoop_jar
        elif path == "spark-tmpfs":  # the tmpfs copy; s3a is unused
            ep, k, s, url, jar = self.endpoint, "minioadmin", "minioadmin", f"file://{self.copy}", ""
        elif path == "alluxio-s3a":
            ep, k, s, url, jar = ALLUXIO_S3, "alluxio", "alluxio", f"s3a://{key}", ""
        else:  # alluxio-fs: Alluxio's Hadoop client; s3a is unused
            ep, k, s = self.endpoint, "minioadmin", "minioadmin"
            url, jar = f"{ALLUXIO_MASTER}/{key}", self.alluxio_client_jar
        return ep, k, s, url, jar

    def spark_cmd(self, path: str, key: str, n: int, jar: str | None = None) -> list[str]:
        """One Spark application counting `path`'s URL n times; `jar` replaces its extra jar."""
        a = self.a
        ep, k, s, url, own_jar = self.spark_target(path, key)
        jar = own_jar if jar is None else jar
        return [sys.executable, __file__, "spark", "--endpoint", ep, "--key", k, "--secret", s, "--url", url,
                "--n", str(n), "--s3a-stream", a.s3a_stream] + (["--extra-jar", jar] if jar else []) \
            + (["--class-archive-dir", str(a.tools / "cds")] if a.spark_cds else [])

    def warm_class_archives(self, paths: list[str], key: str):
        """Writes the missing class-data archives (one per driver class path) with one
        untimed application each, counting the file straight from MinIO (no cache is
        touched), so that no timed application dumps one at its exit and all of them start
        from it. Only the first run on a machine has any to write."""
        from sparkutil import class_archive, session_jars

        # One archive per class path as the drivers will have it (sparkutil adds the
        # connector's jar to every one), so paths whose extra jars end the same share it.
        by_cp = {session_jars(driver_jars(j)): j
                 for j in sorted({self.spark_target(p, key)[4] for p in paths if report.PATHS[p][2] == "spark"})}
        for cp, jar in sorted(by_cp.items()):
            archive, ready = class_archive(self.a.tools / "cds", cp)
            if ready:
                continue
            t = time.monotonic()
            r = subprocess.run(self.spark_cmd("direct-s3a", key, 1, jar=jar), capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit(f"class-data archive warm-up failed:\n{r.stderr[-4000:]}")
            log(f"  class-data archive {archive.name} written in {time.monotonic() - t:.1f} s (untimed warm-up)")

    def app(self, path: str, key: str, n: int) -> dict:
        if report.PATHS[path][2] == "spark":
            r = subprocess.run(self.spark_cmd(path, key, n), capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit(f"{path}: Spark application failed:\n{r.stderr[-4000:]}")
            return report.parse_json_line(r.stdout)
        if path == "direct-boto3":
            r = subprocess.run([sys.executable, __file__, "boto3", "--endpoint", self.endpoint, "--bucket", BUCKET,
                                "--object", key, "--n", str(n)], capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit(f"{path} failed:\n{r.stderr[-3000:]}")
            return report.parse_json_line(r.stdout)
        if path == "locus-native":
            r = self.locus("fs", "wc", "--json", "--repeat", str(n), f"{LOCUS_MOUNT}/{key}")
            return report.parse_json_line(r.stdout)
        if path == "alluxio-java":
            return self.alluxio_tool("count", f"/{key}", str(n))
        raise ValueError(path)

    def spark_batch(self, path: str, key: str, ns: list[int]) -> list[dict]:
        """Spark applications counting n[i] times each, started together (their start-ups
        overlap) and then run one after the other: each waits, idle, for its turn, and the
        next goes once the previous has exited. Each is still a new application: its own
        JVM, SparkContext and first query."""
        procs = []
        t = time.monotonic()
        try:
            for n in ns:
                err = tempfile.TemporaryFile()
                procs.append((subprocess.Popen(self.spark_cmd(path, key, n) + ["--wait-go"], stdin=subprocess.PIPE,
                                               stdout=subprocess.PIPE, stderr=err, text=True), err))
            for p, err in procs:
                line = "x"
                while line and not line.startswith('{"ready"'):
                    line = p.stdout.readline()
                if not line:
                    err.seek(0)
                    raise SystemExit(f"{path}: Spark application failed to start:\n{err.read().decode()[-4000:]}")
            log(f"  {path:>13}: {len(procs)} Spark applications started together, ready in {time.monotonic() - t:.1f} s")
            time.sleep(1.0)  # let the last start-up's JIT and GC settle
            outs = []
            for p, err in procs:
                p.stdin.write("go\n")
                p.stdin.close()
                out = p.stdout.read()
                if p.wait() != 0:
                    err.seek(0)
                    raise SystemExit(f"{path}: Spark application failed:\n{err.read().decode()[-4000:]}")
                outs.append(report.parse_json_line(out))
            return outs
        finally:
            for p, err in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
                err.close()

    def run_pair(self, path: str, key: str, reps: int, lines: int) -> list[dict]:
        """Both modes of a path with fewer applications (quick mode): the same-app
        application's first access opens the new-app series too (both are a new
        application's first access on emptied caches), and Spark's applications start
        together (spark_batch)."""
        self.begin_path(path, key)
        if report.PATHS[path][2] == "spark":
            same, *news = self.spark_batch(path, key, [reps + 1] + [1] * reps)
        else:
            same, news = self.app(path, key, reps + 1), [self.app(path, key, 1) for _ in range(reps)]
        check_lines(path, [same, *news], lines)
        runs = [{"path": path, "mode": "same-app", "seconds": same["seconds"], "lines": lines},
                {"path": path, "mode": "new-app", "seconds": same["seconds"][:1] + [o["seconds"][0] for o in news],
                 "lines": lines, "first_shared": True}]
        if "startup" in same:
            runs[0]["app_startup"] = [same["startup"]]
            runs[1]["app_startup"] = [same["startup"]] + [o["startup"] for o in news]
        return runs

    def begin_path(self, path: str, key: str):
        """Empty the caches before a path's first access; note which system it fills."""
        self.empty_caches(key)
        system = report.PATHS[path][1]
        if system not in ("direct", "floor"):
            self.dirty.add(system)

    def run_path(self, path: str, mode: str, key: str, reps: int, lines: int) -> dict:
        self.begin_path(path, key)
        outs = [self.app(path, key, reps + 1)] if mode == "same-app" else [self.app(path, key, 1)
                                                                           for _ in range(reps + 1)]
        secs = [s for o in outs for s in o["seconds"]]
        check_lines(path, outs, lines)
        r = {"path": path, "mode": mode, "seconds": secs, "lines": lines}
        if "startup" in outs[0]:
            r["app_startup"] = [o["startup"] for o in outs]
        return r


def check_lines(path: str, outs: list[dict], lines: int):
    for o in outs:
        if o["lines"] != lines:
            raise SystemExit(f"{path}: counted {o['lines']} lines, the file has {lines}")


def machine_facts(profile: str) -> dict:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    shape = netstage.PROFILES[profile]
    return {
        "cores": os.cpu_count(),
        "cpu": model,
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GiB),
        "kernel": platform.release(),
        "profile": profile,
        "profile_desc": "MinIO on loopback, no shaping" if shape is None else
        f"tc tbf {shape['rate']}/s, toxiproxy {shape['delay_ms']} ms each way",
    }


def parse_size(s: str) -> int:
    s = s.strip().upper().replace("IB", "")
    mult = {"K": 1 << 10, "M": MiB, "G": GiB}
    return int(float(s[:-1]) * mult[s[-1]]) if s[-1] in mult else int(s)


def choose_sizes(a) -> list[int]:
    if a.sizes:
        return [parse_size(s) for s in a.sizes.split(",")]
    if a.quick:
        return [256 * MiB]
    sizes = [1 * GiB, 5 * GiB]
    if a.full:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        disk = shutil.disk_usage(a.work_dir or tempfile.gettempdir()).free
        # One cache full of the file plus the JVMs in memory; MinIO's copy on disk.
        if mem >= 10 * GiB + 8 * GiB and disk >= 10 * GiB + 4 * GiB:
            sizes.append(10 * GiB)
        else:
            log(f"--full: skipping 10 GiB (memory {mem / GiB:.0f} GiB, free disk {disk / GiB:.0f} GiB)")
    return sizes


def run(a) -> dict:
    sizes = choose_sizes(a)
    reps = a.reps or (3 if a.quick else 10)
    paths = a.paths.split(",") if a.paths else report.default_paths(a.quick)
    unknown = [p for p in paths if p not in report.PATHS]
    if unknown:
        raise SystemExit(f"unknown path(s) {', '.join(unknown)}: known are {', '.join(report.PATHS)}")
    quota = f"{max(sizes) * 1.25 / GiB + 0.5:.1f}GiB"
    raw = {"profile": a.profile, "reps": reps, "s3a_stream": a.s3a_stream, "sizes": sizes, "quick": a.quick, "workers": a.workers, "spark_cds": a.spark_cds, "batch_apps": a.batch_apps,
           "alluxio_version": ALLUXIO_VERSION, "machine": machine_facts(a.profile), "runs": [], "floor": [],
           "code": code_version()}  # at the start: the tree may change while the study runs
    stage = Stage(a)
    t0 = time.monotonic()
    try:
        stage.start_minio()
        stage.start_locus(quota)
        if any(report.PATHS[p][1] == "alluxio" for p in paths):
            stage.start_alluxio(quota.replace("GiB", "GB"))
        for size in sizes:
            key = f"{PREFIX}/lines-{report.human_size(size).replace(' ', '')}.txt"
            copy = stage.copy = Path("/dev/shm") / f"locus-linecount-{os.getpid()}.txt"
            stage.cleanups.append(("tmpfs copy", lambda c=copy: c.unlink(missing_ok=True)))
            lines = generate(copy, size)
            from boto3.s3.transfer import TransferConfig

            t = time.monotonic()
            stage.s3.upload_file(str(copy), BUCKET, key,
                                 Config=TransferConfig(multipart_chunksize=64 * MiB, max_concurrency=4))
            log(f"{report.human_size(size)}: {lines:,} lines, uploaded in {time.monotonic() - t:.1f} s")
            floor = []
            for _ in range(reps + 1):
                t = time.monotonic()
                out = subprocess.run(["wc", "-l", str(copy)], capture_output=True, text=True, check=True).stdout
                floor.append(time.monotonic() - t)
                if int(out.split()[0]) != lines:
                    raise SystemExit(f"wc -l counted {out.split()[0]}, the file has {lines}")
            raw["floor"].append({"size": size, "seconds": floor, "lines": lines})
            log(f"  wc -l on tmpfs: median {sorted(floor)[len(floor) // 2]:.3f} s")
            if a.spark_cds and size == sizes[0]:
                stage.warm_class_archives(paths, key)
            # Spark's floor reads the tmpfs copy, so it goes first; the copy then goes before
            # the caches fill memory.
            order = sorted(((m, p) for m in report.MODES for p in paths), key=lambda mp: mp[1] != report.SPARK_FLOOR)
            if a.batch_apps:  # both modes of a path at once
                order = [(None, p) for p in sorted(paths, key=lambda p: p != report.SPARK_FLOOR)]
            for mode, p in order:
                if p != report.SPARK_FLOOR:
                    copy.unlink(missing_ok=True)
                rs = stage.run_path(p, mode, key, reps, lines) if mode else stage.run_pair(p, key, reps, lines)
                for r in rs if isinstance(rs, list) else [rs]:
                    r["size"] = size
                    raw["runs"].append(r)
                    nxt = r["seconds"][1:]
                    log(f"  {p:>13} {r['mode']:>8}: first {r['seconds'][0]:.2f} s, next mean "
                        f"{sum(nxt) / max(1, len(nxt)):.2f} s")
            copy.unlink(missing_ok=True)
            if size != sizes[-1]:  # the teardown frees the last size
                stage.empty_caches(key)
    finally:
        stage.close()
    raw["wall_seconds"] = time.monotonic() - t0
    return raw


def code_version() -> str:
    """The commit the harness runs (`-dirty` with uncommitted changes), for the table."""
    git = ["git", "-C", str(HERE)]
    try:
        head = subprocess.run(git + ["rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        # Results and docs written meanwhile are not code.
        dirty = subprocess.run(git + ["status", "--porcelain", "--untracked-files=no", "--", ":/",
                                      ":(exclude,top)bench/results", ":(exclude,top)*.md"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""
    return head + ("-dirty" if dirty else "")


def main():
    if len(sys.argv) > 1 and sys.argv[1] in ("spark", "boto3"):
        ap = argparse.ArgumentParser()
        ap.add_argument("cmd")
        ap.add_argument("--endpoint", required=True)
        ap.add_argument("--key", default="")
        ap.add_argument("--secret", default="")
        ap.add_argument("--url", default="")
        ap.add_argument("--bucket", default="")
        ap.add_argument("--object", default="")
        ap.add_argument("--extra-jar", default="")
        ap.add_argument("--n", type=int, default=1)
        ap.add_argument("--s3a-stream", default="classic")
        ap.add_argument("--class-archive-dir", default="")
        ap.add_argument("--wait-go", action="store_true", help="after start-up, wait for a line on stdin")
        a = ap.parse_args()
        (spark_client if a.cmd == "spark" else boto3_client)(a)
        return
    tools = Path(os.environ.get("LOCUS_TOOLS_DIR", Path.home() / ".cache/locus-tools"))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="256 MiB and 3 repeat accesses, with --batch-apps (about 3-4 minutes on 2 cores)")
    ap.add_argument("--full", action="store_true", help="add 10 GiB when memory and disk allow")
    ap.add_argument("--profile", default="lan", choices=list(netstage.PROFILES))
    ap.add_argument("--workers", type=int, default=1, choices=[1, 3])
    ap.add_argument("--sizes", default="", help="comma-separated sizes (e.g. 1GiB,5GiB), overrides the defaults")
    ap.add_argument("--reps", type=int, default=0, help="accesses after the first (default 10, quick 3)")
    ap.add_argument("--paths", default="", help="comma-separated subset of: " + ", ".join(report.PATHS))
    ap.add_argument("--s3a-stream", default="classic", choices=["classic", "analytics", "prefetch"],
                    help="fs.s3a.input.stream.type of every s3a path (default classic: the analytics stream, "
                    "Hadoop 3.5's default, costs Spark about 60%% more CPU per byte on 2 cores)")
    ap.add_argument("--spark-cds", action=argparse.BooleanOptionalAction, default=True,
                    help="Spark driver JVMs share a class-data archive (JDK AppCDS, in LOCUS_TOOLS_DIR/cds; it "
                    "cuts start-up and the first query's class loading, about 1 s of a new application's "
                    "first S3 access on 2 cores). Default on, for every Spark path alike; --no-spark-cds "
                    "runs the JVMs as they come")
    ap.add_argument("--batch-apps", action=argparse.BooleanOptionalAction, default=None,
                    help="fewer applications: the same-app application's first access opens the new-app series "
                    "too, and a path's Spark applications start together, then count one after the other "
                    "(each waits idle for its turn). Default: on with --quick, off otherwise")
    ap.add_argument("--locus-bin", required=True)
    ap.add_argument("--hadoop-jar", default="", help="the Locus Hadoop connector's jar (scripts/build-hadoop-connector)")
    ap.add_argument("--hadoop-lib", default="", help="the connector's liblocus_hadoop.so")
    ap.add_argument("--minio", default=str(tools / "bin" / "minio"))
    ap.add_argument("--alluxio-dir", default=str(tools / f"alluxio-{ALLUXIO_VERSION}"))
    ap.add_argument("--work-dir", default="", help="scratch directory (MinIO's data lives here)")
    ap.add_argument("--out-dir", default=str(HERE / "results"))
    ap.add_argument("--stem", default="", help="file name stem (default seed-linecount[-quick]-PROFILE)")
    a = ap.parse_args()
    a.tools = tools
    if a.batch_apps is None:
        a.batch_apps = a.quick
    paths = a.paths.split(",") if a.paths else report.default_paths(a.quick)
    if "locus-fs" in paths:
        if not (a.hadoop_jar and a.hadoop_lib):
            raise SystemExit("the locus-fs path needs --hadoop-jar and --hadoop-lib (bench/run builds them)")
        # Read by sparkutil in each Spark driver (the class path and the library's path).
        os.environ["LOCUS_HADOOP_JAR"], os.environ["LOCUS_HADOOP_LIB"] = a.hadoop_jar, a.hadoop_lib
    if not os.environ.get("SPARK_S3A_JARS"):
        raise SystemExit("SPARK_S3A_JARS is not set: run through bench/run, which installs the s3a jars")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    raw = run(a)
    stem = a.stem or f"seed-linecount{'-quick' if a.quick else ''}-{a.profile}"
    out = report.write_all(raw, Path(a.out_dir), stem)
    print(out["md"].read_text())
    log(f"done in {raw['wall_seconds']:.0f} s: {out['md']}, {out['png']}, {out['json']}")


if __name__ == "__main__":
    main()
