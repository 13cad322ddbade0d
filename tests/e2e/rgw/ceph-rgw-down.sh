#!/bin/bash
# Vendored from the team's tools so a clean clone has it: tests/e2e/conftest.py (the rgw fixture) runs it.
# Stop daemons started by ceph-rgw-up.sh (by their pid files only).
D=${1:?usage: ceph-rgw-down.sh DIR}
for n in client.rgw.a osd.0 mgr.x mon.a; do
  f="$D/run/$n.pid"; [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null && echo "stopped $n ($(cat "$f"))"
done
sleep 2
for n in client.rgw.a osd.0 mgr.x mon.a; do
  f="$D/run/$n.pid"; [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null && kill -9 "$(cat "$f")" && echo "killed -9 $n"
done; true
