//! What every command family shares: the global flags and the configuration they load,
//! the Tokio runtime, the stop signal, tier specs, sizes for humans, and the one mapping
//! from errors to exit codes.

pub mod admin;
pub mod bench;
pub mod compute;
pub mod doctor;
pub mod fs;
pub mod fuse;
pub mod inventory;
pub mod local;
pub mod masters;
pub mod search;
pub mod server;
pub mod sql;

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use figment::providers::Serialized;
use locus_common::config::{Config, GatewayConfig, TierAlias, TierConfig};
use locus_common::{Error, ErrorKind};
use serde_json::Value;

/// The flags every command takes.
#[derive(Args)]
pub struct Global {
    /// TOML configuration file (also LOCUS_CONFIG). Flags override the file and LOCUS_* variables.
    #[arg(long, global = true, env = "LOCUS_CONFIG")]
    pub config: Option<PathBuf>,
    /// Master RPC address host:port (also LOCUS_MASTER; default 127.0.0.1:19998).
    #[arg(long, global = true)]
    pub master: Option<String>,
    /// Client token file that clients present to the cluster (also security.token_file /
    /// LOCUS_SECURITY__TOKEN_FILE; default ./locus-data/client.token).
    #[arg(long, global = true, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Cluster secret file of the master and workers (also security.secret_file /
    /// LOCUS_SECURITY__SECRET_FILE; default ./locus-data/cluster.secret; a master makes it
    /// when missing).
    #[arg(long, global = true, value_name = "FILE")]
    pub secret_file: Option<PathBuf>,
    /// TLS certificate chain (PEM) the master and workers serve their RPC and data ports
    /// with, with --tls-key-file; they then accept TLS only (also security.tls_cert_file /
    /// LOCUS_SECURITY__TLS_CERT_FILE; default none: plain TCP).
    #[arg(long, global = true, value_name = "FILE")]
    pub tls_cert_file: Option<PathBuf>,
    /// Private key (PEM) of --tls-cert-file (also security.tls_key_file /
    /// LOCUS_SECURITY__TLS_KEY_FILE).
    #[arg(long, global = true, value_name = "FILE")]
    pub tls_key_file: Option<PathBuf>,
    /// CA certificates (PEM) to trust for the servers' certificates; when set, connect to
    /// the master and workers over TLS (also security.tls_ca_file /
    /// LOCUS_SECURITY__TLS_CA_FILE; default none: plain TCP).
    #[arg(long, global = true, value_name = "FILE")]
    pub tls_ca_file: Option<PathBuf>,
}

impl Global {
    /// The configuration: defaults, the file, LOCUS_* variables, `--master`, then `flags`
    /// (config keys set by the command's own flags; `None` where a flag was not given).
    pub fn load_config<'a>(&self, flags: impl IntoIterator<Item = (&'a str, Option<Value>)>) -> Result<Config> {
        let mut f = figment::Figment::new();
        if let Some(m) = &self.master {
            f = f.merge(Serialized::default("master_address", m));
        }
        if let Some(p) = &self.token_file {
            f = f.merge(Serialized::default("security.token_file", p));
        }
        for (k, v) in [
            ("security.secret_file", &self.secret_file),
            ("security.tls_cert_file", &self.tls_cert_file),
            ("security.tls_key_file", &self.tls_key_file),
            ("security.tls_ca_file", &self.tls_ca_file),
        ] {
            if let Some(p) = v {
                f = f.merge(Serialized::default(k, p));
            }
        }
        for (k, v) in flags {
            if let Some(v) = v {
                f = f.merge(Serialized::default(k, v));
            }
        }
        Ok(Config::load(self.config.as_deref(), f)?)
    }
}

/// A client of the configured master, presenting the configured client token (over TLS
/// when `security.tls_ca_file` is set).
pub fn client(cfg: &Config) -> Result<locus_client::Client> {
    Ok(locus_client::Client::from_config(cfg)?)
}

/// How a worker of this binary runs SQL fragments (`locus_sql::remote`): with a client
/// of its own that presents the cluster secret. None without the `sql` feature.
pub fn fragments(cfg: &Config) -> Option<locus_worker::FragmentFactory> {
    #[cfg(feature = "sql")]
    {
        Some(locus_sql::remote::factory(cfg.client.clone()))
    }
    #[cfg(not(feature = "sql"))]
    {
        let _ = cfg;
        None
    }
}

/// A flag's value for [`Global::load_config`], if it was given.
pub fn flag<T: serde::Serialize>(v: &Option<T>) -> Option<Value> {
    v.as_ref().map(|v| serde_json::json!(v))
}

/// The one mapping from errors to exit codes: a Locus error by its kind, anything else 1.
/// Returns the code and the one-line message printed on stderr.
pub fn exit_code(e: &anyhow::Error) -> (i32, String) {
    let Some(le) = e.downcast_ref::<Error>() else {
        return (1, format!("{e:#}"));
    };
    let code = match le.kind() {
        ErrorKind::InvalidArgument | ErrorKind::NameTooLong => 2,
        ErrorKind::NotFound => 3,
        ErrorKind::AlreadyExists => 4,
        ErrorKind::PermissionDenied | ErrorKind::Unauthenticated => 5,
        ErrorKind::ResourceExhausted => 6,
        ErrorKind::Unavailable => 7,
        _ => 1,
    };
    (code, le.to_string())
}

/// A tier as ALIAS:DIR:QUOTA.
pub fn parse_tier(s: &str) -> Result<TierConfig> {
    let mut it = s.splitn(3, ':');
    let (a, d, q) = (it.next().unwrap_or(""), it.next(), it.next());
    let (Some(d), Some(q)) = (d, q) else {
        return Err(Error::invalid(format!("tier {s:?} is not ALIAS:DIR:QUOTA")).into());
    };
    let alias = TierAlias::parse(a).ok_or_else(|| Error::invalid(format!("unknown tier {a:?} (MEM, SSD, HDD)")))?;
    let quota = q.parse().map_err(|e| Error::invalid(format!("bad quota {q:?}: {e}")))?;
    Ok(TierConfig { alias, dir: PathBuf::from(d), quota })
}

/// Every tier of `specs` (ALIAS:DIR:QUOTA each).
pub fn parse_tiers(specs: &[String]) -> Result<Vec<TierConfig>> {
    specs.iter().map(|t| parse_tier(t)).collect()
}

pub fn print_gateway_auth(g: &GatewayConfig) {
    if g.access_key_id.is_empty() {
        println!(
            "  s3 auth      {}",
            if g.anonymous { "anonymous access" } else { "no keys: every request is refused" }
        );
    } else {
        let warn = if g.access_key_id == "locusadmin" && g.secret_access_key == "locusadmin" {
            " (the public default: set gateway.access_key_id/secret_access_key)"
        } else {
            ""
        };
        println!("  s3 auth      access key {}{warn}", g.access_key_id);
    }
}

pub fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().enable_all().build()?)
}

/// Until Ctrl-C or SIGTERM.
pub async fn wait_for_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("signal handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term.recv() => {},
    }
}

/// Bytes in IEC units (`1.5 GiB`).
/// A progress bar of bytes (drawn on a terminal only), with a message after it.
pub fn byte_bar(total: u64) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(total);
    let t = "{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} {bytes_per_sec} {msg}";
    if let Ok(style) = indicatif::ProgressStyle::with_template(t) {
        bar.set_style(style);
    }
    bar
}

pub fn human(b: u64) -> String {
    bytesize::ByteSize::b(b).display().iec().to_string()
}
