"""`fs free` and `fs pin` must have taken effect on the workers when they return.

Workers hear from the master in heartbeats. Here the interval is raised to 4 s and each
test starts its commands right after a heartbeat, so a command that only recorded its
change in the master (and left the workers to learn it on their next heartbeat) is
caught every time: the follow-up command runs in that window.
"""

from __future__ import annotations

import os

from conftest import MiB, sha256, wait_until

SLOW_HEARTBEAT = {"LOCUS_WORKER__HEARTBEAT_INTERVAL": "4s", "LOCUS_MASTER__WORKER_TIMEOUT": "30s"}


def just_after_heartbeat(c):
    """Return once every worker heartbeated less than 0.3 s ago: the next one is ~4 s away."""
    wait_until(lambda: all(w["last_heartbeat_ms_ago"] < 300 for w in c.report()["workers"]),
               timeout=15, interval=0.05, what="a fresh heartbeat")


def test_read_right_after_free_leaves_the_file_cached(cluster_factory, s3, bucket, minio):
    c = cluster_factory(args=["--block-size", "4MiB"], env=SLOW_HEARTBEAT)
    data = os.urandom(8 * MiB + 1)
    s3.put_object(Bucket=bucket, Key="p/f.bin", Body=data)
    c.mount_s3("/data", bucket, "p", minio, "60s")
    assert sha256(c.cat("/data/f.bin")) == sha256(data)
    c.quiesce()
    assert c.stat("/data/f.bin")["cached_fraction"] == 1.0

    just_after_heartbeat(c)
    c.ok("fs", "free", "/data/f.bin")
    assert sha256(c.cat("/data/f.bin")) == sha256(data)  # a CACHE read: it must leave F cached
    c.quiesce()
    c.quiesce()  # the removals, then the commits that follow them
    st = c.stat("/data/f.bin")
    blocks = c.report()["workers"][0]["tiers"][0]["blocks"]
    assert (st["cached_fraction"], blocks) == (1.0, 3), \
        f"cached_fraction {st['cached_fraction']}, worker blocks {blocks}"


def test_pin_protects_at_once(cluster_factory, s3, bucket, minio):
    c = cluster_factory(args=["--block-size", "8MiB", "--mem-quota", "64MiB"], env=SLOW_HEARTBEAT)
    hot = os.urandom(16 * MiB)
    s3.put_object(Bucket=bucket, Key="p/hot.bin", Body=hot)
    for i in range(6):
        s3.put_object(Bucket=bucket, Key=f"p/o/f{i}.bin", Body=os.urandom(16 * MiB))
    c.mount_s3("/data", bucket, "p", minio, "60s")
    c.ok("fs", "load", "/data/hot.bin")
    assert c.stat("/data/hot.bin")["cached_fraction"] == 1.0

    just_after_heartbeat(c)
    assert "pinned 1 file(s)" in c.ok("fs", "pin", "/data/hot.bin").decode()
    c.ok("fs", "load", "-R", "/data/o")  # 96 MiB through a 64 MiB tier
    c.quiesce()
    c.wait_report(lambda r: r["cache"]["evictions"] > 0, what="evictions")
    assert c.stat("/data/hot.bin")["cached_fraction"] == 1.0, "the pinned file was evicted"
