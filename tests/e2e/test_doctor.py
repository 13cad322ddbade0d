"""`locus doctor` and the attribution of reads by client host, with the real binary: a
healthy cluster passes every check (a test read goes short-circuit); each thing that can
be wrong (the master down, a token other users can read, a UFS that stopped answering,
a worker socket the reader cannot see) fails its check with the fix; and reads that were
not short-circuit are counted by host and reason (`locus doctor --reads`,
`locus report --by-host`), each reason made to happen here."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest
from conftest import LOCUS_BIN, assert_one_line_error, wait_until

MIB = 1 << 20


def doctor(c, *args, env=None) -> tuple[int, dict]:
    r = c.run("doctor", "--json", *args, env=env, timeout=60)
    return r.returncode, json.loads(r.stdout)


def by_check(d: dict) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for c in d["checks"]:
        out.setdefault(c["check"], []).append(c)
    return out


def host_reads(c, host: str, since: str | None = None) -> dict:
    args = ["doctor", "--reads", "--json", "--host", host] + (["--since", since] if since else [])
    d = json.loads(c.ok(*args))
    assert all(h["host"] == host for h in d["hosts"]), d
    return d["hosts"][0] if d["hosts"] else {}


def test_a_healthy_cluster_passes_every_check(cluster):
    rc, d = doctor(cluster)
    checks = by_check(d)
    assert rc == 0 and d["failed"] == 0, d
    for name in ["client token", "master", "workers", "ufs", "clock skew", "free space", "open files",
                 "local worker", "test read"]:
        assert name in checks, f"no {name!r} check: {d}"
        assert all(c["status"] in ("ok", "warn") for c in checks[name]), checks[name]
    assert all(c["status"] == "ok" for n in ["master", "workers", "ufs", "local worker", "test read"]
               for c in checks[n]), d
    assert "short-circuit" in checks["test read"][0]["detail"]
    assert "worker.sock" in checks["local worker"][0]["detail"]
    # Text: one line per check, and the test file is gone.
    out = cluster.ok("doctor").decode()
    assert "[ok  ] master" in out and "[ok  ] test read" in out, out
    assert cluster.run("fs", "ls", "/.locus-doctor").stdout.strip() == b"", "the test read left its file"
    # --help documents every flag.
    h = cluster.ok("doctor", "--help").decode()
    for flag in ["--reads", "--since", "--host", "--json", "--no-test-read", "--probe-dir"]:
        assert flag in h, h


def test_a_master_that_is_down_fails_with_the_fix(cluster):
    cluster.stop()
    r = cluster.run("doctor", timeout=60)
    assert r.returncode == 1, r
    out = r.stdout.decode()
    assert "[FAIL] master" in out and "fix: start the master" in out, out
    assert r.stderr.decode().strip() == "locus: 1 check(s) failed"


def test_a_token_others_can_read_and_a_missing_token_fail(cluster, tmp):
    loose = tmp / "loose.token"
    shutil.copy(cluster.token_file, loose)
    loose.chmod(0o644)
    rc, d = doctor(cluster, "--no-test-read", env={"LOCUS_SECURITY__TOKEN_FILE": str(loose)})
    tok = by_check(d)["client token"][0]
    assert rc == 1 and tok["status"] == "FAIL" and "chmod 600" in tok["fix"], d
    rc, d = doctor(cluster, env={"LOCUS_SECURITY__TOKEN_FILE": str(tmp / "none.token"),
                                 "LOCUS_SECURITY__SECRET_FILE": str(tmp / "none.secret")})
    tok = by_check(d)["client token"][0]
    assert rc == 1 and tok["status"] == "FAIL" and "client.token" in tok["fix"], d


def test_a_ufs_that_stops_answering_fails_its_mount(cluster, own_minio, tmp):
    minio = own_minio
    minio.s3.create_bucket(Bucket="doc")
    cluster.mount_s3("/lake", "doc", "", minio.endpoint)
    rc, d = doctor(cluster, "--no-test-read")
    ufs = {c["detail"].split(" ")[0]: c for c in by_check(d)["ufs"]}
    assert ufs["/lake"]["status"] == "ok" and ufs["/"]["status"] == "ok", d
    minio.stop()
    rc, d = doctor(cluster, "--no-test-read")
    ufs = {c["detail"].split(" ")[0].rstrip(":"): c for c in by_check(d)["ufs"]}
    assert rc == 1 and ufs["/lake"]["status"] == "FAIL" and ufs["/"]["status"] == "ok", d
    assert "s3://doc" in ufs["/lake"]["detail"], d


def test_reads_are_counted_by_host_and_reason(cluster):
    data = os.urandom(3 * MIB)
    cluster.ok("fs", "put", "-", "/r.bin", input=data)
    # Short-circuit off in this reader's configuration: the local worker serves it.
    env = {"LOCUS_CLIENT__HOST": "off-host", "LOCUS_CLIENT__SHORT_CIRCUIT": "false"}
    assert cluster.ok("fs", "cat", "/r.bin", env=env) == data
    # A short-circuit reader on another name.
    assert cluster.ok("fs", "cat", "/r.bin", env={"LOCUS_CLIENT__HOST": "sc-host"}) == data

    def told():
        off, sc = host_reads(cluster, "off-host", "10m"), host_reads(cluster, "sc-host", "10m")
        return (off, sc) if off.get("bytes") == len(data) and sc.get("bytes") == len(data) else None

    off, sc = wait_until(told, timeout=15, what="both hosts' reads")
    assert off["not_short_circuit"]["disabled"]["bytes"] == len(data), off
    assert off["bytes_by_source"]["local_worker"] == len(data) and off["short_circuit_share"] == 0
    assert sc["short_circuit_share"] == 1.0 and sc["not_short_circuit"] == {}, sc
    text = cluster.ok("doctor", "--reads", "--host", "off-host").decode()
    assert "disabled" in text and "fix: set client.short_circuit = true" in text, text
    # report --by-host: both hosts, as JSON and as a table.
    hosts = {h["host"]: h for h in json.loads(cluster.ok("report", "--by-host", "--json"))}
    assert hosts["sc-host"]["bytes_by_source"]["short_circuit"] == len(data)
    table = cluster.ok("report", "--by-host").decode()
    assert "off-host" in table and "sc-host" in table and "short-circuit" in table, table
    # The status page shows the same.
    status, _, page = cluster.web_get("/")
    assert status == 200 and "Client reads by host" in page and "off-host" in page and "disabled" in page
    # Bad input: one line and exit 2.
    assert_one_line_error(cluster.run("doctor", "--reads", "--since", "soon"), 2)
    r = cluster.run("doctor", "--since", "10m")
    assert r.returncode == 2 and b"--reads" in r.stderr, r


def _can_unshare() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _can_unshare(), reason="needs root and unshare(1) to hide the worker's socket")
def test_a_reader_that_cannot_see_the_worker_socket_is_told_why(cluster, tmp):
    """A reader in its own mount namespace with the worker's directory hidden (a container
    without the worker's mount): its reads go over TCP, counted as `socket_not_visible`
    under this host, and `locus doctor` there fails the local worker check with the path."""
    data = os.urandom(2 * MIB)
    cluster.ok("fs", "put", "-", "/hidden.bin", input=data)
    token = tmp / "outside.token"
    shutil.copy(cluster.token_file, token)
    token.chmod(0o600)
    worker_dir = (cluster.data_dir / "worker0").absolute()
    assert (worker_dir / "worker.sock").exists()

    def hidden(*args) -> subprocess.CompletedProcess:
        script = f'mount -t tmpfs none "{worker_dir}" && exec "$@"'
        cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", str(LOCUS_BIN),
               "--master", cluster.master, *args]
        return subprocess.run(cmd, capture_output=True, timeout=60,
                              env=cluster.env({"LOCUS_SECURITY__TOKEN_FILE": str(token)}))

    r = hidden("fs", "cat", "/hidden.bin")
    assert r.returncode == 0 and r.stdout == data, r.stderr
    host = socket.gethostname()

    def told():
        h = host_reads(cluster, host)
        nsc = h.get("not_short_circuit", {}).get("socket_not_visible", {})
        return h if nsc.get("bytes", 0) >= len(data) else None

    h = wait_until(told, timeout=15, what="the hidden reader's reads")
    assert h["bytes_by_source"]["local_worker"] >= len(data), h
    r = hidden("doctor", "--json")
    d = json.loads(r.stdout)
    local = by_check(d)["local worker"][0]
    assert r.returncode == 1 and local["status"] == "FAIL", d
    assert "worker.sock" in local["detail"] and "not visible" in local["detail"], local
    assert "mount the worker's data directory" in local["fix"], local
