"""Unit tests of the consistency checker (linearizability.py): each rule, on small
hand-made histories, both ways."""

from __future__ import annotations

from linearizability import ABSENT, History, body_for, ident_of, md5_etag


def put(h: History, key: str, ident: str, start: float, end: float | None, size: int = 16) -> bytes:
    body = body_for(ident, size)
    h.put(key, ident, body, start, end)
    return body


def get(h: History, key: str, body: bytes, start: float, end: float):
    h.get(key, start, end, body, md5_etag(body), len(body))


def test_bodies_name_their_put():
    b = body_for("w3-17", 1000)
    assert len(b) == 1000 and ident_of(b) == "w3-17"
    assert ident_of(body_for("x", 2)) == "x"
    assert body_for("a", 100) != body_for("b", 100)


def test_read_after_write_sees_the_write_or_something_newer():
    h = History()
    a = put(h, "k", "a", 0, 1)
    b = put(h, "k", "b", 2, 3)
    get(h, "k", a, 1.5, 1.6)  # after a, before b: fine
    get(h, "k", b, 2.5, 2.6)  # during b: b is fine...
    get(h, "k", a, 2.5, 2.7)  # ...and so is a
    assert h.check() == []
    get(h, "k", a, 3.5, 3.6)  # after b was acknowledged: a is an older version
    v = h.check()
    assert len(v) == 1 and "GET of k" in v[0] and "saw PUT a" in v[0], v


def test_nothing_from_the_future():
    h = History()
    b = put(h, "k", "b", 5, 6)
    get(h, "k", b, 1, 2)
    assert len(h.check()) == 1
    h2 = History()
    put(h2, "k", "b", 5, 6)
    h2.absent("k", 1, 2, "HEAD")  # the initial absence
    assert h2.check() == []


def test_read_after_delete_never_resurrects():
    h = History()
    a = put(h, "k", "a", 0, 1)
    h.delete("k", 2, 3)
    h.absent("k", 3.5, 4, "GET")
    get(h, "k", a, 2.5, 2.6)  # concurrent with the delete: fine
    assert h.check() == []
    get(h, "k", a, 3.5, 4)  # the delete was acknowledged: resurrected
    assert len(h.check()) == 1
    h3 = History()
    put(h3, "k", "a", 0, 1)
    h3.absent("k", 1.5, 2, "GET")  # absent after an acknowledged PUT, no delete: lost
    assert len(h3.check()) == 1


def test_unacknowledged_writes_may_or_may_not_have_happened():
    h = History()
    a = put(h, "k", "a", 0, 1)
    put(h, "k", "b", 2, None)  # failed or timed out: it may never take effect...
    get(h, "k", a, 12, 13)
    assert h.check() == []
    h2 = History()
    put(h2, "k", "a", 0, 1)
    b = put(h2, "k", "b", 2, None)  # ...or take effect, even late
    get(h2, "k", b, 10, 11)
    assert h2.check() == []
    get(h2, "k", b, 1, 1.5)  # but not before it was sent
    assert len(h2.check()) == 1
    h3 = History()
    a = put(h3, "k", "a", 0, 1)
    h3.delete("k", 20, None)
    h3.absent("k", 30, 31, "GET")
    get(h3, "k", a, 32, 33)  # the delete seen, then a again: an inversion...
    assert len(h3.check()) == 1
    h4 = History()
    a = put(h4, "k", "a", 0, 1)
    h4.delete("k", 20, None)
    get(h4, "k", a, 32, 33)  # ...but a alone is fine: the delete may not have happened
    assert h4.check() == []


def test_a_read_does_not_go_back_behind_an_earlier_read():
    h = History()
    a = put(h, "k", "a", 0, 1)
    b = put(h, "k", "b", 2, 10)  # long in flight
    get(h, "k", b, 3, 4)  # b seen before it was acknowledged
    get(h, "k", a, 5, 6)  # then a, which b overwrote: new-old inversion
    v = h.check()
    assert len(v) == 1 and "earlier read" in v[0], v
    h2 = History()
    a = put(h2, "k", "a", 0, 3)
    b = put(h2, "k", "b", 1, 4)  # concurrent with a: either order
    get(h2, "k", b, 5, 6)
    get(h2, "k", a, 7, 8)  # a may be the later one... but b's ack is not before a's start
    assert len(h2.check()) == 0


def test_bytes_must_match_the_etag_and_the_put():
    h = History()
    a = put(h, "k", "a", 0, 1, size=64)
    h.get("k", 2, 3, a[:-1] + b"X", md5_etag(a), len(a))
    h.get("k", 2, 3, a, '"0123"', len(a))
    h.get("k", 2, 3, a[:10], md5_etag(a), len(a))
    h.get("k", 2, 3, b"garbage", md5_etag(b"garbage"), 7)
    h.head("k", 2, 3, '"feed"', 64)
    assert len(h.check()) == 5
    h2 = History()
    a = put(h2, "k", "a", 0, 1, size=64)
    h2.head("k", 2, 3, md5_etag(a), 64)
    assert h2.check() == []


def test_list_is_checked_key_by_key():
    keys = ["x", "y", "z"]
    h = History()
    put(h, "x", "x1", 0, 1)
    y = put(h, "y", "y1", 0, 1)
    h.delete("y", 2, 3)
    # x acknowledged (must be listed), y deleted (must not), z never written
    h.listed(keys, 4, 5, {"x": None})
    h.listed(keys, 2.5, 2.6, {"x": None, "y": (md5_etag(y), len(y))})  # y's delete in flight
    assert h.check() == []
    h.listed(keys, 4, 5, {"y": None})  # x missing, y resurrected
    v = h.check()
    assert len(v) == 2 and all("LIST" in m for m in v), v
    h.listed(keys, 4, 5, {"x": ('"beef"', 3)})
    assert any("no PUT of this key" in m for m in h.check())


def test_a_list_missing_a_key_seen_before_is_an_inversion():
    h = History()
    x = put(h, "x", "x1", 0, 10)
    get(h, "x", x, 2, 3)
    h.listed(["x"], 4, 5, {})
    assert len(h.check()) == 1
    assert ABSENT == "absent"
