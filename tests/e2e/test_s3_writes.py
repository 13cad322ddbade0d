"""Writes through Locus land in MinIO."""

from __future__ import annotations

import os

from conftest import MiB, assert_one_line_error, sha256


def _get(s3, bucket, key) -> bytes:
    return s3.get_object(Bucket=bucket, Key=key)["Body"].read()


def test_put_mkdir_mv_write_through_to_s3(cluster, s3, bucket, minio, tmp):
    c = cluster
    c.mount_s3("/data", bucket, "p", minio, "60s")
    data = os.urandom(20 * MiB + 3)  # several 4 MiB write chunks, three 8 MiB blocks
    src = tmp / "src"
    src.write_bytes(data)

    out = c.ok("fs", "put", src, "/data/up/x.bin").decode()
    assert out.strip().startswith(f"wrote /data/up/x.bin ({len(data)} bytes, "), out
    c.ok("fs", "persist", "/data/up/x.bin")
    assert sha256(_get(s3, bucket, "p/up/x.bin")) == sha256(data)
    assert sha256(c.cat("/data/up/x.bin")) == sha256(data)
    st = c.stat("/data/up/x.bin")
    etag = s3.head_object(Bucket=bucket, Key="p/up/x.bin")["ETag"].strip('"')
    assert st["length"] == len(data) and etag in st["fingerprint"], (st, etag)

    assert_one_line_error(c.run("fs", "put", src, "/data/up/x.bin"), 4)
    c.ok("fs", "put", "--overwrite", "-", "/data/up/x.bin", input=b"short now")
    c.ok("fs", "persist", "/data/up/x.bin")
    assert _get(s3, bucket, "p/up/x.bin") == b"short now"
    assert c.cat("/data/up/x.bin") == b"short now"

    c.ok("fs", "put", "-", "/data/empty", input=b"")
    c.ok("fs", "persist", "/data/empty")
    assert _get(s3, bucket, "p/empty") == b""
    assert c.cat("/data/empty") == b""

    c.ok("fs", "mkdir", "/data/newdir")
    assert "/data/newdir" in [e["path"] for e in c.ls_json("/data") if e["is_dir"]]
    c.ok("fs", "put", "-", "/data/newdir/n.txt", input=b"n")
    c.ok("fs", "persist", "/data/newdir/n.txt")
    assert _get(s3, bucket, "p/newdir/n.txt") == b"n"

    c.ok("fs", "mv", "/data/up/x.bin", "/data/newdir/y.bin")
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])}
    assert "p/up/x.bin" not in keys and "p/newdir/y.bin" in keys, keys
    assert _get(s3, bucket, "p/newdir/y.bin") == b"short now"
    assert c.cat("/data/newdir/y.bin") == b"short now"
    assert_one_line_error(c.run("fs", "cat", "/data/up/x.bin"), 3)
    # Every key stays under the mount's prefix.
    assert all(k.startswith("p/") for k in keys), keys
