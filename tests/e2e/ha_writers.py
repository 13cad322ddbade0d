"""The master-group tests' group and writers (test_ha.py, test_ha_restarts.py): three
masters, two workers and a gateway (bench/ha.py), S3 writers through the gateway and a CLI
writer, with each acknowledged write's digest, to read back."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from conftest import LOCUS_BIN, gw_client, sha256
from ha import LocusGroup, Threads  # bench/ha.py: the same group the failover benchmark runs

WRITERS = 32


@pytest.fixture
def group(tmp: Path):
    g = LocusGroup(LOCUS_BIN, tmp / "g", tmp)
    try:
        yield g.start()
    finally:
        g.cleanup()


class Writers(Threads):
    """`n` S3 writers through the gateway and a CLI writer (`locus fs put`), each write's key,
    digest, begin and end, and every client error."""

    def __init__(self, group: LocusGroup, bucket: str, n: int = WRITERS):
        self.group, self.bucket = group, bucket
        self.stop, self.lock = threading.Event(), threading.Lock()
        self.acked: list[tuple[str, str, float, float]] = []
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self._s3, args=(w,)) for w in range(n)]
        self.threads.append(threading.Thread(target=self._cli))

    def _s3(self, w: int):
        c = gw_client(f"http://{self.group.gateway}")
        n = 0
        while not self.stop.is_set():
            n += 1
            key, body = f"w{w}/{n}", os.urandom(4096 + 97 * n % 60000)
            start = time.monotonic()
            try:
                c.put_object(Bucket=self.bucket, Key=key, Body=body)
                with self.lock:
                    self.acked.append((key, sha256(body), start, time.monotonic()))
            except Exception as e:  # noqa: BLE001 - every failure is a finding
                with self.lock:
                    self.errors.append(f"{key}: {e}")

    def _cli(self):
        n = 0
        while not self.stop.is_set():
            n += 1
            body, start = os.urandom(10_000 + n), time.monotonic()
            r = self.group.cli("fs", "put", "-", f"/{self.bucket}/cli/{n}", input=body, timeout=120)
            with self.lock:
                if r.returncode == 0:
                    self.acked.append((f"cli/{n}", sha256(body), start, time.monotonic()))
                else:
                    self.errors.append(f"cli/{n}: exit {r.returncode}: {r.stderr.decode(errors='replace')}")

    def __enter__(self):
        gw_client(f"http://{self.group.gateway}").create_bucket(Bucket=self.bucket)
        return super().__enter__()

    def between(self, t0: float, t1: float = float("inf")) -> list[float]:
        """The ends of the writes begun at or after `t0` and acknowledged before `t1`."""
        return [end for _, _, start, end in self.acked if start >= t0 and end < t1]

    def check_every_acknowledged_write(self):
        """No client error, and every acknowledged write reads back through the gateway."""
        assert not self.errors, f"{len(self.errors)} client errors, the first: {self.errors[:3]}"
        s3 = gw_client(f"http://{self.group.gateway}")
        for key, digest, _, _ in self.acked:
            assert sha256(s3.get_object(Bucket=self.bucket, Key=key)["Body"].read()) == digest, key
