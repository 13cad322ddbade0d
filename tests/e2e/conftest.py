"""Fixtures for the end-to-end suite: a real MinIO server and real `locus` processes.

Environment:
  LOCUS_BIN  the locus binary (default: $CARGO_TARGET_DIR/debug/locus, else ./target/debug/locus)
  MINIO_BIN  the minio binary (default: $LOCUS_TOOLS_DIR/bin/minio, else ~/.cache/locus-tools/bin/minio)

One file of about 800 lines because pytest takes a suite's shared fixtures from its
conftest.py: MinIO, the clusters, the gateway and the RGW are each used by many test files.

Every process listens on 127.0.0.1 on ports picked free at start. Processes are stopped
by PID (SIGTERM, then wait, then SIGKILL); nothing is ever killed by name.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MINIO_USER = "minioadmin"
MINIO_PASSWORD = "minioadmin"
MiB = 1 << 20


def _default_locus_bin() -> Path:
    target = os.environ.get("CARGO_TARGET_DIR") or str(REPO / "target")
    return Path(target) / "debug" / "locus"


def _default_minio_bin() -> Path:
    tools = os.environ.get("LOCUS_TOOLS_DIR") or str(Path.home() / ".cache" / "locus-tools")
    return Path(tools) / "bin" / "minio"


# One free-port helper for the tests and the benchmark harness (never hands out a port twice).
sys.path.insert(0, str(REPO / "bench"))
from netstage import free_port  # noqa: E402

LOCUS_BIN = Path(os.environ.get("LOCUS_BIN") or _default_locus_bin())
MINIO_BIN = Path(os.environ.get("MINIO_BIN") or _default_minio_bin())


# --------------------------------------------------------------------------- helpers


def clean_env(extra: dict | None = None) -> dict:
    """The environment for locus processes: every LOCUS_* variable of ours removed.

    locus reads all LOCUS_* variables as configuration and rejects unknown ones, so the
    LOCUS_BIN and LOCUS_TOOLS_DIR of the test harness must not reach it."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("LOCUS_")}
    if extra:
        e.update(extra)
    return e


def sha256(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def wait_until(pred, timeout: float = 10.0, interval: float = 0.1, what: str = "condition"):
    """Poll `pred` until it returns a truthy value; return it, or fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        last = pred()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def stop_process(p: subprocess.Popen, timeout: float = 20.0) -> int:
    """SIGTERM the process by PID, wait; SIGKILL if it does not exit in time."""
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)
    return p.returncode


def shm_tag(data_dir: Path) -> Path:
    """The MEM tier directory `local start` derives from its data dir."""
    tag = "".join(c if (c.isascii() and c.isalnum()) else "_" for c in str(Path(data_dir).absolute()))
    return Path("/dev/shm") / f"locus{tag}"


def assert_one_line_error(r: subprocess.CompletedProcess, code: int | None = None) -> str:
    """A failed CLI call: non-zero exit, exactly one stderr line starting with `locus: `."""
    err = r.stderr.decode(errors="replace")
    assert r.returncode != 0, f"expected failure, got exit 0 (stdout={r.stdout[:200]!r}, stderr={err!r})"
    if code is not None:
        assert r.returncode == code, f"expected exit {code}, got {r.returncode}: {err!r}"
    lines = err.rstrip("\n").split("\n")
    assert len(lines) == 1, f"expected a one-line error, got {len(lines)} lines: {err!r}"
    assert lines[0].startswith("locus: "), f"error must start with 'locus: ': {err!r}"
    assert len(lines[0]) > len("locus: ") + 3, f"error message is empty: {err!r}"
    return lines[0]


# --------------------------------------------------------------------------- CLI


class Locus:
    """Runs `locus` client commands against one master address."""

    def __init__(self, master: str, web: str | None = None, token_file: Path | None = None,
                 client_env: dict | None = None):
        self.master = master
        self.web = web
        # The cluster's client token (the master writes it); every client command presents it.
        self.token_file = token_file
        # More variables every client command gets (LOCUS_SECURITY__TLS_CA_FILE for a TLS cluster).
        self.client_env = dict(client_env or {})

    def env(self, extra: dict | None = None) -> dict:
        """The environment for a client of this cluster: clean_env, plus its token file."""
        e = clean_env({"LOCUS_SECURITY__TOKEN_FILE": str(self.token_file)} if self.token_file else None)
        e.update(self.client_env)
        e.update(extra or {})
        return e

    def run(self, *args, input: bytes | None = None, timeout: float = 120, env: dict | None = None,
            check: bool = False) -> subprocess.CompletedProcess:
        e = self.env(env)
        cmd = [str(LOCUS_BIN), "--master", self.master, *map(str, args)]
        r = subprocess.run(cmd, input=input, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=timeout, env=e)
        if check and r.returncode != 0:
            raise AssertionError(
                f"{' '.join(cmd)} failed with exit {r.returncode}: {r.stderr.decode(errors='replace')}")
        return r

    def popen(self, *args) -> subprocess.Popen:
        cmd = [str(LOCUS_BIN), "--master", self.master, *map(str, args)]
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                env=self.env())

    def ok(self, *args, **kw) -> bytes:
        """Run a command that must succeed; return its stdout."""
        return self.run(*args, check=True, **kw).stdout

    def fs(self, *args, **kw) -> subprocess.CompletedProcess:
        return self.run("fs", *args, **kw)

    def report(self) -> dict:
        return json.loads(self.ok("report", "--json", timeout=30))

    def try_report(self) -> dict | None:
        try:
            r = self.run("report", "--json", timeout=30)
        except subprocess.TimeoutExpired:
            return None
        if r.returncode != 0:
            return None
        return json.loads(r.stdout)

    def stat(self, path: str) -> dict:
        return json.loads(self.ok("fs", "stat", "--json", path))

    def cat(self, path: str, *flags) -> bytes:
        return self.ok("fs", *flags, "cat", path)

    def ls_json(self, path: str, recursive: bool = False) -> list[dict]:
        args = ["fs", "ls", "--json"] + (["-R"] if recursive else []) + [path]
        return [json.loads(x) for x in self.ok(*args).decode().splitlines() if x.strip()]

    def mount_s3(self, path: str, bucket: str, prefix: str, endpoint: str, sync: str | None = "1s", *extra):
        args = ["fs", "mount", path, f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}",
                "--option", f"endpoint={endpoint}",
                "--option", f"access_key_id={MINIO_USER}",
                "--option", f"secret_access_key={MINIO_PASSWORD}"]
        if sync:
            args += ["--sync-interval", sync]
        return self.ok(*args, *extra)

    # counters --------------------------------------------------------------------

    def bytes_read(self) -> dict:
        return self.report()["bytes_read"]

    def wait_report(self, pred, timeout: float = 10.0, what: str = "report") -> dict:
        """Poll `report --json` until pred(report) holds (workers push counters every 1 s)."""
        last = {}

        def check():
            nonlocal last
            last = self.report()
            return last if pred(last) else None

        try:
            return wait_until(check, timeout=timeout, interval=0.2, what=what)
        except AssertionError as e:
            raise AssertionError(f"{e}; last report: {json.dumps(last)[:2000]}") from None

    def wait_bytes(self, base: dict, at_least: dict, timeout: float = 10.0) -> dict:
        """Wait until every bytes_read[k] - base[k] >= at_least[k]; return the deltas."""

        def pred(r):
            return all(r["bytes_read"][k] - base[k] >= v for k, v in at_least.items())

        r = self.wait_report(pred, timeout=timeout, what=f"bytes_read to grow by {at_least} from {base}")
        return {k: r["bytes_read"][k] - base[k] for k in base}

    def quiesce(self, timeout: float = 10.0) -> dict:
        """Return a report whose counters include everything done before this call: every
        live worker has sent a heartbeat since (heartbeats carry the counters)."""
        done = time.monotonic()

        def fresh():
            t0 = time.monotonic()
            r = self.report()
            ws = [w for w in r["workers"] if w["live"]]
            ok = ws and all(t0 - w["last_heartbeat_ms_ago"] / 1000 > done + 0.05 for w in ws)
            return r if ok else None

        return wait_until(fresh, timeout=timeout, interval=0.1, what="a heartbeat after the last operation")

    def counters(self) -> dict:
        """bytes_read after quiescing (a base for deltas)."""
        return dict(self.quiesce()["bytes_read"])

    def delta(self, base: dict) -> dict:
        """bytes_read growth since `base`, counting everything done before this call."""
        now = self.quiesce()["bytes_read"]
        return {k: now[k] - base[k] for k in base}

    def web_get(self, path: str, auth: str | None = "bearer") -> tuple[int, dict, str]:
        """GET `path` of the master's web port: (status, headers, body). It needs the client
        token: `auth` "bearer" sends it as `Authorization: Bearer`, "basic" as the password
        of HTTP Basic, None sends nothing, any other text is the header's value."""
        assert self.web, "no web address"
        headers = {}
        if auth in ("bearer", "basic"):
            token = Path(self.token_file).read_text().strip()
            headers["Authorization"] = (f"Bearer {token}" if auth == "bearer" else
                                        "Basic " + base64.b64encode(f"prometheus:{token}".encode()).decode())
        elif auth:
            headers["Authorization"] = auth
        req = urllib.request.Request(f"http://{self.web}{path}", headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read().decode()

    def metrics(self) -> str:
        status, _, body = self.web_get("/metrics")
        assert status == 200, f"/metrics answered {status}: {body[:500]}"
        return body


# --------------------------------------------------------------------------- clusters


class Cluster(Locus):
    """`locus local start` as a subprocess with its own data dir and free ports."""

    def __init__(self, data_dir: Path, log_dir: Path, workers: int = 1, args=(), env: dict | None = None,
                 client_env: dict | None = None):
        super().__init__(f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}",
                         token_file=Path(data_dir).absolute() / "client.token", client_env=client_env)
        self.gateway = f"127.0.0.1:{free_port()}"
        self.data_dir = Path(data_dir)
        self.log_dir = Path(log_dir)
        self.workers = workers
        self.args = list(args)
        self.extra_env = env or {}
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.log_paths: list[Path] = []
        self.shm_dirs = {shm_tag(self.data_dir)}

    @property
    def ufs_dir(self) -> Path:
        return self.data_dir / "ufs"

    def start(self, timeout: float = 60.0) -> "Cluster":
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.starts += 1
        log = self.log_dir / f"{self.data_dir.name}-start{self.starts}.log"
        self.log_paths.append(log)
        env = clean_env({
            "LOCUS_MASTER__WEB_ADDRESS": self.web,
            "LOCUS_WORKER__DATA_ADDRESS": "127.0.0.1:0",
            "LOCUS_GATEWAY__ADDRESS": self.gateway,
            "RUST_LOG": os.environ.get("RUST_LOG", "info"),
        })
        env.update(self.extra_env)
        cmd = [str(LOCUS_BIN), "--master", self.master, "local", "start", "--data-dir", str(self.data_dir),
               "--workers", str(self.workers), *map(str, self.args)]
        with open(log, "ab") as f:
            f.write(f"$ {' '.join(cmd)}\n".encode())
            f.flush()
            self.proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"locus local start exited with {self.proc.returncode}:\n{self.log_tail()}")
            r = self.try_report()
            if r is not None and r.get("live_workers") == self.workers:
                return self
            if time.monotonic() > deadline:
                raise AssertionError(f"cluster not ready after {timeout}s:\n{self.log_tail()}")
            time.sleep(0.2)

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        rc = stop_process(self.proc)
        return rc

    def kill(self):
        """SIGKILL (by PID): no clean shutdown."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=10)

    def restart(self) -> "Cluster":
        rc = self.stop()
        assert rc == 0, f"local start exited with {rc} on SIGTERM:\n{self.log_tail()}"
        return self.start()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n: int = 60) -> str:
        out = []
        for p in self.log_paths[-2:]:
            try:
                lines = p.read_text(errors="replace").splitlines()
            except OSError:
                continue
            out.append(f"--- {p} (last {n} lines)")
            out.extend(lines[-n:])
        return "\n".join(out)

    def cleanup(self):
        self.stop()
        for d in self.shm_dirs:
            shutil.rmtree(d, ignore_errors=True)


class Standalone(Locus):
    """A `locus master` and `workers` `locus worker` processes, each its own process, so
    that any of them can be killed (SIGKILL) and started again."""

    def __init__(self, base: Path, log_dir: Path, root_ufs: str = "none", mem_quota: str = "256MiB",
                 workers: int = 1, env: dict | None = None, tiers: list[str] | None = None):
        super().__init__(f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}",
                         token_file=Path(base).absolute() / "client.token")
        self.base = base
        self.log_dir = log_dir
        self.root_ufs = root_ufs
        self.shm = Path("/dev/shm") / f"locus-e2e-{uuid.uuid4().hex[:12]}"
        self.mem_quota = mem_quota
        self.n_workers = workers
        # The master makes the cluster secret and the client token here; workers read the secret.
        self.proc_env = {"LOCUS_SECURITY__SECRET_FILE": str(Path(base).absolute() / "cluster.secret"),
                         "LOCUS_SECURITY__TOKEN_FILE": str(self.token_file), **(env or {})}
        # ALIAS:DIR:QUOTA per tier; worker i uses DIR/w<i>. Default: one MEM tier.
        self.tiers = tiers or [f"MEM:{self.shm}:{mem_quota}"]
        self.procs: list[subprocess.Popen] = []
        self.logs: list[Path] = []
        self.master_proc: subprocess.Popen | None = None
        self.worker_procs: list[subprocess.Popen | None] = [None] * workers

    @property
    def worker_proc(self) -> subprocess.Popen | None:
        return self.worker_procs[0]

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        log = self.log_dir / f"{self.base.name}-{name}.log"
        if log not in self.logs:
            self.logs.append(log)
        env = clean_env(self.proc_env)
        cmd = [str(LOCUS_BIN), "--master", self.master, *args]
        with open(log, "ab") as f:
            f.write(f"$ {' '.join(cmd)}\n".encode())
            f.flush()
            p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        self.procs.append(p)
        return p

    def start(self, timeout: float = 60.0) -> "Standalone":
        self.start_master()
        for i in range(self.n_workers):
            self._spawn_worker(i)
        return self.wait_ready(timeout)

    def start_master(self):
        self.master_proc = self._spawn("master", [
            "master", "--root-ufs", self.root_ufs, "--rpc-address", self.master, "--web-address", self.web,
            "--meta-dir", str(self.base / "master")])

    def _spawn_worker(self, i: int):
        tiers = []
        for t in self.tiers:
            alias, d, quota = t.split(":")
            tiers += ["--tier", f"{alias}:{d}/w{i}:{quota}"]
        self.worker_procs[i] = self._spawn(f"worker{i}", [
            "worker", "--data-address", "127.0.0.1:0", "--data-dir", str(self.base / f"worker{i}"), *tiers])

    def start_worker(self, i: int = 0, timeout: float = 60.0) -> "Standalone":
        self._spawn_worker(i)
        return self.wait_ready(timeout)

    def wait_ready(self, timeout: float = 60.0, live: int | None = None) -> "Standalone":
        """Wait until the master answers and `live` workers (default: all running) are live."""
        deadline = time.monotonic() + timeout
        while True:
            running = [p for p in self.worker_procs if p is not None and p.poll() is None]
            for p in [self.master_proc, *running]:
                if p is not None and p.poll() is not None:
                    raise AssertionError(f"{p.args} exited with {p.returncode}:\n{self.log_tail()}")
            want = len(running) if live is None else live
            r = self.try_report()
            if r is not None and r.get("live_workers") == want:
                return self
            if time.monotonic() > deadline:
                raise AssertionError(f"standalone cluster not ready after {timeout}s: {r}\n{self.log_tail()}")
            time.sleep(0.2)

    def stop_worker(self, i: int = 0) -> int:
        return stop_process(self.worker_procs[i])

    def kill_worker(self, i: int):
        """SIGKILL worker `i` (no clean shutdown)."""
        self.worker_procs[i].kill()
        self.worker_procs[i].wait()

    def kill_master(self):
        self.master_proc.kill()
        self.master_proc.wait()

    def alive(self) -> bool:
        return all(p.poll() is None for p in [self.master_proc, *self.worker_procs] if p is not None)

    def log_tail(self, n: int = 40) -> str:
        out = []
        for p in self.logs:
            try:
                out.append(f"--- {p}")
                out.extend(p.read_text(errors="replace").splitlines()[-n:])
            except OSError:
                pass
        return "\n".join(out)

    def cleanup(self):
        for p in reversed(self.procs):
            stop_process(p)
        shutil.rmtree(self.shm, ignore_errors=True)


class MinioServer:
    """A MinIO process; stop() and start() again keep its port and data."""

    def __init__(self, data: Path, log: Path, user: str = MINIO_USER, password: str = MINIO_PASSWORD):
        self.data = Path(data)
        self.data.mkdir(parents=True, exist_ok=True)
        self.log = Path(log)
        self.user, self.password = user, password
        self.port, self.console = free_port(), free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> str:
        env = dict(clean_env(), MINIO_ROOT_USER=self.user, MINIO_ROOT_PASSWORD=self.password,
                   MINIO_BROWSER="off", MINIO_UPDATE="off", MINIO_CI_CD="1")
        with open(self.log, "ab") as f:
            self.proc = subprocess.Popen(
                [str(MINIO_BIN), "server", str(self.data), "--address", f"127.0.0.1:{self.port}",
                 "--console-address", f"127.0.0.1:{self.console}", "--quiet"],
                stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        p = self.proc

        def live():
            if p.poll() is not None:
                raise AssertionError(
                    f"minio exited with {p.returncode}: {self.log.read_text(errors='replace')[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.endpoint}/minio/health/live", timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False

        wait_until(live, timeout=60, interval=0.2, what="MinIO to become live")
        return self.endpoint

    def stop(self):
        if self.proc is not None:
            stop_process(self.proc)


# --------------------------------------------------------------------------- fixtures


def pytest_configure(config):
    # scripts/test runs the suite on two pytest-xdist workers (`-n 2 --dist loadfile -m
    # "not serial"`: each file's tests on one worker, so a module's fixed resources, such
    # as the RGW's ports, are never started twice), then the serial tests alone.
    config.addinivalue_line("markers", "serial: measures latency, so runs with no other test beside it")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)


def _failed(request) -> bool:
    rep = getattr(request.node, "rep_call", None)
    return rep is None or rep.failed


@pytest.fixture(scope="session", autouse=True)
def _binaries():
    assert LOCUS_BIN.is_file() and os.access(LOCUS_BIN, os.X_OK), \
        f"locus binary not found at {LOCUS_BIN} (build it with `cargo build -p locus` or set LOCUS_BIN)"
    assert MINIO_BIN.is_file() and os.access(MINIO_BIN, os.X_OK), \
        f"minio binary not found at {MINIO_BIN} (scripts/test builds it; or set MINIO_BIN)"


@pytest.fixture(scope="session", autouse=True)
def _hadoop_connector():
    """LOCUS_HADOOP_JAR and LOCUS_HADOOP_LIB, the Hadoop connector's jar and library, which
    sparkutil puts into every SparkSession (the first session of the process fixes the
    JVM's class path). scripts/test sets them; otherwise they are built here, once."""
    if not (os.environ.get("LOCUS_HADOOP_JAR") and os.environ.get("LOCUS_HADOOP_LIB")):
        r = subprocess.run([str(REPO / "scripts" / "build-hadoop-connector"), sys.executable],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=1800)
        assert r.returncode == 0, f"scripts/build-hadoop-connector failed:\n{r.stderr.decode()[-3000:]}"
        jar, lib = r.stdout.decode().split()[-2:]
        os.environ["LOCUS_HADOOP_JAR"], os.environ["LOCUS_HADOOP_LIB"] = jar, lib


@pytest.fixture(scope="session")
def e2e_tmp():
    """A short base directory (Unix socket paths must stay under 108 bytes)."""
    d = Path(tempfile.mkdtemp(prefix="locus-e2e-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def tmp(e2e_tmp, request) -> Path:
    """A short per-test directory."""
    name = re.sub(r"[^A-Za-z0-9]+", "", request.node.name.replace("test_", ""))[:20]
    d = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=e2e_tmp))
    return d


@pytest.fixture(scope="session")
def minio(e2e_tmp):
    """A MinIO server on 127.0.0.1 with a throwaway data dir. Yields its endpoint URL."""
    m = MinioServer(e2e_tmp / "minio-data", e2e_tmp / "minio.log")
    try:
        yield m.start()
    finally:
        m.stop()


@pytest.fixture
def own_minio(tmp):
    """A MinIO of this test's own, which it may stop and start again (the shared one must
    stay up for other tests). `.endpoint`, and `.s3`, a boto3 client of it."""
    m = MinioServer(tmp / "minio-own", tmp / "minio-own.log")
    m.start()
    m.s3 = s3_client(m.endpoint)
    try:
        yield m
    finally:
        m.stop()


def s3_client(endpoint: str):
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=MINIO_USER,
                        aws_secret_access_key=MINIO_PASSWORD, region_name="us-east-1",
                        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 3}))


def put_object(s3, bucket: str, key: str, data: bytes):
    """put_object, working around a stall: with this MinIO and boto3, the request after an
    empty-body PUT on the same connection waits 30 s. Empty objects go over a fresh client."""
    if data:
        s3.put_object(Bucket=bucket, Key=key, Body=data)
    else:
        one_off = s3_client(s3.meta.endpoint_url)
        one_off.put_object(Bucket=bucket, Key=key, Body=data)
        one_off.close()


@pytest.fixture(scope="session")
def s3(minio):
    return s3_client(minio)


@pytest.fixture
def bucket(s3) -> str:
    """A new, empty bucket for this test."""
    name = f"e2e-{uuid.uuid4().hex[:16]}"
    s3.create_bucket(Bucket=name)
    return name


@pytest.fixture
def cluster_factory(tmp, request):
    """make(workers=1, args=[...], env={...}, client_env={...}) -> a started Cluster. All are stopped and
    their /dev/shm tiers removed at teardown."""
    made: list[Cluster] = []

    def make(workers: int = 1, args=(), env: dict | None = None, name: str | None = None, start: bool = True,
             shm_dirs=(), client_env: dict | None = None) -> Cluster:
        d = tmp / (name or f"c{len(made)}")
        c = Cluster(d, tmp, workers=workers, args=args, env=env, client_env=client_env)
        c.shm_dirs.update(Path(s) for s in shm_dirs)
        made.append(c)
        if start:
            c.start()
        return c

    yield make
    for c in made:
        c.cleanup()
        if _failed(request):
            print(c.log_tail(80))


@pytest.fixture
def cluster(cluster_factory) -> Cluster:
    """One `locus local start` with one worker, a 1 GiB MEM tier and 8 MiB blocks. The
    blocks of deleted and overwritten files are retired for 2 s (not the default 60 s), so
    tests can see them go."""
    return cluster_factory(args=["--block-size", "8MiB"], env={"LOCUS_WORKER__STALE_BLOCK_GRACE": "2s"})


@pytest.fixture
def standalone_factory(tmp, request):
    made: list[Standalone] = []

    def make(**kw) -> Standalone:
        s = Standalone(tmp / f"s{len(made)}", tmp, **kw)
        made.append(s)
        return s.start()

    yield make
    for s in made:
        s.cleanup()
        if _failed(request):
            print(s.log_tail(80))


# --------------------------------------------------------------------------- S3 gateway

GW_KEY = "locusadmin"
GW_SECRET = "locusadmin"


def gw_client(endpoint: str, key: str = GW_KEY, secret: str = GW_SECRET, **cfg):
    """A boto3 client of the gateway with boto3's defaults (checksums included)."""
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=key, aws_secret_access_key=secret,
                        region_name="us-east-1",
                        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2}, **cfg))


class Gateway:
    """A cluster and its gateway with two buckets: `local`, a directory of the default
    file:// UFS, and `lake`, a mount of a real MinIO bucket."""

    def __init__(self, cluster: Cluster, minio_endpoint: str):
        self.cluster = cluster
        self.endpoint = f"http://{cluster.gateway}"
        self.minio = s3_client(minio_endpoint)
        self.minio_endpoint = minio_endpoint
        self.minio_bucket = f"lake-{uuid.uuid4().hex[:10]}"
        self.minio.create_bucket(Bucket=self.minio_bucket)
        cluster.mount_s3("/lake", self.minio_bucket, "", minio_endpoint, "1s")
        self.s3 = gw_client(self.endpoint)
        wait_until(lambda: _port_open(cluster.gateway), timeout=20, what="the gateway to listen")
        self.s3.create_bucket(Bucket="local")

    def new_bucket(self) -> str:
        name = f"b-{uuid.uuid4().hex[:12]}"
        self.s3.create_bucket(Bucket=name)
        return name


def _port_open(addr: str) -> bool:
    host, port = addr.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def gateway(e2e_tmp, minio, request):
    """One cluster (1 worker, 8 MiB blocks) with its S3 gateway, shared by a module."""
    d = Path(tempfile.mkdtemp(prefix="gw-", dir=e2e_tmp))
    c = Cluster(d / "c", d, workers=1, args=["--block-size", "8MiB"])
    try:
        c.start()
        yield Gateway(c, minio)
    finally:
        c.cleanup()
        if request.session.testsfailed:
            print(c.log_tail(80))


# --------------------------------------------------------------------------- Ceph RGW

# `tests/e2e/rgw/ceph-rgw-up.sh` starts a one-node Ceph with radosgw on 127.0.0.1:7480,
# keys locuskey / locussecret.
RGW_TOOLS = Path(os.environ.get("LOCUS_RGW_TOOLS") or REPO / "tests" / "e2e" / "rgw")
RGW_ENDPOINT = "http://127.0.0.1:7480"
RGW_KEY = "locuskey"
RGW_SECRET = "locussecret"
RGW_PACKAGES = ["radosgw", "ceph-mon", "ceph-osd", "ceph-mgr", "ceph-common"]


def _install_rgw() -> str | None:
    """Install Ceph's packages if radosgw is missing (as scripts/test does). Returns why
    they cannot be installed, or None when radosgw is there."""
    if shutil.which("radosgw"):
        return None
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return "radosgw is not installed and cannot be (needs root and apt-get: " \
               f"apt-get install -y {' '.join(RGW_PACKAGES)})"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *RGW_PACKAGES]):
        r = subprocess.run(cmd, env=env, capture_output=True, timeout=900)
        if r.returncode != 0:
            return f"cannot install Ceph RGW ({' '.join(cmd)}): {r.stderr.decode(errors='replace')[-300:]}"
    return None if shutil.which("radosgw") else "radosgw still missing after apt-get install"


def rgw_client():
    """A boto3 client of the RGW (path-style, its keys)."""
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=RGW_ENDPOINT, aws_access_key_id=RGW_KEY,
                        aws_secret_access_key=RGW_SECRET, region_name="us-east-1",
                        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 3}))


@pytest.fixture(scope="session")
def rgw(e2e_tmp):
    """A Ceph RGW (ceph-rgw-up.sh, objects in a 2 GiB memstore) for the session. Yields
    its endpoint. Skips only when the packages cannot be installed; stopped with
    ceph-rgw-down.sh (by the daemons' pid files)."""
    up, down = RGW_TOOLS / "ceph-rgw-up.sh", RGW_TOOLS / "ceph-rgw-down.sh"
    if not up.exists():
        pytest.fail(f"{up} is missing")
    why = _install_rgw()
    if why:
        pytest.skip(why)
    if _port_open("127.0.0.1:7480"):
        pytest.fail("127.0.0.1:7480 is in use: another RGW is running (stop it with ceph-rgw-down.sh)")
    d = e2e_tmp / "rgw"
    # The objects live in memory (memstore): the monitor's refusal to start below 5% free
    # disk (a build machine's usual state) guards nothing here.
    env = dict(os.environ, MEMSTORE_BYTES=str(2 << 30),
               CEPH_ARGS=(os.environ.get("CEPH_ARGS", "") + " --mon-data-avail-crit=1").strip())
    try:
        r = subprocess.run(["bash", str(up), str(d)], env=env, capture_output=True, timeout=300)
        if r.returncode != 0:
            raise AssertionError(f"ceph-rgw-up.sh failed ({r.returncode}): {r.stderr.decode(errors='replace')[-2000:]}")
        wait_until(lambda: _rgw_answers(), timeout=60, interval=0.5, what="RGW to answer S3 calls")
        yield RGW_ENDPOINT
    finally:
        subprocess.run(["bash", str(down), str(d)], capture_output=True, timeout=120)
        shutil.rmtree(d, ignore_errors=True)


def _rgw_answers() -> bool:
    try:
        rgw_client().list_buckets()
        return True
    except Exception:
        return False
