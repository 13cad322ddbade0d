"""Client benchmark (issue: Python and POSIX clients): the FUSE mount and the Python
client against the native client and tmpfs, and against the peers users run today, in
one run, on a 1 GiB file cached in MEM.

  bench/read --clients [--runs 5] [--size 1GiB] [--files 10000] [--no-peers] [--quick]

What it starts (and stops, by PID): MinIO behind the `lan` profile (bench/netstage.py),
`locus local start` (1 worker) with the bucket mounted at /bench, `locus fuse` on a
directory of its own and, unless --no-peers, `rclone mount --vfs-cache-mode full`,
`s3fs` (s3fs-fuse) and Alluxio 2.9.6's FUSE mount (its master and worker with the bucket
as their root UFS; unless --no-alluxio) over the same bucket, and Python's `s3fs` in
process.

Measured, RUNS times each, interleaved, medians (wall time of one read of the whole file):
  * sequential read of the 1 GiB file: `dd bs=1M` from tmpfs (the floor), the native
    client (`locus fs cat`, short-circuit), the FUSE mount (kernel page cache dropped for
    the file first, so every byte comes through FUSE; and again with the pages the
    kernel kept, `keep_cache`), the FUSE floor (the tmpfs file through `bindfs`, a FUSE
    file system with no storage behind it, pages dropped first too; skipped without
    bindfs), Python (`fs.open().read()` in 8 MiB chunks), the peers;
  * `pq.read_table` of a 1 GiB Parquet file: tmpfs (PyArrow's local file system),
    `locus://`, the FUSE path, the peers;
  * fio: 4 KiB random reads (1 and 8 jobs) and 1 MiB sequential reads, FUSE against
    tmpfs (and the peers' mounts at 1 job): IOPS and GiB/s;
  * metadata: `ls -lR` and `find` over FILES files on the mount, against
    `locus fs ls -R`.
Writes bench/results/clients.md, clients.json and clients.png.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import netstage  # noqa: E402
from seed_csd import Stage as CsdStage  # noqa: E402
from seed_linecount import alluxio_up  # noqa: E402

BUCKET = "bench"
MOUNT = "/bench"
KEY, SECRET = "minioadmin", "minioadmin"
CHUNK = 8 << 20
FUSE_FLOOR = "FUSE floor: bindfs over the tmpfs file (dd)"
ALLUXIO_VERSION = "2.9.6"
#: The peers' FUSE mounts (their fio runs are at 1 job).
PEER_MOUNTS = ("rclone", "s3fs-fuse", "alluxio-fuse")


def log(msg: str):
    print(f"[clients {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def parse_size(s: str) -> int:
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "": 1}
    for u in ("KiB", "MiB", "GiB"):
        if s.endswith(u):
            return int(float(s[: -len(u)]) * units[u])
    return int(s)


def drop_pages(path: str):
    """Drops the kernel's cached pages of one file (on a FUSE mount too), so the next
    read goes through the file system again."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def timed_cmd(cmd: list[str], env=None, stdout=subprocess.DEVNULL) -> float:
    t = time.perf_counter()
    r = subprocess.run(cmd, env=env, stdout=stdout, stderr=subprocess.PIPE)
    dt = time.perf_counter() - t
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.decode()[-500:]}")
    return dt


def dd(path: str) -> float:
    return timed_cmd(["dd", f"if={path}", "of=/dev/null", "bs=1M"])


def read_chunks(f) -> int:
    n = 0
    while True:
        b = f.read(CHUNK)
        if not b:
            return n
        n += len(b)


def timed_read(fs, path: str, size: int) -> float:
    """`fs.open(path).read()` in 8 MiB chunks, timed."""
    t = time.perf_counter()
    with fs.open(path, "rb") as f:
        n = read_chunks(f)
    dt = time.perf_counter() - t
    assert n == size, (path, n)
    return dt


def s3fs_reads(endpoint: str, runs: int, size: int):
    """The Python s3fs figures (run in s3fs's own venv): prints one JSON line."""
    import s3fs

    fs = s3fs.S3FileSystem(key=KEY, secret=SECRET, client_kwargs={"endpoint_url": endpoint, "region_name": "us-east-1"})
    out = {"seq": [], "pq": []}
    for _ in range(runs):
        out["seq"].append(timed_read(fs, f"{BUCKET}/big.bin", size))
        out["pq"].append(read_table(f"{BUCKET}/big.parquet", filesystem=fs))
    print(json.dumps(out), flush=True)
    os._exit(0)  # skip the interpreter's teardown (see measure())


def read_table(path: str, filesystem=None) -> float:
    import pyarrow.parquet as pq

    t = time.perf_counter()
    tab = pq.read_table(path, filesystem=filesystem)
    dt = time.perf_counter() - t
    assert tab.num_rows > 0
    del tab
    return dt


def fio(path: str, rw: str, bs: str, jobs: int, seconds: int) -> dict:
    cmd = ["fio", "--name=b", f"--filename={path}", "--readonly", f"--rw={rw}", f"--bs={bs}",
           f"--numjobs={jobs}", "--time_based", f"--runtime={seconds}", "--ioengine=psync",
           "--group_reporting", "--output-format=json"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"fio failed: {r.stderr[-500:]}")
    j = json.loads(r.stdout[r.stdout.index("{"):])["jobs"][0]["read"]
    return {"iops": j["iops"], "gib_s": j["bw_bytes"] / (1 << 30)}


class Stage(CsdStage):
    """Everything one run starts (the seed-csd harness's stage: its work and tmpfs
    directories, torn down in reverse order by close()), plus FUSE mounts."""

    def __init__(self, a):
        super().__init__(a, prefix="locus-clients-")
        self.env = dict(os.environ)
        self.fuse_floor: Path | None = None

    def spawn(self, name: str, cmd: list[str], env=None) -> subprocess.Popen:
        logf = open(self.work / f"{name}.log", "wb")
        p = subprocess.Popen(cmd, env=env or self.env, stdout=logf, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True)

        def stop():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            logf.close()

        self.cleanups.append((name, stop))
        return p

    def mount_fs(self, name: str, cmd: list[str], mnt: Path, env=None):
        """Starts a FUSE daemon in the foreground on `mnt` and waits for the mount; it is
        unmounted (lazily, if the daemon left it) at teardown."""
        mnt.mkdir(parents=True, exist_ok=True)
        self.cleanups.append((f"{name} mount point", lambda: subprocess.run(
            ["fusermount3", "-u", "-z", str(mnt)], capture_output=True) if os.path.ismount(mnt) else None))
        p = self.spawn(name, cmd, env)
        for _ in range(300):
            if os.path.ismount(mnt) or p.poll() is not None:
                break
            time.sleep(0.1)
        if not os.path.ismount(mnt):
            raise RuntimeError(f"{name} did not mount: {(self.work / f'{name}.log').read_text()[-1500:]}")
        log(f"{name} mounted at {mnt}")

    def locus(self, *args) -> str:
        r = subprocess.run([self.a.locus_bin, *args], env=self.env, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"locus {' '.join(args)} failed: {r.stderr.strip()}")
        return r.stdout


def make_data(st: Stage, a) -> dict:
    """The 1 GiB file, the 1 GiB Parquet file and the tree of small files: on tmpfs (the
    floor's copies) and in MinIO."""
    import boto3
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from boto3.s3.transfer import TransferConfig

    rng = np.random.default_rng(11)
    big = st.shm / "big.bin"
    with open(big, "wb") as f:
        left = a.size
        while left:
            n = min(left, 64 << 20)
            f.write(rng.integers(0, 256, n, dtype=np.uint8).tobytes())
            left -= n
    rows = a.size // 64  # 8 float64 columns, no compression: about SIZE bytes
    cols = {f"c{i}": rng.random(rows) for i in range(8)}
    pq.write_table(pa.table(cols), st.shm / "big.parquet", compression="none", row_group_size=1 << 20)
    del cols
    s3 = boto3.client("s3", endpoint_url=st.upload_endpoint, aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                      region_name="us-east-1")
    s3.create_bucket(Bucket=BUCKET)
    cfg = TransferConfig(multipart_chunksize=64 << 20, max_concurrency=4)
    for name in ("big.bin", "big.parquet"):
        s3.upload_file(str(st.shm / name), BUCKET, name, Config=cfg)
    per_dir = 100
    names = [f"tree/d{i // per_dir:03d}/f{i % per_dir:03d}.txt" for i in range(a.files)]
    with ThreadPoolExecutor(32) as ex:
        list(ex.map(lambda k: s3.put_object(Bucket=BUCKET, Key=k, Body=k.encode()), names))
    log(f"data: {a.size:,} B file, {(st.shm / 'big.parquet').stat().st_size:,} B Parquet, {a.files:,} small files")
    return {"bin": str(big), "parquet": str(st.shm / "big.parquet"), "bin_bytes": a.size,
            "parquet_bytes": (st.shm / "big.parquet").stat().st_size}


def start_locus(st: Stage, a):
    rpc, web = netstage.free_port(), netstage.free_port()
    data = st.work / "locus"
    st.env = dict(os.environ, LOCUS_MASTER=f"127.0.0.1:{rpc}", LOCUS_SECURITY__TOKEN_FILE=str(data / "client.token"))
    p = st.spawn("locus", [a.locus_bin, "local", "start", "--data-dir", str(data), "--master", f"127.0.0.1:{rpc}",
                           "--workers", "1", "--mem-quota", "6GiB", "--no-gateway"],
                 env=dict(st.env, LOCUS_MASTER__WEB_ADDRESS=f"127.0.0.1:{web}",
                          LOCUS_WORKER__DATA_ADDRESS="127.0.0.1:0"))
    shm = "/dev/shm/locus" + "".join(c if c.isalnum() else "_" for c in str(data))
    st.cleanups.append(("locus tier", lambda: shutil.rmtree(shm, ignore_errors=True)))
    for _ in range(150):
        if p.poll() is not None:
            raise RuntimeError(f"locus did not start: {(st.work / 'locus.log').read_text()[-1500:]}")
        if subprocess.run([a.locus_bin, "report"], env=st.env, capture_output=True, timeout=30).returncode == 0:
            break
        time.sleep(0.2)
    st.locus("fs", "mount", MOUNT, f"s3://{BUCKET}", "--option", f"endpoint={st.endpoint}",
             "--option", f"access_key_id={KEY}", "--option", f"secret_access_key={SECRET}", "--sync-interval", "1h")
    for f in ("big.bin", "big.parquet"):
        st.locus("fs", "load", f"{MOUNT}/{f}")
        info = json.loads(st.locus("fs", "stat", "--json", f"{MOUNT}/{f}"))
        assert info.get("cached_fraction", 1.0) >= 1.0 or info.get("cached_bytes") == info.get("length"), info
    log("Locus: 1 worker, both files cached in MEM")


def peers_env(st: Stage) -> dict:
    # MinIO is plain HTTP: a CA bundle in the environment (AWS_CA_BUNDLE) only makes
    # rclone's S3 client fail to start.
    env = {k: v for k, v in st.env.items() if k != "AWS_CA_BUNDLE"}
    return dict(env, RCLONE_CONFIG_MINIO_TYPE="s3", RCLONE_CONFIG_MINIO_PROVIDER="Minio",
                RCLONE_CONFIG_MINIO_ENDPOINT=st.endpoint, RCLONE_CONFIG_MINIO_ACCESS_KEY_ID=KEY,
                RCLONE_CONFIG_MINIO_SECRET_ACCESS_KEY=SECRET, RCLONE_CONFIG_MINIO_REGION="us-east-1")


def mount_alluxio(st: Stage, a) -> Path | None:
    """Alluxio 2.9.6's FUSE mount: its master and worker (bench/alluxio/alluxio-up.sh: the
    bucket in MinIO as the root UFS, a 4 GB MEM tier, short-circuit reads on), then
    `alluxio.fuse.AlluxioFuse` (libfuse through Alluxio's JNI binding) over its root. None,
    saying why in the log, when either does not come up here."""
    mnt = st.work / "mnt-alluxio"
    try:
        cp, jopts = alluxio_up(Path(a.alluxio_dir), f"s3://{BUCKET}/", st.endpoint, "4GB", st.cleanups, peers_env(st))
        st.mount_fs("alluxio-fuse", ["java", "-Xmx1g", *jopts, "-cp", cp, "alluxio.fuse.AlluxioFuse",
                                     "--mount-point", str(mnt), "--alluxio-path", "/"], mnt, env=peers_env(st))
    except RuntimeError as e:
        log(f"Alluxio {ALLUXIO_VERSION} or its FUSE mount did not come up: {str(e)[-800:]}")
        return None
    return mnt


def run(a) -> dict:
    st = Stage(a)
    try:
        state = st.work / "net.json"
        st.cleanups.append(("netstage", lambda: netstage.down(state)))
        net = netstage.up(a.profile, a.minio, st.work / "net", state)
        st.endpoint = net["endpoint"]
        st.upload_endpoint = net.get("direct_endpoint", net["endpoint"])
        log(f"MinIO ({a.profile}) at {st.endpoint}")
        data = make_data(st, a)
        start_locus(st, a)
        mnt = st.work / "mnt-locus"
        st.mount_fs("locus-fuse", [a.locus_bin, "fuse", str(mnt), "--read-only"], mnt)
        fuse_root = mnt / MOUNT.strip("/")
        systems = {"locus-fuse": fuse_root}
        # The floor of a FUSE read: the same tmpfs file through bindfs (Debian's), a FUSE
        # file system that only passes reads through, with no storage layer behind it.
        if shutil.which("bindfs"):
            b = st.work / "mnt-bindfs"
            st.mount_fs("bindfs", ["bindfs", "-f", "-o", "ro", str(Path(data["bin"]).parent), str(b)], b)
            st.fuse_floor = b / Path(data["bin"]).name
        else:
            log("bindfs not found (apt-get install bindfs): no FUSE floor in this run")
        if not a.no_peers:
            r = st.work / "mnt-rclone"
            st.mount_fs("rclone", ["rclone", "mount", f"minio:{BUCKET}", str(r), "--read-only",
                                   "--vfs-cache-mode", "full", "--vfs-cache-max-size", "4G",
                                   "--cache-dir", str(st.work / "rclone-cache"), "--dir-cache-time", "1h"],
                        r, env=peers_env(st))
            systems["rclone"] = r
            pw = st.work / "s3fs.passwd"
            pw.write_text(f"{KEY}:{SECRET}\n")
            pw.chmod(0o600)
            s = st.work / "mnt-s3fs"
            st.mount_fs("s3fs-fuse", ["s3fs", BUCKET, str(s), "-f", "-o", f"url={st.endpoint}", "-o",
                                      "use_path_request_style", "-o", f"passwd_file={pw}", "-o", "ro"], s)
            systems["s3fs-fuse"] = s
            if not a.no_alluxio and (m := mount_alluxio(st, a)):
                systems["alluxio-fuse"] = m
        return measure(st, a, data, systems)
    finally:
        st.close()


def measure(st: Stage, a, data: dict, systems: dict) -> dict:
    import fsspec

    os.environ.update({k: v for k, v in st.env.items() if k.startswith("LOCUS_")})
    lfs = fsspec.filesystem("locus", skip_instance_cache=True)
    size = data["bin_bytes"]
    seq: dict[str, list[float]] = {}
    pq_t: dict[str, list[float]] = {}

    def add(d, k, v):
        d.setdefault(k, []).append(v)

    def py_read(fs, path):
        return timed_read(fs, path, size)

    # Warm the peers' caches (rclone's VFS cache, Alluxio's worker; s3fs keeps no bytes)
    # and every mount's metadata.
    for name, root in systems.items():
        dd(str(root / "big.bin"))
        read_table(str(root / "big.parquet"))
    for r in range(a.runs):
        log(f"sequential and PyArrow reads, run {r + 1}/{a.runs}")
        add(seq, "tmpfs (dd)", dd(data["bin"]))
        add(seq, "Locus native (fs cat)", timed_cmd([a.locus_bin, "fs", "cat", f"{MOUNT}/big.bin"], env=st.env))
        f = str(systems["locus-fuse"] / "big.bin")
        drop_pages(f)
        add(seq, "Locus FUSE (dd)", dd(f))
        add(seq, "Locus FUSE, kernel cache kept (dd)", dd(f))
        if st.fuse_floor:
            drop_pages(str(st.fuse_floor))
            add(seq, FUSE_FLOOR, dd(str(st.fuse_floor)))
        add(seq, "Locus Python (8 MiB reads)", py_read(lfs, f"{MOUNT}/big.bin"))
        for name in PEER_MOUNTS:
            if name in systems:
                f = str(systems[name] / "big.bin")
                drop_pages(f)
                add(seq, f"{name} (dd)", dd(f))
        add(pq_t, "tmpfs (local)", read_table(data["parquet"]))
        add(pq_t, "Locus locus://", read_table(f"{MOUNT}/big.parquet", filesystem=lfs))
        f = str(systems["locus-fuse"] / "big.parquet")
        drop_pages(f)
        add(pq_t, "Locus FUSE path", read_table(f))
        for name in PEER_MOUNTS:
            if name in systems:
                f = str(systems[name] / "big.parquet")
                drop_pages(f)
                add(pq_t, f"{name} path", read_table(f))

    if a.s3fs_python and not a.no_peers:
        # Python's s3fs lives in a venv of its own (its aiobotocore pins a botocore of its
        # own choosing): its runs come after the interleaved ones.
        log("Python s3fs")
        r = subprocess.run([a.s3fs_python, __file__, "--s3fs-reads", st.endpoint, str(a.runs), str(size)],
                           capture_output=True, text=True)
        try:
            # Its figures are printed before the interpreter's exit, which has been seen to
            # abort in a C++ destructor ("terminate called without an active exception").
            got = json.loads(r.stdout.strip().splitlines()[-1])
            seq["Python s3fs (8 MiB reads)"] = got["seq"]
            pq_t["Python s3fs"] = got["pq"]
        except (IndexError, ValueError, KeyError):
            log(f"Python s3fs failed (exit {r.returncode}): {r.stderr.strip()[-800:]}")

    log("fio")
    fio_rows = {}
    targets = {"tmpfs": data["bin"], "Locus FUSE": str(systems["locus-fuse"] / "big.bin")}
    for name in PEER_MOUNTS:
        if name in systems:
            targets[name] = str(systems[name] / "big.bin")
    for name, path in targets.items():
        row = {}
        for label, rw, bs, jobs in (("4k random, 1 job", "randread", "4k", 1), ("4k random, 8 jobs", "randread", "4k", 8),
                                    ("1M sequential", "read", "1M", 1)):
            if name in PEER_MOUNTS and jobs > 1:
                continue
            row[label] = fio(path, rw, bs, jobs, a.fio_seconds)
        fio_rows[name] = row

    log("metadata")
    meta: dict[str, list[float]] = {}
    tree = systems["locus-fuse"] / "tree"
    for r in range(a.runs):
        add(meta, "Locus native (fs ls -R)", timed_cmd([a.locus_bin, "fs", "ls", "-R", f"{MOUNT}/tree"], env=st.env))
        add(meta, "Locus FUSE (ls -lR)", timed_cmd(["ls", "-lR", str(tree)]))
        add(meta, "Locus FUSE (find)", timed_cmd(["find", str(tree)]))
    found = subprocess.run(["find", str(tree), "-type", "f"], capture_output=True, text=True).stdout.split()
    assert len(found) == a.files, f"find saw {len(found)} of {a.files} files"
    return {"seq": seq, "parquet": pq_t, "fio": fio_rows, "meta": meta, "data": data, "files": a.files,
            "runs": a.runs, "profile": a.profile}


def med(v: list[float]) -> float:
    return statistics.median(v)


def report(res: dict, out: Path, code: str):
    size = res["data"]["bin_bytes"]
    seq, pqt, meta = res["seq"], res["parquet"], res["meta"]
    native = med(seq["Locus native (fs cat)"])
    lines = [
        "# Clients: the FUSE mount and the Python client against the native client, tmpfs and the peers",
        "",
        f"2 cores, 24 GiB, {platform.processor() or platform.machine()}; code {code}; medians of {res['runs']} "
        f"runs, interleaved; MinIO behind the `{res['profile']}` profile for the peers and Locus's UFS. The file: "
        f"{size:,} bytes, cached in Locus's MEM tier (1 worker, co-located). Reads of the whole file; GiB/s = "
        f"size / median time.",
        "",
        "## Sequential read of the 1 GiB file",
        "",
        "| path | median s | GiB/s | native / path | goal |",
        "|---|---:|---:|---:|---|",
    ]
    goals = {"Locus FUSE (dd)": 1 / 1.3, "Locus Python (8 MiB reads)": 0.9}
    for k, v in seq.items():
        m = med(v)
        g = goals.get(k)
        verdict = "" if g is None else f">= {g:.2f}: {'pass' if native / m >= g else '**miss**'}"
        lines.append(f"| {k} | {m:.3f} | {size / m / (1 << 30):.2f} | {native / m:.2f} | {verdict} |")
    if FUSE_FLOOR in seq:
        f, fl = med(seq["Locus FUSE (dd)"]), med(seq[FUSE_FLOOR])
        lines += ["", f"The FUSE floor, bindfs passing reads of the tmpfs file through FUSE with no storage layer "
                      f"behind it (kernel pages dropped first, as for Locus's mount), same runs: native / floor "
                      f"{native / fl:.2f}; Locus's FUSE reads at {fl / f:.2f}x the floor's speed."]
    tm = med(pqt["tmpfs (local)"])
    lines += ["", f"## `pq.read_table` of the Parquet file ({res['data']['parquet_bytes']:,} bytes, 8 float64 columns)",
              "", "| path | median s | path / tmpfs | goal |", "|---|---:|---:|---|"]
    for k, v in pqt.items():
        m = med(v)
        verdict = f"<= 1.10: {'pass' if m / tm <= 1.1 else '**miss**'}" if k == "Locus locus://" else ""
        lines.append(f"| {k} | {m:.3f} | {m / tm:.2f} | {verdict} |")
    lines += ["", "## fio (psync, time-based)", "", "| target | test | IOPS | GiB/s |", "|---|---|---:|---:|"]
    for name, row in res["fio"].items():
        for label, r in row.items():
            lines.append(f"| {name} | {label} | {r['iops']:,.0f} | {r['gib_s']:.2f} |")
    lines += ["", f"## Metadata over {res['files']:,} files (100 directories)", "", "| command | median s |", "|---|---:|"]
    for k, v in meta.items():
        lines.append(f"| {k} | {med(v):.3f} |")
    peers = [k for k in seq if not k.startswith(("Locus", "tmpfs", "FUSE floor"))]
    if peers:
        best_seq = min(med(seq[k]) for k in seq if k.startswith("Locus") and "native" not in k)
        fuse_rand = res["fio"]["Locus FUSE"]["4k random, 1 job"]["iops"]
        lines += ["", "## Locus against the peers", "", "| comparison | Locus | best peer | faster |", "|---|---:|---:|---|"]
        bp = min(med(seq[k]) for k in peers)
        lines.append(f"| cached sequential read, s | {best_seq:.3f} | {bp:.3f} | {'yes' if best_seq < bp else '**no**'} |")
        pr = [v["4k random, 1 job"]["iops"] for k, v in res["fio"].items() if k in PEER_MOUNTS]
        if pr:
            lines.append(f"| 4k random reads, IOPS (1 job) | {fuse_rand:,.0f} | {max(pr):,.0f} | "
                         f"{'yes' if fuse_rand > max(pr) else '**no**'} |")
        lp = min(med(pqt["Locus locus://"]), med(pqt["Locus FUSE path"]))
        pp = min(med(v) for k, v in pqt.items() if not k.startswith(("Locus", "tmpfs")))
        lines.append(f"| `pq.read_table`, s | {lp:.3f} | {pp:.3f} | {'yes' if lp < pp else '**no**'} |")
    out.write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps(res, indent=1) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(1, 2, figsize=(13, 5))
        ks = list(seq)
        ax[0].barh(ks, [size / med(seq[k]) / (1 << 30) for k in ks], color="tab:blue")
        ax[0].set_xlabel("GiB/s (sequential read of 1 GiB, cached)")
        kp = list(pqt)
        ax[1].barh(kp, [med(pqt[k]) for k in kp], color="tab:orange")
        ax[1].set_xlabel("seconds (pq.read_table, 1 GiB Parquet)")
        fig.tight_layout()
        fig.savefig(out.with_suffix(".png"), dpi=90)
    except ImportError:
        pass
    print("\n".join(lines))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    if len(sys.argv) == 5 and sys.argv[1] == "--s3fs-reads":
        return s3fs_reads(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    p.add_argument("--locus-bin", required=True, help="the locus binary (a release build)")
    p.add_argument("--minio", required=True, help="the MinIO server binary")
    p.add_argument("--s3fs-python", help="a Python with s3fs installed, for the Python s3fs peer")
    p.add_argument("--profile", default="lan", choices=list(netstage.PROFILES), help="link to MinIO (default lan)")
    p.add_argument("--size", default="1GiB", help="size of the read file and the Parquet file (default 1GiB)")
    p.add_argument("--runs", type=int, default=5, help="timed runs per figure (default 5)")
    p.add_argument("--files", type=int, default=10_000, help="small files for the metadata test (default 10000)")
    p.add_argument("--fio-seconds", type=int, default=10, help="seconds per fio test (default 10)")
    p.add_argument("--no-peers", action="store_true", help="skip rclone, s3fs-fuse, Alluxio's FUSE and Python s3fs")
    p.add_argument("--no-alluxio", action="store_true", help="skip Alluxio's FUSE (its jars come from Maven Central)")
    p.add_argument("--alluxio-dir", default=str(Path(os.environ.get("LOCUS_TOOLS_DIR", Path.home() / ".cache/locus-tools"))
                                                / f"alluxio-{ALLUXIO_VERSION}"),
                   help="Alluxio's directory (its jars, configuration and logs; default in LOCUS_TOOLS_DIR)")
    p.add_argument("--quick", action="store_true", help="64 MiB, 2 runs, 1,000 files, 2 s fio: a smoke test")
    p.add_argument("--work-dir", help="where the run's files go (default: the system's temporary directory)")
    p.add_argument("--out", default=str(HERE / "results" / "clients.md"), help="the Markdown report")
    p.add_argument("--code", default="", help="the code's commit, for the report")
    a = p.parse_args()
    if a.quick:
        a.size, a.runs, a.files, a.fio_seconds = "64MiB", 2, 1000, 2
    a.size = parse_size(a.size)
    res = run(a)
    report(res, Path(a.out), a.code)


if __name__ == "__main__":
    main()
