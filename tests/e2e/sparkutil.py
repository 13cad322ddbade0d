"""PySpark (local[2]) against an S3 endpoint through s3a, for the end-to-end tests.

The jars s3a needs (hadoop-aws, the AWS SDK v2 bundle and the analytics accelerator) are
fetched and cached by `scripts/install-spark PYTHON TOOLS_DIR`, which also installs
pyspark, pyarrow and pandas. Typical use in a test module:

    jars = find_jars(TOOLS_DIR)        # None: skip, or run scripts/install-spark first
    spark = spark_session("http://127.0.0.1:9000", "minioadmin", "minioadmin", jars)
    try:
        assert spark.read.text("s3a://bucket/file.txt").count() == n
    finally:
        spark.stop()

A SparkSession takes about 5 s to start (10 s on a loaded machine), and its first s3a job
about 3.5 s more, so share one per module or per test session. Only one can run per Python
process: the jars and the s3a settings are fixed when it starts.

With LOCUS_HADOOP_JAR and LOCUS_HADOOP_LIB set (scripts/build-hadoop-connector; the e2e
conftest sets them), every session can also read and write locus:// paths.

s3a in Hadoop 3.5 reads through the analytics-accelerator stream by default (GET with Range
and If-Match); `extra={"spark.hadoop.fs.s3a.input.stream.type": "classic"}` selects the
older stream.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# The files scripts/install-spark puts into TOOLS_DIR/jars (Hadoop 3.5.0, as pyspark 4.3.0 ships).
JAR_NAMES = (
    "hadoop-aws-3.5.0.jar",
    "bundle-2.35.4.jar",
    "analyticsaccelerator-s3-1.3.1.jar",
)


def find_jars(tools_dir) -> str | None:
    """The comma-joined absolute paths of the three s3a jars in TOOLS_DIR/jars, or None if
    any is missing. Reads the list scripts/install-spark wrote (jars/s3a-jars.txt; it names
    other versions if pyspark ships another Hadoop), else looks for JAR_NAMES."""
    d = Path(tools_dir).expanduser().absolute() / "jars"
    listed = d / "s3a-jars.txt"
    if listed.is_file():
        paths = [Path(p) for p in listed.read_text().strip().split(",") if p]
    else:
        paths = [d / n for n in JAR_NAMES]
    if not all(p.is_file() and p.stat().st_size > 0 for p in paths):
        return None
    return ",".join(str(p) for p in paths)


def session_jars(jars: str) -> str:
    """The driver class path spark_session() uses for `jars`: they, plus the Locus Hadoop
    connector's jar (locus://) when LOCUS_HADOOP_JAR names one (scripts/test and the e2e
    conftest build it). Every session carries it, since the first session fixes the JVM's
    class path for the rest of the process."""
    hadoop_jar = os.environ.get("LOCUS_HADOOP_JAR")
    if hadoop_jar and hadoop_jar not in jars.split(","):
        return f"{jars},{hadoop_jar}"
    return jars


def class_archive(archive_dir, jars: str) -> tuple[Path, bool]:
    """The class-data archive of the driver JVM for this JDK and class path (`jars`), and
    whether it has been written. Its name covers each jar's size and modification time, so
    a rebuilt jar (the JVM would ignore the old archive) gets an archive of its own."""
    import hashlib
    import shutil

    java = os.environ.get("JAVA_HOME") or os.path.realpath(shutil.which("java") or "java")
    stamps = []
    for j in (j for j in jars.split(",") if j):
        try:
            st = os.stat(j)
            stamps.append(f"{j}:{st.st_size}:{st.st_mtime_ns}")
        except OSError:
            stamps.append(f"{j}:missing")
    key = hashlib.sha256("\n".join([java, *stamps]).encode()).hexdigest()[:16]
    path = Path(archive_dir).expanduser().absolute() / f"spark-{key}.jsa"
    return path, path.is_file() and path.stat().st_size > 0


def class_archive_options(archive_dir, jars: str) -> str:
    """JVM options for a dynamic class-data-sharing archive (JDK 13+) kept in archive_dir,
    one per class path: the first JVM with this class path writes it when it exits, later
    ones map it instead of loading and verifying thousands of Spark, Hadoop and AWS SDK
    classes again (faster start-up and first query). The JVM ignores an archive that does
    not match (another JDK, changed jars) and runs as usual."""
    path, ready = class_archive(archive_dir, jars)
    if ready:
        return f"-XX:SharedArchiveFile={path} -Xshare:auto -Xlog:cds=off -Xlog:cds+dynamic=off"
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"-XX:ArchiveClassesAtExit={path} -Xlog:cds=off -Xlog:cds+dynamic=off"


def spark_session(endpoint: str, access_key: str, secret_key: str, jars: str, app: str = "locus-test",
                  extra: dict | None = None, class_archive_dir=None):
    """A local[2] SparkSession whose s3a:// paths go to `endpoint` (e.g. http://127.0.0.1:9000).

    `jars` is the comma-separated list find_jars() or scripts/install-spark gives. Path-style
    addressing, plain HTTP, region us-east-1, static keys. Everything binds to 127.0.0.1, the
    web UI is off and shuffles use 2 partitions, to keep it fast and quiet. `extra` adds or
    overrides Spark settings (s3a ones as "spark.hadoop.fs.s3a.*"). With `class_archive_dir`,
    the driver JVM shares class data through an archive there (class_archive_options). Stop
    it with spark.stop()."""
    from pyspark.sql import SparkSession

    if SparkSession.getActiveSession() is not None:
        raise RuntimeError("a SparkSession is already running in this process: stop it first "
                           "(jars and s3a settings are fixed when the JVM starts)")
    # Read by the JVM pyspark launches; without it Spark may pick a non-loopback address.
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    # Python workers (UDFs, RDD lambdas) run with this interpreter, not whatever `python3` is on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

    s3a = {
        "fs.s3a.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
        "fs.s3a.endpoint": endpoint,
        "fs.s3a.endpoint.region": "us-east-1",
        "fs.s3a.path.style.access": "true",
        "fs.s3a.connection.ssl.enabled": "false",
        "fs.s3a.access.key": access_key,
        "fs.s3a.secret.key": secret_key,
        "fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
        # A broken endpoint should fail a test in seconds, not after minutes of retries.
        "fs.s3a.attempts.maximum": "2",
        "fs.s3a.retry.limit": "2",
        "fs.s3a.retry.interval": "100ms",
    }
    jars = session_jars(jars)
    hadoop_lib = os.environ.get("LOCUS_HADOOP_LIB")
    b = (
        SparkSession.builder.master("local[2]")
        .appName(app)
        # On the driver's class path, not spark.jars: in local mode the driver is the only
        # JVM, and spark.jars would copy the 686 MB SDK bundle into /tmp/spark-*/userFiles-*
        # at every session start (about 1 s and 686 MB of disk each time).
        .config("spark.driver.extraClassPath", os.pathsep.join(j for j in jars.split(",") if j))
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
    )
    for k, v in s3a.items():
        b = b.config("spark.hadoop." + k, v)
    if hadoop_lib:
        b = b.config("spark.hadoop.fs.locus.native.library", hadoop_lib)
    if class_archive_dir:
        b = b.config("spark.driver.extraJavaOptions", class_archive_options(class_archive_dir, jars))
    for k, v in (extra or {}).items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
