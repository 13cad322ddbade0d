#!/bin/bash
# Vendored from the team's tools so a clean clone has it: tests/e2e/conftest.py (the rgw fixture) runs it.
# Minimal single-node Ceph (1 mon, 1 mgr, 1 memstore OSD) + radosgw on 127.0.0.1:7480, auth=none.
# Needs: apt-get install -y radosgw ceph-mon ceph-osd ceph-mgr ceph-common (Debian 12, Ceph 16.2). Ready in about 15 s.
# Memstore keeps objects in RAM (MEMSTORE_BYTES, default 8 GiB) and loses them when the OSD stops.
# Usage: ceph-rgw-up.sh [DIR]   (DIR is wiped and reused). Stop: ceph-rgw-down.sh [DIR]
set -euo pipefail
D=${1:?usage: ceph-rgw-up.sh DIR}
MEM_BYTES=${MEMSTORE_BYTES:-8589934592}
rm -rf "$D"; mkdir -p "$D"/{run,log,mon,mgr/mgr.x,osd/osd.0,rgw}
cd "$D"
FSID=$(python3 -c "import uuid;print(uuid.uuid4())")
cat > ceph.conf <<EOC
[global]
fsid = $FSID
mon host = v2:127.0.0.1:3300
public network = 127.0.0.0/8
auth cluster required = none
auth service required = none
auth client required = none
ms mon client mode = crc
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
mon allow pool size one = true
mon warn on pool no redundancy = false
mon data avail warn = 2
osd crush chooseleaf type = 0
run dir = $D/run
admin socket = $D/run/\$name.asok
log file = $D/log/\$name.log
pid file = $D/run/\$name.pid
ms bind ipv4 = true
ms bind ipv6 = false
[mon]
mon data = $D/mon/\$name
mon cluster log file = $D/log/cluster.log
[mgr]
mgr data = $D/mgr/\$name
[osd]
osd data = $D/osd/\$name
osd objectstore = memstore
memstore device bytes = $MEM_BYTES
[client.rgw.a]
ms mon client mode = crc
rgw frontends = beast endpoint=127.0.0.1:7480 tcp_nodelay=1
rgw data = $D/rgw
EOC
C="-c $D/ceph.conf"
monmaptool --create --fsid $FSID --addv a [v2:127.0.0.1:3300] monmap >/dev/null
ceph-mon $C --mkfs -i a --monmap monmap
ceph-mon $C -i a
ceph-mgr $C -i x
OSDUUID=$(python3 -c "import uuid;print(uuid.uuid4())")
ID=$(timeout 60 ceph $C osd new $OSDUUID)
ceph-osd $C -i $ID --mkfs --osd-uuid $OSDUUID 2>/dev/null
ceph-osd $C -i $ID
radosgw $C -n client.rgw.a
for i in $(seq 1 120); do
  curl -s -o /dev/null -m 2 http://127.0.0.1:7480/ && break; sleep 1
done
timeout 60 radosgw-admin $C user create --uid=locus --display-name=locus --access-key=locuskey --secret=locussecret >/dev/null
echo "RGW up: http://127.0.0.1:7480 access=locuskey secret=locussecret (conf $D/ceph.conf)"
