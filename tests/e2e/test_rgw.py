"""Ceph RGW as the UFS, beside MinIO: reads (cold, then cached), ASYNC_THROUGH writes,
renames of a file and a directory, multipart uploads through the gateway. The user's
bucket stays the user's: no `.locus-uploads` staging and no directory markers but those
an empty directory needs, checked against RGW's own listing."""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
import uuid
from pathlib import Path

import pytest
from boto3.s3.transfer import TransferConfig

from conftest import (MiB, RGW_ENDPOINT, RGW_KEY, RGW_SECRET, Cluster, _port_open, gw_client, rgw_client,
                      wait_until)


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


class RgwCluster:
    """A cluster (1 worker, 8 MiB blocks) with its gateway and an RGW bucket mounted at
    /rgw (so the gateway's bucket `rgw`)."""

    def __init__(self, c: Cluster):
        self.c = c
        self.rgw = rgw_client()
        self.bucket = f"locus-{uuid.uuid4().hex[:10]}"
        self.rgw.create_bucket(Bucket=self.bucket)
        c.ok("fs", "mount", "/rgw", f"s3://{self.bucket}", "--option", f"endpoint={RGW_ENDPOINT}",
             "--option", f"access_key_id={RGW_KEY}", "--option", f"secret_access_key={RGW_SECRET}",
             "--sync-interval", "1s")
        wait_until(lambda: _port_open(c.gateway), timeout=20, what="the gateway to listen")
        self.s3 = gw_client(f"http://{c.gateway}")

    def keys(self, prefix: str = "") -> list[str]:
        """Every key in the RGW bucket under prefix (RGW's own listing)."""
        out, token = [], None
        while True:
            kw = {"Bucket": self.bucket, "Prefix": prefix}
            if token:
                kw["ContinuationToken"] = token
            r = self.rgw.list_objects_v2(**kw)
            out += [o["Key"] for o in r.get("Contents", [])]
            token = r.get("NextContinuationToken")
            if not token:
                return out

    def rgw_get(self, key: str) -> bytes:
        return self.rgw.get_object(Bucket=self.bucket, Key=key)["Body"].read()

    def in_rgw(self, key: str) -> bool:
        return key in self.keys(key)

    def gw_keys(self, prefix: str = "") -> list[str]:
        r = self.s3.list_objects_v2(Bucket="rgw", Prefix=prefix)
        return [o["Key"] for o in r.get("Contents", [])]


@pytest.fixture(scope="module")
def rc(e2e_tmp, rgw, request):
    d = Path(tempfile.mkdtemp(prefix="rgw-", dir=e2e_tmp))
    c = Cluster(d / "c", d, workers=1, args=["--block-size", "8MiB"])
    try:
        c.start()
        yield RgwCluster(c)
    finally:
        c.cleanup()
        if request.session.testsfailed:
            print(c.log_tail(80))


def test_read_cold_then_cached(rc):
    data = os.urandom(20 * MiB + 5)  # three 8 MiB blocks
    rc.rgw.put_object(Bucket=rc.bucket, Key="in/data.bin", Body=data)
    rc.rgw.put_object(Bucket=rc.bucket, Key="in/small.txt", Body=b"small")
    c = rc.c
    wait_until(lambda: any(e["path"] == "/rgw/in/data.bin" for e in c.ls_json("/rgw/in")), timeout=20,
               what="the RGW object in the namespace")
    st = c.stat("/rgw/in/data.bin")
    assert st["length"] == len(data) and st["cached_fraction"] == 0.0, st
    # cold: through the CLI, from RGW
    assert _sha(c.cat("/rgw/in/data.bin")) == _sha(data)
    assert c.stat("/rgw/in/data.bin")["cached_fraction"] == 1.0
    # cached: the gateway answers from the workers' cache, RGW not asked again
    base = c.counters()
    assert _sha(rc.s3.get_object(Bucket="rgw", Key="in/data.bin")["Body"].read()) == _sha(data)
    got = rc.s3.get_object(Bucket="rgw", Key="in/data.bin", Range="bytes=8388600-8388615")["Body"].read()
    assert got == data[8388600:8388616]
    d = c.delta(base)
    assert d["ufs"] == 0 and d["short_circuit"] + d["local_worker"] >= len(data), d
    # a cold read through the gateway
    assert rc.s3.get_object(Bucket="rgw", Key="in/small.txt")["Body"].read() == b"small"
    assert sorted(rc.gw_keys("in/")) == ["in/data.bin", "in/small.txt"]


def test_async_through_write_lands_in_rgw(rc):
    c = rc.c
    data = os.urandom(9 * MiB + 1)
    c.ok("fs", "put", "--write-type", "ASYNC_THROUGH", "-", "/rgw/async/deep/cli.bin", input=data)
    rc.s3.put_object(Bucket="rgw", Key="async/gw.bin", Body=data[:MiB])
    c.ok("fs", "persist", "/rgw/async/deep/cli.bin")
    c.ok("fs", "persist", "/rgw/async/gw.bin")
    assert _sha(rc.rgw_get("async/deep/cli.bin")) == _sha(data)
    assert _sha(rc.rgw_get("async/gw.bin")) == _sha(data[:MiB])
    # no marker is left for directories that hold objects
    assert sorted(rc.keys("async")) == ["async/deep/cli.bin", "async/gw.bin"], rc.keys("async")
    assert sorted(rc.gw_keys("async")) == ["async/deep/cli.bin", "async/gw.bin"]


def test_rename_file_and_directory(rc):
    c = rc.c
    a, b = os.urandom(3 * MiB), b"bee"
    c.ok("fs", "put", "--write-type", "CACHE_THROUGH", "-", "/rgw/ren/src/a.bin", input=a)
    c.ok("fs", "put", "--write-type", "CACHE_THROUGH", "-", "/rgw/ren/src/sub/b.txt", input=b)
    assert sorted(rc.keys("ren/")) == ["ren/src/a.bin", "ren/src/sub/b.txt"], rc.keys("ren/")
    # a file
    c.ok("fs", "mv", "/rgw/ren/src/a.bin", "/rgw/ren/src/a2.bin")
    assert sorted(rc.keys("ren/")) == ["ren/src/a2.bin", "ren/src/sub/b.txt"], rc.keys("ren/")
    # a directory, into a new one
    c.ok("fs", "mkdir", "/rgw/ren/renamed")
    assert "ren/renamed/" in rc.keys("ren/"), "an empty directory keeps its marker"
    assert "ren/renamed/" not in rc.gw_keys("ren/"), "a marker of Locus's own is not listed as a key"
    c.ok("fs", "mv", "/rgw/ren/src", "/rgw/ren/renamed/dst")
    assert sorted(rc.keys("ren/")) == ["ren/renamed/dst/a2.bin", "ren/renamed/dst/sub/b.txt"], rc.keys("ren/")
    assert _sha(rc.rgw_get("ren/renamed/dst/a2.bin")) == _sha(a)
    assert c.cat("/rgw/ren/renamed/dst/sub/b.txt") == b
    assert sorted(rc.gw_keys("ren/")) == ["ren/renamed/dst/a2.bin", "ren/renamed/dst/sub/b.txt"]
    # a directory that ends up empty still exists in RGW (by its marker), not as a key
    c.ok("fs", "rm", "/rgw/ren/renamed/dst/sub/b.txt")
    assert "ren/renamed/dst/sub/" in rc.keys("ren/"), rc.keys("ren/")
    assert rc.gw_keys("ren/") == ["ren/renamed/dst/a2.bin"]
    c.ok("fs", "rm", "-R", "/rgw/ren")
    assert rc.keys("ren/") == []
    # a user's `dir/` key is the user's: listed, and kept in RGW when objects land below
    rc.s3.put_object(Bucket="rgw", Key="mine/", Body=b"")
    rc.s3.put_object(Bucket="rgw", Key="mine/x", Body=b"x")
    c.ok("fs", "persist", "/rgw/mine/x")
    assert sorted(rc.gw_keys("mine")) == ["mine/", "mine/x"]
    assert sorted(rc.keys("mine")) == ["mine/", "mine/x"], rc.keys("mine")


def test_multipart_through_gateway(rc):
    c = rc.c
    data = os.urandom(13 * MiB + 7)
    cfg = TransferConfig(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB)
    rc.s3.upload_fileobj(io.BytesIO(data), "rgw", "mp/big.bin", Config=cfg)
    assert rc.s3.head_object(Bucket="rgw", Key="mp/big.bin")["ETag"].endswith('-3"')
    # an upload aborted, and one left in progress while the other completes
    gone = rc.s3.create_multipart_upload(Bucket="rgw", Key="mp/gone.bin")["UploadId"]
    rc.s3.upload_part(Bucket="rgw", Key="mp/gone.bin", UploadId=gone, PartNumber=1, Body=b"g" * 100)
    rc.s3.abort_multipart_upload(Bucket="rgw", Key="mp/gone.bin", UploadId=gone)
    c.ok("fs", "persist", "/rgw/mp/big.bin")
    assert _sha(rc.rgw_get("mp/big.bin")) == _sha(data)
    # nothing of the staging is left: not in RGW (the abort's removal reaches RGW through
    # the persist queue, like every UFS change), not in the namespace, not in listings
    wait_until(lambda: rc.keys(".locus-uploads") == [], timeout=20, what="no staging left in RGW")
    assert not any(".locus-uploads" in e["path"] for e in c.ls_json("/rgw"))
    assert rc.keys("mp") == ["mp/big.bin"], rc.keys("mp")
    assert rc.gw_keys("mp") == ["mp/big.bin"]
    # while an upload is in progress its staging is hidden from the gateway's listing
    up = rc.s3.create_multipart_upload(Bucket="rgw", Key="mp/later.bin")["UploadId"]
    rc.s3.upload_part(Bucket="rgw", Key="mp/later.bin", UploadId=up, PartNumber=1, Body=b"l" * 100)
    assert not any(".locus-uploads" in k for k in rc.gw_keys())
    rc.s3.abort_multipart_upload(Bucket="rgw", Key="mp/later.bin", UploadId=up)
    assert not any(".locus-uploads" in e["path"] for e in c.ls_json("/rgw"))
    wait_until(lambda: rc.keys(".locus-uploads") == [], timeout=20, what="no staging left in RGW")


def test_bucket_holds_only_user_objects(rc):
    """After the tests above: every key in RGW is an object some test wrote, or the
    user's own marker."""
    keys = rc.keys()
    assert not any(k.startswith(".locus-uploads") for k in keys), keys
    stray = [k for k in keys if k.endswith("/") and k != "mine/"]
    assert stray == [], keys
