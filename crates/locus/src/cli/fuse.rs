//! `locus fuse MOUNTPOINT`: the namespace as a POSIX file system (locus-fuse), served
//! until Ctrl-C or SIGTERM, which unmount it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use clap::Args;
use locus_common::Error;
use locus_common::config::WriteType;

use super::{Global, runtime, wait_for_signal};

#[derive(Args)]
pub struct FuseArgs {
    /// An empty directory to mount at. If `locus fuse` dies without unmounting, free it
    /// with `fusermount3 -u MOUNTPOINT` (or `umount MOUNTPOINT` as root).
    pub mountpoint: PathBuf,
    /// Write type of files written through the mount (MUST_CACHE, CACHE_THROUGH,
    /// THROUGH, ASYNC_THROUGH; default: the mount's or the cluster's).
    #[arg(long)]
    pub write_type: Option<String>,
    /// Refuse every change (EROFS).
    #[arg(long)]
    pub read_only: bool,
    /// How long the kernel trusts a file's attributes and names (e.g. 1s, 100ms).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub attr_timeout: Duration,
    /// Threads answering the kernel (requests served at once).
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// Let users other than the one who mounted use the mount (needs `user_allow_other`
    /// in /etc/fuse.conf unless run as root).
    #[arg(long)]
    pub allow_other: bool,
}

pub fn run(g: &Global, a: &FuseArgs) -> Result<()> {
    let cfg = g.load_config([])?;
    locus_common::init_logging(cfg.log_json);
    let write_type = a.write_type.as_deref().map(WriteType::parse_or_err).transpose()?;
    if !a.mountpoint.is_dir() {
        return Err(Error::not_found(format!("mount point {} is not a directory", a.mountpoint.display())).into());
    }
    let rt = runtime()?;
    let client = {
        let _g = rt.enter();
        Arc::new(super::client(&cfg)?)
    };
    // One master call first: a wrong address or token fails here, not in the kernel.
    rt.block_on(client.status("/", false))?;
    let opts = locus_fuse::FuseOptions {
        attr_timeout: a.attr_timeout,
        write_type,
        read_only: a.read_only,
        threads: a.threads,
        allow_other: a.allow_other,
    };
    let fs = locus_fuse::LocusFs::new(client, rt.handle().clone(), opts);
    let session = locus_fuse::mount(fs, &a.mountpoint)?;
    println!("locus mounted at {}  master {}", a.mountpoint.display(), cfg.master_address);
    rt.block_on(wait_for_signal());
    drop(session); // unmounts
    Ok(())
}
