//! The server roles: `locus master`, `locus worker` and `locus gateway`, each run until
//! Ctrl-C or SIGTERM.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;

use super::{Global, flag, parse_tiers, print_gateway_auth, runtime, wait_for_signal};

#[derive(Args)]
pub struct MasterArgs {
    /// gRPC bind address (default 127.0.0.1:19998).
    #[arg(long)]
    pub rpc_address: Option<String>,
    /// Status page and /metrics bind address (default 127.0.0.1:19999).
    #[arg(long)]
    pub web_address: Option<String>,
    /// Metadata directory (default ./locus-data/master).
    #[arg(long)]
    pub meta_dir: Option<PathBuf>,
    /// UFS mounted at / when the namespace is new (default file://<meta-dir>/../ufs; "none" for no root mount).
    #[arg(long)]
    pub root_ufs: Option<String>,
    /// Run as a member of a replicated master group, reached by its peers here: every
    /// change goes through the group's log (raft.redb beside the metadata).
    #[arg(long)]
    pub raft_address: Option<String>,
    /// The group's founding members' raft addresses, this one's among them (A,B,C). The
    /// first in sort order founds the group with its metadata; the others start empty.
    #[arg(long, value_delimiter = ',', requires = "raft_address")]
    pub peers: Option<Vec<String>>,
}

#[derive(Args)]
pub struct WorkerArgs {
    /// Data-path bind address (default 127.0.0.1:29999).
    #[arg(long)]
    pub data_address: Option<String>,
    /// Worker directory (default ./locus-data/worker).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// A tier as ALIAS:DIR:QUOTA, e.g. MEM:/dev/shm/locus:2GiB or SSD:/mnt/ssd:100GiB. Repeatable.
    #[arg(long = "tier")]
    pub tiers: Vec<String>,
}

#[derive(Args)]
pub struct GatewayArgs {
    /// Listen address (default 127.0.0.1:39999; also gateway.address / LOCUS_GATEWAY__ADDRESS).
    #[arg(long)]
    pub address: Option<String>,
}

pub fn master(g: &Global, a: &MasterArgs) -> Result<()> {
    let cfg = g.load_config([
        ("master.rpc_address", flag(&a.rpc_address)),
        ("master.web_address", flag(&a.web_address)),
        ("master.meta_dir", flag(&a.meta_dir)),
        ("master.raft_address", flag(&a.raft_address)),
        ("master.peers", flag(&a.peers)),
    ])?;
    locus_common::init_logging(cfg.log_json);
    let root = match a.root_ufs.as_deref() {
        Some("none") => None,
        Some(u) => Some(u.to_string()),
        None => {
            let dir = std::path::absolute(&cfg.master.meta_dir)?.parent().map(|p| p.join("ufs")).unwrap_or_default();
            Some(format!("file://{}", dir.display()))
        }
    };
    let secret = locus_common::security::load_or_create_secret(&cfg.security)?;
    let tls = locus_client::Tls::load(&cfg.security)?;
    runtime()?.block_on(async move {
        let rpc = tokio::net::TcpListener::bind(&cfg.master.rpc_address).await.context("bind master rpc")?;
        let web = tokio::net::TcpListener::bind(&cfg.master.web_address).await.context("bind master web")?;
        let serves_tls = tls.serves();
        let m = locus_master::MasterBuilder::new(cfg.master.clone(), secret)
            .protect([cfg.security.secret_file.clone(), cfg.security.token_file.clone()])
            .tls(tls)
            .root_ufs(root)
            .build()
            .await?;
        println!("master rpc  {}{}", rpc.local_addr()?, if serves_tls { " (TLS)" } else { "" });
        println!("status page http://{}/  metrics http://{}/metrics", web.local_addr()?, web.local_addr()?);
        println!("  (web login: any user name, the client token in {} as password)", cfg.security.token_file.display());
        m.serve(rpc, web, wait_for_signal()).await?;
        Ok(())
    })
}

pub fn worker(g: &Global, a: &WorkerArgs) -> Result<()> {
    let mut cfg =
        g.load_config([("worker.data_address", flag(&a.data_address)), ("worker.data_dir", flag(&a.data_dir))])?;
    if !a.tiers.is_empty() {
        cfg.worker.tiers = parse_tiers(&a.tiers)?;
    }
    locus_common::init_logging(cfg.log_json);
    let secret = locus_common::security::wait_for_secret(&cfg.security, std::time::Duration::from_secs(30))?;
    let tls = locus_client::Tls::load(&cfg.security)?;
    runtime()?.block_on(async move {
        let w = locus_worker::WorkerBuilder::new(cfg.worker.clone(), cfg.master_address.clone(), secret)
            .protect([cfg.security.secret_file.clone(), cfg.security.token_file.clone()])
            .tls(tls)
            .fragments(super::fragments(&cfg))
            .start()
            .await?;
        println!("worker data {}  uds {:?}  master {}", w.data_address(), w.uds_path(), cfg.master_address);
        wait_for_signal().await;
        w.shutdown().await;
        Ok(())
    })
}

pub fn gateway(g: &Global, a: &GatewayArgs) -> Result<()> {
    let cfg = g.load_config([("gateway.address", flag(&a.address))])?;
    locus_common::init_logging(cfg.log_json);
    runtime()?.block_on(async move {
        let client = Arc::new(super::client(&cfg)?);
        let gw = locus_s3::GatewayBuilder::new(client, cfg.gateway.clone()).build()?;
        let listener = gw.bind().await?;
        println!("s3 gateway  http://{}  master {}", listener.local_addr()?, cfg.master_address);
        print_gateway_auth(&cfg.gateway);
        gw.serve(listener, wait_for_signal()).await?;
        Ok(())
    })
}
