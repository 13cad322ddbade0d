"""The S3 behaviour real clients rely on beyond reads and writes (issue 23), checked with
boto3 and awscli against the real gateway, over a local-directory bucket and a bucket
mounted from a real MinIO: the versioning calls on unversioned buckets, the standard
headers, conditional writes, multipart retries and reads by part number, listing details
(prefix `/`, URL encoding, markers, owners, paging of buckets), bucket tagging, ACLs,
chunked uploads without a length, and error bodies with a message and a request id."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import subprocess
import sys
from datetime import datetime, timedelta, timezone

import pytest
from botocore.auth import S3SigV4Auth
from botocore.config import Config
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from conftest import GW_KEY, GW_SECRET, MiB, clean_env

BUCKETS = ["local", "lake"]
# Well-formed version ids (an AWS one, a MinIO one) that no object here has, and a
# malformed one.
AWS_VERSION = "3HL4kqtJlcpXroDTDmJ_rmSpXd3dIbrH"
MINIO_VERSION = "0b5e8f0e-7c1a-4c4e-9d1f-2a3b4c5d6e7f"
BAD_VERSION = "not a version"


def err(exc: ClientError) -> tuple[int, str]:
    return exc.response["ResponseMetadata"]["HTTPStatusCode"], exc.response["Error"].get("Code", "")


def expect(status: int, code: str | None, fn, *a, **kw) -> ClientError:
    with pytest.raises(ClientError) as ei:
        fn(*a, **kw)
    got = err(ei.value)
    assert got[0] == status and (code is None or got[1] == code), f"expected {status} {code}, got {got}"
    return ei.value


def headers(resp) -> dict:
    return resp["ResponseMetadata"]["HTTPHeaders"]


def aws(gateway, *args, check=True, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    env = clean_env({"AWS_ACCESS_KEY_ID": GW_KEY, "AWS_SECRET_ACCESS_KEY": GW_SECRET,
                     "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": "/dev/null",
                     "AWS_SHARED_CREDENTIALS_FILE": "/dev/null"})
    cmd = [sys.executable, "-m", "awscli", "--endpoint-url", gateway.endpoint, *map(str, args)]
    r = subprocess.run(cmd, input=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300, env=env)
    if check and r.returncode != 0:
        raise AssertionError(f"aws {' '.join(map(str, args))} failed ({r.returncode}): {r.stderr.decode()[-2000:]}")
    return r


def signed(gateway, method: str, path: str, body=b"", hdrs: dict | None = None, chunked: bool = False,
           secret: str = GW_SECRET):
    """One raw request signed with botocore's SigV4 (unsigned payload); with `chunked`,
    `body` (an iterable of chunks) goes with `Transfer-Encoding: chunked` and no length."""
    host = gateway.cluster.gateway
    req = AWSRequest(method=method, url=f"http://{host}{path}", data=b"", headers=dict(hdrs or {}))
    req.context["client_config"] = Config(s3={"payload_signing_enabled": False})  # UNSIGNED-PAYLOAD
    S3SigV4Auth(Credentials(GW_KEY, secret), "s3", "us-east-1").add_auth(req)
    c = http.client.HTTPConnection(*host.rsplit(":", 1), timeout=30)
    h = dict(req.headers.items())
    if chunked:
        c.request(method, path, body=iter(body), headers=h, encode_chunked=True)
    else:
        c.request(method, path, body=body, headers=h)
    r = c.getresponse()
    out = (r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
    c.close()
    return out


# --------------------------------------------------------------------------- versioning


@pytest.mark.parametrize("bucket", BUCKETS)
def test_versioning_calls_on_unversioned_buckets(gateway, bucket):
    s3 = gateway.s3
    v = s3.get_bucket_versioning(Bucket=bucket)
    assert "Status" not in v and "MFADelete" not in v, v  # never enabled
    keys = [f"ver/{n}" for n in ("a", "b", "c/d")]
    for k in keys:
        s3.put_object(Bucket=bucket, Key=k, Body=k.encode())
    r = s3.list_object_versions(Bucket=bucket, Prefix="ver/")
    assert [x["Key"] for x in r["Versions"]] == keys
    assert all(x["VersionId"] == "null" and x["IsLatest"] for x in r["Versions"]), r["Versions"]
    assert "DeleteMarkers" not in r and r["IsTruncated"] is False
    assert r["Versions"][0]["ETag"] == f'"{hashlib.md5(b"ver/a").hexdigest()}"'
    # pages, and a delimiter
    r = s3.list_object_versions(Bucket=bucket, Prefix="ver/", MaxKeys=1)
    assert r["IsTruncated"] and r["NextKeyMarker"] == "ver/a" and r["NextVersionIdMarker"] == "null"
    r = s3.list_object_versions(Bucket=bucket, Prefix="ver/", KeyMarker="ver/a", VersionIdMarker="null")
    assert [x["Key"] for x in r["Versions"]] == keys[1:]
    r = s3.list_object_versions(Bucket=bucket, Prefix="ver/", Delimiter="/")
    assert [x["Key"] for x in r["Versions"]] == keys[:2]
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["ver/c/"]
    # versionId=null is the object; other ids name nothing, malformed ones are refused
    t = s3.get_object_tagging(Bucket=bucket, Key="ver/a", VersionId="null")
    assert t["TagSet"] == [] and t.get("VersionId") == "null"
    expect(404, "NoSuchVersion", s3.get_object_tagging, Bucket=bucket, Key="ver/a", VersionId=AWS_VERSION)
    e = expect(501, "NotImplemented", s3.put_bucket_versioning, Bucket=bucket,
               VersioningConfiguration={"Status": "Enabled"})
    assert "version" in e.response["Error"]["Message"]
    assert "Status" not in s3.get_bucket_versioning(Bucket=bucket)
    g = s3.get_object(Bucket=bucket, Key="ver/a", VersionId="null")
    assert g["Body"].read() == b"ver/a" and g["VersionId"] == "null"
    assert s3.head_object(Bucket=bucket, Key="ver/a", VersionId="null")["ContentLength"] == 5
    for vid in (AWS_VERSION, MINIO_VERSION):
        expect(404, "NoSuchVersion", s3.get_object, Bucket=bucket, Key="ver/a", VersionId=vid)
        expect(404, None, s3.head_object, Bucket=bucket, Key="ver/a", VersionId=vid)
    expect(400, "InvalidArgument", s3.get_object, Bucket=bucket, Key="ver/a", VersionId=BAD_VERSION)
    expect(404, "NoSuchVersion", s3.get_object, Bucket=bucket, Key="ver/none", VersionId="null")
    s3.copy_object(Bucket=bucket, Key="ver/copy", CopySource={"Bucket": bucket, "Key": "ver/b", "VersionId": "null"})
    assert s3.get_object(Bucket=bucket, Key="ver/copy")["Body"].read() == b"ver/b"
    s3.delete_object(Bucket=bucket, Key="ver/copy")
    expect(404, "NoSuchVersion", s3.copy_object, Bucket=bucket, Key="ver/copy",
           CopySource={"Bucket": bucket, "Key": "ver/b", "VersionId": AWS_VERSION})
    expect(400, "InvalidArgument", s3.delete_object, Bucket=bucket, Key="ver/a", VersionId=BAD_VERSION)
    s3.delete_object(Bucket=bucket, Key="ver/a", VersionId=AWS_VERSION)  # no such version: nothing goes
    assert s3.get_object(Bucket=bucket, Key="ver/a")["Body"].read() == b"ver/a"
    d = s3.delete_object(Bucket=bucket, Key="ver/a", VersionId="null")
    assert d.get("VersionId") == "null"
    expect(404, "NoSuchKey", s3.get_object, Bucket=bucket, Key="ver/a")
    d = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "ver/b", "VersionId": "null"},
                                                             {"Key": "ver/c/d"}]})
    assert sorted((x["Key"], x.get("VersionId")) for x in d["Deleted"]) == [("ver/b", "null"), ("ver/c/d", None)]
    assert "Versions" not in s3.list_object_versions(Bucket=bucket, Prefix="ver/")
    # awscli
    assert json.loads(aws(gateway, "s3api", "get-bucket-versioning", "--bucket", bucket).stdout or b"{}") == {}
    s3.put_object(Bucket=bucket, Key="ver/cli", Body=b"x")
    out = json.loads(aws(gateway, "s3api", "list-object-versions", "--bucket", bucket, "--prefix", "ver/").stdout)
    assert [(x["Key"], x["VersionId"]) for x in out["Versions"]] == [("ver/cli", "null")]
    s3.delete_object(Bucket=bucket, Key="ver/cli")


# --------------------------------------------------------------------------- standard headers


STANDARD = {
    "CacheControl": "max-age=3600, public",
    "ContentDisposition": 'attachment; filename="report.csv"',
    "ContentEncoding": "gzip",
    "ContentLanguage": "de-CH",
}


def _has_standard(r, want=STANDARD, expires=None):
    for k, v in want.items():
        assert r.get(k) == v, (k, r.get(k))
    if expires is not None:
        assert r["Expires"] == expires, r.get("Expires")


@pytest.mark.parametrize("bucket", BUCKETS)
def test_standard_headers_are_stored_and_returned(gateway, bucket):
    s3 = gateway.s3
    expires = datetime(2031, 5, 6, 7, 8, 9, tzinfo=timezone.utc)
    s3.put_object(Bucket=bucket, Key="std/put", Body=b"gz", Expires=expires, Tagging="a=1&b=2", **STANDARD)
    h = s3.head_object(Bucket=bucket, Key="std/put")
    _has_standard(h, expires=expires)
    assert headers(h)["x-amz-tagging-count"] == "2"
    g = s3.get_object(Bucket=bucket, Key="std/put")
    _has_standard(g, expires=expires)
    assert g["TagCount"] == 2 and g["Body"].read() == b"gz"
    # untagged: no count
    s3.put_object(Bucket=bucket, Key="std/plain", Body=b"p")
    h = s3.head_object(Bucket=bucket, Key="std/plain")
    assert "x-amz-tagging-count" not in headers(h) and "CacheControl" not in h and "Expires" not in h
    # multipart
    up = s3.create_multipart_upload(Bucket=bucket, Key="std/mp", Expires=expires, **STANDARD)["UploadId"]
    e = s3.upload_part(Bucket=bucket, Key="std/mp", UploadId=up, PartNumber=1, Body=b"part")["ETag"]
    s3.complete_multipart_upload(Bucket=bucket, Key="std/mp", UploadId=up,
                                 MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": e}]})
    _has_standard(s3.head_object(Bucket=bucket, Key="std/mp"), expires=expires)
    # copies: COPY keeps them, REPLACE takes the request's
    s3.copy_object(Bucket=bucket, Key="std/copy", CopySource={"Bucket": bucket, "Key": "std/put"})
    _has_standard(s3.head_object(Bucket=bucket, Key="std/copy"), expires=expires)
    other = {"CacheControl": "no-store", "ContentDisposition": "inline", "ContentLanguage": "fr",
             "ContentEncoding": "identity"}
    s3.copy_object(Bucket=bucket, Key="std/copy", CopySource={"Bucket": bucket, "Key": "std/put"},
                   MetadataDirective="REPLACE", **other)
    h = s3.head_object(Bucket=bucket, Key="std/copy")
    _has_standard(h, want=other)
    assert "Expires" not in h
    # awscli
    f = gateway.cluster.data_dir / "std.txt"
    f.write_bytes(b"cli")
    aws(gateway, "s3", "cp", f, f"s3://{bucket}/std/cli", "--cache-control", "no-cache",
        "--content-disposition", "inline", "--content-language", "en", "--content-encoding", "br")
    h = json.loads(aws(gateway, "s3api", "head-object", "--bucket", bucket, "--key", "std/cli").stdout)
    assert (h["CacheControl"], h["ContentDisposition"], h["ContentLanguage"], h["ContentEncoding"]) == \
        ("no-cache", "inline", "en", "br")


# --------------------------------------------------------------------------- conditional requests


@pytest.mark.parametrize("bucket", BUCKETS)
def test_conditional_writes_and_etags_on_304_and_412(gateway, bucket):
    s3 = gateway.s3
    etag = s3.put_object(Bucket=bucket, Key="cond/k", Body=b"one", IfNoneMatch="*")["ETag"]
    expect(412, "PreconditionFailed", s3.put_object, Bucket=bucket, Key="cond/k", Body=b"two", IfNoneMatch="*")
    expect(412, "PreconditionFailed", s3.put_object, Bucket=bucket, Key="cond/k", Body=b"two",
           IfMatch='"00000000000000000000000000000000"')
    expect(404, "NoSuchKey", s3.put_object, Bucket=bucket, Key="cond/none", Body=b"x", IfMatch=etag)
    etag2 = s3.put_object(Bucket=bucket, Key="cond/k", Body=b"two", IfMatch=etag)["ETag"]
    assert s3.get_object(Bucket=bucket, Key="cond/k")["Body"].read() == b"two"
    # multipart completion takes the same conditions
    up = s3.create_multipart_upload(Bucket=bucket, Key="cond/k")["UploadId"]
    pe = s3.upload_part(Bucket=bucket, Key="cond/k", UploadId=up, PartNumber=1, Body=b"three")["ETag"]
    parts = {"Parts": [{"PartNumber": 1, "ETag": pe}]}
    expect(412, "PreconditionFailed", s3.complete_multipart_upload, Bucket=bucket, Key="cond/k", UploadId=up,
           MultipartUpload=parts, IfNoneMatch="*")
    s3.complete_multipart_upload(Bucket=bucket, Key="cond/k", UploadId=up, MultipartUpload=parts, IfMatch=etag2)
    assert s3.get_object(Bucket=bucket, Key="cond/k")["Body"].read() == b"three"
    # 304 and 412 answers carry the ETag
    etag3 = s3.head_object(Bucket=bucket, Key="cond/k")["ETag"]
    e = expect(304, None, s3.get_object, Bucket=bucket, Key="cond/k", IfNoneMatch=etag3)
    assert headers(e.response)["etag"] == etag3 and "last-modified" in headers(e.response)
    e = expect(412, "PreconditionFailed", s3.get_object, Bucket=bucket, Key="cond/k", IfMatch=etag)
    assert headers(e.response)["etag"] == etag3
    e = expect(304, None, s3.head_object, Bucket=bucket, Key="cond/k",
               IfModifiedSince=datetime.now(timezone.utc) + timedelta(days=1))
    assert headers(e.response)["etag"] == etag3


# --------------------------------------------------------------------------- multipart


@pytest.mark.parametrize("bucket", BUCKETS)
def test_multipart_retries_replaced_parts_and_part_numbers(gateway, bucket):
    s3 = gateway.s3
    key = "mp/obj"
    p1_old, p1, p2 = os.urandom(5 * MiB), os.urandom(5 * MiB + 17), os.urandom(1234)
    up = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    s3.upload_part(Bucket=bucket, Key=key, UploadId=up, PartNumber=1, Body=p1_old)
    e1 = s3.upload_part(Bucket=bucket, Key=key, UploadId=up, PartNumber=1, Body=p1)["ETag"]  # replaces it
    e2 = s3.upload_part(Bucket=bucket, Key=key, UploadId=up, PartNumber=2, Body=p2)["ETag"]
    listed = s3.list_parts(Bucket=bucket, Key=key, UploadId=up)["Parts"]
    assert [(p["PartNumber"], p["ETag"], p["Size"]) for p in listed] == [(1, e1, len(p1)), (2, e2, len(p2))]
    parts = {"Parts": [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2}]}
    done = s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=up, MultipartUpload=parts)
    assert done["ETag"].endswith('-2"')
    # an SDK's retry of the same Complete: 200, the same ETag
    again = s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=up, MultipartUpload=parts)
    assert again["ETag"] == done["ETag"]
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == p1 + p2
    expect(404, "NoSuchUpload", s3.complete_multipart_upload, Bucket=bucket, Key=key,
           UploadId="0123456789abcdef0123456789abcdef", MultipartUpload=parts)
    # GET and HEAD by part number
    total = len(p1) + len(p2)
    g = s3.get_object(Bucket=bucket, Key=key, PartNumber=1)
    assert g["Body"].read() == p1 and g["PartsCount"] == 2 and g["ETag"] == done["ETag"]
    assert g["ContentRange"] == f"bytes 0-{len(p1) - 1}/{total}"
    assert g["ResponseMetadata"]["HTTPStatusCode"] == 206
    h = s3.head_object(Bucket=bucket, Key=key, PartNumber=2)
    assert h["ContentLength"] == len(p2) and h["PartsCount"] == 2
    assert h["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert h["ContentRange"] == f"bytes {len(p1)}-{total - 1}/{total}"
    h = s3.head_object(Bucket=bucket, Key=key, Range="bytes=0-1")
    assert h["ResponseMetadata"]["HTTPStatusCode"] == 206 and h["ContentLength"] == 2
    e = expect(416, "InvalidPartNumber", s3.get_object, Bucket=bucket, Key=key, PartNumber=3)
    assert e.response["Error"]["Message"]
    expect(400, "InvalidRequest", s3.get_object, Bucket=bucket, Key=key, PartNumber=1, Range="bytes=0-1")
    # three parts, all but the last of one size (as SDKs upload): every part found
    sizes = [5 * MiB + 3, 5 * MiB + 3, 777]
    blobs = [os.urandom(n) for n in sizes]
    up = s3.create_multipart_upload(Bucket=bucket, Key="mp/three")["UploadId"]
    tags = [s3.upload_part(Bucket=bucket, Key="mp/three", UploadId=up, PartNumber=n + 1, Body=b)["ETag"]
            for n, b in enumerate(blobs)]
    s3.complete_multipart_upload(Bucket=bucket, Key="mp/three", UploadId=up, MultipartUpload={
        "Parts": [{"PartNumber": n + 1, "ETag": t} for n, t in enumerate(tags)]})
    for n, b in enumerate(blobs):
        g = s3.get_object(Bucket=bucket, Key="mp/three", PartNumber=n + 1)
        assert g["Body"].read() == b and g["PartsCount"] == 3
    expect(416, None, s3.head_object, Bucket=bucket, Key="mp/three", PartNumber=4)  # (a HEAD has no body)
    # an object not uploaded in parts is its own part 1
    s3.put_object(Bucket=bucket, Key="mp/single", Body=b"single")
    g = s3.get_object(Bucket=bucket, Key="mp/single", PartNumber=1)
    assert g["Body"].read() == b"single" and "PartsCount" not in g
    expect(416, "InvalidPartNumber", s3.get_object, Bucket=bucket, Key="mp/single", PartNumber=2)
    # a copy of a multipart object is not in parts
    s3.copy_object(Bucket=bucket, Key="mp/copy", CopySource={"Bucket": bucket, "Key": key})
    assert s3.head_object(Bucket=bucket, Key="mp/copy", PartNumber=1)["ContentLength"] == total


# --------------------------------------------------------------------------- listings


@pytest.mark.parametrize("bucket", BUCKETS)
def test_listing_details(gateway, bucket):
    s3 = gateway.s3
    odd = ["lst/a b+c%d&e.txt", "lst/plain", "lst/sub/x", "lst/ü/y"]
    for k in odd:
        s3.put_object(Bucket=bucket, Key=k, Body=b"v")
    # boto3 asks for encoding-type=url and decodes: keys with '+', '%', ' ' survive
    r = s3.list_objects_v2(Bucket=bucket, Prefix="lst/")
    assert [o["Key"] for o in r["Contents"]] == odd
    r = s3.list_objects(Bucket=bucket, Prefix="lst/", Delimiter="/")
    assert [o["Key"] for o in r["Contents"]] == odd[:2]
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["lst/sub/", "lst/ü/"]
    # ... as the raw answer shows
    status, _, body = signed(gateway, "GET", f"/{bucket}?list-type=2&prefix=lst%2F&encoding-type=url")
    assert status == 200 and b"<Key>lst/a+b%2Bc%25d%26e.txt</Key>" in body and b"<Key>lst/%C3%BC/y</Key>" in body
    # ... and with a delimiter, the prefix and each common prefix are encoded too
    status, _, body = signed(gateway, "GET", f"/{bucket}?list-type=2&prefix=lst%2F%C3%BC&delimiter=%2F&encoding-type=url")
    assert status == 200 and b"<Prefix>lst/%C3%BC</Prefix>" in body, body[:800]
    assert b"<CommonPrefixes><Prefix>lst/%C3%BC/</Prefix></CommonPrefixes>" in body, body[:800]
    status, _, body = signed(gateway, "GET", f"/{bucket}?list-type=2&prefix=lst%2F")
    assert b"<Key>lst/a b+c%d&amp;e.txt</Key>" in body, body[:500]
    status, _, body = signed(gateway, "GET", f"/{bucket}?list-type=2&encoding-type=base64")
    assert status == 400 and b"InvalidArgument" in body
    # Prefix=/ : only keys beginning with '/' (there are none)
    assert s3.list_objects_v2(Bucket=bucket, Prefix="/").get("KeyCount") == 0
    assert "Contents" not in s3.list_objects(Bucket=bucket, Prefix="/")
    # V1: Marker echoed; NextMarker only with a delimiter
    r = s3.list_objects(Bucket=bucket, Prefix="lst/", Marker="lst/plain")
    assert r["Marker"] == "lst/plain" and [o["Key"] for o in r["Contents"]] == odd[2:]
    r = s3.list_objects(Bucket=bucket, Prefix="lst/", MaxKeys=1)
    assert r["IsTruncated"] and "NextMarker" not in r and r["Marker"] == ""
    r = s3.list_objects(Bucket=bucket, Prefix="lst/", Delimiter="/", MaxKeys=3)
    assert r["IsTruncated"] and r["NextMarker"] == "lst/sub/"
    assert "Owner" in r["Contents"][0]  # V1 lists owners
    # V2: owners only with FetchOwner
    r = s3.list_objects_v2(Bucket=bucket, Prefix="lst/")
    assert "Owner" not in r["Contents"][0]
    r = s3.list_objects_v2(Bucket=bucket, Prefix="lst/", FetchOwner=True)
    owner = r["Contents"][0]["Owner"]
    assert owner["ID"] and owner["DisplayName"]
    assert owner == s3.get_bucket_acl(Bucket=bucket)["Owner"]
    # MaxKeys=0: nothing, not truncated
    for r in (s3.list_objects_v2(Bucket=bucket, Prefix="lst/", MaxKeys=0),
              s3.list_objects(Bucket=bucket, Prefix="lst/", MaxKeys=0)):
        assert r["IsTruncated"] is False and "Contents" not in r, r
    for k in odd:
        s3.delete_object(Bucket=bucket, Key=k)


def test_list_buckets_pages_and_creation_dates(gateway):
    s3 = gateway.s3
    made = sorted(gateway.new_bucket() for _ in range(3))
    everything = s3.list_buckets()
    names = [b["Name"] for b in everything["Buckets"]]
    assert set(made) | {"local", "lake"} <= set(names) and names == sorted(names)
    assert "ContinuationToken" not in everything and everything["Owner"]["ID"]
    # pages of one
    seen, token = [], None
    while True:
        kw = {"ContinuationToken": token} if token else {}
        r = s3.list_buckets(MaxBuckets=1, **kw)
        seen += [b["Name"] for b in r["Buckets"]]
        token = r.get("ContinuationToken")
        if not token:
            break
        assert len(r["Buckets"]) == 1
    assert seen == names
    r = s3.list_buckets(Prefix="b-", MaxBuckets=2)
    assert [b["Name"] for b in r["Buckets"]] == [n for n in names if n.startswith("b-")][:2]
    assert r["Prefix"] == "b-"
    status, _, body = signed(gateway, "GET", "/?max-buckets=0")  # (boto3 refuses to send it)
    assert status == 400 and b"InvalidArgument" in body
    # creation dates: the mount's time for the mounted bucket (not 1970)
    year_ago = datetime.now(timezone.utc) - timedelta(days=365)
    for b in everything["Buckets"]:
        if b["Name"] in ("lake", "local", *made):
            assert b["CreationDate"] > year_ago, b
    out = aws(gateway, "s3", "ls").stdout.decode()
    # The date opens each line (a random bucket name may hold "1970" too).
    assert not any(line.startswith("1970") for line in out.splitlines()) and " lake" in out, out
    # an S3 prefix (no time of its own) first seen through Locus gets that time
    gateway.minio.put_object(Bucket=gateway.minio_bucket, Key="from-ufs/dir/x", Body=b"x")
    st = gateway.cluster.stat("/lake/from-ufs/dir")
    assert st["is_dir"] and st["mtime_ms"] > year_ago.timestamp() * 1000, st
    for b in made:
        s3.delete_bucket(Bucket=b)


# --------------------------------------------------------------------------- bucket tagging and ACLs


@pytest.mark.parametrize("bucket", BUCKETS)
def test_bucket_tagging(gateway, bucket):
    s3 = gateway.s3
    expect(404, "NoSuchTagSet", s3.get_bucket_tagging, Bucket=bucket)
    tags = [{"Key": "team", "Value": "data"}, {"Key": "cost center", "Value": "42"}]
    s3.put_bucket_tagging(Bucket=bucket, Tagging={"TagSet": tags})
    got = s3.get_bucket_tagging(Bucket=bucket)["TagSet"]
    assert sorted((t["Key"], t["Value"]) for t in got) == sorted((t["Key"], t["Value"]) for t in tags)
    # still an ordinary bucket: listed, its objects unchanged
    assert bucket in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    expect(400, "InvalidTag", s3.put_bucket_tagging, Bucket=bucket,
           Tagging={"TagSet": [{"Key": "k", "Value": "1"}, {"Key": "k", "Value": "2"}]})
    out = json.loads(aws(gateway, "s3api", "get-bucket-tagging", "--bucket", bucket).stdout)
    assert len(out["TagSet"]) == 2
    s3.delete_bucket_tagging(Bucket=bucket)
    expect(404, "NoSuchTagSet", s3.get_bucket_tagging, Bucket=bucket)
    expect(404, "NoSuchBucket", s3.get_bucket_tagging, Bucket="no-such-bucket-here")


@pytest.mark.parametrize("bucket", BUCKETS)
def test_acls_are_private_only(gateway, bucket):
    s3 = gateway.s3
    s3.put_object(Bucket=bucket, Key="acl/o", Body=b"o")
    for acl in (s3.get_bucket_acl(Bucket=bucket), s3.get_object_acl(Bucket=bucket, Key="acl/o")):
        owner = acl["Owner"]
        assert len(owner["ID"]) == 64
        assert acl["Grants"] == [{"Grantee": {"Type": "CanonicalUser", "ID": owner["ID"],
                                              "DisplayName": owner["DisplayName"]},
                                  "Permission": "FULL_CONTROL"}]
    owner = s3.get_bucket_acl(Bucket=bucket)["Owner"]
    s3.put_bucket_acl(Bucket=bucket, ACL="private")
    s3.put_object_acl(Bucket=bucket, Key="acl/o", ACL="private")
    policy = {"Owner": owner, "Grants": [{"Grantee": {"Type": "CanonicalUser", "ID": owner["ID"]},
                                          "Permission": "FULL_CONTROL"}]}
    s3.put_bucket_acl(Bucket=bucket, AccessControlPolicy=policy)
    s3.put_object_acl(Bucket=bucket, Key="acl/o", AccessControlPolicy=policy)
    s3.put_object_acl(Bucket=bucket, Key="acl/o", GrantFullControl=f'id="{owner["ID"]}"')
    e = expect(400, "AccessControlListNotSupported", s3.put_bucket_acl, Bucket=bucket, ACL="public-read")
    assert "private" in e.response["Error"]["Message"]
    expect(400, "AccessControlListNotSupported", s3.put_object_acl, Bucket=bucket, Key="acl/o",
           ACL="public-read-write")
    public = {"Owner": owner, "Grants": policy["Grants"] + [
        {"Grantee": {"Type": "Group", "URI": "http://acs.amazonaws.com/groups/global/AllUsers"},
         "Permission": "READ"}]}
    expect(400, "AccessControlListNotSupported", s3.put_object_acl, Bucket=bucket, Key="acl/o",
           AccessControlPolicy=public)
    expect(400, "AccessControlListNotSupported", s3.put_bucket_acl, Bucket=bucket,
           GrantRead='uri="http://acs.amazonaws.com/groups/global/AllUsers"')
    expect(404, "NoSuchKey", s3.get_object_acl, Bucket=bucket, Key="acl/none")
    # writes that ask for an ACL: only the private ones
    s3.put_object(Bucket=bucket, Key="acl/p", Body=b"p", ACL="private")
    s3.put_object(Bucket=bucket, Key="acl/p", Body=b"p", ACL="bucket-owner-full-control")
    expect(400, "AccessControlListNotSupported", s3.put_object, Bucket=bucket, Key="acl/p", Body=b"p",
           ACL="public-read")
    expect(400, "AccessControlListNotSupported", s3.copy_object, Bucket=bucket, Key="acl/c", ACL="public-read",
           CopySource={"Bucket": bucket, "Key": "acl/p"})
    expect(400, "AccessControlListNotSupported", s3.create_multipart_upload, Bucket=bucket, Key="acl/m",
           ACL="authenticated-read")
    out = json.loads(aws(gateway, "s3api", "get-bucket-acl", "--bucket", bucket).stdout)
    assert out["Grants"][0]["Permission"] == "FULL_CONTROL"
    r = aws(gateway, "s3api", "put-bucket-acl", "--bucket", bucket, "--acl", "public-read", check=False)
    assert r.returncode != 0 and b"AccessControlListNotSupported" in r.stderr


# --------------------------------------------------------------------------- chunked uploads


@pytest.mark.parametrize("bucket", BUCKETS)
def test_chunked_uploads_without_content_length(gateway, bucket):
    s3 = gateway.s3
    chunks = [os.urandom(n) for n in (1, 65536, 3 * MiB + 5, 10)]
    status, hdrs, body = signed(gateway, "PUT", f"/{bucket}/chunked/raw", body=chunks, chunked=True,
                                hdrs={"Content-Type": "application/x-chunks"})
    assert status == 200, body
    data = b"".join(chunks)
    assert hdrs["etag"] == f'"{hashlib.md5(data).hexdigest()}"'
    g = s3.get_object(Bucket=bucket, Key="chunked/raw")
    assert g["Body"].read() == data and g["ContentType"] == "application/x-chunks"
    # awscli streaming from stdin (its size unknown): small, and above its multipart threshold
    for name, n in (("small", 1000), ("big", 9 * MiB + 3)):
        blob = os.urandom(n)
        aws(gateway, "s3", "cp", "-", f"s3://{bucket}/chunked/{name}", stdin=blob)
        assert s3.get_object(Bucket=bucket, Key=f"chunked/{name}")["Body"].read() == blob


# --------------------------------------------------------------------------- errors


def _error_lines(gateway) -> int:
    return sum(p.read_text(errors="replace").count(" ERROR ") for p in gateway.cluster.log_paths)


def test_errors_carry_a_message_and_the_request_id(gateway):
    s3 = gateway.s3
    before = _error_lines(gateway)
    e = expect(404, "NoSuchKey", s3.get_object, Bucket="local", Key="errors/none")
    assert e.response["Error"]["Message"] == "The specified key does not exist."
    rid = e.response["ResponseMetadata"]["RequestId"]
    assert re.fullmatch(r"[0-9A-F]{16}", rid), rid
    status, hdrs, body = signed(gateway, "GET", "/local/errors/none")
    assert status == 404
    m = re.search(rb"<RequestId>([^<]+)</RequestId>", body)
    assert m and m.group(1).decode() == hdrs["x-amz-request-id"], (body, hdrs)
    assert b"<Message>The specified key does not exist.</Message>" in body
    # an error s3s raises before any operation runs (a bad signature) gets them too
    status, hdrs, body = signed(gateway, "GET", "/local/errors/none", secret="wrong")
    assert status == 403 and b"<Code>SignatureDoesNotMatch</Code><Message>" in body, body
    assert f"<RequestId>{hdrs['x-amz-request-id']}</RequestId>".encode() in body, body
    expect(404, "NoSuchBucket", s3.list_objects_v2, Bucket="no-such-bucket-here")
    # the AWS CLI shows the message (not "Unknown")
    r = aws(gateway, "s3api", "get-object", "--bucket", "local", "--key", "errors/none", "/dev/null", check=False)
    assert r.returncode != 0
    msg = r.stderr.decode()
    assert "NoSuchKey" in msg and "The specified key does not exist." in msg and "Unknown" not in msg, msg
    s3.put_object(Bucket="local", Key="errors/keep", Body=b"k")
    r = aws(gateway, "s3api", "delete-bucket", "--bucket", "local", check=False)
    assert "BucketNotEmpty" in r.stderr.decode() and "Unknown" not in r.stderr.decode()
    # client mistakes are not logged as errors
    assert _error_lines(gateway) == before


def _half_sent_part(s3, bucket, key, up, data):
    """An UploadPart of part 1 (presigned) with half its body sent: send the rest with
    `.send(...)` and read the answer."""
    url = s3.generate_presigned_url("upload_part", Params={"Bucket": bucket, "Key": key, "UploadId": up,
                                                           "PartNumber": 1})
    host, rest = url.split("://", 1)[1].split("/", 1)
    conn = http.client.HTTPConnection(host, timeout=60)
    conn.putrequest("PUT", "/" + rest)
    conn.putheader("Content-Length", str(len(data)))
    conn.endheaders()
    conn.send(data[: len(data) // 2])
    return conn


def _finish(conn, data):
    conn.send(data[len(data) // 2:])
    r = conn.getresponse()
    body = r.read()
    assert r.status == 200, body
    assert r.getheader("ETag") == '"%s"' % hashlib.md5(data).hexdigest()
    return r.getheader("ETag")


@pytest.mark.parametrize("bucket", BUCKETS)
@pytest.mark.parametrize("last", ["first started", "second started"])
def test_one_part_number_uploaded_twice_at_once_keeps_the_upload_that_finished_last(gateway, bucket, last):
    """Uploads A and B of part 1 overlap: A starts, B starts, then one finishes and the
    other after it. As in AWS, the part is the one that finished last, whichever started
    first: Complete takes its ETag, and the other's is no part of the upload."""
    s3 = gateway.s3
    key = "mp/raced"
    a, b = os.urandom(3 * MiB), os.urandom(2 * MiB)
    up = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    ca = _half_sent_part(s3, bucket, key, up, a)
    cb = _half_sent_part(s3, bucket, key, up, b)
    if last == "first started":
        eb, ea = _finish(cb, b), _finish(ca, a)
        (won, won_tag), lost_tag = (a, ea), eb
    else:
        ea, eb = _finish(ca, a), _finish(cb, b)
        (won, won_tag), lost_tag = (b, eb), ea
    listed = s3.list_parts(Bucket=bucket, Key=key, UploadId=up)["Parts"]
    assert [(p["PartNumber"], p["ETag"], p["Size"]) for p in listed] == [(1, won_tag, len(won))]
    expect(400, "InvalidPart", s3.complete_multipart_upload, Bucket=bucket, Key=key, UploadId=up,
           MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": lost_tag}]})
    s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=up,
                                 MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": won_tag}]})
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == won
