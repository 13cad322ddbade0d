"""Restarts: the master keeps its mounts and namespace, workers keep their disk tiers."""

from __future__ import annotations

import json
import os
import shutil

from conftest import MiB, sha256, wait_until


def test_master_restart_keeps_mounts_and_namespace(cluster, s3, bucket, minio):
    c = cluster
    a = os.urandom(9 * MiB + 1)
    s3.put_object(Bucket=bucket, Key="p/a.bin", Body=a)
    s3.put_object(Bucket=bucket, Key="p/sub/b.txt", Body=b"bee")
    c.mount_s3("/data", bucket, "p", minio, "30s")
    c.ok("fs", "put", "-", "/local.txt", input=b"on the root UFS")
    assert sha256(c.cat("/data/a.bin")) == sha256(a)
    before = c.stat("/data/a.bin")
    assert before["cached_fraction"] == 1.0

    c.restart()

    lines = [json.loads(x) for x in c.ok("fs", "mount", "--json").decode().splitlines()]
    by_path = {m["path"]: m for m in lines}
    assert "/data" in by_path, lines
    assert by_path["/data"]["uri"] == f"s3://{bucket}/p"
    assert by_path["/data"]["sync_interval_ms"] == 30_000
    assert by_path["/"]["uri"] == f"file://{c.ufs_dir}"
    text = c.ok("fs", "mount").decode()
    assert f"s3://{bucket}/p  on  /data" in text, text
    assert "secret" not in json.dumps(c.report()["mounts"]), "report must not leak mount secrets"

    assert {e["name"] for e in c.ls_json("/data")} == {"a.bin", "sub"}
    assert [e["path"] for e in c.ls_json("/data/sub")] == ["/data/sub/b.txt"]
    assert sha256(c.cat("/data/a.bin")) == sha256(a)
    assert c.cat("/data/sub/b.txt") == b"bee"
    assert c.cat("/local.txt") == b"on the root UFS"
    after = c.stat("/data/a.bin")
    assert after["fingerprint"] == before["fingerprint"]
    assert [b["id"] for b in after["blocks"]] == [b["id"] for b in before["blocks"]]


def test_worker_disk_tier_survives_restart(cluster_factory, s3, bucket, minio, tmp):
    ssd = tmp / "ssd"
    c = cluster_factory(args=["--tier", f"SSD:{ssd}:1GiB", "--block-size", "8MiB"])
    r = c.report()
    assert set(r["capacity"]) == {"SSD"}, r["capacity"]
    data = os.urandom(20 * MiB + 99)  # three 8 MiB blocks
    s3.put_object(Bucket=bucket, Key="p/d.bin", Body=data)
    c.mount_s3("/data", bucket, "p", minio, "60s")

    c.ok("fs", "load", "/data/d.bin")
    st = c.stat("/data/d.bin")
    assert st["cached_fraction"] == 1.0
    assert len(st["blocks"]) == 3
    assert all([x["tier"] for x in b["locations"]] == ["SSD"] for b in st["blocks"]), st
    worker_id = st["blocks"][0]["locations"][0]["worker_id"]
    names = sorted(p.name for p in (ssd / "w0" / "blocks").iterdir())
    block_files = [n for n in names if not n.endswith(".crc")]
    assert block_files == sorted(str(b["id"]) for b in st["blocks"]), names
    assert sorted(n for n in names if n.endswith(".crc")) == sorted(f"{b}.crc" for b in block_files), \
        "each block keeps its checksum beside it"

    c.restart()

    def cached():
        s = c.stat("/data/d.bin")
        return s if s["cached_fraction"] == 1.0 else None

    st2 = wait_until(cached, timeout=10, what="blocks reported again after the restart")
    assert [b["id"] for b in st2["blocks"]] == [b["id"] for b in st["blocks"]]
    for b in st2["blocks"]:
        assert [(x["worker_id"], x["tier"]) for x in b["locations"]] == [(worker_id, "SSD")], b

    b0 = c.counters()
    assert sha256(c.cat("/data/d.bin")) == sha256(data)
    d = c.delta(b0)
    assert d["ufs"] == 0, f"a read after the restart went to the UFS: {d}"
    assert d["short_circuit"] == len(data), d


def test_reset_data_dir_with_a_surviving_mem_tier_never_serves_old_blocks(cluster_factory):
    """`kill -9`, then the data dir (the master's namespace) removed while the tmpfs MEM
    tier survives: the new namespace numbers its blocks from the start again, so the
    worker must drop the old blocks before anything uses their ids."""
    c = cluster_factory(args=["--block-size", "8MiB"])
    old, new = os.urandom(20 * MiB), os.urandom(20 * MiB)
    c.ok("fs", "put", "--write-type", "MUST_CACHE", "-", "/f.bin", input=old)
    old_ids = [b["id"] for b in c.stat("/f.bin")["blocks"]]
    c.kill()
    shutil.rmtree(c.data_dir)
    c.start()
    c.ok("fs", "put", "--write-type", "MUST_CACHE", "-", "/g.bin", input=new)
    st = c.stat("/g.bin")
    assert [b["id"] for b in st["blocks"]] == old_ids, "the test needs colliding block ids"
    assert st["cached_fraction"] == 1.0
    assert sha256(c.cat("/g.bin")) == sha256(new)
    assert "dropped the blocks of another cluster" in c.log_paths[-1].read_text()
