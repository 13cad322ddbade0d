#!/usr/bin/env bash
# Vendored from the team's tools so a clean clone has it.
# Stop the Alluxio processes that alluxio-up.sh DIR started (by their pid files only) and
# remove their MEM tier.
DIR=$(realpath -m "${1:?usage: alluxio-down.sh DIR}")
for r in proxy worker master; do f="$DIR/$r.pid"; [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null; done
for _ in $(seq 10); do  # up to 1 s for them to exit (then kill -9: nothing to keep)
  alive=0; for r in proxy worker master; do f="$DIR/$r.pid"; [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null && alive=1; done
  [ "$alive" = 0 ] && break; sleep 0.1
done
for r in proxy worker master; do f="$DIR/$r.pid"; [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null && kill -9 "$(cat "$f")"; rm -f "$f"; done
rm -rf "/dev/shm/alluxio-$(printf '%s' "$DIR" | md5sum | cut -c1-8)"; true
