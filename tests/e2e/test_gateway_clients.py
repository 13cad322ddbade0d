"""The S3 gateway under real clients other than boto3: awscli, Spark (s3a), PyArrow; and
the gateway's memory while a 5 GiB object streams through it."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import GW_KEY, GW_SECRET, LOCUS_BIN, MiB, clean_env, free_port, gw_client, stop_process, wait_until, \
    _port_open

TOOLS_DIR = Path(os.environ.get("LOCUS_TOOLS_DIR") or Path.home() / ".cache" / "locus-tools")


# --------------------------------------------------------------------------- awscli


def aws(gateway, *args, check=True, timeout=300) -> subprocess.CompletedProcess:
    env = clean_env({"AWS_ACCESS_KEY_ID": GW_KEY, "AWS_SECRET_ACCESS_KEY": GW_SECRET,
                     "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": "/dev/null",
                     "AWS_SHARED_CREDENTIALS_FILE": "/dev/null"})
    cmd = [sys.executable, "-m", "awscli", "--endpoint-url", gateway.endpoint, *map(str, args)]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout, env=env)
    if check and r.returncode != 0:
        raise AssertionError(f"aws {' '.join(map(str, args))} failed ({r.returncode}): {r.stderr.decode()[-2000:]}")
    return r


def test_awscli_cp_sync_ls(gateway, tmp):
    big = tmp / "big.bin"
    data = os.urandom(20 * MiB + 7)  # above awscli's 8 MiB multipart threshold
    big.write_bytes(data)
    aws(gateway, "s3", "cp", big, "s3://lake/cli/big.bin")
    head = json.loads(aws(gateway, "s3api", "head-object", "--bucket", "lake", "--key", "cli/big.bin").stdout)
    assert head["ContentLength"] == len(data)
    assert head["ETag"].strip('"').endswith("-3"), head["ETag"]  # 8 MiB parts: a multipart ETag
    back = tmp / "back.bin"
    aws(gateway, "s3", "cp", "s3://lake/cli/big.bin", back)
    assert hashlib.sha256(back.read_bytes()).digest() == hashlib.sha256(data).digest()

    src = tmp / "tree"
    for i in range(12):
        p = src / f"d{i % 3}" / f"f{i}.txt"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"file {i}\n" * (i + 1))
    aws(gateway, "s3", "sync", src, "s3://local/synced")
    out = aws(gateway, "s3", "ls", "--recursive", "s3://local/synced/").stdout.decode()
    listed = sorted(line.split()[-1] for line in out.splitlines())
    assert listed == sorted(f"synced/d{i % 3}/f{i}.txt" for i in range(12)), out
    # a second sync copies nothing; a changed file is copied again
    again = aws(gateway, "s3", "sync", src, "s3://local/synced").stdout.decode()
    assert "upload:" not in again, again
    (src / "d0" / "f0.txt").write_text("changed, and longer than before\n")
    again = aws(gateway, "s3", "sync", src, "s3://local/synced").stdout.decode()
    assert again.count("upload:") == 1, again
    down = tmp / "down"
    aws(gateway, "s3", "sync", "s3://local/synced", down)
    for p in src.rglob("*.txt"):
        assert (down / p.relative_to(src)).read_bytes() == p.read_bytes()
    top = aws(gateway, "s3", "ls", "s3://local/synced/").stdout.decode()
    assert "PRE d0/" in top and "PRE d2/" in top, top
    buckets = aws(gateway, "s3", "ls").stdout.decode()
    assert "local" in buckets and "lake" in buckets


def test_awscli_s3api(gateway, tmp):
    f = tmp / "meta.txt"
    f.write_bytes(b"0123456789" * 100)
    aws(gateway, "s3api", "put-object", "--bucket", "lake", "--key", "api/meta.txt", "--body", f,
        "--content-type", "text/x-api", "--metadata", "color=blue,size=m", "--tagging", "env=test")
    h = json.loads(aws(gateway, "s3api", "head-object", "--bucket", "lake", "--key", "api/meta.txt").stdout)
    assert h["ContentType"] == "text/x-api" and h["Metadata"] == {"color": "blue", "size": "m"}
    assert h["ETag"] == '"' + hashlib.md5(f.read_bytes()).hexdigest() + '"'
    tags = json.loads(aws(gateway, "s3api", "get-object-tagging", "--bucket", "lake", "--key",
                          "api/meta.txt").stdout)["TagSet"]
    assert tags == [{"Key": "env", "Value": "test"}]
    aws(gateway, "s3api", "put-object-tagging", "--bucket", "lake", "--key", "api/meta.txt",
        "--tagging", json.dumps({"TagSet": [{"Key": "env", "Value": "prod"}]}))
    tags = json.loads(aws(gateway, "s3api", "get-object-tagging", "--bucket", "lake", "--key",
                          "api/meta.txt").stdout)["TagSet"]
    assert tags == [{"Key": "env", "Value": "prod"}]
    part = tmp / "part.out"
    r = json.loads(aws(gateway, "s3api", "get-object", "--bucket", "lake", "--key", "api/meta.txt",
                       "--range", "bytes=5-14", part).stdout)
    assert part.read_bytes() == b"5678901234" and r["ContentRange"] == "bytes 5-14/1000"
    for i in range(7):
        aws(gateway, "s3api", "put-object", "--bucket", "lake", "--key", f"api/page/{i}", "--body", f)
    # list-objects-v2 pagination, page by page with the continuation token
    keys, token, pages = [], None, 0
    while True:
        args = ["s3api", "list-objects-v2", "--bucket", "lake", "--prefix", "api/page/", "--max-keys", "3",
                "--no-paginate"]
        if token:
            args += ["--continuation-token", token]
        r = json.loads(aws(gateway, *args).stdout)
        pages += 1
        keys += [o["Key"] for o in r["Contents"]]
        if not r["IsTruncated"]:
            break
        token = r["NextContinuationToken"]
    assert pages == 3 and keys == [f"api/page/{i}" for i in range(7)]
    err = aws(gateway, "s3api", "head-object", "--bucket", "lake", "--key", "api/none", check=False)
    assert err.returncode != 0 and b"404" in err.stderr


# --------------------------------------------------------------------------- PyArrow


def test_pyarrow_parquet_through_the_gateway(gateway):
    import pyarrow as pa
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    host = gateway.cluster.gateway
    fs = pafs.S3FileSystem(access_key=GW_KEY, secret_key=GW_SECRET, endpoint_override=host, scheme="http",
                           region="us-east-1")
    table = pa.table({"id": list(range(50_000)), "name": [f"n{i % 97}" for i in range(50_000)],
                      "x": [i * 0.5 for i in range(50_000)]})
    # written by boto3, read by PyArrow
    buf = io.BytesIO()
    pq.write_table(table, buf)
    gateway.s3.put_object(Bucket="lake", Key="arrow/t.parquet", Body=buf.getvalue())
    got = pq.read_table("lake/arrow/t.parquet", filesystem=fs)
    assert got.equals(table)
    # and both ways through PyArrow's own S3 client
    pq.write_table(table, "local/arrow/w.parquet", filesystem=fs)
    assert pq.read_table("local/arrow/w.parquet", filesystem=fs).equals(table)
    sel = pq.read_table("lake/arrow/t.parquet", filesystem=fs, columns=["name"])
    assert sel.num_rows == 50_000 and sel.column_names == ["name"]


# --------------------------------------------------------------------------- Spark


def _jars() -> str:
    env = os.environ.get("SPARK_S3A_JARS")
    if env:
        return env
    from sparkutil import find_jars

    jars = find_jars(str(TOOLS_DIR))
    assert jars, f"the s3a jars are missing from {TOOLS_DIR}/jars: run scripts/install-spark (scripts/test does)"
    return jars


@pytest.fixture(scope="module")
def spark(gateway):
    from sparkutil import spark_session

    s = spark_session(gateway.endpoint, GW_KEY, GW_SECRET, _jars(), app="locus-gateway-test")
    yield s
    s.stop()


def test_spark_counts_lines(gateway, spark):
    lines = [f"line {i} " + "x" * (i % 50) for i in range(120_000)]
    body = ("\n".join(lines) + "\n").encode()
    gateway.s3.put_object(Bucket="lake", Key="spark/text.txt", Body=body)
    gateway.s3.put_object(Bucket="local", Key="spark/text.txt", Body=body)
    assert spark.read.text("s3a://lake/spark/text.txt").count() == len(lines)
    assert spark.read.text("s3a://local/spark/text.txt").count() == len(lines)


@pytest.mark.parametrize("bucket", ["local", "lake"])
def test_spark_writes_parquet_and_reads_it_back(gateway, spark, bucket):
    rows = [(i, f"name-{i % 13}", i * 1.5) for i in range(20_000)]
    df = spark.createDataFrame(rows, ["id", "name", "v"]).repartition(3)
    out = f"s3a://{bucket}/spark/out.parquet"
    df.write.mode("overwrite").parquet(out)
    back = spark.read.parquet(out)
    assert sorted(tuple(r) for r in back.collect()) == sorted(rows)
    keys = [o["Key"] for o in gateway.s3.list_objects_v2(Bucket=bucket, Prefix="spark/out.parquet/")["Contents"]]
    assert "spark/out.parquet/_SUCCESS" in keys
    assert sum(k.endswith(".parquet") for k in keys) == 3, keys
    assert not any("_temporary" in k for k in keys), keys  # the committer's renames and deletes went through
    # an overwrite replaces the dataset
    df.limit(10).write.mode("overwrite").parquet(out)
    assert spark.read.parquet(out).count() == 10


# --------------------------------------------------------------------------- memory


class _Pattern:
    """`size` bytes of a repeating 1 MiB random block: a seekable file, never held whole."""

    def __init__(self, size: int, block: bytes):
        self.size, self.pos = size, 0
        self.block2 = block + block

    def tell(self):
        return self.pos

    def seek(self, off, whence=0):
        self.pos = {0: off, 1: self.pos + off, 2: self.size + off}[whence]
        return self.pos

    def read(self, n=-1):
        left = self.size - self.pos
        n = left if n is None or n < 0 else min(n, left)
        out = bytearray()
        blen = len(self.block2) // 2
        while len(out) < n:
            o = self.pos % blen
            k = min(n - len(out), blen)
            out += self.block2[o:o + k]
            self.pos += k
        return bytes(out)


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def test_gateway_rss_stays_flat_for_a_5gib_object(cluster_factory, tmp):
    """A separate `locus gateway` process: its RSS grows by under 100 MiB while a 5 GiB
    object is PUT and then GET through it."""
    size = int(os.environ.get("LOCUS_E2E_BIG_OBJECT", 5 << 30))
    c = cluster_factory(args=["--no-gateway"])
    addr = f"127.0.0.1:{free_port()}"
    log = open(tmp / "gateway.log", "wb")
    p = subprocess.Popen([str(LOCUS_BIN), "--master", c.master, "gateway", "--address", addr], stdout=log,
                         stderr=subprocess.STDOUT, env=c.env())
    try:
        wait_until(lambda: _port_open(addr), timeout=20, what="the gateway to listen")
        s3 = gw_client(f"http://{addr}")
        s3.create_bucket(Bucket="big")
        s3.put_object(Bucket="big", Key="warm", Body=os.urandom(8 * MiB))  # warm up buffers and pools
        s3.get_object(Bucket="big", Key="warm")["Body"].read()
        base = _rss(p.pid)
        peak = [base]
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                peak[0] = max(peak[0], _rss(p.pid))
                time.sleep(0.1)

        t = threading.Thread(target=sample, daemon=True)
        t.start()
        block = os.urandom(MiB)
        want = hashlib.sha256()
        src = _Pattern(size, block)
        while True:
            b = src.read(8 * MiB)
            if not b:
                break
            want.update(b)
        t0 = time.monotonic()
        s3.put_object(Bucket="big", Key="five.bin", Body=_Pattern(size, block))
        t_put = time.monotonic() - t0
        got = hashlib.sha256()
        t0 = time.monotonic()
        n = 0
        for chunk in s3.get_object(Bucket="big", Key="five.bin")["Body"].iter_chunks(MiB):
            got.update(chunk)
            n += len(chunk)
        t_get = time.monotonic() - t0
        stop.set()
        t.join()
        assert n == size and got.digest() == want.digest()
        growth = peak[0] - base
        print(f"gateway RSS: base {base / MiB:.0f} MiB, peak {peak[0] / MiB:.0f} MiB, growth {growth / MiB:.0f} MiB;"
              f" PUT {size / MiB / t_put:.0f} MiB/s, GET {size / MiB / t_get:.0f} MiB/s")
        assert growth < 100 * MiB, f"gateway RSS grew by {growth / MiB:.0f} MiB"
        assert p.poll() is None
    finally:
        stop_process(p)
        log.close()
