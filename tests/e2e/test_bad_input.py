"""Bad input gets a one-line `locus: ...` error and a non-zero exit; the cluster stays healthy."""

from __future__ import annotations

import os
import random
import socket
import struct
import time
from pathlib import Path

from conftest import MINIO_PASSWORD, MINIO_USER, MiB, assert_one_line_error, sha256


def _healthy(c, path: str, data: bytes):
    """The cluster answers reports and serves a read correctly."""
    assert c.alive(), "a locus process died"
    r = c.report()
    assert r["live_workers"] == 1, r
    assert sha256(c.cat(path)) == sha256(data)


def _s3_opts(endpoint: str) -> list[str]:
    return ["--option", f"endpoint={endpoint}", "--option", f"access_key_id={MINIO_USER}",
            "--option", f"secret_access_key={MINIO_PASSWORD}"]


def _mount_paths(c) -> list[str]:
    return [x.split("  on  ")[1].split("  (")[0] for x in c.ok("fs", "mount").decode().splitlines()]


def test_bad_mounts(cluster, s3, bucket, minio):
    c = cluster
    data = os.urandom(MiB + 1)
    s3.put_object(Bucket=bucket, Key="p/ok.bin", Body=data)
    c.mount_s3("/data", bucket, "p", minio)
    _healthy(c, "/data/ok.bin", data)

    # Unreachable endpoint.
    t0 = time.monotonic()
    r = c.run("fs", "mount", "/bad1", f"s3://{bucket}/p", *_s3_opts("http://127.0.0.1:1"), timeout=60)
    assert_one_line_error(r)
    assert time.monotonic() - t0 < 30, "an unreachable endpoint should fail fast"
    # Missing bucket.
    r = c.run("fs", "mount", "/bad2", "s3://no-such-bucket-e2e/p", *_s3_opts(minio), timeout=60)
    assert_one_line_error(r)
    # Wrong credentials.
    r = c.run("fs", "mount", "/bad3", f"s3://{bucket}/p", "--option", f"endpoint={minio}",
              "--option", "access_key_id=nobody", "--option", "secret_access_key=wrongwrong", timeout=60)
    assert_one_line_error(r)
    # Unknown option, unsupported scheme, relative file:// directory, bad sync interval.
    assert_one_line_error(c.run("fs", "mount", "/bad4", f"s3://{bucket}/p", "--option", "colour=blue"), 2)
    assert_one_line_error(c.run("fs", "mount", "/bad5", "ftp://host/dir"), 2)
    assert_one_line_error(c.run("fs", "mount", "/bad6", "file://relative/dir"), 2)
    assert_one_line_error(c.run("fs", "mount", "/bad7", f"s3://{bucket}/p", "--option", "novalue"), 2)
    assert_one_line_error(c.run("fs", "mount", "/bad8", f"s3://{bucket}/p", *_s3_opts(minio),
                                "--sync-interval", "soon"), 2)
    # A prefix that climbs out of the bucket prefix, and a mount point with '..'.
    assert_one_line_error(c.run("fs", "mount", "/bad9", f"s3://{bucket}/p/../other", *_s3_opts(minio)), 2)
    assert_one_line_error(c.run("fs", "mount", "/data/../bad10", f"s3://{bucket}/p", *_s3_opts(minio)), 2)
    # Mounting twice on one path.
    assert_one_line_error(c.run("fs", "mount", "/data", f"s3://{bucket}/p", *_s3_opts(minio)), 4)

    assert sorted(_mount_paths(c)) == ["/", "/data"]
    for i in range(1, 11):
        assert not (c.ufs_dir / f"bad{i}").exists()
    _healthy(c, "/data/ok.bin", data)


def test_dot_dot_paths_are_rejected(cluster, s3, bucket, minio, tmp):
    c = cluster
    data = os.urandom(1000)
    s3.put_object(Bucket=bucket, Key="p/ok.bin", Body=data)
    c.mount_s3("/data", bucket, "p", minio)
    c.ok("fs", "put", "-", "/keep.txt", input=b"keep")
    local = tmp / "payload"
    local.write_bytes(b"payload")
    outside = c.data_dir / "escape.txt"  # where /../escape.txt would land in the root UFS

    cases = [
        ("fs", "cat", "/data/../etc/passwd"),
        ("fs", "cat", "/../../../../etc/passwd"),
        ("fs", "head", "-c", "10", "/data/../../etc/passwd"),
        ("fs", "stat", "/data/./ok.bin"),
        ("fs", "ls", "/data/.."),
        ("fs", "get", "/../etc/passwd", tmp / "stolen"),
        ("fs", "put", local, "/../escape.txt"),
        ("fs", "put", local, "/data/../../escape.txt"),
        ("fs", "put", local, "/data/../escape.txt"),
        ("fs", "mkdir", "-p", "/../evil"),
        ("fs", "mkdir", "-p", "/data/../../evil"),
        ("fs", "mv", "/keep.txt", "/../escape.txt"),
        ("fs", "mv", "/../ufs/keep.txt", "/moved.txt"),
        ("fs", "rm", "-R", "/../ufs"),
        ("fs", "rm", "/data/../keep.txt"),
        ("fs", "load", "/data/../keep.txt"),
        ("fs", "pin", "/data/../keep.txt"),
        ("fs", "free", "/data/../keep.txt"),
        ("fs", "cat", "relative/path"),
    ]
    for args in cases:
        r = c.run(*args)
        msg = assert_one_line_error(r, 2)
        assert "root:" not in msg, msg  # no /etc/passwd content anywhere

    for r in (c.run("fs", "cat", "/data/../etc/passwd"), c.run("fs", "get", "/../etc/passwd", tmp / "x")):
        assert b"root:" not in r.stdout
    assert not (tmp / "stolen").exists() or (tmp / "stolen").read_bytes() == b""
    # Nothing written outside the mount roots.
    assert not outside.exists()
    assert not (c.data_dir.parent / "escape.txt").exists()
    assert not (c.data_dir / "evil").exists() and not (c.data_dir.parent / "evil").exists()
    assert not Path("/evil").exists() and not Path("/escape.txt").exists()
    assert (c.ufs_dir / "keep.txt").read_bytes() == b"keep"
    assert sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])) == ["p/ok.bin"]
    assert c.cat("/keep.txt") == b"keep"
    _healthy(c, "/data/ok.bin", data)


def test_paths_outside_every_mount(standalone_factory, s3, bucket, minio):
    s = standalone_factory(root_ufs="none")
    assert [m["path"] for m in s.report()["mounts"]] == []

    for args in (("fs", "ls", "/nowhere"), ("fs", "cat", "/x"), ("fs", "stat", "/x"),
                 ("fs", "mkdir", "/x"), ("fs", "load", "/x")):
        assert_one_line_error(s.run(*args))
    assert_one_line_error(s.run("fs", "put", "-", "/x", input=b"nowhere to go"))
    assert s.alive()

    # A mount on the bare namespace works, and the rest stays outside.
    data = os.urandom(2 * MiB + 3)
    s3.put_object(Bucket=bucket, Key="q/f.bin", Body=data)
    s.mount_s3("/s3", bucket, "q", minio)
    _healthy(s, "/s3/f.bin", data)
    assert_one_line_error(s.run("fs", "cat", "/x"))
    assert [e["path"] for e in s.ls_json("/s3")] == ["/s3/f.bin"]
    b0 = s.counters()
    assert sha256(s.cat("/s3/f.bin")) == sha256(data)
    d = s.delta(b0)
    assert d == {"short_circuit": len(data), "local_worker": 0, "remote_worker": 0, "ufs": 0}, d


def _send_raw(addr: str, payload: bytes, read: bool = True) -> bytes:
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        try:
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            return b""
        got = b""
        if read:
            sock.settimeout(5)
            try:
                while len(got) < 1 << 16:
                    b = sock.recv(4096)
                    if not b:
                        break
                    got += b
            except OSError:
                pass
        return got


def _send_unix(path: str, payload: bytes):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(path)
        try:
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(4096):
                pass
        except OSError:
            pass


def test_garbled_rpc_keeps_the_cluster_up(cluster, s3, bucket, minio):
    c = cluster
    data = os.urandom(3 * MiB + 5)
    s3.put_object(Bucket=bucket, Key="p/ok.bin", Body=data)
    c.mount_s3("/data", bucket, "p", minio, "60s")
    _healthy(c, "/data/ok.bin", data)
    worker = c.report()["workers"][0]["data_address"]
    uds = c.data_dir / "worker0" / "worker.sock"
    assert uds.exists()

    rnd = random.Random(1234)
    junk = [rnd.randbytes(n) for n in (1, 7, 64, 4096, 1 << 16)]
    frames = [
        struct.pack(">I", 0xFFFFFFFF) + b"\x00" * 16,  # absurd length prefix
        struct.pack(">I", 1 << 30) + b"\x01\x02",  # large length, short body
        struct.pack(">I", 3) + b"\xff\xff\xff",  # a frame that is not protobuf
        struct.pack(">I", 0),  # an empty frame
        struct.pack(">I", 5) + b"\x0a\x03\x08",  # truncated message
    ]
    http2 = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + rnd.randbytes(256)
    for payload in junk + frames + [http2, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"]:
        _send_raw(c.master, payload)
        _send_raw(worker, payload)
        _send_unix(str(uds), payload)
    # Many connections at once that never finish their request.
    socks = []
    for addr in (c.master, worker):
        host, port = addr.rsplit(":", 1)
        for _ in range(20):
            s = socket.create_connection((host, int(port)), timeout=5)
            s.sendall(rnd.randbytes(3))
            socks.append(s)
    try:
        _healthy(c, "/data/ok.bin", data)
        b0 = c.counters()
        assert sha256(c.cat("/data/ok.bin", "--no-short-circuit")) == sha256(data)
        d = c.delta(b0)
        assert d == {"short_circuit": 0, "local_worker": len(data), "remote_worker": 0, "ufs": 0}, d
    finally:
        for s in socks:
            s.close()
    _healthy(c, "/data/ok.bin", data)
    assert c.metrics().count("locus_bytes_read_total") >= 4


def test_a_master_lost_mid_call_is_exit_7(cluster_factory, tmp):
    """The master dies (kill -9) while a call is in flight: the CLI says so on one line
    and exits 7 (unavailable), as when the master is down from the start."""
    import subprocess

    # An S3 endpoint that accepts and never answers holds the master's mount check.
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(16)
    try:
        c = cluster_factory()
        p = c.popen("fs", "mount", "/hole", "s3://bucket", "--option",
                    f"endpoint=http://127.0.0.1:{hole.getsockname()[1]}")
        time.sleep(2)
        assert p.poll() is None, "the call is in flight"
        c.kill()
        out, err = p.communicate(timeout=60)
        r = subprocess.CompletedProcess(p.args, p.returncode, out, err)
        msg = assert_one_line_error(r, 7)
        assert "master" in msg, msg
    finally:
        hole.close()


def test_cli_errors_without_a_master(tmp):
    """No master at the address: a quick one-line 'unavailable' (exit 7); bad flags: exit 2."""
    from conftest import Locus, free_port

    token = tmp / "client.token"
    token.write_text("0123456789abcdef" * 4)
    gone = Locus(f"127.0.0.1:{free_port()}", token_file=token)
    for args in (("report", "--json"), ("fs", "ls", "/"), ("fs", "cat", "/x")):
        t0 = time.monotonic()
        # A client waits client.master_retry (default 30 s) for a restarting master; this
        # one is told to give up after 2 s.
        r = gone.run(*args, timeout=60, env={"LOCUS_CLIENT__MASTER_RETRY": "2s"})
        msg = assert_one_line_error(r, 7)
        assert gone.master in msg, msg
        assert time.monotonic() - t0 < 15, f"{args} took too long to give up"
    assert_one_line_error(gone.run("--config", tmp / "missing.toml", "report"), 3)
    bad = tmp / "bad.toml"
    bad.write_text("[client]\nread_type = 'SOMETIMES'\n")
    assert_one_line_error(gone.run("--config", bad, "report"), 2)
    r = gone.run("local", "start", "--data-dir", tmp / "x", "--tier", "TAPE:/tmp/x:1GiB", timeout=30)
    assert_one_line_error(r, 2)
    r = gone.run("local", "start", "--data-dir", tmp / "x", "--mem-quota", "lots", timeout=30)
    assert_one_line_error(r, 2)
