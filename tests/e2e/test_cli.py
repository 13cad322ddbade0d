"""The command line, tried as a new user would: a wrong --master is named as such, logs
written to a file carry no terminal colours."""

from __future__ import annotations

import shutil
import time

from conftest import Locus, assert_one_line_error, shm_tag


def test_a_wrong_master_address_says_it_is_not_a_master(cluster):
    c = cluster
    worker = c.report()["workers"][0]["data_address"]
    for addr in (c.gateway, worker, c.web):
        t = time.monotonic()
        r = Locus(addr, token_file=c.token_file).run("fs", "ls", "/", timeout=60)
        line = assert_one_line_error(r, 2)
        assert f"{addr} is not a Locus master" in line and "host:port" in line, line
        assert "grpc-status" not in line.split("(")[0], line
        assert time.monotonic() - t < 10, f"{addr}: gave up only after {time.monotonic() - t:.1f} s"


def test_logs_off_a_terminal_are_plain_text(cluster):
    cluster.ok("fs", "put", "-", "/plain.txt", input=b"x")
    text = "".join(p.read_text(errors="replace") for p in cluster.log_paths)
    assert "INFO" in text, text[:500]
    assert "\x1b[" not in text, "ANSI escapes in a log written to a file"


def test_the_banner_names_each_worker_and_its_tiers(cluster_factory):
    c = cluster_factory(args=["--mem-quota", "96MiB"], workers=2)
    text = "".join(p.read_text(errors="replace") for p in c.log_paths)
    for i in range(2):
        assert f"worker{i} (id " in text, text
        assert f"MEM tier  {shm_tag(c.data_dir)}/w{i}  96.0 MiB" in text, text


def test_local_clean_removes_the_mem_tier_even_after_the_data_dir_is_gone(cluster_factory):
    c = cluster_factory(args=["--mem-quota", "64MiB"])
    c.ok("fs", "put", "--write-type", "MUST_CACHE", "-", "/m.bin", input=b"m" * (1 << 20))
    shm = shm_tag(c.data_dir)
    assert any(shm.rglob("*")), "the MEM tier holds the block"
    r = Locus(c.master).run("local", "clean", "--data-dir", c.data_dir)
    assert_one_line_error(r, 1)  # refused while it runs
    assert shm.exists()
    assert c.stop() == 0
    shutil.rmtree(c.data_dir)  # the user deletes the data dir first
    out = Locus(c.master).ok("local", "clean", "--data-dir", c.data_dir).decode()
    assert f"removed {shm}" in out, out
    assert not shm.exists()


def test_an_ephemeral_cluster_leaves_nothing(cluster_factory):
    c = cluster_factory(args=["--ephemeral", "--mem-quota", "64MiB"])
    c.ok("fs", "put", "-", "/e.txt", input=b"gone soon")
    shm = shm_tag(c.data_dir)
    assert shm.exists() and c.data_dir.exists()
    assert c.stop() == 0
    assert not shm.exists(), "the MEM tier outlived an --ephemeral cluster"
    assert not c.data_dir.exists(), "the data dir outlived an --ephemeral cluster"
