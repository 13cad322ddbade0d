"""Locality across simulated hosts (bench/cluster.py): two hosts, each its own network and
mount namespace with a Locus worker and a Spark worker, and a master host (this machine's
namespace) with the Locus master, the Spark master and the driver. Each host sees only
its own worker's socket; `locus doctor` says so on each; reads are attributed to the
reading host with the reason they were not short-circuit; and Spark on locus:// places
its tasks by the connector's block locations, so its warm reads are short-circuit on both
hosts, as the workers' attribution shows."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from conftest import LOCUS_BIN, REPO, wait_until

sys.path.insert(0, str(REPO / "bench"))
from cluster import SimCluster  # noqa: E402

MIB = 1 << 20


def _can_simulate() -> bool:
    if os.geteuid() != 0 or not shutil.which("nsenter") or not shutil.which("unshare"):
        return False
    r = subprocess.run(["ip", "netns", "list"], capture_output=True)
    return r.returncode == 0


pytestmark = pytest.mark.skipif(not _can_simulate(), reason="needs root, ip netns, unshare and nsenter")


@pytest.fixture(scope="module")
def sim(e2e_tmp):
    c = SimCluster(2, e2e_tmp / "sim", str(LOCUS_BIN), spark=True, mem="256MiB", block_size="4MiB")
    c.start()
    yield c
    c.stop()


def doctor(sim, k: int) -> dict:
    r = sim.locus_cmd(k, "doctor", "--json", check=False)
    return {c["check"]: c for c in json.loads(r.stdout)["checks"]}


def reads_of(sim, k: int) -> dict:
    d = json.loads(sim.locus_cmd(0, "doctor", "--reads", "--json", "--host", sim.ip(k)).stdout)
    return d["hosts"][0] if d["hosts"] else {}


def test_each_host_sees_its_own_worker_only(sim):
    for k in (1, 2):
        d = doctor(sim, k)
        assert d["local worker"]["status"] == "ok" and sim.ip(k) in d["local worker"]["detail"], d
        assert d["test read"]["status"] == "ok" and "short-circuit" in d["test read"]["detail"], d
    d = doctor(sim, 0)
    assert d["local worker"]["status"] == "warn" and "no worker runs on this host" in d["local worker"]["detail"]
    assert d["test read"]["status"] == "warn", d
    assert "no Locus worker runs on the reading host" in d["test read"]["detail"], d
    # The other host's tier and socket are not visible here.
    assert not (sim.dir / "host" / "worker").exists()


def test_reads_are_attributed_to_the_reading_host(sim):
    a, b = os.urandom(2 * MIB), os.urandom(3 * MIB)
    (sim.dir / "ufs" / "attr").mkdir(exist_ok=True)
    (sim.dir / "ufs" / "attr" / "a.bin").write_bytes(a)
    (sim.dir / "ufs" / "attr" / "b.bin").write_bytes(b)
    sim.locus_cmd(1, "fs", "load", "/attr/a.bin")  # cached on host 1
    sim.locus_cmd(2, "fs", "load", "/attr/b.bin")  # cached on host 2
    base1 = reads_of(sim, 1).get("bytes", 0)
    assert sim.locus_cmd(1, "fs", "cat", "/attr/a.bin").stdout == a
    assert sim.locus_cmd(1, "fs", "cat", "/attr/b.bin").stdout == b
    assert sim.locus_cmd(0, "fs", "cat", "/attr/a.bin").stdout == a

    def both():
        h1, h0 = reads_of(sim, 1), reads_of(sim, 0)
        return (h1, h0) if h1.get("bytes", 0) - base1 >= len(a) + len(b) and h0.get("bytes", 0) >= len(a) else None

    h1, h0 = wait_until(both, timeout=20, what="the reads of hosts 1 and 0")
    assert h1["not_short_circuit"]["cached_elsewhere"]["bytes"] >= len(b), h1
    assert h1["bytes_by_source"]["remote_worker"] >= len(b), h1
    assert h1["bytes_by_source"]["short_circuit"] >= len(a), h1
    assert h0["not_short_circuit"]["no_local_worker"]["bytes"] >= len(a), h0
    # Where b.bin is cached, by host address (what the connector tells Spark): host 2,
    # and host 1 too once its read from host 2 left a copy there (passive caching).
    def holders():
        st = json.loads(sim.locus_cmd(0, "fs", "stat", "--json", "/attr/b.bin").stdout)
        hosts = [sorted(loc["host"] for loc in blk["locations"]) for blk in st["blocks"]]
        return hosts if all(len(h) == 2 for h in hosts) else None

    for h in wait_until(holders, timeout=20, what="b.bin's copy on host 1"):
        assert h == sorted([sim.ip(1), sim.ip(2)]), h
    # Host 0 runs no worker: its read of a.bin left no copy anywhere new.
    st = json.loads(sim.locus_cmd(0, "fs", "stat", "--json", "/attr/a.bin").stdout)
    assert [loc["host"] for loc in st["blocks"][0]["locations"]] == [sim.ip(1)], st
    # Host 1's next read of b.bin is short-circuit.
    before = reads_of(sim, 1)["bytes_by_source"]["short_circuit"]
    assert sim.locus_cmd(1, "fs", "cat", "/attr/b.bin").stdout == b
    wait_until(lambda: reads_of(sim, 1)["bytes_by_source"]["short_circuit"] - before >= len(b) or None,
               timeout=20, what="host 1's short-circuit read of b.bin")


DRIVER = textwrap.dedent("""
    import json, sys
    from pyspark.sql import SparkSession
    a = json.loads(sys.argv[1])
    s = (SparkSession.builder.master(a["master"]).appName("locus-multihost")
         .config("spark.driver.host", a["ip"]).config("spark.driver.bindAddress", a["ip"])
         .config("spark.driver.extraClassPath", a["jar"]).config("spark.executor.extraClassPath", a["jar"])
         .config("spark.hadoop.fs.locus.native.library", a["lib"])
         .config("spark.hadoop.fs.locus.master", a["locus"])
         .config("spark.hadoop.fs.locus.token.file", a["token"])
         .config("spark.executor.memory", "512m").config("spark.executor.cores", "1")
         .config("spark.cores.max", "2").config("spark.ui.enabled", "false")
         .config("spark.sql.files.maxPartitionBytes", "4m")
         .config("spark.scheduler.minRegisteredResourcesRatio", "1.0")
         .config("spark.scheduler.maxRegisteredResourcesWaitingTime", "120s")
         .getOrCreate())
    try:
        s.sparkContext.setLogLevel("WARN")
        counts = [s.read.text(a["path"]).count() for _ in range(a["runs"])]
        print(json.dumps({"counts": counts}))
    finally:
        s.stop()
""")


def test_spark_tasks_read_short_circuit_on_every_host(sim, tmp):
    jar, lib = os.environ.get("LOCUS_HADOOP_JAR"), os.environ.get("LOCUS_HADOOP_LIB")
    assert jar and lib, "the e2e conftest builds the Hadoop connector"
    (sim.dir / "ufs" / "spark").mkdir(exist_ok=True)
    line = b"0123456789abcdef" * 7 + b"\n"  # 113 bytes
    per_file = (3 * MIB) // len(line)
    for i in range(8):
        (sim.dir / "ufs" / "spark" / f"part-{i}.txt").write_bytes(line * per_file)
    # Half the files cached on each host.
    for i in range(8):
        sim.locus_cmd(1 + i % 2, "fs", "load", f"/spark/part-{i}.txt")
    before = {k: reads_of(sim, k) for k in (1, 2)}
    args = {"master": sim.st["spark"], "ip": sim.ip(0), "jar": jar, "lib": lib, "locus": sim.master,
            "token": str(sim.token_file), "path": "locus:///spark/*.txt", "runs": 2}
    script = tmp / "driver.py"
    script.write_text(DRIVER)
    env = sim.client_env(0, {"SPARK_LOCAL_IP": sim.ip(0), "PYSPARK_PYTHON": sys.executable})
    r = subprocess.run([sys.executable, str(script), json.dumps(args)], capture_output=True, timeout=600, env=env)
    assert r.returncode == 0, f"{r.stderr.decode(errors='replace')[-4000:]}\n{sim.log_tail(30)}"
    out = json.loads(r.stdout.decode().strip().splitlines()[-1])
    assert out["counts"] == [8 * per_file] * 2, out
    total = 2 * 8 * per_file * len(line)

    def grown():
        now = {k: reads_of(sim, k) for k in (1, 2)}
        got = sum(now[k].get("bytes", 0) - before[k].get("bytes", 0) for k in (1, 2))
        return now if got >= total else None

    now = wait_until(grown, timeout=30, what="the executors' reads to be counted")
    sc = sum(now[k]["bytes_by_source"]["short_circuit"] - before[k].get("bytes_by_source", {}).get("short_circuit", 0)
             for k in (1, 2))
    assert sc >= 0.95 * total, f"short-circuit {sc} of {total} bytes: {now}"
    for k in (1, 2):
        assert now[k]["bytes"] - before[k].get("bytes", 0) > 0, f"host {k} read nothing: {now}"
