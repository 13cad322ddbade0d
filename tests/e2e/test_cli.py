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


def test_get_refuses_to_overwrite_like_put(cluster, tmp):
    c = cluster
    c.ok("fs", "put", "-", "/g.txt", input=b"from locus")
    local = tmp / "g.txt"
    local.write_bytes(b"mine")
    line = assert_one_line_error(c.fs("get", "/g.txt", local), 4)
    assert "--overwrite" in line, line
    assert local.read_bytes() == b"mine", "a refused get must not touch the file"
    c.ok("fs", "get", "--overwrite", "/g.txt", local)
    assert local.read_bytes() == b"from locus"
    line = assert_one_line_error(c.fs("put", local, "/g.txt"), 4)
    assert "--overwrite" in line, line


def test_free_skips_pinned_files_and_says_how_many(cluster):
    c = cluster
    for i in range(3):
        c.ok("fs", "put", "--write-type", "CACHE_THROUGH", "-", f"/fr/f{i}", input=b"x" * 1000)
    c.ok("fs", "pin", "/fr/f1")
    out = c.ok("fs", "free", "-R", "/fr").decode()
    assert "freed 2 block(s)" in out and "skipped 1" in out, out
    line = assert_one_line_error(c.fs("free", "/fr/f1"))
    assert "/fr/f1 is pinned" in line, line


def test_set_replication_beyond_the_live_workers_warns(cluster):
    c = cluster
    c.ok("fs", "put", "-", "/rep.txt", input=b"r")
    r = c.fs("setReplication", "--min", "3", "/rep.txt")
    assert r.returncode == 0, r.stderr
    assert b"warning" in r.stderr and b"1 worker(s) are live" in r.stderr, r.stderr


def test_load_prints_a_summary_without_a_terminal(cluster):
    c = cluster
    c.ok("fs", "put", "--write-type", "THROUGH", "-", "/ld/a", input=b"a" * 5000)
    out = c.ok("fs", "load", "-R", "/ld").decode()
    assert out.startswith("loaded 1 file(s)"), out


def test_report_says_what_it_counts_and_how_fresh(cluster):
    out = cluster.ok("report").decode()
    assert "counted in block reads, not bytes" in out, out
    assert "as of the workers' last heartbeats" in out, out


def test_every_argument_has_help():
    import re
    import subprocess

    from conftest import LOCUS_BIN

    def help_of(*args):
        return subprocess.run([str(LOCUS_BIN), *args, "--help"], capture_output=True, text=True, timeout=30).stdout

    empty = []
    commands = [("fs", c) for c in ("ls", "stat", "cat", "wc", "head", "get", "put", "persist", "setReplication",
                                   "mkdir", "rm", "mv", "load", "free", "pin", "unpin", "mount", "unmount")]
    commands += [("local", "start"), ("local", "clean"), ("master",), ("worker",), ("gateway",), ("report",)]
    for cmd in commands:
        lines = help_of(*cmd).splitlines()
        section = None
        for i, line in enumerate(lines):
            if line in ("Arguments:", "Options:"):
                section = line
                continue
            # An argument or option line whose description is empty: none beside it, and
            # none on the next line (clap's layout for long descriptions) either.
            if section and re.match(r"^\s+(-|<|\[)\S.*$", line) and not re.search(r"\S\s{2,}\S", line.strip()):
                nxt = lines[i + 1] if i + 1 < len(lines) else ""
                indent = len(line) - len(line.lstrip())
                if not (nxt.strip() and len(nxt) - len(nxt.lstrip()) > indent and not nxt.strip().startswith("-")):
                    empty.append(f"{' '.join(cmd)}: {line.strip()}")
    assert not empty, "arguments without help:\n" + "\n".join(empty)
