#!/usr/bin/env python3
"""Soak: one cluster under a mixed load for an hour, then idle, with the memory, open
files and threads of its processes sampled every 10 s (issue 54, finding 10: a master
that held 681 MB after a day of mixed probes and kept it while idle).

    bench/soak.py [--duration 3600] [--idle 300] [--out bench/results/soak-1h]
                  [--split] [--server-env KEY=VALUE ...] [--locus-bin BIN]

One file of about 1,500 lines because it is one run a user starts by path: the loads,
the sampler and the report share that run's cluster and clock, and bench/tests/test_soak.py
imports its parsers from here.

The cluster is `locus local start` (master, worker and S3 gateway in one process, the
process the finding calls "the master"); --split runs `locus master`, `locus worker` and
`locus gateway` as three processes instead, to tell their memory apart. Concurrently,
each in its own thread, at modest rates (the machine has 2 cores):

  s3      boto3 through the gateway: PUT (1 B-64 KiB and ~1 MiB, overwriting a fixed set
          of keys), GET, HEAD, LIST, DELETE, batch DELETE, now and then a multipart upload
  grow    boto3 PUTs of small objects with user metadata that are never deleted: the
          namespace grows by --grow-rate files/s (36,000 in an hour by default)
  cli     `locus fs` subprocesses: mkdir, put (in), put --overwrite, ls, stat, cat, rm -R,
          and now and then an ls of a 1,000-file directory
  py      the Python client (`locus.Client` and its fsspec filesystem): create/write,
          open/read, ls, stat, mv, rm, mkdir, pipe_file/cat_file/find
  fuse    `locus fuse` mounted here, used with plain Python file I/O: write, read,
          overwrite, listdir, stat, rename, unlink, mkdir/rmdir
  search  metadata search: the gateway's `?search=` (boto3, up to 2 pages), the Python
          client's `search`, and `locus fs search --count`

Every --sample-every s, per server process (and the FUSE process while mounted): VmRSS,
RssAnon, RssFile, RssShmem, VmHWM, open fds, threads, CPU seconds; the ops and errors of
each client kind; every minute also smaps_rollup, the RSS and anonymous memory of each
kind of mapping (smaps: mimalloc's arenas, glibc's heap and arenas, stacks, redb,
tantivy's index, the MEM tier, the binary), /metrics and `locus report --json`. After the
load stops the clients are closed (FUSE unmounted) and sampling goes on for --idle s.
smaps_rollup and the top 15 mappings by Anonymous are kept at the start, at the end of
the load and at the end of the idle period.

--import-objects N also imports an inventory of N objects (`locus fs index import`, under
/inv) --import-at s into the load, as the metadata-search benchmarks do (--import-file
reuses a JSON-lines inventory). --server-env passes allocator and other settings to the
servers (MIMALLOC_ALLOW_THP=0, LOCUS_MASTER__META_CACHE_SIZE=8MiB, ...); the report names
the inherited RUST_BACKTRACE / RUST_LIB_BACKTRACE / MALLOC_* / MIMALLOC_* variables.
--backtrace-probe measures instead what one logged UFS error costs the master's memory
with and without library backtraces (an S3 mount whose endpoint answers 500).

Writes OUT.md (the report) and OUT.json (every sample). Needs root for FUSE (skipped
otherwise, or with --no-fuse). Processes are stopped by PID; the data dir, the mount
point and the MEM tier in /dev/shm are removed at the end. Results and what they showed:
bench/results/soak-findings.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.parse
import urllib.request
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from netstage import free_port  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
KiB, MiB = 1 << 10, 1 << 20
GW_KEY = GW_SECRET = "locusadmin"

# --------------------------------------------------------------------------- pure helpers


def parse_status(text: str) -> dict:
    """/proc/PID/status: the memory fields in KiB and Threads."""
    out = {}
    for line in text.splitlines():
        k, _, v = line.partition(":")
        if k in ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM", "VmSize", "VmData", "VmSwap"):
            out[k] = int(v.split()[0])
        elif k == "Threads":
            out[k] = int(v.strip())
    return out


def parse_kv_kb(text: str) -> dict:
    """smaps_rollup (or one smaps entry's fields): `Name: N kB` lines as {Name: N}."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0].endswith(":") and parts[-1] == "kB":
            out[parts[0][:-1]] = int(parts[1])
    return out


def parse_smaps(text: str) -> list[dict]:
    """/proc/PID/smaps as a list of mappings: start, end, size (KiB), perms, name, and
    every `Field: N kB` of the entry (Rss, Pss, Anonymous, AnonHugePages, ...)."""
    maps, cur = [], None
    for line in text.splitlines():
        first = line.split(None, 1)[0] if line.strip() else ""
        if "-" in first and not first.endswith(":"):
            parts = line.split(None, 5)
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            cur = {"start": parts[0].split("-")[0], "size": (hi - lo) // 1024, "perms": parts[1],
                   "name": parts[5].strip() if len(parts) > 5 else ""}
            maps.append(cur)
        elif cur is not None:
            parts = line.split()
            if len(parts) == 3 and parts[0].endswith(":") and parts[2] == "kB":
                cur[parts[0][:-1]] = int(parts[1])
    return maps


def classify(m: dict, exe: str = "", data_dir: str = "") -> str:
    """The kind of a mapping: what holds the memory. Unnamed anonymous mappings are told
    apart by size: mimalloc v3 reserves its arenas 1 GiB at a time (256 MiB and more here),
    glibc's thread arenas are 64 MiB reservations (HEAP_MAX), anything else anonymous is a
    thread stack (2-8 MiB with a guard page) or a large allocation mapped on its own."""
    name, size = m.get("name", ""), m.get("size", 0)
    if name == "[heap]":
        return "glibc-heap (brk)"
    if name.startswith("[stack"):
        return "main-stack"
    if name.startswith("[") or name.startswith("//anon"):
        return "kernel (" + name.strip("[]") + ")"
    if name == "":
        if size >= 256 * 1024:
            return "anon >=256MiB (mimalloc arena)"
        if size in (65536, 65536 - 132, 65404, 132) or 60 * 1024 <= size <= 65536:
            return "anon 64MiB (glibc arena)"
        if size <= 8 * 1024 + 4:
            return "anon <=8MiB (stacks, small maps)"
        return "anon other"
    if name.startswith("/dev/shm/") or "/dev/shm" in name:
        return "MEM tier (/dev/shm)"
    if exe and (name == exe or name.startswith(exe + " ")):
        return "binary"
    if ".so" in name:
        return "shared libs"
    if name.endswith(".redb") or "/master/" in name and "redb" in name:
        return "redb file"
    if data_dir and name.startswith(data_dir):
        if "/search" in name or "/index" in name or name.rsplit(".", 1)[-1] in (
                "idx", "term", "pos", "fast", "fieldnorm", "store", "sstable", "managed", "json"):
            return "tantivy index"
        return "data dir file"
    return "other file"


def categories(maps: list[dict], exe: str = "", data_dir: str = "") -> dict:
    """Per kind of mapping: count, size, Rss, Anonymous, Shared and private file pages (KiB)."""
    out: dict = {}
    for m in maps:
        c = out.setdefault(classify(m, exe, data_dir), {"n": 0, "size": 0, "Rss": 0, "Anonymous": 0,
                                                         "AnonHugePages": 0, "Swap": 0})
        c["n"] += 1
        for k in ("size", "Rss", "Anonymous", "AnonHugePages", "Swap"):
            c[k] += m.get(k, 0)
    return out


def top_anon(maps: list[dict], n: int = 15) -> list[dict]:
    """The `n` mappings with the most Anonymous memory."""
    keep = ("start", "size", "perms", "name", "Rss", "Anonymous", "AnonHugePages", "Private_Dirty")
    return [{k: m.get(k, "") for k in keep} for m in sorted(maps, key=lambda m: -m.get("Anonymous", 0))[:n]]


def lsq_slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of ys against xs (None with fewer than 3 points)."""
    n = len(xs)
    if n < 3:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx


def parse_metrics(text: str) -> dict:
    """Prometheus text: {'name{labels}': value} of every sample line."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        k, _, v = line.rpartition(" ")
        try:
            out[k] = float(v)
        except ValueError:
            pass
    return out


def pctl(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def fmt_mib(kib) -> str:
    return "-" if kib is None else f"{kib / 1024:.0f}"


# --------------------------------------------------------------------------- /proc


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def proc_sample(pid: int) -> dict | None:
    """The memory, fds, threads and CPU of `pid` now (None when it is gone)."""
    try:
        st = parse_status(read(f"/proc/{pid}/status"))
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        tasks = len(os.listdir(f"/proc/{pid}/task"))
        stat = read(f"/proc/{pid}/stat").rsplit(")", 1)[1].split()
        cpu = (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    st.update(fds=fds, tasks=tasks, cpu_s=round(cpu, 2))
    return st


def fd_kinds(pid: int) -> dict:
    """Open fds by what they point at (socket, pipe, anon_inode:..., file paths by dir)."""
    c = Counter()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                t = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if t.startswith("socket:"):
                c["socket"] += 1
            elif t.startswith("pipe:"):
                c["pipe"] += 1
            elif t.startswith("anon_inode:"):
                c[t] += 1
            elif t.startswith("/dev/shm"):
                c["/dev/shm file"] += 1
            elif t.startswith("/"):
                c[os.path.dirname(t)[-60:]] += 1
            else:
                c[t[:40]] += 1
    except FileNotFoundError:
        pass
    return dict(c.most_common(12))


def disk_free_mib(path: str) -> int | None:
    """Free space of the file system holding `path` (the cluster's data dir), MiB."""
    try:
        st = os.statvfs(path)
        return st.f_bavail * st.f_frsize // MiB
    except OSError:
        return None


def thp_counters() -> dict:
    """The machine's transparent-huge-page counters (/proc/vmstat): faults, khugepaged's
    collapses, PMD splits (system-wide: every process counts)."""
    out = {}
    try:
        for line in read("/proc/vmstat").splitlines():
            k, _, v = line.partition(" ")
            if k in ("thp_fault_alloc", "thp_collapse_alloc", "thp_split_pmd", "thp_deferred_split_page"):
                out[k] = int(v)
    except OSError:
        pass
    return out


# --------------------------------------------------------------------------- cluster


def clean_env(extra: dict | None = None) -> dict:
    e = {k: v for k, v in os.environ.items() if not k.startswith("LOCUS_")}
    e.update(extra or {})
    return e


def shm_tag(data_dir: Path) -> Path:
    """The MEM tier directory `local start` derives from its data dir."""
    tag = "".join(c if (c.isascii() and c.isalnum()) else "_" for c in str(Path(data_dir).absolute()))
    return Path("/dev/shm") / f"locus{tag}"


class Cluster:
    def __init__(self, bin: str, work: Path, split: bool, server_env: dict, mem_quota: str):
        self.bin, self.work, self.split = bin, work, split
        self.data = work / "data"
        self.master = f"127.0.0.1:{free_port()}"
        self.web = f"127.0.0.1:{free_port()}"
        self.gateway = f"127.0.0.1:{free_port()}"
        self.token_file = self.data / "client.token"
        self.server_env = server_env
        self.mem_quota = mem_quota
        self.procs: dict[str, subprocess.Popen] = {}
        self.shm = shm_tag(self.data) if not split else Path("/dev/shm") / f"locus-soak-{os.getpid()}"
        self.logs: list[Path] = []

    def client_env(self) -> dict:
        return clean_env({"LOCUS_SECURITY__TOKEN_FILE": str(self.token_file), "LOCUS_MASTER": self.master})

    def _spawn(self, name: str, args: list[str], env: dict):
        log = self.work / f"{name}.log"
        self.logs.append(log)
        with open(log, "ab") as f:
            p = subprocess.Popen([self.bin, "--master", self.master, *args], stdout=f, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        self.procs[name] = p

    def start(self):
        self.data.mkdir(parents=True)
        env = clean_env({"LOCUS_MASTER__WEB_ADDRESS": self.web, "LOCUS_WORKER__DATA_ADDRESS": "127.0.0.1:0",
                         "LOCUS_GATEWAY__ADDRESS": self.gateway, "LOCUS_SECURITY__TOKEN_FILE": str(self.token_file),
                         "LOCUS_SECURITY__SECRET_FILE": str(self.data / "cluster.secret"),
                         "RUST_LOG": os.environ.get("RUST_LOG", "info")})
        env.update(self.server_env)
        if not self.split:
            self._spawn("local", ["local", "start", "--data-dir", str(self.data), "--mem-quota", self.mem_quota], env)
        else:
            self._spawn("master", ["master", "--rpc-address", self.master, "--web-address", self.web,
                                   "--meta-dir", str(self.data / "master")], env)
            for _ in range(100):
                if self.token_file.exists():
                    break
                time.sleep(0.1)
            self._spawn("worker", ["worker", "--data-address", "127.0.0.1:0", "--data-dir",
                                   str(self.data / "worker0"), "--tier", f"MEM:{self.shm}/w0:{self.mem_quota}"], env)
            self._spawn("gateway", ["gateway", "--address", self.gateway], env)
        deadline = time.monotonic() + 60
        while True:
            for n, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{n} exited with {p.returncode}:\n{self.log_tail()}")
            r = self.report()
            if r and r.get("live_workers") == 1 and port_open(self.gateway):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"cluster not ready in 60 s:\n{self.log_tail()}")
            time.sleep(0.3)

    def cli(self, *args, timeout: float = 120, input: bytes | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([self.bin, "--master", self.master, *map(str, args)], input=input,
                              capture_output=True, timeout=timeout, env=self.client_env())

    def report(self) -> dict | None:
        try:
            r = self.cli("report", "--json", timeout=30)
            return json.loads(r.stdout) if r.returncode == 0 else None
        except (subprocess.TimeoutExpired, ValueError):
            return None

    def metrics(self) -> dict | None:
        try:
            token = self.token_file.read_text().strip()
            req = urllib.request.Request(f"http://{self.web}/metrics", headers={"Authorization": f"Bearer {token}"})
            with urllib.request.urlopen(req, timeout=10) as r:
                return parse_metrics(r.read().decode())
        except Exception as e:  # noqa: BLE001
            return {"error": str(e)[:200]}

    def pids(self) -> dict[str, int]:
        return {n: p.pid for n, p in self.procs.items()}

    def log_tail(self, n: int = 40) -> str:
        out = []
        for p in self.logs:
            try:
                out.append(f"--- {p.name}")
                out.extend(p.read_text(errors="replace").splitlines()[-n:])
            except OSError:
                pass
        return "\n".join(out)

    def stop(self):
        for n in reversed(list(self.procs)):
            p = self.procs[n]
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=10)

    def cleanup(self):
        self.stop()
        if not self.split:
            subprocess.run([self.bin, "local", "clean", "--data-dir", str(self.data)], capture_output=True,
                           env=clean_env(), timeout=60)
        shutil.rmtree(self.shm, ignore_errors=True)


def port_open(addr: str) -> bool:
    import socket
    host, port = addr.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except OSError:
        return False


# --------------------------------------------------------------------------- load


class Stats:
    """Ops, errors (with a few distinct examples) and latencies per client kind."""

    def __init__(self):
        self.lock = threading.Lock()
        self.ops: Counter = Counter()
        self.ops_by: Counter = Counter()
        self.errors: Counter = Counter()
        self.errors_by: Counter = Counter()
        self.examples: dict[str, list[str]] = defaultdict(list)
        self.lat: dict[str, list[float]] = defaultdict(list)

    def ok(self, kind: str, op: str, secs: float):
        with self.lock:
            self.ops[kind] += 1
            self.ops_by[f"{kind}.{op}"] += 1
            self.lat[kind].append(secs)

    def err(self, kind: str, op: str, msg: str):
        msg = " ".join(str(msg).split())[:300]
        with self.lock:
            self.errors[kind] += 1
            self.errors_by[f"{kind}.{op}"] += 1
            ex = self.examples[kind]
            if len(ex) < 8 and not any(e.split(": ", 1)[-1][:80] == msg[:80] for e in ex):
                ex.append(f"{time.strftime('%H:%M:%S')} {op}: {msg}")

    def snapshot(self) -> dict:
        """Totals so far, and the latencies since the last snapshot (p50, p99, max in ms)."""
        with self.lock:
            lat, self.lat = self.lat, defaultdict(list)
            return {"ops": dict(self.ops), "errors": dict(self.errors),
                    "lat_ms": {k: [round(pctl(v, 0.5) * 1e3, 1), round(pctl(v, 0.99) * 1e3, 1),
                                   round(max(v) * 1e3, 1)] for k, v in lat.items() if v}}


class Load(threading.Thread):
    """One client kind: `step()` at `rate` per second until stopped. Each step is one op
    (timed and counted by `op`), or raises (counted as an error of that op)."""

    kind = "?"

    def __init__(self, stats: Stats, stop: threading.Event, rate: float, seed: int):
        super().__init__(name=self.kind, daemon=True)
        self.stats, self.stop_ev, self.rate = stats, stop, rate
        self.rnd = random.Random(seed)
        self.current = ("", 0.0)

    def op(self, name: str, fn, *a, **kw):
        t = time.monotonic()
        self.current = (name, t)
        try:
            r = fn(*a, **kw)
        except Exception as e:  # noqa: BLE001
            self.stats.err(self.kind, name, f"{type(e).__name__}: {e}")
            raise Skip() from e
        finally:
            self.current = ("", 0.0)
        self.stats.ok(self.kind, name, time.monotonic() - t)
        return r

    def setup(self):
        pass

    def step(self):
        raise NotImplementedError

    def close(self):
        pass

    def run(self):
        try:
            self.setup()
        except Exception as e:  # noqa: BLE001
            self.stats.err(self.kind, "setup", f"{type(e).__name__}: {e}")
            return
        period = 1.0 / self.rate
        nxt = time.monotonic()
        while not self.stop_ev.is_set():
            try:
                self.step()
            except Skip:
                pass
            except Exception as e:  # noqa: BLE001
                self.stats.err(self.kind, "step", f"{type(e).__name__}: {e} {traceback.format_exc(limit=2)[-200:]}")
            nxt += period
            delay = nxt - time.monotonic()
            if delay < -5 * period:
                nxt = time.monotonic()  # behind: do not burst to catch up
            self.stop_ev.wait(max(0.0, delay))
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass


class Skip(Exception):
    pass


def s3_client(endpoint: str):
    import boto3
    from botocore.config import Config
    return boto3.session.Session().client(
        "s3", endpoint_url=endpoint, aws_access_key_id=GW_KEY, aws_secret_access_key=GW_SECRET,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1},
                      connect_timeout=10, read_timeout=60))


COLORS = ["red", "green", "blue", "black", "white"]
OWNERS = [f"user-{i}" for i in range(8)]
TYPES = ["text/plain", "application/json", "image/png", "application/octet-stream"]


class S3Load(Load):
    kind = "s3"
    KEYS = 300

    def setup(self):
        self.s3 = s3_client(self.endpoint)
        for b in ("soak", "grow"):
            try:
                self.s3.create_bucket(Bucket=b)
            except Exception as e:  # noqa: BLE001
                if "BucketAlready" not in str(e):
                    raise
        self.live: set[str] = set()
        self.n = 0

    def key(self) -> str:
        return f"churn/k{self.rnd.randrange(self.KEYS):04d}"

    def body(self, n: int) -> bytes:
        return self.rnd.randbytes(n)

    def step(self):
        self.n += 1
        r, s3 = self.rnd.random(), self.s3
        if self.n % 300 == 0:
            return self.multipart()
        if r < 0.30:
            k = self.key()
            self.op("put_small", s3.put_object, Bucket="soak", Key=k, Body=self.body(self.rnd.randint(1, 64 * KiB)),
                    ContentType=self.rnd.choice(TYPES),
                    Metadata={"color": self.rnd.choice(COLORS), "owner": self.rnd.choice(OWNERS)})
            self.live.add(k)
        elif r < 0.37:
            k = self.key()
            self.op("put_1mib", s3.put_object, Bucket="soak", Key=k, Body=self.body(MiB + self.rnd.randint(0, 64 * KiB)),
                    Metadata={"color": self.rnd.choice(COLORS)})
            self.live.add(k)
        elif r < 0.62:
            if not self.live:
                return
            k = self.rnd.choice(sorted(self.live))
            try:
                self.op("get", lambda: s3.get_object(Bucket="soak", Key=k)["Body"].read())
            except Skip:
                self.live.discard(k)
        elif r < 0.67:
            if self.live:
                k = self.rnd.choice(sorted(self.live))
                self.op("head", s3.head_object, Bucket="soak", Key=k)
        elif r < 0.77:
            if self.rnd.random() < 0.2:
                d = f"grow/d{self.rnd.randrange(max(1, self.grown() // 1000 + 1)):03d}/"
                self.op("list_grow", s3.list_objects_v2, Bucket="grow", Prefix=d, MaxKeys=1000)
            else:
                got = self.op("list", s3.list_objects_v2, Bucket="soak", Prefix="churn/", MaxKeys=1000)
                self.live = {o["Key"] for o in got.get("Contents", [])}
        elif r < 0.97:
            if self.live:
                k = self.rnd.choice(sorted(self.live))
                self.op("delete", s3.delete_object, Bucket="soak", Key=k)
                self.live.discard(k)
        else:
            ks = self.rnd.sample(sorted(self.live), min(10, len(self.live))) if self.live else []
            if ks:
                self.op("delete_batch", s3.delete_objects, Bucket="soak",
                        Delete={"Objects": [{"Key": k} for k in ks], "Quiet": True})
                self.live.difference_update(ks)

    def multipart(self):
        s3, k = self.s3, f"mpu/m{self.rnd.randrange(20):02d}"

        def mpu():
            u = s3.create_multipart_upload(Bucket="soak", Key=k)["UploadId"]
            parts = []
            try:
                for i, n in enumerate([5 * MiB, 5 * MiB, self.rnd.randint(1, 512 * KiB)], 1):
                    e = s3.upload_part(Bucket="soak", Key=k, UploadId=u, PartNumber=i, Body=self.body(n))["ETag"]
                    parts.append({"ETag": e, "PartNumber": i})
                s3.complete_multipart_upload(Bucket="soak", Key=k, UploadId=u, MultipartUpload={"Parts": parts})
            except Exception:
                s3.abort_multipart_upload(Bucket="soak", Key=k, UploadId=u)
                raise
        self.op("multipart", mpu)
        if self.rnd.random() < 0.5:
            self.op("delete_mpu", s3.delete_object, Bucket="soak", Key=k)

    def close(self):
        self.s3.close()


class GrowLoad(Load):
    """Small objects with metadata, never deleted: the namespace (and the search index)
    grows for the whole run."""
    kind = "grow"

    def setup(self):
        self.s3 = s3_client(self.endpoint)
        self.i = 0
        for _ in range(50):
            try:
                self.s3.head_bucket(Bucket="grow")
                return
            except Exception:  # noqa: BLE001
                time.sleep(0.2)  # S3Load makes it

    def step(self):
        k = f"grow/d{self.i // 1000:03d}/f{self.i:06d}"
        self.op("put", self.s3.put_object, Bucket="grow", Key=k, Body=self.rnd.randbytes(self.rnd.randint(1, 600)),
                ContentType=self.rnd.choice(TYPES),
                Metadata={"color": self.rnd.choice(COLORS), "owner": self.rnd.choice(OWNERS),
                          "batch": str(self.i // 5000)})
        self.i += 1

    def close(self):
        self.s3.close()


class CliLoad(Load):
    """`locus fs` commands, one subprocess per op, in a cycle over a ring of directories."""
    kind = "cli"

    def setup(self):
        self.tmp = Path(self.tmpdir) / "cli"
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.plan: list = []
        self.cycle = 0

    def fs(self, name: str, *args, check_out: bytes | None = None):
        def run():
            r = self.cluster.cli("fs", *args, timeout=120)
            if r.returncode != 0:
                raise RuntimeError(f"exit {r.returncode}: {r.stderr.decode(errors='replace').strip()[:200]}")
            if check_out is not None and r.stdout != check_out:
                raise RuntimeError(f"content differs ({len(r.stdout)} bytes, wanted {len(check_out)})")
            return r
        return self.op(name, run)

    def step(self):
        if not self.plan:
            c, self.cycle = self.cycle, self.cycle + 1
            d = f"/cli/d{c % 8}"
            data = self.rnd.randbytes(self.rnd.randint(1, 256 * KiB))
            src = self.tmp / "src.bin"
            data2 = self.rnd.randbytes(self.rnd.randint(1, 64 * KiB))
            src2 = self.tmp / "src2.bin"
            self.plan = [
                lambda: self.fs("rm", "rm", "-R", d) if c >= 8 else None,
                lambda: self.fs("mkdir", "mkdir", "-p", d),
                lambda: (src.write_bytes(data), self.fs("put", "put", src, f"{d}/a.bin")),
                lambda: self.fs("ls", "ls", d),
                lambda: self.fs("stat", "stat", f"{d}/a.bin"),
                lambda: self.fs("cat", "cat", f"{d}/a.bin", check_out=data),
                lambda: (src2.write_bytes(data2), self.fs("put_overwrite", "put", "--overwrite", src2, f"{d}/a.bin")),
                lambda: self.fs("cat", "cat", f"{d}/a.bin", check_out=data2),
                lambda: self.op("put_stdin", self._put_stdin, f"{d}/b.txt"),
                lambda: self.fs("mv", "mv", f"{d}/b.txt", f"{d}/c.txt"),
                lambda: self.fs("ls_R", "ls", "-R", "/cli"),
            ]
            if c % 10 == 5 and self.grown() > 1000:
                self.plan.append(lambda: self.fs("ls_1000", "ls", f"/grow/grow/d{self.rnd.randrange(self.grown() // 1000):03d}"))
        f = self.plan.pop(0)
        f()

    def _put_stdin(self, path: str):
        r = self.cluster.cli("fs", "put", "-", path, input=b"line\n" * self.rnd.randint(1, 2000))
        if r.returncode != 0:
            raise RuntimeError(f"exit {r.returncode}: {r.stderr.decode(errors='replace').strip()[:200]}")


class PyLoad(Load):
    """The Python client: the native `locus.Client` and the fsspec filesystem."""
    kind = "py"
    FILES = 60

    def setup(self):
        import fsspec  # noqa: F401
        import locus
        from locus.fsspec import LocusFileSystem
        self.c = locus.Client(master=self.cluster.master, token_file=str(self.cluster.token_file))
        self.fs = LocusFileSystem(master=self.cluster.master, token_file=str(self.cluster.token_file),
                                  skip_instance_cache=True)
        self.c.mkdir("/py/n", parents=True)
        self.c.mkdir("/py/f", parents=True)
        self.sizes: dict[str, int] = {}

    def path(self, sub="n") -> str:
        return f"/py/{sub}/p{self.rnd.randrange(self.FILES):03d}"

    def step(self):
        r, c = self.rnd.random(), self.c
        if r < 0.25:
            p, n = self.path(), self.rnd.choice([self.rnd.randint(1, 64 * KiB), self.rnd.randint(MiB, 2 * MiB)])
            data = self.rnd.randbytes(n)

            def write():
                w = c.create(p, overwrite=True)
                for i in range(0, n, 256 * KiB):
                    w.write(data[i:i + 256 * KiB])
                w.close()
            self.op("write", write)
            self.sizes[p] = n
        elif r < 0.45 and self.sizes:
            p = self.rnd.choice(sorted(self.sizes))

            def rd():
                f = c.open(p)
                got = f.read(0, f.size)
                if len(got) != self.sizes[p]:
                    raise RuntimeError(f"read {len(got)} bytes of {p}, wrote {self.sizes[p]}")
            try:
                self.op("read", rd)
            except Skip:
                self.sizes.pop(p, None)
        elif r < 0.55:
            self.op("ls", c.ls, "/py/n")
        elif r < 0.62 and self.sizes:
            self.op("stat", c.stat, self.rnd.choice(sorted(self.sizes)))
        elif r < 0.68 and self.sizes:
            src = self.rnd.choice(sorted(self.sizes))
            dst = self.path()
            if dst != src:
                if dst in self.sizes:
                    self.op("rm", c.rm, dst)
                    del self.sizes[dst]
                self.op("mv", c.mv, src, dst)
                self.sizes[dst] = self.sizes.pop(src)
        elif r < 0.78 and self.sizes:
            p = self.rnd.choice(sorted(self.sizes))
            self.op("rm", c.rm, p)
            del self.sizes[p]
        elif r < 0.83:
            d = f"/py/d{self.rnd.randrange(5)}"
            self.op("mkdir", c.mkdir, f"{d}/x/y", parents=True)
            self.op("rm_R", c.rm, d, recursive=True)
        elif r < 0.90:
            p = self.path("f")
            b = self.rnd.randbytes(self.rnd.randint(1, 32 * KiB))
            self.op("fsspec_pipe", self.fs.pipe_file, p, b)
            got = self.op("fsspec_cat", self.fs.cat_file, p)
            if got != b:
                self.stats.err(self.kind, "fsspec_cat", "content differs")
        elif r < 0.95:
            self.op("fsspec_find", self.fs.find, "/py")
        else:
            p = self.path("f")

            def info_rm():
                if self.fs.exists(p):
                    self.fs.info(p)
                    self.fs.rm(p)
            self.op("fsspec_info_rm", info_rm)

    def close(self):
        self.c = self.fs = None


class FuseLoad(Load):
    """Plain file I/O through a `locus fuse` mount."""
    kind = "fuse"
    FILES = 40

    def setup(self):
        self.root = Path(self.mnt) / "fuse"
        self.root.mkdir(exist_ok=True)
        self.sizes: dict[str, int] = {}

    def step(self):
        r, root = self.rnd.random(), self.root
        if r < 0.30:
            p = root / f"f{self.rnd.randrange(self.FILES):03d}"
            n = self.rnd.choice([self.rnd.randint(1, 64 * KiB), self.rnd.randint(256 * KiB, MiB)])
            data = self.rnd.randbytes(n)

            def write():
                with open(p, "wb") as f:
                    for i in range(0, n, 128 * KiB):
                        f.write(data[i:i + 128 * KiB])
            self.op("write", write)
            self.sizes[str(p)] = n
        elif r < 0.55 and self.sizes:
            p = self.rnd.choice(sorted(self.sizes))

            def rd():
                with open(p, "rb") as f:
                    got = f.read()
                if len(got) != self.sizes[p]:
                    raise RuntimeError(f"read {len(got)} bytes, wrote {self.sizes[p]}")
            try:
                self.op("read", rd)
            except Skip:
                self.sizes.pop(p, None)
        elif r < 0.65:
            self.op("listdir", os.listdir, root)
        elif r < 0.72 and self.sizes:
            self.op("stat", os.stat, self.rnd.choice(sorted(self.sizes)))
        elif r < 0.78 and self.sizes:
            src = self.rnd.choice(sorted(self.sizes))
            dst = str(root / f"f{self.rnd.randrange(self.FILES):03d}")
            if dst != src:
                self.op("rename", os.rename, src, dst)
                self.sizes[dst] = self.sizes.pop(src)
        elif r < 0.88 and self.sizes:
            p = self.rnd.choice(sorted(self.sizes))
            self.op("unlink", os.unlink, p)
            del self.sizes[p]
        elif r < 0.94:
            d = root / f"dir{self.rnd.randrange(4)}"

            def dirs():
                os.makedirs(d / "sub", exist_ok=True)
                (d / "sub" / "x.txt").write_bytes(b"x" * self.rnd.randint(1, 4096))
                os.unlink(d / "sub" / "x.txt")
                os.rmdir(d / "sub")
                os.rmdir(d)
            self.op("mkdir_rmdir", dirs)
        else:
            def listdir_s3():  # the S3 client's keys, seen through the mount (absent before its first PUT)
                try:
                    os.listdir(Path(self.mnt) / "soak" / "churn")
                except FileNotFoundError:
                    pass
            self.op("listdir_s3", listdir_s3)


class SearchLoad(Load):
    """Metadata search: the gateway's ?search= (boto3), the Python client, the CLI."""
    kind = "search"
    CLAUSES = [
        ("grow", "x-amz-meta-color = red"),
        ("grow", "content-length > 500"),
        ("grow", "x-amz-meta-owner = user-3 AND content-length < 300"),
        ("grow", 'key LIKE "^grow/d00[0-3]/f0001.*"'),
        ("grow", "content-type = image/png AND x-amz-meta-color = blue"),
        ("soak", "x-amz-meta-color = green"),
        ("soak", "content-length > 100000"),
        ("soak", 'key LIKE "^churn/k00.*"'),
    ]

    INV = [("inv", "x-amz-meta-owner = user-01234"), ("inv", "tags.project = p042 AND content-length > 1000000"),
           ("inv", 'key LIKE "^logs/2025-03-1[0-2]/host-000[0-4]/"'), ("inv", "content-type = image/png")]

    def setup(self):
        import locus
        self.s3 = s3_client(self.endpoint)
        self.clause = None

        def add(request, **_):
            if self.clause is not None:
                request.url += ("&" if "?" in request.url else "?") + "search=" + urllib.parse.quote(self.clause, safe="")
        self.s3.meta.events.register("before-sign.s3.ListObjectsV2", add)
        self.c = locus.Client(master=self.cluster.master, token_file=str(self.cluster.token_file))
        self.n = 0

    def step(self):
        self.n += 1
        bucket, clause = self.rnd.choice(self.CLAUSES + (self.INV if self.stats.ops.get("import") else []))
        if self.n % 5 == 0:
            def cli():
                r = self.cluster.cli("fs", "search", "--count", f"/{bucket}", clause, timeout=120)
                if r.returncode != 0:
                    raise RuntimeError(f"exit {r.returncode}: {r.stderr.decode(errors='replace').strip()[:200]}")
            self.op("cli_count", cli)
        elif self.n % 5 in (1, 3):
            def gw():
                self.clause = clause
                try:
                    token, pages = None, 0
                    while pages < 2:
                        args = dict(Bucket=bucket, MaxKeys=1000)
                        if token:
                            args["ContinuationToken"] = token
                        r = self.s3.list_objects_v2(**args)
                        pages += 1
                        if not r.get("IsTruncated"):
                            break
                        token = r["NextContinuationToken"]
                finally:
                    self.clause = None
            self.op("gateway", gw)
        else:
            self.op("python", self.c.search, f"/{bucket}", clause, limit=1000)

    def close(self):
        self.s3.close()
        self.c = None


def write_inventory(path: Path, n: int, seed: int = 7):
    """An inventory of `n` objects as JSON lines (what `locus fs index import` reads)."""
    rnd = random.Random(seed)
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({
                "key": f"logs/2025-{1 + i % 12:02d}-{1 + i % 28:02d}/host-{i % 1000:04d}/obj-{i:09d}.gz",
                "size": rnd.randint(1, 1 << 30), "last_modified": 1735689600000 + rnd.randrange(31_536_000_000),
                "etag": hashlib.md5(str(i).encode()).hexdigest(), "content_type": rnd.choice(TYPES),
                "metadata": {"owner": f"user-{rnd.randrange(100000):05d}", "team": f"team-{rnd.randrange(100)}"},
                "tags": {"project": f"p{rnd.randrange(1000):03d}"}}) + "\n")


class ImportLoad(threading.Thread):
    """`locus fs index import` of an inventory of `n` objects (JSON lines) under /inv, once,
    `at` s into the load: what a day of metadata-search probes does to the master (the
    10M-object seed-mdsearch imports)."""
    kind = "import"

    def __init__(self, stats: Stats, stop: threading.Event, n: int, at: float, cluster, tmpdir: str,
                 file: str | None = None):
        super().__init__(name="import", daemon=True)
        self.file = file
        self.stats, self.stop_ev, self.n, self.at, self.cluster, self.tmpdir = stats, stop, n, at, cluster, tmpdir
        self.current = ("", 0.0)

    def run(self):
        if self.stop_ev.wait(self.at):
            return
        src = Path(self.file) if self.file else Path(self.tmpdir) / "inventory.jsonl"
        if not self.file:
            write_inventory(src, self.n)
        # /inv as a directory, so the gateway serves it as a bucket (its ?search= asks for one).
        self.cluster.cli("fs", "mkdir", "-p", "/inv")
        t = time.monotonic()
        self.current = ("import", t)
        r = self.cluster.cli("fs", "index", "import", src, "--under", "/inv", timeout=3600)
        self.current = ("", 0.0)
        if r.returncode != 0:
            self.stats.err("import", "import", f"exit {r.returncode}: {r.stderr.decode(errors='replace').strip()[:300]}")
        else:
            self.stats.ok("import", "import", time.monotonic() - t)
            print(f"soak: imported {self.n} objects in {time.monotonic() - t:.1f} s", flush=True)
        if not self.file:
            src.unlink(missing_ok=True)


class FuseMount:
    def __init__(self, cluster: Cluster, mnt: Path, log: Path):
        self.mnt = mnt
        mnt.mkdir(parents=True, exist_ok=True)
        self.log = open(log, "ab")
        self.proc = subprocess.Popen([cluster.bin, "--master", cluster.master, "fuse", str(mnt)], stdout=self.log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=cluster.client_env(),
                                     start_new_session=True)
        deadline = time.monotonic() + 30
        while not os.path.ismount(mnt):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"locus fuse did not mount: {Path(log).read_text(errors='replace')[-2000:]}")
            time.sleep(0.1)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if os.path.ismount(self.mnt):
            subprocess.run(["fusermount3", "-u", str(self.mnt)], capture_output=True)
        if os.path.ismount(self.mnt):
            subprocess.run(["umount", "-l", str(self.mnt)], capture_output=True)
        self.log.close()


# --------------------------------------------------------------------------- sampling


class Sampler:
    def __init__(self, cluster: Cluster, stats: Stats, every: float, data_dir: str, exe: str, grown):
        self.cluster, self.stats, self.every = cluster, stats, every
        self.data_dir, self.exe, self.grown = data_dir, exe, grown
        self.samples: list[dict] = []
        self.extra_pids: dict[str, int] = {}
        self.phase = "start"
        self.t0 = time.monotonic()
        self.stop_ev = threading.Event()
        self.th = threading.Thread(target=self.loop, daemon=True)
        self.last_minute = -1
        self.minutely: list[dict] = []

    def pids(self) -> dict[str, int]:
        return {**self.cluster.pids(), **self.extra_pids}

    def sample(self, full: bool = False):
        t = round(time.monotonic() - self.t0, 1)
        s = {"t": t, "phase": self.phase, "wall": time.strftime("%H:%M:%S"), "loadavg": os.getloadavg()[0],
             "procs": {}, **self.stats.snapshot(), "grown": self.grown(), "disk_free_mib": disk_free_mib(self.data_dir)}
        for n, pid in self.pids().items():
            p = proc_sample(pid)
            if p is not None:
                s["procs"][n] = p
        self.samples.append(s)
        minute = int(t // 60)
        if full or minute != self.last_minute:
            self.last_minute = minute
            m = {"t": t, "phase": self.phase, "rollup": {}, "categories": {}, "fd_kinds": {}}
            for n, pid in self.cluster.pids().items():
                try:
                    m["rollup"][n] = parse_kv_kb(read(f"/proc/{pid}/smaps_rollup"))
                    m["categories"][n] = categories(parse_smaps(read(f"/proc/{pid}/smaps")), self.exe, self.data_dir)
                    m["fd_kinds"][n] = fd_kinds(pid)
                except (FileNotFoundError, ProcessLookupError):
                    pass
            m["metrics"] = self.cluster.metrics()
            m["vmstat_thp"] = thp_counters()
            rep = self.cluster.report()
            if rep:
                m["report"] = {"persist_backlog": rep.get("persist_backlog"),
                               "persist_failed_ops": (rep.get("persist_failed") or {}).get("ops"),
                               "jobs": {j["name"]: {k: j.get(k) for k in ("backlog", "failures", "runs", "state")}
                                        for j in rep.get("jobs", [])},
                               "capacity": rep.get("capacity")}
            self.minutely.append(m)
        return s

    def loop(self):
        nxt = time.monotonic()
        while not self.stop_ev.is_set():
            try:
                self.sample()
            except Exception as e:  # noqa: BLE001
                print(f"soak: sample failed: {e}", file=sys.stderr)
            nxt += self.every
            self.stop_ev.wait(max(0.0, nxt - time.monotonic()))

    def snapshot(self, label: str) -> dict:
        """smaps_rollup and the top 15 mappings by Anonymous of each server process."""
        out = {"label": label, "t": round(time.monotonic() - self.t0, 1), "procs": {}}
        for n, pid in self.cluster.pids().items():
            try:
                maps = parse_smaps(read(f"/proc/{pid}/smaps"))
                out["procs"][n] = {"rollup_text": read(f"/proc/{pid}/smaps_rollup"),
                                   "rollup": parse_kv_kb(read(f"/proc/{pid}/smaps_rollup")),
                                   "top_anon": top_anon(maps, 15),
                                   "categories": categories(maps, self.exe, self.data_dir),
                                   "n_maps": len(maps), "status": proc_sample(pid), "fd_kinds": fd_kinds(pid)}
            except (FileNotFoundError, ProcessLookupError):
                pass
        out["metrics"] = self.cluster.metrics()
        return out


# --------------------------------------------------------------------------- report


def summarize(samples: list[dict], duration: float, proc: str) -> dict:
    """Figures of one process over the run: RSS and anon at start/end of load/end of
    idle, min/median/max during the load, the slope over the last 30 min of the load."""
    pts = [(s["t"], s["procs"][proc], s["phase"]) for s in samples if proc in s["procs"]]
    if not pts:
        return {}
    load = [(t, p) for t, p, ph in pts if ph == "load"]
    idle = [(t, p) for t, p, ph in pts if ph == "idle"]
    out = {}
    for k in ("VmRSS", "RssAnon", "RssFile", "RssShmem", "fds", "tasks"):
        v = [p.get(k, 0) for _, p in load] or [0]
        out[k] = {"start": pts[0][1].get(k), "end_load": load[-1][1].get(k) if load else None,
                  "end_idle": idle[-1][1].get(k) if idle else None,
                  "min": min(v), "median": statistics.median(v), "max": max(v)}
    if load:
        t_end = load[-1][0]
        win = 1800 if duration >= 2400 else duration / 2
        last = [(t, p) for t, p in load if t >= t_end - win]
        for k in ("VmRSS", "RssAnon", "RssFile"):
            sl = lsq_slope([t for t, _ in last], [p.get(k, 0) for _, p in last])
            out[k]["slope_mib_per_h"] = None if sl is None else round(sl * 3600 / 1024, 1)
        out["slope_window_s"] = round(win)
        out["cpu_s_load"] = round(load[-1][1]["cpu_s"] - pts[0][1]["cpu_s"], 1)
    out["VmHWM"] = pts[-1][1].get("VmHWM")
    return out


def write_report(out: str, meta: dict, samples: list[dict], minutely: list[dict], snaps: list[dict],
                 stats: Stats, duration: float):
    order = ["local", "master", "worker", "gateway", "fuse"]
    procs = sorted({n for s in samples for n in s["procs"]}, key=lambda n: (order.index(n) if n in order else 9, n))
    summ = {n: summarize(samples, duration, n) for n in procs}
    with stats.lock:
        ops, errors = dict(stats.ops), dict(stats.errors)
        ops_by, errors_by, examples = dict(stats.ops_by), dict(stats.errors_by), dict(stats.examples)
    data = {"meta": meta, "summary": summ, "ops": ops, "ops_by": ops_by, "errors": errors, "errors_by": errors_by,
            "error_examples": examples, "samples": samples, "minutely": minutely, "snapshots": snaps}
    Path(out + ".json").write_text(json.dumps(data, indent=1))

    L = []
    w = L.append
    w(f"# Soak: {meta['duration']} s of mixed load, then {meta['idle']} s idle\n")
    w(f"`{meta['command']}`  \n{meta['date']}; binary `{meta['bin']}` ({meta['bin_size_mib']} MiB); "
      f"{meta['cluster']}; {meta['machine']}; THP {meta['thp']}.  \n"
      f"Server env: {meta['server_env'] or 'none'}; inherited: {meta.get('env_of_note') or 'nothing of note'}. Rates (ops/s): {meta['rates']}. All samples: `{Path(out).name}.json`."
      + (f" Inventory import: {meta['import_objects']:,} objects under /inv at t = {meta['import_at']:.0f} s."
         if meta.get("import_objects") else "") + "\n")
    w("## Memory, fds and threads\n")
    w("MiB unless noted; min/median/max are over the load phase; the slope is a least-squares fit over the "
      f"last {summ[procs[0]].get('slope_window_s', '?')} s of the load.\n")
    w("| process | figure | start | end of load | end of idle | min | median | max | slope MiB/h |")
    w("|---|---|---|---|---|---|---|---|---|")
    for n in procs:
        s = summ[n]
        for k in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
            f = s.get(k)
            if not f:
                continue
            w(f"| {n} | {k} | {fmt_mib(f['start'])} | {fmt_mib(f['end_load'])} | {fmt_mib(f['end_idle'])} | "
              f"{fmt_mib(f['min'])} | {fmt_mib(f['median'])} | {fmt_mib(f['max'])} | {f.get('slope_mib_per_h', '')} |")
        for k in ("fds", "tasks"):
            f = s.get(k)
            if f:
                w(f"| {n} | {'open fds' if k == 'fds' else 'threads'} | {f['start']} | {f['end_load']} | "
                  f"{f['end_idle'] if f['end_idle'] is not None else '-'} | {f['min']} | {f['median']:.0f} | {f['max']} | |")
        w(f"| {n} | VmHWM (peak RSS) | | | {fmt_mib(s.get('VmHWM'))} | | | | |")
        w(f"| {n} | CPU s during load | | {s.get('cpu_s_load', '')} | | | | | |")
    w("")
    w("## Operations and errors\n")
    w("| client | ops | ops/s | errors |")
    w("|---|---|---|---|")
    for k in sorted(set(ops) | set(errors)):
        w(f"| {k} | {ops.get(k, 0)} | {ops.get(k, 0) / max(1, duration):.2f} | {errors.get(k, 0)} |")
    w(f"| **all** | {sum(ops.values())} | {sum(ops.values()) / max(1, duration):.2f} | {sum(errors.values())} |\n")
    w("By operation: " + ", ".join(f"{k} {v}" for k, v in sorted(ops_by.items())) + "\n")
    if errors_by:
        w("Errors by operation: " + ", ".join(f"{k} {v}" for k, v in sorted(errors_by.items())) + "\n")
        w("Examples (distinct messages, first 8 per client):\n")
        for k, ex in sorted(examples.items()):
            for e in ex:
                w(f"- {k}: `{e}`")
        w("")
    w("## Every minute\n")
    main = procs[0]
    kinds = sorted(ops)
    w(f"Process `{main}`" + (f" (and {', '.join(p for p in procs if p != main)}: RSS)" if len(procs) > 1 else "")
      + ". ops are cumulative; lat is the p50/p99 in ms of the last 10 s.\n")
    others = [p for p in procs if p != main]
    w("| min | phase | RSS | anon | file | shmem | fds | thr | " + " | ".join(f"{p} RSS" for p in others)
      + (" | " if others else "") + " | ".join(kinds) + " | errors | files grown | s3 lat | load | disk free GiB |")
    w("|" + "---|" * (9 + len(others) + len(kinds) + 5))
    last_min = -1
    for s in samples:
        m = int(s["t"] // 60)
        if m == last_min and s is not samples[-1]:
            continue
        last_min = m
        p = s["procs"].get(main, {})
        lat = s.get("lat_ms", {}).get("s3")
        w(f"| {s['t'] / 60:.1f} | {s['phase']} | {fmt_mib(p.get('VmRSS'))} | {fmt_mib(p.get('RssAnon'))} | "
          f"{fmt_mib(p.get('RssFile'))} | {fmt_mib(p.get('RssShmem'))} | {p.get('fds', '-')} | {p.get('tasks', '-')} | "
          + " | ".join(fmt_mib(s["procs"].get(o, {}).get("VmRSS")) for o in others) + (" | " if others else "")
          + " | ".join(str(s["ops"].get(k, 0)) for k in kinds)
          + f" | {sum(s['errors'].values())} | {s.get('grown', 0)} | {'/'.join(map(str, lat[:2])) if lat else '-'} | {s['loadavg']:.1f} | "
          f"{'-' if s.get('disk_free_mib') is None else round(s['disk_free_mib'] / 1024, 1)} |")
    w("")
    w("## smaps_rollup every few minutes (MiB)\n")
    for n in [p for p in procs if p != "fuse"]:
        pick = [m for i, m in enumerate(minutely) if i % max(1, len(minutely) // 15) == 0 or i == len(minutely) - 1]
        w(f"`{n}`:\n")
        w("| min | phase | Rss | Anonymous | AnonHugePages | Private_Clean | Shared_Clean | LazyFree | "
          "khugepaged collapses (machine, cumulative) |")
        w("|---|---|---|---|---|---|---|---|---|")
        base = (minutely[0].get("vmstat_thp") or {}).get("thp_collapse_alloc", 0) if minutely else 0
        for m in pick:
            r = m["rollup"].get(n, {})
            coll = (m.get("vmstat_thp") or {}).get("thp_collapse_alloc")
            w(f"| {m['t'] / 60:.0f} | {m['phase']} | " + " | ".join(fmt_mib(r.get(k)) for k in (
                "Rss", "Anonymous", "AnonHugePages", "Private_Clean", "Shared_Clean", "LazyFree"))
              + f" | {'-' if coll is None else coll - base} |")
        w("")
    w("## Anonymous memory by kind of mapping (smaps, MiB: Rss / Anonymous)\n")
    for n in [p for p in procs if p != "fuse"]:
        cats = sorted({c for m in minutely for c in m["categories"].get(n, {})})
        pick = [m for i, m in enumerate(minutely) if i % max(1, len(minutely) // 12) == 0 or i == len(minutely) - 1]
        w(f"`{n}`:\n")
        w("| min | phase | " + " | ".join(cats) + " |")
        w("|" + "---|" * (2 + len(cats)))
        for m in pick:
            c = m["categories"].get(n, {})
            w(f"| {m['t'] / 60:.0f} | {m['phase']} | " + " | ".join(
                f"{c[k]['Rss'] / 1024:.0f} / {c[k]['Anonymous'] / 1024:.0f}" if k in c else "-" for k in cats) + " |")
        w("")
    for sn in snaps:
        w(f"## Snapshot: {sn['label']} (t = {sn['t'] / 60:.1f} min)\n")
        for n, d in sn["procs"].items():
            w(f"`{n}`: {d['n_maps']} mappings; fds by kind: {d['fd_kinds']}\n")
            w("```\n" + d["rollup_text"].strip() + "\n```\n")
            w("Top 15 mappings by Anonymous (KiB; mimalloc's arenas are the 1 GiB reservations, glibc's "
              "thread arenas 64 MiB-aligned, [heap] glibc's main arena):\n")
            w("| start | size | perms | Rss | Anonymous | AnonHuge | name |")
            w("|---|---|---|---|---|---|---|")
            for m in d["top_anon"]:
                w(f"| {m['start']} | {m['size']} | {m['perms']} | {m['Rss']} | {m['Anonymous']} | {m['AnonHugePages']} | {m['name'] or '(anon)'} |")
            w("")
        met = sn.get("metrics") or {}
        if met:
            w("/metrics: " + ", ".join(f"`{k}` {v:g}" if isinstance(v, float) else f"`{k}` {v}" for k, v in met.items()) + "\n")
    for name, tail in (meta.get("log_tail") or {}).items():
        at = [i for i, x in enumerate(tail) if x.startswith("subproc") or "heap stats" in x or "mimalloc:" in x
              or ("peak" in x and "total" in x and "current" in x)]
        stats_lines = tail[at[0]:] if at else []
        if stats_lines:
            w(f"## mimalloc stats at exit ({name})\n")
            w("```\n" + "\n".join(stats_lines[-60:]) + "\n```\n")
    Path(out + ".md").write_text("\n".join(L) + "\n")
    return summ


# --------------------------------------------------------------------------- backtrace probe


def backtrace_probe(bin: str, out: str, repeats: int = 3) -> int:
    """What one logged UFS error costs the master: a cluster whose S3 mount's endpoint
    answers 500 to everything, `fs mount` tried `repeats` times (each fails; opendal's
    retry layer logs each attempt, with the error's backtrace when one was captured), the
    process's memory measured before and after, under three environments."""
    import http.server
    import socketserver

    class H(http.server.BaseHTTPRequestHandler):
        def _e(self):
            n = int(self.headers.get("Content-Length") or 0)
            if n:
                self.rfile.read(n)
            self.send_response(500)
            self.send_header("Content-Length", "0")
            self.end_headers()
        do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = _e

        def log_message(self, *a):
            pass

    srv = socketserver.ThreadingTCPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    envs = [{"RUST_BACKTRACE": "1"}, {}, {"RUST_BACKTRACE": "1", "RUST_LIB_BACKTRACE": "0"}]
    rows, L = [], []
    saved = {k: os.environ.pop(k, None) for k in ("RUST_BACKTRACE", "RUST_LIB_BACKTRACE")}
    try:
        for env in envs:
            os.environ.update(env)
            work = Path(tempfile.mkdtemp(prefix="locus-soak-bt-"))
            c = Cluster(bin, work, False, {}, "256MiB")
            try:
                c.start()
                time.sleep(2)

                def measure(label):
                    pid = c.procs["local"].pid
                    st = proc_sample(pid)
                    cats = categories(parse_smaps(read(f"/proc/{pid}/smaps")), bin, str(c.data))
                    rows.append({"env": env, "step": label, "VmRSS": st["VmRSS"], "RssAnon": st["RssAnon"],
                                 "RssFile": st["RssFile"], "binary_rss": cats.get("binary", {}).get("Rss", 0),
                                 "binary_maps": cats.get("binary", {}).get("n", 0)})
                measure("fresh")
                for i in range(repeats):
                    c.cli("fs", "mount", f"/bad{i}", "s3://bkt", "--option",
                          f"endpoint=http://127.0.0.1:{srv.server_address[1]}", "--option", "access_key_id=x",
                          "--option", "secret_access_key=y", "--option", "region=us-east-1", timeout=120)
                    time.sleep(3)
                    measure(f"after failed mount {i + 1}")
                log = (work / "local.log").read_text(errors="replace")
                rows.append({"env": env, "step": "log", "warns": log.count(" WARN "),
                             "backtraces": log.count("Backtrace:")})
            finally:
                c.cleanup()
                shutil.rmtree(work, ignore_errors=True)
            for k in env:
                os.environ.pop(k, None)
    finally:
        srv.shutdown()
        for k, v in saved.items():
            if v is not None:
                os.environ[k] = v
    L.append("# One logged UFS error and the master's memory\n")
    L.append(f"`bench/soak.py --backtrace-probe --locus-bin {bin}`, {time.strftime('%Y-%m-%d %H:%M:%S %Z')}. "
             "`locus local start`; an S3 mount whose endpoint answers 500 to every request, tried "
             f"{repeats} times (`fs mount` fails; opendal's retry layer logs each attempt at WARN with the "
             "error's Debug form, which holds its backtrace when one was captured). MiB.\n")
    L.append("| server env | step | VmRSS | RssAnon | RssFile | RSS of the binary's mappings (n) | WARN lines / with a backtrace |")
    L.append("|---|---|---|---|---|---|---|")
    for r in rows:
        e = " ".join(f"{k}={v}" for k, v in r["env"].items()) or "(neither set)"
        if r["step"] == "log":
            L.append(f"| {e} | log | | | | | {r['warns']} / {r['backtraces']} |")
        else:
            L.append(f"| {e} | {r['step']} | {fmt_mib(r['VmRSS'])} | {fmt_mib(r['RssAnon'])} | {fmt_mib(r['RssFile'])} | "
                     f"{fmt_mib(r['binary_rss'])} ({r['binary_maps']}) | |")
    Path(out + ".md").write_text("\n".join(L) + "\n")
    Path(out + ".json").write_text(json.dumps(rows, indent=1))
    print("\n".join(L))
    return 0


# --------------------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=3600, help="seconds of load (default 3600)")
    ap.add_argument("--idle", type=float, default=300, help="seconds of idle sampling after the load (default 300)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "soak"), help="OUT.md and OUT.json")
    ap.add_argument("--locus-bin", default=os.environ.get("LOCUS_BIN") or str(
        Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "release" / "locus"))
    ap.add_argument("--split", action="store_true", help="master, worker and gateway as three processes")
    ap.add_argument("--server-env", action="append", default=[], metavar="KEY=VALUE",
                    help="environment of the server processes (e.g. MIMALLOC_PURGE_DELAY=0); repeatable")
    ap.add_argument("--sample-every", type=float, default=10)
    ap.add_argument("--mem-quota", default="1GiB", help="the worker's MEM tier (default 1GiB)")
    ap.add_argument("--grow-rate", type=float, default=10, help="files/s added and kept (default 10: 36k/h)")
    ap.add_argument("--rates", default="s3=8,cli=1,py=4,fuse=4,search=0.5",
                    help="ops/s per client kind (default s3=8,cli=1,py=4,fuse=4,search=0.5)")
    ap.add_argument("--no-fuse", action="store_true")
    ap.add_argument("--work-dir", default=None,
                    help="where the run's temporary directory (data dir, UFS, mount point) goes (default: $TMPDIR); "
                         "/dev/shm keeps a full disk from failing the run")
    ap.add_argument("--import-objects", type=int, default=0,
                    help="also import an inventory of this many objects (`locus fs index import`, under /inv) "
                         "--import-at s into the load (default 0: none)")
    ap.add_argument("--import-at", type=float, default=120)
    ap.add_argument("--import-file", help="import this JSON-lines inventory (made by write_inventory) instead of "
                                          "generating one of --import-objects")
    ap.add_argument("--seed", type=int, default=54)
    ap.add_argument("--backtrace-probe", action="store_true",
                    help="instead of the soak: what one logged UFS error costs the master's memory with "
                         "RUST_BACKTRACE=1, without it, and with RUST_LIB_BACKTRACE=0 (writes OUT.md/.json)")
    args = ap.parse_args()

    rates = {k: float(v) for k, v in (x.split("=") for x in args.rates.split(","))}
    rates["grow"] = args.grow_rate
    fuse = not args.no_fuse and os.geteuid() == 0 and os.path.exists("/dev/fuse") and shutil.which("fusermount3")
    if not fuse:
        rates.pop("fuse", None)
    server_env = dict(x.split("=", 1) for x in args.server_env)
    bin = os.path.abspath(args.locus_bin)
    if not os.access(bin, os.X_OK):
        print(f"soak: no locus binary at {bin} (--locus-bin)", file=sys.stderr)
        return 2
    out = os.path.abspath(args.out)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    if args.backtrace_probe:
        return backtrace_probe(bin, out)

    work = Path(tempfile.mkdtemp(prefix="locus-soak-", dir=args.work_dir))
    cluster = Cluster(bin, work, args.split, server_env, args.mem_quota)
    stats, stop = Stats(), threading.Event()
    mount: FuseMount | None = None
    loads: list[Load] = []
    sampler = None
    interrupted = []
    signal.signal(signal.SIGTERM, lambda *_: (interrupted.append(1), stop.set()))
    try:
        cluster.start()
        print(f"soak: cluster up ({'split' if args.split else 'local start'}), pids {cluster.pids()}, work {work}",
              flush=True)
        sampler = Sampler(cluster, stats, args.sample_every, str(cluster.data), bin, lambda: stats.ops.get("grow", 0))
        meta = {
            "command": " ".join([os.path.relpath(sys.argv[0], ROOT) if sys.argv[0].startswith(str(ROOT)) else sys.argv[0],
                                 *sys.argv[1:]]),
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "bin": bin,
            "bin_size_mib": round(os.path.getsize(bin) / MiB),
            "bin_version": subprocess.run([bin, "--version"], capture_output=True, text=True).stdout.strip(),
            "cluster": ("`locus master` + `locus worker` + `locus gateway` (3 processes)" if args.split else
                        "`locus local start` (master, 1 worker and the S3 gateway in one process)")
            + f", MEM tier {args.mem_quota}",
            "machine": f"{os.cpu_count()} cores, {os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') // MiB} MiB, "
                       f"Linux {platform.release()}",
            "thp": read("/sys/kernel/mm/transparent_hugepage/enabled").strip() if os.path.exists(
                "/sys/kernel/mm/transparent_hugepage/enabled") else "?",
            "server_env": " ".join(args.server_env), "rates": rates, "duration": args.duration, "idle": args.idle,
            "pids": cluster.pids(), "work": str(work), "fuse": bool(fuse),
            "import_objects": args.import_objects, "import_at": args.import_at,
            "env_of_note": {k: v for k, v in os.environ.items() if k.startswith(("RUST_BACKTRACE", "RUST_LIB_BACKTRACE",
                                                                                  "MALLOC_", "MIMALLOC_"))}}
        snaps = [sampler.snapshot("start (cluster up, before any load)")]
        sampler.sample(full=True)
        if fuse:
            mount = FuseMount(cluster, work / "mnt", work / "fuse.log")
            sampler.extra_pids["fuse"] = mount.proc.pid
        sampler.phase = "load"
        sampler.th.start()
        endpoint = f"http://{cluster.gateway}"
        kinds = {"s3": S3Load, "grow": GrowLoad, "cli": CliLoad, "py": PyLoad, "fuse": FuseLoad, "search": SearchLoad}
        for i, (k, rate) in enumerate(rates.items()):
            if rate <= 0:
                continue
            ld = kinds[k](stats, stop, rate, args.seed + i)
            ld.endpoint, ld.cluster, ld.tmpdir = endpoint, cluster, str(work)
            ld.mnt = str(work / "mnt")
            ld.grown = lambda: stats.ops.get("grow", 0)
            loads.append(ld)
        if args.import_objects:
            imp = ImportLoad(stats, stop, args.import_objects, args.import_at, cluster, str(work), args.import_file)
            loads.append(imp)
        for ld in loads:
            ld.start()
            if ld.kind == "s3":
                time.sleep(1)  # it makes the buckets
        t_end = time.monotonic() + args.duration
        while time.monotonic() < t_end and not stop.is_set():
            stop.wait(min(60, max(0, t_end - time.monotonic())))
            s = sampler.samples[-1] if sampler.samples else None
            if s:
                p = s["procs"].get(next(iter(cluster.pids())), {})
                print(f"soak: t={s['t']:.0f}s rss={fmt_mib(p.get('VmRSS'))}MiB anon={fmt_mib(p.get('RssAnon'))} "
                      f"fds={p.get('fds')} thr={p.get('tasks')} ops={sum(s['ops'].values())} "
                      f"errors={sum(s['errors'].values())} grown={s.get('grown')}", flush=True)
            for n, p in cluster.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{n} exited with {p.returncode}:\n{cluster.log_tail()}")
        stop.set()
        for ld in loads:
            ld.join(timeout=120)
            if ld.is_alive():
                stats.err(ld.kind, "stop", f"still running {ld.current[0]} after 120 s")
        snaps.append(sampler.snapshot("end of load"))
        if mount:
            mount.stop()
            sampler.extra_pids.pop("fuse", None)
            mount = None
        loads.clear()
        import gc
        gc.collect()
        sampler.phase = "idle"
        if not interrupted:
            time.sleep(args.idle)
        sampler.stop_ev.set()
        sampler.th.join(timeout=30)
        sampler.sample(full=True)
        snaps.append(sampler.snapshot(f"end of idle ({args.idle:.0f} s after the load)"))
        cluster.stop()  # MIMALLOC_SHOW_STATS=1 prints at exit: keep the logs' tails
        meta["log_tail"] = {p.name: p.read_text(errors="replace").splitlines()[-120:] for p in cluster.logs}
        summ = write_report(out, meta, sampler.samples, sampler.minutely, snaps, stats, args.duration)
        main_p = next(iter(summ))
        s = summ[main_p]
        print(f"soak: {main_p} RSS MiB start {fmt_mib(s['VmRSS']['start'])} end-of-load {fmt_mib(s['VmRSS']['end_load'])}"
              f" end-of-idle {fmt_mib(s['VmRSS']['end_idle'])} slope {s['VmRSS'].get('slope_mib_per_h')} MiB/h; "
              f"ops {sum(stats.ops.values())} errors {sum(stats.errors.values())}; wrote {out}.md, {out}.json", flush=True)
        return 0
    except BaseException:
        if sampler and sampler.samples:
            try:
                write_report(out + "-partial", {"command": " ".join(sys.argv), "date": time.ctime(), "bin": bin,
                                                "bin_size_mib": 0, "cluster": "", "machine": "", "thp": "",
                                                "server_env": "", "rates": rates, "duration": args.duration,
                                                "idle": args.idle},
                             sampler.samples, sampler.minutely, [], stats, args.duration)
            except Exception:  # noqa: BLE001
                pass
        print(cluster.log_tail(), file=sys.stderr)
        raise
    finally:
        stop.set()
        if sampler:
            sampler.stop_ev.set()
        if mount:
            mount.stop()
        cluster.cleanup()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
