"""Metadata search (issue 25): `GET /bucket?search=WHERE` through the gateway with boto3
(an event hook adds the parameter and SigV4 signs it), curl with SigV4 and the CLI
(`locus fs search`, `--json`, `--count`, `--limit`, `--sql`), checked against a
brute-force evaluation of the same clause over the same objects: every attribute and
operator, AND/OR/parentheses, LIKE with and without a literal prefix and with /i,
pagination (V1 marker, V2 token, prefix, delimiter); changes visible as soon as they are
acknowledged (put, copy, tagging, overwrite, delete, rename); Locus's own attributes;
inventory imports (S3 Inventory CSV with manifest.json, JSON lines, Parquet), re-imported
idempotently; and errors as InvalidArgument / exit code 2."""

from __future__ import annotations

import datetime as dt
import gzip
import hashlib
import json
import random
import re
import subprocess
import urllib.parse

import pytest
from botocore.exceptions import ClientError

from conftest import GW_KEY, GW_SECRET, _port_open, assert_one_line_error, gw_client, wait_until

TYPES = ["image/png", "text/csv", "application/gzip", "application/json"]
OWNERS = [f"user-{i}" for i in range(6)]


class Searcher:
    """A boto3 client whose listings carry `?search=` (added before signing)."""

    def __init__(self, endpoint: str):
        self.s3 = gw_client(endpoint)
        self.clause: str | None = None
        for op in ("ListObjectsV2", "ListObjects"):
            self.s3.meta.events.register(f"before-sign.s3.{op}", self._add)

    def _add(self, request, **_):
        if self.clause is not None:
            sep = "&" if "?" in request.url else "?"
            request.url += sep + "search=" + urllib.parse.quote(self.clause, safe="")

    def v2(self, bucket: str, clause: str, page: int = 1000, **kw) -> tuple[list[str], list[str]]:
        """Every matching key (and common prefix), page by page with ListObjectsV2."""
        self.clause = clause
        keys, prefixes, token = [], [], None
        try:
            while True:
                args = dict(Bucket=bucket, MaxKeys=page, **kw)
                if token:
                    args["ContinuationToken"] = token
                r = self.s3.list_objects_v2(**args)
                got = [o["Key"] for o in r.get("Contents", [])]
                assert len(got) + len(r.get("CommonPrefixes", [])) <= page
                keys += got
                prefixes += [p["Prefix"] for p in r.get("CommonPrefixes", [])]
                if not r["IsTruncated"]:
                    return keys, prefixes
                token = r["NextContinuationToken"]
        finally:
            self.clause = None

    def v1(self, bucket: str, clause: str, page: int, **kw) -> tuple[list[str], list[str]]:
        self.clause = clause
        keys, prefixes, marker = [], [], ""
        try:
            while True:
                r = self.s3.list_objects(Bucket=bucket, MaxKeys=page, Marker=marker, **kw)
                keys += [o["Key"] for o in r.get("Contents", [])]
                prefixes += [p["Prefix"] for p in r.get("CommonPrefixes", [])]
                if not r["IsTruncated"]:
                    return keys, prefixes
                marker = r["NextMarker"]
        finally:
            self.clause = None


# ------------------------------------------------------------------ brute force

def _num(s: str):
    try:
        return float(s) if re.fullmatch(r"[-+0-9.eE]+", s) else None
    except ValueError:
        return None


def _ms(s: str) -> int:
    if "T" not in s:
        s += "T00:00:00Z"
    return int(dt.datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp() * 1000)


def _value(o: dict, attr: str):
    a = attr.lower()
    if a == "key":
        return o["key"]
    if a in ("content-length", "size"):
        return o["size"]
    if a == "last-modified":
        return o["mtime"]
    if a == "content-type":
        return o["ct"]
    if a == "etag":
        return o["etag"]
    if a.startswith("x-amz-meta-"):
        return o["meta"].get(a[len("x-amz-meta-"):])
    if attr.startswith("tags."):
        return o["tags"].get(attr[5:])
    raise KeyError(attr)


def evaluate(tree, o: dict) -> bool:
    kind = tree[0]
    if kind == "and":
        return all(evaluate(t, o) for t in tree[1])
    if kind == "or":
        return any(evaluate(t, o) for t in tree[1])
    if kind == "like":
        _, attr, pat = tree
        v = _value(o, attr)
        flags = 0
        m = re.fullmatch(r"/(.*)/([a-z]*)", pat, re.S)
        if m:
            pat = m.group(1)
            flags = re.I if "i" in m.group(2) else 0
        return v is not None and re.search(pat, str(v), flags) is not None
    _, attr, op, lit = tree
    v = _value(o, attr)
    if v is None:
        return op in ("!=", "<>")
    a = attr.lower()
    if a in ("content-length", "size"):
        x, y = float(v), float(lit)
    elif a == "last-modified":
        x, y = v, _ms(lit)
    elif op in ("=", "!=", "<>"):
        x, y = v, lit
    else:
        nx, ny = _num(v), _num(lit)
        x, y = (nx, ny) if nx is not None and ny is not None else (v, lit)
    return {"=": x == y, "!=": x != y, "<>": x != y, "<": x < y, ">": x > y, "<=": x <= y, ">=": x >= y}[op]


def render(tree) -> str:
    kind = tree[0]
    if kind in ("and", "or"):
        return f" {kind.upper()} ".join(f"({render(t)})" for t in tree[1])
    if kind == "like":
        return f'{tree[1]} LIKE "{tree[2]}"'
    _, attr, op, lit = tree
    return f'{attr} {op} "{lit}"' if random.random() < 0.5 else f"{attr} {op} {lit}"


def brute(objs: dict, tree, prefix: str = "") -> list[str]:
    return sorted(k for k, o in objs.items() if k.startswith(prefix) and evaluate(tree, o))


# ------------------------------------------------------------------ fixtures

@pytest.fixture(scope="module")
def corpus(gateway):
    """A bucket of objects with varied sizes, types, metadata and tags, and its model."""
    rnd = random.Random(25)
    s3 = gateway.s3
    bucket = gateway.new_bucket()
    objs = {}
    for i in range(140):
        top = rnd.choice(["logs", "images", "data", "a.b", "a"])
        key = f"{top}/{rnd.choice(['2026-01-01', '2026-01-02', 'x', 'Y'])}/obj-{i:03d}.{rnd.choice(['gz', 'png', 'csv'])}"
        size = rnd.choice([0, 1, 999, 1000, 1001, 4096]) + rnd.randrange(3)
        meta = {}
        for name in rnd.sample(["owner", "team", "n", "color"], rnd.randrange(0, 4)):
            meta[name] = {"owner": rnd.choice(OWNERS), "n": str(rnd.randrange(200)),
                          "team": rnd.choice(["red", "blue", "ice-cream"]),
                          "color": rnd.choice(["Blue", "green"])}[name]
        tags = {n: f"{n[0]}{rnd.randrange(4)}" for n in rnd.sample(["project", "env"], rnd.randrange(0, 3))}
        ct = rnd.choice(TYPES)
        args = dict(Bucket=bucket, Key=key, Body=bytes(size), ContentType=ct, Metadata=meta)
        if tags:
            args["Tagging"] = urllib.parse.urlencode(tags)
        r = s3.put_object(**args)
        objs[key] = {"key": key, "size": size, "ct": ct, "meta": meta, "tags": tags,
                     "etag": r["ETag"].strip('"')}
    for o in s3.list_objects_v2(Bucket=bucket)["Contents"]:
        objs[o["Key"]]["mtime"] = int(o["LastModified"].timestamp() * 1000)
    return gateway, bucket, objs


def _queries(objs: dict) -> list:
    mtimes = sorted(o["mtime"] for o in objs.values())
    mid = dt.datetime.fromtimestamp(mtimes[len(mtimes) // 2] / 1000, dt.timezone.utc)
    mid_s = mid.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    etag = next(iter(objs.values()))["etag"]
    qs = []
    for op in ["=", "!=", "<>", "<", ">", "<=", ">="]:
        qs += [
            ("cmp", "key", op, "data/x/obj-010.csv"),
            ("cmp", "content-length", op, "1000"),
            ("cmp", "last-modified", op, mid_s),
            ("cmp", "content-type", op, "text/csv"),
            ("cmp", "etag", op, etag),
            ("cmp", "x-amz-meta-owner", op, "user-3"),
            ("cmp", "x-amz-meta-n", op, "100"),
            ("cmp", "tags.project", op, "p2"),
        ]
    qs += [
        ("cmp", "size", ">", "999"),
        ("cmp", "last-modified", ">=", mid.date().isoformat()),
        ("like", "key", "^logs/2026-01-0[12]/"),
        ("like", "key", "^a\\.b/"),
        ("like", "key", "/^DATA/i"),
        ("like", "key", "obj-01.\\.png$"),
        ("like", "content-type", "^image/"),
        ("like", "x-amz-meta-team", "ice-.*"),
        ("like", "x-amz-meta-color", "/^blue$/i"),
        ("like", "tags.env", "^e[0-1]$"),
        ("and", [("cmp", "tags.project", "=", "p1"), ("cmp", "content-length", ">", "500")]),
        ("or", [("cmp", "x-amz-meta-team", "=", "red"), ("cmp", "tags.env", "=", "e3")]),
        ("and", [("or", [("cmp", "content-type", "=", "image/png"), ("like", "key", "^logs/")]),
                 ("cmp", "x-amz-meta-owner", "!=", "user-1")]),
        ("or", [("and", [("like", "key", "^images/"), ("cmp", "size", "<", "1000")]),
                ("cmp", "etag", "=", etag)]),
        ("cmp", "X-Amz-Meta-Owner", "=", "user-2"),
    ]
    return qs


# ------------------------------------------------------------------ tests

def test_every_attribute_and_operator_matches_brute_force(corpus):
    gateway, bucket, objs = corpus
    s = Searcher(gateway.endpoint)
    random.seed(3)
    nonempty = 0
    for q in _queries(objs):
        clause = render(q)
        want = brute(objs, q)
        got, _ = s.v2(bucket, clause, page=random.choice([1000, 9]))
        assert got == want, f"{clause}: {len(got)} keys, want {len(want)}"
        nonempty += bool(want)
    assert nonempty > 40


def test_pagination_prefix_and_delimiter_v1_and_v2(corpus):
    gateway, bucket, objs = corpus
    s = Searcher(gateway.endpoint)
    q = ("or", [("cmp", "content-type", "=", "text/csv"), ("cmp", "content-length", ">=", "1000")])
    clause = render(q)
    want = brute(objs, q)
    assert len(want) > 20
    assert s.v1(bucket, clause, page=4)[0] == want
    assert s.v2(bucket, clause, page=3)[0] == want
    # A prefix narrows, a delimiter groups the matches into common prefixes.
    assert s.v2(bucket, clause, page=5, Prefix="logs/")[0] == [k for k in want if k.startswith("logs/")]
    keys, prefixes = s.v2(bucket, clause, page=2, Delimiter="/")
    assert keys == [] and prefixes == sorted({k.split("/")[0] + "/" for k in want})
    keys, prefixes = s.v1(bucket, clause, page=2, Prefix="a", Delimiter="/")
    assert prefixes == sorted({k.split("/")[0] + "/" for k in want if k.startswith("a")})
    # Without ?search= the same client lists everything, as usual.
    assert len(s.s3.list_objects_v2(Bucket=bucket)["Contents"]) == len(objs)
    # Listed entries carry the object's size and ETag.
    s.clause = 'key = "data/x/obj-010.csv"' if "data/x/obj-010.csv" in objs else f"key = {want[0]}"
    r = s.s3.list_objects_v2(Bucket=bucket)
    s.clause = None
    o = r["Contents"][0]
    assert o["Size"] == objs[o["Key"]]["size"] and o["ETag"].strip('"') == objs[o["Key"]]["etag"]


def test_changes_are_searchable_as_soon_as_acknowledged(gateway):
    s3 = gateway.s3
    b = gateway.new_bucket()
    s = Searcher(gateway.endpoint)
    for i in range(30):
        k = f"live/k{i}"
        s3.put_object(Bucket=b, Key=k, Body=b"x" * i, Metadata={"round": str(i)})
        assert s.v2(b, f"x-amz-meta-round = {i}")[0] == [k]
        s3.put_object_tagging(Bucket=b, Key=k, Tagging={"TagSet": [{"Key": "state", "Value": f"t{i}"}]})
        assert s.v2(b, f"tags.state = t{i}")[0] == [k]
    s3.copy_object(Bucket=b, Key="live/copy", CopySource={"Bucket": b, "Key": "live/k5"})
    assert s.v2(b, "x-amz-meta-round = 5")[0] == ["live/copy", "live/k5"]
    s3.put_object(Bucket=b, Key="live/k5", Body=b"new", Metadata={"round": "fifty"})
    assert s.v2(b, "x-amz-meta-round = 5")[0] == ["live/copy"]
    assert s.v2(b, "x-amz-meta-round = fifty AND content-length = 3")[0] == ["live/k5"]
    s3.delete_object(Bucket=b, Key="live/copy")
    assert s.v2(b, "x-amz-meta-round = 5")[0] == []
    s3.delete_objects(Bucket=b, Delete={"Objects": [{"Key": f"live/k{i}"} for i in range(10, 20)]})
    assert s.v2(b, "key LIKE \"^live/k1\"")[0] == ["live/k1"]
    # A rename (through the CLI) moves the entry; a directory rename moves everything below.
    gateway.cluster.ok("fs", "mkdir", "-p", f"/{b}/moved")
    gateway.cluster.ok("fs", "mv", f"/{b}/live/k7", f"/{b}/moved/k7")
    assert s.v2(b, "x-amz-meta-round = 7")[0] == ["moved/k7"]
    gateway.cluster.ok("fs", "mv", f"/{b}/live", f"/{b}/gone")
    assert s.v2(b, "x-amz-meta-round = 25")[0] == ["gone/k25"]
    assert s.v2(b, "key LIKE \"^live/\"")[0] == []


def test_concurrent_puts_and_deletes_are_seen_by_the_next_search(gateway):
    """Many clients on overlapping keys: after each acknowledged put or delete, that
    client's next search agrees with it."""
    import concurrent.futures as cf
    b = gateway.new_bucket()

    def client(n: int):
        s = Searcher(gateway.endpoint)
        rnd = random.Random(n)
        for j in range(25):
            k = f"hot/{rnd.randrange(8)}"
            if rnd.random() < 0.7:
                v = f"c{n}-{j}"
                s.s3.put_object(Bucket=b, Key=k, Body=b"v", Metadata={"writer": v})
                # [] only when another client overwrote or deleted the key since.
                assert s.v2(b, f"x-amz-meta-writer = {v}")[0] in ([k], [])
            else:
                s.s3.delete_object(Bucket=b, Key=k)
        return True

    with cf.ThreadPoolExecutor(8) as ex:
        assert all(ex.map(client, range(8)))
    # At rest, the catalog and the namespace agree exactly.
    listed = sorted(o["Key"] for o in gateway.s3.list_objects_v2(Bucket=b).get("Contents", []))
    assert Searcher(gateway.endpoint).v2(b, "content-length >= 0")[0] == listed
    for k in listed:
        w = gateway.s3.head_object(Bucket=b, Key=k)["Metadata"]["writer"]
        assert Searcher(gateway.endpoint).v2(b, f"x-amz-meta-writer = {w}")[0] == [k]


def test_kill9_under_load_loses_no_acknowledged_change_from_the_index(cluster_factory, minio):
    """Clients PUT, overwrite and DELETE their own keys through the gateway while `locus
    local start` is killed with SIGKILL. After the restart, a search shows every key in
    the state of its last acknowledged change (or of the one cut off by the kill), and
    agrees exactly with the listing and each object's metadata: the index is rebuilt from
    the journal written with each change."""
    import threading
    import time

    from conftest import Gateway

    c = cluster_factory(args=["--block-size", "1MiB"])
    gw = Gateway(c, minio)
    b = gw.new_bucket()
    stop = threading.Event()
    # key -> (last acknowledged state, state of a request not answered); a state is the
    # writer metadata, or None for deleted.
    states: dict[str, tuple] = {}
    lock = threading.Lock()

    def client(n: int):
        s3 = gw_client(gw.endpoint)
        rnd = random.Random(n)
        j = 0
        while not stop.is_set():
            k = f"k{n}/{rnd.randrange(12)}"
            j += 1
            want = None if rnd.random() < 0.25 else f"c{n}-{j}"
            with lock:
                states[k] = (states.get(k, (None, None))[0], want)
            try:
                if want is None:
                    s3.delete_object(Bucket=b, Key=k)
                else:
                    s3.put_object(Bucket=b, Key=k, Body=b"x" * (j % 7), Metadata={"writer": want})
            except Exception:  # noqa: BLE001 (cut off by the kill: either state may be true)
                return
            with lock:
                states[k] = (want, want)

    threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(4)]
    for t in threads:
        t.start()
    time.sleep(4)
    c.kill()
    stop.set()
    for t in threads:
        t.join(timeout=60)
    c.start()
    wait_until(lambda: _port_open(c.gateway), timeout=20, what="the gateway to listen")
    s = Searcher(gw.endpoint)
    found = dict.fromkeys(s.v2(b, "content-length >= 0")[0])
    listed = sorted(o["Key"] for o in gw.s3.list_objects_v2(Bucket=b).get("Contents", []))
    assert sorted(found) == listed, "the index and the namespace list the same objects"
    for k, (acked, maybe) in states.items():
        have = gw.s3.head_object(Bucket=b, Key=k)["Metadata"]["writer"] if k in found else None
        assert have in (acked, maybe), f"{k}: {have}, acknowledged {acked}, in flight {maybe}"
        if have is not None:
            assert s.v2(b, f"x-amz-meta-writer = {have}")[0] == [k]
    assert len(states) > 20


def test_bad_clauses_are_invalid_argument(corpus):
    gateway, bucket, _ = corpus
    s = Searcher(gateway.endpoint)
    for clause, words in [("colour = blue", "unknown attribute `colour`"), ("key = 'a", "no closing"),
                          ("(key = a", "never closed"), ("content-length > big", "is a number"),
                          ("key LIKE \"(\"", "regular expression"), ("", "empty"),
                          ("NOT key = a", "NOT is not supported")]:
        with pytest.raises(ClientError) as e:
            s.v2(bucket, clause)
        err = e.value.response["Error"]
        assert err["Code"] == "InvalidArgument", (clause, err)
        assert words in err["Message"], (clause, err)
    with pytest.raises(ClientError) as e:
        s.v2("no-such-bucket-here", "key = a")
    assert e.value.response["Error"]["Code"] == "NoSuchBucket"


def test_curl_with_sigv4(corpus):
    gateway, bucket, objs = corpus
    q = ("cmp", "x-amz-meta-owner", "=", "user-4")
    url = f"{gateway.endpoint}/{bucket}?list-type=2&search=" + urllib.parse.quote(render(q), safe="")
    # (curl before 8.x does not send x-amz-content-sha256 itself; S3 needs it.)
    sha = ["-H", "x-amz-content-sha256: " + hashlib.sha256(b"").hexdigest()]
    r = subprocess.run(["curl", "-sS", "--fail-with-body", "--aws-sigv4", "aws:amz:us-east-1:s3", *sha,
                        "--user", f"{GW_KEY}:{GW_SECRET}", url], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    body = r.stdout.decode()
    assert "<ListBucketResult" in body
    assert re.findall(r"<Key>([^<]*)</Key>", body) == brute(objs, q)
    bad = subprocess.run(["curl", "-sS", "--aws-sigv4", "aws:amz:us-east-1:s3", *sha, "--user", f"{GW_KEY}:{GW_SECRET}",
                          f"{gateway.endpoint}/{bucket}?search=" + urllib.parse.quote("nope = 1")],
                         stdout=subprocess.PIPE, timeout=60).stdout.decode()
    assert "<Code>InvalidArgument</Code>" in bad and "<Message>" in bad


def test_cli_search_json_count_limit_and_errors(corpus):
    gateway, bucket, objs = corpus
    c = gateway.cluster
    q = ("cmp", "content-type", "=", "image/png")
    want = brute(objs, q)
    lines = c.ok("fs", "search", f"/{bucket}", render(q), "--json").decode().splitlines()
    hits = [json.loads(x) for x in lines]
    assert [h["key"] for h in hits] == want
    h = hits[0]
    o = objs[h["key"]]
    assert (h["size"], h["etag"], h["content_type"], h["metadata"], h["tags"]) == (
        o["size"], o["etag"], o["ct"], o["meta"], o["tags"])
    assert h["path"] == f"/{bucket}/{h['key']}" and h["persist_state"] == "PERSISTED"
    assert c.ok("fs", "search", f"/{bucket}", render(q), "--count").decode().strip() == str(len(want))
    plain = c.ok("fs", "search", f"/{bucket}", render(q), "--limit", "3").decode().splitlines()
    assert [line.split()[-1] for line in plain] == want[:3]
    # Without PATH: every mount, keys relative to /.
    allq = c.ok("fs", "search", f'key LIKE "^{bucket}/images/"', "--count").decode().strip()
    assert allq == str(len([k for k in objs if k.startswith("images/")]))
    r = c.fs("search", f"/{bucket}", "colour = blue")
    msg = assert_one_line_error(r, 2)
    assert "unknown attribute" in msg


def test_locus_attributes(gateway):
    c = gateway.cluster
    s = Searcher(gateway.endpoint)
    b = gateway.new_bucket()
    c.ok("fs", "put", "-", f"/{b}/cached.bin", "--write-type", "CACHE_THROUGH", input=b"c" * 5000)
    c.ok("fs", "put", "-", f"/{b}/mem.bin", "--write-type", "MUST_CACHE", input=b"m" * 100)
    c.ok("fs", "pin", f"/{b}/cached.bin")
    assert s.v2(b, "locus.persist-state = NOT_PERSISTED")[0] == ["mem.bin"]
    assert s.v2(b, "locus.pinned = true")[0] == ["cached.bin"]
    assert s.v2(b, "locus.cached = 1 AND locus.tier = MEM")[0] == ["cached.bin", "mem.bin"]
    c.ok("fs", "unpin", f"/{b}/cached.bin")
    c.ok("fs", "free", f"/{b}/cached.bin")
    assert s.v2(b, "locus.cached < 1")[0] == ["cached.bin"]
    assert s.v2(b, "locus.tier = NONE")[0] == ["cached.bin"]
    assert s.v2(b, "locus.mount = /")[0] == ["cached.bin", "mem.bin"]
    # Objects of a mounted MinIO bucket are under /lake, found once listed from the UFS.
    gateway.minio.put_object(Bucket=gateway.minio_bucket, Key="outside/made.csv", Body=b"1,2\n")
    gateway.s3.list_objects_v2(Bucket="lake", Prefix="outside/")
    assert s.v2("lake", "locus.mount = /lake AND key LIKE \"^outside/\"")[0] == ["outside/made.csv"]
    assert s.v2("lake", "key = outside/made.csv AND content-length = 4")[0] == ["outside/made.csv"]


def _inventory(tmp, bucket: str, rows: list[dict]):
    """An S3 Inventory layout: PREFIX/BUCKET/CONFIG/DATE/manifest.json and data/*.csv.gz
    (no header, keys URL-encoded)."""
    root = tmp / "inv" / bucket / "cfg"
    (root / "data").mkdir(parents=True)
    (root / "2026-11-26T00-00Z").mkdir()
    files = []
    for i in range(2):
        part = rows[i::2]
        lines = "".join(
            f'"{bucket}","{urllib.parse.quote(r["key"])}","{r["size"]}","{r["mtime"]}","{r["etag"]}","STANDARD"\n'
            for r in part)
        p = root / "data" / f"part-{i}.csv.gz"
        p.write_bytes(gzip.compress(lines.encode()))
        files.append({"key": f"inv/{bucket}/cfg/data/part-{i}.csv.gz", "size": p.stat().st_size})
    m = root / "2026-11-26T00-00Z" / "manifest.json"
    m.write_text(json.dumps({"sourceBucket": bucket, "destinationBucket": "arn:aws:s3:::inv", "version": "2016-11-30",
                             "fileFormat": "CSV", "fileSchema": "Bucket, Key, Size, LastModifiedDate, ETag, StorageClass",
                             "files": files}))
    return m


def test_index_import_csv_jsonl_parquet(gateway, tmp):
    c = gateway.cluster
    s = Searcher(gateway.endpoint)
    b = gateway.new_bucket()
    rows = [{"key": f"inv/{i:04d} name+{i % 3}.bin", "size": i * 10, "etag": f"{i:032x}",
             "mtime": f"2026-0{1 + i % 9}-15T10:00:00.000Z"} for i in range(500)]
    m = _inventory(tmp, b, rows)
    out = c.ok("fs", "index", "import", m).decode()
    assert "indexed 500 object(s)" in out
    assert s.v2(b, "content-length >= 4000")[0] == sorted(r["key"] for r in rows if r["size"] >= 4000)
    assert s.v2(b, f"etag = {7:032x}")[0] == ["inv/0007 name+1.bin"]
    assert s.v2(b, "last-modified < 2026-02-01 AND key LIKE \"^inv/000\"")[0] == ["inv/0000 name+0.bin",
                                                                                 "inv/0009 name+0.bin"]
    # Again: the same objects, nothing more.
    c.ok("fs", "index", "import", m)
    assert c.ok("fs", "search", f"/{b}", "content-length >= 0", "--count").decode().strip() == "500"
    # JSON lines with user metadata and tags, under a given directory.
    jl = tmp / "objs.jsonl"
    jl.write_text("".join(json.dumps({"key": f"j/{i}", "size": i, "last_modified": "2026-03-01T00:00:00Z",
                                      "etag": f"e{i}", "content_type": "text/plain",
                                      "metadata": {"owner": f"o{i % 4}"}, "tags": {"tier": "gold" if i % 5 == 0 else "tin"}})
                          + "\n" for i in range(100)))
    c.ok("fs", "index", "import", jl, "--under", f"/{b}")
    assert s.v2(b, "x-amz-meta-owner = o1 AND tags.tier = gold")[0] == sorted(
        f"j/{i}" for i in range(100) if i % 4 == 1 and i % 5 == 0)
    # Parquet with the S3 Inventory column names.
    import pyarrow as pa
    import pyarrow.parquet as pq
    pqf = tmp / "inv.parquet"
    pq.write_table(pa.table({"bucket": [b] * 50, "key": [f"p/{i}" for i in range(50)],
                             "size": pa.array(range(50), pa.int64()),
                             "last_modified_date": pa.array([dt.datetime(2026, 5, 1, tzinfo=dt.timezone.utc)] * 50,
                                                            pa.timestamp("ms", tz="UTC")),
                             "e_tag": [f"pe{i}" for i in range(50)]}), pqf)
    c.ok("fs", "index", "import", pqf)
    assert s.v2(b, "key LIKE \"^p/\" AND content-length > 45")[0] == ["p/46", "p/47", "p/48", "p/49"]
    assert s.v2(b, "etag = pe3 AND last-modified = 2026-05-01")[0] == ["p/3"]
    # Bad input: one line, exit code 2.
    badf = tmp / "bad.jsonl"
    badf.write_text('{"key": "x", "size": "many"}\n')
    assert "is not a number" in assert_one_line_error(c.fs("index", "import", badf, "--under", f"/{b}"), 2)
    assert "--under" in assert_one_line_error(c.fs("index", "import", jl), 2)  # no bucket, no --under
    assert "not a manifest" in assert_one_line_error(c.fs("index", "import", tmp / "x.txt2"), 2)


def test_sql_over_the_catalog(corpus):
    gateway, bucket, objs = corpus
    c = gateway.cluster
    out = c.ok("fs", "search", "--sql",
               f"SELECT content_type, count(*) AS n, sum(size) AS bytes FROM objects "
               f"WHERE key LIKE '{bucket}/%' GROUP BY 1 ORDER BY 1", "--format", "json").decode()
    rows = [json.loads(x) for x in out.splitlines()]
    want = {}
    for o in objs.values():
        n, s = want.get(o["ct"], (0, 0))
        want[o["ct"]] = (n + 1, s + o["size"])
    assert {r["content_type"]: (r["n"], r["bytes"]) for r in rows} == want
    out = c.ok("fs", "search", "--sql",
               f"SELECT count(*) AS n, max(size) AS m FROM objects WHERE key LIKE '{bucket}/images/%' AND size > 1000 "
               "AND persist_state = 'PERSISTED'", "--format", "json").decode()
    big = [o["size"] for k, o in objs.items() if k.startswith("images/") and o["size"] > 1000]
    assert json.loads(out) == {"n": len(big), "m": max(big)}
    # User metadata and tags are maps: grouped by one of their keys.
    out = c.ok("fs", "search", "--sql",
               f"SELECT metadata['owner'] AS owner, count(*) AS n FROM objects WHERE key LIKE '{bucket}/%' "
               "AND tags['env'] IS NOT NULL GROUP BY 1 ORDER BY 1", "--format", "json").decode()
    want = {}
    for o in objs.values():
        if "env" in o["tags"]:
            owner = o["meta"].get("owner")
            want[owner] = want.get(owner, 0) + 1
    assert {json.loads(x).get("owner"): json.loads(x)["n"] for x in out.splitlines()} == want
