"""A master group across simulated hosts (bench/ha.py's NetnsGroup: each master in a
network namespace of its own on a bridge, a worker and the S3 gateway on this machine's),
the leader's host cut off by taking its link down under S3 writers and a CLI writer. The
cut-off leader acknowledges nothing, even to a client on its own host; the other two elect
a leader and serve; once the link is back, the old leader follows, and what it was asked
during the cut is nowhere."""

from __future__ import annotations

import os
import time

import pytest
from conftest import LOCUS_BIN, sha256
from ha import NetnsGroup
from ha_writers import Writers
from test_multihost import _can_simulate

pytestmark = pytest.mark.skipif(not _can_simulate(), reason="needs root, ip netns, unshare and nsenter")


@pytest.fixture
def ns_group(e2e_tmp):
    g = NetnsGroup(e2e_tmp / "nsha", str(LOCUS_BIN))
    g.start()
    try:
        yield g
    finally:
        g.stop()


def test_a_leader_cut_off_acknowledges_nothing_while_the_other_two_serve(ns_group: NetnsGroup):
    g = ns_group
    with Writers(g, "cut", 8) as w:
        time.sleep(3)
        old = g.leader()
        term = g.group()["term"]
        cut_at = time.monotonic()
        g.cut(old)
        try:
            # A client on the cut-off host, given only its own master, is refused: the
            # master there lost its quorum, so it takes no write.
            body = os.urandom(5000)
            only_old = g.client_env(old, {"LOCUS_MASTER": g.addr(old, g.RPC)})
            r = g.locus_cmd(old, "fs", "put", "-", "/cut/minority", env=only_old, check=False,
                            timeout=120, input=body)
            assert r.returncode != 0, "a master cut off from the group acknowledged a write"
            refused_at = time.monotonic()
            served = g.wait_group(lambda s: s["term"] > term and any(m["role"] == "leader" for m in s["members"]),
                                  "led by the other two")
            assert next(m["rpc_address"] for m in served["members"] if m["role"] == "leader") != g.addr(old, g.RPC)
            time.sleep(2)
        finally:
            g.heal(old)
        healed_at = time.monotonic()
        time.sleep(2)
    during = w.between(cut_at, healed_at)
    assert len(during) >= 8, f"only {len(during)} writes began and ended while the leader was cut off"
    print(f"the cut-off master refused its client after {refused_at - cut_at:.1f} s; "
          f"the first write begun after the cut acknowledged {min(during) - cut_at:.2f} s after it")

    # Healed, the old leader learns the later term and follows; the write it was asked for
    # during the cut is nowhere, and every acknowledged write reads back.
    g.wait_following(g.addr(old, g.RPC), "whole again with the old leader following")
    r = g.cli("fs", "cat", "/cut/minority")
    assert r.returncode != 0 and sha256(r.stdout) != sha256(body), "the minority's write appeared"
    w.check_every_acknowledged_write()
