"""`locus fuse MOUNTPOINT` on a real mount, used by real programs: cat, dd, cp -r, ls -lR,
find, rsync, tar, Python's open, pandas, sqlite3 (read-only) and fio; the errno values
tools expect; user metadata as extended attributes; the kernel's page cache dropped when
a file changes; and a clean unmount on SIGTERM, or `fusermount3 -u` after kill -9."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from conftest import LOCUS_BIN, MiB, gw_client, sha256, wait_until

pytestmark = pytest.mark.skipif(
    not (os.path.exists("/dev/fuse") and os.geteuid() == 0), reason="needs /dev/fuse and root to mount")


def have(tool: str) -> bool:
    return shutil.which(tool) is not None


class Mount:
    """`locus fuse` of a cluster at a directory, as a subprocess."""

    def __init__(self, cluster, mnt: Path, *args):
        self.cluster, self.mnt = cluster, mnt
        mnt.mkdir(parents=True, exist_ok=True)
        self.log = open(mnt.parent / f"{mnt.name}.log", "ab")
        self.proc = subprocess.Popen([str(LOCUS_BIN), "--master", cluster.master, "fuse", str(mnt), *args],
                                     stdout=self.log, stderr=subprocess.STDOUT, env=cluster.env())
        wait_until(lambda: os.path.ismount(mnt) or self.proc.poll() is not None, timeout=30, what="the mount")
        assert self.proc.poll() is None, self.log_tail()

    def log_tail(self) -> str:
        return Path(self.log.name).read_text(errors="replace")[-3000:]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=20)
        if os.path.ismount(self.mnt):
            subprocess.run(["fusermount3", "-u", str(self.mnt)], capture_output=True)
            subprocess.run(["umount", "-l", str(self.mnt)], capture_output=True)
        self.log.close()


@pytest.fixture
def mount(cluster, tmp):
    made = []

    def make(*args, name="mnt"):
        m = Mount(cluster, tmp / name, *args)
        made.append(m)
        return m

    yield make
    for m in made:
        m.stop()


def run(*cmd, **kw):
    return subprocess.run([str(c) for c in cmd], capture_output=True, timeout=120, **kw)


def test_posix_tools_on_the_mount(cluster, mount, tmp):
    m = mount()
    mnt = m.mnt
    data = os.urandom(20 * MiB + 7)
    (tmp / "src.bin").write_bytes(data)
    cluster.ok("fs", "put", tmp / "src.bin", "/data/big.bin")

    # Reading: cat, dd with large blocks, ls -lR, find.
    assert sha256(run("cat", mnt / "data/big.bin").stdout) == sha256(data)
    r = run("dd", f"if={mnt}/data/big.bin", "of=/dev/null", "bs=1M")
    assert r.returncode == 0 and f"{len(data)} bytes".encode() in r.stderr, r.stderr
    assert str(len(data)).encode() in run("ls", "-lR", mnt).stdout
    assert run("find", mnt, "-type", "f").stdout.decode().split() == [f"{mnt}/data/big.bin"]
    assert os.stat(mnt / "data/big.bin").st_size == len(data)

    # Writing: Python, cp -r, tar, rsync; the cluster sees every file.
    with open(mnt / "py.txt", "w") as f:
        f.write("line\n" * 1000)
    assert cluster.cat("/py.txt") == b"line\n" * 1000
    tree = tmp / "tree"
    (tree / "sub").mkdir(parents=True)
    for i in range(5):
        (tree / f"f{i}.bin").write_bytes(os.urandom(100_000 + i))
    (tree / "sub" / "g.txt").write_text("g")
    assert run("cp", "-r", tree, mnt / "copy").returncode == 0
    for p in tree.rglob("*"):
        if p.is_file():
            assert cluster.cat(f"/copy/{p.relative_to(tree)}") == p.read_bytes(), p
    r = run("tar", "-cf", tmp / "t.tar", "-C", mnt, "copy")
    assert r.returncode == 0, r.stderr
    assert sorted(run("tar", "-tf", tmp / "t.tar").stdout.decode().split()) == sorted(
        ["copy/", "copy/sub/", "copy/sub/g.txt"] + [f"copy/f{i}.bin" for i in range(5)])
    if have("rsync"):
        r = run("rsync", "-a", f"{tree}/", f"{mnt}/rs/")
        assert r.returncode == 0, r.stderr
        assert cluster.cat("/rs/sub/g.txt") == b"g"
        # A second rsync replaces changed files (a temporary file renamed over the old).
        (tree / "sub" / "g.txt").write_text("g2")
        r = run("rsync", "-a", f"{tree}/", f"{mnt}/rs/")
        assert r.returncode == 0, r.stderr
        assert cluster.cat("/rs/sub/g.txt") == b"g2"

    # Namespace changes.
    os.mkdir(mnt / "d")
    os.rename(mnt / "py.txt", mnt / "d" / "moved.txt")
    assert cluster.cat("/d/moved.txt") == b"line\n" * 1000
    os.unlink(mnt / "d" / "moved.txt")
    os.rmdir(mnt / "d")
    assert cluster.run("fs", "stat", "/d").returncode == 3

    # pandas on the mount path, and sqlite3 reading a database file.
    pd = pytest.importorskip("pandas")
    pd.DataFrame({"a": range(1000), "b": [x * 0.5 for x in range(1000)]}).to_csv(tmp / "x.csv", index=False)
    cluster.ok("fs", "put", tmp / "x.csv", "/x.csv")
    assert pd.read_csv(mnt / "x.csv")["b"].sum() == sum(x * 0.5 for x in range(1000))
    db = tmp / "x.db"
    con = sqlite3.connect(db)
    con.execute("create table t (k integer, v text)")
    con.executemany("insert into t values (?, ?)", [(i, f"v{i}") for i in range(5000)])
    con.commit()
    con.close()
    cluster.ok("fs", "put", db, "/x.db")
    ro = sqlite3.connect(f"file:{mnt}/x.db?mode=ro", uri=True)
    assert ro.execute("select count(*), sum(k) from t").fetchone() == (5000, sum(range(5000)))
    ro.close()


def test_errno_values(cluster, mount, tmp, s3, bucket, minio):
    m = mount()
    mnt = m.mnt
    cluster.ok("fs", "put", "-", "/f.txt", input=b"f")
    os.mkdir(mnt / "full")
    (mnt / "full" / "x").write_bytes(b"x")

    def err(fn, *a):
        with pytest.raises(OSError) as ei:
            fn(*a)
        return ei.value.errno

    assert err(open, mnt / "nope") == errno.ENOENT
    assert err(os.mkdir, mnt / "full") == errno.EEXIST
    assert err(os.rmdir, mnt / "full") == errno.ENOTEMPTY
    assert err(os.rmdir, mnt / "f.txt") == errno.ENOTDIR
    assert err(os.unlink, mnt / "full") == errno.EISDIR
    assert err(os.listdir, mnt / "f.txt") == errno.ENOTDIR
    assert err(open, mnt / "f.txt" / "under", "w") == errno.ENOTDIR
    # Files are written whole: appending, or writing into a file that exists, is refused.
    assert err(open, mnt / "f.txt", "ab") in (errno.EPERM, errno.ENOTSUP)
    assert err(open, mnt / "f.txt", "r+b") in (errno.EPERM, errno.ENOTSUP)
    assert err(os.link, mnt / "f.txt", mnt / "hard") in (errno.EPERM, errno.ENOTSUP)
    assert err(os.symlink, "f.txt", mnt / "soft") in (errno.EPERM, errno.ENOTSUP)
    with open(mnt / "w.bin", "wb", buffering=0) as f:
        f.write(b"abc")
        f.seek(0)
        with pytest.raises(OSError) as ei:
            f.write(b"x")  # over what was written
        assert ei.value.errno in (errno.EPERM, errno.ENOTSUP)
    assert cluster.cat("/w.bin") == b"abc"
    # A read-only Locus mount (an S3 bucket mounted --readonly) answers EROFS.
    s3.put_object(Bucket=bucket, Key="ro/x.txt", Body=b"ro")
    cluster.mount_s3("/ro", bucket, "ro", minio, "1s", "--readonly")
    assert (mnt / "ro" / "x.txt").read_bytes() == b"ro"
    assert err(open, mnt / "ro" / "new.txt", "w") == errno.EROFS
    assert err(os.unlink, mnt / "ro" / "x.txt") == errno.EROFS
    # The whole FUSE mount read-only.
    r = mount("--read-only", name="ro-mnt")
    assert (r.mnt / "f.txt").read_bytes() == b"f"
    assert err(open, r.mnt / "g.txt", "w") == errno.EROFS
    assert err(os.mkdir, r.mnt / "dir") == errno.EROFS
    # Nothing of the refused writes reached the cluster; the servers are up.
    assert cluster.run("fs", "stat", "/g.txt").returncode == 3
    assert cluster.alive() and m.proc.poll() is None


def test_user_metadata_as_xattrs_and_new_versions(cluster, mount, tmp):
    m = mount("--attr-timeout", "200ms")
    gw = gw_client(f"http://{cluster.gateway}")
    wait_until(lambda: run("curl", "-s", f"http://{cluster.gateway}").returncode == 0, timeout=20, what="gateway")
    gw.create_bucket(Bucket="meta-b")
    gw.put_object(Bucket="meta-b", Key="o.txt", Body=b"v1", Metadata={"owner": "ann", "team": "t1"})
    p = m.mnt / "meta-b" / "o.txt"
    assert sorted(os.listxattr(p)) == ["user.owner", "user.team"]
    assert os.getxattr(p, "user.owner") == b"ann"
    with pytest.raises(OSError) as ei:
        os.getxattr(p, "user.nope")
    assert ei.value.errno == errno.ENODATA
    with pytest.raises(OSError) as ei:
        os.setxattr(p, "user.x", b"1")
    assert ei.value.errno in (errno.ENOTSUP, errno.EPERM)
    # The kernel caches the pages it read; a new version is read anew.
    assert p.read_bytes() == b"v1"
    assert p.read_bytes() == b"v1"
    gw.put_object(Bucket="meta-b", Key="o.txt", Body=b"version two")
    wait_until(lambda: p.read_bytes() == b"version two", timeout=5, what="the new version through the mount")


def test_fio_random_and_sequential_reads(cluster, mount, tmp):
    if not have("fio"):
        pytest.skip("fio is not installed")
    m = mount()
    data = os.urandom(32 * MiB)
    (tmp / "fio.bin").write_bytes(data)
    cluster.ok("fs", "put", tmp / "fio.bin", "/fio.bin")
    cluster.ok("fs", "load", "/fio.bin")
    for args in (["--rw=randread", "--bs=4k", "--numjobs=8"], ["--rw=read", "--bs=1M", "--numjobs=1"]):
        r = run("fio", "--name=t", f"--filename={m.mnt}/fio.bin", "--readonly", "--size=32M", "--runtime=3",
                "--time_based", "--ioengine=psync", "--group_reporting", "--output-format=terse", *args)
        assert r.returncode == 0, r.stderr.decode()
        fields = r.stdout.decode().strip().splitlines()[-1].split(";")
        assert int(fields[7]) > 0, fields[:10]  # read IOPS


def test_sigterm_unmounts_and_kill9_is_freed_by_fusermount(cluster, mount, tmp):
    m = mount(name="a")
    cluster.ok("fs", "put", "-", "/k.txt", input=b"k")
    assert (m.mnt / "k.txt").read_bytes() == b"k"
    m.proc.send_signal(signal.SIGTERM)
    assert m.proc.wait(timeout=20) == 0
    assert not os.path.ismount(m.mnt)

    m2 = mount(name="b")
    assert (m2.mnt / "k.txt").read_bytes() == b"k"
    m2.proc.kill()
    m2.proc.wait(timeout=10)
    # The kernel answers "not connected" instead of hanging...
    with pytest.raises(OSError) as ei:
        os.listdir(m2.mnt)
    assert ei.value.errno == errno.ENOTCONN
    # ...and fusermount3 -u frees the mount point for the next mount.
    if have("fusermount3"):
        assert run("fusermount3", "-u", m2.mnt).returncode == 0
    else:
        assert run("umount", m2.mnt).returncode == 0
    assert not os.path.ismount(m2.mnt)
    m3 = mount(name="b")
    assert (m3.mnt / "k.txt").read_bytes() == b"k"


def test_a_child_closing_an_inherited_descriptor_does_not_end_the_parents_write(cluster, mount, tmp):
    """A program that starts a subprocess while it writes a file: the child inherits the
    descriptor and closes it (at exec, or as `close_fds` does), and the kernel sends the
    mount a `flush` for that close. The file is still open in the writer, which goes on
    writing: nothing it writes is refused or lost."""
    m = mount()
    data = os.urandom(3 * MiB)
    for how in ("fork", "subprocess"):
        p = m.mnt / f"forked-{how}.bin"
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, data[:MiB])
        if how == "fork":
            pid = os.fork()
            if pid == 0:
                os.close(fd)  # the child's copy only
                os._exit(0)
            assert os.waitpid(pid, 0)[1] == 0
        else:  # close_fds=True: the child closes every inherited descriptor before exec
            os.set_inheritable(fd, True)
            assert subprocess.run(["true"], close_fds=True, pass_fds=(fd,)).returncode == 0
            assert subprocess.run(["true"], close_fds=True).returncode == 0
        os.write(fd, data[MiB:2 * MiB])
        os.write(fd, data[2 * MiB:])
        os.close(fd)
        assert p.read_bytes() == data, how
