"""A remote UFS for benchmarks: MinIO in its own network namespace behind a shaped link.

    netstage.py up --profile lan --minio BIN --dir DATA --state FILE   # prints the endpoint
    netstage.py down --state FILE

Profiles (rate limits the aggregate link with `tc tbf` on both ends of a veth pair; delay
comes from toxiproxy latency toxics on both directions, since this kernel has no netem):
  lan    1 Gbit/s, 1 ms each way
  cloud  400 Mbit/s, 15 ms each way
  none   MinIO on loopback, no shaping, no namespace

Only addresses of the namespace created here (10.77.<n>.0/30) and loopback are used.
`up` needs root for the namespace (it says so when it is missing); `down` removes the
namespace, its veth pair and qdiscs, and stops every process `up` started, by PID.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

PROFILES = {
    "lan": {"rate": "1gbit", "delay_ms": 1},
    "cloud": {"rate": "400mbit", "delay_ms": 15},
    "none": None,
}


_PORTS_GIVEN: set[int] = set()


def free_port() -> int:
    """A free loopback port, never one this process handed out before, taken below the
    kernel's ephemeral range (32768 and up here): there no client connection can take it
    between this call and the server's bind, and the kernel cannot offer it to the next
    caller. Each pytest-xdist worker draws from its own slice of the range, so parallel
    test processes never race for one port."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    k = int(worker[2:]) if worker[2:].isdigit() else 0
    n = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1))
    span = (_PORT_HI - _PORT_LO) // n
    lo = _PORT_LO + (k % n) * span
    start = random.randrange(span)
    for i in range(span):
        p = lo + (start + i) % span
        if p in _PORTS_GIVEN:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p))
            except OSError:
                continue
        _PORTS_GIVEN.add(p)
        return p
    raise RuntimeError(f"no free port in {lo}..{lo + span}")


def _ephemeral_floor() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


# Ports handed out: below the kernel's ephemeral range, above the well-known services'
# (Ceph's daemons take 3300 and 6800-7300, its gateway 7480).
_PORT_LO = 10000
_PORT_HI = max(_PORT_LO + 2000, min(32000, _ephemeral_floor()))


def sh(*cmd: str, ns: str | None = None):
    full = (["ip", "netns", "exec", ns] if ns else []) + list(cmd)
    r = subprocess.run(full, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"netstage: {' '.join(full)} failed: {r.stderr.strip()}")


def free_stage_number(seed: int) -> int:
    """A number in 20..219 whose namespace and veth names (locus-ufsN, lufhN) are not taken:
    stages of concurrent runs, or one left by a killed run, never collide."""
    for k in range(200):
        n = (seed + k) % 200 + 20
        if not Path(f"/run/netns/locus-ufs{n}").exists() and not Path(f"/sys/class/net/lufh{n}").exists():
            return n
    raise SystemExit("netstage: no free namespace name (locus-ufs20..219 all exist; "
                     "delete stale ones with `ip netns del`)")


def wait_http(url: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"netstage: {url} did not answer in {timeout}s")


def toxiproxy_bin() -> str:
    tools = Path(os.environ.get("LOCUS_TOOLS_DIR", Path.home() / ".cache/locus-tools"))
    b = tools / "bin" / "server"
    if not b.exists():
        b.parent.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(["go", "install", "github.com/Shopify/toxiproxy/v2/cmd/server@latest"],
                           env=dict(os.environ, GOBIN=str(b.parent)), capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"netstage: installing toxiproxy failed: {r.stderr[-2000:]}")
    return str(b)


def api(port: int, path: str, body: dict):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read() or b"{}")


def spawn(cmd: list[str], log: Path, env: dict | None = None) -> int:
    with open(log, "ab") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=env or os.environ, start_new_session=True)
    return p.pid


def up(profile: str, minio: str, data: Path, state_file: Path, listen_host: str = "127.0.0.1") -> dict:
    """Start the stage; its endpoint listens on `listen_host` (loopback by default; the
    address of a bridge of simulated hosts, bench/cluster.py, for clients in them)."""
    shape = PROFILES[profile]
    data.mkdir(parents=True, exist_ok=True)
    # `pids`: every process started, for `down`; `procs`: the same by name, for reports.
    st: dict = {"profile": profile, "pids": [], "procs": {}}
    # Its Prometheus metrics are open (a benchmark's own MinIO, on loopback or in its own
    # namespace): bench/pipeline counts the requests each system makes of it.
    env = dict(os.environ, MINIO_ROOT_USER="minioadmin", MINIO_ROOT_PASSWORD="minioadmin", MINIO_BROWSER="off",
               MINIO_PROMETHEUS_AUTH_TYPE="public")
    if shape is None:
        port = free_port()
        st["procs"]["minio"] = spawn([minio, "server", str(data / "minio"), "--address", f"{listen_host}:{port}",
                                      "--console-address", f"127.0.0.1:{free_port()}", "--quiet"],
                                     data / "minio.log", env)
        st["pids"].append(st["procs"]["minio"])
        st["endpoint"] = f"http://{listen_host}:{port}"
        state_file.write_text(json.dumps(st))
        wait_http(f"{st['endpoint']}/minio/health/live")
        return st
    if os.geteuid() != 0:
        raise SystemExit("netstage: the lan and cloud profiles need root (a network namespace and tc); "
                         "run as root or use --profile none")
    n = free_stage_number(os.getpid())
    ns, vh, vn = f"locus-ufs{n}", f"lufh{n}", f"lufn{n}"
    host_ip, ns_ip = f"10.77.{n}.1", f"10.77.{n}.2"
    sh("ip", "netns", "add", ns)
    # Recorded once it is ours, so `down` (also after a failure below) never deletes another
    # stage's namespace.
    st.update(ns=ns, veth=vh)
    state_file.write_text(json.dumps(st))
    sh("ip", "link", "add", vh, "type", "veth", "peer", "name", vn)
    sh("ip", "link", "set", vn, "netns", ns)
    sh("ip", "addr", "add", f"{host_ip}/30", "dev", vh)
    sh("ip", "link", "set", vh, "up")
    sh("ip", "addr", "add", f"{ns_ip}/30", "dev", vn, ns=ns)
    sh("ip", "link", "set", vn, "up", ns=ns)
    sh("ip", "link", "set", "lo", "up", ns=ns)
    # The aggregate rate, both directions (each side shapes what it sends).
    sh("tc", "qdisc", "add", "dev", vh, "root", "tbf", "rate", shape["rate"], "burst", "1mb", "latency", "100ms")
    sh("tc", "qdisc", "add", "dev", vn, "root", "tbf", "rate", shape["rate"], "burst", "1mb", "latency", "100ms", ns=ns)
    # (`ip netns exec` execs MinIO: the pid is MinIO's.)
    st["procs"]["minio"] = spawn(["ip", "netns", "exec", ns, minio, "server", str(data / "minio"), "--address",
                                  f"{ns_ip}:9000", "--console-address", f"{ns_ip}:9001", "--quiet"],
                                 data / "minio.log", env)
    st["pids"].append(st["procs"]["minio"])
    state_file.write_text(json.dumps(st))
    wait_http(f"http://{ns_ip}:9000/minio/health/live")
    # Delay: toxiproxy in front of MinIO, latency on both directions.
    api_port, listen = free_port(), free_port()
    st["procs"]["toxiproxy"] = spawn([toxiproxy_bin(), "-host", "127.0.0.1", "-port", str(api_port)],
                                     data / "toxiproxy.log")
    st["pids"].append(st["procs"]["toxiproxy"])
    state_file.write_text(json.dumps(st))
    wait_http(f"http://127.0.0.1:{api_port}/version")
    api(api_port, "/proxies", {"name": "minio", "listen": f"{listen_host}:{listen}", "upstream": f"{ns_ip}:9000"})
    for stream in ("upstream", "downstream"):
        api(api_port, "/proxies/minio/toxics", {"name": f"delay-{stream}", "type": "latency", "stream": stream,
                                                "attributes": {"latency": shape["delay_ms"], "jitter": 0}})
    st["endpoint"] = f"http://{listen_host}:{listen}"
    st["direct_endpoint"] = f"http://{ns_ip}:9000"
    state_file.write_text(json.dumps(st))
    wait_http(f"{st['endpoint']}/minio/health/live")
    return st


def stop_groups(pids: list[int]):
    """Stop the process groups led by `pids` (started with start_new_session), the last
    first: SIGTERM, up to 5 s, then SIGKILL."""
    for pid in reversed(pids):
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        for _ in range(100):
            # Reap it if it is our child: a zombie still counts as a member of its group.
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            try:
                os.killpg(pid, 0)
                time.sleep(0.05)
            except ProcessLookupError:
                break
        else:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def down(state_file: Path):
    if not state_file.exists():
        return
    st = json.loads(state_file.read_text())
    stop_groups(st.get("pids", []))
    if st.get("ns"):
        # Deleting the namespace deletes its veth end, which deletes the pair and both qdiscs.
        for _ in range(20):
            r = subprocess.run(["ip", "netns", "del", st["ns"]], capture_output=True, text=True)
            if not Path(f"/run/netns/{st['ns']}").exists():
                break
            time.sleep(0.25)
        else:
            print(f"netstage: could not delete namespace {st['ns']}: {r.stderr.strip()}", file=sys.stderr)
        if Path(f"/sys/class/net/{st['veth']}").exists():
            subprocess.run(["ip", "link", "del", st["veth"]], capture_output=True)
    state_file.unlink()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=["up", "down"])
    ap.add_argument("--profile", default="lan", choices=list(PROFILES))
    ap.add_argument("--minio", default=str(Path.home() / ".cache/locus-tools/bin/minio"))
    ap.add_argument("--dir", default="")
    ap.add_argument("--state", required=True)
    a = ap.parse_args()
    state = Path(a.state)
    if a.cmd == "down":
        down(state)
        return
    try:
        if not Path(a.minio).exists():
            raise SystemExit(f"netstage: no MinIO binary at {a.minio}")
        st = up(a.profile, a.minio, Path(a.dir or state.with_suffix(".d")), state)
    except BaseException:
        down(state)
        raise
    print(st["endpoint"])


if __name__ == "__main__":
    main()
