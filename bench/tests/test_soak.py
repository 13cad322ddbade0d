"""The soak harness's pure helpers, without a cluster: /proc parsing, the kinds of
mappings, the least-squares slope, the summary of samples."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import soak  # noqa: E402

STATUS = """Name:\tlocus
VmHWM:\t  253912 kB
VmRSS:\t  244740 kB
RssAnon:\t  212308 kB
RssFile:\t   32432 kB
RssShmem:\t       0 kB
Threads:\t25
"""

SMAPS = """20000000000-20040000000 rw-p 00000000 00:00 0 
Size:            1048576 kB
Rss:              209964 kB
Anonymous:        209964 kB
AnonHugePages:    126976 kB
VmFlags: rd wr mr mw me nr hg 
55e598c46000-55e598d4b000 r--p 00000000 fd:00 123   /tmp/soak-locus
Size:               1044 kB
Rss:                1044 kB
Anonymous:             0 kB
7f3154000000-7f3154021000 rw-p 00000000 00:00 0 
Size:                132 kB
Rss:                  40 kB
Anonymous:            40 kB
7f3154021000-7f3158000000 ---p 00000000 00:00 0 
Size:              65404 kB
Rss:                   0 kB
Anonymous:             0 kB
7f318b0e0000-7f318b2e0000 rw-p 00000000 00:00 0 
Size:               2048 kB
Rss:                 104 kB
Anonymous:           104 kB
7f3189000000-7f3189100000 r--s 00000000 fd:00 9   /tmp/x/data/master/search/abc.term
Size:               1024 kB
Rss:                 300 kB
Anonymous:             0 kB
7ffc43bc0000-7ffc43be2000 rw-p 00000000 00:00 0                          [stack]
Size:                136 kB
Rss:                 136 kB
Anonymous:           136 kB
"""


def test_parse_status():
    st = soak.parse_status(STATUS)
    assert st == {"VmHWM": 253912, "VmRSS": 244740, "RssAnon": 212308, "RssFile": 32432, "RssShmem": 0,
                  "Threads": 25}


def test_parse_smaps_and_kinds():
    maps = soak.parse_smaps(SMAPS)
    assert [m["size"] for m in maps] == [1048576, 1044, 132, 65404, 2048, 1024, 136]
    assert maps[0]["AnonHugePages"] == 126976 and maps[0]["name"] == ""
    assert maps[1]["name"] == "/tmp/soak-locus"
    kinds = [soak.classify(m, "/tmp/soak-locus", "/tmp/x/data") for m in maps]
    assert kinds == ["anon >=256MiB (mimalloc arena)", "binary", "anon 64MiB (glibc arena)",
                     "anon 64MiB (glibc arena)", "anon <=8MiB (stacks, small maps)", "tantivy index", "main-stack"]
    cats = soak.categories(maps, "/tmp/soak-locus", "/tmp/x/data")
    assert cats["anon 64MiB (glibc arena)"]["n"] == 2 and cats["anon 64MiB (glibc arena)"]["Anonymous"] == 40
    top = soak.top_anon(maps, 2)
    assert [m["Anonymous"] for m in top] == [209964, 136]


def test_rollup_and_metrics():
    assert soak.parse_kv_kb("20000-7ff ---p 0 00:00 0 [rollup]\nRss:  50464 kB\nAnonymous:   26240 kB\n") == {
        "Rss": 50464, "Anonymous": 26240}
    m = soak.parse_metrics('# HELP x\nlocus_workers_live 1\nlocus_tier_used_bytes{tier="MEM"} 1.5e+06\n')
    assert m == {"locus_workers_live": 1.0, 'locus_tier_used_bytes{tier="MEM"}': 1.5e6}


def test_slope():
    assert soak.lsq_slope([0, 1, 2, 3], [1, 3, 5, 7]) == 2
    assert soak.lsq_slope([0, 1], [0, 1]) is None
    assert soak.lsq_slope([1, 1, 1], [0, 1, 2]) is None


def test_summarize():
    def s(t, phase, rss):
        return {"t": t, "phase": phase, "procs": {"local": {"VmRSS": rss, "RssAnon": rss // 2, "RssFile": 0,
                                                            "RssShmem": 0, "fds": 10, "tasks": 5, "cpu_s": t / 10,
                                                            "VmHWM": 999}}}
    samples = [s(0, "start", 1024)] + [s(t, "load", 1024 + t * 1024) for t in range(10, 610, 10)] + [
        s(700, "idle", 2048)]
    out = soak.summarize(samples, 600, "local")
    assert out["VmRSS"]["start"] == 1024 and out["VmRSS"]["end_idle"] == 2048
    assert out["VmRSS"]["end_load"] == 1024 + 600 * 1024 and out["VmRSS"]["max"] == 1024 + 600 * 1024
    # 1 MiB a second over the last half of the load: 3600 MiB/h.
    assert out["VmRSS"]["slope_mib_per_h"] == 3600.0 and out["slope_window_s"] == 300
    assert out["fds"]["min"] == out["fds"]["max"] == 10


def test_bench_run_soak_help_needs_nothing_built():
    import os
    import subprocess
    root = Path(__file__).resolve().parents[2]
    env = {"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "LOCUS_BIN": "/nonexistent/locus",
           "HOME": os.environ.get("HOME", "/tmp"), "CARGO_TARGET_DIR": "/nonexistent/target"}
    r = subprocess.run([str(root / "bench" / "run"), "soak", "--help"], env=env, cwd=root, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "--duration" in r.stdout and "--backtrace-probe" in r.stdout
