//! SQL over Locus files, on Apache DataFusion: `locus sql`, and (next) S3
//! `SelectObjectContent` in the gateway.
//!
//! - [`store`]: Locus as a read-only `object_store::ObjectStore`, so DataFusion's CSV,
//!   newline-delimited JSON and Parquet scans read `locus:///path` (globs too) through
//!   the client (short-circuit where a worker shares the host).
//! - [`query`]: a session with that store registered, a query run to Arrow batches, and
//!   the batches written as a table, CSV or JSON.
//!
//! Today the scans run in the caller's process. Must not be a dependency of any crate
//! that does not run SQL: DataFusion's build is long.

pub mod input;
pub mod query;
pub mod select;
pub mod store;

pub use query::{Format, run_sql};
pub use store::LocusStore;
