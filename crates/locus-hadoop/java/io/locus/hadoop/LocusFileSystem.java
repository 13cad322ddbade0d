package io.locus.hadoop;

import java.io.FileNotFoundException;
import java.io.IOException;
import java.net.URI;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.BlockLocation;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileAlreadyExistsException;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.hadoop.util.Progressable;

/**
 * Hadoop FileSystem for {@code locus://[master-host:port]/path}.
 *
 * <p>Set {@code fs.locus.impl=io.locus.hadoop.LocusFileSystem} (Spark:
 * {@code spark.hadoop.fs.locus.impl}) and put the jar on the class path. Settings:
 *
 * <ul>
 *   <li>{@code fs.locus.native.library}: path of liblocus_hadoop.so (else the
 *       LOCUS_HADOOP_LIB variable, else java.library.path);
 *   <li>{@code fs.locus.master}: the master's host:port when the URI names none (else
 *       LOCUS_MASTER, else the Locus config's master_address, 127.0.0.1:19998);
 *   <li>{@code fs.locus.config}: a Locus TOML config file for the client settings (else
 *       LOCUS_CONFIG); LOCUS_* variables apply as for the CLI;
 *   <li>{@code fs.locus.token.file}: the cluster's client token file (else the config's
 *       security.token_file, LOCUS_SECURITY__TOKEN_FILE, ./locus-data/client.token);
 *   <li>{@code fs.locus.tls.ca.file}: CA certificates (PEM) of a cluster that serves TLS;
 *       set, the connector connects over TLS (else security.tls_ca_file,
 *       LOCUS_SECURITY__TLS_CA_FILE; default plain TCP);
 *   <li>{@code fs.locus.read.buffer} and {@code fs.locus.write.buffer}: bytes per native
 *       read and per chunk written, 4 MiB each by default.
 * </ul>
 *
 * <p>{@code getFileBlockLocations} names, per block, the hosts of the workers caching it (for a
 * block no worker caches, the worker a read would fill it on).
 * Not supported: append, concat, permissions and owners (every file is reported as the
 * current user's, 0644/0755), hflush/hsync before close.
 */
public class LocusFileSystem extends FileSystem {
  private URI uri;
  private Path workingDir;
  private long ctx;
  private int readBuffer;
  private int writeBuffer;
  private String user;

  @Override
  public String getScheme() {
    return "locus";
  }

  @Override
  public void initialize(URI name, Configuration conf) throws IOException {
    super.initialize(name, conf);
    setConf(conf);
    String lib = conf.get("fs.locus.native.library", System.getenv("LOCUS_HADOOP_LIB"));
    LocusNative.load(lib);
    String master = name.getAuthority();
    if (master == null || master.isEmpty()) {
      master = conf.get("fs.locus.master", "");
    }
    String config = conf.get("fs.locus.config", "");
    String tokenFile = conf.get("fs.locus.token.file", "");
    String caFile = conf.get("fs.locus.tls.ca.file", "");
    ctx = LocusNative.connect(master, config, tokenFile, caFile);
    uri = URI.create("locus://" + (name.getAuthority() == null ? "" : name.getAuthority()) + "/");
    workingDir = new Path("/");
    readBuffer = conf.getInt("fs.locus.read.buffer", 4 << 20);
    writeBuffer = conf.getInt("fs.locus.write.buffer", 4 << 20);
    user = System.getProperty("user.name", "locus");
  }

  @Override
  public URI getUri() {
    return uri;
  }

  /** The Locus path (absolute, no scheme or authority) of {@code p}. */
  private String locusPath(Path p) {
    Path q = p.isAbsolute() ? p : new Path(workingDir, p);
    String s = q.toUri().getPath();
    return s.isEmpty() ? "/" : s;
  }

  private FileStatus status(Path p, long[] a, int i) {
    boolean dir = a[i] != 0;
    return new FileStatus(
        dir ? 0 : a[i + 1],
        dir,
        1,
        a[i + 3],
        a[i + 2],
        a[i + 2],
        dir ? FsPermission.getDirDefault() : FsPermission.getFileDefault(),
        user,
        user,
        p.makeQualified(uri, workingDir));
  }

  @Override
  public FileStatus getFileStatus(Path f) throws IOException {
    return status(f, LocusNative.stat(ctx, locusPath(f)), 0);
  }

  /**
   * One location per Locus block in the range, naming the hosts of the workers that cache
   * it (a scheduler's locality hint); a block no worker holds names no host.
   */
  @Override
  public BlockLocation[] getFileBlockLocations(FileStatus file, long start, long len) throws IOException {
    if (file == null) {
      return null;
    }
    if (start < 0 || len < 0) {
      throw new IllegalArgumentException("Invalid start or len parameter");
    }
    if (file.isDirectory() || file.getLen() <= start) {
      return new BlockLocation[0];
    }
    Object[] r = LocusNative.blockLocations(ctx, locusPath(file.getPath()), start, len);
    String[] hosts = (String[]) r[0];
    long[] spans = (long[]) r[1];
    BlockLocation[] out = new BlockLocation[hosts.length];
    for (int i = 0; i < hosts.length; i++) {
      String[] hs = hosts[i].isEmpty() ? new String[0] : hosts[i].split(",");
      out[i] = new BlockLocation(hs, hs, spans[2 * i], spans[2 * i + 1]);
    }
    return out;
  }

  @Override
  public FSDataInputStream open(Path f, int bufferSize) throws IOException {
    String p = locusPath(f);
    long[] r = LocusNative.open(ctx, p);
    return new FSDataInputStream(new LocusInputStream(r[0], p, r[1], readBuffer, statistics));
  }

  @Override
  public FSDataOutputStream create(
      Path f,
      FsPermission permission,
      boolean overwrite,
      int bufferSize,
      short replication,
      long blockSize,
      Progressable progress)
      throws IOException {
    String p = locusPath(f);
    try {
      long[] a = LocusNative.stat(ctx, p);
      if (a[0] != 0) {
        throw new FileAlreadyExistsException(p + " is a directory");
      }
      if (!overwrite) {
        throw new FileAlreadyExistsException(p + " already exists");
      }
    } catch (FileNotFoundException e) {
      // the usual case
    }
    Path parent = f.getParent();
    if (parent != null) {
      mkdirs(parent);
    }
    long w = LocusNative.create(ctx, p, overwrite);
    return new FSDataOutputStream(new LocusOutputStream(w, p, writeBuffer), statistics);
  }

  @Override
  public FSDataOutputStream append(Path f, int bufferSize, Progressable progress) throws IOException {
    throw new UnsupportedOperationException("Locus files cannot be appended to: " + f);
  }

  @Override
  public boolean rename(Path src, Path dst) throws IOException {
    String s = locusPath(src);
    String d = locusPath(dst);
    if (s.equals("/") || s.equals(d)) {
      return s.equals(d) && exists(src);
    }
    FileStatus ds;
    try {
      ds = getFileStatus(dst);
    } catch (FileNotFoundException e) {
      ds = null;
    }
    if (ds != null) {
      if (!ds.isDirectory()) {
        return false;
      }
      d = locusPath(new Path(dst, src.getName())); // into the directory, as HDFS does
    } else {
      Path parent = dst.getParent();
      if (parent != null && !exists(parent)) {
        return false;
      }
    }
    return LocusNative.rename(ctx, s, d);
  }

  @Override
  public boolean delete(Path f, boolean recursive) throws IOException {
    String p = locusPath(f);
    if (p.equals("/")) {
      return false;
    }
    return LocusNative.delete(ctx, p, recursive);
  }

  @Override
  public FileStatus[] listStatus(Path f) throws IOException {
    String p = locusPath(f);
    long[] a = LocusNative.stat(ctx, p);
    if (a[0] == 0) {
      return new FileStatus[] {status(f, a, 0)};
    }
    Object[] r = LocusNative.list(ctx, p);
    String[] names = (String[]) r[0];
    long[] attrs = (long[]) r[1];
    FileStatus[] out = new FileStatus[names.length];
    Path dir = f.makeQualified(uri, workingDir);
    for (int i = 0; i < names.length; i++) {
      out[i] = status(new Path(dir, names[i]), attrs, 4 * i);
    }
    return out;
  }

  @Override
  public void setWorkingDirectory(Path dir) {
    workingDir = dir.isAbsolute() ? dir : new Path(workingDir, dir);
  }

  @Override
  public Path getWorkingDirectory() {
    return workingDir;
  }

  @Override
  public boolean mkdirs(Path f, FsPermission permission) throws IOException {
    LocusNative.mkdirs(ctx, locusPath(f));
    return true;
  }

  @Override
  public void close() throws IOException {
    try {
      super.close();
    } finally {
      if (ctx != 0) {
        LocusNative.close(ctx);
        ctx = 0;
      }
    }
  }
}
