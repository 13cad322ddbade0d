package io.locus.hadoop;

import java.io.IOException;
import java.io.OutputStream;
import org.apache.hadoop.fs.FSExceptionMessages;

/**
 * A new Locus file being written. Bytes are gathered into chunks (fs.locus.write.buffer,
 * 4 MiB by default) and streamed to the write pipeline; close() returns once the write is
 * acknowledged per its write type (ASYNC_THROUGH: the durable in-memory replicas exist).
 * A failed write is abandoned: nothing of it is acknowledged.
 */
final class LocusOutputStream extends OutputStream {
  private final String path;
  private final byte[] buf;
  private int n;
  private long writer;

  LocusOutputStream(long writer, String path, int bufferSize) {
    this.writer = writer;
    this.path = path;
    this.buf = new byte[bufferSize];
  }

  private void checkOpen() throws IOException {
    if (writer == 0) {
      throw new IOException(FSExceptionMessages.STREAM_IS_CLOSED + ": " + path);
    }
  }

  private void send(byte[] b, int off, int len) throws IOException {
    try {
      LocusNative.write(writer, b, off, len);
    } catch (IOException | RuntimeException e) {
      long w = writer;
      writer = 0;
      LocusNative.abortWriter(w);
      throw e;
    }
  }

  private void drain() throws IOException {
    if (n > 0) {
      send(buf, 0, n);
      n = 0;
    }
  }

  @Override
  public synchronized void write(int b) throws IOException {
    checkOpen();
    if (n == buf.length) {
      drain();
    }
    buf[n++] = (byte) b;
  }

  @Override
  public synchronized void write(byte[] b, int off, int len) throws IOException {
    checkOpen();
    if (off < 0 || len < 0 || len > b.length - off) {
      throw new IndexOutOfBoundsException();
    }
    if (len >= buf.length) {
      drain();
      send(b, off, len);
      return;
    }
    if (len > buf.length - n) {
      drain();
    }
    System.arraycopy(b, off, buf, n, len);
    n += len;
  }

  @Override
  public synchronized void close() throws IOException {
    if (writer == 0) {
      return;
    }
    drain();
    long w = writer;
    writer = 0;
    LocusNative.closeWriter(w);
  }
}
