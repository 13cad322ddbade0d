package io.locus.hadoop;

import java.io.EOFException;
import java.io.IOException;
import java.nio.ByteBuffer;
import org.apache.hadoop.fs.FSExceptionMessages;
import org.apache.hadoop.fs.FSInputStream;
import org.apache.hadoop.fs.FileSystem;

/**
 * A seekable stream over a Locus file. Reads fill a direct buffer (fs.locus.read.buffer,
 * 4 MiB by default) straight from the block file of a co-located worker, or from the data
 * path, and are served from it. A read that goes on where the buffer ended (a scan) fills
 * all of it; a read anywhere else (after a seek: Parquet's footer and column chunks) fills
 * only what it asks, at least 64 KiB, so a reader that jumps about does not pull 4 MiB per
 * request (at TPC-H SF 0.3 that was 14 times the bytes Spark used).
 */
final class LocusInputStream extends FSInputStream {
  private final String path;
  private final long length;
  private final FileSystem.Statistics stats;
  private final ByteBuffer buf;
  private long reader;
  private long pos;
  private long bufStart;
  private int bufLen;

  LocusInputStream(long reader, String path, long length, int bufferSize, FileSystem.Statistics stats) {
    this.reader = reader;
    this.path = path;
    this.length = length;
    this.stats = stats;
    this.buf = ByteBuffer.allocateDirect(bufferSize);
  }

  private void checkOpen() throws IOException {
    if (reader == 0) {
      throw new IOException(FSExceptionMessages.STREAM_IS_CLOSED + ": " + path);
    }
  }

  /** The least a read after a seek fills. */
  private static final int SEEK_FILL = 64 << 10;

  /** Bytes of the buffer available at pos, refilling it if pos is outside it. */
  private int available(long want) throws IOException {
    if (pos < bufStart || pos >= bufStart + bufLen) {
      boolean scan = bufLen > 0 && pos == bufStart + bufLen;
      int fill = scan ? buf.capacity() : (int) Math.min(buf.capacity(), Math.max(want, SEEK_FILL));
      int n = LocusNative.read(reader, pos, buf, fill);
      if (n <= 0) {
        bufLen = 0;
        return -1;
      }
      bufStart = pos;
      bufLen = n;
    }
    return (int) Math.min(want, bufStart + bufLen - pos);
  }

  @Override
  public synchronized int read() throws IOException {
    checkOpen();
    if (pos >= length) {
      return -1;
    }
    if (available(1) <= 0) {
      return -1;
    }
    int b = buf.get((int) (pos - bufStart)) & 0xff;
    pos++;
    if (stats != null) {
      stats.incrementBytesRead(1);
    }
    return b;
  }

  @Override
  public synchronized int read(byte[] b, int off, int len) throws IOException {
    checkOpen();
    if (off < 0 || len < 0 || len > b.length - off) {
      throw new IndexOutOfBoundsException();
    }
    if (len == 0) {
      return 0;
    }
    if (pos >= length) {
      return -1;
    }
    int n = available(len);
    if (n <= 0) {
      return -1;
    }
    buf.get((int) (pos - bufStart), b, off, n);
    pos += n;
    if (stats != null) {
      stats.incrementBytesRead(n);
    }
    return n;
  }

  @Override
  public synchronized void seek(long target) throws IOException {
    checkOpen();
    if (target < 0) {
      throw new EOFException(FSExceptionMessages.NEGATIVE_SEEK + ": " + target);
    }
    if (target > length) {
      throw new EOFException(FSExceptionMessages.CANNOT_SEEK_PAST_EOF + ": " + target);
    }
    pos = target;
  }

  @Override
  public synchronized long getPos() {
    return pos;
  }

  @Override
  public boolean seekToNewSource(long targetPos) {
    return false;
  }

  @Override
  public synchronized int available() throws IOException {
    checkOpen();
    return (int) Math.min(Integer.MAX_VALUE, length - pos);
  }

  @Override
  public synchronized void close() {
    if (reader != 0) {
      LocusNative.closeReader(reader);
      reader = 0;
    }
  }
}
