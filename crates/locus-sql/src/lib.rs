//! SQL over Locus files, on Apache DataFusion: `locus sql`, and S3
//! `SelectObjectContent` for the gateway.
//!
//! - [`store`]: Locus as a read-only `object_store::ObjectStore`, so DataFusion's CSV,
//!   newline-delimited JSON and Parquet scans read `locus:///path` (globs too) through
//!   the client (short-circuit where a worker shares the host).
//! - [`query`]: a session with that store registered, a query run to Arrow batches, and
//!   the batches written as a table, CSV or JSON.
//! - [`select`]: the S3 Select dialect onto DataFusion's SQL, and results in S3 Select's
//!   output formats; [`input`]: the object made readable (ScanRange window, GZIP/BZIP2,
//!   JSON documents and paths); the dialect's translation itself is `locus-select`.
//!
//! - [`catalog`]: the metadata catalog as the table `objects` (`locus fs search --sql`),
//!   and S3 Inventory Parquet files read for `locus fs index import`.
//! - [`remote`]: the plan's per-partition fragments (scans, filters, partial
//!   aggregates) run on the workers that hold the blocks; the rest runs in the caller.
//!
//! Must not be a dependency of any crate that does not run SQL (DataFusion's build is
//! long): the worker runs fragments through its `FragmentRunner` hook, which
//! [`remote::Fragments`] implements and the binary hands it ([`remote::factory`]).

pub mod catalog;
pub mod input;
pub mod query;
pub mod remote;
pub mod select;
pub mod store;

pub use query::{Format, run_sql};
pub use store::LocusStore;
