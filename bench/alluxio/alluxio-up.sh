#!/usr/bin/env bash
# Vendored from the team's tools so a clean clone has it.
# Start Apache-licensed Alluxio 2.9.6 (master, worker, S3 proxy) on 127.0.0.1, as a peer to
# benchmark against. Jars come from Maven Central (about 280 jars, 176 MB; cached in ~/.m2).
#
# usage: alluxio-up.sh DIR UFS [MEM_QUOTA]
#        alluxio-up.sh DIR --resolve-only   (only fetch the jars: DIR/cp.txt, DIR/client/)
#   DIR        scratch directory (its conf/, logs/, journal/ are reset)
#   UFS        a local directory, or s3://bucket/ (then set S3_ENDPOINT, S3_ACCESS_KEY, S3_SECRET_KEY)
#   MEM_QUOTA  worker MEM tier size (default 4GB), kept in /dev/shm/alluxio-<hash of DIR>
# Stop with alluxio-down.sh DIR. Ports: 19998 master RPC, 19999 master web, 29999 worker,
# 30000 worker web, 39999 S3 proxy (http://127.0.0.1:39999/api/v1/s3).
# The shaded client jar for Spark/Hadoop (alluxio://) is written to DIR/client/.
# Offline safety: the master's update check is disabled and the AWS SDK's EC2 metadata probe is
# turned off; without both, the master tries to reach addresses outside this machine.
set -euo pipefail
DIR=$(realpath -m "${1:?usage: alluxio-up.sh DIR UFS [MEM_QUOTA]}"); UFS=${2:?UFS missing}; QUOTA=${3:-4GB}
V=2.9.6
SHM=/dev/shm/alluxio-$(printf '%s' "$DIR" | md5sum | cut -c1-8)
mkdir -p "$DIR"/{lib,client,conf,logs,home,resolve}
[ "$UFS" = --resolve-only ] || { rm -rf "$DIR/journal" "$DIR/logs"/* "$SHM"; mkdir -p "$DIR/journal" "$SHM"; }

if [ ! -s "$DIR/cp.txt" ]; then
  cat >"$DIR/resolve/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>
<groupId>local</groupId><artifactId>alluxio-cp</artifactId><version>1</version><packaging>pom</packaging>
<dependencies>
$(for a in core-server-master core-server-worker core-server-proxy shell underfs-local underfs-s3a; do
  echo "<dependency><groupId>org.alluxio</groupId><artifactId>alluxio-$a</artifactId><version>$V</version></dependency>"; done)
</dependencies></project>
POM
  (cd "$DIR/resolve" && mvn -q dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$DIR/lib")
  mvn -q dependency:copy -Dartifact=org.alluxio:alluxio-shaded-client:$V -DoutputDirectory="$DIR/client"
  # two SLF4J bindings arrive; keep the log4j-1 one so log4j.properties applies
  echo "$DIR/conf:$(ls "$DIR"/lib/*.jar | grep -v log4j-slf4j-impl | paste -sd:)" >"$DIR/cp.txt"
fi
[ "$UFS" = --resolve-only ] && exit 0

cat >"$DIR/conf/log4j.properties" <<'L4J'
log4j.rootLogger=INFO, console
log4j.appender.console=org.apache.log4j.ConsoleAppender
log4j.appender.console.layout=org.apache.log4j.PatternLayout
log4j.appender.console.layout.ConversionPattern=%d{ISO8601} %-5p %c{1} - %m%n
log4j.logger.org.apache.ratis=WARN
L4J
# the shell and other clients log warnings only, to stderr, so stdout carries just the data
printf '%s\n' 'log4j.rootLogger=WARN, err' 'log4j.appender.err=org.apache.log4j.ConsoleAppender' \
  'log4j.appender.err.Target=System.err' 'log4j.appender.err.layout=org.apache.log4j.PatternLayout' \
  'log4j.appender.err.layout.ConversionPattern=%d{ISO8601} %-5p %c{1} - %m%n' >"$DIR/conf/log4j-client.properties"
{
  echo "alluxio.master.hostname=127.0.0.1"; echo "alluxio.worker.hostname=127.0.0.1"
  echo "alluxio.user.hostname=127.0.0.1"; echo "alluxio.proxy.hostname=127.0.0.1"
  for k in master.bind.host master.web.bind.host worker.bind.host worker.web.bind.host proxy.web.bind.host \
           job.master.bind.host job.master.web.bind.host job.worker.bind.host job.worker.web.bind.host; do
    echo "alluxio.$k=127.0.0.1"; done
  echo "alluxio.master.update.check.enabled=false"
  echo "alluxio.master.journal.type=UFS"; echo "alluxio.master.journal.folder=$DIR/journal"
  echo "alluxio.work.dir=$DIR/home"
  echo "alluxio.worker.ramdisk.size=$QUOTA"; echo "alluxio.worker.tieredstore.levels=1"
  echo "alluxio.worker.tieredstore.level0.alias=MEM"; echo "alluxio.worker.tieredstore.level0.dirs.mediumtype=MEM"
  echo "alluxio.worker.tieredstore.level0.dirs.path=$SHM"; echo "alluxio.worker.tieredstore.level0.dirs.quota=$QUOTA"
  echo "alluxio.security.authentication.type=NOSASL"; echo "alluxio.security.authorization.permission.enabled=false"
  echo "alluxio.user.short.circuit.enabled=true"
  case "$UFS" in
    s3://*) echo "alluxio.master.mount.table.root.ufs=$UFS"
            echo "s3a.accessKeyId=${S3_ACCESS_KEY:?}"; echo "s3a.secretKey=${S3_SECRET_KEY:?}"
            echo "alluxio.underfs.s3.endpoint=${S3_ENDPOINT:?}"; echo "alluxio.underfs.s3.endpoint.region=us-east-1"
            echo "alluxio.underfs.s3.disable.dns.buckets=true"; echo "alluxio.underfs.s3.inherit.acl=false" ;;
    *) mkdir -p "$UFS"; echo "alluxio.master.mount.table.root.ufs=$(realpath "$UFS")" ;;
  esac
} >"$DIR/conf/alluxio-site.properties"

CP=$(cat "$DIR/cp.txt")
JOPTS="-Dcom.amazonaws.sdk.disableEc2Metadata=true -Dalluxio.home=$DIR/home -Dalluxio.conf.dir=$DIR/conf -Dalluxio.logs.dir=$DIR/logs -Dlog4j.configuration=file:$DIR/conf/log4j.properties"
OPENS="--add-opens=java.base/java.lang=ALL-UNNAMED --add-opens=java.base/java.nio=ALL-UNNAMED --add-opens=java.base/sun.nio.ch=ALL-UNNAMED --add-opens=java.base/java.util=ALL-UNNAMED --add-opens=java.base/java.util.concurrent=ALL-UNNAMED --add-opens=java.base/jdk.internal.misc=ALL-UNNAMED --add-opens=java.base/java.lang.reflect=ALL-UNNAMED --add-opens=java.base/java.io=ALL-UNNAMED -Dio.netty.tryReflectionSetAccessible=true"
echo "$JOPTS" >"$DIR/jopts.txt"
java $JOPTS -cp "$CP" alluxio.cli.Format master >"$DIR/logs/format.out" 2>&1
java -Xmx2g -Dalluxio.logger.type=MASTER_LOGGER $JOPTS -cp "$CP" alluxio.master.AlluxioMaster >"$DIR/logs/master.out" 2>&1 </dev/null &
echo $! >"$DIR/master.pid"
for i in $(seq 1 60); do grep -q "Primary started" "$DIR/logs/master.out" 2>/dev/null && break; sleep 1; done
java -Xmx2g -XX:MaxDirectMemorySize=4g -Dalluxio.logger.type=WORKER_LOGGER $JOPTS -cp "$CP" alluxio.worker.AlluxioWorker >"$DIR/logs/worker.out" 2>&1 </dev/null &
echo $! >"$DIR/worker.pid"
java -Xmx1g $OPENS -Dalluxio.logger.type=PROXY_LOGGER $JOPTS -cp "$CP" alluxio.proxy.AlluxioProxy >"$DIR/logs/proxy.out" 2>&1 </dev/null &
echo $! >"$DIR/proxy.pid"
for i in $(seq 1 60); do
  curl -s -m 2 http://127.0.0.1:19999/api/v1/master/info 2>/dev/null | grep -q '"workerAddresses"\|workers' && break; sleep 1; done
echo "Alluxio $V up: master 127.0.0.1:19998, S3 http://127.0.0.1:39999/api/v1/s3, shell:"
echo "  java ${JOPTS/log4j.properties/log4j-client.properties} -cp \"\$(cat $DIR/cp.txt)\" alluxio.cli.fs.FileSystemShell ls /"
echo "${JOPTS/log4j.properties/log4j-client.properties}" >"$DIR/jopts-client.txt"
