//! `locus sql "SELECT ... FROM 'locus:///logs/*.csv'"`: SQL over Locus files (CSV with a
//! header, newline-delimited JSON, Parquet) on DataFusion; results as a table, CSV or JSON.
//! A build without the `sql` feature keeps the command and says it is left out.

use anyhow::Result;
use clap::Args;

use super::Global;

#[derive(Args)]
pub struct SqlArgs {
    /// One SQL statement. Files are tables by URL: FROM 'locus:///path/*.csv' (.csv, .json
    /// for newline-delimited JSON, .parquet); SHOW TABLES, information_schema work too.
    pub query: String,
    /// Output: table, csv or json (one object per line).
    #[arg(long, default_value = "table")]
    pub format: String,
}

#[cfg(feature = "sql")]
pub fn run(g: &Global, a: &SqlArgs) -> Result<()> {
    use locus_common::Error;
    use locus_sql::Format;
    use std::sync::Arc;

    let format = Format::parse(&a.format)
        .ok_or_else(|| Error::invalid(format!("unknown --format {:?} (table, csv or json)", a.format)))?;
    let cfg = g.load_config(std::iter::empty())?;
    super::runtime()?.block_on(async move {
        let c = Arc::new(super::client(&cfg)?);
        let batches = locus_sql::run_sql(c, &a.query).await?;
        let mut out = std::io::stdout().lock();
        locus_sql::query::write(&batches, format, &mut out)?;
        Ok(())
    })
}

#[cfg(not(feature = "sql"))]
pub fn run(_: &Global, _: &SqlArgs) -> Result<()> {
    Err(locus_common::Error::new(
        locus_common::ErrorKind::FailedPrecondition,
        "this locus was built without SQL (cargo feature `sql`)",
    )
    .into())
}
