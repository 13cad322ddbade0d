#!/usr/bin/env bash
# Vendored from the team's shared tools (../shared/tools) so a clean clone has it.
# Stop the Alluxio processes that alluxio-up.sh DIR started (by their pid files only) and
# remove their MEM tier.
DIR=$(realpath -m "${1:?usage: alluxio-down.sh DIR}")
for r in proxy worker master; do f="$DIR/$r.pid"; [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null; done
sleep 2
for r in proxy worker master; do f="$DIR/$r.pid"; [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null && kill -9 "$(cat "$f")"; rm -f "$f"; done
rm -rf "/dev/shm/alluxio-$(printf '%s' "$DIR" | md5sum | cut -c1-8)"; true
