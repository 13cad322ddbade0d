//! Metadata search, apart from the namespace it searches:
//! - [`query`]: the `?search=` language (Zenko's syntax), parsed into a typed expression
//!   and evaluated against one object;
//! - [`inventory`]: S3 Inventory records (CSV and JSON lines), as `locus fs index import`
//!   sends them;
//! - with the `index` feature, the search index on tantivy: its schema and key-ordered
//!   reads ([`index`]), its fast columns ([`columns`]), its directory ([`directory`]),
//!   ranges of the numeric attributes ([`ranges`]), an expression as a tantivy query
//!   ([`translate`]), and opening it with its writer ([`writer`]).
//!
//! This crate must not depend on the master, its store (redb), the worker, the client or
//! any network crate: the master's indexer keeps the index in line with the namespace,
//! and the CLI (`locus bench index-floor`) and the fuzz targets (without `index`) use it
//! without them.

pub mod inventory;
pub mod query;

#[cfg(feature = "index")]
pub mod columns;
#[cfg(feature = "index")]
pub mod directory;
#[cfg(feature = "index")]
pub mod index;
#[cfg(feature = "index")]
pub mod ranges;
#[cfg(feature = "index")]
pub mod translate;
#[cfg(feature = "index")]
pub mod writer;

/// `ms` as ISO 8601 with milliseconds, UTC.
pub fn iso_ms(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
        .unwrap_or_default()
}
