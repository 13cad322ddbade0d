//! A change whose reply is lost is sent again with its request id and made once
//! (docs/design/ha-plan.md, stage 2), through fault point
//! `master.after_apply_before_reply`: in process, where the reply is dropped as a broken
//! connection drops it; and with the real `locus` binary, whose master the fault point
//! kills with SIGKILL between its commit and its reply while a CLI put and a gateway put
//! are under way.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use locus_common::config::ClientConfig;
use locus_common::fail;
use sha2::Digest;

use crate::common;

const FP: &str = "master.after_apply_before_reply";

/// Each change call of the client loses its reply once, as a broken connection loses
/// it: the client sends it again with the same request id, and the master answers with
/// the first result instead of making the change again (a mkdir, a delete, a mount or an
/// unmount made twice would fail, a rename's source would be gone).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn changes_whose_replies_are_lost_are_sent_again_and_made_once() {
    let _turn = super::SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let c = common::start(dir.path(), 1, 64 << 20, false).await;
    let cl = c.client(ClientConfig::default()).unwrap();

    fail::cfg(FP, "1*return").unwrap();
    cl.mkdir("/d", false).await.unwrap();
    // The write's create and its complete each lose their first reply.
    fail::cfg(FP, "1*return->1*off->1*return").unwrap();
    let data = common::random(3 << 20);
    let fi = common::put_as(&cl, "/d/f", &data, locus_common::config::WriteType::CacheThrough).await.unwrap();
    assert_eq!(fi.length, data.len() as u64);
    assert_eq!(cl.status("/d/f", false).await.unwrap().version, fi.version);
    fail::cfg(FP, "1*return").unwrap();
    cl.rename("/d/f", "/d/g").await.unwrap();
    assert_eq!(common::read_all(&cl, "/d/g").await, data);
    fail::cfg(FP, "1*return").unwrap();
    cl.create_and_complete_empty("/d/e", None).await.unwrap();
    fail::cfg(FP, "1*return").unwrap();
    cl.delete("/d/g", false).await.unwrap();
    let e = cl.status("/d/g", false).await.unwrap_err();
    assert_eq!(e.kind(), locus_common::ErrorKind::NotFound);
    let names = super::names(&cl, "/d").await.unwrap();
    assert_eq!(names, ["e"]);
    let lake = dir.path().join("lake");
    std::fs::create_dir_all(&lake).unwrap();
    fail::cfg(FP, "1*return").unwrap();
    let uri = format!("file://{}", lake.display());
    let m = cl.mount(locus_proto::pb::MountRequest { path: "/m".into(), uri, ..Default::default() }).await.unwrap();
    assert_eq!(m.path, "/m");
    fail::cfg(FP, "1*return").unwrap();
    cl.unmount("/m").await.unwrap();
    assert!(cl.mount_table().await.unwrap().iter().all(|t| t.path != "/m"));
    fail::remove(FP);
    c.shutdown().await;
}

/// A multipart upload's completion through the gateway whose create and complete each
/// lose their reply once: the client answers the first results, and S3 sees one
/// object, its ETag of two parts, and no upload left.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_multipart_completion_whose_replies_are_lost_completes_once() {
    let _turn = super::SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let mut c = common::start(dir.path(), 1, 64 << 20, false).await;
    let gw = c.start_gateway().await.unwrap().to_string();
    let s3 = |method: &'static str, target: String, body: Vec<u8>| {
        let gw = gw.clone();
        tokio::task::spawn_blocking(move || curl_s3(&gw, method, &target, &body))
    };
    assert_eq!(s3("PUT", "/bkt".into(), vec![]).await.unwrap().0, 200);
    let (st, _, body) = s3("POST", "/bkt/obj?uploads=".into(), vec![]).await.unwrap();
    assert_eq!(st, 200, "{}", String::from_utf8_lossy(&body));
    let upload = between(&String::from_utf8_lossy(&body), "<UploadId>", "</UploadId>");
    let parts = [common::random(5 << 20), common::random(1000)];
    let mut xml = String::from("<CompleteMultipartUpload>");
    for (i, p) in parts.iter().enumerate() {
        let (st, headers, _) =
            s3("PUT", format!("/bkt/obj?partNumber={}&uploadId={upload}", i + 1), p.clone()).await.unwrap();
        assert_eq!(st, 200);
        let etag = between(&headers.to_ascii_lowercase(), "etag: ", "\r\n");
        xml += &format!("<Part><PartNumber>{}</PartNumber><ETag>{etag}</ETag></Part>", i + 1);
    }
    xml += "</CompleteMultipartUpload>";

    fail::cfg(FP, "1*return->1*off->1*return").unwrap();
    let (st, _, body) = s3("POST", format!("/bkt/obj?uploadId={upload}"), xml.into_bytes()).await.unwrap();
    let body = String::from_utf8_lossy(&body).to_string();
    assert_eq!(st, 200, "{body}");
    assert!(body.contains("-2&quot;</ETag>") || body.contains("-2\"</ETag>"), "{body}");
    fail::remove(FP);
    let (st, _, got) = s3("GET", "/bkt/obj".into(), vec![]).await.unwrap();
    assert_eq!(st, 200);
    assert_eq!(got, parts.concat());
    let (_, _, list) = s3("GET", "/bkt?uploads=".into(), vec![]).await.unwrap();
    assert!(!String::from_utf8_lossy(&list).contains("<Upload>"), "{}", String::from_utf8_lossy(&list));
    c.shutdown().await;
}

/// A CLI put whose master is killed (SIGKILL) between committing its create and
/// answering it, and again between committing its complete and answering it, reports
/// success once the master is back, and the file reads back whole.
#[test]
fn a_cli_put_succeeds_across_master_kills_between_commit_and_reply() {
    let mut p = Procs::start("return(kill)");
    let data = common::random(3 << 20);
    let src = p.dir.path().join("src.bin");
    std::fs::write(&src, &data).unwrap();
    let put = p.cli(&["fs", "put", src.to_str().unwrap(), "/f"]).stdout(Stdio::piped()).spawn().unwrap();
    p.master_killed();
    // The create's resend is answered from the retry cache; the complete's kills again.
    p.start_master("1*off->return(kill)");
    p.master_killed();
    p.start_master("");
    let out = finish(put);
    assert!(out.starts_with("wrote /f (3145728 bytes"), "{out}");
    // The restarted master knows the blocks once the worker has registered again (the
    // locations are soft state: docs/design/ha-plan.md, section 4).
    p.wait_live_worker();
    let cat = p.cli(&["fs", "cat", "/f"]).output().unwrap();
    assert!(cat.status.success(), "{}", String::from_utf8_lossy(&cat.stderr));
    assert!(cat.stdout == data, "the file read back differs");
}

/// The same through the S3 gateway: a PUT (curl, SigV4) whose master is killed after
/// committing the create and after committing the complete answers 200, and the object
/// reads back whole.
#[test]
fn a_gateway_put_succeeds_across_master_kills_between_commit_and_reply() {
    let mut p = Procs::start("");
    let gw = p.gateway.clone();
    assert_eq!(curl_s3(&gw, "PUT", "/bkt", b"").0, 200);
    p.kill_master();
    p.start_master("return(kill)");
    let data = common::random(3 << 20);
    let put = {
        let (gw, data) = (gw.clone(), data.clone());
        std::thread::spawn(move || curl_s3(&gw, "PUT", "/bkt/obj", &data))
    };
    p.master_killed();
    p.start_master("1*off->return(kill)");
    p.master_killed();
    p.start_master("");
    let (st, _, body) = put.join().unwrap();
    assert_eq!(st, 200, "{}", String::from_utf8_lossy(&body));
    p.wait_live_worker();
    let (st, _, got) = curl_s3(&gw, "GET", "/bkt/obj", b"");
    assert_eq!(st, 200);
    assert!(got == data, "the object read back differs");
}

/// A member of a one-member group killed (SIGKILL) right after acknowledging changes
/// (before its namespace is flushed: entries are applied without an fsync, and the log
/// holds them) has every one of them after its restart.
#[test]
fn a_group_member_killed_after_acknowledging_loses_nothing() {
    let mut p = Procs::start_as("", true);
    let data = common::random(1 << 20);
    let src = p.dir.path().join("src.bin");
    std::fs::write(&src, &data).unwrap();
    let run = |p: &Procs, args: &[&str]| {
        let out = p.cli(args).output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        out.stdout
    };
    run(&p, &["fs", "put", "--write-type", "CACHE_THROUGH", src.to_str().unwrap(), "/f"]);
    run(&p, &["fs", "mkdir", "/d"]);
    run(&p, &["fs", "mv", "/f", "/d/g"]);
    p.kill_master();
    p.start_master("");
    p.wait_live_worker();
    assert!(run(&p, &["fs", "cat", "/d/g"]) == data, "the file read back differs");
    let moved = p.cli(&["fs", "stat", "/f"]).output().unwrap();
    assert!(!moved.status.success(), "/f is still there after the move");
    assert!(p.dir.path().join("master/raft.redb").exists());
}

/// The text of `s` between `a` and the next `b`.
fn between(s: &str, a: &str, b: &str) -> String {
    let start = s.find(a).unwrap_or_else(|| panic!("no {a} in {s}")) + a.len();
    let len = s[start..].find(b).unwrap_or_else(|| panic!("no {b} after {a} in {s}"));
    s[start..start + len].to_string()
}

/// One S3 request to the gateway at `gw` with curl, signed (SigV4) with the default
/// keys: its status, its headers and its body. (curl 7.88 signs a query parameter with
/// no value wrongly: write `?uploads=`, not `?uploads`.)
fn curl_s3(gw: &str, method: &str, target: &str, body: &[u8]) -> (u16, String, Vec<u8>) {
    let tmp = tempfile::tempdir().unwrap();
    let (input, headers, output) = (tmp.path().join("in"), tmp.path().join("headers"), tmp.path().join("out"));
    std::fs::write(&input, body).unwrap();
    let sha: String = sha2::Sha256::digest(body).iter().map(|b| format!("{b:02x}")).collect();
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "--max-time", "120", "-X", method, "--aws-sigv4", "aws:amz:us-east-1:s3"])
        .args(["--user", "locusadmin:locusadmin", "-H", &format!("x-amz-content-sha256: {sha}")])
        .args(["-D", headers.to_str().unwrap(), "-o", output.to_str().unwrap(), "-w", "%{http_code}"]);
    if !body.is_empty() {
        cmd.args(["-H", "content-type: application/octet-stream", "--data-binary"]);
        cmd.arg(format!("@{}", input.display()));
    }
    let out = cmd.arg(format!("http://{gw}{target}")).output().unwrap();
    assert!(out.status.success(), "curl: {}", String::from_utf8_lossy(&out.stderr));
    let status = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    (status, std::fs::read_to_string(headers).unwrap(), std::fs::read(output).unwrap())
}

/// Waits for a CLI command to end, and returns its output; it must succeed.
fn finish(mut child: Child) -> String {
    let status = child.wait().unwrap();
    let mut out = String::new();
    child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    assert!(status.success(), "exit {status}: {out}");
    out
}

/// A free port on 127.0.0.1, below the ephemeral range.
fn free_address() -> String {
    locus_cluster::free_address().unwrap()
}

/// The real binary's processes for one test: a master (started again at will, with its
/// fault points in `FAILPOINTS`), a worker and a gateway, on loopback ports, their logs
/// in the test's directory.
struct Procs {
    dir: tempfile::TempDir,
    /// The master runs as a one-member replicated group (`--raft-address`).
    group: bool,
    rpc: String,
    web: String,
    gateway: String,
    master: Option<Child>,
    others: Vec<Child>,
}

impl Procs {
    /// A cluster whose first master runs with fault points `fp`, its worker live.
    fn start(fp: &str) -> Procs {
        Procs::start_as(fp, false)
    }

    /// [`Procs::start`], the master a one-member replicated group with `group`.
    fn start_as(fp: &str, group: bool) -> Procs {
        let dir = tempfile::tempdir().unwrap();
        let mut p = Procs {
            dir,
            group,
            rpc: free_address(),
            web: free_address(),
            gateway: free_address(),
            master: None,
            others: Vec::new(),
        };
        p.start_master(fp);
        let d = p.dir.path().to_path_buf();
        // The others read the credentials the master makes at its start.
        let deadline = Instant::now() + Duration::from_secs(60);
        while !d.join("client.token").exists() {
            assert!(Instant::now() < deadline, "no client token after 60 s: {}", p.tail("master"));
            std::thread::sleep(Duration::from_millis(20));
        }
        let tier = format!("MEM:{}:64MiB", d.join("mem").display());
        let wdir = d.join("worker");
        let worker = ["worker", "--data-address", "127.0.0.1:0", "--data-dir", wdir.to_str().unwrap()];
        let w = p.spawn("worker", &[&worker[..], &["--tier", &tier]].concat(), "");
        let g = p.spawn("gateway", &["gateway", "--address", &p.gateway.clone()], "");
        p.others.extend([w, g]);
        p.wait_live_worker();
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(&p.gateway).is_err() {
            assert!(Instant::now() < deadline, "the gateway is not listening after 60 s: {}", p.tail("gateway"));
            std::thread::sleep(Duration::from_millis(50));
        }
        p
    }

    fn spawn(&self, name: &str, args: &[&str], fp: &str) -> Child {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.log(name)).unwrap();
        let mut cmd = self.cli(args);
        cmd.stdout(log.try_clone().unwrap()).stderr(log);
        if !fp.is_empty() {
            cmd.env("FAILPOINTS", format!("{FP}={fp}"));
        }
        cmd.spawn().unwrap()
    }

    fn log(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.log"))
    }

    /// The `locus` binary with this cluster's master and credentials.
    fn cli(&self, args: &[&str]) -> Command {
        let d = self.dir.path();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_locus"));
        cmd.args(["--master", &self.rpc]).args(args);
        cmd.env("LOCUS_SECURITY__SECRET_FILE", d.join("cluster.secret"))
            .env("LOCUS_SECURITY__TOKEN_FILE", d.join("client.token"))
            .env_remove("FAILPOINTS")
            .stdin(Stdio::null());
        cmd
    }

    /// Starts the master (on the same ports and directory as before), with fault points `fp`.
    fn start_master(&mut self, fp: &str) {
        let d: &Path = self.dir.path();
        let ufs = format!("file://{}", d.join("ufs").display());
        let meta = d.join("master").to_str().unwrap().to_string();
        let args = ["master", "--root-ufs", &ufs, "--rpc-address", &self.rpc, "--web-address", &self.web];
        let mut args = [&args[..], &["--meta-dir", &meta]].concat();
        if self.group {
            args.extend(["--raft-address", "127.0.0.1:19997"]);
        }
        let m = self.spawn("master", &args, fp);
        self.master = Some(m);
    }

    /// Waits until the fault point has killed the master.
    fn master_killed(&mut self) {
        use std::os::unix::process::ExitStatusExt;
        let m = self.master.as_mut().unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(s) = m.try_wait().unwrap() {
                break s;
            }
            assert!(Instant::now() < deadline, "the master was not killed in 60 s: {}", self.tail("master"));
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{}", self.tail("master"));
        self.master = None;
    }

    /// Kills the master (SIGKILL).
    fn kill_master(&mut self) {
        let mut m = self.master.take().unwrap();
        m.kill().unwrap();
        m.wait().unwrap();
    }

    fn wait_live_worker(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let out = self.cli(&["report", "--json"]).output().unwrap();
            let report: String = String::from_utf8_lossy(&out.stdout).split_whitespace().collect();
            if report.contains("\"live_workers\":1,") {
                return;
            }
            assert!(Instant::now() < deadline, "no live worker in 60 s: {}", self.tail("worker"));
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn tail(&self, name: &str) -> String {
        let s = std::fs::read_to_string(self.log(name)).unwrap_or_default();
        s.lines().rev().take(30).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n")
    }
}

/// Every process stops with the test, passed or failed.
impl Drop for Procs {
    fn drop(&mut self) {
        for c in self.others.iter_mut().chain(self.master.as_mut()) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
