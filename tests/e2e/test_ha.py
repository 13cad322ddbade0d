"""Three masters with the real binary (`locus master --raft-address A --peers A,B,C`), two
workers and an S3 gateway, all given the three masters, under 32 S3 writers and a CLI
writer. The leader killed (SIGKILL), or stopped for 15 s (SIGSTOP) and then woken, loses
no acknowledged write and shows no client an error; the others elect a leader and serve
meanwhile; the old leader, started again or woken, follows and catches up. Across a
failover, every key's history of puts, gets, deletes and lists stays linearizable."""

from __future__ import annotations

import signal
import threading
import time

from conftest import gw_client
from ha import LocusGroup
from test_concurrent_consistency import Load, examples
from ha_writers import WRITERS, Writers, group  # noqa: F401 (group: the fixture)


def test_the_leader_killed_under_load_loses_no_acknowledged_write(group: LocusGroup):
    with Writers(group, "failover") as w:
        time.sleep(3)
        old = group.leader()
        term = group.group()["term"]
        killed_at = time.monotonic()
        group.kill_master(old)
        time.sleep(8)
    after = w.between(killed_at)
    assert len(after) >= WRITERS, f"only {len(after)} writes began and ended after the kill"
    print(f"first write begun after the kill acknowledged {min(after) - killed_at:.2f} s after it; "
          f"{len(w.acked)} writes acknowledged")
    g = group.wait_group(lambda g: any(m["role"] == "leader" for m in g["members"]), "led again")
    assert g["term"] > term
    assert group.leader() != old
    w.check_every_acknowledged_write()

    # The killed master, started again, follows and catches up.
    group.start_master(old)
    group.wait_following(group.rpc[old], "whole again")


def test_the_leader_stopped_for_15_s_acts_on_nothing_and_follows_once_woken(group: LocusGroup):
    with Writers(group, "paused") as w:
        time.sleep(3)
        old = group.leader()
        term = group.group()["term"]
        stopped_at = time.monotonic()
        group.masters[old].send_signal(signal.SIGSTOP)
        try:
            time.sleep(15)
        finally:
            group.masters[old].send_signal(signal.SIGCONT)
        woken_at = time.monotonic()
        time.sleep(3)
    # The others elected a leader and served while it slept; its callers left it.
    during = w.between(stopped_at, woken_at)
    assert len(during) >= WRITERS, f"only {len(during)} writes began and ended while the leader was stopped"
    print(f"first write begun after the stop acknowledged {min(during) - stopped_at:.2f} s after it")
    assert w.between(woken_at), "no write began and ended after the old leader woke"
    # Woken, it learns the later term and follows; nothing it held back is acknowledged.
    g = group.wait_following(group.rpc[old], "the woken leader following")
    assert g["term"] > term
    w.check_every_acknowledged_write()


def test_per_key_histories_stay_linearizable_across_a_failover(group: LocusGroup):
    """test_concurrent_consistency.py's load (16 boto3 clients putting, getting, heading,
    deleting and listing 8 overlapping keys) with the leader killed in the middle: every
    answer is checked against the history of acknowledged writes (linearizability.py)."""
    gw_client(f"http://{group.gateway}").create_bucket(Bucket="lin")
    load = Load(f"http://{group.gateway}", "lin")
    run = threading.Thread(target=load.run, args=(16.0,))
    run.start()
    time.sleep(5)
    old = group.leader()
    group.kill_master(old)
    run.join(240)
    assert not run.is_alive(), "a client hung"
    load.final_reads()
    violations = load.h.check()
    writes = sum(len(v) for v in load.h.writes.values())
    print(f"{load.counts}, {writes} writes, {len(violations)} violations, {len(load.unexpected)} errors")
    assert writes > 100, load.counts
    assert not violations and not load.unexpected, (
        f"{len(violations)} consistency violations:\n{examples(violations)}\n"
        f"{len(load.unexpected)} failed requests:\n{examples(load.unexpected)}")
    group.start_master(old)
    group.wait_following(group.rpc[old], "whole again")
