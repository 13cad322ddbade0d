package io.locus.hadoop;

import java.io.IOException;
import java.nio.ByteBuffer;

/**
 * The JNI entry points of liblocus_hadoop (crates/locus-hadoop/src/lib.rs). Handles are
 * opaque: a connection from {@link #connect}, a reader from {@link #open}, a writer from
 * {@link #create}. Locus errors arrive as exceptions: FileNotFoundException,
 * FileAlreadyExistsException, AccessControlException, PathIsNotEmptyDirectoryException or
 * IOException.
 */
final class LocusNative {
  private static volatile boolean loaded;

  private LocusNative() {}

  /** Loads the library once: from {@code path} when given, else from java.library.path. */
  static synchronized void load(String path) {
    if (loaded) {
      return;
    }
    if (path != null && !path.isEmpty()) {
      System.load(path);
    } else {
      System.loadLibrary("locus_hadoop");
    }
    loaded = true;
  }

  /**
   * A connection to the master at {@code master} (empty: the configured default),
   * presenting the client token in {@code tokenFile} (empty: the configured one), over
   * TLS trusting the CA certificates in {@code caFile} (empty: the configured ones, if any).
   */
  static native long connect(String master, String configFile, String tokenFile, String caFile)
      throws IOException;

  static native void close(long ctx);

  /** {isDir, length, mtimeMs, blockSize}. */
  static native long[] stat(long ctx, String path) throws IOException;

  /** {String[] names, long[] attributes, 4 per entry as in stat}. */
  static native Object[] list(long ctx, String path) throws IOException;

  /** {String[] comma-separated hosts per block, long[] (offset, length) per block}. */
  static native Object[] blockLocations(long ctx, String path, long start, long len) throws IOException;

  static native void mkdirs(long ctx, String path) throws IOException;

  static native boolean delete(long ctx, String path, boolean recursive) throws IOException;

  static native boolean rename(long ctx, String src, String dst) throws IOException;

  /** Opens a file for reading: {reader, file length}; a directory is a FileNotFoundException. */
  static native long[] open(long ctx, String path) throws IOException;

  /** Reads up to len bytes at pos into the direct buffer buf (from its start); -1 at EOF. */
  static native int read(long reader, long pos, ByteBuffer buf, int len) throws IOException;

  static native void closeReader(long reader);

  static native long create(long ctx, String path, boolean overwrite) throws IOException;

  static native void write(long writer, byte[] data, int off, int len) throws IOException;

  static native void closeWriter(long writer) throws IOException;

  static native void abortWriter(long writer);
}
