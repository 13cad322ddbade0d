//! `locus bench gateway`: the S3 gateway against MinIO, side by side in one run, both on
//! loopback, through one S3 client (OpenDAL): single-stream and 4-stream GET of a cached
//! object, single-request PUT, and the p50/p99 latency of 4 KiB GETs. Runs alternate
//! between the two servers so that background noise hits both alike.

use std::time::Instant;

use bytes::Bytes;
use futures::StreamExt;
use locus_common::config::Config;
use locus_common::{Error, Result};
use locus_ufs::Ufs;
use serde::Serialize;

use locus_cluster::LocalCluster;

use crate::{MinioTarget, loopback_config, machine, median, percentile, s3_client, with_cluster};

/// What `locus bench gateway` needs: a MinIO to compare with (its bucket must exist).
#[derive(Clone, Debug)]
pub struct GatewayBench {
    pub minio: MinioTarget,
    pub size: u64,
    pub runs: usize,
    pub small_gets: usize,
    pub work_dir: std::path::PathBuf,
}

#[derive(Clone, Debug, Serialize)]
pub struct Measure {
    pub name: String,
    pub unit: String,
    pub minio: f64,
    pub locus: f64,
    /// Locus / MinIO (throughput: higher is better for Locus; latency: lower is).
    pub ratio: f64,
    pub minio_runs: Vec<f64>,
    pub locus_runs: Vec<f64>,
}

/// One GET of the whole object as one stream; returns the bytes.
async fn get(s3: &Ufs, key: &str, size: u64) -> Result<u64> {
    let mut s = Box::pin(s3.read_range(key, 0, size, size.max(1) as usize, 1).await?);
    let mut n = 0u64;
    while let Some(b) = s.next().await {
        n += b?.len() as u64;
    }
    if n != size {
        return Err(Error::internal(format!("read {n} of {size} bytes of {key}")));
    }
    Ok(n)
}

impl GatewayBench {
    pub async fn run(&self) -> Result<Vec<Measure>> {
        let mut cfg = loopback_config();
        cfg.worker.tiers = vec![locus_common::config::TierConfig {
            alias: locus_common::config::TierAlias::Mem,
            dir: std::path::PathBuf::from("/dev/shm").join(format!("locus-gwbench-{}", std::process::id())),
            quota: bytesize::ByteSize::b(self.size * 3 + (1 << 30)),
        }];
        let res = with_cluster(cfg, &self.work_dir, true, async |c| self.measure(c).await).await;
        let _ = std::fs::remove_dir_all(format!("/dev/shm/locus-gwbench-{}", std::process::id()));
        res
    }

    async fn measure(&self, cluster: &LocalCluster) -> Result<Vec<Measure>> {
        let gw = cluster.gateway_address().ok_or_else(|| Error::internal("the gateway is not running"))?;
        // Locus serves a bucket mounted from the same MinIO, so both hold the same bytes.
        let lc = cluster.client(Default::default())?;
        let m = &self.minio;
        lc.mount(locus_proto::pb::MountRequest {
            path: "/lake".into(),
            uri: format!("s3://{}/via-locus", m.bucket),
            options: m.mount_options().into_iter().collect(),
            readonly: false,
            sync_interval_ms: 3_600_000,
            ..Default::default()
        })
        .await?;
        let timeout = std::time::Duration::from_secs(300);
        let minio = s3_client(&m.endpoint, &m.bucket, &m.access_key, &m.secret_key, timeout)?;
        let cfgd = Config::default().gateway;
        let locus = s3_client(&format!("http://{gw}"), "lake", &cfgd.access_key_id, &cfgd.secret_access_key, timeout)?;
        let data = Bytes::from((0..self.size).map(|i| (i * 2654435761 % 251) as u8).collect::<Vec<u8>>());
        let small = Bytes::from(vec![7u8; 4096]);
        let mut out = Vec::new();

        // PUT: one request per object, alternating.
        let (mut pm, mut pl) = (Vec::new(), Vec::new());
        for i in 0..self.runs {
            for (s3, v) in [(&minio, &mut pm), (&locus, &mut pl)] {
                let t = Instant::now();
                s3.put(&format!("put/{i}"), data.clone()).await?;
                v.push(self.size as f64 / (1 << 20) as f64 / t.elapsed().as_secs_f64());
            }
        }
        out.push(measure("PUT (one request)", "MiB/s", pm, pl));

        // The object to GET, in both; Locus's copy is cached by a first read.
        minio.put("obj", data.clone()).await?;
        locus.put("obj", data.clone()).await?;
        minio.put("small", small.clone()).await?;
        locus.put("small", small.clone()).await?;
        get(&locus, "obj", self.size).await?;
        get(&locus, "small", 4096).await?;
        let fi = lc.status("/lake/obj", true).await?;
        if fi.blocks.iter().any(|b| b.locations.is_empty()) {
            return Err(Error::internal("the object is not cached after a full read"));
        }

        let (mut gm, mut gl) = (Vec::new(), Vec::new());
        for _ in 0..self.runs {
            for (s3, v) in [(&minio, &mut gm), (&locus, &mut gl)] {
                let t = Instant::now();
                get(s3, "obj", self.size).await?;
                v.push(self.size as f64 / (1 << 20) as f64 / t.elapsed().as_secs_f64());
            }
        }
        out.push(measure("GET cached object, 1 stream", "MiB/s", gm, gl));

        let (mut fm, mut fl) = (Vec::new(), Vec::new());
        for _ in 0..self.runs {
            for (s3, v) in [(&minio, &mut fm), (&locus, &mut fl)] {
                let t = Instant::now();
                let gets = (0..4).map(|_| get(s3, "obj", self.size));
                for r in futures::future::join_all(gets).await {
                    r?;
                }
                v.push(4.0 * self.size as f64 / (1 << 20) as f64 / t.elapsed().as_secs_f64());
            }
        }
        out.push(measure("GET cached object, 4 streams (aggregate)", "MiB/s", fm, fl));

        // 4 KiB GETs, in alternating batches of 10.
        let (mut lm, mut ll) = (Vec::new(), Vec::new());
        for _ in 0..self.small_gets.div_ceil(10) {
            for (s3, v) in [(&minio, &mut lm), (&locus, &mut ll)] {
                for _ in 0..10 {
                    let t = Instant::now();
                    get(s3, "small", 4096).await?;
                    v.push(t.elapsed().as_secs_f64() * 1000.0);
                }
            }
        }
        for (name, p) in [("4 KiB GET p50", 0.5), ("4 KiB GET p99", 0.99)] {
            let (a, b) = (percentile(&lm, p), percentile(&ll, p));
            out.push(Measure {
                name: name.into(),
                unit: "ms".into(),
                minio: a,
                locus: b,
                ratio: b / a,
                minio_runs: Vec::new(),
                locus_runs: Vec::new(),
            });
        }
        Ok(out)
    }
}

fn measure(name: &str, unit: &str, minio: Vec<f64>, locus: Vec<f64>) -> Measure {
    let (a, b) = (median(&minio), median(&locus));
    Measure {
        name: name.into(),
        unit: unit.into(),
        minio: a,
        locus: b,
        ratio: b / a,
        minio_runs: minio,
        locus_runs: locus,
    }
}

/// The result as Markdown, with the machine facts and the goals.
pub fn markdown(b: &GatewayBench, rows: &[Measure]) -> String {
    let mut s = format!(
        "Object {}, {} runs per throughput row (medians), {} GETs of 4 KiB per server. {} Both servers on loopback; Locus = `locus local start` (1 worker, MEM tier) with its gateway, serving a bucket mounted from the same MinIO; client: OpenDAL S3.\n\n",
        bytesize::ByteSize::b(b.size).display().iec(),
        b.runs,
        b.small_gets,
        machine()
    );
    s.push_str("| measure | MinIO | Locus gateway | Locus / MinIO | goal |\n|---|---|---|---|---|\n");
    for r in rows {
        let goal = match r.name.as_str() {
            n if n.starts_with("GET cached") => "≥ 1.00",
            "4 KiB GET p50" => "≤ 1.00",
            _ => "",
        };
        s.push_str(&format!(
            "| {} ({}) | {:.2} | {:.2} | {:.2} | {goal} |\n",
            r.name, r.unit, r.minio, r.locus, r.ratio
        ));
    }
    s
}
