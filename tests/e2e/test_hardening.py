"""Issue 23 items 3 and 4 through the real binary: names the UFS cannot hold (exit 2),
persists that keep failing (report, /metrics, `fs persist --retry/--drop`), and a
MUST_CACHE write bigger than the MEM tier (exit 6, its space back at once)."""

from __future__ import annotations

import os

from conftest import MiB, assert_one_line_error, wait_until


def test_names_the_ufs_cannot_hold_exit_2(cluster_factory, tmp):
    c = cluster_factory(args=["--block-size", "1MiB"])
    src = tmp / "small.txt"
    src.write_bytes(b"x")
    c.ok("fs", "put", str(src), "/x")
    for path in [f"/d/{'n' * 300}", "/x ", "/ ", "/d/ ", "/dir /f"]:
        r = c.fs("put", str(src), path)
        msg = assert_one_line_error(r, 2)
        assert "long" in msg or "whitespace" in msg, msg
    r = c.fs("mkdir", "-p", f"/d/{'q' * 256}")
    assert_one_line_error(r, 2)
    r = c.fs("mv", "/x", "/x ")
    assert_one_line_error(r, 2)
    wait_until(lambda: c.stat("/x")["persist_state"] == "PERSISTED", what="/x persisted")
    assert (c.ufs_dir / "x").read_bytes() == b"x"
    assert sorted(p.name for p in c.ufs_dir.iterdir() if p.name != ".locus-tmp") == ["x"]


def test_a_failing_persist_is_reported_and_retried_or_dropped(cluster_factory, tmp):
    c = cluster_factory(args=["--block-size", "1MiB"])
    c.ok("fs", "mkdir", "/blk")
    for n in ["f1", "f2"]:
        (c.ufs_dir / "blk" / n).mkdir(parents=True)
        (c.ufs_dir / "blk" / n / "inner").write_bytes(b"in the way")
    src = tmp / "data.bin"
    data = os.urandom(3 * MiB)
    src.write_bytes(data)
    for n in ["f1", "f2", "ok"]:
        c.ok("fs", "put", str(src), f"/blk/{n}")
    wait_until(lambda: c.stat("/blk/ok")["persist_state"] == "PERSISTED", what="/blk/ok persisted")
    r = c.wait_report(lambda r: r["persist_failed"]["ops"] == 2, what="two given-up persists")
    ops = sorted(r["persist_failed"]["operations"], key=lambda o: o["path"])
    assert [o["path"] for o in ops] == ["/blk/f1", "/blk/f2"], ops
    assert all(o["kind"] == "PERSIST" and o["error"] and o["failures"] >= 1 for o in ops), ops
    text = c.ok("report").decode()
    assert "Persist failures: 2" in text and "/blk/f1" in text, text
    assert "locus_persist_failed_paths 2" in c.metrics()
    status, _, html = c.web_get("/")
    assert status == 200, html
    assert "Persist failures (2)" in html and "/blk/f2" in html, html
    # `fs persist` of such a file says so instead of waiting out its timeout.
    r = c.fs("persist", "/blk/f1", "--timeout", "20s")
    msg = assert_one_line_error(r)
    assert "given up" in msg, msg
    for flag in ["--retry", "--drop"]:
        h = c.ok("fs", "persist", "--help").decode()
        assert flag in h, h
    (c.ufs_dir / "blk" / "f1" / "inner").unlink()
    (c.ufs_dir / "blk" / "f1").rmdir()
    out = c.ok("fs", "persist", "--retry", "/blk/f1").decode()
    assert "retrying 1" in out, out
    wait_until(lambda: c.stat("/blk/f1")["persist_state"] == "PERSISTED", what="/blk/f1 persisted")
    assert (c.ufs_dir / "blk" / "f1").read_bytes() == data
    out = c.ok("fs", "persist", "--drop", "/blk").decode()
    assert "dropped 1" in out, out
    assert c.stat("/blk/f2")["persist_state"] == "NOT_PERSISTED"
    assert c.cat("/blk/f2") == data
    r = c.report()
    assert r["persist_failed"]["ops"] == 0, r["persist_failed"]
    assert_one_line_error(c.fs("persist", "--retry", "/blk"), 3)


def test_must_cache_write_bigger_than_mem_exits_6_and_frees_its_space(cluster_factory, tmp):
    c = cluster_factory(args=["--mem-quota", "16MiB", "--block-size", "1MiB"])
    kept = tmp / "kept.bin"
    kept.write_bytes(os.urandom(4 * MiB))
    c.ok("fs", "put", "--write-type", "CACHE_THROUGH", str(kept), "/kept")
    before = c.wait_report(lambda r: r["capacity"]["MEM"]["used"] == 4 * MiB, what="kept cached")
    big = tmp / "big.bin"
    big.write_bytes(os.urandom(24 * MiB))
    r = c.fs("put", "--write-type", "MUST_CACHE", str(big), "/big")
    msg = assert_one_line_error(r, 6)
    assert "quota" in msg, msg
    # Piped (no size known up front): still exit 6, not a reset connection.
    r = c.fs("put", "--write-type", "MUST_CACHE", "-", "/big2", input=big.read_bytes())
    msg = assert_one_line_error(r, 6)
    assert "quota" in msg, msg
    r = c.wait_report(lambda r: r["capacity"]["MEM"]["used"] <= before["capacity"]["MEM"]["used"],
                      what="MEM usage back")
    assert c.run("fs", "stat", "/big").returncode == 3
    # The space is there for a write that fits.
    fits = tmp / "fits.bin"
    fits.write_bytes(os.urandom(8 * MiB))
    c.ok("fs", "put", "--write-type", "MUST_CACHE", str(fits), "/fits")
    assert c.cat("/fits") == fits.read_bytes()


def test_s3_keys_past_1024_bytes_exit_2(cluster, s3, bucket, minio, tmp):
    c = cluster
    c.mount_s3("/s3", bucket, "pre", minio)
    src = tmp / "small.txt"
    src.write_bytes(b"s3")
    # "pre/" + the key: 1024 bytes fit, more do not (components under 255 bytes each).
    fits = "/".join(["k" * 200] * 5) + "/" + "k" * 15  # 1020 bytes: 1024 with "pre/"
    too_long = fits + "k"  # 1025 with the prefix
    msg = assert_one_line_error(c.fs("put", str(src), f"/s3/{too_long}"), 2)
    assert "S3 key" in msg and "1024" in msg, msg
    assert_one_line_error(c.fs("put", str(src), "/s3/trailing "), 2)
    c.ok("fs", "put", str(src), f"/s3/{fits}")
    wait_until(lambda: c.stat(f"/s3/{fits}")["persist_state"] == "PERSISTED", what="persisted")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="pre/").get("Contents", [])]
    assert f"pre/{fits}" in keys, keys
    assert not any(k.startswith("pre/trailing") for k in keys), keys
