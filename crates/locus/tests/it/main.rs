//! The `locus` crate's integration tests, in one binary (one link instead of one per
//! file): the in-process MiniCluster scenarios, roles and security, availability,
//! hardening, near-data compute, SQL, and the crate rules. `memory.rs` (its own global
//! allocator) and `failpoints` (another feature set) stay binaries of their own.
#![allow(clippy::unwrap_used)] // a test that cannot go on fails

#[path = "../common/mod.rs"]
mod common;

mod availability;
mod compute;
mod crate_rules;
mod feature_parity;
mod ha;
mod hardening;
mod minicluster;
mod roles;
mod security;
#[cfg(feature = "sql")]
mod sql;
