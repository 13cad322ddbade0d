#!/usr/bin/env python3
"""Master memory against file count: load N files into the namespace (by listing a
local UFS holding them) and report the RSS of the `locus local start` process after
each step. The namespace lives in redb, so RSS should level off (redb's page cache is
bounded by master.meta_cache_size) instead of growing with N.

    bench/meta_memory.py [--steps 20000,100000,200000]
"""
import argparse, os, shutil, signal, subprocess, sys, tempfile, time

from netstage import free_port  # this directory

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("LOCUS_BIN") or os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "release", "locus")


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", default="20000,100000,200000")
    args = ap.parse_args()
    steps = [int(x) for x in args.steps.split(",")]
    work = tempfile.mkdtemp(prefix="locus-meta-")
    ufs = os.path.join(work, "data", "ufs")
    os.makedirs(ufs)
    port, web = free_port(), free_port()
    env = dict(os.environ, LOCUS_MASTER__WEB_ADDRESS=f"127.0.0.1:{web}", LOCUS_WORKER__DATA_ADDRESS="127.0.0.1:0")
    # The cluster's client token, which local start writes into its data dir.
    os.environ["LOCUS_SECURITY__TOKEN_FILE"] = os.path.join(work, "data", "client.token")
    p = subprocess.Popen([BIN, "--master", f"127.0.0.1:{port}", "local", "start", "--data-dir", os.path.join(work, "data")],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if subprocess.run([BIN, "--master", f"127.0.0.1:{port}", "report", "--json"], capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        print(f"| files in namespace | RSS MiB | load+list s |\n|---|---|---|")
        print(f"| 0 | {rss_mib(p.pid):.0f} | - |")
        made = 0
        for n in steps:
            d = os.path.join(ufs, f"d{n}")
            os.makedirs(d)
            for i in range(n - made):
                open(os.path.join(d, f"f{i:07d}"), "w").close()
            t = time.time()
            r = subprocess.run([BIN, "--master", f"127.0.0.1:{port}", "fs", "ls", f"/d{n}"], stdout=subprocess.PIPE)
            assert r.returncode == 0 and r.stdout.count(b"\n") == n - made, r.returncode
            made = n
            print(f"| {made} | {rss_mib(p.pid):.0f} | {time.time() - t:.1f} |", flush=True)
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
