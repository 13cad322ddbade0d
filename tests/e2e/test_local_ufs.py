"""put/get/mkdir/mv/rm on the default UFS (file://<data-dir>/ufs mounted at /)."""

from __future__ import annotations

import json
import os

from conftest import MiB, assert_one_line_error, sha256


def test_put_get_mkdir_mv_on_local_ufs(cluster, tmp):
    c = cluster
    ufs = c.ufs_dir
    mounts = [json.loads(x) for x in c.ok("fs", "mount", "--json").decode().splitlines()]
    assert [(m["path"], m["uri"]) for m in mounts] == [("/", f"file://{ufs}")], mounts

    # put from a file: acknowledged from worker memory (ASYNC_THROUGH, the default),
    # then persisted to <data-dir>/ufs; `fs persist` waits for that.
    data = os.urandom(9 * MiB + 3)  # crosses an 8 MiB block
    src = tmp / "src.bin"
    src.write_bytes(data)
    out = c.ok("fs", "put", src, "/dir/a.bin").decode()
    assert out.strip().startswith(f"wrote /dir/a.bin ({len(data)} bytes, "), out
    assert sha256(c.cat("/dir/a.bin")) == sha256(data), "readable at once, from the cache"
    assert c.ok("fs", "persist", "/dir/a.bin").decode().strip() == "/dir/a.bin: PERSISTED"
    assert (ufs / "dir" / "a.bin").read_bytes() == data
    assert sha256(c.cat("/dir/a.bin")) == sha256(data)
    dst = tmp / "got.bin"
    c.ok("fs", "get", "/dir/a.bin", dst)
    assert dst.read_bytes() == data
    st = c.stat("/dir/a.bin")
    assert st["length"] == len(data) and st["cached_fraction"] == 1.0

    # put from stdin.
    c.ok("fs", "put", "-", "/b.txt", input=b"from stdin\n")
    c.ok("fs", "persist", "/b.txt")
    assert (ufs / "b.txt").read_bytes() == b"from stdin\n"
    assert c.cat("/b.txt") == b"from stdin\n"

    # put over an existing file needs --overwrite.
    r = c.run("fs", "put", "-", "/b.txt", input=b"second")
    assert_one_line_error(r, 4)
    assert (ufs / "b.txt").read_bytes() == b"from stdin\n"
    c.ok("fs", "put", "--overwrite", "-", "/b.txt", input=b"second")
    c.ok("fs", "persist", "/b.txt")
    assert (ufs / "b.txt").read_bytes() == b"second"
    assert c.cat("/b.txt") == b"second"

    # empty file.
    c.ok("fs", "put", "-", "/empty", input=b"")
    c.ok("fs", "persist", "/empty")
    assert (ufs / "empty").read_bytes() == b""
    assert c.cat("/empty") == b""
    assert c.stat("/empty")["length"] == 0

    # mkdir.
    r = c.run("fs", "mkdir", "/x/y/z")
    assert_one_line_error(r, 3)
    assert not (ufs / "x").exists()
    c.ok("fs", "mkdir", "-p", "/x/y/z")
    assert (ufs / "x" / "y" / "z").is_dir()
    r = c.run("fs", "mkdir", "/x")
    assert_one_line_error(r, 4)
    c.ok("fs", "mkdir", "-p", "/x/y")  # -p on an existing directory is fine

    # mv a file into the new directory.
    c.ok("fs", "mv", "/dir/a.bin", "/x/y/z/a2.bin")
    assert not (ufs / "dir" / "a.bin").exists()
    assert (ufs / "x" / "y" / "z" / "a2.bin").read_bytes() == data
    assert sha256(c.cat("/x/y/z/a2.bin")) == sha256(data)
    assert_one_line_error(c.run("fs", "cat", "/dir/a.bin"), 3)
    # mv onto an existing path is refused.
    assert_one_line_error(c.run("fs", "mv", "/b.txt", "/x/y/z/a2.bin"), 4)
    assert (ufs / "b.txt").exists()
    # mv a directory.
    c.ok("fs", "mv", "/x/y", "/x/w")
    assert (ufs / "x" / "w" / "z" / "a2.bin").read_bytes() == data
    assert not (ufs / "x" / "y").exists()
    assert sha256(c.cat("/x/w/z/a2.bin")) == sha256(data)

    # listings agree with the UFS.
    entries = {e["path"]: e for e in c.ls_json("/", recursive=True)}
    assert {"/dir", "/b.txt", "/empty", "/x", "/x/w", "/x/w/z", "/x/w/z/a2.bin"} <= set(entries), entries
    assert entries["/x/w/z/a2.bin"]["length"] == len(data)

    # A file written straight into the UFS directory is found by path.
    (ufs / "direct.txt").write_bytes(b"written outside locus")
    assert c.cat("/direct.txt") == b"written outside locus"

    # Directories are not files.
    (ufs / "d2").mkdir()
    assert_one_line_error(c.run("fs", "cat", "/d2"))
    assert_one_line_error(c.run("fs", "put", "-", "/d2", input=b"x"))
    assert (ufs / "d2").is_dir()


def test_rm_on_local_ufs(cluster):
    """rm deletes from the UFS and from the namespace, and reports success."""
    c = cluster
    ufs = c.ufs_dir
    c.ok("fs", "put", "-", "/x/w/z/a2.bin", input=b"a2")
    c.ok("fs", "put", "-", "/b.txt", input=b"b")
    c.ok("fs", "persist", "/x/w/z/a2.bin")
    c.ok("fs", "persist", "/b.txt")
    c.ok("fs", "mkdir", "/dir")
    assert (ufs / "x" / "w" / "z" / "a2.bin").exists() and (ufs / "dir").is_dir()
    assert c.cat("/x/w/z/a2.bin") == b"a2"  # cached since the write
    c.wait_report(lambda r: r["workers"][0]["tiers"][0]["blocks"] == 2, what="the written blocks to be cached")

    # rm: files, empty directories, trees with -R only.
    assert_one_line_error(c.run("fs", "rm", "/x"))
    assert (ufs / "x" / "w" / "z" / "a2.bin").exists()
    c.ok("fs", "rm", "-R", "/x")
    assert not (ufs / "x").exists()
    assert_one_line_error(c.run("fs", "cat", "/x/w/z/a2.bin"), 3)
    c.ok("fs", "rm", "/b.txt")
    assert not (ufs / "b.txt").exists()
    c.ok("fs", "rm", "/dir")
    assert not (ufs / "dir").exists()
    assert_one_line_error(c.run("fs", "rm", "/nothing-here"), 3)
    assert c.ls_json("/") == []

    # The namespace and the UFS agree afterwards, and the cached block is gone.
    # (.locus-tmp holds writes in flight, renamed into place on close: none are left.)
    assert sorted(p.name for p in ufs.iterdir() if p.name != ".locus-tmp") == []
    assert list((ufs / ".locus-tmp").iterdir()) == []
    c.wait_report(lambda r: r["workers"][0]["tiers"][0]["blocks"] == 0, what="the removed file's block to go")
