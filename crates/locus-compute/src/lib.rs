//! Near-data compute: the seed study's operators (count, per-column stats, modular sums,
//! standard deviation, normalization, the Gram matrix, digit frequencies and entropy)
//! over delimited text, as partial results that a worker computes from one block of a
//! file and the caller merges.
//!
//! - [`scan`]: a block's bytes, in the order they arrive (a cached block at once, a block
//!   being filled from the UFS piece by piece), to its [`pb::ComputePartial`]. The records
//!   that cross the block's edges are left to the caller as raw bytes (`head`, `tail`).
//! - [`merge`]: the caller's side: joins the edge records, merges the partials (sums with
//!   Neumaier compensation, variances with Chan's formula) and finishes the results.
//! - [`normalize`]: the normalized file itself (`--out`), record by record.
//! - [`spec`]: operator names, column selection by header name, `c0..c7` ranges or `_N`
//!   positions, and the CSV format.
//!
//! Pure computation: it must not depend on the client, the worker, the master, any I/O
//! beyond the `Read`/`Write` it is handed, or the SQL engine (DataFusion lives in `locus-sql`).

pub mod merge;
pub mod normalize;
pub mod num;
pub mod scan;
pub mod spec;

pub use locus_proto::pb;
pub use merge::{Merger, Results};
pub use scan::BlockScanner;
pub use spec::{Plan, Request, Resolved, header_fields, parse_ops, resolve_columns};
