//! `locus local start`: a whole cluster (master, workers, S3 gateway) in this process,
//! until Ctrl-C or SIGTERM.

use std::path::PathBuf;

use anyhow::Result;
use clap::Subcommand;
use locus_cluster::{LocalCluster, default_mem_dir};

use super::{Global, flag, parse_tier, parse_tiers, print_gateway_auth, runtime, wait_for_signal};

#[derive(Subcommand)]
pub enum LocalCmd {
    /// Start a master, workers and the status page over a local directory; Ctrl-C stops.
    Start {
        /// Directory for metadata, worker state and the default UFS (default ./locus-data).
        #[arg(long, default_value = "./locus-data")]
        data_dir: PathBuf,
        /// Number of workers.
        #[arg(long, default_value_t = 1)]
        workers: usize,
        /// UFS mounted at / on first start (default file://<data-dir>/ufs).
        #[arg(long)]
        ufs: Option<String>,
        /// MEM tier quota of each worker (default 1GiB).
        #[arg(long)]
        mem_quota: Option<String>,
        /// A tier per worker as ALIAS:DIR:QUOTA (each worker uses DIR/w<i>). Repeatable.
        #[arg(long = "tier")]
        tiers: Vec<String>,
        /// Block size of new files (default 64MiB).
        #[arg(long)]
        block_size: Option<String>,
        /// S3 gateway listen address (default 127.0.0.1:39999).
        #[arg(long)]
        gateway_address: Option<String>,
        /// Do not run the S3 gateway.
        #[arg(long)]
        no_gateway: bool,
        /// Remove the data dir and the MEM tiers when stopped (a throwaway cluster).
        #[arg(long)]
        ephemeral: bool,
    },
    /// Remove what `local start` keeps for a data dir: its MEM tiers in /dev/shm (found
    /// even when the data dir was deleted), metadata, worker state and credentials.
    Clean {
        /// The data dir given to `local start` (default ./locus-data).
        #[arg(long, default_value = "./locus-data")]
        data_dir: PathBuf,
        /// Also remove the default UFS, <data-dir>/ufs: the files written to Locus.
        #[arg(long)]
        ufs: bool,
    },
}

pub fn run(g: &Global, cmd: &LocalCmd) -> Result<()> {
    let (data_dir, workers, ufs, mem_quota, tiers, block_size, gateway_address, no_gateway, ephemeral) = match cmd {
        LocalCmd::Start {
            data_dir,
            workers,
            ufs,
            mem_quota,
            tiers,
            block_size,
            gateway_address,
            no_gateway,
            ephemeral,
        } => (data_dir, workers, ufs, mem_quota, tiers, block_size, gateway_address, no_gateway, ephemeral),
        LocalCmd::Clean { data_dir, ufs } => {
            let removed = locus_cluster::clean(data_dir, *ufs)?;
            for p in &removed {
                println!("removed {}", p.display());
            }
            if removed.is_empty() {
                println!("nothing to remove for {}", data_dir.display());
            }
            return Ok(());
        }
    };
    let mut cfg =
        g.load_config([("master.block_size", flag(block_size)), ("gateway.address", flag(gateway_address))])?;
    if let Some(m) = &g.master {
        cfg.master.rpc_address = m.clone();
    }
    if !tiers.is_empty() {
        cfg.worker.tiers = parse_tiers(tiers)?;
    } else if let Some(q) = mem_quota {
        cfg.worker.tiers = vec![parse_tier(&format!("MEM:{}:{q}", default_mem_dir(data_dir).display()))?];
    }
    locus_common::init_logging(cfg.log_json);
    runtime()?.block_on(async move {
        let gateway_cfg = cfg.gateway.clone();
        let fragments = super::fragments(&cfg);
        let mut c = LocalCluster::start_with(cfg, data_dir, *workers, ufs.clone(), fragments).await?;
        if !*no_gateway {
            c.start_gateway().await?;
        }
        println!("Locus is running");
        println!("  master rpc   {}{}", c.master_address(), if c.tls().serves() { " (TLS)" } else { "" });
        if let Some(g) = c.gateway_address() {
            println!("  s3 gateway   http://{g}");
            print_gateway_auth(&gateway_cfg);
        }
        println!("  status page  http://{}/", c.web_address());
        println!("  metrics      http://{}/metrics", c.web_address());
        println!("  web login    any user name, the client token below as password (or Authorization: Bearer)");
        for i in 0..*workers {
            if let Some(w) = c.worker(i) {
                println!(
                    "  worker{i} (id {})  data {}  uds {}",
                    w.id(),
                    w.data_address(),
                    w.uds_path().map(|p| p.display().to_string()).unwrap_or_default()
                );
                for t in c.worker_tiers(i) {
                    println!("    {} tier  {}  {}", t.alias.as_str(), t.dir.display(), t.quota.display().iec());
                }
            }
        }
        println!("  data dir     {}", c.data_dir().display());
        println!("  client token {} (clients in another directory: --token-file)", c.security().token_file.display());
        println!("Press Ctrl-C to stop.");
        wait_for_signal().await;
        println!("stopping");
        let dir = c.data_dir().to_path_buf();
        c.shutdown().await;
        if *ephemeral {
            let d = dir.clone();
            tokio::task::spawn_blocking(move || locus_cluster::clean(&d, true)).await??;
            println!("removed {} and its tiers (--ephemeral)", dir.display());
        }
        Ok(())
    })
}
