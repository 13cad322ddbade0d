"""A GET that has started returns the whole object version it started with (S3's promise),
even when the object is overwritten and then deleted while the body streams: the
gateway resolved the object's blocks when the GET began, and the workers keep the old
version's blocks (retired, `worker.stale_block_grace`) until the reader is done.

Before: the old blocks were dropped at the worker's next heartbeat and the stream broke
off (boto3 IncompleteRead) or the read failed.

Run on both buckets of the `Gateway` fixture: `local` (the default file:// UFS) and
`lake` (a real MinIO bucket), with 1 MiB blocks, so a 40 MiB object is 40 blocks and
most of them are still to be read when the object changes."""

from __future__ import annotations

import hashlib
import os
import time

import pytest
from conftest import MiB, Gateway, gw_client, wait_until

SIZE = 40 * MiB
CHUNK = 256 << 10


@pytest.fixture
def gw(cluster_factory, minio) -> Gateway:
    c = cluster_factory(args=["--block-size", "1MiB", "--mem-quota", "1GiB"])
    return Gateway(c, minio)


def persisted(c) -> bool:
    return c.report()["persist_backlog"]["queued_ops"] == 0


@pytest.mark.parametrize("bucket", ["local", "lake"])
def test_a_get_under_way_returns_the_version_it_started_with(gw, bucket):
    s3 = gw_client(gw.endpoint, read_timeout=60)
    old, new = os.urandom(SIZE), os.urandom(SIZE)
    s3.put_object(Bucket=bucket, Key="big", Body=old)
    # Persisted first: the UFS holds it too, and once it is overwritten there, a block
    # read from the UFS instead of the cache would be the new bytes (refused, not mixed).
    wait_until(lambda: persisted(gw.cluster), timeout=120, interval=0.5, what="the persist")
    for change in ("overwrite", "delete"):
        r = s3.get_object(Bucket=bucket, Key="big")
        body = r["Body"]
        assert r["ContentLength"] == SIZE
        got = [body.read(CHUNK)]
        if change == "overwrite":
            s3.put_object(Bucket=bucket, Key="big", Body=new)
        else:
            s3.delete_object(Bucket=bucket, Key="big")
        # The workers act on the change at their next heartbeats (1 s): give them three.
        time.sleep(3)
        while chunk := body.read(CHUNK):
            got.append(chunk)
        data = b"".join(got)
        assert len(data) == SIZE, f"{change}: the stream ended after {len(data)} of {SIZE} bytes"
        want = old if change == "overwrite" else new
        assert hashlib.sha256(data).digest() == hashlib.sha256(want).digest(), (
            f"{change}: the GET did not return the version it started with")
        if change == "overwrite":
            # What a GET sees now is the new version, whole.
            assert s3.get_object(Bucket=bucket, Key="big")["Body"].read() == new
    assert s3.list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0
