//! Shared foundations of Locus: the structured [`Error`] type, configuration structs
//! with documented defaults, path rules, metric names, ids and named fault points.
//!
//! This crate must not depend on any other Locus crate, and must stay free of
//! networking and storage code: everything else depends on it.

pub mod config;
pub mod error;
pub mod job;
pub mod metrics;
pub mod path;
pub mod security;
pub mod wait;

pub use error::{Error, ErrorKind, Result};

/// Re-exported so that crates can declare fault points with `locus_common::fail::fail_point!`.
/// Fault points are compiled in only with the `failpoints` feature.
pub use fail;

/// Fault point `name` (`return(<ms>)`): wait that long there (the failpoint tests open
/// race windows with it). Nothing without the `failpoints` feature.
pub async fn delay_point(name: &str) {
    let _ = name;
    #[allow(clippy::redundant_closure_call)]
    let ms: Option<u64> = (|| {
        fail::fail_point!(name, |a: Option<String>| a.and_then(|s| s.parse().ok()));
        None
    })();
    if let Some(ms) = ms {
        tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
    }
}

/// Block ids pack a file version id and the block index: `version << 24 | index`.
/// 2^24 blocks of the default 64 MiB size allow files of 1 PiB.
pub const BLOCK_INDEX_BITS: u32 = 24;

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// This process's soft limit on open files (`RLIMIT_NOFILE`); 0 when unknown.
pub fn open_files_limit() -> u64 {
    let mut l = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the struct it is given and nothing else.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) } == 0 { l.rlim_cur } else { 0 }
}

pub fn block_id(version: u64, index: u64) -> u64 {
    (version << BLOCK_INDEX_BITS) | index
}

/// Split a block id into (file version id, block index).
pub fn split_block_id(id: u64) -> (u64, u64) {
    (id >> BLOCK_INDEX_BITS, id & ((1 << BLOCK_INDEX_BITS) - 1))
}

/// Install a `tracing` subscriber writing structured logs to stderr.
/// `json` selects JSON lines; the filter comes from `RUST_LOG` (default `info`).
///
/// The `s3s` crate's own events are off unless `RUST_LOG` names it: it logs every
/// refused request at ERROR (twice), while the gateway logs each answer once, by its
/// request id (client mistakes at debug, its own failures at warn).
pub fn init_logging(json: bool) {
    use tracing_subscriber::EnvFilter;
    let spec = std::env::var("RUST_LOG").unwrap_or_default();
    let mut filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    if !spec.contains("s3s")
        && let Ok(d) = "s3s=off".parse()
    {
        filter = filter.add_directive(d);
    }
    // openraft narrates every election and shutdown at INFO; the master logs what matters.
    if !spec.contains("openraft")
        && let Ok(d) = "openraft=warn".parse()
    {
        filter = filter.add_directive(d);
    }
    // Colours only on a terminal: logs written to a file or a pipe stay plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let b = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr);
    let _ = if json { b.json().try_init() } else { b.try_init() };
}

/// The fingerprint of a file whose bytes are only in worker caches. It matches no UFS
/// object, so no worker ever fills such a file's blocks from the UFS.
pub const UNPERSISTED_FINGERPRINT: &str = "locus:unpersisted";

#[cfg(test)]
mod tests {
    #[test]
    fn block_ids_round_trip() {
        let id = super::block_id(77, 5);
        assert_eq!(super::split_block_id(id), (77, 5));
    }
}
