"""Simulated hosts on one machine, for locality tests and benchmarks: N hosts, each its own
network namespace (an address on a bridge) and its own mount namespace (its own tmpfs at
DIR/host, holding its Locus worker's data directory, short-circuit socket and MEM tier:
no other host sees them). The master host is this machine's own namespace: it runs the
Locus master and, with --spark, the Spark standalone master (the driver runs there too);
each simulated host runs a Locus worker and, with --spark, a Spark worker whose executors
inherit the host's namespaces.

    cluster.py up --hosts 2 --dir DIR --state FILE [--spark] [--mem 1GiB] [--locus BIN]
    cluster.py run --state FILE --host 1 -- locus fs cat /x      # a command on host 1
    cluster.py down --state FILE

Every host is named by its address (10.79.<n>.<10+k>): the Locus worker's `worker.host`,
the clients' `client.host` and the Spark worker's and executors' host are that address,
so the block locations the Hadoop connector gives match what Spark's executors report.
The UFS is mounted by the caller (a file:// directory under DIR is the same directory on
every host). Only addresses of the bridge made here are used. `up` needs root; `down`
stops every process `up` started, by PID, and removes the namespaces, the bridge and the
tmpfs mounts (also after a failed `up`). Tests and benchmarks use `SimCluster` directly.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from netstage import free_port, stop_groups  # noqa: E402


def sh(*cmd: str):
    r = subprocess.run(list(cmd), capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"cluster: {' '.join(cmd)} failed: {r.stderr.strip()}")


def free_cluster_number(seed: int) -> int:
    """A number in 20..219 whose bridge name (lcbrN) is not taken."""
    for k in range(200):
        n = (seed + k) % 200 + 20
        if not Path(f"/sys/class/net/lcbr{n}").exists():
            return n
    raise RuntimeError("cluster: no free bridge name (lcbr20..219 all exist; delete stale ones with `ip link del`)")


def pyspark_home(python: str = sys.executable) -> Path:
    out = subprocess.run([python, "-c", "import pyspark, os; print(os.path.dirname(pyspark.__file__))"],
                         capture_output=True, text=True, check=True).stdout.strip()
    return Path(out)


class SimCluster:
    """N simulated hosts with a Locus master (and optionally Spark) on this machine.

    `state` is written as the cluster comes up, so `down(state)` (or `SimCluster.stop`)
    undoes whatever was made even after a failure half-way.
    """

    def __init__(self, hosts: int, dir: Path, locus: str, spark: bool = False, mem: str = "1GiB",
                 block_size: str | None = None, python: str = sys.executable, env: dict | None = None,
                 executor_memory: str = "512m"):
        self.hosts, self.dir, self.locus = hosts, Path(dir).absolute(), str(locus)
        self.spark, self.mem, self.block_size, self.python = spark, mem, block_size, python
        self.executor_memory = executor_memory
        self.extra_env = dict(env or {})
        self.state_file = self.dir / "cluster.json"
        self.st: dict = {"pids": [], "netns": [], "mounts": [], "links": []}

    # -- addresses -----------------------------------------------------------------------
    def ip(self, k: int) -> str:
        """The address of host k (0: the master host, this machine's namespace)."""
        return f"10.79.{self.st['n']}.{1 if k == 0 else 10 + k}"

    @property
    def master(self) -> str:
        return self.st["master"]

    @property
    def token_file(self) -> Path:
        return self.dir / "master" / "client.token"

    def client_env(self, k: int, extra: dict | None = None) -> dict:
        """The environment of a Locus client on host k."""
        e = {k2: v for k2, v in os.environ.items() if not k2.startswith("LOCUS_")}
        e.update(LOCUS_MASTER=self.master, LOCUS_SECURITY__TOKEN_FILE=str(self.token_file),
                 LOCUS_CLIENT__HOST=self.ip(k))
        e.update(extra or {})
        return e

    def _save(self):
        self.state_file.write_text(json.dumps(self.st))

    # -- running things on a host ---------------------------------------------------------
    def wrap(self, k: int, cmd: list[str]) -> list[str]:
        """`cmd` as run on host k (k=0: as it is, on the master host)."""
        if k == 0:
            return list(cmd)
        ns = self.st["netns"][k - 1]
        return ["nsenter", f"--net=/run/netns/{ns}", f"--mount={self.dir / 'ns' / f'h{k}.mnt'}", "--", *cmd]

    def run(self, k: int, cmd: list[str], env: dict | None = None, timeout: float = 300,
            input: bytes | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(self.wrap(k, cmd), capture_output=True, timeout=timeout, input=input,
                              env=env or self.client_env(k))

    def locus_cmd(self, k: int, *args: str, env: dict | None = None, check: bool = True,
                  timeout: float = 300, input: bytes | None = None) -> subprocess.CompletedProcess:
        """`locus ARGS...` as a client on host k."""
        r = self.run(k, [self.locus, *args], env=env or self.client_env(k), timeout=timeout, input=input)
        if check and r.returncode != 0:
            raise AssertionError(f"host {k}: locus {' '.join(args)} failed ({r.returncode}): "
                                 f"{r.stderr.decode(errors='replace')}")
        return r

    def spawn(self, k: int, name: str, cmd: list[str], env: dict) -> int:
        log = self.dir / "logs" / f"{name}.log"
        with open(log, "ab") as f:
            f.write(f"$ {' '.join(cmd)}\n".encode())
            f.flush()
            p = subprocess.Popen(self.wrap(k, cmd), stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env=env, start_new_session=True)
        self.st["pids"].append(p.pid)
        self._save()
        return p.pid

    def log_tail(self, n: int = 40) -> str:
        out = []
        for p in sorted((self.dir / "logs").glob("*.log")):
            out.append(f"--- {p.name}")
            out.extend(p.read_text(errors="replace").splitlines()[-n:])
        return "\n".join(out)

    # -- up and down ------------------------------------------------------------------------
    def start(self) -> "SimCluster":
        if os.geteuid() != 0:
            raise RuntimeError("cluster: simulated hosts need root (network and mount namespaces)")
        try:
            self._start()
        except BaseException:
            print(self.log_tail(), file=sys.stderr)
            self.stop()
            raise
        return self

    def _start(self):
        self.dir.mkdir(parents=True, exist_ok=True)
        for d in ("logs", "ns", "host", "master", "ufs"):
            (self.dir / d).mkdir(exist_ok=True)
        n = free_cluster_number(os.getpid())
        self.st["n"] = n
        self.st["dir"] = str(self.dir)
        br = f"lcbr{n}"
        sh("ip", "link", "add", br, "type", "bridge")
        self.st["links"].append(br)
        self._save()
        sh("ip", "addr", "add", f"{self.ip(0)}/24", "dev", br)
        sh("ip", "link", "set", br, "up")
        # Where bridged traffic goes through iptables (br_netfilter) and FORWARD drops it
        # (a Docker host), let the hosts' traffic across this bridge through.
        nf = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")
        if nf.exists() and nf.read_text().strip() == "1" and shutil.which("iptables"):
            rule = ["FORWARD", "-i", br, "-o", br, "-j", "ACCEPT"]
            sh("iptables", "-I", *rule)
            self.st["iptables"] = rule
            self._save()
        # Persistent mount namespaces are bind mounts of nsfs files: their directory must be
        # a private mount.
        ns_dir = self.dir / "ns"
        sh("mount", "--bind", str(ns_dir), str(ns_dir))
        self.st["mounts"].append(str(ns_dir))
        self._save()
        sh("mount", "--make-private", str(ns_dir))
        for k in range(1, self.hosts + 1):
            ns, a, b = f"lc{n}h{k}", f"lc{n}h{k}a", f"lc{n}h{k}b"
            sh("ip", "netns", "add", ns)
            self.st["netns"].append(ns)
            self._save()
            sh("ip", "link", "add", a, "type", "veth", "peer", "name", b)
            sh("ip", "link", "set", a, "master", br, "up")
            sh("ip", "link", "set", b, "netns", ns)
            sh("ip", "-n", ns, "addr", "add", f"{self.ip(k)}/24", "dev", b)
            sh("ip", "-n", ns, "link", "set", b, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            mnt = ns_dir / f"h{k}.mnt"
            mnt.touch()
            # The host's own tmpfs at DIR/host: its worker's data dir, socket and MEM tier.
            sh("unshare", f"--mount={mnt}", "--propagation", "private", "sh", "-c",
               f'mount -t tmpfs -o mode=0755 locus-h{k} "{self.dir / "host"}" && '
               f'mkdir -p "{self.dir / "host" / "worker"}" "{self.dir / "host" / "spark"}"')
            self.st["mounts"].insert(0, str(mnt))
            self._save()
        self._start_locus()
        if self.spark:
            self._start_spark()

    def _start_locus(self):
        port, web = free_port(), free_port()
        self.st["master"] = f"{self.ip(0)}:{port}"
        self.st["web"] = f"{self.ip(0)}:{web}"
        base = {k: v for k, v in os.environ.items() if not k.startswith("LOCUS_")}
        base.update(RUST_LOG=os.environ.get("RUST_LOG", "info"), **self.extra_env)
        menv = dict(base, LOCUS_MASTER__WORKER_TIMEOUT="5s")
        if self.block_size:
            menv["LOCUS_MASTER__BLOCK_SIZE"] = self.block_size
        secret = self.dir / "master" / "cluster.secret"
        self.spawn(0, "master", [self.locus, "--secret-file", str(secret), "--token-file", str(self.token_file),
                                 "master", "--rpc-address", self.master, "--web-address", self.st["web"],
                                 "--meta-dir", str(self.dir / "master" / "meta"),
                                 "--root-ufs", f"file://{self.dir / 'ufs'}"], menv)
        deadline = time.monotonic() + 60
        while not self.token_file.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"cluster: the master made no client token:\n{self.log_tail()}")
            time.sleep(0.1)
        host = self.dir / "host"
        for k in range(1, self.hosts + 1):
            wenv = dict(base, LOCUS_WORKER__HOST=self.ip(k), LOCUS_WORKER__HEARTBEAT_INTERVAL="500ms")
            self.spawn(k, f"worker-h{k}", [
                self.locus, "--master", self.master, "--secret-file", str(secret),
                "worker", "--data-address", f"{self.ip(k)}:29999", "--data-dir", str(host / "worker"),
                "--tier", f"MEM:{host / 'mem'}:{self.mem}"], wenv)
        self.wait_workers(self.hosts)

    def report(self) -> dict | None:
        r = self.locus_cmd(0, "report", "--json", check=False, timeout=30)
        return json.loads(r.stdout) if r.returncode == 0 else None

    def wait_workers(self, live: int, timeout: float = 60):
        deadline = time.monotonic() + timeout
        while True:
            r = self.report()
            if r and r["live_workers"] == live:
                return r
            if time.monotonic() > deadline:
                raise RuntimeError(f"cluster: {live} workers did not register:\n{self.log_tail()}")
            time.sleep(0.3)

    def _start_spark(self):
        home = pyspark_home(self.python)
        spark_class = str(home / "bin" / "spark-class")
        port, web = free_port(), free_port()
        self.st["spark"] = f"spark://{self.ip(0)}:{port}"
        senv = {k: v for k, v in os.environ.items() if not k.startswith("LOCUS_")}
        senv.update(SPARK_HOME=str(home), SPARK_LOCAL_IP=self.ip(0), SPARK_NO_DAEMONIZE="1",
                    SPARK_LOG_DIR=str(self.dir / "logs"))
        self.st["spark_web"] = f"{self.ip(0)}:{web}"
        self.spawn(0, "spark-master", [spark_class, "org.apache.spark.deploy.master.Master", "--host", self.ip(0),
                                       "--port", str(port), "--webui-port", str(web)], senv)
        for k in range(1, self.hosts + 1):
            # JAVA_TOOL_OPTIONS reaches the executors (they inherit the worker's
            # environment): an Alluxio client there names itself by the host's address,
            # as its worker does, or it would not know the worker is local.
            wenv = dict(self.client_env(k), SPARK_HOME=str(home), SPARK_LOCAL_IP=self.ip(k),
                        SPARK_LOCAL_HOSTNAME=self.ip(k), SPARK_NO_DAEMONIZE="1",
                        SPARK_WORKER_DIR=str(self.dir / "host" / "spark"),
                        JAVA_TOOL_OPTIONS=f"-Dalluxio.user.hostname={self.ip(k)}")
            self.spawn(k, f"spark-worker-h{k}", [
                spark_class, "org.apache.spark.deploy.worker.Worker", self.st["spark"], "--host", self.ip(k),
                "--cores", "1", "--memory", "1g", "--webui-port", "0"], wenv)
        self._save()
        self.wait_spark_workers()

    def wait_spark_workers(self, timeout: float = 120):
        """Until the Spark master lists a live worker on every host."""
        self._wait_json(f"http://{self.st['spark_web']}/json/", "the Spark workers",
                        lambda j: len([w for w in j["workers"] if w.get("state") == "ALIVE"]) >= self.hosts, timeout)

    def _wait_json(self, url: str, what: str, ready, timeout: float):
        """Until `ready` holds of the JSON at `url` (a cluster web port)."""
        import urllib.request

        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if ready(json.loads(r.read())):
                        return
            except (OSError, ValueError, KeyError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"cluster: {what} did not register:\n{self.log_tail()}")
            time.sleep(0.5)

    # -- Alluxio 2.9.6 on the same hosts (the study's peer) ---------------------------------
    ALLUXIO_MASTER_PORT, ALLUXIO_WEB_PORT = 19998, 19999
    # Not Alluxio's default 29999/30000: the Locus worker holds 29999 on each host.
    ALLUXIO_WORKER_PORT, ALLUXIO_WORKER_WEB_PORT = 29989, 30010

    def start_alluxio(self, home: Path, ufs: str, site: dict, mem: str, block_size: str) -> dict:
        """Alluxio 2.9.6, its jars resolved in `home` (bench/alluxio/alluxio-up.sh HOME
        --resolve-only): its master on the master host, a worker on every host with its MEM
        tier on that host's tmpfs, each named by the host's address (as Spark's executors
        are). `site`: extra properties (the UFS's credentials: the file is mode 600).
        Returns what a client needs: `url`, `java_options`, `jar`, `metrics`."""
        home = Path(home)
        d = self.dir / "alluxio"
        for sub in ("conf", "journal", "home"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        (self.dir / "logs" / "alluxio").mkdir(exist_ok=True)
        quota = mem.replace("iB", "B")
        ip0 = self.ip(0)
        props = {
            "alluxio.master.hostname": ip0, "alluxio.master.bind.host": ip0, "alluxio.master.web.bind.host": ip0,
            "alluxio.master.rpc.port": self.ALLUXIO_MASTER_PORT, "alluxio.master.web.port": self.ALLUXIO_WEB_PORT,
            "alluxio.worker.rpc.port": self.ALLUXIO_WORKER_PORT, "alluxio.worker.web.port": self.ALLUXIO_WORKER_WEB_PORT,
            "alluxio.master.update.check.enabled": "false", "alluxio.master.journal.type": "UFS",
            "alluxio.master.journal.folder": d / "journal", "alluxio.master.mount.table.root.ufs": ufs,
            "alluxio.security.authentication.type": "NOSASL",
            "alluxio.security.authorization.permission.enabled": "false",
            "alluxio.user.short.circuit.enabled": "true", "alluxio.user.block.size.bytes.default": block_size.replace("iB", "B"),
            "alluxio.worker.ramdisk.size": quota, "alluxio.worker.tieredstore.levels": 1,
            "alluxio.worker.tieredstore.level0.alias": "MEM", "alluxio.worker.tieredstore.level0.dirs.mediumtype": "MEM",
            "alluxio.worker.tieredstore.level0.dirs.path": self.dir / "host" / "alluxio-mem",
            "alluxio.worker.tieredstore.level0.dirs.quota": quota,
            "alluxio.user.metrics.collection.enabled": "true", "alluxio.user.metrics.heartbeat.interval": "1sec",
            **site}
        conf = d / "conf" / "alluxio-site.properties"
        conf.touch(mode=0o600)
        conf.chmod(0o600)
        conf.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        (d / "conf" / "log4j.properties").write_text(
            "log4j.rootLogger=WARN, console\nlog4j.appender.console=org.apache.log4j.ConsoleAppender\n"
            "log4j.appender.console.layout=org.apache.log4j.PatternLayout\n"
            "log4j.appender.console.layout.ConversionPattern=%d{ISO8601} %-5p %c{1} - %m%n\n"
            "log4j.logger.alluxio.master.AlluxioMasterProcess=INFO\n")
        cp = (home / "cp.txt").read_text().strip()
        jopts = ["-Dcom.amazonaws.sdk.disableEc2Metadata=true", f"-Dalluxio.conf.dir={d / 'conf'}",
                 f"-Dalluxio.logs.dir={self.dir / 'logs' / 'alluxio'}",
                 f"-Dlog4j.configuration=file:{d / 'conf' / 'log4j.properties'}"]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LOCUS_", "JAVA_TOOL_OPTIONS"))}
        fmt = subprocess.run(["java", *jopts, f"-Dalluxio.home={d / 'home'}", "-cp", cp, "alluxio.cli.Format", "master"],
                             capture_output=True, text=True, env=env)
        if fmt.returncode != 0:
            raise RuntimeError(f"cluster: Alluxio's master format failed: {fmt.stderr[-2000:]}")
        pids = [self.spawn(0, "alluxio-master", ["java", "-Xmx1g", "-Dalluxio.logger.type=MASTER_LOGGER", *jopts,
                                                 f"-Dalluxio.home={d / 'home'}", "-cp", cp,
                                                 "alluxio.master.AlluxioMaster"], env)]
        for k in range(1, self.hosts + 1):
            ip = self.ip(k)
            pids.append(self.spawn(k, f"alluxio-worker-h{k}", [
                "java", "-Xmx1g", "-XX:MaxDirectMemorySize=1g", "-Dalluxio.logger.type=WORKER_LOGGER", *jopts,
                f"-Dalluxio.home={self.dir / 'host' / 'alluxio-home'}", f"-Dalluxio.worker.hostname={ip}",
                f"-Dalluxio.worker.bind.host={ip}", f"-Dalluxio.worker.web.bind.host={ip}",
                f"-Dalluxio.user.hostname={ip}", "-cp", cp, "alluxio.worker.AlluxioWorker"], env))
        self.st["alluxio_pids"] = pids
        self._save()
        metrics = f"http://{ip0}:{self.ALLUXIO_WEB_PORT}"
        self._wait_json(f"{metrics}/api/v1/master/info", "the Alluxio workers",
                        lambda j: len(j.get("workers", [])) >= self.hosts, 120)
        client = ["-Dalluxio.master.hostname=" + ip0, "-Dalluxio.security.authentication.type=NOSASL",
                  "-Dalluxio.user.short.circuit.enabled=true", "-Dalluxio.user.metrics.collection.enabled=true",
                  "-Dalluxio.user.metrics.heartbeat.interval=1sec"]
        jar = next((home / "client").glob("alluxio-shaded-client-*.jar"))
        return {"url": f"alluxio://{ip0}:{self.ALLUXIO_MASTER_PORT}", "java_options": " ".join(client),
                "jar": str(jar), "metrics": metrics}

    def stop_alluxio(self):
        """Stop the Alluxio processes (the rest of the cluster runs on)."""
        pids = self.st.pop("alluxio_pids", [])
        stop_groups(pids)
        self.st["pids"] = [p for p in self.st["pids"] if p not in pids]
        self._save()

    def stop(self):
        stop(self.st, self.state_file)


def stop(st: dict, state_file: Path | None = None):
    """Undo what `up` made, as its state records it: processes by PID (their groups), then
    the mount namespaces (their tmpfs go with them), the network namespaces and the bridge."""
    stop_groups(st.get("pids", []))
    for m in st.get("mounts", []):
        subprocess.run(["umount", "-l", m], capture_output=True)
    for ns in st.get("netns", []):
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    for link in st.get("links", []):
        subprocess.run(["ip", "link", "del", link], capture_output=True)
    if st.get("iptables"):
        subprocess.run(["iptables", "-D", *st["iptables"]], capture_output=True)
    st.update(pids=[], mounts=[], netns=[], links=[], iptables=None)
    if state_file is not None and state_file.exists():
        state_file.unlink()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("up", help="start the hosts, the master and the workers (and Spark)")
    u.add_argument("--hosts", type=int, default=2, help="simulated hosts (default 2)")
    u.add_argument("--dir", required=True, help="scratch directory")
    u.add_argument("--state", help="state file (default DIR/cluster.json)")
    u.add_argument("--spark", action="store_true", help="also a Spark standalone master and a worker per host")
    u.add_argument("--mem", default="1GiB", help="each worker's MEM tier (default 1GiB)")
    u.add_argument("--block-size", help="Locus block size (default the master's)")
    u.add_argument("--locus", default=shutil.which("locus") or "locus", help="the locus binary")
    r = sub.add_parser("run", help="run a command on a host")
    r.add_argument("--state", required=True)
    r.add_argument("--host", type=int, required=True, help="0 is the master host")
    r.add_argument("argv", nargs=argparse.REMAINDER)
    d = sub.add_parser("down", help="stop everything up started and remove the namespaces")
    d.add_argument("--state", required=True)
    a = ap.parse_args()
    if a.cmd == "up":
        c = SimCluster(a.hosts, Path(a.dir), a.locus, spark=a.spark, mem=a.mem, block_size=a.block_size)
        c.start()
        if a.state:
            shutil.copy(c.state_file, a.state)
        print(json.dumps({"master": c.master, "hosts": [c.ip(k) for k in range(1, a.hosts + 1)],
                          "spark": c.st.get("spark"), "token_file": str(c.token_file)}))
    elif a.cmd == "down":
        p = Path(a.state)
        if p.exists():
            stop(json.loads(p.read_text()), p)
    else:
        st = json.loads(Path(a.state).read_text())
        argv = a.argv[1:] if a.argv[:1] == ["--"] else a.argv
        c = SimCluster(len(st["netns"]), Path(st["dir"]), "locus")
        c.st = st
        sys.exit(subprocess.run(c.wrap(a.host, argv), env=c.client_env(a.host)).returncode)


if __name__ == "__main__":
    main()
