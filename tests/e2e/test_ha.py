"""Three masters with the real binary (`locus master --raft-address A --peers A,B,C`), two
workers and an S3 gateway, all given the three masters: the leader killed (SIGKILL) under
32 S3 writers and a CLI writer loses no acknowledged write and shows no client an error;
the killed master started again rejoins as a follower and catches up."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from conftest import LOCUS_BIN, gw_client, sha256
from ha import LocusGroup  # bench/ha.py: the same group the failover benchmark runs

WRITERS = 32


@pytest.fixture
def group(tmp: Path):
    g = LocusGroup(LOCUS_BIN, tmp / "g", tmp)
    try:
        yield g.start()
    finally:
        g.cleanup()


def test_the_leader_killed_under_load_loses_no_acknowledged_write(group: LocusGroup):
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
            r = group.run("fs", "put", "-", f"/failover/cli/{n}", input=body, timeout=120)
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
        group.kill_master(old)
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
