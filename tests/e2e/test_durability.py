"""Fast durable writes (ASYNC_THROUGH) against real crashes of real processes: kill -9
of a worker during a stream of writes, a UFS outage (MinIO stopped), and kill -9 of the
master in the middle of the persist backlog. Every acknowledged file is checked by
checksum, in Locus and in MinIO."""

from __future__ import annotations

import os
import random
import threading
import time

from conftest import MiB, assert_one_line_error, sha256, wait_until

# Fast failure detection so the tests do not wait out production timeouts.
ENV = {
    "LOCUS_MASTER__WORKER_TIMEOUT": "3s",
    "LOCUS_WORKER__HEARTBEAT_INTERVAL": "200ms",
    "LOCUS_MASTER__BLOCK_SIZE": "4MiB",
}


def wait_persisted(c, paths, timeout: float = 120.0):
    pending = set(paths)

    def done():
        for p in list(pending):
            st = c.stat(p)
            assert st["persist_state"] != "LOST", st
            if st["persist_state"] == "PERSISTED":
                pending.discard(p)
        return not pending

    wait_until(done, timeout=timeout, interval=0.5, what=f"{len(pending)} file(s) to be persisted")


def ufs_keys(s3, bucket, prefix):
    out = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for o in page.get("Contents", []):
            out[o["Key"]] = o["Size"]
    return out


def test_kill9_of_a_worker_during_async_writes_loses_no_acknowledged_file(standalone_factory, s3, bucket, minio,
                                                                       tmp):
    c = standalone_factory(root_ufs="none", workers=3, env=ENV)
    c.mount_s3("/lake", bucket, "w", minio, "1h")
    c.ok("fs", "mkdir", "/lake/in")
    acked: dict[str, str] = {}
    failures: list[str] = []
    stop = threading.Event()

    def writer(k: int):
        rnd = random.Random(k)
        i = 0
        while not stop.is_set():
            data = rnd.randbytes(rnd.randint(1, 9 * MiB))
            src = tmp / f"src-{k}-{i}"
            src.write_bytes(data)
            path = f"/lake/in/f{k}-{i}"
            r = c.run("fs", "put", src, path)  # ASYNC_THROUGH, 2 copies: the defaults
            if r.returncode == 0:
                acked[path] = sha256(data)
            else:
                failures.append(r.stderr.decode(errors="replace").strip())
            src.unlink()
            i += 1

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: len(acked) >= 6, timeout=120, what="writes before the crash")
        c.kill_worker(1)
        n = len(acked)
        wait_until(lambda: len(acked) >= n + 6, timeout=120, what="writes after the crash")
    finally:
        stop.set()
        for t in threads:
            t.join()
    c.wait_ready(live=2)
    # A write in flight on the killed worker may fail; it must say why in one line.
    assert all(f and "\n" not in f for f in failures), failures
    wait_persisted(c, acked)
    keys = {k for k in ufs_keys(s3, bucket, "w/in/") if not k.endswith("/")}  # not the mkdir marker
    assert set(keys) == {"w" + p[len("/lake"):] for p in acked}, "MinIO holds exactly the acknowledged files"
    for path, digest in acked.items():
        assert sha256(c.cat(path)) == digest, path
        body = s3.get_object(Bucket=bucket, Key="w" + path[len("/lake"):])["Body"].read()
        assert sha256(body) == digest, f"{path} in MinIO"
        st = c.stat(path)
        # the survivors hold a copy of every block (re-replicated where the lost worker had one)
        assert all(b["locations"] for b in st["blocks"]), st
    r = c.report()
    assert r["persist_backlog"]["files"] == 0, r["persist_backlog"]


def test_ufs_outage_and_master_kill9_mid_backlog(standalone_factory, own_minio):
    own, endpoint, s3 = own_minio, own_minio.endpoint, own_minio.s3
    s3.create_bucket(Bucket="lake")
    c = standalone_factory(root_ufs="none", workers=2, env=ENV)
    c.mount_s3("/lake", "lake", "p", endpoint, "1h")
    c.ok("fs", "mkdir", "/lake/q")
    cached = os.urandom(5 * MiB)
    c.ok("fs", "put", "-", "/lake/q/cached.bin", input=cached)
    c.ok("fs", "persist", "/lake/q/cached.bin")

    own.stop()  # the UFS goes away
    outage = time.monotonic()
    # cached reads go on
    assert sha256(c.cat("/lake/q/cached.bin")) == sha256(cached)
    # a write that needs the UFS fails clearly...
    r = c.run("fs", "put", "--write-type", "THROUGH", "-", "/lake/q/through.bin", input=b"x" * 1000,
              timeout=180)
    assert_one_line_error(r)
    # ...and ASYNC_THROUGH writes are acknowledged from memory and queue their persist
    files = {}
    for i in range(8):
        data = os.urandom(random.randint(1, 3 * MiB))
        c.ok("fs", "put", "-", f"/lake/q/f{i}", input=data)
        files[f"f{i}"] = data
    # create -> rename -> delete, and a rename and a delete of queued files
    c.ok("fs", "put", "-", "/lake/q/tmp", input=b"short-lived")
    c.ok("fs", "mv", "/lake/q/tmp", "/lake/q/tmp2")
    c.ok("fs", "rm", "/lake/q/tmp2")
    c.ok("fs", "mv", "/lake/q/f0", "/lake/q/g0")
    files["g0"] = files.pop("f0")
    c.ok("fs", "rm", "/lake/q/f1")
    files.pop("f1")
    backlog = c.report()["persist_backlog"]
    assert backlog["files"] >= 7 and backlog["queued_ops"] >= 12, backlog

    # the master dies mid-backlog (kill -9) and comes back while the UFS is still away
    c.kill_master()
    c.start_master()
    c.wait_ready()
    names = sorted(e["name"] for e in c.ls_json("/lake/q"))
    assert names == sorted(["cached.bin", *files]), names
    # the queue came back from the journal: every live file still waits for the UFS
    assert c.report()["persist_backlog"]["files"] >= len(files), c.report()["persist_backlog"]
    assert all(c.stat(f"/lake/q/{n}")["persist_state"] == "TO_BE_PERSISTED" for n in files)
    for name, data in files.items():
        assert sha256(c.cat(f"/lake/q/{name}")) == sha256(data), name

    # the UFS returns after 60 s; the backlog drains, in order
    time.sleep(max(0.0, 60 - (time.monotonic() - outage)))
    own.start()
    wait_persisted(c, [f"/lake/q/{n}" for n in files])
    wait_until(lambda: c.report()["persist_backlog"]["queued_ops"] == 0, timeout=60, what="an empty queue")
    keys = {k for k in ufs_keys(s3, "lake", "p/q/") if not k.endswith("/")}
    assert set(keys) == {f"p/q/{n}" for n in ["cached.bin", *files]}, keys
    for name, data in files.items():
        assert sha256(s3.get_object(Bucket="lake", Key=f"p/q/{name}")["Body"].read()) == sha256(data), name
    # what was created, renamed and deleted never reached the UFS, nor came back
    time.sleep(1)
    assert not any(k.endswith(("/tmp", "/tmp2", "/f0", "/f1")) for k in ufs_keys(s3, "lake", "p/")), keys


def test_ssd_blocks_survive_kill9_and_a_corrupt_copy_is_repaired_never_served(standalone_factory, s3, bucket,
                                                                              minio, tmp):
    ssd = tmp / "ssd"
    c = standalone_factory(root_ufs="none", env=ENV, tiers=[f"SSD:{ssd}:1GiB"])
    c.mount_s3("/lake", bucket, "s", minio, "1h")
    data = os.urandom(10 * MiB + 5)  # three 4 MiB blocks
    c.ok("fs", "put", "-", "/lake/f.bin", input=data)
    c.ok("fs", "persist", "/lake/f.bin")
    st = c.stat("/lake/f.bin")
    assert st["cached_fraction"] == 1.0 and all(b["locations"][0]["tier"] == "SSD" for b in st["blocks"]), st

    # kill -9, restart: the SSD blocks come back without a UFS read
    c.kill_worker(0)
    c.start_worker(0)
    wait_until(lambda: c.stat("/lake/f.bin")["cached_fraction"] == 1.0, timeout=30, what="blocks reported again")
    base = c.counters()
    assert sha256(c.cat("/lake/f.bin")) == sha256(data)
    d = c.delta(base)
    assert d["ufs"] == 0, d

    # a copy goes bad on disk: it is detected, dropped, refilled from the UFS, never served
    block = st["blocks"][1]["id"]
    f = ssd / "w0" / "blocks" / str(block)
    b = bytearray(f.read_bytes())
    b[len(b) // 2] ^= 0xFF
    f.write_bytes(bytes(b))
    base = c.counters()
    assert sha256(c.cat("/lake/f.bin")) == sha256(data)
    r = c.wait_report(lambda r: r["cache"]["corrupt_blocks"] >= 1, what="the corruption to be counted")
    d = c.delta(base)
    assert d["ufs"] >= 4 * MiB, f"repaired from the UFS: {d}"
    assert "locus_block_corruptions_total 1" in c.metrics()
    assert sha256(f.read_bytes()) != sha256(bytes(b)), "the bad copy was replaced"
    assert sha256(c.cat("/lake/f.bin")) == sha256(data)


def test_kill9_of_local_start_under_gateway_write_load_loses_no_acknowledged_change(cluster_factory, minio):
    """Several S3 clients PUT (up to 5 MiB, 1 MiB blocks), overwrite and DELETE
    overlapping keys (ASYNC_THROUGH) on a MinIO mount and on the file:// root while
    `locus local start` is killed with SIGKILL; after the restart every key shows a
    state the acknowledged history allows (linearizability.py: an acknowledged PUT's
    bytes or something newer, never a deleted object back), and once the persists
    have landed, MinIO and the local UFS hold the same."""
    from linearizability import md5_etag
    from test_concurrent_consistency import ENV as SYNC_ENV
    from test_concurrent_consistency import KEYS, Gateway, Load, examples

    c = cluster_factory(args=["--block-size", "1MiB", "--mem-quota", "2GiB"], env=SYNC_ENV)
    gw = Gateway(c, minio)
    loads = {b: Load(gw.endpoint, b) for b in ("lake", "local")}
    for load in loads.values():
        load.weights = [50, 10, 5, 25, 10]  # mostly writes
    threads = [threading.Thread(target=load.worker, args=(n,), daemon=True)
               for load in loads.values() for n in range(4)]
    for t in threads:
        t.start()
    time.sleep(8)
    backlog = c.report()["persist_backlog"]
    c.kill()  # mid-load, with persists queued
    killed = time.monotonic()
    time.sleep(0.5)
    for load in loads.values():
        load.stop.set()
    for t in threads:
        t.join(timeout=120)
    c.start()
    wait_until(lambda: c.report()["live_workers"] == 1, timeout=30, what="the worker back")
    for b, load in loads.items():
        # Requests cut off by the kill failed: they count as writes that may or may not
        # have happened.
        print(f"{b}: {load.counts}, backlog at the kill {backlog}, {len(load.unexpected)} failed requests")
        load.unexpected.clear()
        load.final_reads()
        v = load.h.check()
        assert not v, f"{b}: {len(v)} violations after the restart:\n{examples(v)}"
        assert not load.unexpected, f"{b}: reads after the restart failed:\n{examples(load.unexpected)}"
        n_acked = sum(1 for ws in load.h.writes.values() for w in ws if w.end < killed)
        assert n_acked > 20, load.counts
    wait_until(lambda: c.report()["persist_backlog"]["queued_ops"] == 0, timeout=120, interval=0.5,
               what="the persist queue to drain after the restart")
    # The UFS now says what Locus says: read both bodies and record the UFS ones as
    # reads too, so the checker holds them to the same history.
    for b, load in loads.items():
        for key in KEYS:
            if b == "lake":
                try:
                    body = gw.minio.get_object(Bucket=gw.minio_bucket, Key=key)["Body"].read()
                except Exception as e:  # noqa: BLE001
                    assert "NoSuchKey" in str(e), e
                    body = None
            else:
                f = c.ufs_dir / "local" / key
                body = f.read_bytes() if f.is_file() else None
            t = time.monotonic()
            if body is None:
                load.h.absent(key, t, t, f"{b} UFS")
            else:
                load.h.get(key, t, t, body, md5_etag(body), len(body))
        load.final_reads()  # and Locus, once more, after its syncs were due again
        v = load.h.check()
        assert not v, f"{b}: {len(v)} violations in the UFS after the persists:\n{examples(v)}"


def test_after_a_worker_kill9_no_write_is_acknowledged_short_without_a_warning(standalone_factory, tmp):
    """A worker is killed (kill -9) and the master still lists it: a write asks for two
    copies, never counts the dead worker as one, and either waits and fails (exit 7) or,
    allowed fewer, is acknowledged with a warning and counted in /metrics."""
    c = standalone_factory(root_ufs="none", workers=2, env={**ENV, "LOCUS_MASTER__WORKER_TIMEOUT": "60s"})
    lake = tmp / "lake"
    lake.mkdir()
    c.ok("fs", "mount", "/lake", f"file://{lake}")
    c.ok("fs", "put", "-", "/lake/before", input=b"b" * 1000)
    c.kill_worker(1)
    assert c.report()["live_workers"] == 2, "the master has not noticed yet"
    r = c.run("fs", "put", "-", "/lake/strict", input=b"s" * 1000, env={"LOCUS_CLIENT__REPLICATION__WAIT": "2s"})
    msg = assert_one_line_error(r, 7)
    assert "2 worker copies" in msg, msg
    r = c.run("fs", "put", "-", "/lake/short", input=b"f" * 1000,
              env={"LOCUS_CLIENT__REPLICATION__WAIT": "1s", "LOCUS_CLIENT__REPLICATION__ALLOW_FEWER": "true"})
    err = r.stderr.decode()
    assert r.returncode == 0, err
    assert "warning" in err and "1 worker(s), not the 2" in err, err
    assert "locus_writes_short_total 1" in c.metrics(), "the short write is counted"
    assert c.cat("/lake/short") == b"f" * 1000
