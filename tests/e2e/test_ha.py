"""Three masters with the real binary (`locus master --raft-address A --peers A,B,C`), two
workers and an S3 gateway, all given the three masters: the leader killed (SIGKILL) under
32 S3 writers and a CLI writer loses no acknowledged write and shows no client an error;
the killed master started again rejoins as a follower and catches up."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

from conftest import LOCUS_BIN, Locus, _port_open, clean_env, free_port, gw_client, sha256, stop_process, wait_until

WRITERS = 32


class Group(Locus):
    """A master group, its workers and a gateway, each its own process."""

    def __init__(self, base: Path, log_dir: Path, masters: int = 3, workers: int = 2):
        self.rpc = [f"127.0.0.1:{free_port()}" for _ in range(masters)]
        self.raft = [f"127.0.0.1:{free_port()}" for _ in range(masters)]
        self.webs = [f"127.0.0.1:{free_port()}" for _ in range(masters)]
        super().__init__(",".join(self.rpc), None, token_file=base.absolute() / "client.token")
        self.base, self.log_dir = base, log_dir
        self.gateway = f"127.0.0.1:{free_port()}"
        self.shm = Path("/dev/shm") / f"locus-e2e-{uuid.uuid4().hex[:12]}"
        self.secret = base.absolute() / "cluster.secret"
        self.proc_env = {"LOCUS_SECURITY__SECRET_FILE": str(self.secret),
                         "LOCUS_SECURITY__TOKEN_FILE": str(self.token_file), "RUST_LOG": "info"}
        self.masters: list[subprocess.Popen | None] = [None] * masters
        self.workers = workers
        self.procs: list[subprocess.Popen] = []
        self.logs: list[Path] = []

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        log = self.log_dir / f"{self.base.name}-{name}.log"
        self.logs.append(log)
        cmd = [str(LOCUS_BIN), "--master", self.master, *args]
        with open(log, "ab") as f:
            f.write(f"$ {' '.join(cmd)}\n".encode())
            f.flush()
            p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env=clean_env(self.proc_env))
        self.procs.append(p)
        return p

    def start_master(self, i: int):
        self.masters[i] = self._spawn(f"master{i}", [
            "master", "--root-ufs", f"file://{self.base.absolute() / 'ufs'}", "--rpc-address", self.rpc[i],
            "--web-address", self.webs[i], "--meta-dir", str(self.base / f"master{i}"),
            "--raft-address", self.raft[i], "--peers", ",".join(self.raft)])

    def start(self) -> "Group":
        # The first master makes the cluster secret; the others read the same file.
        self.start_master(0)
        wait_until(self.secret.exists, timeout=30, what="the cluster secret")
        for i in range(1, len(self.masters)):
            self.start_master(i)
        for i in range(self.workers):
            self._spawn(f"worker{i}", ["worker", "--data-address", "127.0.0.1:0",
                                       "--data-dir", str(self.base / f"worker{i}"),
                                       "--tier", f"MEM:{self.shm}/w{i}:256MiB"])
        self._spawn("gateway", ["gateway", "--address", self.gateway])
        self.wait_group(lambda g: len(g["members"]) == 3 and all(m["lag"] == 0 for m in g["members"]),
                        "3 members in step")
        wait_until(lambda: _port_open(self.gateway), timeout=30, what="the gateway to listen")
        return self

    def group(self) -> dict | None:
        r = self.try_report()
        return r and r.get("masters") and {**r["masters"], "live_workers": r["live_workers"]}

    def wait_group(self, pred, what: str, timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            for p in self.procs:
                # Only the masters a test kills (SIGKILL: a negative code) may be gone.
                if p.poll() is not None and p.returncode >= 0:
                    raise AssertionError(f"{p.args} exited with {p.returncode}:\n{self.log_tail()}")
            g = self.group()
            if g and g["live_workers"] == self.workers and pred(g):
                return g
            if time.monotonic() > deadline:
                raise AssertionError(f"the group is not {what} after {timeout}s: {g}\n{self.log_tail()}")
            time.sleep(0.2)

    def leader(self) -> int:
        g = self.wait_group(lambda g: any(m["role"] == "leader" for m in g["members"]), "led")
        return self.rpc.index(next(m["rpc_address"] for m in g["members"] if m["role"] == "leader"))

    def log_tail(self, n: int = 30) -> str:
        out = []
        for p in dict.fromkeys(self.logs):
            out.append(f"--- {p}")
            out.extend(p.read_text(errors="replace").splitlines()[-n:])
        return "\n".join(out)

    def cleanup(self):
        for p in reversed(self.procs):
            stop_process(p)
        shutil.rmtree(self.shm, ignore_errors=True)


@pytest.fixture
def group(tmp: Path):
    g = Group(tmp / "g", tmp)
    try:
        yield g.start()
    finally:
        g.cleanup()


def test_the_leader_killed_under_load_loses_no_acknowledged_write(group: Group):
    s3 = gw_client(f"http://{group.gateway}")
    s3.create_bucket(Bucket="failover")
    stop, acked, errors = threading.Event(), [], []
    lock = threading.Lock()

    def s3_writer(w: int):
        c = gw_client(f"http://{group.gateway}")
        n = 0
        while not stop.is_set():
            n += 1
            key, body = f"w{w}/{n}", os.urandom(4096 + 97 * n % 60000)
            start = time.monotonic()
            try:
                c.put_object(Bucket="failover", Key=key, Body=body)
                with lock:
                    acked.append((key, sha256(body), start, time.monotonic()))
            except Exception as e:  # noqa: BLE001 - every failure is a finding
                with lock:
                    errors.append(f"{key}: {e}")

    def cli_writer():
        n = 0
        while not stop.is_set():
            n += 1
            body, start = os.urandom(10_000 + n), time.monotonic()
            r = group.fs("put", "-", f"/failover/cli/{n}", input=body, timeout=120)
            with lock:
                if r.returncode == 0:
                    acked.append((f"cli/{n}", sha256(body), start, time.monotonic()))
                else:
                    errors.append(f"cli/{n}: exit {r.returncode}: {r.stderr.decode(errors='replace')}")

    threads = [threading.Thread(target=s3_writer, args=(w,)) for w in range(WRITERS)]
    threads.append(threading.Thread(target=cli_writer))
    for t in threads:
        t.start()
    try:
        time.sleep(3)
        old = group.leader()
        term = group.group()["term"]
        killed_at = time.monotonic()
        group.masters[old].kill()
        group.masters[old].wait()
        time.sleep(8)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=180)
    assert not errors, f"{len(errors)} client errors, the first: {errors[:3]}"
    after = [end for _, _, start, end in acked if start >= killed_at]
    assert len(after) >= WRITERS, f"only {len(after)} writes began and ended after the kill"
    print(f"first write begun after the kill acknowledged {min(after) - killed_at:.2f} s after it; "
          f"{len(acked)} writes acknowledged")

    g = group.wait_group(lambda g: any(m["role"] == "leader" for m in g["members"]), "led again")
    assert g["term"] > term
    assert group.leader() != old
    # Every acknowledged write reads back, through the gateway and the new leader.
    for key, digest, _, _ in acked:
        assert sha256(s3.get_object(Bucket="failover", Key=key)["Body"].read()) == digest, key

    # The killed master, started again, follows and catches up.
    group.start_master(old)
    group.wait_group(lambda g: len(g["members"]) == 3 and all(m["lag"] == 0 for m in g["members"])
                     and next(m["role"] for m in g["members"] if m["rpc_address"] == group.rpc[old]) == "follower",
                     "whole again")
