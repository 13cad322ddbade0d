//! Metadata search's parsers: the `?search=` language ([`query`]: Zenko's syntax, parsed
//! into a typed expression and evaluated against one object) and S3 Inventory records
//! ([`inventory`]: CSV and JSON lines, as `locus fs index import` sends them).
//!
//! Pure parsing and evaluation over `locus-proto` types: this crate must not depend on
//! the master, its store or its index (tantivy), nor on any network or I/O crate, so
//! that the CLI and the fuzz targets use it without them.

pub mod inventory;
pub mod query;

/// `ms` as ISO 8601 with milliseconds, UTC.
pub fn iso_ms(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
        .unwrap_or_default()
}
