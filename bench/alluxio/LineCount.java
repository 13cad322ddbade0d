// The Alluxio side of the line-count study (bench/seed_linecount.py): Alluxio's own Java
// client (FileSystem API, short-circuit on), in one JVM.
//   java -cp ALLUXIO_CP:. LineCount count PATH N   read PATH N times, count '\n';
//                                                 prints {"lines":..,"bytes":..,"seconds":[..]}
//   java -cp ALLUXIO_CP:. LineCount free PATH      free PATH from Alluxio's cache and wait
//                                                 until none of it is cached
import alluxio.AlluxioURI;
import alluxio.client.file.FileInStream;
import alluxio.client.file.FileSystem;
import alluxio.grpc.FreePOptions;

public class LineCount {
    public static void main(String[] args) throws Exception {
        AlluxioURI uri = new AlluxioURI(args[1]);
        try (FileSystem fs = FileSystem.Factory.create()) {
            if (args[0].equals("free")) {
                fs.free(uri, FreePOptions.newBuilder().setForced(true).build());
                long deadline = System.nanoTime() + 120_000_000_000L;
                while (fs.getStatus(uri).getInAlluxioPercentage() > 0) {
                    if (System.nanoTime() > deadline) throw new RuntimeException("free did not finish in 120 s");
                    Thread.sleep(200);
                }
                System.out.println("{\"freed\":true}");
                return;
            }
            int n = Integer.parseInt(args[2]);
            byte[] buf = new byte[4 << 20];
            StringBuilder secs = new StringBuilder();
            long lines = 0, bytes = 0;
            for (int i = 0; i < n; i++) {
                long t = System.nanoTime();
                lines = 0;
                bytes = 0;
                try (FileInStream in = fs.openFile(uri)) {
                    int r;
                    while ((r = in.read(buf)) > 0) {
                        bytes += r;
                        for (int j = 0; j < r; j++) if (buf[j] == '\n') lines++;
                    }
                }
                if (i > 0) secs.append(',');
                secs.append((System.nanoTime() - t) / 1e9);
            }
            System.out.println("{\"lines\":" + lines + ",\"bytes\":" + bytes + ",\"seconds\":[" + secs + "]}");
        }
    }
}
