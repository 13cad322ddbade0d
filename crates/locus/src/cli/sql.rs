//! `locus sql "SELECT ... FROM 'locus:///logs/*.csv'"`: SQL over Locus files (CSV with a
//! header, newline-delimited JSON, Parquet) on DataFusion; results as a table, CSV or JSON.

use std::sync::Arc;

use anyhow::Result;
use clap::Args;
use locus_common::Error;
use locus_sql::Format;

use super::{Global, runtime};

#[derive(Args)]
pub struct SqlArgs {
    /// One SQL statement. Files are tables by URL: FROM 'locus:///path/*.csv' (.csv, .json
    /// for newline-delimited JSON, .parquet); SHOW TABLES, information_schema work too.
    pub query: String,
    /// Output: table, csv or json (one object per line).
    #[arg(long, default_value = "table")]
    pub format: String,
}

pub fn run(g: &Global, a: &SqlArgs) -> Result<()> {
    let format = Format::parse(&a.format)
        .ok_or_else(|| Error::invalid(format!("unknown --format {:?} (table, csv or json)", a.format)))?;
    let cfg = g.load_config(std::iter::empty())?;
    runtime()?.block_on(async move {
        let c = Arc::new(super::client(&cfg)?);
        let batches = locus_sql::run_sql(c, &a.query).await?;
        let mut out = std::io::stdout().lock();
        locus_sql::query::write(&batches, format, &mut out)?;
        Ok(())
    })
}
