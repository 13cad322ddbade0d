"""Mount table operations: read-only mounts, unmount, and finding the master."""

from __future__ import annotations

import json
import os
import subprocess

from conftest import LOCUS_BIN, MiB, assert_one_line_error, sha256


def _keys(s3, bucket):
    return sorted((o["Key"], o["Size"]) for o in s3.list_objects_v2(Bucket=bucket).get("Contents", []))


def test_readonly_mount_refuses_writes(cluster, s3, bucket, minio, tmp):
    c = cluster
    data = os.urandom(MiB + 3)
    s3.put_object(Bucket=bucket, Key="ro/f.bin", Body=data)
    s3.put_object(Bucket=bucket, Key="ro/d/g.txt", Body=b"g")
    c.mount_s3("/ro", bucket, "ro", minio, "1s", "--readonly")
    before = _keys(s3, bucket)
    mounts = {m["path"]: m for m in (json.loads(x) for x in c.ok("fs", "mount", "--json").decode().splitlines())}
    assert mounts["/ro"]["readonly"] is True
    assert "ro, " in c.ok("fs", "mount").decode()

    assert sha256(c.cat("/ro/f.bin")) == sha256(data)
    local = tmp / "l"
    local.write_bytes(b"new")
    for args, kw in [
        (("fs", "put", local, "/ro/new.txt"), {}),
        (("fs", "put", "--overwrite", "-", "/ro/f.bin"), {"input": b"overwrite"}),
        (("fs", "mkdir", "/ro/newdir"), {}),
        (("fs", "rm", "/ro/f.bin"), {}),
        (("fs", "rm", "-R", "/ro/d"), {}),
        (("fs", "mv", "/ro/f.bin", "/ro/g.bin"), {}),
    ]:
        assert_one_line_error(c.run(*args, **kw), 5)
    assert _keys(s3, bucket) == before
    assert sha256(c.cat("/ro/f.bin")) == sha256(data)
    # Writes elsewhere still work.
    c.ok("fs", "put", local, "/rw.txt")
    c.ok("fs", "persist", "/rw.txt")
    assert (c.ufs_dir / "rw.txt").read_bytes() == b"new"


def test_unmount(cluster, s3, bucket, minio):
    c = cluster
    data = os.urandom(3 * MiB)
    s3.put_object(Bucket=bucket, Key="p/f.bin", Body=data)
    c.mount_s3("/data", bucket, "p", minio, "60s")
    assert sha256(c.cat("/data/f.bin")) == sha256(data)
    c.wait_report(lambda r: r["workers"][0]["tiers"][0]["blocks"] == 1, what="the block to be cached")
    assert_one_line_error(c.run("fs", "unmount", "/nope"), 3)
    assert_one_line_error(c.run("fs", "unmount", "/data/f.bin"), 3)

    out = c.ok("fs", "unmount", "/data").decode()
    assert out.strip() == "unmounted /data", out
    assert [m["path"] for m in c.report()["mounts"]] == ["/"]
    assert_one_line_error(c.run("fs", "cat", "/data/f.bin"), 3)
    assert "/data" not in [e["path"] for e in c.ls_json("/")]
    # The UFS is untouched; the cached blocks go.
    assert _keys(s3, bucket) == [("p/f.bin", len(data))]
    c.wait_report(lambda r: r["workers"][0]["tiers"][0]["blocks"] == 0, what="the unmounted file's block to go")
    # Mount again on the same path.
    c.mount_s3("/data", bucket, "p", minio, "60s")
    assert sha256(c.cat("/data/f.bin")) == sha256(data)


def test_master_address_from_environment_and_status_page(cluster):
    c = cluster
    c.ok("fs", "put", "-", "/hello.txt", input=b"hello")
    r = subprocess.run([str(LOCUS_BIN), "fs", "cat", "/hello.txt"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, env=c.env({"LOCUS_MASTER": c.master}), timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"hello"
    r = subprocess.run([str(LOCUS_BIN), "report"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       env=c.env({"LOCUS_MASTER": c.master}), timeout=60)
    assert r.returncode == 0, r.stderr
    assert b"Workers: 1 live" in r.stdout, r.stdout
    assert b"Bytes read by source" in r.stdout

    status, _, page = c.web_get("/")
    assert status == 200, page
    assert c.ufs_dir.as_posix() in page, page[:2000]
    status, _, body = c.web_get("/api/report", auth="basic")
    assert status == 200, body
    api = json.loads(body)
    cli = c.report()
    assert api["live_workers"] == cli["live_workers"] == 1
    assert api["mounts"] == cli["mounts"]
    assert set(api["bytes_read"]) == {"short_circuit", "local_worker", "remote_worker", "ufs"}
    m = c.metrics()
    assert "locus_workers_live 1" in m, m[:2000]
