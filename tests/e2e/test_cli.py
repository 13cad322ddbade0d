"""The command line, tried as a new user would: a wrong --master is named as such, logs
written to a file carry no terminal colours."""

from __future__ import annotations

import time

from conftest import Locus, assert_one_line_error


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
