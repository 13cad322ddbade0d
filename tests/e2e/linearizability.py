"""A checker of what S3 promises: strong read-after-write and read-after-delete
consistency, per key, for GET, HEAD and LIST.

A history records, per key, every PUT and DELETE with the interval it was in flight
(`start`, `end` on one monotonic clock; a write that failed or timed out may or may not
have taken effect, so it stays in flight for ever: `end = inf`), and every observation
of the key (a GET, a HEAD, or the key's presence or absence in a LIST) with its interval
and what it saw: a given PUT (every PUT writes bytes of its own, so its ETag and its
bytes name it), absent, or present (a PUT not identified).

An observation O may see write W (for "absent": a DELETE, or the key's initial absence)
only if
  1. W started before O ended (nothing from the future), and
  2. W was not overwritten before O started: no acknowledged write W2 of the key started
     after W was acknowledged and was itself acknowledged before O started (no older
     version, no resurrected delete), and
  3. no earlier observation saw a newer write: if O1 ended before O started and saw
     write W1, then W must not be acknowledged before W1 started (a read after a read
     does not go back in time). An absence or a PUT not identified counts as the
     earliest write it may have seen by rules 1 and 2.
A LIST is checked key by key (S3 does not promise a snapshot across keys). The bytes
of a GET must match the ETag and length it reports and the bytes the PUT wrote; that is
checked where the GET is recorded (`History.get`).
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections import defaultdict
from dataclasses import dataclass, field

INF = math.inf
ABSENT = "absent"
PRESENT = "present"


@dataclass
class Write:
    key: str
    kind: str  # "put" | "delete"
    start: float
    end: float  # INF when not acknowledged
    ident: str = ""  # a PUT's own name
    etag: str = ""
    length: int = 0
    digest: str = ""  # sha256 of the bytes


@dataclass
class Observation:
    key: str
    start: float
    end: float
    seen: str  # a PUT's ident, ABSENT or PRESENT
    what: str  # "GET" / "HEAD" / "LIST", for messages


def body_for(ident: str, size: int) -> bytes:
    """Bytes of their own for PUT `ident`: its name, then a deterministic filler."""
    head = f"<{ident}>".encode()
    if size <= len(head):
        return head
    seed = hashlib.sha256(head).digest()
    filler = (seed * (size // len(seed) + 1))[: size - len(head)]
    return head + filler


def ident_of(body: bytes) -> str | None:
    """The PUT that wrote `body`, from its header (see `body_for`)."""
    if not body.startswith(b"<"):
        return None
    end = body.find(b">")
    return body[1:end].decode(errors="replace") if end > 0 else None


def md5_etag(body: bytes) -> str:
    return '"' + hashlib.md5(body).hexdigest() + '"'


@dataclass
class History:
    writes: dict = field(default_factory=lambda: defaultdict(list))
    observations: dict = field(default_factory=lambda: defaultdict(list))
    errors: list = field(default_factory=list)  # violations found while recording (bad bytes)
    _by_etag: dict = field(default_factory=dict)
    _by_ident: dict = field(default_factory=dict)

    # --- recording -----------------------------------------------------------------

    def put(self, key: str, ident: str, body: bytes, start: float, end: float | None = None) -> Write:
        """A PUT of `body` (made by `body_for(ident, ...)`); `end=None`: not acknowledged
        (yet: record a PUT before it is sent, so that a read during it knows its bytes,
        and set `end` of the returned write when it is acknowledged)."""
        w = Write(key, "put", start, INF if end is None else end, ident, md5_etag(body), len(body),
                  hashlib.sha256(body).hexdigest())
        self.writes[key].append(w)
        self._by_etag[(key, w.etag)] = w
        self._by_ident[(key, ident)] = w
        return w

    def delete(self, key: str, start: float, end: float | None = None) -> Write:
        w = Write(key, "delete", start, INF if end is None else end)
        self.writes[key].append(w)
        return w

    def absent(self, key: str, start: float, end: float, what: str):
        self.observations[key].append(Observation(key, start, end, ABSENT, what))

    def head(self, key: str, start: float, end: float, etag: str, length: int):
        w = self._by_etag.get((key, etag))
        if w is None or w.length != length:
            self.errors.append(f"HEAD {key} [{start:.3f},{end:.3f}]: ETag {etag} length {length} "
                               "is no PUT of this key")
            return
        self.observations[key].append(Observation(key, start, end, w.ident, "HEAD"))

    def get(self, key: str, start: float, end: float, body: bytes, etag: str, length: int):
        ident = ident_of(body)
        w = self._by_ident.get((key, ident)) if ident else None
        where = f"GET {key} [{start:.3f},{end:.3f}]"
        if len(body) != length:
            self.errors.append(f"{where}: {len(body)} bytes, Content-Length {length}")
        elif w is None:
            self.errors.append(f"{where}: bytes of no PUT of this key ({body[:40]!r})")
        elif hashlib.sha256(body).hexdigest() != w.digest:
            self.errors.append(f"{where}: the bytes of {ident} are damaged")
        elif etag != w.etag:
            self.errors.append(f"{where}: ETag {etag}, the bytes' MD5 is {w.etag}")
        else:
            self.observations[key].append(Observation(key, start, end, w.ident, "GET"))

    def listed(self, keys: list[str], start: float, end: float, entries: dict[str, tuple[str, int] | None],
               what: str = "LIST"):
        """A LIST that ran in [start, end] and returned `entries` (key -> (etag, size), or
        None when unknown): each key of `keys` is observed present or absent."""
        for k in keys:
            if k not in entries:
                self.observations[k].append(Observation(k, start, end, ABSENT, what))
                continue
            e = entries[k]
            w = self._by_etag.get((k, e[0])) if e else None
            if e and (w is None or w.length != e[1]):
                self.errors.append(f"LIST [{start:.3f},{end:.3f}] lists {k} with ETag {e[0]} size {e[1]}: "
                                   "no PUT of this key")
                continue
            self.observations[k].append(Observation(k, start, end, w.ident if w else PRESENT, what))

    # --- checking ------------------------------------------------------------------

    def check(self) -> list[str]:
        """Every violation found (empty: the history is consistent)."""
        out = list(self.errors)
        for key in sorted(set(self.writes) | set(self.observations)):
            out.extend(check_key(self.writes.get(key, []), self.observations.get(key, [])))
        return out


class _Writes:
    """One key's writes with what the checks ask of them, in O(log n)."""

    def __init__(self, writes: list[Write]):
        self.all = sorted(writes, key=lambda w: w.start)
        self.starts = [w.start for w in self.all]
        # suffix minimum of the acknowledgement times: the earliest a write started at
        # or after position i was acknowledged
        self.min_end_from = [INF] * (len(self.all) + 1)
        for i in range(len(self.all) - 1, -1, -1):
            self.min_end_from[i] = min(self.all[i].end, self.min_end_from[i + 1])
        self.by_ident = {w.ident: w for w in self.all if w.kind == "put"}
        self.absences = [w for w in self.all if w.kind == "delete"]

    def overwritten_by(self, after: float) -> float:
        """When the first write that started after `after` was acknowledged (INF: never)."""
        return self.min_end_from[bisect.bisect_right(self.starts, after)]

    def candidates(self, o: Observation) -> list:
        """The writes `o` may have seen by what it saw (None: the initial absence)."""
        if o.seen == ABSENT:
            return [None, *self.absences]
        if o.seen == PRESENT:
            return list(self.by_ident.values())
        w = self.by_ident.get(o.seen)
        return [w] if w else []

    def may_see(self, w: Write | None, o: Observation, newest_seen_start: float = -INF) -> bool:
        """Whether `o` may see `w` (None: the key's initial absence)."""
        w_start, w_end = (-INF, -INF) if w is None else (w.start, w.end)
        if w_start >= o.end:
            return False  # 1. from the future
        if self.overwritten_by(w_end) < o.start:
            return False  # 2. overwritten before o started
        return not w_end < newest_seen_start  # 3. older than what an earlier read saw


def check_key(writes: list[Write], observations: list[Observation]) -> list[str]:
    ws = _Writes(writes)
    out = []
    # For rule 3: when each observation ended, and when the write it saw started (of those
    # it may have seen by rules 1 and 2, the earliest: an absence after an acknowledged
    # PUT saw a delete at least that new).
    seen = []
    for o in observations:
        starts = [-INF if w is None else w.start for w in ws.candidates(o) if ws.may_see(w, o)]
        if starts:
            seen.append((o.end, min(starts)))
    seen.sort()
    seen_ends = [e for e, _ in seen]
    newest = []  # prefix maximum of the seen PUTs' starts
    m = -INF
    for _, s in seen:
        m = max(m, s)
        newest.append(m)

    def describe(w: Write | None) -> str:
        if w is None:
            return "initial absence"
        end = "never acknowledged" if w.end == INF else f"acknowledged {w.end:.3f}"
        return f"{w.kind.upper()} {w.ident} [started {w.start:.3f}, {end}]"

    for o in observations:
        i = bisect.bisect_left(seen_ends, o.start)
        newest_seen = newest[i - 1] if i > 0 else -INF
        if any(ws.may_see(w, o, newest_seen) for w in ws.candidates(o)):
            continue
        later = [w for w in ws.all if w.end < o.start]
        last = max(later, key=lambda w: w.end) if later else None
        shown = o.seen if o.seen in (ABSENT, PRESENT) else describe(ws.by_ident.get(o.seen))
        out.append(f"{o.what} of {o.key} [{o.start:.3f}, {o.end:.3f}] saw {shown}; "
                   f"last write acknowledged before it: {describe(last) if last else 'none'}"
                   + (f"; an earlier read saw a PUT started {newest_seen:.3f}" if newest_seen > -INF else ""))
    return out
