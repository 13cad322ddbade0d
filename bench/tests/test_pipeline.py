"""Unit tests for the pipeline benchmark's own code (bench/pipeline.py): the Prometheus
counters it reads from Locus, the spread it reports, and the settling between runs."""

from __future__ import annotations

import contextlib
import http.server
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pipeline  # noqa: E402

METRICS = """# HELP locus_persisted_bytes_total Bytes written to UFSes by the persist queue
# TYPE locus_persisted_bytes_total counter
locus_persisted_bytes_total 2713173395
locus_persist_ops_total{kind="DELETE",result="done"} 16
locus_persist_ops_total{kind="PERSIST",result="done"} 41
locus_persist_ops_total{kind="PERSIST",result="skipped"} 302
"""


def serve(text: str):
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = text.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    s = http.server.HTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=s.serve_forever, daemon=True).start()
    return s


@contextlib.contextmanager
def served(text: str):
    """`text` served over HTTP for the block: its base URL."""
    s = serve(text)
    try:
        yield f"http://127.0.0.1:{s.server_port}"
    finally:
        s.shutdown()


def test_persist_counters_read_the_locus_metrics():
    with served(METRICS) as url:
        c = pipeline.persist_counters(f"{url}/metrics")
    assert c == {"persisted_bytes": 2713173395, "persists_done": 41, "persists_skipped": 302}


def test_persist_counters_are_zero_without_an_endpoint_or_a_metric():
    assert pipeline.persist_counters("") == {"persisted_bytes": 0, "persists_done": 0, "persists_skipped": 0}
    with served("locus_workers_live 1\n") as url:
        c = pipeline.persist_counters(f"{url}/metrics")
    assert c["persisted_bytes"] == 0 and c["persists_done"] == 0


def test_spread_is_max_minus_min():
    assert pipeline.spread([90.3, 108.1, 86.9]) == 108.1 - 86.9
    assert pipeline.spread([5.0]) == 0


def table(totals: dict) -> str:
    """The report of medians that put every stage and the total at each system's figure (spreads 0.4)."""
    stages = pipeline.STAGES + ["total"]
    med = {n: dict.fromkeys(stages, v) for n, v in totals.items()}
    spr = {n: dict.fromkeys(stages, 0.4) for n in med}
    return "\n".join(pipeline.markdown_table(med, spr, 2 << 30, 3, 1, "lan"))


def test_table_has_a_column_group_per_locus_system_and_the_floor():
    md = table({"direct": 20.0, "locus": 10.0, "locus-fs": 8.0, "floor": 5.0})
    assert "| total | 20.0 | 0.4 | 10.0 | 0.4 | **2.00×** | 8.0 | 0.4 | **2.50×** | 5.0 | 4.00× |" in md
    assert "Locus, Spark on locus:// total spread: 0.4 s (5.0% of its median)." in md
    assert "Measured: Locus 2.00x, spread 4.0%; Locus, Spark on locus:// 2.50x, spread 5.0%." in md
    assert "more than 4.00x faster than direct" in md
    # Without the connector's system and the floor, the table is the two-system one.
    md = table({"direct": 20.0, "locus": 10.0})
    assert "| total | 20.0 | 0.4 | 10.0 | 0.4 | **2.00×** |" in md and "locus://" not in md


def test_table_reports_the_share_of_the_gain_left_by_each_floor():
    md = table({"direct": 60.0, "locus-py": 40.0, "floor": 35.0, "floor-persist": 38.0})
    assert "| total | 60.0 | 0.4 | 40.0 | 0.4 | **1.50×** | 35.0 | 1.71× | 38.0 | 1.58× |" in md
    assert "Measured: Locus, all on locus:// 80%." in md
    # (60 - 38) / (60 - 35) = 88% of the floor's gain is left; Locus takes 20 of its 22 s.
    assert "It takes 38.0 s, +3.0 s on the floor: the gain left to any storage layer that does this work is 88%" in md
    assert "(direct - (floor + persistence)): Locus, all on locus:// 91%." in md


def test_uploader_sends_each_complete_output_once_and_skips_the_rest(tmp_path):
    import opendal

    root, dest = tmp_path / "run0", tmp_path / "bucket"
    (root / "csv").mkdir(parents=True)
    (root / "out" / "_temporary" / "0").mkdir(parents=True)
    dest.mkdir()
    (root / "csv" / "part-0.csv").write_bytes(b"a,b\n1,2\n")
    (root / "out" / "_temporary" / "0" / "part-9.parquet").write_bytes(b"in flight")
    (root / "out" / ".part-0.parquet.crc").write_bytes(b"crc")
    (root / "out" / "_SUCCESS").write_bytes(b"")
    up = pipeline.Uploader(str(root), opendal.Operator("fs", root=str(dest)))
    with open(root / "csv" / "part-1.csv", "wb") as f:  # still being written by this process
        f.write(b"x" * 1000)
        for _ in range(50):
            if (dest / "run0" / "csv" / "part-0.csv").exists() and (dest / "run0" / "out" / "_SUCCESS").exists():
                break
            time.sleep(0.1)
        assert (dest / "run0" / "csv" / "part-0.csv").read_bytes() == b"a,b\n1,2\n"
        assert not (dest / "run0" / "csv" / "part-1.csv").exists(), "an open file is not complete"
        f.write(b"y")
    got = up.finish()
    assert (dest / "run0" / "csv" / "part-1.csv").read_bytes() == b"x" * 1000 + b"y"
    assert got == {"persisted_bytes": 8 + 1001, "persists_done": 3, "persists_skipped": 0}
    assert not (dest / "run0" / "out" / "_temporary").exists()
    assert not (dest / "run0" / "out" / ".part-0.parquet.crc").exists()
    up.remove()
    assert not (dest / "run0").exists()


def test_process_cpu_counts_this_process_and_nothing_for_a_gone_one():
    import os

    t0 = pipeline.process_cpu(os.getpid())
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:  # burn 0.3 s of CPU
        pass
    assert pipeline.process_cpu(os.getpid()) - t0 >= 0.2
    assert pipeline.process_cpu(2**22 + 12345) == 0.0  # past pid_max: no such process


def test_cpu_table_gives_the_median_per_process_and_the_sum():
    runs = {"direct": [{"cpu": {"stages": 10.0, "minio": 4.0}}, {"cpu": {"stages": 12.0, "minio": 6.0}},
                       {"cpu": {"stages": 11.0, "minio": 5.0}}],
            "floor": [{"cpu": {"stages": 8.0, "minio": 0.0}}]}
    lines = pipeline.cpu_lines(runs)
    head = next(l for l in lines if l.startswith("| system"))
    assert head == "| system | stages | minio | all |"
    assert "| direct | 11.0 | 5.0 | 16.0 |" in lines
    assert "| floor | 8.0 | 0.0 | 8.0 |" in lines
    assert pipeline.cpu_lines({"direct": [{"total": 1.0}]}) == []


MINIO_METRICS = """# HELP minio_s3_requests_total Total number of S3 requests
# TYPE minio_s3_requests_total counter
minio_s3_requests_total{api="headobject",server="127.0.0.1:9000"} 72
minio_s3_requests_total{api="listobjectsv2",server="127.0.0.1:9000"} 78
minio_s3_requests_total{api="putobjectpart",server="127.0.0.1:9000"} 1.05e+02
minio_s3_requests_4xx_errors_total{api="headobject",server="127.0.0.1:9000"} 70
"""


def test_minio_requests_are_read_by_api_and_empty_when_unreachable():
    with served(MINIO_METRICS) as url:
        c = pipeline.minio_requests(url)
    assert c == {"headobject": 72, "listobjectsv2": 78, "putobjectpart": 105}
    assert pipeline.minio_requests("") == {}
    assert pipeline.minio_requests(url) == {}  # shut down


def test_request_table_gives_the_median_per_api_and_the_sum():
    runs = {"locus-py": [{"minio_requests": {"headobject": 70, "putobject": 20}},
                         {"minio_requests": {"headobject": 74, "putobject": 26}},
                         {"minio_requests": {"headobject": 72, "putobject": 23}}],
            "floor": [{}]}
    lines = pipeline.request_lines(runs)
    assert "| system | headobject | putobject | all |" in lines
    assert "| Locus, all on locus:// | 72 | 23 | 95 |" in lines
    assert "| floor | 0 | 0 | 0 |" in lines
    assert pipeline.request_lines({"direct": [{"total": 1.0}]}) == []


def test_settle_waits_while_the_machine_is_busy_and_returns_once_idle():
    stop = threading.Event()

    def spin():  # one core busy for ~1.5 s
        end = time.monotonic() + 1.5
        while time.monotonic() < end and not stop.is_set():
            pass

    t = threading.Thread(target=spin)
    t.start()
    try:
        waited = pipeline.settle(sync=False, quiet=0.5, window=0.25, limit=3)
    finally:
        stop.set()
        t.join()
    assert waited >= 1.2, "returned while a core was busy"
    assert waited < 3 + 2.0, "waited past its limit"
    # Above the machine's cores, any window is quiet: one window, then it returns.
    assert pipeline.settle(sync=False, quiet=os.cpu_count() + 1, window=0.25, limit=3) < 2.0


def test_mem_watch_keeps_the_lowest_free_memory_seen():
    w = pipeline.MemWatch(every=0.05)
    time.sleep(0.2)
    lowest = w.stop()
    assert 0 < lowest <= pipeline.mem_free() + 0.5
    assert not w.thread.is_alive()


def test_machine_table_gives_medians_without_a_sum():
    runs = {"direct": [{"machine": {"busy": b, "iowait": 1.0, "steal": 0.0, "other": 2.0}} for b in (9.0, 10.0, 30.0)]}
    lines = pipeline.machine_lines(runs)
    assert "| system | busy | iowait | other | steal |" in lines
    assert "| direct | 10.0 | 1.0 | 2.0 | 0.0 |" in lines


def test_machine_cpu_counts_this_process_spinning_as_busy():
    m0 = pipeline.machine_cpu()
    end = time.monotonic() + 0.3
    while time.monotonic() < end:
        pass
    m1 = pipeline.machine_cpu()
    assert m1["busy"] - m0["busy"] >= 0.2
    assert set(m1) == {"busy", "iowait", "steal"}
