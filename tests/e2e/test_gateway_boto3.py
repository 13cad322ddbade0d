"""The S3 gateway driven by boto3 with its defaults (checksum headers and streaming
trailers on), over a local-directory bucket and a MinIO-backed bucket."""

from __future__ import annotations

import base64
import hashlib
import http.client
import io
import os
import random
import time
import urllib.error
import urllib.request
from datetime import datetime, timedelta, timezone

import pytest
from boto3.s3.transfer import TransferConfig
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from conftest import GW_KEY, GW_SECRET, MiB, gw_client, put_object, wait_until

BUCKETS = ["local", "lake"]


def code_of(exc: ClientError) -> str:
    return exc.response["Error"]["Code"]


def expect(code: str, fn, *a, **kw):
    with pytest.raises(ClientError) as ei:
        fn(*a, **kw)
    assert code_of(ei.value) == code, f"expected {code}, got {ei.value.response['Error']}"
    return ei.value


def md5(b: bytes) -> str:
    return hashlib.md5(b).hexdigest()


def test_committer_staging_never_reaches_the_ufs(gateway):
    """What Hadoop's file output committer does through S3: task output is written under
    `_temporary/`, then renamed (copy and delete) to the task's and then the job's
    directory. Staged objects wait (master.staged_persist_wait) before their persist, the
    delete ends the wait with nothing to write, so only the committed object reaches
    MinIO; a staged object left behind waits, cached and readable. First in the module, so
    no other test's persist is under way while the persisted bytes are counted."""
    s3, bucket = gateway.s3, "lake"
    data = os.urandom(3 * MiB + 5)
    before = _persisted_bytes(gateway)
    attempt = "job/_temporary/0/_temporary/attempt_1_m_000000_0/part-00000.parquet"
    task = "job/_temporary/0/task_1_m_000000/part-00000.parquet"
    s3.put_object(Bucket=bucket, Key=attempt, Body=data)
    s3.copy_object(Bucket=bucket, Key=task, CopySource={"Bucket": bucket, "Key": attempt})
    s3.delete_object(Bucket=bucket, Key=attempt)
    s3.copy_object(Bucket=bucket, Key="job/part-00000.parquet", CopySource={"Bucket": bucket, "Key": task})
    s3.delete_object(Bucket=bucket, Key=task)
    s3.put_object(Bucket=bucket, Key="job/_temporary/0/left-behind", Body=b"stays")
    s3.put_object(Bucket=bucket, Key="job/_SUCCESS", Body=b"")
    wait_until(lambda: _in_minio(gateway, "job/_SUCCESS") and _in_minio(gateway, "job/part-00000.parquet"),
               timeout=30, what="the committed objects in MinIO")
    got = gateway.minio.get_object(Bucket=gateway.minio_bucket, Key="job/part-00000.parquet")["Body"].read()
    assert got == data
    assert _minio_files(gateway, "job/_temporary") == [], "staged output never reaches the UFS"
    # ... not even for a while: the committed object is all the persist queue wrote (the
    # counter moves just after the object lands)
    wait_until(lambda: _persisted_bytes(gateway) - before >= len(data), timeout=10, what="the persist counted")
    assert _persisted_bytes(gateway) - before == len(data)
    assert s3.get_object(Bucket=bucket, Key="job/_temporary/0/left-behind")["Body"].read() == b"stays"
    s3.delete_object(Bucket=bucket, Key="job/_temporary/0/left-behind")


def test_buckets(gateway):
    s3 = gateway.s3
    names = [b["Name"] for b in s3.list_buckets()["Buckets"]]
    assert {"local", "lake"} <= set(names), names
    b = gateway.new_bucket()
    s3.head_bucket(Bucket=b)
    assert s3.get_bucket_location(Bucket=b).get("LocationConstraint") in (None, "")
    s3.put_object(Bucket=b, Key="x", Body=b"1")
    # In us-east-1, creating a bucket one already owns answers 200 and changes nothing.
    assert s3.create_bucket(Bucket=b)["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert s3.get_object(Bucket=b, Key="x")["Body"].read() == b"1"
    expect("BucketNotEmpty", s3.delete_bucket, Bucket=b)
    s3.delete_object(Bucket=b, Key="x")
    s3.delete_bucket(Bucket=b)
    assert b not in [x["Name"] for x in s3.list_buckets()["Buckets"]]
    with pytest.raises(ClientError) as ei:
        s3.head_bucket(Bucket=b)
    assert ei.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    expect("NoSuchBucket", s3.list_objects_v2, Bucket=b)
    expect("NoSuchBucket", s3.put_object, Bucket=b, Key="k", Body=b"x")
    expect("NoSuchBucket", s3.get_object, Bucket=b, Key="k")
    # a bucket is a top-level directory of the namespace
    gateway.cluster.ok("fs", "mkdir", "/from-cli")
    assert "from-cli" in [x["Name"] for x in s3.list_buckets()["Buckets"]]


@pytest.mark.parametrize("bucket", BUCKETS)
def test_put_get_head_metadata_ranges(gateway, bucket):
    s3 = gateway.s3
    data = os.urandom(3 * MiB + 123)
    r = s3.put_object(Bucket=bucket, Key="dir/obj.bin", Body=data, ContentType="application/x-test",
                      Metadata={"owner": "ana", "stage": "raw"}, Tagging="team=ml&tier=gold")
    assert r["ETag"] == f'"{md5(data)}"'
    h = s3.head_object(Bucket=bucket, Key="dir/obj.bin")
    assert h["ContentLength"] == len(data)
    assert h["ContentType"] == "application/x-test"
    assert h["Metadata"] == {"owner": "ana", "stage": "raw"}
    assert h["ETag"] == f'"{md5(data)}"'
    g = s3.get_object(Bucket=bucket, Key="dir/obj.bin")
    assert g["Body"].read() == data
    assert g["Metadata"] == {"owner": "ana", "stage": "raw"}
    assert g["ContentType"] == "application/x-test"
    assert g.get("TagCount") == 2
    # single ranges: closed, open-ended, suffix
    assert s3.get_object(Bucket=bucket, Key="dir/obj.bin", Range="bytes=10-19")["Body"].read() == data[10:20]
    r = s3.get_object(Bucket=bucket, Key="dir/obj.bin", Range=f"bytes={len(data) - 5}-")
    assert r["Body"].read() == data[-5:]
    assert r["ContentRange"] == f"bytes {len(data) - 5}-{len(data) - 1}/{len(data)}"
    assert s3.get_object(Bucket=bucket, Key="dir/obj.bin", Range="bytes=-7")["Body"].read() == data[-7:]
    # a range across a block boundary (8 MiB blocks are configured; 3 MiB file: use offsets)
    assert s3.get_object(Bucket=bucket, Key="dir/obj.bin", Range="bytes=1048570-2097160")["Body"].read() == \
        data[1048570:2097161]
    expect("InvalidRange", s3.get_object, Bucket=bucket, Key="dir/obj.bin", Range=f"bytes={len(data)}-")
    tags = s3.get_object_tagging(Bucket=bucket, Key="dir/obj.bin")["TagSet"]
    assert sorted((t["Key"], t["Value"]) for t in tags) == [("team", "ml"), ("tier", "gold")]
    expect("NoSuchKey", s3.get_object, Bucket=bucket, Key="dir/missing")
    expect("NoSuchKey", s3.get_object, Bucket=bucket, Key="dir")  # a directory is not an object
    for key in ("dir/missing", "dir"):
        with pytest.raises(ClientError) as ei:
            s3.head_object(Bucket=bucket, Key=key)
        assert ei.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    # but `dir/` is: a directory marker
    assert s3.head_object(Bucket=bucket, Key="dir/")["ContentLength"] == 0
    if bucket == "lake":
        # the bytes, content type and user metadata reached MinIO (once persisted)
        gateway.cluster.ok("fs", "persist", "/lake/dir/obj.bin")
        m = gateway.minio.head_object(Bucket=gateway.minio_bucket, Key="dir/obj.bin")
        assert m["ContentLength"] == len(data)
        assert m["ContentType"] == "application/x-test"
        assert m["Metadata"]["owner"] == "ana"
        assert "team=ml" in m["Metadata"]["locus-tags"]
        assert gateway.minio.get_object(Bucket=gateway.minio_bucket, Key="dir/obj.bin")["Body"].read() == data


@pytest.mark.parametrize("bucket", BUCKETS)
def test_conditional_gets(gateway, bucket):
    s3 = gateway.s3
    s3.put_object(Bucket=bucket, Key="cond.txt", Body=b"conditional")
    etag = s3.head_object(Bucket=bucket, Key="cond.txt")["ETag"]
    assert s3.get_object(Bucket=bucket, Key="cond.txt", IfMatch=etag)["Body"].read() == b"conditional"
    expect("PreconditionFailed", s3.get_object, Bucket=bucket, Key="cond.txt", IfMatch='"0123"')
    with pytest.raises(ClientError) as ei:
        s3.get_object(Bucket=bucket, Key="cond.txt", IfNoneMatch=etag)
    assert ei.value.response["ResponseMetadata"]["HTTPStatusCode"] == 304
    future = datetime.now(timezone.utc) + timedelta(days=1)
    past = datetime.now(timezone.utc) - timedelta(days=1)
    with pytest.raises(ClientError) as ei:
        s3.get_object(Bucket=bucket, Key="cond.txt", IfModifiedSince=future)
    assert ei.value.response["ResponseMetadata"]["HTTPStatusCode"] == 304
    assert s3.get_object(Bucket=bucket, Key="cond.txt", IfModifiedSince=past)["Body"].read() == b"conditional"
    expect("PreconditionFailed", s3.get_object, Bucket=bucket, Key="cond.txt", IfUnmodifiedSince=past)


@pytest.mark.parametrize("bucket", BUCKETS)
def test_checksums_are_verified(gateway, bucket):
    s3 = gateway.s3
    # boto3's default: a CRC32 sent as a streaming trailer (aws-chunked)
    r = s3.put_object(Bucket=bucket, Key="sum.bin", Body=b"a" * 100_000)
    assert r.get("ChecksumCRC32"), r
    for alg in ("SHA256", "SHA1", "CRC32"):  # CRC32C and CRC64NVME need botocore[crt]
        r = s3.put_object(Bucket=bucket, Key=f"sum-{alg}.bin", Body=b"b" * 1000, ChecksumAlgorithm=alg)
        assert r.get(f"Checksum{alg}"), (alg, r)
        assert s3.get_object(Bucket=bucket, Key=f"sum-{alg}.bin")["Body"].read() == b"b" * 1000
    # a wrong checksum fails the write and leaves the old object whole
    expect("BadDigest", s3.put_object, Bucket=bucket, Key="sum.bin", Body=b"c" * 5000,
           ChecksumCRC32=base64.b64encode(b"\0\0\0\0").decode())
    wrong_md5 = base64.b64encode(hashlib.md5(b"other").digest()).decode()
    expect("BadDigest", s3.put_object, Bucket=bucket, Key="sum.bin", Body=b"d" * 5000, ContentMD5=wrong_md5)
    expect("InvalidDigest", s3.put_object, Bucket=bucket, Key="sum.bin", Body=b"d", ContentMD5="not-base64!")
    assert s3.get_object(Bucket=bucket, Key="sum.bin")["Body"].read() == b"a" * 100_000
    good_md5 = base64.b64encode(hashlib.md5(b"e" * 10).digest()).decode()
    s3.put_object(Bucket=bucket, Key="sum.bin", Body=b"e" * 10, ContentMD5=good_md5)
    assert s3.get_object(Bucket=bucket, Key="sum.bin")["Body"].read() == b"e" * 10


@pytest.mark.parametrize("bucket", BUCKETS)
def test_multipart(gateway, bucket):
    s3 = gateway.s3
    data = os.urandom(17 * MiB + 5)
    cfg = TransferConfig(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB, max_concurrency=4)
    s3.upload_fileobj(io.BytesIO(data), bucket, "mp/big.bin", Config=cfg)
    parts = [data[i:i + 5 * MiB] for i in range(0, len(data), 5 * MiB)]
    want = hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest() + f"-{len(parts)}"
    h = s3.head_object(Bucket=bucket, Key="mp/big.bin")
    assert h["ETag"] == f'"{want}"'
    assert h["ContentLength"] == len(data)
    assert hashlib.sha256(s3.get_object(Bucket=bucket, Key="mp/big.bin")["Body"].read()).digest() == \
        hashlib.sha256(data).digest()

    # the low-level calls: list, part copy, errors, abort
    up = s3.create_multipart_upload(Bucket=bucket, Key="mp/low.bin", ContentType="text/x-low",
                                    Metadata={"m": "1"})["UploadId"]
    uploads = s3.list_multipart_uploads(Bucket=bucket)["Uploads"]
    assert any(u["UploadId"] == up and u["Key"] == "mp/low.bin" for u in uploads)
    p1 = s3.upload_part(Bucket=bucket, Key="mp/low.bin", UploadId=up, PartNumber=1, Body=data[:6 * MiB])
    p2 = s3.upload_part_copy(Bucket=bucket, Key="mp/low.bin", UploadId=up, PartNumber=2,
                             CopySource={"Bucket": bucket, "Key": "mp/big.bin"},
                             CopySourceRange="bytes=100-199")["CopyPartResult"]
    listed = s3.list_parts(Bucket=bucket, Key="mp/low.bin", UploadId=up)["Parts"]
    assert [(p["PartNumber"], p["Size"]) for p in listed] == [(1, 6 * MiB), (2, 100)]
    if bucket == "lake":
        # Parts wait (gateway.part_persist_wait) before they are persisted: a write queued
        # after them reaches MinIO, they do not (Complete copies them into the object).
        s3.put_object(Bucket=bucket, Key="mp/marker", Body=b"m")
        wait_until(lambda: _in_minio(gateway, "mp/marker"), timeout=30, what="the marker in MinIO")
        assert _minio_files(gateway, ".locus-uploads") == []
    expect("InvalidPart", s3.complete_multipart_upload, Bucket=bucket, Key="mp/low.bin", UploadId=up,
           MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": '"00000000000000000000000000000000"'}]})
    expect("InvalidPartOrder", s3.complete_multipart_upload, Bucket=bucket, Key="mp/low.bin", UploadId=up,
           MultipartUpload={"Parts": [{"PartNumber": 2, "ETag": p2["ETag"]}, {"PartNumber": 1, "ETag": p1["ETag"]}]})
    s3.complete_multipart_upload(Bucket=bucket, Key="mp/low.bin", UploadId=up, MultipartUpload={
        "Parts": [{"PartNumber": 1, "ETag": p1["ETag"]}, {"PartNumber": 2, "ETag": p2["ETag"]}]})
    got = s3.get_object(Bucket=bucket, Key="mp/low.bin")
    assert got["Body"].read() == data[:6 * MiB] + data[100:200]
    assert got["ContentType"] == "text/x-low" and got["Metadata"] == {"m": "1"}
    assert got["ETag"].endswith('-2"')
    expect("NoSuchUpload", s3.list_parts, Bucket=bucket, Key="mp/low.bin", UploadId=up)

    small = s3.create_multipart_upload(Bucket=bucket, Key="mp/small.bin")["UploadId"]
    a = s3.upload_part(Bucket=bucket, Key="mp/small.bin", UploadId=small, PartNumber=1, Body=b"x" * 1000)
    b = s3.upload_part(Bucket=bucket, Key="mp/small.bin", UploadId=small, PartNumber=2, Body=b"y" * 1000)
    expect("EntityTooSmall", s3.complete_multipart_upload, Bucket=bucket, Key="mp/small.bin", UploadId=small,
           MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": a["ETag"]}, {"PartNumber": 2, "ETag": b["ETag"]}]})
    s3.abort_multipart_upload(Bucket=bucket, Key="mp/small.bin", UploadId=small)
    expect("NoSuchUpload", s3.upload_part, Bucket=bucket, Key="mp/small.bin", UploadId=small, PartNumber=3,
           Body=b"z")
    expect("NoSuchUpload", s3.abort_multipart_upload, Bucket=bucket, Key="mp/small.bin",
           UploadId="0123456789abcdef0123456789abcdef")
    with pytest.raises(ClientError):
        s3.head_object(Bucket=bucket, Key="mp/small.bin")
    # uploads in progress never show up as objects
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="")["Contents"]]
    assert not any(".locus-uploads" in k for k in keys), keys
    if bucket == "lake":
        wait_until(lambda: _in_minio(gateway, "mp/low.bin"), timeout=30, what="the completed object in MinIO")
        assert _minio_files(gateway, ".locus-uploads") == [], "parts of completed uploads never reach the UFS"
    # with no upload in progress, the staging directory is gone: from the namespace, and
    # (markers too) from the UFS
    assert not any(".locus-uploads" in e["path"] for e in gateway.cluster.ls_json(f"/{bucket}"))
    if bucket == "lake":
        r = gateway.minio.list_objects_v2(Bucket=gateway.minio_bucket, Prefix=".locus-uploads")
        assert r.get("KeyCount", 0) == 0, r.get("Contents")


def _persisted_bytes(gateway) -> int:
    """Bytes the persist queue has written to UFSes (locus_persisted_bytes_total)."""
    for line in gateway.cluster.metrics().splitlines():
        if line.startswith("locus_persisted_bytes_total "):
            return int(float(line.split()[1]))
    raise AssertionError("locus_persisted_bytes_total missing from /metrics")


def _in_minio(gateway, key: str) -> bool:
    try:
        gateway.minio.head_object(Bucket=gateway.minio_bucket, Key=key)
        return True
    except ClientError:
        return False


def _minio_files(gateway, prefix: str) -> list[str]:
    """MinIO's keys under prefix, but directory markers (an upload's directories are made at once)."""
    r = gateway.minio.list_objects_v2(Bucket=gateway.minio_bucket, Prefix=prefix)
    return [o["Key"] for o in r.get("Contents", []) if not o["Key"].endswith("/")]


@pytest.mark.parametrize("bucket", BUCKETS)
def test_copy_and_delete(gateway, bucket):
    s3 = gateway.s3
    s3.put_object(Bucket=bucket, Key="cp/src.txt", Body=b"copy me", ContentType="text/plain",
                  Metadata={"a": "1"}, Tagging="k=v")
    r = s3.copy_object(Bucket=bucket, Key="cp/dst.txt", CopySource={"Bucket": bucket, "Key": "cp/src.txt"})
    assert r["CopyObjectResult"]["ETag"] == f'"{md5(b"copy me")}"'
    h = s3.head_object(Bucket=bucket, Key="cp/dst.txt")
    assert h["Metadata"] == {"a": "1"} and h["ContentType"] == "text/plain"
    s3.copy_object(Bucket=bucket, Key="cp/dst.txt", CopySource={"Bucket": bucket, "Key": "cp/src.txt"},
                   MetadataDirective="REPLACE", Metadata={"b": "2"}, ContentType="text/x-new")
    h = s3.head_object(Bucket=bucket, Key="cp/dst.txt")
    assert h["Metadata"] == {"b": "2"} and h["ContentType"] == "text/x-new"
    expect("InvalidRequest", s3.copy_object, Bucket=bucket, Key="cp/src.txt",
           CopySource={"Bucket": bucket, "Key": "cp/src.txt"})
    # across buckets (and, for `lake`, across UFSes)
    other = "local" if bucket == "lake" else "lake"
    s3.copy_object(Bucket=other, Key="cp/from-other.txt", CopySource={"Bucket": bucket, "Key": "cp/src.txt"})
    assert s3.get_object(Bucket=other, Key="cp/from-other.txt")["Body"].read() == b"copy me"
    expect("NoSuchKey", s3.copy_object, Bucket=bucket, Key="cp/x", CopySource={"Bucket": bucket, "Key": "cp/none"})
    # A copy's ETag is the MD5 of its bytes: taken over from a plain source, computed for a
    # multipart one (whose ETag is not an MD5).
    r = s3.copy_object(Bucket=bucket, Key="cp/dst2.txt", CopySource={"Bucket": other, "Key": "cp/from-other.txt"})
    assert r["CopyObjectResult"]["ETag"] == f'"{md5(b"copy me")}"'
    parts = [b"p" * (5 << 20), b"q" * 1000]
    up = s3.create_multipart_upload(Bucket=bucket, Key="cp/mp.bin")["UploadId"]
    done = [{"PartNumber": i + 1, "ETag": s3.upload_part(Bucket=bucket, Key="cp/mp.bin", UploadId=up, PartNumber=i + 1,
                                                          Body=p)["ETag"]} for i, p in enumerate(parts)]
    mp = s3.complete_multipart_upload(Bucket=bucket, Key="cp/mp.bin", UploadId=up,
                                      MultipartUpload={"Parts": done})["ETag"]
    assert mp.endswith('-2"')
    r = s3.copy_object(Bucket=bucket, Key="cp/mp-copy.bin", CopySource={"Bucket": bucket, "Key": "cp/mp.bin"})
    assert r["CopyObjectResult"]["ETag"] == f'"{md5(b"".join(parts))}"'
    assert s3.get_object(Bucket=bucket, Key="cp/mp-copy.bin")["Body"].read() == b"".join(parts)

    for i in range(5):
        s3.put_object(Bucket=bucket, Key=f"del/sub/{i}", Body=b"x")
    s3.delete_object(Bucket=bucket, Key="del/never-existed")  # not an error, as in S3
    r = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": f"del/sub/{i}"} for i in range(5)]
                                                 + [{"Key": "del/missing"}]})
    assert sorted(d["Key"] for d in r["Deleted"]) == sorted([f"del/sub/{i}" for i in range(5)] + ["del/missing"])
    assert not r.get("Errors")
    # the emptied directories went with their objects
    assert s3.list_objects_v2(Bucket=bucket, Prefix="del/")["KeyCount"] == 0
    assert "del/" not in [p["Prefix"] for p in s3.list_objects_v2(Bucket=bucket, Delimiter="/")
                          .get("CommonPrefixes", [])]


@pytest.mark.parametrize("bucket", BUCKETS)
def test_tagging_round_trip(gateway, bucket):
    s3 = gateway.s3
    # 24 MiB, so that its background persist is usually still running when the tags are
    # set: they must reach the MinIO object all the same.
    body = os.urandom(24 << 20)
    s3.put_object(Bucket=bucket, Key="tags.txt", Body=body)
    assert s3.get_object_tagging(Bucket=bucket, Key="tags.txt")["TagSet"] == []
    s3.put_object_tagging(Bucket=bucket, Key="tags.txt",
                          Tagging={"TagSet": [{"Key": "a", "Value": "1"}, {"Key": "b", "Value": "2"}]})
    tags = s3.get_object_tagging(Bucket=bucket, Key="tags.txt")["TagSet"]
    assert sorted((t["Key"], t["Value"]) for t in tags) == [("a", "1"), ("b", "2")]
    expect("InvalidTag", s3.put_object_tagging, Bucket=bucket, Key="tags.txt",
           Tagging={"TagSet": [{"Key": f"k{i}", "Value": "v"} for i in range(11)]})
    if bucket == "lake":
        # tags set after the write reach the MinIO object too (rewritten with new metadata)
        gateway.cluster.ok("fs", "persist", "/lake/tags.txt")

        def minio_tags():
            m = gateway.minio.head_object(Bucket=gateway.minio_bucket, Key="tags.txt")["Metadata"]
            return m.get("locus-tags") == "a=1&b=2"

        wait_until(minio_tags, timeout=30, what="the new tags in MinIO")
        assert gateway.minio.get_object(Bucket=gateway.minio_bucket, Key="tags.txt")["Body"].read() == body
        assert s3.get_object(Bucket=bucket, Key="tags.txt")["Body"].read() == body
    s3.delete_object_tagging(Bucket=bucket, Key="tags.txt")
    assert s3.get_object_tagging(Bucket=bucket, Key="tags.txt")["TagSet"] == []
    if bucket == "lake":
        wait_until(lambda: "locus-tags" not in gateway.minio.head_object(
            Bucket=gateway.minio_bucket, Key="tags.txt")["Metadata"], timeout=30, what="the tags to go from MinIO")
    expect("NoSuchKey", s3.get_object_tagging, Bucket=bucket, Key="nope.txt")


def _keys_for_listing() -> list[str]:
    """Keys whose names make S3 order differ from directory order (`a.txt` < `a/`)."""
    # (A key cannot also be a directory in Locus: no `a` beside `a/b`.)
    keys = ["a.txt", "a-b/c", "a/b.c/d", "a/b-c", "a/b/c/d/e", "a/b/c/f", "a/b0", "a0/x", "a0.y",
            "b/", "b/c", "c/d/", "dir.v1/x", "dir/x", "dir/y/z", "dir-x", "z.z", "zz/top", "é/ü"]
    keys += [f"many/{i:04d}" for i in range(35)]
    keys += [f"many/sub{i}/k" for i in range(5)]
    return keys


reference_client = None


def _all_pages(s3, bucket, v1=False, **kw):
    """Every page of a listing: (keys, prefixes, page count)."""
    keys, prefixes, pages, tok = [], [], 0, None
    while True:
        args = dict(kw)
        if v1:
            if tok:
                args["Marker"] = tok
            r = s3.list_objects(Bucket=bucket, **args)
        else:
            if tok:
                args["ContinuationToken"] = tok
            r = s3.list_objects_v2(Bucket=bucket, **args)
        pages += 1
        n = r["KeyCount"] if not v1 else len(r.get("Contents", [])) + len(r.get("CommonPrefixes", []))
        if s3 is not reference_client and r["IsTruncated"]:
            assert n == kw.get("MaxKeys", 1000), f"a truncated page holds {n} of {kw.get('MaxKeys')}: {kw}"
        keys += [o["Key"] for o in r.get("Contents", [])]
        for p in r.get("CommonPrefixes", []):
            # MinIO repeats a common prefix that spans pages (S3 does not): keep one.
            if not prefixes or prefixes[-1] != p["Prefix"]:
                prefixes.append(p["Prefix"])
            elif s3 is not reference_client:
                raise AssertionError(f"common prefix {p['Prefix']} listed twice")
        if not r["IsTruncated"]:
            return keys, prefixes, pages
        tok = r.get("NextMarker") if v1 else r["NextContinuationToken"]
        if v1 and tok is None:
            tok = (keys + prefixes)[-1]
        assert pages < 200


def test_listings_match_minio(gateway):
    """The same keys in MinIO and behind the gateway list identically, page by page."""
    s3 = gateway.s3
    bucket = gateway.new_bucket()
    global reference_client
    reference_client = gateway.minio
    ref = f"ref-{bucket}"[:40]
    gateway.minio.create_bucket(Bucket=ref)
    for k in _keys_for_listing():
        body = b"" if k.endswith("/") else k.encode()
        s3.put_object(Bucket=bucket, Key=k, Body=body)
        put_object(gateway.minio, ref, k, body)
    cases = []
    for prefix in ["", "a", "a/", "a/b", "a/b/", "dir", "many/", "many/sub", "nope", "b/", "é"]:
        for delim in [None, "/", "-"]:
            for max_keys in [1000, 3]:
                cases.append(dict(Prefix=prefix, MaxKeys=max_keys, **({"Delimiter": delim} if delim else {})))
    for kw in cases:
        got, want = _all_pages(s3, bucket, **kw), _all_pages(gateway.minio, ref, **kw)
        assert got[:2] == want[:2], f"v2 {kw}: gateway {got[:2]} != minio {want[:2]}"
    for kw in [dict(StartAfter="a/b"), dict(StartAfter="a.txt"), dict(StartAfter="a/b.c"), dict(StartAfter="a/b.c/d", Delimiter="/"),
               dict(StartAfter="a", Prefix="a"), dict(StartAfter="zzz"), dict(StartAfter="dir/", Delimiter="/")]:
        got, want = _all_pages(s3, bucket, **kw), _all_pages(gateway.minio, ref, **kw)
        assert got[:2] == want[:2], f"start-after {kw}: gateway {got[:2]} != minio {want[:2]}"
    for kw in [dict(MaxKeys=4), dict(MaxKeys=2, Delimiter="/"), dict(Prefix="many/", MaxKeys=7)]:
        got, want = _all_pages(s3, bucket, v1=True, **kw), _all_pages(gateway.minio, ref, v1=True, **kw)
        assert got[:2] == want[:2], f"v1 {kw}: gateway {got[:2]} != minio {want[:2]}"


def test_auth_presign_and_anonymous(gateway):
    s3 = gateway.s3
    s3.put_object(Bucket="local", Key="auth/p.txt", Body=b"presigned body")
    url = s3.generate_presigned_url("get_object", Params={"Bucket": "local", "Key": "auth/p.txt"}, ExpiresIn=300)
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.read() == b"presigned body"
    tampered = url.replace("auth/p.txt", "auth/q.txt")
    with pytest.raises(urllib.error.HTTPError) as ei:
        urllib.request.urlopen(tampered, timeout=10)
    assert ei.value.code == 403 and b"SignatureDoesNotMatch" in ei.value.read()
    # unsigned: refused (anonymous access is off by default)
    with pytest.raises(urllib.error.HTTPError) as ei:
        urllib.request.urlopen(f"{gateway.endpoint}/local/auth/p.txt", timeout=10)
    assert ei.value.code == 403 and b"AccessDenied" in ei.value.read()
    expect("SignatureDoesNotMatch", gw_client(gateway.endpoint, secret="wrong-secret").list_buckets)
    expect("InvalidAccessKeyId", gw_client(gateway.endpoint, key="nobody").list_buckets)
    # A presigned URL past its lifetime: 403 AccessDenied, "Request has expired", as AWS.
    short = s3.generate_presigned_url("get_object", Params={"Bucket": "local", "Key": "auth/p.txt"}, ExpiresIn=1)
    time.sleep(2.5)
    with pytest.raises(urllib.error.HTTPError) as ei:
        urllib.request.urlopen(short, timeout=10)
    body = ei.value.read()
    assert ei.value.code == 403 and b"<Code>AccessDenied</Code>" in body, body
    assert b"expired" in body.lower(), body


def _raw(gateway, method: str, path: str, headers: dict | None = None, body: bytes = b"", sign=True,
         content_length: int | None = None):
    """One raw HTTP request, SigV4-signed by botocore unless sign=False. With
    `content_length`, that length is declared (unsigned payload) but no body is sent."""
    host = gateway.cluster.gateway
    h = dict(headers or {})
    url = f"http://{h.pop('Host', host)}{path}"  # the signer takes the host from the URL
    if sign:
        req = AWSRequest(method=method, url=url, data=body, headers=h)
        req.headers["x-amz-content-sha256"] = (
            "UNSIGNED-PAYLOAD" if content_length is not None else hashlib.sha256(body).hexdigest())
        S3SigV4Auth(Credentials(GW_KEY, GW_SECRET), "s3", "us-east-1").add_auth(req)
        h = dict(req.headers.items())
    c = http.client.HTTPConnection(*host.rsplit(":", 1), timeout=20)
    c.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
    if not any(k.lower() == "host" for k in h):
        c.putheader("Host", url.split("/")[2])
    for k, v in h.items():
        c.putheader(k, v)
    c.putheader("Content-Length", str(len(body) if content_length is None else content_length))
    c.endheaders(body if content_length is None else None)
    r = c.getresponse()
    out = (r.status, r.read())
    c.close()
    return out


def test_bad_input_gets_s3_errors_and_the_server_lives(gateway):
    s3 = gateway.s3
    s3.put_object(Bucket="local", Key="safe.txt", Body=b"safe")
    # keys that would climb out of the bucket or the mount
    for key in ["../escape", "a/../../etc/passwd", "x/./y", "a//b"]:
        status, body = _raw(gateway, "GET", f"/local/{key}")
        assert status == 400 and b"InvalidArgument" in body, (key, status, body[:300])
        status, body = _raw(gateway, "PUT", f"/local/{key}", body=b"evil")
        assert status == 400, (key, status, body[:300])
    assert not (gateway.cluster.data_dir / "escape").exists()
    assert not (gateway.cluster.data_dir / "ufs" / "escape").exists()
    # an oversized header, a malformed XML body, garbage: errors, not crashes
    status, _ = _raw(gateway, "GET", "/local/safe.txt", headers={"x-big": "v" * 200_000}, sign=False)
    assert status in (400, 431), status
    status, body = _raw(gateway, "POST", "/local?delete", body=b"<Delete><Object><Key>x</Ke")
    assert status == 400 and b"MalformedXML" in body, (status, body[:300])
    c = http.client.HTTPConnection(*gateway.cluster.gateway.rsplit(":", 1), timeout=10)
    c.sock = None
    c.connect()
    c.sock.sendall(b"\x16\x03\x01garbage that is not HTTP\r\n\r\n")
    c.sock.recv(100)
    c.close()
    status, body = _raw(gateway, "GET", "/local/safe.txt", headers={"x-locus-read-type": "SOMETIMES"})
    assert status == 400 and b"InvalidArgument" in body
    # a declared 6 GiB body is refused before any of it is read
    status, body = _raw(gateway, "PUT", "/local/huge", content_length=6 << 30)
    assert status == 400 and b"EntityTooLarge" in body, (status, body[:300])
    with pytest.raises(ClientError):
        s3.head_object(Bucket="local", Key="huge")
    # still serving
    assert s3.get_object(Bucket="local", Key="safe.txt")["Body"].read() == b"safe"
    assert gateway.cluster.alive()


def test_virtual_hosted_style(gateway):
    s3 = gateway.s3
    s3.put_object(Bucket="local", Key="vh/obj.txt", Body=b"virtual")
    port = gateway.cluster.gateway.rsplit(":", 1)[1]
    status, body = _raw(gateway, "GET", "/vh/obj.txt", headers={"Host": f"local.localhost:{port}"})
    assert status == 200 and body == b"virtual", (status, body[:300])
    status, body = _raw(gateway, "GET", "/?list-type=2&prefix=vh%2F", headers={"Host": f"local.localhost:{port}"})
    assert status == 200 and b"<Key>vh/obj.txt</Key>" in body, body[:500]


def test_read_type_header_and_cache(gateway):
    s3 = gateway.s3
    data = os.urandom(2 * MiB)

    def header(name, value):
        def add(request, **kw):
            request.headers[name] = value
        return add

    # THROUGH writes leave nothing cached, so the reads below start cold
    th = gw_client(gateway.endpoint)
    th.meta.events.register("before-sign.s3.PutObject", header("x-locus-write-type", "THROUGH"))
    th.put_object(Bucket="local", Key="rt/nocache.bin", Body=data)
    th.put_object(Bucket="local", Key="rt/cache.bin", Body=data)
    assert gateway.cluster.stat("/local/rt/cache.bin")["cached_fraction"] == 0
    assert (gateway.cluster.ufs_dir / "local/rt/cache.bin").read_bytes() == data, "THROUGH: in the UFS at the ack"
    bad = gw_client(gateway.endpoint)
    bad.meta.events.register("before-sign.s3.PutObject", header("x-locus-write-type", "SOMETIMES"))
    with pytest.raises(ClientError) as e:
        bad.put_object(Bucket="local", Key="rt/bad.bin", Body=b"x")
    assert e.value.response["Error"]["Code"] == "InvalidArgument"

    nc = gw_client(gateway.endpoint)
    nc.meta.events.register("before-sign.s3.GetObject", header("x-locus-read-type", "NO_CACHE"))
    assert nc.get_object(Bucket="local", Key="rt/nocache.bin")["Body"].read() == data
    assert s3.get_object(Bucket="local", Key="rt/cache.bin")["Body"].read() == data
    st = gateway.cluster.stat("/local/rt/nocache.bin")
    assert st["cached_fraction"] == 0, st
    st = gateway.cluster.stat("/local/rt/cache.bin")
    assert st["cached_fraction"] == 1, st
    # the second read of the cached object is a cache hit, counted by source
    base = gateway.cluster.counters()
    assert s3.get_object(Bucket="local", Key="rt/cache.bin")["Body"].read() == data
    d = gateway.cluster.delta(base)
    assert d["ufs"] == 0 and d["short_circuit"] + d["local_worker"] >= len(data), d


def test_many_small_objects_concurrently(gateway):
    """Concurrent writers and readers on one gateway; every byte comes back."""
    import concurrent.futures as cf

    s3 = gateway.s3
    rnd = random.Random(7)
    blobs = {f"conc/{i:03d}": rnd.randbytes(rnd.randint(0, 300_000)) for i in range(60)}

    def put(k):
        gw_client(gateway.endpoint).put_object(Bucket="lake", Key=k, Body=blobs[k])

    with cf.ThreadPoolExecutor(8) as ex:
        list(ex.map(put, blobs))
    with cf.ThreadPoolExecutor(8) as ex:
        got = dict(zip(blobs, ex.map(lambda k: s3.get_object(Bucket="lake", Key=k)["Body"].read(), blobs)))
    assert got == blobs
    assert s3.list_objects_v2(Bucket="lake", Prefix="conc/")["KeyCount"] == 60
    t0 = time.monotonic()
    s3.delete_objects(Bucket="lake", Delete={"Objects": [{"Key": k} for k in blobs], "Quiet": True})
    assert time.monotonic() - t0 < 60
    assert s3.list_objects_v2(Bucket="lake", Prefix="conc/")["KeyCount"] == 0


def test_anonymous_access_only_when_enabled(cluster_factory, tmp):
    """`gateway.anonymous = true` lets unsigned requests in; signed ones still work."""
    import subprocess

    from conftest import LOCUS_BIN, _port_open, free_port, stop_process

    c = cluster_factory(args=["--no-gateway"])
    addr = f"127.0.0.1:{free_port()}"
    with open(tmp / "anon-gateway.log", "wb") as log:
        p = subprocess.Popen([str(LOCUS_BIN), "--master", c.master, "gateway", "--address", addr], stdout=log,
                             stderr=subprocess.STDOUT, env=c.env({"LOCUS_GATEWAY__ANONYMOUS": "true"}))
    try:
        wait_until(lambda: _port_open(addr), timeout=20, what="the gateway to listen")

        def call(method, path, body=None):
            req = urllib.request.Request(f"http://{addr}{path}", data=body, method=method)
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, r.read()

        assert call("PUT", "/anon")[0] == 200
        assert call("PUT", "/anon/x.txt", b"hello anonymous")[0] == 200
        assert call("GET", "/anon/x.txt") == (200, b"hello anonymous")
        assert b"<Key>x.txt</Key>" in call("GET", "/anon?list-type=2")[1]
        signed = gw_client(f"http://{addr}")
        assert signed.get_object(Bucket="anon", Key="x.txt")["Body"].read() == b"hello anonymous"
        expect("SignatureDoesNotMatch", gw_client(f"http://{addr}", secret="wrong").list_buckets)
    finally:
        stop_process(p)
