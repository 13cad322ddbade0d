#!/usr/bin/env python3
"""Python writes through the Locus client against the same writes to a tmpfs file (the
floor: no storage layer), side by side in one run.

Starts `locus local start` (a MEM tier, the local-directory root UFS) in a temporary
directory, then writes SIZE bytes in WRITE-byte pieces (PyArrow's CSV writer hands its
file about 58 KiB at a time) with the fsspec `locus://` filesystem, per write type, and
to a file in /dev/shm, RUNS times each, interleaved. Prints the medians, the ratio to the
floor, and the CPU seconds of the writing process and of the Locus process (which holds
the worker) per run; the written-bytes counters say which path the bytes took.

    LOCUS_BIN=target/release/locus python3 bench/pywrite.py [--size BYTES] [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import netstage  # noqa: E402


def proc_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        s = f.read().split(")")[1].split()
    return (int(s[11]) + int(s[12])) / os.sysconf("SC_CLK_TCK")


def self_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=1 << 30, help="bytes per file (default 1 GiB)")
    ap.add_argument("--write", type=int, default=58 * 1024, help="bytes per write call (default 58 KiB)")
    ap.add_argument("--runs", type=int, default=5, help="runs per system, interleaved (default 5)")
    ap.add_argument("--write-types", default="MUST_CACHE,ASYNC_THROUGH",
                    help="comma-separated write types to run through locus:// (default MUST_CACHE,ASYNC_THROUGH)")
    ap.add_argument("--out", help="also write the table (Markdown) and the runs (JSON, same stem) here")
    a = ap.parse_args()
    locus_bin = os.environ.get("LOCUS_BIN")
    if not locus_bin:
        raise SystemExit("LOCUS_BIN must name a locus binary (cargo build --release -p locus)")
    from locus.fsspec import LocusFileSystem

    work = Path(tempfile.mkdtemp(prefix="locus-pywrite-"))
    rpc, web, gw = (netstage.free_port() for _ in range(3))
    env = dict(os.environ, LOCUS_MASTER__WEB_ADDRESS=f"127.0.0.1:{web}", LOCUS_WORKER__DATA_ADDRESS="127.0.0.1:0",
               LOCUS_GATEWAY__ADDRESS=f"127.0.0.1:{gw}", LOCUS_SECURITY__TOKEN_FILE=str(work / "locus/client.token"),
               LOCUS_MASTER=f"127.0.0.1:{rpc}")
    os.environ.update({k: env[k] for k in ("LOCUS_SECURITY__TOKEN_FILE", "LOCUS_MASTER")})
    log = open(work / "locus.log", "w")
    p = subprocess.Popen([locus_bin, "--master", f"127.0.0.1:{rpc}", "local", "start", "--data-dir", str(work / "locus"),
                          "--mem-quota", f"{max(4, 3 * a.size >> 30)}GiB"], stdout=log, stderr=log, env=env)
    floor_file = Path(f"/dev/shm/locus-pywrite-{os.getpid()}")
    shm_dir = "/dev/shm/locus" + "".join(c if c.isalnum() else "_" for c in str(work / "locus"))

    def report() -> dict:
        r = subprocess.run([locus_bin, "report", "--json"], capture_output=True, text=True, env=env)
        return json.loads(r.stdout) if r.returncode == 0 else {}

    try:
        for _ in range(150):
            if report().get("live_workers") == 1:
                break
            time.sleep(0.2)
        else:
            raise SystemExit(f"the cluster did not start: see {work / 'locus.log'}")
        piece = os.urandom(a.write)
        systems = ["tmpfs"] + a.write_types.split(",")
        runs: dict[str, list[dict]] = {s: [] for s in systems}
        for r in range(a.runs):
            for s in (systems if r % 2 == 0 else systems[::-1]):
                c0, l0, t = self_cpu(), proc_cpu(p.pid), time.monotonic()
                if s == "tmpfs":
                    f = open(floor_file, "wb")
                else:
                    fs = LocusFileSystem(write_type=s, skip_instance_cache=True)
                    f = fs.open(f"/pywrite/{s}-{r}", "wb")
                done = 0
                while done < a.size:
                    f.write(piece)
                    done += len(piece)
                f.close()
                runs[s].append({"seconds": time.monotonic() - t, "client_cpu": self_cpu() - c0,
                                "locus_cpu": proc_cpu(p.pid) - l0})
                if s == "tmpfs":
                    floor_file.unlink()
                else:
                    fs.rm(f"/pywrite/{s}-{r}")
                # Each run starts with the persist backlog empty (its CPU is not counted).
                while report().get("persist_backlog", {}).get("queued_ops", 1) != 0:
                    time.sleep(0.2)
                print(f"run {r + 1}/{a.runs} {s}: {runs[s][-1]['seconds']:.3f} s", flush=True)
        written = report().get("bytes_written", {})
    finally:
        p.terminate()
        p.wait(timeout=30)
        floor_file.unlink(missing_ok=True)
        subprocess.run(["rm", "-rf", str(work), shm_dir])
    med = {s: {k: statistics.median(x[k] for x in v) for k in v[0]} for s, v in runs.items()}
    floor = med["tmpfs"]["seconds"]
    lines = [f"### Python writes: {a.size / 2**30:.2f} GiB in {a.write // 1024} KiB writes, {a.runs} runs each, "
             "interleaved", "",
             "Machine: 2 cores, 24 GiB. tmpfs = Python `open()` of a /dev/shm file (the floor); the others "
             "`locus://` through the fsspec filesystem, by write type (`locus local start`, MEM tier, the "
             "local-directory root UFS; ASYNC_THROUGH persists in the background, its CPU after the close not "
             "counted).", "",
             "| system | median (s) | GiB/s | / floor | writer CPU (s) | Locus CPU (s) |", "|---|---:|---:|---:|---:|---:|"]
    for s in systems:
        m = med[s]
        lines.append(f"| {s} | {m['seconds']:.3f} | {a.size / 2**30 / m['seconds']:.2f} | {m['seconds'] / floor:.2f}x "
                     f"| {m['client_cpu']:.2f} | {m['locus_cpu']:.2f} |")
    lines += ["", f"Bytes written by path (whole run): {written}."]
    print("\n".join(lines))
    if a.out:
        Path(a.out).write_text("\n".join(lines) + "\n")
        Path(a.out).with_suffix(".json").write_text(json.dumps({"runs": runs, "medians": med, "written": written}, indent=1))


if __name__ == "__main__":
    main()
