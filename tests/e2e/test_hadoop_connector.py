"""The Hadoop FileSystem connector (locus://, crates/locus-hadoop) driven by real Spark.

One `locus local start` (1 worker, 8 MiB blocks) with a real MinIO bucket mounted at /lake,
and one SparkSession (local[2]) whose class path holds the connector's jar; the JVM loads
liblocus_hadoop.so. scripts/test builds both with scripts/build-hadoop-connector and passes
their paths in LOCUS_HADOOP_JAR and LOCUS_HADOOP_LIB (the conftest builds them otherwise);
tests/e2e/sparkutil.py puts them into every SparkSession of the suite.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
import uuid

import pytest

from conftest import MiB, Cluster, put_object, s3_client, wait_until

sys.path.insert(0, os.path.dirname(__file__))
TOOLS_DIR = os.environ.get("LOCUS_TOOLS_DIR") or os.path.expanduser("~/.cache/locus-tools")


@pytest.fixture(scope="module")
def hcluster(e2e_tmp, minio):
    d = e2e_tmp / f"hadoop-{uuid.uuid4().hex[:6]}"
    d.mkdir()
    c = Cluster(d / "c", d, args=["--block-size", "8MiB"])
    c.start()
    c.s3 = s3_client(minio)
    c.bucket = f"hadoop-{uuid.uuid4().hex[:12]}"
    c.s3.create_bucket(Bucket=c.bucket)
    c.mount_s3("/lake", c.bucket, "", minio, sync="1s")
    try:
        yield c
    finally:
        c.cleanup()
        print(c.log_tail(40))


@pytest.fixture(scope="module")
def spark(hcluster):
    from sparkutil import find_jars, spark_session

    s3a = find_jars(TOOLS_DIR)
    assert s3a, f"the s3a jars are missing from {TOOLS_DIR}/jars: run scripts/install-spark (scripts/test does)"
    assert os.environ.get("LOCUS_HADOOP_JAR"), "the conftest builds the connector"
    # sparkutil adds the connector's jar and library; the s3a settings are unused here.
    s = spark_session("http://127.0.0.1:1", "x", "x", s3a, app="locus-hadoop-test", extra={
        "spark.hadoop.fs.locus.impl": "io.locus.hadoop.LocusFileSystem",
        "spark.hadoop.fs.locus.master": hcluster.master,
        "spark.hadoop.fs.locus.token.file": str(hcluster.token_file),
    })
    try:
        yield s
    finally:
        s.stop()


def _fs(spark, uri: str = "locus:///"):
    jvm = spark._jvm
    conf = spark._jsc.hadoopConfiguration()
    return jvm, jvm.org.apache.hadoop.fs.FileSystem.get(jvm.java.net.URI(uri), conf)


def _text(n_lines: int) -> bytes:
    return b"".join(b"line %08d of the connector test, with some padding to make it longer\n" % i
                    for i in range(n_lines))


def test_spark_counts_lines_from_the_ufs_then_short_circuit(hcluster, spark):
    body = _text(400_000)  # about 29 MiB: four 8 MiB blocks
    put_object(hcluster.s3, hcluster.bucket, "text/lines.txt", body)
    base = hcluster.counters()
    assert spark.read.text("locus:///lake/text/lines.txt").count() == 400_000
    first = hcluster.delta(base)
    assert first["ufs"] >= len(body), f"the first count must fill the cache from MinIO: {first}"
    st = hcluster.stat("/lake/text/lines.txt")
    assert st["cached_fraction"] == pytest.approx(1.0), st

    base = hcluster.counters()
    assert spark.read.text("locus:///lake/text/lines.txt").count() == 400_000
    again = hcluster.delta(base)
    assert again["ufs"] == 0, f"the second count must not touch MinIO: {again}"
    assert again["short_circuit"] >= len(body), f"a co-located reader reads short-circuit: {again}"
    assert again["remote_worker"] == 0, again

    # Locality hints: each 8 MiB block names the host of the worker caching it.
    jvm, fs = _fs(spark)
    st = fs.getFileStatus(jvm.org.apache.hadoop.fs.Path("/lake/text/lines.txt"))
    locs = fs.getFileBlockLocations(st, 0, st.getLen())
    assert [(loc.getOffset(), loc.getLength()) for loc in locs] == \
        [(o, min(8 * MiB, len(body) - o)) for o in range(0, len(body), 8 * MiB)]
    hosts = {w["host"] for w in hcluster.report()["workers"]}
    assert all(list(loc.getHosts()) == sorted(hosts) for loc in locs), [list(loc.getHosts()) for loc in locs]
    assert len(fs.getFileBlockLocations(st, 9 * MiB, 1)) == 1


def _persist_ops(c: Cluster, kind: str, result: str) -> int:
    """locus_persist_ops_total{kind, result} of the cluster's master."""
    want = f'locus_persist_ops_total{{kind="{kind}",result="{result}"}} '
    return sum(int(float(line.split()[-1])) for line in c.metrics().splitlines() if line.startswith(want))


def test_spark_writes_parquet_through_the_connector(hcluster, spark):
    """Spark's file output committer stages each task's file under _temporary/ and commits
    it by two renames (attempt directory -> task directory -> output). The file's persist
    waits while it is staged and moves with the renames, so each file reaches MinIO once,
    at its final key: the UFS renames of the files find nothing to move."""
    rows = [(i, f"name-{i % 17}", i * 0.5) for i in range(20_000)]
    out = "locus:///lake/spark/out.parquet"
    moved = _persist_ops(hcluster, "RENAME", "done")
    nothing_to_move = _persist_ops(hcluster, "RENAME", "skipped")
    spark.createDataFrame(rows, ["id", "name", "v"]).repartition(3).write.mode("overwrite").parquet(out)
    names = {e["name"] for e in hcluster.ls_json("/lake/spark/out.parquet")}
    assert "_SUCCESS" in names and sum(n.endswith(".parquet") for n in names) == 3, names
    assert not any(n.startswith("_temporary") for n in names), names
    back = spark.read.parquet(out)
    assert back.count() == len(rows)
    assert back.groupBy().sum("id").collect()[0][0] == sum(r[0] for r in rows)

    # ASYNC_THROUGH (the default): the part files reach MinIO in the background.
    def persisted():
        keys = [o["Key"] for o in hcluster.s3.list_objects_v2(
            Bucket=hcluster.bucket, Prefix="spark/out.parquet/").get("Contents", [])]
        return keys if sum(k.endswith(".parquet") for k in keys) == 3 else None

    wait_until(persisted, timeout=60, what="the parquet files persisted to MinIO")
    # Three file renames out of _temporary found nothing in MinIO (their bytes were not
    # there: the persists moved); at most the three attempt directories' markers moved.
    assert _persist_ops(hcluster, "RENAME", "skipped") - nothing_to_move >= 3
    assert _persist_ops(hcluster, "RENAME", "done") - moved <= 3

    def staging_gone():
        keys = [o["Key"] for o in hcluster.s3.list_objects_v2(
            Bucket=hcluster.bucket, Prefix="spark/out.parquet/").get("Contents", [])]
        return not any("_temporary" in k for k in keys)

    wait_until(staging_gone, timeout=30, what="the staging directory's markers gone from MinIO")


def test_file_system_api(hcluster, spark):
    jvm, fs = _fs(spark)
    Path = jvm.org.apache.hadoop.fs.Path
    d = Path("/lake/api")
    assert fs.mkdirs(d)
    assert fs.getFileStatus(d).isDirectory()

    data = bytes(range(256)) * 4096 + b"tail"  # 1 MiB and 4 bytes
    out = fs.create(Path("/lake/api/a.bin"), False)
    out.write(bytearray(data))
    out.close()
    st = fs.getFileStatus(Path("/lake/api/a.bin"))
    assert st.getLen() == len(data) and not st.isDirectory()
    assert str(st.getPath()) == "locus:/lake/api/a.bin"

    # The same bytes through the CLI, and through a seek in the stream.
    assert hashlib.sha256(hcluster.cat("/lake/api/a.bin")).hexdigest() == hashlib.sha256(data).hexdigest()
    ins = fs.open(Path("/lake/api/a.bin"))
    ins.seek(len(data) - 10)
    assert ins.getPos() == len(data) - 10
    assert bytes(jvm.org.apache.commons.io.IOUtils.toByteArray(ins)) == data[-10:]
    assert ins.read() == -1
    ins.seek(3)
    assert [ins.read() for _ in range(3)] == [3, 4, 5]
    ins.close()

    # create without overwrite on an existing file, and a missing path.
    with pytest.raises(Exception, match="FileAlreadyExistsException"):
        fs.create(Path("/lake/api/a.bin"), False)
    with pytest.raises(Exception, match="FileNotFoundException"):
        fs.getFileStatus(Path("/lake/api/missing"))
    with pytest.raises(Exception, match="FileNotFoundException"):
        fs.open(Path("/lake/api"))  # a directory

    # rename into a directory (HDFS semantics), then listing.
    assert fs.mkdirs(Path("/lake/api/sub"))
    assert fs.rename(Path("/lake/api/a.bin"), Path("/lake/api/sub"))
    assert not fs.exists(Path("/lake/api/a.bin"))
    listed = [s.getPath().getName() for s in fs.listStatus(Path("/lake/api/sub"))]
    assert listed == ["a.bin"]
    assert not fs.rename(Path("/lake/api/nothing"), Path("/lake/api/x"))

    # delete: a non-empty directory needs recursive; a missing path is false.
    with pytest.raises(Exception, match="PathIsNotEmptyDirectoryException"):
        fs.delete(Path("/lake/api/sub"), False)
    assert fs.delete(Path("/lake/api/sub"), True)
    assert not fs.exists(Path("/lake/api/sub"))
    assert not fs.delete(Path("/lake/api/missing"), False)

    # A path that climbs out of the namespace is refused (Hadoop's Path keeps a leading "..").
    with pytest.raises(Exception, match="IOException"):
        fs.getFileStatus(Path("/../etc/passwd"))


def test_directory_rename_of_persisted_files_moves_the_objects(hcluster, spark):
    jvm, fs = _fs(spark)
    Path = jvm.org.apache.hadoop.fs.Path
    files = {"d/a.txt": b"alpha\n" * 1000, "d/sub/b.txt": b"beta\n" * 2000}
    for k, v in files.items():
        out = fs.create(Path(f"/lake/mv/{k}"), False)
        out.write(bytearray(v))
        out.close()
    hcluster.ok("fs", "persist", "/lake/mv/d/a.txt")
    hcluster.ok("fs", "persist", "/lake/mv/d/sub/b.txt")
    assert fs.rename(Path("/lake/mv/d"), Path("/lake/mv/e"))
    for k, v in files.items():
        assert hcluster.cat(f"/lake/mv/{k.replace('d/', 'e/', 1)}") == v

    def moved():
        keys = {o["Key"] for o in hcluster.s3.list_objects_v2(Bucket=hcluster.bucket, Prefix="mv/").get("Contents", [])}
        return keys if {"mv/e/a.txt", "mv/e/sub/b.txt"} <= keys and not any(k.startswith("mv/d/") for k in keys) else None

    wait_until(moved, timeout=30, what="the objects moved from mv/d/ to mv/e/ in MinIO")
    body = hcluster.s3.get_object(Bucket=hcluster.bucket, Key="mv/e/sub/b.txt")["Body"].read()
    assert body == files["d/sub/b.txt"]


def test_unreachable_master_is_a_clear_io_error(spark, tmp):
    jvm = spark._jvm
    conf = jvm.org.apache.hadoop.conf.Configuration(spark._jsc.hadoopConfiguration())
    conf.setBoolean("fs.locus.impl.disable.cache", True)
    # A client waits client.master_retry (default 30 s) for a restarting master; this one
    # gives up after 2 s.
    cfg = tmp / "impatient.toml"
    cfg.write_text('[client]\nmaster_retry = "2s"\n')
    conf.set("fs.locus.config", str(cfg))
    fs = jvm.org.apache.hadoop.fs.FileSystem.get(jvm.java.net.URI("locus://127.0.0.1:1/"), conf)
    t = time.monotonic()
    with pytest.raises(Exception, match="cannot reach the master at 127.0.0.1:1"):
        fs.getFileStatus(jvm.org.apache.hadoop.fs.Path("/x"))
    assert time.monotonic() - t < 30
    fs.close()
